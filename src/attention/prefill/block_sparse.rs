//! `block_sparse`: mean-pooled block selection (docs/reference.md §7.5.5) — MInference's block-sparse
//! pattern (Jiang et al., NeurIPS 2024, "MInference 1.0", §3.2 "Block-Sparse", the estimate
//! softmax(pool(Q)·pool(K)ᵀ); code `microsoft/MInference`) and the Sparse Frontier's
//! "Block-Sparse" (Nawrot et al. 2025):
//!
//!   blocks of b = 16 queries and keys; Q̄_a, K̄_c = the mean q (k) row of block a (c);
//!   query block a keeps the diagonal block a (causal inside) and key block 0, then the
//!   ⌈d/b⌉ − 2 blocks 0 < c < a with the largest Q̄_a·K̄_c (ties to the lower block);
//!   every query of block a visits the kept blocks' keys j ≤ i.
//!
//! The block selector is [`super::select::block_pattern`], shared with `xattention`, which
//! differs only in the estimator. A ragged last block (b ∤ n) is a query block whose mean is over
//! the rows it has; it is never a past key block. Ranking by Q̄·K̄ is the ranking of MInference's
//! softmax over the pooled logits (monotone per query block).
//!
//! What d means: keys per query (§7.3), in whole blocks: a row of block a > 0 visits
//! b·(1 + min(⌈d/b⌉ − 2, a − 1)) + (i − ab + 1) keys — at d = 16 the two fixed blocks
//! (≈ 24.5 keys), more than d. Deterministic; exact once d ≥ n.
//!
//! Cost: (n/b)²·p/2 for the block scores + 2p per visited pair. The product runs one key group per
//! query block (the 16 rows share the gathered keys; the causal filter masks the diagonal block).

use anyhow::Result;

use super::select::{block_count, block_macs, block_means, block_selection, host_f64};
use crate::attention::{Approximation, HeadInputs, Method, MethodInfo};
use crate::numerics::sampling::TrialRng;

pub struct BlockSparse;

impl Method for BlockSparse {
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(&super::BLOCK_SPARSE)
    }
    fn approximate(&self, head: &HeadInputs, d: usize, _: &mut TrialRng) -> Result<Approximation> {
        block_selection(self, head, d, || {
            let (qbar, kbar) = (block_means(&head.q)?, block_means(&head.k)?);
            host_f64(&qbar.matmul(&kbar.t()?)?)
        })
    }
    /// The causal cost (the method has no other form).
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        let nb = block_count(n) as f64;
        block_macs(n, p, d, nb * nb * p as f64 / 2.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::prefill::select::block_visited_pairs;
    use crate::attention::prefill::test_util::{
        blocks_to_visits, stable_top, support_and_weights, tied_head,
    };
    use crate::attention::test_util::{assert_causal_restricted, host_rows, random_head};
    use candle_core::DType;

    /// §7.5.5 entry by entry: block means in loops (the ragged block over its own rows), the
    /// dot products, a stable sort of 0 < c < a.
    fn blocks_by_definition(q: &[Vec<f64>], k: &[Vec<f64>], d: usize) -> Vec<Vec<usize>> {
        let (n, p) = (q.len(), q[0].len());
        let nb = n.div_ceil(16);
        let mean = |x: &[Vec<f64>], a: usize| -> Vec<f64> {
            let rows = 16 * a..(16 * a + 16).min(n);
            let len = rows.len() as f64;
            (0..p)
                .map(|c| rows.clone().map(|j| x[j][c]).sum::<f64>() / len)
                .collect()
        };
        let m = d.div_ceil(16).saturating_sub(2);
        (0..nb)
            .map(|a| {
                let qa = mean(q, a);
                let s: Vec<f64> = (1..a)
                    .map(|c| qa.iter().zip(mean(k, c)).map(|(x, y)| x * y).sum())
                    .collect();
                let mut kept: Vec<usize> = stable_top(&s, m).iter().map(|c| c + 1).collect();
                kept.push(0);
                kept.push(a);
                kept
            })
            .collect()
    }

    #[test]
    fn equals_the_dense_masked_softmax_over_the_mean_selected_blocks() {
        // n = 203: a ragged last block of 11 rows.
        let h = random_head(203, 16, 41, DType::F64);
        let [q, k, _] = host_rows(&h);
        let ds = [1, 16, 32, 33, 48, 100, 203];
        let blocks: Vec<_> = ds
            .iter()
            .map(|&d| blocks_by_definition(&q, &k, d))
            .collect();
        let by_d: Vec<_> = blocks.iter().map(|b| blocks_to_visits(b)).collect();
        assert_causal_restricted(&BlockSparse, &h, &ds, |i, j, d| {
            by_d[ds.iter().position(|&x| x == d).unwrap()](i, j)
        });
    }

    /// Ties (q = 0) go to the lowest blocks; the two fixed blocks exceed d = 16; n = 50 ends with
    /// a block of 2 rows.
    #[test]
    fn fixed_blocks_ties_and_a_ragged_block_by_hand() {
        let (n, h) = (50, tied_head(50, 8));
        let (sets, mass, keys) = support_and_weights(&BlockSparse, &h, 16);
        assert_eq!(sets[40], (0..16).chain(32..41).collect::<Vec<_>>());
        assert_eq!(sets[49], (0..16).chain(48..50).collect::<Vec<_>>());
        assert_eq!(sets[20], (0..21).collect::<Vec<_>>());
        let want: Vec<usize> = (0..n)
            .map(|i| i % 16 + 1 + if i >= 16 { 16 } else { 0 })
            .collect();
        assert_eq!(sets.iter().map(|s| s.len()).collect::<Vec<_>>(), want);
        assert_eq!(keys, block_visited_pairs(n, 16) / n as f64);
        let m = (0..n).map(|i| want[i] as f64 / (i + 1) as f64).sum::<f64>() / n as f64;
        assert!((mass - m).abs() < 1e-12);
        // d = 48: one scored block, the lowest c > 0 on ties.
        let (sets, _, _) = support_and_weights(&BlockSparse, &h, 48);
        assert_eq!(sets[49], (0..32).chain(48..50).collect::<Vec<_>>());
    }
}
