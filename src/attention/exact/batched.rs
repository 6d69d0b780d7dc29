//! Exact attention for all heads of a window at once: the products are batched over heads
//! ([H_kv, G·b, p] × [H_kv, p, n]), so a device runs a few large kernels per row block instead of
//! a few small ones per head and block. Grouped-query heads (METHODS.md §7.1: query head h reads
//! K/V head ⌊h·H_kv/H⌋, groups of G = H/H_kv consecutive heads) are a reshape of Q, never a copy of
//! K or V: the G query heads of a group are stacked along the rows of one batch entry.
//!
//! The arithmetic per head is the generic path's (max-shifted exponentials in the working dtype),
//! except that the normalisation comes after E·V, as on the CPU's in-place path: O = (E·V)/z.
//! A head's result therefore agrees with [`ExactAttention::compute`] within rounding, not bit for
//! bit (tests: against f64, and against the per-head path).

use anyhow::{bail, Result};
use candle_core::{Tensor, D};

use super::{mask_after_diagonal, ExactAttention};
use crate::attention::target::Mask;

/// Score entries per batched row block: about 64 M (256 MB in f32, one block in flight), so that
/// each product is large enough to fill a GPU and H·b·n never grows with n² (n = 65536, H = 32:
/// 32 rows per block).
const BLOCK_ENTRIES: usize = 1 << 26;

/// Rows per batched block for `heads` query heads of length n: at least 16, at most n.
pub fn batched_block_rows(heads: usize, n: usize) -> usize {
    (BLOCK_ENTRIES / (heads.max(1) * n.max(1)))
        .max(16)
        .min(n.max(1))
}

impl ExactAttention {
    /// Every query head's exact attention, q [H, n, p], k and v [H_kv, n, p] with H_kv | H, in
    /// head order. Each result also carries log D (its row statistics come for free here).
    pub fn compute_heads(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Vec<ExactAttention>> {
        Self::compute_heads_masked(q, k, v, Mask::None)
    }

    /// [`ExactAttention::compute_heads`] under `mask`; under the causal mask a row block sees
    /// only the keys up to its last row, as in the per-head path.
    pub fn compute_heads_masked(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Mask,
    ) -> Result<Vec<ExactAttention>> {
        let (h, n, p) = q.dims3()?;
        let (hkv, nk, pk) = k.dims3()?;
        if v.dims3()? != (hkv, nk, pk) || pk != p || hkv == 0 || h % hkv != 0 {
            bail!(
                "exact attention over heads: q {:?}, k {:?}, v {:?} do not fit (K/V heads must divide the query heads)",
                q.dims(),
                k.dims(),
                v.dims()
            );
        }
        let g = h / hkv;
        let qs = (q * (1.0 / (p as f64).sqrt()))?.contiguous()?;
        let kt = k.transpose(1, 2)?.contiguous()?; // [H_kv, p, n_k]
        let v = v.contiguous()?;
        let q4 = qs.reshape((hkv, g, n, p))?;
        let step = batched_block_rows(h, nk);
        let (mut outs, mut lds) = (Vec::new(), Vec::new());
        for start in (0..n).step_by(step) {
            let len = step.min(n - start);
            // [H_kv, G·len, p]: the group's query heads stacked along the rows.
            let qb = q4
                .narrow(2, start, len)?
                .contiguous()?
                .reshape((hkv, g * len, p))?;
            let (s, vb) = match mask {
                Mask::None => (qb.matmul(&kt)?, v.clone()),
                Mask::Causal => {
                    let keys = start + len;
                    let s = qb
                        .matmul(&kt.narrow(2, 0, keys)?.contiguous()?)?
                        .reshape((hkv, g, len, keys))?;
                    let s = mask_after_diagonal(&s, start)?;
                    (s.reshape((hkv, g * len, keys))?, v.narrow(1, 0, keys)?)
                }
            };
            let m = s.max_keepdim(D::Minus1)?;
            let e = s.broadcast_sub(&m)?.exp()?;
            let z = e.sum_keepdim(D::Minus1)?;
            let o = e.matmul(&vb)?.broadcast_div(&z)?;
            outs.push(o.reshape((hkv, g, len, p))?);
            lds.push((m + z.log()?)?.reshape((hkv, g, len))?);
        }
        let out = Tensor::cat(&outs, 2)?.reshape((h, n, p))?;
        let ld = Tensor::cat(&lds, 2)?.reshape((h, n))?;
        (0..h)
            .map(|i| {
                let log_rowsum = std::sync::OnceLock::new();
                let _ = log_rowsum.set(ld.get(i)?);
                Ok(ExactAttention {
                    output: out.get(i)?,
                    q: qs.get(i)?,
                    k: kt.get(i / g)?,
                    mask,
                    log_rowsum,
                })
            })
            .collect()
    }
}
