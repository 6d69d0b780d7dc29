//! Decode-time KV-cache compression (docs/reference.md §9, issue 35): the continuation protocol and the
//! methods that compress a prompt's cache before decoding (SnapKV, PyramidKV, Ada-KV, H2O, TOVA,
//! StreamingLLM), Quest's per-query pages, and two oracles.
//!
//! **Protocol** (§9.1, `--decode N_F`): a window of n tokens is a prompt of n_p = n − n_f tokens
//! and a continuation F = {n_p..n−1}. Q, K, V come from one teacher-forced forward. A method
//! compresses from prompt-side tensors (the oracles also read F) and gives each query head a kept
//! set C_h ⊆ {0..n_p−1} (per continuation query for `quest_dec` and `topk_dec`); continuation
//! query t then reads S_t = C_h ∪ {n_p..t}. Ô_F is the restricted softmax over S_t, scored against
//! the exact causal rows O_F: every column over the n_f rows. d is the prompt keys kept per query
//! head; d ≥ n_p keeps every prompt key for every method, whatever its schedule (exact).
//!
//! **Layer-level methods.** `adakv` and `tova` read every query head of the layer, `pyramidkv` the
//! layer index and the model's layer count: a [`LayerContext`] (one per window, shared by the
//! window's heads) carries all heads' Q and K and memoises per-head prompt scores across heads and
//! budgets, so the per-head trial stays the unit (each trial's Ô depends only on the window, its
//! head and d). They use all heads even when `--heads` measures a subset.
//!
//! Files: [`budgets`] (PyramidKV's and Ada-KV's schedules), [`scores`] (the per-head prompt
//! scores, computed once per window and head), [`kept`] (the static sets), [`methods`] (the
//! `Method`s). Pooling is `numerics::pooling`; the stable top-k the prefill family's
//! `select::top_indices`; the restricted softmax `numerics::key_sets`.

pub mod budgets;
pub mod kept;
pub mod methods;
pub mod press;
pub mod scores;

#[cfg(test)]
mod press_tests;
#[cfg(test)]
mod spec_tests;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{anyhow, ensure, Result};
use candle_core::Tensor;

use crate::attention::spec::AttentionSpec;
use crate::attention::{Approximation, HeadInputs, Mask, SpecFeatures};
use crate::numerics::key_sets::{key_set_softmax_logits, per_row_groups, KeyGroup, KeyLogits};
use crate::numerics::sampling::TrialRng;

/// The recommended continuation length n_f (§9.1: the method-to-oracle ratios and the rankings
/// are stable from 256 on).
pub const RECOMMENDED_N_F: usize = 256;

/// A memoised per-head product, or the error computing it gave (returned to every caller).
type Memoised = std::result::Result<Arc<dyn std::any::Any + Send + Sync>, String>;
/// (kind of product, query head or another index such as a budget).
type MemoKey = (&'static str, usize);

/// Everything of one window that a decode trial of any head may read: all query heads' Q
/// ([H, n, p]), all K/V heads' K and V ([H_kv, n, p]), the split, and the layer's place in the
/// model. Per-head prompt scores are memoised here ([`LayerContext::scores`]), so a layer-level
/// method computes each head's scores once per window, whichever head's trial asks first.
pub struct LayerContext {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    /// Continuation tokens n_f (the prompt is the first n − n_f).
    pub n_f: usize,
    /// This layer ℓ and the model's layer count L (PyramidKV's schedule).
    pub layer: usize,
    pub layers: usize,
    /// The layer's attention (docs/reference.md §7.7.6): the scores read its probabilities (τ,
    /// capped, windowed, over real keys beside the sink), `topk_dec` ranks its raw τ·q·k.
    pub spec: AttentionSpec,
    /// The layer's rotary map where the model has one (kvpress's ExpectedAttention reads it).
    pub rope: Option<crate::numerics::rope::LayerRope>,
    memo: Mutex<HashMap<MemoKey, Arc<OnceLock<Memoised>>>>,
}

impl LayerContext {
    pub fn new(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        n_f: usize,
        layer: usize,
        layers: usize,
    ) -> Result<Self> {
        let (h, n, _) = q.dims3()?;
        let (hkv, nk, _) = k.dims3()?;
        ensure!(
            h % hkv == 0 && n == nk && v.dims3()?.1 == n,
            "decode: Q [{h}, {n}, ·] does not fit K [{hkv}, {nk}, ·]"
        );
        ensure!(
            n_f >= 1 && n_f < n,
            "--decode {n_f}: the continuation must leave a prompt of at least one token at n = {n}"
        );
        let spec = AttentionSpec::causal(q.dims3()?.2, None);
        Ok(Self {
            q,
            k,
            v,
            n_f,
            layer,
            layers,
            spec,
            rope: None,
            memo: Mutex::new(HashMap::new()),
        })
    }

    /// The context with the layer's rotary map.
    pub fn with_rope(mut self, rope: Option<crate::numerics::rope::LayerRope>) -> Self {
        self.rope = rope;
        self
    }

    /// The context under a layer's own spec (a §7.7 family's; plain causal otherwise).
    pub fn with_spec(mut self, spec: AttentionSpec) -> Result<Self> {
        spec.validate(self.heads(), "the decode layer's spec")?;
        ensure!(spec.causal, "the decode protocol needs a causal spec");
        self.spec = spec;
        Ok(self)
    }

    /// Whether the layer's spec is the plain causal target at this n (the scores then take
    /// their original, fused paths).
    pub fn plain(&self) -> bool {
        let p = self.q.dims()[2];
        self.spec.features(p, self.n()).is_plain()
    }

    /// Window length n.
    pub fn n(&self) -> usize {
        self.q.dims()[1]
    }
    /// Prompt length n_p = n − n_f.
    pub fn n_p(&self) -> usize {
        self.n() - self.n_f
    }
    /// Query heads H.
    pub fn heads(&self) -> usize {
        self.q.dims()[0]
    }
    /// The K/V head query head `g` reads, ⌊g·H_kv/H⌋ (§7.1).
    pub fn kv_head(&self, g: usize) -> usize {
        crate::numerics::gqa::kv_head(g, self.heads(), self.k.dims()[0])
    }
    /// The query heads that share `g`'s K/V head (its GQA group), in order.
    pub fn group(&self, g: usize) -> Vec<usize> {
        self.query_heads_of(self.kv_head(g))
    }
    /// The query heads that read K/V head `kv`, in order.
    pub fn query_heads_of(&self, kv: usize) -> Vec<usize> {
        (0..self.heads())
            .filter(|&x| self.kv_head(x) == kv)
            .collect()
    }
    /// Query head g's Q and its K/V head's K, V ([n, p] each).
    pub fn head_qkv(&self, g: usize) -> Result<(Tensor, Tensor, Tensor)> {
        let kv = self.kv_head(g);
        Ok((self.q.get(g)?, self.k.get(kv)?, self.v.get(kv)?))
    }

    /// The scores `kind` of head `head`, computed by `f` once per window (concurrent first calls
    /// of one key wait for one computation). An error is kept and returned to every caller.
    pub fn scores(
        &self,
        kind: &'static str,
        head: usize,
        f: impl FnOnce() -> Result<Vec<f64>>,
    ) -> Result<Arc<Vec<f64>>> {
        self.memo(kind, head, f)
    }

    /// [`Self::scores`] for a product of any type (a ranking, a score matrix).
    pub fn memo<T: std::any::Any + Send + Sync>(
        &self,
        kind: &'static str,
        head: usize,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<Arc<T>> {
        let cell = self
            .memo
            .lock()
            .map_err(|_| anyhow!("decode score memo poisoned"))?
            .entry((kind, head))
            .or_default()
            .clone();
        let value = cell
            .get_or_init(|| {
                f().map(|v| Arc::new(v) as Arc<dyn std::any::Any + Send + Sync>)
                    .map_err(|e| format!("{e:#}"))
            })
            .clone()
            .map_err(|e| anyhow!(e))?;
        value
            .downcast::<T>()
            .map_err(|_| anyhow!("decode memo: {kind} holds another type"))
    }
}

/// What a head's trial under the protocol knows beyond its own Q, K, V: which query head it is,
/// and its window's [`LayerContext`].
#[derive(Clone)]
pub struct DecodeHead {
    pub head: usize,
    pub layer: Arc<LayerContext>,
}

impl DecodeHead {
    pub fn n_f(&self) -> usize {
        self.layer.n_f
    }
    pub fn n_p(&self) -> usize {
        self.layer.n_p()
    }
}

/// A method under the decode protocol (§9.1): the §9 family and the §8 KV caches. Ô is the n_f
/// continuation rows of the head, which read the layer's compressed prompt; the protocol gives
/// the head's [`DecodeHead`] here, and nowhere else (a method's inputs do not carry it).
pub trait Decoding: Sync + Send {
    /// Ô of the continuation rows n_p..n of `head`.
    fn approximate_decode(
        &self,
        head: &HeadInputs,
        dec: &DecodeHead,
        d: usize,
        rng: &mut TrialRng,
    ) -> Result<Approximation>;
    /// One decode trial with the generator of the trial's derived seed (a user's function that
    /// seeds its own generator overrides this, as [`crate::attention::Method::approximate_trial`]).
    fn approximate_decode_trial(
        &self,
        head: &HeadInputs,
        dec: &DecodeHead,
        d: usize,
        seed: u64,
    ) -> Result<Approximation> {
        self.approximate_decode(
            head,
            dec,
            d,
            &mut crate::numerics::sampling::rng_from_seed(seed),
        )
    }
    /// Leading multiply-adds with n_f continuation rows: by default the dense continuation rows,
    /// 2p·Σ_{t∈F}(t + 1) (a §8 cache read by every continuation query).
    fn macs_decode(&self, n: usize, p: usize, d: usize, n_f: usize) -> f64 {
        let _ = d;
        2.0 * p as f64 * dense_pairs(n, n_f)
    }
    /// `kv_bits` (§8.5) with n_f continuation rows; None for a method that reads an f16 cache
    /// (the §9 selections: the protocol counts their keys at 16 bits).
    fn kv_bits_decode(&self, n: usize, n_f: usize) -> Option<f64> {
        let _ = (n, n_f);
        None
    }
    /// What of a layer's spec the method implements under the protocol (docs/reference.md §7.7.6);
    /// its prefill support says nothing of its decode form.
    fn decode_spec_support(&self) -> SpecFeatures {
        SpecFeatures::NONE
    }
}

/// The continuation row i (query t = n_p + i) sees key j: causal, and within the layer's window.
fn continuation_sees(spec: &AttentionSpec, n_p: usize) -> impl Fn(usize, usize) -> bool + Sync {
    let w = spec.window;
    move |i: usize, j: usize| {
        let t = n_p + i;
        j <= t && w.is_none_or(|w| j + w > t)
    }
}

/// The mean over the continuation rows of the keys of `sets[i]` that row i sees (`keys`, §7.7.6:
/// realised keys only, so a window's cut counts).
fn realised_keys(spec: &AttentionSpec, n_p: usize, sets: &[&[usize]]) -> f64 {
    let sees = continuation_sees(spec, n_p);
    let total: usize = sets
        .iter()
        .enumerate()
        .map(|(i, s)| s.iter().filter(|&&j| sees(i, j)).count())
        .sum();
    total as f64 / sets.len() as f64
}

/// The head's logits for a key-set softmax: plain (1/√p, the pre-§7.7 path's own), or the
/// head's τ, cap and sink.
fn head_logits(head: &HeadInputs) -> KeyLogits {
    if head.spec.features(head.p(), head.n()).is_plain() {
        KeyLogits::plain(head.p())
    } else {
        head.key_logits()
    }
}

/// What a decode method's [`crate::attention::Method::approximate`] answers outside the protocol:
/// a usage error naming `id`.
pub fn outside_the_protocol(id: &str) -> anyhow::Error {
    crate::usage!("{id} is a decode-time method (docs/reference.md §9): run it with --decode N_F (e.g. --decode {RECOMMENDED_N_F})")
}

/// A §9 method needs the causal mask.
pub fn require_causal(head: &HeadInputs, id: &str) -> Result<()> {
    ensure!(
        head.mask == Mask::Causal,
        "{id} is a decode-time method (docs/reference.md §9): it needs the causal mask"
    );
    Ok(())
}

/// The continuation's dense key count Σ_{t∈F} (t + 1): `kv_read`'s denominator (§9.1).
pub fn dense_pairs(n: usize, n_f: usize) -> f64 {
    let n_p = n - n_f;
    // Σ_{t=n_p}^{n−1} (t + 1) = Σ_{u=n_p+1}^{n} u.
    (n * (n + 1) / 2 - n_p * (n_p + 1) / 2) as f64
}

/// The mean over F of |S_t| for a static set of `kept` prompt keys: |C| + (n_f + 1)/2 (§9.1).
pub fn static_keys(kept: usize, n_f: usize) -> f64 {
    kept as f64 + (n_f as f64 + 1.0) / 2.0
}

/// Ô_F of the continuation rows reading one static prompt set `kept` (sorted, < n_p) plus the
/// continuation so far, with its support (mean keys, log-normalisers), on the head's device and in
/// its dtype: one key group of the n_f rows, the causal filter j < n_p or j ≤ t.
pub fn static_rows(head: &HeadInputs, dec: &DecodeHead, kept: &[usize]) -> Result<Approximation> {
    let (n, n_p, n_f) = (head.n(), dec.n_p(), dec.n_f());
    ensure!(
        kept.windows(2).all(|w| w[0] < w[1]) && kept.last().is_none_or(|&j| j < n_p),
        "decode: a kept set must be sorted prompt positions"
    );
    let mut keys = kept.to_vec();
    keys.extend(n_p..n);
    let groups = [KeyGroup {
        rows: (0..n_f).collect(),
        keys,
    }];
    // §7.7.6: the set is intersected with the window (keys outside it are dropped, not
    // replaced), and the sink stays in every row's denominator.
    let filter = continuation_sees(&head.spec, n_p);
    let q_f = head.q.narrow(0, n_p, n_f)?;
    let out = key_set_softmax_logits(
        &q_f,
        &head.k,
        &head.v,
        &groups,
        Some(&filter),
        true,
        head_logits(head),
    )?;
    let keys = match head.spec.window_within(n) {
        None => static_keys(kept.len(), n_f),
        Some(_) => realised_keys(&head.spec, n_p, &vec![groups[0].keys.as_slice(); n_f]),
    };
    Approximation::restricted(out, keys)
}

/// The continuation rows of dense causal attention over (q, k, v) ([n, p] each): softmax over
/// keys j ≤ t for t = n_p..n − 1, [n_f, p], in the inputs' dtype — what a §8 cache read by every
/// continuation query computes, without forming the prompt's own rows. Under a layer's spec
/// beyond the mask (§7.7.6) the rows are the spec's exact attention on these (q, k, v).
pub fn dense_continuation(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    n_p: usize,
    spec: &AttentionSpec,
) -> Result<Tensor> {
    use crate::attention::exact::{causal_scores, scaled_operands};
    let n_f = q.dim(0)? - n_p;
    if !spec.features(q.dim(1)?, q.dim(0)?).is_plain() {
        let o = crate::attention::exact::ExactAttention::compute_spec(q, k, v, spec)?.output;
        return Ok(o.narrow(0, n_p, n_f)?);
    }
    let (qs, kt) = scaled_operands(&q.narrow(0, n_p, n_f)?, k)?;
    Ok(crate::attention::row_softmax(&causal_scores(&qs, &kt, n_p)?)?.matmul(v)?)
}

/// Ô_F with a prompt set per continuation query (`per_row[i]` for t = n_p + i, sorted, < n_p).
pub fn per_query_rows(
    head: &HeadInputs,
    dec: &DecodeHead,
    per_row: Vec<Vec<usize>>,
) -> Result<Approximation> {
    let (n_p, n_f) = (dec.n_p(), dec.n_f());
    ensure!(
        per_row.len() == n_f,
        "decode: one prompt set per continuation query"
    );
    let mut total = 0usize;
    let sets: Vec<Vec<usize>> = per_row
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            s.extend(n_p..=n_p + i);
            total += s.len();
            s
        })
        .collect();
    let keys = match head.spec.window_within(head.n()) {
        None => total as f64 / n_f as f64,
        Some(_) => realised_keys(
            &head.spec,
            n_p,
            &sets.iter().map(Vec::as_slice).collect::<Vec<_>>(),
        ),
    };
    // Each row's set is its own and causal already: only a window needs a filter.
    let sees = continuation_sees(&head.spec, n_p);
    let filter: Option<crate::numerics::key_sets::RowFilter> =
        head.spec.window_within(head.n()).map(|_| &sees as _);
    let q_f = head.q.narrow(0, n_p, n_f)?;
    let out = key_set_softmax_logits(
        &q_f,
        &head.k,
        &head.v,
        &per_row_groups(sets),
        filter,
        true,
        head_logits(head),
    )?;
    Approximation::restricted(out, keys)
}

/// Sets the support's `kv_union` (§9.1: the prompt keys a K/V head holds for its group).
pub fn with_union(mut a: Approximation, union: f64) -> Approximation {
    if let Some(s) = a.support.as_mut() {
        s.kv_union = Some(union);
    }
    a
}

/// |∪ sets|, for sorted sets of prompt positions.
pub fn union_size(sets: &[&[usize]]) -> usize {
    let mut all: Vec<usize> = sets.iter().flat_map(|s| s.iter().copied()).collect();
    all.sort_unstable();
    all.dedup();
    all.len()
}
