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

use crate::attention::spec::AttentionSpec;
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

/// A tensor's values on the host, as they left the device (an f32 tensor as f32: half the bytes).
enum HostValues {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

impl HostValues {
    fn of(t: &Tensor) -> Result<Self> {
        let t = t.flatten_all()?;
        Ok(match t.dtype() {
            DType::F32 => Self::F32(t.to_vec1::<f32>()?),
            _ => Self::F64(t.to_dtype(DType::F64)?.to_vec1::<f64>()?),
        })
    }

    /// Values `range` in f64.
    fn f64s(&self, range: std::ops::Range<usize>) -> Vec<f64> {
        match self {
            Self::F32(v) => v[range].iter().map(|&x| f64::from(x)).collect(),
            Self::F64(v) => v[range].to_vec(),
        }
    }
}

/// Checks `output` ([n, p], any dtype, any device) against `target` of q, k, v ([n, p] each) on
/// the sampled rows: |o_ic − ô_ic| ≤ tol · Σ_j |w_ij| · max_j |v_jc|, with tol 1e-4 for f32 and
/// 1e-9 for f64 results (the f32 path's measured error is under 2e-6 of max |O|).
pub fn check_target_rows(
    target: Target,
    spec: &AttentionSpec,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    output: &Tensor,
) -> Result<()> {
    let one = |t: &Tensor| t.unsqueeze(0);
    TargetCheck::gather(&one(q)?, &one(k)?, &one(v)?, &one(output)?)?.verify(target, spec, None)
}

/// What the check of a batch of heads reads, on the host: their K and V, and the sampled rows of
/// their Q and of the output under test. Gathered on the thread that issues the device's work
/// ([`TargetCheck::gather`]: each tensor leaves the device once), then verified on any host
/// thread ([`TargetCheck::verify`]), e.g. beside the device while it runs the methods.
pub struct TargetCheck {
    heads: usize,
    n: usize,
    p: usize,
    /// p_v, V's and the output's columns (≠ p for MLA).
    pv: usize,
    /// The sampled rows ([`sampled_rows`]).
    rows: Vec<usize>,
    q_rows: HostValues,
    k: HostValues,
    v: HostValues,
    out_rows: HostValues,
    /// f64 in and out: the tighter bound.
    exact_dtype: bool,
    /// The largest finite value of the inputs' dtype, in which the softmax target was computed:
    /// a failure whose row needs larger intermediates is an overflow, not a device's fault.
    input_limit: f64,
}

impl TargetCheck {
    /// q and k [B, n, p], v and output [B, n, p_v] (head b of each together).
    pub fn gather(q: &Tensor, k: &Tensor, v: &Tensor, output: &Tensor) -> Result<Self> {
        let (b, n, p) = q.dims3()?;
        let pv = v.dim(2)?;
        let rows = sampled_rows(n);
        let idx = crate::attention::HeadBatch::flat_index(&vec![rows.clone(); b], n, q.device())?;
        let pick = |t: &Tensor, cols: usize| -> Result<HostValues> {
            HostValues::of(&t.reshape((b * n, cols))?.index_select(&idx, 0)?)
        };
        Ok(Self {
            heads: b,
            n,
            p,
            pv,
            q_rows: pick(q, p)?,
            out_rows: pick(output, pv)?,
            k: HostValues::of(k)?,
            v: HostValues::of(v)?,
            rows,
            exact_dtype: output.dtype() == DType::F64 && q.dtype() == DType::F64,
            input_limit: largest_finite(q.dtype()),
        })
    }

    /// The check of every head on the host's threads; `heads` names the batch's heads in an
    /// error. A failure on a row whose exact computation needs values beyond the range of the
    /// dtype it ran in is a usage error (the inputs are too large: `--dtype f64`); any other is
    /// the device's wrong result.
    pub fn verify(
        &self,
        target: Target,
        spec: &AttentionSpec,
        heads: Option<&[usize]>,
    ) -> Result<()> {
        let (n, p, pv, r) = (self.n, self.p, self.pv, self.rows.len());
        let tol = if self.exact_dtype { 1e-9 } else { 1e-4 };
        // The kernelized target is computed in float64 whatever the inputs' dtype (§6.4.1).
        let limit = match target {
            Target::Softmax => self.input_limit,
            Target::Kernelized => f64::MAX,
        };
        let batch: Vec<usize> = (0..self.heads).collect();
        let failures = crate::runtime::host_map(&batch, |&i| {
            check_head(
                (target, spec),
                (tol, limit),
                (n, p, pv),
                &self.rows,
                (
                    &self.q_rows.f64s(i * r * p..(i + 1) * r * p),
                    &self.k.f64s(i * n * p..(i + 1) * n * p),
                    &self.v.f64s(i * n * pv..(i + 1) * n * pv),
                ),
                &self.out_rows.f64s(i * r * pv..(i + 1) * r * pv),
            )
        });
        let target_name = match target {
            Target::Softmax => "softmax",
            Target::Kernelized => "kernelized",
        };
        for (i, failure) in failures.into_iter().enumerate() {
            let name = heads.map_or(String::new(), |h| format!("head {}: ", h[i]));
            match failure {
                None => {}
                Some(Failure::Overflow(what)) => {
                    return Err(crate::usage!(
                        "{name}the exact {target_name} target overflows: {what}. The inputs are \
                         finite but too large for a {} forward, and no row of this head was \
                         written. Rerun with --dtype f64 (for `score`, dump the Q/K/V with \
                         `dump-qkv --dtype f64`), or check the model's weights",
                        dtype_name(self.input_limit)
                    ))
                }
                Some(Failure::Wrong(what)) => bail!(
                    "{name}the exact {target_name} target is wrong at {what}. The device produced \
                     a wrong result; no row of this head was written. Rerun with --device cpu, \
                     and report the device, driver and command",
                ),
            }
        }
        Ok(())
    }
}

/// The largest finite value of a float dtype (an integer dtype's never limits).
fn largest_finite(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 65504.0,
        // (2 − 2⁻⁷)·2¹²⁷, bfloat16's largest finite value.
        DType::BF16 => 3.389_531_389_251_535_5e38,
        DType::F32 => f64::from(f32::MAX),
        _ => f64::MAX,
    }
}

/// The dtype whose largest value is `limit`, for messages.
fn dtype_name(limit: f64) -> &'static str {
    if limit == f64::from(f32::MAX) {
        "float32"
    } else if limit == f64::MAX {
        "float64"
    } else {
        "half-precision"
    }
}

/// Why a sampled row of a target differs from its float64 recomputation.
enum Failure {
    /// The row's computation needs values beyond its dtype's range (named, with their size).
    Overflow(String),
    /// Finite intermediates, a wrong value: the device's.
    Wrong(String),
}

/// One head's check (the sampled rows of q (r×p), k (n×p) and v (n×p_v), row-major, and the
/// output's sampled rows `got`, r×p_v): where it fails, if it does, and whether an overflow
/// explains it.
fn check_head(
    (target, spec): (Target, &AttentionSpec),
    (tol, limit): (f64, f64),
    (n, p, pv): (usize, usize, usize),
    rows: &[usize],
    (q_rows, k, v): (&[f64], &[f64], &[f64]),
    got: &[f64],
) -> Option<Failure> {
    let vmax: Vec<f64> = (0..pv)
        .map(|c| (0..n).fold(0.0f64, |m, j| m.max(v[j * pv + c].abs())))
        .collect();
    for (ri, &i) in rows.iter().enumerate() {
        let qi = &q_rows[ri * p..(ri + 1) * p];
        let (lo, hi) = spec.visible().span(i, i + 1, n);
        let (k, v) = (&k[lo * p..hi * p], &v[lo * pv..hi * pv]);
        let weights = row_weights(target, spec, (qi, k), p);
        let mass: f64 = weights.iter().map(|w| w.abs()).sum();
        for c in 0..pv {
            let want: f64 = weights
                .iter()
                .enumerate()
                .map(|(j, w)| w * v[j * pv + c])
                .sum();
            let bound = tol * mass * vmax[c];
            let o = got[ri * pv + c];
            if (o - want).abs() > bound || o.is_nan() {
                let at = format!(
                    "row {i}, column {c}: {o} where a float64 recomputation from the same Q, K, V \
                     gives {want}"
                );
                return Some(match overflow(target, limit, qi, (k, p), (v, pv)) {
                    Some(why) => Failure::Overflow(format!("{at}, and {why}")),
                    None => Failure::Wrong(format!("{at} (allowed difference {bound:.3e})")),
                });
            }
        }
    }
    None
}

/// The target's weights of one query row `qi` over the keys `k` it sees (keys×p, row-major), in
/// f64: the softmax under `spec` (its scale, cap and sink: with a sink they sum to less than 1).
fn row_weights(
    target: Target,
    spec: &AttentionSpec,
    (qi, k): (&[f64], &[f64]),
    p: usize,
) -> Vec<f64> {
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    match target {
        Target::Softmax => {
            let s: Vec<f64> = k
                .chunks_exact(p)
                .map(|kj| spec.logit(dot(qi, kj)))
                .collect();
            // The sink is the head's; a checked head has the spec's first (one per query head).
            let sink = spec.sink(0);
            let m = s
                .iter()
                .cloned()
                .chain(sink)
                .fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |x| (x - m).exp());
            e.iter().map(|x| x / z).collect()
        }
        Target::Kernelized => {
            let s2 = 1.0 / (p as f64).sqrt();
            k.chunks_exact(p)
                .map(|kj| {
                    let d2: f64 = qi.iter().zip(kj).map(|(a, b)| (a - b) * (a - b)).sum();
                    (-d2 * s2 / 2.0).exp()
                })
                .collect()
        }
    }
}

/// Why one row of the target cannot be computed within `limit` (its dtype's largest value), if
/// it cannot. Any form of the computation holds at least: every partial sum of a logit
/// (bounded by Σ_c |q_c·k_jc|, or Σ_c (|q_c| + |k_jc|)² for the kernelized distance) and, as the
/// weights before normalisation are at most 1, every partial sum of Σ_j e_j·v_jc (bounded by
/// Σ_j |v_jc|). Both bounds are reached when a channel dominates, which is what overflows.
fn overflow(
    target: Target,
    limit: f64,
    qi: &[f64],
    (k, p): (&[f64], usize),
    (v, pv): (&[f64], usize),
) -> Option<String> {
    let term = |a: f64, b: f64| match target {
        Target::Softmax => (a * b).abs(),
        Target::Kernelized => (a.abs() + b.abs()).powi(2),
    };
    let logit = k
        .chunks_exact(p)
        .map(|kj| qi.iter().zip(kj).map(|(&a, &b)| term(a, b)).sum::<f64>())
        .fold(0.0f64, f64::max);
    let largest = |x: &[f64]| x.iter().fold(0.0f64, |m, y| m.max(y.abs()));
    if logit > limit {
        return Some(format!(
            "its logits (Q·Kᵀ) reach {logit:.3e}, past the largest finite {limit:.3e}, with |Q| up \
             to {:.3e} and |K| up to {:.3e}",
            largest(qi),
            largest(k)
        ));
    }
    let (c, sum) = (0..pv)
        .map(|c| {
            (
                c,
                v.iter().skip(c).step_by(pv).map(|x| x.abs()).sum::<f64>(),
            )
        })
        .fold((0, 0.0f64), |a, b| if b.1 > a.1 { b } else { a });
    (sum > limit).then(|| {
        format!(
            "the sum over keys of V's column {c} reaches {sum:.3e}, past the largest finite \
             {limit:.3e}, with |V| up to {:.3e}",
            largest(v)
        )
    })
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
    /// A batch of heads: three right targets pass; one wrong row in the second head fails and
    /// the error names that head by its label.
    #[test]
    fn a_batch_check_names_the_head_with_a_wrong_row() {
        let (n, p) = (300, 8);
        let dev = test_device();
        let mut rng = TrialRng::seed_from_u64(5);
        let mut mk =
            || from_f64(normal_values(&mut rng, n, p, 1.0), (n, p), &dev, DType::F32).unwrap();
        let heads: Vec<(Tensor, Tensor, Tensor)> = (0..3).map(|_| (mk(), mk(), mk())).collect();
        let outs: Vec<Tensor> = heads
            .iter()
            .map(|(q, k, v)| ExactAttention::compute(q, k, v).unwrap().output)
            .collect();
        let stack = |f: &dyn Fn(&(Tensor, Tensor, Tensor)) -> Tensor| {
            Tensor::stack(&heads.iter().map(f).collect::<Vec<_>>(), 0).unwrap()
        };
        let (q, k, v) = (
            stack(&|h| h.0.clone()),
            stack(&|h| h.1.clone()),
            stack(&|h| h.2.clone()),
        );
        let good = Tensor::stack(&outs, 0).unwrap();
        let check = |out: &Tensor| {
            TargetCheck::gather(&q, &k, &v, out).unwrap().verify(
                Target::Softmax,
                &AttentionSpec::bidirectional(p),
                Some(&[4, 5, 6]),
            )
        };
        check(&good).unwrap();
        // Head 1's last row (always sampled) off by 1 %.
        let last = outs[1]
            .narrow(0, n - 1, 1)
            .unwrap()
            .affine(1.01, 0.0)
            .unwrap();
        let bad1 = Tensor::cat(&[outs[1].narrow(0, 0, n - 1).unwrap(), last], 0).unwrap();
        let bad = Tensor::stack(&[outs[0].clone(), bad1, outs[2].clone()], 0).unwrap();
        let err = format!("{}", check(&bad).unwrap_err());
        assert!(
            err.starts_with("head 5: ") && err.contains(&format!("row {}", n - 1)),
            "{err}"
        );
    }

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
                        crate::attention::exact::kernelized_output(&q, &k, &v, DType::F64).unwrap()
                    }
                };
                check_target_rows(target, &AttentionSpec::bidirectional(p), &q, &k, &v, &out)
                    .unwrap();
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
                let err =
                    check_target_rows(target, &AttentionSpec::bidirectional(p), &q, &k, &v, &bad)
                        .unwrap_err();
                assert!(format!("{err}").contains("is wrong at row"), "{err}");
                if target == Target::Softmax {
                    // The causal target passes its own check and fails the bidirectional one.
                    let causal =
                        ExactAttention::compute_masked(&q, &k, &v, crate::attention::Mask::Causal)
                            .unwrap()
                            .output;
                    check_target_rows(target, &AttentionSpec::causal(p, None), &q, &k, &v, &causal)
                        .unwrap();
                    assert!(check_target_rows(
                        target,
                        &AttentionSpec::bidirectional(p),
                        &q,
                        &k,
                        &v,
                        &causal
                    )
                    .is_err());
                }
            }
        }
    }
}
