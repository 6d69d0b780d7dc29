//! Next-token output metrics (docs/reference.md §10.1 "Output metrics"): a method run's logits against
//! the exact run's at the scored positions, in f64 from the logits widened exactly, with
//! log-probabilities by a max-shifted log_softmax; and the statistics of llama.cpp's
//! `llama-perplexity --kl-divergence` report over those positions.

use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};

/// Log-probabilities of each row of `logits` ([rows, vocab], any float dtype), in f64:
/// x − max − ln Σ exp(x − max).
pub fn log_softmax_rows(logits: &Tensor) -> Result<Vec<Vec<f64>>> {
    let rows: Vec<Vec<f64>> = logits.to_dtype(DType::F64)?.to_vec2()?;
    Ok(rows.into_iter().map(log_softmax).collect())
}

fn log_softmax(mut row: Vec<f64>) -> Vec<f64> {
    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let ln_sum = row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
    // (x − max) − ln Σ, not x − (max + ln Σ): the latter loses ln Σ against a huge max.
    row.iter_mut().for_each(|x| *x = (*x - max) - ln_sum);
    row
}

/// The first index of the largest value (ties to the lower token id, §10.4).
pub fn argmax(row: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best
}

/// What each scored position measured: the prediction at position i of token i + 1.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PositionScores {
    /// KL(p_i ‖ p̂_i) in nats, clamped at 0 (f64 rounding can give −1e-17).
    pub kl: Vec<f64>,
    pub argmax_exact: Vec<usize>,
    pub argmax_method: Vec<usize>,
    /// −log p(y), −log p̂(y) of the label y = token i + 1.
    pub nll_exact: Vec<f64>,
    pub nll_method: Vec<f64>,
}

/// The per-position scores of a method's log-probabilities `method` against the exact run's
/// `exact` (one row per scored position, [`log_softmax_rows`]), with `labels` the next tokens.
pub fn score_positions(
    exact: &[Vec<f64>],
    method: &[Vec<f64>],
    labels: &[u32],
) -> Result<PositionScores> {
    ensure!(
        exact.len() == method.len() && exact.len() == labels.len() && !exact.is_empty(),
        "next-token scores: {} exact rows, {} method rows, {} labels",
        exact.len(),
        method.len(),
        labels.len()
    );
    let mut s = PositionScores::default();
    for ((lp, lq), &y) in exact.iter().zip(method).zip(labels) {
        ensure!(
            lp.len() == lq.len() && (y as usize) < lp.len(),
            "next-token scores: a row of {} against {} logits, label {y}",
            lp.len(),
            lq.len()
        );
        let kl: f64 = lp
            .iter()
            .zip(lq)
            .map(|(a, b)| {
                if *a == f64::NEG_INFINITY {
                    0.0
                } else {
                    a.exp() * (a - b)
                }
            })
            .sum();
        s.kl.push(kl.max(0.0));
        s.argmax_exact.push(argmax(lp));
        s.argmax_method.push(argmax(lq));
        s.nll_exact.push(-lp[y as usize]);
        s.nll_method.push(-lq[y as usize]);
    }
    Ok(s)
}

/// numpy's default (linear) percentile of `values` at `q` ∈ [0, 100].
pub fn percentile(values: &[f64], q: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let pos = q / 100.0 * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// The standard error of the mean of `v` (sample standard deviation / √N; 0 for one value).
fn standard_error(v: &[f64]) -> f64 {
    let n = v.len() as f64;
    if v.len() < 2 {
        return 0.0;
    }
    let m = mean(v);
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0);
    (var / n).sqrt()
}

/// The summary columns of `e2e.csv` (§10.1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutputMetrics {
    pub kl_mean: f64,
    pub kl_p99: f64,
    pub kl_max: f64,
    pub top1: f64,
    pub nll_exact: f64,
    pub nll_method: f64,
    pub dnll: f64,
    pub ppl_ratio: f64,
}

impl PositionScores {
    pub fn len(&self) -> usize {
        self.kl.len()
    }
    pub fn is_empty(&self) -> bool {
        self.kl.is_empty()
    }

    /// The fraction of positions whose argmax agrees.
    pub fn top1(&self) -> f64 {
        let same = self
            .argmax_exact
            .iter()
            .zip(&self.argmax_method)
            .filter(|(a, b)| a == b)
            .count();
        same as f64 / self.len() as f64
    }

    pub fn metrics(&self) -> OutputMetrics {
        let (nll_exact, nll_method) = (mean(&self.nll_exact), mean(&self.nll_method));
        let dnll = nll_method - nll_exact;
        OutputMetrics {
            kl_mean: mean(&self.kl),
            kl_p99: percentile(&self.kl, 99.0),
            kl_max: self.kl.iter().copied().fold(0.0, f64::max),
            top1: self.top1(),
            nll_exact,
            nll_method,
            dnll,
            ppl_ratio: dnll.exp(),
        }
    }
}

/// The statistics of llama.cpp's KL-divergence report (tools/perplexity/perplexity.cpp), for a
/// method against the exact run. Errors are standard errors of the mean over positions; the
/// PPL errors propagate the NLL's (PPL · SE), the ratio's that of the per-token difference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KldReport {
    pub positions: usize,
    pub kld_mean: f64,
    pub kld_se: f64,
    pub kld_median: f64,
    pub kld_p90: f64,
    pub kld_p95: f64,
    pub kld_p99: f64,
    pub kld_p999: f64,
    pub kld_max: f64,
    /// "Same top p": the fraction of positions with the same argmax, and its binomial error.
    pub same_top: f64,
    pub same_top_se: f64,
    /// RMS of Δp = p̂(y) − p(y), the change of the true token's probability, and its error.
    pub rms_dp: f64,
    pub rms_dp_se: f64,
    pub ppl_exact: f64,
    pub ppl_exact_se: f64,
    pub ppl_method: f64,
    pub ppl_method_se: f64,
    pub ppl_ratio: f64,
    pub ppl_ratio_se: f64,
    /// Pearson correlation of the per-token ln PPL (the NLLs) of the two runs.
    pub ln_ppl_correlation: f64,
}

impl KldReport {
    pub fn new(s: &PositionScores) -> Self {
        let n = s.len() as f64;
        let top = s.top1();
        let dp: Vec<f64> = s
            .nll_method
            .iter()
            .zip(&s.nll_exact)
            .map(|(m, e)| (-m).exp() - (-e).exp())
            .collect();
        let dp2: Vec<f64> = dp.iter().map(|x| x * x).collect();
        let ms_dp = mean(&dp2);
        // d√x = dx / (2√x): the error of the RMS from that of the mean square.
        let rms_dp_se = if ms_dp > 0.0 {
            standard_error(&dp2) / (2.0 * ms_dp.sqrt())
        } else {
            0.0
        };
        let diff: Vec<f64> = s
            .nll_method
            .iter()
            .zip(&s.nll_exact)
            .map(|(m, e)| m - e)
            .collect();
        let (ppl_exact, ppl_method) = (mean(&s.nll_exact).exp(), mean(&s.nll_method).exp());
        let ratio = mean(&diff).exp();
        KldReport {
            positions: s.len(),
            kld_mean: mean(&s.kl),
            kld_se: standard_error(&s.kl),
            kld_median: percentile(&s.kl, 50.0),
            kld_p90: percentile(&s.kl, 90.0),
            kld_p95: percentile(&s.kl, 95.0),
            kld_p99: percentile(&s.kl, 99.0),
            kld_p999: percentile(&s.kl, 99.9),
            kld_max: s.kl.iter().copied().fold(0.0, f64::max),
            same_top: top,
            same_top_se: if s.len() > 1 {
                (top * (1.0 - top) / (n - 1.0)).sqrt()
            } else {
                0.0
            },
            rms_dp: ms_dp.sqrt(),
            rms_dp_se,
            ppl_exact,
            ppl_exact_se: ppl_exact * standard_error(&s.nll_exact),
            ppl_method,
            ppl_method_se: ppl_method * standard_error(&s.nll_method),
            ppl_ratio: ratio,
            ppl_ratio_se: ratio * standard_error(&diff),
            ln_ppl_correlation: pearson(&s.nll_exact, &s.nll_method),
        }
    }
}

/// Pearson's correlation of two equal-length samples (NaN when either is constant).
pub fn pearson(a: &[f64], b: &[f64]) -> f64 {
    let (ma, mb) = (mean(a), mean(b));
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for (x, y) in a.iter().zip(b) {
        sab += (x - ma) * (y - mb);
        saa += (x - ma) * (x - ma);
        sbb += (y - mb) * (y - mb);
    }
    sab / (saa * sbb).sqrt()
}

/// Spearman's rank correlation: Pearson's of the ranks, ties given their mean rank.
pub fn spearman(a: &[f64], b: &[f64]) -> f64 {
    pearson(&ranks(a), &ranks(b))
}

fn ranks(v: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&i, &j| v[i].total_cmp(&v[j]));
    let mut r = vec![0.0; v.len()];
    let mut s = 0;
    while s < idx.len() {
        let mut e = s;
        while e + 1 < idx.len() && v[idx[e + 1]] == v[idx[s]] {
            e += 1;
        }
        let mean_rank = (s + e) as f64 / 2.0 + 1.0;
        for &i in &idx[s..=e] {
            r[i] = mean_rank;
        }
        s = e + 1;
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lsm(v: &[f64]) -> Vec<f64> {
        log_softmax(v.to_vec())
    }

    #[test]
    fn kl_top1_and_nll_on_hand_made_logits() {
        // p = (1/2, 1/4, 1/4), q = (1/4, 1/2, 1/4) as log-probabilities shifted by constants.
        let p = lsm(&[2f64.ln() + 3.0, 3.0, 3.0]);
        let q = lsm(&[-7.0, 2f64.ln() - 7.0, -7.0]);
        let s = score_positions(&[p.clone(), p.clone()], &[q, p], &[1, 0]).unwrap();
        // KL = ½ ln 2 + ¼ ln ½ + ¼ ln 1 = ¼ ln 2.
        assert!((s.kl[0] - 0.25 * 2f64.ln()).abs() < 1e-15, "{}", s.kl[0]);
        assert_eq!(s.kl[1], 0.0);
        assert_eq!(s.argmax_exact, vec![0, 0]);
        assert_eq!(s.argmax_method, vec![1, 0]);
        assert!((s.nll_exact[0] - 4f64.ln()).abs() < 1e-15);
        assert!((s.nll_method[0] - 2f64.ln()).abs() < 1e-15);
        let m = s.metrics();
        assert_eq!(m.top1, 0.5);
        assert!((m.kl_mean - 0.125 * 2f64.ln()).abs() < 1e-15);
        // dnll = mean(ln 2 − ln 4, ln 2 − ln 2) = −½ ln 2.
        assert!((m.dnll + 0.5 * 2f64.ln()).abs() < 1e-15);
        assert!((m.ppl_ratio - 0.5f64.sqrt()).abs() < 1e-15);
    }

    #[test]
    fn argmax_ties_go_to_the_lower_token_id() {
        assert_eq!(argmax(&[0.0, 1.0, 1.0, 0.5]), 1);
    }

    #[test]
    fn log_softmax_survives_huge_logits() {
        let r = lsm(&[1e300, 1e300, 0.0]);
        assert!(r.iter().all(|x| !x.is_nan()), "{r:?}");
        assert!((r[0] + 2f64.ln()).abs() < 1e-12 && r[2] < -1e299);
    }

    #[test]
    fn percentile_is_numpys_linear_interpolation() {
        // numpy.percentile([1, 2, 3, 4], [0, 50, 90, 99, 100]) = 1, 2.5, 3.7, 3.97, 4.
        let v = [4.0, 1.0, 3.0, 2.0];
        for (q, want) in [
            (0.0, 1.0),
            (50.0, 2.5),
            (90.0, 3.7),
            (99.0, 3.97),
            (100.0, 4.0),
        ] {
            assert!((percentile(&v, q) - want).abs() < 1e-12, "q = {q}");
        }
    }

    #[test]
    fn the_kld_report_on_hand_made_scores() {
        let s = PositionScores {
            kl: vec![0.1, 0.3, 0.0, 0.2],
            argmax_exact: vec![1, 2, 3, 4],
            argmax_method: vec![1, 2, 0, 4],
            nll_exact: vec![1.0, 2.0, 3.0, 2.0],
            nll_method: vec![1.5, 2.5, 3.5, 2.5],
        };
        let r = KldReport::new(&s);
        assert!((r.kld_mean - 0.15).abs() < 1e-15);
        // SE: sample sd of (0.1, 0.3, 0, 0.2) is √(0.05/3); / √4.
        assert!((r.kld_se - (0.05f64 / 3.0).sqrt() / 2.0).abs() < 1e-15);
        assert!((r.kld_median - 0.15).abs() < 1e-15);
        assert_eq!(r.kld_max, 0.3);
        assert_eq!(r.same_top, 0.75);
        assert!((r.same_top_se - (0.75f64 * 0.25 / 3.0).sqrt()).abs() < 1e-15);
        // Every NLL moved by +0.5: ratio e^0.5 with no spread, correlation 1.
        assert!((r.ppl_ratio - 0.5f64.exp()).abs() < 1e-15);
        assert!(r.ppl_ratio_se.abs() < 1e-15);
        assert!((r.ln_ppl_correlation - 1.0).abs() < 1e-12);
        assert!((r.ppl_exact - 2f64.exp()).abs() < 1e-12);
        let dp: Vec<f64> = [1.0f64, 2.0, 3.0, 2.0]
            .iter()
            .map(|e| (-(e + 0.5f64)).exp() - (-e).exp())
            .collect();
        let rms = (dp.iter().map(|x| x * x).sum::<f64>() / 4.0).sqrt();
        assert!((r.rms_dp - rms).abs() < 1e-15);
    }

    #[test]
    fn spearman_of_monotone_maps_is_one_and_ties_take_mean_ranks() {
        let a = [1.0, 5.0, 2.0, 9.0];
        let b = [10.0, 50.0, 11.0, 1e9];
        assert!((spearman(&a, &b) - 1.0).abs() < 1e-12);
        assert_eq!(ranks(&[3.0, 1.0, 3.0]), vec![2.5, 1.0, 2.5]);
        let rev: Vec<f64> = b.iter().map(|x| -x).collect();
        assert!((spearman(&a, &rev) + 1.0).abs() < 1e-12);
    }
}
