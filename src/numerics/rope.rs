//! Rotary position tables (Hugging Face's rotate-half convention, docs/reference.md §7.1 "RoPE")
//! for any range of positions, and a layer's rotary map: below both the models, which build them
//! from their configs, and the methods that read positions beyond a window (kvpress's
//! ExpectedAttentionPress, issue 58).

use anyhow::Result;
use candle_core::{DType, Device, Tensor, D};

/// cos and sin tables [n, d] of the inverse frequencies `inv` (d = 2·|inv|, the rotary dim) for
/// positions start..start+n, each multiplied by `attention_factor`, in `dtype`. In f32 the angle is
/// the f32 product of the f32 position and the f32 inv_freq, as transformers computes it; cos and
/// sin of that angle are then rounded once. In f64 everything is f64.
pub fn cos_sin_from(
    inv: &[f64],
    start: usize,
    n: usize,
    attention_factor: f64,
    dtype: DType,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let half = inv.len();
    let dim = 2 * half;
    let mut cos = vec![0f64; n * dim];
    let mut sin = vec![0f64; n * dim];
    for j in 0..n {
        let (i, row) = (start + j, j);
        for (t, &f) in inv.iter().enumerate() {
            let angle = if dtype == DType::F64 {
                i as f64 * f
            } else {
                (i as f32 * f as f32) as f64
            };
            let (s, c) = angle.sin_cos();
            for j in [t, t + half] {
                cos[row * dim + j] = c * attention_factor;
                sin[row * dim + j] = s * attention_factor;
            }
        }
    }
    let table = |v: Vec<f64>| -> Result<Tensor> {
        Ok(Tensor::from_vec(v, (n, dim), device)?.to_dtype(dtype)?)
    };
    Ok((table(cos)?, table(sin)?))
}

/// A layer's rotary map, for what reads positions beyond a window (kvpress's ExpectedAttentionPress
/// averages it over future positions): inverse frequencies over the rotary dim and the factor on
/// cos and sin (longrope's and yarn's a; 1 for the others).
#[derive(Debug, Clone, PartialEq)]
pub struct LayerRope {
    pub inv_freq: Vec<f64>,
    pub attention_factor: f64,
}

impl LayerRope {
    /// The rotary dim (2 per inverse frequency).
    pub fn dim(&self) -> usize {
        2 * self.inv_freq.len()
    }
    /// cos and sin [n, dim] for positions start..start+n, with [`cos_sin_from`]'s rounding.
    pub fn tables(
        &self,
        start: usize,
        n: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<(Tensor, Tensor)> {
        cos_sin_from(
            &self.inv_freq,
            start,
            n,
            self.attention_factor,
            dtype,
            device,
        )
    }
}

/// rotate_half(x) = [−x_{p/2..p}, x_{0..p/2}] over the last dimension.
pub fn rotate_half(x: &Tensor) -> Result<Tensor> {
    let p = x.dim(D::Minus1)?;
    let x1 = x.narrow(D::Minus1, 0, p / 2)?;
    let x2 = x.narrow(D::Minus1, p / 2, p / 2)?;
    Ok(Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?)
}
