use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::{DType, Device};

use super::*;
use crate::models::decoder::tests::fixture_config;
use crate::models::deepseek::load;
use crate::models::Depth;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/families")
        .join(name)
}

/// The GGUF route (fixtures/families/deepseek_v{2,3}/model.gguf, written by
/// tests/reference/generate_family_gguf.py as llama.cpp's converter lays DeepSeek out: experts
/// stacked, kv_b split per head into attn_k_b (transposed) and attn_v_b, F32) reads the same model:
/// the same MLA sizes, router and yarn (τ from the stored 0.1·mscale_all_dim), the same spec, and
/// at the dense layer 0 and the MoE layer 2 bit-identical Q, K, V, kv_latent and w_kv_b in f32 and
/// f64, with the same sidecar (the `mla` object, its rope layout).
#[test]
fn the_gguf_route_reads_the_same_model_as_safetensors() {
    let dev = Device::Cpu;
    for name in ["deepseek_v2", "deepseek_v3"] {
        let dir = fixture(name);
        let want = fixture_config(name);
        let (config, _) =
            from_gguf(GgufFile::open(&dir.join("model.gguf")).unwrap(), &dev).unwrap();
        for field in [
            "model_type",
            "q_lora_rank",
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
            "n_routed_experts",
            "num_experts_per_tok",
            "n_shared_experts",
            "first_k_dense_replace",
            "routed_scaling_factor",
            "moe_intermediate_size",
        ] {
            assert_eq!(config[field], want[field], "{name} {field}");
        }
        for p in ["factor", "mscale_all_dim", "rope_theta", "beta_fast"] {
            assert_eq!(
                config["rope_parameters"][p].as_f64(),
                want["rope_parameters"][p].as_f64(),
                "{name} {p}"
            );
        }
        for layer in [0, 2] {
            let mut st = NamedTensors::open_file(&dir.join("model.safetensors"), &dev).unwrap();
            let (config, mut gg) =
                from_gguf(GgufFile::open(&dir.join("model.gguf")).unwrap(), &dev).unwrap();
            let a = load(&want, &mut st, Depth::Through(layer)).unwrap();
            let b = load(&config, &mut gg, Depth::Through(layer)).unwrap();
            assert_eq!(a.shape(), b.shape(), "{name}");
            let ids: Vec<u32> = (0..40u32).map(|i| (i * 29 + 3) % 128).collect();
            for dtype in [DType::F32, DType::F64] {
                let (da, db) = (
                    a.layer_dump(&ids, dtype).unwrap(),
                    b.layer_dump(&ids, dtype).unwrap(),
                );
                assert_eq!(da.spec, db.spec, "{name}");
                assert_eq!(da.sidecar, db.sidecar, "{name}");
                assert_eq!(da.extra.len(), db.extra.len(), "{name}");
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
                        "{name} layer {layer} {dtype:?}"
                    );
                }
            }
        }
    }
}

/// The fixture's GGUF rewritten without `drop` and with `extra`; the error of reading it.
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
fn bad_deepseek_metadata_is_refused_naming_the_key() {
    for (name, key, value) in [
        ("deepseek_v3", "deepseek2.attention.q_lora_rank", None),
        ("deepseek_v2", "deepseek2.attention.kv_lora_rank", None),
        (
            "deepseek_v2",
            "deepseek2.attention.key_length",
            Some(GgufValue::U32(24)),
        ),
        (
            "deepseek_v2",
            "deepseek2.attention.key_length_mla",
            Some(GgufValue::U32(8)),
        ),
        (
            "deepseek_v3",
            "deepseek2.expert_gating_func",
            Some(GgufValue::U32(3)),
        ),
        (
            "deepseek_v3",
            "deepseek2.rope.scaling.type",
            Some(GgufValue::String("linear".into())),
        ),
        (
            "deepseek_v2",
            "deepseek2.rope.scaling.yarn_log_multiplier",
            Some(GgufValue::F32(-0.1)),
        ),
    ] {
        let extra: Vec<(&str, GgufValue)> = value.into_iter().map(|v| (key, v)).collect();
        let m = refused(name, key, &extra);
        assert!(m.contains(key), "{name} {key}: {m}");
    }
}
