//! The per-head prompt scores of the §9.2 methods, computed once per window and head (memoised in
//! the [`LayerContext`], so every budget d and every head of a layer-level method reuses them),
//! in the run's dtype on the head's device and read to the host as f64 for selection.
//!
//! - [`snap`]: SnapKV's s_j = Σ_{i∈window} A_ij, j < n_p − w (before pooling): w·n_p·p.
//! - [`h2o`]: H2O's a_j = Σ_{i<n_p} P_ij over the prompt's exact causal rows: on the host two
//!   passes of the fused exact kernel (n_p²·p), elsewhere blocks of 256 rows of P; never an
//!   n_p × n_p matrix.
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

/// Query head g's target probabilities, rows start..start+len over keys 0..start+len: the causal
/// softmax rows on a plain layer; under the layer's spec (§7.7.6) its τ, capped, windowed
/// probabilities over the real keys (a sink's share is in no column), which the scores read as
/// "the true attention".
fn probability_rows(ctx: &LayerContext, g: usize, start: usize, len: usize) -> Result<Tensor> {
    let (q, k, v) = ctx.head_qkv(g)?;
    if ctx.plain() {
        return causal_rows(&q, &k, start, len);
    }
    let dtype = q.dtype();
    crate::attention::HeadInputs::with_spec(q, k, v, ctx.spec.for_head(g))?
        .spec_probability_rows(start, len, dtype)
}

/// Column sums of [rows, cols] as host f64.
fn column_sums(p: &Tensor) -> Result<Vec<f64>> {
    Ok(p.sum(0)?.to_dtype(DType::F64)?.to_vec1()?)
}

/// SnapKV's window scores of query head `g` (unpooled, length n_p − w). Needs n_p > w.
pub fn snap(ctx: &LayerContext, g: usize) -> Result<Arc<Vec<f64>>> {
    ctx.scores("snapkv", g, || window_sums(ctx, g, WINDOW))
}

/// Σ_{i∈window} A_ij over the last `w` prompt queries of head `g`, for j < n_p − w: the causal
/// softmax rows (the window's own block in the denominator), summed over the window. Needs
/// n_p > w. (SnapKV's w = 32 here; kvpress's SnapKVPress takes w = 64.)
pub fn window_sums(ctx: &LayerContext, g: usize, w: usize) -> Result<Vec<f64>> {
    let n_p = ctx.n_p();
    ensure!(n_p > w, "SnapKV scores need a prompt longer than w = {w}");
    let a = probability_rows(ctx, g, n_p - w, w)?;
    let mut s = column_sums(&a)?;
    s.truncate(n_p - w);
    Ok(s)
}

/// Σ_i P_ij, the column sums of the causal softmax rows of (q, k) ([n, p] each), with the fused
/// exact kernel on the host, in two passes of it and never a block of P: pass 1 gives every row's
/// log D_i (V = 1, one column); pass 2 runs each key j as a query over the rows i ≥ j, with
/// k′_j = [k_j/√p, 1] and q′_i = [q_i, −log D_i], so that its scores are s_ij − log D_i and its
/// log-normaliser is log Σ_{i≥j} P_ij. Reversing both sequences turns i ≥ j into the causal
/// kernel's j′ ≤ i′. None off the host or in another dtype (the caller forms the rows instead).
fn causal_column_sums_on_host(q: &Tensor, k: &Tensor) -> Result<Option<Vec<f64>>> {
    use crate::numerics::flash::{on_host, Logits};
    use crate::numerics::visible::Visible;
    let (n, p) = q.dims2()?;
    let causal = Visible::Causal { window: None };
    let scale = 1.0 / (p as f64).sqrt();
    let ones = Tensor::ones((n, 1), q.dtype(), q.device())?;
    let Some((_, log_d)) = on_host(&(q * scale)?, k, &ones, causal, Logits::PLAIN)? else {
        return Ok(None);
    };
    let reversed = Tensor::from_vec((0..n as u32).rev().collect::<Vec<u32>>(), n, q.device())?;
    let keys_as_queries =
        Tensor::cat(&[(k * scale)?, ones.clone()], 1)?.index_select(&reversed, 0)?;
    let rows_as_keys =
        Tensor::cat(&[q.clone(), log_d.reshape((n, 1))?.neg()?], 1)?.index_select(&reversed, 0)?;
    let Some((_, log_c)) = on_host(
        &keys_as_queries,
        &rows_as_keys,
        &ones,
        causal,
        Logits::PLAIN,
    )?
    else {
        return Ok(None);
    };
    let log_c: Vec<f64> = log_c.flatten_all()?.to_dtype(DType::F64)?.to_vec1()?;
    Ok(Some(log_c.into_iter().rev().map(f64::exp).collect()))
}

/// H2O's accumulated attention of query head `g` after the prompt: a_j = Σ_{i<n_p} P_ij. On the
/// host with the fused kernel (two passes, ~n_p²p MACs, no P formed); elsewhere in 256-row blocks
/// of P.
pub fn h2o(ctx: &LayerContext, g: usize) -> Result<Arc<Vec<f64>>> {
    ctx.scores("h2o_dec", g, || {
        let n_p = ctx.n_p();
        let (q, k, _) = ctx.head_qkv(g)?;
        let (qp, kp) = (q.narrow(0, 0, n_p)?, k.narrow(0, 0, n_p)?);
        if ctx.plain() {
            if let Some(a) = causal_column_sums_on_host(&qp, &kp)? {
                return Ok(a);
            }
        }
        let mut a = vec![0f64; n_p];
        for start in (0..n_p).step_by(ROWS) {
            let len = ROWS.min(n_p - start);
            let sums = column_sums(&probability_rows(ctx, g, start, len)?)?;
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
            let row = column_sums(&probability_rows(ctx, g, n_p - 1, 1)?)?;
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
        let mut s = column_sums(&probability_rows(ctx, g, n_p, n_f)?)?;
        s.truncate(n_p);
        Ok(s)
    })
}

/// The logits q_t·k_j/√p of the continuation queries of head `g` against the prompt keys, as host
/// f64 rows ([n_f][n_p]), computed in the run's dtype (`topk_dec`). Under a layer's spec
/// (§7.7.6) the raw τ·q·k, uncapped (the cap is monotone and would saturate into ties), with the
/// keys outside query t's window at −∞: ranked last, so a budget goes to keys the row sees.
pub fn continuation_logits(ctx: &LayerContext, g: usize) -> Result<Vec<Vec<f64>>> {
    let (n_p, n_f) = (ctx.n_p(), ctx.n_f);
    let (q, k, _) = ctx.head_qkv(g)?;
    let (qf, kp) = (q.narrow(0, n_p, n_f)?, k.narrow(0, 0, n_p)?);
    if ctx.plain() {
        let (qs, kt) = scaled_operands(&qf, &kp)?;
        return Ok(qs.matmul(&kt)?.to_dtype(DType::F64)?.to_vec2()?);
    }
    let mut rows: Vec<Vec<f64>> = (qf * ctx.spec.scale)?
        .matmul(&kp.t()?)?
        .to_dtype(DType::F64)?
        .to_vec2()?;
    if let Some(w) = ctx.spec.window_within(ctx.n()) {
        for (i, row) in rows.iter_mut().enumerate() {
            let t = n_p + i;
            row.iter_mut()
                .enumerate()
                .filter(|(j, _)| j + w <= t)
                .for_each(|(_, x)| *x = f64::NEG_INFINITY);
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two-pass column sums equal the rows formed and summed, in f64 to rounding and in f32
    /// to f32's (through exp of a log-normaliser).
    #[test]
    fn column_sums_from_the_fused_kernel_equal_the_formed_rows() {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-5)] {
            let h = crate::attention::test_util::random_head(300, 16, 5, dtype);
            let got = causal_column_sums_on_host(&h.q, &h.k).unwrap().unwrap();
            let mut want = vec![0f64; 300];
            for start in (0..300).step_by(ROWS) {
                let len = ROWS.min(300 - start);
                let sums = column_sums(&causal_rows(&h.q, &h.k, start, len).unwrap()).unwrap();
                for (x, s) in want.iter_mut().zip(sums) {
                    *x += s;
                }
            }
            // The column sums add up to the row count (each row sums to 1).
            assert!((got.iter().sum::<f64>() - 300.0).abs() < 300.0 * tol);
            for (j, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= tol * b.max(1e-3),
                    "{dtype:?} key {j}: {a} vs {b}"
                );
            }
        }
    }
}
