//! A method as a model's attention (docs/reference.md §10.1): the [`AttentionHook`] that replaces every
//! layer's attention with a method's Ô on that layer's own (already perturbed) Q, K, V, and
//! measures, on the way, the layer's local operator error against exact attention of those same
//! inputs.
//!
//! Prefill mode: every row of every layer is the method's. Decode mode (§9.1 in every layer): the
//! prompt rows are exact, the continuation rows read the compressed prompt; a layer-level method
//! (Ada-KV, TOVA, PyramidKV) sees the layer's [`LayerContext`] with ℓ and L.

use std::sync::{Arc, Mutex};

use anyhow::Result;
use candle_core::Tensor;
use rayon::prelude::*;

use crate::attention::decode::LayerContext;
use crate::attention::latent::LayerLatent;
use crate::attention::spec::AttentionSpec;
use crate::attention::{Method, Target};
use crate::models::AttentionHook;
use crate::numerics::sampling::TrialKey;
use crate::protocol::pipeline::{layer_head, HeadTarget, Protocol};

/// One layer's local error (§10.1 "Layer metrics"): per query head, and their means.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerError {
    /// Per query head: ‖O − Ô‖₂, ‖O − Ô‖₂/‖O‖₂, 1 − cos_sim, keys, mass, kv_read (over the rows
    /// the method changes). `keys`, `mass` and `kv_read` are NaN for a method without them.
    pub heads: Vec<[f64; 6]>,
    /// Rows of Ô that are non-finite or whose normaliser is ≤ 0, over all heads.
    pub nonfinite_rows: usize,
}

impl LayerError {
    /// The mean over query heads of column `c` (0 abs_error … 5 kv_read).
    pub fn mean(&self, c: usize) -> f64 {
        self.heads.iter().map(|h| h[c]).sum::<f64>() / self.heads.len() as f64
    }
    pub fn abs_error(&self) -> f64 {
        self.mean(0)
    }
    pub fn rel_error(&self) -> f64 {
        self.mean(1)
    }
    pub fn one_minus_cos(&self) -> f64 {
        self.mean(2)
    }
    pub fn keys(&self) -> f64 {
        self.mean(3)
    }
    pub fn mass(&self) -> f64 {
        self.mean(4)
    }
    pub fn kv_read(&self) -> f64 {
        self.mean(5)
    }
}

/// A method at budget d as every layer's attention of one window's forward.
pub struct MethodHook<'a> {
    pub method: &'a dyn Method,
    pub d: usize,
    pub mode: Protocol,
    /// The model's layer count L.
    pub layers: usize,
    /// The run seed and the window, for each trial's derived seed.
    pub seed: u64,
    pub window: usize,
    /// Each layer's local error, as the forward passes it.
    errors: Mutex<Vec<Option<LayerError>>>,
    /// Each layer's rotary map, for a decode method that reads it (kvpress's ExpectedAttention).
    ropes: Vec<Option<crate::numerics::rope::LayerRope>>,
}

impl<'a> MethodHook<'a> {
    pub fn new(
        method: &'a dyn Method,
        d: usize,
        mode: Protocol,
        layers: usize,
        seed: u64,
        window: usize,
    ) -> Self {
        Self {
            method,
            d,
            mode,
            layers,
            seed,
            window,
            errors: Mutex::new(vec![None; layers]),
            ropes: Vec::new(),
        }
    }

    /// The model's rotary map per layer (the decode contexts carry their layer's).
    pub fn with_ropes(mut self, ropes: Vec<Option<crate::numerics::rope::LayerRope>>) -> Self {
        self.ropes = ropes;
        self
    }

    /// Every layer's local error, in layer order (after a forward).
    pub fn layer_errors(&self) -> Result<Vec<LayerError>> {
        let errors = self.errors.lock().expect("layer errors lock").clone();
        errors
            .into_iter()
            .enumerate()
            .map(|(l, e)| e.ok_or_else(|| anyhow::anyhow!("layer {l} was not run")))
            .collect()
    }

    /// Layer `layer`'s O (the method's rows, the exact prompt rows in decode mode) and local
    /// error, under the layer's exact attention `spec` (its scale, cap, window and sinks: the
    /// target the error is measured against and the rules the method follows, §7.7.6). On an
    /// MLA layer `latent` is its latent view, which every head carries, as in the sweep: a §8
    /// cache there quantizes the latent row (§7.7.6), not the materialised K/V.
    pub fn layer(
        &self,
        layer: usize,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        spec: &AttentionSpec,
        latent: Option<&Arc<LayerLatent>>,
    ) -> Result<(Tensor, LayerError)> {
        let (heads, n, _) = q.dims3()?;
        let ctx = match self.mode.n_f() {
            Some(n_f) => Some(Arc::new(
                LayerContext::new(q.clone(), k.clone(), v.clone(), n_f, layer, self.layers)?
                    .with_spec(spec.clone())?
                    .with_rope(self.ropes.get(layer).cloned().flatten()),
            )),
            None => None,
        };
        // Every head runs, then the first error in head order is the one reported: rayon's own
        // collect into a Result returns whichever failing head finished first, so the message
        // (and a user's test of it) would depend on the thread count and scheduling.
        let per_head: Vec<(Tensor, [f64; 6], usize)> = (0..heads)
            .into_par_iter()
            .map(|h| self.head(layer, h, n, (q, k, v), spec, (ctx.as_ref(), latent)))
            .collect::<Vec<Result<_>>>()
            .into_iter()
            .collect::<Result<_>>()?;
        let outs: Vec<&Tensor> = per_head.iter().map(|(o, _, _)| o).collect();
        let o = Tensor::stack(&outs, 0)?;
        let error = LayerError {
            heads: per_head.iter().map(|(_, e, _)| *e).collect(),
            nonfinite_rows: per_head.iter().map(|(_, _, f)| f).sum(),
        };
        Ok((o, error))
    }

    /// Query head `h` of layer `layer`: its O rows and its error columns.
    fn head(
        &self,
        layer: usize,
        h: usize,
        n: usize,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        spec: &AttentionSpec,
        (ctx, latent): (Option<&Arc<LayerContext>>, Option<&Arc<LayerLatent>>),
    ) -> Result<(Tensor, [f64; 6], usize)> {
        let m = self.method;
        let lh = layer_head(q, k, v, h, spec, ctx, latent)?;
        let head = &lh.head;
        let seed = TrialKey {
            seed: self.seed,
            n,
            window: self.window,
            head: layer * q.dim(0)? + h,
            method: m.id(),
            d: self.d,
        }
        .derive_seed();
        let where_ = || {
            format!(
                "method {} at d = {}, layer {layer}, head {h}",
                m.id(),
                self.d
            )
        };
        let target = HeadTarget::new(head, lh.decode.as_ref(), Target::Softmax, self.mode)?;
        let (approx, r) = match target.trial(m, self.d, seed) {
            Ok(t) => t,
            // What a user's own function returns (a wrong shape, a NaN) is the user's to fix.
            Err(e) if m.family() == crate::attention::Family::User => {
                return Err(crate::usage!("{}: {e:#}", where_()));
            }
            Err(e) => return Err(e.context(where_())),
        };
        let nan = f64::NAN;
        let cols = [
            r.norms.spectral,
            r.rel_error(),
            1.0 - r.agreement.cos_sim,
            r.cache.keys.unwrap_or(nan),
            r.cache.mass.unwrap_or(nan),
            r.cache.kv_read.unwrap_or(nan),
        ];
        let exact = &head.exact()?.output;
        let rows = approx.output.to_dtype(q.dtype())?;
        let o = match self.mode {
            Protocol::Prefill => rows,
            Protocol::Decode { n_f } => Tensor::cat(&[exact.narrow(0, 0, n - n_f)?, rows], 0)?,
        };
        Ok((o, cols, r.nonfinite_rows))
    }
}

impl AttentionHook for MethodHook<'_> {
    fn attend(
        &self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        spec: &AttentionSpec,
    ) -> Result<Tensor> {
        // A method the layer's spec is beyond is refused per head ([`HeadTarget::trial`]), and
        // by the face before any window runs (`end_to_end::refuse_unsupported`).
        let (o, error) = self.layer(layer, (q, k, v), spec, None)?;
        self.errors.lock().expect("layer errors lock")[layer] = Some(error);
        Ok(o)
    }

    fn attend_latent(
        &self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        spec: &AttentionSpec,
        latent: &Arc<LayerLatent>,
    ) -> Result<Tensor> {
        let (o, error) = self.layer(layer, (q, k, v), spec, Some(latent))?;
        self.errors.lock().expect("layer errors lock")[layer] = Some(error);
        Ok(o)
    }
}

/// One layer's inputs as the exact run handed them to its hook.
#[derive(Clone)]
pub struct KeptLayer {
    pub layer: usize,
    /// Post-RoPE Q [H, n, p], K [H_kv, n, p], V [H_kv, n, p_v].
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    /// On an MLA layer its latent view (what a §8 cache there quantizes, §7.7.6).
    pub latent: Option<Arc<LayerLatent>>,
}

/// The exact attention that keeps the post-RoPE Q, K, V (and, on MLA, the latent view) of some
/// layers: the exact run's inputs of the one-layer view (§10.1 "Summary columns").
pub struct RecordingExact {
    keep: Vec<usize>,
    kept: Mutex<Vec<KeptLayer>>,
}

impl RecordingExact {
    pub fn new(keep: Vec<usize>) -> Self {
        Self {
            keep,
            kept: Mutex::new(Vec::new()),
        }
    }
    /// Every kept layer, in layer order.
    pub fn into_kept(self) -> Vec<KeptLayer> {
        let mut kept = self.kept.into_inner().expect("kept lock");
        kept.sort_by_key(|k| k.layer);
        kept
    }

    fn record(
        &self,
        layer: usize,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        latent: Option<&Arc<LayerLatent>>,
    ) {
        if self.keep.contains(&layer) {
            self.kept.lock().expect("kept lock").push(KeptLayer {
                layer,
                q: q.clone(),
                k: k.clone(),
                v: v.clone(),
                latent: latent.cloned(),
            });
        }
    }
}

impl AttentionHook for RecordingExact {
    fn attend(
        &self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        spec: &AttentionSpec,
    ) -> Result<Tensor> {
        self.record(layer, (q, k, v), None);
        crate::models::ExactAttention.attend(layer, q, k, v, spec)
    }

    fn attend_latent(
        &self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        spec: &AttentionSpec,
        latent: &Arc<LayerLatent>,
    ) -> Result<Tensor> {
        // Kept with its latent: the one-layer view of a §8 cache must read the latent row, as
        // the method run's layers do.
        self.record(layer, (q, k, v), Some(latent));
        crate::models::ExactAttention.attend(layer, q, k, v, spec)
    }
}
