//! The decoder forward against transformers (fixtures/decoders, written by
//! tests/reference/generate_decoder_fixtures.py) and the causal attention against a plain loop.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::*;
use crate::models::{
    gguf::load_gguf,
    weights::{initialize, load_safetensors, shards_needed},
};
use crate::tensor_util::{test_device, to_vec_f64};

/// Layer L's Q, K, V of the window `ids`: the forward stopped at the last loaded layer.
fn window_qkv(
    w: &DecoderWeights,
    cfg: &DecoderConfig,
    ids: &[u32],
    dtype: DType,
) -> Result<(Tensor, Tensor, Tensor)> {
    let model = Llama {
        cfg: cfg.clone(),
        weights: w.clone(),
    };
    let dump = model.layer_dump(ids, dtype)?;
    Ok((dump.q, dump.k, dump.v))
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/decoders")
}

fn expected(family: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(
        fixtures().join(family).join("expected.safetensors"),
        &test_device(),
    )
    .unwrap()
}

/// max |a − b| / max |b|.
fn rel(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims());
    let (a, b) = (to_vec_f64(a).unwrap(), to_vec_f64(b).unwrap());
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
        / scale
}

fn ids(e: &HashMap<String, Tensor>) -> Vec<u32> {
    e["ids"]
        .to_vec1::<i64>()
        .unwrap()
        .iter()
        .map(|&i| i as u32)
        .collect()
}

/// Q, K, V and the causal output of layer 1 agree with transformers to 1e-5 relative, in f32 and
/// in f64; returns the worst relative difference seen.
fn check_against_fixture(family: &str, w: &DecoderWeights, cfg: &DecoderConfig) -> f64 {
    let e = expected(family);
    let mut worst = 0.0f64;
    for dtype in [DType::F32, DType::F64] {
        let (q, k, v) = window_qkv(w, cfg, &ids(&e), dtype).unwrap();
        assert_eq!(q.dtype(), dtype);
        let o = causal_attention(&q, &k, &v, None).unwrap();
        for (name, got) in [("q", &q), ("k", &k), ("v", &v), ("causal_output", &o)] {
            let r = rel(got, &e[name]);
            println!("{family} {dtype:?} {name}: max rel diff {r:.2e}");
            assert!(r <= 1e-5, "{family} {dtype:?} {name}: {r:.3e} > 1e-5");
            worst = worst.max(r);
        }
    }
    worst
}

fn from_dir(family: &str, weights: &str) -> (DecoderConfig, DecoderWeights) {
    let dir = fixtures().join(family);
    let cfg = DecoderConfig::load(&dir.join("config.json")).unwrap();
    let w = load_safetensors(&cfg, 1, &dir.join(weights), &test_device()).unwrap();
    (cfg, w)
}

#[test]
fn llama_gqa_llama3_rope_sharded_matches_transformers() {
    let (cfg, w) = from_dir("llama", "model.safetensors.index.json");
    assert_eq!((cfg.num_attention_heads, cfg.num_key_value_heads), (4, 2));
    assert!(matches!(
        cfg.rope.scaling,
        super::super::RopeScaling::Llama3 { .. }
    ));
    assert_eq!(w.layers.len(), 2);
    assert!(w.layers[0].rest.is_some() && w.layers[1].rest.is_none());
    check_against_fixture("llama", &w, &cfg);
}

#[test]
fn mistral_with_a_sliding_window_matches_transformers() {
    let (cfg, w) = from_dir("mistral", "model.safetensors");
    // 16 < 40 tokens: layer 0's attention is windowed, and layer 1's input shows it.
    assert_eq!(cfg.sliding_window, vec![Some(16); 2]);
    check_against_fixture("mistral", &w, &cfg);
    // Without the window layer 1's input differs: the window is what makes it agree.
    let mut plain = cfg.clone();
    plain.sliding_window = vec![None; 2];
    let e = expected("mistral");
    let (q, _, _) = window_qkv(&w, &plain, &ids(&e), DType::F32).unwrap();
    assert!(rel(&q, &e["q"]) > 1e-3);
}

#[test]
fn qwen2_biases_and_bf16_weights_match_transformers() {
    let (cfg, w) = from_dir("qwen2", "model.safetensors");
    assert!(cfg.qkv_bias && cfg.tie_word_embeddings);
    check_against_fixture("qwen2", &w, &cfg);
}

#[test]
fn qwen3_qk_norms_and_explicit_head_dim_match_transformers() {
    let (cfg, w) = from_dir("qwen3", "model.safetensors");
    assert_eq!(cfg.head_dim, 32);
    assert!(cfg.qk_norm);
    check_against_fixture("qwen3", &w, &cfg);
}

#[test]
fn shards_needed_picks_exactly_the_shards_of_layers_0_to_l() {
    let index = fixtures().join("llama/model.safetensors.index.json");
    let shard = |i: usize| format!("model-0000{i}-of-00004.safetensors");
    assert_eq!(shards_needed(&index, 0).unwrap(), vec![shard(1), shard(2)]);
    assert_eq!(
        shards_needed(&index, 1).unwrap(),
        vec![shard(1), shard(2), shard(3)]
    );
    assert_eq!(
        shards_needed(&index, 2).unwrap(),
        (1..=4).map(shard).collect::<Vec<_>>()
    );
    // Layer 1 loads from a copy without the last shard (later layers, lm_head) and agrees.
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors.index.json"]
        .into_iter()
        .map(String::from)
        .chain((1..=3).map(shard))
    {
        std::fs::copy(fixtures().join("llama").join(&f), dir.path().join(&f)).unwrap();
    }
    let cfg = DecoderConfig::load(&dir.path().join("config.json")).unwrap();
    let index_copy = dir.path().join("model.safetensors.index.json");
    let w = load_safetensors(&cfg, 1, &index_copy, &test_device()).unwrap();
    let (_, full) = from_dir("llama", "model.safetensors.index.json");
    let e = expected("llama");
    let a = window_qkv(&w, &cfg, &ids(&e), DType::F32).unwrap();
    let b = window_qkv(&full, &cfg, &ids(&e), DType::F32).unwrap();
    assert_eq!(to_vec_f64(&a.0).unwrap(), to_vec_f64(&b.0).unwrap());
    // Layer 2 needs the missing shard: a usage error naming it.
    let err = load_safetensors(&cfg, 2, &index_copy, &test_device()).unwrap_err();
    assert!(err.to_string().contains(&shard(4)), "{err}");
}

#[test]
fn gguf_with_llama_cpp_permutation_matches_transformers() {
    let (cfg, w) = load_gguf(&fixtures().join("llama_gguf.gguf"), 1, &test_device()).unwrap();
    let json = DecoderConfig::load(&fixtures().join("llama/config.json")).unwrap();
    // Metadata and config.json agree on everything but the spelling of the llama3 scaling
    // (divisors in rope_freqs.weight), which gives the same inv_freq.
    // GGUF holds ε as f32 (transformers' GGUF loader reads the same f32 value).
    let mut same = cfg.clone();
    same.rope.scaling = json.rope.scaling.clone();
    assert!((same.rms_norm_eps / json.rms_norm_eps - 1.0).abs() < 1e-7);
    same.rms_norm_eps = json.rms_norm_eps;
    assert_eq!(same, json);
    let (a, b) = (
        super::super::rope::inv_freq(&cfg.rope, 16),
        super::super::rope::inv_freq(&json.rope, 16),
    );
    assert!(
        a.iter().zip(&b).all(|(x, y)| (x / y - 1.0).abs() < 1e-6),
        "{a:?} {b:?}"
    );
    check_against_fixture("llama", &w, &cfg);
}

#[test]
fn missing_tensor_is_a_usage_error_naming_tensor_and_file() {
    // qwen2 expects q/k/v biases; the mistral checkpoint has none.
    let dir = fixtures();
    let mut cfg = DecoderConfig::load(&dir.join("mistral/config.json")).unwrap();
    cfg.qkv_bias = true;
    let path = dir.join("mistral/model.safetensors");
    let e = load_safetensors(&cfg, 1, &path, &test_device()).unwrap_err();
    assert!(e.downcast_ref::<crate::UsageError>().is_some());
    let m = e.to_string();
    assert!(
        m.contains("model.layers.0.self_attn.q_proj.bias")
            && m.contains("mistral/model.safetensors"),
        "{m}"
    );
}

/// A plain loop: O_i = Σ_{j ≤ i, j > i − W} softmax(q_i·k_j/√p) v_j, K/V head ⌊h·H_kv/H⌋.
fn naive(
    (q, k, v): (&[f64], &[f64], &[f64]),
    (h, hkv, n, p): (usize, usize, usize, usize),
    w: usize,
) -> Vec<f64> {
    let mut out = vec![0.0; h * n * p];
    for hd in 0..h {
        let g = hd * hkv / h;
        for i in 0..n {
            let js: Vec<usize> = (0..=i).filter(|&j| j + w > i).collect();
            let s: Vec<f64> = js
                .iter()
                .map(|&j| {
                    (0..p)
                        .map(|t| q[(hd * n + i) * p + t] * k[(g * n + j) * p + t])
                        .sum::<f64>()
                        / (p as f64).sqrt()
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            for (&j, sj) in js.iter().zip(&s) {
                for t in 0..p {
                    out[(hd * n + i) * p + t] += (sj - m).exp() / z * v[(g * n + j) * p + t];
                }
            }
        }
    }
    out
}

#[test]
fn dense_attention_blocks_gqa_and_windows_match_a_plain_loop() {
    let (h, hkv, n, p) = (6, 2, 23, 4);
    let gen = |len: usize, salt: usize| -> Vec<f64> {
        (0..len)
            .map(|i| (((i * 7919 + salt * 104729) % 1000) as f64 / 250.0) - 2.0)
            .collect()
    };
    let (qv, kv, vv) = (gen(h * n * p, 1), gen(hkv * n * p, 2), gen(hkv * n * p, 3));
    let dev = test_device();
    let q = Tensor::from_vec(qv.clone(), (h, n, p), &dev).unwrap();
    let k = Tensor::from_vec(kv.clone(), (hkv, n, p), &dev).unwrap();
    let v = Tensor::from_vec(vv.clone(), (hkv, n, p), &dev).unwrap();
    for window in [None, Some(1), Some(5), Some(100)] {
        let want = naive(
            (&qv, &kv, &vv),
            (h, hkv, n, p),
            window.unwrap_or(usize::MAX / 2),
        );
        for rows in [1, 4, 7, n] {
            let spec = crate::attention::spec::AttentionSpec::causal(p, window);
            let got = to_vec_f64(
                &crate::attention::spec::exact_attention_blocks(&q, &k, &v, &spec, rows).unwrap(),
            )
            .unwrap();
            let err = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            assert!(err < 1e-12, "window {window:?} rows {rows}: {err}");
        }
    }
    // Query heads 0–2 read K/V head 0 and 3–5 head 1: changing K/V head 1 leaves heads 0–2 alone.
    let mut kv2 = kv.clone();
    kv2[n * p..].iter_mut().for_each(|x| *x *= 2.0);
    let k2 = Tensor::from_vec(kv2, (hkv, n, p), &dev).unwrap();
    let a = causal_attention(&q, &k, &v, None).unwrap();
    let b = causal_attention(&q, &k2, &v, None).unwrap();
    assert_eq!(
        to_vec_f64(&a.narrow(0, 0, 3).unwrap()).unwrap(),
        to_vec_f64(&b.narrow(0, 0, 3).unwrap()).unwrap()
    );
    assert!(rel(&a.narrow(0, 3, 3).unwrap(), &b.narrow(0, 3, 3).unwrap()) > 1e-3);
}

#[test]
fn initialized_weights_follow_hf_init_weights() {
    let cfg = DecoderConfig::load(&fixtures().join("qwen3/config.json")).unwrap();
    let dev = test_device();
    let w = initialize(&cfg, 1, 5, &dev).unwrap();
    let l0 = &w.layers[0];
    assert_eq!(l0.q.weight.dims(), &[128, 64]);
    let ones = |t: &Tensor| to_vec_f64(t).unwrap().iter().all(|&x| x == 1.0);
    assert!(
        ones(&l0.input_norm)
            && ones(l0.q_norm.as_ref().unwrap())
            && ones(&l0.rest.as_ref().unwrap().post_norm)
    );
    let vals = to_vec_f64(&w.embed.widen(DType::F32).unwrap()).unwrap();
    let sd = (vals.iter().map(|x| x * x).sum::<f64>() / vals.len() as f64).sqrt();
    // 8192 draws of N(0, 0.02²): the sample sd is within 0.001 of 0.02 (≈ 3.5 standard errors).
    assert!((sd - 0.02).abs() < 1e-3, "{sd}");
    // Per-name seeds: the same tensor whatever else is built.
    let w0 = initialize(&cfg, 0, 5, &dev).unwrap();
    assert_eq!(
        to_vec_f64(&w0.layers[0].k.weight.widen(DType::F32).unwrap()).unwrap(),
        to_vec_f64(&l0.k.weight.widen(DType::F32).unwrap()).unwrap()
    );
    let other = initialize(&cfg, 0, 6, &dev).unwrap();
    assert_ne!(
        to_vec_f64(&other.layers[0].k.weight.widen(DType::F32).unwrap()).unwrap(),
        to_vec_f64(&l0.k.weight.widen(DType::F32).unwrap()).unwrap()
    );
    let (q, k, _) = window_qkv(&w, &cfg, &[1, 2, 3, 4, 5], DType::F32).unwrap();
    assert_eq!((q.dims(), k.dims()), (&[4, 5, 32][..], &[2, 5, 32][..]));
    // qwen2 biases are zero at init.
    let q2 = DecoderConfig::load(&fixtures().join("qwen2/config.json")).unwrap();
    let w2 = initialize(&q2, 0, 5, &dev).unwrap();
    assert!(to_vec_f64(w2.layers[0].q.bias.as_ref().unwrap())
        .unwrap()
        .iter()
        .all(|&x| x == 0.0));
}

#[test]
fn out_of_vocabulary_ids_and_layers_beyond_the_model_are_usage_errors() {
    let cfg = DecoderConfig::load(&fixtures().join("mistral/config.json")).unwrap();
    let w = initialize(&cfg, 0, 1, &test_device()).unwrap();
    let e = window_qkv(&w, &cfg, &[1, 500], DType::F32).unwrap_err();
    assert!(e.to_string().contains("500"), "{e}");
    let e = initialize(&cfg, 2, 1, &test_device()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "--layer 2 is beyond the model: it has 2 layers (0..=1)"
    );
}

/// The Mistral window question (issue 54): transformers' own attention at sliding layer 1 (n = 40 >
/// W = 16; tests/reference/mistral_window_output.py) is the layer's spec with its window, and not the
/// plain causal target. The sweep's and dump's target (`Prepared::layer_spec`) is this spec.
#[test]
fn a_sliding_layers_own_attention_is_the_windowed_target() {
    let (cfg, w) = from_dir("mistral", "model.safetensors");
    let e = expected("mistral");
    let (q, k, v) = window_qkv(&w, &cfg, &ids(&e), DType::F32).unwrap();
    let theirs = candle_core::safetensors::load(
        fixtures().join("mistral/attention_output.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap()
    .remove("attention_output")
    .unwrap();
    let spec = cfg.attention_spec(1);
    assert_eq!(spec.window, Some(16));
    let windowed = crate::attention::spec::exact_attention(&q, &k, &v, &spec).unwrap();
    assert!(
        rel(&windowed, &theirs) < 1e-5,
        "{}",
        rel(&windowed, &theirs)
    );
    let plain = crate::attention::spec::exact_attention(
        &q,
        &k,
        &v,
        &crate::attention::AttentionSpec::causal(cfg.head_dim, None),
    )
    .unwrap();
    assert!(rel(&plain, &theirs) > 1e-3, "{}", rel(&plain, &theirs));
}
