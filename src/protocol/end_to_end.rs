//! The end-to-end protocol (docs/reference.md §10.1): a method in every layer of a decoder, the damage
//! measured at the output (next-token KL, top-1, NLL against the exact run in the same dtype) and,
//! from the same forward, every layer's local operator error; plus the one-layer view, the same
//! method on the exact run's Q/K/V of a layer ℓ*.
//!
//! A window of n tokens is a prompt of n_p = n − n_f tokens and a continuation; the scored
//! positions are i = n_p − 1 … n − 2, the prediction at i of token i + 1 (every label inside the
//! window).

use std::time::Instant;

use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};

use super::layer_hook::{KeptLayer, LayerError, MethodHook, RecordingExact};
use super::pipeline::Protocol;
use crate::attention::{self, Family, Mask, Method};
use crate::models::{AttentionHook, Decoder, PromptCache, PromptRecorder};
use crate::numerics::next_token::{log_softmax_rows, score_positions, PositionScores};
use crate::usage;

/// A method as the end-to-end run names it: its CSV id (a §8 cache read under the decode protocol
/// is `d` + the cache's id, §10.2), the method, and its mode.
pub struct E2eMethod {
    pub name: String,
    pub method: Box<dyn Method>,
    pub decode: bool,
}

impl E2eMethod {
    /// Resolves an id of §10.2: a §9 method or a `d`-prefixed §8 cache (decode mode), or a causal
    /// §7 or §8 method (prefill mode). Everything else is refused, naming why.
    pub fn resolve(id: &str) -> Result<Self> {
        if let Some(cache) = id.strip_prefix('d') {
            if let Ok(m) = attention::by_id(cache) {
                if m.family() == Family::Quantized && m.decoding().is_some() {
                    return Ok(Self {
                        name: id.to_string(),
                        method: m,
                        decode: true,
                    });
                }
            }
        }
        let m = attention::by_id(id).map_err(|e| usage!("--methods: {e}"))?;
        if m.family() == Family::Decode {
            return Ok(Self {
                name: id.to_string(),
                method: m,
                decode: true,
            });
        }
        if !m.masks().contains(&Mask::Causal) {
            return Err(usage!(
                "--methods {id}: it has no causal form (docs/reference.md §7.4), and a decoder's output needs its causal mask; end to end runs the §7 prefill methods, the §8 methods, the §9 decode methods and the §8 caches read under the decode protocol (d + the cache's id, e.g. dkv_q4_0)"
            ));
        }
        Ok(Self {
            name: id.to_string(),
            method: m,
            decode: false,
        })
    }

    pub fn mode(&self, n_f: usize) -> Protocol {
        if self.decode {
            Protocol::Decode { n_f }
        } else {
            Protocol::Prefill
        }
    }

    /// The budgets the method runs at from the grid: d = 0 for the §8 methods and cache reads.
    pub fn budgets(&self, grid: &[usize]) -> Vec<usize> {
        attention::budgets(self.method.id(), grid)
    }
}

/// One window of an end-to-end run: the model, the token ids, the split and the dtype.
pub struct Window<'a> {
    pub model: &'a dyn Decoder,
    pub ids: &'a [u32],
    pub n_f: usize,
    pub dtype: DType,
    /// The run seed and this window's index (each trial's derived seed).
    pub seed: u64,
    pub index: usize,
    /// The layers ℓ* of the one-layer view.
    pub one_layer: Vec<usize>,
    /// Whether decode-mode points will run on this window: the exact run then keeps every
    /// layer's prompt rows of Q, K, V for their continuation-only forward
    /// ([`Decoder::continuation_logits`]).
    pub keep_prompt: bool,
}

/// What the exact run leaves for every method run of the window.
pub struct ExactRun {
    /// Log-probabilities (f64) at the scored positions.
    pub logp: Vec<Vec<f64>>,
    /// The exact run's post-RoPE Q, K, V (and MLA's latent view) of the one-layer view's layers.
    pub kept: Vec<KeptLayer>,
    /// Every layer's prompt rows of Q, K, V, for the decode-mode points' continuation-only
    /// forward (kept when the window has decode points).
    pub prompt: Option<PromptCache>,
    pub seconds: f64,
}

/// One (mode, method, d) point of a window.
pub struct E2ePoint {
    pub scores: PositionScores,
    /// Every layer's local error in the method run.
    pub layers: Vec<LayerError>,
    /// (ℓ*, the method's error on the exact run's Q/K/V of ℓ*).
    pub one_layer: Vec<(usize, LayerError)>,
    pub seconds: f64,
}

impl Window<'_> {
    pub fn n(&self) -> usize {
        self.ids.len()
    }
    pub fn n_p(&self) -> usize {
        self.n() - self.n_f
    }
    /// The rows whose logits are scored, n_p − 1 … n − 2.
    pub fn scored_rows(&self) -> std::ops::Range<usize> {
        self.n_p() - 1..self.n() - 1
    }
    /// The labels of the scored positions, tokens n_p … n − 1.
    pub fn labels(&self) -> &[u32] {
        &self.ids[self.n_p()..]
    }

    /// Checks the split: a prompt of at least one token and a continuation of at least one.
    pub fn check(&self) -> Result<()> {
        ensure!(
            self.n_f >= 1 && self.n_f < self.n(),
            crate::UsageError(format!(
                "--n-f {}: the continuation must be at least 1 token and leave a prompt of at least 1 in a window of n = {} tokens; give --n-f below n",
                self.n_f,
                self.n()
            ))
        );
        Ok(())
    }

    /// The log-probabilities (f64) at the scored positions of the forward with `hook` as every
    /// layer's attention; non-finite logits are an error naming `what`.
    fn scored_logp(&self, hook: &dyn AttentionHook, what: &str) -> Result<Vec<Vec<f64>>> {
        let logits = self
            .model
            .forward_logits(self.ids, self.dtype, hook, self.scored_rows())?;
        self.checked_logp(&logits, what)
    }

    /// Log-softmax (f64) of the logits of `what`, refused where the forward overflowed.
    fn checked_logp(&self, logits: &Tensor, what: &str) -> Result<Vec<Vec<f64>>> {
        crate::tensor_util::check_finite(logits, || {
            format!(
                "the logits of {what} on window {} (n = {}) in {:?}: the forward overflowed; try --dtype f64",
                self.index,
                self.n(),
                self.dtype
            )
        })?;
        log_softmax_rows(logits)
    }

    /// `m` at budget `d` as every layer's attention of this window.
    fn hook<'m>(&self, m: &'m E2eMethod, d: usize) -> MethodHook<'m> {
        let layers = self.model.shape().layers;
        MethodHook::new(
            m.method.as_ref(),
            d,
            m.mode(self.n_f),
            layers,
            self.seed,
            self.index,
        )
        .with_ropes((0..layers).map(|l| self.model.layer_rope(l)).collect())
    }

    /// The exact run: the window through the model with exact attention in the run's dtype.
    pub fn exact(&self) -> Result<ExactRun> {
        self.check()?;
        let t0 = Instant::now();
        let hook = RecordingExact::new(self.one_layer.clone());
        let (logp, prompt) = if self.keep_prompt {
            let recorder = PromptRecorder::new(&hook, self.n_p(), self.model.shape().layers);
            let logp = self.scored_logp(&recorder, "the exact run")?;
            (logp, Some(recorder.into_cache()?))
        } else {
            (self.scored_logp(&hook, "the exact run")?, None)
        };
        Ok(ExactRun {
            logp,
            kept: hook.into_kept(),
            prompt,
            seconds: t0.elapsed().as_secs_f64(),
        })
    }

    /// Decode mode's scored log-probabilities from the continuation-only forward: the first
    /// scored row (n_p − 1) is a prompt row, the exact run's own; rows n_p … n − 2 go through the
    /// layers on the exact run's prompt rows ([`Decoder::continuation_logits`]).
    fn continuation_logp(
        &self,
        exact: &ExactRun,
        prompt: &PromptCache,
        hook: &dyn AttentionHook,
        what: &str,
    ) -> Result<Vec<Vec<f64>>> {
        let rows = self.n_p()..self.n() - 1;
        let logits = self
            .model
            .continuation_logits(self.ids, self.dtype, hook, prompt, rows)?;
        let mut logp = vec![exact.logp[0].clone()];
        logp.extend(self.checked_logp(&logits, what)?);
        Ok(logp)
    }

    /// The method `m` at budget `d` in every layer, scored against `exact`.
    pub fn point(&self, exact: &ExactRun, m: &E2eMethod, d: usize) -> Result<E2ePoint> {
        self.check()?;
        let t0 = Instant::now();
        let hook = self.hook(m, d);
        let what = format!("{} at d = {d}", m.name);
        let logp = match (&exact.prompt, m.decode && self.n_f > 1) {
            (Some(prompt), true) => self.continuation_logp(exact, prompt, &hook, &what)?,
            _ => self.scored_logp(&hook, &what)?,
        };
        let errors = hook.layer_errors()?;
        let flagged: usize = errors.iter().map(|e| e.nonfinite_rows).sum();
        ensure!(
            flagged == 0,
            "{} at d = {d} gave {flagged} non-finite (or non-positive-normaliser) rows over the layers of window {}; no end-to-end row is written for it",
            m.name,
            self.index
        );
        let scores = score_positions(&exact.logp, &logp, self.labels())?;
        let seconds = t0.elapsed().as_secs_f64();
        let mut one_layer = Vec::new();
        for kept in &exact.kept {
            let l = kept.layer;
            let qkv = (&kept.q, &kept.k, &kept.v);
            let spec = self.model.attention_spec(l);
            let error = self
                .hook(m, d)
                .layer(l, qkv, &spec, kept.latent.as_ref())?
                .1;
            one_layer.push((l, error));
        }
        Ok(E2ePoint {
            scores,
            layers: errors,
            one_layer,
            seconds,
        })
    }
}

/// Refuses, before any window runs, a method that a layer of `model` cannot have at windows of
/// up to `n` tokens (docs/reference.md §7.7.6's rules, in every layer): a feature of the layer's
/// spec the method's form (prefill, or its decode form) does not implement, and on Multi-head
/// Latent Attention what the sweep refuses there ([`refuse_quantized_mla`]).
pub fn refuse_unsupported(model: &dyn Decoder, methods: &[E2eMethod], n: usize) -> Result<()> {
    refuse_quantized_mla(model, methods)?;
    let p = model.shape().head_dim;
    for m in methods {
        let support = attention::spec_support_under(m.method.as_ref(), m.decode);
        for l in 0..model.shape().layers {
            let spec = model.attention_spec(l);
            if let Some(feature) = spec.features(p, n).first_missing(support) {
                return Err(usage!(
                    "--methods {}: layer {l} has {feature} ({spec}) at n = {n}, which {} does not implement yet {}(docs/reference.md §7.7.6); a method runs end to end only where it runs in every layer",
                    m.name,
                    m.method.id(),
                    if m.decode { "under the decode protocol " } else { "" }
                ));
            }
        }
    }
    Ok(())
}

/// On MLA (§7.7.6), what the sweep refuses (`sweep::spec_refusals::refuse_quantized_mla`),
/// naming the refused methods and those that run: an MLA layer caches one latent row [c; k_pe]
/// per token, which the KV caches quantize in prefill (the hook hands it them); what KIVI's
/// per-channel groups and SageAttention's kernels do on that row is not specified, and the
/// latent cache has no decode form, so every §8 cache read under the decode protocol goes too.
fn refuse_quantized_mla(model: &dyn Decoder, methods: &[E2eMethod]) -> Result<()> {
    if !model.is_mla() {
        return Ok(());
    }
    let (refused, run): (Vec<&E2eMethod>, Vec<&E2eMethod>) = methods.iter().partition(|m| {
        m.method.family() == Family::Quantized && (m.decode || !m.method.reads_mla_latent())
    });
    if refused.is_empty() {
        return Ok(());
    }
    let names = |ms: &[&E2eMethod]| {
        ms.iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>()
            .join(",")
    };
    let why = match (refused.iter().any(|m| m.decode), refused.iter().any(|m| !m.decode)) {
        (true, false) => "the latent-row cache has no decode form yet",
        (false, _) => "the KV caches (kv_f16 … kv_q4_0) quantize that row, but what KIVI and SageAttention do on it is not specified",
        (true, true) => "the KV caches (kv_f16 … kv_q4_0) quantize that row in prefill, but the latent-row cache has no decode form yet and what KIVI and SageAttention do on it is not specified",
    };
    let others = if run.is_empty() {
        "run the KV caches in prefill, or the sparse or §9 methods, instead (e.g. --methods kv_q8_0,window,snapkv)".to_string()
    } else {
        format!("run the others with --methods {}", names(&run))
    };
    Err(usage!(
        "--methods {}: the model's layers are Multi-head Latent Attention, whose cache holds one latent row [c; k_pe] per token, not per-head K/V; {why} (docs/reference.md §7.7.6), so these methods are refused there; {others}",
        names(&refused)
    ))
}

/// The head size a method's formats group on `model` (its [`Method::check_head_dim`]): on MLA
/// the latent row's r + d_R for a method that reads it, as the sweep checks; else p_qk.
pub fn checked_head_dim(model: &dyn Decoder, m: &E2eMethod) -> usize {
    match model.mla_latent_width() {
        Some(width) if m.method.reads_mla_latent() => width,
        _ => model.shape().head_dim,
    }
}

/// The one-layer view's default layers ℓ* = 0 and ⌊L/2⌋ (§10.1).
pub fn default_one_layer(layers: usize) -> Vec<usize> {
    let mut v = vec![0, layers / 2];
    v.dedup();
    v
}

#[cfg(test)]
#[path = "end_to_end_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "end_to_end_mla_tests.rs"]
mod mla_tests;
