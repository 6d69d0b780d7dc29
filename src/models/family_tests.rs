//! The §7.7 families against transformers in true float64 (fixtures/families, made by
//! tests/reference/generate_family_fixtures.py; docs/reference.md §7.7.7). Each family's file
//! calls [`check_fixture`] on its fixtures.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use super::*;
use crate::attention::spec::exact_attention;
use crate::models::llama::ExactAttention;
use crate::models::Depth;

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

/// Fixture `name` loaded whole: from model.safetensors, and from model.gguf when the fixture has
/// one (through its family's GGUF reader), each with the name of its route.
pub(crate) fn whole_models(name: &str) -> Vec<(&'static str, Box<dyn FamilyModel>)> {
    let dir = fixture_dir(name);
    let dev = Device::Cpu;
    let config = fixture_config(name);
    let entry = family_entry(config["model_type"].as_str().unwrap()).unwrap();
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

/// A hook that records each call's layer and spec and answers with exact attention, or, at
/// `bad_layer`, with O one head-dim short.
struct Recorder {
    seen: std::sync::Mutex<Vec<(usize, AttentionSpec)>>,
    bad_layer: Option<usize>,
}

impl AttentionHook for Recorder {
    fn attend(
        &self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        spec: &AttentionSpec,
    ) -> Result<Tensor> {
        self.seen.lock().unwrap().push((layer, spec.clone()));
        let o = exact_attention(q, k, v, spec)?;
        match self.bad_layer {
            Some(l) if l == layer => Ok(o.narrow(2, 0, o.dim(2)? - 1)?),
            _ => Ok(o),
        }
    }
}

/// The usage error of `r`, as text.
fn usage_error<T>(r: Result<T>) -> String {
    let e = r.err().expect("an error");
    assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e:#}");
    format!("{e:#}")
}

/// Fixture `name`'s forward through a hook: the hook sees every layer once, in order, each with
/// that layer's own spec (`attention_spec(l)`), and its O is what the logits are made of (a
/// recording hook that answers exactly gives ExactAttention's logits bit for bit); a hook whose
/// O is not shaped like Q at a middle layer is a usage error naming the layer; a model loaded
/// through its last layer (not whole), and empty or out-of-range rows, are usage errors.
pub(crate) fn check_logits_hook(name: &str) {
    let (_, model) = whole_models(name).swap_remove(0);
    let layers = model.shape().layers;
    let ids: Vec<u32> = (0..24u32).map(|i| (i * 29 + 3) % 128).collect();
    let rec = Recorder {
        seen: Default::default(),
        bad_layer: None,
    };
    let got = model.forward_logits(&ids, DType::F64, &rec, 0..24).unwrap();
    let seen = rec.seen.into_inner().unwrap();
    let want: Vec<(usize, AttentionSpec)> =
        (0..layers).map(|l| (l, model.attention_spec(l))).collect();
    assert_eq!(seen, want, "{name}: the layers the hook saw");
    let exact = model
        .forward_logits(&ids, DType::F64, &ExactAttention, 0..24)
        .unwrap();
    assert_eq!(rel(&got, &exact), 0.0, "{name}");
    let bad = Recorder {
        seen: Default::default(),
        bad_layer: Some(1),
    };
    let e = usage_error(model.forward_logits(&ids, DType::F64, &bad, 0..24));
    assert!(e.contains("layer 1") && e.contains("shape"), "{name}: {e}");
    assert_eq!(
        bad.seen.into_inner().unwrap().len(),
        2,
        "{name}: stops at layer 1"
    );
    for rows in [3..3, 20..25] {
        let e = usage_error(model.forward_logits(&ids, DType::F64, &ExactAttention, rows));
        assert!(e.contains("rows"), "{name}: {e}");
    }
    let dir = fixture_dir(name);
    let config = fixture_config(name);
    let entry = family_entry(config["model_type"].as_str().unwrap()).unwrap();
    let mut st = NamedTensors::open_file(&dir.join("model.safetensors"), &Device::Cpu).unwrap();
    let part = (entry.load)(&config, &mut st, Depth::Through(layers - 1)).unwrap();
    let e = usage_error(part.forward_logits(&ids, DType::F64, &ExactAttention, 0..24));
    assert!(e.contains("whole"), "{name}: {e}");
}
