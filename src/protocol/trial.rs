//! What a trial's Ô is flagged for and the mass its rows captured (docs/reference.md §7.2), for
//! the pipeline ([`super::pipeline`]) and the device path's batched measurement.

use anyhow::Result;
use candle_core::DType;

use crate::attention::{self, Approximation, HeadInputs};

/// Rows whose output is non-finite or whose estimated normalizer is ≤ 0 or non-finite.
pub fn flagged_rows(a: &Approximation) -> Result<usize> {
    // 0·x is 0 for finite x and NaN for ±∞ or NaN, so each row's sum is NaN exactly when the
    // row has a non-finite entry: one n-vector leaves the device instead of the n×p output.
    let out = a.output.to_dtype(DType::F64)?;
    let row_check: Vec<f64> = (&out * 0.0)?.sum(1)?.to_vec1()?;
    let norm: Option<Vec<f64>> = match &a.normalizer {
        Some(t) => Some(t.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?),
        None => None,
    };
    Ok(count_flagged(&row_check, norm.as_deref()))
}

/// Rows i with a non-finite `row_check[i]` (0·row summed) or, given normalizers, one that is
/// ≤ 0 or non-finite.
#[allow(clippy::neg_cmp_op_on_partial_ord)] // `!(n > 0.0)` is deliberately true for NaN too
pub(crate) fn count_flagged(row_check: &[f64], norm: Option<&[f64]>) -> usize {
    row_check
        .iter()
        .enumerate()
        .filter(|(i, c)| {
            !c.is_finite() || norm.is_some_and(|n| !(n[*i] > 0.0) || !n[*i].is_finite())
        })
        .count()
}

/// The mass a restricted method captured, against the exact log-normaliser (softmax target
/// only: C·V has no normalised rows); None for every other method.
/// Over the protocol's scored rows (Ô's rows).
pub fn trial_mass(
    approx: &Approximation,
    head: &HeadInputs,
    target: attention::Target,
    protocol: super::Protocol,
) -> Result<Option<f64>> {
    match (&approx.support, target) {
        (Some(_), attention::Target::Softmax) => {
            approx.mass(&protocol.scored(head.exact()?.log_rowsum()?)?)
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::Approximation;
    use crate::tensor_util::test_device;
    use candle_core::Tensor;

    #[test]
    fn flagged_rows_counts_non_finite_rows_and_non_positive_normalizers() {
        let out = Tensor::new(
            &[
                [1f32, 2.0],
                [f32::INFINITY, 0.0],
                [0.0, f32::NAN],
                [1.0, 1.0],
                [3.0, 4.0],
            ],
            &test_device(),
        )
        .unwrap();
        let plain = Approximation {
            output: out.clone(),
            normalizer: None,
            support: None,
        };
        assert_eq!(flagged_rows(&plain).unwrap(), 2);
        let norm = Tensor::new(&[1f32, 1.0, 1.0, 0.0, -2.0], &test_device()).unwrap();
        let with_norm = Approximation {
            output: out,
            normalizer: Some(norm),
            support: None,
        };
        assert_eq!(flagged_rows(&with_norm).unwrap(), 4);
    }
}
