//! The families of docs/reference.md §7.7 (gemma2, gemma3, phi3, gpt_oss, deepseek_v2/v3): each is
//! one file that turns config.json and its weights into a [`FamilyModel`], plus one line in
//! [`FAMILIES`]. A family's forward runs the layers before L as transformers' eager forward of that
//! family does, each layer's attention through its own [`AttentionSpec`], and stops at layer L
//! with the post-RoPE Q, K, V (not multiplied by τ) and the layer's spec: the dump.
//!
//! The Llama-style families (llama, mistral, qwen2, qwen3) keep their own path (`llama.rs`), which
//! also serves the whole-model view of §10.

use std::ops::Range;

use anyhow::Result;
use candle_core::{DType, Tensor};
use serde_json::{Map, Value};

use super::continuation::PromptCache;
use super::llama::AttentionHook;
use crate::attention::spec::AttentionSpec;
use crate::usage;

/// The head layout and size of a family model.
#[derive(Debug, Clone, PartialEq)]
pub struct FamilyShape {
    /// H: query heads.
    pub heads: usize,
    /// H_kv: K/V heads of the dumped view (H for MLA's materialised K/V).
    pub kv_heads: usize,
    /// p_qk.
    pub head_dim: usize,
    /// p_v (≠ p_qk for MLA).
    pub head_dim_v: usize,
    pub layers: usize,
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
}

/// Layer L's dump: what `dump-qkv` writes and a sweep measures.
pub struct LayerDump {
    /// [H, n, p_qk], post-RoPE (and post q/k-norm), not multiplied by τ.
    pub q: Tensor,
    /// [H_kv, n, p_qk].
    pub k: Tensor,
    /// [H_kv, n, p_v].
    pub v: Tensor,
    /// Layer L's exact attention.
    pub spec: AttentionSpec,
    /// Further tensors of the dump: `sinks` [H] (f32), MLA's `kv_latent` [n, r + d_R] and
    /// `w_kv_b` [H, d_nope + d_v, r].
    pub extra: Vec<(String, Tensor)>,
    /// Further sidecar fields: phi3's `rope_factors`, MLA's `mla` object.
    pub sidecar: Map<String, Value>,
}

/// A decoder of a §7.7 family, loaded through layer L.
pub trait FamilyModel: Send + Sync {
    /// config.json's `model_type`.
    fn model_type(&self) -> &'static str;
    fn shape(&self) -> FamilyShape;
    /// Whether the layers are Multi-head Latent Attention (docs/reference.md §7.7.5): what a
    /// deployed cache holds is then the latent row, not the materialised per-head K/V.
    fn is_mla(&self) -> bool {
        false
    }
    /// On an MLA layer, the values of its latent row, r + d_R (what a §8 cache stores per token).
    fn mla_latent_width(&self) -> Option<usize> {
        None
    }
    /// Layer `layer`'s exact attention, for a loaded layer (0..=L): from the config, and for
    /// gpt-oss the sinks of its weights.
    fn attention_spec(&self, layer: usize) -> AttentionSpec;
    /// Layer `layer`'s sliding window, for any layer of the model: from the config alone.
    fn window(&self, layer: usize) -> Option<usize> {
        self.attention_spec(layer).window
    }
    /// Layer L's dump for the token window `ids` at positions 0..n−1, in `dtype` (f32 or f64).
    fn layer_dump(&self, ids: &[u32], dtype: DType) -> Result<LayerDump>;
    /// The logits [rows, vocab] (in `dtype`) of the whole model (loaded at [`Depth::Whole`]) on
    /// the window `ids`, every layer's attention through `hook` with that layer's spec; only the
    /// rows `rows` go through the final norm and the LM head (docs/reference.md §10.1).
    fn forward_logits(
        &self,
        ids: &[u32],
        dtype: DType,
        hook: &dyn AttentionHook,
        rows: Range<usize>,
    ) -> Result<Tensor> {
        let _ = (ids, dtype, hook, rows);
        Err(usage!(
            "an end-to-end run of a {} model is not supported yet (docs/reference.md §10); e2e reads {}",
            self.model_type(),
            super::SUPPORTED_FAMILIES
        ))
    }
    /// Whether [`Self::continuation_logits`] is there.
    fn has_continuation(&self) -> bool {
        false
    }
    /// Decode mode's continuation-only forward (docs/reference.md §10.1 [REC], as
    /// [`super::continuation_logits`] for the Llama-style decoders): the logits of `rows` (in
    /// n_p..n) with every layer's prompt rows from `prompt`; None where the family has none.
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

#[cfg(test)]
#[path = "family_tests.rs"]
pub(crate) mod tests;
