//! One trial's measurement, shared by every protocol: what Ô is flagged for, the mass its rows
//! captured, and the cache columns (`keys`, `kv_bits`, `kv_read`) of docs/reference.md §7.2, §8.5, §9.1.

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
pub fn trial_mass(
    approx: &Approximation,
    head: &HeadInputs,
    target: attention::Target,
) -> Result<Option<f64>> {
    match (&approx.support, target) {
        (Some(_), attention::Target::Softmax) => {
            approx.mass(&head.scored(head.exact()?.log_rowsum()?)?)
        }
        _ => Ok(None),
    }
}

/// A trial's `mass`, `keys`, `kv_bits` and `kv_read` (docs/reference.md §8.5): a method without a budget
/// (the §8 family) visits every key (the dense count, mass 1) at its own width; a
/// restrict-and-renormalise method (one with a key support) reads its keys from an f16 cache (16
/// bits); every other method reads no cache (all four empty but what it measured). Under the
/// decode protocol (`decode` = n_f, §9.1) the rows are the continuation's: the dense count is the
/// mean of t + 1 over F and `kv_read`'s denominator Σ_{t∈F}(t + 1).
pub fn cache_columns(
    m: &dyn attention::Method,
    measured_mass: Option<f64>,
    measured_keys: Option<f64>,
    n: usize,
    mask: attention::Mask,
    decode: Option<usize>,
) -> (Option<f64>, Option<f64>, Option<f64>, Option<f64>) {
    use attention::quantized::{dense_keys, kv_read_of};
    let dense = match decode {
        Some(n_f) => attention::decode::dense_pairs(n, n_f) / n_f as f64,
        None => dense_keys(n, mask),
    };
    let (mass, keys) = if m.has_budget() {
        (measured_mass, measured_keys)
    } else {
        (Some(1.0), Some(dense))
    };
    let bits = match decode {
        Some(n_f) => m.kv_bits_decode(n, n_f),
        None => m.kv_bits(n),
    };
    let kv_bits = bits.or(measured_keys.map(|_| 16.0));
    let read = match (kv_bits, keys) {
        (Some(b), Some(k)) => Some(kv_read_of(b, k, dense)),
        _ => None,
    };
    (mass, keys, kv_bits, read)
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
