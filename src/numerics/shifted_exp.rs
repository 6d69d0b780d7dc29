//! Shifted exponentials computed in place on the CPU, without the fresh buffers (and page faults)
//! of candle's element-wise ops.
//!
//! Row-wise, for exact attention, in f32: E_ij = exp(s_ij − m_i)
//! with m_i = max_j s_ij, written in place over the score block, with the row sums Σ_j E_ij
//! accumulated in f64. Exact attention is O = (E·V) / rowsum — the n×n normalisation becomes an
//! n×p one — and log D_i = m_i + log Σ_j E_ij.
//!
//! Why not candle's softmax: it calls libm's scalar `expf` per entry into a fresh n×n buffer, and at
//! n = 4096 that was about 45 % of exact attention's time (BENCHMARKS.md). The exponential below is
//! Cephes' `expf` (Cody–Waite reduction by ln 2, degree-6 minimax polynomial), written branch-free
//! so that it vectorises; its error is ≤ 2 ulp over the whole range (tested against f64), the same
//! order as the f32 rounding of the scores themselves. No fused multiply-add is used, so the
//! result does not depend on the CPU's instruction set.
//!
//! With one global shift, for Skyformer's float64 kernel blocks: x ← exp(x − c) in place, with
//! libm's exp (the same bits as candle's ops, without their two fresh buffers).

use candle_core::{CpuStorage, DType, InplaceOp1, Layout, Tensor};
use rayon::prelude::*;

pub(super) const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in two (Cody–Waite): LN2_HI has few mantissa bits, so n·LN2_HI is exact for |n| ≤ 128.
pub(super) const LN2_HI: f32 = 0.693_359_4;
pub(super) const LN2_LO: f32 = -2.121_944_4e-4;
/// Below this exp(x) is under f32's smallest normal (2⁻¹²⁶); the result is flushed to 0, which
/// in a softmax row whose largest term is 1 is far below the f32 resolution of the sum.
pub(super) const LOWEST: f32 = -87.336_55;
/// Above this exp(x) would overflow 2¹²⁷·2.
pub(super) const HIGHEST: f32 = 88.376_26;
/// 1.5·2²³: adding it rounds a float of magnitude < 2²² to the nearest integer, branch-free.
pub(super) const ROUNDER: f32 = 12_582_912.0;

/// exp(x) in f32, ≤ 2 ulp (Cephes expf coefficients). NaN in, NaN out; −∞ and anything below
/// `LOWEST` give 0.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    // f32::clamp lets NaN through (f32::max would swallow it).
    let xc = x.clamp(LOWEST, HIGHEST);
    // n = round(x / ln 2), via the 1.5·2²³ trick (its low bits hold n).
    let t = xc * LOG2E + ROUNDER;
    let n = t - ROUNDER;
    let k = (t.to_bits() as i32).wrapping_sub(ROUNDER.to_bits() as i32);
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_2e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5; // Cephes' 5.0000001201e-1 rounds to 0.5 in f32
    let y = p * (r * r) + r + 1.0;
    let scale = f32::from_bits((k.wrapping_add(127) as u32) << 23);
    if x < LOWEST {
        0.0
    } else {
        y * scale
    }
}

/// Replaces a row by exp(row − max row) and returns (max, Σ exp) with the sum in f64. A row that
/// holds NaN or +∞ (or only −∞) becomes NaN, so it is counted downstream as a non-finite row
/// instead of being hidden.
pub fn shifted_exp_row(row: &mut [f32]) -> (f32, f64) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { shifted_exp_row_avx2(row) };
    }
    shifted_exp_row_body(row)
}

/// The same arithmetic compiled for 8-wide vectors. Plain multiplies and adds (Rust never
/// contracts them into FMA), so the result is bit-identical to the portable build.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn shifted_exp_row_avx2(row: &mut [f32]) -> (f32, f64) {
    shifted_exp_row_body(row)
}

/// Lanes of the independent partial reductions (max, sum): wide enough for the vector units, and
/// a fixed number so that the summation order does not depend on the CPU.
const LANES: usize = 8;

#[inline(always)]
fn shifted_exp_row_body(row: &mut [f32]) -> (f32, f64) {
    let mut lane_max = [f32::NEG_INFINITY; LANES];
    let mut lane_nan = [false; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            let x = c[i];
            lane_nan[i] |= x.is_nan();
            lane_max[i] = if x > lane_max[i] { x } else { lane_max[i] };
        }
    }
    let mut max = f32::NEG_INFINITY;
    let mut nan = false;
    for &x in chunks.remainder().iter().chain(lane_max.iter()) {
        nan |= x.is_nan();
        max = if x > max { x } else { max };
    }
    if nan || lane_nan.iter().any(|&b| b) || !max.is_finite() {
        row.fill(f32::NAN);
        return (f32::NAN, f64::NAN);
    }
    for x in row.iter_mut() {
        *x = exp_f32(*x - max);
    }
    let mut acc = [0f64; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            acc[i] += c[i] as f64;
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|&x| x as f64).sum();
    (max, acc.iter().sum::<f64>() + tail)
}

/// Candle in-place op over a contiguous f32 [rows, cols] block: each row becomes exp(row − max)
/// (see [`shifted_exp_row`]); the per-row (max, sum) pairs are left in `stats` for the caller.
#[derive(Default)]
pub struct ShiftedExpRows {
    pub stats: std::sync::Mutex<Vec<(f32, f64)>>,
}

impl InplaceOp1 for ShiftedExpRows {
    fn name(&self) -> &'static str {
        "shifted-exp-rows"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let (rows, cols) = layout.shape().dims2()?;
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("shifted-exp-rows needs a contiguous block");
        };
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!(
                "shifted-exp-rows is the f32 path; other dtypes use candle's softmax"
            );
        };
        // Rows in parallel: a block may be the whole head (n ≤ 1024), and nested rayon work just
        // shares the pool with the heads and blocks already in flight.
        let stats = data[start..end]
            .par_chunks_exact_mut(cols)
            .with_min_len(8)
            .map(shifted_exp_row)
            .collect::<Vec<_>>();
        debug_assert_eq!(stats.len(), rows);
        *self.stats.lock().expect("not poisoned") = stats;
        Ok(())
    }
}

/// On the CPU in f32: each row of the score block `s` replaced in place by exp(s − max s), and
/// the per-row (max, Σ exp) returned. `None` on other devices and dtypes, which take candle's own
/// ops. `s` must not be shared (it is the caller's fresh matmul output).
pub fn shifted_exp_rows_in_place(s: &Tensor) -> candle_core::Result<Option<Vec<(f32, f64)>>> {
    if !s.device().is_cpu() || s.dtype() != DType::F32 || !s.is_contiguous() {
        return Ok(None);
    }
    let op = ShiftedExpRows::default();
    s.inplace_op1(&op)?;
    let stats = std::mem::take(&mut *op.stats.lock().expect("not poisoned"));
    Ok(Some(stats))
}

/// Candle in-place op: x ← exp(x − c) for f64 storage (libm's exp: the same bits as
/// `t.affine(1.0, −c)?.exp()`, without its two fresh buffers).
struct ExpMinus(f64);

impl InplaceOp1 for ExpMinus {
    fn name(&self) -> &'static str {
        "exp-minus"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let (Some((start, end)), CpuStorage::F64(data)) = (layout.contiguous_offsets(), storage)
        else {
            candle_core::bail!("exp-minus needs contiguous f64 storage");
        };
        let c = self.0;
        data[start..end]
            .par_chunks_mut(4096)
            .for_each(|xs| xs.iter_mut().for_each(|x| *x = (*x - c).exp()));
        Ok(())
    }
}

/// exp(t − c_b) for each head b of t: [B, ·, ·] with one c per head, or one matrix and one c
/// ([`exp_minus`], in place on the CPU).
pub fn exp_minus_each(t: Tensor, c: &[f64]) -> candle_core::Result<Tensor> {
    if t.rank() == 2 && c.len() == 1 {
        return exp_minus(t, c[0]);
    }
    let shape: Vec<usize> = std::iter::once(c.len())
        .chain(std::iter::repeat_n(1, t.rank().saturating_sub(1)))
        .collect();
    let c = Tensor::from_vec(c.to_vec(), shape, t.device())?.to_dtype(t.dtype())?;
    t.broadcast_sub(&c)?.exp()
}

/// exp(t − c) for a global shift c, in place when `t` is a contiguous f64 CPU tensor (the
/// caller hands over its own fresh product), through candle's ops otherwise.
pub fn exp_minus(t: Tensor, c: f64) -> candle_core::Result<Tensor> {
    if t.device().is_cpu() && t.dtype() == DType::F64 && t.is_contiguous() {
        t.inplace_op1(&ExpMinus(c))?;
        Ok(t)
    } else {
        t.affine(1.0, -c)?.exp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor_util::test_device;

    /// Distance in units in the last place of the f32 result from the f64 value.
    fn ulps(got: f32, want: f64) -> f64 {
        let w = want as f32;
        let ulp = (f32::from_bits(w.to_bits() + 1) - w) as f64;
        (got as f64 - want).abs() / ulp
    }

    #[test]
    fn exp_is_within_two_ulp_of_f64_over_the_normal_range() {
        let mut worst: f64 = 0.0;
        let steps = 2_000_000;
        for i in 0..=steps {
            let x = LOWEST + (HIGHEST - LOWEST) * i as f32 / steps as f32;
            worst = worst.max(ulps(exp_f32(x), (x as f64).exp()));
        }
        // Cephes documents ≈ 1 ulp peak for expf; 2 is the bound we rely on in the docs.
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert_eq!(exp_f32(0.0), 1.0);
    }

    #[test]
    fn exp_edges_underflow_to_zero_and_propagate_nan() {
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-100.0), 0.0);
        assert!(exp_f32(f32::NAN).is_nan());
        assert!(exp_f32(LOWEST) > 0.0);
    }

    #[test]
    fn shifted_row_matches_f64_softmax_terms() {
        let mut row: Vec<f32> = (0..1000)
            .map(|i| ((i * 37 % 101) as f32) * 0.173 - 9.0)
            .collect();
        let orig: Vec<f64> = row.iter().map(|&x| x as f64).collect();
        let (max, sum) = shifted_exp_row(&mut row);
        let m = orig.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        assert_eq!(max as f64, m);
        // The shift x − m is itself rounded to f32 (as in any f32 softmax); the exponential of that
        // shifted value is what must be within 2 ulp.
        let want: Vec<f64> = orig
            .iter()
            .map(|&x| ((x as f32 - m as f32) as f64).exp())
            .collect();
        let want_sum: f64 = want.iter().sum();
        assert!((sum - want_sum).abs() <= 1e-6 * want_sum);
        for (g, w) in row.iter().zip(&want) {
            assert!(ulps(*g, *w) <= 2.0, "{g} vs {w}: {} ulp", ulps(*g, *w));
        }
    }

    /// The AVX2 build and the portable build give the same bits (no FMA contraction), so a run's
    /// numbers do not depend on which one the CPU picks.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_and_portable_builds_agree_bit_for_bit() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let orig: Vec<f32> = (0..4099)
            .map(|i| ((i as f32) * 0.37).sin() * 30.0 - 5.0)
            .collect();
        let (mut a, mut b) = (orig.clone(), orig);
        let sa = unsafe { shifted_exp_row_avx2(&mut a) };
        let sb = shifted_exp_row_body(&mut b);
        assert_eq!(sa.0.to_bits(), sb.0.to_bits());
        assert_eq!(sa.1.to_bits(), sb.1.to_bits());
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    }

    #[test]
    fn exp_minus_in_place_equals_candles_affine_then_exp_bit_for_bit() {
        let dev = test_device();
        let t = Tensor::arange(0u32, 10_000, &dev)
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .affine(0.0123, -70.0)
            .unwrap();
        let want: Vec<f64> = t
            .affine(1.0, -3.25)
            .unwrap()
            .exp()
            .unwrap()
            .to_vec1()
            .unwrap();
        let got: Vec<f64> = exp_minus(t.copy().unwrap(), 3.25)
            .unwrap()
            .to_vec1()
            .unwrap();
        assert!(want
            .iter()
            .zip(&got)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        // Other dtypes take candle's path.
        let t32 = t.to_dtype(DType::F32).unwrap();
        let via: Vec<f32> = exp_minus(t32.clone(), 1.0).unwrap().to_vec1().unwrap();
        let want32: Vec<f32> = t32
            .affine(1.0, -1.0)
            .unwrap()
            .exp()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(via, want32);
    }

    #[test]
    fn rows_with_nan_or_infinity_become_nan() {
        for bad in [f32::NAN, f32::INFINITY] {
            let mut row = vec![0.5f32, bad, -1.0];
            let (m, s) = shifted_exp_row(&mut row);
            assert!(m.is_nan() && s.is_nan() && row.iter().all(|x| x.is_nan()));
        }
        let mut row = vec![f32::NEG_INFINITY; 3];
        assert!(shifted_exp_row(&mut row).1.is_nan());
    }
}
