//! The online softmax with a quantized P (docs/reference.md §8.4), written once for the SageAttention
//! kernels. Query blocks of 128 rows, key blocks of 64 from token 0 (a ragged last block is
//! smaller); under the causal mask a query block visits the key blocks up to its diagonal, and a
//! logit j > i is −∞ before the max. For row i and key blocks c = 0, 1, … in order:
//!
//!   m⁽ᶜ⁾ = max(m⁽ᶜ⁻¹⁾, max_{j∈c} S_ij),  p_ij = exp(S_ij − m⁽ᶜ⁾),
//!   ℓ ← ℓ·exp(m⁽ᶜ⁻¹⁾ − m⁽ᶜ⁾) + Σ_{j∈c} p_ij   (unquantized),
//!   acc ← acc·exp(m⁽ᶜ⁻¹⁾ − m⁽ᶜ⁾) + Σ_{j∈c} Q_P(p_ij)·V̂_j,      Ô_i = acc/ℓ.
//!
//! P is quantized against the **running** maximum m⁽ᶜ⁾, as the kernels do. The accumulator's
//! rescalings telescope: acc = Σ_c exp(m⁽ᶜ⁾ − m_last) Σ_{j∈c} Q_P(p_ij)·V̂_j, so the rows build
//! W_ij = exp(m⁽ᶜ⁽ʲ⁾⁾ − m_last)·Q_P(p_ij) on the host and take acc = W·V̂ as one product on the
//! head's device (the n²p work), instead of a p-vector update per key block. ℓ follows the
//! recursion literally (a scalar per block). With Q_P the identity this is exact softmax
//! attention (a test checks, in f64, to rounding; another checks the literal recursion).
//!
//! Each row's arithmetic depends on its logits and its visible keys only, so the rows are
//! processed in chunks of several query blocks (a multiple of 128 rows, as large as exact
//! attention's blocks) for the two products: the query blocks matter to the kernels' quantizers
//! (scales, smoothing), which the caller applies, not to the softmax.

use anyhow::Result;
use candle_core::Tensor;

use super::Real;
use crate::attention::Mask;

/// Rows per query block.
pub const QUERY_BLOCK: usize = 128;
/// Keys per key block.
pub const KEY_BLOCK: usize = 64;

/// Rows per chunk of the products: exact attention's block rows rounded up to whole query blocks.
pub fn chunk_rows(n: usize) -> usize {
    crate::attention::exact::block_rows(n).div_ceil(QUERY_BLOCK) * QUERY_BLOCK
}

/// Ô ([n, p], V̂'s dtype) of the online softmax over the logits `scores(a, len, kend)` (rows
/// a..a+len against keys 0..kend, row-major on the host, already scaled; `a` and `len` whole query
/// blocks but for a ragged end) and V̂ ([n, p]), with P quantized by `quant_p`. Chunks run in
/// parallel on the CPU (each row's arithmetic is its own, so the result does not depend on the
/// thread count) and in order elsewhere.
pub fn online_softmax<T: Real>(
    n: usize,
    mask: Mask,
    scores: &(dyn Fn(usize, usize, usize) -> Result<Vec<T>> + Sync),
    v: &Tensor,
    quant_p: impl Fn(T) -> T + Sync,
) -> Result<Tensor> {
    online_softmax_in_chunks(n, mask, scores, v, quant_p, chunk_rows(n))
}

/// [`online_softmax`] with chunks of `step` rows (a multiple of [`QUERY_BLOCK`]): the result does
/// not depend on `step` (a test checks, bit for bit).
pub fn online_softmax_in_chunks<T: Real>(
    n: usize,
    mask: Mask,
    scores: &(dyn Fn(usize, usize, usize) -> Result<Vec<T>> + Sync),
    v: &Tensor,
    quant_p: impl Fn(T) -> T + Sync,
    step: usize,
) -> Result<Tensor> {
    use rayon::prelude::*;
    debug_assert!(step.is_multiple_of(QUERY_BLOCK));
    let starts: Vec<usize> = (0..n).step_by(step).collect();
    let chunk = |&a: &usize| -> Result<Tensor> {
        let len = step.min(n - a);
        // The key blocks up to the diagonal: keys past the chunk's last row are masked for all
        // of its rows.
        let kend = match mask {
            Mask::None => n,
            Mask::Causal => a + len,
        };
        let mut w = scores(a, len, kend)?;
        let mut l = vec![T::ZERO; len];
        let mut maxima = Vec::with_capacity(kend.div_ceil(KEY_BLOCK));
        for (r, (row, l)) in w.chunks_exact_mut(kend).zip(&mut l).enumerate() {
            let visible = match mask {
                Mask::None => kend,
                Mask::Causal => a + r + 1,
            };
            *l = row_weights(row, visible, &quant_p, &mut maxima);
        }
        let w = T::tensor(w, (len, kend), v.device())?;
        let l = T::tensor(l, (len, 1), v.device())?;
        Ok(w.matmul(&v.narrow(0, 0, kend)?)?.broadcast_div(&l)?)
    };
    let outs = if v.device().is_cpu() {
        starts.par_iter().map(chunk).collect::<Result<Vec<_>>>()?
    } else {
        starts.iter().map(chunk).collect::<Result<Vec<_>>>()?
    };
    Ok(Tensor::cat(&outs, 0)?)
}

/// Turns one row's logits into its weights W in place (keys ≥ `visible` become 0) and returns ℓ.
/// `maxima` is scratch space for the running maximum after each key block.
fn row_weights<T: Real>(
    row: &mut [T],
    visible: usize,
    quant_p: &impl Fn(T) -> T,
    maxima: &mut Vec<T>,
) -> T {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { row_weights_avx2(row, visible, quant_p, maxima) };
    }
    row_weights_body(row, visible, quant_p, maxima)
}

/// The same arithmetic compiled for 8-wide vectors: plain multiplies and adds (Rust never
/// contracts them into FMA), so the result is bit-identical to the portable build.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn row_weights_avx2<T: Real>(
    row: &mut [T],
    visible: usize,
    quant_p: &impl Fn(T) -> T,
    maxima: &mut Vec<T>,
) -> T {
    row_weights_body(row, visible, quant_p, maxima)
}

/// Lanes of the partial sums of a key block: a fixed number, so that the summation order (and
/// so ℓ's bits) does not depend on the CPU.
const LANES: usize = 8;

/// The arithmetic of [`row_weights`], in passes that vectorise: each key block's maximum, its
/// exponentials, their sum in [`LANES`] fixed partial sums, their quantization; then the
/// telescoped rescaling of the blocks whose maximum was overtaken.
#[inline(always)]
fn row_weights_body<T: Real>(
    row: &mut [T],
    visible: usize,
    quant_p: &impl Fn(T) -> T,
    maxima: &mut Vec<T>,
) -> T {
    let (mut m, mut sum) = (T::NEG_INFINITY, T::ZERO);
    maxima.clear();
    for block in row[..visible].chunks_mut(KEY_BLOCK) {
        // The maximum is exact whatever the order of comparisons.
        let bmax = block.iter().fold(T::NEG_INFINITY, |x, &y| x.max(y));
        let m_new = m.max(bmax);
        block.iter_mut().for_each(|x| *x = (*x - m_new).exp());
        let mut lanes = [T::ZERO; LANES];
        let mut chunks = block.chunks_exact(LANES);
        for c in &mut chunks {
            for i in 0..LANES {
                lanes[i] += c[i];
            }
        }
        for (i, &x) in chunks.remainder().iter().enumerate() {
            lanes[i] += x;
        }
        let bsum = lanes.iter().fold(T::ZERO, |a, &b| a + b);
        block.iter_mut().for_each(|x| *x = quant_p(*x));
        // exp(−∞ − m) = 0 at the first block.
        sum = sum * (m - m_new).exp() + bsum;
        m = m_new;
        maxima.push(m);
    }
    for (block, &mc) in row[..visible].chunks_mut(KEY_BLOCK).zip(maxima.iter()) {
        if mc != m {
            let f = (mc - m).exp();
            block.iter_mut().for_each(|x| *x *= f);
        }
    }
    // Blocks wholly past the diagonal hold only −∞ logits: they move neither m nor ℓ.
    row[visible..].iter_mut().for_each(|x| *x = T::ZERO);
    sum
}
