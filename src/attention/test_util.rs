//! Helpers shared by the methods' tests.

use crate::tensor_util::test_device;
use candle_core::DType;
use nalgebra::DMatrix;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

use super::{Approximation, HeadInputs, Method};
use crate::numerics::sampling::{normal_values, TrialRng};
use crate::tensor_util::from_f64;

/// An r×c matrix of iid N(0, std²) values.
pub fn gauss(rng: &mut TrialRng, r: usize, c: usize, std: f64) -> DMatrix<f64> {
    DMatrix::from_fn(r, c, |_, _| {
        let z: f64 = StandardNormal.sample(rng);
        z * std
    })
}

/// The same head with Q, K, V in f32 (its exact target recomputed in f32).
pub fn in_f32(h: &HeadInputs) -> HeadInputs {
    let f = |t: &candle_core::Tensor| t.to_dtype(DType::F32).unwrap();
    HeadInputs::new(f(&h.q), f(&h.k), f(&h.v)).unwrap()
}

/// `m` at d with the trial generator seeded by `seed`.
pub fn run_seeded(m: &dyn Method, h: &HeadInputs, d: usize, seed: u64) -> Approximation {
    m.approximate(h, d, &mut TrialRng::seed_from_u64(seed))
        .unwrap()
}

/// Ô of `m` on `h` at d with the trial generator of `seed`, as f64 rows.
pub fn out_rows(m: &dyn Method, h: &HeadInputs, d: usize, seed: u64) -> Vec<Vec<f64>> {
    let o = run_seeded(m, h, d, seed).output;
    o.to_dtype(DType::F64).unwrap().to_vec2().unwrap()
}

/// Ô of `m` on `h` at d with the trial generator of `seed`, as an f64 matrix.
pub fn out_matrix(m: &dyn Method, h: &HeadInputs, d: usize, seed: u64) -> DMatrix<f64> {
    crate::tensor_util::to_dmatrix(&run_seeded(m, h, d, seed).output).unwrap()
}

/// A randomized method is a function of its seed: `seed` twice gives the same Ô, `seed + 1`
/// another. Returns the run for `seed`.
pub fn assert_seed_determines_output(
    m: &dyn Method,
    h: &HeadInputs,
    d: usize,
    seed: u64,
) -> Approximation {
    let rows = |a: &Approximation| {
        a.output
            .to_dtype(DType::F64)
            .unwrap()
            .to_vec2::<f64>()
            .unwrap()
    };
    let a = run_seeded(m, h, d, seed);
    assert_eq!(
        rows(&a),
        rows(&run_seeded(m, h, d, seed)),
        "{} not reproducible",
        m.id()
    );
    assert_ne!(
        rows(&a),
        rows(&run_seeded(m, h, d, seed + 1)),
        "{} ignores the seed",
        m.id()
    );
    a
}

/// ‖O − Ô‖₂: the spectral error of `o` against the head's exact attention.
pub fn exact_error(h: &HeadInputs, o: &candle_core::Tensor) -> f64 {
    crate::numerics::spectral::error_norms(&h.exact().unwrap().output, o)
        .unwrap()
        .spectral
}

/// ‖target − out‖ / ‖target‖ in the spectral and the Frobenius norm.
pub fn relative_errors(target: &candle_core::Tensor, out: &candle_core::Tensor) -> [f64; 2] {
    use crate::numerics::spectral::{error_norms, matrix_norms};
    let (err, norm) = (
        error_norms(target, out).unwrap(),
        matrix_norms(target).unwrap(),
    );
    [err.spectral / norm.spectral, err.frobenius / norm.frobenius]
}

/// One row of a dense host reference: Σ_j a_j·v_j / Σ_j a_j over the row's `(a_j, j)` terms,
/// accumulated in their order.
pub fn weighted_mean_row(
    v: &[Vec<f64>],
    terms: impl IntoIterator<Item = (f64, usize)>,
) -> Vec<f64> {
    let mut num = vec![0.0; v[0].len()];
    let mut den = 0.0;
    for (a, j) in terms {
        den += a;
        num.iter_mut().zip(&v[j]).for_each(|(x, y)| *x += a * y);
    }
    num.iter().map(|x| x / den).collect()
}

/// Every entry of `t` is finite.
pub fn assert_all_finite(t: &candle_core::Tensor) {
    let v = t.flatten_all().unwrap().to_dtype(DType::F64).unwrap();
    assert!(v.to_vec1::<f64>().unwrap().iter().all(|x| x.is_finite()));
}

/// ‖O − Ô_V-Mean‖₂ of a head (every row of Ô the mean of V).
pub fn vmean_error(h: &HeadInputs) -> f64 {
    let mean =
        h.v.mean_keepdim(0)
            .unwrap()
            .broadcast_as(h.v.shape())
            .unwrap();
    crate::numerics::spectral::error_norms(&h.exact().unwrap().output, &mean)
        .unwrap()
        .spectral
}

/// Q, K, V of a head as host f64 rows.
pub fn host_rows(h: &HeadInputs) -> [Vec<Vec<f64>>; 3] {
    let r = |t: &candle_core::Tensor| -> Vec<Vec<f64>> {
        t.to_dtype(DType::F64).unwrap().to_vec2().unwrap()
    };
    [r(&h.q), r(&h.k), r(&h.v)]
}

/// The weight matrix W (n×n) a restrict-and-renormalise method puts on the keys of `h`:
/// the method run on the same Q, K with V = I_n (so Ô = W·I = W), in `h`'s dtype.
pub fn weight_matrix(m: &dyn Method, h: &HeadInputs, d: usize, seed: u64) -> Vec<Vec<f64>> {
    let n = h.n();
    let eye = candle_core::Tensor::eye(n, h.dtype(), h.device()).unwrap();
    let hw = HeadInputs::new(h.q.clone(), h.k.clone(), eye).unwrap();
    let out = run_seeded(m, &hw, d, seed).output;
    out.to_dtype(DType::F64).unwrap().to_vec2().unwrap()
}

/// Every row of W is a distribution: non-negative, summing to 1 within `tol`.
pub fn assert_rows_are_distributions(w: &[Vec<f64>], tol: f64) {
    for (i, row) in w.iter().enumerate() {
        assert!(
            row.iter().all(|&x| x >= 0.0),
            "row {i} has a negative weight"
        );
        let sum: f64 = row.iter().sum();
        assert!((sum - 1.0).abs() < tol, "row {i} sums to {sum}");
    }
}

/// Entry by entry, |got − want| ≤ rel·|want|.
pub fn assert_close_per_entry(got: &[Vec<f64>], want: &[Vec<f64>], rel: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        for (c, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(
                (a - b).abs() <= rel * b.abs(),
                "entry ({i}, {c}): {a} vs {b}"
            );
        }
    }
}

/// The same head under the causal mask.
pub fn causal(h: &HeadInputs) -> HeadInputs {
    HeadInputs::masked(
        h.q.clone(),
        h.k.clone(),
        h.v.clone(),
        crate::attention::Mask::Causal,
    )
    .unwrap()
}

/// A restrict-and-renormalise method under the causal mask against the dense float64 masked
/// softmax over the sets its definition gives, `visits(i, j, d)` (which must imply j ≤ i), for
/// each d: Ô entry by entry, the realised keys mean_i |S_i|, and the mass captured
/// mean_i Σ_{j∈S_i} P_ij with P the exact causal attention — all to 1e-10 in f64.
pub fn assert_causal_restricted(
    m: &dyn Method,
    h: &HeadInputs,
    ds: &[usize],
    visits: impl Fn(usize, usize, usize) -> bool,
) {
    use crate::numerics::key_sets::tests::dense_masked_softmax;
    let h = causal(h);
    let [q, k, v] = host_rows(&h);
    let n = q.len();
    let (_, log_d) = dense_masked_softmax(&q, &k, &v, |i, j| j <= i);
    for &d in ds {
        for i in 0..n {
            for j in i + 1..n {
                assert!(!visits(i, j, d), "the definition visits a future key");
            }
        }
        let (want, log_s) = dense_masked_softmax(&q, &k, &v, |i, j| visits(i, j, d));
        let got = run_seeded(m, &h, d, 0);
        let rows: Vec<Vec<f64>> = got.output.to_dtype(DType::F64).unwrap().to_vec2().unwrap();
        let scale = want.iter().flatten().fold(0.0f64, |a, x| a.max(x.abs()));
        for (i, (a, b)) in rows.iter().zip(&want).enumerate() {
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y).abs() <= 1e-10 * scale,
                    "{} d = {d}, row {i}: {x} vs {y}",
                    m.id()
                );
            }
        }
        let keys = (0..n)
            .map(|i| (0..n).filter(|&j| visits(i, j, d)).count())
            .sum::<usize>() as f64
            / n as f64;
        let support = got
            .support
            .as_ref()
            .expect("a restricted method reports its keys");
        assert!(
            (support.keys - keys).abs() < 1e-12,
            "{} d = {d}: keys {} vs {keys}",
            m.id(),
            support.keys
        );
        let mass = (0..n).map(|i| (log_s[i] - log_d[i]).exp()).sum::<f64>() / n as f64;
        let got_mass = got
            .mass(h.exact().unwrap().log_rowsum().unwrap())
            .unwrap()
            .unwrap();
        assert!(
            (got_mass - mass).abs() < 1e-10,
            "{} d = {d}: mass {got_mass} vs {mass}",
            m.id()
        );
    }
}

/// A head with iid N(0, 1) Q, K, V of shape [n, p] from `seed`.
pub fn random_head(n: usize, p: usize, seed: u64, dtype: DType) -> HeadInputs {
    let mut rng = TrialRng::seed_from_u64(seed);
    let mut mk = || {
        from_f64(
            normal_values(&mut rng, n, p, 1.0),
            (n, p),
            &test_device(),
            dtype,
        )
        .unwrap()
    };
    let (q, k, v) = (mk(), mk(), mk());
    HeadInputs::new(q, k, v).unwrap()
}

/// s_ij = q_i·k_j/√p for every (i, j), in f64 entry by entry (the dense references' logits).
pub fn logit_rows(q: &[Vec<f64>], k: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let p = q[0].len() as f64;
    q.iter()
        .map(|qi| {
            k.iter()
                .map(|kj| qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() / p.sqrt())
                .collect()
        })
        .collect()
}
