//! The §7.7 families' GGUF files (METHODS.md §7.7, issue 45), as llama.cpp's converter writes them
//! (tests/reference/generate_family_gguf.py): `dump-qkv` of each reads the same Q, K, V, extra
//! tensors and spec as its safetensors, and bad metadata is a usage error naming its key.

mod common;

use std::path::{Path, PathBuf};

use candle_core::Device;
use common::families::*;
use common::*;
use serde_json::Value;

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

/// gpt-oss as the hub ships it (fixtures/gpt_oss-mxfp4): its MXFP4 GGUF (ggml type 39,
/// the converter's layout) and its MXFP4 checkpoint give the same end-to-end run through the CLI,
/// every number of e2e.csv and e2e_layers.csv but the timing, so every layer's experts, the final
/// norm and the LM head read the same on both routes.
#[test]
fn an_mxfp4_gpt_oss_gguf_runs_end_to_end_as_its_mxfp4_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/gpt_oss-mxfp4");
    let st = tmp.path().join("checkpoint");
    std::fs::create_dir_all(&st).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(fixture.join(f), st.join(f)).unwrap();
    }
    // gpt_oss's tokenizer, which the fixture's is a copy of.
    let gguf = gguf_dir(tmp.path(), "gpt_oss", Some(&fixture.join("model.gguf")));
    let corpus = fixture.join("corpus.txt");
    let run = |dir: &Path, out: &str| {
        let out = tmp.path().join(out);
        let flags = format!(
            "e2e --lengths 40 --windows 1 --n-f 8 --dtype f64 --quiet --methods window,topk --features 8,16 --out {}",
            out.display()
        );
        let o = decoder_cli(dir, &corpus, &flags);
        assert!(o.status.success(), "{}", stderr(&o));
        ["e2e.csv", "e2e_layers.csv"].map(|f| {
            let text = std::fs::read_to_string(out.join(f)).unwrap();
            // Every column but a trailing `seconds` (the timing).
            let timed = text.lines().next().unwrap().ends_with(",seconds");
            text.lines()
                .map(|l| match (timed, l.rsplit_once(',')) {
                    (true, Some((head, _))) => head.to_string(),
                    _ => l.to_string(),
                })
                .collect::<Vec<_>>()
        })
    };
    let a = run(&st, "a");
    let b = run(&gguf, "b");
    assert_eq!(a[0].len(), 1 + 2 * 2, "one row per method and d");
    assert_eq!(a, b);
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

/// A GGUF whose `block_count` is 2^32 − 1 (issue 57: the allocator aborted, exit 134) is a usage
/// error naming the key, before anything is sized by it. The value is patched in place: the u32
/// after the key's name and its type code (4).
#[test]
fn an_impossible_block_count_is_refused_before_allocating() {
    let tmp = tempfile::tempdir().unwrap();
    let mut bytes = std::fs::read(family_fixture("gemma2").join("model.gguf")).unwrap();
    let key = b"gemma2.block_count";
    let at = bytes
        .windows(key.len())
        .position(|w| w == key)
        .expect("the key")
        + key.len();
    assert_eq!(bytes[at..at + 4], 4u32.to_le_bytes(), "a u32 value");
    bytes[at + 4..at + 8].copy_from_slice(&u32::MAX.to_le_bytes());
    let patched = tmp.path().join("patched.gguf");
    std::fs::write(&patched, bytes).unwrap();
    let dir = gguf_dir(tmp.path(), "gemma2", Some(&patched));
    let corpus = family_fixture("gemma2").join("corpus.txt");
    let out = tmp.path().join("d.safetensors");
    let o = decoder_cli(
        &dir,
        &corpus,
        &format!("dump-qkv --length 40 --layer 1 --out {}", out.display()),
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("block_count") && stderr(&o).contains("4294967295"),
        "{}",
        stderr(&o)
    );
}

/// Weights kept as stored (issue 56): every family's GGUF dumps and runs end to end with its
/// ggml blocks kept and widened a layer at a time, bit for bit as widened at load; the e2e
/// manifest says which form ran and its memory; a model whose weights cannot fit the memory a
/// run may take is refused before it loads, the estimate in the message.
#[test]
fn stored_weights_give_the_widened_bits_and_a_model_too_large_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["gemma2", "gemma3", "phi3", "gpt_oss", "deepseek_v3"] {
        let gguf = gguf_dir(tmp.path(), name, None);
        let corpus = family_fixture(name).join("corpus.txt");
        let mut outs = Vec::new();
        for form in ["widened", "stored"] {
            let d = tmp.path().join(format!("{name}-{form}.safetensors"));
            let e = tmp.path().join(format!("{name}-{form}-e2e"));
            let (m, c) = (gguf.to_str().unwrap(), corpus.to_str().unwrap());
            let env = [("APPROX_BENCH_WEIGHTS", form)];
            let o = run(
                &[
                    "dump-qkv",
                    "--length",
                    "24",
                    "--layer",
                    "1",
                    "--model-dir",
                    m,
                    "--corpus",
                    c,
                    "--out",
                    d.to_str().unwrap(),
                ],
                &env,
            );
            assert!(o.status.success(), "{name} {form}: {}", stderr(&o));
            let flags = [
                "e2e",
                "--lengths",
                "24",
                "--windows",
                "1",
                "--n-f",
                "8",
                "--methods",
                "window,snapkv",
                "--features",
                "8",
                "--quiet",
                "--model-dir",
                m,
                "--corpus",
                c,
                "--out",
                e.to_str().unwrap(),
            ];
            let o = run(&flags, &env);
            assert!(o.status.success(), "{name} {form}: {}", stderr(&o));
            let manifest: Value =
                serde_json::from_str(&std::fs::read_to_string(e.join("manifest.json")).unwrap())
                    .unwrap();
            assert_eq!(manifest["memory"]["weights"], form, "{name}");
            assert!(
                manifest["memory"]["peak_resident_bytes"].as_u64().unwrap() > 0,
                "{name}"
            );
            assert!(
                manifest["memory"]["weights_estimate_bytes"]
                    .as_u64()
                    .unwrap()
                    > 0,
                "{name}"
            );
            let rows: Vec<String> = std::fs::read_to_string(e.join("e2e.csv"))
                .unwrap()
                .lines()
                .map(|l| l.rsplit_once(',').unwrap().0.to_string()) // all but `seconds`
                .collect();
            outs.push((std::fs::read(&d).unwrap(), rows));
        }
        assert!(
            outs[0].0 == outs[1].0,
            "{name}: the stored dump differs from the widened one"
        );
        assert_eq!(outs[0].1, outs[1].1, "{name}: e2e rows");
    }
    // 0.00001 GB is less than any fixture's weights: refused before loading, exit 2; a memory
    // that is no number is refused by name.
    let gguf = gguf_dir(tmp.path(), "gemma3", None);
    let corpus = family_fixture("gemma3").join("corpus.txt");
    let out = tmp.path().join("refused.safetensors");
    let (m, c, d) = (
        gguf.to_str().unwrap(),
        corpus.to_str().unwrap(),
        out.to_str().unwrap(),
    );
    for (memory, needle) in [
        ("0.00001", "its weights need about"),
        ("lots", "APPROX_BENCH_MEMORY_GB=lots"),
    ] {
        let args = [
            "dump-qkv",
            "--length",
            "24",
            "--model-dir",
            m,
            "--corpus",
            c,
            "--out",
            d,
        ];
        let o = run(&args, &[("APPROX_BENCH_MEMORY_GB", memory)]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{}", stderr(&o));
        assert!(!out.exists());
    }
}
