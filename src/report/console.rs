//! The one-screen summary printed at the end of a sweep: where the files went and the best
//! method per (model, n, d).

use std::collections::BTreeMap;
use std::path::Path;

use crate::report::summary::SummaryRow;

/// Prints where a finished run's files are (`out`), how many trials it added (`new_trials`) and
/// holds (`total_trials`), and the best method per point of its `summary`.
pub fn print_summary(out: &Path, summary: &[SummaryRow], new_trials: usize, total_trials: usize) {
    eprintln!(
        "{new_trials} new trials ({total_trials} in total) → {}/trials.csv, summary.csv, manifest.json",
        out.display()
    );
    // Oracles (the SVD floor, top-k, the exact kernelized product) are yardsticks, not candidates.
    let oracle = |id: &str| crate::attention::describe(id).is_some_and(|(_, oracle)| oracle);
    let mut best: BTreeMap<(String, usize, usize), (String, f64, f64)> = BTreeMap::new();
    for r in summary {
        if !r.mean.is_finite() || oracle(&r.method) {
            continue;
        }
        let e =
            best.entry((r.model.clone(), r.n, r.d))
                .or_insert((r.method.clone(), r.mean, r.stderr));
        if r.mean < e.1 {
            *e = (r.method.clone(), r.mean, r.stderr);
        }
    }
    if !best.is_empty() {
        let target = match summary.first().map(|r| r.target) {
            Some(crate::attention::Target::Kernelized) => "C·V",
            _ => "O",
        };
        eprintln!(
            "{:<12} {:>6} {:>5}  best method (mean ± SE of ‖{target} − Ô‖₂)",
            "model", "n", "d"
        );
        for ((model, n, d), (m, mean, se)) in best {
            eprintln!("{model:<12} {n:>6} {d:>5}  {m} {mean:.4} ± {se:.4}");
        }
    }
    let flagged: usize = summary.iter().map(|r| r.nonfinite_trials).sum();
    if flagged > 0 {
        eprintln!("warning: {flagged} trials had non-finite errors and are excluded from the means (see nonfinite_trials in summary.csv)");
    }
}
