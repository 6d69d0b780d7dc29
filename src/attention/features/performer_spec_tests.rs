//! `performer_favor` on a layer's spec (docs/reference.md §7.7.6): the native √τ, the sliding
//! window's prefix sums and the sink's e^{σ − c_i − c_K}, against the estimator written out in
//! float64, and the estimate converging to the layer's own target as m grows.

use candle_core::DType;
use nalgebra::DMatrix;
use rand::SeedableRng;

use super::*;
use crate::attention::spec::AttentionSpec;
use crate::attention::test_util::gauss;
use crate::tensor_util::{from_dmatrix, test_device, to_dmatrix};

fn t64(m: &DMatrix<f64>) -> Tensor {
    from_dmatrix(m, &test_device(), DType::F64).unwrap()
}

/// The estimator as §2.5 and §7.7.6 give it, entry by entry in f64: x̃ = √τ·x,
/// φ(x̃)_r = m^{-1/2}(e^{ω_r·x̃ − ‖x̃‖²/2 − c} + ε) with c per query row and one c_K for all keys,
/// Ô_i = Σ_{j∈V_i} (φ_q,i·φ_k,j) v_j / (e^{σ − c_i − c_K} + Σ_{j∈V_i} φ_q,i·φ_k,j).
fn favor_definition(
    (q, k, v): (&DMatrix<f64>, &DMatrix<f64>, &DMatrix<f64>),
    omega: &DMatrix<f64>,
    tau: f64,
    window: usize,
    sink: Option<f64>,
) -> DMatrix<f64> {
    let (n, m) = (q.nrows(), omega.nrows());
    let s = tau.sqrt();
    let logits = |x: &DMatrix<f64>| (x * s) * omega.transpose();
    let half = |x: &DMatrix<f64>| (x * s).map(|e| e * e).column_sum() / 2.0;
    let (lq, lk, hq, hk) = (logits(q), logits(k), half(q), half(k));
    let ck = lk.max();
    let cq: Vec<f64> = (0..n).map(|i| lq.row(i).max()).collect();
    let norm = (m as f64).powf(-0.5);
    let fq = DMatrix::from_fn(n, m, |i, r| {
        norm * ((lq[(i, r)] - hq[i] - cq[i]).exp() + EPS)
    });
    let fk = DMatrix::from_fn(n, m, |j, r| norm * ((lk[(j, r)] - hk[j] - ck).exp() + EPS));
    DMatrix::from_fn(n, v.ncols(), |i, c| {
        let keys = (i + 1).saturating_sub(window)..=i;
        let w: Vec<f64> = keys.clone().map(|j| fq.row(i).dot(&fk.row(j))).collect();
        let z = w.iter().sum::<f64>() + sink.map_or(0.0, |sg| (sg - cq[i] - ck).exp());
        keys.zip(&w).map(|(j, w)| w * v[(j, c)]).sum::<f64>() / z
    })
}

/// Windows shorter than a chunk, across chunk boundaries, a whole chunk and none (W ≥ n), with
/// τ ≠ 1/√p, with and without a sink: n = 300 spans three chunks of 128, the last one short.
#[test]
fn favor_on_a_windowed_scaled_sink_layer_equals_its_definition() {
    let (n, p, m) = (300, 8, 16);
    let mut rng = TrialRng::seed_from_u64(9);
    let mut mk = |sd| gauss(&mut rng, n, p, sd);
    let (q, k, v) = (mk(0.7), mk(0.7), mk(1.0));
    let tau = 0.2;
    for window in [1, 37, 128, 129, 200, 1000] {
        for sink in [None, Some(0.8)] {
            let spec = AttentionSpec::causal(p, Some(window))
                .with_scale(tau)
                .with_sinks(sink.map(|s| vec![s]));
            let head = HeadInputs::with_spec(t64(&q), t64(&k), t64(&v), spec).unwrap();
            let got = Performer::favor()
                .approximate(&head, m, &mut TrialRng::seed_from_u64(3))
                .unwrap();
            let omega = orthogonal_gaussian(&mut TrialRng::seed_from_u64(3), m, p);
            let want = favor_definition((&q, &k, &v), &omega, tau, window, sink);
            let err = (to_dmatrix(&got.output).unwrap() - &want).abs().max();
            assert!(err < 1e-10, "W = {window}, sink {sink:?}: {err:e}");
        }
    }
}

/// The windowed prefix sums in f32 stay at f32's rounding of the f64 ones (the running states are
/// f64; the window's sum is their difference).
#[test]
fn windowed_prefix_sums_in_f32_agree_with_f64() {
    let (n, m, c) = (700, 16, 9);
    let mut rng = TrialRng::seed_from_u64(11);
    let fq = gauss(&mut rng, n, m, 1.0).map(f64::abs);
    let fk = gauss(&mut rng, n, m, 1.0).map(f64::abs);
    let r = gauss(&mut rng, n, c, 1.0);
    for w in [5, 128, 300] {
        let run = |dt| {
            let t = |x: &DMatrix<f64>| from_dmatrix(x, &test_device(), dt).unwrap();
            let out = windowed_causal_products(&t(&fq), &t(&fk), &t(&r), w).unwrap();
            to_dmatrix(&out.to_dtype(DType::F64).unwrap()).unwrap()
        };
        let (a, b) = (run(DType::F64), run(DType::F32));
        let want = DMatrix::from_fn(n, c, |i, col| {
            ((i + 1).saturating_sub(w)..=i)
                .map(|j| fq.row(i).dot(&fk.row(j)) * r[(j, col)])
                .sum::<f64>()
        });
        let scale = want.abs().max();
        assert!((&a - &want).abs().max() < 1e-12 * scale, "W = {w}: f64");
        assert!((&b - &want).abs().max() < 1e-5 * scale, "W = {w}: f32");
    }
}

/// With many features the estimate approaches the layer's own target (window, τ and sink), far
/// nearer to it than to the same layer without its sink: the sink enters on the kernel's scale.
#[test]
fn many_features_converge_to_the_sink_layers_target() {
    let mut rng = TrialRng::seed_from_u64(2);
    let (n, p, w, tau) = (12, 8, 5, 0.25);
    let (q, k, v) = (
        gauss(&mut rng, n, p, 0.6),
        gauss(&mut rng, n, p, 0.6),
        gauss(&mut rng, n, p, 1.0),
    );
    let spec = |sink: Option<f64>| {
        AttentionSpec::causal(p, Some(w))
            .with_scale(tau)
            .with_sinks(sink.map(|s| vec![s]))
    };
    let head = |s| HeadInputs::with_spec(t64(&q), t64(&k), t64(&v), spec(s)).unwrap();
    let target = |s| to_dmatrix(&head(s).exact().unwrap().output).unwrap();
    let (own, other) = (target(Some(1.0)), target(None));
    let dist = |a: &DMatrix<f64>, b: &DMatrix<f64>| (a - b).abs().max();
    let gap = dist(&own, &other);
    assert!(gap > 0.05, "the sink hardly moves the target: {gap}");
    let a = Performer::favor()
        .approximate(&head(Some(1.0)), 16384, &mut TrialRng::seed_from_u64(3))
        .unwrap();
    let o = to_dmatrix(&a.output).unwrap();
    assert!(
        dist(&o, &own) < 0.2 * gap,
        "{} vs gap {gap}",
        dist(&o, &own)
    );
    assert!(
        dist(&o, &other) > 0.8 * gap,
        "{} vs gap {gap}",
        dist(&o, &other)
    );
}
