//! The number formats of docs/reference.md §8.2, bit for bit: one round-to-nearest-even to f16, bf16 and
//! saturating E4M3 (`float`), llama.cpp's Q8_0/Q5_1/Q5_0/Q4_1/Q4_0 blocks (`ggml`), and the
//! integer groups of KIVI (asymmetric) and SageAttention (symmetric) (`groups`); and the
//! block-scaled weight formats of hub checkpoints, MXFP4 and FP8 with block scales
//! (`block_scaled`), decoded on load.
//!
//! The committed fixtures under `fixtures/formats/` (from
//! `tests/reference/generate_format_fixtures.py`: gguf-py, numpy, ml_dtypes/PyTorch and exact
//! rational arithmetic) are the independent cross-check.

mod block_scaled;
mod float;
mod ggml;
mod groups;

#[cfg(test)]
mod tests;

pub use block_scaled::{
    e2m1_value, e8m0_value, fp8_block_dequantize, mxfp4_decode, mxfp4_decode_ggml, BadScale,
    MXFP4_BLOCK,
};
pub use float::{
    bf16_bits, bf16_from_bits, e4m3_bits, e4m3_from_bits, f16_bits, f16_from_bits, round_bf16,
    round_bf16_f32, round_e4m3, round_e4m3_f32, round_f16, round_f16_f32, RunFloat, BF16_MAX,
    E4M3_MAX, F16_MAX, F16_OVERFLOW,
};
pub use ggml::{
    ggml_dequantize_block, ggml_quantize_block, ggml_roundtrip, GgmlBlock, GgmlType, GGML_BLOCK,
};
pub use groups::{asym_group_roundtrip, sym_group_roundtrip};

/// A value a format cannot store: which quantity (`"scale"`, `"offset"`, `"value"`) and the
/// value. The caller turns it into the usage error of §8.2, naming the tensor.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "{what} {value:e} cannot be stored: f16 overflows at |x| >= 65520 and every input must be finite"
)]
pub struct FormatError {
    pub what: &'static str,
    pub value: f64,
}
