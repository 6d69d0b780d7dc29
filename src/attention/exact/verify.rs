//! A target is what every trial of its head is divided by and compared with, so a wrong one
//! silently spoils a whole head's rows (issue 21: a device race gave 72 trials a wrong exact
//! target and no error). Before a head's trials are scored, a sample of the target's rows is
//! recomputed on the host in f64 from the head's own Q, K, V (its definition, written out
//! independently of the products that computed it) and a difference beyond rounding stops the
//! run with an error, instead of writing rows.
//!
//! The sample is row 0, row n − 1 and one row in every 256, so a corrupted row block of either
//! product path (256 rows or more) is always hit; the cost is 2·n·p MACs per sampled row (n = 4096:
//! 18 rows, under 1 % of exact attention).

use anyhow::{bail, Result};
use candle_core::{DType, Tensor};

use crate::attention::target::Mask;
use crate::attention::Target;

/// Sampled rows every this many rows.
const STRIDE: usize = 256;

/// The rows checked for a head of n rows: 0, n − 1, and one row per stretch of [`STRIDE`] rows (at
/// a position that moves within the stretch, so that the check is not blind to one offset).
pub fn sampled_rows(n: usize) -> Vec<usize> {
    let mut rows: Vec<usize> = (0..n.div_ceil(STRIDE))
        .map(|b| (b * STRIDE + (b * 97) % STRIDE).min(n - 1))
        .collect();
    rows.push(0);
    rows.push(n.saturating_sub(1));
    rows.sort_unstable();
    rows.dedup();
    rows
}

fn host_rows(t: &Tensor) -> Result<Vec<Vec<f64>>> {
    Ok(t.to_dtype(DType::F64)?.to_vec2::<f64>()?)
}

/// Checks `output` ([n, p], any dtype, any device) against `target` of q, k, v ([n, p] each) on
/// the sampled rows: |o_ic − ô_ic| ≤ tol · Σ_j |w_ij| · max_j |v_jc|, with tol 1e-4 for f32 and
/// 1e-9 for f64 results (the f32 path's measured error is under 2e-6 of max |O|).
pub fn check_target_rows(
    target: Target,
    mask: Mask,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    output: &Tensor,
) -> Result<()> {
    let (n, p) = q.dims2()?;
    let tol = if output.dtype() == DType::F64 && q.dtype() == DType::F64 {
        1e-9
    } else {
        1e-4
    };
    let (q, k, v) = (host_rows(q)?, host_rows(k)?, host_rows(v)?);
    let rows = sampled_rows(n);
    let mut got = Vec::with_capacity(rows.len());
    for &i in &rows {
        got.push(host_rows(&output.narrow(0, i, 1)?)?.remove(0));
    }
    let vmax: Vec<f64> = (0..v[0].len())
        .map(|c| v.iter().fold(0.0f64, |m, r| m.max(r[c].abs())))
        .collect();
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    for (&i, o) in rows.iter().zip(&got) {
        // Keys the row attends to: all, or 0..=i under the causal mask.
        let k = &k[..if mask == Mask::Causal { i + 1 } else { k.len() }];
        let weights: Vec<f64> = match target {
            Target::Softmax => {
                let s: Vec<f64> = k
                    .iter()
                    .map(|kj| dot(&q[i], kj) / (p as f64).sqrt())
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                e.iter().map(|x| x / z).collect()
            }
            // C_ij = exp(−‖q̃_i − k̃_j‖²/2), q̃ = q·p^-1/4 (METHODS.md §6.4.1).
            Target::Kernelized => {
                let s2 = 1.0 / (p as f64).sqrt();
                k.iter()
                    .map(|kj| {
                        let d2: f64 = q[i].iter().zip(kj).map(|(a, b)| (a - b) * (a - b)).sum();
                        (-d2 * s2 / 2.0).exp()
                    })
                    .collect()
            }
        };
        let mass: f64 = weights.iter().map(|w| w.abs()).sum();
        for c in 0..vmax.len() {
            let want: f64 = weights.iter().zip(&v).map(|(w, vj)| w * vj[c]).sum();
            let bound = tol * mass * vmax[c];
            // False for a NaN as well as for a difference beyond the bound.
            let within = (o[c] - want).abs() <= bound;
            if !within {
                bail!(
                    "the exact {} target is wrong at row {i}, column {c}: {} where a float64 \
                     recomputation from the same Q, K, V gives {want} (allowed difference {bound:.3e}). \
                     The device produced a wrong result; no row of this head was written. Rerun with \
                     --device cpu, and report the device, driver and command",
                    match target {
                        Target::Softmax => "softmax",
                        Target::Kernelized => "kernelized",
                    },
                    o[c]
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::exact::ExactAttention;
    use crate::numerics::sampling::{normal_values, TrialRng};
    use crate::tensor_util::{from_f64, test_device};
    use rand::SeedableRng;

    #[test]
    fn sampled_rows_hit_every_block_of_256_and_both_ends() {
        for n in [1, 5, 255, 256, 257, 1000, 4096] {
            let rows = sampled_rows(n);
            assert_eq!(rows[0], 0);
            assert_eq!(*rows.last().unwrap(), n - 1);
            for b in 0..n.div_ceil(256) {
                assert!(
                    rows.iter().any(|&r| r / 256 == b),
                    "n = {n}: no row in block {b}"
                );
            }
        }
    }

    /// A right target passes; the same target with one row block overwritten (what the race of
    /// issue 21 did) fails, for both targets and both dtypes.
    #[test]
    fn a_corrupted_row_block_is_caught_and_a_right_target_passes() {
        let (n, p) = (700, 16);
        let dev = test_device();
        let mut rng = TrialRng::seed_from_u64(3);
        let mut mk = |std: f64, dt: DType| {
            from_f64(normal_values(&mut rng, n, p, std), (n, p), &dev, dt).unwrap()
        };
        for dt in [DType::F32, DType::F64] {
            let (q, k, v) = (mk(0.9, dt), mk(0.9, dt), mk(1.0, dt));
            for target in [Target::Softmax, Target::Kernelized] {
                let out = match target {
                    Target::Softmax => ExactAttention::compute(&q, &k, &v).unwrap().output,
                    Target::Kernelized => {
                        crate::attention::target::kernelized_output(&q, &k, &v, DType::F64).unwrap()
                    }
                };
                check_target_rows(target, Mask::None, &q, &k, &v, &out).unwrap();
                // Rows 256..512 replaced by rows 0..256 of another head's output (stale data).
                let other = out.narrow(0, 0, 256).unwrap().affine(1.01, 0.0).unwrap();
                let bad = Tensor::cat(
                    &[
                        out.narrow(0, 0, 256).unwrap(),
                        other,
                        out.narrow(0, 512, n - 512).unwrap(),
                    ],
                    0,
                )
                .unwrap();
                let err = check_target_rows(target, Mask::None, &q, &k, &v, &bad).unwrap_err();
                assert!(format!("{err}").contains("is wrong at row"), "{err}");
                if target == Target::Softmax {
                    // The causal target passes its own check and fails the bidirectional one.
                    let causal = ExactAttention::compute_masked(&q, &k, &v, Mask::Causal)
                        .unwrap()
                        .output;
                    check_target_rows(target, Mask::Causal, &q, &k, &v, &causal).unwrap();
                    assert!(check_target_rows(target, Mask::None, &q, &k, &v, &causal).is_err());
                }
            }
        }
    }
}
