//! NVIDIA kvpress's presses (kvpress 0.5.5, issue 58) under the decode protocol (§9.1), each as
//! kvpress computes it: **one kept set per K/V head** (kvpress's budget rule: a press scores
//! (batch, K/V head, position), reducing a group's query heads by their mean, and keeps the top
//! `n_kept` of each K/V head), with kvpress's defaults. Every query head of a group reads its K/V
//! head's set, so a K/V head stores exactly d prompt keys (`kv_union` = d).
//!
//! d is kvpress's `n_kept`: the prompt keys each K/V head keeps. kvpress derives it from a
//! compression ratio as int(n_p·(1 − ratio)); `scripts/kvpress-check.py` passes the ratio
//! (n_p − d − ½)/n_p, which keeps exactly d (1 − d/n_p keeps d − 1 for 18 % of (n_p, d) pairs).
//!
//! Readings where kvpress is silent or unspecified (noted on issue 58):
//! - Ties: kvpress takes `torch.topk`, whose order among equal scores is unspecified; here the
//!   lower position wins (§9.1), and across K/V heads (Ada-KV) the lower head.
//! - A press that forces its window (SnapKV, PyramidKV, Ada-KV: the last 64 prompt tokens score
//!   max + 1) keeps, at d ≤ 64, d of 64 equal scores; here the most recent d (`dec_window`).
//! - CUR forces its 4 sinks (score 1.0): at d < 4, the first d.
//! - Ada-KV masks (a fake key whose logit is about −1e5·τ·⟨q, Y⟩/‖Y‖²) where the others remove;
//!   here every press removes. `scripts/kvpress-check.py` measures what the mask leaves.
//!
//! Scores are computed in the run's dtype and read to the host as f64, as the §9.2 methods'.

use anyhow::{ensure, Result};
use candle_core::{DType, Tensor, D};

use super::scores;
use super::LayerContext;
use crate::attention::prefill::select::top_indices;
use crate::numerics::pooling::avg_pool1d;
use crate::numerics::rope::rotate_half;

/// kvpress's SnapKV window (`window_size`, also PyramidKV's; Ada-KV wraps SnapKV).
pub const PRESS_WINDOW: usize = 64;
/// kvpress's SnapKV pooling (`kernel_size`, `avg_pool1d` with zero padding counted).
const PRESS_KERNEL: usize = 5;
/// PyramidKVPress's β.
const PRESS_BETA: f64 = 20.0;
/// AdaKVPress's `alpha_safeguard`.
const PRESS_ALPHA: f64 = 0.2;
/// The relative tilt that orders ties by construction (see [`toward_lower`]).
pub const TIE_TILT: f64 = 1e-10;
/// ExpectedAttentionPress's `n_sink` and `n_future_positions`.
const EA_SINKS: usize = 4;
const EA_FUTURE: usize = 512;
/// LagKVPress's `n_sink` and `lag_size`.
const LAG_SINKS: usize = 4;
const LAG: usize = 128;
/// CURPress's `num_sinks` and `local_window_size`.
const CUR_SINKS: usize = 4;
const CUR_LOCAL: usize = 16;

/// The presses, each kvpress's class of that name with its defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Press {
    /// SnapKVPress: the last 64 prompt queries' attention, mean over the window and the group,
    /// average-pooled (5); the window is kept.
    SnapKv,
    /// PyramidKVPress: SnapKVPress's scores with its per-layer budget (β = 20).
    PyramidKv,
    /// AdaKVPress(SnapKVPress()): the layer's H_kv·d keys go to the top scores over all K/V heads,
    /// each head keeping at least its top ⌊0.2·d⌋.
    AdaKv,
    /// ObservedAttentionPress: a key's attention summed over the prompt queries, divided by the
    /// number of queries that see it (n_p − j), mean over the group.
    ObservedAttention,
    /// TOVAPress: the last prompt query's attention, mean over every query head of the layer; the
    /// last prompt token is kept.
    Tova,
    /// KnormPress: the keys of smallest norm.
    Knorm,
    /// KeyDiffPress: the keys least similar (cosine) to the mean normalised key.
    KeyDiff,
    /// CURPress: leverage k²·v² normalised in local windows of 16, the first 4 kept.
    Cur,
    /// ExpectedAttentionPress: the attention a key can expect from future queries, whose mean and
    /// covariance are the prompt's (pre-RoPE, past the 4 sinks) under the RoPE map averaged over
    /// the next 512 positions; times ‖v‖; the 4 sinks kept.
    ExpectedAttention,
    /// LagKVPress: per partition of 128 prompt tokens, the rank of each token's spread
    /// (lag-relative to the next partition's range) in K and V; 4 sinks and the last partition
    /// and remainder kept.
    LagKv,
}

impl Press {
    pub const ALL: [Press; 10] = [
        Press::SnapKv,
        Press::PyramidKv,
        Press::AdaKv,
        Press::ObservedAttention,
        Press::Tova,
        Press::Knorm,
        Press::KeyDiff,
        Press::Cur,
        Press::ExpectedAttention,
        Press::LagKv,
    ];

    /// The method id (kvpress's class name in snake case).
    pub fn id(self) -> &'static str {
        match self {
            Press::SnapKv => "snapkv_press",
            Press::PyramidKv => "pyramidkv_press",
            Press::AdaKv => "adakv_press",
            Press::ObservedAttention => "observed_attention_press",
            Press::Tova => "tova_press",
            Press::Knorm => "knorm_press",
            Press::KeyDiff => "keydiff_press",
            Press::Cur => "cur_press",
            Press::ExpectedAttention => "expected_attention_press",
            Press::LagKv => "lagkv_press",
        }
    }

    /// kvpress's class name (what a kvpress user looks for).
    pub fn class(self) -> &'static str {
        match self {
            Press::SnapKv => "SnapKVPress",
            Press::PyramidKv => "PyramidKVPress",
            Press::AdaKv => "AdaKVPress",
            Press::ObservedAttention => "ObservedAttentionPress",
            Press::Tova => "TOVAPress",
            Press::Knorm => "KnormPress",
            Press::KeyDiff => "KeyDiffPress",
            Press::Cur => "CURPress",
            Press::ExpectedAttention => "ExpectedAttentionPress",
            Press::LagKv => "LagKVPress",
        }
    }

    /// The sorted prompt positions K/V head `kv` keeps at budget `d` (0 < d < n_p).
    pub fn kept(self, ctx: &LayerContext, kv: usize, d: usize) -> Result<Vec<usize>> {
        let n_p = ctx.n_p();
        let windowed = matches!(self, Press::SnapKv | Press::PyramidKv | Press::AdaKv);
        if windowed && (d <= PRESS_WINDOW || n_p <= PRESS_WINDOW) {
            return Ok((n_p - d.min(n_p)..n_p).collect());
        }
        Ok(match self {
            Press::SnapKv => window_plus_top(&snap_scores(ctx, kv)?, d, n_p),
            Press::PyramidKv => {
                let keep = pyramid_n_kept(d, n_p, ctx.layers, ctx.layer);
                window_plus_top(&snap_scores(ctx, kv)?, keep, n_p)
            }
            Press::AdaKv => {
                let sets = ctx.memo("adakv_press.kept", d, || adakv_sets(ctx, d))?;
                sets[kv].clone()
            }
            Press::ObservedAttention => top_indices(&observed_scores(ctx, kv)?, d),
            Press::Tova => {
                // The last prompt token scores max + 1: it and the top d − 1 of the others.
                let s = scores::tova(ctx)?;
                let mut kept = top_indices(&s[..n_p - 1], d - 1);
                kept.push(n_p - 1);
                kept
            }
            Press::Knorm => {
                top_indices(&toward_lower(&key_only(ctx, kv, "knorm_press", knorm)?), d)
            }
            Press::KeyDiff => top_indices(&key_only(ctx, kv, "keydiff_press", keydiff)?, d),
            Press::Cur => {
                let s = toward_lower(&ctx.scores("cur_press", kv, || cur(ctx, kv))?);
                sinks_plus_top(&s[CUR_SINKS.min(n_p)..], CUR_SINKS.min(n_p), d)
            }
            Press::ExpectedAttention => {
                let s = ctx.scores("expected_attention_press", kv, || {
                    expected_attention(ctx, kv)
                })?;
                sinks_plus_top(&s, EA_SINKS.min(n_p), d)
            }
            Press::LagKv => top_indices(&ctx.scores("lagkv_press", kv, || lagkv(ctx, kv))?, d),
        })
    }

    /// Leading multiply-adds of the selection (§2.11), besides the continuation's pairs.
    pub fn select_macs(self, n_p: f64, p: f64) -> f64 {
        match self {
            Press::SnapKv | Press::PyramidKv | Press::AdaKv => PRESS_WINDOW as f64 * n_p * p,
            Press::ObservedAttention => n_p * (n_p + 1.0) / 2.0 * p,
            Press::Tova => n_p * p,
            Press::Knorm | Press::KeyDiff | Press::Cur => n_p * p,
            // Per query head: the prompt's query covariance (n_p·p²), the keys' quadratic form.
            Press::ExpectedAttention => 2.0 * n_p * p * p,
            Press::LagKv => 4.0 * n_p * p,
        }
    }
}

/// `s` with s_t − 1e-10·|s_t|·t/n: scores that tie by construction go to the lower position, whatever
/// their last bits. Knorm's and CUR's do: a key's norm is RoPE's invariant, and in layer 0 a key
/// before RoPE and a value depend on the token only, so every repeat of a token scores the same in
/// exact arithmetic and apart by rounding (1e-16 relative in f64) in any implementation. §9.1's
/// rule (ties to the lower index) then holds for them too; no real gap is that small.
/// `scripts/kvpress-check.py` tilts kvpress's scores the same way (and reports the spread to the
/// opposite tilt, the tie noise).
pub fn toward_lower(s: &[f64]) -> Vec<f64> {
    let n = s.len() as f64;
    s.iter()
        .enumerate()
        .map(|(t, &x)| x - TIE_TILT * x.abs() * t as f64 / n)
        .collect()
}

/// The first `sinks` positions (forced: kvpress scores them max + 1) and the top d − sinks of
/// `rest`, the scores of the positions after them; at d ≤ sinks the first d.
fn sinks_plus_top(rest: &[f64], sinks: usize, d: usize) -> Vec<usize> {
    if d <= sinks {
        return (0..d).collect();
    }
    let mut kept: Vec<usize> = (0..sinks).collect();
    kept.extend(top_indices(rest, d - sinks).iter().map(|j| j + sinks));
    kept
}

/// The window {n_p − 64..n_p − 1} and the top `keep − 64` of `scores` (which cover j < n_p − 64);
/// at keep ≤ 64 the last `keep`.
fn window_plus_top(scores: &[f64], keep: usize, n_p: usize) -> Vec<usize> {
    if keep <= PRESS_WINDOW {
        return (n_p - keep..n_p).collect();
    }
    // kept.rs' SnapKV form with kvpress's window (kept.rs names the presses: not imported back).
    let mut kept = top_indices(scores, keep - PRESS_WINDOW);
    kept.extend(n_p - PRESS_WINDOW..n_p);
    kept
}

/// The mean over K/V head `kv`'s query heads of a per-query-head score vector.
fn group_mean(
    ctx: &LayerContext,
    kv: usize,
    per_head: impl Fn(usize) -> Result<Vec<f64>>,
) -> Result<Vec<f64>> {
    let group = ctx.query_heads_of(kv);
    let mut mean: Vec<f64> = Vec::new();
    for &g in &group {
        let s = per_head(g)?;
        if mean.is_empty() {
            mean = s;
        } else {
            mean.iter_mut().zip(s).for_each(|(m, x)| *m += x);
        }
    }
    let n = group.len() as f64;
    Ok(mean.into_iter().map(|m| m / n).collect())
}

/// SnapKVPress's scores of K/V head `kv` over j < n_p − 64: per query head the window mean of
/// the causal softmax rows (the window's own block in the denominator), average-pooled (5, zero
/// padding counted), then the group's mean. Once per window and K/V head.
fn snap_scores(ctx: &LayerContext, kv: usize) -> Result<std::sync::Arc<Vec<f64>>> {
    ctx.scores("snapkv_press", kv, || {
        let w = PRESS_WINDOW as f64;
        group_mean(ctx, kv, |g| {
            let s: Vec<f64> = scores::window_sums(ctx, g, PRESS_WINDOW)?
                .iter()
                .map(|x| x / w)
                .collect();
            Ok(avg_pool1d(&s, PRESS_KERNEL, PRESS_KERNEL / 2))
        })
    })
}

/// PyramidKVPress's n_kept in layer ℓ of L at budget d (window included), as kvpress computes it
/// in f64 with n(1 − ratio) = d: cap − w = d, min = d/β, max = 2d − min (capped at n_p − w, then
/// min = 2d − max); unless n_p ≥ max ≥ min ≥ w (then uniform: d), steps = (max − min)/(L − 1)
/// and n_kept = round_half_even(max − ℓ·steps). Below 20·64 = 1280 it is uniform SnapKV.
pub fn pyramid_n_kept(d: usize, n_p: usize, layers: usize, layer: usize) -> usize {
    let (df, n, w) = (d as f64, n_p as f64, PRESS_WINDOW as f64);
    let mut min = df / PRESS_BETA;
    let mut max = 2.0 * df - min;
    if max >= n - w {
        max = n - w;
        min = 2.0 * df - max;
    }
    if !(n >= max && max >= min && min >= w) {
        return d.max(1);
    }
    let steps = if layers > 1 {
        (max - min) / (layers - 1) as f64
    } else {
        0.0
    };
    (max - layer as f64 * steps).round_ties_even() as usize
}

/// AdaKVPress's sets for every K/V head at budget d (> 64): each head's SnapKV scores with the
/// window at +∞; each head's top ⌊0.2·d⌋ (at least 1) forced; the layer's H_kv·d keys are the
/// forced ones, then the window, then the top scores over all heads (ties: lower head, then
/// lower position).
fn adakv_sets(ctx: &LayerContext, d: usize) -> Result<Vec<Vec<usize>>> {
    let n_p = ctx.n_p();
    let kv_heads = ctx.k.dims()[0];
    let safe = ((d as f64 * PRESS_ALPHA) as usize).max(1);
    // (class, score, head, position): class 2 forced, 1 window, 0 the rest.
    let mut all: Vec<(u8, f64, usize, usize)> = Vec::with_capacity(kv_heads * n_p);
    for kv in 0..kv_heads {
        let s = snap_scores(ctx, kv)?;
        let forced: std::collections::HashSet<usize> = if safe > PRESS_WINDOW {
            top_indices(&s, safe - PRESS_WINDOW).into_iter().collect()
        } else {
            Default::default()
        };
        for (j, &x) in s.iter().enumerate() {
            all.push((2 * forced.contains(&j) as u8, x, kv, j));
        }
        // The window: max + 1 in kvpress, so within the head's forced top when ⌊0.2·d⌋ ≥ 64.
        for j in n_p - PRESS_WINDOW..n_p {
            all.push((
                if safe > PRESS_WINDOW { 2 } else { 1 },
                f64::INFINITY,
                kv,
                j,
            ));
        }
    }
    ensure!(
        all.iter().all(|a| !a.1.is_nan()),
        "adakv_press: a score is NaN"
    );
    // Descending (class, score); a stable sort keeps (head, position) order among equals.
    all.sort_by(|a, b| (b.0, b.1).partial_cmp(&(a.0, a.1)).expect("no NaN"));
    let mut sets = vec![Vec::new(); kv_heads];
    for &(_, _, kv, j) in all.iter().take(kv_heads * d) {
        sets[kv].push(j);
    }
    sets.iter_mut().for_each(|s| s.sort_unstable());
    Ok(sets)
}

/// ObservedAttentionPress's scores of K/V head `kv`: Σ_{i<n_p} P_ij / (n_p − j), the group's mean.
fn observed_scores(ctx: &LayerContext, kv: usize) -> Result<std::sync::Arc<Vec<f64>>> {
    ctx.scores("observed_attention_press", kv, || {
        let n_p = ctx.n_p();
        group_mean(ctx, kv, |g| {
            Ok(scores::h2o(ctx, g)?
                .iter()
                .enumerate()
                .map(|(j, a)| a / (n_p - j) as f64)
                .collect())
        })
    })
}

/// A key-only score of K/V head `kv` over its prompt keys (once per window and head).
fn key_only(
    ctx: &LayerContext,
    kv: usize,
    kind: &'static str,
    f: fn(&Tensor) -> Result<Vec<f64>>,
) -> Result<std::sync::Arc<Vec<f64>>> {
    ctx.scores(kind, kv, || f(&ctx.k.get(kv)?.narrow(0, 0, ctx.n_p())?))
}

/// KnormPress: −‖k_j‖ (kvpress computes it in f32 at least).
fn knorm(k: &Tensor) -> Result<Vec<f64>> {
    let norms: Vec<f64> = k
        .sqr()?
        .sum(D::Minus1)?
        .sqrt()?
        .to_dtype(DType::F64)?
        .to_vec1()?;
    Ok(norms.into_iter().map(|x| -x).collect())
}

/// KeyDiffPress: −cos(k_j, a) with a = mean_j k_j/max(‖k_j‖, 1e-12).
fn keydiff(k: &Tensor) -> Result<Vec<f64>> {
    let norms = k.sqr()?.sum_keepdim(D::Minus1)?.sqrt()?;
    let unit = k.broadcast_div(&norms.maximum(1e-12)?)?;
    let anchor = unit.mean_keepdim(0)?;
    let dots = k.broadcast_mul(&anchor)?.sum(D::Minus1)?;
    let a_norm = anchor.sqr()?.sum_all()?.sqrt()?;
    // torch's cosine_similarity: x·y / max(‖x‖·‖y‖, 1e-8).
    let denom = norms
        .squeeze(D::Minus1)?
        .broadcast_mul(&a_norm)?
        .maximum(1e-8)?;
    let cos: Vec<f64> = (dots / denom)?.to_dtype(DType::F64)?.to_vec1()?;
    Ok(cos.into_iter().map(|x| -x).collect())
}

/// CURPress (`leverage_type = "kv_product"`, local approximation): k²_j = ‖k_j‖², v²_j = ‖v_j‖²,
/// each divided by its sum over the block of 16 that holds j (blocks from position 0, zero
/// padded), then k²·v² normalised to sum 1. The sinks are forced by the caller.
fn cur(ctx: &LayerContext, kv: usize) -> Result<Vec<f64>> {
    let n_p = ctx.n_p();
    let sq = |t: &Tensor| -> Result<Vec<f64>> {
        Ok(t.narrow(0, 0, n_p)?
            .sqr()?
            .sum(D::Minus1)?
            .to_dtype(DType::F64)?
            .to_vec1()?)
    };
    let local = |x: Vec<f64>| -> Vec<f64> {
        let mut out = x.clone();
        for (b, chunk) in x.chunks(CUR_LOCAL).enumerate() {
            let sum: f64 = chunk.iter().sum();
            for (i, v) in chunk.iter().enumerate() {
                out[b * CUR_LOCAL + i] = v / sum;
            }
        }
        out
    };
    let k2 = local(sq(&ctx.k.get(kv)?)?);
    let v2 = local(sq(&ctx.v.get(kv)?)?);
    let prod: Vec<f64> = k2.iter().zip(&v2).map(|(a, b)| a * b).collect();
    let total: f64 = prod.iter().sum();
    Ok(prod.into_iter().map(|x| x / total).collect())
}

/// ExpectedAttentionPress's scores of K/V head `kv` over positions 4..n_p: per query head g of its
/// group, the prompt's pre-RoPE queries q̃_t (t ≥ 4; here the run's rotated ones rotated back,
/// (q·cos − rotate_half(q)·sin)/a²) give μ and the biased covariance Σ; R̄ is the RoPE map averaged
/// over positions n_p … n_p + 511 (cos·I + sin·P, P the rotate-half matrix); then
/// z_t = (R̄μ)·k_t/√p + k_tᵀ(R̄ΣR̄ᵀ)k_t/(2p), softmax over t, the group's mean, times ‖v_t‖.
/// kvpress's scale is 1/√p whatever the layer's τ (it recomputes the scores itself).
fn expected_attention(ctx: &LayerContext, kv: usize) -> Result<Vec<f64>> {
    let rope = ctx.rope.as_ref().ok_or_else(|| {
        anyhow::anyhow!(
            "expected_attention_press reads the layer's rotary map, which this model family does not give (the Llama path and Gemma do); use another press"
        )
    })?;
    let (n_p, p) = (ctx.n_p(), ctx.k.dims()[2]);
    ensure!(
        rope.dim() == p,
        "expected_attention_press: a partial rotary map ({} of {p} dims) is not kvpress's case",
        rope.dim()
    );
    ensure!(
        n_p > EA_SINKS,
        "expected_attention_press needs a prompt longer than its {EA_SINKS} sinks"
    );
    let (dev, dt, m) = (ctx.q.device(), ctx.q.dtype(), n_p - EA_SINKS);
    let (cos, sin) = rope.tables(EA_SINKS, m, dt, dev)?;
    let (fc, fs) = rope.tables(n_p, EA_FUTURE, dt, dev)?;
    let (cbar, sbar) = (fc.mean_keepdim(0)?.t()?, fs.mean_keepdim(0)?.t()?);
    let eye = Tensor::eye(p, dt, dev)?;
    // rotate_half of the identity's rows is Pᵀ (row i = P e_i).
    let rot = rotate_half(&eye)?.t()?;
    let rbar = (eye.broadcast_mul(&cbar)? + rot.broadcast_mul(&sbar)?)?;
    let a2 = rope.attention_factor * rope.attention_factor;
    let k = ctx.k.get(kv)?.narrow(0, EA_SINKS, m)?;
    let v = ctx.v.get(kv)?.narrow(0, EA_SINKS, m)?;
    let group = ctx.query_heads_of(kv);
    let mut sum: Option<Tensor> = None;
    for &g in &group {
        let q = ctx.q.get(g)?.narrow(0, EA_SINKS, m)?;
        let pre = ((q.mul(&cos)? - rotate_half(&q)?.mul(&sin)?)? / a2)?;
        let mu = pre.mean_keepdim(0)?;
        let centred = pre.broadcast_sub(&mu)?;
        let cov = (centred.t()?.matmul(&centred)? / m as f64)?;
        let mu_r = rbar.matmul(&mu.t()?)?;
        let cov_r = rbar.matmul(&cov)?.matmul(&rbar.t()?)?;
        let z = ((k.matmul(&mu_r)?.squeeze(1)? / (p as f64).sqrt())?
            + (k.matmul(&cov_r)?.mul(&k)?.sum(1)? / (2.0 * p as f64))?)?;
        let e = z.broadcast_sub(&z.max_keepdim(0)?)?.exp()?;
        let probs = e.broadcast_div(&e.sum_keepdim(0)?)?;
        sum = Some(match sum {
            None => probs,
            Some(s) => (s + probs)?,
        });
    }
    let mean = (sum.expect("a K/V head has query heads") / group.len() as f64)?;
    let scores = mean.mul(&v.sqr()?.sum(1)?.sqrt()?)?;
    Ok(scores.to_dtype(DType::F64)?.to_vec1()?)
}

/// LagKVPress's scores of K/V head `kv` over the prompt (`cross_scoring` off). A prompt shorter
/// than 4 + 2·128 scores its sinks 1 and position 4 + i as i/(n_p − 4) (the most recent kept).
/// Otherwise the positions 4..end, end = 4 + ⌊(n_p − 4)/128⌋·128, are partitions of 128; token t of
/// partition i < last scores, for X = K and V, s_X = the softmax over the partition of the
/// unbiased standard deviation over channels of (X_t − lo)/(hi − lo), lo and hi the next
/// partition's channel minima and maxima; its score is the rank of (s_K + s_V)/2 within its
/// partition over 128. The sinks and the last partition with the remainder score 1. The ranks tie
/// across partitions by construction: kvpress's order among them is torch.topk's, here the lower
/// position's (§9.1).
fn lagkv(ctx: &LayerContext, kv: usize) -> Result<Vec<f64>> {
    let n_p = ctx.n_p();
    if n_p < LAG_SINKS + 2 * LAG {
        let ramp = (n_p.saturating_sub(LAG_SINKS)).max(1) as f64;
        return Ok((0..n_p)
            .map(|t| {
                if t < LAG_SINKS {
                    1.0
                } else {
                    (t - LAG_SINKS) as f64 / ramp
                }
            })
            .collect());
    }
    let end = LAG_SINKS + (n_p - LAG_SINKS) / LAG * LAG;
    let parts = (end - LAG_SINKS) / LAG;
    let rows = |t: &Tensor| -> Result<Vec<Vec<f64>>> {
        Ok(t.narrow(0, 0, n_p)?.to_dtype(DType::F64)?.to_vec2()?)
    };
    let (k, v) = (rows(&ctx.k.get(kv)?)?, rows(&ctx.v.get(kv)?)?);
    let mut scores = vec![1.0; n_p];
    for i in 0..parts - 1 {
        let (start, next) = (LAG_SINKS + i * LAG, LAG_SINKS + (i + 1) * LAG);
        let lag = |x: &[Vec<f64>]| -> Vec<f64> {
            let p = x[0].len();
            let (mut lo, mut hi) = (vec![f64::INFINITY; p], vec![f64::NEG_INFINITY; p]);
            for row in &x[next..next + LAG] {
                for c in 0..p {
                    lo[c] = lo[c].min(row[c]);
                    hi[c] = hi[c].max(row[c]);
                }
            }
            let spread: Vec<f64> = x[start..start + LAG]
                .iter()
                .map(|row| {
                    // A channel constant over the next partition (hi = lo; Gemma 3 has them) puts
                    // 0/0 here in kvpress, and NaN through its ranks; it carries no lag-relative
                    // information, so it counts 0 (a reading where kvpress is undefined).
                    let z: Vec<f64> = (0..p)
                        .map(|c| {
                            let range = hi[c] - lo[c];
                            if range > 0.0 {
                                (row[c] - lo[c]) / range
                            } else {
                                0.0
                            }
                        })
                        .collect();
                    let mean = z.iter().sum::<f64>() / p as f64;
                    (z.iter().map(|y| (y - mean).powi(2)).sum::<f64>() / (p - 1) as f64).sqrt()
                })
                .collect();
            let mx = spread.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = spread.iter().map(|s| (s - mx).exp()).collect();
            let total: f64 = e.iter().sum();
            e.into_iter().map(|x| x / total).collect()
        };
        let (sk, sv) = (lag(&k), lag(&v));
        let combined: Vec<f64> = sk.iter().zip(&sv).map(|(a, b)| (a + b) / 2.0).collect();
        ensure!(
            combined.iter().all(|x| x.is_finite()),
            "lagkv_press: a non-finite key or value in layer {} (K/V head {kv})",
            ctx.layer
        );
        // The rank within the partition (0 the smallest), ties to the lower position.
        let mut order: Vec<usize> = (0..LAG).collect();
        order.sort_by(|&a, &b| combined[a].total_cmp(&combined[b]).then(a.cmp(&b)));
        for (rank, &j) in order.iter().enumerate() {
            scores[start + j] = rank as f64 / LAG as f64;
        }
    }
    Ok(scores)
}
