//! Loading one side of a check: a run directory (summary.csv, and trials.csv and manifest.json
//! when present) or a bare summary.csv file. Every problem with the files is a usage error
//! (exit 2) that names the file.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::report::manifest::Manifest;
use crate::report::summary::{self, SummaryRow};
use crate::report::trials::{self, TrialRow};
use crate::usage;

/// One side of a comparison, loaded.
#[derive(Debug, Clone)]
pub struct RunData {
    /// The path the user gave (a directory or a summary.csv file), for messages.
    pub path: PathBuf,
    /// Where the curve points came from (summary.csv, or trials.csv summarized when a run
    /// directory has no summary.csv).
    pub summary_source: PathBuf,
    pub summary: Vec<SummaryRow>,
    /// Per-trial rows, when the side is a run directory with trials.csv.
    pub trials: Option<Vec<TrialRow>>,
    /// The run's manifest, when the side is a run directory with manifest.json.
    pub manifest: Option<Manifest>,
}

impl RunData {
    /// The target the side's points are measured against (one per side; `load` refuses mixes).
    pub fn target(&self) -> crate::attention::Target {
        self.summary.first().map(|r| r.target).unwrap_or_default()
    }

    /// The decode protocol's n_f of the side's points, None for prefill (one per side; `load`
    /// refuses mixes).
    pub fn n_f(&self) -> Option<usize> {
        self.summary.first().and_then(|r| r.n_f)
    }

    /// The mask of the side's target (one per side; `load` refuses mixes).
    pub fn mask(&self) -> crate::attention::Mask {
        self.summary.first().map(|r| r.mask).unwrap_or_default()
    }

    /// A side made from data in memory (tests, or callers that computed rows themselves).
    pub fn from_parts(
        label: &str,
        summary: Vec<SummaryRow>,
        trials: Option<Vec<TrialRow>>,
        manifest: Option<Manifest>,
    ) -> Self {
        Self {
            path: label.into(),
            summary_source: label.into(),
            summary,
            trials,
            manifest,
        }
    }

    /// Whether the side was given as a directory (the default home of the markdown report).
    pub fn is_dir(&self) -> bool {
        self.path.is_dir()
    }
}

/// Loads `path` given for `flag` (`--baseline` or `--current`).
pub fn load(path: &Path, flag: &str) -> Result<RunData> {
    if !path.exists() {
        return Err(usage!(
            "{flag} {}: no such file or directory; give a run directory or a summary.csv file",
            path.display()
        ));
    }
    let (summary_source, summary, trials, manifest) = if path.is_dir() {
        let manifest = match path.join("manifest.json") {
            p if p.is_file() => Some(Manifest::read(path)?),
            _ => None,
        };
        let trials_path = path.join("trials.csv");
        let trials = if trials_path.is_file() {
            Some(trials::read_rows(&trials_path)?)
        } else {
            None
        };
        let summary_path = path.join("summary.csv");
        if summary_path.is_file() {
            (
                summary_path.clone(),
                summary::read(&summary_path)?,
                trials,
                manifest,
            )
        } else if let Some(rows) = &trials {
            let order = manifest
                .as_ref()
                .map(|m| m.config.methods.clone())
                .unwrap_or_default();
            (
                trials_path.clone(),
                summary::summarize(rows, &order),
                trials,
                manifest,
            )
        } else {
            return Err(usage!(
                "{flag} {}: the directory holds neither summary.csv nor trials.csv; give a run directory written by approx-bench or a summary.csv file",
                path.display()
            ));
        }
    } else {
        (path.to_path_buf(), summary::read(path)?, None, None)
    };
    if summary.is_empty() {
        return Err(usage!(
            "{flag} {}: no curve points (the file has no data rows)",
            summary_source.display()
        ));
    }
    let targets: std::collections::BTreeSet<_> = summary.iter().map(|r| r.target).collect();
    if targets.len() > 1 {
        return Err(usage!(
            "{flag} {}: holds points of both targets (softmax and kernelized); check compares runs of one target, so give each target's run separately",
            summary_source.display()
        ));
    }
    let masks: std::collections::BTreeSet<_> = summary.iter().map(|r| r.mask).collect();
    if masks.len() > 1 {
        return Err(usage!(
            "{flag} {}: holds points of both masks (none and causal); check compares runs of one mask, so give each mask's run separately",
            summary_source.display()
        ));
    }
    let n_fs: std::collections::BTreeSet<_> = summary.iter().map(|r| r.n_f).collect();
    if n_fs.len() > 1 {
        return Err(usage!(
            "{flag} {}: holds points of several decode protocols (n_f {}); check compares runs of one protocol, so give each run separately",
            summary_source.display(),
            n_fs.iter()
                .map(|n| n.map_or("none (prefill)".to_string(), |n| n.to_string()))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let mut seen = HashSet::new();
    for r in &summary {
        if !seen.insert((r.model.as_str(), r.n, r.method.as_str(), r.d)) {
            return Err(usage!(
                "{flag} {}: the point (model {}, n = {}, method {}, d = {}) appears twice",
                summary_source.display(),
                r.model,
                r.n,
                r.method,
                r.d
            ));
        }
        if r.trials > 0 && !(r.mean.is_finite() && r.stderr.is_finite() && r.stderr >= 0.0) {
            return Err(usage!(
                "{flag} {}: the point (model {}, n = {}, method {}, d = {}) has {} finite trials but mean {} ± {}",
                summary_source.display(),
                r.model,
                r.n,
                r.method,
                r.d,
                r.trials,
                r.mean,
                r.stderr
            ));
        }
    }
    Ok(RunData {
        path: path.to_path_buf(),
        summary_source,
        summary,
        trials,
        manifest,
    })
}
