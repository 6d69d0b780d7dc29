//! The §7.7 families through the CLI (METHODS.md §7.7, issue 45) on the tiny transformers models
//! of `fixtures/families`: `dump-qkv` at a sliding and a global layer against transformers'
//! float64 values, with the layer's spec in the sidecar; the default layer of a family with
//! sliding layers; a sweep under the layer's own spec, and its refusals; bad configs as usage
//! errors naming the field.

mod common;

use candle_core::Device;
use common::families::*;
use common::*;
use serde_json::Value;

#[test]
fn dump_qkv_of_gemma2_matches_transformers_with_the_layers_spec_in_the_sidecar() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, corpus, ids) = family_dir(tmp.path(), "gemma2");
    let want = expected("gemma2", "expected.safetensors");
    let tau = 24f64.powf(-0.5);
    for (layer, window, layer_type) in [
        (2, Value::from(16), "sliding_attention"),
        (3, Value::Null, "full_attention"),
    ] {
        let out = tmp.path().join(format!("l{layer}.safetensors"));
        let (t, side, _) = dump(&dir, &corpus, &out, &format!("--layer {layer}"));
        assert_eq!(t["token_ids"].to_vec1::<u32>().unwrap(), ids);
        for x in ["q", "k", "v"] {
            let e = rel(&t[x], &want[&format!("layer{layer}.{x}")]);
            assert!(e <= 1e-4, "layer {layer} {x}: off by {e:e}");
        }
        assert!(
            (side["scale"].as_f64().unwrap() - tau).abs() <= 1e-12,
            "{side}"
        );
        assert_eq!(side["softcap"], Value::from(8.0), "{side}");
        // The layer's W is `sliding_window`: `window` is the corpus window's index, as in every
        // dump (METHODS §7.7.0 names W `window`; the sidecar had that name already).
        assert_eq!(side["sliding_window"], window, "{side}");
        assert_eq!(side["window"], 0, "{side}");
        assert_eq!(side["layer_type"], layer_type, "{side}");
        assert_eq!(side["head_dim_v"], 16, "{side}");
        assert_eq!(side["kv_heads"], 2, "{side}");
        assert_eq!(side["mask"], "causal", "{side}");
        assert_eq!(side["inputs"]["layer"], layer, "{side}");
    }
}

#[test]
fn a_family_with_sliding_layers_dumps_a_global_layer_by_default() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, corpus, _) = family_dir(tmp.path(), "gemma3");
    let out = tmp.path().join("d.safetensors");
    let (t, side, err) = dump(&dir, &corpus, &out, "");
    // 5 local : 1 global: layer 5 is the first full-attention layer.
    assert_eq!(side["inputs"]["layer"], 5, "{side}");
    assert_eq!(side["layer_type"], "full_attention", "{side}");
    assert!(err.contains("layer 5"), "{err}");
    let want = expected("gemma3", "expected.safetensors");
    let e = rel(&t["q"], &want["layer5.q"]);
    assert!(e <= 1e-4, "q off by {e:e}");
    // gpt-oss's sinks are weights of the loaded layers only: its layer 1 is found from the config.
    let (dir, corpus, _) = family_dir(tmp.path(), "gpt_oss");
    let (_, side, err) = dump(&dir, &corpus, &out, "");
    assert_eq!(side["inputs"]["layer"], 1, "{side}");
    assert_eq!(side["layer_type"], "full_attention", "{side}");
    assert!(err.contains("layer 1"), "{err}");
}

#[test]
fn longrope_dumps_say_which_factors_they_read() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, corpus, _) = family_dir(tmp.path(), "phi3-longrope");
    let out = tmp.path().join("d.safetensors");
    let (t, side, _) = dump(&dir, &corpus, &out, "--layer 2");
    assert_eq!(side["rope_factors"], "long", "{side}");
    let want = expected("phi3-longrope", "expected.safetensors");
    let e = rel(&t["k"], &want["layer2.k"]);
    assert!(e <= 1e-4, "k off by {e:e}");
    let o = decoder_cli(
        &dir,
        &corpus,
        &format!("dump-qkv --length 24 --layer 2 --out {}", out.display()),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let side: Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{}.json", out.display())).unwrap())
            .unwrap();
    assert_eq!(side["rope_factors"], "short", "{side}");
}

/// A sweep of a family measures the layer under its own spec: gemma2's capped layers refuse the
/// methods that do not implement a soft-cap yet, naming them, and a family without --mask causal
/// is told to add it; bad configs are usage errors naming the field.
#[test]
fn a_family_sweep_refuses_what_its_methods_lack_and_bad_configs_name_their_field() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, corpus, _) = family_dir(tmp.path(), "gemma2");
    let sweep = |flags: &str| {
        decoder_cli(
            &dir,
            &corpus,
            &format!(
                "--lengths 32 --windows 1 --features 8 --out {} --quiet {flags}",
                tmp.path().join("run").display()
            ),
        )
    };
    for (flags, needle) in [
        ("--mask none --methods window", "drop --mask none"),
        (
            "--mask causal --layer 1 --methods window,performer_favor,topk",
            "has a logit soft-cap (causal, τ = 0.204124, soft-cap 8), which these methods do not implement yet (docs/reference.md §7.7.6): performer_favor; run the others with --methods window,topk",
        ),
    ] {
        let o = sweep(flags);
        assert_eq!(o.status.code(), Some(2), "{flags}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{flags}: {}", stderr(&o));
    }
    let config = dir.join("config.json");
    let original = std::fs::read_to_string(&config).unwrap();
    let out = tmp.path().join("bad.safetensors");
    // (text, its replacement, the field the error must name)
    for (from, to, field) in [
        (
            r#""sliding_attention","#,
            r#""chunked_attention","#,
            "layer_types",
        ),
        (
            r#""sliding_window": 16"#,
            r#""sliding_window": 0"#,
            "sliding_window",
        ),
        (
            r#""query_pre_attn_scalar": 24,"#,
            "",
            "query_pre_attn_scalar",
        ),
        // 2^32 − 1 layers (issue 57): refused before the allocator aborts.
        (
            r#""num_hidden_layers": 4"#,
            r#""num_hidden_layers": 4294967295"#,
            "num_hidden_layers",
        ),
        // Finite, but beyond f32 (issue 57): it overflowed the f32 forward, blamed on the device.
        (
            r#""attn_logit_softcapping": 8.0"#,
            r#""attn_logit_softcapping": 1e39"#,
            "attn_logit_softcapping",
        ),
    ] {
        assert!(original.contains(from), "{from}");
        std::fs::write(&config, original.replacen(from, to, 1)).unwrap();
        let o = decoder_cli(
            &dir,
            &corpus,
            &format!("dump-qkv --length 40 --layer 3 --out {}", out.display()),
        );
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{field}: {e}");
        assert!(e.contains(field) && !e.contains("panicked"), "{field}: {e}");
    }
}

/// A sharded checkpoint of a family: the embeddings and layers 0..=2 in one shard, layer 3 and the
/// final norm in another that is not there. `dump-qkv --layer 2` reads only the first and matches
/// transformers; `--layer 3` names the missing shard.
#[test]
fn a_sharded_family_checkpoint_reads_only_the_shards_of_layers_0_to_l() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, corpus, _) = family_dir(tmp.path(), "gemma2");
    let all = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let (shard1, shard2) = (
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    );
    let mut first = std::collections::HashMap::new();
    let mut map = serde_json::Map::new();
    for (name, t) in all {
        let late = name.starts_with("model.layers.3.") || name == "model.norm.weight";
        map.insert(
            name.clone(),
            Value::from(if late { shard2 } else { shard1 }),
        );
        if !late {
            first.insert(name, t);
        }
    }
    candle_core::safetensors::save(&first, dir.join(shard1)).unwrap();
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let out = tmp.path().join("d.safetensors");
    let (t, side, _) = dump(&dir, &corpus, &out, "--layer 2");
    assert_eq!(side["sliding_window"], 16, "{side}");
    let want = expected("gemma2", "expected.safetensors");
    for x in ["q", "k", "v"] {
        let e = rel(&t[x], &want[&format!("layer2.{x}")]);
        assert!(e <= 1e-4, "{x} off by {e:e}");
    }
    let o = decoder_cli(
        &dir,
        &corpus,
        &format!("dump-qkv --length 40 --layer 3 --out {}", out.display()),
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains(shard2), "{}", stderr(&o));
}

/// `dump-qkv` of every fixture family at every stored layer (a sliding and a global one where the
/// family has both) against transformers' float64 values within the issue's f32 bounds
/// (1e-4 for q/k/v and the extra tensors), with the spec and the family's fields in the sidecar
/// and gpt-oss's sinks as a tensor.
#[test]
fn dump_qkv_of_every_family_matches_transformers_at_each_stored_layer() {
    let tmp = tempfile::tempdir().unwrap();
    for name in [
        "gemma3",
        "phi3",
        "gpt_oss",
        "deepseek_v2",
        "deepseek_v3",
        "deepseek_v3-noqlora",
    ] {
        let (dir, corpus, ids) = family_dir(tmp.path(), name);
        let spec: Value = serde_json::from_str(
            &std::fs::read_to_string(family_fixture(name).join("spec.json")).unwrap(),
        )
        .unwrap();
        let want = expected(name, "expected.safetensors");
        for (layer, ls) in spec["expected"][0]["layers"].as_object().unwrap() {
            let out = tmp.path().join(format!("{name}-{layer}.safetensors"));
            let (t, side, _) = dump(&dir, &corpus, &out, &format!("--layer {layer}"));
            assert_eq!(t["token_ids"].to_vec1::<u32>().unwrap(), ids, "{name}");
            let mut names = vec!["q", "k", "v"];
            names.extend(
                ["sinks", "kv_latent", "w_kv_b"]
                    .into_iter()
                    .filter(|x| t.contains_key(*x)),
            );
            for x in names {
                let e = rel(&t[x], &want[&format!("layer{layer}.{x}")]);
                assert!(e <= 1e-4, "{name} layer {layer} {x}: off by {e:e}");
            }
            assert_eq!(
                t.contains_key("sinks"),
                ls["sinks"].as_bool().unwrap(),
                "{name}"
            );
            let scale = ls["scale"].as_f64().unwrap();
            assert!(
                (side["scale"].as_f64().unwrap() - scale).abs() <= 1e-12 * scale,
                "{name}"
            );
            assert_eq!(side["softcap"], ls["softcap"], "{name}");
            assert_eq!(side["sliding_window"], ls["window"], "{name}");
            assert_eq!(side["layer_type"], ls["layer_type"], "{name}");
            assert_eq!(side["head_dim_v"], ls["head_dim_v"], "{name}");
            if let Some(mla) = ls.get("mla") {
                assert_eq!(&side["mla"], mla, "{name}");
            }
        }
    }
}

/// A sweep of DeepSeek-V3's MLA layer (τ with yarn's mscale², p_qk = 24 ≠ p_v = 16) runs every
/// method that implements the scale: the methods exact at d = n reproduce the layer's own target
/// (at 1/√p they would be off by the scale), and the others give finite errors.
#[test]
fn a_sweep_of_an_mla_layer_measures_it_under_its_own_scale() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, corpus, _) = family_dir(tmp.path(), "deepseek_v3");
    let out = tmp.path().join("run");
    let o = decoder_cli(
        &dir,
        &corpus,
        &format!(
            "--lengths 32 --windows 1 --layer 1 --mask causal --features 8,32 --methods window,topk,svd_optimal,performer_favor,quest,h2o --out {} --quiet",
            out.display()
        ),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let mut rows = csv::Reader::from_path(out.join("trials.csv")).unwrap();
    let header = rows.headers().unwrap().clone();
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let (method, d, rel) = (col("method"), col("d"), col("rel_error"));
    let mut seen = 0;
    for r in rows.records() {
        let r = r.unwrap();
        let e: f64 = r[rel].parse().unwrap();
        assert!(e.is_finite(), "{r:?}");
        if &r[d] == "32" && ["window", "topk", "svd_optimal"].contains(&&r[method]) {
            assert!(e < 1e-5, "{} at d = n: relative error {e}", &r[method]);
        }
        seen += 1;
    }
    // 6 methods × 2 budgets × 4 heads.
    assert_eq!(seen, 48);
}

/// gpt-oss's layers (sinks), gemma2's (a soft-cap) and phi3's, global and sliding (W = 16), through
/// a sweep with the methods that read the spec: `window` and `topk` from d = min(W, n) on, the
/// ranked prefill methods at d = n, reproduce the layer's target and read all of its K/V, and on
/// the sink layers `mass` + `sink_mass` = 1 there, with the sink taking a visible share.
#[test]
fn a_sweep_of_sink_capped_and_sliding_layers_runs_window_and_topk() {
    let tmp = tempfile::tempdir().unwrap();
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
            &format!("--lengths 32 --windows 1 --layer {layer} --features 8,16,32 --methods window,topk,streaming,quest,moba,block_sparse,h2o,xattention,vertical_slash,svd_optimal,vmean"),
        );
        let col = |c: &str| header.iter().position(|h| h == c).unwrap();
        let [method, d, rel, mass, sink_mass, sinks, softcap, sliding, kv_read] = [
            "method",
            "d",
            "rel_error",
            "mass",
            "sink_mass",
            "sinks",
            "softcap",
            "sliding_window",
            "kv_read",
        ]
        .map(col);
        let mut seen = 0;
        for r in &rows {
            let e: f64 = r[rel].parse().unwrap();
            assert_eq!(&r[sinks], if name == "gpt_oss" { "true" } else { "false" });
            assert_eq!(&r[softcap], if name == "gemma2" { "8.0" } else { "" });
            let w: usize = r[sliding].parse().unwrap_or(32);
            let d: usize = r[d].parse().unwrap();
            // window and topk cover the window from d = W; the ranked prefill methods and
            // svd_optimal from d = n; h2o and vertical_slash only from d ≈ 2n, past this grid;
            // vmean never.
            let full = (d >= 32 && !["h2o", "vertical_slash", "vmean"].contains(&&r[method]))
                || (d >= w && ["window", "topk"].contains(&&r[method]));
            // The key-set methods' columns (svd_optimal and vmean read no cache and keep no set).
            let kept_mass: Option<f64> = r[mass].parse().ok();
            assert!(
                e.is_finite() && kept_mass.is_none_or(|m| m <= 1.0 + 1e-5),
                "{r:?}"
            );
            if full {
                assert!(e < 1e-5, "{name} layer {layer}: {r:?}");
                if let Ok(read) = r[kv_read].parse::<f64>() {
                    assert!((read - 1.0).abs() < 1e-9, "{name} layer {layer}: {r:?}");
                }
            }
            if name == "gpt_oss" {
                let s: f64 = r[sink_mass].parse().unwrap();
                assert!(s > 1e-3 && s < 1.0, "{r:?}");
                if let (true, Some(m)) = (full, kept_mass) {
                    assert!((m + s - 1.0).abs() < 1e-5, "{r:?}");
                }
            }
            seen += 1;
        }
        assert!(seen >= 60, "{name}: {seen} rows");
    }
}
