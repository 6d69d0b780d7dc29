//! llama.cpp's legacy block types Q8_0, Q5_1, Q5_0, Q4_1, Q4_0 (docs/reference.md §8.2, table), bit for
//! bit as `quantize_row_*_ref` / `dequantize_row_*` in `ggml-quants.c` compute them; gguf-py's
//! `gguf/quants.py` is the same arithmetic in numpy and is the cross-check of the committed
//! fixtures (`tests/reference/generate_format_fixtures.py`).
//!
//! Everything is f32, whatever the run's dtype (§8.2 "Always in f32"): the caller rounds x to f32
//! first (the cache write does), then d, id and the codes are f32 operations in the C order. The
//! codes come from the *unrounded* f32 d (through id = 1/d); only the stored scale and offset are
//! rounded to f16, and dequantization uses those stored values widened to f32.

use super::float::{f16_bits, f16_from_bits, F16_OVERFLOW};
use super::FormatError;

/// Values per block (`QK8_0` = `QK5_1` = … = 32).
pub const GGML_BLOCK: usize = 32;

/// A llama.cpp block type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    Q8_0,
    Q5_1,
    Q5_0,
    Q4_1,
    Q4_0,
}

impl GgmlType {
    /// From most to fewest bits.
    pub const ALL: [GgmlType; 5] = [
        GgmlType::Q8_0,
        GgmlType::Q5_1,
        GgmlType::Q5_0,
        GgmlType::Q4_1,
        GgmlType::Q4_0,
    ];

    /// llama.cpp's name (`-ctk q4_0`).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q5_1 => "q5_1",
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q4_0 => "q4_0",
        }
    }

    /// Storage bits per value, scales included: `8 · type_size / 32`.
    pub fn bits_per_value(self) -> f64 {
        8.0 * self.type_size() as f64 / GGML_BLOCK as f64
    }

    /// Bytes of one stored block (`sizeof(block_q*)`): f16 d, [f16 m], [u32 qh], codes.
    pub fn type_size(self) -> usize {
        match self {
            GgmlType::Q8_0 => 2 + 32,
            GgmlType::Q5_1 => 2 + 2 + 4 + 16,
            GgmlType::Q5_0 => 2 + 4 + 16,
            GgmlType::Q4_1 => 2 + 2 + 16,
            GgmlType::Q4_0 => 2 + 16,
        }
    }

    /// Whether the block stores an offset m (the `_1` types).
    pub fn has_offset(self) -> bool {
        matches!(self, GgmlType::Q5_1 | GgmlType::Q4_1)
    }

    /// Largest code (codes of the `_0`/`_1` 4- and 5-bit types are unsigned).
    fn code_max(self) -> i32 {
        match self {
            GgmlType::Q8_0 => 127,
            GgmlType::Q5_1 | GgmlType::Q5_0 => 31,
            GgmlType::Q4_1 | GgmlType::Q4_0 => 15,
        }
    }
}

/// One block as stored. `d` and `m` are binary16 bit patterns (`m` only for Q5_1/Q4_1). `q` are
/// the codes as llama.cpp stores them: for Q8_0 the **signed** int8 value (−127..=127); for the
/// 4- and 5-bit types the **unsigned** code (0..=15 or 0..=31) before the `− 8`/`− 16` of Q4_0/Q5_0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlBlock {
    pub d: u16,
    pub m: Option<u16>,
    pub q: [i32; 32],
}

impl GgmlBlock {
    /// The block's bytes in llama.cpp's layout (little-endian): `d`, `m`, then for the 5-bit
    /// types `qh` (bit j = bit 4 of code j), then the codes: int8 for Q8_0, else nibbles with
    /// code j in the low and code j + 16 in the high half of byte j.
    pub fn to_bytes(&self, ty: GgmlType) -> Vec<u8> {
        let mut out = Vec::with_capacity(ty.type_size());
        out.extend_from_slice(&self.d.to_le_bytes());
        if let Some(m) = self.m {
            out.extend_from_slice(&m.to_le_bytes());
        }
        match ty {
            GgmlType::Q8_0 => out.extend(self.q.iter().map(|&q| q as i8 as u8)),
            _ => {
                if matches!(ty, GgmlType::Q5_0 | GgmlType::Q5_1) {
                    let qh = (0..32).fold(0u32, |h, j| h | (((self.q[j] as u32 >> 4) & 1) << j));
                    out.extend_from_slice(&qh.to_le_bytes());
                }
                out.extend(
                    (0..16).map(|j| ((self.q[j] & 0xf) | ((self.q[j + 16] & 0xf) << 4)) as u8),
                );
            }
        }
        out
    }

    /// Inverse of [`GgmlBlock::to_bytes`]; `bytes` must be `ty.type_size()` long.
    pub fn from_bytes(ty: GgmlType, bytes: &[u8]) -> GgmlBlock {
        assert_eq!(bytes.len(), ty.type_size(), "{} block size", ty.name());
        let u16_at = |i: usize| u16::from_le_bytes([bytes[i], bytes[i + 1]]);
        let d = u16_at(0);
        let (m, mut at) = if ty.has_offset() {
            (Some(u16_at(2)), 4)
        } else {
            (None, 2)
        };
        let mut q = [0i32; 32];
        if ty == GgmlType::Q8_0 {
            for (qj, &b) in q.iter_mut().zip(&bytes[at..]) {
                *qj = i32::from(b as i8);
            }
            return GgmlBlock { d, m, q };
        }
        let mut qh = 0u32;
        if matches!(ty, GgmlType::Q5_0 | GgmlType::Q5_1) {
            qh = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
            at += 4;
        }
        for j in 0..16 {
            let b = i32::from(bytes[at + j]);
            q[j] = (b & 0xf) | ((((qh >> j) & 1) as i32) << 4);
            q[j + 16] = (b >> 4) | ((((qh >> (j + 16)) & 1) as i32) << 4);
        }
        GgmlBlock { d, m, q }
    }
}

/// f16 storage of a scale or offset; overflow (|v| ≥ 65520) is the usage error of §8.2.
fn store_f16(what: &'static str, v: f32) -> Result<u16, FormatError> {
    if v.is_nan() || v.abs() as f64 >= F16_OVERFLOW {
        return Err(FormatError {
            what,
            value: v as f64,
        });
    }
    Ok(f16_bits(v as f64))
}

/// C's `(int8_t)` of a float followed by `MIN(code_max, ·)`. With a finite id the argument is
/// positive (about 0.5 at least: x·id ≥ −8 or −16 up to an ulp) and truncates to at most
/// code_max + 1 (16.5 → 16 for Q4_0), which the MIN clips; for Q8_0 it is within ±127 up to an
/// ulp. When d is an f32 subnormal, id = 1/d overflows to inf and C's cast is undefined; we
/// saturate into the code range. Such a block's f16(d) is 0, so x̂ = ±0 whatever the code.
fn to_code(v: f32, lo: i32, hi: i32) -> i32 {
    (v as i32).clamp(lo, hi)
}

/// Quantize one block of 32 f32 values exactly as `quantize_row_*_ref` does. Errors: a
/// non-finite input (`"value"`), an f16 scale or offset that overflows (`"scale"`, `"offset"`).
pub fn ggml_quantize_block(ty: GgmlType, x: &[f32]) -> Result<GgmlBlock, FormatError> {
    assert_eq!(x.len(), GGML_BLOCK, "a {} block holds 32 values", ty.name());
    if let Some(&v) = x.iter().find(|v| !v.is_finite()) {
        return Err(FormatError {
            what: "value",
            value: v as f64,
        });
    }
    let mut q = [0i32; 32];
    let inv = |d: f32| if d != 0.0 { 1.0 / d } else { 0.0 };
    match ty {
        GgmlType::Q8_0 => {
            // amax = MAX(amax, fabsf(v)); d = amax / ((1 << 7) − 1); codes roundf(x·id).
            let amax = x
                .iter()
                .fold(0.0f32, |a, &v| if a > v.abs() { a } else { v.abs() });
            let d = amax / 127.0;
            let id = inv(d);
            for (qj, &v) in q.iter_mut().zip(x) {
                // f32::round is roundf: half away from zero.
                *qj = to_code((v * id).round(), -127, 127);
            }
            Ok(GgmlBlock {
                d: store_f16("scale", d)?,
                m: None,
                q,
            })
        }
        GgmlType::Q5_0 | GgmlType::Q4_0 => {
            // x_max: the signed value of the first element of largest |x| (strict `<`).
            let (mut amax, mut max) = (0.0f32, 0.0f32);
            for &v in x {
                if amax < v.abs() {
                    amax = v.abs();
                    max = v;
                }
            }
            let (div, bias) = if ty == GgmlType::Q5_0 {
                (-16.0f32, 16.5f32)
            } else {
                (-8.0, 8.5)
            };
            let d = max / div;
            let id = inv(d);
            for (qj, &v) in q.iter_mut().zip(x) {
                *qj = to_code(v * id + bias, 0, ty.code_max());
            }
            Ok(GgmlBlock {
                d: store_f16("scale", d)?,
                m: None,
                q,
            })
        }
        GgmlType::Q5_1 | GgmlType::Q4_1 => {
            let (mut min, mut max) = (f32::MAX, -f32::MAX);
            for &v in x {
                if v < min {
                    min = v;
                }
                if v > max {
                    max = v;
                }
            }
            let d = (max - min) / ty.code_max() as f32;
            let id = inv(d);
            for (qj, &v) in q.iter_mut().zip(x) {
                *qj = to_code((v - min) * id + 0.5, 0, ty.code_max());
            }
            let d = store_f16("scale", d)?;
            let m = store_f16("offset", min)?;
            Ok(GgmlBlock { d, m: Some(m), q })
        }
    }
}

/// Dequantize one block as `dequantize_row_*` does, in f32: f16(d)·q, f16(d)·(q − 16 or 8), or
/// f16(d)·q + f16(m) (a product, then a sum: two f32 roundings, no fused multiply-add).
pub fn ggml_dequantize_block(ty: GgmlType, b: &GgmlBlock) -> [f32; 32] {
    let d = f16_from_bits(b.d) as f32;
    let m = b.m.map_or(0.0, |m| f16_from_bits(m) as f32);
    let mut out = [0.0f32; 32];
    for (o, &q) in out.iter_mut().zip(&b.q) {
        *o = match ty {
            GgmlType::Q8_0 => d * q as f32,
            GgmlType::Q5_0 => d * (q - 16) as f32,
            GgmlType::Q4_0 => d * (q - 8) as f32,
            GgmlType::Q5_1 | GgmlType::Q4_1 => d * q as f32 + m,
        };
    }
    out
}

/// Quantize and dequantize `x` in place, in blocks of 32 consecutive values (`x.len()` a
/// multiple of 32). On an error the blocks before the failing one have already been replaced.
pub fn ggml_roundtrip(ty: GgmlType, x: &mut [f32]) -> Result<(), FormatError> {
    assert!(
        x.len().is_multiple_of(GGML_BLOCK),
        "{}: length {} is not a multiple of 32",
        ty.name(),
        x.len()
    );
    for block in x.chunks_exact_mut(GGML_BLOCK) {
        let b = ggml_quantize_block(ty, block)?;
        block.copy_from_slice(&ggml_dequantize_block(ty, &b));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_bits() {
        let names: Vec<_> = GgmlType::ALL.iter().map(|t| t.name()).collect();
        assert_eq!(names, ["q8_0", "q5_1", "q5_0", "q4_1", "q4_0"]);
        let bits: Vec<_> = GgmlType::ALL.iter().map(|t| t.bits_per_value()).collect();
        assert_eq!(bits, [8.5, 6.0, 5.5, 5.0, 4.5]);
    }

    #[test]
    fn q8_0_rounds_half_away_from_zero() {
        // max|x| = 127: d = 1, id = 1, codes = roundf(x)
        let mut x = [0.0f32; 32];
        x[..7].copy_from_slice(&[127.0, 0.5, -0.5, 1.5, -2.5, 2.5, 0.49999997]);
        let b = ggml_quantize_block(GgmlType::Q8_0, &x).unwrap();
        assert_eq!(&b.q[..7], &[127, 1, -1, 2, -3, 3, 0]);
        assert_eq!(b.d, 0x3c00); // f16(1)
    }

    #[test]
    fn q4_0_and_q5_0_take_the_first_largest_magnitude() {
        let mut x = [0.0f32; 32];
        x[3] = 5.0;
        x[9] = -5.0;
        let b = ggml_quantize_block(GgmlType::Q4_0, &x).unwrap();
        assert_eq!(f16_from_bits(b.d), -0.625); // d = 5 / −8
        assert_eq!((b.q[3], b.q[9], b.q[0]), (0, 15, 8)); // −8.5+8.5 → 0; 8+8.5 → 16 → min 15
        x[3] = -5.0;
        x[9] = 5.0;
        let b = ggml_quantize_block(GgmlType::Q5_0, &x).unwrap();
        assert_eq!(f16_from_bits(b.d), 0.3125); // d = −5 / −16
        assert_eq!((b.q[3], b.q[9]), (0, 31)); // 16 + 16.5 → 32 → min 31
    }

    #[test]
    fn zero_scale_blocks() {
        for ty in GgmlType::ALL {
            let b = ggml_quantize_block(ty, &[0.0; 32]).unwrap();
            assert_eq!(ggml_dequantize_block(ty, &b), [0.0; 32], "{}", ty.name());
            // all equal: d = 0 for the `_1` types (x̂ = m = 1.5); Q4_0/Q5_0: d = 1.5/−8 or −16
            // (exact in f16), code 0, x̂ = d·(−8 or −16) = 1.5; Q8_0: every code 127
            let b = ggml_quantize_block(ty, &[1.5; 32]).unwrap();
            if ty == GgmlType::Q8_0 {
                assert_eq!(b.q, [127; 32]);
            } else {
                assert_eq!(ggml_dequantize_block(ty, &b), [1.5; 32], "{}", ty.name());
            }
        }
    }

    #[test]
    fn signed_zero_blocks_follow_llama_cpp() {
        // C: max starts at +0 and only a strictly larger |v| replaces it, so d = +0/−8 = −0.
        for v in [0.0f32, -0.0] {
            for ty in [GgmlType::Q4_0, GgmlType::Q5_0] {
                let b = ggml_quantize_block(ty, &[v; 32]).unwrap();
                assert_eq!(b.d, 0x8000, "{} of {v:?}", ty.name());
                assert!(ggml_dequantize_block(ty, &b)
                    .iter()
                    .all(|x| x.to_bits() == 0x8000_0000));
            }
        }
        // C: min starts at FLT_MAX and only a strictly smaller v replaces it: the first zero wins.
        let mut x = [0.0f32; 32];
        x[1] = -0.0;
        assert_eq!(
            ggml_quantize_block(GgmlType::Q4_1, &x).unwrap().m,
            Some(0x0000)
        );
        x[0] = -0.0;
        x[1] = 0.0;
        assert_eq!(
            ggml_quantize_block(GgmlType::Q5_1, &x).unwrap().m,
            Some(0x8000)
        );
    }

    #[test]
    fn f16_overflow_of_scale_or_offset_is_an_error() {
        let mut x = [0.0f32; 32];
        x[4] = 1e7; // Q8_0: d = 1e7/127 = 78740 ≥ 65520
        let e = ggml_quantize_block(GgmlType::Q8_0, &x).unwrap_err();
        assert_eq!(e.what, "scale");
        assert!((e.value - 1e7 / 127.0).abs() < 0.01);
        assert!(e.to_string().contains("scale"));
        x[4] = -65530.0; // offset m = min overflows; d = 65530/15 does not
        assert_eq!(
            ggml_quantize_block(GgmlType::Q4_1, &x).unwrap_err().what,
            "offset"
        );
        x[4] = f32::NAN;
        assert_eq!(
            ggml_quantize_block(GgmlType::Q4_0, &x).unwrap_err().what,
            "value"
        );
        let mut y = [1.0f32; 64];
        y[40] = 1e7;
        assert!(ggml_roundtrip(GgmlType::Q8_0, &mut y).is_err());
    }

    #[test]
    fn roundtrip_is_blockwise() {
        let x: Vec<f32> = (0..32 * 5)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.173)
            .collect();
        for ty in GgmlType::ALL {
            let mut y = x.clone();
            ggml_roundtrip(ty, &mut y).unwrap();
            for (xb, yb) in x.chunks(32).zip(y.chunks(32)) {
                let b = ggml_quantize_block(ty, xb).unwrap();
                assert_eq!(ggml_dequantize_block(ty, &b).as_slice(), yb);
                assert_eq!(GgmlBlock::from_bytes(ty, &b.to_bytes(ty)), b);
            }
            assert_ne!(x, y, "{} changes something", ty.name());
        }
    }
}
