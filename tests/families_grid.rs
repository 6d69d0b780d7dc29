//! A family's sliding layers through the sweep (METHODS.md §7.7.6, issue 45): the d grid's stop at
//! the first d ≥ W in the sweep, `merge` and the manifest, `macs` at min(d, W), the default global
//! layer, and `performer_favor` on sink and sliding layers.

mod common;

use std::path::{Path, PathBuf};

use common::families::*;
use common::*;
use serde_json::Value;

/// The d grid on a sliding layer (§7.7.6): gemma2's layer 0 (W = 16) stops the grid 8, 20, 24 at
/// 20, its first d ≥ W, in the sweep, in `merge`'s count of a complete run (two shards: n = 24
/// and n = 32) and in the manifest; `macs` there is counted at min(d, W) = 16, as the global
/// layer's `window` at d = 16. Without `--layer` the sweep measures the first global layer, 1.
#[test]
fn a_sliding_layers_grid_stops_at_the_window_and_a_default_sweep_is_global() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, corpus, _) = family_dir(tmp.path(), "gemma2");
    let sweep = |out: &Path, flags: &str| {
        let o = decoder_cli(
            &dir,
            &corpus,
            &format!(
                "--lengths 24,32 --windows 1 --methods window,topk --out {} --quiet {flags}",
                out.display()
            ),
        );
        assert!(o.status.success(), "{flags}: {}", stderr(&o));
        stderr(&o)
    };
    let read = |out: &Path| -> Vec<csv::StringRecord> {
        let mut r = csv::Reader::from_path(out.join("trials.csv")).unwrap();
        let h = r.headers().unwrap().clone();
        let mut rows: Vec<_> = r.records().map(|x| x.unwrap()).collect();
        rows.insert(0, h);
        rows
    };
    let col = |rows: &[csv::StringRecord], name: &str| -> Vec<String> {
        let c = rows[0].iter().position(|h| h == name).unwrap();
        rows[1..].iter().map(|r| r[c].to_string()).collect()
    };

    let global = tmp.path().join("global");
    let said = sweep(&global, "--features 16");
    assert!(said.contains("no --layer given; layer 1"), "{said}");
    let g = read(&global);
    assert!(col(&g, "layer").iter().all(|l| l == "1"));
    assert!(col(&g, "sliding_window").iter().all(|w| w.is_empty()));

    let parts: Vec<PathBuf> = (1..=2)
        .map(|k| {
            let part = tmp.path().join(format!("part{k}"));
            sweep(
                &part,
                &format!("--layer 0 --features 8,20,24 --shard {k}/2"),
            );
            part
        })
        .collect();
    let merged = tmp.path().join("merged");
    let mut args = vec!["merge", "--out", merged.to_str().unwrap()];
    args.extend(parts.iter().map(|p| p.to_str().unwrap()));
    let o = run(&args, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(merged.join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["status"], "complete", "{manifest}");
    assert_eq!(manifest["sliding_window"], 16);
    let s = read(&merged);
    // 2 lengths × 4 heads × 2 methods × d ∈ {8, 20}.
    assert_eq!(manifest["trials"], 32);
    assert_eq!(s.len() - 1, 32);
    let mut ds = col(&s, "d");
    ds.sort();
    ds.dedup();
    assert_eq!(ds, ["20", "8"]);
    let macs_at = |rows: &[csv::StringRecord], method: &str, d: &str| -> Vec<String> {
        let (m, dd, mc) = (col(rows, "method"), col(rows, "d"), col(rows, "macs"));
        let n = col(rows, "n");
        (0..m.len())
            .filter(|&i| m[i] == method && dd[i] == d && n[i] == "32")
            .map(|i| mc[i].clone())
            .collect()
    };
    let at_w = macs_at(&g, "window", "16");
    assert!(!at_w.is_empty());
    assert_eq!(macs_at(&s, "window", "20")[0], at_w[0]);
    // Below the window the budget itself counts.
    assert_ne!(macs_at(&s, "window", "8")[0], at_w[0]);
}

/// `performer_favor` on gpt-oss's sink layers, sliding and global, and on phi3's sliding layer
/// (§7.7.6: √τ, the window's prefix sums, the sink in its denominator): the sweep runs it at
/// every d of the layer's grid, with finite errors; gemma2's cap still refuses it (above).
#[test]
fn performer_favor_runs_on_sink_and_sliding_layers() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, layer, grid) in [
        ("gpt_oss", 0, &["4", "16"][..]),
        ("gpt_oss", 1, &["4", "16", "32"]),
        ("phi3", 1, &["4", "16"]),
    ] {
        let (header, rows) = family_sweep(
            tmp.path(),
            name,
            &format!("--lengths 32 --windows 1 --layer {layer} --features 4,16,32 --methods performer_favor"),
        );
        let col = |c: &str| header.iter().position(|h| h == c).unwrap();
        let (d, rel) = (col("d"), col("rel_error"));
        let mut ds: Vec<&str> = rows.iter().map(|r| &r[d]).collect();
        ds.sort_by_key(|d| d.parse::<usize>().unwrap());
        ds.dedup();
        // The sliding layers' grid stops at d = 16 = W; the global one keeps the whole grid.
        assert_eq!(ds, grid, "{name} layer {layer}");
        for r in &rows {
            let e: f64 = r[rel].parse().unwrap();
            assert!(
                e.is_finite() && e > 0.0 && e < 3.0,
                "{name} layer {layer}: {r:?}"
            );
        }
    }
}

/// `bench` times a family's layer under its own target, as a sweep measures it: gpt-oss's layer 0
/// (sinks, W = 16) says so, its d grid stops at W as the sweep's, and a method the sweep refuses
/// there (`kivi2` on DeepSeek's MLA layer) is refused before any timing.
#[test]
fn bench_times_a_family_layer_under_its_own_target() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, corpus, _) = family_dir(tmp.path(), "gpt_oss");
    let o = decoder_cli(
        &dir,
        &corpus,
        "bench --lengths 40 --layer 0 --methods window --features 8,16,32 --repeats 1",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("the layer's own target: causal, window 16"),
        "{out}"
    );
    let ds: Vec<&str> = out
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("window "))
        .map(|rest| rest.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(ds, ["8", "16"], "{out}");
    let (dir, corpus, _) = family_dir(tmp.path(), "deepseek_v3");
    let o = decoder_cli(
        &dir,
        &corpus,
        "bench --lengths 40 --layer 1 --methods kv_q8_0,kivi2 --repeats 1",
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("so these methods are refused there: kivi2"),
        "{}",
        stderr(&o)
    );
}
