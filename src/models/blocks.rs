//! The numerics every decoder family's layer is built of, written once: the Linear layer,
//! RMSNorm, the head split and merge, the row chunks of the row-wise work, the embedding lookup
//! and the LM head.

use std::sync::Arc;

use anyhow::Result;
use candle_core::quantized::{QStorage, QTensor};
use candle_core::{DType, Device, Tensor, D};

use crate::usage;

/// A weight matrix [rows, cols] as it is kept in memory (issue 56): widened to f32 at load, or
/// as stored — bf16/f16 values, or a GGUF's ggml blocks — and widened to the run's dtype where a
/// product reads it ([`Weight::widen`]), then dropped. Widening is exact (bf16/f16 → f32, and a
/// block's dequantization is the same function on the same bytes as at load), so both forms give
/// the same bits.
#[derive(Debug, Clone)]
pub enum Weight {
    /// Float values: f32 (widened at load), or bf16/f16 as a safetensors checkpoint stores them.
    Float(Tensor),
    /// ggml blocks as a GGUF stores them, rows in the checkpoint's order, on the host; `device`
    /// is where the widened values go.
    Ggml { q: Arc<QTensor>, device: Device },
}

impl From<Tensor> for Weight {
    fn from(t: Tensor) -> Self {
        Weight::Float(t)
    }
}

impl Weight {
    pub fn dims(&self) -> &[usize] {
        match self {
            Weight::Float(t) => t.dims(),
            Weight::Ggml { q, .. } => q.shape().dims(),
        }
    }

    /// The device the widened values go to.
    pub fn device(&self) -> &Device {
        match self {
            Weight::Float(t) => t.device(),
            Weight::Ggml { device, .. } => device,
        }
    }

    /// The values in `dtype` on the run's device.
    pub fn widen(&self, dtype: DType) -> Result<Tensor> {
        match self {
            Weight::Float(t) => Ok(t.to_dtype(dtype)?),
            Weight::Ggml { q, device } => {
                Ok(dequantize_parallel(q)?.to_device(device)?.to_dtype(dtype)?)
            }
        }
    }

    /// The bytes it holds in memory.
    pub fn bytes(&self) -> usize {
        match self {
            Weight::Float(t) => t.elem_count() * t.dtype().size_in_bytes(),
            Weight::Ggml { q, .. } => q.storage_size_in_bytes(),
        }
    }

    /// Rows `start..start + len` (a fused projection's part), in the same form.
    pub fn rows(&self, start: usize, len: usize) -> Result<Weight> {
        match self {
            Weight::Float(t) => Ok(Weight::Float(t.narrow(0, start, len)?.contiguous()?)),
            Weight::Ggml { q, device } => {
                let order: Vec<usize> = (start..start + len).collect();
                Ok(Weight::Ggml {
                    q: Arc::new(ggml_rows(q, &order)?),
                    device: device.clone(),
                })
            }
        }
    }

    /// The rows `ids` [n, cols] in `dtype` (the embedding lookup): from ggml blocks only those
    /// rows are widened.
    pub fn select_rows(&self, ids: &[u32], dtype: DType) -> Result<Tensor> {
        match self {
            Weight::Float(t) => {
                let ids_t = Tensor::from_vec(ids.to_vec(), ids.len(), t.device())?;
                Ok(t.index_select(&ids_t, 0)?.to_dtype(dtype)?)
            }
            Weight::Ggml { q, device } => {
                let order: Vec<usize> = ids.iter().map(|&i| i as usize).collect();
                let rows = Weight::Ggml {
                    q: Arc::new(ggml_rows(q, &order)?),
                    device: device.clone(),
                };
                rows.widen(dtype)
            }
        }
    }
}

/// Refuses a weight stored as integers (issue 57): converting them to floats would silently
/// compute with a checkpoint that is not one.
pub(super) fn check_float(t: &Tensor, name: &str, what: &str) -> Result<()> {
    if !matches!(
        t.dtype(),
        DType::F32 | DType::F64 | DType::BF16 | DType::F16
    ) {
        return Err(usage!(
            "weights {what}: tensor '{name}' is stored as {:?}; a weight must be f32, bf16 or f16 (an integer tensor is no weight of this model: the file is corrupt or another kind of checkpoint)",
            t.dtype()
        ));
    }
    Ok(())
}

/// ggml blocks [rows, cols] dequantized to f32 on the host, row ranges in parallel (candle's
/// dequantization runs on one thread): each row is whole blocks, dequantized by the same
/// function on the same bytes, so the values are those of one call on the whole tensor.
pub(super) fn dequantize_parallel(q: &QTensor) -> Result<Tensor> {
    use rayon::prelude::*;
    let rows = q.shape().dims()[0];
    let threads = rayon::current_num_threads();
    const MIN_ROWS: usize = 64;
    if rows < 2 * MIN_ROWS || threads < 2 {
        return Ok(q.dequantize(&Device::Cpu)?);
    }
    let step = rows.div_ceil(threads * 4).max(MIN_ROWS);
    let starts: Vec<usize> = (0..rows).step_by(step).collect();
    let parts = starts
        .par_iter()
        .map(|&s| {
            let order: Vec<usize> = (s..(s + step).min(rows)).collect();
            Ok(ggml_rows(q, &order)?.dequantize(&Device::Cpu)?)
        })
        .collect::<Result<Vec<Tensor>>>()?;
    Ok(Tensor::cat(&parts, 0)?)
}

/// The rows `order` of ggml blocks [rows, cols] as a new [order.len(), cols] block tensor: each
/// row is whole blocks (cols is a multiple of the block size, which `QTensor::new` checked), so a
/// row's bytes are its own and dequantize to the same values wherever they sit.
pub(super) fn ggml_rows(q: &QTensor, order: &[usize]) -> Result<QTensor> {
    let dims = q.shape().dims();
    let (rows, cols) = (dims[0], dims[1..].iter().product::<usize>());
    let dtype = q.dtype();
    let row_bytes = cols / dtype.block_size() * dtype.type_size();
    let data = q.data()?;
    anyhow::ensure!(
        data.len() == rows * row_bytes,
        "ggml rows: {} bytes for {rows} rows of {row_bytes}",
        data.len()
    );
    let mut out = Vec::with_capacity(order.len() * row_bytes);
    for &r in order {
        anyhow::ensure!(r < rows, "ggml rows: row {r} of {rows}");
        out.extend_from_slice(&data[r * row_bytes..(r + 1) * row_bytes]);
    }
    let mut shape = dims.to_vec();
    shape[0] = order.len();
    let storage = QStorage::from_data(std::borrow::Cow::Owned(out), &Device::Cpu, dtype)?;
    Ok(QTensor::new(storage, shape)?)
}

/// How a loader keeps a checkpoint's weight matrices (issue 56): widened to f32 at load (the
/// fastest forward where memory allows), or as stored and widened a layer at a time. Both give
/// the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightForm {
    Widened,
    Stored,
}

/// How a decoder's weights are kept, and the memory they were estimated to take before loading
/// (issue 56).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightPlan {
    pub form: WeightForm,
    /// The weights' estimated peak; None for an initialized model (no file).
    pub estimate_bytes: Option<u64>,
}

/// A Linear layer: y = x·Wᵀ (+ b), W [out, in] as kept ([`Weight`]), the bias f32.
#[derive(Debug, Clone)]
pub struct Linear {
    pub weight: Weight,
    pub bias: Option<Tensor>,
}

impl Linear {
    /// The layer with its weight widened to `dtype` (f32 or f64): what a layer's row chunks
    /// share, widened once per layer rather than once per chunk.
    pub fn widened(&self, dtype: DType) -> Result<Linear> {
        Ok(Linear {
            weight: Weight::Float(self.weight.widen(dtype)?),
            bias: self.bias.clone(),
        })
    }
}

/// The final RMSNorm and the LM head of a whole model.
#[derive(Debug, Clone)]
pub struct OutputHead {
    pub norm: Tensor,
    /// [vocab, hidden]; None when tied to the token embeddings.
    pub lm_head: Option<Weight>,
}

pub(super) fn linear(x: &Tensor, l: &Linear) -> Result<Tensor> {
    let y = x.matmul(&l.weight.widen(x.dtype())?.t()?)?;
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
pub(super) fn embed_ids(embed: &Weight, ids: &[u32], dtype: DType) -> Result<Tensor> {
    if !matches!(dtype, DType::F32 | DType::F64) {
        return Err(usage!(
            "a decoder forward runs in f32 or f64, not {dtype:?}"
        ));
    }
    if ids.is_empty() {
        return Err(usage!("an empty token window has no forward"));
    }
    let vocab = embed.dims()[0];
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= vocab) {
        return Err(usage!(
            "token id {bad} is outside the model's vocabulary of {vocab} (the tokenizer or the ids do not fit the model)"
        ));
    }
    embed.select_rows(ids, dtype)
}

/// The logits X·Wᵀ [m, vocab] of the normed rows X [m, hidden], W the LM head or, tied, the
/// token embeddings.
pub(super) fn lm_logits(x: &Tensor, lm_head: Option<&Weight>, embed: &Weight) -> Result<Tensor> {
    let w = lm_head.unwrap_or(embed);
    // One product over the whole vocabulary, its weight widened whole for it (2.2 GB for a
    // 152k × 3584 head in f32): a product over slices of the vocabulary is not bit for bit the
    // whole one (gemm takes another path on a ragged slice; measured on a Q8_0 head, issue 56).
    Ok(x.matmul(&w.widen(x.dtype())?.t()?)?)
}

/// The rows X [m, hidden] through the final RMSNorm and the LM head (no bias, as transformers'
/// `lm_head`): logits [m, vocab] in X's dtype. `embed` is the head where it is tied.
pub(super) fn head_logits(
    x: &Tensor,
    head: &OutputHead,
    embed: &Weight,
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

#[cfg(test)]
#[path = "blocks_tests.rs"]
mod tests;
