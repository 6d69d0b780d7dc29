//! Outputs: per-trial rows, summaries, the run manifest, figures and the regression check.

pub mod anchors;
pub mod check;
pub mod console;
pub mod figures;
pub mod manifest;
pub mod merge;
pub mod summary;
pub mod trials;
