//! What the prefill methods (docs/reference.md §7.5) share, written once: the causal-only guard, page
//! and block bounds and means (b = 16), top-m with ties to the lower index, the page selector of
//! `quest`/`moba` (§7.5.3–4), the block selector of `block_sparse`/`xattention` (§7.5.5, §7.5.7),
//! the key groups of a block pattern (all queries of a query block share its key blocks: one
//! group per query block with the causal filter j ≤ i, which bites only in the diagonal block)
//! and the restrict-and-renormalise softmax with its realised keys.

use std::ops::Range;

use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};

use crate::attention::sparse::topk::top_keys;
use crate::attention::{Approximation, HeadInputs, Mask};
use crate::numerics::key_sets::{key_set_softmax_logits, per_row_groups, KeyGroup};

/// Page and block size b (§7.5: Quest's page, the Sparse Frontier's chunk).
pub const B: usize = 16;

/// StreamingLLM's start_size and MInference's forced sink columns (§7.5.1, §7.5.6).
pub const SINKS: usize = 4;

/// The prefill methods have only a causal form (§7.5): anything else is an error.
pub fn require_causal(head: &HeadInputs, id: &str) -> Result<()> {
    ensure!(
        head.mask == Mask::Causal,
        "{id} is a causal prefill method (docs/reference.md §7.5): it has no form under --mask {}",
        head.mask.label()
    );
    Ok(())
}

/// What every prefill method checks first: the causal mask and its own (n, d) limits; returns n.
pub fn checked_n(
    method: &dyn crate::attention::Method,
    head: &HeadInputs,
    d: usize,
) -> Result<usize> {
    require_causal(head, method.id())?;
    method.check(head.n(), d).map_err(anyhow::Error::msg)?;
    Ok(head.n())
}

/// The rows (keys) of block c: [cb, min((c+1)b, n)).
pub fn block_span(c: usize, n: usize) -> Range<usize> {
    c * B..((c + 1) * B).min(n)
}

/// ⌈n/b⌉ blocks, the last one ragged when b ∤ n.
pub fn block_count(n: usize) -> usize {
    n.div_ceil(B)
}

/// The blocks or pages chosen by score on top of `fixed` always-kept ones: ⌈d/b⌉ − fixed, at
/// least 0.
pub fn scored_count(d: usize, fixed: usize) -> usize {
    d.div_ceil(B).saturating_sub(fixed)
}

/// The mean of the rows of each block of b consecutive rows, [⌈n/b⌉, p] in x's dtype; a ragged
/// last block averages the rows it has.
pub fn block_means(x: &Tensor) -> Result<Tensor> {
    let (n, p) = x.dims2()?;
    let full = n / B;
    let mut parts = Vec::new();
    if full > 0 {
        parts.push(x.narrow(0, 0, full * B)?.reshape((full, B, p))?.mean(1)?);
    }
    if n % B != 0 {
        parts.push(x.narrow(0, full * B, n % B)?.mean_keepdim(0)?);
    }
    Ok(Tensor::cat(&parts, 0)?)
}

/// Channel minima and maxima of each complete block ([⌊n/b⌋, p] each; Quest's page bounds
/// m_pc, M_pc). The ragged last block is never a past page, so it has none.
pub fn block_bounds(x: &Tensor) -> Result<(Tensor, Tensor)> {
    let (n, p) = x.dims2()?;
    let full = n / B;
    ensure!(full > 0, "block bounds need at least one complete block");
    let blocks = x.narrow(0, 0, full * B)?.reshape((full, B, p))?;
    Ok((blocks.min(1)?, blocks.max(1)?))
}

/// The m largest of `scores`, ties to the lower index (NaN lowest), in index order (the rank of
/// `topk`'s oracle, [`crate::attention::sparse::topk::ranked_keys`]).
pub fn top_indices(scores: &[f64], m: usize) -> Vec<usize> {
    top_keys(scores, m.min(scores.len()))
}

/// Which past pages each row of the page selector kept (a bit matrix rows × ⌊n/b⌋), for the
/// filter of merged groups: query i visits key j iff j ≤ i and j lies in i's own page or a kept one.
pub struct PageFilter {
    words: usize,
    bits: Vec<u64>,
}

impl PageFilter {
    pub fn visits(&self, i: usize, j: usize) -> bool {
        let t = j / B;
        j <= i && (t == i / B || self.bits[i * self.words + t / 64] >> (t % 64) & 1 == 1)
    }
}

/// The page selector (§7.5.3, §7.5.4): per row i, the keys ⌊i/b⌋b..=i of the page holding i and
/// every key of the m = ⌈d/b⌉ − 1 complete past pages t < ⌊i/b⌋ with the largest score(i, t), ties
/// to the lower page. `scores(start, len, pages)` gives the scores of query rows
/// [start, start+len) against pages 0..pages as a row-major [len, pages] host vector (only the
/// past pages of each row are read). Row blocks keep the score matrix to 256 rows at a time.
/// Returns the sets and the same choice as a filter.
pub fn page_sets(
    n: usize,
    d: usize,
    scores: impl Fn(usize, usize, usize) -> Result<Vec<f64>>,
) -> Result<(Vec<Vec<usize>>, PageFilter)> {
    const ROWS: usize = 256;
    let m = scored_count(d, 1);
    let words = (n / B).div_ceil(64).max(1);
    let mut filter = PageFilter {
        words,
        bits: vec![0; n * words],
    };
    let mut sets = Vec::with_capacity(n);
    for start in (0..n).step_by(ROWS) {
        let len = ROWS.min(n - start);
        // The past pages of the block's last row; none are scored when m = 0.
        let pages = if m == 0 { 0 } else { (start + len - 1) / B };
        let s = if pages == 0 {
            Vec::new()
        } else {
            scores(start, len, pages)?
        };
        ensure!(s.len() == len * pages, "page scores: wrong shape");
        for r in 0..len {
            let i = start + r;
            let own = i / B;
            let kept = if own == 0 || m == 0 {
                Vec::new()
            } else {
                top_indices(&s[r * pages..r * pages + own], m)
            };
            let mut keys: Vec<usize> = Vec::with_capacity(kept.len() * B + B);
            for t in kept {
                keys.extend(block_span(t, n));
                filter.bits[i * words + t / 64] |= 1 << (t % 64);
            }
            keys.extend(own * B..=i);
            sets.push(keys);
        }
    }
    Ok((sets, filter))
}

/// The block selector (§7.5.5, §7.5.7): per query block a, key block 0 and the diagonal block a
/// always, then the m = ⌈d/b⌉ − 2 blocks 0 < c < a with the largest score[a·nb + c], ties to the
/// lower block; in index order. `score` is row-major [nb, nb] (only c < a is read).
pub fn block_pattern(nb: usize, d: usize, score: &[f64]) -> Vec<Vec<usize>> {
    let m = scored_count(d, 2);
    (0..nb)
        .map(|a| {
            let mut kept = vec![0];
            if a > 1 && m > 0 {
                kept.extend(
                    top_indices(&score[a * nb + 1..a * nb + a], m)
                        .iter()
                        .map(|c| c + 1),
                );
            }
            if a > 0 {
                kept.push(a);
            }
            kept
        })
        .collect()
}

/// One key group per query block a: its rows, and the keys of its kept key blocks (the diagonal
/// block's keys stop at the block's last row); run with the causal filter j ≤ i.
pub fn block_groups(n: usize, kept: &[Vec<usize>]) -> Vec<KeyGroup> {
    kept.iter()
        .enumerate()
        .map(|(a, blocks)| KeyGroup {
            rows: block_span(a, n).collect(),
            keys: blocks.iter().flat_map(|&c| block_span(c, n)).collect(),
        })
        .collect()
}

/// Σ_i |S_i| of a block pattern: per row of query block a, b keys per kept block c < a and
/// i − ab + 1 of the diagonal block.
pub fn block_pattern_pairs(n: usize, kept: &[Vec<usize>]) -> usize {
    kept.iter()
        .enumerate()
        .map(|(a, blocks)| {
            let past = blocks.iter().filter(|&&c| c < a).count() * B;
            block_span(a, n)
                .map(|i| past + i - a * B + 1)
                .sum::<usize>()
        })
        .sum()
}

/// Σ_i |S_i| of a block pattern with the analytic count of kept blocks (no scores needed):
/// 1[a > 0] + min(⌈d/b⌉ − 2, a − 1) past blocks per query block a.
pub fn block_visited_pairs(n: usize, d: usize) -> f64 {
    let m = scored_count(d, 2);
    (0..block_count(n))
        .map(|a| {
            let past = if a == 0 { 0 } else { 1 + m.min(a - 1) };
            block_span(a, n)
                .map(|i| past * B + i - a * B + 1)
                .sum::<usize>()
        })
        .sum::<usize>() as f64
}

/// Σ_i |S_i| of the page selector: i − ⌊i/b⌋b + 1 keys of the own page and b per scored page,
/// min(⌈d/b⌉ − 1, ⌊i/b⌋) of them.
pub fn page_visited_pairs(n: usize, d: usize) -> f64 {
    let m = scored_count(d, 1);
    (0..n).map(|i| i % B + 1 + B * m.min(i / B)).sum::<usize>() as f64
}

/// Σ_i min(d, i+1): the budget of keys (§7.3), what a method with data-dependent overlaps
/// (`h2o`, `vertical_slash`) spends at most.
pub fn budget_pairs(n: usize, d: usize) -> f64 {
    let w = d.min(n) as f64;
    w * (w + 1.0) / 2.0 + (n as f64 - w) * w
}

/// Ô over the groups, the causal filter j ≤ i applied when `causal_filter` (block groups), with
/// the realised mean keys per row counted from the groups as run. Per-row sets must already lie
/// in {0..i}; a key after its query is an error. Under the head's spec (docs/reference.md §7.7.6)
/// the sets meet the layer's window (keys outside it dropped) and the kept keys' logits are the
/// layer's (τ, cap, sink); a plain head's are q·k/√p as before.
pub fn restricted(
    head: &HeadInputs,
    groups: &[KeyGroup],
    filter: Option<crate::numerics::key_sets::RowFilter>,
) -> Result<Approximation> {
    let n = head.n();
    let window = head.spec.window_within(n);
    let in_window =
        |i: usize, j: usize| window.is_none_or(|w| j + w > i) && filter.is_none_or(|f| f(i, j));
    let filter: Option<crate::numerics::key_sets::RowFilter> = match window {
        Some(_) => Some(&in_window),
        None => filter,
    };
    let mut pairs = 0usize;
    for g in groups {
        for &i in &g.rows {
            for &j in &g.keys {
                if filter.is_none_or(|f| f(i, j)) {
                    ensure!(j <= i, "prefill: row {i} would visit the future key {j}");
                    pairs += 1;
                }
            }
        }
    }
    let out = key_set_softmax_logits(
        &head.q,
        &head.k,
        &head.v,
        groups,
        filter,
        true,
        head.key_logits(),
    )?;
    Approximation::restricted(out, pairs as f64 / n as f64)
}

/// [`restricted`] over per-row sets.
pub fn restricted_rows(head: &HeadInputs, sets: Vec<Vec<usize>>) -> Result<Approximation> {
    restricted(head, &per_row_groups(sets), None)
}

/// Consecutive units (a query row with its set, or a query block with its kept keys) merged
/// into one key group — the rows together, the union of their keys — while the merged group's
/// work |rows|·|union| stays within `slack` × the pairs its rows really visit (`pairs` per unit)
/// and it has at most `max_rows` rows; a unit that would break either starts the next group.
/// The caller's filter then restores each row's own set inside a group. Why: a batched product
/// over a group of rows runs several times faster than per-row loops, and neighbouring queries
/// of these patterns mostly pick the same pages, blocks or diagonals, so the padding is small;
/// where they do not, the groups stay small and nothing is lost.
pub fn merged_groups(
    units: Vec<(Vec<usize>, Vec<usize>, usize)>,
    n_keys: usize,
    slack: f64,
    max_rows: usize,
) -> Vec<KeyGroup> {
    let mut stamp = vec![usize::MAX; n_keys];
    let mut groups: Vec<KeyGroup> = Vec::new();
    let mut pairs = 0usize;
    for (rows, keys, unit_pairs) in units {
        let id = groups.len().wrapping_sub(1);
        if let Some(g) = groups.last_mut() {
            let fresh = keys.iter().filter(|&&j| stamp[j] != id).count();
            let (r, l) = (g.rows.len() + rows.len(), g.keys.len() + fresh);
            if r <= max_rows && (r * l) as f64 <= slack * (pairs + unit_pairs) as f64 {
                for &j in &keys {
                    if stamp[j] != id {
                        stamp[j] = id;
                        g.keys.push(j);
                    }
                }
                g.rows.extend(rows);
                pairs += unit_pairs;
                continue;
            }
        }
        let id = groups.len();
        for &j in &keys {
            stamp[j] = id;
        }
        groups.push(KeyGroup { rows, keys });
        pairs = unit_pairs;
    }
    groups
}

/// Per-row sets as merged groups ([`merged_groups`]: slack 2, up to 64 rows); run them with a
/// filter that is true exactly on each row's set.
pub fn merged_rows(sets: Vec<Vec<usize>>) -> Vec<KeyGroup> {
    let n = sets.len();
    let units = sets
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let l = s.len();
            (vec![i], s, l)
        })
        .collect();
    merged_groups(units, n, 2.0, 64)
}

/// A block pattern's query blocks as merged groups (slack 1.25, up to 64 rows); run them with
/// [`BlockFilter`].
pub fn merged_block_groups(n: usize, kept: &[Vec<usize>]) -> Vec<KeyGroup> {
    let units = block_groups(n, kept)
        .into_iter()
        .map(|g| {
            let pairs = g
                .rows
                .iter()
                .map(|&i| g.keys.iter().filter(|&&j| j <= i).count())
                .sum();
            (g.rows, g.keys, pairs)
        })
        .collect();
    merged_groups(units, n, 1.25, 64)
}

/// Whether query i visits key j under a block pattern: j ≤ i and key block ⌊j/b⌋ kept for
/// query block ⌊i/b⌋ (a bit matrix over (query block, key block)).
pub struct BlockFilter {
    nb: usize,
    bits: Vec<bool>,
}

impl BlockFilter {
    pub fn new(kept: &[Vec<usize>]) -> Self {
        let nb = kept.len();
        let mut bits = vec![false; nb * nb];
        for (a, blocks) in kept.iter().enumerate() {
            for &c in blocks {
                bits[a * nb + c] = true;
            }
        }
        Self { nb, bits }
    }
    pub fn visits(&self, i: usize, j: usize) -> bool {
        j <= i && self.bits[(i / B) * self.nb + j / B]
    }
}

/// The causal filter of block groups.
pub fn causal_filter(i: usize, j: usize) -> bool {
    j <= i
}

/// A host copy of a [rows, cols] tensor as row-major f64.
pub fn host_f64(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?)
}

/// The block methods' common part (docs/reference.md §7.5.5, §7.5.7): per query block the diagonal block,
/// block 0 and the ⌈d/b⌉ − 2 best blocks by `score` ([nb × nb], row = query block), which is
/// computed only when some block is chosen by score; then the restricted softmax over them.
pub fn block_selection(
    method: &dyn crate::attention::Method,
    head: &HeadInputs,
    d: usize,
    score: impl FnOnce() -> Result<Vec<f64>>,
) -> Result<crate::attention::Approximation> {
    let n = checked_n(method, head, d)?;
    let nb = block_count(n);
    let score = if scored_count(d, 2) == 0 || nb < 3 {
        vec![0.0; nb * nb] // nothing is chosen by score
    } else {
        score()?
    };
    let kept = block_pattern(nb, d, &score);
    let filter = BlockFilter::new(&kept);
    let visits = |i: usize, j: usize| filter.visits(i, j);
    restricted(head, &merged_block_groups(n, &kept), Some(&visits))
}

/// The block methods' cost: the estimate's MACs when blocks are chosen by score, plus 2p per
/// visited pair.
pub fn block_macs(n: usize, p: usize, d: usize, estimate: f64) -> f64 {
    let scores = if scored_count(d, 2) == 0 {
        0.0
    } else {
        estimate
    };
    scores + crate::attention::sparse::pair_macs(block_visited_pairs(n, d), p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor_util::test_device;

    #[test]
    fn spans_counts_and_means_handle_a_ragged_last_block() {
        assert_eq!(block_span(2, 40), 32..40);
        assert_eq!(block_count(40), 3);
        assert_eq!(block_count(48), 3);
        assert_eq!(scored_count(16, 2), 0);
        assert_eq!(scored_count(17, 2), 0);
        assert_eq!(scored_count(33, 2), 1);
        assert_eq!(scored_count(16, 1), 0);
        assert_eq!(scored_count(1, 1), 0);
        let rows: Vec<f64> = (0..40 * 2).map(|x| x as f64).collect();
        let x = Tensor::from_vec(rows, (40, 2), &test_device()).unwrap();
        let m = block_means(&x).unwrap().to_vec2::<f64>().unwrap();
        // Block 0: rows 0..16, channel 0 holds 0, 2, …, 30 → 15; the ragged block rows 32..40.
        assert_eq!(
            m,
            vec![vec![15.0, 16.0], vec![47.0, 48.0], vec![71.0, 72.0]]
        );
        let (lo, hi) = block_bounds(&x).unwrap();
        assert_eq!(
            lo.to_vec2::<f64>().unwrap(),
            vec![vec![0.0, 1.0], vec![32.0, 33.0]]
        );
        assert_eq!(
            hi.to_vec2::<f64>().unwrap(),
            vec![vec![30.0, 31.0], vec![62.0, 63.0]]
        );
    }

    #[test]
    fn selectors_break_ties_to_the_lower_index_and_keep_the_fixed_blocks() {
        assert_eq!(top_indices(&[1.0, 2.0, 2.0, 0.0], 1), vec![1]);
        assert_eq!(top_indices(&[0.0; 5], 2), vec![0, 1]);
        assert_eq!(top_indices(&[0.0; 2], 5), vec![0, 1]);
        // nb = 4, d = 48 → one scored block; all scores equal → the lowest c > 0.
        let flat = vec![0.0; 16];
        assert_eq!(
            block_pattern(4, 48, &flat),
            vec![vec![0], vec![0, 1], vec![0, 1, 2], vec![0, 1, 3]]
        );
        let mut s = vec![0.0; 16];
        s[3 * 4 + 2] = 1.0; // query block 3 prefers key block 2
        s[3 * 4] = 9.0; // block 0 is kept anyway, never counted twice
        assert_eq!(block_pattern(4, 48, &s)[3], vec![0, 2, 3]);
        // d = 16: the two fixed blocks only.
        assert_eq!(block_pattern(4, 16, &s)[3], vec![0, 3]);
        // Pages: n = 40, d = 32 → one scored page; row 35 (page 2) prefers page 1.
        let (sets, filter) = page_sets(40, 32, |start, len, pages| {
            Ok((0..len * pages)
                .map(|x| ((start + x / pages == 35) && x % pages == 1) as u8 as f64)
                .collect())
        })
        .unwrap();
        for (i, s) in sets.iter().enumerate() {
            assert_eq!(
                *s,
                (0..40).filter(|&j| filter.visits(i, j)).collect::<Vec<_>>()
            );
        }
        assert_eq!(sets[35], (16..32).chain(32..36).collect::<Vec<_>>());
        assert_eq!(sets[34], (0..16).chain(32..35).collect::<Vec<_>>());
        assert_eq!(sets[3], vec![0, 1, 2, 3]);
        assert_eq!(
            sets.iter().map(|s| s.len()).sum::<usize>() as f64,
            page_visited_pairs(40, 32)
        );
    }

    #[test]
    fn analytic_pair_counts_match_the_patterns() {
        for (n, d) in [(40, 16), (40, 48), (100, 33), (257, 80), (5, 16)] {
            let nb = block_count(n);
            let kept = block_pattern(nb, d, &vec![0.0; nb * nb]);
            assert_eq!(
                block_pattern_pairs(n, &kept) as f64,
                block_visited_pairs(n, d)
            );
            let groups = block_groups(n, &kept);
            let counted: usize = groups
                .iter()
                .map(|g| {
                    g.rows
                        .iter()
                        .map(|&i| g.keys.iter().filter(|&&j| j <= i).count())
                        .sum::<usize>()
                })
                .sum();
            assert_eq!(counted as f64, block_visited_pairs(n, d));
        }
        assert_eq!(budget_pairs(5, 3), (1 + 2 + 3 + 3 + 3) as f64);
        assert_eq!(budget_pairs(3, 10), 6.0);
    }
}
