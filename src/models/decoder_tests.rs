//! The §7.7 families against transformers in true float64 (fixtures/families, made by
//! tests/reference/generate_family_fixtures.py; docs/reference.md §7.7.7). Each family's file
//! calls [`check_fixture`] on its fixtures.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use super::*;
use crate::attention::spec::exact_attention;
use crate::models::named_tensors::NamedTensors;
use crate::models::registry::{family_entry, gguf_family_entry};
use crate::models::Depth;
use crate::models::ExactAttention;

fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/families")
        .join(name)
}

/// Fixture `name`'s config.json.
pub(crate) fn fixture_config(name: &str) -> Value {
    json(&fixture_dir(name).join("config.json"))
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// max |a − b| / max |b|.
fn rel(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims(), "shapes differ");
    let a = a.to_dtype(DType::F64).unwrap();
    let b = b.to_dtype(DType::F64).unwrap();
    let num = (a - &b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap();
    let den = b.abs().unwrap().flatten_all().unwrap().max(0).unwrap();
    num.to_scalar::<f64>().unwrap() / den.to_scalar::<f64>().unwrap()
}

/// Every stored layer of fixture `name`, in f64 and f32, against transformers' float64 values:
/// Q, K, V and the dump's extra tensors; the layer's spec against spec.json; and O by the tool's
/// own exact attention on its own Q, K, V against transformers' attention output. Bounds: 1e-10
/// in f64 (both sides float64; measured ≤ 1e-13); in f32 the max(1e-4, 5 × floor) for
/// Q/K/V and max(1e-3, 5 × floor) for O, with the floors of docs/reference.md §7.7.7 all below
/// 2e-5 on these fixtures, so 1e-4 and 1e-3.
#[allow(dead_code)] // each family's tests call it
pub(crate) fn check_fixture(name: &str) {
    let dir = fixture_dir(name);
    let config = json(&dir.join("config.json"));
    let spec_json = json(&dir.join("spec.json"));
    let model_type = config["model_type"].as_str().unwrap();
    let entry = family_entry(model_type)
        .unwrap_or_else(|| panic!("{name}: model_type {model_type} has no family entry"));
    let dev = Device::Cpu;
    for expected in spec_json["expected"].as_array().unwrap() {
        let file = dir.join(expected["file"].as_str().unwrap());
        let want = candle_core::safetensors::load(&file, &dev).unwrap();
        let ids: Vec<u32> = want["ids"]
            .to_dtype(DType::I64)
            .unwrap()
            .to_vec1::<i64>()
            .unwrap()
            .into_iter()
            .map(|i| i as u32)
            .collect();
        for (layer, layer_spec) in expected["layers"].as_object().unwrap() {
            let l: usize = layer.parse().unwrap();
            let at = |t: &str| want[&format!("layer{l}.{t}")].clone();
            let mut weights =
                NamedTensors::open_file(&dir.join("model.safetensors"), &dev).unwrap();
            let model = (entry.load)(&config, &mut weights, Depth::Through(l)).unwrap();
            let what = format!("{name} {} layer {l}", expected["file"]);
            check_spec(&what, &model.attention_spec(l), layer_spec, &want, l);
            for (dtype, bound_qkv, bound_o) in
                [(DType::F64, 1e-10, 1e-10), (DType::F32, 1e-4, 1e-3)]
            {
                let dump = model.layer_dump(&ids, dtype).unwrap();
                assert_eq!(
                    dump.spec,
                    model.attention_spec(l),
                    "{what}: the dump's spec"
                );
                for (t, got) in [("q", &dump.q), ("k", &dump.k), ("v", &dump.v)] {
                    assert_eq!(got.dtype(), dtype, "{what}: {t} dtype");
                    let e = rel(got, &at(t));
                    assert!(e <= bound_qkv, "{what} {dtype:?}: {t} off by {e:e}");
                }
                for (t, got) in &dump.extra {
                    let e = rel(got, &at(t));
                    assert!(e <= bound_qkv, "{what} {dtype:?}: {t} off by {e:e}");
                }
                let o = exact_attention(&dump.q, &dump.k, &dump.v, &dump.spec).unwrap();
                let e = rel(&o, &at("o"));
                assert!(e <= bound_o, "{what} {dtype:?}: O off by {e:e}");
                for key in ["rope_factors", "mla"] {
                    if let Some(v) = layer_spec.get(key) {
                        assert_eq!(dump.sidecar.get(key), Some(v), "{what}: sidecar {key}");
                    }
                }
            }
        }
    }
}

/// The spec's τ, cap, window, layer type and sinks against spec.json and the stored sinks.
fn check_spec(
    what: &str,
    spec: &AttentionSpec,
    want: &Value,
    tensors: &std::collections::HashMap<String, Tensor>,
    l: usize,
) {
    let scale = want["scale"].as_f64().unwrap();
    assert!(
        (spec.scale - scale).abs() <= 1e-12 * scale,
        "{what}: scale {} vs {scale}",
        spec.scale
    );
    assert_eq!(spec.softcap, want["softcap"].as_f64(), "{what}: softcap");
    assert_eq!(
        spec.window,
        want["window"].as_u64().map(|w| w as usize),
        "{what}: window"
    );
    assert_eq!(
        spec.layer_type().label(),
        want["layer_type"].as_str().unwrap(),
        "{what}: layer type"
    );
    assert!(spec.causal, "{what}: a decoder layer is causal");
    match tensors.get(&format!("layer{l}.sinks")) {
        Some(s) => {
            let s: Vec<f64> = s.to_dtype(DType::F64).unwrap().to_vec1().unwrap();
            let got = spec.sinks.as_ref().expect("the layer has sinks");
            assert_eq!(got.len(), s.len(), "{what}: sinks");
            for (a, b) in got.iter().zip(&s) {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                    "{what}: sink {a} vs {b}"
                );
            }
        }
        None => assert!(spec.sinks.is_none(), "{what}: no sinks expected"),
    }
}

/// Fixture `name`'s ids and transformers' float64 `logits` [n, vocab].
pub(crate) fn fixture_logits(name: &str) -> (Vec<u32>, Tensor) {
    let want = candle_core::safetensors::load(
        fixture_dir(name).join("expected.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    let ids = want["ids"]
        .to_dtype(DType::I64)
        .unwrap()
        .to_vec1::<i64>()
        .unwrap()
        .into_iter()
        .map(|i| i as u32)
        .collect();
    (ids, want["logits"].clone())
}

/// Fixture `name` loaded whole through each route it has: "safetensors" (model.safetensors) and,
/// where the fixture has a model.gguf, "gguf" (the family's GGUF reader).
pub(crate) fn whole_models(name: &str) -> Vec<(&'static str, Box<dyn Decoder>)> {
    let dir = fixture_dir(name);
    let config = fixture_config(name);
    let entry = family_entry(config["model_type"].as_str().unwrap()).unwrap();
    let dev = Device::Cpu;
    let mut st = NamedTensors::open_file(&dir.join("model.safetensors"), &dev).unwrap();
    let mut models = vec![(
        "safetensors",
        (entry.load)(&config, &mut st, Depth::Whole).unwrap(),
    )];
    let gguf = dir.join("model.gguf");
    if gguf.is_file() {
        let file = crate::models::GgufFile::open(&gguf).unwrap();
        let (_, read) = gguf_family_entry(&file.architecture().unwrap()).unwrap();
        let (config, mut gg) = read(file, &dev).unwrap();
        models.push((
            "gguf",
            (entry.load)(&config, &mut gg, Depth::Whole).unwrap(),
        ));
    }
    models
}

/// One call of a hook: the layer, its spec, and the shapes of Q, K, V.
pub(crate) type HookCall = (usize, AttentionSpec, [Vec<usize>; 3]);

/// A hook that records its calls and answers `answer(layer, q, k, v, spec)`.
pub(crate) struct Recording<F> {
    pub calls: Mutex<Vec<HookCall>>,
    pub answer: F,
}

impl<F> Recording<F> {
    pub(crate) fn new(answer: F) -> Self {
        Self {
            calls: Mutex::new(Vec::new()),
            answer,
        }
    }
}

impl<F> AttentionHook for Recording<F>
where
    F: Fn(usize, &Tensor, &Tensor, &Tensor, &AttentionSpec) -> Tensor + Sync,
{
    fn attend(
        &self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        spec: &AttentionSpec,
    ) -> Result<Tensor> {
        let shapes = [q.dims().to_vec(), k.dims().to_vec(), v.dims().to_vec()];
        self.calls
            .lock()
            .unwrap()
            .push((layer, spec.clone(), shapes));
        Ok((self.answer)(layer, q, k, v, spec))
    }
}

/// The usage error of `r`, as text.
fn usage_error<T>(r: Result<T>) -> String {
    let e = r.err().expect("an error");
    assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e:#}");
    format!("{e:#}")
}

/// Fixture `name` whole (safetensors) through a recording hook that answers with exact attention:
/// one call per layer, in order, each with that layer's own spec (`attention_spec(l)`) and Q, K,
/// V shaped [H, n, p_qk], [H_kv, n, p_qk], [H_kv, n, p_v]; the logits equal ExactAttention's bit
/// for bit, and a hook answering zeros changes them (the forward uses the caller's hook). A hook
/// answering `wrong(q, k, v)` at layer 1 (a shape other than [H, n, p_v]) is a usage error naming
/// layer 1, and the forward stops there; so are a model loaded through its last layer (not whole)
/// and empty or out-of-range rows. Returns the calls for the family's own checks.
pub(crate) fn check_logits_hook(
    name: &str,
    wrong: impl Fn(&Tensor, &Tensor, &Tensor) -> Tensor + Sync,
) -> Vec<HookCall> {
    let (ids, _) = fixture_logits(name);
    let n = ids.len();
    let (_, model) = whole_models(name).swap_remove(0);
    let shape = model.shape();
    let exact = |_: usize, q: &Tensor, k: &Tensor, v: &Tensor, s: &AttentionSpec| {
        exact_attention(q, k, v, s).unwrap()
    };
    let hook = Recording::new(exact);
    let got = model.forward_logits(&ids, DType::F64, &hook, 0..n).unwrap();
    let want = model
        .forward_logits(&ids, DType::F64, &ExactAttention, 0..n)
        .unwrap();
    assert_eq!(rel(&got, &want), 0.0, "{name}: the recording hook's logits");
    let calls = hook.calls.into_inner().unwrap();
    let layers: Vec<usize> = calls.iter().map(|c| c.0).collect();
    assert_eq!(layers, (0..shape.layers).collect::<Vec<_>>(), "{name}");
    for (l, spec, [q, k, v]) in &calls {
        assert_eq!(*spec, model.attention_spec(*l), "{name}: layer {l}'s spec");
        assert_eq!(
            q,
            &[shape.heads, n, shape.head_dim],
            "{name}: layer {l}'s Q"
        );
        let kv = shape.kv_heads;
        assert_eq!(k, &[kv, n, shape.head_dim], "{name}: layer {l}'s K");
        assert_eq!(v, &[kv, n, shape.head_dim_v], "{name}: layer {l}'s V");
    }
    let zeros = Recording::new(
        |_: usize, q: &Tensor, _: &Tensor, v: &Tensor, _: &AttentionSpec| {
            let (h, n, _) = q.dims3().unwrap();
            Tensor::zeros((h, n, v.dim(2).unwrap()), q.dtype(), q.device()).unwrap()
        },
    );
    let other = model
        .forward_logits(&ids, DType::F64, &zeros, 0..n)
        .unwrap();
    assert!(
        rel(&other, &want) > 1e-3,
        "{name}: a zero attention changed nothing"
    );
    let bad = Recording::new(
        |l: usize, q: &Tensor, k: &Tensor, v: &Tensor, s: &AttentionSpec| match l {
            1 => wrong(q, k, v),
            _ => exact_attention(q, k, v, s).unwrap(),
        },
    );
    let e = usage_error(model.forward_logits(&ids, DType::F64, &bad, 0..n));
    assert!(e.contains("layer 1") && e.contains("shape"), "{name}: {e}");
    assert_eq!(
        bad.calls.into_inner().unwrap().len(),
        2,
        "{name}: stops at layer 1"
    );
    for rows in [3..3, 0..n + 1, n..n + 2] {
        let e = usage_error(model.forward_logits(&ids, DType::F64, &ExactAttention, rows));
        assert!(e.contains("rows"), "{name}: {e}");
    }
    let config = fixture_config(name);
    let entry = family_entry(config["model_type"].as_str().unwrap()).unwrap();
    let dir = fixture_dir(name);
    let mut st = NamedTensors::open_file(&dir.join("model.safetensors"), &Device::Cpu).unwrap();
    let part = (entry.load)(&config, &mut st, Depth::Through(shape.layers - 1)).unwrap();
    let e = usage_error(part.forward_logits(&ids, DType::F64, &ExactAttention, 0..n));
    assert!(e.contains("whole"), "{name}: {e}");
    calls
}

/// O one value short in its last axis: a wrong shape for every family.
pub(crate) fn one_short(_: &Tensor, _: &Tensor, v: &Tensor) -> Tensor {
    let (h, n, p_v) = v.dims3().unwrap();
    Tensor::zeros((h, n, p_v - 1), v.dtype(), v.device()).unwrap()
}

/// The expected files of fixture `name`: (file, ids, float64 logits [n, vocab]).
fn expected_logits(name: &str) -> Vec<(String, Vec<u32>, Tensor)> {
    let dir = fixture_dir(name);
    let spec_json = json(&dir.join("spec.json"));
    let files = spec_json["expected"].as_array().unwrap();
    files
        .iter()
        .map(|e| {
            let file = e["file"].as_str().unwrap().to_string();
            let want = candle_core::safetensors::load(dir.join(&file), &Device::Cpu).unwrap();
            let ids = want["ids"]
                .to_dtype(DType::I64)
                .unwrap()
                .to_vec1::<i64>()
                .unwrap();
            let ids = ids.into_iter().map(|i| i as u32).collect();
            (file, ids, want["logits"].clone())
        })
        .collect()
}

/// The whole model's logits (docs/reference.md §10.1) of fixture `name` with exact attention
/// against transformers' float64 logits, every route (`bounds`: route → (f64 bound, f32 bound),
/// max |Δ| / max |ref| over all rows); and a subset of rows equals the same rows of the full
/// call. Returns the measured (route, file, f64, f32) for the callers' comments.
pub(crate) fn check_fixture_logits(
    name: &str,
    bounds: impl Fn(&str) -> (f64, f64),
) -> Vec<(String, String, f64, f64)> {
    let mut measured = Vec::new();
    for (route, model) in whole_models(name) {
        let (b64, b32) = bounds(route);
        for (file, ids, want) in expected_logits(name) {
            let n = ids.len();
            let what = format!("{name} {route} {file}");
            let mut errs = [0.0; 2];
            for (i, (dtype, bound)) in [(DType::F64, b64), (DType::F32, b32)]
                .into_iter()
                .enumerate()
            {
                let got = model
                    .forward_logits(&ids, dtype, &ExactAttention, 0..n)
                    .unwrap();
                assert_eq!(got.dtype(), dtype, "{what}");
                assert_eq!(got.dims(), want.dims(), "{what}");
                errs[i] = rel(&got, &want);
                eprintln!("{what} {dtype:?}: logits off by {:e}", errs[i]);
                assert!(
                    errs[i] <= bound,
                    "{what} {dtype:?}: logits off by {:e}",
                    errs[i]
                );
                // The head is row-wise: rows 5..n alone are the same rows of the full call.
                let part = model
                    .forward_logits(&ids, dtype, &ExactAttention, 5..n)
                    .unwrap();
                let e = rel(&part, &got.narrow(0, 5, n - 5).unwrap());
                assert!(e == 0.0, "{what} {dtype:?}: rows 5..{n} off by {e:e}");
            }
            measured.push((route.to_string(), file, errs[0], errs[1]));
        }
    }
    measured
}

/// Decode mode's continuation-only forward (docs/reference.md §10.1 [REC]) of every family that
/// has one, on each route: with the exact run's prompt rows (a PromptRecorder over the full
/// forward) and exact attention, the continuation rows' logits are the full forward's (1e-12
/// relative in f64, 1e-5 in f32; the products differ only in their row blocking). Every layer's
/// hook sees the whole window, prompt and continuation, under the layer's own spec; a hook
/// answering zeros moves the logits (the forward uses the caller's hook); rows before the
/// continuation are refused. On MLA (DeepSeek) the hook is handed the whole window's latent,
/// the prompt's rows the exact run's.
#[test]
fn the_continuation_forward_gives_the_full_forwards_rows() {
    use crate::models::PromptRecorder;
    let exact = |_: usize, q: &Tensor, k: &Tensor, v: &Tensor, s: &AttentionSpec| {
        exact_attention(q, k, v, s).unwrap()
    };
    let names = ["gemma2", "gemma3", "phi3", "phi3-longrope", "gpt_oss"];
    let mla = ["deepseek_v2", "deepseek_v3", "deepseek_v3-noqlora"];
    for name in names.into_iter().chain(mla) {
        let (ids, _) = fixture_logits(name);
        let (n, n_p) = (ids.len(), ids.len() - 8);
        for (route, model) in whole_models(name) {
            let what = format!("{name} ({route})");
            let shape = model.shape();
            for (dtype, bound) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
                let recorder = PromptRecorder::new(&ExactAttention, n_p, shape.layers);
                let full = model
                    .forward_logits(&ids, dtype, &recorder, n_p..n)
                    .unwrap();
                let prompt = recorder.into_cache().unwrap();
                let hook = Recording::new(exact);
                let got = model
                    .continuation_logits(&ids, dtype, &hook, &prompt, n_p..n)
                    .unwrap();
                let e = rel(&got, &full);
                assert!(e <= bound, "{what} {dtype:?}: {e:e}");
                let calls = hook.calls.into_inner().unwrap();
                assert_eq!(calls.len(), shape.layers, "{what}");
                for (l, spec, [q, k, _]) in &calls {
                    assert_eq!(*spec, model.attention_spec(*l), "{what}: layer {l}");
                    assert_eq!(q[1], n, "{what}: layer {l}'s Q rows");
                    assert_eq!(k[1], n, "{what}: layer {l}'s K rows");
                }
                let zeros = Recording::new(
                    |_: usize, q: &Tensor, _: &Tensor, v: &Tensor, _: &AttentionSpec| {
                        let (h, n, _) = q.dims3().unwrap();
                        Tensor::zeros((h, n, v.dim(2).unwrap()), q.dtype(), q.device()).unwrap()
                    },
                );
                let moved = model
                    .continuation_logits(&ids, dtype, &zeros, &prompt, n_p..n)
                    .unwrap();
                assert!(rel(&moved, &full) > 1e-3, "{what}: zeros changed nothing");
                let early = model.continuation_logits(&ids, dtype, &ExactAttention, &prompt, 1..n);
                assert!(early.is_err(), "{what}: a prompt row was accepted");
                if model.is_mla() {
                    // The latent each layer's hook is handed: the full forward's, every row.
                    let (full, cont) = (Latents::default(), Latents::default());
                    let recorder = PromptRecorder::new(&full, n_p, shape.layers);
                    model
                        .forward_logits(&ids, dtype, &recorder, n_p..n)
                        .unwrap();
                    let prompt = recorder.into_cache().unwrap();
                    model
                        .continuation_logits(&ids, dtype, &cont, &prompt, n_p..n)
                        .unwrap();
                    let (full, cont) = (full.0.into_inner().unwrap(), cont.0.into_inner().unwrap());
                    assert_eq!(full.len(), shape.layers, "{what}");
                    assert_eq!(cont.len(), shape.layers, "{what}");
                    for (l, (a, b)) in full.iter().zip(&cont).enumerate() {
                        assert_eq!(a.0.dims(), b.0.dims(), "{what}: layer {l}'s latent");
                        let e = rel(&b.0, &a.0).max(rel(&b.1, &a.1));
                        assert!(e <= bound, "{what}: layer {l}'s latent off by {e:e}");
                    }
                }
            }
        }
    }
}

/// A hook that keeps the latent view (rows and W_kvb) each MLA layer is handed, answering with
/// exact attention.
#[derive(Default)]
struct Latents(Mutex<Vec<(Tensor, Tensor)>>);

impl AttentionHook for Latents {
    fn attend(
        &self,
        _: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        spec: &AttentionSpec,
    ) -> Result<Tensor> {
        exact_attention(q, k, v, spec)
    }

    fn attend_latent(
        &self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        spec: &AttentionSpec,
        latent: &std::sync::Arc<crate::attention::latent::LayerLatent>,
    ) -> Result<Tensor> {
        let mut kept = self.0.lock().unwrap();
        assert_eq!(kept.len(), layer, "one call per layer, in order");
        kept.push((latent.latent.clone(), latent.w_kv_b.clone()));
        exact_attention(q, k, v, spec)
    }
}
