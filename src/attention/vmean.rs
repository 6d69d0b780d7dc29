//! V-Mean, Skeinformer's artificial baseline (Skeinformer §5; docs/reference.md §2.1):
//! Ô = (1/n)·1·1ᵀV, every row the column mean of V. Independent of d.
//!
//! Under the causal mask (docs/reference.md §7.4) the same baseline — uniform attention over the keys a
//! row may see — is the prefix mean Ô_i = (1/(i+1)) Σ_{j≤i} v_j; on a sliding layer of W
//! (§7.7.6) the mean over the window, (1/min(i+1, W)) Σ_{i−W<j≤i} v_j. The scale and a soft-cap
//! do not reach it, and a sink's damping stays in its error (it reads no attention).

use anyhow::Result;

use candle_core::{DType, Tensor};

use super::{Approximation, Family, HeadInputs, Mask, Method, MethodInfo};
use crate::numerics::sampling::TrialRng;

pub struct VMean;

const V_MEAN: MethodInfo = MethodInfo {
    id: "vmean",
    family: Family::Reference,
    meaning: "ignored: every row of Ô is mean(V)",
    random: false,
    masks: MethodInfo::BOTH_MASKS,
    spec: super::SpecFeatures::ALL,
    ..MethodInfo::BASE
};

impl Method for VMean {
    fn approximate(&self, head: &HeadInputs, _: usize, _: &mut TrialRng) -> Result<Approximation> {
        let v = &head.v;
        if head.mask == Mask::Causal {
            // Prefix sums in f64 (a long prefix summed in f32 drifts), then / (i + 1).
            let n = head.n();
            let mut sums = prefix_sums(&v.to_dtype(DType::F64)?)?;
            let counts = match head.spec.window_within(n) {
                None => Tensor::arange(1.0f64, n as f64 + 1.0, v.device())?,
                Some(w) => {
                    // Row i's window sum is S_i − S_{i−W}: the prefix sums shifted down W rows.
                    let before = Tensor::cat(
                        &[
                            &Tensor::zeros((w, sums.dim(1)?), DType::F64, v.device())?,
                            &sums.narrow(0, 0, n - w)?,
                        ],
                        0,
                    )?;
                    sums = (sums - before)?;
                    let c: Vec<f64> = (0..n).map(|i| (i + 1).min(w) as f64).collect();
                    Tensor::from_vec(c, n, v.device())?
                }
            }
            .unsqueeze(1)?;
            return Ok(Approximation::plain(
                sums.broadcast_div(&counts)?.to_dtype(v.dtype())?,
            ));
        }
        let mean = v.mean_keepdim(0)?; // 1ᵀV / n
        Ok(Approximation::plain(
            mean.broadcast_as(v.shape())?.contiguous()?,
        ))
    }
    fn macs(&self, n: usize, p: usize, _d: usize) -> f64 {
        (n * p) as f64
    }
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(&V_MEAN)
    }
}

/// Rows per block of [`prefix_sums`].
const PREFIX_BLOCK: usize = 256;

/// Σ_{j≤i} x_j for every row i of x ([n, p]), on x's device, in blocks of rows: a lower-triangular
/// b×b product within a block plus the carry of the blocks before. candle's `cumsum` multiplies by
/// an n×n triangular matrix (n²p work and an n×n buffer: 1.4 s and 512 MB at n = 8192).
fn prefix_sums(x: &Tensor) -> Result<Tensor> {
    let (n, p) = x.dims2()?;
    let b = PREFIX_BLOCK.min(n.max(1));
    let tri = crate::tensor_util::triangle(b, 1.0, 0.0, x.device(), x.dtype())?;
    let mut carry = Tensor::zeros((1, p), x.dtype(), x.device())?;
    let mut outs = Vec::with_capacity(n.div_ceil(b));
    for start in (0..n).step_by(b) {
        let len = b.min(n - start);
        // The last block's corner of the triangle is a strided view: contiguous for CUDA's
        // matmul, which takes no such lhs (the CPU's does).
        let local = tri
            .narrow(0, 0, len)?
            .narrow(1, 0, len)?
            .contiguous()?
            .matmul(&x.narrow(0, start, len)?)?;
        let block = local.broadcast_add(&carry)?;
        carry = block.narrow(0, len - 1, 1)?;
        outs.push(block);
    }
    Ok(Tensor::cat(&outs, 0)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor_util::test_device;
    use candle_core::Tensor;
    use rand::SeedableRng;

    #[test]
    fn every_row_is_the_mean_and_equals_uniform_attention() {
        let dev = test_device();
        let v = Tensor::new(&[[1f64, 2.0], [3.0, 6.0], [5.0, 10.0]], &dev).unwrap();
        // Q = 0 makes softmax uniform, so exact attention equals V-Mean exactly.
        let q = Tensor::zeros((3, 2), candle_core::DType::F64, &dev).unwrap();
        let head = HeadInputs::new(q.clone(), q, v).unwrap();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let out = VMean.approximate(&head, 16, &mut rng).unwrap().output;
        assert_eq!(out.to_vec2::<f64>().unwrap(), vec![vec![3.0, 6.0]; 3]);
        let err =
            crate::numerics::spectral::error_norms(&head.exact().unwrap().output, &out).unwrap();
        assert!(err.spectral < 1e-12);
    }

    /// The causal form equals uniform attention over j ≤ i, computed entry by entry in f64.
    #[test]
    fn causal_form_is_the_prefix_mean() {
        use crate::numerics::sampling::{normal_values, TrialRng};
        let (n, p) = (600, 5); // three blocks of prefix sums, the last one short
        let mut rng = TrialRng::seed_from_u64(4);
        let vals = normal_values(&mut rng, n, p, 1.0);
        let v =
            crate::tensor_util::from_f64(vals.clone(), (n, p), &test_device(), DType::F32).unwrap();
        let head = HeadInputs::masked(v.clone(), v.clone(), v, Mask::Causal).unwrap();
        let got = crate::attention::test_util::out_rows(&VMean, &head, 8, 0);
        for i in [0, 1, 17, 255, 256, 257, 511, 512, n - 1] {
            for c in 0..p {
                let want = (0..=i).map(|j| vals[j * p + c]).sum::<f64>() / (i + 1) as f64;
                assert!(
                    (got[i][c] - want).abs() < 1e-6,
                    "row {i}: {} vs {want}",
                    got[i][c]
                );
            }
        }
    }

    /// On a sliding layer (W = 300 of n = 600, with a cap and a sink, which it ignores): the mean
    /// of the last min(i + 1, W) values.
    #[test]
    fn a_sliding_layers_form_is_the_window_mean() {
        use crate::numerics::sampling::{normal_values, TrialRng};
        let (n, p, w) = (600, 5, 300);
        let vals = normal_values(&mut TrialRng::seed_from_u64(5), n, p, 1.0);
        let v =
            crate::tensor_util::from_f64(vals.clone(), (n, p), &test_device(), DType::F64).unwrap();
        let spec = crate::attention::AttentionSpec::causal(p, Some(w))
            .with_softcap(Some(5.0))
            .with_sinks(Some(vec![0.3]));
        let head = HeadInputs::with_spec(v.clone(), v.clone(), v, spec).unwrap();
        let got = crate::attention::test_util::out_rows(&VMean, &head, 8, 0);
        for i in [0, 1, 298, 299, 300, 301, 511, n - 1] {
            let lo = (i + 1).saturating_sub(w);
            for c in 0..p {
                let want = (lo..=i).map(|j| vals[j * p + c]).sum::<f64>() / (i + 1 - lo) as f64;
                assert!(
                    (got[i][c] - want).abs() < 1e-12,
                    "row {i}: {} vs {want}",
                    got[i][c]
                );
            }
        }
    }
}
