//! The metric: ‖O − Ô‖₂ = σ_max(E), by power iteration on the p×p Gram matrix G = EᵀE
//! (docs/reference.md §1.2), with an exact symmetric eigen-solver kept as the check.

// `!(x > 0.0)` is deliberate throughout: it is true for NaN as well as for x ≤ 0.
#![allow(clippy::neg_cmp_op_on_partial_ord)]

use anyhow::Result;
use candle_core::{DType, Tensor};
use nalgebra::{DMatrix, DVector};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Power iteration, accelerated: G is only p×p (64×64), so instead of thousands of plain steps
/// when the top two eigenvalues are close, the iteration is first run on H = G^(2^SQUARINGS),
/// built by repeated squaring (each squaring doubles the number of power steps; H is rescaled
/// by its trace to stay finite). The start vector H·x₀ (x₀ seeded random) then lies in the top
/// eigenspace to working precision even for relative gaps of 1e-6, and plain steps x ← Gx/‖Gx‖
/// follow until the Rayleigh quotient xᵀGx changes by less than `REL_TOL` relative, or
/// `MAX_STEPS` steps. With clustered top eigenvalues the vector may be any mix of the cluster,
/// but the quotient is then within the cluster's width of λ_max, which is the quantity we need.
pub const SQUARINGS: usize = 40;
pub const REL_TOL: f64 = 1e-14;
pub const MAX_STEPS: usize = 500;

/// Norms of one error matrix E = O − Ô.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErrorNorms {
    /// ‖E‖₂ (spectral), by power iteration.
    pub spectral: f64,
    /// ‖E‖_F.
    pub frobenius: f64,
    /// Plain power steps used after the squarings.
    pub steps: usize,
}

/// Result of a power iteration.
#[derive(Debug, Clone, Copy)]
pub struct PowerResult {
    /// The largest eigenvalue λ_max of the symmetric PSD input.
    pub lambda: f64,
    pub steps: usize,
    pub converged: bool,
}

/// G = EᵀE accumulated in f64 on E's device, then copied to the host (p×p).
pub fn gram(e: &Tensor) -> Result<DMatrix<f64>> {
    let e = e.to_dtype(DType::F64)?;
    let g = e.t()?.matmul(&e)?;
    crate::tensor_util::to_dmatrix(&g)
}

/// Largest eigenvalue of a symmetric PSD matrix by (accelerated) power iteration from a seeded
/// random start.
pub fn power_iteration(g: &DMatrix<f64>, seed: u64) -> PowerResult {
    let p = g.nrows();
    let tr = g.trace();
    if p == 0 || tr == 0.0 {
        return PowerResult {
            lambda: 0.0,
            steps: 0,
            converged: true,
        };
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let x0 = DVector::from_fn(p, |_, _| rng.random::<f64>() - 0.5);
    // H = G^(2^k) / trace, by repeated squaring, until it stops changing: trace(H²) = Σμ_i² for
    // the trace-normalized eigenvalues μ, which reaches 1 when one eigenvalue dominates and
    // 1/k for a k-fold cluster; squaring further then changes nothing.
    let mut h = g / tr;
    let mut last = 0.0;
    for _ in 0..SQUARINGS {
        let h2 = &h * &h;
        let t = h2.trace();
        if !(t > 0.0) || !t.is_finite() {
            break;
        }
        h = h2 / t;
        if (t - last).abs() <= 1e-15 * t {
            break;
        }
        last = t;
    }
    let mut x = &h * &x0;
    if !(x.norm() > 0.0) {
        x = x0;
    }
    x /= x.norm();
    let mut rho = f64::NAN;
    for step in 1..=MAX_STEPS {
        let y = g * &x;
        let new_rho = x.dot(&y); // Rayleigh quotient xᵀGx with ‖x‖ = 1
        let ny = y.norm();
        if !(ny > 0.0) || !ny.is_finite() {
            let lambda = if ny == 0.0 { 0.0 } else { f64::NAN };
            return PowerResult {
                lambda,
                steps: step,
                converged: ny == 0.0,
            };
        }
        if (new_rho - rho).abs() <= REL_TOL * new_rho.abs() {
            return PowerResult {
                lambda: new_rho.max(rho),
                steps: step,
                converged: true,
            };
        }
        rho = new_rho;
        x = y / ny;
    }
    PowerResult {
        lambda: rho,
        steps: MAX_STEPS,
        converged: false,
    }
}

/// λ_max by nalgebra's exact symmetric eigen-solver (the check for the power iteration).
pub fn exact_lambda_max(g: &DMatrix<f64>) -> f64 {
    if g.nrows() == 0 {
        return 0.0;
    }
    let eig = nalgebra::SymmetricEigen::new(g.clone());
    eig.eigenvalues
        .iter()
        .cloned()
        .fold(f64::NEG_INFINITY, f64::max)
}

/// ‖E‖₂ and ‖E‖_F of E = exact − approx. Non-finite inputs give NaN norms (the caller counts
/// non-finite rows separately and keeps such trials out of the means).
pub fn error_norms(exact: &Tensor, approx: &Tensor) -> Result<ErrorNorms> {
    let e = (exact.to_dtype(DType::F64)? - approx.to_dtype(DType::F64)?)?;
    matrix_norms(&e)
}

/// ‖M‖₂ and ‖M‖_F of a tall matrix via its Gram matrix.
pub fn matrix_norms(m: &Tensor) -> Result<ErrorNorms> {
    Ok(norms_of_gram(&gram(m)?))
}

/// [`matrix_norms`] for each matrix of a batch [B, n, p]: the B Gram matrices in one batched
/// product on the batch's device and one copy to the host, the power iterations on the host's
/// threads. Each matrix's norms are those [`matrix_norms`] gives it alone, within the rounding of
/// the batched product.
pub fn batch_matrix_norms(m: &Tensor) -> Result<Vec<ErrorNorms>> {
    let (b, _, p) = m.dims3()?;
    let e = m.to_dtype(DType::F64)?;
    let g: Vec<f64> = e.transpose(1, 2)?.matmul(&e)?.flatten_all()?.to_vec1()?;
    let grams: Vec<DMatrix<f64>> = (0..b)
        .map(|i| DMatrix::from_row_slice(p, p, &g[i * p * p..(i + 1) * p * p]))
        .collect();
    Ok(crate::runtime::host_map(&grams, norms_of_gram))
}

/// ‖M‖₂ and ‖M‖_F from G = MᵀM (NaN for a non-finite G).
fn norms_of_gram(g: &DMatrix<f64>) -> ErrorNorms {
    if g.iter().any(|x| !x.is_finite()) {
        return ErrorNorms {
            spectral: f64::NAN,
            frobenius: f64::NAN,
            steps: 0,
        };
    }
    let pr = power_iteration(g, 0x5eed_5eed);
    let spectral = if pr.converged {
        pr.lambda.max(0.0).sqrt()
    } else {
        // Not converged in MAX_STEPS: fall back to the exact solver rather than report a
        // quotient that may be low (never observed on p×p Gram matrices, but cheap to guard).
        exact_lambda_max(g).max(0.0).sqrt()
    };
    ErrorNorms {
        spectral,
        frobenius: g.trace().max(0.0).sqrt(),
        steps: pr.steps,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor_util::test_device;

    fn random_matrix(rng: &mut ChaCha8Rng, r: usize, c: usize) -> DMatrix<f64> {
        DMatrix::from_fn(r, c, |_, _| rng.random::<f64>() * 2.0 - 1.0)
    }

    #[test]
    fn power_iteration_matches_eigensolver_on_random_grams() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for trial in 0..50 {
            let e = random_matrix(&mut rng, 200, 64);
            let g = e.transpose() * &e;
            let pr = power_iteration(&g, trial);
            let exact = exact_lambda_max(&g);
            assert!(pr.converged);
            assert!(
                (pr.lambda - exact).abs() <= 1e-10 * exact,
                "{} vs {}",
                pr.lambda,
                exact
            );
        }
    }

    #[test]
    fn power_iteration_matches_eigensolver_on_clustered_top_singular_values() {
        // E = U Σ Wᵀ with σ₁ = 1, σ₂ = 1 − 1e-6, σ₃ = 1 − 1e-3: the vector converges very slowly,
        // the quotient must still be right.
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for gap in [1e-2, 1e-4, 1e-6, 0.0] {
            let u = random_matrix(&mut rng, 300, 64).qr().q();
            let w = random_matrix(&mut rng, 64, 64).qr().q();
            let mut s = DMatrix::zeros(64, 64);
            for i in 0..64 {
                s[(i, i)] = if i == 0 {
                    3.0
                } else if i == 1 {
                    3.0 * (1.0 - gap)
                } else {
                    1.0 / (i as f64)
                };
            }
            let e = u * s * w.transpose();
            let g = e.transpose() * &e;
            let pr = power_iteration(&g, 3);
            let exact = exact_lambda_max(&g);
            assert!((exact - 9.0).abs() < 1e-9);
            assert!(
                (pr.lambda - exact).abs() <= 1e-9 * exact,
                "gap {gap}: {} vs {}",
                pr.lambda,
                exact
            );
        }
    }

    #[test]
    fn error_norms_match_svd_of_thin_matrix() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let a = random_matrix(&mut rng, 120, 16);
        let b = random_matrix(&mut rng, 120, 16);
        let dev = test_device();
        let ta = crate::tensor_util::from_dmatrix(&a, &dev, DType::F64).unwrap();
        let tb = crate::tensor_util::from_dmatrix(&b, &dev, DType::F64).unwrap();
        let norms = error_norms(&ta, &tb).unwrap();
        let svd = (&a - &b).svd(false, false);
        let smax = svd.singular_values.max();
        assert!((norms.spectral - smax).abs() < 1e-10 * smax);
        assert!((norms.frobenius - (&a - &b).norm()).abs() < 1e-10 * smax);
    }

    #[test]
    fn batched_norms_are_each_matrix_s_own() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let dev = test_device();
        let mut mats: Vec<Tensor> = (0..4)
            .map(|_| {
                let m = random_matrix(&mut rng, 50, 8);
                crate::tensor_util::from_dmatrix(&m, &dev, DType::F64).unwrap()
            })
            .collect();
        let mut poisoned = vec![0.5f64; 50 * 8];
        poisoned[17] = f64::NAN;
        mats[2] = Tensor::from_vec(poisoned, (50, 8), &dev).unwrap();
        let batch = Tensor::stack(&mats, 0).unwrap();
        let got = batch_matrix_norms(&batch).unwrap();
        assert_eq!(got.len(), 4);
        for (m, g) in mats.iter().zip(&got) {
            let one = matrix_norms(m).unwrap();
            if one.spectral.is_nan() {
                assert!(g.spectral.is_nan() && g.frobenius.is_nan());
                continue;
            }
            assert!((g.spectral - one.spectral).abs() <= 1e-12 * one.spectral);
            assert!((g.frobenius - one.frobenius).abs() <= 1e-12 * one.frobenius);
        }
        assert!(got[2].spectral.is_nan());
    }

    #[test]
    fn zero_error_is_zero_and_nan_is_nan() {
        let dev = test_device();
        let a = Tensor::ones((10, 4), DType::F32, &dev).unwrap();
        assert_eq!(error_norms(&a, &a).unwrap().spectral, 0.0);
        let mut v = vec![1f32; 40];
        v[5] = f32::NAN;
        let b = Tensor::from_vec(v, (10, 4), &dev).unwrap();
        assert!(error_norms(&a, &b).unwrap().spectral.is_nan());
    }
}
