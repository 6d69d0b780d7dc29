//! The Llama-style decoder forward (llama, mistral, qwen2, qwen3 share it; docs/reference.md §7.1 "Layers
//! before L", "Layer L"; §10.1 "Model"): embeddings → layers → final norm → LM head, each layer's
//! attention called through one [`AttentionHook`] (exact, a method, or a user's callable). The
//! Q/K/V dump is this forward stopped at layer L ([`window_qkv`]); the whole model gives logits
//! ([`forward_logits`]).
//!
//! candle-transformers' llama/mistral/qwen2/qwen3 models compute attention inside their forward
//! and expose no layer's post-RoPE Q/K/V (nor an f64 path), so the forward is written here, step
//! for step as transformers' eager implementation runs it.

use std::sync::Arc;

use anyhow::Result;
use candle_core::{DType, Tensor, D};

use super::decoder_config::DecoderConfig;
use super::rope;
use crate::attention::latent::LayerLatent;
use crate::attention::spec::{exact_attention, AttentionSpec};

/// A Linear layer: y = x·Wᵀ (+ b), W [out, in], f32.
#[derive(Debug, Clone)]
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

/// What layer L needs (every layer has it): the input RMSNorm, the q/k/v projections and qwen3's
/// per-head norms. Layers before L also carry [`LayerRest`].
#[derive(Debug, Clone)]
pub struct DecoderLayerWeights {
    pub input_norm: Tensor,
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    /// qwen3's q_norm / k_norm weights ([p]).
    pub q_norm: Option<Tensor>,
    pub k_norm: Option<Tensor>,
    /// o_proj, the post-attention norm and the MLP; None for the measured layer.
    pub rest: Option<LayerRest>,
}

/// The parts of a layer that only layers before L need.
#[derive(Debug, Clone)]
pub struct LayerRest {
    pub o: Linear,
    pub post_norm: Tensor,
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

/// The final RMSNorm and the LM head of a whole model.
#[derive(Debug, Clone)]
pub struct OutputHead {
    pub norm: Tensor,
    /// [vocab, hidden]; None when tied to the token embeddings.
    pub lm_head: Option<Tensor>,
}

/// The token embeddings and layers 0..=L (f32, on the run's device), and for a whole model
/// (`models::Depth::Whole`) every layer and the output head.
#[derive(Debug, Clone)]
pub struct DecoderWeights {
    /// [vocab, hidden].
    pub embed: Tensor,
    pub layers: Vec<DecoderLayerWeights>,
    /// The final norm and LM head; None when loaded only through layer L.
    pub head: Option<OutputHead>,
}

/// The one seam every layer's attention passes through: layer `layer`'s post-RoPE Q [H, n, p],
/// K [H_kv, n, p] and V [H_kv, n, p_v], and the layer's exact attention (its window, scale, cap
/// and sinks) in; O [H, n, p_v] out, in Q's dtype.
pub trait AttentionHook: Sync {
    fn attend(
        &self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        spec: &AttentionSpec,
    ) -> Result<Tensor>;

    /// [`Self::attend`] on a Multi-head Latent Attention layer (docs/reference.md §7.7.5), which
    /// also hands the layer's latent rows [c; k_pe] and W_kvb: what its deployed cache holds, and
    /// so what a §8 cache quantizes there (§7.7.6). Q, K, V are the materialised view, O the
    /// same. A hook that has no use for the latent is its `attend`.
    fn attend_latent(
        &self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        spec: &AttentionSpec,
        latent: &Arc<LayerLatent>,
    ) -> Result<Tensor> {
        let _ = latent;
        self.attend(layer, q, k, v, spec)
    }
}

/// The model's own attention: the layer's exact target (docs/reference.md §7.7.0).
pub struct ExactAttention;

impl AttentionHook for ExactAttention {
    fn attend(
        &self,
        _layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        spec: &AttentionSpec,
    ) -> Result<Tensor> {
        exact_attention(q, k, v, spec)
    }
}

impl DecoderWeights {
    /// L, the measured layer.
    pub fn layer(&self) -> usize {
        self.layers.len() - 1
    }
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

/// Exact causal attention with τ = 1/√p and, if given, a sliding window W (docs/reference.md
/// §7.2): the plain Llama-style target of [`AttentionSpec::causal`], through
/// [`crate::attention::spec::exact_attention`]. q [H, n, p], k and v [H_kv, n, p] → [H, n, p].
pub fn causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    window: Option<usize>,
) -> Result<Tensor> {
    let p = q.dims3()?.2;
    exact_attention(q, k, v, &AttentionSpec::causal(p, window))
}

/// [n, H·p] → [H, n, p].
pub(super) fn split_heads(x: &Tensor, heads: usize, p: usize) -> Result<Tensor> {
    let n = x.dim(0)?;
    Ok(x.reshape((n, heads, p))?.transpose(0, 1)?.contiguous()?)
}

/// Rows per chunk of the forward's row-wise work (RMSNorm, the projections, RoPE, the MLP).
/// The chunks run in parallel on the host's threads: candle's element-wise ops run on the calling
/// thread only (runtime.rs), so unchunked they left one of two cores idle for a fifth of a
/// forward. A fixed size, so the bits do not depend on the thread count.
const FORWARD_CHUNK_ROWS: usize = 512;

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

/// Post-RoPE Q [H, n, p], K and V [H_kv, n, p] of one layer from its input X [n, hidden], in
/// row chunks ([`row_chunks`]).
pub(super) fn layer_qkv(
    x: &Tensor,
    lw: &DecoderLayerWeights,
    cfg: &DecoderConfig,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let n = x.dim(0)?;
    if n <= FORWARD_CHUNK_ROWS {
        return layer_qkv_rows(x, lw, cfg, cos, sin);
    }
    let parts = row_chunks(n, x.device(), |s, rows| {
        layer_qkv_rows(
            &x.narrow(0, s, rows)?,
            lw,
            cfg,
            &cos.narrow(0, s, rows)?,
            &sin.narrow(0, s, rows)?,
        )
    })?;
    let cat = |pick: fn(&(Tensor, Tensor, Tensor)) -> &Tensor| -> Result<Tensor> {
        let ts: Vec<&Tensor> = parts.iter().map(pick).collect();
        Ok(Tensor::cat(&ts, 1)?)
    };
    Ok((cat(|t| &t.0)?, cat(|t| &t.1)?, cat(|t| &t.2)?))
}

/// [`layer_qkv`] of one chunk of rows (`cos`, `sin` the chunk's rows of the RoPE tables).
fn layer_qkv_rows(
    x: &Tensor,
    lw: &DecoderLayerWeights,
    cfg: &DecoderConfig,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (h, h_kv, p) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
    );
    let hn = rms_norm(x, &lw.input_norm, cfg.rms_norm_eps)?;
    let mut q = split_heads(&linear(&hn, &lw.q)?, h, p)?;
    let mut k = split_heads(&linear(&hn, &lw.k)?, h_kv, p)?;
    let v = split_heads(&linear(&hn, &lw.v)?, h_kv, p)?;
    // qwen3: RMSNorm over each head's p dims, before RoPE.
    if let Some(w) = &lw.q_norm {
        q = rms_norm(&q, w, cfg.rms_norm_eps)?;
    }
    if let Some(w) = &lw.k_norm {
        k = rms_norm(&k, w, cfg.rms_norm_eps)?;
    }
    Ok((rope::apply(&q, cos, sin)?, rope::apply(&k, cos, sin)?, v))
}

/// One whole decoder layer `l` (eval mode), as transformers' `LlamaDecoderLayer.forward`, its
/// attention through `hook`.
fn decoder_layer(
    x: &Tensor,
    l: usize,
    w: &DecoderWeights,
    cfg: &DecoderConfig,
    rope: &(Tensor, Tensor),
    hook: &dyn AttentionHook,
) -> Result<Tensor> {
    let (q, k, v) = layer_qkv(x, &w.layers[l], cfg, &rope.0, &rope.1)?;
    let o = attend_checked(hook, l, cfg, &q, &k, &v)?;
    layer_output(x, &o, l, w, cfg)
}

/// The hook's O for layer `l`, refused unless it is shaped like Q.
pub(super) fn attend_checked(
    hook: &dyn AttentionHook,
    l: usize,
    cfg: &DecoderConfig,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
) -> Result<Tensor> {
    let o = hook.attend(l, q, k, v, &cfg.attention_spec(l))?;
    if o.dims() != q.dims() {
        return Err(crate::usage!(
            "the attention of layer {l} returned shape {:?}; it must return O shaped like Q, {:?}",
            o.dims(),
            q.dims()
        ));
    }
    Ok(o)
}

/// Layer `l`'s output for the rows X [m, hidden] from their attention O [H, m, p]: the output
/// projection, the residual and the SwiGLU MLP.
pub(super) fn layer_output(
    x: &Tensor,
    o: &Tensor,
    l: usize,
    w: &DecoderWeights,
    cfg: &DecoderConfig,
) -> Result<Tensor> {
    let rest = w.layers[l]
        .rest
        .as_ref()
        .expect("layers before L carry o_proj and the MLP");
    let n = x.dim(0)?;
    let ctx = o
        .to_dtype(x.dtype())?
        .transpose(0, 1)?
        .contiguous()?
        .reshape((n, cfg.num_attention_heads * cfg.head_dim))?;
    // The output projection and the SwiGLU MLP are row-wise: row chunks in parallel, which also
    // bounds the [rows, intermediate] activations.
    let outs = row_chunks(n, x.device(), |s, rows| {
        let xs = (x.narrow(0, s, rows)? + linear(&ctx.narrow(0, s, rows)?, &rest.o)?)?;
        let h = rms_norm(&xs, &rest.post_norm, cfg.rms_norm_eps)?;
        let act = (linear(&h, &rest.gate)?.silu()? * linear(&h, &rest.up)?)?;
        Ok((xs + linear(&act, &rest.down)?)?)
    })?;
    Ok(Tensor::cat(&outs, 0)?)
}

/// The embedded window `ids` ([n, hidden], in `dtype`) and the RoPE tables of positions 0..n−1.
pub(super) fn embed(
    w: &DecoderWeights,
    cfg: &DecoderConfig,
    ids: &[u32],
    dtype: DType,
) -> Result<(Tensor, (Tensor, Tensor))> {
    if !matches!(dtype, DType::F32 | DType::F64) {
        return Err(crate::usage!(
            "a decoder forward runs in f32 or f64, not {dtype:?}"
        ));
    }
    if ids.is_empty() {
        return Err(crate::usage!("an empty token window has no forward"));
    }
    let dev = w.embed.device();
    let n = ids.len();
    let vocab = w.embed.dim(0)?;
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= vocab) {
        return Err(crate::usage!(
            "token id {bad} is outside the model's vocabulary of {vocab} (the tokenizer or the ids do not fit the model)"
        ));
    }
    let ids_t = Tensor::from_vec(ids.to_vec(), n, dev)?;
    let x = w.embed.index_select(&ids_t, 0)?.to_dtype(dtype)?;
    let rope = rope::cos_sin(&cfg.rope, cfg.head_dim, n, dtype, dev)?;
    Ok((x, rope))
}

/// X after layers 0..`upto` (exclusive), each layer's attention through `hook`.
pub(super) fn run_layers(
    mut x: Tensor,
    upto: usize,
    w: &DecoderWeights,
    cfg: &DecoderConfig,
    rope: &(Tensor, Tensor),
    hook: &dyn AttentionHook,
) -> Result<Tensor> {
    for l in 0..upto {
        // A layer at n = 8192 takes seconds: a signal stops the forward here (nothing of it is kept).
        crate::interrupt::check()?;
        x = decoder_layer(&x, l, w, cfg, rope, hook)?;
    }
    Ok(x)
}

/// Post-RoPE Q [H, n, p], K [H_kv, n, p] and V [H_kv, n, p] of layer L (the last loaded layer) for
/// the token window `ids` at positions 0..n−1, in `dtype` (f32 or f64): the forward with exact
/// attention, stopped at layer L. Layers before L run exactly as transformers' eager
/// implementation (docs/reference.md §7.1).
pub fn window_qkv(
    weights: &DecoderWeights,
    cfg: &DecoderConfig,
    ids: &[u32],
    dtype: DType,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (x, rope) = embed(weights, cfg, ids, dtype)?;
    let last = weights.layers.len() - 1;
    let x = run_layers(x, last, weights, cfg, &rope, &ExactAttention)?;
    layer_qkv(&x, &weights.layers[last], cfg, &rope.0, &rope.1)
}

/// The logits ([rows, vocab], in `dtype`) of the whole model (docs/reference.md §10.1) on the window
/// `ids`, every layer's attention through `hook`; only the rows `rows` go through the final norm
/// and the LM head (the scored positions: n_f of n rows, and the head is the model's largest
/// product).
pub fn forward_logits(
    weights: &DecoderWeights,
    cfg: &DecoderConfig,
    ids: &[u32],
    dtype: DType,
    hook: &dyn AttentionHook,
    rows: std::ops::Range<usize>,
) -> Result<Tensor> {
    let head = weights.head.as_ref().ok_or_else(|| {
        anyhow::anyhow!(
            "the logits need the whole model (models::Depth::Whole); only layers 0..={} are loaded",
            weights.layer()
        )
    })?;
    if weights.layers.len() != cfg.num_hidden_layers || rows.end > ids.len() || rows.is_empty() {
        return Err(anyhow::anyhow!(
            "forward_logits: {} of {} layers loaded, rows {rows:?} of {}",
            weights.layers.len(),
            cfg.num_hidden_layers,
            ids.len()
        ));
    }
    let (x, rope) = embed(weights, cfg, ids, dtype)?;
    let x = run_layers(x, weights.layers.len(), weights, cfg, &rope, hook)?;
    output_logits(weights, head, cfg, &x.narrow(0, rows.start, rows.len())?)
}

/// The final norm and the LM head (tied or not) of the rows X [m, hidden].
pub(super) fn output_logits(
    weights: &DecoderWeights,
    head: &OutputHead,
    cfg: &DecoderConfig,
    x: &Tensor,
) -> Result<Tensor> {
    let x = rms_norm(x, &head.norm, cfg.rms_norm_eps)?;
    let w = head.lm_head.as_ref().unwrap_or(&weights.embed);
    Ok(x.matmul(&w.to_dtype(x.dtype())?.t()?)?)
}

#[cfg(test)]
#[path = "llama_tests.rs"]
mod tests;
