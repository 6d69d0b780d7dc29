//! `vertical_slash`: columns and diagonals from the last queries (docs/reference.md §7.5.6) — MInference
//! 1.0's vertical-slash pattern (Jiang et al., NeurIPS 2024, §3.2, Algorithm 3; code
//! `microsoft/MInference`, `minference/modules/minference_forward.py`):
//!
//!   w = min(64, n); A = the exact causal softmax rows of queries n−w..n−1 against all keys;
//!   column scores c_j = Σ_r A_rj; diagonal scores s_o = Σ_r A_{r, r−o} (o = r − j ≥ 0);
//!   columns: v = ⌊d/2⌋ — the s = 4 sinks j < 4 first, then the largest c_j;
//!   offsets: d − v — o = 0 first, then the largest s_o (ties to the lower index);
//!   S_i = {j ∈ columns : j ≤ i} ∪ {i − o : o ∈ offsets, o ≤ i}.
//!
//! What d means: keys per query (§7.3), ⌊d/2⌋ columns + ⌈d/2⌉ diagonals; columns and diagonals
//! overlap, so |S_i| ≤ min(d, i+1) and the realised count is reported. When ⌊d/2⌋ < 4 the
//! columns are the first ⌊d/2⌋ sinks; d = 1 keeps the diagonal only. Deterministic. A covering
//! budget is d ≥ 2n (every column), not d ≥ n: at d = n the n/2 best columns and n/2 best offsets
//! need not cover a row.
//! [P≠C] the kernel widens each diagonal to 64-wide blocks and forces 30 columns and 100 offsets at
//! 128k; here the pattern is at token granularity and scaled to the budget.
//!
//! Cost: w·n·p for the estimate (the last w exact rows) + 2p per visited pair, counted at the budget
//! Σ_i min(d, i+1). The estimate forms only the w×n block of A.

use anyhow::Result;
use candle_core::DType;

use super::select::{budget_pairs, checked_n, merged_rows, restricted, top_indices, SINKS};
use crate::attention::exact::{causal_scores, scaled_operands};
use crate::attention::sparse::pair_macs;
use crate::attention::{Approximation, HeadInputs, Method, MethodInfo};
use crate::numerics::sampling::TrialRng;

pub struct VerticalSlash;

/// The estimate's last queries.
pub const LAST: usize = 64;

/// The kept columns and diagonal offsets, each in increasing order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    pub columns: Vec<usize>,
    pub offsets: Vec<usize>,
}

/// The pattern of budget d from A, the exact causal rows of the last w queries ([w, n]
/// row-major: row r is query n − w + r).
pub fn pattern(a: &[f64], n: usize, d: usize) -> Pattern {
    let w = a.len() / n;
    let mut col = vec![0f64; n];
    let mut diag = vec![0f64; n];
    for r in 0..w {
        let i = n - w + r;
        for (j, &x) in a[r * n..r * n + i + 1].iter().enumerate() {
            col[j] += x;
            diag[i - j] += x;
        }
    }
    let v = d / 2;
    let sinks = SINKS.min(v).min(n);
    let mut columns: Vec<usize> = (0..sinks).collect();
    columns.extend(
        top_indices(&col[sinks..], v - sinks)
            .iter()
            .map(|j| j + sinks),
    );
    let mut offsets = vec![0];
    offsets.extend(
        top_indices(&diag[1..], (d - v).saturating_sub(1))
            .iter()
            .map(|o| o + 1),
    );
    Pattern { columns, offsets }
}

/// The per-row sets S_i of a pattern, each key once.
pub fn key_sets(n: usize, pat: &Pattern) -> Vec<Vec<usize>> {
    let mut is_col = vec![false; n];
    for &j in &pat.columns {
        is_col[j] = true;
    }
    (0..n)
        .map(|i| {
            let mut s: Vec<usize> = pat
                .columns
                .iter()
                .copied()
                .take_while(|&j| j <= i)
                .collect();
            s.extend(
                pat.offsets
                    .iter()
                    .take_while(|&&o| o <= i)
                    .map(|o| i - o)
                    .filter(|&j| !is_col[j]),
            );
            s
        })
        .collect()
}

impl Method for VerticalSlash {
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(&super::VERTICAL_SLASH)
    }
    fn approximate(&self, head: &HeadInputs, d: usize, _: &mut TrialRng) -> Result<Approximation> {
        let n = checked_n(self, head, d)?;
        let w = LAST.min(n);
        let pat = head.memo("vertical_slash_last_rows", || {
            // Under a layer's spec A is the target's own rows (§7.7.6: capped, windowed, over
            // real keys); the sink columns that fall outside a window are dropped in `restricted`.
            let a = if head.spec.features(head.p(), n).is_plain() {
                let (qs, kt) = scaled_operands(&head.q, &head.k)?;
                let s = causal_scores(&qs.narrow(0, n - w, w)?, &kt, n - w)?;
                candle_nn::ops::softmax_last_dim(&s)?
            } else {
                head.spec_probability_rows(n - w, w, head.dtype())?
            };
            Ok(a.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?)
        })?;
        let pat = pattern(&pat, n, d);
        let (mut is_col, mut is_off) = (vec![false; n], vec![false; n]);
        pat.columns.iter().for_each(|&j| is_col[j] = true);
        pat.offsets.iter().for_each(|&o| is_off[o] = true);
        let visits = |i: usize, j: usize| j <= i && (is_col[j] || is_off[i - j]);
        restricted(head, &merged_rows(key_sets(n, &pat)), Some(&visits))
    }
    /// The causal cost (the method has no other form).
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        (LAST.min(n) * n * p) as f64 + pair_macs(budget_pairs(n, d), p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::prefill::test_util::{
        assert_spec_restricted, causal_p, sets_at, spec_head, spec_p, stable_top,
        support_and_weights, tied_head,
    };
    use crate::attention::test_util::{assert_causal_restricted, causal, random_head};

    /// §7.5.6 from the dense f64 P: the scores in loops over the last w rows, the sinks forced,
    /// stable sorts for the rest.
    fn sets_by_definition(p: &[Vec<f64>], d: usize) -> Vec<Vec<bool>> {
        let n = p.len();
        let w = n.min(64);
        let c: Vec<f64> = (0..n).map(|j| (n - w..n).map(|i| p[i][j]).sum()).collect();
        let s: Vec<f64> = (0..n)
            .map(|o| (n - w..n).filter(|&i| i >= o).map(|i| p[i][i - o]).sum())
            .collect();
        let v = d / 2;
        let sinks = v.min(4).min(n);
        let mut cols: Vec<usize> = (0..sinks).collect();
        cols.extend(stable_top(&c[sinks..], v - sinks).iter().map(|j| j + sinks));
        let mut offs = vec![0];
        offs.extend(stable_top(&s[1..], d - v - 1).iter().map(|o| o + 1));
        (0..n)
            .map(|i| {
                (0..n)
                    .map(|j| j <= i && (cols.contains(&j) || offs.contains(&(i - j))))
                    .collect()
            })
            .collect()
    }

    /// Under a layer's spec (a window of 30, τ, a cap and a sink): columns and diagonals scored
    /// from the target's last rows (capped, windowed, over real keys), the sets inside the
    /// window, the layer's logits and the sink in every denominator, in float64.
    #[test]
    fn under_a_layer_spec_it_is_its_definition_on_the_targets_rows() {
        let h = spec_head(120, 30, 63);
        let p = spec_p(&h);
        for d in [8, 20, 45] {
            let sets = sets_by_definition(&p, d);
            assert_spec_restricted(&VerticalSlash, &h, d, |i, j| sets[i][j]);
        }
    }

    #[test]
    fn equals_the_dense_masked_softmax_over_columns_and_diagonals() {
        for (n, seed) in [(203, 61), (40, 62)] {
            let h = random_head(n, 16, seed, DType::F64);
            let p = causal_p(&causal(&h));
            let ds = [1, 2, 5, 8, 9, 30, 64, 2 * n];
            let by_d: Vec<_> = ds.iter().map(|&d| sets_by_definition(&p, d)).collect();
            assert_causal_restricted(&VerticalSlash, &h, &ds, sets_at(&ds, &by_d));
        }
    }

    /// q = 0: A's rows are uniform, c_j and s_o are equal wherever all 64 rows see them, so ties
    /// keep columns 0..v and offsets 0..d−v; n = 100, d = 20: S_i = {0..9} ∪ {i−9..i}, overlapping
    /// for i < 19. d = 1 keeps the diagonal alone.
    #[test]
    fn ties_overlaps_and_the_first_rows_by_hand() {
        let (n, h) = (100, tied_head(100, 8));
        let (sets, mass, keys) = support_and_weights(&VerticalSlash, &h, 20);
        assert_eq!(sets[50], (0..10).chain(41..51).collect::<Vec<_>>());
        assert_eq!(sets[12], (0..13).collect::<Vec<_>>());
        let want: Vec<usize> = (0..n).map(|i| (i + 1).min(20)).collect();
        assert_eq!(sets.iter().map(|s| s.len()).collect::<Vec<_>>(), want);
        assert_eq!(keys, want.iter().sum::<usize>() as f64 / n as f64);
        let m = (0..n).map(|i| want[i] as f64 / (i + 1) as f64).sum::<f64>() / n as f64;
        assert!((mass - m).abs() < 1e-12);
        let (sets, _, keys) = support_and_weights(&VerticalSlash, &h, 1);
        assert!(sets.iter().enumerate().all(|(i, s)| s == &vec![i]));
        assert_eq!(keys, 1.0);
    }

    #[test]
    fn the_pattern_puts_the_sinks_first_and_never_counts_a_key_twice() {
        // n = 6, w = 6; A chosen so that offset 2 wins and columns 4, 5 tie.
        let n = 6;
        let mut a = vec![0.0; n * n];
        for i in 0..n {
            a[i * n] = 0.1;
            a[i * n + i.min(5)] += 0.2;
            if i >= 2 {
                a[i * n + i - 2] += 0.5;
            }
        }
        let pat = pattern(&a, n, 12);
        assert_eq!(pat.columns, (0..6).collect::<Vec<_>>());
        let pat = pattern(&a, n, 10);
        assert_eq!(pat.columns, vec![0, 1, 2, 3, 4]);
        assert_eq!(pat.offsets, vec![0, 1, 2, 3, 4]); // 0 first, 2 by score, then ties
        let sets = key_sets(n, &pat);
        assert_eq!(sets[5], vec![0, 1, 2, 3, 4, 5]);
        let pat = pattern(&a, n, 4); // 2 columns: the first two sinks
        assert_eq!(pat.columns, vec![0, 1]);
        assert_eq!(pat.offsets, vec![0, 2]);
        assert_eq!(key_sets(n, &pat)[4], vec![0, 1, 4, 2]);
    }
}
