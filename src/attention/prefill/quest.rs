//! `quest`: query-aware page selection (docs/reference.md §7.5.3) — Quest (Tang, Zhao, Zhu, Xiao, Kasikci
//! & Han, ICML 2024, "Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference", §3.2,
//! Algorithm 1; code `mit-han-lab/Quest`), applied at every prefill query:
//!
//!   pages of b = 16 keys; m_tc = min_{j∈t} k_jc, M_tc = max_{j∈t} k_jc;
//!   U(q, t) = Σ_c max(q_c·m_tc, q_c·M_tc)   (an upper bound on max_{j∈t} q·k_j);
//!   S_i = keys ⌊i/b⌋b..=i of the page holding i ∪ the keys of the ⌈d/b⌉ − 1 complete past pages
//!         t < ⌊i/b⌋ with the largest U(q_i, t), ties to the lower page.
//!
//! The page selector is [`super::select::page_sets`], shared with `moba`, which differs only in
//! the score. U is computed as q⁺·Mᵀ + q⁻·mᵀ (q⁺ = max(q, 0), q⁻ = min(q, 0)): per channel the max
//! of the two products is q_c·M_c when q_c ≥ 0 and q_c·m_c when q_c < 0, so the two forms are the
//! same sum (two products per channel, as the definition's max of two).
//!
//! What d means: keys per query (§7.3), in whole pages: |S_i| = (i mod b) + 1 + b·min(⌈d/b⌉ − 1,
//! ⌊i/b⌋); at d = 16 only the own page (8.5 keys on average). Deterministic; exact once d ≥ n.
//!
//! Cost: 2p per (row, past page) for U — Σ_i ⌊i/b⌋·2p ≈ n²p/b, quadratic over 16: Quest runs
//! its estimate per decoded token, and the Sparse Frontier found it too costly for prefill, which
//! this cost shows — + 2p per visited pair. (§7.5.3 writes "p per (row, past page) score: n²p/b";
//! the two disagree by 2: Σ_i ⌊i/b⌋ ≈ n²/(2b), so n²p/b is 2p per pair, the two bound products.)

use anyhow::Result;

use super::select::{
    block_bounds, checked_n, host_f64, merged_rows, page_sets, page_visited_pairs, restricted,
    scored_count, B,
};
use crate::attention::sparse::pair_macs;
use crate::attention::{Approximation, HeadInputs, Method, MethodInfo};
use crate::numerics::sampling::TrialRng;

pub struct Quest;

/// Σ_i ⌊i/b⌋: the (row, past page) pairs a page score is computed for.
pub fn scored_pairs(n: usize) -> f64 {
    (0..n).map(|i| i / B).sum::<usize>() as f64
}

impl Method for Quest {
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(&super::QUEST)
    }
    fn approximate(&self, head: &HeadInputs, d: usize, _: &mut TrialRng) -> Result<Approximation> {
        let n = checked_n(self, head, d)?;
        let bounds = if n >= B {
            Some(block_bounds(&head.k)?)
        } else {
            None
        };
        let (sets, filter) = page_sets(n, d, |start, len, pages| {
            let (lo, hi) = bounds
                .as_ref()
                .expect("pages are scored only when one is complete");
            let q = head.q.narrow(0, start, len)?;
            let (qp, qn) = (q.relu()?, q.minimum(0.0)?);
            let u = (qp.matmul(&hi.narrow(0, 0, pages)?.t()?)?
                + qn.matmul(&lo.narrow(0, 0, pages)?.t()?)?)?;
            host_f64(&u)
        })?;
        let visits = |i: usize, j: usize| filter.visits(i, j);
        restricted(head, &merged_rows(sets), Some(&visits))
    }
    /// The causal cost (the method has no other form).
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        let scores = if scored_count(d, 1) == 0 {
            0.0
        } else {
            2.0 * p as f64 * scored_pairs(n)
        };
        scores + pair_macs(page_visited_pairs(n, d), p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::prefill::test_util::{
        assert_equals_its_sets, page_head, page_sets_from_scores, support_and_weights, tied_head,
    };
    use crate::attention::test_util::{host_rows, random_head};
    use crate::attention::Mask;
    use candle_core::DType;

    /// §7.5.3 entry by entry: page minima and maxima in loops, U as the max of the two products
    /// per channel, a stable sort of the past pages.
    pub(crate) fn sets_by_definition(q: &[Vec<f64>], k: &[Vec<f64>], d: usize) -> Vec<Vec<bool>> {
        let (n, p) = (q.len(), q[0].len());
        let pages = n / 16;
        let bound = |t: usize, c: usize, f: fn(f64, f64) -> f64| {
            (16 * t..16 * t + 16).map(|j| k[j][c]).reduce(f).unwrap()
        };
        let lo: Vec<Vec<f64>> = (0..pages)
            .map(|t| (0..p).map(|c| bound(t, c, f64::min)).collect())
            .collect();
        let hi: Vec<Vec<f64>> = (0..pages)
            .map(|t| (0..p).map(|c| bound(t, c, f64::max)).collect())
            .collect();
        page_sets_from_scores(n, d, |i, t| {
            (0..p)
                .map(|c| (q[i][c] * lo[t][c]).max(q[i][c] * hi[t][c]))
                .sum()
        })
    }

    #[test]
    fn the_page_methods_equal_the_dense_masked_softmax_over_their_pages() {
        // n = 203: 12 complete pages and a ragged one. Quest by its bound, MoBA by its mean key.
        let ds = [1, 16, 17, 40, 64, 150];
        let h = random_head(203, 16, 31, DType::F64);
        let [q, k, _] = host_rows(&h);
        assert_equals_its_sets(&Quest, &h, &ds, |d| sets_by_definition(&q, &k, d));
        let h = random_head(203, 16, 32, DType::F64);
        let [q, k, _] = host_rows(&h);
        assert_equals_its_sets(&crate::attention::prefill::moba::Moba, &h, &ds, |d| {
            mean_sets_by_definition(&q, &k, d)
        });
    }

    /// MoBA's sets (§7.5.4) entry by entry: page means in loops, g = q·mean, a stable sort of the past pages.
    fn mean_sets_by_definition(q: &[Vec<f64>], k: &[Vec<f64>], d: usize) -> Vec<Vec<bool>> {
        let (n, p) = (q.len(), q[0].len());
        let means: Vec<Vec<f64>> = (0..n / 16)
            .map(|t| {
                (0..p)
                    .map(|c| (16 * t..16 * t + 16).map(|j| k[j][c]).sum::<f64>() / 16.0)
                    .collect()
            })
            .collect();
        page_sets_from_scores(n, d, |i, t| (0..p).map(|c| q[i][c] * means[t][c]).sum())
    }

    /// Ties (q = 0: every U is 0) go to the lowest pages; n = 37 has a ragged third page.
    #[test]
    fn ties_first_rows_and_a_ragged_page_by_hand() {
        let (n, d) = (37, 32);
        let (sets, mass, keys) = support_and_weights(&Quest, &tied_head(n, 8), d);
        for (i, set) in sets.iter().enumerate().take(16) {
            assert_eq!(*set, (0..=i).collect::<Vec<_>>());
        }
        assert_eq!(sets[20], (0..=20).collect::<Vec<_>>());
        assert_eq!(sets[35], (0..16).chain(32..36).collect::<Vec<_>>());
        let want: Vec<usize> = (0..n).map(|i| i % 16 + 1 + 16 * (i / 16).min(1)).collect();
        assert_eq!(sets.iter().map(|s| s.len()).collect::<Vec<_>>(), want);
        assert_eq!(keys, want.iter().sum::<usize>() as f64 / n as f64);
        assert_eq!(keys, page_visited_pairs(n, d) / n as f64);
        let m = (0..n).map(|i| want[i] as f64 / (i + 1) as f64).sum::<f64>() / n as f64;
        assert!((mass - m).abs() < 1e-12);
    }

    /// The bound sees one large key in page 0 where the mean sees a uniformly larger page 1:
    /// quest keeps page 0 (U = 10 > 1), moba page 1 (mean 1 > 10/16).
    #[test]
    fn the_bound_keeps_the_page_with_one_large_key() {
        let h = page_head();
        let (sets, _, _) = support_and_weights(&Quest, &h, 32);
        assert_eq!(sets[40], (0..16).chain(32..41).collect::<Vec<_>>());
        let (sets, _, _) = support_and_weights(&super::super::moba::Moba, &h, 32);
        assert_eq!(sets[40], (16..41).collect::<Vec<_>>());
    }

    #[test]
    fn cost_is_quadratic_over_b() {
        let (n, p) = (8192, 64);
        let scores =
            Quest.macs_masked(n, p, 256, Mask::Causal) - pair_macs(page_visited_pairs(n, 256), p);
        let ratio = scores / ((n * n * p) as f64 / 16.0);
        assert!((0.99..1.0).contains(&ratio), "{ratio}");
        // d = 16 scores nothing: only the own page is kept.
        assert_eq!(
            Quest.macs_masked(n, p, 16, Mask::Causal),
            pair_macs(page_visited_pairs(n, 16), p)
        );
    }
}
