//! The microkernels of every path this CPU runs, each named explicitly (not through `AB_SIMD`):
//! on an AVX-512 machine both AVX2 and AVX-512 are tested.

use super::*;

/// The microkernel paths this CPU runs (AVX2 and AVX-512 where it has them).
fn tile_paths() -> Vec<Simd> {
    Simd::runnable()
        .into_iter()
        .filter(|&s| s >= Simd::Avx2)
        .collect()
}

/// The fused exponential against float64's: 2e-7 relative wherever the result is a normal f32
/// (the fit's 1.6e-7 with its f32 roundings, simulated over the whole range by
/// scripts/fit-exp-poly.py, plus margin), 0 below, and the f64 sum of what it wrote. Lengths
/// 20 015 (an 8-vector after the 16s, then 7 scalars) and 20 006 (no 8-vector).
#[test]
fn the_fused_exponential_agrees_with_float64() {
    for simd in tile_paths() {
        for extra in [0, 9] {
            let mut row: Vec<f32> = (0..20_011 - extra)
                .map(|i| -100.0 + 100.0 * i as f32 / 20_000.0)
                .chain([f32::NEG_INFINITY, -87.3, 0.0, 2.5])
                .collect();
            let m = 2.5;
            let orig = row.clone();
            let sum = unsafe { exp_shifted(simd, &mut row, m) };
            for (&x, &e) in orig.iter().zip(&row) {
                let want = ((x - m) as f64).exp();
                if want < f32::MIN_POSITIVE as f64 {
                    assert!(
                        e == 0.0 || (e as f64 - want).abs() <= 1e-38,
                        "{simd:?} {x}: {e}"
                    );
                } else {
                    let err = (e as f64 - want).abs();
                    assert!(err <= 2e-7 * want, "{simd:?} {x}: {e} vs {want}");
                }
            }
            // The sum of what it wrote, up to the f32 rounding of each pair of vectors (2⁻²⁴).
            let direct: f64 = row.iter().map(|&e| e as f64).sum();
            assert!(
                (sum - direct).abs() <= 6e-8 * direct,
                "{simd:?} {sum} vs {direct}"
            );
        }
    }
}

/// Every path's exponential and sum give AVX2's bits, on every length 0..40 (each remainder of
/// the 16- and 8-wide steps) and a long row.
#[test]
fn the_exponential_has_the_same_bits_on_every_path() {
    let paths = tile_paths();
    for len in (0..40).chain([1000, 4099]) {
        let row: Vec<f32> = (0..len).map(|i| -((i * 37 % 101) as f32) * 0.7).collect();
        let runs: Vec<(Vec<f32>, f64)> = paths
            .iter()
            .map(|&simd| {
                let mut r = row.clone();
                let sum = unsafe { exp_shifted(simd, &mut r, 0.0) };
                (r, sum)
            })
            .collect();
        for (simd, (r, sum)) in paths.iter().zip(&runs) {
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(r), bits(&runs[0].0), "{simd:?} len {len}");
            assert_eq!(sum.to_bits(), runs[0].1.to_bits(), "{simd:?} len {len}");
        }
    }
}

/// A NaN or +∞ score poisons exactly its row's statistics, on every path.
#[test]
fn the_row_statistics_flag_nan_and_infinity() {
    for simd in tile_paths() {
        for nk in [48, 64] {
            let (rows, p) = (9, 4);
            let mut q = vec![0.25f32; rows * p];
            q[3 * p] = f32::NAN; // row 3: every score NaN
            q[5 * p] = f32::MAX; // row 5: overflows to +∞ against positive keys
            let k: Vec<f32> = (0..nk * p).map(|i| 1.0 + (i % 5) as f32).collect();
            let packed = pack_keys(&k, nk, p);
            let mut s = vec![0.0; rows * nk];
            let mut stats = LaneStats::new(rows);
            unsafe {
                scores(
                    simd,
                    &q,
                    rows,
                    p,
                    &packed,
                    0,
                    nk,
                    &mut s,
                    nk,
                    Some(&mut stats),
                )
            };
            for r in 0..rows {
                let (m, bad) = stats.row(r);
                assert_eq!(bad, r == 3 || r == 5, "{simd:?} nk {nk} row {r}");
                if !bad {
                    let want = s[r * nk..(r + 1) * nk]
                        .iter()
                        .fold(f32::MIN, |a, &b| a.max(b));
                    assert_eq!(m, want, "{simd:?} nk {nk} row {r}");
                }
            }
        }
    }
}

/// Both products against float64 sums on ragged sizes (every remainder of the 6- and 8-row
/// tiles, an odd and an even number of panels, a partial last panel, a depth that is not a
/// multiple of 8), and every path's bits equal to the first's.
#[test]
fn the_tile_products_agree_with_float64() {
    let val = |i: usize| ((i * 7919 % 1009) as f32 / 1009.0 - 0.5) * 2.0;
    for (rows, nk, c0, kt, p) in [
        (1usize, 1usize, 0usize, 1usize, 1usize),
        (7, 40, 16, 19, 13),
        (128, 512, 256, 256, 64),
        (125, 300, 32, 250, 80),
        (11, 33, 0, 33, 16),
        (15, 64, 0, 48, 48),
    ] {
        let mut first: Option<(Vec<f32>, Vec<f32>)> = None;
        for simd in tile_paths() {
            let q: Vec<f32> = (0..rows * p).map(val).collect();
            let k: Vec<f32> = (0..nk * p).map(|i| val(i + 5)).collect();
            let packed = pack_keys(&k, nk, p);
            let ld = kt.div_ceil(NR) * NR + 3;
            let mut s = vec![f32::NAN; rows * ld];
            let mut stats = LaneStats::new(rows);
            let st = Some(&mut stats);
            unsafe { scores(simd, &q, rows, p, &packed, c0, kt, &mut s, ld, st) };
            check_scores(simd, &q, &k, &s, &stats, (rows, nk, c0, kt, p, ld));
            let pv = p.div_ceil(NR) * NR;
            let v: Vec<f32> = (0..nk * pv).map(|i| val(i + 11)).collect();
            let vp = pack_values(&v, nk, pv);
            let acc0: Vec<f32> = (0..rows * pv).map(|i| val(i + 3)).collect();
            let mut acc = acc0.clone();
            unsafe { accumulate_values(simd, &s, ld, rows, &vp, nk, c0, kt, pv, &mut acc) };
            for i in 0..rows {
                for j in 0..pv {
                    let want = acc0[i * pv + j] as f64
                        + (0..kt)
                            .map(|l| s[i * ld + l] as f64 * v[(c0 + l) * pv + j] as f64)
                            .sum::<f64>();
                    let got = acc[i * pv + j] as f64;
                    assert!(
                        (got - want).abs() <= 1e-6 * (kt * p) as f64,
                        "{simd:?} acc {rows}×{kt}×{pv} [{i},{j}]: {got} vs {want}"
                    );
                }
            }
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            match &first {
                None => first = Some((s, acc)),
                Some((s0, acc0)) => {
                    assert_eq!(bits(&s), bits(s0), "{simd:?} S bits {rows}×{kt}×{p}");
                    assert_eq!(bits(&acc), bits(acc0), "{simd:?} acc bits {rows}×{kt}×{p}");
                }
            }
        }
    }
}

/// S against float64 and each row's fused maximum against S's.
fn check_scores(
    simd: Simd,
    q: &[f32],
    k: &[f32],
    s: &[f32],
    stats: &LaneStats,
    (rows, nk, c0, kt, p, ld): (usize, usize, usize, usize, usize, usize),
) {
    let w = kt.div_ceil(NR) * NR;
    for i in 0..rows {
        let want = s[i * ld..i * ld + w]
            .iter()
            .fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        assert_eq!(
            stats.row(i),
            (want, false),
            "{simd:?} max {rows}×{kt}×{p} [{i}]"
        );
        for j in 0..w {
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
                "{simd:?} S {rows}×{kt}×{p} [{i},{j}]"
            );
        }
    }
}

/// `AB_SIMD`'s values: a lower path where asked, never above the CPU's best, `AB_NO_TILES` as
/// `portable`, and a typo an error.
#[test]
fn a_request_never_exceeds_the_cpu() {
    let best = Simd::best();
    assert_eq!(Simd::for_request(None, false), Ok(best));
    assert_eq!(Simd::for_request(Some("auto"), false), Ok(best));
    assert_eq!(Simd::for_request(None, true), Ok(Simd::Portable));
    assert_eq!(
        Simd::for_request(Some("portable"), false),
        Ok(Simd::Portable)
    );
    assert_eq!(
        Simd::for_request(Some("AVX2"), false),
        Ok(best.min(Simd::Avx2))
    );
    assert_eq!(Simd::for_request(Some("avx512"), true), Ok(best));
    assert!(Simd::for_request(Some("avx-512"), false).is_err());
    assert_eq!(*Simd::runnable().last().unwrap(), best);
}
