//! Which operator metric predicts the damage at the output (issue 43, docs/reference.md §10.6):
//! Spearman's ρ between `kl_mean` and each operator metric over the (mode, method, d) points,
//! each point the mean over windows, with a bootstrap interval over windows; over all points and
//! over the near-lossless ones (mean KL < 0.01) separately, since a predictor can rank large
//! errors and still fail near the exact model.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use rand::{Rng, SeedableRng};

use crate::numerics::next_token::{percentile, spearman};

/// The near-lossless subset's bound on a point's mean KL (nats).
pub const NEAR_LOSSLESS_KL: f64 = 0.01;
/// Bootstrap resamples of the windows (seeded: the interval is reproducible).
const RESAMPLES: usize = 1000;

/// One line of `summary.csv`.
#[derive(Debug, Clone, PartialEq)]
pub struct Correlation {
    pub subset: &'static str,
    pub predictor: String,
    pub points: usize,
    pub spearman: f64,
    /// The 2.5 and 97.5 percentiles of ρ over window resamples (NaN with one window).
    pub ci_low: f64,
    pub ci_high: f64,
}

/// Per point (mode, method, d): per window, kl_mean and every predictor column.
type Table = BTreeMap<(String, String, usize), BTreeMap<usize, Vec<f64>>>;

/// The predictors: the layer means and the one-layer view's columns of the header.
fn predictors(header: &[&str]) -> Vec<usize> {
    header
        .iter()
        .enumerate()
        .filter(|(_, h)| {
            matches!(
                **h,
                "op_err_mean" | "op_rel_err_mean" | "op_1mcos_mean" | "mass_mean"
            ) || h.starts_with("one_layer_")
        })
        .map(|(i, _)| i)
        .collect()
}

/// The correlation table of the run in `out` (its e2e.csv).
pub fn correlations(out: &Path) -> Result<Vec<Correlation>> {
    let t = crate::report::e2e_rows::E2eRows::read(&out.join("e2e.csv"))?;
    let header: Vec<&str> = t.header.iter().map(String::as_str).collect();
    let kl = t.col("kl_mean")?;
    let preds = predictors(&header);
    let mut table = Table::new();
    for r in &t.rows {
        let values = std::iter::once(kl)
            .chain(preds.iter().copied())
            .map(|i| r.values[i])
            .collect();
        table
            .entry(r.point.clone())
            .or_default()
            .insert(r.window, values);
    }
    let windows: Vec<usize> = {
        let mut w: Vec<usize> = table.values().flat_map(|m| m.keys().copied()).collect();
        w.sort_unstable();
        w.dedup();
        w
    };
    let means = point_means(&table, &windows);
    let mut out_rows = Vec::new();
    for (subset, keep) in [("all", f64::INFINITY), ("near_lossless", NEAR_LOSSLESS_KL)] {
        let points: Vec<&(String, String, usize)> = means
            .iter()
            .filter(|(_, v)| v[0] < keep)
            .map(|(k, _)| k)
            .collect();
        for (j, &c) in preds.iter().enumerate() {
            out_rows.push(correlate(
                subset,
                header[c],
                j + 1,
                &points,
                &table,
                &windows,
            ));
        }
    }
    Ok(out_rows)
}

/// Each point's mean over `windows` (a window may repeat in a resample) of every column.
fn point_means(table: &Table, windows: &[usize]) -> BTreeMap<(String, String, usize), Vec<f64>> {
    table
        .iter()
        .filter_map(|(k, per)| {
            let rows: Vec<&Vec<f64>> = windows.iter().filter_map(|w| per.get(w)).collect();
            let first = rows.first()?;
            let mean = (0..first.len())
                .map(|i| rows.iter().map(|r| r[i]).sum::<f64>() / rows.len() as f64)
                .collect();
            Some((k.clone(), mean))
        })
        .collect()
}

fn correlate(
    subset: &'static str,
    name: &str,
    j: usize,
    points: &[&(String, String, usize)],
    table: &Table,
    windows: &[usize],
) -> Correlation {
    let rho = |ws: &[usize]| -> (usize, f64) {
        let means = point_means(table, ws);
        let pairs: Vec<(f64, f64)> = points
            .iter()
            .filter_map(|k| means.get(*k))
            .map(|v| (v[0], v[j]))
            .filter(|(a, b)| a.is_finite() && b.is_finite())
            .collect();
        let (a, b): (Vec<f64>, Vec<f64>) = pairs.into_iter().unzip();
        (
            a.len(),
            if a.len() >= 3 {
                spearman(&a, &b)
            } else {
                f64::NAN
            },
        )
    };
    let (count, spearman_all) = rho(windows);
    let (mut lo, mut hi) = (f64::NAN, f64::NAN);
    if windows.len() > 1 && count >= 3 {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x05ee_de2e);
        let draws: Vec<f64> = (0..RESAMPLES)
            .map(|_| {
                let ws: Vec<usize> = (0..windows.len())
                    .map(|_| windows[rng.random_range(0..windows.len())])
                    .collect();
                rho(&ws).1
            })
            .filter(|r| r.is_finite())
            .collect();
        lo = percentile(&draws, 2.5);
        hi = percentile(&draws, 97.5);
    }
    Correlation {
        subset,
        predictor: name.to_string(),
        points: count,
        spearman: spearman_all,
        ci_low: lo,
        ci_high: hi,
    }
}

/// Writes `summary.csv` of the run in `out` (whole, under a temporary name).
pub fn write(out: &Path) -> Result<Vec<Correlation>> {
    let rows = correlations(out)?;
    let mut text = String::from("subset,predictor,points,spearman,ci_low,ci_high\n");
    for r in &rows {
        text += &format!(
            "{},{},{},{},{},{}\n",
            r.subset, r.predictor, r.points, r.spearman, r.ci_low, r.ci_high
        );
    }
    crate::atomic_file::write(&out.join("summary.csv"), text.as_bytes())?;
    Ok(rows)
}

/// The correlation table as text, for the console.
pub fn table(out: &Path) -> Result<String> {
    let mut t = format!(
        "Spearman ρ(kl_mean, predictor) over (mode, method, d) points, 95% bootstrap interval over windows\n{:<14} {:<24} {:>6} {:>8} {:>18}\n",
        "subset", "predictor", "points", "rho", "interval"
    );
    for r in correlations(out)? {
        t += &format!(
            "{:<14} {:<24} {:>6} {:>8.3} {:>8.3} .. {:<8.3}\n",
            r.subset, r.predictor, r.points, r.spearman, r.ci_low, r.ci_high
        );
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_predictor_monotone_in_kl_has_rho_one_and_an_anti_monotone_one_minus_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = String::from("window,mode,method,d,kl_mean,op_err_mean,mass_mean\n");
        for w in 0..3 {
            for (i, d) in [8usize, 16, 32, 64, 128].iter().enumerate() {
                let kl = 0.5 / (i as f64 + 1.0) + 0.001 * w as f64;
                text += &format!(
                    "{w},prefill,window,{d},{kl},{},{}\n",
                    kl * kl * 3.0,
                    1.0 - kl
                );
            }
        }
        std::fs::write(dir.path().join("e2e.csv"), text).unwrap();
        let rows = write(dir.path()).unwrap();
        let get = |s: &str, p: &str| {
            rows.iter()
                .find(|r| r.subset == s && r.predictor == p)
                .unwrap()
        };
        let op = get("all", "op_err_mean");
        assert_eq!(op.points, 5);
        assert!((op.spearman - 1.0).abs() < 1e-12 && (op.ci_low - 1.0).abs() < 1e-12);
        assert!((get("all", "mass_mean").spearman + 1.0).abs() < 1e-12);
        // Near-lossless: no point has mean KL < 0.01, so no ρ.
        assert_eq!(get("near_lossless", "op_err_mean").points, 0);
        assert!(std::fs::read_to_string(dir.path().join("summary.csv"))
            .unwrap()
            .starts_with("subset,"));
    }
}
