//! `approx-bench check`: is a run worse than a baseline by more than the noise?
//!
//! For every curve point (model, n, method, d) of the baseline, the current mean error is
//! compared with the baseline's. The difference Δ = mean_c − mean_b is a regression when
//! Δ > q·SE + slack·|mean_b|, an improvement when Δ < −(q·SE + slack·|mean_b|), where
//!
//! * SE is the **paired** standard error of the per-trial differences (current − baseline,
//!   matched on (window, head)) when both sides have trials.csv with the same trial keys for
//!   the point: the variation between windows and heads is shared by both runs, so it cancels
//!   (a deterministic method then has SE = 0 and the slack alone decides). Otherwise the
//!   **unpaired** SE = √(SE_b² + SE_c²) from the two summaries.
//! * q is the Bonferroni-corrected critical value for a family-wise false-positive rate α over
//!   the m compared points: the upper α/m quantile (α/(2m) with --two-sided) of Student's t
//!   with the test's degrees of freedom (pairs − 1, or Welch–Satterthwaite for the unpaired
//!   test), which is z = Φ⁻¹(1 − α/m) for large samples and honest for small ones.
//!
//! Points missing on either side, new non-finite trials and configuration changes are findings
//! of their own. `--exact` instead demands trial-level equality within 1e-12 relative.
//!
//! [`check`] is the pure core (loaded data in, [`CheckReport`] out); [`crate::check::execute`] runs
//! the `check` command (and the re-run of `--rerun`) around it.

pub mod drift;
mod exact;
pub mod load;
pub mod render;
mod report;
pub mod stats;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};

use anyhow::Result;

use crate::report::summary::SummaryRow;
use crate::report::trials::TrialRow;
use crate::usage;

pub use load::{load, RunData};
pub use report::{
    CheckOptions, CheckReport, Finding, PointKey, PointResult, SideStat, Status, Test, WorstTrial,
};

/// Relative tolerance of `--exact`.
pub const EXACT_REL_TOL: f64 = 1e-12;
/// Relative tolerance within which summary.csv and the means recomputed from trials.csv agree.
const CONSISTENT_REL_TOL: f64 = 1e-9;

/// Errors of one trial per (window, head), for one point of one side.
pub(crate) type TrialMap = BTreeMap<(usize, usize), f64>;

/// Per-point trial errors of a side, keeping only points whose trials reproduce summary.csv
/// (an edited or stale summary must not be silently replaced by trial data).
struct SideTrials {
    usable: HashMap<PointKey, TrialMap>,
    /// Points whose trials disagree with the summary, with the reason.
    inconsistent: Vec<(PointKey, String)>,
}

fn side_trials(summary: &[SummaryRow], trials: Option<&Vec<TrialRow>>) -> Option<SideTrials> {
    let trials = trials?;
    let mut grouped: HashMap<PointKey, Vec<&TrialRow>> = HashMap::new();
    for t in trials {
        grouped
            .entry((t.model.clone(), t.n, t.method.clone(), t.d))
            .or_default()
            .push(t);
    }
    let mut usable = HashMap::new();
    let mut inconsistent = Vec::new();
    for s in summary {
        let key = (s.model.clone(), s.n, s.method.clone(), s.d);
        let Some(rows) = grouped.get(&key) else {
            inconsistent.push((key, "trials.csv has no trials for this point".to_string()));
            continue;
        };
        let mut map = TrialMap::new();
        let mut duplicate = false;
        for r in rows {
            duplicate |= map.insert((r.window, r.head), r.error).is_some();
        }
        let finite: Vec<f64> = rows
            .iter()
            .map(|r| r.error)
            .filter(|e| e.is_finite())
            .collect();
        let (mean, _) = crate::report::summary::mean_stderr(&finite);
        let nonfinite = rows.len() - finite.len();
        let agrees = finite.len() == s.trials
            && nonfinite == s.nonfinite_trials
            && ((mean.is_nan() && s.mean.is_nan())
                || (mean - s.mean).abs()
                    <= CONSISTENT_REL_TOL * s.mean.abs().max(f64::MIN_POSITIVE));
        if duplicate {
            inconsistent.push((
                key,
                "trials.csv holds a (window, head) twice for this point".to_string(),
            ));
        } else if !agrees {
            inconsistent.push((
                key,
                format!(
                    "summary.csv says mean {} over {} trials, trials.csv gives {} over {}",
                    render::num(s.mean),
                    s.trials,
                    render::num(mean),
                    finite.len()
                ),
            ));
        } else {
            usable.insert(key, map);
        }
    }
    Some(SideTrials {
        usable,
        inconsistent,
    })
}

fn stat(r: &SummaryRow) -> SideStat {
    SideStat {
        mean: r.mean,
        se: r.stderr,
        trials: r.trials,
        nonfinite: r.nonfinite_trials,
        flagged: r.flagged_trials,
    }
}

fn key_of(r: &SummaryRow) -> PointKey {
    (r.model.clone(), r.n, r.method.clone(), r.d)
}

/// Compares `current` with `baseline`. Pure: no files are read or written. Errors only for
/// unusable options or `--exact` without trial-level data (usage errors).
pub fn check(baseline: &RunData, current: &RunData, opts: &CheckOptions) -> Result<CheckReport> {
    refuse_incomparable(baseline, current, opts)?;
    let mut findings = config_findings(baseline, current, opts);
    let b_trials = side_trials(&baseline.summary, baseline.trials.as_ref());
    let c_trials = side_trials(&current.summary, current.trials.as_ref());
    findings.extend(trial_findings(
        baseline,
        current,
        (&b_trials, &c_trials),
        opts,
    ));

    let cur: HashMap<PointKey, &SummaryRow> =
        current.summary.iter().map(|r| (key_of(r), r)).collect();
    let base_keys: std::collections::HashSet<PointKey> =
        baseline.summary.iter().map(key_of).collect();

    // Bonferroni family: points present on both sides with finite means.
    let compared = if opts.exact {
        0
    } else {
        baseline
            .summary
            .iter()
            .filter(|b| {
                cur.get(&key_of(b))
                    .is_some_and(|c| b.mean.is_finite() && c.mean.is_finite())
            })
            .count()
    };
    let mut critical = CriticalValues::new(
        opts.alpha / (compared.max(1) as f64) / if opts.two_sided { 2.0 } else { 1.0 },
    );

    let mut points = Vec::new();
    let mut worst_trial: Option<WorstTrial> = None;
    for b in &baseline.summary {
        let key = key_of(b);
        let mut p = PointResult::of_baseline(b);
        for (label, t) in [("baseline", &b_trials), ("current", &c_trials)] {
            if let Some(why) = inconsistency(t, &key) {
                p.notes.push(if opts.exact {
                    format!("{label} summary and trials disagree: {why}")
                } else {
                    format!("{label} trials not used: {why}")
                });
            }
        }
        let Some(c) = cur.get(&key) else {
            absent_from_current(&mut p, b, current, opts);
            points.push(p);
            continue;
        };
        p.current = Some(stat(c));
        p.difference = c.mean - b.mean;
        if opts.exact {
            let tb = exact::trial_map(baseline.trials.as_ref(), &key);
            let tc = exact::trial_map(current.trials.as_ref(), &key);
            let (status, worst_rel) =
                exact::exact_point(&key, &tb, &tc, &mut p.notes, &mut worst_trial);
            p.test = Test::Exact { worst_rel };
            p.status = status;
            p.failing = status != Status::Pass;
        } else if b.mean.is_finite() && c.mean.is_finite() {
            let paired = paired_differences(&key, (&b_trials, &c_trials), &mut p.notes);
            statistical_test(&mut p, b, c, paired, &mut critical, opts);
        } else {
            p.status = Status::NotComparable;
            p.notes
                .push(match (b.mean.is_finite(), c.mean.is_finite()) {
                    (false, false) => "no finite trials on either side".to_string(),
                    (false, true) => {
                        "the baseline has no finite trials; the current run has".to_string()
                    }
                    _ => "the current run has no finite trials".to_string(),
                });
        }
        nonfinite_notes(&mut p, b, c);
        points.push(p);
    }
    for c in &current.summary {
        if !base_keys.contains(&key_of(c)) {
            points.push(PointResult::new_in_current(c, baseline));
        }
    }
    points.sort_by(|a, b| {
        (!a.failing, a.status)
            .cmp(&(!b.failing, b.status))
            .then(b.ratio().total_cmp(&a.ratio()))
            .then((&a.model, a.n, &a.method, a.d).cmp(&(&b.model, b.n, &b.method, b.d)))
    });
    Ok(CheckReport {
        baseline: baseline.path.clone(),
        current: current.path.clone(),
        options: opts.clone(),
        compared,
        points,
        findings,
        worst_trial,
    })
}

/// Options out of range, or two runs of different targets, masks or protocols: a usage error.
fn refuse_incomparable(baseline: &RunData, current: &RunData, opts: &CheckOptions) -> Result<()> {
    if !(opts.alpha > 0.0 && opts.alpha < 1.0) {
        return Err(usage!(
            "--alpha {}: must lie strictly between 0 and 1",
            opts.alpha
        ));
    }
    if !(opts.slack >= 0.0 && opts.slack.is_finite()) {
        return Err(usage!(
            "--slack {}: must be a finite number ≥ 0 (a fraction of the baseline mean, 0.01 = 1 %)",
            opts.slack
        ));
    }
    if baseline.target() != current.target() {
        return Err(usage!(
            "{} measures the {} target and {} the {} target; check compares runs of one target (--target of the sweep)",
            baseline.path.display(),
            baseline.target(),
            current.path.display(),
            current.target()
        ));
    }
    if baseline.mask() != current.mask() {
        return Err(usage!(
            "{} is under the {} mask and {} under the {} mask; check compares runs of one mask (--mask of the sweep)",
            baseline.path.display(),
            baseline.mask(),
            current.path.display(),
            current.mask()
        ));
    }
    if baseline.n_f() != current.n_f() {
        let protocol = |n: Option<usize>| {
            n.map_or("prefill (every row)".to_string(), |n| {
                format!("the decode protocol with n_f = {n}")
            })
        };
        return Err(usage!(
            "{} is scored under {} and {} under {}; check compares runs of one protocol (--decode of the sweep)",
            baseline.path.display(),
            protocol(baseline.n_f()),
            current.path.display(),
            protocol(current.n_f())
        ));
    }
    if opts.exact {
        for side in [baseline, current] {
            if side.trials.is_none() {
                return Err(usage!(
                    "--exact compares trials, but {} has no trials.csv; give run directories on both sides",
                    side.path.display()
                ));
            }
        }
    }
    Ok(())
}

/// The configuration's changes (material ones fail unless allowed) and runs not complete.
fn config_findings(baseline: &RunData, current: &RunData, opts: &CheckOptions) -> Vec<Finding> {
    let mut findings = Vec::new();
    // Configuration.
    match (&baseline.manifest, &current.manifest) {
        (Some(b), Some(c)) => {
            for ch in drift::compare(b, c) {
                let failing = ch.material && (!opts.allow_config_change || opts.exact);
                findings.push(Finding {
                    kind: if ch.material { "config change" } else { "note" },
                    message: ch.to_string(),
                    failing,
                });
            }
            for (side, m) in [(baseline, b), (current, c)] {
                if m.status != "complete" {
                    findings.push(Finding {
                        kind: "warning",
                        message: format!(
                            "{}: the run's manifest says status '{}', not 'complete'",
                            side.path.display(),
                            m.status
                        ),
                        failing: false,
                    });
                }
            }
        }
        (b, c) => {
            let missing: Vec<String> = [(baseline, b.is_none()), (current, c.is_none())]
                .iter()
                .filter(|(_, none)| *none)
                .map(|(s, _)| s.path.display().to_string())
                .collect();
            findings.push(Finding {
                kind: "note",
                message: format!(
                    "configuration not compared: no manifest.json for {}",
                    missing.join(" and ")
                ),
                failing: false,
            });
        }
    }

    findings
}

/// A side whose trials.csv does not reproduce its summary at some points (a warning).
fn trial_findings(
    baseline: &RunData,
    current: &RunData,
    (b_trials, c_trials): (&Option<SideTrials>, &Option<SideTrials>),
    opts: &CheckOptions,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    for (side, t) in [(baseline, b_trials), (current, c_trials)] {
        if let Some(t) = t {
            if !t.inconsistent.is_empty() {
                findings.push(Finding {
                    kind: "warning",
                    message: format!(
                        "{}: trials.csv does not reproduce {} at {} point(s){}",
                        side.path.display(),
                        side.summary_source.display(),
                        t.inconsistent.len(),
                        if opts.exact {
                            ""
                        } else {
                            "; those points use the unpaired test on the summary"
                        }
                    ),
                    failing: false,
                });
            }
        }
    }
    findings
}

/// Why a side's trials do not reproduce its summary at `key`, if they do not.
fn inconsistency(t: &Option<SideTrials>, key: &PointKey) -> Option<String> {
    t.as_ref().and_then(|t| {
        t.inconsistent
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, why)| why.clone())
    })
}

/// Student-t critical values at the Bonferroni level `upper`, by whole degrees of freedom (most
/// points share one).
struct CriticalValues {
    upper: f64,
    by_df: HashMap<u64, f64>,
}

impl CriticalValues {
    fn new(upper: f64) -> Self {
        Self {
            upper,
            by_df: HashMap::new(),
        }
    }
    fn at(&mut self, df: f64) -> f64 {
        let key = if df.is_finite() && df < stats::NORMAL_DF {
            df.floor() as u64
        } else {
            u64::MAX
        };
        let upper = self.upper;
        *self
            .by_df
            .entry(key)
            .or_insert_with(|| stats::student_t_upper_quantile(upper, df))
    }
}

/// A baseline point missing from the current run: dropped where the current configuration no
/// longer has it (and that is allowed), missing (failing) otherwise.
fn absent_from_current(
    p: &mut PointResult,
    b: &SummaryRow,
    current: &RunData,
    opts: &CheckOptions,
) {
    let explained = opts.allow_config_change
        && current
            .manifest
            .as_ref()
            .is_some_and(|m| !drift::grid_contains(m, &b.model, b.n, &b.method, b.d));
    if explained {
        p.status = Status::Dropped;
        p.notes
            .push("absent from the current run, whose configuration no longer includes it".into());
    } else {
        p.status = Status::Missing;
        p.failing = true;
        p.notes.push(format!(
            "present in the baseline, missing from {}",
            current.summary_source.display()
        ));
    }
}

/// The per-trial differences (current − baseline) at `key` where both sides' trials have the
/// same (window, head) keys; None for the unpaired test.
fn paired_differences(
    key: &PointKey,
    (b_trials, c_trials): (&Option<SideTrials>, &Option<SideTrials>),
    notes: &mut Vec<String>,
) -> Option<Vec<f64>> {
    match (b_trials, c_trials) {
        (Some(tb), Some(tc)) => match (tb.usable.get(key), tc.usable.get(key)) {
            (Some(mb), Some(mc)) if mb.keys().eq(mc.keys()) => {
                let diffs: Vec<f64> = mb
                    .iter()
                    .filter_map(|(k, eb)| Some(mc[k] - eb).filter(|x| x.is_finite()))
                    .collect();
                if diffs.is_empty() {
                    None
                } else {
                    Some(diffs)
                }
            }
            (Some(_), Some(_)) => {
                notes.push(
                    "trial keys (window, head) differ between the runs: unpaired test".into(),
                );
                None
            }
            _ => None,
        },
        _ => None,
    }
}

/// The paired (or Welch's unpaired) one-sided test of the point's difference against its bound:
/// the critical value times the standard error, plus the slack.
fn statistical_test(
    p: &mut PointResult,
    b: &SummaryRow,
    c: &SummaryRow,
    paired: Option<Vec<f64>>,
    critical: &mut CriticalValues,
    opts: &CheckOptions,
) {
    match paired {
        Some(diffs) => {
            let (mean, se) = crate::report::summary::mean_stderr(&diffs);
            p.difference = mean;
            p.se = se;
            p.df = if diffs.len() > 1 {
                diffs.len() as f64 - 1.0
            } else {
                f64::INFINITY
            };
            p.test = Test::Paired { pairs: diffs.len() };
        }
        None => {
            p.se = (b.stderr * b.stderr + c.stderr * c.stderr).sqrt();
            p.df = stats::welch_df(b.stderr, b.trials, c.stderr, c.trials);
            p.test = Test::Unpaired;
        }
    }
    p.critical = critical.at(p.df);
    p.bound = if p.se > 0.0 { p.critical * p.se } else { 0.0 } + opts.slack * b.mean.abs();
    if p.difference > p.bound {
        p.status = Status::Regression;
        p.failing = true;
    } else if p.difference < -p.bound {
        p.status = Status::Improvement;
        p.failing = opts.two_sided;
    }
}

/// Notes on the point's non-finite and flagged trials; more non-finite trials fail.
fn nonfinite_notes(p: &mut PointResult, b: &SummaryRow, c: &SummaryRow) {
    if c.nonfinite_trials > b.nonfinite_trials {
        p.notes.push(format!(
            "non-finite trials rose from {} to {}",
            b.nonfinite_trials, c.nonfinite_trials
        ));
        p.failing = true;
        if p.status > Status::NewNonFinite {
            p.status = Status::NewNonFinite;
        }
    } else if c.nonfinite_trials < b.nonfinite_trials {
        p.notes.push(format!(
            "non-finite trials fell from {} to {}",
            b.nonfinite_trials, c.nonfinite_trials
        ));
    }
    if c.flagged_trials > b.flagged_trials {
        p.notes.push(format!(
            "trials with flagged rows (non-finite or D̂ ≤ 0) rose from {} to {}",
            b.flagged_trials, c.flagged_trials
        ));
    }
}

impl PointResult {
    /// The point of `r`, not yet compared: no sides, no test, passing.
    fn blank(r: &SummaryRow) -> Self {
        PointResult {
            model: r.model.clone(),
            n: r.n,
            method: r.method.clone(),
            d: r.d,
            baseline: None,
            current: None,
            difference: f64::NAN,
            se: f64::NAN,
            df: f64::NAN,
            critical: f64::NAN,
            bound: f64::NAN,
            test: Test::None,
            status: Status::Pass,
            failing: false,
            notes: Vec::new(),
        }
    }

    /// A baseline point before it is compared.
    fn of_baseline(b: &SummaryRow) -> Self {
        PointResult {
            baseline: Some(stat(b)),
            ..Self::blank(b)
        }
    }

    /// A point of the current run that the baseline does not have.
    fn new_in_current(c: &SummaryRow, baseline: &RunData) -> Self {
        PointResult {
            current: Some(stat(c)),
            status: Status::New,
            notes: vec![format!(
                "not in the baseline {}",
                baseline.summary_source.display()
            )],
            ..Self::blank(c)
        }
    }
}
