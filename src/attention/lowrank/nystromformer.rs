//! Nyströmformer (Xiong et al., AAAI 2021; docs/reference.md §2.4), as in mlpen/Nystromformer.
//!
//! // Eq. (14): Ô = softmax(Q̃K̄ᵀ) · (softmax(Q̄K̄ᵀ))⁺ · softmax(Q̄K̃ᵀ) · V
//! // Eq. (12)–(13): (·)⁺ by 6 steps of Z_{t+1} = ¼Z_t(13I − AZ_t(15I − AZ_t(7I − AZ_t))), Z₀ = Aᵀ/‖A‖₁
//! Q̃ = Q·p^{-1/4}, K̃ = K·p^{-1/4}; Q̄, K̄ are the d segment means (landmarks) of Q̃ and K̃.
//!
//! - d does not divide n: contiguous near-equal segments [⌊s·n/d⌋, ⌊(s+1)·n/d⌋), sizes differing
//!   by at most 1 (the reference requires d | n; docs/reference.md is silent otherwise).
//! - d ≥ n: exact softmax attention, as the reference does at d = n (every row its own landmark;
//!   the 6-step inverse would not invert an n×n attention matrix).
//! - No depthwise-conv skip on V (docs/reference.md §2.4 [REC]); deterministic; computed in the
//!   input dtype on the head's device (the softmaxes are max-shifted).

use anyhow::Result;
use candle_core::Tensor;

use crate::attention::batch::each_head;
use crate::attention::{
    quarter_scale, row_softmax, Approximation, Family, HeadInputs, HeadTrials, Method, MethodInfo,
};
use crate::numerics::inverse::iterative_inverse;
use crate::numerics::sampling::TrialRng;

/// Iterations of the inverse (docs/reference.md §2.4).
pub const ITER_STEPS: usize = 6;

pub struct Nystromformer;

/// Segment boundaries: segment s covers rows [⌊s·n/d⌋, ⌊(s+1)·n/d⌋) (requires 1 ≤ d ≤ n).
pub(crate) fn segments(n: usize, d: usize) -> Vec<(usize, usize)> {
    (0..d).map(|s| (s * n / d, (s + 1) * n / d)).collect()
}

/// The d segment means of the rows of x (n×p), d×p, in x's dtype and device; for a batch of
/// heads ([B, n, p]) each head's, [B, d, p].
pub(crate) fn segment_means(x: &Tensor, d: usize) -> Result<Tensor> {
    if x.rank() == 3 {
        let (b, n, p) = x.dims3()?;
        if n % d == 0 && d >= 1 {
            return Ok(x.reshape((b, d, n / d, p))?.mean(2)?);
        }
        let means: Vec<Tensor> = (0..b)
            .map(|i| segment_means(&x.get(i)?, d))
            .collect::<Result<_>>()?;
        return Ok(Tensor::stack(&means, 0)?);
    }
    let (n, p) = x.dims2()?;
    anyhow::ensure!(
        d >= 1 && d <= n,
        "segment means need 1 ≤ d ≤ n (d = {d}, n = {n})"
    );
    if n % d == 0 {
        return Ok(x.reshape((d, n / d, p))?.mean(1)?);
    }
    // Averaging matrix S (d×n), S[s, j] = 1/|segment s| on the segment: one matmul.
    let mut s = vec![0f64; d * n];
    for (r, (a, b)) in segments(n, d).into_iter().enumerate() {
        let w = 1.0 / (b - a) as f64;
        s[r * n + a..r * n + b].iter_mut().for_each(|x| *x = w);
    }
    let s = crate::tensor_util::from_f64(s, (d, n), x.device(), x.dtype())?;
    Ok(s.matmul(x)?)
}

/// Eq. (14) for d < n, on one head ([n, p]) or a batch of heads ([B, n, p]).
fn landmark_products(q: &Tensor, k: &Tensor, v: &Tensor, d: usize) -> Result<Tensor> {
    let p = q.dim(candle_core::D::Minus1)?;
    let qt = quarter_scale(q, p)?;
    let kt = quarter_scale(k, p)?;
    let qbar = segment_means(&qt, d)?;
    let kbar = segment_means(&kt, d)?;
    let kbar_t = kbar.t()?;
    let f = row_softmax(&qt.matmul(&kbar_t)?)?; // n×d
    let a_s = row_softmax(&qbar.matmul(&kbar_t)?)?; // d×d
    let b = row_softmax(&qbar.matmul(&kt.t()?)?)?; // d×n
    let z = iterative_inverse(&a_s, ITER_STEPS)?;
    Ok(f.matmul(&z.matmul(&b.matmul(v)?)?)?)
}

const NYSTROMFORMER: MethodInfo = MethodInfo {
    id: "nystromformer",
    family: Family::LowRank,
    meaning: "number of segment-means landmarks, used for both Q and K (d ≥ n: exact)",
    random: false,
    ..MethodInfo::BASE
};

impl Method for Nystromformer {
    fn approximate(&self, head: &HeadInputs, d: usize, _: &mut TrialRng) -> Result<Approximation> {
        let n = head.n();
        self.check(head.n(), d).map_err(anyhow::Error::msg)?;
        if d >= n {
            return Ok(Approximation::plain(head.exact()?.output.clone()));
        }
        Ok(Approximation::plain(landmark_products(
            &head.q, &head.k, &head.v, d,
        )?))
    }
    /// Every product batched over heads (deterministic: no seed is read).
    fn approximate_heads(&self, trials: &HeadTrials) -> Result<Vec<Approximation>> {
        let (batch, d) = (trials.batch, trials.d);
        if d >= batch.n() {
            return each_head(self, trials);
        }
        self.check(batch.n(), d).map_err(anyhow::Error::msg)?;
        trials.per_head(&landmark_products(&batch.q, &batch.k, &batch.v, d)?, None)
    }
    /// docs/reference.md §2.11: 4ndp + 24d³, plus np for the landmarks.
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        let (n, p, d) = (n as f64, p as f64, d as f64);
        4.0 * n * d * p + 24.0 * d * d * d + n * p
    }
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(&NYSTROMFORMER)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::test_util::exact_error;
    use crate::tensor_util::test_device;
    use crate::tensor_util::{from_dmatrix, to_dmatrix};
    use candle_core::DType;
    use nalgebra::DMatrix;
    use rand::SeedableRng;

    use crate::attention::test_util::{gauss, out_matrix};
    fn head(q: &DMatrix<f64>, k: &DMatrix<f64>, v: &DMatrix<f64>, dt: DType) -> HeadInputs {
        let t = |m: &DMatrix<f64>| from_dmatrix(m, &test_device(), dt).unwrap();
        HeadInputs::new(t(q), t(k), t(v)).unwrap()
    }
    fn max_rel(a: &DMatrix<f64>, b: &DMatrix<f64>) -> f64 {
        (a - b).abs().max() / b.abs().max()
    }
    fn softmax_rows(m: DMatrix<f64>) -> DMatrix<f64> {
        let mut m = m;
        for mut r in m.row_iter_mut() {
            let mx = r.max();
            r.apply(|x| *x = (*x - mx).exp());
            let s = r.sum();
            r.apply(|x| *x /= s);
        }
        m
    }

    /// Independent host port (loops for the means, nalgebra for the products).
    fn host_reference(
        q: &DMatrix<f64>,
        k: &DMatrix<f64>,
        v: &DMatrix<f64>,
        d: usize,
    ) -> DMatrix<f64> {
        let (n, p) = q.shape();
        let s = (p as f64).powf(-0.25);
        let (qt, kt) = (q * s, k * s);
        let means = |x: &DMatrix<f64>| {
            DMatrix::from_fn(d, p, |r, c| {
                let (a, b) = (r * n / d, (r + 1) * n / d);
                (a..b).map(|i| x[(i, c)]).sum::<f64>() / (b - a) as f64
            })
        };
        let (qb, kb) = (means(&qt), means(&kt));
        let f = softmax_rows(&qt * kb.transpose());
        let a = softmax_rows(&qb * kb.transpose());
        let b = softmax_rows(&qb * kt.transpose());
        let colmax = (0..d)
            .map(|j| a.column(j).iter().map(|x| x.abs()).sum::<f64>())
            .fold(0.0, f64::max);
        let mut z = a.transpose() / colmax;
        let eye = DMatrix::<f64>::identity(d, d);
        for _ in 0..ITER_STEPS {
            let y = &a * &z;
            z = &z * (&eye * 13.0 - &y * (&eye * 15.0 - &y * (&eye * 7.0 - &y))) * 0.25;
        }
        f * (z * (b * v))
    }

    #[test]
    fn near_equal_segments_and_their_means() {
        for (n, d) in [(10, 3), (10, 4), (7, 7), (100, 16), (512, 3)] {
            let seg = segments(n, d);
            assert_eq!(seg.len(), d);
            assert_eq!(seg[0].0, 0);
            assert_eq!(seg[d - 1].1, n);
            let sizes: Vec<usize> = seg.iter().map(|(a, b)| b - a).collect();
            let (lo, hi) = (*sizes.iter().min().unwrap(), *sizes.iter().max().unwrap());
            assert!(lo >= 1 && hi - lo <= 1, "{n} {d}: {sizes:?}");
            assert!(seg.windows(2).all(|w| w[0].1 == w[1].0));
        }
        let x = DMatrix::from_fn(10, 2, |i, j| (i * 10 + j) as f64);
        let t = from_dmatrix(&x, &test_device(), DType::F64).unwrap();
        // n = 10, d = 3: segments [0,3), [3,6), [6,10).
        let m = to_dmatrix(&segment_means(&t, 3).unwrap()).unwrap();
        let want = DMatrix::from_row_slice(3, 2, &[10.0, 11.0, 40.0, 41.0, 75.0, 76.0]);
        assert!((m - want).abs().max() < 1e-12);
        // Dividing case (reshape path): n = 10, d = 5, pairs.
        let m = to_dmatrix(&segment_means(&t, 5).unwrap()).unwrap();
        assert!((m[(4, 1)] - 86.0).abs() < 1e-12 && (m[(0, 0)] - 5.0).abs() < 1e-12);
    }

    #[test]
    fn matches_host_reference_for_dividing_and_non_dividing_d() {
        let mut rng = TrialRng::seed_from_u64(1);
        let (n, p) = (60, 16);
        let (q, k, v) = (
            gauss(&mut rng, n, p, 1.0),
            gauss(&mut rng, n, p, 1.0),
            gauss(&mut rng, n, p, 1.0),
        );
        let h = head(&q, &k, &v, DType::F64);
        for d in [1, 4, 7, 12, 13, 59] {
            let got = out_matrix(&Nystromformer, &h, d, 0);
            let want = host_reference(&q, &k, &v, d);
            assert!(
                max_rel(&got, &want) < 1e-9,
                "d={d}: {}",
                max_rel(&got, &want)
            );
        }
    }

    #[test]
    fn one_landmark_gives_softmax_of_the_mean_query() {
        // d = 1: F = 1, A_s = [1], IterInv = [1], so every row is softmax(mean(Q̃)K̃ᵀ)V.
        let mut rng = TrialRng::seed_from_u64(2);
        let (n, p) = (20, 8);
        let (q, k, v) = (
            gauss(&mut rng, n, p, 1.0),
            gauss(&mut rng, n, p, 1.0),
            gauss(&mut rng, n, p, 1.0),
        );
        let h = head(&q, &k, &v, DType::F64);
        let got = out_matrix(&Nystromformer, &h, 1, 0);
        let s = (p as f64).powf(-0.25);
        let qm = (q * s).row_mean();
        let qbar = DMatrix::from_row_slice(1, p, qm.as_slice());
        let row = softmax_rows(&qbar * (k * s).transpose()) * &v;
        for i in 0..n {
            assert!((got.row(i) - &row).abs().max() < 1e-12);
        }
    }

    #[test]
    fn exact_when_every_row_is_a_landmark() {
        let mut rng = TrialRng::seed_from_u64(3);
        let (n, p) = (32, 8);
        let (q, k, v) = (
            gauss(&mut rng, n, p, 1.0),
            gauss(&mut rng, n, p, 1.0),
            gauss(&mut rng, n, p, 1.0),
        );
        let h = head(&q, &k, &v, DType::F64);
        let exact = to_dmatrix(&h.exact().unwrap().output).unwrap();
        for d in [n, n + 1, 4 * n] {
            let got = out_matrix(&Nystromformer, &h, d, 0);
            assert!(max_rel(&got, &exact) < 1e-14, "d={d}");
        }
        // And the error shrinks towards it: d = n/2 is worse than exact but still beats d = 1.
        let err = |d| {
            let o = Nystromformer
                .approximate(&h, d, &mut TrialRng::seed_from_u64(0))
                .unwrap()
                .output;
            exact_error(&h, &o)
        };
        assert!(err(n / 2) > 0.0 && err(n / 2) < err(1));
    }

    #[test]
    fn f32_agrees_with_f64_and_outputs_are_finite_and_deterministic() {
        let mut rng = TrialRng::seed_from_u64(4);
        let (n, p) = (256, 64);
        let (q, k, v) = (
            gauss(&mut rng, n, p, 0.6),
            gauss(&mut rng, n, p, 0.6),
            gauss(&mut rng, n, p, 1.0),
        );
        let (h32, h64) = (head(&q, &k, &v, DType::F32), head(&q, &k, &v, DType::F64));
        for d in [8, 16, 24, 64, 100] {
            let a32 = Nystromformer
                .approximate(&h32, d, &mut TrialRng::seed_from_u64(0))
                .unwrap()
                .output;
            let a64 = Nystromformer
                .approximate(&h64, d, &mut TrialRng::seed_from_u64(1))
                .unwrap()
                .output;
            assert_eq!(a32.dtype(), DType::F32);
            let (o32, o64) = (to_dmatrix(&a32).unwrap(), to_dmatrix(&a64).unwrap());
            assert!(o32.iter().all(|x| x.is_finite()));
            assert!(max_rel(&o32, &o64) < 1e-3, "d={d}: {}", max_rel(&o32, &o64));
            let again = Nystromformer
                .approximate(&h64, d, &mut TrialRng::seed_from_u64(7))
                .unwrap()
                .output;
            assert_eq!(to_dmatrix(&again).unwrap(), o64);
        }
        assert!(!Nystromformer.is_random());
        assert!(Nystromformer.check(512, 0).is_err() && Nystromformer.check(512, 1000).is_ok());
    }
}
