//! The §7.7 families through the CLI (METHODS.md §7.7, issue 45) on the tiny transformers models
//! of `fixtures/families`: `dump-qkv` at a sliding and a global layer against transformers'
//! float64 values, with the layer's spec in the sidecar; the default layer of a family with
//! sliding layers; a sweep under the layer's own spec, and its refusals; bad configs as usage
//! errors naming the field.

mod common;

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use common::*;
use serde_json::Value;

fn family_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/families")
        .join(name)
}

/// The fixture `name`'s model in a directory of its own, with its word-level tokenizer (word `t{i}`
/// is token i, no BOS) and its corpus.txt, which tokenizes to the fixture's expected ids.
fn family_dir(tmp: &Path, name: &str) -> (PathBuf, PathBuf, Vec<u32>) {
    let dir = tmp.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(family_fixture(name).join(f), dir.join(f)).unwrap();
    }
    let ids = expected(name, "expected.safetensors")["ids"]
        .to_dtype(DType::I64)
        .unwrap()
        .to_vec1::<i64>()
        .unwrap();
    (
        dir,
        family_fixture(name).join("corpus.txt"),
        ids.into_iter().map(|i| i as u32).collect(),
    )
}

fn expected(name: &str, file: &str) -> std::collections::HashMap<String, Tensor> {
    candle_core::safetensors::load(family_fixture(name).join(file), &Device::Cpu).unwrap()
}

/// max |a − b| / max |b|.
fn rel(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims());
    let a = a.to_dtype(DType::F64).unwrap();
    let b = b.to_dtype(DType::F64).unwrap();
    let num = (a - &b).unwrap().abs().unwrap().max_all().unwrap();
    let den = b.abs().unwrap().max_all().unwrap();
    num.to_scalar::<f64>().unwrap() / den.to_scalar::<f64>().unwrap()
}

/// `dump-qkv` of `dir` over `corpus` with `flags`; the dump's tensors and sidecar.
fn dump(
    dir: &Path,
    corpus: &Path,
    out: &Path,
    flags: &str,
) -> (std::collections::HashMap<String, Tensor>, Value, String) {
    let o = decoder_cli(
        dir,
        corpus,
        &format!("dump-qkv --length 40 {flags} --out {}", out.display()),
    );
    assert!(o.status.success(), "{flags}: {}", stderr(&o));
    let t = candle_core::safetensors::load(out, &Device::Cpu).unwrap();
    let side = std::fs::read_to_string(format!("{}.json", out.display())).unwrap();
    (t, serde_json::from_str(&side).unwrap(), stderr(&o))
}

fn decoder_cli(model: &Path, corpus: &Path, flags: &str) -> std::process::Output {
    let mut args: Vec<&str> = flags.split_whitespace().collect();
    args.extend([
        "--model-dir",
        model.to_str().unwrap(),
        "--corpus",
        corpus.to_str().unwrap(),
    ]);
    run(&args, &[])
}

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

/// Fixture `name`'s GGUF (its `model.gguf`, or `gguf` in its place) in a directory of its own with
/// the fixture's tokenizer, and no config.json: the GGUF's metadata is the configuration.
fn gguf_dir(tmp: &Path, name: &str, gguf: Option<&Path>) -> PathBuf {
    let dir = tmp.join(format!("{name}-gguf"));
    std::fs::create_dir_all(&dir).unwrap();
    let src = gguf
        .map(Path::to_path_buf)
        .unwrap_or_else(|| family_fixture(name).join("model.gguf"));
    std::fs::copy(src, dir.join("model.gguf")).unwrap();
    std::fs::copy(
        family_fixture(name).join("tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    dir
}

/// Fixture `name`'s GGUF (written by tests/reference/generate_family_gguf.py as llama.cpp's
/// converter lays the family out) dumps at each of `layers` what its safetensors checkpoint dumps:
/// the same token ids, q/k/v (and the extra tensors) equal up to `bound` (relative to the largest
/// value; 0 where both routes compute with the same f32 weights) and within 1e-4 of transformers
/// at the layers the fixture stores, and the same spec in the sidecar. The GGUF sidecars, for
/// further checks.
fn gguf_dumps_match_safetensors(name: &str, layers: &[usize], bound: f64) -> Vec<Value> {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, corpus, ids) = family_dir(tmp.path(), name);
    let gguf = gguf_dir(tmp.path(), name, None);
    let want = expected(name, "expected.safetensors");
    let mut sides = Vec::new();
    for &layer in layers {
        let flags = format!("--layer {layer}");
        let (a, side_a, _) = dump(&dir, &corpus, &tmp.path().join("a.safetensors"), &flags);
        let (b, side_b, _) = dump(&gguf, &corpus, &tmp.path().join("b.safetensors"), &flags);
        assert_eq!(b["token_ids"].to_vec1::<u32>().unwrap(), ids, "{name}");
        let mut names = vec!["q", "k", "v"];
        names.extend(
            ["sinks", "kv_latent", "w_kv_b"]
                .into_iter()
                .filter(|x| a.contains_key(*x)),
        );
        for x in names {
            assert!(b.contains_key(x), "{name} layer {layer}: no {x}");
            let e = rel(&b[x], &a[x]);
            assert!(e <= bound, "{name} layer {layer} {x}: GGUF off by {e:e}");
            // Where the fixture stores this layer.
            if let Some(w) = want.get(&format!("layer{layer}.{x}")) {
                let e = rel(&b[x], w);
                assert!(e <= 1e-4, "{name} layer {layer} {x}: off by {e:e}");
            }
        }
        for field in [
            "scale",
            "softcap",
            "sliding_window",
            "layer_type",
            "head_dim_v",
            "kv_heads",
            "rope_factors",
            "mla",
        ] {
            assert_eq!(side_a[field], side_b[field], "{name} layer {layer} {field}");
        }
        sides.push(side_b);
    }
    sides
}

/// A phi3 GGUF (fixtures/families/phi3/model.gguf) dumps what the safetensors checkpoint dumps.
#[test]
fn a_phi3_gguf_dumps_the_same_layer_as_its_safetensors() {
    let sides = gguf_dumps_match_safetensors("phi3", &[2], 0.0);
    assert_eq!(sides[0]["sliding_window"], 16, "{}", sides[0]);
}

/// Gemma 2 and 3 GGUFs (norms stored as 1 + w, llama.cpp's layer patterns, gemma3's local θ and
/// global linear scaling, τ from `{arch}.attention.scale`) dump a sliding and a global layer as
/// their safetensors do: the same f32 bits, gemma2's cap, the windows.
#[test]
fn gemma_ggufs_dump_the_same_sliding_and_global_layers_as_their_safetensors() {
    let sides = gguf_dumps_match_safetensors("gemma2", &[2, 3], 0.0);
    assert_eq!(sides[0]["softcap"], 8.0);
    assert_eq!(
        (&sides[0]["sliding_window"], &sides[1]["sliding_window"]),
        (&Value::from(16), &Value::Null)
    );
    let sides = gguf_dumps_match_safetensors("gemma3", &[4, 5], 0.0);
    assert_eq!(sides[0]["layer_type"], "sliding_attention");
    assert_eq!(sides[1]["layer_type"], "full_attention");
}

/// A gpt-oss GGUF (experts split and transposed by the converter, put back by the reader; sinks as
/// `attn_sinks`) dumps a sliding and a global layer as its safetensors do, the `sinks` tensor
/// included (compared by the helper).
#[test]
fn a_gpt_oss_gguf_dumps_the_same_layers_and_sinks_as_its_safetensors() {
    let sides = gguf_dumps_match_safetensors("gpt_oss", &[2, 3], 0.0);
    assert_eq!(sides[0]["sliding_window"], 16);
    assert_eq!(sides[1]["sliding_window"], Value::Null);
}

#[test]
fn bad_gpt_oss_gguf_metadata_is_a_usage_error_naming_the_key() {
    use candle_core::quantized::gguf_file::Value as V;
    bad_gguf_names_its_key(
        "gpt_oss",
        "gpt-oss.attention.sliding_window",
        Some(V::U32(0)),
    );
    bad_gguf_names_its_key("gpt_oss", "gpt-oss.expert_used_count", Some(V::U32(5)));
    bad_gguf_names_its_key(
        "gpt_oss",
        "gpt-oss.rope.scaling.type",
        Some(V::String("longrope".into())),
    );
}

/// DeepSeek V2 and V3 GGUFs (`deepseek2`: experts stacked, kv_b split per head into attn_k_b and
/// attn_v_b, τ from `rope.scaling.yarn_log_multiplier`) dump the dense layer 0 and the MoE layer 2
/// as their safetensors do: q/k/v, `kv_latent` and `w_kv_b`, and the sidecar's `mla` object.
#[test]
fn deepseek_ggufs_dump_the_same_mla_layers_as_their_safetensors() {
    for name in ["deepseek_v2", "deepseek_v3"] {
        let sides = gguf_dumps_match_safetensors(name, &[0, 2], 0.0);
        assert!(sides[1]["mla"].is_object(), "{name}: {}", sides[1]);
    }
}

#[test]
fn bad_deepseek_gguf_metadata_is_a_usage_error_naming_the_key() {
    use candle_core::quantized::gguf_file::Value as V;
    bad_gguf_names_its_key("deepseek_v3", "deepseek2.attention.q_lora_rank", None);
    bad_gguf_names_its_key(
        "deepseek_v2",
        "deepseek2.expert_gating_func",
        Some(V::U32(7)),
    );
    bad_gguf_names_its_key(
        "deepseek_v2",
        "deepseek2.attention.value_length",
        Some(V::U32(16)),
    );
}

/// Fixture `name`'s GGUF with the metadata key `key` set to `value` (added if absent, dropped
/// when None), through gguf-py-free candle: the file `dump-qkv` then reads.
fn gguf_with(
    tmp: &Path,
    name: &str,
    key: &str,
    value: Option<candle_core::quantized::gguf_file::Value>,
) -> PathBuf {
    use candle_core::quantized::gguf_file::{self, Content};
    let src = family_fixture(name).join("model.gguf");
    let mut reader = std::io::BufReader::new(std::fs::File::open(&src).unwrap());
    let content = Content::read(&mut reader).unwrap();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let tensors: Vec<(String, candle_core::quantized::QTensor)> = names
        .iter()
        .map(|n| {
            let t = content.tensor(&mut reader, n, &Device::Cpu).unwrap();
            (n.to_string(), t)
        })
        .collect();
    let mut meta: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .filter(|(k, _)| k.as_str() != key)
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    meta.sort_by_key(|(k, _)| *k);
    if let Some(v) = &value {
        meta.push((key, v));
    }
    let out = tmp.join(format!("{name}-bad.gguf"));
    let t: Vec<(&str, &candle_core::quantized::QTensor)> =
        tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    gguf_file::write(&mut std::fs::File::create(&out).unwrap(), &meta, &t).unwrap();
    out
}

/// `dump-qkv` of fixture `name`'s GGUF with `key` changed exits 2 with a message naming the key.
fn bad_gguf_names_its_key(
    name: &str,
    key: &str,
    value: Option<candle_core::quantized::gguf_file::Value>,
) {
    let tmp = tempfile::tempdir().unwrap();
    let bad = gguf_with(tmp.path(), name, key, value);
    let dir = gguf_dir(tmp.path(), name, Some(&bad));
    let corpus = family_fixture(name).join("corpus.txt");
    let out = tmp.path().join("d.safetensors");
    let o = decoder_cli(
        &dir,
        &corpus,
        &format!("dump-qkv --length 40 --layer 1 --out {}", out.display()),
    );
    assert_eq!(o.status.code(), Some(2), "{name} {key}: {}", stderr(&o));
    assert!(stderr(&o).contains(key), "{name} {key}: {}", stderr(&o));
}

#[test]
fn bad_gemma_gguf_metadata_is_a_usage_error_naming_the_key() {
    use candle_core::quantized::gguf_file::Value as V;
    // Neither llama.cpp's sizes (4 layers) nor an attention.scale: τ unknown.
    bad_gguf_names_its_key("gemma2", "gemma2.attention.scale", None);
    bad_gguf_names_its_key(
        "gemma2",
        "gemma2.attn_logit_softcapping",
        Some(V::F32(-1.0)),
    );
    bad_gguf_names_its_key("gemma3", "gemma3.attention.sliding_window", Some(V::U32(0)));
    bad_gguf_names_its_key(
        "gemma3",
        "gemma3.rope.scaling.type",
        Some(V::String("yarn".into())),
    );
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
        let (dir, corpus, _) = family_dir(tmp.path(), name);
        let out = tmp.path().join(format!("run-{name}-{layer}"));
        let o = decoder_cli(
            &dir,
            &corpus,
            &format!(
                "--lengths 32 --windows 1 --layer {layer} --features 8,16,32 --methods window,topk,streaming,quest,moba,block_sparse,h2o,xattention,vertical_slash,svd_optimal,vmean --out {} --quiet",
                out.display()
            ),
        );
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let mut rows = csv::Reader::from_path(out.join("trials.csv")).unwrap();
        let header = rows.headers().unwrap().clone();
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
        for r in rows.records() {
            let r = r.unwrap();
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

/// The d grid on a sliding layer (§7.7.6): gemma2's layer 0 (W = 16) stops the grid 8, 20, 24 at
/// 20, its first d ≥ W, in the sweep, in `merge`'s count of a complete run (two shards: n = 24
/// and n = 32) and in the manifest; `macs` there is counted at min(d, W) = 16, as the global
/// layer's `window` at d = 16. Without `--layer` the sweep measures the first global layer, 1.
#[test]
fn a_sliding_layers_grid_stops_at_the_window_and_a_default_sweep_is_global() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, corpus, _) = family_dir(tmp.path(), "gemma2");
    let sweep = |out: &Path, flags: &str| {
        let o = decoder_cli(
            &dir,
            &corpus,
            &format!(
                "--lengths 24,32 --windows 1 --methods window,topk --out {} --quiet {flags}",
                out.display()
            ),
        );
        assert!(o.status.success(), "{flags}: {}", stderr(&o));
        stderr(&o)
    };
    let read = |out: &Path| -> Vec<csv::StringRecord> {
        let mut r = csv::Reader::from_path(out.join("trials.csv")).unwrap();
        let h = r.headers().unwrap().clone();
        let mut rows: Vec<_> = r.records().map(|x| x.unwrap()).collect();
        rows.insert(0, h);
        rows
    };
    let col = |rows: &[csv::StringRecord], name: &str| -> Vec<String> {
        let c = rows[0].iter().position(|h| h == name).unwrap();
        rows[1..].iter().map(|r| r[c].to_string()).collect()
    };

    let global = tmp.path().join("global");
    let said = sweep(&global, "--features 16");
    assert!(said.contains("no --layer given; layer 1"), "{said}");
    let g = read(&global);
    assert!(col(&g, "layer").iter().all(|l| l == "1"));
    assert!(col(&g, "sliding_window").iter().all(|w| w.is_empty()));

    let parts: Vec<PathBuf> = (1..=2)
        .map(|k| {
            let part = tmp.path().join(format!("part{k}"));
            sweep(
                &part,
                &format!("--layer 0 --features 8,20,24 --shard {k}/2"),
            );
            part
        })
        .collect();
    let merged = tmp.path().join("merged");
    let mut args = vec!["merge", "--out", merged.to_str().unwrap()];
    args.extend(parts.iter().map(|p| p.to_str().unwrap()));
    let o = run(&args, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(merged.join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["status"], "complete", "{manifest}");
    assert_eq!(manifest["sliding_window"], 16);
    let s = read(&merged);
    // 2 lengths × 4 heads × 2 methods × d ∈ {8, 20}.
    assert_eq!(manifest["trials"], 32);
    assert_eq!(s.len() - 1, 32);
    let mut ds = col(&s, "d");
    ds.sort();
    ds.dedup();
    assert_eq!(ds, ["20", "8"]);
    let macs_at = |rows: &[csv::StringRecord], method: &str, d: &str| -> Vec<String> {
        let (m, dd, mc) = (col(rows, "method"), col(rows, "d"), col(rows, "macs"));
        let n = col(rows, "n");
        (0..m.len())
            .filter(|&i| m[i] == method && dd[i] == d && n[i] == "32")
            .map(|i| mc[i].clone())
            .collect()
    };
    let at_w = macs_at(&g, "window", "16");
    assert!(!at_w.is_empty());
    assert_eq!(macs_at(&s, "window", "20")[0], at_w[0]);
    // Below the window the budget itself counts.
    assert_ne!(macs_at(&s, "window", "8")[0], at_w[0]);
}

/// `performer_favor` on gpt-oss's sink layers, sliding and global, and on phi3's sliding layer
/// (§7.7.6: √τ, the window's prefix sums, the sink in its denominator): the sweep runs it at
/// every d of the layer's grid, with finite errors; gemma2's cap still refuses it (above).
#[test]
fn performer_favor_runs_on_sink_and_sliding_layers() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, layer, grid) in [
        ("gpt_oss", 0, &["4", "16"][..]),
        ("gpt_oss", 1, &["4", "16", "32"]),
        ("phi3", 1, &["4", "16"]),
    ] {
        let (dir, corpus, _) = family_dir(tmp.path(), name);
        let out = tmp.path().join(format!("run-{name}-{layer}"));
        let o = decoder_cli(
            &dir,
            &corpus,
            &format!(
                "--lengths 32 --windows 1 --layer {layer} --features 4,16,32 --methods performer_favor --out {} --quiet",
                out.display()
            ),
        );
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let mut rows = csv::Reader::from_path(out.join("trials.csv")).unwrap();
        let header = rows.headers().unwrap().clone();
        let col = |c: &str| header.iter().position(|h| h == c).unwrap();
        let (d, rel) = (col("d"), col("rel_error"));
        let rows: Vec<_> = rows.records().map(|r| r.unwrap()).collect();
        let mut ds: Vec<&str> = rows.iter().map(|r| &r[d]).collect();
        ds.sort_by_key(|d| d.parse::<usize>().unwrap());
        ds.dedup();
        // The sliding layers' grid stops at d = 16 = W; the global one keeps the whole grid.
        assert_eq!(ds, grid, "{name} layer {layer}");
        for r in &rows {
            let e: f64 = r[rel].parse().unwrap();
            assert!(
                e.is_finite() && e > 0.0 && e < 3.0,
                "{name} layer {layer}: {r:?}"
            );
        }
    }
}
