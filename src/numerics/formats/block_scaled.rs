//! Block-scaled weight formats of hub checkpoints, decoded once on load (docs/reference.md §7.7.4,
//! §7.7.5): MXFP4 (OCP Microscaling: E2M1 elements, one E8M0 power-of-two scale per 32 values;
//! gpt-oss's experts) and FP8 E4M3 weights with one f32 `weight_scale_inv` per 128×128 block
//! (DeepSeek-V3). Every decoded value is exact in f64; the f32 result is one rounding of it.

use super::float::e4m3_from_bits;

/// Values per MXFP4 block (one E8M0 scale each).
pub const MXFP4_BLOCK: usize = 32;

/// The E2M1 values of the 16 codes: sign bit 3, exponent bits 2–1 (bias 1), mantissa bit 0.
const E2M1_VALUES: [f64; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// An element code's E2M1 value (the low 4 bits of `code`).
pub fn e2m1_value(code: u8) -> f64 {
    E2M1_VALUES[usize::from(code & 0x0f)]
}

/// An E8M0 scale's value 2^(code − 127); code 255 is NaN in the format: None.
pub fn e8m0_value(code: u8) -> Option<f64> {
    (code != 0xff).then(|| 2f64.powi(i32::from(code) - 127))
}

/// A scale code the format does not allow, at block `index` of the tensor.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("scale {index} is E8M0 code {code} (NaN)")]
pub struct BadScale {
    pub index: usize,
    pub code: u8,
}

/// MXFP4 blocks to values: `blocks` holds 16 bytes per block (value 2k in the low nibble of byte
/// k, value 2k+1 in the high one, as the gpt-oss checkpoints and transformers' decoder order
/// them), `scales` one E8M0 code per block. Returns 32 values per block, in f32 (a value of
/// 6·2^127 overflows to inf; callers check finiteness).
pub fn mxfp4_decode(blocks: &[u8], scales: &[u8]) -> Result<Vec<f32>, BadScale> {
    assert_eq!(
        blocks.len(),
        scales.len() * MXFP4_BLOCK / 2,
        "16 bytes of MXFP4 elements per scale"
    );
    let mut out = Vec::with_capacity(scales.len() * MXFP4_BLOCK);
    for (index, (bytes, &code)) in blocks.chunks_exact(MXFP4_BLOCK / 2).zip(scales).enumerate() {
        let scale = e8m0_value(code).ok_or(BadScale { index, code })?;
        for &b in bytes {
            out.push((e2m1_value(b) * scale) as f32);
            out.push((e2m1_value(b >> 4) * scale) as f32);
        }
    }
    Ok(out)
}

/// ggml's MXFP4 blocks (`block_mxfp4`, what llama.cpp's converter writes for gpt-oss's experts):
/// 17 bytes per block of 32 values, the E8M0 scale first, then 16 bytes whose byte j holds value j
/// in its low nibble and value j + 16 in its high one. The converter only reorders the
/// checkpoint's nibbles, so the values are [`mxfp4_decode`]'s, bit for bit. Two decisions where
/// ggml's reading differs from the format: its table has +0 for code 8 (E2M1's −0; a signed zero
/// changes no sum of products), and it reads scale 255 as 2^128 where OCP says NaN: refused, as on
/// the safetensors route.
pub fn mxfp4_decode_ggml(blocks: &[u8]) -> Result<Vec<f32>, BadScale> {
    const BYTES: usize = MXFP4_BLOCK / 2 + 1;
    assert_eq!(blocks.len() % BYTES, 0, "17 bytes per ggml MXFP4 block");
    let mut out = vec![0f32; blocks.len() / BYTES * MXFP4_BLOCK];
    for (index, (block, values)) in blocks
        .chunks_exact(BYTES)
        .zip(out.chunks_exact_mut(MXFP4_BLOCK))
        .enumerate()
    {
        let code = block[0];
        let scale = e8m0_value(code).ok_or(BadScale { index, code })?;
        let (low, high) = values.split_at_mut(MXFP4_BLOCK / 2);
        for (j, &b) in block[1..].iter().enumerate() {
            low[j] = (e2m1_value(b) * scale) as f32;
            high[j] = (e2m1_value(b >> 4) * scale) as f32;
        }
    }
    Ok(out)
}

/// A FP8 E4M3 matrix [rows, cols] (`codes`, row-major) times its block scales `scale_inv`
/// [⌈rows/block⌉, ⌈cols/block⌉] (row-major): w_ij = e4m3(code_ij)·scale_inv[i/block, j/block],
/// rounded once to f32 (the product of a 4-bit and a 24-bit significand is exact in f64). A NaN
/// code (0x7F, 0xFF) gives NaN; callers check finiteness.
pub fn fp8_block_dequantize(
    codes: &[u8],
    rows: usize,
    cols: usize,
    scale_inv: &[f32],
    block: usize,
) -> Vec<f32> {
    let block_cols = cols.div_ceil(block);
    assert_eq!(codes.len(), rows * cols, "one code per weight");
    assert_eq!(
        scale_inv.len(),
        rows.div_ceil(block) * block_cols,
        "one scale per block"
    );
    let mut out = Vec::with_capacity(rows * cols);
    for (i, row) in codes.chunks_exact(cols.max(1)).enumerate().take(rows) {
        let scales = &scale_inv[(i / block) * block_cols..][..block_cols];
        for (j, &c) in row.iter().enumerate() {
            out.push((e4m3_from_bits(c) * f64::from(scales[j / block])) as f32);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e2m1_and_e8m0_by_hand() {
        // 0b0110: exponent 11 (2^(3−1)), mantissa 0 → 4; 0b0001: subnormal 0.5; 0b1111: −6.
        assert_eq!(e2m1_value(0b0110), 4.0);
        assert_eq!(e2m1_value(0b0001), 0.5);
        assert_eq!(e2m1_value(0b0011), 1.5);
        assert_eq!(e2m1_value(0b1111), -6.0);
        assert!(e2m1_value(0b1000).is_sign_negative());
        assert_eq!(e8m0_value(127), Some(1.0));
        assert_eq!(e8m0_value(130), Some(8.0));
        assert_eq!(e8m0_value(0), Some(2f64.powi(-127)));
        assert_eq!(e8m0_value(254), Some(2f64.powi(127)));
        assert_eq!(e8m0_value(255), None);
    }

    #[test]
    fn mxfp4_blocks_by_hand() {
        // Block 0, scale 2^(125−127) = 1/4: byte 0x72 → low nibble 2 (1.0), high 7 (6.0).
        // Block 1, scale 2^3: byte 0x9B → low 0xB (−1.5), high 0x9 (−0.5).
        let mut blocks = vec![0u8; 32];
        blocks[0] = 0x72;
        blocks[15] = 0x0F;
        blocks[16] = 0x9B;
        let out = mxfp4_decode(&blocks, &[125, 130]).unwrap();
        assert_eq!(out.len(), 64);
        assert_eq!(&out[..2], &[0.25, 1.5]);
        assert_eq!(&out[30..32], &[-1.5, 0.0]);
        assert_eq!(&out[32..34], &[-12.0, -4.0]);
        assert!(out[2..30].iter().all(|&x| x == 0.0));
        assert_eq!(
            mxfp4_decode(&blocks, &[125, 255]),
            Err(BadScale {
                index: 1,
                code: 255
            })
        );
    }

    /// Values from a Python generator (transformers 5.24's `convert_moe_packed_tensors` on
    /// blocks bytes 0..=15 and 240..=255, scales 120 and 135, printed as f32).
    #[test]
    fn mxfp4_matches_transformers_decoder() {
        let blocks: Vec<u8> = (0u8..16).chain(240u8..=255).collect();
        let out = mxfp4_decode(&blocks, &[120, 135]).unwrap();
        let s0 = 2f32.powi(-7);
        let s1 = 2f32.powi(8);
        for k in 0..16 {
            assert_eq!(out[2 * k], e2m1_value(k as u8) as f32 * s0);
            assert_eq!(out[2 * k + 1], 0.0);
            assert_eq!(out[32 + 2 * k], e2m1_value(k as u8) as f32 * s1);
            assert_eq!(out[32 + 2 * k + 1], -6.0 * s1);
        }
        assert_eq!(
            &out[..8],
            &[0.0, 0.0, 0.00390625, 0.0, 0.0078125, 0.0, 0.01171875, 0.0]
        );
        assert_eq!(&out[46..50], &[1536.0, -1536.0, -0.0, -1536.0]);
    }

    #[test]
    fn ggml_mxfp4_blocks_by_hand() {
        // Block 0, scale 2^(125−127): byte 1 (first element byte) 0x72 → value 0 low nibble 2
        // (1.0 · 1/4), value 16 high nibble 7 (6.0 · 1/4). Block 1, scale 2^3: last byte 0x9B →
        // value 15 = −1.5 · 8, value 31 = −0.5 · 8.
        let mut blocks = vec![0u8; 34];
        blocks[0] = 125;
        blocks[1] = 0x72;
        blocks[17] = 130;
        blocks[33] = 0x9B;
        let out = mxfp4_decode_ggml(&blocks).unwrap();
        assert_eq!(out.len(), 64);
        assert_eq!((out[0], out[16]), (0.25, 1.5));
        assert_eq!((out[32 + 15], out[32 + 31]), (-12.0, -4.0));
        let others = (0..64).filter(|i| ![0, 16, 47, 63].contains(i));
        assert!(others.into_iter().all(|i| out[i] == 0.0));
        blocks[17] = 255;
        assert_eq!(
            mxfp4_decode_ggml(&blocks),
            Err(BadScale {
                index: 1,
                code: 255
            })
        );
    }

    /// llama.cpp's converter (`GptOssModel.transform_nibble_layout`) moves value 2k, 2k+1 of the
    /// checkpoint's byte k to the ggml layout, and puts the scale in front: every code of a
    /// seeded block set decodes to the checkpoint decoder's value, bit for bit.
    #[test]
    fn ggml_layout_decodes_to_the_checkpoint_values() {
        let mut state = 0x9e3779b97f4a7c15u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u8
        };
        let blocks: Vec<u8> = (0..16 * 5).map(|_| next()).collect();
        let scales: Vec<u8> = (0..5).map(|_| 110 + next() % 30).collect();
        let mut ggml = Vec::new();
        for (bytes, &scale) in blocks.chunks_exact(16).zip(&scales) {
            let code = |v: usize| (bytes[v / 2] >> (4 * (v % 2))) & 0x0f;
            ggml.push(scale);
            ggml.extend((0..16).map(|j| code(j) | (code(j + 16) << 4)));
        }
        let want = mxfp4_decode(&blocks, &scales).unwrap();
        let got = mxfp4_decode_ggml(&ggml).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want));
    }

    #[test]
    fn fp8_blocks_by_hand() {
        // 3×5 with 2×2 blocks: scales [[1, 2, 4], [0.5, 8, 16]].
        // Codes: 0x38 = 1.0 (exponent 0111, mantissa 0), 0x3C = 1.5, 0xC0 = −2, 0x01 = 2^−9.
        let codes = [
            0x38, 0x3C, 0x38, 0x38, 0xC0, //
            0x00, 0x38, 0x01, 0x38, 0x38, //
            0x38, 0x3C, 0x38, 0x7F, 0x38,
        ];
        let scales = [1.0, 2.0, 4.0, 0.5, 8.0, 16.0];
        let w = fp8_block_dequantize(&codes, 3, 5, &scales, 2);
        assert_eq!(&w[..5], &[1.0, 1.5, 2.0, 2.0, -8.0]);
        assert_eq!(&w[5..10], &[0.0, 1.0, 2f32.powi(-8), 2.0, 4.0]);
        assert_eq!(&w[10..12], &[0.5, 0.75]);
        assert_eq!(w[12], 8.0);
        assert!(w[13].is_nan());
        assert_eq!(w[14], 16.0);
    }
}
