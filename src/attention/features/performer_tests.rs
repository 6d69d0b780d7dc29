//! performer's tests: the feature maps, the orthogonal draws and the estimators against float64.

use super::*;
use crate::tensor_util::test_device;
use crate::tensor_util::{from_dmatrix, to_dmatrix};
use rand::SeedableRng;

use crate::attention::test_util::{gauss, out_matrix};
fn t64(m: &DMatrix<f64>) -> Tensor {
    from_dmatrix(m, &test_device(), DType::F64).unwrap()
}
/// The row-wise max-shifted softmax of a logits matrix, on the host.
fn row_softmax(mut a: DMatrix<f64>) -> DMatrix<f64> {
    for mut r in a.row_iter_mut() {
        let mx = r.max();
        r.apply(|x| *x = (*x - mx).exp());
        let s = r.sum();
        r.apply(|x| *x /= s);
    }
    a
}

#[test]
fn omega_blocks_are_orthogonal_with_chi_lengths() {
    let mut rng = TrialRng::seed_from_u64(1);
    let (m, p) = (20, 8);
    let om = orthogonal_gaussian(&mut rng, m, p);
    assert_eq!(om.shape(), (m, p));
    for r in 0..m {
        for s in 0..m {
            let dot = om.row(r).dot(&om.row(s));
            if r != s && r / p == s / p {
                assert!(dot.abs() < 1e-12, "rows {r},{s} of one block: {dot}");
            }
        }
    }
    // Row lengths are chi_p: mean of ‖ω‖² over many rows ≈ p.
    let big = orthogonal_gaussian(&mut rng, 4000, p);
    let mean_sq = big.row_iter().map(|r| r.norm_squared()).sum::<f64>() / 4000.0;
    assert!((mean_sq - p as f64).abs() < 0.3, "{mean_sq}");
    // Reproducible from the generator alone.
    let a = orthogonal_gaussian(&mut TrialRng::seed_from_u64(5), m, p);
    let b = orthogonal_gaussian(&mut TrialRng::seed_from_u64(5), m, p);
    assert_eq!(a, b);
}

/// Mean and standard error over `draws` fresh Ω of φ(q̃)·φ(k̃) with ε = 0 and no shift.
fn kernel_estimate(method: &Performer, q: &[f64], k: &[f64], m: usize, draws: usize) -> (f64, f64) {
    let p = q.len();
    let s = method.input_scale(p);
    let qt = Tensor::new(q, &test_device())
        .unwrap()
        .reshape((1, p))
        .unwrap();
    let kt = Tensor::new(k, &test_device())
        .unwrap()
        .reshape((1, p))
        .unwrap();
    let (qt, kt) = ((qt * s).unwrap(), (kt * s).unwrap());
    let mut rng = TrialRng::seed_from_u64(42);
    let vals: Vec<f64> = (0..draws)
        .map(|_| {
            let om = t64(&orthogonal_gaussian(&mut rng, m, p));
            let fq = feature_map(&qt, &om, Shift::None, 0.0).unwrap();
            let fk = feature_map(&kt, &om, Shift::None, 0.0).unwrap();
            crate::tensor_util::scalar(&fq.matmul(&fk.t().unwrap()).unwrap()).unwrap()
        })
        .collect();
    let mean = vals.iter().sum::<f64>() / draws as f64;
    let var = vals.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (draws - 1) as f64;
    (mean, (var / draws as f64).sqrt())
}

#[test]
fn features_are_unbiased_for_the_targeted_kernel() {
    // q + k points mostly along the first axis: a LAPACK-style sign convention (Q₀₀ ≤ 0)
    // would bias this strongly. m = 6 > p = 4 covers a partial second block.
    let p = 4;
    let q = [0.9, 0.2, -0.2, 0.1];
    let k = [0.6, -0.3, 0.1, 0.2];
    let qk: f64 = q.iter().zip(&k).map(|(a, b)| a * b).sum();
    for (method, target) in [
        (Performer::reference(), (qk / p as f64).exp()), // exp(q·k/p)
        (Performer::favor(), (qk / (p as f64).sqrt()).exp()), // exp(q·k/√p)
    ] {
        let (mean, se) = kernel_estimate(&method, &q, &k, 6, 20_000);
        assert!(
            (mean - target).abs() < 4.0 * se,
            "{}: {mean} ± {se} vs {target}",
            method.id()
        );
        assert!(se < 0.01 * target, "{}: se {se}", method.id());
    }
}

#[test]
fn many_features_converge_to_each_ids_own_softmax() {
    // Small logits: positive random features are heavy-tailed (per-feature relative variance
    // e^{‖q̃+k̃‖²} − 1) and Ô is a ratio estimator, so large logits converge very slowly; the
    // error relative to the gap between the two targets shrinks like m^{-1/2} at any scale.
    let mut rng = TrialRng::seed_from_u64(2);
    let (n, p) = (12, 8);
    let (q, k, v) = (
        gauss(&mut rng, n, p, 0.3),
        gauss(&mut rng, n, p, 0.3),
        gauss(&mut rng, n, p, 1.0),
    );
    let head = HeadInputs::new(t64(&q), t64(&k), t64(&v)).unwrap();
    let flat = row_softmax(&q * k.transpose() * (1.0 / p as f64)) * &v; // softmax(QKᵀ/p)V
    let sharp = row_softmax(&q * k.transpose() * (1.0 / (p as f64).sqrt())) * &v; // the real target
    assert!(
        (&sharp - to_dmatrix(&head.exact().unwrap().output).unwrap())
            .abs()
            .max()
            < 1e-12
    );
    let dist = |a: &DMatrix<f64>, b: &DMatrix<f64>| (a - b).abs().max();
    let gap = dist(&flat, &sharp);
    assert!(gap > 0.02, "targets too close to tell apart: {gap}");
    for (method, own, other) in [
        (Performer::reference(), &flat, &sharp),
        (Performer::favor(), &sharp, &flat),
    ] {
        let a = method
            .approximate(&head, 16384, &mut TrialRng::seed_from_u64(3))
            .unwrap();
        let o = to_dmatrix(&a.output).unwrap();
        assert!(
            dist(&o, own) < 0.3 * gap,
            "{}: {} vs gap {gap}",
            method.id(),
            dist(&o, own)
        );
        assert!(
            dist(&o, other) > 0.7 * gap,
            "{}: {} vs gap {gap}",
            method.id(),
            dist(&o, other)
        );
        assert!(a
            .normalizer
            .unwrap()
            .to_vec1::<f64>()
            .unwrap()
            .iter()
            .all(|&x| x > 0.0));
    }
}

#[test]
fn seeded_reproducible_finite_and_f32_agrees_with_f64() {
    let mut rng = TrialRng::seed_from_u64(4);
    let (n, p) = (200, 64);
    let (q, k, v) = (
        gauss(&mut rng, n, p, 0.6),
        gauss(&mut rng, n, p, 0.6),
        gauss(&mut rng, n, p, 1.0),
    );
    let h64 = HeadInputs::new(t64(&q), t64(&k), t64(&v)).unwrap();
    let t32 = |m: &DMatrix<f64>| from_dmatrix(m, &test_device(), DType::F32).unwrap();
    let h32 = HeadInputs::new(t32(&q), t32(&k), t32(&v)).unwrap();
    for method in [Performer::reference(), Performer::favor()] {
        for d in [1, 16, 70, 256] {
            let a = out_matrix(&method, &h64, d, 9);
            let b = out_matrix(&method, &h64, d, 9);
            assert_eq!(a, b);
            assert!(a.iter().all(|x| x.is_finite()));
            let c = method
                .approximate(&h32, d, &mut TrialRng::seed_from_u64(9))
                .unwrap();
            assert_eq!(c.output.dtype(), DType::F32);
            let c = to_dmatrix(&c.output).unwrap();
            let rel = (&c - &a).abs().max() / a.abs().max();
            assert!(rel < 1e-3, "{} d={d}: {rel}", method.id());
        }
        let x = out_matrix(&method, &h64, 16, 1);
        let y = out_matrix(&method, &h64, 16, 2);
        assert_ne!(x, y);
    }
    assert_eq!(Performer::reference().id(), "performer");
    assert_eq!(Performer::favor().id(), "performer_favor");
    assert_eq!(
        Performer::reference().macs(512, 64, 100),
        4.0 * 512.0 * 100.0 * 64.0 + 2.0 * 64f64.powi(3)
    );
}

#[test]
fn shifts_cancel_except_through_eps() {
    // With ε = 0 the per-row and global shifts cancel exactly in Ô.
    let mut rng = TrialRng::seed_from_u64(6);
    let (n, p, m) = (10, 4, 12);
    let (q, k, v) = (
        gauss(&mut rng, n, p, 1.0),
        gauss(&mut rng, n, p, 1.0),
        gauss(&mut rng, n, p, 1.0),
    );
    let om = t64(&orthogonal_gaussian(&mut rng, m, p));
    let out = |sq: Shift, sk: Shift| {
        let fq = to_dmatrix(&feature_map(&t64(&q), &om, sq, 0.0).unwrap()).unwrap();
        let fk = to_dmatrix(&feature_map(&t64(&k), &om, sk, 0.0).unwrap()).unwrap();
        let a = fq * fk.transpose();
        let mut o = &a * &v;
        for i in 0..n {
            o.row_mut(i).scale_mut(1.0 / a.row(i).sum());
        }
        o
    };
    let diff = (out(Shift::PerRow, Shift::Global) - out(Shift::None, Shift::None))
        .abs()
        .max();
    assert!(diff < 1e-12, "{diff}");
}

/// The causal form against its definition in f64, entry by entry, with the feature map
/// written out as §2.5 gives it (the same Ω from the same seed, the stabilisers included):
/// Ô_i = Σ_{j≤i} (φ_q,i·φ_k,j) v_j / Σ_{j≤i} φ_q,i·φ_k,j. n = 300 spans three chunks, the last
/// one short. The last row sees every key, so it equals the bidirectional estimator's.
#[test]
fn causal_favor_equals_the_masked_ratio_of_feature_products() {
    use crate::attention::Mask;
    let (n, p, m) = (300, 8, 16);
    let mut rng = TrialRng::seed_from_u64(9);
    let mut mk = || gauss(&mut rng, n, p, 0.7);
    let (q, k, v) = (mk(), mk(), mk());
    let fav = Performer::favor();
    let run = |mask: Mask| {
        let head = HeadInputs::masked(t64(&q), t64(&k), t64(&v), mask).unwrap();
        let out = fav
            .approximate(&head, m, &mut TrialRng::seed_from_u64(3))
            .unwrap();
        to_dmatrix(&out.output).unwrap()
    };
    let got = run(Mask::Causal);
    let omega = orthogonal_gaussian(&mut TrialRng::seed_from_u64(3), m, p);
    let s = fav.input_scale(p);
    let logits = |x: &DMatrix<f64>| (x * s) * omega.transpose(); // n×m: ω_r·x̃_i
    let half = |x: &DMatrix<f64>| (x * s).map(|e| e * e).column_sum() / 2.0;
    let (lq, lk, hq, hk) = (logits(&q), logits(&k), half(&q), half(&k));
    let ck = lk.max(); // one shift for all keys
    let fq = DMatrix::from_fn(n, m, |i, r| {
        let c = lq.row(i).max(); // per query row
        (lq[(i, r)] - hq[i] - c).exp() + EPS
    });
    let fk = DMatrix::from_fn(n, m, |j, r| (lk[(j, r)] - hk[j] - ck).exp() + EPS);
    let want = DMatrix::from_fn(n, p, |i, c| {
        let w: Vec<f64> = (0..=i).map(|j| fq.row(i).dot(&fk.row(j))).collect();
        let z: f64 = w.iter().sum();
        (0..=i).map(|j| w[j] * v[(j, c)]).sum::<f64>() / z
    });
    let err = (&got - &want).abs().max();
    assert!(err < 1e-10, "causal FAVOR+ against its definition: {err:e}");
    let last = run(Mask::None);
    for c in 0..p {
        assert!((got[(n - 1, c)] - last[(n - 1, c)]).abs() < 1e-10);
    }
    // The double-scaled `performer` has no causal form.
    assert!(!Performer::reference().masks().contains(&Mask::Causal));
}
