//! summary.csv: mean and standard error over trials for each (model, n, method, d).

use serde::{Deserialize, Serialize};

/// One curve point. Column order is the CSV schema (README "Output files").
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
    pub rel_mean: f64,
    pub rel_stderr: f64,
    /// Trials excluded from the mean because Ô had non-finite rows (or D̂ ≤ 0 rows made it NaN).
    pub nonfinite_trials: usize,
    /// Trials with at least one row counted in `nonfinite_rows` (finite or not overall).
    pub flagged_trials: usize,
    pub macs: f64,
    pub seconds_mean: f64,
}
