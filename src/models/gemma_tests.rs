//! gemma2 and gemma3 against transformers' float64 values (fixtures/families), and the config
//! errors that name their field.

use serde_json::Value;

use super::*;
use crate::models::family::tests::check_fixture;

#[test]
fn gemma2_matches_transformers_at_a_sliding_and_a_global_layer() {
    check_fixture("gemma2");
}

#[test]
fn gemma3_matches_transformers_at_a_sliding_and_a_global_layer() {
    check_fixture("gemma3");
}

fn fixture_config(name: &str) -> Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/families")
        .join(name)
        .join("config.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
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
