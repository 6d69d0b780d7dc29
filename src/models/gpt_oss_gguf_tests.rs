use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::{DType, Device};

use super::*;
use crate::models::gpt_oss::load;
use crate::models::Depth;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/families/gpt_oss")
}

/// The GGUF route (fixtures/families/gpt_oss/model.gguf, written by
/// tests/reference/generate_family_gguf.py as llama.cpp's converter lays gpt-oss out: gate/up
/// split from the interleaved experts, down transposed, the sinks as `attn_sinks`, F32) reads the
/// same model: the same config fields that matter (yarn rope, windows, experts), the same spec
/// with the same sinks at every layer, and at a sliding and a global layer bit-identical Q, K, V
/// and sinks in f32 and f64 (the layers before L run the MoE on the rebuilt experts).
#[test]
fn the_gguf_route_reads_the_same_model_as_safetensors() {
    routes_agree(&fixture());
}

/// The same with the experts in MXFP4 as the hub ships them (fixtures/gpt_oss-mxfp4):
/// the checkpoint's `*_blocks`/`*_scales` on one side, the converter's ggml MXFP4 (type 39, the
/// nibbles reordered behind each scale byte) on the other. The layers before L run the MoE on
/// the decoded experts, so a wrong nibble order or scale moves Q, K and V.
#[test]
fn the_mxfp4_gguf_route_reads_the_same_model_as_the_mxfp4_checkpoint() {
    routes_agree(&Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/gpt_oss-mxfp4"));
}

/// The checkpoint in `dir` (config.json, model.safetensors) and its model.gguf.
fn routes_agree(dir: &Path) {
    let dev = Device::Cpu;
    let (config, _) = from_gguf(GgufFile::open(&dir.join("model.gguf")).unwrap(), &dev).unwrap();
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let want: serde_json::Value = serde_json::from_str(&text).unwrap();
    for field in [
        "rope_parameters",
        "layer_types",
        "sliding_window",
        "num_local_experts",
        "num_experts_per_tok",
        "intermediate_size",
        "rms_norm_eps",
        "head_dim",
        "tie_word_embeddings",
    ] {
        assert_eq!(config[field], want[field], "{field}");
    }
    for layer in [2, 3] {
        let mut st = NamedTensors::open_file(&dir.join("model.safetensors"), &dev).unwrap();
        let (config, mut gg) =
            from_gguf(GgufFile::open(&dir.join("model.gguf")).unwrap(), &dev).unwrap();
        let a = load(&want, &mut st, Depth::Through(layer)).unwrap();
        let b = load(&config, &mut gg, Depth::Through(layer)).unwrap();
        assert_eq!(a.shape(), b.shape());
        for l in 0..=layer {
            assert_eq!(a.attention_spec(l), b.attention_spec(l), "layer {l}");
        }
        let ids: Vec<u32> = (0..40u32).map(|i| (i * 29 + 3) % 128).collect();
        for dtype in [DType::F32, DType::F64] {
            let (da, db) = (
                a.layer_dump(&ids, dtype).unwrap(),
                b.layer_dump(&ids, dtype).unwrap(),
            );
            assert_eq!(da.spec, db.spec);
            assert_eq!(da.extra.len(), db.extra.len());
            let pairs = [(&da.q, &db.q), (&da.k, &db.k), (&da.v, &db.v)]
                .into_iter()
                .chain(da.extra.iter().zip(&db.extra).map(|(x, y)| (&x.1, &y.1)));
            for (x, y) in pairs {
                let d = (x.to_dtype(DType::F64).unwrap() - y.to_dtype(DType::F64).unwrap())
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap();
                assert_eq!(
                    d.to_scalar::<f64>().unwrap(),
                    0.0,
                    "layer {layer} {dtype:?}"
                );
            }
        }
    }
}

/// The fixture's GGUF rewritten without `drop` and with `extra`; the error of reading it.
fn refused(drop: &str, extra: &[(&str, GgufValue)]) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("bad.gguf");
    crate::models::gguf::tests::rewritten(
        &fixture().join("model.gguf"),
        &path,
        |k| k != drop,
        extra,
    );
    let e = from_gguf(GgufFile::open(&path).unwrap(), &Device::Cpu)
        .err()
        .expect("refused");
    assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e:#}");
    format!("{e:#}")
}

#[test]
fn bad_gpt_oss_metadata_is_refused_naming_the_key() {
    for (key, value) in [
        ("gpt-oss.attention.sliding_window", Some(GgufValue::U32(0))),
        ("gpt-oss.attention.sliding_window", None),
        ("gpt-oss.expert_used_count", Some(GgufValue::U32(9))),
        (
            "gpt-oss.rope.scaling.type",
            Some(GgufValue::String("linear".into())),
        ),
        ("gpt-oss.rope.scaling.original_context_length", None),
        ("gpt-oss.attention.value_length", Some(GgufValue::U32(8))),
        ("gpt-oss.block_count", None),
    ] {
        let extra: Vec<(&str, GgufValue)> = value.into_iter().map(|v| (key, v)).collect();
        let m = refused(key, &extra);
        assert!(m.contains(key), "{key}: {m}");
    }
}
