//! Rotary position embeddings in Hugging Face's rotate-half convention (docs/reference.md §7.1 "RoPE"):
//! inv_freq_t = θ^(−2t/p), angle_{i,t} = i·inv_freq_t, x' = x·cos + rotate_half(x)·sin with cos
//! and sin repeating the p/2 angles over both halves.

use anyhow::Result;
use candle_core::{DType, Device, Tensor, D};

use super::decoder_config::{RopeConfig, RopeScaling};

// yarn and the pair layouts of §7.7.4–7.7.5, in their own file.
mod yarn;
pub use yarn::{deinterleave, interleave, yarn_mscale, FamilyRope, Yarn};
// The tables of any positions and a layer's map, below the methods that read them.
pub use crate::numerics::rope::{cos_sin_from, rotate_half, LayerRope};

/// inv_freq_t, t = 0..p/2, in f64, with the config's scaling applied.
pub fn inv_freq(rope: &RopeConfig, head_dim: usize) -> Vec<f64> {
    let base: Vec<f64> = (0..head_dim / 2)
        .map(|t| 1.0 / rope.theta.powf((2 * t) as f64 / head_dim as f64))
        .collect();
    match rope.scaling {
        RopeScaling::Default => base,
        RopeScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
        RopeScaling::Divisors(ref d) => base.iter().zip(d).map(|(f, d)| f / d).collect(),
        // transformers' `_compute_llama3_parameters`: wavelengths longer than N₀/l are slowed by
        // the factor, shorter than N₀/h kept, and those between interpolated with the smooth
        // factor s = (N₀/λ − l)/(h − l).
        RopeScaling::Llama3 {
            factor,
            low_freq_factor: l,
            high_freq_factor: h,
            original_max_position_embeddings: n0,
        } => {
            let low_freq_wavelen = n0 / l;
            let high_freq_wavelen = n0 / h;
            base.iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen > low_freq_wavelen {
                        f / factor
                    } else if wavelen < high_freq_wavelen {
                        f
                    } else {
                        let s = (n0 / wavelen - l) / (h - l);
                        (1.0 - s) * f / factor + s * f
                    }
                })
                .collect()
        }
    }
}

/// cos and sin tables [n, p] for positions 0..n−1, in `dtype` (f32 or f64) on `device`.
///
/// In f32 the angle is the f32 product of the f32 position and the f32 inv_freq, as transformers
/// computes it (`position_ids.float() * inv_freq`), so that long windows carry the same angle
/// rounding as the model in use (at position 32768 one f32 ulp is 0.004 rad); cos and sin of that
/// angle are then rounded once. In f64 everything is f64.
pub fn cos_sin(
    rope: &RopeConfig,
    head_dim: usize,
    n: usize,
    dtype: DType,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    cos_sin_of(&inv_freq(rope, head_dim), n, 1.0, dtype, device)
}

/// cos and sin tables [n, d] of the inverse frequencies `inv` (d = 2·|inv|, the rotary dim) for
/// positions 0..n−1, each multiplied by `attention_factor` (longrope's and yarn's a; 1 for the
/// others), in `dtype`, with [`cos_sin`]'s angle rounding. The factor multiplies the cos and sin
/// of the rounded angle, as transformers' `cos * attention_scaling` does.
pub fn cos_sin_of(
    inv: &[f64],
    n: usize,
    attention_factor: f64,
    dtype: DType,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    cos_sin_from(inv, 0, n, attention_factor, dtype, device)
}

/// Longrope's inverse frequencies (docs/reference.md §7.7.3): inv_freq_t = 1/(e_t·θ^(2t/d)) over
/// the rotary dim d, e the short or the long factors (d/2 of them).
pub fn longrope_inv_freq(theta: f64, rotary_dim: usize, factors: &[f64]) -> Vec<f64> {
    factors
        .iter()
        .enumerate()
        .map(|(t, e)| 1.0 / (e * theta.powf((2 * t) as f64 / rotary_dim as f64)))
        .collect()
}

/// Plain inverse frequencies θ^(−2t/d) over a rotary dim d (partial rotary: d < p).
pub fn default_inv_freq(theta: f64, rotary_dim: usize) -> Vec<f64> {
    (0..rotary_dim / 2)
        .map(|t| 1.0 / theta.powf((2 * t) as f64 / rotary_dim as f64))
        .collect()
}

/// Partial rotary RoPE (docs/reference.md §7.7.3): rotate-half on the first d dims of x
/// [heads, n, p], d the tables' width ([n, d]), the other p − d dims passed unrotated.
pub fn apply_partial(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let p = x.dim(D::Minus1)?;
    let d = cos.dim(D::Minus1)?;
    if d == p {
        return apply(x, cos, sin);
    }
    let rotated = apply(&x.narrow(D::Minus1, 0, d)?, cos, sin)?;
    let rest = x.narrow(D::Minus1, d, p - d)?;
    Ok(Tensor::cat(&[&rotated, &rest], D::Minus1)?)
}

/// RoPE on x [heads, n, p] with the tables of [`cos_sin`] ([n, p], same dtype).
pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    Ok((x.broadcast_mul(cos)? + rotate_half(x)?.broadcast_mul(sin)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor_util::test_device;

    #[test]
    fn rope_matches_a_hand_written_f64_loop() {
        let rope = RopeConfig {
            theta: 500000.0,
            scaling: RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 64.0,
            },
        };
        let (heads, n, p) = (3, 50, 16);
        let vals: Vec<f64> = (0..heads * n * p)
            .map(|i| ((i * 37 % 101) as f64 - 50.0) / 17.0)
            .collect();
        let dev = test_device();
        let x = Tensor::from_vec(vals.clone(), (heads, n, p), &dev).unwrap();
        let (c, s) = cos_sin(&rope, p, n, DType::F64, &dev).unwrap();
        let got: Vec<f64> = apply(&x, &c, &s)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        // The reference: pairs (t, t + p/2) rotate by angle i·inv_freq_t, llama3 by hand.
        let mut want = vec![0f64; vals.len()];
        let (l, h, n0, f) = (1.0, 4.0, 64.0, 8.0);
        for hd in 0..heads {
            for i in 0..n {
                for t in 0..p / 2 {
                    let base = 500000f64.powf(-(2.0 * t as f64) / p as f64);
                    let lambda = 2.0 * std::f64::consts::PI / base;
                    let inv = if lambda < n0 / h {
                        base
                    } else if lambda > n0 / l {
                        base / f
                    } else {
                        let s = (n0 / lambda - l) / (h - l);
                        (1.0 - s) * base / f + s * base
                    };
                    let a = i as f64 * inv;
                    let o = hd * n * p + i * p;
                    let (x1, x2) = (vals[o + t], vals[o + t + p / 2]);
                    want[o + t] = x1 * a.cos() - x2 * a.sin();
                    want[o + t + p / 2] = x2 * a.cos() + x1 * a.sin();
                }
            }
        }
        let err = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(err < 1e-12, "{err}");
        // The three llama3 regimes all occur at p = 16, θ = 5e5, N₀ = 64.
        let inv = inv_freq(&rope, p);
        let plain = inv_freq(
            &RopeConfig {
                theta: 500000.0,
                scaling: RopeScaling::Default,
            },
            p,
        );
        assert_eq!(inv[0], plain[0]);
        assert!((inv[7] - plain[7] / 8.0).abs() < 1e-20);
        assert!(inv.iter().zip(&plain).any(|(a, b)| a != b && *a != b / 8.0));
        // f32 tables agree with f64 to f32 rounding at these positions.
        let (c32, _) = cos_sin(&rope, p, n, DType::F32, &dev).unwrap();
        let d = (c32.to_dtype(DType::F64).unwrap() - &c)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        assert!(d < 1e-5, "{d}");
    }

    #[test]
    fn linear_scaling_divides_inv_freq() {
        let a = inv_freq(
            &RopeConfig {
                theta: 10000.0,
                scaling: RopeScaling::Linear { factor: 4.0 },
            },
            8,
        );
        for (a, b) in a.iter().zip([0.25, 0.025, 0.0025, 0.00025]) {
            assert!((a / b - 1.0).abs() < 1e-15, "{a} {b}");
        }
    }

    #[test]
    fn partial_rotary_rotates_the_first_d_dims_and_the_factor_scales_cos_and_sin() {
        let dev = test_device();
        let (n, p, d, a) = (5, 8, 4, 1.25);
        let vals: Vec<f64> = (0..n * p).map(|i| (i as f64 * 0.37).sin()).collect();
        let x = Tensor::from_vec(vals.clone(), (1, n, p), &dev).unwrap();
        let inv = longrope_inv_freq(100.0, d, &[1.0, 3.0]);
        assert_eq!(inv, [1.0, 1.0 / (3.0 * 10.0)]);
        let (c, s) = cos_sin_of(&inv, n, a, DType::F64, &dev).unwrap();
        let got: Vec<f64> = apply_partial(&x, &c, &s)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        for i in 0..n {
            let o = i * p;
            for t in 0..d / 2 {
                let ang = i as f64 * inv[t];
                let (x1, x2) = (vals[o + t], vals[o + t + d / 2]);
                let want1 = a * (x1 * ang.cos() - x2 * ang.sin());
                let want2 = a * (x2 * ang.cos() + x1 * ang.sin());
                assert!((got[o + t] - want1).abs() < 1e-14);
                assert!((got[o + t + d / 2] - want2).abs() < 1e-14);
            }
            // The p − d dims past the rotary ones pass unchanged (and unscaled).
            assert_eq!(got[o + d..o + p], vals[o + d..o + p]);
        }
        assert_eq!(default_inv_freq(100.0, d), [1.0, 0.1]);
    }
}
