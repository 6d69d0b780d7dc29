//! A decoder run whole (docs/reference.md §10.1): what the end-to-end protocol needs of a model,
//! the Llama-style decoders and the §7.7 families alike. The protocol sees the layer count, each
//! layer's exact attention (for its refusals before a window runs), and the forward with a hook
//! in every layer; decode mode's continuation-only forward where the model has one.

use std::ops::Range;

use anyhow::Result;
use candle_core::{DType, Tensor};

use super::continuation::{continuation_logits, PromptCache};
use super::decoder_config::DecoderConfig;
use super::family::FamilyModel;
use super::llama::{forward_logits, AttentionHook, DecoderWeights};
use crate::attention::spec::AttentionSpec;

/// A whole decoder: every layer, the final norm and the LM head.
pub trait WholeDecoder: Sync {
    /// L, the number of layers.
    fn num_layers(&self) -> usize;
    fn vocab_size(&self) -> usize;
    /// p_qk, the query/key head size (what a method's head-size check reads).
    fn head_dim(&self) -> usize;
    /// Layer `layer`'s exact attention: its scale, cap, window and sinks (§7.7.0).
    fn layer_spec(&self, layer: usize) -> AttentionSpec;
    /// Whether the layers are Multi-head Latent Attention (§7.7.5).
    fn is_mla(&self) -> bool {
        false
    }
    /// On MLA, r + d_R, the values of a token's latent row: what a §8 cache's format groups
    /// there (its head-size check reads it, as the sweep's).
    fn mla_latent_width(&self) -> Option<usize> {
        None
    }
    /// The logits [rows, vocab] in `dtype` of the window `ids`, every layer's attention
    /// through `hook`, only the rows `rows` through the head.
    fn forward_logits(
        &self,
        ids: &[u32],
        dtype: DType,
        hook: &dyn AttentionHook,
        rows: Range<usize>,
    ) -> Result<Tensor>;
    /// Whether [`Self::continuation_logits`] is there (so that the exact run keeps every
    /// layer's prompt rows only where they will be read).
    fn has_continuation(&self) -> bool {
        false
    }
    /// Decode mode's continuation-only forward on the exact run's prompt rows (§10.1 [REC]);
    /// None where the model has none, and then the full forward serves: its prompt rows are
    /// exact in every layer, so the numbers are the same up to rounding.
    fn continuation_logits(
        &self,
        ids: &[u32],
        dtype: DType,
        hook: &dyn AttentionHook,
        prompt: &PromptCache,
        rows: Range<usize>,
    ) -> Option<Result<Tensor>> {
        let _ = (ids, dtype, hook, prompt, rows);
        None
    }
}

/// A Llama-style decoder (llama, mistral, qwen2, qwen3) loaded whole.
pub struct LlamaDecoder<'a> {
    pub weights: &'a DecoderWeights,
    pub cfg: &'a DecoderConfig,
}

impl WholeDecoder for LlamaDecoder<'_> {
    fn num_layers(&self) -> usize {
        self.cfg.num_hidden_layers
    }
    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }
    fn head_dim(&self) -> usize {
        self.cfg.head_dim
    }
    fn layer_spec(&self, layer: usize) -> AttentionSpec {
        self.cfg.attention_spec(layer)
    }
    fn forward_logits(
        &self,
        ids: &[u32],
        dtype: DType,
        hook: &dyn AttentionHook,
        rows: Range<usize>,
    ) -> Result<Tensor> {
        forward_logits(self.weights, self.cfg, ids, dtype, hook, rows)
    }
    fn has_continuation(&self) -> bool {
        true
    }
    fn continuation_logits(
        &self,
        ids: &[u32],
        dtype: DType,
        hook: &dyn AttentionHook,
        prompt: &PromptCache,
        rows: Range<usize>,
    ) -> Option<Result<Tensor>> {
        Some(continuation_logits(
            self.weights,
            self.cfg,
            ids,
            dtype,
            hook,
            prompt,
            rows,
        ))
    }
}

/// A §7.7 family loaded whole ([`super::Depth::Whole`]).
pub struct FamilyDecoder<'a>(pub &'a dyn FamilyModel);

impl WholeDecoder for FamilyDecoder<'_> {
    fn num_layers(&self) -> usize {
        self.0.shape().layers
    }
    fn vocab_size(&self) -> usize {
        self.0.shape().vocab_size
    }
    fn head_dim(&self) -> usize {
        self.0.shape().head_dim
    }
    fn layer_spec(&self, layer: usize) -> AttentionSpec {
        self.0.attention_spec(layer)
    }
    fn is_mla(&self) -> bool {
        self.0.is_mla()
    }
    fn mla_latent_width(&self) -> Option<usize> {
        self.0.mla_latent_width()
    }
    fn forward_logits(
        &self,
        ids: &[u32],
        dtype: DType,
        hook: &dyn AttentionHook,
        rows: Range<usize>,
    ) -> Result<Tensor> {
        self.0.forward_logits(ids, dtype, hook, rows)
    }
    fn has_continuation(&self) -> bool {
        self.0.has_continuation()
    }
    fn continuation_logits(
        &self,
        ids: &[u32],
        dtype: DType,
        hook: &dyn AttentionHook,
        prompt: &PromptCache,
        rows: Range<usize>,
    ) -> Option<Result<Tensor>> {
        self.0.continuation_logits(ids, dtype, hook, prompt, rows)
    }
}
