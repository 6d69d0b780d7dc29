use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::{DType, Device};

use super::*;
use crate::models::decoder::tests::fixture_config;
use crate::models::gemma::load;
use crate::models::Depth;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/families")
        .join(name)
}

/// The GGUF route (fixtures/families/gemma{2,3}/model.gguf, written by
/// tests/reference/generate_family_gguf.py as llama.cpp's converter lays a Gemma out: norms stored
/// 1 + w, F32 tensors) reads the same model as the safetensors route: the same spec at every layer
/// (τ, gemma2's cap, the windows and layer types), the same shape, and at a sliding and a global
/// layer the same Q, K, V: bit for bit in f32 (1 + w is the stored value on both routes), within
/// f32's rounding of the stored 1 + w in f64.
#[test]
fn the_gguf_route_reads_the_same_model_as_safetensors() {
    let dev = Device::Cpu;
    for (name, layers) in [("gemma2", [2usize, 3]), ("gemma3", [4, 5])] {
        let dir = fixture(name);
        for layer in layers {
            let mut st = NamedTensors::open_file(&dir.join("model.safetensors"), &dev).unwrap();
            let (config, mut gg) =
                from_gguf(GgufFile::open(&dir.join("model.gguf")).unwrap(), &dev).unwrap();
            let a = load(&fixture_config(name), &mut st, Depth::Through(layer)).unwrap();
            let b = load(&config, &mut gg, Depth::Through(layer)).unwrap();
            assert_eq!(a.shape(), b.shape(), "{name}");
            assert_eq!(a.model_type(), b.model_type(), "{name}");
            for l in 0..a.shape().layers {
                assert_eq!(a.window(l), b.window(l), "{name} layer {l}");
            }
            for l in 0..=layer {
                assert_eq!(a.attention_spec(l), b.attention_spec(l), "{name} layer {l}");
            }
            let ids: Vec<u32> = (0..40u32).map(|i| (i * 29 + 3) % 128).collect();
            for (dtype, bound) in [(DType::F32, 0.0), (DType::F64, 1e-6)] {
                let (da, db) = (
                    a.layer_dump(&ids, dtype).unwrap(),
                    b.layer_dump(&ids, dtype).unwrap(),
                );
                assert_eq!(da.spec, db.spec, "{name}");
                for (x, y) in [(&da.q, &db.q), (&da.k, &db.k), (&da.v, &db.v)] {
                    let d = (x - y).unwrap().abs().unwrap().max_all().unwrap();
                    let m = x.abs().unwrap().max_all().unwrap();
                    let r = d.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap()
                        / m.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap();
                    assert!(r <= bound, "{name} layer {layer} {dtype:?}: {r:e}");
                }
            }
        }
    }
}

/// The fixture `name`'s GGUF rewritten without the metadata `drop` and with `extra`; the error
/// of reading it.
fn refused(name: &str, drop: &str, extra: &[(&str, GgufValue)]) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("bad.gguf");
    crate::models::gguf::tests::rewritten(
        &fixture(name).join("model.gguf"),
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
fn bad_gemma_metadata_is_refused_naming_the_key() {
    // No attention.scale on a size llama.cpp does not know (4 layers): τ is unknown.
    let m = refused("gemma2", "gemma2.attention.scale", &[]);
    assert!(
        m.contains("gemma2.attention.scale") && m.contains("26, 42") && m.contains("46"),
        "{m}"
    );
    let m = refused(
        "gemma2",
        "gemma2.attention.value_length",
        &[("gemma2.attention.value_length", GgufValue::U32(8))],
    );
    assert!(m.contains("gemma2.attention.value_length"), "{m}");
    let m = refused(
        "gemma2",
        "gemma2.attn_logit_softcapping",
        &[("gemma2.attn_logit_softcapping", GgufValue::F32(0.0))],
    );
    assert!(m.contains("gemma2.attn_logit_softcapping"), "{m}");
    let m = refused("gemma3", "gemma3.attention.sliding_window", &[]);
    assert!(m.contains("gemma3.attention.sliding_window"), "{m}");
    let m = refused(
        "gemma3",
        "gemma3.rope.scaling.type",
        &[("gemma3.rope.scaling.type", GgufValue::String("yarn".into()))],
    );
    assert!(m.contains("gemma3.rope.scaling.type"), "{m}");
    let m = refused(
        "gemma3",
        "",
        &[(
            "gemma3.attention.sliding_window_pattern",
            GgufValue::Array(vec![GgufValue::Bool(true); 5]),
        )],
    );
    assert!(m.contains("gemma3.attention.sliding_window_pattern"), "{m}");
}

/// Without `attention.scale`, τ by llama.cpp's size rule: 1/√head_dim, except the 27B models'
/// 1/√(hidden/H) (gemma-2-27b: 4608/32 = 144; gemma-3-27b: 5376/32 = 168).
#[test]
fn the_scale_follows_llama_cpp_s_size_rule() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("sized.gguf");
    for (arch, layers, want) in [
        ("gemma2", 26u32, 16.0),
        ("gemma2", 46, 16.0),
        ("gemma3", 18, 16.0),
        ("gemma3", 62, 16.0),
    ] {
        let name = if arch == "gemma2" { "gemma2" } else { "gemma3" };
        let block = format!("{arch}.block_count");
        let scale = format!("{arch}.attention.scale");
        crate::models::gguf::tests::rewritten(
            &fixture(name).join("model.gguf"),
            &path,
            |k| k != block && k != scale,
            &[(block.as_str(), GgufValue::U32(layers))],
        );
        let (config, _) = from_gguf(GgufFile::open(&path).unwrap(), &Device::Cpu).unwrap();
        // hidden 64 / H 4 = head_dim 16 on the fixtures: both branches give 16 here.
        assert_eq!(config["query_pre_attn_scalar"], want, "{arch} {layers}");
    }
    assert_eq!(
        query_pre_attn_rule("gemma2", 46, 4608, 32, 128),
        Some(144.0)
    );
    assert_eq!(
        query_pre_attn_rule("gemma3", 62, 5376, 32, 128),
        Some(168.0)
    );
    assert_eq!(
        query_pre_attn_rule("gemma2", 42, 3584, 16, 256),
        Some(256.0)
    );
    assert_eq!(query_pre_attn_rule("gemma3", 5, 64, 4, 16), None);
}

/// The fixture's own τ comes back as the config's integer scalar (24 and 40), not as 1/f32(τ)².
#[test]
fn attention_scale_reads_back_as_the_configs_scalar() {
    for (name, s) in [("gemma2", 24.0), ("gemma3", 40.0)] {
        let file = GgufFile::open(&fixture(name).join("model.gguf")).unwrap();
        let (config, _) = from_gguf(file, &Device::Cpu).unwrap();
        assert_eq!(config["query_pre_attn_scalar"], s, "{name}");
        assert_eq!(
            config["layer_types"],
            fixture_config(name)["layer_types"],
            "{name}"
        );
    }
}

/// The final logit cap: the file's (6 in the gemma2 fixture), and for a gemma2 without the key
/// llama.cpp's default 30, as for its attention cap's 50; a gemma3 without it has none.
#[test]
fn the_final_cap_follows_llama_cpp_s_default() {
    let tmp = tempfile::tempdir().unwrap();
    let read = |name: &str, drop: &str| {
        let path = tmp.path().join(format!("{name}.gguf"));
        crate::models::gguf::tests::rewritten(
            &fixture(name).join("model.gguf"),
            &path,
            |k| k != drop,
            &[],
        );
        from_gguf(GgufFile::open(&path).unwrap(), &Device::Cpu)
            .unwrap()
            .0["final_logit_softcapping"]
            .clone()
    };
    assert_eq!(read("gemma2", ""), 6.0);
    assert_eq!(read("gemma2", "gemma2.final_logit_softcapping"), 30.0);
    assert_eq!(read("gemma3", ""), serde_json::Value::Null);
}
