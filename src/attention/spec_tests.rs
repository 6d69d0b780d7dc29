//! The spec's dense form and fused kernel against its float64 definition.

use super::*;
use candle_core::{DType, Device};
use rand::{Rng, SeedableRng};

fn random(len: usize, rng: &mut rand::rngs::StdRng, amp: f64) -> Vec<f64> {
    (0..len).map(|_| rng.random_range(-amp..amp)).collect()
}

fn max_rel(a: &[f64], b: &[f64]) -> f64 {
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    a.iter()
        .zip(b)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

/// The blocked dense form against the row-by-row float64 definition, for every feature of
/// the spec together and apart, with GQA and p_v ≠ p, and blocks that split the window.
#[test]
fn dense_blocks_match_the_definition() {
    let (heads, kv_heads, n, p, pv) = (4, 2, 37, 8, 5);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let q = random(heads * n * p, &mut rng, 2.0);
    let k = random(kv_heads * n * p, &mut rng, 2.0);
    let v = random(kv_heads * n * pv, &mut rng, 1.0);
    let dev = Device::Cpu;
    let qt = Tensor::from_vec(q.clone(), (heads, n, p), &dev).unwrap();
    let kt = Tensor::from_vec(k.clone(), (kv_heads, n, p), &dev).unwrap();
    let vt = Tensor::from_vec(v.clone(), (kv_heads, n, pv), &dev).unwrap();
    let specs = [
        AttentionSpec::bidirectional(p),
        AttentionSpec::causal(p, None),
        AttentionSpec::causal(p, Some(5)),
        AttentionSpec::causal(p, Some(1)),
        AttentionSpec::causal(p, None)
            .with_scale(0.3)
            .with_softcap(Some(2.0)),
        AttentionSpec::causal(p, Some(9)).with_sinks(Some(vec![0.5, -1.0, 3.0, 0.0])),
        AttentionSpec::causal(p, Some(6))
            .with_scale(0.2)
            .with_softcap(Some(1.5))
            .with_sinks(Some(vec![2.0, 2.0, -3.0, 1.0])),
    ];
    for spec in &specs {
        let want = exact_attention_reference(&q, &k, &v, (heads, kv_heads, n, p, pv), spec);
        for b in [1, 4, 16, 64] {
            let got = exact_attention_blocks(&qt, &kt, &vt, spec, b).unwrap();
            let got: Vec<f64> = got.flatten_all().unwrap().to_vec1().unwrap();
            let err = max_rel(&got, &want);
            assert!(err < 1e-13, "{spec:?}, {b} rows per block: {err}");
        }
    }
}

/// Closed forms: one visible key gives O_i = v_j, lowered by the sink's share
/// 1/(1 + e^{σ − s}); and a cap bounds every logit by c.
#[test]
fn closed_forms() {
    let spec = AttentionSpec::causal(2, Some(1)).with_sinks(Some(vec![0.7]));
    let q = [1.0, 2.0, 0.5, -1.0];
    let k = [0.3, 0.1, 2.0, 1.0];
    let v = [4.0, 8.0];
    let o = exact_attention_reference(&q, &k, &v, (1, 1, 2, 2, 1), &spec);
    for i in 0..2 {
        let s = spec.logit(q[2 * i] * k[2 * i] + q[2 * i + 1] * k[2 * i + 1]);
        let want = v[i] / (1.0 + (0.7 - s).exp());
        assert!((o[i] - want).abs() < 1e-15, "row {i}: {} vs {want}", o[i]);
    }
    let capped = AttentionSpec::causal(4, None).with_softcap(Some(3.0));
    assert!(capped.logit(1e6) <= 3.0 && capped.logit(-1e6) >= -3.0);
    assert!((capped.logit(0.2) - 3.0 * (0.2 * 0.5 / 3.0f64).tanh()).abs() < 1e-16);
}

#[test]
fn f32_agrees_with_f64() {
    let (heads, kv_heads, n, p, pv) = (2, 1, 50, 16, 16);
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let dev = Device::Cpu;
    let mk = |len: usize, shape: (usize, usize, usize), rng: &mut rand::rngs::StdRng| {
        Tensor::from_vec(random(len, rng, 1.5), shape, &dev).unwrap()
    };
    let q = mk(heads * n * p, (heads, n, p), &mut rng);
    let k = mk(kv_heads * n * p, (kv_heads, n, p), &mut rng);
    let v = mk(kv_heads * n * pv, (kv_heads, n, pv), &mut rng);
    let spec = AttentionSpec::causal(p, Some(20))
        .with_softcap(Some(4.0))
        .with_sinks(Some(vec![1.0, -0.5]));
    let f64_out = exact_attention_dense(&q, &k, &v, &spec).unwrap();
    let f32_out = exact_attention_dense(
        &q.to_dtype(DType::F32).unwrap(),
        &k.to_dtype(DType::F32).unwrap(),
        &v.to_dtype(DType::F32).unwrap(),
        &spec,
    )
    .unwrap()
    .to_dtype(DType::F64)
    .unwrap();
    let a: Vec<f64> = f64_out.flatten_all().unwrap().to_vec1().unwrap();
    let b: Vec<f64> = f32_out.flatten_all().unwrap().to_vec1().unwrap();
    assert!(max_rel(&b, &a) < 1e-5, "{}", max_rel(&b, &a));
}

#[test]
fn bad_specs_are_refused_by_name() {
    let e = AttentionSpec::causal(8, Some(0))
        .validate(2, "layer 3")
        .unwrap_err();
    assert!(e.to_string().contains("layer 3") && e.to_string().contains("window of 0"));
    let e = AttentionSpec::causal(8, None)
        .with_sinks(Some(vec![0.0]))
        .validate(2, "layer 1")
        .unwrap_err();
    assert!(e.to_string().contains("one per query head"));
    let e = AttentionSpec::causal(8, None)
        .with_softcap(Some(0.0))
        .validate(2, "x")
        .unwrap_err();
    assert!(e.to_string().contains("soft-cap"));
    assert!(LayerType::parse("chunked_attention", "layer_types[2]")
        .unwrap_err()
        .to_string()
        .contains("layer_types[2]"));
}

/// log D_i = log(e^{σ_h} + Σ_{j∈V_i} e^{s_ij}) by the definition, [H, n].
fn log_d_reference(
    q: &[f64],
    k: &[f64],
    (heads, kv_heads, n, p): (usize, usize, usize, usize),
    spec: &AttentionSpec,
) -> Vec<f64> {
    let mut out = Vec::with_capacity(heads * n);
    for h in 0..heads {
        let g = h * kv_heads / heads;
        for i in 0..n {
            let qi = &q[(h * n + i) * p..][..p];
            let terms: Vec<f64> = (0..n)
                .filter(|&j| spec.sees(i, j))
                .map(|j| {
                    spec.logit(
                        qi.iter()
                            .zip(&k[(g * n + j) * p..][..p])
                            .map(|(a, b)| a * b)
                            .sum(),
                    )
                })
                .chain(spec.sink(h))
                .collect();
            let m = terms.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            out.push(m + terms.iter().map(|s| (s - m).exp()).sum::<f64>().ln());
        }
    }
    out
}

/// Specs with every feature the fused kernel takes beyond the mask, over sizes that span several
/// query blocks and key tiles, for 4 query heads on 2 K/V heads.
fn fused_specs(p: usize) -> Vec<AttentionSpec> {
    let sinks = |s: [f64; 4]| Some(s.to_vec());
    vec![
        AttentionSpec::causal(p, None).with_softcap(Some(1.5)),
        AttentionSpec::bidirectional(p).with_sinks(sinks([0.5, -1.0, 3.0, 0.0])),
        AttentionSpec::causal(p, Some(100)).with_sinks(sinks([2.0, -4.0, 0.3, 1.0])),
        AttentionSpec::causal(p, Some(1)).with_sinks(sinks([0.0, 1.0, -1.0, 2.0])),
        AttentionSpec::causal(p, None).with_sinks(sinks([30.0, 30.0, -30.0, 5.0])),
        AttentionSpec::causal(p, Some(77))
            .with_scale(0.6)
            .with_softcap(Some(2.0))
            .with_sinks(sinks([1.0, 0.0, -2.0, 2.5])),
        AttentionSpec::bidirectional(p)
            .with_softcap(Some(0.7))
            .with_sinks(sinks([-1.0, 0.2, 0.0, 1.0])),
    ]
}

/// The fused kernel on every path this CPU runs against the float64 definition (O and log D with
/// the sink's term) in f64 and f32, with GQA and p_v ≠ p (5: the generic value products; 32: the
/// packed ones); and its two microkernel paths give the same bits under a cap and sinks.
#[test]
fn the_fused_kernel_matches_the_definition_on_every_path() {
    use crate::numerics::flash::{attention_with, Simd};
    let (heads, kv_heads, n, p) = (4, 2, 300, 16);
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let q = random(heads * n * p, &mut rng, 1.5);
    let k = random(kv_heads * n * p, &mut rng, 1.5);
    let f32s = |x: &[f64]| x.iter().map(|&y| y as f32).collect::<Vec<f32>>();
    for pv in [5, 32] {
        let v = random(kv_heads * n * pv, &mut rng, 1.0);
        for spec in fused_specs(p) {
            let want = exact_attention_reference(&q, &k, &v, (heads, kv_heads, n, p, pv), &spec);
            let want_ld = log_d_reference(&q, &k, (heads, kv_heads, n, p), &spec);
            let qs: Vec<f64> = q.iter().map(|x| x * spec.scale).collect();
            let mut f32_bits = Vec::new();
            for simd in Simd::runnable() {
                let run = |q: &[f64]| {
                    attention_with(
                        simd,
                        q,
                        &k,
                        &v,
                        heads,
                        kv_heads,
                        p,
                        spec.visible(),
                        spec.logits(),
                    )
                };
                let (o, ld) = run(&qs);
                for (a, b) in o.iter().zip(&want).chain(ld.iter().zip(&want_ld)) {
                    assert!(
                        (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                        "{simd:?} pv={pv} {spec:?}: {a} vs {b}"
                    );
                }
                let (o32, ld32) = attention_with(
                    simd,
                    &f32s(&qs),
                    &f32s(&k),
                    &f32s(&v),
                    heads,
                    kv_heads,
                    p,
                    spec.visible(),
                    spec.logits(),
                );
                let o32: Vec<f64> = o32.iter().map(|&x| x as f64).collect();
                let err = max_rel(&o32, &want);
                assert!(err < 2e-6, "{simd:?} f32 pv={pv} {spec:?}: {err}");
                for (a, b) in ld32.iter().zip(&want_ld) {
                    assert!(
                        (*a as f64 - b).abs() <= 2e-6 * (1.0 + b.abs()),
                        "{simd:?} f32 log D {spec:?}"
                    );
                }
                if simd >= Simd::Avx2 {
                    f32_bits.push((simd, o32, ld32));
                }
            }
            for (simd, o, ld) in &f32_bits {
                let bits = |x: &[f32]| x.iter().map(|y| y.to_bits()).collect::<Vec<_>>();
                assert!(o == &f32_bits[0].1, "{simd:?} O bits, pv={pv} {spec:?}");
                assert!(
                    bits(ld) == bits(&f32_bits[0].2),
                    "{simd:?} log D bits {spec:?}"
                );
            }
        }
    }
}

/// `exact_attention` takes the fused kernel for every spec on the host: the same bits as the
/// kernel called directly, and the definition's values.
#[test]
fn exact_attention_on_the_host_is_the_fused_kernel_for_every_spec() {
    let (heads, kv_heads, n, p, pv) = (4, 2, 150, 8, 6);
    let mut rng = rand::rngs::StdRng::seed_from_u64(19);
    let q = random(heads * n * p, &mut rng, 2.0);
    let k = random(kv_heads * n * p, &mut rng, 2.0);
    let v = random(kv_heads * n * pv, &mut rng, 1.0);
    let dev = Device::Cpu;
    let qt = Tensor::from_vec(q.clone(), (heads, n, p), &dev).unwrap();
    let kt = Tensor::from_vec(k.clone(), (kv_heads, n, p), &dev).unwrap();
    let vt = Tensor::from_vec(v.clone(), (kv_heads, n, pv), &dev).unwrap();
    for spec in fused_specs(p) {
        let got: Vec<f64> = exact_attention(&qt, &kt, &vt, &spec)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let qs: Vec<f64> = q.iter().map(|x| x * spec.scale).collect();
        let (direct, _) = crate::numerics::flash::attention(
            &qs,
            &k,
            &v,
            heads,
            kv_heads,
            p,
            spec.visible(),
            spec.logits(),
        );
        assert!(got == direct, "{spec:?}");
        let want = exact_attention_reference(&q, &k, &v, (heads, kv_heads, n, p, pv), &spec);
        assert!(max_rel(&got, &want) < 1e-12, "{spec:?}");
    }
}
