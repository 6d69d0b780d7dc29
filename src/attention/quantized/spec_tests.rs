//! The §8 methods on a layer beyond its mask (docs/reference.md §7.7.6): every method under a
//! window, τ ≠ 1/√p, a soft-cap and a sink against a float64 definition written here (the same
//! format functions, then the spec's attention by its definition; SageAttention's blocks and
//! online softmax literally, row by row); with every format the identity, the spec's exact
//! target; under a plain spec, the mask's path bit for bit; under a window, no key outside the
//! key blocks a query block needs is read.

use candle_core::Tensor;

use super::kivi::Kivi;
use super::kv_cache::{per_tensor_e4m3, CacheFormat, KvCache};
use super::sage::{Sage, SageKernel};
use super::*;
use crate::attention::exact::ExactAttention;
use crate::attention::spec::{exact_attention_reference, AttentionSpec};
use crate::attention::test_util::run_seeded;
use crate::attention::Method;
use crate::numerics::formats::{ggml_roundtrip, GgmlType, RunFloat};
use crate::numerics::sampling::{normal_values, TrialRng};
use crate::tensor_util::{test_device, to_vec_f64};
use rand::SeedableRng;

/// n = 300 (two full query blocks and a ragged one, key blocks ending ragged), p = 64.
pub(super) const N: usize = 300;
pub(super) const P: usize = 64;

/// A sliding layer with a cap and a sink: W = 100 (query blocks start their keys inside key
/// block 0, 0 and 2), τ = 0.3 (1/√p = 0.125), c = 4 (τ·q·k has a standard deviation of about 5:
/// the cap bites), σ as given (above the cap: the sink overtakes every row's maximum).
pub(super) fn full_spec(window: usize, sink: f64) -> AttentionSpec {
    AttentionSpec::causal(P, Some(window))
        .with_scale(0.3)
        .with_softcap(Some(4.0))
        .with_sinks(Some(vec![sink]))
}

pub(super) type Qkv = (Vec<f64>, Vec<f64>, Vec<f64>);

pub(super) fn qkv(seed: u64) -> Qkv {
    let mut rng = TrialRng::seed_from_u64(seed);
    let mut x = || normal_values(&mut rng, N, P, 1.5);
    (x(), x(), x())
}

pub(super) fn head(x: &Qkv, spec: AttentionSpec) -> HeadInputs {
    let t = |v: &Vec<f64>| Tensor::from_vec(v.clone(), (N, P), &test_device()).unwrap();
    HeadInputs::with_spec(t(&x.0), t(&x.1), t(&x.2), spec).unwrap()
}

pub(super) fn out(m: &dyn Method, h: &HeadInputs) -> Vec<f64> {
    to_vec_f64(&run_seeded(m, h, 0, 0).output).unwrap()
}

pub(super) fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()))
}

/// Q̂, K̂, V̂ of a cache format by §8.2–8.3's format functions, in f64.
fn cache_formats(format: CacheFormat, (q, k, v): &Qkv) -> Qkv {
    let (mut q, mut k, mut v) = (q.clone(), k.clone(), v.clone());
    let ggml = |x: &mut Vec<f64>, ty| {
        let mut f: Vec<f32> = x.iter().map(|&y| y as f32).collect();
        ggml_roundtrip(ty, &mut f).unwrap();
        *x = f.into_iter().map(f64::from).collect();
    };
    match format {
        CacheFormat::F16 => [&mut q, &mut k, &mut v]
            .into_iter()
            .for_each(|x| x.iter_mut().for_each(|y| *y = y.round_f16())),
        CacheFormat::Bf16 => [&mut q, &mut k, &mut v]
            .into_iter()
            .for_each(|x| x.iter_mut().for_each(|y| *y = y.round_bf16())),
        CacheFormat::Fp8 => {
            for x in [&mut k, &mut v] {
                let mut m = HostMat {
                    rows: N,
                    cols: P,
                    data: x.clone(),
                };
                per_tensor_e4m3(&mut m);
                *x = m.data;
            }
        }
        CacheFormat::Ggml(ty) => {
            ggml(&mut q, GgmlType::Q8_0);
            ggml(&mut k, ty);
            ggml(&mut v, ty);
        }
        CacheFormat::Identity => {}
    }
    (q, k, v)
}

/// The spec's attention by its definition (one head).
pub(super) fn spec_attention((q, k, v): &Qkv, spec: &AttentionSpec) -> Vec<f64> {
    exact_attention_reference(q, k, v, (1, 1, N, P, P), spec)
}

fn kivi_formats(bits: u32, (q, k, v): &Qkv) -> Qkv {
    let mat = |x: &Vec<f64>| HostMat {
        rows: N,
        cols: P,
        data: x.clone(),
    };
    let (mut km, mut vm) = (mat(k), mat(v));
    Kivi { bits }.quantize_kv(&mut km, &mut vm);
    (q.clone(), km.data, vm.data)
}

/// The caches and KIVI, each with its float64 definition on this head under `spec`.
fn caches(x: &Qkv, spec: &AttentionSpec) -> Vec<(Box<dyn Method>, Vec<f64>)> {
    let mut all: Vec<(Box<dyn Method>, Vec<f64>)> = KvCache::all()
        .into_iter()
        .map(|m| {
            let want = spec_attention(&cache_formats(m.format, x), spec);
            (Box::new(m) as Box<dyn Method>, want)
        })
        .collect();
    for bits in [4, 2] {
        let want = spec_attention(&kivi_formats(bits, x), spec);
        all.push((Box::new(Kivi { bits }), want));
    }
    all
}

/// Every cache and KIVI under the full spec (and under a sink below the cap) is its float64
/// definition: the formats' Q̂, K̂, V̂, then the windowed, scaled, capped softmax with the sink.
/// The spec matters: the same caches under the plain causal spec are far from it.
#[test]
fn every_cache_under_a_full_spec_is_its_float64_definition() {
    let x = qkv(1);
    for sink in [6.0, 1.0] {
        let spec = full_spec(100, sink);
        let h = head(&x, spec.clone());
        for (m, want) in caches(&x, &spec) {
            let got = out(m.as_ref(), &h);
            let e = max_diff(&got, &want);
            assert!(e < 1e-12, "{} σ = {sink}: {e}", m.id());
            let plain = spec_attention(&x, &AttentionSpec::causal(P, None));
            assert!(max_diff(&got, &plain) > 0.1, "{}", m.id());
        }
    }
}

/// With every format the identity the caches are the spec's exact target (to rounding), and the
/// formats move it (the comparison is not vacuous).
#[test]
fn identity_formats_under_a_full_spec_are_the_exact_target() {
    let x = qkv(2);
    let h = head(&x, full_spec(100, 1.0));
    let target = to_vec_f64(&h.exact().unwrap().output).unwrap();
    let identities: [Box<dyn Method>; 3] = [
        Box::new(KvCache {
            format: CacheFormat::Identity,
        }),
        Box::new(Kivi { bits: 0 }),
        Box::new(Sage {
            kernel: SageKernel::Identity,
        }),
    ];
    for m in identities {
        let e = max_diff(&out(m.as_ref(), &h), &target);
        assert!(e < 1e-12, "{}: {e}", m.id());
    }
    let q4 = KvCache::ggml(GgmlType::Q4_0);
    assert!(max_diff(&out(&q4, &h), &target) > 1e-3);
}

/// Under the mask's plain spec the caches and KIVI take the mask's path: the same bits as exact attention
/// under the mask on the quantized inputs (what they computed before specs existed).
#[test]
fn a_plain_spec_takes_the_masks_path_bit_for_bit() {
    let x = qkv(3);
    for mask in [Mask::None, Mask::Causal] {
        let h = head(&x, AttentionSpec::of_mask(mask, P));
        for m in KvCache::all() {
            let (q, k, v) = m.quantized_qkv(&h).unwrap();
            let old = ExactAttention::compute_masked(&q, &k, &v, mask).unwrap();
            let old = to_vec_f64(&old.output).unwrap();
            let bits = |x: &[f64]| x.iter().map(|y| y.to_bits()).collect::<Vec<_>>();
            assert!(bits(&out(&m, &h)) == bits(&old), "{} {mask:?}", m.id());
        }
        for bits_per_value in [4, 2] {
            let m = Kivi {
                bits: bits_per_value,
            };
            let (_, k, v) = kivi_formats(bits_per_value, &x);
            let t = |v: Vec<f64>| Tensor::from_vec(v, (N, P), &test_device()).unwrap();
            let old = ExactAttention::compute_masked(&h.q, &t(k), &t(v), mask).unwrap();
            let old = to_vec_f64(&old.output).unwrap();
            let bits = |x: &[f64]| x.iter().map(|y| y.to_bits()).collect::<Vec<_>>();
            assert!(bits(&out(&m, &h)) == bits(&old), "{} {mask:?}", m.id());
        }
    }
}
