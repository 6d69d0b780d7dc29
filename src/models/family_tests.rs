//! The §7.7 families against transformers in true float64 (fixtures/families, made by
//! tests/reference/generate_family_fixtures.py; docs/reference.md §7.7.7). Each family's file
//! calls [`check_fixture`] on its fixtures.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use super::*;
use crate::attention::spec::exact_attention;
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
