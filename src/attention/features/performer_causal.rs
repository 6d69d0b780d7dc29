//! FAVOR+'s causal form (docs/reference.md §7.4) by chunked prefix sums of φ(k_j)[v_j, 1]ᵀ, and
//! under a sliding window (§7.7.6) by the difference of two running prefix states: linear in n.

use anyhow::Result;
use candle_core::{DType, Tensor};

/// Rows per chunk of the causal prefix sums: the masked c×c products cost n·c·m in all, the
/// state updates n·m·(p+1); 128 keeps the former under the latter's order for p = 64.
pub(super) const CAUSAL_CHUNK: usize = 128;

/// Row i of the result: Σ_{j≤i} (φ_q,i·φ_k,j)·rhs_j, for φ_q, φ_k [n, m] and rhs [n, p+1].
pub(super) fn causal_products(phi_q: &Tensor, phi_k: &Tensor, rhs: &Tensor) -> Result<Tensor> {
    let (n, m) = phi_q.dims2()?;
    let (dt, dev) = (phi_q.dtype(), phi_q.device());
    let mut state = Tensor::zeros((m, rhs.dim(1)?), DType::F64, dev)?;
    let mut outs = Vec::new();
    for a in (0..n).step_by(CAUSAL_CHUNK) {
        let c = CAUSAL_CHUNK.min(n - a);
        let (fq, fk, r) = (
            phi_q.narrow(0, a, c)?,
            phi_k.narrow(0, a, c)?,
            rhs.narrow(0, a, c)?,
        );
        // Within the chunk: key j of the chunk counts for query i of the chunk iff j ≤ i.
        let tril = crate::tensor_util::triangle(c, 1.0, 0.0, dev, dt)?;
        let inner = (fq.matmul(&fk.t()?)? * tril)?.matmul(&r)?;
        let before = fq.to_dtype(DType::F64)?.matmul(&state)?.to_dtype(dt)?;
        outs.push((inner + before)?);
        state = (state
            + fk.to_dtype(DType::F64)?
                .t()?
                .matmul(&r.to_dtype(DType::F64)?)?)?;
    }
    Ok(Tensor::cat(&outs, 0)?)
}

/// [`causal_products`] under a sliding window of `w` keys (docs/reference.md §7.7.6): row i sums
/// over j ∈ (i − w, i]. For a chunk of rows [a, a + c), the keys [a + c − w, a) are seen by every
/// row: their sum is the difference of two running prefix states (f64), one up to a and one up to
/// a + c − w, both advancing monotonically, so the cost stays linear in n. The keys of the band
/// [a − w + 1, a + c − w) and of the chunk itself, which only some rows see, go through one
/// masked product each, as the chunk's own keys do without a window.
pub(super) fn windowed_causal_products(
    phi_q: &Tensor,
    phi_k: &Tensor,
    rhs: &Tensor,
    w: usize,
) -> Result<Tensor> {
    let (n, m) = phi_q.dims2()?;
    let (dt, dev) = (phi_q.dtype(), phi_q.device());
    let zero_state = || Tensor::zeros((m, rhs.dim(1)?), DType::F64, dev);
    let (mut head_state, mut tail_state) = (zero_state()?, zero_state()?);
    let mut tail = 0;
    let add = |state: &Tensor, lo: usize, hi: usize| -> Result<Tensor> {
        let fk = phi_k.narrow(0, lo, hi - lo)?.to_dtype(DType::F64)?;
        let r = rhs.narrow(0, lo, hi - lo)?.to_dtype(DType::F64)?;
        Ok((state + fk.t()?.matmul(&r)?)?)
    };
    let mut outs = Vec::new();
    for a in (0..n).step_by(CAUSAL_CHUNK) {
        let c = CAUSAL_CHUNK.min(n - a);
        let fq = phi_q.narrow(0, a, c)?;
        // Keys every row of the chunk sees: [full_lo, a).
        let full_lo = (a + c).saturating_sub(w).min(a);
        if full_lo > tail {
            tail_state = add(&tail_state, tail, full_lo)?;
            tail = full_lo;
        }
        let mut out = fq
            .to_dtype(DType::F64)?
            .matmul(&(&head_state - &tail_state)?)?
            .to_dtype(dt)?;
        // The band below the chunk that only its later rows see, then the chunk's own keys.
        let band_lo = (a + 1).saturating_sub(w);
        for (lo, hi) in [(band_lo, full_lo), (a, a + c)] {
            if lo < hi {
                let mask = window_mask(a, c, lo, hi, w, dev, dt)?;
                let inner = (fq.matmul(&phi_k.narrow(0, lo, hi - lo)?.t()?)? * mask)?;
                out = (out + inner.matmul(&rhs.narrow(0, lo, hi - lo)?)?)?;
            }
        }
        outs.push(out);
        head_state = add(&head_state, a, a + c)?;
    }
    Ok(Tensor::cat(&outs, 0)?)
}

/// 1 where row i ∈ [a, a + c) sees key j ∈ [lo, hi) under a causal window of w keys
/// (i − w < j ≤ i), else 0: [c, hi − lo] in `dt`.
fn window_mask(
    a: usize,
    c: usize,
    lo: usize,
    hi: usize,
    w: usize,
    dev: &candle_core::Device,
    dt: DType,
) -> Result<Tensor> {
    let mut v = Vec::with_capacity(c * (hi - lo));
    for i in a..a + c {
        v.extend((lo..hi).map(|j| f64::from(u8::from(j <= i && j + w > i))));
    }
    Ok(Tensor::from_vec(v, (c, hi - lo), dev)?.to_dtype(dt)?)
}
