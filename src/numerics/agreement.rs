//! The literature's agreement measures between O and Ô (docs/reference.md §8.5; SageAttention2 App. A.7,
//! `thu-ml/SpargeAttn`'s `precision_metric`), on one head's flattened n×p output, in f64:
//! `cos_sim` = ⟨O, Ô⟩/(‖O‖_F‖Ô‖_F), `rel_l1` = Σ|O − Ô|/Σ|O|, `rmse` = √(mean (O − Ô)²). Papers
//! flatten every head and layer into one vector; these are per head (a summary's mean over heads
//! is the comparable figure).

use anyhow::Result;
use candle_core::{DType, Tensor};

/// `err / norm`, a relative error, defined where the target is zero (‖O‖ = 0, e.g. an all-zero
/// V, issue 44): 0 when the error is 0 too (Ô = O), +∞ otherwise, never the NaN of 0/0 that
/// would drop the trial from the means without a word.
pub fn relative(err: f64, norm: f64) -> f64 {
    if norm == 0.0 && err == 0.0 {
        0.0
    } else {
        err / norm
    }
}

/// ⟨O, Ô⟩/(‖O‖‖Ô‖) from the inner product and the squared norms, defined where a norm is zero:
/// 1 when both outputs are zero (they are equal), 0 when only one is (nothing in common).
fn cosine(dot: f64, oo: f64, aa: f64) -> f64 {
    match (oo == 0.0, aa == 0.0) {
        (true, true) => 1.0,
        (true, false) | (false, true) => 0.0,
        (false, false) => dot / (oo.sqrt() * aa.sqrt()),
    }
}

/// cos_sim, rel_l1 and rmse of one trial.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Agreement {
    pub cos_sim: f64,
    pub rel_l1: f64,
    pub rmse: f64,
}

/// The agreement of `approx` with `exact` (same shape, any dtype, on any device): six sums in f64
/// on the tensors' device, one copy of six numbers to the host. Non-finite Ô gives NaN measures.
pub fn agreement(exact: &Tensor, approx: &Tensor) -> Result<Agreement> {
    let o = exact.to_dtype(DType::F64)?.flatten_all()?;
    let a = approx.to_dtype(DType::F64)?.flatten_all()?;
    if o.device().is_cpu() && a.device().is_cpu() {
        return Ok(host_agreement(&o.to_vec1()?, &a.to_vec1()?));
    }
    device_agreement(&o, &a)
}

/// [`agreement`] of flat f64 tensors by tensor operations on their device.
fn device_agreement(o: &Tensor, a: &Tensor) -> Result<Agreement> {
    let e = (o - a)?;
    let sums = Tensor::stack(
        &[
            (o * a)?.sum_all()?,
            o.sqr()?.sum_all()?,
            a.sqr()?.sum_all()?,
            e.abs()?.sum_all()?,
            o.abs()?.sum_all()?,
            e.sqr()?.sum_all()?,
        ],
        0,
    )?
    .to_vec1::<f64>()?;
    let count = o.elem_count() as f64;
    Ok(Agreement {
        cos_sim: cosine(sums[0], sums[1], sums[2]),
        rel_l1: relative(sums[3], sums[4]),
        rmse: (sums[5] / count).sqrt(),
    })
}

/// [`agreement`] on the host in one pass: the same six f64 sums, each in element order from 0 as
/// candle's sequential f64 reduction adds them, so the measures keep their bits (a test checks)
/// without the twelve whole-tensor temporaries of the device form (a sweep measures every trial:
/// at n = 1024 those took a tenth of Figure 1's workload).
fn host_agreement(o: &[f64], a: &[f64]) -> Agreement {
    let mut sums = [0.0f64; 6];
    for (&x, &y) in o.iter().zip(a) {
        let e = x - y;
        sums[0] += x * y;
        sums[1] += x * x;
        sums[2] += y * y;
        sums[3] += e.abs();
        sums[4] += x.abs();
        sums[5] += e * e;
    }
    Agreement {
        cos_sim: cosine(sums[0], sums[1], sums[2]),
        rel_l1: relative(sums[3], sums[4]),
        rmse: (sums[5] / o.len() as f64).sqrt(),
    }
}

/// [`agreement`] of each head of a batch: `exact` and `approx` [B, ...] (same shape), the six sums
/// of every head at once in f64 on the tensors' device and one copy of 6·B numbers to the host (a
/// device sweep's metric for all heads of a method at one d, instead of B rounds of small kernels
/// and copies).
pub fn agreement_heads(exact: &Tensor, approx: &Tensor) -> Result<Vec<Agreement>> {
    let b = exact.dim(0)?;
    let o = exact.to_dtype(DType::F64)?.reshape((b, ()))?;
    let a = approx.to_dtype(DType::F64)?.reshape((b, ()))?;
    let e = (&o - &a)?;
    let sums = Tensor::stack(
        &[
            (&o * &a)?.sum(1)?,
            o.sqr()?.sum(1)?,
            a.sqr()?.sum(1)?,
            e.abs()?.sum(1)?,
            o.abs()?.sum(1)?,
            e.sqr()?.sum(1)?,
        ],
        0,
    )?
    .to_vec2::<f64>()?;
    let count = o.dim(1)? as f64;
    Ok((0..b)
        .map(|i| Agreement {
            cos_sim: cosine(sums[0][i], sums[1][i], sums[2][i]),
            rel_l1: relative(sums[3][i], sums[4][i]),
            rmse: (sums[5][i] / count).sqrt(),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor_util::test_device;

    #[test]
    fn batched_heads_agree_with_each_head_alone() {
        let dev = test_device();
        let o = Tensor::new(
            &[[[1f64, 2.0], [3.0, -4.0]], [[0.5, -1.0], [2.0, 0.25]]],
            &dev,
        )
        .unwrap();
        let a = Tensor::new(
            &[[[1.5f64, 2.0], [2.0, -4.0]], [[0.5, -1.5], [1.0, 0.75]]],
            &dev,
        )
        .unwrap();
        let batched = agreement_heads(&o, &a).unwrap();
        assert_eq!(batched.len(), 2);
        for (i, got) in batched.iter().enumerate() {
            let want = agreement(&o.get(i).unwrap(), &a.get(i).unwrap()).unwrap();
            for (g, w) in [
                (got.cos_sim, want.cos_sim),
                (got.rel_l1, want.rel_l1),
                (got.rmse, want.rmse),
            ] {
                assert!(
                    (g - w).abs() <= 1e-15 * w.abs().max(1.0),
                    "head {i}: {g} vs {w}"
                );
            }
        }
    }

    /// The host's one pass gives the device form's bits: the same products, each sum in element
    /// order (a trials.csv row does not change with the path).
    #[test]
    fn the_host_pass_equals_the_tensor_operations_bit_for_bit() {
        use crate::numerics::sampling::{normal_values, TrialRng};
        use rand::SeedableRng;
        let mut rng = TrialRng::seed_from_u64(5);
        let dev = candle_core::Device::Cpu;
        let o = Tensor::from_vec(normal_values(&mut rng, 1024, 64, 1.0), 65536, &dev).unwrap();
        let a = (&o
            + Tensor::from_vec(normal_values(&mut rng, 1024, 64, 0.1), 65536, &dev).unwrap())
        .unwrap();
        let host = host_agreement(&o.to_vec1().unwrap(), &a.to_vec1().unwrap());
        assert_eq!(host, device_agreement(&o, &a).unwrap());
        assert_eq!(host, agreement(&o, &a).unwrap());
        assert!(host.cos_sim > 0.99 && host.cos_sim < 1.0 && host.rmse > 0.05);
    }

    /// Where O = 0 (an all-zero V) the measures are defined, not 0/0: equal outputs agree
    /// fully, a non-zero Ô has no relative agreement with a zero target.
    #[test]
    fn a_zero_target_gives_defined_measures() {
        let dev = test_device();
        let zero = Tensor::zeros((2, 2), DType::F64, &dev).unwrap();
        let same = agreement(&zero, &zero).unwrap();
        assert_eq!((same.cos_sim, same.rel_l1, same.rmse), (1.0, 0.0, 0.0));
        let o = Tensor::new(&[[1f64, 2.0], [3.0, -4.0]], &dev).unwrap();
        let off = agreement(&zero, &o).unwrap();
        assert_eq!((off.cos_sim, off.rel_l1), (0.0, f64::INFINITY));
        assert_eq!(agreement(&o, &zero).unwrap().cos_sim, 0.0);
        let batched = agreement_heads(&zero.unsqueeze(0).unwrap(), &zero.unsqueeze(0).unwrap());
        assert_eq!(batched.unwrap()[0].cos_sim, 1.0);
        assert_eq!(relative(0.0, 0.0), 0.0);
        assert_eq!(relative(1.0, 0.0), f64::INFINITY);
        assert!(relative(f64::NAN, 0.0).is_nan());
    }

    #[test]
    fn closed_forms_on_small_matrices() {
        let dev = test_device();
        let o = Tensor::new(&[[1f64, 2.0], [3.0, -4.0]], &dev).unwrap();
        let same = agreement(&o, &o).unwrap();
        assert!((same.cos_sim - 1.0).abs() < 1e-15);
        assert_eq!((same.rel_l1, same.rmse), (0.0, 0.0));
        // Ô = 2O: cos 1, Σ|O − Ô| = Σ|O| → rel_l1 1, rmse = √(Σ o²/4) = √(30/4).
        let twice = agreement(&o, &(&o * 2.0).unwrap()).unwrap();
        assert!((twice.cos_sim - 1.0).abs() < 1e-15);
        assert!((twice.rel_l1 - 1.0).abs() < 1e-15);
        assert!((twice.rmse - (30f64 / 4.0).sqrt()).abs() < 1e-15);
        // An orthogonal Ô: ⟨O, Ô⟩ = 1·2 + 2·(−1) + 3·4 + (−4)·3 = 0.
        let orth = Tensor::new(&[[2f64, -1.0], [4.0, 3.0]], &dev).unwrap();
        let g = agreement(&o, &orth).unwrap();
        assert!(g.cos_sim.abs() < 1e-15);
        // Σ|O − Ô| = 1 + 3 + 1 + 7 = 12 over Σ|O| = 10; Σ(O − Ô)² = 1 + 9 + 1 + 49 = 60.
        assert!((g.rel_l1 - 1.2).abs() < 1e-15);
        assert!((g.rmse - 15f64.sqrt()).abs() < 1e-15);
        // f32 Ô is widened exactly.
        let f = agreement(&o, &o.to_dtype(DType::F32).unwrap()).unwrap();
        assert_eq!(f.rmse, 0.0);
    }

    #[test]
    fn non_finite_output_gives_nan() {
        let dev = test_device();
        let o = Tensor::new(&[[1f64, 2.0]], &dev).unwrap();
        let bad = Tensor::new(&[[f64::NAN, 2.0]], &dev).unwrap();
        let g = agreement(&o, &bad).unwrap();
        assert!(g.cos_sim.is_nan() && g.rel_l1.is_nan() && g.rmse.is_nan());
    }
}
