//! The element types of the fused kernel ([`super`]): the arithmetic it needs of f32 and f64 (the
//! online softmax's exponentials and reductions, and the two tile products, on `gemm` by default
//! and on our own microkernels for f32 on the AVX2 and AVX-512 paths, [`flash_tiles::Simd`]).
//!
//! Every method that has a microkernel takes the path: the kernel decides it once per call of
//! [`super::attention_with`] (the tests name each path the CPU runs), never per row.

use super::tiles::{self as flash_tiles, Simd};

/// The element types the kernel runs in.
pub trait FlashFloat:
    Copy
    + Send
    + Sync
    + PartialOrd
    + 'static
    + std::ops::Mul<Output = Self>
    + std::ops::Sub<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    const INFINITY: Self;
    const NAN: Self;
    fn to_f64(self) -> f64;
    fn from_f64(x: f64) -> Self;
    fn is_finite(self) -> bool;
    fn exp(self) -> Self;
    /// row ← exp(row − m) in place (m finite), returning Σ row in f64, on path `simd`.
    fn exp_shifted(row: &mut [Self], m: Self, simd: Simd) -> f64;

    /// One K/V head's keys [nk, p] and values [nk, pv] packed for [`Self::scores`] and
    /// [`Self::accumulate_values`] on path `simd`; empty where the type or path has no packed
    /// kernel.
    fn pack(
        _k: &[Self],
        _v: &[Self],
        _nk: usize,
        _p: usize,
        _pv: usize,
        _simd: Simd,
    ) -> (Vec<Self>, Vec<Self>) {
        (Vec::new(), Vec::new())
    }

    /// s (row stride ld ≥ 16·⌈kt/16⌉) ← Q̃_b K_cᵀ for `rows` query rows `qb` [rows, p] and keys
    /// c0..c0 + kt of the head's `k` [nk, p] (`kp` its packed form, or empty). Returns whether
    /// it also filled `stats` (each row's maximum and poison, asked for only where they are
    /// the tile's: kt a multiple of 16 and no key masked). `simd` is the path `kp` was packed for.
    #[allow(clippy::too_many_arguments)]
    fn scores(
        _simd: Simd,
        qb: &[Self],
        rows: usize,
        p: usize,
        k: &[Self],
        _kp: &[Self],
        c0: usize,
        kt: usize,
        s: &mut [Self],
        ld: usize,
        _stats: Option<&mut flash_tiles::LaneStats>,
    ) -> bool {
        // K_c is [kt, p] row-major, so K_cᵀ has row stride 1, column stride p.
        gemm_into(rows, kt, p, s, ld, false, qb, p, 1, &k[c0 * p..], 1, p);
        false
    }

    /// acc [rows, pv] += E V_c for E [rows, kt] (row stride ld) and rows c0..c0 + kt of the
    /// head's `v` [nk, pv] (`vp` its packed form for path `simd`, or empty).
    #[allow(clippy::too_many_arguments)]
    fn accumulate_values(
        _simd: Simd,
        e: &[Self],
        ld: usize,
        rows: usize,
        v: &[Self],
        _vp: &[Self],
        c0: usize,
        kt: usize,
        pv: usize,
        acc: &mut [Self],
    ) {
        gemm_into(rows, pv, kt, acc, pv, true, e, ld, 1, &v[c0 * pv..], pv, 1);
    }
}

/// Lanes of the partial sums (fixed, so that ℓ's bits do not depend on the CPU).
const LANES: usize = 8;

#[inline(always)]
fn lane_sum<T: FlashFloat>(row: &[T]) -> f64 {
    let mut acc = [0f64; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            acc[i] += c[i].to_f64();
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|x| x.to_f64()).sum();
    acc.iter().sum::<f64>() + tail
}

impl FlashFloat for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f32::NEG_INFINITY;
    const INFINITY: Self = f32::INFINITY;
    const NAN: Self = f32::NAN;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn is_finite(self) -> bool {
        f32::is_finite(self)
    }
    fn exp(self) -> Self {
        crate::numerics::shifted_exp::exp_f32(self)
    }
    fn exp_shifted(row: &mut [Self], m: Self, simd: Simd) -> f64 {
        #[cfg(target_arch = "x86_64")]
        if simd >= Simd::Avx2 {
            // SAFETY: `checked` panics unless this CPU runs `simd`.
            return unsafe { flash_tiles::exp_shifted(simd.checked(), row, m) };
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { exp_shifted_f32_avx2(row, m) };
        }
        exp_shifted_f32(row, m)
    }
    fn pack(
        k: &[Self],
        v: &[Self],
        nk: usize,
        p: usize,
        pv: usize,
        simd: Simd,
    ) -> (Vec<Self>, Vec<Self>) {
        // Both microkernel paths read the same 16-column panels.
        if simd < Simd::Avx2 {
            return (Vec::new(), Vec::new());
        }
        let vp = if pv.is_multiple_of(flash_tiles::NR) {
            flash_tiles::pack_values(v, nk, pv)
        } else {
            Vec::new()
        };
        (flash_tiles::pack_keys(k, nk, p), vp)
    }
    fn scores(
        simd: Simd,
        qb: &[Self],
        rows: usize,
        p: usize,
        k: &[Self],
        kp: &[Self],
        c0: usize,
        kt: usize,
        s: &mut [Self],
        ld: usize,
        stats: Option<&mut flash_tiles::LaneStats>,
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        if !kp.is_empty() {
            let filled = stats.is_some();
            // Packed panels are read by a microkernel path: at least AVX2, and `checked` panics
            // unless this CPU runs it.
            let simd = simd.max(Simd::Avx2).checked();
            // SAFETY: the path is one this CPU runs (just above); `kp` holds every panel of the
            // head, c0 is a multiple of 16 (query_block_body aligns the spans), s holds rows · ld
            // with ld ≥ the panels' width, and the stats QUERY_BLOCK rows.
            unsafe { flash_tiles::scores(simd, qb, rows, p, kp, c0, kt, s, ld, stats) };
            return filled;
        }
        let _ = (simd, stats);
        gemm_into(rows, kt, p, s, ld, false, qb, p, 1, &k[c0 * p..], 1, p);
        false
    }
    fn accumulate_values(
        simd: Simd,
        e: &[Self],
        ld: usize,
        rows: usize,
        v: &[Self],
        vp: &[Self],
        c0: usize,
        kt: usize,
        pv: usize,
        acc: &mut [Self],
    ) {
        #[cfg(target_arch = "x86_64")]
        if !vp.is_empty() {
            let simd = simd.max(Simd::Avx2).checked();
            let nk = v.len() / pv;
            // SAFETY: as above; `vp` is the head's nk · pv values packed (pv a multiple of 16).
            return unsafe {
                flash_tiles::accumulate_values(simd, e, ld, rows, vp, nk, c0, kt, pv, acc)
            };
        }
        let _ = simd;
        gemm_into(rows, pv, kt, acc, pv, true, e, ld, 1, &v[c0 * pv..], pv, 1);
    }
}

#[inline(always)]
fn exp_shifted_f32(row: &mut [f32], m: f32) -> f64 {
    for x in row.iter_mut() {
        *x = crate::numerics::shifted_exp::exp_f32(*x - m);
    }
    lane_sum(row)
}

/// The same arithmetic compiled for 8-wide vectors (plain multiplies and adds: Rust never
/// contracts them into FMA, so the bits equal the portable build's).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn exp_shifted_f32_avx2(row: &mut [f32], m: f32) -> f64 {
    exp_shifted_f32(row, m)
}

impl FlashFloat for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f64::NEG_INFINITY;
    const INFINITY: Self = f64::INFINITY;
    const NAN: Self = f64::NAN;
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(x: f64) -> Self {
        x
    }
    fn is_finite(self) -> bool {
        f64::is_finite(self)
    }
    fn exp(self) -> Self {
        f64::exp(self)
    }
    fn exp_shifted(row: &mut [Self], m: Self, _simd: Simd) -> f64 {
        for x in row.iter_mut() {
            *x = (*x - m).exp();
        }
        lane_sum(row)
    }
}

/// The row's maximum and whether it holds NaN or +∞ (which poison the row), in `L` independent
/// lanes so that it vectorises (8 for AVX2's vectors, 16 for AVX-512's; the maximum is exact, so
/// the lane count changes no output; a tie of −0 and +0 leaves the same exponentials and log D).
// `!(x < ∞)` is meant: it holds for NaN as for +∞ (partial_cmp would spell the same test longer).
#[allow(clippy::neg_cmp_op_on_partial_ord)]
#[inline(always)]
pub(super) fn max_and_poison<T: FlashFloat, const L: usize>(row: &[T]) -> (T, bool) {
    let mut lane_max = [T::NEG_INFINITY; L];
    let mut lane_bad = [false; L];
    let mut chunks = row.chunks_exact(L);
    for c in &mut chunks {
        for i in 0..L {
            let x = c[i];
            // NaN or +∞: not below +∞.
            lane_bad[i] |= !(x < T::INFINITY);
            lane_max[i] = if x > lane_max[i] { x } else { lane_max[i] };
        }
    }
    let mut max = T::NEG_INFINITY;
    let mut bad = lane_bad.iter().any(|&b| b);
    for &x in chunks.remainder().iter().chain(lane_max.iter()) {
        bad |= !(x < T::INFINITY);
        max = if x > max { x } else { max };
    }
    (max, bad)
}

/// dst (m×n, row stride `dst_rs`) ← [dst +] lhs (m×k) · rhs (k×n), strides in elements, on the
/// calling thread.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn gemm_into<T: FlashFloat>(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [T],
    dst_rs: usize,
    accumulate: bool,
    lhs: &[T],
    lhs_rs: usize,
    lhs_cs: usize,
    rhs: &[T],
    rhs_rs: usize,
    rhs_cs: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    debug_assert!(dst.len() >= (m - 1) * dst_rs + n);
    debug_assert!(lhs.len() > (m - 1) * lhs_rs + (k.max(1) - 1) * lhs_cs || k == 0);
    debug_assert!(rhs.len() > (k.max(1) - 1) * rhs_rs + (n - 1) * rhs_cs || k == 0);
    // SAFETY: the extents are checked above (in debug builds) and by the callers' slicing; the
    // three slices do not overlap (dst is the block's own scratch).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            accumulate,
            lhs.as_ptr(),
            lhs_cs as isize,
            lhs_rs as isize,
            rhs.as_ptr(),
            rhs_cs as isize,
            rhs_rs as isize,
            T::ONE,
            T::ONE,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}
