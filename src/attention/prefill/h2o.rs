//! `h2o`: heavy hitters + a recent window (docs/reference.md §7.5.2) — an **oracle**: it reads exact
//! causal attention rows. H2O (Zhang et al., NeurIPS 2023, "H₂O: Heavy-Hitter Oracle for Efficient
//! Generative Inference of Large Language Models", §3–4), in the prefill simulation of its own
//! evaluation (`FMInference/H2O`, `h2o_hf/utils_lm_eval/modify_llama.py`,
//! `local_heavy_hitter_mask`). Heavy budget h = ⌊d/2⌋, recent budget r = d − h:
//!
//! - rows i < h: S_i = {0..i} (dense);
//! - an accumulator a over keys starts as the column sums of the exact causal rows P_0..P_{h−1};
//! - for i = h, …, n−1: H_i = the h − 1 keys with the largest a (ties to the lower index) ∪ {i};
//!   then a ← (a + P_i) ⊙ 1[H_i] (a key dropped from the heavy set is zeroed);
//! - S_i = H_i ∪ {j : max(0, i − r + 1) ≤ j ≤ i}.
//!
//! What d means: keys per query (§7.3), |S_i| ≤ min(d, i+1) (heavy and recent keys may overlap:
//! the realised count is reported). Deterministic. A covering budget is d ≥ 2n − 1 (r ≥ n), not
//! d ≥ n: at d = n the recent window has n − ⌊n/2⌋ keys and the heavy set need not hold the
//! rest.
//!
//! H_i reads a before P_i is added, so it ranks the keys < i only: key i has a = 0 then and every
//! key > i too, and i ≥ h > h − 1 keys lie below it, so with ties to the lower index no key ≥ i
//! can be among the h − 1 (the selection runs over a[0..i], which is the same set).
//! [P≠C] the code's recent window is `triu(diagonal=−r)`, r + 1 keys; here it is r keys so that
//! |S_i| ≤ d. `torch.topk` leaves ties unspecified; here they go to the lower index.
//!
//! Cost: n²p for the exact rows (an oracle, like `topk`) + 2p per visited pair, counted at the
//! budget Σ_i min(d, i+1). The rows are formed in blocks of 256 queries (causal_scores, softmax)
//! and read on the host, where the accumulator runs row by row. They do not depend on d, so a
//! head keeps them in its memo for the next budget while they fit in [`MEMO_BYTES`] (n ≤ 11 458
//! in f32): formed at each of a sweep's 8 budgets they were half of `h2o`'s time (BENCHMARKS.md).
//! Past the cap each budget forms them again block by block, and no n×n P is ever held.

use anyhow::Result;
use candle_core::{DType, WithDType};

use super::select::{budget_pairs, checked_n, restricted_rows, top_indices};
use crate::attention::exact::{causal_scores, scaled_operands};
use crate::attention::sparse::pair_macs;
use crate::attention::sparse::topk::{first_ranked, rank_index, rank_key};
use crate::attention::{Approximation, HeadInputs, Method, MethodInfo};
use crate::numerics::sampling::TrialRng;

pub struct H2o;

/// Query rows per block of exact rows.
const ROWS: usize = 256;

/// The most bytes of exact rows a head keeps for the next budget (one head's; the CPU sweep runs
/// a head per thread, the device path a window's heads at once, so this bounds them per head).
pub const MEMO_BYTES: usize = 256 << 20;

/// The (heavy, recent) budgets h = ⌊d/2⌋, r = d − h.
pub fn budgets(d: usize) -> (usize, usize) {
    (d / 2, d - d / 2)
}

/// The sets S_i of §7.5.2 from the exact causal rows, delivered in order by `rows` as
/// (first row index, rows of P over keys 0..first+len) blocks.
/// The rows arrive in any float type T and are read as f64 (`to_f64`, exact from f32 or f64).
pub fn key_sets<T: WithDType>(
    n: usize,
    d: usize,
    mut rows: impl FnMut(&mut dyn FnMut(usize, &[T], usize) -> Result<()>) -> Result<()>,
) -> Result<Vec<Vec<usize>>> {
    let (h, r) = budgets(d);
    let heavy_count = h.saturating_sub(1);
    let mut a = vec![0f64; n];
    // The keys where a may be non-zero (the previous heavy set, or 0..h at the start).
    let mut live: Vec<usize> = (0..h.min(n)).collect();
    let mut sets: Vec<Vec<usize>> = Vec::with_capacity(n);
    rows(&mut |start: usize, block: &[T], width: usize| {
        for (off, p) in block.chunks(width).enumerate() {
            let i = start + off;
            if i < h {
                for j in 0..=i {
                    a[j] += p[j].to_f64();
                }
                sets.push((0..=i).collect());
                continue;
            }
            let mut heavy = heavy_keys(&a, &live, i, heavy_count);
            heavy.push(i);
            let vals: Vec<f64> = heavy.iter().map(|&j| a[j] + p[j].to_f64()).collect();
            for &j in &live {
                a[j] = 0.0;
            }
            for (&j, &x) in heavy.iter().zip(&vals) {
                a[j] = x;
            }
            // S_i = H_i ∪ recent, each key once (heavy keys ≥ lo are in the window).
            let lo = (i + 1).saturating_sub(r);
            let mut s: Vec<usize> = heavy.iter().copied().filter(|&j| j < lo).collect();
            s.extend(lo..=i);
            sets.push(s);
            live = heavy;
        }
        Ok(())
    })?;
    Ok(sets)
}

/// top_indices(&a[..i], count), in O(|live|) instead of O(i): a is zero outside `live` (every
/// key dropped from the heavy set is zeroed, and only keys 0..h start non-zero), and `live` lies
/// below i. Where a is non-negative and finite on `live` (it sums softmax rows), the stable order
/// (−a_j, j) puts the positive live keys first and every zero after them by index, so the top
/// `count` are the best positive ones, then the lowest zero keys. Anything else (a NaN from
/// non-finite inputs) takes the general selection over a[..i].
fn heavy_keys(a: &[f64], live: &[usize], i: usize, count: usize) -> Vec<usize> {
    if live.iter().any(|&j| !(a[j].is_finite() && a[j] >= 0.0)) {
        return top_indices(&a[..i], count);
    }
    let positive: Vec<u128> = live
        .iter()
        .filter(|&&j| a[j] > 0.0)
        .map(|&j| rank_key(a[j], j))
        .collect();
    let mut heavy: Vec<usize> = if positive.len() >= count {
        first_ranked(positive, count)
            .into_iter()
            .map(rank_index)
            .collect()
    } else {
        let mut chosen: Vec<usize> = positive.iter().map(|&k| rank_index(k)).collect();
        chosen.sort_unstable();
        // The lowest-index zero keys fill the rest (count ≤ i, so there are enough).
        let mut zeros = Vec::with_capacity(count - chosen.len());
        let mut next = chosen.iter().peekable();
        for j in 0..i {
            if zeros.len() == count - chosen.len() {
                break;
            }
            if next.peek() == Some(&&j) {
                next.next();
            } else {
                zeros.push(j);
            }
        }
        chosen.extend(zeros);
        chosen
    };
    heavy.sort_unstable();
    heavy
}

/// [`key_sets`] over the head's exact causal rows in T, taken from (and left in) its memo when
/// they fit in `memo_bytes`, else formed block by block. Either way the values are the same
/// softmax in the head's dtype, so the sets do not depend on the memo.
fn sets_from_rows<T: WithDType>(
    head: &HeadInputs,
    n: usize,
    d: usize,
    memo_bytes: usize,
) -> Result<Vec<Vec<usize>>> {
    let width = |start: usize| start + ROWS.min(n - start);
    let bytes: usize = (0..n)
        .step_by(ROWS)
        .map(|s| (width(s) - s) * width(s) * std::mem::size_of::<T>())
        .sum();
    // Kept rows, or the operands to form them here (only when the memo does not hold them).
    let source = if bytes <= memo_bytes {
        Rows::Kept(head.memo("h2o_exact_rows", || {
            let form = row_blocks::<T>(head, n)?;
            (0..n).step_by(ROWS).map(form).collect::<Result<Vec<_>>>()
        })?)
    } else {
        Rows::Formed(row_blocks::<T>(head, n)?)
    };
    key_sets(n, d, |sink| {
        for (b, start) in (0..n).step_by(ROWS).enumerate() {
            match &source {
                Rows::Kept(blocks) => sink(start, &blocks[b], width(start))?,
                Rows::Formed(form) => sink(start, &form(start)?, width(start))?,
            }
        }
        Ok(())
    })
}

/// Where [`sets_from_rows`] reads the row blocks: a head's memo, or formed block by block.
enum Rows<T, F> {
    Kept(std::sync::Arc<Vec<Vec<T>>>),
    Formed(F),
}

/// A function from `start` to the block of exact causal rows P of the query rows from `start`
/// (256 of them, fewer at the end) over keys 0..start+len, in T: the softmax in the head's dtype.
/// Under a layer's spec (docs/reference.md §7.7.6) the rows are the target's: τ, capped, inside
/// the window (zero before it), over the real keys (a row sums to 1 − its sink's probability).
fn row_blocks<T: WithDType>(
    head: &HeadInputs,
    n: usize,
) -> Result<impl Fn(usize) -> Result<Vec<T>> + '_> {
    let (qs, kt) = scaled_operands(&head.q, &head.k)?;
    let plain = head.spec.features(head.p(), n).is_plain();
    Ok(move |start: usize| {
        let len = ROWS.min(n - start);
        let p = if plain {
            let s = causal_scores(&qs.narrow(0, start, len)?, &kt, start)?;
            candle_nn::ops::softmax_last_dim(&s)?
        } else {
            head.spec_probability_rows(start, len, head.dtype())?
        };
        Ok(p.to_dtype(T::DTYPE)?.flatten_all()?.to_vec1()?)
    })
}

impl Method for H2o {
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(&super::H2O)
    }
    fn approximate(&self, head: &HeadInputs, d: usize, _: &mut TrialRng) -> Result<Approximation> {
        let n = checked_n(self, head, d)?;
        // f64 heads keep f64 rows; every other dtype's rows widen exactly to f32.
        let sets = if head.dtype() == DType::F64 {
            sets_from_rows::<f64>(head, n, d, MEMO_BYTES)?
        } else {
            sets_from_rows::<f32>(head, n, d, MEMO_BYTES)?
        };
        restricted_rows(head, sets)
    }
    /// The causal cost (the method has no other form).
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        (n * n * p) as f64 + pair_macs(budget_pairs(n, d), p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::prefill::test_util::{
        assert_spec_restricted, causal_p, sets_at, spec_head, spec_p, stable_top,
        support_and_weights, tied_head,
    };
    use crate::attention::test_util::{assert_causal_restricted, random_head};
    use crate::attention::Mask;

    /// §7.5.2 written out on the dense f64 P: a vector accumulator over all n keys, the top h − 1
    /// by a stable sort over all n keys, the update (a + P_i)·1[H_i].
    fn sets_by_definition(p: &[Vec<f64>], d: usize) -> Vec<Vec<bool>> {
        let n = p.len();
        let (h, r) = (d / 2, d - d / 2);
        let mut a = vec![0f64; n];
        for row in p.iter().take(h) {
            for j in 0..n {
                a[j] += row[j];
            }
        }
        (0..n)
            .map(|i| {
                let mut s = vec![false; n];
                if i < h {
                    s[..=i].iter_mut().for_each(|x| *x = true);
                    return s;
                }
                let mut heavy = stable_top(&a, h.saturating_sub(1));
                heavy.push(i);
                let mut next = vec![0f64; n];
                for &j in &heavy {
                    next[j] = a[j] + p[i][j];
                    s[j] = true;
                }
                a = next;
                s[(i + 1).saturating_sub(r)..=i].fill(true);
                s
            })
            .collect()
    }

    #[test]
    fn equals_the_dense_masked_softmax_of_heavy_and_recent_keys() {
        let h = random_head(203, 16, 21, DType::F64);
        let p = causal_p(&crate::attention::test_util::causal(&h));
        let ds = [1, 2, 3, 8, 17, 40, 203];
        let by_d: Vec<Vec<Vec<bool>>> = ds.iter().map(|&d| sets_by_definition(&p, d)).collect();
        assert_causal_restricted(&H2o, &h, &ds, sets_at(&ds, &by_d));
    }

    /// Under a layer's spec (a window of 20, τ, a cap and a sink): the accumulator reads the
    /// target's rows over real keys, the sets meet the window, and the kept keys' logits are the
    /// layer's — §7.5.2 and §7.7.6 written out in float64.
    #[test]
    fn under_a_layer_spec_it_is_its_definition_on_the_targets_rows() {
        let h = spec_head(120, 20, 29);
        let p = spec_p(&h);
        for d in [4, 9, 30] {
            let sets = sets_by_definition(&p, d);
            assert_spec_restricted(&H2o, &h, d, |i, j| sets[i][j]);
        }
    }

    /// Hand-built with q = 0: P_i is uniform on 0..=i, a ties everywhere it is equal; d = 8
    /// (h = 4: 3 heavy + i, r = 4 recent). Rows 0..3 are dense; the accumulator after rows 0..3
    /// is a = (1 + 1/2 + 1/3 + 1/4, 1/2 + 1/3 + 1/4, 1/3 + 1/4, 1/4): row 4 keeps 0, 1, 2 and 4,
    /// and key 3 is dropped for good — from row 4 on the heavy set is {0, 1, 2} (their a only
    /// grows), so S_i = {0, 1, 2} ∪ {i−3..i}: H_i and the window share i, so |S_i| = min(i+1, 7),
    /// never the budget 8.
    #[test]
    fn the_accumulator_and_set_sizes_by_hand() {
        let (n, d) = (37, 8);
        let h = tied_head(n, 8);
        let (sets, mass, keys) = support_and_weights(&H2o, &h, d);
        for (i, set) in sets.iter().enumerate().take(4) {
            assert_eq!(*set, (0..=i).collect::<Vec<_>>());
        }
        assert_eq!(sets[4], vec![0, 1, 2, 3, 4]);
        assert_eq!(sets[5], vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(sets[7], vec![0, 1, 2, 4, 5, 6, 7]);
        assert_eq!(sets[20], vec![0, 1, 2, 17, 18, 19, 20]);
        let sizes: Vec<usize> = sets.iter().map(|s| s.len()).collect();
        let want: Vec<usize> = (0..n).map(|i| if i < 7 { i + 1 } else { 7 }).collect();
        assert_eq!(sizes, want);
        assert_eq!(keys, want.iter().sum::<usize>() as f64 / n as f64);
        let m = (0..n).map(|i| want[i] as f64 / (i + 1) as f64).sum::<f64>() / n as f64;
        assert!((mass - m).abs() < 1e-12);
    }

    /// The O(|live|) selection equals the general one over a[..i] on accumulators shaped as the
    /// recurrence leaves them: zero off `live`, with ties, zeros on `live` (an underflowed P),
    /// fewer positive keys than wanted, and a NaN (the general path).
    #[test]
    fn heavy_keys_equal_the_general_selection() {
        use rand::{Rng, SeedableRng};
        let mut rng = TrialRng::seed_from_u64(11);
        for case in 0..400 {
            let i = rng.random_range(1..60);
            let count = rng.random_range(0..=i);
            let mut a = vec![0f64; i + 5];
            let mut live: Vec<usize> = (0..i).filter(|_| rng.random_bool(0.4)).collect();
            for &j in &live {
                a[j] = match rng.random_range(0..4) {
                    0 => 0.0,
                    1 => 0.5, // ties
                    _ => rng.random::<f64>(),
                };
            }
            if case % 50 == 0 && !live.is_empty() {
                a[live[0]] = f64::NAN;
            }
            live.reverse(); // any order
            assert_eq!(
                heavy_keys(&a, &live, i, count),
                top_indices(&a[..i], count),
                "case {case}: a = {a:?}, live = {live:?}, count = {count}"
            );
        }
    }

    /// Rows kept in the head's memo give the sets of rows formed afresh, in f32 and f64, over
    /// three row blocks (the last one partial) and budgets across both halves of the recurrence.
    fn kept_rows_match_fresh<T: WithDType>(dtype: DType) {
        let n = 2 * ROWS + 89;
        let h = crate::attention::test_util::causal(&random_head(n, 16, 5, dtype));
        for d in [4, 33, 300, n] {
            let fresh = sets_from_rows::<T>(&h.with_empty_memo(), n, d, 0).unwrap();
            let kept = sets_from_rows::<T>(&h, n, d, usize::MAX).unwrap();
            assert_eq!(kept, fresh, "{dtype:?}, d = {d}");
        }
        // The rows are in the memo now (so the later budgets above read them from there) ...
        let missing = || -> Result<Vec<Vec<T>>> { anyhow::bail!("not kept") };
        assert!(h.memo("h2o_exact_rows", missing).is_ok());
        // ... and a head past the cap keeps nothing.
        let over = h.with_empty_memo();
        sets_from_rows::<T>(&over, n, 9, 0).unwrap();
        assert!(over.memo("h2o_exact_rows", missing).is_err());
    }

    #[test]
    fn kept_rows_give_the_sets_of_fresh_rows() {
        kept_rows_match_fresh::<f32>(DType::F32);
        kept_rows_match_fresh::<f64>(DType::F64);
    }

    #[test]
    fn is_an_oracle_with_quadratic_cost() {
        assert!(H2o.is_oracle());
        assert_eq!(
            H2o.macs_masked(100, 8, 10, Mask::Causal),
            100.0 * 100.0 * 8.0 + 2.0 * 8.0 * (55.0 + 90.0 * 10.0)
        );
    }
}
