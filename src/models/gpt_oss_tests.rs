use super::*;
use crate::models::Depth;
use serde_json::Map;

#[test]
fn gpt_oss_fixture_matches_transformers() {
    crate::models::decoder::tests::check_fixture("gpt_oss");
}

fn fixture_config() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/families/gpt_oss/config.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn parse_error(edit: impl FnOnce(&mut Map<String, Value>)) -> String {
    let mut v = fixture_config();
    edit(v.as_object_mut().unwrap());
    let e = GptOssConfig::parse(&v, "cfg").unwrap_err();
    assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e}");
    e.to_string()
}

#[test]
fn config_fields_and_defaults() {
    let c = GptOssConfig::parse(&fixture_config(), "cfg").unwrap();
    assert_eq!(
        (
            c.heads,
            c.kv_heads,
            c.head_dim,
            c.experts,
            c.experts_per_token
        ),
        (4, 2, 16, 4, 2)
    );
    assert_eq!(c.sliding_window, Some(16));
    assert_eq!(c.spec_without_sinks(2).window, Some(16));
    assert_eq!(c.spec_without_sinks(3).window, None);
    let mut v = fixture_config();
    let o = v.as_object_mut().unwrap();
    o.remove("layer_types");
    o.remove("sliding_window");
    let c = GptOssConfig::parse(&v, "cfg").unwrap();
    // transformers' defaults: even layers slide, W = 128.
    assert_eq!(c.layer_types[0], LayerType::Sliding);
    assert_eq!(c.layer_types[1], LayerType::Full);
    assert_eq!(c.spec_without_sinks(0).window, Some(128));
}

#[test]
fn bad_configs_are_usage_errors_naming_the_field() {
    let e = parse_error(|o| {
        o.insert("num_key_value_heads".into(), 3.into());
    });
    assert!(e.contains("num_key_value_heads"), "{e}");
    let e = parse_error(|o| {
        o.insert(
            "layer_types".into(),
            serde_json::json!(["sliding_attention"]),
        );
    });
    assert!(e.contains("layer_types"), "{e}");
    let e = parse_error(|o| {
        o.insert(
            "layer_types".into(),
            serde_json::json!(["a", "b", "c", "d"]),
        );
    });
    assert!(e.contains("layer_types[0]"), "{e}");
    let e = parse_error(|o| {
        o.insert("num_experts_per_tok".into(), 9.into());
    });
    assert!(e.contains("num_experts_per_tok"), "{e}");
    let e = parse_error(|o| {
        o.remove("num_local_experts");
    });
    assert!(e.contains("num_local_experts"), "{e}");
    let e = parse_error(|o| {
        o["rope_parameters"]["rope_type"] = "longrope".into();
    });
    assert!(e.contains("longrope"), "{e}");
}

#[test]
fn a_layer_past_the_model_or_a_missing_tensor_is_a_usage_error() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/families/gpt_oss/model.safetensors"
    );
    let mut w =
        NamedTensors::open_file(std::path::Path::new(dir), &candle_core::Device::Cpu).unwrap();
    let e = load(&fixture_config(), &mut w, Depth::Through(4))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("layer 4"), "{e}");
    let mut v = fixture_config();
    v["num_local_experts"] = 5.into();
    let e = load(&v, &mut w, Depth::Through(1))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("model.layers.0.mlp.router.weight"), "{e}");
}

/// Measured (safetensors and GGUF alike): f64 2.0e-15, f32 1.7e-6 (transformers' own f32 floor on
/// these logits is ≤ 1.9e-6, fixtures/families/README.md). 1e-5 in f32 is about 5× that: no
/// router choice flips in f32 on this window (a flipped top-2 expert moves the logits by far more).
#[test]
fn gpt_oss_whole_model_logits_match_transformers() {
    crate::models::decoder::tests::check_fixture_logits("gpt_oss", |_| (1e-10, 1e-5));
}

/// Every layer reaches the hook once, in order, with its own spec: the sliding (even, W = 16) and
/// global (odd) layers alternate, and each layer brings its own sinks. O with H_kv heads instead
/// of H (K's shape) is refused, as are logits of a partial model.
#[test]
fn gpt_oss_hook_sees_every_layer_with_its_own_spec() {
    let calls = crate::models::decoder::tests::check_logits_hook("gpt_oss", |_, k, _| k.clone());
    let windows: Vec<Option<usize>> = calls.iter().map(|c| c.1.window).collect();
    assert_eq!(windows, [Some(16), None, Some(16), None]);
    let sinks: Vec<Vec<f64>> = calls.iter().map(|c| c.1.sinks.clone().unwrap()).collect();
    for (l, s) in sinks.iter().enumerate() {
        assert_eq!(s.len(), 4, "layer {l}");
        assert!(
            sinks[..l].iter().all(|t| t != s),
            "layer {l}'s sinks repeat"
        );
    }
}
