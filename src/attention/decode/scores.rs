//! The per-head prompt scores of the §9.2 methods, computed once per window and head (memoised in
//! the [`LayerContext`], so every budget d and every head of a layer-level method reuses them),
//! in the run's dtype on the head's device and read to the host as f64 for selection.
//!
//! - [`snap`]: SnapKV's s_j = Σ_{i∈window} A_ij, j < n_p − w (before pooling): w·n_p·p.
//! - [`h2o`]: H2O's a_j = Σ_{i<n_p} P_ij over the prompt's exact causal rows: n_p²·p/2, formed in
//!   blocks of 256 rows, never an n_p × n_p matrix.
//! - [`tova`]: the last prompt query's softmax row, averaged over the layer's query heads.
//! - [`evict`]: the eviction oracle's Σ_{t∈F} P_tj over j < n_p (it reads the future).

use std::sync::Arc;

use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};

use super::budgets::WINDOW;
use super::LayerContext;
use crate::attention::exact::{causal_scores, scaled_operands};
use crate::attention::row_softmax;

/// Query rows per block of exact prompt rows ([`h2o`]).
const ROWS: usize = 256;

/// The causal softmax rows start..start+len of (q, k) over keys 0..start+len, [len, start+len].
fn causal_rows(q: &Tensor, k: &Tensor, start: usize, len: usize) -> Result<Tensor> {
    let (qs, kt) = scaled_operands(&q.narrow(0, start, len)?, &k.narrow(0, 0, start + len)?)?;
    row_softmax(&causal_scores(&qs, &kt, start)?)
}

/// Column sums of [rows, cols] as host f64.
fn column_sums(p: &Tensor) -> Result<Vec<f64>> {
    Ok(p.sum(0)?.to_dtype(DType::F64)?.to_vec1()?)
}

/// SnapKV's window scores of query head `g` (unpooled, length n_p − w). Needs n_p > w.
pub fn snap(ctx: &LayerContext, g: usize) -> Result<Arc<Vec<f64>>> {
    ctx.scores("snapkv", g, || {
        let n_p = ctx.n_p();
        ensure!(
            n_p > WINDOW,
            "SnapKV scores need a prompt longer than w = {WINDOW}"
        );
        let (q, k, _) = ctx.head_qkv(g)?;
        let a = causal_rows(&q, &k, n_p - WINDOW, WINDOW)?;
        let mut s = column_sums(&a)?;
        s.truncate(n_p - WINDOW);
        Ok(s)
    })
}

/// H2O's accumulated attention of query head `g` after the prompt: a_j = Σ_{i<n_p} P_ij.
pub fn h2o(ctx: &LayerContext, g: usize) -> Result<Arc<Vec<f64>>> {
    ctx.scores("h2o_dec", g, || {
        let n_p = ctx.n_p();
        let (q, k, _) = ctx.head_qkv(g)?;
        let mut a = vec![0f64; n_p];
        for start in (0..n_p).step_by(ROWS) {
            let len = ROWS.min(n_p - start);
            let sums = column_sums(&causal_rows(&q, &k, start, len)?)?;
            for (x, s) in a.iter_mut().zip(sums) {
                *x += s;
            }
        }
        Ok(a)
    })
}

/// TOVA's layer score: the softmax row of prompt query n_p − 1 over keys 0..n_p − 1, per query
/// head, averaged over every query head of the layer (one vector for the layer).
pub fn tova(ctx: &LayerContext) -> Result<Arc<Vec<f64>>> {
    ctx.scores("tova", 0, || {
        let n_p = ctx.n_p();
        let mut mean = vec![0f64; n_p];
        for g in 0..ctx.heads() {
            let (q, k, _) = ctx.head_qkv(g)?;
            let row = column_sums(&causal_rows(&q, &k, n_p - 1, 1)?)?;
            for (m, r) in mean.iter_mut().zip(row) {
                *m += r;
            }
        }
        let h = ctx.heads() as f64;
        Ok(mean.into_iter().map(|m| m / h).collect())
    })
}

/// The eviction oracle's score of query head `g`: Σ_{t∈F} P_tj over prompt keys j < n_p, with P
/// the exact causal continuation rows.
pub fn evict(ctx: &LayerContext, g: usize) -> Result<Arc<Vec<f64>>> {
    ctx.scores("evict_oracle", g, || {
        let (n_p, n_f) = (ctx.n_p(), ctx.n_f);
        let (q, k, _) = ctx.head_qkv(g)?;
        let mut s = column_sums(&causal_rows(&q, &k, n_p, n_f)?)?;
        s.truncate(n_p);
        Ok(s)
    })
}

/// The logits q_t·k_j/√p of the continuation queries of head `g` against the prompt keys, as host
/// f64 rows ([n_f][n_p]), computed in the run's dtype (`topk_dec`).
pub fn continuation_logits(ctx: &LayerContext, g: usize) -> Result<Vec<Vec<f64>>> {
    let (n_p, n_f) = (ctx.n_p(), ctx.n_f);
    let (q, k, _) = ctx.head_qkv(g)?;
    let (qs, kt) = scaled_operands(&q.narrow(0, n_p, n_f)?, &k.narrow(0, 0, n_p)?)?;
    Ok(qs.matmul(&kt)?.to_dtype(DType::F64)?.to_vec2()?)
}
