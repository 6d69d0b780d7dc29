//! The numerics every decoder family's layer is built of, written once: the Linear layer,
//! RMSNorm, the head split and merge, the row chunks of the row-wise work, the embedding lookup
//! and the LM head.

use anyhow::Result;
use candle_core::{DType, Tensor, D};

use crate::usage;

/// A Linear layer: y = x·Wᵀ (+ b), W [out, in], f32.
#[derive(Debug, Clone)]
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

/// The final RMSNorm and the LM head of a whole model.
#[derive(Debug, Clone)]
pub struct OutputHead {
    pub norm: Tensor,
    /// [vocab, hidden]; None when tied to the token embeddings.
    pub lm_head: Option<Tensor>,
}

pub(super) fn linear(x: &Tensor, l: &Linear) -> Result<Tensor> {
    let y = x.matmul(&l.weight.to_dtype(x.dtype())?.t()?)?;
    Ok(match &l.bias {
        Some(b) => y.broadcast_add(&b.to_dtype(x.dtype())?)?,
        None => y,
    })
}

/// RMSNorm over the last dimension: weight·x/√(mean(x²)+ε), in x's dtype (f32 as transformers
/// computes it, or f64).
pub(super) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = x.broadcast_mul(&(ms + eps)?.sqrt()?.recip()?)?;
    Ok(normed.broadcast_mul(&weight.to_dtype(x.dtype())?)?)
}

/// [n, H·p] → [H, n, p].
pub(super) fn split_heads(x: &Tensor, heads: usize, p: usize) -> Result<Tensor> {
    let n = x.dim(0)?;
    Ok(x.reshape((n, heads, p))?.transpose(0, 1)?.contiguous()?)
}

/// [H, n, p] → [n, H·p] (the attention output as o_proj reads it).
pub(super) fn merge_heads(o: &Tensor) -> Result<Tensor> {
    let (h, n, p) = o.dims3()?;
    Ok(o.transpose(0, 1)?.contiguous()?.reshape((n, h * p))?)
}

/// The attention block's output: O [H, n, p_v] back to rows [n, H·p_v], through o_proj.
pub(super) fn attention_out(o: &Tensor, o_proj: &Linear) -> Result<Tensor> {
    linear(&merge_heads(o)?, o_proj)
}

/// Rows per chunk of the forward's row-wise work (RMSNorm, the projections, RoPE, the MLP).
/// The chunks run in parallel on the host's threads: candle's element-wise ops run on the calling
/// thread only (runtime.rs), so unchunked they left one of two cores idle for a fifth of a
/// forward. A fixed size, so the bits do not depend on the thread count.
pub(super) const FORWARD_CHUNK_ROWS: usize = 512;

/// `f` on consecutive row chunks [s, s + rows) of 0..n, in parallel on the host (in order on
/// other devices, whose kernels are asynchronous anyway), results in chunk order.
pub(super) fn row_chunks<R: Send>(
    n: usize,
    dev: &candle_core::Device,
    f: impl Fn(usize, usize) -> Result<R> + Sync + Send,
) -> Result<Vec<R>> {
    use rayon::prelude::*;
    let starts: Vec<usize> = (0..n).step_by(FORWARD_CHUNK_ROWS).collect();
    let run = |&s: &usize| f(s, FORWARD_CHUNK_ROWS.min(n - s));
    if dev.is_cpu() {
        // The first error in chunk order, whatever the scheduling (rayon's Result collect returns
        // whichever failed first).
        let results: Vec<Result<R>> = starts.par_iter().map(run).collect();
        results.into_iter().collect()
    } else {
        starts.iter().map(run).collect()
    }
}

/// The embeddings of `ids` ([n, hidden], in `dtype`, f32 or f64) from `embed` [vocab, hidden].
pub(super) fn embed_ids(embed: &Tensor, ids: &[u32], dtype: DType) -> Result<Tensor> {
    if !matches!(dtype, DType::F32 | DType::F64) {
        return Err(usage!(
            "a decoder forward runs in f32 or f64, not {dtype:?}"
        ));
    }
    if ids.is_empty() {
        return Err(usage!("an empty token window has no forward"));
    }
    let vocab = embed.dim(0)?;
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= vocab) {
        return Err(usage!(
            "token id {bad} is outside the model's vocabulary of {vocab} (the tokenizer or the ids do not fit the model)"
        ));
    }
    let ids_t = Tensor::from_vec(ids.to_vec(), ids.len(), embed.device())?;
    Ok(embed.index_select(&ids_t, 0)?.to_dtype(dtype)?)
}

/// The logits X·Wᵀ [m, vocab] of the normed rows X [m, hidden], W the LM head or, tied, the
/// token embeddings.
pub(super) fn lm_logits(x: &Tensor, lm_head: Option<&Tensor>, embed: &Tensor) -> Result<Tensor> {
    let w = lm_head.unwrap_or(embed);
    Ok(x.matmul(&w.to_dtype(x.dtype())?.t()?)?)
}

/// The rows X [m, hidden] through the final RMSNorm and the LM head (no bias, as transformers'
/// `lm_head`): logits [m, vocab] in X's dtype. `embed` is the head where it is tied.
pub(super) fn head_logits(
    x: &Tensor,
    head: &OutputHead,
    embed: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    lm_logits(&rms_norm(x, &head.norm, eps)?, head.lm_head.as_ref(), embed)
}

/// The head of a decoder asked for logits: [`super::Decoder::check_logits_call`] refuses a call
/// without one before any layer runs.
pub(super) fn loaded_head<H>(head: &Option<H>) -> Result<&H> {
    head.as_ref()
        .ok_or_else(|| anyhow::anyhow!("the logits need the whole model (models::Depth::Whole)"))
}
