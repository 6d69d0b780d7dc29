//! The AVX-512F microkernels of the fused exact kernel ([`super`], issue 46): an 8 × 32 register
//! tile over two 16-column panels at once (16 zmm accumulators, two B vectors, broadcasts folded
//! into the FMAs: 18 of the 32 zmm registers), and the exponential 16 lanes at a time.
//!
//! Same packed layout and same arithmetic per element as [`super::avx2`]: each output element is
//! one FMA chain over the inner index in order (from zero, then added to the accumulator), the
//! exponential is the same operations, and the row sum pairs the same values in f32 before the
//! same 8 f64 lanes. So the bits equal AVX2's (tested); what changes is the instructions per
//! value: half the FMAs, loads and loop trips per tile, and half the exponential's operations.
//!
//! Why 8 rows: a query block of 128 rows splits into 16 whole tiles (6 left a 2-row remainder),
//! and 16 independent accumulators cover the FMA latency on two 512-bit ports (Intel) as on one
//! double-pumped unit (AMD Zen 4).

use std::arch::x86_64::*;

use super::{LaneStats, NR, STAT_LANES};

/// Rows of the register tile.
const MR: usize = 8;

/// s[i·ld + j] = Σ_l q[i·p + l] · K[c0 + j, l] for i < rows and j < 16·⌈kt/16⌉, from the
/// head's keys packed by [`super::pack_keys`] (c0 a multiple of 16; columns past nk come out 0).
///
/// # Safety
/// The CPU must support AVX-512F, AVX2 and FMA ([`super::Simd::Avx512`]); `q` holds rows·p
/// values, `packed` the panels of keys c0..c0 + kt, and `s` (rows − 1)·ld + 16·⌈kt/16⌉ with
/// ld ≥ 16·⌈kt/16⌉.
#[target_feature(enable = "avx512f,avx2,fma")]
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
    // Eight query rows (2 kB at p = 64) stay in L1 while the tile's key panels stream past.
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
        // Two panels (32 keys) per tile; an odd last panel alone. Panel c + 1 starts p·16
        // values after panel c.
        let mut c = 0;
        while c < panels {
            let wide = panels - c >= 2;
            let (b, out) = (b0.add(c * p * NR), s.as_mut_ptr().add(i * ld + c * NR));
            let strip = Strip {
                b,
                b_next: p * NR,
                depth: p,
                c: out,
                c_rs: ld,
            };
            tile_rows::<false>(r, wide, a, p, &strip, mx, po);
            c += 2;
        }
        i += MR;
    }
}

/// acc[i·pv + j] += Σ_{l < kt} e[i·ld + l] · V[c0 + l, j] for i < rows, j < pv, from the head's
/// values packed by [`super::pack_values`] (nk rows).
///
/// # Safety
/// The CPU must support AVX-512F, AVX2 and FMA ([`super::Simd::Avx512`]); `e` holds
/// (rows − 1)·ld + kt values, `packed` nk·pv with c0 + kt ≤ nk, and `acc` rows·pv.
#[target_feature(enable = "avx512f,avx2,fma")]
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
    let panels = pv / NR;
    let null = std::ptr::null_mut();
    // Two value panels (32 columns) per tile; panel c + 1 starts nk·16 values after panel c.
    let mut c = 0;
    while c < panels {
        let strip = Strip {
            b: packed.as_ptr().add((c * nk + c0) * NR),
            b_next: nk * NR,
            depth: kt,
            c: acc.as_mut_ptr().add(c * NR),
            c_rs: pv,
        };
        tile_rows::<true>(rows, panels - c >= 2, e.as_ptr(), ld, &strip, null, null);
        c += 2;
    }
}

/// row ← exp(row − m) in place (m ≥ every entry, no NaN or +∞ in the row), returning Σ row: the
/// operations of [`super::avx2::exp_shifted`] 16 lanes at a time (the same bits).
///
/// The sum keeps AVX2's pairing: per 16 values, the low 8 plus the high 8 in f32 (AVX2's pair of
/// vectors), widened into 8 f64 lanes; then one 8-value vector alone, then the scalar tail.
///
/// # Safety
/// The CPU must support AVX-512F, AVX2 and FMA ([`super::Simd::Avx512`]).
#[target_feature(enable = "avx512f,avx2,fma")]
pub unsafe fn exp_shifted(row: &mut [f32], m: f32) -> f64 {
    use crate::numerics::shifted_exp::exp_f32;
    let shift = _mm512_set1_ps(m);
    let mut sum = _mm512_setzero_pd();
    let mut pairs = row.chunks_exact_mut(16);
    for c in &mut pairs {
        let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(c.as_ptr()), shift));
        _mm512_storeu_ps(c.as_mut_ptr(), e);
        let lo = _mm512_castps512_ps256(e);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(e)));
        sum = _mm512_add_pd(sum, _mm512_cvtps_pd(_mm256_add_ps(lo, hi)));
    }
    let rest = pairs.into_remainder();
    let mut done = 0;
    if rest.len() >= 8 {
        // The low 8 lanes only (masked: nothing past the row is read or written).
        let k: __mmask16 = 0x00ff;
        let e = exp16(_mm512_sub_ps(
            _mm512_maskz_loadu_ps(k, rest.as_ptr()),
            shift,
        ));
        _mm512_mask_storeu_ps(rest.as_mut_ptr(), k, e);
        sum = _mm512_add_pd(sum, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        done = 8;
    }
    let mut lanes = [0f64; 8];
    _mm512_storeu_pd(lanes.as_mut_ptr(), sum);
    let mut tail = 0.0;
    for x in &mut rest[done..] {
        *x = exp_f32(*x - m);
        tail += *x as f64;
    }
    lanes.iter().sum::<f64>() + tail
}

/// exp(x) for 16 values x ≤ 0: [`super::avx2`]'s exp8 operation for operation (the same
/// degree-5 polynomial, Cody–Waite steps and 2ⁿ from the rounding constant; see there for why
/// each), 0 below the lowest normal result.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn exp16(x: __m512) -> __m512 {
    use crate::numerics::shifted_exp::{LN2_HI, LN2_LO, LOG2E, LOWEST, ROUNDER};
    let rounder = _mm512_set1_ps(ROUNDER + 127.0);
    let [c1, c2, c3, c4, c5] = [
        0.999_999_7_f32,
        0.499_991_5,
        0.166_676_37,
        0.041_897_975,
        0.008_290_306,
    ]
    .map(|c| _mm512_set1_ps(c));
    let t = _mm512_fmadd_ps(x, _mm512_set1_ps(LOG2E), rounder);
    let n = _mm512_sub_ps(t, rounder);
    let scale = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_castps_si512(t)));
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let p = _mm512_fmadd_ps(c5, r, c4);
    let p = _mm512_fmadd_ps(p, r, c3);
    let p = _mm512_fmadd_ps(p, r, c2);
    let p = _mm512_fmadd_ps(p, r, c1);
    let p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0));
    let y = _mm512_mul_ps(p, scale);
    // Below LOWEST (−∞ included, whose lanes hold NaN by now): 0.
    _mm512_maskz_mov_ps(
        _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(LOWEST)),
        y,
    )
}

/// One strip of register tiles: B's first panel at `b` (rows of 16 at a stride of 16) and its
/// second `b_next` values on, `depth` steps, C at `c` with row stride `c_rs`.
#[derive(Clone, Copy)]
struct Strip {
    b: *const f32,
    b_next: usize,
    depth: usize,
    c: *mut f32,
    c_rs: usize,
}

/// `rows` rows of a strip of 32 columns (`wide`) or 16, 8 at a time then the remainder, with
/// row statistics folded into `lane_max`/`lane_poison` ([`STAT_LANES`] per row) when not null.
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn tile_rows<const ACCUMULATE: bool>(
    rows: usize,
    wide: bool,
    a: *const f32,
    a_rs: usize,
    strip: &Strip,
    lane_max: *mut f32,
    lane_poison: *mut f32,
) {
    let mut i = 0;
    while i < rows {
        let a = a.add(i * a_rs);
        let c = strip.c.add(i * strip.c_rs);
        let (mx, po) = if lane_max.is_null() {
            (lane_max, lane_poison)
        } else {
            (
                lane_max.add(i * STAT_LANES),
                lane_poison.add(i * STAT_LANES),
            )
        };
        let st = Strip { c, ..*strip };
        macro_rules! run {
            ($($r:literal)*) => {
                match ((rows - i).min(MR), wide) {
                    $(
                        ($r, true) => tile::<$r, 2, ACCUMULATE>(a, a_rs, &st, mx, po),
                        ($r, false) => tile::<$r, 1, ACCUMULATE>(a, a_rs, &st, mx, po),
                    )*
                    _ => unreachable!("1 ≤ rows ≤ MR"),
                }
            };
        }
        run!(1 2 3 4 5 6 7 8);
        i += MR;
    }
}

/// One R × 16·W register tile: c[r, 0..16W] (+)= Σ_{l < depth} a[r·a_rs + l] · B[l, 0..16W],
/// B's w-th 16 columns read from the strip's panel w; with `lane_max` (and `lane_poison`) not
/// null, also folds each row's results into its 16 lanes there (rows at a stride of
/// [`STAT_LANES`]).
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn tile<const R: usize, const W: usize, const ACCUMULATE: bool>(
    a: *const f32,
    a_rs: usize,
    strip: &Strip,
    lane_max: *mut f32,
    lane_poison: *mut f32,
) {
    let Strip {
        b,
        b_next,
        depth,
        c,
        c_rs,
    } = *strip;
    let mut acc = [[_mm512_setzero_ps(); W]; R];
    // One base pointer per row, indexed by l (base+index addressing of each broadcast: see
    // avx2's tile for the measurement), and two depth steps per loop trip. Each accumulator adds
    // its terms in order l = 0, 1, …, as AVX2's do.
    let rows: [*const f32; R] = std::hint::black_box(std::array::from_fn(|r| a.add(r * a_rs)));
    let step = |l: usize, acc: &mut [[__m512; W]; R]| {
        let mut bv = [_mm512_setzero_ps(); W];
        for (w, v) in bv.iter_mut().enumerate() {
            *v = _mm512_loadu_ps(b.add(w * b_next + l * NR));
        }
        for r in 0..R {
            let x = _mm512_set1_ps(*rows[r].add(l));
            for w in 0..W {
                acc[r][w] = _mm512_fmadd_ps(x, bv[w], acc[r][w]);
            }
        }
    };
    let mut l = 0;
    while l + 2 <= depth {
        step(l, &mut acc);
        step(l + 1, &mut acc);
        l += 2;
    }
    if l < depth {
        step(l, &mut acc);
    }
    for (r, row) in acc.iter_mut().enumerate() {
        let out = c.add(r * c_rs);
        for (w, v) in row.iter_mut().enumerate() {
            if ACCUMULATE {
                *v = _mm512_add_ps(_mm512_loadu_ps(out.add(w * NR)), *v);
            }
            _mm512_storeu_ps(out.add(w * NR), *v);
        }
        if !lane_max.is_null() {
            fold_stats(
                row,
                lane_max.add(r * STAT_LANES),
                lane_poison.add(r * STAT_LANES),
            );
        }
    }
}

/// One row's results into its 16 lanes of maximum and poison (NaN or +∞: not below +∞).
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn fold_stats<const W: usize>(row: &[__m512; W], mx: *mut f32, po: *mut f32) {
    let inf = _mm512_set1_ps(f32::INFINITY);
    let mut bad: __mmask16 = 0;
    let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
    for &v in row {
        bad |= _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(v, inf);
        m = _mm512_max_ps(m, v);
    }
    let all = _mm512_castsi512_ps(_mm512_set1_epi32(-1));
    _mm512_storeu_ps(po, _mm512_mask_mov_ps(_mm512_loadu_ps(po), bad, all));
    _mm512_storeu_ps(mx, _mm512_max_ps(_mm512_loadu_ps(mx), m));
}
