//! The prompt rows of decode mode's continuation-only forward (docs/reference.md §10.1,
//! [`super::Decoder::continuation_logits`]): when every layer's
//! prompt rows are exact, the prompt's hidden states, and so its post-RoPE Q, K, V in every
//! layer, are the exact run's (causal attention: a prompt row never reads a continuation row).
//! So a decode-mode run takes them from the exact run ([`PromptRecorder`]) and sends only the n_f
//! continuation rows through the projections, the MLP and the head, while each layer's hook still
//! sees the whole window's Q, K, V. The forward's matrix products are most of a point's time
//! (measured: 43 % of an e2e run's samples in gemm's microkernel, SmolLM2, n = 1024); at
//! n_f = n/4 this leaves a quarter of them for a decode point.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use anyhow::{ensure, Result};
use candle_core::Tensor;

use super::hook::AttentionHook;
use crate::attention::latent::LayerLatent;
use crate::attention::spec::AttentionSpec;

/// Every layer's post-RoPE Q [H, n_p, p], K and V [H_kv, n_p, p] on the prompt rows 0..n_p,
/// and on an MLA layer the latent rows [n_p, r + d_R] its hook was handed.
pub struct PromptCache {
    n_p: usize,
    layers: Vec<PromptLayer>,
}

/// One layer's prompt rows.
#[derive(Clone)]
struct PromptLayer {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    latent: Option<Tensor>,
}

impl PromptCache {
    pub fn n_p(&self) -> usize {
        self.n_p
    }

    /// Checks a continuation-only forward's call: one cached layer per layer of the model, a
    /// continuation after the prompt, and `rows` inside it.
    pub(super) fn check_call(&self, layers: usize, n: usize, rows: &Range<usize>) -> Result<()> {
        ensure!(
            self.layers.len() == layers
                && self.n_p < n
                && rows.start >= self.n_p
                && rows.end <= n
                && !rows.is_empty(),
            "continuation_logits: a prompt of {} rows over {} layers, rows {rows:?} of {n} over {layers} layers",
            self.n_p,
            self.layers.len()
        );
        Ok(())
    }

    /// Layer `l`'s Q, K, V on the whole window: its cached prompt rows, then the continuation's
    /// rows `(q, k, v)`.
    pub(super) fn whole_window(
        &self,
        l: usize,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let p = &self.layers[l];
        Ok((
            Tensor::cat(&[&p.q, q], 1)?,
            Tensor::cat(&[&p.k, k], 1)?,
            Tensor::cat(&[&p.v, v], 1)?,
        ))
    }

    /// Layer `l`'s latent view on the whole window (MLA): its cached prompt rows, then the
    /// continuation's `rows` [n_f, r + d_R], with W_kvb `w_kv_b`.
    pub(super) fn whole_latent(
        &self,
        l: usize,
        rows: &Tensor,
        w_kv_b: Tensor,
    ) -> Result<Arc<LayerLatent>> {
        let prompt = self.layers[l].latent.as_ref().ok_or_else(|| {
            anyhow::anyhow!("layer {l}'s prompt latent was not kept (its hook had no latent)")
        })?;
        Ok(Arc::new(LayerLatent::new(
            Tensor::cat(&[prompt, rows], 0)?,
            w_kv_b,
        )?))
    }
}

/// A hook that keeps every layer's prompt rows of Q, K, V on the way to `inner`.
pub struct PromptRecorder<'a> {
    inner: &'a dyn AttentionHook,
    n_p: usize,
    kept: Mutex<Vec<Option<PromptLayer>>>,
}

impl<'a> PromptRecorder<'a> {
    pub fn new(inner: &'a dyn AttentionHook, n_p: usize, layers: usize) -> Self {
        Self {
            inner,
            n_p,
            kept: Mutex::new(vec![None; layers]),
        }
    }

    /// The prompt cache, once the forward passed every layer.
    pub fn into_cache(self) -> Result<PromptCache> {
        let layers = self
            .kept
            .into_inner()
            .expect("prompt lock")
            .into_iter()
            .enumerate()
            .map(|(l, t)| t.ok_or_else(|| anyhow::anyhow!("layer {l} was not run")))
            .collect::<Result<_>>()?;
        Ok(PromptCache {
            n_p: self.n_p,
            layers,
        })
    }
}

impl AttentionHook for PromptRecorder<'_> {
    fn attend(
        &self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        spec: &AttentionSpec,
    ) -> Result<Tensor> {
        self.keep(layer, (q, k, v), None)?;
        self.inner.attend(layer, q, k, v, spec)
    }

    /// The inner hook is handed the latent too (a recorder must not change what the run
    /// measures), and its prompt rows are kept with Q, K, V.
    fn attend_latent(
        &self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        spec: &AttentionSpec,
        latent: &Arc<LayerLatent>,
    ) -> Result<Tensor> {
        self.keep(layer, (q, k, v), Some(&latent.latent))?;
        self.inner.attend_latent(layer, q, k, v, spec, latent)
    }
}

impl PromptRecorder<'_> {
    /// Keeps layer `layer`'s prompt rows of Q, K, V and of its latent rows where given.
    fn keep(
        &self,
        layer: usize,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        latent: Option<&Tensor>,
    ) -> Result<()> {
        // Copied out (contiguous), so that the cache holds n_p rows, not the window's storage.
        let rows =
            |t: &Tensor, axis| -> Result<Tensor> { Ok(t.narrow(axis, 0, self.n_p)?.contiguous()?) };
        let kept = PromptLayer {
            q: rows(q, 1)?,
            k: rows(k, 1)?,
            v: rows(v, 1)?,
            latent: latent.map(|t| rows(t, 0)).transpose()?,
        };
        self.kept.lock().expect("prompt lock")[layer] = Some(kept);
        Ok(())
    }
}
