//! One-dimensional pooling of a score vector with stride 1, as `torch.nn.functional.max_pool1d`
//! and `avg_pool1d` compute it (docs/reference.md §9.2: SnapKV, PyramidKV and Ada-KV smooth their
//! per-position scores before the top-k). The output has len + 2·padding − kernel + 1 entries
//! (= len for kernel 7, padding 3 and kernel 5, padding 2). Max pooling pads with −∞; average
//! pooling pads with zeros and counts them (PyTorch's default `count_include_pad=True`).

/// Max pooling: out_j = max(x_{j−padding} … x_{j−padding+kernel−1}), padding −∞. NaN wins (as in
/// PyTorch), so a poisoned score is not hidden.
pub fn max_pool1d(x: &[f64], kernel: usize, padding: usize) -> Vec<f64> {
    window_map(x, kernel, padding, |w| {
        w.iter().fold(f64::NEG_INFINITY, |m, &v| {
            if v.is_nan() || m.is_nan() {
                f64::NAN
            } else {
                m.max(v)
            }
        })
    })
}

/// Average pooling with the padded zeros counted: out_j = Σ_window x / kernel.
pub fn avg_pool1d(x: &[f64], kernel: usize, padding: usize) -> Vec<f64> {
    window_map(x, kernel, padding, |w| {
        w.iter().sum::<f64>() / kernel as f64
    })
}

/// `f` over every window of `kernel` entries of `x` padded by `padding` on both sides, where a
/// padded entry is absent from the window slice (max: −∞; average: zero, counted by the caller's
/// divisor).
fn window_map(x: &[f64], kernel: usize, padding: usize, f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    assert!(
        kernel > 0 && padding <= kernel / 2,
        "PyTorch requires padding ≤ kernel/2"
    );
    let len = (x.len() + 2 * padding + 1).saturating_sub(kernel);
    (0..len)
        .map(|j| {
            // Window [j − padding, j − padding + kernel) ∩ [0, len(x)).
            let lo = j.saturating_sub(padding);
            let hi = (j + kernel).saturating_sub(padding).min(x.len());
            f(&x[lo.min(hi)..hi])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_by_hand_as_pytorch_computes_it() {
        let x = [1.0, 5.0, 2.0, 0.0, 3.0, -1.0, 4.0, 2.0];
        // torch.nn.functional.max_pool1d(x, 7, 1, 3) (checked with PyTorch 2.15):
        assert_eq!(
            max_pool1d(&x, 7, 3),
            vec![5.0, 5.0, 5.0, 5.0, 5.0, 4.0, 4.0, 4.0]
        );
        // avg_pool1d(x, 5, 1, 2) (zeros counted): e.g. out_0 = (0 + 0 + 1 + 5 + 2)/5.
        let want = [8.0, 8.0, 11.0, 9.0, 8.0, 8.0, 8.0, 5.0].map(|v: f64| v / 5.0);
        let got = avg_pool1d(&x, 5, 2);
        assert_eq!(got.len(), want.len());
        for (a, b) in got.iter().zip(want) {
            assert!((a - b).abs() < 1e-15, "{got:?}");
        }
        // A kernel larger than the input still gives len entries; ties stay exact copies.
        assert_eq!(max_pool1d(&[2.0, 2.0], 7, 3), vec![2.0, 2.0]);
        assert_eq!(max_pool1d(&[], 7, 3), Vec::<f64>::new());
        assert!(max_pool1d(&[1.0, f64::NAN, 0.0], 3, 1)
            .iter()
            .all(|v| v.is_nan()));
    }
}
