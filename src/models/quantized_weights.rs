//! Hub checkpoints' quantized weights, dequantized to f32 on load (docs/reference.md §7.7.4,
//! §7.7.5): gpt-oss's MXFP4 experts (`*_blocks` + `*_scales`) and DeepSeek-V3's FP8 E4M3 linear
//! weights with 128×128 `weight_scale_inv` blocks. A checkpoint without them (bf16/f32, as the
//! fixtures) is read as stored.

use anyhow::Result;
use candle_core::{DType, Device, Storage, Tensor};

use super::named_tensors::NamedTensors;
use crate::numerics::formats::{fp8_block_dequantize, mxfp4_decode, MXFP4_BLOCK};
use crate::usage;

/// DeepSeek-V3's FP8 block: 128×128 weights share one scale (its config's
/// `quantization_config.weight_block_size`).
pub const FP8_BLOCK: usize = 128;

/// The bytes of a U8 or FP8 E4M3 tensor, row-major, on the host.
fn byte_codes(t: &Tensor) -> Result<Vec<u8>> {
    let t = t.to_device(&Device::Cpu)?.flatten_all()?.contiguous()?;
    match t.dtype() {
        DType::U8 => Ok(t.to_vec1::<u8>()?),
        DType::F8E4M3 => {
            let (storage, layout) = t.storage_and_layout();
            let Storage::Cpu(candle_core::CpuStorage::F8E4M3(v)) = &*storage else {
                unreachable!("an F8E4M3 tensor on the host holds F8E4M3 storage")
            };
            let (start, end) = layout.contiguous_offsets().expect("made contiguous above");
            Ok(v[start..end].iter().map(|x| x.to_bits()).collect())
        }
        other => Err(anyhow::anyhow!("byte codes of a {other:?} tensor")),
    }
}

/// gpt-oss's stacked expert tensor `name` as the forward uses it, [E, rows_in, cols_out]
/// (`x @ w`): from `{name}_blocks` [E, cols_out, rows_in/32, 16] and `{name}_scales`
/// [E, cols_out, rows_in/32] when the checkpoint holds MXFP4 (decoded, then transposed, as
/// transformers' `convert_moe_packed_tensors`, exact in bf16), else `name` as stored (f32).
pub fn mxfp4_or_plain(weights: &NamedTensors, name: &str, shape: [usize; 3]) -> Result<Tensor> {
    let (blocks_name, scales_name) = (format!("{name}_blocks"), format!("{name}_scales"));
    if !weights.has(&blocks_name) {
        return weights.get(name, &shape);
    }
    let [experts, rows_in, cols_out] = shape;
    let groups = rows_in.div_ceil(MXFP4_BLOCK);
    let blocks = weights.raw(&blocks_name)?;
    let scales = weights.raw(&scales_name)?;
    let want_blocks = [experts, cols_out, groups, MXFP4_BLOCK / 2];
    let want_scales = [experts, cols_out, groups];
    if blocks.dims() != want_blocks || scales.dims() != want_scales || rows_in % MXFP4_BLOCK != 0 {
        return Err(usage!(
            "weights {}: MXFP4 tensors '{blocks_name}' {:?} and '{scales_name}' {:?} do not fit config.json's expert shape {shape:?} (want {want_blocks:?} and {want_scales:?})",
            weights.what(),
            blocks.dims(),
            scales.dims()
        ));
    }
    let values = mxfp4_decode(&byte_codes(&blocks)?, &byte_codes(&scales)?).map_err(|e| {
        usage!(
            "weights {}: tensor '{scales_name}': {e}; the MXFP4 checkpoint is corrupt, re-download it",
            weights.what()
        )
    })?;
    let w = Tensor::from_vec(values, (experts, cols_out, rows_in), weights.device())?
        .transpose(1, 2)?
        .contiguous()?;
    crate::tensor_util::check_finite(&w, || {
        format!("weights {}: tensor '{blocks_name}' decoded", weights.what())
    })?;
    // Held in bf16, which stores every finite E2M1·2^k exactly (two significant bits; f32's
    // exponent range, subnormals down to 2^−133 below the smallest 2^−128): half of f32's memory
    // for the experts of layers 0..L, and the forward widens each expert as it uses it.
    Ok(w.to_dtype(DType::BF16)?)
}

/// The linear weight `{prefix}.weight` [out, in], dequantized with `{prefix}.weight_scale_inv`
/// [⌈out/128⌉, ⌈in/128⌉] when the checkpoint stores it in FP8 E4M3 (DeepSeek-V3's hub weights),
/// else as stored.
pub fn fp8_or_plain(weights: &NamedTensors, prefix: &str, shape: [usize; 2]) -> Result<Tensor> {
    let name = format!("{prefix}.weight");
    let scale_name = format!("{prefix}.weight_scale_inv");
    if !weights.has(&scale_name) {
        return weights.get(&name, &shape);
    }
    let codes = weights.raw(&name)?;
    let [rows, cols] = shape;
    if !matches!(codes.dtype(), DType::F8E4M3 | DType::U8) || codes.dims() != shape {
        return Err(usage!(
            "weights {}: tensor '{name}' is {:?} {:?} beside '{scale_name}'; block-scaled weights must be FP8 E4M3 of shape {shape:?}",
            weights.what(),
            codes.dtype(),
            codes.dims()
        ));
    }
    let scale_shape = [rows.div_ceil(FP8_BLOCK), cols.div_ceil(FP8_BLOCK)];
    let scales = weights.get(&scale_name, &scale_shape)?;
    let scales: Vec<f32> = scales.flatten_all()?.to_vec1()?;
    let values = fp8_block_dequantize(&byte_codes(&codes)?, rows, cols, &scales, FP8_BLOCK);
    let w = Tensor::from_vec(values, (rows, cols), weights.device())?;
    crate::tensor_util::check_finite(&w, || {
        format!("weights {}: tensor '{name}' dequantized", weights.what())
    })?;
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::{Dtype, TensorView};

    /// A safetensors file of (name, dtype, shape, bytes) in a temporary directory.
    fn checkpoint(
        tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)],
    ) -> (tempfile::TempDir, NamedTensors) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &path).unwrap();
        let w = NamedTensors::open_file(&path, &Device::Cpu).unwrap();
        (dir, w)
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn fp8_weight_with_block_scales_is_dequantized() {
        // [2, 130]: two column blocks (128 + 2), scales 0.5 and 4.
        let mut codes = vec![0x38u8; 260]; // 1.0
        codes[129] = 0xC4; // −3.0 (exponent 1000, mantissa 100), in column block 1
        codes[130] = 0x40; // 2.0, row 1 column 0
        let (_d, w) = checkpoint(&[
            ("p.weight", Dtype::F8_E4M3, vec![2, 130], codes),
            (
                "p.weight_scale_inv",
                Dtype::F32,
                vec![1, 2],
                f32_bytes(&[0.5, 4.0]),
            ),
        ]);
        let t: Vec<Vec<f32>> = fp8_or_plain(&w, "p", [2, 130]).unwrap().to_vec2().unwrap();
        assert_eq!(
            (t[0][0], t[0][127], t[0][128], t[0][129]),
            (0.5, 0.5, 4.0, -12.0)
        );
        assert_eq!((t[1][0], t[1][129]), (1.0, 4.0));
        let e = fp8_or_plain(&w, "p", [2, 128]).unwrap_err().to_string();
        assert!(e.contains("'p.weight'"), "{e}");
    }

    #[test]
    fn mxfp4_experts_are_decoded_and_a_nan_scale_names_the_tensor() {
        // One expert, rows_in 32, cols_out 2: column 0 all 1.0·2^1, column 1 all −0.5·2^0.
        let mut blocks = vec![0x22u8; 16];
        blocks.extend(vec![0x99u8; 16]);
        let (_d, w) = checkpoint(&[
            (
                "e.down_proj_blocks",
                Dtype::U8,
                vec![1, 2, 1, 16],
                blocks.clone(),
            ),
            (
                "e.down_proj_scales",
                Dtype::U8,
                vec![1, 2, 1],
                vec![128, 127],
            ),
        ]);
        let t = mxfp4_or_plain(&w, "e.down_proj", [1, 32, 2]).unwrap();
        assert_eq!(t.dtype(), DType::BF16);
        let t = t.to_dtype(DType::F32).unwrap();
        assert_eq!(t.dims(), &[1, 32, 2]);
        let rows: Vec<Vec<f32>> = t.squeeze(0).unwrap().to_vec2().unwrap();
        assert!(rows.iter().all(|r| r == &[2.0, -0.5]));
        let (_d, bad) = checkpoint(&[
            ("e.down_proj_blocks", Dtype::U8, vec![1, 2, 1, 16], blocks),
            (
                "e.down_proj_scales",
                Dtype::U8,
                vec![1, 2, 1],
                vec![128, 255],
            ),
        ]);
        let e = mxfp4_or_plain(&bad, "e.down_proj", [1, 32, 2]).unwrap_err();
        assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e}");
        assert!(
            e.to_string().contains("'e.down_proj_scales'") && e.to_string().contains("255"),
            "{e}"
        );
    }

    /// Two experts, 64 inputs (two blocks), 3 outputs, against transformers 5.24's
    /// `convert_moe_packed_tensors` on the same bytes (blocks (37i + 11) mod 256, scales
    /// 120 + (5j mod 15)): a weighted checksum of all 384 values and six of them.
    #[test]
    fn mxfp4_layout_matches_transformers() {
        let blocks: Vec<u8> = (0..192u32).map(|i| ((i * 37 + 11) % 256) as u8).collect();
        let scales: Vec<u8> = (0..12u32).map(|j| (120 + j * 5 % 15) as u8).collect();
        let (_d, w) = checkpoint(&[
            (
                "x.gate_up_proj_blocks",
                Dtype::U8,
                vec![2, 3, 2, 16],
                blocks,
            ),
            ("x.gate_up_proj_scales", Dtype::U8, vec![2, 3, 2], scales),
        ]);
        let t = mxfp4_or_plain(&w, "x.gate_up_proj", [2, 64, 3])
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        let checksum: f64 = v
            .iter()
            .enumerate()
            .map(|(i, &x)| x as f64 * (i % 7 + 1) as f64)
            .sum();
        assert_eq!(checksum, 262.3359375);
        let picks = [0, 1, 2, 95, 200, 383].map(|i| v[i]);
        assert_eq!(picks, [-0.01171875, -12.0, -0.375, 1.5, 0.0, -8.0]);
    }
}
