//! The one pipeline every protocol shares, from a head's Q, K, V to a measured trial: which rows
//! are scored ([`Protocol`]), the target they are scored against ([`HeadTarget`]), one trial of a
//! method at d on it and its measurement ([`Measured`]), and the trials.csv row ([`RowAt`]).
//!
//! The sweep (its CPU and device paths), `score` and the end-to-end run's layers all go through
//! it; they differ only in where Ô comes from (a method on the CPU, a batch of heads on a device,
//! a user's file) and in what they do with the measurement (a row, a layer's error columns).

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use candle_core::Tensor;

use crate::attention::decode::{DecodeHead, LayerContext};
use crate::attention::latent::{HeadLatent, LayerLatent};
use crate::attention::{self, Approximation, AttentionSpec, HeadInputs, Mask, Method, Target};
use crate::numerics::agreement::{self, Agreement};
use crate::numerics::spectral::{self, ErrorNorms};
use crate::protocol::trial::{flagged_rows, trial_mass};
use crate::report::trials::TrialRow;

/// Which rows of a head a method's Ô replaces and is scored on (docs/reference.md §7, §9.1,
/// §10.1). The end-to-end protocol runs one of these in every layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Every row of the head (one layer's prefill, §7–§8).
    Prefill,
    /// The n_f continuation rows, which read a compressed prompt cache; the prompt rows stay
    /// exact (§9.1).
    Decode { n_f: usize },
}

impl Protocol {
    /// `--decode N_F` or its absence.
    pub fn of(decode: Option<usize>) -> Self {
        match decode {
            Some(n_f) => Protocol::Decode { n_f },
            None => Protocol::Prefill,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Protocol::Prefill => "prefill",
            Protocol::Decode { .. } => "decode",
        }
    }

    pub fn n_f(self) -> Option<usize> {
        match self {
            Protocol::Prefill => None,
            Protocol::Decode { n_f } => Some(n_f),
        }
    }

    /// The scored rows of an [n, ·] or [n] tensor of every row.
    pub fn scored(self, t: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Protocol::Prefill => t.clone(),
            Protocol::Decode { n_f } => t.narrow(0, t.dim(0)? - n_f, n_f)?,
        })
    }

    /// The method's leading multiply-adds at (n, p, d) under this protocol (NaN for a method
    /// that does not decode, which the decode protocol never runs).
    pub fn macs(self, m: &dyn Method, n: usize, p: usize, d: usize, mask: Mask) -> f64 {
        match self {
            Protocol::Prefill => m.macs_masked(n, p, d, mask),
            Protocol::Decode { n_f } => m
                .decoding()
                .map_or(f64::NAN, |dm| dm.macs_decode(n, p, d, n_f)),
        }
    }

    /// A trial's `mass`, `keys`, `kv_bits` and `kv_read` (docs/reference.md §8.5): a method without a
    /// budget (the §8 family) visits every key (the dense count, mass 1 but for the sink's share)
    /// at its own width; a restrict-and-renormalise method (one with a key support) reads its
    /// keys from an f16 cache (16 bits); every other method reads no cache (all four empty but
    /// what it measured). Under
    /// the decode protocol the rows are the continuation's: the dense count is the mean of t + 1
    /// over F and `kv_read`'s denominator Σ_{t∈F}(t + 1).
    pub fn cache_columns(
        self,
        m: &dyn Method,
        measured_mass: Option<f64>,
        measured_keys: Option<f64>,
        n: usize,
        mask: Mask,
        spec: &AttentionSpec,
    ) -> CacheColumns {
        use attention::quantized::{dense_keys, kv_read_of};
        let dense = match (self, spec.window_within(n)) {
            // §7.7.6: under a window a continuation row's dense traffic is min(t + 1, W) keys.
            (Protocol::Decode { n_f }, Some(w)) => {
                (n - n_f..n).map(|t| (t + 1).min(w) as f64).sum::<f64>() / n_f as f64
            }
            (Protocol::Decode { n_f }, None) => attention::decode::dense_pairs(n, n_f) / n_f as f64,
            // §7.7.6: a windowed layer's dense traffic is Σ_i |V_i|, min(i + 1, W) keys a row.
            (Protocol::Prefill, Some(w)) => {
                (0..n).map(|i| (i + 1).min(w) as f64).sum::<f64>() / n as f64
            }
            (Protocol::Prefill, None) => dense_keys(n, mask),
        };
        let (mass, keys) = if m.has_budget() {
            (measured_mass, measured_keys)
        } else {
            // Every key: mass 1, or what the caller measured (1 − sink_mass on a sink layer).
            (Some(measured_mass.unwrap_or(1.0)), Some(dense))
        };
        let bits = match self {
            Protocol::Decode { n_f } => m.decoding().and_then(|dm| dm.kv_bits_decode(n, n_f)),
            Protocol::Prefill => m.kv_bits(n),
        };
        let kv_bits = bits.or(measured_keys.map(|_| 16.0));
        let kv_read = match (kv_bits, keys) {
            (Some(b), Some(k)) => Some(kv_read_of(b, k, dense)),
            _ => None,
        };
        CacheColumns {
            mass,
            keys,
            kv_bits,
            kv_read,
        }
    }
}

/// The cache columns of a trial (§8.5); empty where the method has none.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CacheColumns {
    pub mass: Option<f64>,
    pub keys: Option<f64>,
    pub kv_bits: Option<f64>,
    pub kv_read: Option<f64>,
}

/// Query head `h` of a layer: its inputs, the K/V head it reads, and under the decode protocol
/// its place in the layer (what a §9 method reads beyond its own Q, K, V).
pub struct LayerHead {
    pub head: HeadInputs,
    pub kv_head: usize,
    pub decode: Option<DecodeHead>,
}

/// Query head `h` of a layer's [H, n, p] Q and [H_kv, n, p] K, V, under the layer's `spec`
/// (its own sink: [`crate::attention::AttentionSpec::for_head`]), with the layer's
/// decode context when the protocol is decode: grouped-query heads (docs/reference.md §7.1) read
/// K/V head ⌊h·H_kv/H⌋. On an MLA layer `latent` is the layer's latent view, which the head
/// carries for the §8 caches (§7.7.6: they quantize the latent row); the sweep and the
/// end-to-end run's layers both attach it here, so a cache reads the same row in both.
pub fn layer_head(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    h: usize,
    spec: &AttentionSpec,
    layer: Option<&Arc<LayerContext>>,
    latent: Option<&Arc<LayerLatent>>,
) -> Result<LayerHead> {
    let kv_head = h * k.dim(0)? / q.dim(0)?;
    let head_spec = spec.for_head(h);
    let mut head = HeadInputs::with_spec(q.get(h)?, k.get(kv_head)?, v.get(kv_head)?, head_spec)?;
    if let Some(latent) = latent {
        head = head.with_latent(HeadLatent {
            layer: latent.clone(),
            head: h,
        })?;
    }
    Ok(LayerHead {
        head,
        kv_head,
        decode: layer.map(|layer| DecodeHead {
            head: h,
            layer: layer.clone(),
        }),
    })
}

/// What one head's trials are scored against: the run's target on the protocol's rows, in f64,
/// and its spectral norm; computed once per head, before any method's clock starts.
pub struct HeadTarget<'h> {
    pub head: &'h HeadInputs,
    /// The head's place in its layer under the decode protocol (None in prefill, and in `score`,
    /// whose files carry no layer to run a method in).
    pub decode: Option<&'h DecodeHead>,
    pub target: Target,
    pub protocol: Protocol,
    /// The target's scored rows in f64.
    pub output: Tensor,
    /// ‖O‖₂ of those rows.
    pub norm: f64,
    /// [`Self::sink_mass`], a property of the target: computed at the head's first trial.
    sink_mass: std::sync::OnceLock<Option<f64>>,
}

impl<'h> HeadTarget<'h> {
    /// The head's target, after a sample of its rows was checked against a float64
    /// recomputation ([`HeadInputs::target_output`]): a wrong target is an error, never a row.
    pub fn new(
        head: &'h HeadInputs,
        decode: Option<&'h DecodeHead>,
        target: Target,
        protocol: Protocol,
    ) -> Result<Self> {
        match (decode, protocol) {
            (Some(dec), Protocol::Decode { n_f }) if dec.n_f() != n_f => {
                anyhow::bail!("a head decoding {} rows under n_f = {n_f}", dec.n_f())
            }
            (Some(_), Protocol::Prefill) => {
                anyhow::bail!("a head with a decode context scored as prefill")
            }
            _ => {}
        }
        let output = protocol.scored(&head.target_output(target)?)?;
        let norm = spectral::matrix_norms(&output)?.spectral;
        Ok(Self {
            decode,
            ..Self::from_parts(head, target, protocol, output, norm)
        })
    }

    /// A target computed and checked elsewhere (batched over a window's heads on a device).
    pub fn from_parts(
        head: &'h HeadInputs,
        target: Target,
        protocol: Protocol,
        output: Tensor,
        norm: f64,
    ) -> Self {
        Self {
            head,
            decode: None,
            target,
            protocol,
            output,
            norm,
            sink_mass: std::sync::OnceLock::new(),
        }
    }

    /// One trial: the method's Ô at d from the trial's seed, timed until the device is done,
    /// then measured.
    pub fn trial(&self, m: &dyn Method, d: usize, seed: u64) -> Result<(Approximation, Measured)> {
        // A scaled head's rescaled inputs, built once per head before any clock starts.
        let inputs = match self.protocol {
            Protocol::Prefill => self.head.inputs_for(m)?,
            // A decode form that implements the layer's scale reads it from the spec itself.
            Protocol::Decode { .. } => {
                attention::refuse_unimplemented_decode_spec(m, self.head)?;
                self.head
            }
        };
        let t0 = Instant::now();
        let approx = match (self.protocol, self.decode) {
            (Protocol::Prefill, _) => m.approximate_trial(inputs, d, seed)?,
            (Protocol::Decode { .. }, Some(dec)) => m
                .decoding()
                .ok_or_else(|| {
                    crate::usage!(
                        "{} does not run under the decode protocol (docs/reference.md §9.1): only the §9 methods and the §8 KV caches do",
                        m.id()
                    )
                })?
                .approximate_decode_trial(self.head, dec, d, seed)?,
            (Protocol::Decode { .. }, None) => {
                anyhow::bail!("a decode trial of {} without its layer", m.id())
            }
        };
        self.head.device().synchronize()?;
        let seconds = t0.elapsed().as_secs_f64();
        let measured = self.measure(Some(m), d, &approx, seed, seconds)?;
        Ok((approx, measured))
    }

    /// Ô against the target: the metric, the agreement measures and the flags, then the
    /// protocol's columns. `m` is None for an Ô that no method here made (`score`'s files): its
    /// cost and cache columns are then unknown.
    pub fn measure(
        &self,
        m: Option<&dyn Method>,
        d: usize,
        approx: &Approximation,
        seed: u64,
        seconds: f64,
    ) -> Result<Measured> {
        let norms = spectral::error_norms(&self.output, &approx.output)?;
        let agreement = agreement::agreement(&self.output, &approx.output)?;
        let flagged = flagged_rows(approx)?;
        self.measured(m, d, approx, seed, seconds, norms, agreement, flagged)
    }

    /// [`Self::measure`] from a metric computed elsewhere (batched over heads on a device).
    #[allow(clippy::too_many_arguments)]
    pub fn measured(
        &self,
        m: Option<&dyn Method>,
        d: usize,
        approx: &Approximation,
        seed: u64,
        seconds: f64,
        norms: ErrorNorms,
        agreement: Agreement,
        nonfinite_rows: usize,
    ) -> Result<Measured> {
        let (n, p, mask) = (self.head.n(), self.head.p(), self.head.mask);
        let support = approx.support.as_ref();
        let sink_mass = self.sink_mass()?;
        let (macs, cache) = match m {
            Some(m) => {
                let mass = match (m.has_budget(), sink_mass) {
                    // §7.7.6: a method that visits every key (§8) keeps the real keys' mass,
                    // 1 − sink_mass on a layer with sinks.
                    (false, Some(sink)) => Some(1.0 - sink),
                    _ => trial_mass(approx, self.head, self.target, self.protocol)?,
                };
                let keys = support.map(|s| s.keys);
                // On a sliding layer a method keeps at most min(d, W) keys a row (§7.7.6): its
                // leading term is counted at that budget. [REC] METHODS is silent on macs there;
                // selection costs still count the causal rows, an upper bound.
                let d_kept = self.head.spec.window_within(n).map_or(d, |w| d.min(w));
                (
                    self.protocol.macs(m, n, p, d_kept, mask),
                    self.protocol
                        .cache_columns(m, mass, keys, n, mask, &self.head.spec),
                )
            }
            None => (f64::NAN, CacheColumns::default()),
        };
        Ok(Measured {
            seed,
            norms,
            agreement,
            exact_norm: self.norm,
            nonfinite_rows,
            seconds,
            macs,
            cache,
            kv_union: support.and_then(|s| s.kv_union),
            sink_mass,
        })
    }

    /// The mean over the scored rows of the sink's probability e^{σ − log D_i} (softmax target
    /// on a layer with sinks; docs/reference.md §7.7.6), so that `mass` + `sink_mass` = 1 for a
    /// method that keeps every key.
    fn sink_mass(&self) -> Result<Option<f64>> {
        if let Some(&m) = self.sink_mass.get() {
            return Ok(m);
        }
        let m = self.compute_sink_mass()?;
        Ok(*self.sink_mass.get_or_init(|| m))
    }

    fn compute_sink_mass(&self) -> Result<Option<f64>> {
        let Some(sink) = self.head.spec.sink(0) else {
            return Ok(None);
        };
        if self.target != Target::Softmax {
            return Ok(None);
        }
        let log_d = self.protocol.scored(self.head.exact()?.log_rowsum()?)?;
        let p = log_d
            .to_dtype(candle_core::DType::F64)?
            .affine(-1.0, sink)?
            .exp()?;
        Ok(Some(p.mean_all()?.to_scalar::<f64>()?))
    }
}

/// What one trial measured.
#[derive(Debug, Clone)]
pub struct Measured {
    pub seed: u64,
    pub norms: ErrorNorms,
    pub agreement: Agreement,
    pub exact_norm: f64,
    pub nonfinite_rows: usize,
    pub seconds: f64,
    pub macs: f64,
    pub cache: CacheColumns,
    pub kv_union: Option<f64>,
    /// The target's mean sink probability, on a layer with sinks.
    pub sink_mass: Option<f64>,
}

impl Measured {
    /// ‖O − Ô‖₂/‖O‖₂, defined (0) where both are zero.
    pub fn rel_error(&self) -> f64 {
        agreement::relative(self.norms.spectral, self.exact_norm)
    }
}

/// Where a trial sits in a run: the identity columns of its row.
pub struct RowAt<'a> {
    pub model: &'a str,
    pub model_id: &'a str,
    pub layer: usize,
    pub n: usize,
    pub window: usize,
    pub head: usize,
    pub kv_head: usize,
    pub method: &'a str,
    pub d: usize,
    pub target: Target,
    pub mask: Mask,
    pub protocol: Protocol,
    /// The layer's spec (its sinks' presence, not their values, reaches the row).
    pub spec: &'a AttentionSpec,
}

impl RowAt<'_> {
    /// The trials.csv row of a measured trial.
    pub fn row(&self, r: &Measured) -> TrialRow {
        TrialRow {
            model: self.model.to_string(),
            model_id: self.model_id.to_string(),
            layer: self.layer,
            n: self.n,
            window: self.window,
            head: self.head,
            method: self.method.to_string(),
            d: self.d,
            seed: r.seed,
            error: r.norms.spectral,
            rel_error: r.rel_error(),
            frob_error: r.norms.frobenius,
            exact_norm: r.exact_norm,
            nonfinite_rows: r.nonfinite_rows,
            macs: r.macs,
            seconds: r.seconds,
            target: self.target,
            mask: self.mask,
            kv_head: Some(self.kv_head),
            mass: r.cache.mass,
            keys: r.cache.keys,
            cos_sim: Some(r.agreement.cos_sim),
            rel_l1: Some(r.agreement.rel_l1),
            rmse: Some(r.agreement.rmse),
            kv_bits: r.cache.kv_bits,
            kv_read: r.cache.kv_read,
            n_f: self.protocol.n_f(),
            kv_union: r.kv_union,
            layer_type: Some(self.spec.layer_type()),
            sliding_window: self.spec.window,
            scale: Some(self.spec.scale),
            softcap: self.spec.softcap,
            sinks: Some(self.spec.sinks.is_some()),
            sink_mass: r.sink_mass,
        }
    }
}

#[cfg(test)]
#[path = "pipeline_spec_tests.rs"]
mod spec_tests;
