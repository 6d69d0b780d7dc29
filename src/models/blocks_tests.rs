//! Weights kept as stored (issue 56) against the same checkpoint widened at load: a GGUF of
//! several ggml types and a bf16 safetensors checkpoint give the same Q/K/V, logits and
//! continuation logits, bit for bit, and the stored form holds the file's bytes, not f32's.

use std::path::Path;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use super::*;
use crate::models::decoder::Decoder;
use crate::models::gguf::{load_gguf_as, tests::rewritten_with};
use crate::models::llama::Llama;
use crate::models::weights::{load_safetensors_as, Depth};
use crate::models::{DecoderConfig, ExactAttention, PromptRecorder};

fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/decoders")
}

fn ids() -> Vec<u32> {
    (0..40u32).map(|i| (i * 37 + 5) % 128).collect()
}

fn bits(t: &Tensor) -> Vec<u64> {
    let v: Vec<f64> = t
        .flatten_all()
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec1()
        .unwrap();
    v.into_iter().map(f64::to_bits).collect()
}

/// Asserts `a` and `b` hold the same values bit for bit, naming the first that differs.
fn assert_bits(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.dims(), b.dims(), "{what}");
    let (x, y) = (bits(a), bits(b));
    if let Some(i) = (0..x.len()).find(|&i| x[i] != y[i]) {
        panic!(
            "{what}: value {i} of {} differs: {} against {}",
            x.len(),
            f64::from_bits(x[i]),
            f64::from_bits(y[i])
        );
    }
}

/// Every forward of `a` and `b` (the same checkpoint kept two ways) agrees bit for bit: layer
/// L's dump through each layer, the whole model's logits, and the continuation-only logits.
fn assert_same_forwards(what: &str, load: impl Fn(Depth, WeightForm) -> Llama) {
    let ids = ids();
    let layers = load(Depth::Whole, WeightForm::Widened)
        .cfg
        .num_hidden_layers;
    for dtype in [DType::F32, DType::F64] {
        for l in 0..layers {
            let (w, s) = (
                load(Depth::Through(l), WeightForm::Widened),
                load(Depth::Through(l), WeightForm::Stored),
            );
            let (a, b) = (
                w.layer_dump(&ids, dtype).unwrap(),
                s.layer_dump(&ids, dtype).unwrap(),
            );
            for (name, x, y) in [("q", &a.q, &b.q), ("k", &a.k, &b.k), ("v", &a.v, &b.v)] {
                assert_bits(x, y, &format!("{what}: layer {l}'s {name} in {dtype:?}"));
            }
        }
        let (w, s) = (
            load(Depth::Whole, WeightForm::Widened),
            load(Depth::Whole, WeightForm::Stored),
        );
        let n = ids.len();
        let (a, b) = (
            w.forward_logits(&ids, dtype, &ExactAttention, 0..n)
                .unwrap(),
            s.forward_logits(&ids, dtype, &ExactAttention, 0..n)
                .unwrap(),
        );
        assert_bits(&a, &b, &format!("{what}: logits in {dtype:?}"));
        let n_p = n - 8;
        let recorder = PromptRecorder::new(&ExactAttention, n_p, layers);
        w.forward_logits(&ids, dtype, &recorder, n_p..n).unwrap();
        let prompt = recorder.into_cache().unwrap();
        let (a, b) = (
            w.continuation_logits(&ids, dtype, &ExactAttention, &prompt, n_p..n)
                .unwrap(),
            s.continuation_logits(&ids, dtype, &ExactAttention, &prompt, n_p..n)
                .unwrap(),
        );
        assert_bits(&a, &b, &format!("{what}: continuation logits in {dtype:?}"));
    }
}

/// The bytes of every weight matrix of a whole model.
fn matrix_bytes(m: &Llama) -> usize {
    let w = &m.weights;
    let mut total = w.embed.bytes();
    for l in &w.layers {
        total += l.q.weight.bytes() + l.k.weight.bytes() + l.v.weight.bytes();
        if let Some(r) = &l.rest {
            total += r.o.weight.bytes()
                + r.gate.weight.bytes()
                + r.up.weight.bytes()
                + r.down.weight.bytes();
        }
    }
    total
}

#[test]
fn a_gguf_of_several_ggml_types_kept_as_stored_gives_the_widened_bits() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("mixed.gguf");
    // Every 2-D weight requantized, cycling through the block types whose blocks fit a row of
    // 64 or 96; q/k in a block type too, so that llama.cpp's row order is undone on blocks.
    let types = [
        GgmlDType::Q4_0,
        GgmlDType::Q8_0,
        GgmlDType::Q4_1,
        GgmlDType::Q5_0,
        GgmlDType::Q5_1,
        GgmlDType::F16,
    ];
    let mut used = std::collections::BTreeSet::new();
    let mut i = 0;
    rewritten_with(&fixtures().join("llama_gguf.gguf"), &path, |name, q| {
        if q.shape().rank() != 2 || name.contains("norm") {
            return None;
        }
        let t = types[i % types.len()];
        i += 1;
        used.insert(format!("{t:?}"));
        let f = q.dequantize(&Device::Cpu).unwrap();
        Some(QTensor::quantize(&f, t).unwrap())
    });
    assert!(used.len() >= 5, "{used:?}");
    let dev = Device::Cpu;
    let load = |depth: Depth, form: WeightForm| {
        let (cfg, weights) = load_gguf_as(&path, depth, &dev, form).unwrap();
        Llama { cfg, weights }
    };
    let (w, s) = (
        load(Depth::Whole, WeightForm::Widened),
        load(Depth::Whole, WeightForm::Stored),
    );
    assert!(matches!(s.weights.embed, Weight::Ggml { .. }));
    assert!(
        matrix_bytes(&s) * 3 < matrix_bytes(&w),
        "{} of {}",
        matrix_bytes(&s),
        matrix_bytes(&w)
    );
    assert_same_forwards("mixed GGUF", load);
}

#[test]
fn a_bf16_checkpoint_kept_as_stored_gives_the_widened_bits() {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixtures().join("llama");
    let mut tensors = std::collections::HashMap::new();
    for i in 1..=4 {
        let shard = src.join(format!("model-0000{i}-of-00004.safetensors"));
        for (name, t) in candle_core::safetensors::load(shard, &Device::Cpu).unwrap() {
            tensors.insert(name, t.to_dtype(DType::BF16).unwrap());
        }
    }
    let path = tmp.path().join("model.safetensors");
    candle_core::safetensors::save(&tensors, &path).unwrap();
    let cfg = DecoderConfig::load(&src.join("config.json")).unwrap();
    let dev = Device::Cpu;
    let load = |depth: Depth, form: WeightForm| Llama {
        cfg: cfg.clone(),
        weights: load_safetensors_as(&cfg, depth, &path, &dev, form).unwrap(),
    };
    let (w, s) = (
        load(Depth::Whole, WeightForm::Widened),
        load(Depth::Whole, WeightForm::Stored),
    );
    assert_eq!(2 * matrix_bytes(&s), matrix_bytes(&w));
    assert_same_forwards("bf16 safetensors", load);
}

#[test]
fn rows_of_ggml_blocks_dequantize_to_the_rows_of_the_whole() {
    let dev = Device::Cpu;
    let values: Vec<f32> = (0..96 * 64)
        .map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0)
        .collect();
    let f = Tensor::from_vec(values, (96, 64), &dev).unwrap();
    for t in [GgmlDType::Q4_0, GgmlDType::Q8_0, GgmlDType::Q4K] {
        let cols = if t == GgmlDType::Q4K { 256 } else { 64 };
        let f = if cols == 256 {
            f.reshape((24, 256)).unwrap()
        } else {
            f.clone()
        };
        let q = QTensor::quantize(&f, t).unwrap();
        let whole = q.dequantize(&dev).unwrap();
        let w = Weight::Ggml {
            q: std::sync::Arc::new(q),
            device: dev.clone(),
        };
        assert_bits(&w.widen(DType::F32).unwrap(), &whole, &format!("{t:?}"));
        let ids = [5u32, 0, 5, 17];
        let want = whole
            .index_select(&Tensor::new(&ids, &dev).unwrap(), 0)
            .unwrap();
        assert_bits(
            &w.select_rows(&ids, DType::F32).unwrap(),
            &want,
            &format!("{t:?} rows"),
        );
        let part = w.rows(3, 4).unwrap().widen(DType::F64).unwrap();
        assert_bits(
            &part,
            &whole.narrow(0, 3, 4).unwrap(),
            &format!("{t:?} part"),
        );
    }
}

#[test]
fn an_integer_weight_is_refused_by_name_not_converted() {
    // Issue 57: a checkpoint whose weight is stored as integers is no checkpoint of this model.
    let tmp = tempfile::tempdir().unwrap();
    let src = fixtures().join("llama");
    let mut tensors = std::collections::HashMap::new();
    for i in 1..=4 {
        let shard = src.join(format!("model-0000{i}-of-00004.safetensors"));
        tensors.extend(candle_core::safetensors::load(shard, &Device::Cpu).unwrap());
    }
    let name = "model.layers.0.mlp.up_proj.weight";
    let w = tensors[name].to_dtype(DType::I64).unwrap();
    tensors.insert(name.to_string(), w);
    let path = tmp.path().join("model.safetensors");
    candle_core::safetensors::save(&tensors, &path).unwrap();
    let cfg = DecoderConfig::load(&src.join("config.json")).unwrap();
    for form in [WeightForm::Widened, WeightForm::Stored] {
        let e = load_safetensors_as(&cfg, Depth::Whole, &path, &Device::Cpu, form).unwrap_err();
        assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e}");
        assert!(
            e.to_string().contains(name) && e.to_string().contains("I64"),
            "{e}"
        );
    }
}
