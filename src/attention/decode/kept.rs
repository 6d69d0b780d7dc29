//! The static kept sets C_h of the §9.2 methods that compress the prompt once: which prompt
//! positions query head g keeps at budget d, sorted. Ties always go to the lower index, also
//! after pooling, where max pooling makes exact ties common (§9.1): every top-k is the prefill
//! family's stable [`top_indices`]; Ada-KV's ranking across heads is [`adakv_caps`]'s.
//!
//! Readings where §9.2 is silent (each noted on issue 35):
//! - d ≥ n_p keeps every prompt key for every method, before any schedule is consulted (§9.1).
//! - `snapkv`, `snapkv_avg5`, `pyramidkv` and `adakv` at d ≤ w = 32 are `dec_window`: the authors'
//!   code refuses d ≤ w (`assert max_capacity_prompt - window_size > 0`), §9.2 says "here it is
//!   `dec_window`" for SnapKV, and PyramidKV and Ada-KV are SnapKV-scored with the same window, so
//!   the same fallback is applied to them (figures grey those rows).
//! - Ada-KV's per-head score is the window *mean* (§9.2), SnapKV's the window sum: the ranking
//!   within a head is the same, and across heads every head is divided by the same w = 32 (exact
//!   in binary), so the caps equal those of the sums.

use anyhow::{ensure, Result};

use super::budgets::{adakv_caps, pyramid_keep, PyramidKeep, WINDOW};
use super::press::Press;
use super::{scores, LayerContext};
use crate::attention::prefill::select::{top_indices, SINKS};
use crate::numerics::pooling::{avg_pool1d, max_pool1d};

/// SnapKV's smoothing of the window scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    /// `max_pool1d`, kernel 7, padding 3: SnapKV's LongBench configs, Ada-KV, KVCache-Factory.
    Max7,
    /// `avg_pool1d`, kernel 5, padding 2, zeros counted: the code's fallback default.
    Avg5,
}

impl Pool {
    pub fn apply(self, s: &[f64]) -> Vec<f64> {
        match self {
            Pool::Max7 => max_pool1d(s, 7, 3),
            Pool::Avg5 => avg_pool1d(s, 5, 2),
        }
    }
}

/// The methods that keep one static set per query head (or per layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Static {
    /// The last d prompt tokens.
    Window,
    /// The first 4 and the last d − 4 prompt tokens (StreamingLLM; d ≥ 8).
    Streaming,
    /// SnapKV: top(d − w) pooled window scores ∪ the window.
    SnapKv(Pool),
    /// PyramidKV: SnapKV's scores (max 7) with the layer's budget.
    PyramidKv,
    /// Ada-KV: SnapKV's scores (max 7) with per-head caps over the layer.
    AdaKv,
    /// H2O's state after the prompt: ⌊d/2⌋ heavy hitters + the last d − ⌊d/2⌋ prompt tokens.
    H2o,
    /// TOVA: one layer set, the top d of the last prompt query's head-averaged softmax row.
    Tova,
    /// The eviction oracle: the top d of Σ_{t∈F} P_tj (it reads the future).
    EvictOracle,
    /// A kvpress press (issue 58): one set per K/V head, which every query head of its group reads.
    Press(Press),
}

/// The last `count` prompt positions.
fn recent(n_p: usize, count: usize) -> Vec<usize> {
    (n_p - count.min(n_p)..n_p).collect()
}

/// The top `m` of `scores` ∪ the window {n_p − w..n_p − 1}, sorted (the scores cover j < n_p − w,
/// so the two parts are disjoint).
fn top_plus_window(scores: &[f64], m: usize, n_p: usize) -> Vec<usize> {
    let mut kept = top_indices(scores, m);
    kept.extend(recent(n_p, WINDOW));
    kept
}

/// Query head g's SnapKV scores, pooled (once per window, head and pooling).
fn pooled(ctx: &LayerContext, g: usize, pool: Pool) -> Result<std::sync::Arc<Vec<f64>>> {
    let kind = match pool {
        Pool::Max7 => "snapkv.max7",
        Pool::Avg5 => "snapkv.avg5",
    };
    ctx.scores(kind, g, || Ok(pool.apply(&scores::snap(ctx, g)?)))
}

impl Static {
    /// The sorted prompt positions query head `g` keeps at budget `d`.
    pub fn kept(self, ctx: &LayerContext, g: usize, d: usize) -> Result<Vec<usize>> {
        let n_p = ctx.n_p();
        if d >= n_p {
            return Ok((0..n_p).collect());
        }
        let snap_scored = matches!(self, Static::SnapKv(_) | Static::PyramidKv | Static::AdaKv);
        if snap_scored && d <= WINDOW {
            return Static::Window.kept(ctx, g, d);
        }
        Ok(match self {
            Static::Window => recent(n_p, d),
            Static::Streaming => {
                ensure!(d >= 2 * SINKS, "dec_streaming needs d ≥ 8 (d = {d})");
                let mut kept: Vec<usize> = (0..SINKS).collect();
                kept.extend(recent(n_p, d - SINKS));
                kept
            }
            Static::SnapKv(pool) => top_plus_window(&pooled(ctx, g, pool)?, d - WINDOW, n_p),
            Static::PyramidKv => match pyramid_keep(d, n_p, ctx.layers, ctx.layer)? {
                PyramidKeep::All => (0..n_p).collect(),
                PyramidKeep::TopPlusWindow(m) => {
                    top_plus_window(&pooled(ctx, g, Pool::Max7)?, m, n_p)
                }
            },
            Static::AdaKv => {
                let b = d - WINDOW;
                // Every head's window-mean scores, once per window; the layer's caps once per
                // budget (memo key: the budget d), whichever head asks first.
                let all = ctx.memo("adakv.scores", 0, || {
                    let w = WINDOW as f64;
                    (0..ctx.heads())
                        .map(|h| Ok(pooled(ctx, h, Pool::Max7)?.iter().map(|x| x / w).collect()))
                        .collect::<Result<Vec<Vec<f64>>>>()
                })?;
                let caps = ctx.memo("adakv.caps", d, || Ok(adakv_caps(&all, b)))?;
                top_plus_window(&all[g], caps[g], n_p)
            }
            Static::H2o => {
                let (h, r) = (d / 2, d - d / 2);
                let a = scores::h2o(ctx, g)?;
                let mut kept = top_indices(&a[..n_p - r], h);
                kept.extend(recent(n_p, r));
                kept
            }
            Static::Tova => top_indices(&scores::tova(ctx)?, d),
            Static::EvictOracle => top_indices(&scores::evict(ctx, g)?, d),
            Static::Press(press) => press.kept(ctx, ctx.kv_head(g), d)?,
        })
    }

    /// Whether every query head of a group reads one set (the layer's, or kvpress's per K/V head),
    /// so that a K/V head's union is that set.
    pub fn one_set_per_kv_head(self) -> bool {
        matches!(
            self,
            Static::Window | Static::Streaming | Static::Tova | Static::Press(_)
        )
    }
}
