//! The §8 methods on the §7.7 families through the CLI (docs/reference.md §7.7.6, issue 45), on
//! the tiny transformers models of `fixtures/families` (p = 16, so the ggml and KIVI caches, which
//! store blocks of 32 along p, are left out): gpt-oss's sink layers, gemma2's capped ones and
//! phi3's, global and sliding, run every other §8 method under the layer's spec; on an MLA layer
//! the KV caches quantize the latent row and KIVI and SageAttention are refused by name.

mod common;

use common::families::*;
use common::*;

/// The §8 methods that take p = 16, with their `kv_bits` and a bound on their relative error
/// (about 3× the largest these layers give: 1e-3, 6.5e-3, 0.057, 0.038, 0.032, 0.34).
const METHODS: [(&str, f64, f64); 6] = [
    ("kv_f16", 16.0, 1e-2),
    ("kv_bf16", 16.0, 2e-2),
    ("kv_fp8", 8.0, 0.15),
    ("sage1", 12.0, 0.1),
    ("sage2_8b", 8.0, 0.1),
    ("sage2_4b", 6.0, 1.0),
];

/// Each family layer's sweep of the §8 methods: finite errors, small for the wide formats
/// (`kv_f16` within 1e-2 relative, `kv_bf16` 2e-2, the 8-bit ones 0.15), every key of the layer read at the
/// method's width (`kv_read` = kv_bits/16 against Σ_i |V_i|), and on the sink layers the real keys'
/// mass, `mass` + `sink_mass` = 1.
#[test]
fn quantized_methods_run_on_sink_capped_and_sliding_layers() {
    let tmp = tempfile::tempdir().unwrap();
    let ids = METHODS.map(|m| m.0).join(",");
    for (name, layer) in [
        ("gpt_oss", 1),
        ("gpt_oss", 0),
        ("gemma2", 1),
        ("gemma2", 0),
        ("phi3", 1),
    ] {
        let (header, rows) = family_sweep(
            tmp.path(),
            name,
            &format!("--lengths 32 --windows 1 --layer {layer} --methods {ids}"),
        );
        let col = |c: &str| header.iter().position(|h| h == c).unwrap();
        let [method, rel, mass, sink_mass, sinks, kv_read] = [
            "method",
            "rel_error",
            "mass",
            "sink_mass",
            "sinks",
            "kv_read",
        ]
        .map(col);
        let mut seen = 0;
        for r in &rows {
            let e: f64 = r[rel].parse().unwrap();
            let &(_, bits, bound) = METHODS.iter().find(|m| m.0 == &r[method]).unwrap();
            assert!(e.is_finite() && e < bound, "{name} layer {layer}: {r:?}");
            let read: f64 = r[kv_read].parse().unwrap();
            assert!((read - bits / 16.0).abs() < 1e-12, "{r:?}");
            let m: f64 = r[mass].parse().unwrap();
            if name == "gpt_oss" {
                assert_eq!(&r[sinks], "true");
                let s: f64 = r[sink_mass].parse().unwrap();
                assert!(s > 1e-3 && (m + s - 1.0).abs() < 1e-9, "{r:?}");
            } else {
                assert_eq!(m, 1.0, "{r:?}");
            }
            seen += 1;
        }
        // 6 methods × 4 query heads, d = 0 once each.
        assert_eq!(seen, 24, "{name} layer {layer}");
    }
}

/// The KV caches on an MLA layer: the latent row [c; k_pe] (64 values here, two ggml blocks)
/// quantized, with the kernel's bits per latent value, and an absorbed read bounded at about 3×
/// the largest relative error these layers give (5.5e-4, 4.6e-3, 0.050, 0.013, 0.082, 0.10,
/// 0.14, 0.14); `kv_read` = kv_bits/16: every key's row, shared by the heads, against the f16
/// latent.
const MLA_CACHES: [(&str, f64, f64); 8] = [
    ("kv_f16", 16.0, 2e-3),
    ("kv_bf16", 16.0, 1.5e-2),
    ("kv_fp8", 8.0, 0.15),
    ("kv_q8_0", 8.5, 0.04),
    ("kv_q5_1", 6.0, 0.25),
    ("kv_q5_0", 5.5, 0.3),
    ("kv_q4_1", 5.0, 0.4),
    ("kv_q4_0", 4.5, 0.45),
];

#[test]
fn the_kv_caches_run_on_an_mla_layers_latent_row() {
    let tmp = tempfile::tempdir().unwrap();
    let ids = MLA_CACHES.map(|m| m.0).join(",");
    for name in ["deepseek_v3", "deepseek_v2"] {
        let (dir, corpus, _) = family_dir(tmp.path(), name);
        let out = tmp.path().join(format!("run-{name}"));
        let o = decoder_cli(
            &dir,
            &corpus,
            &format!(
                "--lengths 32 --windows 1 --layer 1 --methods {ids} --out {} --quiet",
                out.display()
            ),
        );
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let mut rows = csv::Reader::from_path(out.join("trials.csv")).unwrap();
        let header = rows.headers().unwrap().clone();
        let col = |c: &str| header.iter().position(|h| h == c).unwrap();
        let [method, rel, bits_col, kv_read] =
            ["method", "rel_error", "kv_bits", "kv_read"].map(col);
        let mut seen = 0;
        for r in rows.records() {
            let r = r.unwrap();
            let e: f64 = r[rel].parse().unwrap();
            let &(_, bits, bound) = MLA_CACHES.iter().find(|m| m.0 == &r[method]).unwrap();
            assert!(e.is_finite() && e > 0.0 && e < bound, "{name}: {r:?}");
            assert_eq!(r[bits_col].parse::<f64>().unwrap(), bits, "{r:?}");
            let read: f64 = r[kv_read].parse().unwrap();
            assert!((read - bits / 16.0).abs() < 1e-12, "{r:?}");
            seen += 1;
        }
        // 8 caches × 4 heads, d = 0 once each.
        assert_eq!(seen, 32, "{name}");
    }
}

/// An MLA layer refuses KIVI and SageAttention before any window is read, naming them, why
/// (what they do on the latent row is not specified) and what runs instead.
#[test]
fn an_mla_layer_refuses_kivi_and_sage_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, corpus, _) = family_dir(tmp.path(), "deepseek_v3");
    for (methods, refused, others) in [
        (
            "window,kv_f16,sage1,kivi2",
            "sage1,kivi2",
            "run the others with --methods window,kv_f16",
        ),
        (
            "kivi2",
            "kivi2",
            "run the KV caches (kv_f16 … kv_q4_0) or the sparse",
        ),
    ] {
        let out = tmp.path().join("run");
        let o = decoder_cli(
            &dir,
            &corpus,
            &format!(
                "--lengths 32 --windows 1 --layer 1 --features 8 --methods {methods} --out {} --quiet",
                out.display()
            ),
        );
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let e = stderr(&o);
        assert!(
            e.contains("layer 1 of deepseek_v3 is Multi-head Latent Attention")
                && e.contains("what KIVI and SageAttention do on it is not specified")
                && e.contains(&format!("refused there: {refused};"))
                && e.contains(others),
            "{e}"
        );
        assert!(!out.join("trials.csv").exists());
    }
}
