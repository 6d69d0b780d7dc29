//! gemma2 and gemma3 against transformers' float64 values (fixtures/families), and the config
//! errors that name their field.

use serde_json::Value;

use super::*;
use crate::models::decoder::tests::{
    check_fixture, check_fixture_logits, check_logits_hook, fixture_config, one_short, whole_models,
};
use crate::models::Depth;

#[test]
fn gemma2_matches_transformers_at_a_sliding_and_a_global_layer() {
    check_fixture("gemma2");
}

#[test]
fn gemma3_matches_transformers_at_a_sliding_and_a_global_layer() {
    check_fixture("gemma3");
}

fn config_error(mut v: Value, edit: impl FnOnce(&mut Value)) -> String {
    edit(&mut v);
    let variant = match v["model_type"].as_str().unwrap() {
        "gemma2" => Variant::Gemma2,
        _ => Variant::Gemma3,
    };
    let e = GemmaConfig::from_json(&v, variant, "test").unwrap_err();
    assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e:#}");
    format!("{e:#}")
}

#[test]
fn bad_gemma_configs_are_usage_errors_naming_the_field() {
    let g2 = fixture_config("gemma2");
    let e = config_error(g2.clone(), |v| {
        v["layer_types"][1] = "chunked_attention".into()
    });
    assert!(
        e.contains("layer_types") && e.contains("chunked_attention"),
        "{e}"
    );
    let e = config_error(g2.clone(), |v| v["sliding_window"] = 0.into());
    assert!(e.contains("sliding_window") && e.contains("0"), "{e}");
    for field in [
        "hidden_size",
        "query_pre_attn_scalar",
        "attn_logit_softcapping",
        "sliding_window",
    ] {
        let e = config_error(g2.clone(), |v| {
            v.as_object_mut().unwrap().remove(field);
        });
        assert!(e.contains(field) && e.contains("missing"), "{field}: {e}");
    }
    let e = config_error(g2.clone(), |v| v["attn_logit_softcapping"] = 0.0.into());
    assert!(
        e.contains("attn_logit_softcapping") && e.contains("soft-cap is 0"),
        "{e}"
    );
    let e = config_error(g2, |v| {
        v["layer_types"] = serde_json::json!(["full_attention"])
    });
    assert!(e.contains("layer_types") && e.contains("1 entries"), "{e}");
    let g3 = fixture_config("gemma3");
    let e = config_error(g3.clone(), |v| v["layer_types"][0] = "local".into());
    assert!(e.contains("layer_types\"[0]"), "{e}");
    let e = config_error(g3, |v| {
        v["rope_parameters"]
            .as_object_mut()
            .unwrap()
            .remove("sliding_attention");
    });
    assert!(
        e.contains("rope_parameters") && e.contains("sliding_attention"),
        "{e}"
    );
}

#[test]
fn the_multimodal_gemma3_wrapper_reads_its_language_model() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/families/gemma3");
    let dev = candle_core::Device::Cpu;
    let text = fixture_config("gemma3");
    let mut plain = NamedTensors::open_file(&dir.join("model.safetensors"), &dev).unwrap();
    let want = load(&text, &mut plain, Depth::Through(5)).unwrap();
    // The hub's layout: text_config, and the language model's tensors under
    // language_model.model. beside a vision tower that is not read.
    let tensors = candle_core::safetensors::load(dir.join("model.safetensors"), &dev).unwrap();
    let mut wrapped: std::collections::HashMap<String, candle_core::Tensor> = tensors
        .into_iter()
        .map(|(k, t)| (format!("language_model.{k}"), t))
        .collect();
    wrapped.insert(
        "vision_tower.weight".into(),
        candle_core::Tensor::zeros(3, candle_core::DType::F32, &dev).unwrap(),
    );
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("model.safetensors");
    candle_core::safetensors::save(&wrapped, &file).unwrap();
    let config = serde_json::json!({"model_type": "gemma3", "text_config": text});
    let mut w = NamedTensors::open_file(&file, &dev).unwrap();
    let got = load(&config, &mut w, Depth::Through(5)).unwrap();
    assert_eq!(got.attention_spec(5), want.attention_spec(5));
    let ids: Vec<u32> = (0..20).map(|i| (i * 7 % 128) as u32).collect();
    let (a, b) = (
        got.layer_dump(&ids, candle_core::DType::F64).unwrap(),
        want.layer_dump(&ids, candle_core::DType::F64).unwrap(),
    );
    for (x, y) in [(&a.q, &b.q), (&a.k, &b.k), (&a.v, &b.v)] {
        let d = (x - y).unwrap().abs().unwrap().max_all().unwrap();
        assert_eq!(d.to_scalar::<f64>().unwrap(), 0.0);
    }
    // Without text_config, or with the language model elsewhere: refused, saying what is missing.
    let e = load(
        &serde_json::json!({"model_type": "gemma3"}),
        &mut w,
        Depth::Through(0),
    )
    .err()
    .unwrap();
    assert!(format!("{e:#}").contains("text_config"), "{e:#}");
    let e = load(&config, &mut plain, Depth::Through(0)).err().unwrap();
    assert!(format!("{e:#}").contains("language_model.model."), "{e:#}");
}

/// The whole model's logits against transformers' float64 logits (gemma2's final cap 6 applied).
/// Measured (f64 / f32, max |Δ| / max |ref|): gemma2 2.0e-15 / 1.1e-6, gemma3 5.2e-16 / 2.2e-7
/// from safetensors. From GGUF the f32 logits are the same bits, the f64 ones 1.5e-7 (gemma2) and
/// 2.0e-8 (gemma3) off, hence its 1e-6: the file stores the norms as f32 1 + w
/// (`the_gguf_logits_differ_only_by_the_stored_norms`).
#[test]
fn gemma_logits_match_transformers() {
    for name in ["gemma2", "gemma3"] {
        check_fixture_logits(name, |route| match route {
            "safetensors" => (1e-10, 1e-4),
            _ => (1e-6, 1e-4),
        });
    }
}

#[test]
fn gemma_logits_take_each_layer_through_the_hook() {
    for name in ["gemma2", "gemma3"] {
        check_logits_hook(name, one_short);
    }
    // gemma2's alternation, which the hook's specs were compared with: W = 16 on even layers,
    // none on odd ones, the cap 8 on every layer.
    let (_, model) = whole_models("gemma2").swap_remove(0);
    let specs: Vec<_> = (0..4).map(|l| model.attention_spec(l)).collect();
    let windows: Vec<_> = specs.iter().map(|s| s.window).collect();
    assert_eq!(windows, [Some(16), None, Some(16), None]);
    assert!(specs.iter().all(|s| s.softcap == Some(8.0)));
}

#[test]
fn gemma2_needs_a_positive_final_cap_to_load_whole() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/families/gemma2");
    let dev = candle_core::Device::Cpu;
    // Absent (refused, not the class default), and 0 (no cap).
    for (says, cap) in [("missing", None), ("positive", Some(0.0))] {
        let mut config = fixture_config("gemma2");
        match cap {
            Some(c) => config["final_logit_softcapping"] = c.into(),
            None => {
                config
                    .as_object_mut()
                    .unwrap()
                    .remove("final_logit_softcapping");
            }
        }
        let mut w = NamedTensors::open_file(&dir.join("model.safetensors"), &dev).unwrap();
        // A dump does not read the head.
        load(&config, &mut w, Depth::Through(3)).unwrap();
        let e = load(&config, &mut w, Depth::Whole).err().unwrap();
        assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e:#}");
        let e = format!("{e:#}");
        assert!(
            e.contains("final_logit_softcapping") && e.contains(says),
            "{e}"
        );
    }
}

/// Why the GGUF route's f64 logits are 2e-8 (gemma3) – 1.5e-7 (gemma2) from transformers' while
/// safetensors' are 2e-15: the GGUF stores each norm as 1 + w in f32, so the w it gives back is
/// f32(1 + w) − 1, not w. The safetensors model with its norms rounded so gives the GGUF route's
/// f64 logits bit for bit (and its f32 logits were already equal: both form f32(1 + w)).
#[test]
fn the_gguf_logits_differ_only_by_the_stored_norms() {
    let dev = candle_core::Device::Cpu;
    for name in ["gemma2", "gemma3"] {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/families")
            .join(name);
        let tensors = candle_core::safetensors::load(dir.join("model.safetensors"), &dev).unwrap();
        let rounded: std::collections::HashMap<String, Tensor> = tensors
            .into_iter()
            .map(|(k, t)| {
                let t = match k.ends_with("norm.weight") {
                    true => ((t + 1.0).unwrap() - 1.0).unwrap(),
                    false => t,
                };
                (k, t)
            })
            .collect();
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("model.safetensors");
        candle_core::safetensors::save(&rounded, &file).unwrap();
        let mut w = NamedTensors::open_file(&file, &dev).unwrap();
        let st = load(&fixture_config(name), &mut w, Depth::Whole).unwrap();
        let (route, gguf) = whole_models(name).pop().unwrap();
        assert_eq!(route, "gguf");
        let ids: Vec<u32> = (0..40u32).map(|i| (i * 29 + 3) % 128).collect();
        let exact = crate::models::ExactAttention;
        for dtype in [DType::F64, DType::F32] {
            let a = st.forward_logits(&ids, dtype, &exact, 0..40).unwrap();
            let b = gguf.forward_logits(&ids, dtype, &exact, 0..40).unwrap();
            let d = (a - b).unwrap().abs().unwrap().max_all().unwrap();
            let d = d.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap();
            assert_eq!(d, 0.0, "{name} {dtype:?}");
        }
    }
}
