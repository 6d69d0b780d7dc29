//! The §8 KV caches end to end on Multi-head Latent Attention (docs/reference.md §7.7.6, §10.1),
//! on the deepseek_v3 fixture in f64 (p_qk = 24, r + d_R = 56 + 8 = 64): every layer hands its
//! hook the latent view the dump writes, a cache run end to end quantizes that row (the ggml
//! caches, which store blocks of 32, refuse p = 24 but take the row's 64), and its one-layer view
//! is the sweep's measurement of the same layer.

use std::sync::{Arc, Mutex};

use super::*;
use crate::attention::latent::LayerLatent;
use crate::attention::quantized::kv_cache::{CacheFormat, KvCache};
use crate::attention::{AttentionSpec, Target};
use crate::models::decoder::tests::{fixture_logits, whole_models};
use crate::models::{Decoder, ExactAttention};
use crate::protocol::pipeline::{layer_head, HeadTarget};
use crate::tensor_util::to_vec_f64;

const FIXTURE: &str = "deepseek_v3";

/// The fixture loaded whole from its safetensors, and transformers' window (n = 40).
fn model_and_ids() -> (Box<dyn Decoder>, Vec<u32>) {
    let (_, model) = whole_models(FIXTURE).swap_remove(0);
    (model, fixture_logits(FIXTURE).0)
}

fn window<'a>(model: &'a dyn Decoder, ids: &'a [u32], one_layer: Vec<usize>) -> Window<'a> {
    Window {
        model,
        ids,
        n_f: 8,
        dtype: DType::F64,
        seed: 7,
        index: 0,
        one_layer,
        keep_prompt: false,
    }
}

/// max |a − b| / max |b|.
fn rel(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (to_vec_f64(a).unwrap(), to_vec_f64(b).unwrap());
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let diff = a
        .iter()
        .zip(&b)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

/// Exact attention that keeps the latent view each layer hands it.
struct LatentRecorder(Mutex<Vec<(usize, Arc<LayerLatent>)>>);

impl AttentionHook for LatentRecorder {
    fn attend(
        &self,
        l: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        s: &AttentionSpec,
    ) -> Result<Tensor> {
        panic!("layer {l} of an MLA model called attend, not attend_latent ({q:?} {k:?} {v:?} {s})")
    }
    fn attend_latent(
        &self,
        l: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        spec: &AttentionSpec,
        latent: &Arc<LayerLatent>,
    ) -> Result<Tensor> {
        self.0.lock().unwrap().push((l, latent.clone()));
        ExactAttention.attend(l, q, k, v, spec)
    }
}

/// Every layer hands its hook the latent view; the last one's is, bit for bit, what the dump
/// writes as `kv_latent` and `w_kv_b` (what the sweep's caches read), in the run's dtype.
#[test]
fn every_mla_layer_hands_its_hook_the_dumps_latent_view() {
    let (model, ids) = model_and_ids();
    let layers = model.shape().layers;
    for dtype in [DType::F64, DType::F32] {
        let hook = LatentRecorder(Mutex::new(Vec::new()));
        model
            .forward_logits(&ids, dtype, &hook, 0..ids.len())
            .unwrap();
        let got = hook.0.into_inner().unwrap();
        assert_eq!(
            got.iter().map(|g| g.0).collect::<Vec<_>>(),
            (0..layers).collect::<Vec<_>>()
        );
        let dump = model.layer_dump(&ids, dtype).unwrap();
        let last = &got[layers - 1].1;
        for (name, mine) in [("kv_latent", &last.latent), ("w_kv_b", &last.w_kv_b)] {
            let want = &dump.extra.iter().find(|(n, _)| n == name).unwrap().1;
            assert_eq!(mine.dtype(), dtype, "{name}");
            assert_eq!(mine.dims(), want.dims(), "{name}");
            assert_eq!(
                to_vec_f64(mine).unwrap(),
                to_vec_f64(want).unwrap(),
                "{name} {dtype:?}"
            );
        }
    }
}

/// A KV cache whose format is the identity, read absorbed from the latent row in every layer,
/// reproduces the exact run's logits (the absorption's algebra in every layer, not only the
/// dumped one), and so its KL and every layer's error are at f64's floor.
#[test]
fn the_identity_latent_cache_end_to_end_is_the_exact_run() {
    let (model, ids) = model_and_ids();
    let n = ids.len();
    let layers = model.shape().layers;
    let identity = KvCache {
        format: CacheFormat::Identity,
    };
    let exact = model
        .forward_logits(&ids, DType::F64, &ExactAttention, 0..n)
        .unwrap();
    let hook = MethodHook::new(&identity, 0, Protocol::Prefill, layers, 7, 0);
    let got = model.forward_logits(&ids, DType::F64, &hook, 0..n).unwrap();
    let e = rel(&got, &exact);
    assert!(e <= 1e-12, "logits off by {e:e}");
    for (l, err) in hook.layer_errors().unwrap().iter().enumerate() {
        assert!(err.rel_error() < 1e-12, "layer {l}: {}", err.rel_error());
    }
    let win = window(model.as_ref(), &ids, vec![0, layers - 1]);
    let run = win.exact().unwrap();
    assert!(run.kept.iter().all(|k| k.latent.is_some()));
    let m = E2eMethod {
        name: "kv_identity".into(),
        method: Box::new(identity),
        decode: false,
    };
    let p = win.point(&run, &m, 0).unwrap();
    let kl_max = p.scores.kl.iter().copied().fold(0.0, f64::max);
    assert!(kl_max < 1e-13, "kl_max {kl_max}");
    assert!(p.one_layer.iter().all(|(_, e)| e.rel_error() < 1e-12));
}

/// The sweep's measurement of layer `l` from the model's dump of it (the layer it measures is
/// the last, `--layer L`): each head's (rel_error, kv_read) of `m` on the latent row.
fn sweep_of_last_layer(model: &dyn Decoder, ids: &[u32], m: &dyn Method) -> Vec<(f64, f64)> {
    let dump = model.layer_dump(ids, DType::F64).unwrap();
    let extra = |name: &str| {
        dump.extra
            .iter()
            .find(|(n, _)| n == name)
            .unwrap()
            .1
            .clone()
    };
    let latent = Arc::new(LayerLatent::new(extra("kv_latent"), extra("w_kv_b")).unwrap());
    (0..dump.q.dims()[0])
        .map(|h| {
            let lh = layer_head(
                &dump.q,
                &dump.k,
                &dump.v,
                h,
                &dump.spec,
                None,
                Some(&latent),
            )
            .unwrap();
            let target =
                HeadTarget::new(&lh.head, None, Target::Softmax, Protocol::Prefill).unwrap();
            let (_, r) = target.trial(m, 0, 0).unwrap();
            (r.rel_error(), r.cache.kv_read.unwrap())
        })
        .collect()
}

/// `kv_q8_0` and `kv_q4_0` end to end on MLA: the output moves (finite, positive KL), every layer
/// reads its latent row at the format's width (kv_read = kv_bits/16, the f16 latent cache being
/// 1), and the one-layer view of the last layer is the sweep's trial of that layer head by head.
/// On the materialised K/V (p_qk = 24) both formats would be refused: they group blocks of 32.
#[test]
fn the_ggml_latent_caches_run_end_to_end_and_their_one_layer_view_is_the_sweeps() {
    let (model, ids) = model_and_ids();
    let layers = model.shape().layers;
    let win = window(model.as_ref(), &ids, vec![0, layers - 1]);
    let run = win.exact().unwrap();
    for (id, bits) in [("kv_q8_0", 8.5), ("kv_q4_0", 4.5)] {
        let m = E2eMethod::resolve(id).unwrap();
        assert!(
            m.method.check_head_dim(model.shape().head_dim).is_err(),
            "{id}"
        );
        assert_eq!(checked_head_dim(model.as_ref(), &m), 64, "{id}");
        let p = win.point(&run, &m, 0).unwrap();
        let kl = p.scores.metrics().kl_mean;
        assert!(kl.is_finite() && kl > 0.0, "{id}: KL {kl}");
        for (l, e) in p.layers.iter().enumerate() {
            assert!(
                e.rel_error() > 0.0 && e.rel_error().is_finite(),
                "{id} layer {l}"
            );
            for h in &e.heads {
                assert_eq!(h[5], bits / 16.0, "{id} layer {l}: kv_read");
            }
        }
        let sweep = sweep_of_last_layer(model.as_ref(), &ids, m.method.as_ref());
        let (l, view) = &p.one_layer[1];
        assert_eq!(*l, layers - 1);
        for (h, (cols, (rel_err, kv_read))) in view.heads.iter().zip(&sweep).enumerate() {
            assert!(
                (cols[1] - rel_err).abs() <= 1e-12 * rel_err,
                "{id} head {h}: one-layer rel_error {} against the sweep's {rel_err}",
                cols[1]
            );
            assert_eq!(cols[5], *kv_read, "{id} head {h}");
        }
    }
}

/// On MLA the face refuses what the sweep refuses, naming the methods and those that run:
/// KIVI and SageAttention (prefill), every §8 cache read under the decode protocol; the KV
/// caches in prefill, the sparse and the §9 methods run.
#[test]
fn on_mla_only_what_the_sweep_refuses_is_refused() {
    let (model, ids) = model_and_ids();
    let n = ids.len();
    let resolve = |list: &str| -> Vec<E2eMethod> {
        list.split(',')
            .map(|id| E2eMethod::resolve(id).unwrap())
            .collect()
    };
    refuse_unsupported(
        model.as_ref(),
        &resolve("kv_f16,kv_fp8,kv_q4_0,window,snapkv"),
        n,
    )
    .unwrap();
    for (list, refused, why) in [
        (
            "window,kivi2,kv_q8_0",
            "kivi2",
            "what KIVI and SageAttention do on it is not specified",
        ),
        (
            "sage1",
            "sage1",
            "what KIVI and SageAttention do on it is not specified",
        ),
        (
            "snapkv,dkv_q8_0",
            "dkv_q8_0",
            "the latent-row cache has no decode form yet",
        ),
        (
            "dkivi2,kivi4",
            "dkivi2,kivi4",
            "no decode form yet and what KIVI",
        ),
    ] {
        let e = refuse_unsupported(model.as_ref(), &resolve(list), n).unwrap_err();
        assert!(
            e.downcast_ref::<crate::UsageError>().is_some(),
            "{list}: {e}"
        );
        let e = e.to_string();
        assert!(
            e.starts_with(&format!(
                "--methods {refused}: the model's layers are Multi-head Latent Attention"
            )) && e.contains(why),
            "{list}: {e}"
        );
    }
}
