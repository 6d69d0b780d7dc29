//! What a check reports: its options, the verdict on each curve point, and the findings that
//! are not about one point. [`super::check`] fills it; [`super::render`] prints it.

use std::path::PathBuf;

/// Options of a check (everything except where the data come from).
#[derive(Debug, Clone, PartialEq)]
pub struct CheckOptions {
    /// Family-wise false-positive rate over all compared points.
    pub alpha: f64,
    /// Relative slack: a regression must exceed the noise bound plus slack·|baseline mean|.
    pub slack: f64,
    /// Improvements beyond the bound fail too.
    pub two_sided: bool,
    /// Configuration changes are reported but do not fail the check.
    pub allow_config_change: bool,
    /// Demand trial-level equality of the error within [`super::EXACT_REL_TOL`] relative.
    pub exact: bool,
}

impl Default for CheckOptions {
    fn default() -> Self {
        Self {
            alpha: 0.05,
            slack: 0.01,
            two_sided: false,
            allow_config_change: false,
            exact: false,
        }
    }
}

/// A curve point: (model, n, method, d).
pub type PointKey = (String, usize, String, usize);

/// One side's summary of a point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SideStat {
    pub mean: f64,
    pub se: f64,
    /// Finite trials averaged.
    pub trials: usize,
    pub nonfinite: usize,
    /// Trials with at least one flagged row (non-finite, or estimated normalizer D̂ ≤ 0).
    pub flagged: usize,
}

/// How a point was compared.
#[derive(Debug, Clone, PartialEq)]
pub enum Test {
    /// Paired over `pairs` trials matched on (window, head).
    Paired { pairs: usize },
    /// From the two summaries.
    Unpaired,
    /// Trial-level equality; the worst relative difference of the point's trials.
    Exact { worst_rel: f64 },
    /// No comparison (point missing on a side, or no finite trials).
    None,
}

/// The verdict on one point, most severe first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Regression,
    ExactMismatch,
    NewNonFinite,
    Missing,
    Improvement,
    Dropped,
    New,
    NotComparable,
    Pass,
}

impl Status {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Regression => "REGRESSION",
            Self::ExactMismatch => "NOT-EXACT",
            Self::NewNonFinite => "NONFINITE",
            Self::Missing => "MISSING",
            Self::Improvement => "improved",
            Self::Dropped => "dropped",
            Self::New => "new",
            Self::NotComparable => "n/a",
            Self::Pass => "ok",
        }
    }
}

/// The result for one curve point.
#[derive(Debug, Clone, PartialEq)]
pub struct PointResult {
    pub model: String,
    pub n: usize,
    pub method: String,
    pub d: usize,
    pub baseline: Option<SideStat>,
    pub current: Option<SideStat>,
    /// current − baseline (the mean of paired differences for the paired test); NaN if none.
    pub difference: f64,
    /// Standard error of the difference; NaN if none.
    pub se: f64,
    /// Degrees of freedom of the critical value (∞ = normal).
    pub df: f64,
    /// Critical value q (Bonferroni-corrected).
    pub critical: f64,
    /// q·SE + slack·|baseline mean|; NaN if none.
    pub bound: f64,
    pub test: Test,
    pub status: Status,
    /// Whether this point makes the check fail.
    pub failing: bool,
    pub notes: Vec<String>,
}

impl PointResult {
    /// difference / bound: how close to (or far past) the bound the point is, for ordering.
    pub fn ratio(&self) -> f64 {
        let r = self.difference / self.bound;
        if r.is_nan() {
            f64::NEG_INFINITY
        } else {
            r
        }
    }
}

/// A finding that is not about one point: configuration changes, notes and warnings.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// `config change`, `note` or `warning`.
    pub kind: &'static str,
    pub message: String,
    pub failing: bool,
}

/// The worst trial of an `--exact` comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct WorstTrial {
    pub point: PointKey,
    pub window: usize,
    pub head: usize,
    pub baseline: f64,
    pub current: f64,
    pub rel: f64,
}

/// Everything a check found.
#[derive(Debug, Clone)]
pub struct CheckReport {
    pub baseline: PathBuf,
    pub current: PathBuf,
    pub options: CheckOptions,
    /// Points compared statistically (the Bonferroni m).
    pub compared: usize,
    /// Worst first.
    pub points: Vec<PointResult>,
    pub findings: Vec<Finding>,
    pub worst_trial: Option<WorstTrial>,
}

impl CheckReport {
    pub fn failed(&self) -> bool {
        self.points.iter().any(|p| p.failing) || self.findings.iter().any(|f| f.failing)
    }
    /// 0 pass, 1 regression or failing finding.
    pub fn exit_code(&self) -> i32 {
        i32::from(self.failed())
    }
    pub fn count(&self, s: Status) -> usize {
        self.points.iter().filter(|p| p.status == s).count()
    }
}
