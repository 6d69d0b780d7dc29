//! The hook every decoder layer's attention goes through (docs/reference.md §7.7.0, §10.1): the
//! model's own exact attention, a method's, a recorder's or a user's callable.

use std::sync::Arc;

use anyhow::Result;
use candle_core::Tensor;

use crate::attention::latent::LayerLatent;
use crate::attention::spec::{exact_attention, AttentionSpec};

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
