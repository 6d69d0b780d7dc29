//! yarn RoPE for the §7.7 families (docs/reference.md §7.7.4 gpt-oss, §7.7.5 DeepSeek), its
//! cos/sin tables with the attention factor, and the pair layouts of DeepSeek's rope dims.

use std::f64::consts::PI;

use anyhow::Result;
use candle_core::{DType, Device, Tensor, D};
use serde_json::Value;

/// yarn RoPE (transformers' `_compute_yarn_parameters`; docs/reference.md §7.7.4, §7.7.5): each
/// frequency mixes the extrapolated θ^(−2t/d) and the interpolated θ^(−2t/d)/f by a linear ramp
/// between the correction dims of β_fast and β_slow, and cos and sin carry an attention factor.
#[derive(Debug, Clone, PartialEq)]
pub struct Yarn {
    pub theta: f64,
    /// d, the rotary dims.
    pub dim: usize,
    /// f.
    pub factor: f64,
    /// N₀.
    pub original_max_position_embeddings: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    /// Whether the correction dims are rounded outwards to integers (transformers' default true;
    /// gpt-oss false).
    pub truncate: bool,
    /// The factor on cos and sin.
    pub attention_factor: f64,
    /// DeepSeek's `mscale_all_dim` (0 when absent): τ carries m(f, mscale_all_dim)².
    pub mscale_all_dim: f64,
}

/// yarn's m(f, μ) = 0.1·μ·ln f + 1 (1 for f ≤ 1).
pub fn yarn_mscale(factor: f64, mscale: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * mscale * factor.ln() + 1.0
    }
}

impl Yarn {
    /// inv_freq_t, t = 0..d/2, in f64.
    pub fn inv_freq(&self) -> Vec<f64> {
        let d = self.dim as f64;
        let correction_dim = |beta: f64| {
            d * (self.original_max_position_embeddings / (beta * 2.0 * PI)).ln()
                / (2.0 * self.theta.ln())
        };
        let (mut low, mut high) = (
            correction_dim(self.beta_fast),
            correction_dim(self.beta_slow),
        );
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
        if low == high {
            // transformers' guard against a zero-width ramp.
            high += 0.001;
        }
        (0..self.dim / 2)
            .map(|t| {
                let pos_freq = self.theta.powf((2 * t) as f64 / d);
                let extrapolated = 1.0 / pos_freq;
                let interpolated = 1.0 / (self.factor * pos_freq);
                let ramp = ((t as f64 - low) / (high - low)).clamp(0.0, 1.0);
                interpolated * ramp + extrapolated * (1.0 - ramp)
            })
            .collect()
    }
}

/// A §7.7 family's RoPE: plain, or yarn.
#[derive(Debug, Clone, PartialEq)]
pub enum FamilyRope {
    Default { theta: f64, dim: usize },
    Yarn(Yarn),
}

impl FamilyRope {
    /// inv_freq_t, t = 0..d/2, in f64.
    pub fn inv_freq(&self) -> Vec<f64> {
        match self {
            FamilyRope::Default { theta, dim } => (0..dim / 2)
                .map(|t| 1.0 / theta.powf((2 * t) as f64 / *dim as f64))
                .collect(),
            FamilyRope::Yarn(y) => y.inv_freq(),
        }
    }

    /// The factor on cos and sin (1 without yarn).
    pub fn attention_factor(&self) -> f64 {
        match self {
            FamilyRope::Default { .. } => 1.0,
            FamilyRope::Yarn(y) => y.attention_factor,
        }
    }

    /// The rotary dims d.
    pub fn dim(&self) -> usize {
        match self {
            FamilyRope::Default { dim, .. } => *dim,
            FamilyRope::Yarn(y) => y.dim,
        }
    }

    /// cos and sin tables [n, d] of positions 0..n−1 (see [`super::cos_sin_of`]).
    pub fn cos_sin(&self, n: usize, dtype: DType, device: &Device) -> Result<(Tensor, Tensor)> {
        super::cos_sin_of(&self.inv_freq(), n, self.attention_factor(), dtype, device)
    }

    /// The RoPE of a family's config.json over `dim` rotary dims: `rope_parameters`
    /// (transformers 5), else `rope_scaling` with `rope_theta`; `default` or `yarn`, anything
    /// else a usage error naming the type. `what` names the config in errors.
    pub fn from_config(config: &Value, dim: usize, what: &str) -> Result<Self> {
        let params = ["rope_parameters", "rope_scaling"]
            .iter()
            .find_map(|k| config.get(*k).filter(|x| x.is_object()));
        let num = |name: &str| -> Result<Option<f64>> {
            match params.and_then(|p| p.get(name)).filter(|x| !x.is_null()) {
                None => Ok(None),
                Some(x) => x.as_f64().map(Some).ok_or_else(|| {
                    crate::usage!(
                        "config {what}: rope parameter \"{name}\" must be a number, found {x}"
                    )
                }),
            }
        };
        let theta = match config.get("rope_theta").and_then(Value::as_f64) {
            Some(t) => t,
            None => num("rope_theta")?.unwrap_or(10000.0),
        };
        if !(theta > 1.0 && theta.is_finite()) {
            return Err(crate::usage!(
                "config {what}: rope_theta is {theta}; it must be a finite number above 1"
            ));
        }
        let rope_type = params
            .and_then(|p| p.get("rope_type").or_else(|| p.get("type")))
            .and_then(Value::as_str)
            .unwrap_or("default");
        match rope_type {
            "default" => Ok(FamilyRope::Default { theta, dim }),
            "yarn" => Ok(FamilyRope::Yarn(yarn_from_params(params, &num, theta, dim, config, what)?)),
            other => Err(crate::usage!(
                "config {what}: rope type \"{other}\" is not supported for this family (default or yarn)"
            )),
        }
    }
}

/// [`Yarn`] from its rope parameters, as transformers reads them: f defaults to
/// max_position_embeddings/N₀, β to 32/1 (also when 0), truncate to true, and the attention
/// factor, when not given, to m(f, mscale)/m(f, mscale_all_dim) if both are set, else m(f, 1).
fn yarn_from_params(
    params: Option<&Value>,
    num: &dyn Fn(&str) -> Result<Option<f64>>,
    theta: f64,
    dim: usize,
    config: &Value,
    what: &str,
) -> Result<Yarn> {
    let n0 = num("original_max_position_embeddings")?.ok_or_else(|| {
        crate::usage!("config {what}: yarn rope needs \"original_max_position_embeddings\"")
    })?;
    let factor = match num("factor")? {
        Some(f) => f,
        None => config
            .get("max_position_embeddings")
            .and_then(Value::as_f64)
            .map(|m| m / n0)
            .ok_or_else(|| crate::usage!("config {what}: yarn rope needs \"factor\""))?,
    };
    if !(factor > 0.0 && factor.is_finite() && n0 > 0.0) {
        return Err(crate::usage!(
            "config {what}: yarn factor {factor} and original_max_position_embeddings {n0} must be positive"
        ));
    }
    let truthy = |x: Option<f64>| x.filter(|&m| m != 0.0);
    let (mscale, mscale_all_dim) = (truthy(num("mscale")?), truthy(num("mscale_all_dim")?));
    let attention_factor = match (num("attention_factor")?, mscale, mscale_all_dim) {
        (Some(a), _, _) => a,
        (None, Some(m), Some(ma)) => yarn_mscale(factor, m) / yarn_mscale(factor, ma),
        _ => yarn_mscale(factor, 1.0),
    };
    let truncate = match params
        .and_then(|p| p.get("truncate"))
        .filter(|x| !x.is_null())
    {
        None => true,
        Some(t) => t.as_bool().ok_or_else(|| {
            crate::usage!(
                "config {what}: rope parameter \"truncate\" must be true or false, found {t}"
            )
        })?,
    };
    Ok(Yarn {
        theta,
        dim,
        factor,
        original_max_position_embeddings: n0,
        beta_fast: truthy(num("beta_fast")?).unwrap_or(32.0),
        beta_slow: truthy(num("beta_slow")?).unwrap_or(1.0),
        truncate,
        attention_factor,
        mscale_all_dim: mscale_all_dim.unwrap_or(0.0),
    })
}

/// Adjacent pairs (2t, 2t+1) of the last dim to rotate-half order [evens; odds].
pub fn deinterleave(x: &Tensor) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let d = *dims.last().expect("a tensor with dims");
    let mut pairs = dims.clone();
    pairs.pop();
    pairs.extend([d / 2, 2]);
    Ok(x.reshape(pairs)?
        .transpose(D::Minus1, D::Minus2)?
        .contiguous()?
        .reshape(dims)?)
}

/// The inverse of [`deinterleave`]: [evens; odds] back to adjacent pairs.
pub fn interleave(x: &Tensor) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let d = *dims.last().expect("a tensor with dims");
    let mut halves = dims.clone();
    halves.pop();
    halves.extend([2, d / 2]);
    Ok(x.reshape(halves)?
        .transpose(D::Minus1, D::Minus2)?
        .contiguous()?
        .reshape(dims)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// transformers' `_compute_yarn_parameters` on the gpt_oss fixture's config (θ 1.5e5, d 16,
    /// f 32, N₀ 4096), with truncate false and true, and on deepseek_v3-noqlora's (d 8, f 40,
    /// mscale 1 ≠ mscale_all_dim 0.8): float32 values, so agreement to f32 rounding.
    #[test]
    fn yarn_matches_transformers() {
        let gpt_oss = serde_json::json!({"rope_parameters": {"beta_fast": 32.0, "beta_slow": 1.0,
            "factor": 32.0, "original_max_position_embeddings": 4096, "rope_theta": 150000.0,
            "rope_type": "yarn", "truncate": false}});
        let want = [
            1.0,
            0.22541800141334534,
            0.05081327259540558,
            0.006794959306716919,
            0.0004564839182421565,
            1.818833698052913e-05,
            4.099978468730114e-06,
            9.242089618055616e-07,
        ];
        let rope = FamilyRope::from_config(&gpt_oss, 16, "t").unwrap();
        let close = |got: &[f64], want: &[f64]| {
            assert_eq!(got.len(), want.len());
            for (a, b) in got.iter().zip(want) {
                assert!((a / b - 1.0).abs() < 2e-7, "{a} vs {b}");
            }
        };
        close(&rope.inv_freq(), &want);
        assert!((rope.attention_factor() - 1.3465735902799727).abs() < 1e-15);
        // truncate true (the default when the key is absent) rounds the ramp's ends outwards.
        let mut truncated = gpt_oss.clone();
        truncated["rope_parameters"]
            .as_object_mut()
            .unwrap()
            .remove("truncate");
        let mut want_t = want;
        want_t[3] = 0.007755465339869261;
        want_t[4] = 0.0009144543437287211;
        close(
            &FamilyRope::from_config(&truncated, 16, "t")
                .unwrap()
                .inv_freq(),
            &want_t,
        );
        // The legacy spelling: rope_scaling with "type" and a top-level rope_theta.
        let legacy = serde_json::json!({"rope_theta": 10000.0, "rope_scaling": {"type": "yarn",
            "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
            "mscale_all_dim": 0.8, "beta_fast": 32, "beta_slow": 1}});
        let ds = FamilyRope::from_config(&legacy, 8, "t").unwrap();
        close(
            &ds.inv_freq(),
            &[
                1.0,
                0.10000000149011612,
                0.005124999675899744,
                2.499999936844688e-05,
            ],
        );
        assert!((ds.attention_factor() - 1.0569662567531275).abs() < 1e-15);
        let FamilyRope::Yarn(y) = &ds else {
            panic!("yarn")
        };
        assert_eq!(y.mscale_all_dim, 0.8);
        // Tables carry the factor on cos and sin.
        let (c, s) = ds.cos_sin(3, DType::F64, &Device::Cpu).unwrap();
        let c: Vec<Vec<f64>> = c.to_vec2().unwrap();
        let s: Vec<Vec<f64>> = s.to_vec2().unwrap();
        let a = ds.attention_factor();
        assert!((c[2][1] - a * (2.0 * 0.1f64).cos()).abs() < 1e-8 && c[2][1] == c[2][5]);
        assert!((s[2][0] - a * 2f64.sin()).abs() < 1e-15);
        let bad = serde_json::json!({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}});
        let e = FamilyRope::from_config(&bad, 8, "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("dynamic"), "{e}");
    }

    #[test]
    fn deinterleave_and_interleave_are_inverse() {
        let x = Tensor::arange(0f64, 12.0, &Device::Cpu)
            .unwrap()
            .reshape((2, 6))
            .unwrap();
        let d = deinterleave(&x).unwrap();
        assert_eq!(
            d.to_vec2::<f64>().unwrap()[0],
            vec![0.0, 2.0, 4.0, 1.0, 3.0, 5.0]
        );
        assert_eq!(
            interleave(&d).unwrap().to_vec2::<f64>().unwrap(),
            x.to_vec2::<f64>().unwrap()
        );
    }
}
