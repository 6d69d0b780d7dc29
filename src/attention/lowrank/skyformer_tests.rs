//! skyformer's tests: the modified Nyström estimator, its cores and its iterative form against float64.

use super::*;
use crate::tensor_util::test_device;
use crate::tensor_util::{from_dmatrix, to_dmatrix};
use nalgebra::DMatrix;
use rand::SeedableRng;

use crate::attention::test_util::gauss;

fn tensor(m: &DMatrix<f64>, dtype: DType) -> Tensor {
    from_dmatrix(m, &test_device(), dtype).unwrap()
}

/// The upper-right n×n block of the dense Nyström completion K̄S·core·SᵀK̄ of a 2n×2n kernel
/// matrix K̄ = `kernel(X)` on X = [Q̃; K̃] (x̃ = x·p^{-1/4}) with the landmark columns `sel`,
/// core = (SᵀK̄S)^† (nalgebra SVD) or (SᵀK̄S + γI)⁻¹ (LU): Eq. (5) built independently.
pub(crate) fn dense_completion(
    q: &DMatrix<f64>,
    k: &DMatrix<f64>,
    sel: &[usize],
    gamma: Option<f64>,
    kernel: impl Fn(&DMatrix<f64>) -> DMatrix<f64>,
) -> DMatrix<f64> {
    let (n, p) = q.shape();
    let s = (p as f64).powf(-0.25);
    let mut x = DMatrix::zeros(2 * n, p);
    x.rows_mut(0, n).copy_from(&(q * s));
    x.rows_mut(n, n).copy_from(&(k * s));
    let kbar = kernel(&x);
    let cols = kbar.select_columns(sel); // K̄S
    let core = cols.select_rows(sel); // SᵀK̄S
    let w = match gamma {
        None => core.pseudo_inverse(1e-12).unwrap(),
        Some(g) => (core + DMatrix::identity(sel.len(), sel.len()) * g)
            .try_inverse()
            .unwrap(),
    };
    let full = &cols * w * cols.transpose();
    full.view((0, n), (n, n)).into_owned()
}

/// Independent dense construction: Ā = exp(XXᵀ) (no shift), Ā̃ = ĀS·core·SᵀĀ, Ã its
/// upper-right block; Ô = D̃⁻¹ÃV with D̃ = Ã1.
fn dense(
    q: &DMatrix<f64>,
    k: &DMatrix<f64>,
    v: &DMatrix<f64>,
    sel: &[usize],
    gamma: Option<f64>,
) -> (DMatrix<f64>, Vec<f64>) {
    let a = dense_completion(q, k, sel, gamma, |x| (x * x.transpose()).map(f64::exp));
    let n = a.nrows();
    let den: Vec<f64> = (0..n).map(|i| a.row(i).sum()).collect();
    let mut out = &a * v;
    for (mut row, &di) in out.row_iter_mut().zip(&den) {
        row.scale_mut(1.0 / di);
    }
    (out, den)
}

/// The core with every row of X as a landmark (S = I₂ₙ), under the pseudo-inverse.
pub(crate) fn core_on_every_landmark(h: &HeadInputs, kernel: CoreKernel) -> (Tensor, Tensor) {
    let all: Vec<usize> = (0..h.n()).collect();
    let ops = Operands::of(h).unwrap();
    skyformer_core(&ops, &all, &all, CoreInverse::Pinv, kernel).unwrap()
}

/// From `seed`, `draw` splits d landmarks of n rows as `(d, (from Q̃, from K̃))` says, every
/// index below n.
pub(crate) fn assert_landmark_split(
    draw: impl Fn(&mut TrialRng, usize, usize) -> (Vec<usize>, Vec<usize>),
    seed: u64,
    n: usize,
    cases: &[(usize, (usize, usize))],
) {
    let mut rng = TrialRng::seed_from_u64(seed);
    for &(d, split) in cases {
        let (iq, ik) = draw(&mut rng, n, d);
        assert_eq!((iq.len(), ik.len()), split, "d = {d}");
        assert!(iq.iter().chain(&ik).all(|&i| i < n));
    }
}

pub(crate) fn max_rel(a: &DMatrix<f64>, b: &DMatrix<f64>) -> f64 {
    (a - b).abs().max() / b.abs().max()
}

#[test]
fn matches_dense_eq5_construction_with_duplicates() {
    let mut rng = TrialRng::seed_from_u64(1);
    let (n, p) = (7, 6);
    let (q, k, v) = (
        gauss(&mut rng, n, p, 1.0),
        gauss(&mut rng, n, p, 1.0),
        gauss(&mut rng, n, p, 1.0),
    );
    let iq = vec![0, 3, 3, 5];
    let ik = vec![1, 6, 2];
    let ops = Operands::new(
        &tensor(&q, DType::F64),
        &tensor(&k, DType::F64),
        &tensor(&v, DType::F64),
    )
    .unwrap();
    let (out, den) =
        skyformer_core(&ops, &iq, &ik, CoreInverse::Pinv, CoreKernel::Softmax).unwrap();
    let sel: Vec<usize> = iq.iter().cloned().chain(ik.iter().map(|j| j + n)).collect();
    let (want, want_den) = dense(&q, &k, &v, &sel, None);
    let got = to_dmatrix(&out).unwrap();
    assert!(max_rel(&got, &want) < 1e-9, "{}", max_rel(&got, &want));
    // den is Ã1 up to the global factor e^{-c}: the ratio is one constant.
    let got_den: Vec<f64> = den.to_vec1().unwrap();
    let r0 = want_den[0] / got_den[0];
    for i in 0..n {
        assert!((want_den[i] / got_den[i] / r0 - 1.0).abs() < 1e-9);
    }
}

#[test]
fn iterative_path_matches_dense_ridge_inverse_and_is_close_to_pinv() {
    // Distinct landmarks with ‖z‖² ≈ 4 in p = 16: M is diagonally dominant, N well conditioned,
    // so 6 iterations converge and the result is (M + 0.1 I)⁻¹ on the *unshifted* scale.
    let mut rng = TrialRng::seed_from_u64(2);
    let (n, p) = (40, 16);
    let (q, k, v) = (
        gauss(&mut rng, n, p, 1.0),
        gauss(&mut rng, n, p, 1.0),
        gauss(&mut rng, n, p, 1.0),
    );
    let (iq, ik) = (vec![0, 5, 9], vec![2, 17, 33]);
    let sel: Vec<usize> = iq.iter().cloned().chain(ik.iter().map(|j| j + n)).collect();
    let (tq, tk, tv) = (
        tensor(&q, DType::F64),
        tensor(&k, DType::F64),
        tensor(&v, DType::F64),
    );
    let it = CoreInverse::of_variant(true);
    let ops = Operands::new(&tq, &tk, &tv).unwrap();
    let got = to_dmatrix(
        &skyformer_core(&ops, &iq, &ik, it, CoreKernel::Softmax)
            .unwrap()
            .0,
    )
    .unwrap();
    let (want, _) = dense(&q, &k, &v, &sel, Some(GAMMA));
    assert!(max_rel(&got, &want) < 1e-8, "{}", max_rel(&got, &want));
    let pinv = to_dmatrix(
        &skyformer_core(&ops, &iq, &ik, CoreInverse::Pinv, CoreKernel::Softmax)
            .unwrap()
            .0,
    )
    .unwrap();
    let rel = max_rel(&got, &pinv);
    assert!(rel < 2e-2 && rel > 0.0, "iter vs pinv {rel}");
}

#[test]
fn exact_when_every_row_is_a_landmark() {
    // S = I (all 2n rows): Ā Ā^† Ā = Ā, so Ô = softmax(QKᵀ/√p)V to rounding.
    let mut rng = TrialRng::seed_from_u64(3);
    let (n, p) = (6, 8);
    let (q, k, v) = (
        gauss(&mut rng, n, p, 1.0),
        gauss(&mut rng, n, p, 1.0),
        gauss(&mut rng, n, p, 1.0),
    );
    let head = HeadInputs::new(
        tensor(&q, DType::F64),
        tensor(&k, DType::F64),
        tensor(&v, DType::F64),
    )
    .unwrap();
    let (out, den) = core_on_every_landmark(&head, CoreKernel::Softmax);
    let exact = to_dmatrix(&head.exact().unwrap().output).unwrap();
    assert!(max_rel(&to_dmatrix(&out).unwrap(), &exact) < 1e-7);
    assert!(den.to_vec1::<f64>().unwrap().iter().all(|&x| x > 0.0));
    // Through the method: d = 400 draws cover all 12 rows w.h.p., with many duplicates
    // (M singular of rank 12): the pseudo-inverse still gives the exact output.
    let mut r = TrialRng::seed_from_u64(4);
    let approx = Skyformer::pseudo_inverse()
        .approximate(&head, 400, &mut r)
        .unwrap();
    assert!(max_rel(&to_dmatrix(&approx.output).unwrap(), &exact) < 1e-6);
}

#[test]
fn random_inputs_finite_reproducible_and_f32_agrees_with_f64() {
    let mut rng = TrialRng::seed_from_u64(5);
    let (n, p) = (128, 32);
    let (q, k, v) = (
        gauss(&mut rng, n, p, 0.6),
        gauss(&mut rng, n, p, 0.6),
        gauss(&mut rng, n, p, 1.0),
    );
    let h64 = HeadInputs::new(
        tensor(&q, DType::F64),
        tensor(&k, DType::F64),
        tensor(&v, DType::F64),
    )
    .unwrap();
    let h32 = HeadInputs::new(
        tensor(&q, DType::F32),
        tensor(&k, DType::F32),
        tensor(&v, DType::F32),
    )
    .unwrap();
    for method in [Skyformer::pseudo_inverse(), Skyformer::iterative()] {
        for d in [1, 7, 16, 64] {
            let a64 = method
                .approximate(&h64, d, &mut TrialRng::seed_from_u64(9))
                .unwrap();
            let a32 = method
                .approximate(&h32, d, &mut TrialRng::seed_from_u64(9))
                .unwrap();
            assert_eq!(a32.output.dtype(), DType::F32);
            assert_eq!(a64.normalizer.as_ref().unwrap().dims(), &[n]);
            let o64 = to_dmatrix(&a64.output).unwrap();
            let o32 = to_dmatrix(&a32.output).unwrap();
            assert!(o64.iter().all(|x| x.is_finite()), "{} d={d}", method.id());
            // The core is f64 either way; only the f32 rounding of the inputs differs.
            assert!(
                max_rel(&o32, &o64) < 1e-3,
                "{} d={d}: {}",
                method.id(),
                max_rel(&o32, &o64)
            );
            // Same seed, same draw.
            let again = method
                .approximate(&h64, d, &mut TrialRng::seed_from_u64(9))
                .unwrap();
            assert_eq!(to_dmatrix(&again.output).unwrap(), o64);
        }
        let x = method
            .approximate(&h64, 16, &mut TrialRng::seed_from_u64(10))
            .unwrap();
        let y = method
            .approximate(&h64, 16, &mut TrialRng::seed_from_u64(11))
            .unwrap();
        assert_ne!(
            to_dmatrix(&x.output).unwrap(),
            to_dmatrix(&y.output).unwrap()
        );
    }
}

#[test]
fn logits_beyond_f64_exp_range_stay_finite_thanks_to_the_global_shift() {
    // Rows of Q̃ = K̃ on an arc of radius √800 in p = 2: every logit is in [−800, 800] and
    // unshifted exp overflows f64 (> 709); after the global shift all logits lie in
    // [800(cos 1 − 1), 0] ≈ [−368, 0], so nothing overflows or underflows to an all-zero row.
    let (n, p) = (24, 2);
    let r = 800f64.sqrt() * (p as f64).powf(0.25);
    let q = DMatrix::from_fn(n, p, |i, j| {
        let t = i as f64 / (n - 1) as f64;
        if j == 0 {
            r * t.cos()
        } else {
            r * t.sin()
        }
    });
    let v = gauss(&mut TrialRng::seed_from_u64(6), n, p, 1.0);
    assert!((&q * q.transpose() / (p as f64).sqrt())
        .map(f64::exp)
        .iter()
        .any(|x| x.is_infinite()));
    let head = HeadInputs::new(
        tensor(&q, DType::F64),
        tensor(&q, DType::F64),
        tensor(&v, DType::F64),
    )
    .unwrap();
    for method in [Skyformer::pseudo_inverse(), Skyformer::iterative()] {
        let a = method
            .approximate(&head, 16, &mut TrialRng::seed_from_u64(8))
            .unwrap();
        assert!(
            to_dmatrix(&a.output).unwrap().iter().all(|x| x.is_finite()),
            "{}",
            method.id()
        );
        assert!(a
            .normalizer
            .unwrap()
            .to_vec1::<f64>()
            .unwrap()
            .iter()
            .all(|x| x.is_finite()));
    }
}

#[test]
fn landmark_split_and_metadata() {
    assert_landmark_split(draw_landmarks, 7, 10, &[(7, (4, 3)), (1, (1, 0))]);
    assert_eq!(Skyformer::pseudo_inverse().id(), "skyformer");
    assert_eq!(Skyformer::iterative().id(), "skyformer_iter");
    assert_eq!(
        Skyformer::pseudo_inverse().macs(1024, 64, 16),
        4.0 * 1024.0 * 16.0 * 64.0 + 24.0 * 4096.0
    );
    assert!(Skyformer::pseudo_inverse().check(512, 0).is_err());
}
