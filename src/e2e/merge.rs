//! `approx-bench merge` of end-to-end shards (`e2e --shard K/N`): the shards' rows in one run
//! directory, with the correlation table and the figure recomputed over every window.
//!
//! Shards are one command split by window, so they must agree on everything but the shard: the
//! model's files, the windows, dtype, n_f, seed and the one-layer view. A shard that did not
//! finish is refused (its command completes it); shards of a count given twice are refused.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::usage;

/// What a merge wrote.
pub struct MergedE2e {
    pub points: usize,
    pub shards: usize,
    /// `complete` when every shard 1..=N was given, else `partial`.
    pub status: String,
}

/// Whether `dir` holds an end-to-end run (its manifest's `kind`).
pub fn is_e2e_run(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("manifest.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .is_some_and(|m| m["kind"] == "e2e")
}

/// Joins the shard directories `dirs` into `out`.
pub fn merge(dirs: &[PathBuf], out: &Path) -> Result<MergedE2e> {
    let manifests = dirs
        .iter()
        .map(|d| read_manifest(d))
        .collect::<Result<Vec<_>>>()?;
    let shards = check_shards(dirs, &manifests)?;
    check_same_points(dirs)?;
    if dirs.iter().any(|d| same_dir(d, out)) {
        return Err(usage!(
            "--out {}: is one of the shards; give a new directory",
            out.display()
        ));
    }
    let _lock = crate::report::run_lock::create_and_lock(out)?;
    let merged_from = serde_json::json!(dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>());
    refuse_occupied(out, &merged_from)?;
    // Said first, so that an interrupted merge is recognised as this one and rerun.
    let mut manifest = manifests[0].clone();
    manifest["shard"] = serde_json::Value::Null;
    manifest["status"] = serde_json::json!("merging");
    manifest["merged_from"] = merged_from;
    crate::atomic_file::write(
        &out.join("manifest.json"),
        serde_json::to_string_pretty(&manifest)?.as_bytes(),
    )?;
    let mut points = 0;
    for file in [
        "e2e.csv",
        "e2e_layers.csv",
        "e2e_positions.csv",
        "e2e_heads.csv",
    ] {
        let texts = dirs
            .iter()
            .map(|d| std::fs::read_to_string(d.join(file)).ok())
            .collect::<Vec<_>>();
        if texts.iter().all(|t| t.is_none()) {
            continue;
        }
        let merged = join_rows(dirs, file, &texts)?;
        if file == "e2e.csv" {
            points = merged.lines().count() - 1;
        }
        crate::atomic_file::write(&out.join(file), merged.as_bytes())?;
    }
    // Every shard wrote every window's ids; through a temporary name like every other file.
    let ids = dirs[0].join("ids.txt");
    let text =
        std::fs::read(&ids).map_err(|e| usage!("{}: cannot read it ({e})", ids.display()))?;
    crate::atomic_file::write(&out.join("ids.txt"), &text)?;
    super::summary::write(out)?;
    crate::report::figures::e2e::draw(out)?;
    let count = shards[0].1;
    let status = if shards.len() == count {
        "complete"
    } else {
        "partial"
    };
    manifest["status"] = serde_json::json!(status);
    let text = serde_json::to_string_pretty(&manifest)?;
    crate::atomic_file::write(&out.join("manifest.json"), text.as_bytes())?;
    Ok(MergedE2e {
        points,
        shards: shards.len(),
        status: status.into(),
    })
}

/// A merge writes only into an empty directory, or over a merge of the same shards (an interrupted
/// one, or one done before): never over another run, whose manifest it would replace (issue 57).
fn refuse_occupied(out: &Path, merged_from: &serde_json::Value) -> Result<()> {
    let entries: Vec<String> = std::fs::read_dir(out)
        .map_err(|e| usage!("--out {}: cannot read it ({e})", out.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name != crate::report::run_lock::LOCK_FILE)
        .collect();
    if entries.is_empty() {
        return Ok(());
    }
    let old: Option<serde_json::Value> = std::fs::read_to_string(out.join("manifest.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let same_merge = old
        .as_ref()
        .is_some_and(|m| m["kind"] == "e2e" && sorted(&m["merged_from"]) == sorted(merged_from));
    if same_merge {
        return Ok(());
    }
    let holds = match old {
        Some(_) => "a run's manifest.json".to_string(),
        None => format!("{} files", entries.len()),
    };
    Err(usage!(
        "--out {}: holds {holds} (another run, not a merge of these shards); merge into an empty or new directory",
        out.display()
    ))
}

fn sorted(v: &serde_json::Value) -> Option<Vec<String>> {
    let mut list: Vec<String> = v
        .as_array()?
        .iter()
        .map(|x| x.as_str().map(str::to_string))
        .collect::<Option<_>>()?;
    list.sort();
    Some(list)
}

fn read_manifest(dir: &Path) -> Result<serde_json::Value> {
    let path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        usage!(
            "{}: cannot read it ({e}); is it an e2e run?",
            path.display()
        )
    })?;
    serde_json::from_str(&text).map_err(|e| usage!("{}: not valid JSON ({e})", path.display()))
}

/// Each shard's (K, N), after checking that the shards are finished shards of one command.
fn check_shards(dirs: &[PathBuf], manifests: &[serde_json::Value]) -> Result<Vec<(usize, usize)>> {
    let mut shards = Vec::new();
    for (dir, m) in dirs.iter().zip(manifests) {
        if m["kind"] != "e2e" {
            return Err(usage!(
                "{}: not an e2e run; merge e2e shards with e2e shards, sweep shards with sweep shards",
                dir.display()
            ));
        }
        let spec = m["shard"].as_str().ok_or_else(|| {
            usage!(
                "{}: not a shard (it ran without --shard K/N); merge joins shards of one command",
                dir.display()
            )
        })?;
        let shard = crate::config::Shard::parse(spec)?;
        if m["status"] != "partial" {
            return Err(usage!(
                "{}: shard {spec} did not finish (status {}); rerun its command to complete it, then merge",
                dir.display(),
                m["status"]
            ));
        }
        if shards.iter().any(|&(k, _)| k == shard.index) {
            return Err(usage!("{}: shard {spec} is given twice", dir.display()));
        }
        shards.push((shard.index, shard.count));
    }
    for (dir, m) in dirs.iter().zip(manifests).skip(1) {
        for key in [
            "model_id",
            "inputs",
            "window_sha256",
            "dtype",
            "n_f",
            "seed",
            "one_layer",
        ] {
            if m[key] != manifests[0][key] {
                return Err(usage!(
                    "{}: its {key} differs from {}'s; the shards must come from one command",
                    dir.display(),
                    dirs[0].display()
                ));
            }
        }
        if m["shard"]
            .as_str()
            .map(crate::config::Shard::parse)
            .transpose()?
            .map(|s| s.count)
            != Some(shards[0].1)
        {
            return Err(usage!(
                "{}: a shard of another count than {}'s",
                dir.display(),
                dirs[0].display()
            ));
        }
    }
    Ok(shards)
}

/// Refuses shards whose windows ran other points (mode, method, d): shards of commands with other
/// `--methods` or `--features` would merge into a run with holes (issue 57). A shard with no
/// window (more shards than windows) ran nothing and is no witness.
fn check_same_points(dirs: &[PathBuf]) -> Result<()> {
    type Points = std::collections::BTreeSet<String>;
    let mut first: Option<(&PathBuf, Points)> = None;
    for dir in dirs {
        let text = std::fs::read_to_string(dir.join("e2e.csv")).unwrap_or_default();
        let points: Points = text
            .lines()
            .skip(1)
            .filter_map(|l| {
                let f: Vec<&str> = l.splitn(5, ',').collect();
                (f.len() == 5).then(|| format!("{} {} at d = {}", f[1], f[2], f[3]))
            })
            .collect();
        if points.is_empty() {
            continue;
        }
        match &first {
            None => first = Some((dir, points)),
            Some((d0, p0)) if *p0 != points => {
                let only = |a: &Points, b: &Points| {
                    a.difference(b).cloned().collect::<Vec<_>>().join(", ")
                };
                return Err(usage!(
                    "{}: its windows ran other points than {}'s (only here: [{}]; only there: [{}]); the shards must come from one command (the same --methods and --features)",
                    dir.display(),
                    d0.display(),
                    only(&points, p0),
                    only(p0, &points)
                ));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// The complete rows of `file` from every shard under one header (shards hold disjoint
/// windows, so no point appears twice).
fn join_rows(dirs: &[PathBuf], file: &str, texts: &[Option<String>]) -> Result<String> {
    let mut header: Option<&str> = None;
    let mut out = String::new();
    let mut points = std::collections::HashSet::new();
    for (dir, text) in dirs.iter().zip(texts) {
        let Some(text) = text else {
            return Err(usage!(
                "{}: has no {file} where other shards do (run every shard with the same flags)",
                dir.display()
            ));
        };
        let head = text.lines().next().unwrap_or("");
        match header {
            None => {
                header = Some(head);
                out += head;
                out += "\n";
            }
            Some(h) if h != head => {
                return Err(usage!(
                    "{}: its header differs from the first shard's",
                    dir.join(file).display()
                ))
            }
            Some(_) => {}
        }
        let width = head.split(',').count();
        for line in text.split_inclusive('\n').skip(1) {
            if line.ends_with('\n') && line.trim_end().split(',').count() == width {
                // A point (window, mode, method, d) is one shard's: the same point in two shards
                // would be counted twice (issue 57).
                if file == "e2e.csv" {
                    let key: Vec<&str> = line.split(',').take(4).collect();
                    if !points.insert(key.join(",")) {
                        return Err(usage!(
                            "{}: the point (window {}, {} {} at d = {}) is also in another shard; each point must come from one shard (run every shard with the same flags)",
                            dir.join(file).display(),
                            key[0],
                            key[1],
                            key[2],
                            key.get(3).unwrap_or(&"?")
                        ));
                    }
                }
                out += line;
            }
        }
    }
    Ok(out)
}

/// Whether two paths name one directory (either may not exist yet).
fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// `approx-bench merge`: e2e shards merged here, a sweep's or score's by `report::merge` (its
/// console summary printed); the line to say for an e2e merge, None for the others.
pub fn merge_runs(dirs: &[PathBuf], out: &Path) -> Result<Option<String>> {
    if dirs.first().is_some_and(|d| is_e2e_run(d)) {
        let m = merge(dirs, out)?;
        return Ok(Some(format!(
            "{}: {} points from {} shard(s), {}; summary.csv and e2e.png recomputed over every window",
            out.display(),
            m.points,
            m.shards,
            m.status
        )));
    }
    let merged = crate::report::merge::merge(dirs, out)?;
    crate::report::console::print_summary(out, &merged.summary, 0, merged.trials);
    Ok(None)
}
