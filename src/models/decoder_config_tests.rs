//! decoder_config.rs's tests: the families' config.json fields, RoPE parameters and bad configs.

use super::*;

fn base(extra: &str) -> String {
    format!(
        r#"{{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_hidden_layers": 2, "intermediate_size": 96, "vocab_size": 100, "rms_norm_eps": 1e-5{extra}}}"#
    )
}

#[test]
fn defaults_and_derived_fields() {
    let c = DecoderConfig::from_json(&base(""), "c.json").unwrap();
    assert_eq!(c.head_dim, 16);
    assert_eq!(c.initializer_range, 0.02);
    assert_eq!(c.rope.theta, 10000.0);
    assert_eq!(c.rope.scaling, RopeScaling::Default);
    assert!(!c.qkv_bias && !c.qk_norm);
    assert_eq!(
        (0..4).map(|h| c.kv_head(h)).collect::<Vec<_>>(),
        [0, 0, 1, 1]
    );
    let no_kv = base("").replace(r#""num_key_value_heads": 2,"#, "");
    assert_eq!(
        DecoderConfig::from_json(&no_kv, "c")
            .unwrap()
            .num_key_value_heads,
        4
    );
}

#[test]
fn transformers5_rope_parameters() {
    let c = DecoderConfig::from_json(
        &base(r#", "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}"#),
        "c",
    )
    .unwrap();
    assert_eq!(c.rope.theta, 100000.0);
    let c = DecoderConfig::from_json(
        &base(
            r#", "rope_theta": 500000.0, "rope_scaling": {"type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}"#,
        ),
        "c",
    )
    .unwrap();
    assert_eq!(c.rope.theta, 500000.0);
    assert!(matches!(c.rope.scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
}

#[test]
fn a_rope_scaling_that_is_not_an_object_is_refused_and_null_is_none() {
    for bad in [r#""yes""#, "true", "2.0", r#"["linear"]"#] {
        let e = DecoderConfig::from_json(
            &base(&format!(r#", "rope_scaling": {bad}"#)),
            "d/config.json",
        )
        .unwrap_err();
        assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{bad}");
        assert!(
            e.to_string().contains("rope_scaling is") && e.to_string().contains("d/config.json"),
            "{e}"
        );
    }
    let c = DecoderConfig::from_json(&base(r#", "rope_scaling": null"#), "c").unwrap();
    assert!(matches!(c.rope.scaling, RopeScaling::Default));
}

#[test]
fn unsupported_rope_type_is_a_usage_error_naming_it() {
    let e = DecoderConfig::from_json(
        &base(r#", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}"#),
        "dir/config.json",
    )
    .unwrap_err();
    assert!(e.downcast_ref::<crate::UsageError>().is_some());
    let m = e.to_string();
    assert!(
        m.contains("\"yarn\"") && m.contains("llama3") && m.contains("dir/config.json"),
        "{m}"
    );
}

#[test]
fn unknown_family_is_a_usage_error_and_bert_is_not_a_decoder() {
    let bert = r#"{"model_type": "bert", "hidden_size": 8}"#;
    assert_eq!(decoder_family(bert), None);
    assert_eq!(decoder_family(&base("")), Some(DecoderFamily::Llama));
    let gpt = base("").replace("\"llama\"", "\"gpt2\"");
    let e = DecoderConfig::from_json(&gpt, "x/config.json").unwrap_err();
    assert!(e.downcast_ref::<crate::UsageError>().is_some());
    let m = e.to_string();
    assert!(
        m.contains("\"gpt2\"") && m.contains(SUPPORTED_FAMILIES),
        "{m}"
    );
    let m = DecoderConfig::from_json(bert, "b").unwrap_err().to_string();
    assert!(m.contains("encoder"), "{m}");
}

#[test]
fn shape_errors_name_the_field() {
    let bad = base("").replace(r#""num_key_value_heads": 2"#, r#""num_key_value_heads": 3"#);
    let m = DecoderConfig::from_json(&bad, "c.json")
        .unwrap_err()
        .to_string();
    assert!(
        m.contains("num_key_value_heads 3") && m.contains("c.json"),
        "{m}"
    );
    let missing = base("").replace(r#""intermediate_size": 96,"#, "");
    let m = DecoderConfig::from_json(&missing, "c.json")
        .unwrap_err()
        .to_string();
    assert!(m.contains("\"intermediate_size\" is missing"), "{m}");
}

#[test]
fn qwen_biases_norms_and_sliding_windows() {
    let q2 = base(r#", "use_sliding_window": true, "sliding_window": 8, "max_window_layers": 1"#)
        .replace("\"llama\"", "\"qwen2\"");
    let c = DecoderConfig::from_json(&q2, "c").unwrap();
    assert!(c.qkv_bias && !c.o_bias && !c.qk_norm);
    assert_eq!(c.sliding_window, vec![None, Some(8)]);
    let q3 = base(r#", "head_dim": 32"#).replace("\"llama\"", "\"qwen3\"");
    let c = DecoderConfig::from_json(&q3, "c").unwrap();
    assert!(c.qk_norm && !c.qkv_bias && c.head_dim == 32);
    let m = base(r#", "sliding_window": 4096"#).replace("\"llama\"", "\"mistral\"");
    assert_eq!(
        DecoderConfig::from_json(&m, "c").unwrap().sliding_window,
        vec![Some(4096); 2]
    );
}

/// A layer count no model has (2^40; issue 57: it aborted the allocator) is refused naming the
/// field before anything is sized by it, as is 0.
#[test]
fn an_impossible_layer_count_is_refused_before_allocating() {
    for n in ["1099511627776", "0"] {
        let text = base("").replace(
            r#""num_hidden_layers": 2"#,
            &format!(r#""num_hidden_layers": {n}"#),
        );
        let e = DecoderConfig::from_json(&text, "c.json").unwrap_err();
        assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e}");
        assert!(e.to_string().contains("num_hidden_layers"), "{e}");
    }
}
