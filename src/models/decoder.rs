//! One decoder interface (issue 54): every family — the Llama-style decoders (llama, mistral,
//! qwen2, qwen3) and those of docs/reference.md §7.7 (gemma2/3, phi3, gpt_oss, deepseek_v2/v3) —
//! gives its shape, each layer's [`AttentionSpec`], and its layer split at the attention:
//! [`Decoder::embed`], [`Decoder::attention_inputs`] (Q, K, V and MLA's latent rows) and
//! [`Decoder::finish`] of layer l, and [`Decoder::head_logits`]. The forward is written once, here,
//! as the trait's provided methods, each layer's attention through one [`AttentionHook`]:
//! - stopped at layer L: [`Decoder::layer_dump`] (`dump-qkv`, the sweep; §7.1);
//! - whole: [`Decoder::forward_logits`] (the end-to-end protocol; §10.1);
//! - continuation-only: [`Decoder::continuation_logits`] (decode mode's points; §10.1 [REC]).

use std::ops::Range;
use std::sync::Arc;

use anyhow::Result;
use candle_core::{DType, Tensor};
use serde_json::{Map, Value};

use super::continuation::PromptCache;
pub use super::hook::{AttentionHook, ExactAttention};
use crate::attention::latent::LayerLatent;
use crate::attention::spec::AttentionSpec;
use crate::usage;

/// The head layout and size of a decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderShape {
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
    /// The hidden size (a row of X).
    pub hidden: usize,
    /// The widest MLP activation of a row (an MoE's: its experts per token and shared ones).
    pub intermediate: usize,
}

impl DecoderShape {
    /// The activations an end-to-end run holds at its peak beside the weights (issue 56), in bytes,
    /// for windows of up to `n` tokens with `n_f` scored, in a dtype of `dtype_bytes`: one layer's
    /// rows (X, its norm, Q, K, V, O and the MLP's widest activations), the scored rows' logits
    /// and their f64 log-probabilities (the exact run's kept, the method's), the one-layer view's
    /// two layers of Q, K, V, and with decode points every layer's prompt rows of Q, K, V. An
    /// estimate: it leaves out what a method allocates for itself.
    pub fn e2e_activation_bytes(
        &self,
        n: usize,
        n_f: usize,
        dtype_bytes: usize,
        decode: bool,
    ) -> u64 {
        let b = dtype_bytes as u64;
        let (n, n_f) = (n as u64, n_f as u64);
        let qkv_row =
            ((self.heads + 2 * self.kv_heads) * self.head_dim.max(self.head_dim_v)) as u64;
        let layer = b * n * (4 * self.hidden as u64 + 2 * qkv_row + 3 * self.intermediate as u64);
        let logits = n_f * self.vocab_size as u64 * (b + 2 * 8);
        let one_layer = 2 * b * n * qkv_row;
        let prompt = if decode {
            self.layers as u64 * b * n * qkv_row
        } else {
            0
        };
        layer + logits + one_layer + prompt
    }
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
    /// Further tensors of the dump: MLA's `kv_latent` [n, r + d_R] and `w_kv_b`
    /// [H, d_nope + d_v, r] (gpt-oss's sinks travel in the spec).
    pub extra: Vec<(String, Tensor)>,
    /// Further sidecar fields: phi3's `rope_factors`, MLA's `mla` object.
    pub sidecar: Map<String, Value>,
}

/// The position tables of a window's rows that a family's layers read: RoPE's (cos, sin), one
/// pair per kind of layer (gemma's global and local), rows in position order.
pub struct Positions(pub Vec<(Tensor, Tensor)>);

impl Positions {
    /// The tables of rows `start..start + len` (a continuation's positions).
    pub fn rows(&self, start: usize, len: usize) -> Result<Self> {
        let narrow = |t: &Tensor| t.narrow(0, start, len);
        self.0
            .iter()
            .map(|(c, s)| Ok((narrow(c)?, narrow(s)?)))
            .collect::<Result<_>>()
            .map(Self)
    }

    /// The one table of a family with one kind of layer.
    pub fn single(&self) -> (&Tensor, &Tensor) {
        let (c, s) = &self.0[0];
        (c, s)
    }
}

/// Layer l's attention inputs of some rows: post-RoPE Q [H, m, p_qk], K [H_kv, m, p_qk], V
/// [H_kv, m, p_v], and on MLA those rows' latent [m, r + d_R] with the layer's W_kvb.
pub struct LayerInputs {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub latent: Option<(Tensor, Tensor)>,
}

impl LayerInputs {
    /// Q, K, V of a layer that has no latent view.
    pub fn qkv((q, k, v): (Tensor, Tensor, Tensor)) -> Self {
        Self {
            q,
            k,
            v,
            latent: None,
        }
    }
}

/// A decoder loaded through layer L (a dump) or whole (the end-to-end forward). A family gives
/// the required methods; the forward is the provided ones.
pub trait Decoder: Send + Sync {
    /// config.json's `model_type` (or the GGUF architecture's equivalent).
    fn model_type(&self) -> &'static str;
    fn shape(&self) -> DecoderShape;
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
    /// Layer `layer`'s rotary map, where the family has one read beyond a window (the Llama path,
    /// Gemma): kvpress's ExpectedAttentionPress averages it over future positions (issue 58).
    fn layer_rope(&self, layer: usize) -> Option<super::rope::LayerRope> {
        let _ = layer;
        None
    }
    /// Layer `layer`'s sliding window, for any layer of the model: from the config alone.
    fn window(&self, layer: usize) -> Option<usize> {
        self.attention_spec(layer).window
    }
    /// The layers loaded: L + 1 for a dump, every layer for the whole model.
    fn loaded_layers(&self) -> usize;
    /// Whether the final norm and the LM head are loaded ([`super::Depth::Whole`]).
    fn has_head(&self) -> bool;

    /// X⁰ [n, hidden] of the window `ids` in `dtype` (f32 or f64; ids checked against the
    /// vocabulary), and the position tables of positions 0..n−1.
    fn embed(&self, ids: &[u32], dtype: DType) -> Result<(Tensor, Positions)>;
    /// Layer `l`'s attention inputs of the rows X [m, hidden] at the positions of `pos`.
    fn attention_inputs(&self, x: &Tensor, l: usize, pos: &Positions) -> Result<LayerInputs>;
    /// Layer `l`'s output rows from their input X [m, hidden] and attention O [H, m, p_v]: the
    /// output projection, the residuals and the MLP.
    fn finish(&self, x: &Tensor, o: &Tensor, l: usize) -> Result<Tensor>;
    /// The rows X [m, hidden] through the final norm and the LM head (and any final cap):
    /// logits [m, vocab] in X's dtype. Called only when [`Self::has_head`].
    fn head_logits(&self, x: &Tensor) -> Result<Tensor>;
    /// Further sidecar fields of a dump of a window of `n` tokens (phi3's longrope factors,
    /// MLA's dimensions).
    fn dump_sidecar(&self, n: usize) -> Map<String, Value> {
        let _ = n;
        Map::new()
    }

    /// Layer `l` of a whole model, or before L: its attention through `hook` under the layer's
    /// spec (handed the latent view on MLA), then the rest of the layer.
    fn layer(
        &self,
        x: &Tensor,
        l: usize,
        pos: &Positions,
        hook: &dyn AttentionHook,
    ) -> Result<Tensor> {
        let inputs = self.attention_inputs(x, l, pos)?;
        let latent = inputs
            .latent
            .map(|(rows, w_kv_b)| LayerLatent::new(rows, w_kv_b).map(Arc::new))
            .transpose()?;
        let qkv = (&inputs.q, &inputs.k, &inputs.v);
        let o = attend_checked(hook, l, qkv, &self.attention_spec(l), latent.as_ref())?;
        self.finish(x, &o, l)
    }

    /// X after layers 0..`upto` (exclusive), each layer's attention through `hook`.
    fn run_layers(
        &self,
        mut x: Tensor,
        upto: usize,
        pos: &Positions,
        hook: &dyn AttentionHook,
    ) -> Result<Tensor> {
        for l in 0..upto {
            // A layer at n = 8192 takes seconds: a signal stops the forward here (nothing of it
            // is kept).
            crate::interrupt::check()?;
            x = self.layer(&x, l, pos, hook)?;
        }
        Ok(x)
    }

    /// Layer L's dump (the last loaded layer) for the token window `ids` at positions 0..n−1, in
    /// `dtype` (f32 or f64): the forward with exact attention, stopped at layer L, as
    /// transformers' eager forward of the family runs it (docs/reference.md §7.1).
    fn layer_dump(&self, ids: &[u32], dtype: DType) -> Result<LayerDump> {
        let (x, pos) = self.embed(ids, dtype)?;
        let last = self.loaded_layers() - 1;
        let x = self.run_layers(x, last, &pos, &ExactAttention)?;
        let inputs = self.attention_inputs(&x, last, &pos)?;
        let extra = match inputs.latent {
            Some((rows, w_kv_b)) => vec![("kv_latent".into(), rows), ("w_kv_b".into(), w_kv_b)],
            None => Vec::new(),
        };
        Ok(LayerDump {
            q: inputs.q,
            k: inputs.k,
            v: inputs.v,
            spec: self.attention_spec(last),
            extra,
            sidecar: self.dump_sidecar(ids.len()),
        })
    }

    /// The logits [rows, vocab] (in `dtype`) of the whole model (loaded at
    /// [`super::Depth::Whole`]) on the window `ids`, every layer's attention through `hook`;
    /// only the rows `rows` go through the final norm and the LM head (the scored positions: n_f
    /// of n rows, and the head is the model's largest product; docs/reference.md §10.1).
    fn forward_logits(
        &self,
        ids: &[u32],
        dtype: DType,
        hook: &dyn AttentionHook,
        rows: Range<usize>,
    ) -> Result<Tensor> {
        self.check_logits_call(&rows, ids.len())?;
        let (x, pos) = self.embed(ids, dtype)?;
        let x = self.run_layers(x, self.loaded_layers(), &pos, hook)?;
        self.head_logits(&x.narrow(0, rows.start, rows.len())?)
    }

    /// Decode mode's continuation-only forward (docs/reference.md §10.1 [REC]): the logits of
    /// `rows` (in n_p..n), only the continuation's n_f rows through the projections, the MLP
    /// and the head, every layer's prompt rows (and MLA latent rows) from `prompt` (the exact
    /// run's), and each layer's hook still handed the whole window's Q, K, V. When every
    /// layer's prompt rows are exact, the prompt's hidden states are the exact run's (causal
    /// attention: a prompt row never reads a continuation row), so this is the full forward's
    /// result on those rows up to rounding.
    fn continuation_logits(
        &self,
        ids: &[u32],
        dtype: DType,
        hook: &dyn AttentionHook,
        prompt: &PromptCache,
        rows: Range<usize>,
    ) -> Result<Tensor> {
        let (n, layers) = (ids.len(), self.loaded_layers());
        self.check_logits_call(&rows, n)?;
        prompt.check_call(layers, n, &rows)?;
        let (n_p, n_f) = (prompt.n_p(), n - prompt.n_p());
        let (x, pos) = self.embed(ids, dtype)?;
        let (mut x, pos) = (x.narrow(0, n_p, n_f)?, pos.rows(n_p, n_f)?);
        for l in 0..layers {
            crate::interrupt::check()?;
            let inputs = self.attention_inputs(&x, l, &pos)?;
            let (q, k, v) = prompt.whole_window(l, (&inputs.q, &inputs.k, &inputs.v))?;
            let latent = inputs
                .latent
                .map(|(rows, w_kv_b)| prompt.whole_latent(l, &rows, w_kv_b))
                .transpose()?;
            let spec = self.attention_spec(l);
            let o = attend_checked(hook, l, (&q, &k, &v), &spec, latent.as_ref())?;
            x = self.finish(&x, &o.narrow(1, n_p, n_f)?, l)?;
        }
        self.head_logits(&x.narrow(0, rows.start - n_p, rows.len())?)
    }

    /// Refuses a logits call before any layer runs: a model loaded through layer L (it has no
    /// output head), or rows that are empty or past the window's n.
    fn check_logits_call(&self, rows: &Range<usize>, n: usize) -> Result<()> {
        if !self.has_head() {
            return Err(usage!(
                "the logits of a {} model need the whole model loaded (models::Depth::Whole); only layers 0..={} are loaded",
                self.model_type(),
                self.loaded_layers().saturating_sub(1)
            ));
        }
        if rows.is_empty() || rows.end > n {
            return Err(usage!(
                "forward_logits: rows {rows:?} must be a non-empty range within the window's {n} tokens"
            ));
        }
        Ok(())
    }
}

/// Layer `l`'s attention through `hook` (its `attend_latent` where the layer has a latent view):
/// O [H, n, p_v] (Q's heads and rows, V's width; p_v ≠ p_qk for MLA), refused with a usage error
/// when the hook returns another shape (a user's callable can), and in Q's dtype.
pub(super) fn attend_checked(
    hook: &dyn AttentionHook,
    l: usize,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    spec: &AttentionSpec,
    latent: Option<&Arc<LayerLatent>>,
) -> Result<Tensor> {
    let o = match latent {
        Some(latent) => hook.attend_latent(l, q, k, v, spec, latent)?,
        None => hook.attend(l, q, k, v, spec)?,
    };
    let (h, n, _) = q.dims3()?;
    let want = [h, n, v.dim(2)?];
    if o.dims() != want {
        return Err(usage!(
            "the attention of layer {l} returned shape {:?}; it must return O [H, n, p_v] = {want:?}",
            o.dims()
        ));
    }
    Ok(o.to_dtype(q.dtype())?)
}

#[cfg(test)]
#[path = "decoder_tests.rs"]
pub(crate) mod tests;
