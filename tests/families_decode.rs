//! The decode protocol on the §7.7 families (METHODS.md §7.7.6, §9.1; issue 45): every §9 method
//! and the f16/bf16 caches on gpt-oss's sink layers, gemma2's capped sliding layer and phi3's
//! sliding layer. At d ≥ n_p every method keeps every prompt key and is the layer's own target;
//! on a sliding layer the grid stops at d = W, where `dec_window` already covers the window; on a
//! sink layer `mass` + `sink_mass` = 1 there.

mod common;

use common::families::*;
use common::*;

const METHODS: &str = "dec_window,dec_streaming,snapkv,snapkv_avg5,pyramidkv,adakv,h2o_dec,tova,quest_dec,topk_dec,evict_oracle,kv_f16,kv_bf16";

#[test]
fn every_decode_method_runs_on_the_families_layers_and_is_exact_with_every_key() {
    let tmp = tempfile::tempdir().unwrap();
    // (fixture, layer, its window W or none); n = 40, n_f = 8, so n_p = 32.
    for (name, layer, window) in [
        ("gpt_oss", 1, None),
        ("gpt_oss", 0, Some(16)),
        ("gemma2", 0, Some(16)),
        ("phi3", 1, Some(16)),
    ] {
        let (header, rows) = family_sweep(
            tmp.path(),
            name,
            &format!("--lengths 40 --windows 1 --decode 8 --layer {layer} --features 8,16,32 --methods {METHODS}"),
        );
        let col = |c: &str| header.iter().position(|h| h == c).unwrap();
        let [method, d, rel, mass, sink_mass, n_f] =
            ["method", "d", "rel_error", "mass", "sink_mass", "n_f"].map(col);
        let mut seen = 0;
        for r in &rows {
            let (m, dd): (&str, usize) = (&r[method], r[d].parse().unwrap());
            let e: f64 = r[rel].parse().unwrap();
            assert_eq!(&r[n_f], "8");
            assert!(e.is_finite(), "{name} {layer}: {r:?}");
            if let Some(w) = window {
                assert!(dd <= w, "the grid stops at d = W: {r:?}");
            }
            let every_key = dd >= 32 || (m == "dec_window" && window.is_some_and(|w| dd >= w));
            if m.starts_with("kv_") {
                let bound = if m == "kv_f16" { 1e-2 } else { 5e-2 };
                assert!(e < bound, "{name} {layer}: {r:?}");
            } else if every_key {
                assert!(e < 1e-5, "{name} {layer}: {r:?}");
            }
            if name == "gpt_oss" && (every_key || m.starts_with("kv_")) {
                let (a, b): (f64, f64) = (r[mass].parse().unwrap(), r[sink_mass].parse().unwrap());
                assert!(b > 1e-3 && (a + b - 1.0).abs() < 1e-5, "{r:?}");
            }
            seen += 1;
        }
        assert!(seen >= 4 * 13, "{name} {layer}: {seen} rows");
    }
}

/// On an MLA layer (DeepSeek-V3) the §9 methods decode the materialised heads under the layer's τ,
/// exact once they keep every prompt key; the §8 latent cache has no decode form yet and is
/// refused by name before a window is read, naming the methods that do run.
#[test]
fn an_mla_layer_decodes_with_the_section_9_methods_and_refuses_the_latent_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, corpus, _) = family_dir(tmp.path(), "deepseek_v3");
    let out = tmp.path().join("dec");
    let run_with = |methods: &str| {
        decoder_cli(
            &dir,
            &corpus,
            &format!(
                "--lengths 40 --windows 1 --decode 8 --layer 1 --features 8,32 --methods {methods} --out {} --quiet --force",
                out.display()
            ),
        )
    };
    let o = run_with("dec_window,snapkv,kv_f16");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("latent-row cache has no decode form yet")
            && stderr(&o)
                .contains("refused there: kv_f16; run the others with --methods dec_window,snapkv"),
        "{}",
        stderr(&o)
    );
    let o = run_with("dec_window,snapkv,h2o_dec,topk_dec");
    assert!(o.status.success(), "{}", stderr(&o));
    let mut rows = csv::Reader::from_path(out.join("trials.csv")).unwrap();
    let header = rows.headers().unwrap().clone();
    let col = |c: &str| header.iter().position(|h| h == c).unwrap();
    let (d, rel) = (col("d"), col("rel_error"));
    let mut exact = 0;
    for r in rows.records() {
        let r = r.unwrap();
        let e: f64 = r[rel].parse().unwrap();
        assert!(e.is_finite(), "{r:?}");
        if &r[d] == "32" {
            assert!(e < 1e-5, "{r:?}");
            exact += 1;
        }
    }
    assert!(exact >= 4 * 4, "{exact}");
}
