//! `topk`: the top-2d oracle (docs/reference.md §6.1.3) — a **reference curve, not an efficient
//! method**. Each query keeps its kk = min(2d, n) largest logits and renormalises over them
//! (the selection of top-k attention, Gupta, Dar, Goodman, Ciprut & Berant 2021, "Memory-efficient
//! Transformers via Top-k Attention", §3, computed here in query blocks as theirs is):
//!
//!   V_i = the first kk keys of a stable sort of j by (−s_ij, j),   s_ij = q_i·k_j/√p,
//!   Ô_i = Σ_{j∈V_i} softmax_{V_i}(s_ij) v_j.
//!
//! Ties at the threshold go to the lower key index. Row by row it is the best
//! restrict-and-renormalise choice of kk keys (ℓ₁ error 2(1 − Σ_{V_i} P_ij) is minimised), but
//! not a proven lower bound on ‖O − Ô‖₂, which mixes rows through V.
//!
//! What d means: kk = 2d kept keys per query (the key count of the 4ndp methods); it is a size,
//! not a cost. Deterministic; exact iff 2d ≥ n.
//!
//! Cost: n²p (every logit, to select) + n·kk·p = 2ndp (the weighted V over the kept keys) —
//! quadratic, as much as exact attention; the O(n²) selection is not counted in MACs. This
//! follows §6.1.3, which reuses the selection pass's logits; the product instead recomputes the
//! kept logits in the shared key-set softmax (another 2ndp, < 1/8 of n²p on the grid) so that
//! all four §6.1 methods run one code path.
//!
//! Causal form (docs/reference.md §7.4): S_i = the min(d, i+1) keys j ≤ i with the largest s_ij, ties to
//! the lower index — d keys per query (§7.3), not 2d. Cost n²p/2 to select + Σ_i min(d, i+1)·2p.
//!
//! Within a sweep the selection is done once per head: each row's first 2·256 keys in rank order
//! (`Ranking`, memoised), whose prefixes are the sets of every d ≤ 256 — the oracle's sets are
//! nested in d. A larger d re-ranks with 4× the keys (the causal grid to 2048 ranks twice).
//! `macs` still counts one trial on its own.

use std::sync::{Arc, Mutex};

use anyhow::Result;
use candle_core::{DType, Tensor};

use crate::attention::exact::{map_masked_score_blocks, scaled_operands};
use crate::attention::{Approximation, Family, HeadInputs, Mask, Method, MethodInfo};
use crate::numerics::key_sets::{key_set_softmax_logits, per_row_groups};
use crate::numerics::sampling::TrialRng;

pub struct TopK;

/// kk = min(2d, n) keys kept per query.
pub fn kept(n: usize, d: usize) -> usize {
    d.saturating_mul(2).min(n)
}

/// The rank order (−x, j) as one integer, smallest first: x descending, with NaN ranked as −∞
/// and −0 as +0 (both tie, as `partial_cmp` has them), then j ascending. Sorting these integers
/// is the stable sort by (−x, j) without a comparison closure (with h2o's selection, a20a0ba
/// took `topk` from 400 to 340 ms per head at n = 8192, d = 16: BENCHMARKS.md).
#[inline]
pub fn rank_key(x: f64, j: usize) -> u128 {
    let x = if x.is_nan() {
        f64::NEG_INFINITY
    } else if x == 0.0 {
        0.0
    } else {
        x
    };
    let bits = x.to_bits();
    // IEEE order as unsigned order: negatives flipped whole, positives above them.
    let ascending = if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    };
    ((!ascending as u128) << 64) | j as u128
}

/// The key index of a [`rank_key`].
#[inline]
pub fn rank_index(key: u128) -> usize {
    key as u64 as usize
}

/// The `m` first of `keys` in rank order, in no particular order (a partition, O(len)).
pub fn first_ranked(mut keys: Vec<u128>, m: usize) -> Vec<u128> {
    if m == 0 {
        return Vec::new();
    }
    if m < keys.len() {
        keys.select_nth_unstable(m - 1);
        keys.truncate(m);
    }
    keys
}

/// The first `m` of (0..len) stably sorted by (−row[j], j), in that rank order. NaN ranks
/// lowest; −0 and +0 tie. A partition (O(len)) and a sort of the m kept: the order (−s, j) is
/// total, so the m smallest under it are exactly the stable sort's first m.
pub fn ranked_keys(row: &[f64], m: usize) -> Vec<usize> {
    let keys = row.iter().enumerate().map(|(j, &x)| rank_key(x, j));
    let mut keys = first_ranked(keys.collect(), m);
    keys.sort_unstable();
    keys.into_iter().map(rank_index).collect()
}

/// The first `kk` of the stable sort by (−row[j], j), in index order.
pub fn top_keys(row: &[f64], kk: usize) -> Vec<usize> {
    let mut idx = ranked_keys(row, kk);
    idx.sort_unstable();
    idx
}

/// Every query's first m keys in rank order, selected on the logits in the working dtype (ties
/// as that dtype rounds them), one row block of QKᵀ at a time. The sets of every kk ≤ m are
/// prefixes, so one ranking serves the whole d grid of a head (memoised in `approximate`).
/// Under the causal mask a row i < m − 1 has fewer than m candidate keys; its ranking is padded
/// with this marker, which no key set ever includes.
const NO_KEY: u32 = u32::MAX;

pub struct Ranking {
    m: usize,
    rows: Vec<Vec<u32>>,
}

impl Ranking {
    pub fn compute(q: &Tensor, k: &Tensor, m: usize) -> Result<Self> {
        Self::compute_masked(q, k, m, Mask::None)
    }

    /// Under the causal mask row i ranks only the keys j ≤ i.
    pub fn compute_masked(q: &Tensor, k: &Tensor, m: usize, mask: Mask) -> Result<Self> {
        Self::compute_visible(q, k, m, mask, None)
    }

    /// [`Self::compute_masked`] with the causal mask's keys narrowed to a sliding window of W
    /// (docs/reference.md §7.7.6: a set never leaves V_i).
    pub fn compute_visible(
        q: &Tensor,
        k: &Tensor,
        m: usize,
        mask: Mask,
        window: Option<usize>,
    ) -> Result<Self> {
        let m = m.min(k.dims2()?.0);
        let (qs, kt) = scaled_operands(q, k)?;
        let picked = map_masked_score_blocks(&qs, &kt, mask, |start, len, s| {
            let rows: Vec<Vec<f64>> = s.to_dtype(DType::F64)?.to_vec2()?;
            let flat: Vec<u32> = rows
                .iter()
                .enumerate()
                .flat_map(|(r, row)| {
                    let i = start + r;
                    let lo = window.map_or(0, |w| (i + 1).saturating_sub(w));
                    let row = match mask {
                        Mask::None => &row[..],
                        Mask::Causal => &row[lo..=i],
                    };
                    let lo = if mask == Mask::Causal { lo } else { 0 };
                    let mut ranked: Vec<u32> = ranked_keys(row, m.min(row.len()))
                        .into_iter()
                        .map(|j| (lo + j) as u32) // j < n ≤ u32::MAX for any tensor this crate builds
                        .collect();
                    ranked.resize(m, NO_KEY);
                    ranked
                })
                .collect();
            Ok(Tensor::from_vec(flat, (len, m), s.device())?)
        })?;
        Ok(Self {
            m,
            rows: picked.to_vec2()?,
        })
    }

    /// V_i for every query: its first kk ranked keys, in index order (kk ≤ m).
    pub fn key_sets(&self, kk: usize) -> Vec<Vec<usize>> {
        assert!(
            kk <= self.m,
            "a ranking of {} keys cannot give {kk}",
            self.m
        );
        self.rows
            .iter()
            .map(|r| {
                let mut set: Vec<usize> = r[..kk]
                    .iter()
                    .filter(|&&j| j != NO_KEY)
                    .map(|&j| j as usize)
                    .collect();
                set.sort_unstable();
                set
            })
            .collect()
    }
}

/// V_i for every query at d: kk = min(2d, n) keys each.
pub fn key_sets(q: &Tensor, k: &Tensor, d: usize) -> Result<Vec<Vec<usize>>> {
    let kk = kept(k.dims2()?.0, d);
    Ok(Ranking::compute(q, k, kk)?.key_sets(kk))
}

/// The d a head's ranking is first built for, so that the default grid (8–256) ranks once.
const RANK_FOR_D: usize = 256;

const TOP_K: MethodInfo = MethodInfo {
    id: "topk",
    family: Family::Sparse,
    meaning: "oracle (quadratic): keeps the 2d largest logits per query (min(2d, n); d under the causal mask), ties to the lower key index",
    random: false,
    oracle: true,
    masks: MethodInfo::BOTH_MASKS,
    // §7.7.6: ranks the raw q·k of the keys the row sees (τ > 0 and tanh are monotone, and in
    // f32 a saturated cap would tie), then the kept keys' logits are the layer's, sink in the
    // denominator.
    spec: crate::attention::SpecFeatures::ALL,
    ..MethodInfo::BASE
};

impl Method for TopK {
    fn approximate(&self, head: &HeadInputs, d: usize, _: &mut TrialRng) -> Result<Approximation> {
        self.check(head.n(), d).map_err(anyhow::Error::msg)?;
        // kk keys per query: 2d bidirectionally (§6.1.3), d under the causal mask (§7.3).
        let kk = match head.mask {
            Mask::None => kept(head.n(), d),
            Mask::Causal => d.min(head.n()),
        };
        let slot = head.memo("topk_ranking", || Ok(Mutex::new(None::<Arc<Ranking>>)))?;
        let ranking = {
            let mut guard = slot.lock().expect("topk memo lock");
            match guard.as_ref() {
                Some(r) if r.m >= kk => r.clone(),
                grown => {
                    // A grid past RANK_FOR_D (the causal decoder grid runs to d = 2048) grows
                    // the ranking 4× at a time: 512 → 2048 ranks twice instead of thrice.
                    let floor = grown.map_or(kept(head.n(), RANK_FOR_D), |r| 4 * r.m);
                    let m = kk.max(floor);
                    let window = head.spec.window_within(head.n());
                    let r = Arc::new(Ranking::compute_visible(
                        &head.q, &head.k, m, head.mask, window,
                    )?);
                    *guard = Some(r.clone());
                    r
                }
            }
        };
        let sets = ranking.key_sets(kk);
        let keys = sets.iter().map(|s| s.len()).sum::<usize>() as f64 / head.n() as f64;
        let groups = per_row_groups(sets);
        let out = key_set_softmax_logits(
            &head.q,
            &head.k,
            &head.v,
            &groups,
            None,
            true,
            head.key_logits(),
        )?;
        Approximation::restricted(out, keys)
    }
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        let (nf, pf) = (n as f64, p as f64);
        nf * nf * pf + nf * kept(n, d) as f64 * pf
    }
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(&TOP_K)
    }
    fn macs_masked(&self, n: usize, p: usize, d: usize, mask: Mask) -> f64 {
        match mask {
            Mask::None => self.macs(n, p, d),
            Mask::Causal => {
                let nf = n as f64;
                nf * nf * p as f64 / 2.0
                    + super::pair_macs(super::window::causal_visited_pairs(n, d), p)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::attention::sparse::test_util::{
        self, assert_covering_budget_is_exact, assert_is_masked_softmax_of_its_sets,
    };
    use crate::attention::test_util::{
        assert_rows_are_distributions, host_rows, random_head, weight_matrix,
    };

    fn out_rows(h: &HeadInputs, d: usize) -> Vec<Vec<f64>> {
        test_util::out_rows(&TopK, h, d, 0)
    }

    /// The oracle's sets straight from the definition: stable sort of j by (−s_ij, j) on f64
    /// logits computed entry by entry.
    fn stable_sort_sets(q: &[Vec<f64>], k: &[Vec<f64>], kk: usize) -> Vec<Vec<usize>> {
        crate::attention::test_util::logit_rows(q, k)
            .into_iter()
            .map(|s| {
                let mut j: Vec<usize> = (0..k.len()).collect();
                j.sort_by(|&a, &b| s[b].partial_cmp(&s[a]).unwrap()); // stable: ties keep index order
                j.truncate(kk);
                j.sort_unstable();
                j
            })
            .collect()
    }

    #[test]
    fn equals_the_dense_masked_softmax_in_float64() {
        let h = random_head(240, 16, 1, DType::F64);
        let [q, k, _] = host_rows(&h);
        assert_is_masked_softmax_of_its_sets(&TopK, &h, &[1, 4, 16, 50, 119], 0, |d| {
            stable_sort_sets(&q, &k, 2 * d)
        });
    }

    /// Integer logits tie often: ties must go to the lower key index, as a stable sort does.
    #[test]
    fn ties_go_to_the_lower_key_index() {
        assert_eq!(top_keys(&[1.0, 3.0, 3.0, 2.0, 3.0], 2), vec![1, 2]);
        assert_eq!(top_keys(&[1.0, 3.0, 3.0, 2.0, 3.0], 4), vec![1, 2, 3, 4]);
        assert_eq!(top_keys(&[0.0, -0.0, 0.0], 1), vec![0]);
        assert_eq!(top_keys(&[-0.0, 0.0, 0.0], 2), vec![0, 1]);
        assert_eq!(top_keys(&[f64::NAN, -5.0, f64::NAN], 2), vec![0, 1]); // NaN ranks lowest
        assert_eq!(top_keys(&[f64::NAN, -5.0, f64::NAN], 1), vec![1]);
        assert_eq!(top_keys(&[2.0, 1.0], 5), vec![0, 1]);
        assert!(top_keys(&[2.0, 1.0], 0).is_empty());
        // Integer Q, K (p = 4, √p = 2): logits are exact multiples of 1/2, with many ties.
        let (n, p) = (60, 4);
        let int = |seed: u64| -> Vec<Vec<f64>> {
            (0..n)
                .map(|i| {
                    (0..p)
                        .map(|c| (((i * 7 + c * 3) as u64 * seed) % 5) as f64 - 2.0)
                        .collect()
                })
                .collect()
        };
        let (q, k) = (int(3), int(11));
        let t = |m: &Vec<Vec<f64>>, dt| {
            Tensor::new(m.clone(), &crate::tensor_util::test_device())
                .unwrap()
                .to_dtype(dt)
                .unwrap()
        };
        for dt in [DType::F64, DType::F32] {
            for d in [1, 3, 10, 29] {
                assert_eq!(
                    key_sets(&t(&q, dt), &t(&k, dt), d).unwrap(),
                    stable_sort_sets(&q, &k, 2 * d),
                    "{dt:?}, d = {d}"
                );
            }
        }
    }

    /// The integer rank keys order exactly as a stable sort with the comparison written out:
    /// x descending by `partial_cmp` with NaN as −∞ (so −0 = +0), then j ascending; on rows
    /// drawn from a small alphabet so that ties, signed zeros, infinities and NaN all meet.
    #[test]
    fn rank_keys_order_as_the_written_out_comparison() {
        use rand::{Rng, SeedableRng};
        let alphabet = [
            f64::NAN,
            f64::NEG_INFINITY,
            -3.5,
            -1e-300,
            -0.0,
            0.0,
            5e-324,
            1.0,
            1.0 + f64::EPSILON,
            f64::MAX,
            f64::INFINITY,
        ];
        let mut rng = TrialRng::seed_from_u64(7);
        for len in [1, 2, 5, 17, 64] {
            for _ in 0..50 {
                let row: Vec<f64> = (0..len)
                    .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                    .collect();
                let key = |x: f64| if x.is_nan() { f64::NEG_INFINITY } else { x };
                let mut want: Vec<usize> = (0..len).collect();
                want.sort_by(|&a, &b| key(row[b]).partial_cmp(&key(row[a])).unwrap());
                for m in [0, 1, len / 2, len] {
                    assert_eq!(ranked_keys(&row, m), want[..m], "{row:?}, m = {m}");
                }
            }
        }
    }

    /// One ranking serves every d of a head: prefixes of the rank order are the top-kk sets,
    /// and the memoised path (grown on demand past RANK_FOR_D) equals a fresh head's result.
    #[test]
    fn one_ranking_serves_every_d_of_a_head() {
        let row = [1.0, 3.0, 3.0, f64::NAN, 2.0, 3.0, -0.0, 0.0];
        assert_eq!(ranked_keys(&row, 8), vec![1, 2, 5, 4, 0, 6, 7, 3]);
        for kk in 0..=8 {
            let mut prefix = ranked_keys(&row, 8)[..kk].to_vec();
            prefix.sort_unstable();
            assert_eq!(prefix, top_keys(&row, kk), "kk = {kk}");
        }
        let n = 700; // kept(n, 300) = 600 > kept(n, RANK_FOR_D) = 512: the memo grows
        let h = random_head(n, 8, 4, DType::F32);
        let shared: Vec<_> = [64, 8, 300, 16].iter().map(|&d| out_rows(&h, d)).collect();
        for (i, &d) in [64, 8, 300, 16].iter().enumerate() {
            let fresh = random_head(n, 8, 4, DType::F32); // a new head: an empty memo
            assert_eq!(shared[i], out_rows(&fresh, d), "d = {d}");
        }
    }

    #[test]
    fn covering_budget_is_exact_attention() {
        let h = random_head(150, 32, 2, DType::F64);
        assert_covering_budget_is_exact(&TopK, &h, &[75, 76, 400], &[0]);
    }

    /// Weights are a distribution on exactly the kk largest logits, and no other kk-set keeps
    /// more of each row's exact attention mass.
    #[test]
    fn weights_sum_to_one_on_the_kk_largest_logits() {
        let (n, d) = (80, 6);
        let h = random_head(n, 8, 3, DType::F64);
        let [q, k, _] = host_rows(&h);
        let sets = stable_sort_sets(&q, &k, 2 * d);
        let w = weight_matrix(&TopK, &h, d, 0);
        assert_rows_are_distributions(&w, 1e-12);
        let p_exact = weight_matrix(&TopK, &h, n, 0); // 2d ≥ n: the exact P
        for i in 0..n {
            let support: Vec<usize> = (0..n).filter(|&j| w[i][j] > 0.0).collect();
            assert_eq!(support, sets[i], "row {i}");
            assert_eq!(support.len(), 2 * d);
            let kept_mass: f64 = support.iter().map(|&j| p_exact[i][j]).sum();
            let mut sorted = p_exact[i].clone();
            sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
            assert!((kept_mass - sorted[..2 * d].iter().sum::<f64>()).abs() < 1e-12);
        }
    }

    #[test]
    fn cost_is_quadratic_and_flagged_as_an_oracle() {
        assert!(TopK.is_oracle());
        // n²p + 2ndp (§6.1.3), kk = min(2d, n).
        assert_eq!(
            TopK.macs(4096, 64, 64),
            4096.0 * 4096.0 * 64.0 + 2.0 * 4096.0 * 64.0 * 64.0
        );
        assert_eq!(
            TopK.macs(100, 8, 80),
            100.0 * 100.0 * 8.0 + 100.0 * 100.0 * 8.0
        );
        assert!(TopK.check(100, 0).is_err());
    }

    /// The causal form: the min(d, i+1) largest logits among j ≤ i, ties to the lower index,
    /// from the stable sort on f64 logits; with keys and mass.
    #[test]
    fn causal_form_keeps_the_largest_past_logits_with_keys_and_mass() {
        let h = random_head(150, 8, 3, DType::F64);
        let [q, k, _] = host_rows(&h);
        let p = q[0].len() as f64;
        let sets = |d: usize| -> Vec<Vec<usize>> {
            (0..q.len())
                .map(|i| {
                    let s: Vec<f64> = (0..=i)
                        .map(|j| q[i].iter().zip(&k[j]).map(|(a, b)| a * b).sum::<f64>() / p.sqrt())
                        .collect();
                    let mut j: Vec<usize> = (0..=i).collect();
                    j.sort_by(|&a, &b| s[b].partial_cmp(&s[a]).unwrap());
                    j.truncate(d.min(i + 1));
                    j
                })
                .collect()
        };
        let by_d: Vec<(usize, Vec<Vec<usize>>)> =
            [1, 5, 64, 150].iter().map(|&d| (d, sets(d))).collect();
        crate::attention::test_util::assert_causal_restricted(
            &TopK,
            &h,
            &[1, 5, 64, 150],
            |i, j, d| by_d.iter().find(|(dd, _)| *dd == d).unwrap().1[i].contains(&j),
        );
    }
}
