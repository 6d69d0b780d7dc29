//! Matrix inverses for the Nyström-type methods: the iterative (Razavi et al. 2014) inverse
//! used by Nyströmformer and Skyformer's code path, and the symmetric pseudo-inverse of
//! Skyformer's paper Eq. (5).

use anyhow::Result;
use candle_core::{DType, Tensor, D};
use nalgebra::DMatrix;

/// Default relative eigenvalue cut-off of [`symmetric_pinv`] (docs/reference.md §2.3 [REC]: 1e-10·λ_max).
pub const PINV_REL_CUTOFF: f64 = 1e-10;

/// `steps` iterations of Z_{t+1} = ¼ Z_t (13I − NZ_t(15I − NZ_t(7I − NZ_t))) from
/// Z₀ = Nᵀ / max_j Σ_i |N_ij| (docs/reference.md §2.3; Nyströmformer Eq. (12)–(13), Razavi et al. 2014).
/// Runs on `n`'s device and dtype.
pub fn iterative_inverse(n: &Tensor, steps: usize) -> Result<Tensor> {
    let d = n.dim(D::Minus1)?;
    let eye = Tensor::eye(d, n.dtype(), n.device())?;
    // The largest column sum ‖N‖₁, one matrix at a time (docs/reference.md §3 item 17): for a batch
    // [B, d, d], each matrix its own.
    let col_max = n.abs()?.sum_keepdim(D::Minus2)?.max_keepdim(D::Minus1)?;
    let mut z = n.t()?.broadcast_div(&col_max)?;
    for _ in 0..steps {
        let y = n.matmul(&z)?;
        let t = (&eye * 7.0)?.broadcast_sub(&y)?;
        let t = (&eye * 15.0)?.broadcast_sub(&y.matmul(&t)?)?;
        let t = (&eye * 13.0)?.broadcast_sub(&y.matmul(&t)?)?;
        z = (z.matmul(&t)? * 0.25)?;
    }
    Ok(z)
}

/// Moore–Penrose pseudo-inverse of a symmetric matrix from its eigen-decomposition in f64,
/// dropping eigenvalues with |λ| ≤ `rel_cutoff`·max|λ|.
pub fn symmetric_pinv(m: &DMatrix<f64>, rel_cutoff: f64) -> DMatrix<f64> {
    let sym = (m + m.transpose()) * 0.5; // exact symmetry for the solver
    let eig = nalgebra::SymmetricEigen::new(sym);
    let lmax = eig.eigenvalues.iter().fold(0.0f64, |a, &b| a.max(b.abs()));
    let cut = rel_cutoff * lmax;
    let inv: Vec<f64> = eig
        .eigenvalues
        .iter()
        .map(|&l| {
            if l.abs() > cut && l.abs() > 0.0 {
                1.0 / l
            } else {
                0.0
            }
        })
        .collect();
    let u = &eig.eigenvectors;
    let mut scaled = u.clone();
    for (j, &w) in inv.iter().enumerate() {
        scaled.column_mut(j).scale_mut(w);
    }
    scaled * u.transpose()
}

/// [`symmetric_pinv`] of the row-major d×d matrix `m` by faer's eigen-solver (the device path's
/// batches of cores: 3× nalgebra's speed at d = 256), row-major. The same semantics (the average of
/// m and mᵀ, eigenvalues with |λ| ≤ `rel_cutoff`·max|λ| dropped); the two agree to rounding
/// except where an eigenvalue lies at the cut-off within the solvers' rounding.
pub fn symmetric_pinv_faer(m: &[f64], d: usize, rel_cutoff: f64) -> Result<Vec<f64>> {
    use faer::{Mat, Side};
    let sym = Mat::<f64>::from_fn(d, d, |i, j| 0.5 * (m[i * d + j] + m[j * d + i]));
    let eig = sym
        .as_ref()
        .self_adjoint_eigen(Side::Lower)
        .map_err(|e| anyhow::anyhow!("symmetric eigen-decomposition of a {d}×{d} core: {e:?}"))?;
    let (u, s) = (eig.U(), eig.S().column_vector());
    let lmax = (0..d).fold(0.0f64, |a, i| a.max(s[i].abs()));
    let cut = rel_cutoff * lmax;
    let inv: Vec<f64> = (0..d)
        .map(|i| {
            let l = s[i];
            if l.abs() > cut && l.abs() > 0.0 {
                1.0 / l
            } else {
                0.0
            }
        })
        .collect();
    // U·diag(1/λ)·Uᵀ
    let scaled = Mat::<f64>::from_fn(d, d, |i, j| u[(i, j)] * inv[j]);
    let w = &scaled * u.transpose();
    let mut out = Vec::with_capacity(d * d);
    for i in 0..d {
        for j in 0..d {
            out.push(w[(i, j)]);
        }
    }
    Ok(out)
}

/// [`symmetric_pinv`] of a device tensor: computed on the host in f64, returned in f64 on the
/// tensor's device.
pub fn symmetric_pinv_tensor(m: &Tensor, rel_cutoff: f64) -> Result<Tensor> {
    let host = crate::tensor_util::to_dmatrix(m)?;
    crate::tensor_util::from_dmatrix(&symmetric_pinv(&host, rel_cutoff), m.device(), DType::F64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor_util::test_device;
    use crate::tensor_util::{from_dmatrix, to_dmatrix};
    use rand::{Rng, SeedableRng};

    #[test]
    fn faer_pseudo_inverse_matches_nalgebra_on_rank_deficient_cores() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        // PSD of rank 40 in dimension d (eigenvalues at zero dropped by the cut-off), and a
        // full-rank one; asymmetric by rounding as a device's product would leave it.
        for (d, rank) in [(64, 40), (130, 130), (256, 64)] {
            let x = DMatrix::from_fn(d, rank, |_, _| rng.random::<f64>() - 0.5);
            let mut m = &x * x.transpose();
            m[(0, 1)] += 1e-13;
            let want = symmetric_pinv(&m, PINV_REL_CUTOFF);
            let row_major: Vec<f64> = (0..d * d).map(|k| m[(k / d, k % d)]).collect();
            let got = symmetric_pinv_faer(&row_major, d, PINV_REL_CUTOFF).unwrap();
            let scale = want.iter().fold(0.0f64, |a, &b| a.max(b.abs()));
            let worst =
                (0..d * d).fold(0.0f64, |a, k| a.max((got[k] - want[(k / d, k % d)]).abs()));
            assert!(
                worst <= 1e-9 * scale,
                "d = {d}, rank {rank}: {worst:e} of {scale:e}"
            );
            // The defining property: M·M⁺·M = M.
            let p = DMatrix::from_row_slice(d, d, &got);
            let back = &m * &p * &m;
            let err = (&back - &m).abs().max();
            assert!(
                err <= 1e-9 * m.abs().max(),
                "d = {d}: M M⁺ M off by {err:e}"
            );
        }
    }

    #[test]
    fn iterative_inverse_converges_on_row_stochastic_matrix() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        let d = 16;
        // A diagonally dominant row-stochastic matrix (well conditioned).
        let mut a = DMatrix::from_fn(d, d, |_, _| rng.random::<f64>());
        for i in 0..d {
            a[(i, i)] += d as f64;
        }
        for i in 0..d {
            let s: f64 = a.row(i).sum();
            a.row_mut(i).scale_mut(1.0 / s);
        }
        let t = from_dmatrix(&a, &test_device(), DType::F64).unwrap();
        let z = to_dmatrix(&iterative_inverse(&t, 6).unwrap()).unwrap();
        let resid = (&a * &z - DMatrix::identity(d, d)).norm();
        assert!(resid < 1e-10, "residual {resid}");
        // The error contracts cubically: E_{t+1} = ¾E³ + ¼E⁴, so 2 steps leave a larger residual.
        let z2 = to_dmatrix(&iterative_inverse(&t, 2).unwrap()).unwrap();
        let resid2 = (&a * &z2 - DMatrix::identity(d, d)).norm();
        assert!(resid2 > resid);
    }

    #[test]
    fn pinv_satisfies_penrose_conditions_on_singular_psd() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let b = DMatrix::from_fn(10, 4, |_, _| rng.random::<f64>() - 0.5);
        let m = &b * b.transpose(); // rank 4, 10×10
        let p = symmetric_pinv(&m, PINV_REL_CUTOFF);
        assert!((&m * &p * &m - &m).norm() < 1e-10 * m.norm());
        assert!((&p * &m * &p - &p).norm() < 1e-8 * p.norm());
        // Full rank: the pseudo-inverse is the inverse.
        let f = &m + DMatrix::identity(10, 10);
        let pf = symmetric_pinv(&f, PINV_REL_CUTOFF);
        assert!((&f * &pf - DMatrix::identity(10, 10)).norm() < 1e-10);
    }
}
