//! phi3 (window on every layer; longrope with partial rotary, short and long factors) against
//! transformers' float64 values (fixtures/families), and the config errors that name their field.

use serde_json::Value;

use super::*;
use crate::models::decoder::tests::{
    check_fixture, check_fixture_logits, check_logits_hook, fixture_config, one_short,
};
use crate::models::Depth;

#[test]
fn phi3_matches_transformers_with_a_window_on_every_layer() {
    check_fixture("phi3");
}

#[test]
fn phi3_longrope_matches_transformers_with_short_and_long_factors() {
    check_fixture("phi3-longrope");
}

fn config_error(mut v: Value, edit: impl FnOnce(&mut Value)) -> String {
    edit(&mut v);
    let e = Phi3Config::from_json(&v).unwrap_err();
    assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e:#}");
    format!("{e:#}")
}

#[test]
fn bad_phi3_configs_are_usage_errors_naming_the_field() {
    let phi3 = fixture_config("phi3");
    let e = config_error(phi3.clone(), |v| v["sliding_window"] = 0.into());
    assert!(e.contains("sliding_window"), "{e}");
    for field in ["num_attention_heads", "hidden_size", "num_hidden_layers"] {
        let e = config_error(phi3.clone(), |v| {
            v.as_object_mut().unwrap().remove(field);
        });
        assert!(e.contains(field) && e.contains("missing"), "{field}: {e}");
    }
    let long = fixture_config("phi3-longrope");
    let e = config_error(long.clone(), |v| {
        v["rope_parameters"]["long_factor"] = serde_json::json!([1.0, 2.0]);
    });
    assert!(e.contains("long_factor"), "{e}");
    let e = config_error(long, |v| {
        v["rope_parameters"]["rope_type"] = "dynamic".into()
    });
    assert!(e.contains("dynamic"), "{e}");
}

#[test]
fn longrope_reads_the_long_factors_past_n0_and_scales_cos_and_sin() {
    let cfg = Phi3Config::from_json(&fixture_config("phi3-longrope")).unwrap();
    // p = 16, partial 0.75: 12 rotary dims, 6 factors; N₀ = 32, max 128.
    assert_eq!(cfg.rope.rotary_dim, 12);
    let a = (1.0 + 4f64.ln() / 32f64.ln()).sqrt();
    let (short, a_short, w_short) = cfg.rope.at(32);
    let (long, a_long, w_long) = cfg.rope.at(33);
    assert_eq!((w_short, w_long), (Some("short"), Some("long")));
    assert_eq!((a_short, a_long), (a, a));
    // inv_freq_5 = 1/(e_5·θ^(10/12)): short e_5 = 3, long 24.
    let base = 1.0 / 10_000f64.powf(10.0 / 12.0);
    assert!((short[5] - base / 3.0).abs() < 1e-18 && (long[5] - base / 24.0).abs() < 1e-18);
}

/// The GGUF route (fixtures/families/*/model.gguf, written by tests/reference/generate_family_gguf.py
/// as llama.cpp's converter lays a Phi-3 out, F32 tensors) reads the same model as the
/// safetensors route: the same spec and sidecar, and bit-identical Q, K, V in f64, at n on both
/// sides of longrope's switch (GGUF's f32 metadata and rope factors read back as the config's
/// decimals, `gguf::f32_decimal`).
#[test]
fn the_gguf_route_reads_the_same_model_as_safetensors() {
    use crate::models::named_tensors::NamedTensors;
    let dev = candle_core::Device::Cpu;
    for (name, lengths) in [("phi3", &[40usize][..]), ("phi3-longrope", &[20, 40][..])] {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/families")
            .join(name);
        let mut st = NamedTensors::open_file(&dir.join("model.safetensors"), &dev).unwrap();
        let file = GgufFile::open(&dir.join("model.gguf")).unwrap();
        let (config, mut gg) = from_gguf(file, &dev).unwrap();
        let layer = 2;
        let a = load(&fixture_config(name), &mut st, Depth::Through(layer)).unwrap();
        let b = load(&config, &mut gg, Depth::Through(layer)).unwrap();
        assert_eq!(a.shape(), b.shape(), "{name}");
        for &n in lengths {
            let ids: Vec<u32> = (0..n as u32).map(|i| (i * 29 + 3) % 128).collect();
            let (da, db) = (
                a.layer_dump(&ids, DType::F64).unwrap(),
                b.layer_dump(&ids, DType::F64).unwrap(),
            );
            assert_eq!(da.spec, db.spec, "{name}");
            assert_eq!(da.sidecar, db.sidecar, "{name} n = {n}");
            for (x, y) in [(&da.q, &db.q), (&da.k, &db.k), (&da.v, &db.v)] {
                let diff = (x - y).unwrap().abs().unwrap().max_all().unwrap();
                assert_eq!(diff.to_scalar::<f64>().unwrap(), 0.0, "{name} n = {n}");
            }
        }
    }
}

#[test]
fn a_phi3_gguf_without_a_required_key_names_it() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/families/phi3");
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("bad.gguf");
    crate::models::gguf::tests::rewritten(
        &dir.join("model.gguf"),
        &path,
        |k| k != "phi3.attention.head_count",
        &[],
    );
    let e = from_gguf(GgufFile::open(&path).unwrap(), &candle_core::Device::Cpu)
        .err()
        .unwrap();
    assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e:#}");
    assert!(
        format!("{e:#}").contains("phi3.attention.head_count"),
        "{e:#}"
    );
}

/// The whole model's logits against transformers' float64 logits: phi3 (untied LM head, window
/// on every layer), phi3-longrope (tied, long factors at n = 40, short at n = 24).
/// Measured (f64 / f32, max |Δ| / max |ref|), the same bits from safetensors and GGUF: phi3
/// 1.8e-15 / 1.5e-6; phi3-longrope n = 40 1.1e-15 / 8.4e-7, n = 24 1.6e-15 / 7.1e-7.
#[test]
fn phi3_logits_match_transformers() {
    for name in ["phi3", "phi3-longrope"] {
        check_fixture_logits(name, |_| (1e-10, 1e-4));
    }
}

#[test]
fn phi3_logits_take_each_layer_through_the_hook() {
    for name in ["phi3", "phi3-longrope"] {
        check_logits_hook(name, one_short);
    }
}

/// An untied phi3 whose checkpoint lacks lm_head.weight is refused when loaded whole
/// (transformers would draw the head at random), and read when tie_word_embeddings says so.
#[test]
fn a_phi3_without_its_lm_head_loads_whole_only_when_tied() {
    let dev = candle_core::Device::Cpu;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/families/phi3");
    let mut tensors = candle_core::safetensors::load(dir.join("model.safetensors"), &dev).unwrap();
    tensors.remove("lm_head.weight").unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("model.safetensors");
    candle_core::safetensors::save(&tensors, &file).unwrap();
    let mut w = NamedTensors::open_file(&file, &dev).unwrap();
    let mut config = fixture_config("phi3");
    let e = load(&config, &mut w, Depth::Whole).err().unwrap();
    assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e:#}");
    assert!(format!("{e:#}").contains("lm_head.weight"), "{e:#}");
    config["tie_word_embeddings"] = true.into();
    let tied = load(&config, &mut w, Depth::Whole).unwrap();
    let ids: Vec<u32> = (0..8).collect();
    let got = tied.forward_logits(&ids, DType::F64, &crate::models::ExactAttention, 0..8);
    assert_eq!(got.unwrap().dims(), [8, 128]);
}
