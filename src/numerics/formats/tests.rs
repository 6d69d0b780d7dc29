//! Checks of the §8.2 formats against independent implementations: the committed fixtures of
//! `tests/reference/generate_format_fixtures.py` (numpy, ml_dtypes, PyTorch, gguf-py and an exact
//! rational table search), a brute-force nearest-value search over every f16/bf16/E4M3 value
//! (a different algorithm from the scale-and-`round_ties_even` of `float.rs`), and closed forms.

use super::*;

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/fixtures/formats/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e} (run generate_format_fixtures.py)"))
}

/// Records of (x, expected code) with x an f32 or f64 and the code a u8 or u16.
fn records(name: &str, x_bytes: usize, code_bytes: usize) -> Vec<(f64, u32)> {
    let raw = fixture(name);
    let rec = x_bytes + code_bytes;
    assert!(
        !raw.is_empty() && raw.len().is_multiple_of(rec),
        "{name}: {} bytes",
        raw.len()
    );
    raw.chunks_exact(rec)
        .map(|r| {
            let x = if x_bytes == 8 {
                f64::from_le_bytes(r[..8].try_into().unwrap())
            } else {
                f32::from_le_bytes(r[..4].try_into().unwrap()) as f64
            };
            let code = r[x_bytes..]
                .iter()
                .rev()
                .fold(0u32, |c, &b| (c << 8) | u32::from(b));
            (x, code)
        })
        .collect()
}

/// Same value, same bits (signed zeros distinguished); any NaN matches any NaN.
fn same(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// One format's codes: pattern of a rounded value, value of a pattern, whether a pattern is NaN.
struct Fmt {
    bits: fn(f64) -> u32,
    value: fn(u32) -> f64,
    nan: fn(u32) -> bool,
}

const F16: Fmt = Fmt {
    bits: |x| u32::from(f16_bits(x)),
    value: |c| f16_from_bits(c as u16),
    nan: |c| c & 0x7c00 == 0x7c00 && c & 0x3ff != 0,
};
const BF16: Fmt = Fmt {
    bits: |x| u32::from(bf16_bits(x)),
    value: |c| bf16_from_bits(c as u16),
    nan: |c| c & 0x7f80 == 0x7f80 && c & 0x7f != 0,
};
const E4M3: Fmt = Fmt {
    bits: |x| u32::from(e4m3_bits(x)),
    value: |c| e4m3_from_bits(c as u8),
    nan: |c| c & 0x7f == 0x7f,
};

/// Checks one fixture file: the bits, the widened value, and the rounding of the input's own
/// type (`round32` for the f32 files, `round64` for the f64 files).
fn check_fixture(
    name: &str,
    x_bytes: usize,
    code_bytes: usize,
    f: &Fmt,
    round64: fn(f64) -> f64,
    round32: fn(f32) -> f32,
) {
    let recs = records(name, x_bytes, code_bytes);
    let mut bad = Vec::new();
    for &(x, code) in &recs {
        let want = (f.value)(code);
        let got = if x_bytes == 8 {
            round64(x)
        } else {
            round32(x as f32) as f64
        };
        let ok = if (f.nan)(code) {
            got.is_nan() && (f.nan)((f.bits)(x))
        } else {
            (f.bits)(x) == code && same(got, want)
        };
        if !ok {
            bad.push(format!(
                "x = {x:e}: want {code:#x} = {want:e}, got {:#x} = {got:e}",
                (f.bits)(x)
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{name}: {} of {} differ, e.g. {:?}",
        bad.len(),
        recs.len(),
        &bad[..bad.len().min(5)]
    );
}

#[test]
fn f16_agrees_with_numpy_fixtures() {
    // the RunFloat methods on one file, the free functions on the other
    check_fixture(
        "f16_f64.bin",
        8,
        2,
        &F16,
        <f64 as RunFloat>::round_f16,
        <f32 as RunFloat>::round_f16,
    );
    check_fixture("f16_f32.bin", 4, 2, &F16, round_f16, round_f16_f32);
}

#[test]
fn bf16_agrees_with_ml_dtypes_and_exact_fixtures() {
    check_fixture(
        "bf16_f64.bin",
        8,
        2,
        &BF16,
        <f64 as RunFloat>::round_bf16,
        <f32 as RunFloat>::round_bf16,
    );
    check_fixture("bf16_f32.bin", 4, 2, &BF16, round_bf16, round_bf16_f32);
}

#[test]
fn e4m3_agrees_with_torch_and_exact_fixtures() {
    check_fixture(
        "e4m3_f64.bin",
        8,
        1,
        &E4M3,
        <f64 as RunFloat>::round_e4m3,
        <f32 as RunFloat>::round_e4m3,
    );
    check_fixture("e4m3_f32.bin", 4, 1, &E4M3, round_e4m3, round_e4m3_f32);
}

#[test]
fn ggml_blocks_agree_with_gguf_py_bit_for_bit() {
    let input = fixture("ggml_input.bin");
    let blocks: Vec<Vec<f32>> = input
        .chunks_exact(128)
        .map(|b| {
            b.chunks_exact(4)
                .map(|v| f32::from_le_bytes(v.try_into().unwrap()))
                .collect()
        })
        .collect();
    assert!(blocks.len() >= 300);
    for ty in GgmlType::ALL {
        let ts = ty.type_size();
        let raw = fixture(&format!("ggml_{}.bin", ty.name()));
        assert_eq!(raw.len(), blocks.len() * (ts + 128), "{}", ty.name());
        let (mut refused, mut ties, mut signed_zero) = (0, 0, 0);
        for (i, (x, rec)) in blocks.iter().zip(raw.chunks_exact(ts + 128)).enumerate() {
            let (bytes, deq) = rec.split_at(ts);
            let want = GgmlBlock::from_bytes(ty, bytes);
            let inf = |h: u16| h & 0x7fff == 0x7c00;
            let got = ggml_quantize_block(ty, x);
            if inf(want.d) || want.m.is_some_and(inf) {
                let e = got.expect_err("gguf-py's f16 scale/offset overflowed; we must refuse");
                assert!(e.what == "scale" || e.what == "offset");
                refused += 1;
                continue;
            }
            let got = got.unwrap_or_else(|e| panic!("{} block {i}: {e}", ty.name()));
            let got_deq = ggml_dequantize_block(ty, &got);
            let want_deq: Vec<f32> = deq
                .chunks_exact(4)
                .map(|v| f32::from_le_bytes(v.try_into().unwrap()))
                .collect();
            if x.iter().all(|&v| v == 0.0) && got != want {
                // Blocks of ±0 only: llama.cpp's C takes x_max = +0 (its initial value) and the
                // first strict minimum; gguf-py takes numpy's argmax/min, which may pick −0. The
                // stored d or m then differ only in the sign of a zero, and so may x̂ (we follow
                // the C; `signed_zero_blocks_follow_llama_cpp` in ggml.rs pins it down).
                let unsign = |h: u16| if h & 0x7fff == 0 { 0 } else { h };
                assert_eq!(
                    (unsign(got.d), got.m.map(unsign), got.q),
                    (unsign(want.d), want.m.map(unsign), want.q)
                );
                assert!(
                    got_deq.iter().zip(&want_deq).all(|(g, w)| g == w),
                    "{} block {i}",
                    ty.name()
                );
                signed_zero += 1;
                continue;
            }
            assert_eq!(got, want, "{} block {i}: scale/offset/codes", ty.name());
            assert_eq!(got.to_bytes(ty), bytes, "{} block {i}: layout", ty.name());
            for (j, (g, w)) in got_deq.iter().zip(&want_deq).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{} block {i} value {j}: {g} vs {w}",
                    ty.name()
                );
            }
            // count exact .5 ties the fixtures exercise (x·id + bias an integer + 0.5 or .5 for Q8_0)
            ties += x.iter().filter(|&&v| v.fract().abs() == 0.5).count();
        }
        assert!(
            refused >= 1,
            "{}: the fixtures include an overflowing scale",
            ty.name()
        );
        assert!(ties > 50, "{}: the fixtures include .5 ties", ty.name());
        assert!(
            signed_zero <= 3,
            "{}: {signed_zero} all-zero blocks differ in a zero's sign",
            ty.name()
        );
    }
}

// ------------------------------------------------------------------ brute force over all values

/// Every finite non-negative value of a format, ascending, with its code.
fn table(codes: std::ops::Range<u32>, decode: impl Fn(u32) -> f64) -> Vec<(f64, u32)> {
    let mut t: Vec<(f64, u32)> = codes
        .map(|c| (decode(c), c))
        .filter(|(v, _)| v.is_finite())
        .collect();
    t.sort_by(|a, b| a.0.total_cmp(&b.0));
    t
}

/// Nearest table value by bisection; the midpoint of two adjacent values is exact in f64 (they
/// have ≤ 11 significant bits), so comparing x with it decides exactly; ties to the even code.
/// (Adjacent codes alternate in parity, so `lo`'s parity decides.) `over` is the virtual value
/// above the top and `overflow` the result when it wins.
fn nearest(t: &[(f64, u32)], over: f64, overflow: f64, x: f64) -> f64 {
    let a = x.abs();
    let i = t.partition_point(|&(v, _)| v <= a) - 1;
    let (lo, lc) = t[i];
    let hi = t.get(i + 1).map_or(over, |p| p.0);
    let mid = (lo + hi) / 2.0;
    let r = if a == lo || a < mid || (a == mid && lc % 2 == 0) {
        lo
    } else if hi == over {
        overflow
    } else {
        hi
    };
    r.copysign(x)
}

struct SplitMix(u64);
impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Random f64 with a random exponent in [lo, hi) and a full 52-bit mantissa.
    fn f64_in(&mut self, lo: i32, hi: i32) -> f64 {
        let e = lo + (self.next() % (hi - lo) as u64) as i32;
        let m = f64::from_bits((1023u64 << 52) | (self.next() >> 12));
        let s = if self.next() & 1 == 1 { -1.0 } else { 1.0 };
        s * m * 2f64.powi(e)
    }
}

fn brute_force(
    name: &str,
    t: &[(f64, u32)],
    over: f64,
    overflow: f64,
    round: fn(f64) -> f64,
    exp: (i32, i32),
) {
    let reference = |x: f64| nearest(t, over, overflow, x);
    let mut inputs: Vec<f64> = Vec::new();
    let mut vals: Vec<f64> = t.iter().map(|p| p.0).collect();
    vals.push(over);
    for w in vals.windows(2) {
        let m = (w[0] + w[1]) / 2.0;
        inputs.extend([w[0], m, m.next_up(), m.next_down()]);
    }
    let mut rng = SplitMix(0x5eed_f0f0 ^ t.len() as u64);
    inputs.extend((0..200_000).map(|_| rng.f64_in(exp.0, exp.1)));
    inputs.extend([0.0, 5e-324, 1e-300, f64::MAX, f64::INFINITY]);
    let mut bad = 0;
    for &x in &inputs {
        for x in [x, -x] {
            let (got, want) = (round(x), reference(x));
            if !same(got, want) {
                bad += 1;
                eprintln!("{name}({x:e}) = {got:e}, want {want:e}");
            }
        }
    }
    assert_eq!(bad, 0, "{name}: {bad} of {} differ", 2 * inputs.len());
}

#[test]
fn f16_brute_force_over_all_values_midpoints_and_neighbours() {
    let t = table(0..0x7c00, |c| f16_from_bits(c as u16));
    assert_eq!(t.len(), 0x7c00);
    for &(v, c) in &t {
        assert_eq!(f16_bits(v), c as u16);
        assert_eq!(f16_bits(-v), c as u16 | 0x8000);
    }
    brute_force(
        "round_f16",
        &t,
        65536.0,
        f64::INFINITY,
        round_f16,
        (-30, 18),
    );
}

#[test]
fn bf16_brute_force_over_all_values_midpoints_and_neighbours() {
    let t = table(0..0x7f80, |c| bf16_from_bits(c as u16));
    for &(v, c) in &t {
        assert_eq!(bf16_bits(v), c as u16);
    }
    brute_force(
        "round_bf16",
        &t,
        2f64.powi(128),
        f64::INFINITY,
        round_bf16,
        (-140, 129),
    );
}

#[test]
fn e4m3_brute_force_over_all_values_midpoints_and_neighbours() {
    let t = table(0..0x7f, |c| e4m3_from_bits(c as u8));
    assert_eq!(t.len(), 127);
    for c in 0..=255u8 {
        let v = e4m3_from_bits(c);
        assert_eq!(v.is_nan(), c & 0x7f == 0x7f);
        if !v.is_nan() {
            assert_eq!(e4m3_bits(v), c, "code {c:#x}");
            assert!(same(round_e4m3(v), v));
        }
    }
    // 480 would be code 0x7F (odd), so the tie at 464 goes down; beyond: saturate to 448.
    brute_force("round_e4m3", &t, 480.0, E4M3_MAX, round_e4m3, (-13, 11));
}

#[test]
fn f32_paths_equal_the_exact_widening() {
    let mut rng = SplitMix(7);
    for _ in 0..300_000 {
        let x = f32::from_bits(rng.next() as u32);
        for (a, b) in [
            (round_f16_f32(x), round_f16(x as f64)),
            (round_bf16_f32(x), round_bf16(x as f64)),
            (round_e4m3_f32(x), round_e4m3(x as f64)),
            (RunFloat::round_f16(x), round_f16(x as f64)),
            (RunFloat::round_bf16(x), round_bf16(x as f64)),
            (RunFloat::round_e4m3(x), round_e4m3(x as f64)),
        ] {
            assert!(same(a as f64, b), "{x:e}: {a:e} vs {b:e}");
        }
    }
}

/// The f32 bit-arithmetic roundings against the f64 ones (verified above by brute force) where
/// they can differ: at and around every midpoint of each format's grid (and the overflow and
/// saturation edges), on a stride through every f32 bit pattern, and on both signs.
#[test]
fn f32_bit_roundings_equal_the_f64_ones_around_every_midpoint() {
    let check = |x: f32| {
        for y in [x, -x] {
            for (a, b) in [
                (round_f16_f32(y), round_f16(y as f64)),
                (round_bf16_f32(y), round_bf16(y as f64)),
                (round_e4m3_f32(y), round_e4m3(y as f64)),
            ] {
                assert!(same(a as f64, b), "{y:e}: {a:e} vs {b:e}");
            }
        }
    };
    let around = |m: f64| {
        let c = m as f32;
        let mut x = c;
        for _ in 0..3 {
            x = f32::from_bits(x.to_bits().saturating_sub(1));
        }
        for _ in 0..7 {
            check(x);
            x = f32::from_bits(x.to_bits() + 1);
        }
    };
    // f16: every pair of neighbours; E4M3: every code; bf16: every pattern with the low byte of
    // its f32 exponent range sampled (its midpoints are f32 values exactly).
    let f16s: Vec<f64> = (0u16..0x7c00).map(f16_from_bits).collect();
    let e4m3s: Vec<f64> = (0u8..0x7f).map(e4m3_from_bits).collect();
    for grid in [&f16s, &e4m3s] {
        for w in grid.windows(2) {
            around(w[0]);
            around(0.5 * (w[0] + w[1]));
        }
    }
    for b in (0u16..0x7f80).step_by(7) {
        let (lo, hi) = (bf16_from_bits(b), bf16_from_bits(b + 1));
        around(0.5 * (lo + hi));
    }
    for m in [65504.0, 65520.0, 65536.0, 448.0, 464.0, 480.0, 3.4e38] {
        around(m);
    }
    for bits in (0u32..=u32::MAX).step_by(4099) {
        check(f32::from_bits(bits));
    }
}
