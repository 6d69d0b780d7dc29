//! The target under a layer's whole spec (docs/reference.md §7.7.0): a spec that is its mask's
//! plain target takes the mask's path unchanged (the same bits as before specs existed); any other
//! takes [`crate::attention::spec`]'s kernels.

use anyhow::Result;
use candle_core::Tensor;

use super::ExactAttention;
use crate::attention::spec::{exact_attention, AttentionSpec};
use crate::numerics::flash;

impl ExactAttention {
    /// Exact attention of one head (q, k, v [n, p]) under `spec`. Beyond the mask, on the host
    /// the fused kernel gives O and log D (which then includes the sinks' term); elsewhere O
    /// comes from [`exact_attention`] and log D is not available.
    pub fn compute_spec(q: &Tensor, k: &Tensor, v: &Tensor, spec: &AttentionSpec) -> Result<Self> {
        let p = q.dim(1)?;
        let Some(feature) = spec.beyond_mask(p) else {
            return Self::compute_masked(q, k, v, spec.mask());
        };
        spec.validate(1, "the head's attention spec")?;
        let qs = (q * spec.scale)?;
        let log_rowsum = std::sync::OnceLock::new();
        let on_host = if q.device().is_cpu() {
            flash::on_host(&qs, k, v, spec.visible(), spec.logits())?
        } else {
            None
        };
        let output = match on_host {
            Some((output, log_d)) => {
                let _ = log_rowsum.set(log_d.squeeze(0)?);
                output.squeeze(0)?
            }
            None => exact_attention(&q.unsqueeze(0)?, &k.unsqueeze(0)?, &v.unsqueeze(0)?, spec)?
                .squeeze(0)?,
        };
        Ok(Self {
            output,
            q: qs,
            k: k.clone(),
            mask: spec.mask(),
            log_rowsum,
            beyond_mask: Some(feature),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::target::Mask;
    use crate::numerics::sampling::{normal_values, TrialRng};
    use candle_core::{DType, Device};
    use rand::SeedableRng;

    /// A plain spec gives the mask's bits; a spec beyond it gives the float64 definition.
    #[test]
    fn the_target_follows_the_spec() {
        let (n, p) = (300, 16);
        let mut rng = TrialRng::seed_from_u64(23);
        let (q, k, v) = (
            normal_values(&mut rng, n, p, 1.0),
            normal_values(&mut rng, n, p, 1.0),
            normal_values(&mut rng, n, p, 1.0),
        );
        let t = |x: &[f64], dt| {
            Tensor::from_vec(x.to_vec(), (n, p), &Device::Cpu)
                .unwrap()
                .to_dtype(dt)
                .unwrap()
        };
        for dt in [DType::F32, DType::F64] {
            let (qt, kt, vt) = (t(&q, dt), t(&k, dt), t(&v, dt));
            let plain =
                ExactAttention::compute_spec(&qt, &kt, &vt, &AttentionSpec::causal(p, None));
            let masked = ExactAttention::compute_masked(&qt, &kt, &vt, Mask::Causal).unwrap();
            let bits = |t: &Tensor| -> Vec<u64> {
                let x: Vec<f64> = t
                    .to_dtype(DType::F64)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                x.iter().map(|y| y.to_bits()).collect()
            };
            assert!(bits(&plain.unwrap().output) == bits(&masked.output));
        }
        let spec = AttentionSpec::causal(p, Some(40))
            .with_softcap(Some(3.0))
            .with_sinks(Some(vec![0.5]));
        let e = ExactAttention::compute_spec(
            &t(&q, DType::F64),
            &t(&k, DType::F64),
            &t(&v, DType::F64),
            &spec,
        )
        .unwrap();
        let want =
            crate::attention::spec::exact_attention_reference(&q, &k, &v, (1, 1, n, p, p), &spec);
        let got: Vec<f64> = e.output.flatten_all().unwrap().to_vec1().unwrap();
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-12 * (1.0 + b.abs()), "{a} vs {b}");
        }
        assert!(e.log_rowsum().is_ok());
    }
}

/// Every registered method without a soft-cap is refused, by name and feature, on a capped head
/// (those with one are accepted), and every method is accepted under the plain spec.
#[cfg(test)]
#[test]
fn methods_without_the_spec_are_refused_by_name() {
    use crate::attention::{refuse_unimplemented_spec, registry::registry, HeadInputs};
    let (n, p) = (32, 8);
    let t = || Tensor::ones((n, p), candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
    let capped = AttentionSpec::causal(p, None).with_softcap(Some(30.0));
    let head = HeadInputs::with_spec(t(), t(), t(), capped).unwrap();
    let plain = HeadInputs::with_spec(t(), t(), t(), AttentionSpec::causal(p, None)).unwrap();
    for m in registry() {
        refuse_unimplemented_spec(m.as_ref(), &plain).unwrap();
        if m.spec_support().softcap {
            refuse_unimplemented_spec(m.as_ref(), &head).unwrap();
            continue;
        }
        let e = refuse_unimplemented_spec(m.as_ref(), &head)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "{} does not yet implement a logit soft-cap (§7.7.6)",
                m.id()
            )
        );
        refuse_unimplemented_spec(m.as_ref(), &plain).unwrap();
    }
}
