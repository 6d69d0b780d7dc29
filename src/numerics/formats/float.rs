//! Rounding to the small float formats of docs/reference.md §8.2: IEEE binary16 (f16), bfloat16 and
//! E4M3 (`float8_e4m3fn`), each **one** round-to-nearest-even of the value as given.
//!
//! Why not the `half` crate: its `f16::from_f64` goes through f32 on some CPUs (a double
//! rounding, wrong on about 5e-5 of f64 values) and through a truncated-mantissa fallback on
//! others (§8.2 "One rounding"). ml_dtypes' float64 casts also round through f32 (checked by
//! `tests/reference/generate_format_fixtures.py`). So the rounding is written here once, for
//! all three formats, by power-of-two scaling (exact) and `round_ties_even`.

use std::fmt::Debug;
use std::ops::{Add, AddAssign, Div, DivAssign, Mul, MulAssign, Neg, Sub, SubAssign};

/// Largest finite f16 value.
pub const F16_MAX: f64 = 65504.0;
/// The smallest |x| that rounds to ±inf in f16: the tie between 65504 and 65536 (= 2¹⁶, whose
/// mantissa is even), so it rounds up and overflows.
pub const F16_OVERFLOW: f64 = 65520.0;
/// Largest finite bfloat16 value, (2 − 2⁻⁷)·2¹²⁷.
pub const BF16_MAX: f64 = 3.389_531_389_251_535_5e38;
/// Largest E4M3 value (`0x7E`: exponent 1111, mantissa 110; 1111/111 is NaN in the `fn` variant).
pub const E4M3_MAX: f64 = 448.0;

/// 2^k, exact, for k in the normal range of f64.
fn pow2(k: i32) -> f64 {
    debug_assert!((-1022..=1023).contains(&k));
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// Round a finite x to the nearest value with `mant_bits` fraction bits, ties to even, with the
/// exponent clamped below at `emin` (so that subnormals get the fixed step 2^(emin − mant_bits))
/// and unbounded above (the caller decides overflow). Exact apart from that one rounding:
/// x·2^−k and r·2^k are multiplications by powers of two (no rounding, also for f64
/// subnormal x), and |x·2^−k| < 2^(mant_bits+1) is an f64 value `round_ties_even` rounds exactly.
fn round_to_grid(x: f64, mant_bits: i32, emin: i32) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let biased = ((x.to_bits() >> 52) & 0x7ff) as i32;
    // floor(log2|x|) for a normal f64; an f64 subnormal is far below any emin used here.
    let e = if biased == 0 { -1023 } else { biased - 1023 };
    // k: the exponent of the ulp at x. The rounded r ≤ 2^(mant_bits+1); near f64's top r·2^k
    // overflows to inf, which every caller treats as out of range anyway.
    let k = e.max(emin) - mant_bits;
    round_ties_even_small(x * pow2(-k)) * pow2(k)
}

/// Round half to even of |y| < 2⁵¹, exactly: adding 2⁵² rounds |y| to an integer in the default
/// rounding mode (the ulp there is 1), and subtracting it back is exact. The same result as
/// `f64::round_ties_even` (a test checks), without its libm call on CPUs the baseline target
/// gives no rounding instruction (SSE4.1): the P quantizers of the SageAttention kernels round
/// every probability of a head through here.
#[inline(always)]
fn round_ties_even_small(y: f64) -> f64 {
    const TWO52: f64 = 4_503_599_627_370_496.0;
    ((y.abs() + TWO52) - TWO52).copysign(y)
}

/// One round-to-nearest-even of x to IEEE binary16, returned widened (exact). |x| ≥ 65520 gives
/// ±inf; NaN stays NaN; subnormals (step 2⁻²⁴) and signed zeros are kept.
pub fn round_f16(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let r = round_to_grid(x, 10, -14);
    if r.abs() > F16_MAX {
        f64::INFINITY.copysign(x)
    } else {
        r
    }
}

/// [`round_f16`] of an f32, in f32 bit arithmetic (branch-free, so that a slice of them
/// vectorises: the P quantizer of `sage1` rounds every probability of a head); equal to
/// `round_f16(x as f64) as f32` on every input (tests check, with the committed tables).
pub fn round_f16_f32(x: f32) -> f32 {
    let r = round_f32_to_grid(x, 10, -14);
    if r.abs() > F16_MAX as f32 {
        f32::INFINITY.copysign(x)
    } else {
        r
    }
}

/// One round-to-nearest-even of an f32 to `mant_bits` fraction bits with the exponent clamped
/// below at `emin`, in f32 bit arithmetic: at or above 2^emin, adding half an ulp of the target
/// (less one, plus the kept lowest bit: ties to even) to the bit pattern and clearing the dropped
/// bits rounds the mantissa, a carry moving into the exponent as it should; below 2^emin the fixed
/// step 2^(emin − mant_bits) is the ulp of c = 2^(emin − mant_bits + 23), so (|x| + c) − c rounds
/// to it exactly. NaN stays NaN; ±∞ stays; a result past f32's range is ±∞ (callers decide
/// overflow and saturation).
#[inline(always)]
fn round_f32_to_grid(x: f32, mant_bits: u32, emin: i32) -> f32 {
    let a = x.abs();
    let shift = 23 - mant_bits;
    let bits = a.to_bits();
    let lowest_kept = (bits >> shift) & 1;
    let normal =
        f32::from_bits((bits + ((1 << (shift - 1)) - 1) + lowest_kept) & !((1 << shift) - 1));
    let c = f32::from_bits(((emin - mant_bits as i32 + 23 + 127) as u32) << 23);
    let sub = (a + c) - c;
    let two_emin = f32::from_bits(((emin + 127) as u32) << 23);
    let r = if a < two_emin { sub } else { normal };
    if x.is_nan() {
        x
    } else {
        r.copysign(x)
    }
}

/// One round-to-nearest-even of x to bfloat16 (8 exponent bits, 7 fraction bits, f32's range
/// and subnormals), directly from f64. Overflow gives ±inf.
pub fn round_bf16(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let r = round_to_grid(x, 7, -126);
    if r.abs() > BF16_MAX {
        f64::INFINITY.copysign(x)
    } else {
        r
    }
}

/// [`round_bf16`] of an f32, in f32 bit arithmetic (as [`round_f16_f32`]).
pub fn round_bf16_f32(x: f32) -> f32 {
    round_f32_to_grid(x, 7, -126)
}

/// One round-to-nearest-even of x to E4M3 (`float8_e4m3fn`: bias 7, normals 2⁻⁶..448,
/// subnormals in steps of 2⁻⁹), **saturating**: a result above 448 in magnitude (x ≥ 464 rounds
/// to 480, which the format lacks; also ±inf) becomes ±448, as CUDA's `satfinite` does. NaN stays
/// NaN.
pub fn round_e4m3(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let r = round_to_grid(x, 3, -6);
    if r.abs() > E4M3_MAX {
        E4M3_MAX.copysign(x)
    } else {
        r
    }
}

/// [`round_e4m3`] of an f32, in f32 bit arithmetic (as [`round_f16_f32`]; `sage2_*` round
/// every probability of a head through here), saturating at ±448.
pub fn round_e4m3_f32(x: f32) -> f32 {
    let r = round_f32_to_grid(x, 3, -6);
    if r.abs() > E4M3_MAX as f32 {
        (E4M3_MAX as f32).copysign(x)
    } else {
        r
    }
}

/// Bit pattern of a value already on a format's grid (`r` finite, in range). `bias` and
/// `mant_bits` describe the format; subnormals have exponent field 0.
fn encode(r: f64, mant_bits: u32, bias: i32) -> u32 {
    let sign = u32::from(r.is_sign_negative()) << (mant_bits + exp_bits_for(bias));
    let a = r.abs();
    if a == 0.0 {
        return sign;
    }
    let e = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    let body = if e < 1 - bias {
        // subnormal: a = m·2^(1 − bias − mant_bits)
        (a * pow2(bias - 1 + mant_bits as i32)) as u32
    } else {
        let frac = ((a * pow2(-e) - 1.0) * pow2(mant_bits as i32)) as u32;
        (((e + bias) as u32) << mant_bits) | frac
    };
    sign | body
}

fn exp_bits_for(bias: i32) -> u32 {
    match bias {
        15 => 5,
        7 => 4,
        127 => 8,
        _ => unreachable!("no format with bias {bias}"),
    }
}

/// Value of a format's bit pattern that is not inf/NaN.
fn decode(bits: u32, mant_bits: u32, bias: i32) -> f64 {
    let ebits = exp_bits_for(bias);
    let neg = (bits >> (mant_bits + ebits)) & 1 == 1;
    let ef = ((bits >> mant_bits) & ((1 << ebits) - 1)) as i32;
    let m = (bits & ((1 << mant_bits) - 1)) as f64;
    let a = if ef == 0 {
        m * pow2(1 - bias - mant_bits as i32)
    } else {
        (m + pow2(mant_bits as i32)) * pow2(ef - bias - mant_bits as i32)
    };
    if neg {
        -a
    } else {
        a
    }
}

/// The binary16 bit pattern of [`round_f16`]`(x)` (NaN → 0x7E00, or 0xFE00 with the sign).
pub fn f16_bits(x: f64) -> u16 {
    let r = round_f16(x);
    let sign = if r.is_sign_negative() { 0x8000 } else { 0 };
    if r.is_nan() {
        sign | 0x7e00
    } else if r.is_infinite() {
        sign | 0x7c00
    } else {
        encode(r, 10, 15) as u16
    }
}

/// The value of a binary16 bit pattern, widened exactly.
pub fn f16_from_bits(b: u16) -> f64 {
    let neg = b & 0x8000 != 0;
    let v = if b & 0x7c00 == 0x7c00 {
        if b & 0x3ff == 0 {
            f64::INFINITY
        } else {
            f64::NAN
        }
    } else {
        decode(u32::from(b & 0x7fff), 10, 15)
    };
    if neg {
        -v
    } else {
        v
    }
}

/// The bfloat16 bit pattern of [`round_bf16`]`(x)`: the top half of the f32 (exact, since the
/// rounded value is an f32 with 16 zero low bits); NaN → quiet NaN.
pub fn bf16_bits(x: f64) -> u16 {
    let r = round_bf16(x) as f32;
    if r.is_nan() {
        return if r.is_sign_negative() { 0xffc0 } else { 0x7fc0 };
    }
    (r.to_bits() >> 16) as u16
}

/// The value of a bfloat16 bit pattern.
pub fn bf16_from_bits(b: u16) -> f64 {
    f32::from_bits(u32::from(b) << 16) as f64
}

/// The E4M3 bit pattern of [`round_e4m3`]`(x)` (NaN → 0x7F, or 0xFF with the sign).
pub fn e4m3_bits(x: f64) -> u8 {
    let r = round_e4m3(x);
    if r.is_nan() {
        return if r.is_sign_negative() { 0xff } else { 0x7f };
    }
    encode(r, 3, 7) as u8
}

/// The value of an E4M3 bit pattern; 0x7F and 0xFF are NaN (there is no inf).
pub fn e4m3_from_bits(b: u8) -> f64 {
    if b & 0x7f == 0x7f {
        return f64::NAN;
    }
    decode(u32::from(b), 3, 7)
}

/// The float type of a run (f32, or f64 under `--dtype f64`). The KIVI and SageAttention groups
/// compute in it, one `T` operation at a time, and the `round_*` methods round a value of the
/// run's dtype to f16/bf16/E4M3 once (§8.2 "One rounding"): an f64 is never rounded through f32.
pub trait RunFloat:
    Copy
    + PartialOrd
    + Debug
    + Default
    + Send
    + Sync
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
    + std::iter::Sum
{
    const ZERO: Self;
    const ONE: Self;
    /// Exact widening for f32; identity for f64.
    fn to_f64(self) -> f64;
    /// Round-to-nearest-even narrowing for f32; identity for f64.
    fn from_f64(x: f64) -> Self;
    fn abs(self) -> Self;
    fn is_finite(self) -> bool;
    /// Round half to even (`torch.round`, numpy `rint`).
    fn round_ties_even(self) -> Self;
    /// Round half away from zero (C `roundf`/`round`).
    fn round_half_away(self) -> Self;
    /// [`round_f16`] in this type (for f32 from f32, for f64 directly from f64).
    fn round_f16(self) -> Self;
    /// [`round_bf16`] in this type.
    fn round_bf16(self) -> Self;
    /// [`round_e4m3`] in this type (saturating).
    fn round_e4m3(self) -> Self;
}

macro_rules! run_float {
    ($t:ty, $f16:path, $bf16:path, $e4m3:path) => {
        impl RunFloat for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            fn is_finite(self) -> bool {
                <$t>::is_finite(self)
            }
            fn round_ties_even(self) -> Self {
                <$t>::round_ties_even(self)
            }
            fn round_half_away(self) -> Self {
                <$t>::round(self)
            }
            fn round_f16(self) -> Self {
                $f16(self)
            }
            fn round_bf16(self) -> Self {
                $bf16(self)
            }
            fn round_e4m3(self) -> Self {
                $e4m3(self)
            }
        }
    };
}

run_float!(f32, round_f16_f32, round_bf16_f32, round_e4m3_f32);
run_float!(f64, round_f16, round_bf16, round_e4m3);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_ties_even_rounding_is_round_ties_even() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Halves, quarters and random values across magnitudes below 2^12, both signs.
            let y = match i % 3 {
                0 => (x % 8192) as f64 / 2.0 - 2048.0,
                1 => (x % 32768) as f64 / 8.0 - 2048.0,
                _ => (f64::from_bits(0x3ff0_0000_0000_0000 | (x >> 12)) - 1.5) * 4096.0,
            };
            let (a, b) = (round_ties_even_small(y), y.round_ties_even());
            assert_eq!(a.to_bits(), b.to_bits(), "{y}");
        }
    }

    #[test]
    fn f16_closed_forms() {
        assert_eq!(round_f16(65504.0), 65504.0);
        assert_eq!(round_f16(65519.99), 65504.0);
        assert_eq!(round_f16(F16_OVERFLOW), f64::INFINITY); // tie 65504 | 65536: even is 2^16
        assert_eq!(round_f16(-65520.0), f64::NEG_INFINITY);
        assert_eq!(round_f16(F16_OVERFLOW.next_down()), 65504.0);
        assert_eq!(round_f16(2f64.powi(-24)), 2f64.powi(-24));
        assert_eq!(f16_bits(2f64.powi(-24)), 0x0001);
        assert_eq!(round_f16(2f64.powi(-25)), 0.0); // tie 0 | 2^-24: even is 0
        assert_eq!(round_f16(2f64.powi(-25).next_up()), 2f64.powi(-24));
        assert_eq!(round_f16(3.0 * 2f64.powi(-25)), 2f64.powi(-23)); // tie 1 | 2 ulps
        assert_eq!(f16_bits(-1e-30), 0x8000);
        assert!(round_f16(-1e-30).is_sign_negative() && round_f16(-0.0).is_sign_negative());
        assert!(round_f16(f64::NAN).is_nan() && f16_bits(f64::NAN) & 0x7c00 == 0x7c00);
        assert_eq!(
            (f16_bits(1.0), f16_bits(65504.0), f16_bits(-2.0)),
            (0x3c00, 0x7bff, 0xc000)
        );
        // the double-rounding trap: just above the midpoint 1 + 2^-11 by less than f32's half-ulp
        let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(round_f16(x), 1.0 + 2f64.powi(-10));
        assert_eq!(round_f16_f32(x as f32), 1.0); // through f32: the tie, to even
        assert_eq!(<f64 as RunFloat>::round_f16(x), 1.0 + 2f64.powi(-10));
    }

    #[test]
    fn bf16_closed_forms() {
        assert_eq!(round_bf16(1.0 + 2f64.powi(-8)), 1.0);
        assert_eq!(round_bf16(1.0 + 3.0 * 2f64.powi(-8)), 1.0 + 2f64.powi(-6));
        assert_eq!(
            round_bf16(1.0 + 2f64.powi(-8) + 2f64.powi(-40)),
            1.0 + 2f64.powi(-7)
        );
        assert_eq!(round_bf16(BF16_MAX), BF16_MAX);
        assert_eq!(round_bf16(f32::MAX as f64), f64::INFINITY);
        assert_eq!(round_bf16_f32(-f32::MAX), f32::NEG_INFINITY);
        assert_eq!(round_bf16(2f64.powi(-133)), 2f64.powi(-133));
        assert_eq!(round_bf16(2f64.powi(-134)), 0.0);
        assert_eq!((bf16_bits(1.0), bf16_bits(BF16_MAX)), (0x3f80, 0x7f7f));
    }

    #[test]
    fn e4m3_closed_forms() {
        assert_eq!(round_e4m3(448.0), 448.0);
        for (x, want) in [
            (449.0, 448.0),
            (464.0, 448.0),
            (465.0, 448.0),
            (1e6, 448.0),
            (f64::INFINITY, 448.0),
        ] {
            assert_eq!(round_e4m3(x), want, "{x}");
            assert_eq!(round_e4m3(-x), -want, "{x}");
        }
        assert_eq!(round_e4m3(2f64.powi(-9)), 2f64.powi(-9));
        assert_eq!(round_e4m3(2f64.powi(-10)), 0.0); // tie 0 | 2^-9
        assert_eq!(round_e4m3(2f64.powi(-10).next_up()), 2f64.powi(-9));
        assert_eq!(round_e4m3(3.0 * 2f64.powi(-10)), 2f64.powi(-8)); // tie code 1 | code 2
        assert_eq!(round_e4m3(2f64.powi(-6)), 2f64.powi(-6));
        assert!(round_e4m3(-1e-9).is_sign_negative());
        assert!(round_e4m3(f64::NAN).is_nan() && round_e4m3_f32(f32::NAN).is_nan());
        assert_eq!(
            (e4m3_bits(448.0), e4m3_bits(-448.0), e4m3_bits(1.0)),
            (0x7e, 0xfe, 0x38)
        );
        assert_eq!(round_e4m3_f32(-1e6), -448.0);
        assert_eq!(<f32 as RunFloat>::round_e4m3(300.0), 288.0);
    }
}
