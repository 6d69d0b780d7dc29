//! Exact attention for all heads of a window at once: the products are batched over heads
//! ([H_kv, G·b, p] × [H_kv, p, n]), so a device runs a few large kernels per row block instead of
//! a few small ones per head and block. Grouped-query heads (docs/reference.md §7.1: query head h reads
//! K/V head ⌊h·H_kv/H⌋, groups of G = H/H_kv consecutive heads) are a reshape of Q, never a copy of
//! K or V: the G query heads of a group are stacked along the rows of one batch entry.
//!
//! The arithmetic per head is the generic path's: a max-shifted softmax of each row block in the
//! working dtype (one fused kernel), then P·V. A head's result agrees with
//! [`ExactAttention::compute`] within rounding, not bit for bit (tests: against f64, and against
//! the per-head path).

use anyhow::{bail, Result};
use candle_core::Tensor;

use super::{mask_after_diagonal, ExactAttention};
use crate::attention::target::Mask;
use crate::numerics::flash;

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
    /// head order; each result computes its log D when first asked.
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
        let (h, _, p) = q.dims3()?;
        let (hkv, nk, pk) = k.dims3()?;
        if v.dims3()? != (hkv, nk, pk) || pk != p || !crate::numerics::gqa::groups_fit(h, hkv) {
            bail!(
                "exact attention over heads: q {:?}, k {:?}, v {:?} do not fit (K/V heads must divide the query heads)",
                q.dims(),
                k.dims(),
                v.dims()
            );
        }
        let g = h / hkv;
        let qs = (q * (1.0 / (p as f64).sqrt()))?.contiguous()?;
        let visible = mask.visible();
        // On a CUDA device: every head in one launch of the fused kernel (issue 34).
        let out = match flash::on_device(&qs, k, v, visible)? {
            Some(out) => out,
            None => {
                let kt = k.transpose(1, 2)?.contiguous()?; // [H_kv, p, n_k]
                Self::blocks_over_heads(&qs, &kt, v, mask, hkv, g)?
            }
        };
        (0..h)
            .map(|i| {
                Ok(ExactAttention {
                    output: out.get(i)?,
                    q: qs.get(i)?,
                    k: k.get(i / g)?,
                    mask,
                    // log D on demand, from this head's scaled Q and K (only the restricted
                    // methods' mass reads it).
                    log_rowsum: std::sync::OnceLock::new(),
                    beyond_mask: None,
                })
            })
            .collect()
    }

    /// O [H, n, p] by candle's products and fused softmax, in batched row blocks.
    fn blocks_over_heads(
        qs: &Tensor,
        kt: &Tensor,
        v: &Tensor,
        mask: Mask,
        hkv: usize,
        g: usize,
    ) -> Result<Tensor> {
        let (h, n, p) = qs.dims3()?;
        let nk = kt.dim(2)?;
        let v = v.contiguous()?;
        let q4 = qs.reshape((hkv, g, n, p))?;
        let step = batched_block_rows(h, nk);
        let mut outs = Vec::new();
        for start in (0..n).step_by(step) {
            let len = step.min(n - start);
            // [H_kv, G·len, p]: the group's query heads stacked along the rows.
            let qb = q4
                .narrow(2, start, len)?
                .contiguous()?
                .reshape((hkv, g * len, p))?;
            let (s, vb) = match mask {
                Mask::None => (qb.matmul(kt)?, v.clone()),
                Mask::Causal => {
                    let keys = start + len;
                    let s = qb
                        .matmul(&kt.narrow(2, 0, keys)?.contiguous()?)?
                        .reshape((hkv, g, len, keys))?;
                    let s = mask_after_diagonal(&s, start)?;
                    (s.reshape((hkv, g * len, keys))?, v.narrow(1, 0, keys)?)
                }
            };
            // One fused softmax kernel per block (max, exp, sum and division in one pass over
            // the scores on a GPU, where each unfused element-wise pass over a block costs about
            // what its products do), then P·V.
            let o = candle_nn::ops::softmax_last_dim(&s)?.matmul(&vb)?;
            outs.push(o.reshape((hkv, g, len, p))?);
        }
        Ok(Tensor::cat(&outs, 2)?.reshape((h, n, p))?)
    }
}
