//! What exact attention is for one layer (docs/reference.md §7.7.0, generalising §7.2): which keys a
//! query sees (all, causal, or causal within a window W), the logit scale τ, the soft-cap c and the
//! learned sink logits σ_h. For query head h and row i with visible set V_i:
//!
//!   s_ij = c·tanh(τ·q_i·k_j / c)   with a cap,   s_ij = τ·q_i·k_j   without;
//!   O_i  = Σ_{j∈V_i} e^{s_ij − m_i} v_j / ([e^{σ_h − m_i}] + Σ_{j∈V_i} e^{s_ij − m_i}),
//!   m_i  = max([σ_h,] max_{j∈V_i} s_ij),
//!
//! the bracketed sink terms only on a layer with sinks (the sink's value vector is zero). With
//! τ = 1/√p and no cap, window or sinks this is the plain causal (or bidirectional) target.
//!
//! One value per layer, from the model's config and the layer index, never from the data: the
//! models build it, the dump's sidecar carries it, and the target, the methods, the kernels,
//! `score` and the Python face read it.

use anyhow::Result;
use candle_core::{Tensor, D};
use serde::{Deserialize, Serialize};

use super::target::Mask;
use crate::numerics::flash::Logits;
use crate::numerics::visible::Visible;

#[path = "spec_sidecar.rs"]
mod sidecar;
pub use sidecar::{spec_from_sidecar, spec_sidecar, SpecDumpParts, SINKS_TENSOR};

/// A layer's kind in a family that alternates them (transformers' `layer_types` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LayerType {
    #[serde(rename = "full_attention")]
    Full,
    #[serde(rename = "sliding_attention")]
    Sliding,
}

impl LayerType {
    /// transformers' name (`full_attention`, `sliding_attention`), as in config.json and trials.csv.
    pub fn label(self) -> &'static str {
        match self {
            LayerType::Full => "full_attention",
            LayerType::Sliding => "sliding_attention",
        }
    }

    /// Parses a `layer_types` entry; `field` names the entry in the error.
    pub fn parse(name: &str, field: &str) -> Result<Self> {
        match name {
            "full_attention" => Ok(LayerType::Full),
            "sliding_attention" => Ok(LayerType::Sliding),
            other => Err(crate::usage!(
                "{field} is \"{other}\"; the layer types understood are full_attention and sliding_attention"
            )),
        }
    }
}

/// What a spec has beyond its mask's plain target (docs/reference.md §7.7.6), or the part of that a
/// method implements ([`crate::attention::Method::spec_support`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpecFeatures {
    /// A sliding window shorter than the keys (a window of W ≥ n hides nothing).
    pub window: bool,
    pub softcap: bool,
    pub sinks: bool,
    /// τ ≠ 1/√p.
    pub scale: bool,
}

impl SpecFeatures {
    /// None of them: the plain target only.
    pub const NONE: SpecFeatures = SpecFeatures {
        window: false,
        softcap: false,
        sinks: false,
        scale: false,
    };
    /// The scale alone.
    pub const SCALE: SpecFeatures = SpecFeatures {
        scale: true,
        ..Self::NONE
    };
    /// Every feature.
    pub const ALL: SpecFeatures = SpecFeatures {
        window: true,
        softcap: true,
        sinks: true,
        scale: true,
    };

    /// The first feature of `self` that `support` lacks, named for a refusal.
    pub fn first_missing(self, support: SpecFeatures) -> Option<&'static str> {
        [
            (self.window && !support.window, "a sliding window"),
            (self.softcap && !support.softcap, "a logit soft-cap"),
            (self.sinks && !support.sinks, "attention sinks"),
            (
                self.scale && !support.scale,
                "a logit scale other than 1/√p",
            ),
        ]
        .into_iter()
        .find_map(|(missing, name)| missing.then_some(name))
    }

    /// Whether the spec is its mask's plain target.
    pub fn is_plain(self) -> bool {
        self == Self::NONE
    }
}

/// One layer's exact attention (docs/reference.md §7.7.0).
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionSpec {
    /// Query i sees keys j ≤ i only (decoders); false: every key (encoders).
    pub causal: bool,
    /// W: with `causal`, query i also sees only keys j > i − W (W counts the diagonal).
    pub window: Option<usize>,
    /// τ, the factor on q·k (1/√p_qk unless the family says otherwise).
    pub scale: f64,
    /// c: logits become c·tanh(s/c) (gemma2).
    pub softcap: Option<f64>,
    /// σ_h: one learned logit per query head in every row's softmax, with a zero value (gpt-oss).
    pub sinks: Option<Vec<f64>>,
}

impl AttentionSpec {
    /// Softmax over every key with τ = 1/√p (encoders, Figure 1).
    pub fn bidirectional(p: usize) -> Self {
        Self {
            causal: false,
            window: None,
            scale: default_scale(p),
            softcap: None,
            sinks: None,
        }
    }

    /// Causal softmax with τ = 1/√p and, if given, a sliding window (Llama-style decoders).
    pub fn causal(p: usize, window: Option<usize>) -> Self {
        Self {
            causal: true,
            window,
            scale: default_scale(p),
            softcap: None,
            sinks: None,
        }
    }

    /// The plain target under a user's `mask` choice (τ = 1/√p, no window, cap or sinks).
    pub fn of_mask(mask: Mask, p: usize) -> Self {
        match mask {
            Mask::None => Self::bidirectional(p),
            Mask::Causal => Self::causal(p, None),
        }
    }

    /// The mask choice this spec refines (causal or none).
    pub fn mask(&self) -> Mask {
        if self.causal {
            Mask::Causal
        } else {
            Mask::None
        }
    }

    /// The first feature of this spec beyond its plain mask target for head size `p`, named for
    /// a refusal ("a sliding window", …); None when the spec is [`AttentionSpec::of_mask`]'s.
    pub fn beyond_mask(&self, p: usize) -> Option<&'static str> {
        if self.window.is_some() {
            Some("a sliding window")
        } else if self.softcap.is_some() {
            Some("a logit soft-cap")
        } else if self.sinks.is_some() {
            Some("attention sinks")
        } else if self.scale != default_scale(p) {
            Some("a logit scale other than 1/√p")
        } else {
            None
        }
    }

    /// What the spec has beyond its mask for a head of size `p` over `n` keys: unlike
    /// [`Self::beyond_mask`], a window of W ≥ n is no feature (it hides nothing at this n).
    pub fn features(&self, p: usize, n: usize) -> SpecFeatures {
        SpecFeatures {
            window: self.window_within(n).is_some(),
            softcap: self.softcap.is_some(),
            sinks: self.sinks.is_some(),
            scale: self.scale != default_scale(p),
        }
    }

    /// The spec with τ replaced.
    pub fn with_scale(mut self, scale: f64) -> Self {
        self.scale = scale;
        self
    }

    /// The spec with a soft-cap c.
    pub fn with_softcap(mut self, softcap: Option<f64>) -> Self {
        self.softcap = softcap;
        self
    }

    /// The spec with per-query-head sink logits.
    pub fn with_sinks(mut self, sinks: Option<Vec<f64>>) -> Self {
        self.sinks = sinks;
        self
    }

    /// The keys a row sees, as the fused kernels take it.
    pub fn visible(&self) -> Visible {
        Visible::new(self.causal, self.window)
    }

    /// The cap and sinks as the fused kernels take them.
    pub fn logits(&self) -> Logits<'_> {
        Logits {
            softcap: self.softcap,
            sinks: self.sinks.as_deref(),
        }
    }

    /// Whether query i sees key j.
    pub fn sees(&self, i: usize, j: usize) -> bool {
        self.visible().sees(i, j)
    }

    /// The window, when it is shorter than `n` (a window of W ≥ n keys hides nothing).
    pub fn window_within(&self, n: usize) -> Option<usize> {
        self.window.filter(|&w| self.causal && w < n)
    }

    /// `sliding_attention` when the layer has a window, else `full_attention`.
    pub fn layer_type(&self) -> LayerType {
        if self.window.is_some() {
            LayerType::Sliding
        } else {
            LayerType::Full
        }
    }

    /// Whether the logits are plain scaled dot products over the keys (no cap, no sinks), so that
    /// a kernel that scales Q by τ computes this target.
    pub fn plain_logits(&self) -> bool {
        self.softcap.is_none() && self.sinks.is_none()
    }

    /// s = c·tanh(τ·dot/c), or τ·dot without a cap: a raw product q·k to the logit.
    pub fn logit(&self, dot: f64) -> f64 {
        let s = self.scale * dot;
        match self.softcap {
            Some(c) => c * (s / c).tanh(),
            None => s,
        }
    }

    /// Query head h's own spec: the same with its sink σ_h alone (a one-head computation's).
    pub fn for_head(&self, h: usize) -> Self {
        Self {
            sinks: self.sink(h).map(|s| vec![s]),
            ..self.clone()
        }
    }

    /// Query head h's sink logit σ_h, if the layer has sinks.
    pub fn sink(&self, h: usize) -> Option<f64> {
        self.sinks.as_ref().map(|s| s[h])
    }

    /// Refuses a spec no attention has: a window of 0, a window without the causal mask, a scale
    /// or cap that is not a positive finite number, non-finite sinks, or sinks not one per query
    /// head (`heads`). `what` names the layer in the message.
    pub fn validate(&self, heads: usize, what: &str) -> Result<()> {
        if self.window == Some(0) {
            return Err(crate::usage!(
                "{what}: a sliding window of 0 sees no key; give a window of at least 1 (or none)"
            ));
        }
        if self.window.is_some() && !self.causal {
            return Err(crate::usage!(
                "{what}: a sliding window needs the causal mask"
            ));
        }
        if !(self.scale.is_finite() && self.scale > 0.0) {
            return Err(crate::usage!(
                "{what}: the attention scale is {}; it must be a positive finite number",
                self.scale
            ));
        }
        if let Some(c) = self.softcap {
            if !(c.is_finite() && c > 0.0) {
                return Err(crate::usage!(
                    "{what}: the logit soft-cap is {c}; it must be a positive finite number (or none)"
                ));
            }
        }
        if let Some(s) = &self.sinks {
            if s.len() != heads {
                return Err(crate::usage!(
                    "{what}: {} sink logits for {heads} query heads; there must be one per query head",
                    s.len()
                ));
            }
            if let Some(bad) = s.iter().find(|x| !x.is_finite()) {
                return Err(crate::usage!(
                    "{what}: a sink logit is {bad}; sinks must be finite"
                ));
            }
        }
        Ok(())
    }
}

/// One line for messages: "causal, window 64, τ = 0.125, soft-cap 50, sinks".
impl std::fmt::Display for AttentionSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.causal {
            "causal"
        } else {
            "bidirectional"
        })?;
        if let Some(w) = self.window {
            write!(f, ", window {w}")?;
        }
        write!(f, ", τ = {:.6}", self.scale)?;
        if let Some(c) = self.softcap {
            write!(f, ", soft-cap {c}")?;
        }
        if self.sinks.is_some() {
            f.write_str(", sinks")?;
        }
        Ok(())
    }
}

/// 1/√p.
pub fn default_scale(p: usize) -> f64 {
    1.0 / (p as f64).sqrt()
}

/// Exact attention of every query head under `spec` (q [H, n, p], k [H_kv, n, p], v [H_kv, n, p_v]
/// → [H, n, p_v], in Q's dtype), with Q scaled by τ first (where transformers' eager path scales
/// the scores: a rounding apart). On the host every spec takes the fused kernel (f32, f64); on a
/// device, plain logits (no cap, no sinks) take its device form where it applies; everything
/// else takes [`exact_attention_dense`].
pub fn exact_attention(q: &Tensor, k: &Tensor, v: &Tensor, spec: &AttentionSpec) -> Result<Tensor> {
    let fused = if q.device().is_cpu() {
        spec.validate(q.dim(0)?, "the attention spec")?;
        let qs = (q * spec.scale)?;
        crate::numerics::flash::on_host(&qs, k, v, spec.visible(), spec.logits())?.map(|(o, _)| o)
    } else if spec.plain_logits() {
        crate::numerics::flash::on_device(&(q * spec.scale)?, k, v, spec.visible())?
    } else {
        None
    };
    match fused {
        Some(o) => Ok(o),
        None => exact_attention_dense(q, k, v, spec),
    }
}

/// Rows per block of [`exact_attention_dense`] for `heads` query heads over `n` keys: about 2²⁴
/// score entries (64 MB in f32).
fn dense_block_rows(heads: usize, n: usize) -> usize {
    ((1usize << 24) / (heads * n).max(1)).clamp(1, n.max(1))
}

/// Exact attention of every query head under `spec`, by blocks of rows of explicit logits on any
/// device, in Q's dtype: q [H, n, p], k [H_kv, n, p], v [H_kv, n, p_v] → [H, n, p_v], query head h
/// reading K/V head ⌊h·H_kv/H⌋ (K/V broadcast over their group by viewing Q as
/// [H_kv, group·rows, p], never copied). The order is transformers' eager one: scale, cap, mask,
/// softmax with the sink column, drop the sink. Key columns outside a block's causal span are
/// skipped, not only masked.
pub fn exact_attention_dense(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    spec: &AttentionSpec,
) -> Result<Tensor> {
    let (heads, n, _) = q.dims3()?;
    exact_attention_blocks(q, k, v, spec, dense_block_rows(heads, n))
}

/// [`exact_attention_dense`] with `b` rows per block.
pub(crate) fn exact_attention_blocks(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    spec: &AttentionSpec,
    b: usize,
) -> Result<Tensor> {
    let (heads, n, p) = q.dims3()?;
    let (kv_heads, nk, pk) = k.dims3()?;
    let (kv_heads_v, nv, pv) = v.dims3()?;
    if kv_heads == 0
        || !heads.is_multiple_of(kv_heads)
        || pk != p
        || kv_heads_v != kv_heads
        || nv != nk
        || (spec.causal && nk != n)
    {
        return Err(crate::usage!(
            "attention needs Q [H, n, p], K [H_kv, n, p] and V [H_kv, n, p_v] with H_kv dividing H; got {:?}, {:?}, {:?}",
            q.dims(),
            k.dims(),
            v.dims()
        ));
    }
    spec.validate(heads, "the attention spec")?;
    let group = heads / kv_heads;
    let dtype = q.dtype();
    let dev = q.device();
    let b = b.clamp(1, n.max(1));
    let q4 = q.reshape((kv_heads, group, n, p))?;
    // The sinks as a [H_kv, group, 1, 1] column, in the run's dtype.
    let sinks = match &spec.sinks {
        Some(s) => {
            Some(Tensor::from_vec(s.clone(), (kv_heads, group, 1, 1), dev)?.to_dtype(dtype)?)
        }
        None => None,
    };
    let mut outs = Vec::with_capacity(n.div_ceil(b));
    for s in (0..n).step_by(b) {
        let rows = b.min(n - s);
        let (probs, j0) = probability_block(&q4, k, spec, sinks.as_ref(), (s, rows))?;
        let keys = probs.dim(3)?;
        let vb = v.narrow(1, j0, keys)?.contiguous()?;
        let probs = probs.reshape((kv_heads, group * rows, keys))?;
        outs.push(probs.matmul(&vb)?.reshape((kv_heads, group, rows, pv))?);
    }
    Ok(Tensor::cat(&outs, 2)?.reshape((heads, n, pv))?)
}

/// Rows s..s + rows of every query head's probabilities under `spec` (q4 [H_kv, group, n, p],
/// k [H_kv, n_k, p]; `sinks` as a [H_kv, group, 1, 1] column in q's dtype): P over the real keys
/// j0..j1 that the block's rows can see, [H_kv, group, rows, j1 − j0], and j0. With sinks a row
/// sums to 1 − its sink's probability.
pub(crate) fn probability_block(
    q4: &Tensor,
    k: &Tensor,
    spec: &AttentionSpec,
    sinks: Option<&Tensor>,
    (s, rows): (usize, usize),
) -> Result<(Tensor, usize)> {
    let (kv_heads, group, _, p) = q4.dims4()?;
    let nk = k.dim(1)?;
    let (dtype, dev) = (q4.dtype(), q4.device());
    let (j0, j1) = if spec.causal {
        let lo = spec.window.map_or(0, |w| (s + 1).saturating_sub(w));
        (lo, s + rows)
    } else {
        (0, nk)
    };
    let keys = j1 - j0;
    let qb = q4
        .narrow(2, s, rows)?
        .contiguous()?
        .reshape((kv_heads, group * rows, p))?;
    let kb = k.narrow(1, j0, keys)?.t()?.contiguous()?;
    let mut logits = (qb.matmul(&kb)? * spec.scale)?;
    if let Some(c) = spec.softcap {
        logits = ((logits / c)?.tanh()? * c)?;
    }
    let mut logits = logits.reshape((kv_heads, group, rows, keys))?;
    if spec.causal {
        let mask: Vec<f32> = (s..s + rows)
            .flat_map(|i| {
                (j0..j1).map(move |j| {
                    if spec.sees(i, j) {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (rows, keys), dev)?.to_dtype(dtype)?;
        logits = logits.broadcast_add(&mask)?;
    }
    let probs = match sinks {
        None => candle_nn::ops::softmax_last_dim(&logits)?,
        Some(col) => {
            // The sink column joins the softmax and is dropped after it: its value is zero.
            let col = col.broadcast_as((kv_heads, group, rows, 1))?.contiguous()?;
            let with_sink = Tensor::cat(&[&logits, &col], D::Minus1)?;
            let max = with_sink.max_keepdim(D::Minus1)?;
            let e = with_sink.broadcast_sub(&max)?.exp()?;
            let denom = e.sum_keepdim(D::Minus1)?;
            e.narrow(D::Minus1, 0, keys)?.broadcast_div(&denom)?
        }
    };
    Ok((probs, j0))
}

/// The same attention in float64 by its definition, one row at a time on the host (tests and
/// checks): q [H, n, p], k [H_kv, n, p], v [H_kv, n, p_v] as row-major f64 slices.
pub fn exact_attention_reference(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    dims: (usize, usize, usize, usize, usize),
    spec: &AttentionSpec,
) -> Vec<f64> {
    let (heads, kv_heads, n, p, pv) = dims;
    let mut out = vec![0.0; heads * n * pv];
    for h in 0..heads {
        let g = crate::numerics::gqa::kv_head(h, heads, kv_heads);
        for i in 0..n {
            let qi = &q[(h * n + i) * p..][..p];
            let s: Vec<(usize, f64)> = (0..n)
                .filter(|&j| spec.sees(i, j))
                .map(|j| {
                    let kj = &k[(g * n + j) * p..][..p];
                    (j, spec.logit(qi.iter().zip(kj).map(|(a, b)| a * b).sum()))
                })
                .collect();
            let sink = spec.sink(h);
            let m = s
                .iter()
                .map(|x| x.1)
                .chain(sink)
                .fold(f64::NEG_INFINITY, f64::max);
            let mut denom = sink.map_or(0.0, |x| (x - m).exp());
            let o = &mut out[(h * n + i) * pv..][..pv];
            for &(j, sj) in &s {
                let e = (sj - m).exp();
                denom += e;
                let vj = &v[(g * n + j) * pv..][..pv];
                o.iter_mut().zip(vj).for_each(|(a, b)| *a += e * b);
            }
            o.iter_mut().for_each(|a| *a /= denom);
        }
    }
    out
}

#[cfg(test)]
#[path = "spec_tests.rs"]
mod tests;
