//! The AVX2 + FMA microkernels of the fused exact kernel ([`super`]): a 6 × 16 register tile
//! (12 accumulators, two B vectors, one broadcast: 15 of the 16 ymm registers). Each output
//! element is one sum over the inner index in order with FMA, the same for every block and
//! thread, so the bits do not depend on the thread count.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::{LaneStats, NR, STAT_LANES};

/// Rows of the register tile.
const MR: usize = 6;

/// s[i·ld + j] = Σ_l q[i·p + l] · K[c0 + j, l] for i < rows and j < 16·⌈kt/16⌉, from the
/// head's keys packed by [`super::pack_keys`] (c0 a multiple of 16; columns past nk come out 0).
///
/// # Safety
/// The CPU must support AVX2 and FMA ([`super::Simd::Avx2`] or above); `q` holds rows·p values, `packed` the
/// panels of keys c0..c0 + kt, and `s` (rows − 1)·ld + 16·⌈kt/16⌉ with ld ≥ 16·⌈kt/16⌉.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn scores(
    q: &[f32],
    rows: usize,
    p: usize,
    packed: &[f32],
    c0: usize,
    kt: usize,
    s: &mut [f32],
    ld: usize,
    stats: Option<&mut LaneStats>,
) {
    let panels = kt.div_ceil(NR);
    debug_assert!(c0.is_multiple_of(NR) && packed.len() >= (c0 / NR + panels) * p * NR);
    debug_assert!(q.len() >= rows * p && ld >= panels * NR);
    debug_assert!(rows == 0 || s.len() >= (rows - 1) * ld + panels * NR);
    let (max, poison) = match stats {
        Some(st) => {
            st.reset(rows);
            (st.max.as_mut_ptr(), st.poison.as_mut_ptr())
        }
        None => (std::ptr::null_mut(), std::ptr::null_mut()),
    };
    // Six query rows (1.5 kB at p = 64) stay in L1 while the tile's key panels stream past;
    // the other order re-read the whole query block (32 kB, L1's size) from L2 per panel.
    let b0 = packed.as_ptr().add((c0 / NR) * p * NR);
    let mut i = 0;
    while i < rows {
        let r = (rows - i).min(MR);
        let (mx, po) = if max.is_null() {
            (max, poison)
        } else {
            (max.add(i * STAT_LANES), poison.add(i * STAT_LANES))
        };
        let a = q.as_ptr().add(i * p);
        for c in 0..panels {
            let (b, out) = (b0.add(c * p * NR), s.as_mut_ptr().add(i * ld + c * NR));
            // r ≤ MR rows: one register tile.
            tile_rows::<false>(r, a, p, b, p, out, ld, mx, po);
        }
        i += MR;
    }
}

/// acc[i·pv + j] += Σ_{l < kt} e[i·ld + l] · V[c0 + l, j] for i < rows, j < pv, from the head's
/// values packed by [`super::pack_values`] (nk rows).
///
/// # Safety
/// The CPU must support AVX2 and FMA ([`super::Simd::Avx2`] or above); `e` holds (rows − 1)·ld + kt values,
/// `packed` nk·pv with c0 + kt ≤ nk, and `acc` rows·pv.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn accumulate_values(
    e: &[f32],
    ld: usize,
    rows: usize,
    packed: &[f32],
    nk: usize,
    c0: usize,
    kt: usize,
    pv: usize,
    acc: &mut [f32],
) {
    debug_assert!(pv.is_multiple_of(NR) && packed.len() >= nk * pv && c0 + kt <= nk);
    debug_assert!(acc.len() >= rows * pv);
    debug_assert!(rows == 0 || e.len() >= (rows - 1) * ld + kt);
    for c in 0..pv / NR {
        let b = packed.as_ptr().add((c * nk + c0) * NR);
        let c = acc.as_mut_ptr().add(c * NR);
        let null = std::ptr::null_mut();
        tile_rows::<true>(rows, e.as_ptr(), ld, b, kt, c, pv, null, null);
    }
}

/// row ← exp(row − m) in place (m ≥ every entry, no NaN or +∞ in the row), returning Σ row: the
/// Cody–Waite reduction of [`crate::numerics::shifted_exp::exp_f32`], then a degree-5 minimax
/// polynomial in fused multiply-adds (≤ 2e-7 relative, tested; the bits differ from the portable
/// form's, not between threads or blocks). −∞ (a masked key) and anything below the lowest
/// normal result give 0.
///
/// The sum adds each pair of 8-wide vectors in f32 (one rounding, ≤ 2⁻²⁴ relative: the values are
/// positive), then runs in 8 f64 lanes, then the tail: halving the f32 → f64 conversions took 12 %
/// off this loop.
///
/// Its cost is its operations: about 0.8 ns per value on the 2-core build machine with Cephes'
/// 20-operation form, the same whether it ran alone or interleaved one vector per 8 steps into a
/// score microkernel's depth loop (measured in session 18). So it takes as few as it can (13 per
/// 8 values, session 19: the kernel 0.94× the time before): no clamps (x ≤ 0 since m is the
/// row's maximum, and what falls below the lowest result is masked to 0 after the fact, NaN from
/// −∞ included), a degree-5 polynomial by Horner's rule rather than Cephes' degree 7, and 2ⁿ
/// built by one shift from the rounding constant.
///
/// # Safety
/// The CPU must support AVX2 and FMA ([`super::Simd::Avx2`] or above).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn exp_shifted(row: &mut [f32], m: f32) -> f64 {
    use crate::numerics::shifted_exp::exp_f32;
    let shift = _mm256_set1_ps(m);
    let (mut sum_lo, mut sum_hi) = (_mm256_setzero_pd(), _mm256_setzero_pd());
    let mut add = |e: __m256| {
        sum_lo = _mm256_add_pd(sum_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        sum_hi = _mm256_add_pd(sum_hi, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(e)));
    };
    let mut pairs = row.chunks_exact_mut(16);
    for c in &mut pairs {
        let e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), shift));
        let e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr().add(8)), shift));
        _mm256_storeu_ps(c.as_mut_ptr(), e0);
        _mm256_storeu_ps(c.as_mut_ptr().add(8), e1);
        add(_mm256_add_ps(e0, e1));
    }
    let rest = pairs.into_remainder();
    let mut singles = rest.chunks_exact_mut(8);
    for c in &mut singles {
        let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), shift));
        _mm256_storeu_ps(c.as_mut_ptr(), e);
        add(e);
    }
    let mut lanes = [0f64; 8];
    _mm256_storeu_pd(lanes.as_mut_ptr(), sum_lo);
    _mm256_storeu_pd(lanes.as_mut_ptr().add(4), sum_hi);
    let mut tail = 0.0;
    for x in singles.into_remainder() {
        *x = exp_f32(*x - m);
        tail += *x as f64;
    }
    lanes.iter().sum::<f64>() + tail
}

/// exp(x) for 8 values x ≤ 0 (see [`exp_shifted`]): 0 below the lowest normal result.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn exp8(x: __m256) -> __m256 {
    use crate::numerics::shifted_exp::{LN2_HI, LN2_LO, LOG2E, LOWEST, ROUNDER};
    let rounder = _mm256_set1_ps(ROUNDER + 127.0);
    // exp(r) ≈ 1 + r(c1 + r(c2 + r(c3 + r(c4 + r c5)))) on |r| ≤ ln2/2: a degree-5 minimax fit
    // of the relative error (9.2e-8; 1.6e-7 with the f32 roundings, simulated over all of
    // [−87.3, 0] by scripts/fit-exp-poly.py), in five multiply-adds by Horner's rule. Cephes'
    // 1 + r + r²·P(r), P of degree 5, took 11 operations where this takes 6, and this loop is
    // bound by its operations, not its chain.
    // The constant term is exactly 1, so exp(0) = 1 at each row's maximum.
    let [c1, c2, c3, c4, c5] = [
        0.999_999_7_f32,
        0.499_991_5,
        0.166_676_37,
        0.041_897_975,
        0.008_290_306,
    ]
    .map(|c| _mm256_set1_ps(c));
    // n = round(x / ln 2) via the 1.5·2²³ trick, with the exponent bias 127 added to the rounder:
    // t's low bits hold n + 127, so t's bits shifted left by 23 are 2ⁿ (the rounder's own bits
    // shift out), one integer operation and one constant fewer.
    let t = _mm256_fmadd_ps(x, _mm256_set1_ps(LOG2E), rounder);
    let n = _mm256_sub_ps(t, rounder);
    let scale = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_castps_si256(t)));
    // Two steps of Cody–Waite: one step (r = x − n·fl(ln 2)) is 1.9e-9·|n| relative off, 3.9e-7
    // at n = −126, over the test's bound.
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    let p = _mm256_fmadd_ps(c5, r, c4);
    let p = _mm256_fmadd_ps(p, r, c3);
    let p = _mm256_fmadd_ps(p, r, c2);
    let p = _mm256_fmadd_ps(p, r, c1);
    let p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0));
    // The product by 2ⁿ is exact (except at n = −126, where it is subnormal: results below
    // 2⁻¹²⁵, about 1 ulp more there; the test covers them).
    let y = _mm256_mul_ps(p, scale);
    // Below LOWEST (−∞ included, whose lanes hold NaN by now): 0.
    _mm256_and_ps(y, _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(LOWEST)))
}

/// `rows` rows of a 16-column strip, 6 at a time then the remainder: c[i, 0..16] (+)=
/// Σ_{l < depth} a[i·a_rs + l] · b[l·16 + 0..16], with row statistics folded into
/// the first 8 of each row's [`STAT_LANES`] in `lane_max`/`lane_poison` when they are not null.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_rows<const ACCUMULATE: bool>(
    rows: usize,
    a: *const f32,
    a_rs: usize,
    b: *const f32,
    depth: usize,
    c: *mut f32,
    c_rs: usize,
    lane_max: *mut f32,
    lane_poison: *mut f32,
) {
    let mut i = 0;
    while i < rows {
        let (a, c) = (a.add(i * a_rs), c.add(i * c_rs));
        let (mx, po) = if lane_max.is_null() {
            (lane_max, lane_poison)
        } else {
            (
                lane_max.add(i * STAT_LANES),
                lane_poison.add(i * STAT_LANES),
            )
        };
        match (rows - i).min(MR) {
            6 => tile::<6, ACCUMULATE>(a, a_rs, b, NR, depth, c, c_rs, mx, po),
            5 => tile::<5, ACCUMULATE>(a, a_rs, b, NR, depth, c, c_rs, mx, po),
            4 => tile::<4, ACCUMULATE>(a, a_rs, b, NR, depth, c, c_rs, mx, po),
            3 => tile::<3, ACCUMULATE>(a, a_rs, b, NR, depth, c, c_rs, mx, po),
            2 => tile::<2, ACCUMULATE>(a, a_rs, b, NR, depth, c, c_rs, mx, po),
            _ => tile::<1, ACCUMULATE>(a, a_rs, b, NR, depth, c, c_rs, mx, po),
        }
        i += MR;
    }
}

/// One R × 16 register tile: c[r, 0..16] (+)= Σ_{l < depth} a[r·a_rs + l] · b[l·b_rs + 0..16];
/// with `lane_max` (and `lane_poison`) not null, also folds each row's 16 results into its 8
/// first 8 lanes there (rows at a stride of [`STAT_LANES`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const R: usize, const ACCUMULATE: bool>(
    a: *const f32,
    a_rs: usize,
    b: *const f32,
    b_rs: usize,
    depth: usize,
    c: *mut f32,
    c_rs: usize,
    lane_max: *mut f32,
    lane_poison: *mut f32,
) {
    let mut lo = [_mm256_setzero_ps(); R];
    let mut hi = [_mm256_setzero_ps(); R];
    // One base pointer per row, indexed by l: each broadcast is then one load with base+index
    // addressing. Written as a[r·a_rs + l], LLVM walked the rows with a chain of pointer adds,
    // 7 integer operations per depth step beside 12 FMAs and 8 loads, and the 4-wide front end,
    // not the FMA ports, set the pace. Two depth steps per loop trip halve the loop's own
    // operations. Each accumulator still adds its terms in order l = 0, 1, …: the bits are
    // unchanged (the kernel 0.91× its time, median of 8 alternated rounds, session 19).
    let rows: [*const f32; R] = std::hint::black_box(std::array::from_fn(|r| a.add(r * a_rs)));
    let step = |l: usize, lo: &mut [__m256; R], hi: &mut [__m256; R]| {
        let b0 = _mm256_loadu_ps(b.add(l * b_rs));
        let b1 = _mm256_loadu_ps(b.add(l * b_rs + 8));
        for r in 0..R {
            let x = _mm256_broadcast_ss(&*rows[r].add(l));
            lo[r] = _mm256_fmadd_ps(x, b0, lo[r]);
            hi[r] = _mm256_fmadd_ps(x, b1, hi[r]);
        }
    };
    let mut l = 0;
    while l + 2 <= depth {
        step(l, &mut lo, &mut hi);
        step(l + 1, &mut lo, &mut hi);
        l += 2;
    }
    if l < depth {
        step(l, &mut lo, &mut hi);
    }
    for r in 0..R {
        let out = c.add(r * c_rs);
        if ACCUMULATE {
            lo[r] = _mm256_add_ps(_mm256_loadu_ps(out), lo[r]);
            hi[r] = _mm256_add_ps(_mm256_loadu_ps(out.add(8)), hi[r]);
        }
        _mm256_storeu_ps(out, lo[r]);
        _mm256_storeu_ps(out.add(8), hi[r]);
        if !lane_max.is_null() {
            let (mx, po) = (
                lane_max.add(r * STAT_LANES),
                lane_poison.add(r * STAT_LANES),
            );
            let inf = _mm256_set1_ps(f32::INFINITY);
            // Not below +∞: NaN or +∞.
            let bad = _mm256_or_ps(
                _mm256_cmp_ps::<_CMP_NLT_UQ>(lo[r], inf),
                _mm256_cmp_ps::<_CMP_NLT_UQ>(hi[r], inf),
            );
            _mm256_storeu_ps(po, _mm256_or_ps(_mm256_loadu_ps(po), bad));
            let m = _mm256_max_ps(lo[r], hi[r]);
            _mm256_storeu_ps(mx, _mm256_max_ps(_mm256_loadu_ps(mx), m));
        }
    }
}
