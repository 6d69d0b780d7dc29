//! `streaming`: attention sinks + a recent window (docs/reference.md §7.5.1) — StreamingLLM (Xiao, Tian,
//! Chen, Han & Lewis, ICLR 2024, "Efficient Streaming Language Models with Attention Sinks", §3.2;
//! code `mit-han-lab/streaming-llm`, `streaming_llm/kv_cache.py`, start_size = 4), MInference's
//! "A-shape" pattern:
//!
//!   S_i = {j < s, j ≤ i} ∪ {j : max(0, i − (d − s) + 1) ≤ j ≤ i},   s = 4 sinks,
//!   Ô_i = Σ_{j∈S_i} softmax_{S_i}(q_i·k_j/√p) v_j.
//!
//! What d means: keys per query (§7.3): 4 sinks + a window of w = d − 4 recent keys (the diagonal
//! included); |S_i| = min(w, i+1) + min(4, max(0, i − w + 1)) ≤ d. `window` plus the first four
//! tokens. d < 8 is refused (§7.5.1). Deterministic; exact once d ≥ n.
//! [P≠C] StreamingLLM re-indexes positions inside its cache at decode time; prefill uses the
//! original positions (the Q/K handed in are post-RoPE at positions 0..n−1).
//!
//! Cost: 2p per visited pair, Σ_i |S_i|·2p ≈ 2ndp. The product runs blocks of consecutive query
//! rows against the sinks and the keys their windows span, masking the rest (as `window` does).

use anyhow::Result;

use super::select::{checked_n, restricted, SINKS};
use crate::attention::sparse::pair_macs;
use crate::attention::{Approximation, HeadInputs, Method, MethodInfo};
use crate::numerics::key_sets::KeyGroup;
use crate::numerics::sampling::TrialRng;

pub struct Streaming;

/// The smallest budget: the 4 sinks and a window of 4.
pub const MIN_D: usize = 2 * SINKS;

/// Whether query i visits key j at budget d.
pub fn visits(i: usize, j: usize, d: usize) -> bool {
    j <= i && (j < SINKS || i - j < d - SINKS)
}

/// Σ_i |S_i| = Σ_i min(w, i+1) + min(s, max(0, i − w + 1)), w = d − s.
pub fn visited_pairs(n: usize, d: usize) -> f64 {
    let w = d - SINKS;
    (0..n)
        .map(|i| w.min(i + 1) + SINKS.min((i + 1).saturating_sub(w)))
        .sum::<usize>() as f64
}

/// Blocks of consecutive query rows with the sinks and the keys their windows span.
pub fn key_groups(n: usize, d: usize) -> Vec<KeyGroup> {
    let w = d - SINKS;
    let b = w.clamp(16, 256);
    (0..n)
        .step_by(b)
        .map(|a| {
            let end = (a + b).min(n);
            let lo = a.saturating_sub(w - 1);
            KeyGroup {
                rows: (a..end).collect(),
                keys: (0..SINKS.min(lo)).chain(lo..end).collect(),
            }
        })
        .collect()
}

impl Method for Streaming {
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(&super::STREAMING)
    }
    fn approximate(&self, head: &HeadInputs, d: usize, _: &mut TrialRng) -> Result<Approximation> {
        checked_n(self, head, d)?;
        let filter = move |i: usize, j: usize| visits(i, j, d);
        restricted(head, &key_groups(head.n(), d), Some(&filter))
    }
    fn check(&self, _n: usize, d: usize) -> std::result::Result<(), String> {
        if d < MIN_D {
            return Err(format!(
                "streaming needs d ≥ {MIN_D} (4 sinks + a window of at least 4)"
            ));
        }
        Ok(())
    }
    /// The causal cost (the method has no other form).
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        pair_macs(visited_pairs(n, d.max(MIN_D)), p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::prefill::test_util::{support_and_weights, tied_head};
    use crate::attention::test_util::{assert_causal_restricted, random_head};
    use crate::attention::Mask;
    use candle_core::DType;

    /// The dense float64 masked softmax over §7.5.1's sets, with keys and mass; n = 301 is not a
    /// multiple of the row block, and d = 8 leaves a window of 4.
    #[test]
    fn equals_the_dense_masked_softmax_of_sinks_and_window() {
        let h = random_head(301, 16, 5, DType::F64);
        assert_causal_restricted(&Streaming, &h, &[8, 9, 20, 64, 300], |i, j, d| {
            j <= i && (j < 4 || j + (d - 4) > i)
        });
    }

    /// Hand-built: with q = 0 every logit ties, so the weights are 1/|S_i| on S_i and the mass is
    /// |S_i|/(i+1). d = 10 → w = 6: rows 0..5 dense, row 6 keeps 0..6 (the sinks meet the
    /// window), row 20 keeps {0, 1, 2, 3} ∪ {15..20}.
    #[test]
    fn first_rows_and_set_sizes_by_hand() {
        let (n, d) = (37, 10);
        let h = tied_head(n, 8);
        let (sets, mass, keys) = support_and_weights(&Streaming, &h, d);
        for (i, set) in sets.iter().enumerate().take(10) {
            assert_eq!(*set, (0..=i).collect::<Vec<_>>(), "row {i}");
        }
        assert_eq!(sets[10], vec![0, 1, 2, 3, 5, 6, 7, 8, 9, 10]);
        assert_eq!(sets[20], vec![0, 1, 2, 3, 15, 16, 17, 18, 19, 20]);
        let want: Vec<usize> = (0..n).map(|i| (i + 1).min(d)).collect();
        let got: Vec<usize> = sets.iter().map(|s| s.len()).collect();
        assert_eq!(got, want);
        assert_eq!(keys, want.iter().sum::<usize>() as f64 / n as f64);
        let m = (0..n).map(|i| want[i] as f64 / (i + 1) as f64).sum::<f64>() / n as f64;
        assert!((mass - m).abs() < 1e-12, "{mass} vs {m}");
        assert_eq!(visited_pairs(n, d), want.iter().sum::<usize>() as f64);
    }

    #[test]
    fn small_budgets_and_the_bidirectional_mask_are_refused() {
        assert!(Streaming.check(100, 7).is_err() && Streaming.check(100, 8).is_ok());
        let h = crate::attention::test_util::causal(&random_head(20, 4, 1, DType::F64));
        let mut rng = <TrialRng as rand::SeedableRng>::seed_from_u64(0);
        assert!(Streaming.approximate(&h, 4, &mut rng).is_err());
    }

    #[test]
    fn cost_is_two_p_per_visited_pair() {
        // n = 4096, d = 256: every row but the first 252 visits 256 keys.
        let (n, p, d) = (4096, 64, 256);
        let pairs: usize = (0..n).map(|i| (i + 1).min(d)).sum();
        assert_eq!(
            Streaming.macs_masked(n, p, d, Mask::Causal),
            (2 * p * pairs) as f64
        );
    }
}
