use super::*;
use crate::models::Depth;

#[test]
fn deepseek_v2_fixture_matches_transformers() {
    crate::models::decoder::tests::check_fixture("deepseek_v2");
}

#[test]
fn deepseek_v3_fixture_matches_transformers() {
    crate::models::decoder::tests::check_fixture("deepseek_v3");
}

#[test]
fn deepseek_v3_without_q_lora_matches_transformers() {
    crate::models::decoder::tests::check_fixture("deepseek_v3-noqlora");
}

fn fixture_config(name: &str) -> Value {
    let path = format!(
        "{}/fixtures/families/{name}/config.json",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn parse_error(name: &str, edit: impl FnOnce(&mut Value)) -> String {
    let mut v = fixture_config(name);
    edit(&mut v);
    let e = DeepseekConfig::parse(&v, "cfg").unwrap_err();
    assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e}");
    e.to_string()
}

#[test]
fn config_scale_layout_and_defaults() {
    let v2 = DeepseekConfig::parse(&fixture_config("deepseek_v2"), "cfg").unwrap();
    assert_eq!(v2.mla.layout, RopeLayout::Pairs);
    assert_eq!(v2.mla.q_lora_rank, None);
    assert_eq!(
        v2.router,
        Router::Softmax {
            group_limited: false
        }
    );
    // τ = (0.1·0.707·ln 40 + 1)²/√24, by hand.
    let m = 0.1 * 0.707 * 40f64.ln() + 1.0;
    assert!((v2.scale() - m * m / 24f64.sqrt()).abs() < 1e-15);
    let mut v = fixture_config("deepseek_v3");
    v["rope_interleave"] = false.into();
    v.as_object_mut().unwrap().remove("n_group");
    v.as_object_mut().unwrap().remove("topk_group");
    v["n_routed_experts"] = 16.into();
    let v3 = DeepseekConfig::parse(&v, "cfg").unwrap();
    assert_eq!(v3.mla.layout, RopeLayout::RotateHalf);
    assert_eq!((v3.n_group, v3.topk_group), (8, 4));
    assert_eq!(v3.mla.q_lora_rank, Some(48));
}

#[test]
fn bad_configs_are_usage_errors_naming_the_field() {
    let e = parse_error("deepseek_v3", |v| v["qk_head_dim"] = 25.into());
    assert!(e.contains("qk_head_dim"), "{e}");
    let e = parse_error("deepseek_v3", |v| v["qk_rope_head_dim"] = 7.into());
    assert!(e.contains("qk_rope_head_dim"), "{e}");
    let e = parse_error("deepseek_v2", |v| v["topk_method"] = "noaux_tc".into());
    assert!(e.contains("topk_method"), "{e}");
    let e = parse_error("deepseek_v3", |v| v["n_group"] = 3.into());
    assert!(e.contains("n_group"), "{e}");
    let e = parse_error("deepseek_v3", |v| v["q_lora_rank"] = 0.into());
    assert!(e.contains("q_lora_rank"), "{e}");
    let e = parse_error("deepseek_v2", |v| v["hidden_act"] = "gelu".into());
    assert!(e.contains("hidden_act"), "{e}");
    let e =
        parse_error(
            "deepseek_v3",
            |v| {
                v["quantization_config"] =
                    serde_json::json!({"quant_method": "fp8", "weight_block_size": [64, 64]})
            },
        );
    assert!(e.contains("weight_block_size"), "{e}");
    let e = parse_error("deepseek_v2", |v| v["kv_lora_rank"] = "wide".into());
    assert!(e.contains("kv_lora_rank"), "{e}");
}

#[test]
fn mla_ranks_that_do_not_fit_kv_b_proj_name_the_fields() {
    let path = format!(
        "{}/fixtures/families/deepseek_v3/model.safetensors",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut w =
        NamedTensors::open_file(std::path::Path::new(&path), &candle_core::Device::Cpu).unwrap();
    // v_head_dim 12 instead of 16: kv_b_proj's 128 rows are not 4·(16 + 12).
    let mut v = fixture_config("deepseek_v3");
    v["v_head_dim"] = 12.into();
    let e = load(&v, &mut w, Depth::Through(2)).err().unwrap();
    assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e}");
    let e = e.to_string();
    assert!(
        e.contains("kv_b_proj") && e.contains("v_head_dim") && e.contains("kv_lora_rank"),
        "{e}"
    );
    let e = load(&fixture_config("deepseek_v3"), &mut w, Depth::Through(3))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("layer 3"), "{e}");
}

/// 4 experts in 2 groups, one group chosen, top-2: the group rule overrides the global ranking.
#[test]
fn group_limited_routers_by_hand() {
    let mut v = fixture_config("deepseek_v2");
    v["topk_method"] = "group_limited_greedy".into();
    v["n_group"] = 2.into();
    v["topk_group"] = 1.into();
    v["routed_scaling_factor"] = 2.0.into();
    let v2 = DeepseekConfig::parse(&v, "cfg").unwrap();
    let logits = [2.0, 1.9, 2.5, -1.0];
    let z: f64 = logits.iter().map(|x: &f64| x.exp()).sum();
    // Group 1 holds the largest score (expert 2), so experts 2 and 3; greedy would take 2 and 0.
    let got = v2.route(&logits, None);
    assert_eq!(got.iter().map(|c| c.0).collect::<Vec<_>>(), vec![2, 3]);
    assert!((got[0].1 - 2.0 * 2.5f64.exp() / z).abs() < 1e-15);
    assert!((got[1].1 - 2.0 * (-1f64).exp() / z).abs() < 1e-15);
    let mut v = fixture_config("deepseek_v3");
    v["n_group"] = 2.into();
    v["topk_group"] = 1.into();
    let v3 = DeepseekConfig::parse(&v, "cfg").unwrap();
    // σ(0) = 0.5 everywhere; with the bias, choice [0.8, 0.0, 0.6, 0.6]: group sums 0.8 and 1.2,
    // so group 1 although expert 0 ranks first. Weights: the scores (not the bias), normalised,
    // × 2.5.
    let got = v3.route(&[0.0; 4], Some(&[0.3, -0.5, 0.1, 0.1]));
    assert_eq!(got.iter().map(|c| c.0).collect::<Vec<_>>(), vec![2, 3]);
    assert!(got.iter().all(|c| (c.1 - 1.25).abs() < 1e-15), "{got:?}");
}

/// `rope_interleave: false` rotates the rope dims as stored (rotate-half). With the rope rows of
/// q_b_proj and kv_a_proj_with_mqa permuted to [evens; odds], it must give exactly what the
/// interleaved default gives on the original weights (transformers: "bit-identical to the
/// de-interleaved rotate_half formulation").
#[test]
fn rope_interleave_false_on_deinterleaved_weights_equals_the_default() {
    let dir = format!(
        "{}/fixtures/families/deepseek_v3",
        env!("CARGO_MANIFEST_DIR")
    );
    let dev = candle_core::Device::Cpu;
    let config = fixture_config("deepseek_v3");
    let cfg = DeepseekConfig::parse(&config, "cfg").unwrap();
    let (d, r) = (&cfg.mla, cfg.mla.kv_lora_rank);
    let evens_then_odds: Vec<usize> = (0..d.d_rope)
        .step_by(2)
        .chain((1..d.d_rope).step_by(2))
        .collect();
    // Row order: each block of d_R rope rows starting at `start` reordered evens then odds.
    let permuted = |t: &Tensor, starts: Vec<usize>| {
        let mut order: Vec<u32> = (0..t.dim(0).unwrap() as u32).collect();
        for s in starts {
            for (j, &src) in evens_then_odds.iter().enumerate() {
                order[s + j] = (s + src) as u32;
            }
        }
        let idx = Tensor::from_vec(order.clone(), order.len(), &dev).unwrap();
        t.index_select(&idx, 0).unwrap()
    };
    let mut tensors =
        candle_core::safetensors::load(format!("{dir}/model.safetensors"), &dev).unwrap();
    for (name, t) in tensors.iter_mut() {
        if name.ends_with("q_b_proj.weight") {
            let p = d.qk_head_dim();
            *t = permuted(t, (0..d.heads).map(|h| h * p + d.d_nope).collect());
        } else if name.ends_with("kv_a_proj_with_mqa.weight") {
            *t = permuted(t, vec![r]);
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("model.safetensors");
    candle_core::safetensors::save(&tensors, &path).unwrap();
    let mut rotate_half_config = config.clone();
    rotate_half_config["rope_interleave"] = false.into();
    let ids: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % 128).collect();
    let dump = |config: &Value, file: &std::path::Path| {
        let mut w = NamedTensors::open_file(file, &dev).unwrap();
        load(config, &mut w, Depth::Through(2))
            .unwrap()
            .layer_dump(&ids, DType::F64)
            .unwrap()
    };
    let a = dump(
        &config,
        &std::path::Path::new(&dir).join("model.safetensors"),
    );
    let b = dump(&rotate_half_config, &path);
    for (x, y) in [
        (&a.q, &b.q),
        (&a.k, &b.k),
        (&a.v, &b.v),
        (&a.extra[0].1, &b.extra[0].1),
    ] {
        let diff = (x - y)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        assert_eq!(diff, 0.0);
    }
    assert_eq!(b.sidecar["mla"]["rope_layout"], "deinterleaved");
}

/// Measured (safetensors and GGUF alike; noqlora has no GGUF): f64 2.8e-15 (v2), 4.3e-15 (v3),
/// 3.6e-15 (v3-noqlora); f32 1.7e-6, 2.1e-6, 2.0e-6 (transformers' own f32 floor on these logits
/// is ≤ 1.9e-6, fixtures/families/README.md). 1e-5 in f32 is about 5× that: no router choice
/// flips in f32 on these windows (a flipped expert moves the logits by far more).
#[test]
fn deepseek_whole_model_logits_match_transformers() {
    for name in ["deepseek_v2", "deepseek_v3", "deepseek_v3-noqlora"] {
        crate::models::decoder::tests::check_fixture_logits(name, |_| (1e-10, 1e-5));
    }
}

/// Every layer reaches the hook once, in order, with the MLA spec (τ with mscale², no window) and
/// the materialised view: Q and K [H, n, d_nope + d_R] = [4, n, 24], V [4, n, 16]. O shaped like
/// Q ([H, n, p_qk], not [H, n, p_v]) is refused, as are logits of a partial model.
#[test]
fn deepseek_hook_sees_every_layer_with_the_materialised_view() {
    for name in ["deepseek_v2", "deepseek_v3", "deepseek_v3-noqlora"] {
        let calls = crate::models::decoder::tests::check_logits_hook(name, |q, _, _| q.clone());
        let cfg = DeepseekConfig::parse(&fixture_config(name), "cfg").unwrap();
        for (l, spec, [q, _, v]) in &calls {
            assert_eq!((q[2], v[2]), (24, 16), "{name} layer {l}");
            assert_eq!(spec.window, None, "{name} layer {l}");
            assert_eq!(spec.scale, cfg.scale(), "{name} layer {l}");
        }
    }
}
