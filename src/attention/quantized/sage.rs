//! SageAttention's kernels (docs/reference.md §8.4): Q and K quantized for QKᵀ, P and V for PV, block by
//! block, with the [`online_softmax`] whose P is quantized against the running row maximum.
//!
//! - `sage1` — SageAttention (Zhang, Wei, Zhu & Chen, ICLR 2025), `sageattn_qk_int8_pv_fp16_triton`
//!   (`thu-ml/SageAttention`): smooth K (K̃ = K − k̄, k̄ the mean over the window's n tokens per
//!   K/V head); Q′ = Q/√p and K̃ in INT8 per block (one scale per 128-row query block and per 64-row
//!   key block); Q_P(p) = f16(p); V̂ = f16(V).
//! - `sage2_8b` — SageAttention2 (Zhang et al., ICML 2025) as released, `sageattn_qk_int8_pv_fp8_cuda`:
//!   smooth K; Q′ and K̃ in INT8 per token; V̂ per channel in E4M3 (s_c = max_t|V_tc|/448);
//!   Q_P(p) = E4M3(448·p)/448. [P≠C] The kernel shares scales among the rows of an MMA thread;
//!   per token is the architecture-free choice (the paper's Table 6 measures them equal).
//! - `sage2_4b` — SageAttention2's 4-bit path: as `sage2_8b` with INT4 per-token Q′ and K̃, and
//!   smooth Q: per 128-row query block, Q̃ = Q′ − q̄_b is quantized and S_ij = Q̂̃_i·K̂̃_j + q̄_b·K̃_j,
//!   the second term unquantized.
//!
//! Smoothing K is exact in real arithmetic (it adds the row constant q_i·k̄ to row i's logits, so
//! also under the causal mask). [P≠C] The released kernels accumulate P̂V̂ in FP22 inside a block;
//! here the accumulator is in the run's dtype.
//!
//! On a §7.7 layer (docs/reference.md §7.7.6) τ is folded into Q′ in place of 1/√p, S is capped
//! before the online softmax (with the smoothing's row constant added back first, see
//! `sage_output`), keys outside the window are not visited, and the sink enters ℓ after the last
//! key block.

use anyhow::Result;
use candle_core::Tensor;

use super::online_softmax::{online_softmax, Rows, KEY_BLOCK, QUERY_BLOCK};
use super::{check_f16_range, dense_macs, in_run_dtype, quantized, HostMat, Real};
use crate::attention::spec::{default_scale, AttentionSpec};
use crate::attention::{Approximation, HeadInputs, Mask, Method, MethodInfo};
use crate::numerics::formats::{sym_group_roundtrip, E4M3_MAX};
use crate::numerics::sampling::TrialRng;

/// Which SageAttention kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SageKernel {
    /// INT8 Q/K per block, f16 P and V.
    Sage1,
    /// INT8 Q/K per token, E4M3 P and V.
    Sage2Int8,
    /// INT4 Q/K per token with smooth Q, E4M3 P and V.
    Sage2Int4,
    /// `sage2_4b`'s smoothing of Q and K with every quantizer (Q, K, V and P) the identity: the
    /// test seam of docs/reference.md §10.4's exactness limit.
    #[cfg(test)]
    Identity,
}

pub struct Sage {
    pub kernel: SageKernel,
}

pub const SAGE1: MethodInfo = quantized("sage1");
pub const SAGE2_8B: MethodInfo = quantized("sage2_8b");
pub const SAGE2_4B: MethodInfo = quantized("sage2_4b");
#[cfg(test)]
pub const SAGE_IDENTITY: MethodInfo = quantized("sage_identity");

const INT8: i32 = 127;
const INT4: i32 = 7;

/// K̃ = K − k̄ (k̄ the mean of K's rows, summed in order and divided by n); returns k̄.
pub fn smooth_k<T: Real>(k: &mut HostMat<T>) -> Vec<T> {
    let (n, p) = (k.rows, k.cols);
    let mut mean = vec![T::ZERO; p];
    for t in 0..n {
        for (c, m) in mean.iter_mut().enumerate() {
            *m += k.data[t * p + c];
        }
    }
    let nt = T::from_f64(n as f64);
    mean.iter_mut().for_each(|m| *m /= nt);
    for row in k.data.chunks_exact_mut(p) {
        row.iter_mut().zip(&mean).for_each(|(x, m)| *x -= *m);
    }
    mean
}

/// Symmetric integer groups of `rows` consecutive rows each (one scale per group, §8.2).
fn sym_rows<T: Real>(x: &mut HostMat<T>, rows: usize, qmax: i32) {
    let p = x.cols;
    x.data
        .chunks_mut(rows * p)
        .for_each(|g| sym_group_roundtrip(g, qmax));
}

/// V̂ = s_c·E4M3(V/s_c) per channel c, s_c = max_t |V_tc|/448 (0 for an all-zero channel).
pub fn e4m3_per_channel<T: Real>(v: &mut HostMat<T>) {
    let p = v.cols;
    let max = T::from_f64(E4M3_MAX);
    let scales: Vec<T> = (0..p)
        .map(|c| {
            let m =
                v.data[c..]
                    .iter()
                    .step_by(p)
                    .fold(T::ZERO, |m, &x| if x.abs() > m { x.abs() } else { m });
            m / max
        })
        .collect();
    for row in v.data.chunks_exact_mut(p) {
        for (x, &s) in row.iter_mut().zip(&scales) {
            *x = if s == T::ZERO {
                T::ZERO
            } else {
                s * (*x / s).round_e4m3()
            };
        }
    }
}

/// Q_P of `sage2_*`: E4M3(448·p)/448 (p ≤ 1 scaled to E4M3's range).
pub fn e4m3_p<T: Real>(p: T) -> T {
    let max = T::from_f64(E4M3_MAX);
    (max * p).round_e4m3() / max
}

fn sage_output<T: Real>(m: &Sage, head: &HeadInputs) -> Result<Tensor> {
    let id = m.id();
    let (n, p, spec) = (head.n(), head.p(), &head.spec);
    let (mut q, mut k, mut v) = super::host_qkv::<T>(head)?;
    fold_scale(&mut q, spec, p);
    let k_mean = smooth_k(&mut k);
    // Smoothing K shifts row i's logits by −q′_i·k̄, which the softmax cancels; a cap (tanh is not
    // shift-invariant) and a sink (σ is on the scale of the true logits) do not, so on such a
    // layer the kernel adds q′_i·k̄ back, unquantized in the run's dtype (§7.7.6): S is then the
    // quantized product of the true logits, capped.
    let row_shift = (!spec.plain_logits()).then(|| row_dots(&q, &k_mean));
    // sage2_4b's smooth Q: the block means q̄_b ([blocks, p]) and the unquantized K̃ they multiply.
    let mut q_means: Vec<T> = Vec::new();
    let k_smooth = k.tensor(&head.k)?;
    match m.kernel {
        SageKernel::Sage1 => {
            sym_rows(&mut q, QUERY_BLOCK, INT8);
            sym_rows(&mut k, KEY_BLOCK, INT8);
            check_f16_range(id, "V", &v)?;
            v.map(T::round_f16);
        }
        SageKernel::Sage2Int8 => {
            sym_rows(&mut q, 1, INT8);
            sym_rows(&mut k, 1, INT8);
            e4m3_per_channel(&mut v);
        }
        SageKernel::Sage2Int4 => {
            q_means = smooth_q(&mut q, p);
            sym_rows(&mut q, 1, INT4);
            sym_rows(&mut k, 1, INT4);
            e4m3_per_channel(&mut v);
        }
        #[cfg(test)]
        SageKernel::Identity => q_means = smooth_q(&mut q, p),
    }
    let qhat = q.into_tensor(&head.q)?;
    let kt = k.into_tensor(&head.k)?.t()?.contiguous()?;
    // sage2_4b: q̄_b·K̃ᵀ for every query block b ([blocks, n], on the device), added to its rows.
    let mean_logits = if q_means.is_empty() {
        None
    } else {
        let means = T::tensor(q_means, (n.div_ceil(QUERY_BLOCK), p), head.q.device())?;
        Some(T::host(&means.matmul(&k_smooth.t()?.contiguous()?)?)?)
    };
    let softcap = spec.softcap.map(T::from_f64);
    let scores = |a: usize, len: usize, j0: usize, kend: usize| -> Result<Vec<T>> {
        let keys = kend - j0;
        let s = qhat
            .narrow(0, a, len)?
            .matmul(&kt.narrow(1, j0, keys)?.contiguous()?)?;
        let mut s = T::host(&s)?;
        for (r, row) in s.chunks_exact_mut(keys).enumerate() {
            if let Some(ml) = &mean_logits {
                let b = (a + r) / QUERY_BLOCK;
                row.iter_mut()
                    .zip(&ml[b * n + j0..b * n + kend])
                    .for_each(|(x, &y)| *x += y);
            }
            if let Some(shift) = &row_shift {
                row.iter_mut().for_each(|x| *x += shift[a + r]);
            }
            if let Some(c) = softcap {
                row.iter_mut().for_each(|x| *x = c * (*x / c).tanh());
            }
        }
        Ok(s)
    };
    let vhat = v.into_tensor(&head.v)?;
    // The sink, unquantized in the run's dtype, enters ℓ after the last key block (§7.7.6).
    let rows = Rows {
        visible: spec.visible(),
        sink: spec.sink(0).map(T::from_f64),
    };
    match m.kernel {
        SageKernel::Sage1 => online_softmax(n, rows, &scores, &vhat, T::round_f16),
        #[cfg(test)]
        SageKernel::Identity => online_softmax(n, rows, &scores, &vhat, |x| x),
        _ => online_softmax(n, rows, &scores, &vhat, e4m3_p::<T>),
    }
}

/// Q′: Q·τ, the layer's scale folded into Q before it is quantized (§7.7.6, SageAttention's
/// `sm_scale`); under τ = 1/√p, Q/√p as before specs existed (the same bits).
fn fold_scale<T: Real>(q: &mut HostMat<T>, spec: &AttentionSpec, p: usize) {
    if spec.scale == default_scale(p) {
        let sqrt_p = T::from_f64(p as f64).sqrt();
        q.map(|x| x / sqrt_p);
    } else {
        let tau = T::from_f64(spec.scale);
        q.map(|x| x * tau);
    }
}

/// x_i·y for every row x_i of `x`, in order.
fn row_dots<T: Real>(x: &HostMat<T>, y: &[T]) -> Vec<T> {
    x.data
        .chunks_exact(x.cols)
        .map(|r| r.iter().zip(y).fold(T::ZERO, |a, (&u, &w)| a + u * w))
        .collect()
}

/// sage2_4b's smooth Q: each query block's mean q̄_b subtracted from its rows; returns the means
/// ([blocks, p]).
fn smooth_q<T: Real>(q: &mut HostMat<T>, p: usize) -> Vec<T> {
    let mut q_means = Vec::new();
    for block in q.data.chunks_mut(QUERY_BLOCK * p) {
        let rows = block.len() / p;
        let mut mean = vec![T::ZERO; p];
        for row in block.chunks_exact(p) {
            mean.iter_mut().zip(row).for_each(|(m, &x)| *m += x);
        }
        let rt = T::from_f64(rows as f64);
        mean.iter_mut().for_each(|m| *m /= rt);
        for row in block.chunks_exact_mut(p) {
            row.iter_mut().zip(&mean).for_each(|(x, &m)| *x -= m);
        }
        q_means.extend(mean);
    }
    q_means
}

impl Method for Sage {
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(match self.kernel {
            SageKernel::Sage1 => &SAGE1,
            SageKernel::Sage2Int8 => &SAGE2_8B,
            SageKernel::Sage2Int4 => &SAGE2_4B,
            #[cfg(test)]
            SageKernel::Identity => &SAGE_IDENTITY,
        })
    }
    fn macs(&self, n: usize, p: usize, _d: usize) -> f64 {
        dense_macs(n, p, Mask::None)
    }
    fn macs_masked(&self, n: usize, p: usize, _d: usize, mask: Mask) -> f64 {
        dense_macs(n, p, mask)
    }
    /// K and V as the kernel takes them (§8.4): 8 + 16 → 12 for `sage1`, 8 for `sage2_8b`,
    /// (4 + 8)/2 = 6 for `sage2_4b` (scales negligible).
    fn kv_bits(&self, _n: usize) -> Option<f64> {
        Some(match self.kernel {
            SageKernel::Sage1 => 12.0,
            SageKernel::Sage2Int8 => 8.0,
            SageKernel::Sage2Int4 => 6.0,
            #[cfg(test)]
            SageKernel::Identity => 16.0,
        })
    }
    fn approximate(&self, head: &HeadInputs, _d: usize, _: &mut TrialRng) -> Result<Approximation> {
        super::check_head(self, head)?;
        let out = in_run_dtype!(head.dtype(), sage_output(self, head))?;
        Ok(Approximation::plain(out))
    }
}
