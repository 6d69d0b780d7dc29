//! `approx-bench merge`: shard directories of one run (`--shard K/N`) combined into one run, rows in
//! the grid's order, with its summary and manifest.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::config::RunConfig;
use crate::report::manifest::{json_diff, Manifest, MergedPart, BUILD};
use crate::report::summary::{self, SummaryRow};
use crate::report::trials::{self, TrialRow, TrialWriter};
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
    let (mut x, mut y) = (
        serde_json::to_value(&a.config)?,
        serde_json::to_value(&b.config)?,
    );
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
    Ok(diff)
}

/// The merged run in `out`: its summary and how many trials it holds.
pub struct Merged {
    pub summary: Vec<SummaryRow>,
    pub trials: usize,
}

/// Combines shard directories (same configuration) into one run in `out`.
pub fn merge(dirs: &[PathBuf], out: &Path) -> Result<Merged> {
    let manifests: Vec<Manifest> = dirs
        .iter()
        .map(|d| Manifest::read(d))
        .collect::<Result<_>>()?;
    let first = &manifests[0];
    for (d, m) in dirs.iter().zip(&manifests).skip(1) {
        let diff = config_diff(first, m)?;
        if !diff.is_empty() {
            return Err(usage!("{} was run with another configuration than {} ({}); only shards of one run can be merged", d.display(), dirs[0].display(), diff.join("; ")));
        }
    }
    let mut by_key: std::collections::BTreeMap<_, TrialRow> = std::collections::BTreeMap::new();
    for d in dirs {
        for r in trials::read_rows(&d.join("trials.csv"))? {
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
    // One writer per run directory, the merged one too (issue 32).
    let _lock = super::run_lock::create_and_lock(out)?;
    let path = out.join("trials.csv");
    if path.exists() {
        return Err(usage!(
            "--out {} already holds a trials.csv; merge into an empty directory",
            out.display()
        ));
    }
    let (mut writer, _) = TrialWriter::open(&path)?;
    for r in by_key.values() {
        writer.append(r)?;
    }
    let rows: Vec<TrialRow> = by_key.into_values().collect();
    let summary_rows = summary::summarize(&rows, &first.config.methods);
    summary::write(&out.join("summary.csv"), &summary_rows)?;
    let heads = first.config.heads.as_ref().map_or(first.heads, |h| h.len());
    let budgets: usize = first
        .config
        .methods
        .iter()
        .map(|m| crate::attention::budgets(m, &first.config.features).len())
        .sum();
    let expected = first.config.lengths.len() * first.config.windows * heads * budgets;
    let mut manifest = first.clone();
    manifest.shard = None;
    // The parts' cache use says nothing of the merged directory.
    manifest.qkv_cache = None;
    manifest.trials = rows.len();
    manifest.status = if rows.len() == expected {
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
    let parts = dirs.iter().zip(&manifests).flat_map(|(d, m)| {
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
    manifest.write(out)?;
    if rows.len() != expected {
        eprintln!("warning: merged {} of the {expected} trials of the configuration; some shards are missing or incomplete", rows.len());
    }
    Ok(Merged {
        summary: summary_rows,
        trials: rows.len(),
    })
}
