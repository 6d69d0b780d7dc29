//! summary.csv: mean and standard error over trials for each (model, n, method, d).

use serde::{Deserialize, Serialize};

/// One curve point. Column order is the CSV schema (docs/guide.md, "Output files").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryRow {
    pub model: String,
    pub n: usize,
    pub method: String,
    pub d: usize,
    /// Trials with a finite error (the ones averaged).
    pub trials: usize,
    /// Mean of ‖O − Ô‖₂ over finite trials.
    pub mean: f64,
    /// Standard error sd/√trials (sample sd, n − 1); 0 with one trial.
    pub stderr: f64,
    /// Median of the finite trials' errors: a robust level beside the mean for heavy-tailed
    /// methods (Skyformer's pseudo-inverse on pretrained weights has single trials 10⁴× the
    /// median). Absent (NaN) in summaries written before the column existed.
    #[serde(default = "not_recorded")]
    pub median: f64,
    pub rel_mean: f64,
    pub rel_stderr: f64,
    /// Trials excluded from the mean because Ô had non-finite rows (or D̂ ≤ 0 rows made it NaN).
    pub nonfinite_trials: usize,
    /// Trials with at least one row counted in `nonfinite_rows` (finite or not overall).
    pub flagged_trials: usize,
    pub macs: f64,
    pub seconds_mean: f64,
    /// What the errors are measured against; the last column (older summaries read as softmax).
    #[serde(default)]
    pub target: crate::attention::Target,
    /// The target's mask; after `target` (older summaries read as none).
    #[serde(default)]
    pub mask: crate::attention::Mask,
    /// Mean realised keys per query over the trials (restrict-and-renormalise methods), else empty.
    #[serde(default)]
    pub keys_mean: Option<f64>,
    /// Mean mass captured over the trials (restrict-and-renormalise methods), else empty.
    #[serde(default)]
    pub mass_mean: Option<f64>,
    /// Means over the trials of cos_sim, rel_l1 and rmse (docs/reference.md §8.5: per-head measures; this
    /// mean over heads is the figure comparable with the papers' flattened ones), of kv_bits and of
    /// kv_read; empty where a trial lacks the column (older files, methods that read no cache).
    #[serde(default)]
    pub cos_sim_mean: Option<f64>,
    #[serde(default)]
    pub rel_l1_mean: Option<f64>,
    #[serde(default)]
    pub rmse_mean: Option<f64>,
    #[serde(default)]
    pub kv_bits: Option<f64>,
    #[serde(default)]
    pub kv_read_mean: Option<f64>,
    /// The decode protocol's n_f (docs/reference.md §9.1): the rows scored were the last n_f of each
    /// window. Part of the point's identity (a decode and a prefill run never share a point).
    #[serde(default)]
    pub n_f: Option<usize>,
    /// Mean `kv_union` over the trials (decode methods), else empty.
    #[serde(default)]
    pub kv_union_mean: Option<f64>,
}

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};

use super::trials::TrialRow;

fn not_recorded() -> f64 {
    f64::NAN
}

/// Median of the values (the mean of the middle two for an even count); NaN when empty.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        k if k % 2 == 1 => v[k / 2],
        k => 0.5 * (v[k / 2 - 1] + v[k / 2]),
    }
}

/// Mean and standard error (sample sd / √k) of finite values; (NaN, NaN) when none.
pub fn mean_stderr(values: &[f64]) -> (f64, f64) {
    let k = values.len();
    if k == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mean = values.iter().sum::<f64>() / k as f64;
    if k == 1 {
        return (mean, 0.0);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (k as f64 - 1.0);
    (mean, (var / k as f64).sqrt())
}

/// Groups trials by (target, mask, n_f, model, n, method, d) and averages over the finite ones (rows
/// of different targets or masks never share a point). Order: target, mask, model, n, method in
/// `method_order` (unknown ones last, by name), d.
pub fn summarize(rows: &[TrialRow], method_order: &[String]) -> Vec<SummaryRow> {
    let rank = |m: &str| {
        method_order
            .iter()
            .position(|x| x == m)
            .unwrap_or(usize::MAX)
    };
    type Key = (
        crate::attention::Target,
        crate::attention::Mask,
        Option<usize>,
        String,
        usize,
        usize,
        String,
        usize,
    );
    let mut groups: BTreeMap<Key, Vec<&TrialRow>> = BTreeMap::new();
    for r in rows {
        groups
            .entry((
                r.target,
                r.mask,
                r.n_f,
                r.model.clone(),
                r.n,
                rank(&r.method),
                r.method.clone(),
                r.d,
            ))
            .or_default()
            .push(r);
    }
    groups
        .into_iter()
        .map(|((target, mask, n_f, model, n, _, method, d), rs)| {
            let finite: Vec<&&TrialRow> = rs.iter().filter(|r| r.error.is_finite()).collect();
            let errs: Vec<f64> = finite.iter().map(|r| r.error).collect();
            let rels: Vec<f64> = finite
                .iter()
                .map(|r| r.rel_error)
                .filter(|x| x.is_finite())
                .collect();
            let (mean, stderr) = mean_stderr(&errs);
            let (rel_mean, rel_stderr) = mean_stderr(&rels);
            SummaryRow {
                model,
                n,
                method,
                d,
                trials: errs.len(),
                mean,
                stderr,
                median: median(&errs),
                rel_mean,
                rel_stderr,
                nonfinite_trials: rs.len() - errs.len(),
                flagged_trials: rs.iter().filter(|r| r.nonfinite_rows > 0).count(),
                macs: rs[0].macs,
                seconds_mean: rs.iter().map(|r| r.seconds).sum::<f64>() / rs.len() as f64,
                target,
                mask,
                keys_mean: mean_of(rs.iter().map(|r| r.keys)),
                mass_mean: mean_of(rs.iter().map(|r| r.mass)),
                cos_sim_mean: mean_of(rs.iter().map(|r| r.cos_sim)),
                rel_l1_mean: mean_of(rs.iter().map(|r| r.rel_l1)),
                rmse_mean: mean_of(rs.iter().map(|r| r.rmse)),
                kv_bits: mean_of(rs.iter().map(|r| r.kv_bits)),
                kv_read_mean: mean_of(rs.iter().map(|r| r.kv_read)),
                n_f,
                kv_union_mean: mean_of(rs.iter().map(|r| r.kv_union)),
            }
        })
        .collect()
}

/// The mean of the values when every trial has one, else None.
fn mean_of(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let v: Option<Vec<f64>> = values.collect();
    v.filter(|v| !v.is_empty())
        .map(|v| v.iter().sum::<f64>() / v.len() as f64)
}

pub fn write(path: &Path, rows: &[SummaryRow]) -> Result<()> {
    crate::atomic_file::write_with(path, |tmp| {
        let mut w = csv::Writer::from_path(tmp)
            .map_err(|e| crate::usage!("cannot write {} ({e})", path.display()))?;
        for r in rows {
            w.serialize(r)?;
        }
        w.flush()
            .with_context(|| format!("writing {} (disk full?)", path.display()))?;
        Ok(())
    })
}

pub fn read(path: &Path) -> Result<Vec<SummaryRow>> {
    let mut rdr = csv::Reader::from_path(path)
        .map_err(|e| crate::usage!("{}: cannot read ({e})", path.display()))?;
    let mut out = Vec::new();
    for (i, r) in rdr.deserialize().enumerate() {
        out.push(r.map_err(|e| {
            crate::usage!(
                "{}: malformed summary row {} ({e}); expected the columns of summary.csv",
                path.display(),
                i + 2
            )
        })?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stderr_is_sample_sd_over_root_k() {
        let (m, se) = mean_stderr(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(m, 2.5);
        // sd = sqrt(5/3), se = sd/2
        assert!((se - (5.0f64 / 3.0).sqrt() / 2.0).abs() < 1e-15);
        assert_eq!(mean_stderr(&[7.0]), (7.0, 0.0));
        assert!(mean_stderr(&[]).0.is_nan());
    }

    #[test]
    fn median_of_odd_and_even_counts_and_heavy_tails() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
        // One wild trial moves the mean, not the median.
        assert_eq!(median(&[1.0, 1.1, 0.9, 1e5, 1.0]), 1.0);
    }

    #[test]
    fn summaries_without_the_median_column_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("summary.csv");
        std::fs::write(
            &path,
            "model,n,method,d,trials,mean,stderr,rel_mean,rel_stderr,nonfinite_trials,flagged_trials,macs,seconds_mean\n\
             initialized,512,vmean,8,2,1.5,0.5,0.1,0.01,0,0,10.0,0.001\n",
        )
        .unwrap();
        let rows = read(&path).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].mean, 1.5);
        assert!(rows[0].median.is_nan());
        // Written back, the column is there.
        write(&path, &rows).unwrap();
        assert!(std::fs::read_to_string(&path)
            .unwrap()
            .starts_with("model,n,method,d,trials,mean,stderr,median,"));
    }
}
