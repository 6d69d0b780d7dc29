//! The Llama-style decoders (llama, mistral, qwen2, qwen3; docs/reference.md §7.1 "Layers before
//! L", "Layer L"; §10.1 "Model") as a [`Decoder`]: embeddings, RMSNorm, q/k/v (qwen3's per-head
//! norms), rotate-half RoPE with default, linear or llama3 frequencies, a window on Mistral's and
//! Qwen's sliding layers, the SwiGLU MLP, the final norm and the LM head (tied or not), step for
//! step as transformers' eager implementation runs them.
//!
//! candle-transformers' llama/mistral/qwen2/qwen3 models compute attention inside their forward
//! and expose no layer's post-RoPE Q/K/V (nor an f64 path), so the layer is written here.

use anyhow::Result;
use candle_core::{DType, Tensor};

use super::blocks::{
    embed_ids, head_logits, linear, loaded_head, rms_norm, row_chunks, split_heads,
};
pub use super::blocks::{Linear, OutputHead, Weight};
use super::decoder::{Decoder, DecoderShape, LayerInputs, Positions};
use super::decoder_config::DecoderConfig;
use super::rope;
use crate::attention::spec::{exact_attention, AttentionSpec};

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

/// The token embeddings and layers 0..=L (f32, on the run's device), and for a whole model
/// (`models::Depth::Whole`) every layer and the output head.
#[derive(Debug, Clone)]
pub struct DecoderWeights {
    /// [vocab, hidden].
    pub embed: Weight,
    pub layers: Vec<DecoderLayerWeights>,
    /// The final norm and LM head; None when loaded only through layer L.
    pub head: Option<OutputHead>,
}

impl LayerRest {
    /// The projections widened to `dtype`, for the layer's row chunks (issue 56).
    fn widened(&self, dtype: DType) -> Result<Self> {
        Ok(Self {
            o: self.o.widened(dtype)?,
            post_norm: self.post_norm.clone(),
            gate: self.gate.widened(dtype)?,
            up: self.up.widened(dtype)?,
            down: self.down.widened(dtype)?,
        })
    }
}

impl DecoderWeights {
    /// L, the measured layer.
    pub fn layer(&self) -> usize {
        self.layers.len() - 1
    }
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

/// Post-RoPE Q [H, n, p], K and V [H_kv, n, p] of one layer from its input X [n, hidden], in
/// row chunks ([`row_chunks`]).
fn layer_qkv(
    x: &Tensor,
    lw: &DecoderLayerWeights,
    cfg: &DecoderConfig,
    cos: &Tensor,
    sin: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let n = x.dim(0)?;
    // The projections widened once for the layer's row chunks (issue 56), dropped after it.
    let dt = x.dtype();
    let lw = &DecoderLayerWeights {
        q: lw.q.widened(dt)?,
        k: lw.k.widened(dt)?,
        v: lw.v.widened(dt)?,
        rest: None,
        ..lw.clone()
    };
    if n <= super::blocks::FORWARD_CHUNK_ROWS {
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

/// Layer `l`'s output for the rows X [m, hidden] from their attention O [H, m, p]: the output
/// projection, the residual and the SwiGLU MLP.
fn layer_output(
    x: &Tensor,
    o: &Tensor,
    l: usize,
    w: &DecoderWeights,
    cfg: &DecoderConfig,
) -> Result<Tensor> {
    let rest = w.layers[l]
        .rest
        .as_ref()
        .expect("layers before L carry o_proj and the MLP")
        .widened(x.dtype())?;
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

/// A Llama-style decoder (llama, mistral, qwen2, qwen3): its config and weights, loaded through
/// layer L or whole.
pub struct Llama {
    pub cfg: DecoderConfig,
    pub weights: DecoderWeights,
}

impl Decoder for Llama {
    fn model_type(&self) -> &'static str {
        self.cfg.family.model_type()
    }

    fn shape(&self) -> DecoderShape {
        let c = &self.cfg;
        DecoderShape {
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            head_dim_v: c.head_dim,
            layers: c.num_hidden_layers,
            max_position_embeddings: c.max_position_embeddings,
            vocab_size: c.vocab_size,
            hidden: c.hidden_size,
            intermediate: c.intermediate_size,
        }
    }

    /// Plain causal attention, windowed on a Mistral layer or a Qwen sliding layer.
    fn attention_spec(&self, layer: usize) -> AttentionSpec {
        self.cfg.attention_spec(layer)
    }

    fn layer_rope(&self, _layer: usize) -> Option<rope::LayerRope> {
        Some(rope::LayerRope {
            inv_freq: rope::inv_freq(&self.cfg.rope, self.cfg.head_dim),
            attention_factor: 1.0,
        })
    }

    fn loaded_layers(&self) -> usize {
        self.weights.layers.len()
    }

    fn has_head(&self) -> bool {
        self.weights.head.is_some()
    }

    fn embed(&self, ids: &[u32], dtype: DType) -> Result<(Tensor, Positions)> {
        let x = embed_ids(&self.weights.embed, ids, dtype)?;
        let dev = self.weights.embed.device();
        let rope = rope::cos_sin(&self.cfg.rope, self.cfg.head_dim, ids.len(), dtype, dev)?;
        Ok((x, Positions(vec![rope])))
    }

    fn attention_inputs(&self, x: &Tensor, l: usize, pos: &Positions) -> Result<LayerInputs> {
        let (cos, sin) = pos.single();
        let qkv = layer_qkv(x, &self.weights.layers[l], &self.cfg, cos, sin)?;
        Ok(LayerInputs::qkv(qkv))
    }

    fn finish(&self, x: &Tensor, o: &Tensor, l: usize) -> Result<Tensor> {
        layer_output(x, o, l, &self.weights, &self.cfg)
    }

    fn head_logits(&self, x: &Tensor) -> Result<Tensor> {
        let head = loaded_head(&self.weights.head)?;
        head_logits(x, head, &self.weights.embed, self.cfg.rms_norm_eps)
    }
}

#[cfg(test)]
#[path = "llama_tests.rs"]
mod tests;
