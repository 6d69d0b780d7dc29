//! `window`: sliding-window attention (docs/reference.md §6.1.2), the token-centred local pattern of
//! Longformer (Beltagy, Peters & Cohan 2020, §3.1 "Sliding Window", without its global tokens
//! and dilation):
//!
//!   V_i = { j : |i − j| ≤ d },   Ô_i = Σ_{j∈V_i} softmax_{V_i}(q_i·k_j/√p) v_j   (§6.1 common form)
//!
//! What d means: the one-sided half-width w = d (Longformer's `attention_window` = 2d). Query i
//! visits min(i, d) + min(n−1−i, d) + 1 keys: 2d + 1 inside, d + 1 at i = 0 and n − 1 — the
//! window is truncated at the ends, neither wrapped nor shifted. Deterministic; exact iff
//! d ≥ n − 1; d = 0 gives Ô_i = v_i.
//!
//! Causal form (docs/reference.md §7.4): S_i = {j : max(0, i−d+1) ≤ j ≤ i}, the d most recent keys with
//! the diagonal — d counts keys per query, as every method under the causal mask does (§7.3).
//!
//! Cost: (n(2d+1) − d(d+1))·2p MACs ≈ 4ndp (2p per visited pair); causal Σ_i min(d, i+1)·2p. The product computes the
//! window per block of b query rows against the b + 2d keys the block's windows span, masking
//! the corners (−∞), so it does up to (b + 2d)/(2d + 1) times the counted work in exchange for
//! dense batched products; the reported cost is the visited pairs, as for every §6.1 method.

use anyhow::Result;

use crate::attention::{Approximation, Family, HeadInputs, Mask, Method, MethodInfo};
use crate::numerics::key_sets::{key_set_softmax_logits, KeyGroup};
use crate::numerics::sampling::TrialRng;

pub struct Window;

/// Query rows per block: d, but at least 16 (tiny blocks run the batched products far below
/// their speed) and at most 256 (the corners of a b×(b+2d) block are masked work).
fn block_rows(d: usize) -> usize {
    d.clamp(16, 256)
}

/// Whether query i visits key j.
pub fn visits(i: usize, j: usize, d: usize) -> bool {
    i.abs_diff(j) <= d
}

/// Blocks of consecutive query rows [a, end), each with the keys `span(a, end)` its windows reach.
fn row_blocks(
    n: usize,
    d: usize,
    span: impl Fn(usize, usize) -> std::ops::Range<usize>,
) -> Vec<KeyGroup> {
    let b = block_rows(d);
    (0..n)
        .step_by(b)
        .map(|a| {
            let end = (a + b).min(n);
            KeyGroup {
                rows: (a..end).collect(),
                keys: span(a, end).collect(),
            }
        })
        .collect()
}

/// The key sets as blocks of consecutive query rows, each with the keys its windows span.
pub fn key_groups(n: usize, d: usize) -> Vec<KeyGroup> {
    row_blocks(n, d, |a, end| {
        a.saturating_sub(d)..end.saturating_add(d).min(n)
    })
}

/// Σ_i |V_i| = n(2w+1) − w(w+1) with w = min(d, n−1).
pub fn visited_pairs(n: usize, d: usize) -> f64 {
    if n == 0 {
        return 0.0;
    }
    let (n, w) = (n as f64, d.min(n - 1) as f64);
    n * (2.0 * w + 1.0) - w * (w + 1.0)
}

/// Causal form: whether query i visits key j (the d most recent keys, diagonal included).
pub fn causal_visits(i: usize, j: usize, d: usize) -> bool {
    j <= i && i - j < d
}

/// The causal key sets as blocks of consecutive query rows, each with the keys its windows span.
pub fn causal_key_groups(n: usize, d: usize) -> Vec<KeyGroup> {
    row_blocks(n, d, |a, end| a.saturating_sub(d.saturating_sub(1))..end)
}

/// Σ_i min(d, i+1): the keys of the causal window.
pub fn causal_visited_pairs(n: usize, d: usize) -> f64 {
    let w = d.min(n) as f64;
    let n = n as f64;
    w * (w + 1.0) / 2.0 + (n - w) * w
}

const WINDOW: MethodInfo = MethodInfo {
    id: "window",
    family: Family::Sparse,
    meaning: "one-sided half-width of a token-centred window, |i − j| ≤ d (2d+1 keys inside, d+1 at the ends)",
    random: false,
    masks: MethodInfo::BOTH_MASKS,
    // §7.7.6: the set's logits are the layer's (τ, capped), the sink stays in every
    // denominator, and on a sliding layer of W the last d keys meet V_i in the last min(d, W).
    spec: crate::attention::SpecFeatures::ALL,
    ..MethodInfo::BASE
};

impl Method for Window {
    fn approximate(&self, head: &HeadInputs, d: usize, _: &mut TrialRng) -> Result<Approximation> {
        let n = head.n();
        // A layer's window (causal only, by the spec's validation) intersects the set.
        let d = head.spec.window_within(n).map_or(d, |w| d.min(w));
        let (groups, pairs) = match head.mask {
            Mask::None => (key_groups(n, d), visited_pairs(n, d)),
            Mask::Causal => (causal_key_groups(n, d), causal_visited_pairs(n, d)),
        };
        let mask = head.mask;
        let filter = move |i: usize, j: usize| match mask {
            Mask::None => visits(i, j, d),
            Mask::Causal => causal_visits(i, j, d),
        };
        let out = key_set_softmax_logits(
            &head.q,
            &head.k,
            &head.v,
            &groups,
            Some(&filter),
            true,
            head.key_logits(),
        )?;
        Approximation::restricted(out, pairs / n as f64)
    }
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        super::pair_macs(visited_pairs(n, d), p)
    }
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(&WINDOW)
    }
    fn macs_masked(&self, n: usize, p: usize, d: usize, mask: Mask) -> f64 {
        match mask {
            Mask::None => self.macs(n, p, d),
            Mask::Causal => super::pair_macs(causal_visited_pairs(n, d), p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::DType;

    use crate::attention::sparse::test_util::{
        self, assert_covering_budget_is_exact, assert_is_masked_softmax_of_its_sets,
    };
    use crate::attention::test_util::random_head;
    use crate::numerics::key_sets::tests::max_rel;

    fn out_rows(h: &HeadInputs, d: usize) -> Vec<Vec<f64>> {
        test_util::out_rows(&Window, h, d, 0)
    }

    /// The dense float64 masked softmax over |i − j| ≤ d, entry by entry; the f32 run agrees
    /// with it to f32 rounding.
    #[test]
    fn equals_the_dense_masked_softmax_in_float64() {
        let h = random_head(300, 16, 1, DType::F64);
        let ds = [0, 1, 7, 16, 40, 150, 298];
        assert_is_masked_softmax_of_its_sets(&Window, &h, &ds, 0, |d| {
            (0..h.n())
                .map(|i| (0..h.n()).filter(|&j| i.abs_diff(j) <= d).collect())
                .collect()
        });
    }

    #[test]
    fn covering_window_is_exact_attention() {
        let h = random_head(200, 32, 2, DType::F64);
        assert_covering_budget_is_exact(&Window, &h, &[199, 200, 1000], &[0]);
        // d = 0: each query sees only its own key.
        assert!(max_rel(&out_rows(&h, 0), &h.v.to_vec2::<f64>().unwrap()) < 1e-15);
    }

    /// Weights are a distribution on exactly |i − j| ≤ d: 2d+1 keys inside, d+1 at the ends.
    #[test]
    fn weights_sum_to_one_on_the_window_with_the_stated_key_counts() {
        let (n, d) = (100, 8);
        for dtype in [DType::F64, DType::F32] {
            let h = random_head(n, 8, 3, dtype);
            let supports = test_util::supports(&Window, &h, d, 0, 1e-6);
            let mut pairs = 0;
            for (i, support) in supports.iter().enumerate() {
                let want: Vec<usize> = (i.saturating_sub(d)..=(i + d).min(n - 1)).collect();
                assert_eq!(support, &want, "row {i}");
                let count = i.min(d) + (n - 1 - i).min(d) + 1;
                assert_eq!(support.len(), count);
                if (d..n - d).contains(&i) {
                    assert_eq!(count, 2 * d + 1);
                }
                pairs += count;
            }
            assert_eq!(supports[0].len(), d + 1);
            assert_eq!(supports[n - 1].len(), d + 1);
            assert_eq!(visited_pairs(n, d), pairs as f64);
        }
    }

    #[test]
    fn cost_is_the_visited_pairs_and_about_4ndp() {
        let (n, p) = (4096, 64);
        for d in [8, 64, 256] {
            let macs = Window.macs(n, p, d);
            assert_eq!(
                macs,
                2.0 * 64.0 * ((n * (2 * d + 1)) as f64 - (d * (d + 1)) as f64)
            );
            let ratio = macs / (4 * n * d * p) as f64;
            assert!((0.9..1.1).contains(&ratio), "d = {d}: {ratio}");
        }
        // Capped at n²·2p once the window covers everything.
        assert_eq!(Window.macs(10, 4, 50), 2.0 * 4.0 * 100.0);
        assert_eq!(visited_pairs(1, 5), 1.0);
        assert_eq!(visited_pairs(0, 5), 0.0);
    }

    #[test]
    fn blocks_cover_each_row_once_and_span_its_window() {
        for (n, d) in [(1, 3), (17, 0), (100, 8), (513, 64), (64, 300)] {
            let groups = key_groups(n, d);
            let mut rows: Vec<usize> = groups.iter().flat_map(|g| g.rows.clone()).collect();
            rows.sort_unstable();
            assert_eq!(rows, (0..n).collect::<Vec<_>>());
            for g in &groups {
                for &i in &g.rows {
                    let want = i.saturating_sub(d)..=(i + d).min(n - 1);
                    assert!(
                        want.clone().all(|j| g.keys.contains(&j)),
                        "n {n} d {d} row {i}"
                    );
                }
            }
        }
    }

    /// The causal form: the d most recent keys, diagonal included (docs/reference.md §7.4), with its
    /// keys and mass; n = 301 is not a multiple of the block.
    #[test]
    fn causal_form_equals_the_dense_masked_softmax_with_keys_and_mass() {
        let h = random_head(301, 16, 2, DType::F64);
        crate::attention::test_util::assert_causal_restricted(
            &Window,
            &h,
            &[1, 2, 16, 40, 301, 400],
            |i, j, d| j <= i && i - j < d,
        );
    }
}
