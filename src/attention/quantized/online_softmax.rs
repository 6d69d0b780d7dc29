//! The online softmax with a quantized P (METHODS.md §8.4), written once for the SageAttention
//! kernels. Query blocks of 128 rows, key blocks of 64 from token 0 (a ragged last block is
//! smaller); under the causal mask a query block visits the key blocks up to its diagonal, and a
//! logit j > i is −∞ before the max. For row i and key blocks c = 0, 1, … in order:
//!
//!   m⁽ᶜ⁾ = max(m⁽ᶜ⁻¹⁾, max_{j∈c} S_ij),  p_ij = exp(S_ij − m⁽ᶜ⁾),
//!   ℓ ← ℓ·exp(m⁽ᶜ⁻¹⁾ − m⁽ᶜ⁾) + Σ_{j∈c} p_ij   (unquantized),
//!   acc ← acc·exp(m⁽ᶜ⁻¹⁾ − m⁽ᶜ⁾) + Σ_{j∈c} Q_P(p_ij)·V̂_j,      Ô_i = acc/ℓ.
//!
//! P is quantized against the **running** maximum m⁽ᶜ⁾, as the kernels do. The accumulator's
//! rescalings telescope: acc = Σ_c exp(m⁽ᶜ⁾ − m_last) Σ_{j∈c} Q_P(p_ij)·V̂_j, so each query block
//! builds W_ij = exp(m⁽ᶜ⁽ʲ⁾⁾ − m_last)·Q_P(p_ij) on the host and takes acc = W·V̂ as one product on
//! the head's device (the n²p work), instead of a p-vector update per key block. ℓ follows the
//! recursion literally (a scalar per block). With Q_P the identity this is exact softmax
//! attention (a test checks, in f64, to rounding).

use anyhow::Result;
use candle_core::Tensor;

use super::Real;
use crate::attention::Mask;

/// Rows per query block.
pub const QUERY_BLOCK: usize = 128;
/// Keys per key block.
pub const KEY_BLOCK: usize = 64;

/// Ô ([n, p], the scores' dtype) of the online softmax over the logits `scores(a, len, kend)`
/// (rows a..a+len against keys 0..kend, [len, kend], already scaled) and V̂ ([n, p]), with P
/// quantized by `quant_p`. Query blocks run in parallel on the CPU (each block's arithmetic is
/// its own, so the result does not depend on the thread count) and in order elsewhere.
pub fn online_softmax<T: Real>(
    n: usize,
    mask: Mask,
    scores: &(dyn Fn(usize, usize, usize) -> Result<Tensor> + Sync),
    v: &Tensor,
    quant_p: &(dyn Fn(T) -> T + Sync),
) -> Result<Tensor> {
    use rayon::prelude::*;
    let starts: Vec<usize> = (0..n).step_by(QUERY_BLOCK).collect();
    let block = |&a: &usize| -> Result<Tensor> {
        let len = QUERY_BLOCK.min(n - a);
        // The key blocks up to the diagonal: keys past the block's last row are masked for all
        // of its rows.
        let kend = match mask {
            Mask::None => n,
            Mask::Causal => a + len,
        };
        let s: Vec<T> = T::host(&scores(a, len, kend)?)?;
        let (w, l) = weights(&s, a, len, kend, mask, quant_p);
        let w = T::tensor(w, (len, kend), v.device())?;
        let l = T::tensor(l, (len, 1), v.device())?;
        Ok(w.matmul(&v.narrow(0, 0, kend)?)?.broadcast_div(&l)?)
    };
    let outs = if v.device().is_cpu() {
        starts.par_iter().map(block).collect::<Result<Vec<_>>>()?
    } else {
        starts.iter().map(block).collect::<Result<Vec<_>>>()?
    };
    Ok(Tensor::cat(&outs, 0)?)
}

/// The weights W ([len, kend], row-major) and the row sums ℓ ([len]) of query rows a..a+len
/// from their logits `s` ([len, kend]).
fn weights<T: Real>(
    s: &[T],
    a: usize,
    len: usize,
    kend: usize,
    mask: Mask,
    quant_p: &(dyn Fn(T) -> T + Sync),
) -> (Vec<T>, Vec<T>) {
    let mut w = vec![T::ZERO; len * kend];
    let mut l = vec![T::ZERO; len];
    let mut block_max = Vec::with_capacity(kend.div_ceil(KEY_BLOCK));
    for r in 0..len {
        let i = a + r;
        // Keys row i sees: all, or 0..=i.
        let visible = match mask {
            Mask::None => kend,
            Mask::Causal => i + 1,
        };
        let (srow, wrow) = (
            &s[r * kend..(r + 1) * kend],
            &mut w[r * kend..(r + 1) * kend],
        );
        let (mut m, mut sum) = (T::NEG_INFINITY, T::ZERO);
        block_max.clear();
        // Blocks wholly past the diagonal hold only −∞ logits: they move neither m nor ℓ.
        for c0 in (0..visible).step_by(KEY_BLOCK) {
            let c1 = (c0 + KEY_BLOCK).min(visible);
            let bmax = srow[c0..c1].iter().fold(T::NEG_INFINITY, |x, &y| x.max(y));
            let m_new = m.max(bmax);
            let mut bsum = T::ZERO;
            for j in c0..c1 {
                let p = (srow[j] - m_new).exp();
                bsum = bsum + p;
                wrow[j] = quant_p(p);
            }
            // exp(−∞ − m) = 0 at the first block.
            sum = sum * (m - m_new).exp() + bsum;
            m = m_new;
            block_max.push(m);
        }
        for (c, &mc) in block_max.iter().enumerate() {
            let f = (mc - m).exp();
            let c0 = c * KEY_BLOCK;
            let c1 = (c0 + KEY_BLOCK).min(visible);
            wrow[c0..c1].iter_mut().for_each(|x| *x = *x * f);
        }
        l[r] = sum;
    }
    (w, l)
}
