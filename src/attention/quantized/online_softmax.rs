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
//!
//! Beyond the mask (docs/reference.md §7.7.6): under a sliding window a chunk is one query block
//! and visits the key blocks from the one holding its first row's first key to its diagonal (a
//! kernel skips the blocks wholly outside the window); a row's blocks start at the one holding
//! its own first key, where the keys before it are −∞. A sink σ enters ℓ after the last block
//! ([`Rows::sink`]), leaving P's quantization as it is.

use anyhow::Result;
use candle_core::Tensor;

use super::Real;
use crate::attention::Mask;
use crate::numerics::visible::Visible;

/// Rows per query block.
pub const QUERY_BLOCK: usize = 128;
/// Keys per key block.
pub const KEY_BLOCK: usize = 64;

/// What the rows' softmax is over beyond their logits (docs/reference.md §7.7.6): the keys each row
/// sees (all, causal, or causal within a window) and the head's sink logit σ, if any.
#[derive(Debug, Clone, Copy)]
pub struct Rows<T> {
    pub visible: Visible,
    /// σ on the scale of the logits the kernel forms; the sink's value vector is zero.
    pub sink: Option<T>,
}

impl<T> Rows<T> {
    /// The plain target of `mask`: no window, no sink.
    pub fn of_mask(mask: Mask) -> Self {
        Self {
            visible: Visible::new(mask == Mask::Causal, None),
            sink: None,
        }
    }
}

/// Rows per chunk of the products: exact attention's block rows rounded up to whole query blocks.
pub fn chunk_rows(n: usize) -> usize {
    crate::attention::exact::block_rows(n).div_ceil(QUERY_BLOCK) * QUERY_BLOCK
}

/// The logits of rows a..a+len against keys j0..kend, row-major on the host, already scaled (and
/// capped): what a kernel forms for one chunk.
pub type Scores<'a, T> = dyn Fn(usize, usize, usize, usize) -> Result<Vec<T>> + Sync + 'a;

/// Ô ([n, p], V̂'s dtype) of the online softmax over the logits `scores(a, len, j0, kend)` (`a`
/// and `len` whole query blocks but for a ragged end; j0 a whole key block) and V̂ ([n, p]), with
/// P quantized by `quant_p`, each row over the keys `rows` lets it see. Chunks run in parallel on
/// the CPU (each row's arithmetic is its own, so the result does not depend on the thread count)
/// and in order elsewhere. Under a window a chunk is one query block, which visits the key
/// blocks from the one holding its first row's first key to its diagonal, and no other.
pub fn online_softmax<T: Real>(
    n: usize,
    rows: Rows<T>,
    scores: &Scores<T>,
    v: &Tensor,
    quant_p: impl Fn(T) -> T + Sync,
) -> Result<Tensor> {
    let step = match rows.visible {
        Visible::Causal { window: Some(_) } => QUERY_BLOCK,
        _ => chunk_rows(n),
    };
    online_softmax_in_chunks(n, rows, scores, v, quant_p, step)
}

/// The first key of the key block that holds row i's first visible key.
fn first_block(visible: Visible, i: usize) -> usize {
    visible.span(i, i + 1, i + 1).0 / KEY_BLOCK * KEY_BLOCK
}

/// [`online_softmax`] with chunks of `step` rows (a multiple of [`QUERY_BLOCK`]): the result does
/// not depend on `step` (a test checks, bit for bit).
pub fn online_softmax_in_chunks<T: Real>(
    n: usize,
    rows: Rows<T>,
    scores: &Scores<T>,
    v: &Tensor,
    quant_p: impl Fn(T) -> T + Sync,
    step: usize,
) -> Result<Tensor> {
    use rayon::prelude::*;
    debug_assert!(step.is_multiple_of(QUERY_BLOCK));
    let starts: Vec<usize> = (0..n).step_by(step).collect();
    let chunk = |&a: &usize| -> Result<Tensor> {
        let len = step.min(n - a);
        // The key blocks from the first one any row needs to the diagonal: keys past the chunk's
        // last row are masked for all of its rows, and under a window so are the blocks before
        // its first row's first key.
        let (j0, kend) = match rows.visible {
            Visible::All => (0, n),
            causal => (first_block(causal, a), a + len),
        };
        let keys = kend - j0;
        let mut w = scores(a, len, j0, kend)?;
        let mut l = vec![T::ZERO; len];
        let mut maxima = Vec::with_capacity(keys.div_ceil(KEY_BLOCK));
        for (r, (row, l)) in w.chunks_exact_mut(keys).zip(&mut l).enumerate() {
            let i = a + r;
            let (lo, hi) = rows.visible.span(i, i + 1, kend);
            let span = (first_block(rows.visible, i) - j0, lo - j0, hi - j0);
            let (sum, m) = row_weights(row, span, &quant_p, &mut maxima);
            *l = match rows.sink {
                Some(sink) => with_sink(row, sum, m, sink),
                None => sum,
            };
        }
        let w = T::tensor(w, (len, keys), v.device())?;
        let l = T::tensor(l, (len, 1), v.device())?;
        Ok(w.matmul(&v.narrow(0, j0, keys)?)?.broadcast_div(&l)?)
    };
    let outs = if v.device().is_cpu() {
        starts.par_iter().map(chunk).collect::<Result<Vec<_>>>()?
    } else {
        starts.iter().map(chunk).collect::<Result<Vec<_>>>()?
    };
    Ok(Tensor::cat(&outs, 0)?)
}

/// The sink's epilogue (docs/reference.md §7.7.6): ℓ + e^{σ − m}, as FlashAttention-3's sink
/// epilogue adds it after the last key block, so P's quantization against the running maximum of
/// the real keys is unchanged. When σ > m the row's weights and ℓ are first rescaled to σ (as a
/// key block that overtakes the maximum would be), which is the same in real arithmetic and keeps
/// e^{σ − m} from overflowing; when σ ≤ m nothing is rescaled (e⁰ = 1).
fn with_sink<T: Real>(row: &mut [T], sum: T, m: T, sink: T) -> T {
    let top = m.max(sink);
    let mut sum = sum;
    if top != m {
        let f = (m - top).exp();
        row.iter_mut().for_each(|x| *x *= f);
        sum *= f;
    }
    sum + (sink - top).exp()
}

/// A row's keys relative to its chunk's first key: the first key of its first key block, its
/// first visible key, and one past its last.
type Span = (usize, usize, usize);

/// Turns one row's logits into its weights W in place and returns ℓ and the last running maximum.
/// The row visits the key blocks from `span.0` to its last visible key `span.2`: keys before its
/// first visible one `span.1` are −∞ in the first of them, and keys outside the blocks it visits
/// become 0. `maxima` is scratch space for the running maximum after each key block.
fn row_weights<T: Real>(
    row: &mut [T],
    span: Span,
    quant_p: &impl Fn(T) -> T,
    maxima: &mut Vec<T>,
) -> (T, T) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { row_weights_avx2(row, span, quant_p, maxima) };
    }
    row_weights_body(row, span, quant_p, maxima)
}

/// The same arithmetic compiled for 8-wide vectors: plain multiplies and adds (Rust never
/// contracts them into FMA), so the result is bit-identical to the portable build.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn row_weights_avx2<T: Real>(
    row: &mut [T],
    span: Span,
    quant_p: &impl Fn(T) -> T,
    maxima: &mut Vec<T>,
) -> (T, T) {
    row_weights_body(row, span, quant_p, maxima)
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
    (first, lo, visible): Span,
    quant_p: &impl Fn(T) -> T,
    maxima: &mut Vec<T>,
) -> (T, T) {
    let (mut m, mut sum) = (T::NEG_INFINITY, T::ZERO);
    maxima.clear();
    // Keys before the window in the row's first block: masked before the max. The block holds
    // the row's first visible key, so its maximum is finite.
    row[first..lo].iter_mut().for_each(|x| *x = T::NEG_INFINITY);
    for block in row[first..visible].chunks_mut(KEY_BLOCK) {
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
    for (block, &mc) in row[first..visible].chunks_mut(KEY_BLOCK).zip(maxima.iter()) {
        if mc != m {
            let f = (mc - m).exp();
            block.iter_mut().for_each(|x| *x *= f);
        }
    }
    // Blocks wholly past the diagonal, or before the window, hold only −∞ logits: they move
    // neither m nor ℓ, and are not visited.
    row[visible..].iter_mut().for_each(|x| *x = T::ZERO);
    row[..first].iter_mut().for_each(|x| *x = T::ZERO);
    (sum, m)
}
