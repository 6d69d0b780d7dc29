//! `xattention`: antidiagonal block scoring with a fixed budget (docs/reference.md §7.5.7) — XAttention
//! (Xu, Guo, Han et al. 2025, "XAttention: Block Sparse Attention with Antidiagonal Scoring", §2.1–2.2;
//! code `mit-han-lab/x-attention`):
//!
//!   stride S = 4, blocks of b = 16; strided rows q̃_a = concat_{t<S} q_{aS+S−1−t},
//!   k̃_c = concat_{t<S} k_{cS+t} (S·p long), so q̃_a·k̃_c sums one antidiagonal of the S×S logit
//!   square; W_ac = softmax over c ≤ a of q̃_a·k̃_c/(√p·S) (causal a ≥ c);
//!   score(A, C) = Σ of W_ac over the (b/S)² strided entries of query block A × key block C;
//!   query block A keeps the diagonal block and block 0, then the ⌈d/b⌉ − 2 blocks 0 < C < A with
//!   the largest score (ties to the lower block); its rows visit the kept keys j ≤ i.
//!
//! The block selector is [`super::select::block_pattern`], shared with `block_sparse`.
//! [REC] When S ∤ n the last partial stride group is left out of the estimate (as a query and as a
//! key); a ragged last block is scored from its complete stride groups — with none (n mod 16 < 4)
//! every score of that block is 0 and the tie rule keeps the lowest blocks.
//! [P≠C] XAttention keeps blocks until a cumulative threshold τ of the estimated mass; the fixed
//! count puts it on the d axis (`mass` shows what it captures).
//!
//! What d means: keys per query (§7.3), in whole blocks, as `block_sparse`. Deterministic; exact
//! once d ≥ n.
//!
//! Cost: the strided logits of c ≤ a, G(G+1)/2·S·p ≈ n²p/(2S) with G = ⌊n/S⌋, + 2p per visited
//! pair. §7.5.7 writes n²p/S² for the estimate; from its own definition (G²/2 pairs of S·p-long
//! vectors) it is n²p/(2S) — 1/8 of exact causal attention's n²p at S = 4, not 1/16. The count
//! here follows the definition.

use anyhow::Result;
use candle_core::{Tensor, D};

use super::select::{block_count, block_macs, block_selection, host_f64, B};
use crate::attention::exact::map_masked_score_blocks;
use crate::attention::{Approximation, HeadInputs, Mask, Method, MethodInfo};
use crate::numerics::sampling::TrialRng;

pub struct XAttention;

/// The stride S.
pub const STRIDE: usize = 4;

/// The block scores score(A, C) ([nb, nb] row-major, host f64; only C ≤ A is non-zero) from the
/// antidiagonal estimate. Never forms more than a block of rows of the G×G strided logits.
pub fn antidiagonal_scores(q: &Tensor, k: &Tensor) -> Result<Vec<f64>> {
    antidiagonal_scores_under(q, k, None)
}

/// [`antidiagonal_scores`] under a layer's logits (docs/reference.md §7.7.6): the strided logit,
/// an average of S logits, is τ·q̃·k̃/S and is capped before its softmax. The estimate's softmax
/// stays over every c ≤ a, with no sink and no window: it ranks blocks, and the kept blocks then
/// meet the window in [`super::select::restricted`]. (The specification says where the cap goes
/// and is silent on the window and the sink here; ranking over the whole past is what the method
/// computes on a layer without them.)
pub fn antidiagonal_scores_under(
    q: &Tensor,
    k: &Tensor,
    logits: Option<(f64, Option<f64>)>,
) -> Result<Vec<f64>> {
    let (n, p) = q.dims2()?;
    let (g, nb, per) = (n / STRIDE, block_count(n), B / STRIDE);
    let mut score = vec![0.0; nb * nb];
    if g == 0 {
        return Ok(score);
    }
    let rev: Vec<u32> = (0..g)
        .flat_map(|a| (0..STRIDE).map(move |t| (a * STRIDE + STRIDE - 1 - t) as u32))
        .collect();
    let rev = Tensor::from_vec(rev, g * STRIDE, q.device())?;
    let (scale, softcap) = match logits {
        None => (1.0 / ((p as f64).sqrt() * STRIDE as f64), None),
        Some((tau, cap)) => (tau / STRIDE as f64, cap),
    };
    let qt = (q.index_select(&rev, 0)?.reshape((g, STRIDE * p))? * scale)?;
    let kt = k
        .narrow(0, 0, g * STRIDE)?
        .reshape((g, STRIDE * p))?
        .t()?
        .contiguous()?;
    // Per block of strided rows: W over c ≤ a, summed over the key blocks' stride groups.
    let w = map_masked_score_blocks(&qt, &kt, Mask::Causal, |_start, len, s| {
        let cols = s.dim(D::Minus1)?;
        let e = match softcap {
            None => host_f64(&candle_nn::ops::softmax_last_dim(&s)?)?,
            Some(c) => capped_softmax_rows(&host_f64(&s)?, cols, c),
        };
        let mut out = vec![0.0; len * nb];
        for r in 0..len {
            for (c, x) in e[r * cols..(r + 1) * cols].iter().enumerate() {
                out[r * nb + c / per] += x;
            }
        }
        Ok(Tensor::from_vec(out, (len, nb), s.device())?)
    })?;
    let w = host_f64(&w)?;
    for a in 0..g {
        let qa = a / per;
        for c in 0..nb {
            score[qa * nb + c] += w[a * nb + c];
        }
    }
    Ok(score)
}

/// Row-wise softmax of host logits (`cols` a row, −∞ for masked entries) after the cap
/// s → c·tanh(s/c), which leaves −∞ masked.
fn capped_softmax_rows(s: &[f64], cols: usize, c: f64) -> Vec<f64> {
    let mut out = Vec::with_capacity(s.len());
    for row in s.chunks(cols) {
        let capped: Vec<f64> = row
            .iter()
            .map(|&x| {
                if x == f64::NEG_INFINITY {
                    x
                } else {
                    c * (x / c).tanh()
                }
            })
            .collect();
        let m = capped.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = capped.iter().map(|x| (x - m).exp()).sum();
        out.extend(capped.iter().map(|x| (x - m).exp() / z));
    }
    out
}

impl Method for XAttention {
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(&super::XATTENTION)
    }
    fn approximate(&self, head: &HeadInputs, d: usize, _: &mut TrialRng) -> Result<Approximation> {
        let logits = (!head.spec.features(head.p(), head.n()).is_plain())
            .then_some((head.spec.scale, head.spec.softcap));
        block_selection(self, head, d, || {
            antidiagonal_scores_under(&head.q, &head.k, logits)
        })
    }
    /// The causal cost (the method has no other form).
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        let g = (n / STRIDE) as f64;
        block_macs(n, p, d, g * (g + 1.0) / 2.0 * (STRIDE * p) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::prefill::select::block_visited_pairs;
    use crate::attention::prefill::test_util::{
        assert_spec_restricted, blocks_to_visits, spec_head, stable_top, support_and_weights,
        tied_head,
    };
    use crate::attention::sparse::pair_macs;
    use crate::attention::test_util::{assert_causal_restricted, host_rows, random_head};
    use candle_core::DType;

    /// §7.5.7 entry by entry: each strided logit as the antidiagonal sum Σ_t q_{aS+3−t}·k_{cS+t}
    /// in loops, the softmax over c ≤ a < G, the block sums, a stable sort of 0 < C < A.
    fn block_scores_by_definition(q: &[Vec<f64>], k: &[Vec<f64>]) -> Vec<Vec<f64>> {
        let p = q[0].len();
        block_scores_under(q, k, 1.0 / (p as f64).sqrt(), None)
    }

    /// The same under a layer's τ and cap: the strided logit τ·q̃·k̃/S, capped, then the softmax.
    fn block_scores_under(
        q: &[Vec<f64>],
        k: &[Vec<f64>],
        tau: f64,
        cap: Option<f64>,
    ) -> Vec<Vec<f64>> {
        let (n, p) = (q.len(), q[0].len());
        let (g, nb) = (n / 4, n.div_ceil(16));
        let mut score = vec![vec![0.0; nb]; nb];
        for a in 0..g {
            let l: Vec<f64> = (0..=a)
                .map(|c| {
                    (0..4)
                        .map(|t| {
                            (0..p)
                                .map(|x| q[4 * a + 3 - t][x] * k[4 * c + t][x])
                                .sum::<f64>()
                        })
                        .sum::<f64>()
                        * tau
                        / 4.0
                })
                .map(|x: f64| cap.map_or(x, |c| c * (x / c).tanh()))
                .collect();
            let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = l.iter().map(|x| (x - m).exp()).sum();
            for (c, x) in l.iter().enumerate() {
                score[a / 4][c / 4] += (x - m).exp() / z;
            }
        }
        score
    }

    fn blocks_by_definition(score: &[Vec<f64>], d: usize) -> Vec<Vec<usize>> {
        let m = d.div_ceil(16).saturating_sub(2);
        (0..score.len())
            .map(|a| {
                let s: Vec<f64> = (1..a).map(|c| score[a][c]).collect();
                let mut kept: Vec<usize> = stable_top(&s, m).iter().map(|c| c + 1).collect();
                kept.extend([0, a]);
                kept
            })
            .collect()
    }

    /// Under a layer's spec (a window of 40, τ, a cap and a sink): blocks ranked by the capped
    /// τ-scaled estimate, kept keys inside the window, the layer's logits and the sink in every
    /// denominator, in float64.
    #[test]
    fn under_a_layer_spec_it_is_its_definition() {
        let h = spec_head(206, 40, 57);
        let [q, k, _] = host_rows(&h);
        let score = block_scores_under(&q, &k, 0.35, Some(2.0));
        for d in [33, 48] {
            let kept = blocks_by_definition(&score, d);
            assert_spec_restricted(&XAttention, &h, d, blocks_to_visits(&kept));
        }
    }

    #[test]
    fn equals_the_dense_masked_softmax_over_the_antidiagonal_blocks() {
        // n = 206: S ∤ n (two rows outside the estimate) and a ragged block of 14 rows (3
        // complete stride groups); n = 194: a ragged block of 2 rows, no stride group.
        for (n, seed) in [(206, 51), (194, 52), (256, 53)] {
            let h = random_head(n, 16, seed, DType::F64);
            let [q, k, _] = host_rows(&h);
            let score = block_scores_by_definition(&q, &k);
            let ds = [1, 16, 33, 48, 100, n];
            let by_d: Vec<_> = ds
                .iter()
                .map(|&d| blocks_by_definition(&score, d))
                .collect();
            let by_d: Vec<_> = by_d.iter().map(|b| blocks_to_visits(b)).collect();
            assert_causal_restricted(&XAttention, &h, &ds, |i, j, d| {
                by_d[ds.iter().position(|&x| x == d).unwrap()](i, j)
            });
            // The scores themselves, to rounding.
            let got = antidiagonal_scores(&h.q, &h.k).unwrap();
            let nb = score.len();
            for a in 0..nb {
                for c in 0..nb {
                    assert!(
                        (got[a * nb + c] - score[a][c]).abs() < 1e-13,
                        "n {n} ({a}, {c})"
                    );
                }
            }
        }
    }

    /// Ties (q = 0: W_ac = 1/(a+1) on c ≤ a, equal over the past blocks) go to the lowest block;
    /// the ragged block of n = 50 (2 rows, no complete stride group) scores 0 everywhere.
    #[test]
    fn ties_and_a_block_without_stride_groups_by_hand() {
        let n = 50;
        let h = tied_head(n, 8);
        let score = antidiagonal_scores(&h.q, &h.k).unwrap();
        assert!(score[3 * 4..4 * 4].iter().all(|&x| x == 0.0));
        // Block 2 (stride groups 8..11): Σ_a 4/(a+1) per past key block.
        let want: f64 = (8..12).map(|a| 4.0 / (a + 1) as f64).sum();
        assert!((score[2 * 4] - want).abs() < 1e-14 && (score[2 * 4 + 1] - want).abs() < 1e-14);
        let (sets, mass, keys) = support_and_weights(&XAttention, &h, 48);
        assert_eq!(sets[49], (0..32).chain(48..50).collect::<Vec<_>>());
        assert_eq!(sets[40], (0..41).collect::<Vec<_>>());
        let want: Vec<usize> = (0..n).map(|i| i % 16 + 1 + 16 * (i / 16).min(2)).collect();
        assert_eq!(sets.iter().map(|s| s.len()).collect::<Vec<_>>(), want);
        assert_eq!(keys, block_visited_pairs(n, 48) / n as f64);
        let m = (0..n).map(|i| want[i] as f64 / (i + 1) as f64).sum::<f64>() / n as f64;
        assert!((mass - m).abs() < 1e-12);
    }

    #[test]
    fn the_estimate_costs_n_squared_p_over_2s() {
        let (n, p) = (8192, 64);
        let est = XAttention.macs_masked(n, p, 256, Mask::Causal)
            - pair_macs(block_visited_pairs(n, 256), p);
        let ratio = est / ((n * n * p) as f64 / 8.0);
        assert!((1.0..1.001).contains(&ratio), "{ratio}");
    }
}
