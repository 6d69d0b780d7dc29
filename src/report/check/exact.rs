//! `--exact`: trial-level equality of the error within [`EXACT_REL_TOL`] relative, the
//! reproducibility check for refactors (same seeds, same configuration).

use super::{render, PointKey, Status, TrialMap, WorstTrial, EXACT_REL_TOL};
use crate::report::trials::TrialRow;

pub(super) fn trial_map(trials: Option<&Vec<TrialRow>>, key: &PointKey) -> TrialMap {
    trials
        .map(|ts| {
            ts.iter()
                .filter(|t| t.model == key.0 && t.n == key.1 && t.method == key.2 && t.d == key.3)
                .map(|t| ((t.window, t.head), t.error))
                .collect()
        })
        .unwrap_or_default()
}

/// Relative difference of two trial errors; equal non-finite values count as equal.
fn rel_diff(a: f64, b: f64) -> f64 {
    if a == b || (a.is_nan() && b.is_nan()) {
        0.0
    } else if !(a.is_finite() && b.is_finite()) {
        f64::INFINITY
    } else {
        (a - b).abs() / a.abs().max(b.abs())
    }
}

pub(super) fn exact_point(
    key: &PointKey,
    tb: &TrialMap,
    tc: &TrialMap,
    notes: &mut Vec<String>,
    worst: &mut Option<WorstTrial>,
) -> (Status, f64) {
    let mut status = Status::Pass;
    let mut worst_rel: f64 = 0.0;
    if tb.is_empty() {
        notes.push("the baseline's trials.csv has no trials for this point".into());
        status = Status::ExactMismatch;
    }
    let missing: Vec<String> = tb
        .keys()
        .filter(|k| !tc.contains_key(k))
        .map(|(w, h)| format!("window {w} head {h}"))
        .collect();
    if !missing.is_empty() {
        notes.push(format!(
            "{} baseline trial(s) missing from the current run (first: {})",
            missing.len(),
            missing[0]
        ));
        status = Status::ExactMismatch;
    }
    let extra = tc.keys().filter(|k| !tb.contains_key(k)).count();
    if extra > 0 {
        notes.push(format!(
            "{extra} trial(s) in the current run that the baseline lacks"
        ));
        status = Status::ExactMismatch;
    }
    let mut point_worst: Option<WorstTrial> = None;
    for (k, &eb) in tb {
        let Some(&ec) = tc.get(k) else { continue };
        let rel = rel_diff(eb, ec);
        if point_worst.as_ref().is_none_or(|w| rel > w.rel) {
            point_worst = Some(WorstTrial {
                point: key.clone(),
                window: k.0,
                head: k.1,
                baseline: eb,
                current: ec,
                rel,
            });
        }
        worst_rel = worst_rel.max(rel);
    }
    if let Some(w) = point_worst {
        if w.rel > EXACT_REL_TOL {
            notes.push(format!(
                "worst trial window {} head {}: {} → {} (relative {:.2e} > {:.0e})",
                w.window,
                w.head,
                render::full(w.baseline),
                render::full(w.current),
                w.rel,
                EXACT_REL_TOL
            ));
            status = Status::ExactMismatch;
        }
        if worst.as_ref().is_none_or(|g| w.rel > g.rel) {
            *worst = Some(w);
        }
    }
    (status, worst_rel)
}
