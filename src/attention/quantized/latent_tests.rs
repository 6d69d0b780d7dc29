//! The KV caches on an MLA layer's latent row (docs/reference.md §7.7.6, MLA), on the DeepSeek
//! fixtures' layer 1 in f64: with every format the identity, the absorbed read is the layer's
//! materialised exact attention (the absorption's algebra and the rope part's pair layout,
//! V2's adjacent pairs and V3's deinterleaved ones); each format against a float64 definition
//! written here (the same format functions on q̃ and the latent, then the absorbed causal
//! attention by its definition, loop by loop).

use crate::models::Depth;
use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use super::kv_cache::{per_tensor_e4m3, CacheFormat, KvCache};
use super::HostMat;
use crate::attention::exact::ExactAttention;
use crate::attention::latent::{HeadLatent, LayerLatent};
use crate::attention::test_util::run_seeded;
use crate::attention::HeadInputs;
use crate::models::named_tensors::NamedTensors;
use crate::models::registry::family_entry;
use crate::models::LayerDump;
use crate::numerics::formats::{ggml_roundtrip, GgmlType, RunFloat};
use crate::tensor_util::to_vec_f64;

const N: usize = 40;

/// Layer 1's dump of fixture `name` for N tokens, in f64.
fn dump(name: &str) -> LayerDump {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/families")
        .join(name);
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let cfg: serde_json::Value = serde_json::from_str(&text).unwrap();
    let entry = family_entry(cfg["model_type"].as_str().unwrap()).unwrap();
    let mut w = NamedTensors::open_file(&dir.join("model.safetensors"), &Device::Cpu).unwrap();
    let model = (entry.load)(&cfg, &mut w, Depth::Through(1)).unwrap();
    let vocab = model.shape().vocab_size;
    let ids: Vec<u32> = (0..N).map(|i| ((i * 37 + 5) % vocab) as u32).collect();
    model.layer_dump(&ids, DType::F64).unwrap()
}

fn extra(d: &LayerDump, name: &str) -> Tensor {
    d.extra.iter().find(|(n, _)| n == name).unwrap().1.clone()
}

/// Head h of the dump with the latent view `latent`.
fn head(d: &LayerDump, latent: &Arc<LayerLatent>, h: usize) -> HeadInputs {
    let (q, k, v) = (
        d.q.get(h).unwrap(),
        d.k.get(h).unwrap(),
        d.v.get(h).unwrap(),
    );
    HeadInputs::with_spec(q, k, v, d.spec.for_head(h))
        .unwrap()
        .with_latent(HeadLatent {
            layer: latent.clone(),
            head: h,
        })
        .unwrap()
}

fn rel_diff(a: &[f64], b: &[f64]) -> f64 {
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let diff = a
        .iter()
        .zip(b)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

/// Identity format: the absorbed read equals the materialised exact target of every head, and
/// the same latent with its rope pairs reordered does not (the check sees the layout).
#[test]
fn the_identity_latent_cache_is_the_layers_exact_attention() {
    let identity = KvCache {
        format: CacheFormat::Identity,
    };
    for name in ["deepseek_v2", "deepseek_v3", "deepseek_v3-noqlora"] {
        let d = dump(name);
        let (latent, w) = (extra(&d, "kv_latent"), extra(&d, "w_kv_b"));
        let (r, width) = (w.dims()[2], latent.dims()[1]);
        // The rope part's pairs written the other way ([evens; odds] ↔ adjacent pairs).
        let half = (width - r) / 2;
        let swapped: Vec<u32> = (0..r)
            .chain((0..width - r).map(|t| r + (t % 2) * half + t / 2))
            .map(|t| t as u32)
            .collect();
        let idx = Tensor::new(swapped.as_slice(), &Device::Cpu).unwrap();
        let wrong =
            Arc::new(LayerLatent::new(latent.index_select(&idx, 1).unwrap(), w.clone()).unwrap());
        let right = Arc::new(LayerLatent::new(latent, w).unwrap());
        for h in 0..d.q.dims()[0] {
            let hd = head(&d, &right, h);
            let want = ExactAttention::compute_spec(&hd.q, &hd.k, &hd.v, &hd.spec).unwrap();
            let want = to_vec_f64(&want.output).unwrap();
            let got = to_vec_f64(&run_seeded(&identity, &hd, 0, 0).output).unwrap();
            let e = rel_diff(&got, &want);
            assert!(e <= 1e-10, "{name} head {h}: {e:e}");
            let bad =
                to_vec_f64(&run_seeded(&identity, &head(&d, &wrong, h), 0, 0).output).unwrap();
            assert!(
                rel_diff(&bad, &want) > 1e-4,
                "{name} head {h}: layout not seen"
            );
        }
    }
}

/// q̃ and the latent rows [N, width] in `format` by §8.2–8.3's format functions.
fn formatted(format: CacheFormat, qt: &mut [f64], lat: &mut Vec<f64>, width: usize) {
    let ggml = |x: &mut [f64], ty| {
        let mut f: Vec<f32> = x.iter().map(|&y| y as f32).collect();
        ggml_roundtrip(ty, &mut f).unwrap();
        x.iter_mut().zip(f).for_each(|(y, v)| *y = f64::from(v));
    };
    match format {
        CacheFormat::F16 => qt
            .iter_mut()
            .chain(lat.iter_mut())
            .for_each(|y| *y = y.round_f16()),
        CacheFormat::Bf16 => qt
            .iter_mut()
            .chain(lat.iter_mut())
            .for_each(|y| *y = y.round_bf16()),
        CacheFormat::Fp8 => {
            let mut m = HostMat {
                rows: N,
                cols: width,
                data: lat.clone(),
            };
            per_tensor_e4m3(&mut m);
            *lat = m.data;
        }
        CacheFormat::Ggml(ty) => {
            ggml(qt, GgmlType::Q8_0);
            ggml(lat, ty);
        }
        CacheFormat::Identity => {}
    }
}

/// Head h's absorbed causal attention by its definition, in f64: q̃_i = [W_UKᵀ q_nope,i; q_pe,i],
/// s_ij = τ·q̃_i·l_j (j ≤ i), y_i = Σ_j softmax(s_i)_j c_j, o_i = W_UV y_i.
fn definition(d: &LayerDump, h: usize, format: CacheFormat) -> Vec<f64> {
    let q = to_vec_f64(&d.q.get(h).unwrap()).unwrap();
    let mut lat = to_vec_f64(&extra(d, "kv_latent")).unwrap();
    let wt = extra(d, "w_kv_b");
    let (width, r) = (lat.len() / N, wt.dims()[2]);
    let w = to_vec_f64(&wt.get(h).unwrap()).unwrap();
    let (p, d_v) = (d.q.dims()[2], d.v.dims()[2]);
    let d_nope = p - (width - r);
    let mut qt = vec![0.0; N * width];
    for i in 0..N {
        for c in 0..r {
            qt[i * width + c] = (0..d_nope).map(|t| q[i * p + t] * w[t * r + c]).sum();
        }
        for t in 0..width - r {
            qt[i * width + r + t] = q[i * p + d_nope + t];
        }
    }
    formatted(format, &mut qt, &mut lat, width);
    let tau = d.spec.scale;
    let mut out = vec![0.0; N * d_v];
    for i in 0..N {
        let s: Vec<f64> = (0..=i)
            .map(|j| {
                tau * (0..width)
                    .map(|c| qt[i * width + c] * lat[j * width + c])
                    .sum::<f64>()
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        let y: Vec<f64> = (0..r)
            .map(|c| (0..=i).map(|j| e[j] * lat[j * width + c]).sum::<f64>() / z)
            .collect();
        for t in 0..d_v {
            out[i * d_v + t] = (0..r).map(|c| w[(d_nope + t) * r + c] * y[c]).sum();
        }
    }
    out
}

/// Every cache format (and the identity) on every head of V2's and V3's layer 1 against its
/// float64 definition.
#[test]
fn each_latent_cache_is_its_float64_definition() {
    let mut formats: Vec<CacheFormat> = KvCache::all().into_iter().map(|m| m.format).collect();
    formats.push(CacheFormat::Identity);
    for name in ["deepseek_v2", "deepseek_v3"] {
        let d = dump(name);
        assert!(d.spec.window.is_none() && d.spec.softcap.is_none() && d.spec.sinks.is_none());
        let latent =
            Arc::new(LayerLatent::new(extra(&d, "kv_latent"), extra(&d, "w_kv_b")).unwrap());
        for &format in &formats {
            let m = KvCache { format };
            for h in 0..d.q.dims()[0] {
                let got = to_vec_f64(&run_seeded(&m, &head(&d, &latent, h), 0, 0).output).unwrap();
                let e = rel_diff(&got, &definition(&d, h, format));
                assert!(e <= 1e-12, "{name} {format:?} head {h}: {e:e}");
            }
        }
    }
}

/// A latent view that does not fit the head (a head index past W_kvb's, another n) is a usage
/// error naming both shapes.
#[test]
fn a_latent_that_does_not_fit_the_head_is_refused() {
    let d = dump("deepseek_v3");
    let latent = Arc::new(LayerLatent::new(extra(&d, "kv_latent"), extra(&d, "w_kv_b")).unwrap());
    let short = Arc::new(
        LayerLatent::new(
            extra(&d, "kv_latent").narrow(0, 0, N - 1).unwrap(),
            extra(&d, "w_kv_b"),
        )
        .unwrap(),
    );
    let h = d.q.dims()[0];
    for (layer, head) in [(latent, h), (short, 0)] {
        let hd = HeadInputs::with_spec(
            d.q.get(0).unwrap(),
            d.k.get(0).unwrap(),
            d.v.get(0).unwrap(),
            d.spec.for_head(0),
        )
        .unwrap();
        let e = hd.with_latent(HeadLatent { layer, head }).err().unwrap();
        assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e}");
        assert!(e.to_string().contains("does not fit the MLA latent"), "{e}");
    }
}
