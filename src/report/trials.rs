//! trials.csv: one row per (model, n, window, head, method, d), appended and flushed as each
//! trial finishes so that an interrupted run loses nothing already computed.

use serde::{Deserialize, Serialize};

/// One trial. Column order is the CSV schema (README "Output files").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialRow {
    /// `initialized` or `pretrained` (the Q/K/V weight source).
    pub model: String,
    /// Hub id or local directory of the model.
    pub model_id: String,
    pub layer: usize,
    pub n: usize,
    pub window: usize,
    pub head: usize,
    pub method: String,
    pub d: usize,
    /// The trial's derived seed (see numerics::sampling::TrialKey).
    pub seed: u64,
    /// ‖O − Ô‖₂ (NaN when Ô has non-finite entries).
    pub error: f64,
    /// error / ‖O‖₂.
    pub rel_error: f64,
    /// ‖O − Ô‖_F.
    pub frob_error: f64,
    /// ‖O‖₂.
    pub exact_norm: f64,
    /// Rows of Ô that are non-finite or whose estimated normalizer D̂ is ≤ 0 or non-finite.
    pub nonfinite_rows: usize,
    /// Analytic multiply-adds of the method at (n, p, d).
    pub macs: f64,
    /// Wall-clock seconds of the method's approximation (timing column; not reproducible).
    pub seconds: f64,
}

impl TrialRow {
    /// The identity of a trial within a run: what resume and `check --exact` match on.
    pub fn key(&self) -> (String, usize, usize, usize, String, usize) {
        (self.model.clone(), self.n, self.window, self.head, self.method.clone(), self.d)
    }
}
