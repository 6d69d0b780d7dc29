//! The two f32 tile products of the fused exact kernel ([`super`]) on AVX2 + FMA
//! microkernels of our own (issue 33): S = Q̃_b K_cᵀ and acc += E V_c for a block of up to
//! [`super::QUERY_BLOCK`] rows and a tile of up to [`super::KEY_TILE`] keys.
//!
//! Why not `gemm` here: each tile is a small product (128 × 256 × 64), and `gemm` packs both
//! operands and dispatches afresh on every call. Here K and V are packed once per head into
//! 16-column panels (K: [p][16] per 16 keys; V: [nk][16] per 16 value columns, so that a tile's
//! panel is contiguous and does not alias in L1 as V's rows at a 256-byte stride do), and Q and E
//! are read in place (one broadcast per row and step).
//!
//! The register tile is 6 rows × 16 columns (12 accumulators, two B vectors, one broadcast: 15 of
//! the 16 ymm registers). Each output element is one sum over the inner index in order with FMA,
//! the same for every block and thread, so the bits do not depend on the thread count.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Columns of a panel (two 8-lane vectors).
pub const NR: usize = 16;
/// Rows of the register tile.
const MR: usize = 6;

/// Whether this CPU runs the microkernels (`AB_NO_TILES` set turns them off, to compare with
/// `gemm`'s path). Decided once per process: the kernel asks per row, and reading the
/// environment there cost 6 % of its time.
#[inline]
pub fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::env::var_os("AB_NO_TILES").is_none()
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// `k` ([nk, p] row-major) as ⌈nk/16⌉ panels of [p][16], keys past nk zero.
pub fn pack_keys(k: &[f32], nk: usize, p: usize) -> Vec<f32> {
    let mut dst = vec![0.0; nk.div_ceil(NR) * p * NR];
    for (j, key) in k[..nk * p].chunks_exact(p).enumerate() {
        let panel = &mut dst[(j / NR) * p * NR..];
        for (l, &x) in key.iter().enumerate() {
            panel[l * NR + j % NR] = x;
        }
    }
    dst
}

/// `v` ([nk, pv] row-major, pv a multiple of 16) as pv/16 panels of [nk][16].
pub fn pack_values(v: &[f32], nk: usize, pv: usize) -> Vec<f32> {
    debug_assert!(pv.is_multiple_of(NR));
    let mut dst = vec![0.0; nk * pv];
    for (j, row) in v[..nk * pv].chunks_exact(pv).enumerate() {
        for (c, part) in row.chunks_exact(NR).enumerate() {
            dst[(c * nk + j) * NR..(c * nk + j + 1) * NR].copy_from_slice(part);
        }
    }
    dst
}

/// s[i·ld + j] = Σ_l q[i·p + l] · K[c0 + j, l] for i < rows and j < 16·⌈kt/16⌉, from the
/// head's keys packed by [`pack_keys`] (c0 a multiple of 16; columns past nk come out 0).
///
/// # Safety
/// The CPU must support AVX2 and FMA ([`available`]); `q` holds rows·p values, `packed` the
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
            debug_assert!(st.max.len() >= rows * 8 && st.poison.len() >= rows * 8);
            st.max[..rows * 8].fill(f32::NEG_INFINITY);
            st.poison[..rows * 8].fill(0.0);
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
            (max.add(i * 8), poison.add(i * 8))
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

/// Per-row statistics of a score tile gathered in [`scores`]'s registers, in 8 lanes per row:
/// the running maximum, and a lane mask (all bits set) where a NaN or +∞ was seen. Meaningful
/// only when every column the panels compute belongs to the tile (kt a multiple of 16) and no
/// key of it is masked.
pub struct LaneStats {
    pub max: Vec<f32>,
    pub poison: Vec<f32>,
}

impl LaneStats {
    pub fn new(rows: usize) -> Self {
        Self {
            max: vec![f32::NEG_INFINITY; rows * 8],
            poison: vec![0.0; rows * 8],
        }
    }

    /// Row r's maximum and whether it met NaN or +∞.
    pub fn row(&self, r: usize) -> (f32, bool) {
        let lanes = &self.max[r * 8..r * 8 + 8];
        let max = lanes
            .iter()
            .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
        let bad = self.poison[r * 8..r * 8 + 8]
            .iter()
            .any(|x| x.to_bits() != 0);
        (max, bad)
    }
}

/// acc[i·pv + j] += Σ_{l < kt} e[i·ld + l] · V[c0 + l, j] for i < rows, j < pv, from the head's
/// values packed by [`pack_values`] (nk rows).
///
/// # Safety
/// The CPU must support AVX2 and FMA ([`available`]); `e` holds (rows − 1)·ld + kt values,
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
/// The CPU must support AVX2 and FMA ([`available`]).
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
/// `lane_max`/`lane_poison` (8 per row) when they are not null.
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
            (lane_max.add(i * 8), lane_poison.add(i * 8))
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
/// lanes there (rows at a stride of 8).
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
            let (mx, po) = (lane_max.add(r * 8), lane_poison.add(r * 8));
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

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// The fused exponential against float64's: 2e-7 relative wherever the result is a normal
    /// f32 (the fit's 1.6e-7 with its f32 roundings, simulated over the whole range by
    /// scripts/fit-exp-poly.py, plus margin), 0 below, and the f64 sum of what it wrote.
    #[test]
    fn the_fused_exponential_agrees_with_float64() {
        if !available() {
            return;
        }
        let mut row: Vec<f32> = (0..20_011)
            .map(|i| -100.0 + 100.0 * i as f32 / 20_000.0)
            .chain([f32::NEG_INFINITY, -87.3, 0.0, 2.5])
            .collect();
        let m = 2.5;
        let orig = row.clone();
        let sum = unsafe { exp_shifted(&mut row, m) };
        for (&x, &e) in orig.iter().zip(&row) {
            let want = ((x - m) as f64).exp();
            if want < f32::MIN_POSITIVE as f64 {
                assert!(e == 0.0 || (e as f64 - want).abs() <= 1e-38, "{x}: {e}");
            } else {
                assert!((e as f64 - want).abs() <= 2e-7 * want, "{x}: {e} vs {want}");
            }
        }
        // The sum of what it wrote, up to the f32 rounding of each pair of vectors (2⁻²⁴).
        let direct: f64 = row.iter().map(|&e| e as f64).sum();
        assert!((sum - direct).abs() <= 6e-8 * direct, "{sum} vs {direct}");
    }

    /// A NaN or +∞ score poisons exactly its row's statistics.
    #[test]
    fn the_row_statistics_flag_nan_and_infinity() {
        if !available() {
            return;
        }
        let (rows, nk, p) = (9, 48, 4);
        let mut q = vec![0.25f32; rows * p];
        q[3 * p] = f32::NAN; // row 3: every score NaN
        q[5 * p] = f32::MAX; // row 5: overflows to +∞ against positive keys
        let k: Vec<f32> = (0..nk * p).map(|i| 1.0 + (i % 5) as f32).collect();
        let packed = pack_keys(&k, nk, p);
        let mut s = vec![0.0; rows * nk];
        let mut stats = LaneStats::new(rows);
        unsafe { scores(&q, rows, p, &packed, 0, nk, &mut s, nk, Some(&mut stats)) };
        for r in 0..rows {
            let (m, bad) = stats.row(r);
            assert_eq!(bad, r == 3 || r == 5, "row {r}");
            if !bad {
                assert_eq!(
                    m,
                    s[r * nk..(r + 1) * nk]
                        .iter()
                        .fold(f32::MIN, |a, &b| a.max(b))
                );
            }
        }
    }

    /// Both products against float64 sums on ragged sizes (every remainder of the 6-row tile,
    /// a partial last panel, a depth that is not a multiple of 8).
    #[test]
    fn the_tile_products_agree_with_float64() {
        if !available() {
            return;
        }
        let val = |i: usize| ((i * 7919 % 1009) as f32 / 1009.0 - 0.5) * 2.0;
        for (rows, nk, c0, kt, p) in [
            (1usize, 1usize, 0usize, 1usize, 1usize),
            (7, 40, 16, 19, 13),
            (128, 512, 256, 256, 64),
            (125, 300, 32, 250, 80),
            (11, 33, 0, 33, 16),
        ] {
            let q: Vec<f32> = (0..rows * p).map(val).collect();
            let k: Vec<f32> = (0..nk * p).map(|i| val(i + 5)).collect();
            let packed = pack_keys(&k, nk, p);
            let ld = kt.div_ceil(NR) * NR + 3;
            let mut s = vec![f32::NAN; rows * ld];
            let mut stats = LaneStats::new(rows);
            unsafe { scores(&q, rows, p, &packed, c0, kt, &mut s, ld, Some(&mut stats)) };
            for i in 0..rows {
                let w = kt.div_ceil(NR) * NR;
                let want = s[i * ld..i * ld + w]
                    .iter()
                    .fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                assert_eq!(stats.row(i), (want, false), "row max {rows}×{kt}×{p} [{i}]");
            }
            for i in 0..rows {
                for j in 0..kt.div_ceil(NR) * NR {
                    let want: f64 = if c0 + j < nk {
                        (0..p)
                            .map(|l| q[i * p + l] as f64 * k[(c0 + j) * p + l] as f64)
                            .sum()
                    } else {
                        0.0
                    };
                    let got = s[i * ld + j] as f64;
                    assert!(
                        (got - want).abs() <= 1e-6 * p as f64,
                        "S {rows}×{kt}×{p} [{i},{j}]"
                    );
                }
            }
            let pv = p.div_ceil(NR) * NR;
            let v: Vec<f32> = (0..nk * pv).map(|i| val(i + 11)).collect();
            let vp = pack_values(&v, nk, pv);
            let acc0: Vec<f32> = (0..rows * pv).map(|i| val(i + 3)).collect();
            let mut acc = acc0.clone();
            unsafe { accumulate_values(&s, ld, rows, &vp, nk, c0, kt, pv, &mut acc) };
            for i in 0..rows {
                for j in 0..pv {
                    let want = acc0[i * pv + j] as f64
                        + (0..kt)
                            .map(|l| s[i * ld + l] as f64 * v[(c0 + l) * pv + j] as f64)
                            .sum::<f64>();
                    let got = acc[i * pv + j] as f64;
                    assert!(
                        (got - want).abs() <= 1e-6 * (kt * p) as f64,
                        "acc {rows}×{kt}×{pv} [{i},{j}]: {got} vs {want}"
                    );
                }
            }
        }
    }
}
