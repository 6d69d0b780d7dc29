//! `moba`: block gating by mean keys (docs/reference.md §7.5.4) — MoBA (Lu et al. 2025, "MoBA: Mixture of
//! Block Attention for Long-Context LLMs", §2.2, the gate s_i = ⟨q, mean_pool(K[I_i])⟩; code
//! `MoonshotAI/MoBA`), applied as a training-free mask (as MInference's `moba.py` applies it):
//!
//!   g(q, t) = q · mean_{j∈t} k_j over pages of b = 16 keys;
//!   S_i = keys ⌊i/b⌋b..=i of the page holding i ∪ the keys of the ⌈d/b⌉ − 1 complete past pages
//!         with the largest g(q_i, t), ties to the lower page.
//!
//! `quest`'s page selector ([`super::select::page_sets`]) with the mean instead of the bound: the
//! two differ only in the estimator. [P≠C] MoBA's blocks are 512–4096 tokens and its model is
//! trained with the gate; here it is a mask on a pretrained model with b = 16.
//!
//! What d means: keys per query (§7.3), in whole pages, as `quest`. Deterministic; exact once
//! d ≥ n.
//!
//! Cost: p per (row, past page) for the gate, Σ_i ⌊i/b⌋·p ≈ n²p/(2b) (one product against the
//! mean key, half of `quest`'s two bound products), + n·p for the page means + 2p per visited pair.

use anyhow::Result;

use super::quest::scored_pairs;
use super::select::{
    block_means, checked_n, host_f64, merged_rows, page_sets, page_visited_pairs, restricted,
    scored_count, B,
};
use crate::attention::sparse::pair_macs;
use crate::attention::{Approximation, HeadInputs, Method, MethodInfo};
use crate::numerics::sampling::TrialRng;

pub struct Moba;

impl Method for Moba {
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(&super::MOBA)
    }
    fn approximate(&self, head: &HeadInputs, d: usize, _: &mut TrialRng) -> Result<Approximation> {
        let n = checked_n(self, head, d)?;
        let means = if n >= B {
            Some(block_means(&head.k)?)
        } else {
            None
        };
        let (sets, filter) = page_sets(n, d, |start, len, pages| {
            let kbar = means
                .as_ref()
                .expect("pages are scored only when one is complete");
            let g = head
                .q
                .narrow(0, start, len)?
                .matmul(&kbar.narrow(0, 0, pages)?.t()?)?;
            host_f64(&g)
        })?;
        let visits = |i: usize, j: usize| filter.visits(i, j);
        restricted(head, &merged_rows(sets), Some(&visits))
    }
    /// The causal cost (the method has no other form).
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        let scores = if scored_count(d, 1) == 0 {
            0.0
        } else {
            p as f64 * (scored_pairs(n) + n as f64)
        };
        scores + pair_macs(page_visited_pairs(n, d), p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::prefill::test_util::{support_and_weights, tied_head};

    /// Ties (q = 0) go to the lowest pages: n = 50, d = 48 keeps pages 0 and 1 for row 49.
    #[test]
    fn ties_go_to_the_lowest_pages() {
        let (n, d) = (50, 48);
        let (sets, mass, keys) = support_and_weights(&Moba, &tied_head(n, 8), d);
        assert_eq!(sets[49], (0..32).chain(48..50).collect::<Vec<_>>());
        assert_eq!(sets[40], (0..41).collect::<Vec<_>>());
        let want: Vec<usize> = (0..n).map(|i| i % 16 + 1 + 16 * (i / 16).min(2)).collect();
        assert_eq!(sets.iter().map(|s| s.len()).collect::<Vec<_>>(), want);
        assert_eq!(keys, page_visited_pairs(n, d) / n as f64);
        let m = (0..n).map(|i| want[i] as f64 / (i + 1) as f64).sum::<f64>() / n as f64;
        assert!((mass - m).abs() < 1e-12);
    }
}
