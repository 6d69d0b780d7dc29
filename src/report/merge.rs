//! `approx-bench merge`: shard directories of one run (`--shard K/N`) combined into one run, rows in
//! the grid's order, with its summary and manifest.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::config::RunConfig;
use crate::report::grid::Grid;
use crate::report::manifest::{json_diff, Manifest, MergedPart, BUILD};
use crate::report::summary::{self, SummaryRow};
use crate::report::trials::{self, TrialRow};
use crate::usage;

/// Position of a trial in the grid order (n, window, head, method, d) of `cfg`.
fn grid_rank(cfg: &RunConfig, r: &TrialRow) -> (usize, usize, usize, usize, usize) {
    let pos = |v: &[usize], x: usize| v.iter().position(|&y| y == x).unwrap_or(usize::MAX);
    let m = cfg
        .methods
        .iter()
        .position(|y| *y == r.method)
        .unwrap_or(usize::MAX);
    (
        pos(&cfg.lengths, r.n),
        r.window,
        r.head,
        m,
        pos(&cfg.features, r.d),
    )
}

/// Where two runs' configurations differ. Shards of one run may have read their local files from
/// other paths (another machine, another session's scratch directory): a local model source or
/// corpus (`dir:…`, `file:…`) at another path is the same input when every input file has the
/// same sha256 in both manifests, so only the files' contents count there.
fn config_diff(a: &Manifest, b: &Manifest) -> Result<Vec<String>> {
    let (mut x, mut y) = crate::report::manifest::comparable_configs(&a.config, &b.config)?;
    let contents = |m: &Manifest| {
        let mut files: Vec<(String, String)> = m
            .inputs
            .iter()
            .map(|f| (f.role.clone(), f.sha256.clone()))
            .collect();
        files.sort();
        files
    };
    if contents(a) == contents(b) {
        let local = |v: &serde_json::Value| {
            v.as_str()
                .is_some_and(|s| s.starts_with("dir:") || s.starts_with("file:"))
        };
        for key in ["model_source", "corpus"] {
            if local(&x["inputs"][key]) && local(&y["inputs"][key]) {
                x["inputs"][key] = serde_json::Value::Null;
                y["inputs"][key] = serde_json::Value::Null;
            }
        }
    }
    let mut diff = Vec::new();
    json_diff("", &x, &y, &mut diff);
    // The window ends the d grid: parts of one layer agree on it (a part written before the
    // field existed reads as no window, and is refused beside one that has it).
    if a.sliding_window != b.sliding_window {
        let w = |m: &Manifest| m.sliding_window.map_or("none".into(), |w| w.to_string());
        diff.push(format!("sliding_window: {} vs {}", w(a), w(b)));
    }
    Ok(diff)
}

/// The merged run in `out`: its summary and how many trials it holds.
pub struct Merged {
    pub summary: Vec<SummaryRow>,
    pub trials: usize,
}

/// Marks `out` as holding a merge that has not finished: written before any output and removed
/// after the manifest, so that an interrupted merge (a kill, a signal, a full disk) is recognised
/// and completed by the same command instead of refused as a directory that holds a run.
pub const MERGING: &str = ".merge-incomplete";

/// The files a merge writes into `out`, each renamed into place whole.
const OUTPUTS: [&str; 3] = ["trials.csv", "summary.csv", "manifest.json"];

/// Combines shard directories (same configuration) into one run in `out`. Every output is
/// written under a temporary name and renamed into place, inside a directory marked as an
/// unfinished merge until the manifest is in place: rerunning an interrupted merge rewrites it
/// whole, to the rows of an uninterrupted one.
pub fn merge(dirs: &[PathBuf], out: &Path) -> Result<Merged> {
    let manifests: Vec<Manifest> = dirs.iter().map(|d| read_part(d)).collect::<Result<_>>()?;
    let first = &manifests[0];
    for (d, m) in dirs.iter().zip(&manifests).skip(1) {
        let diff = config_diff(first, m)?;
        if !diff.is_empty() {
            return Err(usage!("{} was run with another configuration than {} ({}); only shards of one run can be merged", d.display(), dirs[0].display(), diff.join("; ")));
        }
    }
    let rows = merged_rows(dirs, &manifests)?;
    // One writer per run directory, the merged one too (issue 32).
    let _lock = super::run_lock::create_and_lock(out)?;
    let marker = out.join(MERGING);
    // A manifest is written last by a merge and first by a sweep: beside the mark, it means the
    // merge had finished (or a run has started there since), so the directory is not rewritten.
    if marker.exists() && !out.join("manifest.json").exists() {
        // An interrupted merge: its outputs are rewritten below; its temporaries go.
        for f in OUTPUTS {
            crate::atomic_file::remove_stale_temporaries(&out.join(f), std::time::Duration::ZERO);
        }
    } else if out.join("trials.csv").exists() {
        return Err(usage!(
            "--out {} already holds a trials.csv; merge into an empty directory",
            out.display()
        ));
    }
    crate::atomic_file::write(
        &marker,
        b"a merge into this directory has not finished; rerun it\n",
    )?;
    trials::rewrite(&out.join("trials.csv"), &rows)?;
    let summary_rows = summary::summarize(&rows, &first.config.methods);
    summary::write(&out.join("summary.csv"), &summary_rows)?;
    let expected = expected_trials(first);
    merged_manifest(dirs, &manifests, rows.len(), expected).write(out)?;
    std::fs::remove_file(&marker)
        .with_context(|| format!("removing {} after the merge", marker.display()))?;
    if rows.len() != expected {
        eprintln!("warning: merged {} of the {expected} trials of the configuration; some shards are missing or incomplete", rows.len());
    }
    Ok(Merged {
        summary: summary_rows,
        trials: rows.len(),
    })
}

/// The manifest of a directory to merge, after checking that it is one: a path that does not
/// exist, a file, or a directory without a run is a usage error naming the path.
fn read_part(d: &Path) -> Result<Manifest> {
    let what = if !d.exists() {
        "does not exist"
    } else if !d.is_dir() {
        "is a file, not a run directory"
    } else if !d.join("manifest.json").is_file() {
        "holds no manifest.json: it is not a run directory, or its run has not started"
    } else if !d.join("trials.csv").is_file() {
        "holds a manifest.json but no trials.csv: its run has not written any row"
    } else {
        return Manifest::read(d);
    };
    Err(usage!(
        "merge: {} {what}; give the --out directories of the shards (each holds manifest.json and trials.csv)",
        d.display()
    ))
}

/// The rows of every directory in the grid's order, each trial once. A row that is no trial of
/// the run is refused as a resume refuses it ([`Grid`]); a trial present twice must agree.
fn merged_rows(dirs: &[PathBuf], manifests: &[Manifest]) -> Result<Vec<TrialRow>> {
    let first = &manifests[0];
    let model = crate::choice::Choice::name(first.config.inputs.model);
    let all: Vec<usize> = (0..first.heads).collect();
    let heads = first.config.heads.as_deref().unwrap_or(&all);
    let mut by_key: std::collections::BTreeMap<_, TrialRow> = std::collections::BTreeMap::new();
    for (d, m) in dirs.iter().zip(manifests) {
        let path = d.join("trials.csv");
        let rows = trials::read_rows(&path)?;
        let grid = Grid {
            cfg: &first.config,
            model,
            heads,
            shard: m.shard,
            sliding_window: first.sliding_window,
        };
        grid.check(
            &rows,
            &path,
            "merge only the shards' own rows: restore the file (or rerun that shard into a fresh --out) and merge again",
        )?;
        for r in rows {
            let rank = grid_rank(&first.config, &r);
            if let Some(prev) = by_key.get(&rank) {
                let same = TrialRow {
                    seconds: prev.seconds,
                    ..r.clone()
                } == *prev;
                if !same {
                    // The usual cause is a rerun on another CPU or build, whose f32 products
                    // round differently: such runs agree statistically, which `check` tests.
                    return Err(usage!(
                        "{}: trial {:?} differs from the same trial in an earlier directory (error {} there, {} here); merge only shards of one run, from one build on one machine (f32 products round differently elsewhere), and compare two runs with `approx-bench check --baseline A --current B`",
                        d.display(),
                        r.key(),
                        prev.error,
                        r.error
                    ));
                }
                continue;
            }
            by_key.insert(rank, r);
        }
    }
    Ok(by_key.into_values().collect())
}

/// The number of trials of the whole configuration of `m`.
fn expected_trials(m: &Manifest) -> usize {
    let heads = m.config.heads.as_ref().map_or(m.heads, |h| h.len());
    let budgets: usize = m
        .config
        .methods
        .iter()
        .map(|id| crate::attention::layer_budgets(id, &m.config.features, m.sliding_window).len())
        .sum();
    m.config.lengths.len() * m.config.windows * heads * budgets
}

/// The merged run's manifest: the first part's, with the trial count, the status, the times of
/// all parts and their provenance.
fn merged_manifest(
    dirs: &[PathBuf],
    manifests: &[Manifest],
    trials: usize,
    expected: usize,
) -> Manifest {
    let mut manifest = manifests[0].clone();
    manifest.shard = None;
    // The parts' cache use says nothing of the merged directory.
    manifest.qkv_cache = None;
    manifest.trials = trials;
    manifest.status = if trials == expected {
        "complete".into()
    } else {
        "partial".into()
    };
    manifest.finished = manifests.iter().filter_map(|m| m.finished.clone()).max();
    manifest.started = manifests
        .iter()
        .map(|m| m.started.clone())
        .min()
        .unwrap_or_default();
    manifest.command = std::env::args().collect();
    manifest.build = BUILD.into();
    let parts = dirs.iter().zip(manifests).flat_map(|(d, m)| {
        if m.merged_from.is_empty() {
            vec![MergedPart {
                path: d.display().to_string(),
                build: m.build.clone(),
                shard: m.shard,
                trials: m.trials,
                started: m.started.clone(),
                finished: m.finished.clone(),
            }]
        } else {
            m.merged_from.clone()
        }
    });
    // A part merged twice (a shard merged again into a directory that already holds it, from
    // wherever it was moved to since) is listed once: the rows were deduplicated, so is their
    // provenance. The same run is the same shard, build, trial count and times.
    manifest.merged_from = vec![];
    for part in parts {
        let same = |p: &MergedPart| {
            (&p.build, p.shard, p.trials, &p.started, &p.finished)
                == (
                    &part.build,
                    part.shard,
                    part.trials,
                    &part.started,
                    &part.finished,
                )
        };
        if !manifest.merged_from.iter().any(same) {
            manifest.merged_from.push(part);
        }
    }
    manifest
}
