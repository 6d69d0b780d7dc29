//! gemma2 and gemma3 against transformers' float64 values (fixtures/families), and the config
//! errors that name their field.

use serde_json::Value;

use super::*;
use crate::models::family::tests::{check_fixture, fixture_config};
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
