//! `approx-bench e2e` on the §7.7 families (docs/reference.md §10 on §7.7): the exact run's
//! next-token NLL at every scored position against transformers' own float64 logits of the
//! fixture, every layer measured under its own spec (soft-caps, windows, sinks, MLA), the
//! exactness limits at a budget that covers every key, and the refusals by name.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, D};
use common::families::*;
use common::*;

/// n = 40 tokens in every fixture's expected window; n_f = 8, so n_p = 32.
const N: usize = 40;
const N_F: usize = 8;

/// The e2e run of fixture `name` on its expected ids with `flags`, in f64, into a directory of
/// its own; its output.
fn family_e2e(tmp: &Path, name: &str, flags: &str) -> (std::process::Output, PathBuf) {
    let (dir, corpus, ids) = family_dir(tmp, name);
    let ids_file = tmp.join(format!("{name}-ids.txt"));
    let line: Vec<String> = ids.iter().map(u32::to_string).collect();
    std::fs::write(&ids_file, line.join(" ") + "\n").unwrap();
    let out = tmp.join(format!("e2e-{name}"));
    let o = decoder_cli(
        &dir,
        &corpus,
        &format!(
            "e2e --ids {} --n-f {N_F} --dtype f64 --quiet --out {} {flags}",
            ids_file.display(),
            out.display()
        ),
    );
    (o, out)
}

/// −log p(ids[i+1]) at every row i of transformers' float64 logits of the fixture.
fn reference_nll(name: &str) -> Vec<f64> {
    let t = expected(name, "expected.safetensors");
    let logits = t["logits"].to_dtype(DType::F64).unwrap();
    let ids: Vec<i64> = t["ids"].to_dtype(DType::I64).unwrap().to_vec1().unwrap();
    let max = logits.max_keepdim(D::Minus1).unwrap();
    let shifted = logits.broadcast_sub(&max).unwrap();
    let lse = shifted
        .exp()
        .unwrap()
        .sum_keepdim(D::Minus1)
        .unwrap()
        .log()
        .unwrap();
    let logp: Vec<Vec<f64>> = shifted.broadcast_sub(&lse).unwrap().to_vec2().unwrap();
    (0..ids.len() - 1)
        .map(|i| -logp[i][ids[i + 1] as usize])
        .collect()
}

fn field(r: &HashMap<String, String>, c: &str) -> f64 {
    r[c].parse().unwrap_or_else(|_| panic!("{c} = {}", r[c]))
}

/// Every family's exact run is transformers' forward: the NLL at each scored position within
/// 1e-9 of the fixture's float64 logits (relative to max(|NLL|, 1)), so every layer ran with its
/// own spec (a missed cap, window, sink or MLA detail moves the logits by far more). At a budget
/// covering every key each method is the exact run (KL at f64's floor); below the layer's window or
/// the prompt the output moves.
#[test]
fn the_exact_run_of_every_family_is_transformers_and_every_key_is_exact() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["gemma2", "gemma3", "phi3", "gpt_oss", "deepseek_v3"] {
        let (o, out) = family_e2e(
            tmp.path(),
            name,
            &format!("--methods window,topk,snapkv,dec_window --features 8,{N} --positions"),
        );
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let want = reference_nll(name);
        let positions = csv_records(&out.join("e2e_positions.csv"));
        assert_eq!(positions.len(), 4 * 2 * N_F, "{name}");
        for r in &positions {
            let i = r["position"].parse::<usize>().unwrap();
            assert!((N - N_F - 1..N - 1).contains(&i), "{name}: position {i}");
            let got = field(r, "nll_exact");
            assert!(
                (got - want[i]).abs() <= 1e-9 * want[i].abs().max(1.0),
                "{name}: NLL at {i}: {got} against transformers' {}",
                want[i]
            );
        }
        for r in csv_records(&out.join("e2e.csv")) {
            let (m, d) = (&r["method"], &r["d"]);
            let (kl, op) = (field(&r, "kl_mean"), field(&r, "op_err_mean"));
            if d == &N.to_string() {
                assert!(kl < 1e-13, "{name}: {m} at d = n: kl_mean {kl}");
                assert!(op < 1e-12, "{name}: {m} at d = n: op_err_mean {op}");
            } else {
                // The layers' error, not the KL: gemma3's fixture (tied head, no final cap,
                // embeddings scaled by √hidden) puts nearly all its mass on one token, so its KL
                // sits at f64's floor whatever the layers do.
                assert!(op > 1e-3, "{name}: {m} at d = 8: op_err_mean {op}");
            }
        }
        let layers = csv_records(&out.join("e2e_layers.csv"));
        assert!(
            layers.iter().all(|r| field(r, "abs_error").is_finite()),
            "{name}"
        );
    }
}

/// What a layer's spec is beyond, or on MLA what the sweep refuses there (KIVI, and every §8
/// cache read under the decode protocol), is refused before any window runs, naming the method,
/// the layer and the feature; nothing is written.
#[test]
fn a_method_a_familys_layer_cannot_have_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, flags, needle) in [
        (
            "gemma2",
            "--methods window,performer_favor --features 8",
            "--methods performer_favor: layer 0 has a logit soft-cap",
        ),
        (
            "gpt_oss",
            "--methods snapkv,dkivi2 --features 8",
            "--methods dkivi2: layer 0 has a sliding window",
        ),
        (
            "deepseek_v3",
            "--methods window,kv_q8_0,kivi2 --features 8",
            "--methods kivi2: the model's layers are Multi-head Latent Attention",
        ),
        (
            "deepseek_v3",
            "--methods snapkv,dkv_q8_0 --features 8",
            "--methods dkv_q8_0: the model's layers are Multi-head Latent Attention, whose cache holds one latent row [c; k_pe] per token, not per-head K/V; the latent-row cache has no decode form yet",
        ),
    ] {
        let (o, out) = family_e2e(tmp.path(), name, flags);
        assert_eq!(o.status.code(), Some(2), "{name}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{name}: {}", stderr(&o));
        assert!(!out.join("e2e.csv").exists(), "{name}");
    }
}

/// DeepSeek-V3's KV caches end to end quantize each MLA layer's latent row [c; k_pe] (r + d_R =
/// 64 values; the ggml formats' blocks of 32 do not fit p_qk = 24, so a run on the materialised
/// K/V would be refused): the output moves (finite, positive KL), every layer reads at the
/// format's width (kv_read = kv_bits/16, against the f16 latent cache), and the one-layer view of
/// layer 1 is the sweep's error on the same window and layer (mean over heads, 1e-12 relative).
#[test]
fn the_kv_caches_run_end_to_end_on_mla_and_their_one_layer_view_is_the_sweeps() {
    let tmp = tempfile::tempdir().unwrap();
    let caches = [("kv_f16", 16.0), ("kv_q8_0", 8.5), ("kv_q4_0", 4.5)];
    let ids = caches.map(|c| c.0).join(",");
    let (dir, corpus, _) = family_dir(tmp.path(), "deepseek_v3");
    let (e2e, sweep) = (tmp.path().join("e2e"), tmp.path().join("sweep"));
    let common = format!("--lengths 32 --windows 1 --dtype f64 --quiet --methods {ids}");
    let o = decoder_cli(
        &dir,
        &corpus,
        &format!("e2e {common} --n-f 8 --one-layer 1 --out {}", e2e.display()),
    );
    assert!(o.status.success(), "e2e: {}", stderr(&o));
    let o = decoder_cli(
        &dir,
        &corpus,
        &format!("{common} --layer 1 --out {}", sweep.display()),
    );
    assert!(o.status.success(), "sweep: {}", stderr(&o));
    let trials = csv_records(&sweep.join("trials.csv"));
    let rows = csv_records(&e2e.join("e2e.csv"));
    assert_eq!(rows.len(), caches.len());
    for r in &rows {
        let m = &r["method"];
        let bits = caches.iter().find(|c| c.0 == m).unwrap().1;
        let kl = field(r, "kl_mean");
        assert!(kl.is_finite() && kl > 0.0, "{m}: kl_mean {kl}");
        assert_eq!(field(r, "kv_read"), bits / 16.0, "{m}");
        let heads: Vec<f64> = trials
            .iter()
            .filter(|t| &t["method"] == m)
            .map(|t| field(t, "error"))
            .collect();
        assert_eq!(heads.len(), 4, "{m}");
        let want = heads.iter().sum::<f64>() / 4.0;
        let got = field(r, "one_layer_err_l1");
        assert!(
            (got - want).abs() <= 1e-12 * want,
            "{m}: one-layer error {got} against the sweep's {want}"
        );
    }
    let layers = csv_records(&e2e.join("e2e_layers.csv"));
    assert_eq!(layers.len(), caches.len() * 3);
    for r in &layers {
        let bits = caches.iter().find(|c| c.0 == r["method"]).unwrap().1;
        assert_eq!(field(r, "kv_read"), bits / 16.0, "{r:?}");
        assert!(field(r, "rel_error") > 0.0, "{r:?}");
    }
}
