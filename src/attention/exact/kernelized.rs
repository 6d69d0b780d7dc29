//! The kernelized target of docs/reference.md §6.4.1 (O_C = C·V, C_ij = exp(−‖q̃_i − k̃_j‖²/2)), computed
//! by the row blocks of the softmax target. It lives with the exact kernels, below the target's
//! declarations (`target.rs` holds what a run names, no computation).

use anyhow::Result;
use candle_core::{DType, Tensor, D};

use super::map_score_blocks;

/// O_C = C·V ([n, p]) computed in `dtype` in the expanded form of docs/reference.md §6.4.1: per row block,
/// one GEMM Q̃_b·K̃ᵀ, the rank-one correction −‖q̃_i‖²/2 − ‖k̃_j‖²/2, exp, and the product with V.
/// No shift is needed: every exponent is −‖q̃_i − k̃_j‖²/2 ≤ 0 up to rounding, so every entry
/// of C lies in (0, 1]. Never holds an n×n matrix (row blocks as for the softmax target).
pub fn kernelized_output(q: &Tensor, k: &Tensor, v: &Tensor, dtype: DType) -> Result<Tensor> {
    let p = q.dims2()?.1;
    let s = (p as f64).powf(-0.25);
    let qt = (q.to_dtype(dtype)? * s)?;
    let kt = (k.to_dtype(dtype)? * s)?;
    let v = v.to_dtype(dtype)?;
    let half_sq = |x: &Tensor| -> Result<Tensor> { Ok((x.sqr()?.sum_keepdim(D::Minus1)? * 0.5)?) };
    let q_half = half_sq(&qt)?; // n×1
    let k_half = half_sq(&kt)?.t()?.contiguous()?; // 1×n
    let k_transposed = kt.t()?.contiguous()?;
    map_score_blocks(&qt, &k_transposed, |start, len, s| {
        let logits = s
            .broadcast_sub(&q_half.narrow(0, start, len)?)?
            .broadcast_sub(&k_half)?;
        Ok(logits.exp()?.matmul(&v)?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::test_util::gauss;
    use crate::numerics::sampling::TrialRng;
    use crate::tensor_util::{from_dmatrix, test_device, to_dmatrix};
    use nalgebra::DMatrix;
    use rand::SeedableRng;

    /// C·V entry by entry from the definition exp(−‖q̃_i − k̃_j‖²/2) (the distance form, not the
    /// expanded one the product uses).
    fn by_definition(q: &DMatrix<f64>, k: &DMatrix<f64>, v: &DMatrix<f64>) -> DMatrix<f64> {
        let (n, p) = q.shape();
        let s = (p as f64).powf(-0.25);
        let c = DMatrix::from_fn(n, k.nrows(), |i, j| {
            let d2 = (q.row(i) * s - k.row(j) * s).norm_squared();
            (-d2 / 2.0).exp()
        });
        c * v
    }

    #[test]
    fn kernelized_output_is_c_times_v_by_definition() {
        // n above one row block (block_rows(n) = 1024·1024/n ≥ 256) is not needed for the blocks to
        // be exercised: the closure's row offsets are checked by n = 300 with a 256-row block floor.
        let mut rng = TrialRng::seed_from_u64(3);
        let (n, p) = (300, 16);
        let (q, k, v) = (
            gauss(&mut rng, n, p, 1.0),
            gauss(&mut rng, n, p, 1.0),
            gauss(&mut rng, n, p, 1.0),
        );
        let want = by_definition(&q, &k, &v);
        let dev = test_device();
        let t = |m: &DMatrix<f64>| from_dmatrix(m, &dev, DType::F64).unwrap();
        let got =
            to_dmatrix(&kernelized_output(&t(&q), &t(&k), &t(&v), DType::F64).unwrap()).unwrap();
        let rel = (&got - &want).abs().max() / want.abs().max();
        assert!(rel < 1e-12, "{rel}");
        // In f32 the same product carries f32 rounding only.
        let got32 = to_dmatrix(
            &kernelized_output(&t(&q), &t(&k), &t(&v), DType::F32)
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap(),
        )
        .unwrap();
        let rel32 = (&got32 - &want).abs().max() / want.abs().max();
        assert!(rel32 < 1e-5, "{rel32}");
    }

    #[test]
    fn identical_query_and_key_give_kernel_one() {
        // q = k for one pair: C_ii = exp(0) = 1 exactly in the distance form; the expanded form
        // gives 1 up to rounding. With V = e_0 the entry is visible directly.
        let dev = test_device();
        let x = Tensor::new(&[[0.3f64, -1.2, 2.0, 0.5]], &dev).unwrap();
        let v = Tensor::new(&[[1.0f64, 0.0]], &dev).unwrap();
        let o = kernelized_output(&x, &x, &v, DType::F64).unwrap();
        let o: Vec<Vec<f64>> = o.to_vec2().unwrap();
        assert!((o[0][0] - 1.0).abs() < 1e-15 && o[0][1] == 0.0, "{o:?}");
    }
}
