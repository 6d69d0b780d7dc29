//! The figures of issue 13: every method of the field on one d axis (softmax target), and the
//! kernelized target's methods (relative error, docs/reference.md §6.4.1 [REC]).
//!
//! * `field.png`: one row per model, one panel per n ∈ {1024, 4096} (the lengths present), plus
//!   an accuracy–cost panel (error against measured seconds per head at the largest n; oracles
//!   left out, their d being a size and not a budget). One hue
//!   per method family; the references (V-Mean, the top-2d oracle, the SVD floor) grey.
//! * `kernelized.png`: the same layout for a `--target kernelized` run, on ‖C·V − Ô‖₂/‖C·V‖₂,
//!   so that lengths and heads (‖C·V‖ grows with n) share one scale; `zero` is the line at 1.

use super::axis::{Axis, Scale, TickFormat};
use super::draw::Figure;
use super::figs::{ds_of, panel, Tally, XOf, X_FEATURES};
use super::style::{field_style, is_oracle, ordered_methods};
use super::{lengths_of, models, Statistic};
use crate::attention::{self, Family, Target};
use crate::report::summary::SummaryRow;

/// The lengths the field figure shows when present (issue 13); otherwise every length.
const FIELD_LENGTHS: [usize; 2] = [1024, 4096];

/// The lengths a figure shows: those of `preferred` that some model has, else every length present.
pub(super) fn shown_lengths(
    rows: &[SummaryRow],
    models: &[String],
    preferred: &[usize],
) -> Vec<usize> {
    let mut all: Vec<usize> = models.iter().flat_map(|m| lengths_of(rows, m)).collect();
    all.sort_unstable();
    all.dedup();
    let kept: Vec<usize> = preferred
        .iter()
        .copied()
        .filter(|n| all.contains(n))
        .collect();
    if kept.is_empty() {
        all
    } else {
        kept
    }
}

/// What the y axis shows.
#[derive(Clone, Copy)]
enum Measure {
    /// ‖O − Ô‖₂ (the softmax target).
    Absolute,
    /// ‖O_C − Ô‖₂ / ‖O_C‖₂ (the kernelized target).
    Relative,
}

/// The figure of one target: per model the chosen lengths against d, then accuracy–cost.
fn target_figure(rows: &[SummaryRow], measure: Measure, stat: Statistic) -> Option<Figure> {
    let rows: Vec<SummaryRow> = match measure {
        Measure::Absolute => rows.to_vec(),
        Measure::Relative => rows
            .iter()
            .filter(|r| r.method != "exact_kernelized")
            .map(|r| SummaryRow {
                mean: r.rel_mean,
                stderr: r.rel_stderr,
                ..r.clone()
            })
            .collect(),
    };
    let y_label = match measure {
        Measure::Absolute => "Spectral Norm Loss",
        Measure::Relative => "‖C·V − Ô‖₂ / ‖C·V‖₂",
    };
    let models = models(&rows);
    let ns = shown_lengths(&rows, &models, &FIELD_LENGTHS);
    let cost_n = *ns.last()?;
    let x_axis = Axis::features(&ds_of(&rows, |r| ns.contains(&r.n)));
    let mut tally = Tally::default();
    let mut cells = vec![];
    let mut legend_order: Vec<String> = vec![];
    for model in &models {
        let (legend, draw) = ordered_methods(&rows, model);
        for m in &legend {
            if !legend_order.contains(m) {
                legend_order.push(m.clone());
            }
        }
        let style_of = |m: &str| field_style(m, &legend);
        for &n in &ns {
            let x = (XOf::Features, x_axis.clone(), X_FEATURES);
            let mut p = panel(
                &rows,
                model,
                n,
                &draw,
                &style_of,
                x,
                Scale::Log10,
                &mut tally,
            );
            p.y_label = y_label.into();
            cells.push(Some(p));
        }
        let secs: Vec<f64> = rows
            .iter()
            .filter(|r| r.model == *model && r.n == cost_n && r.mean.is_finite())
            .filter(|r| !is_oracle(&r.method))
            .map(|r| r.seconds_mean)
            .collect();
        let x_axis = Axis::fit(Scale::Log10, &secs, TickFormat::Seconds);
        let x = (XOf::Seconds, x_axis, "seconds per head (measured)");
        let mut scratch = Tally::default();
        // An oracle's d is a size, not a budget, and its time is no method's cost (the SVD
        // floor's first d pays for the whole decomposition): the cost panel leaves oracles out.
        let costed: Vec<String> = draw.iter().filter(|m| !is_oracle(m)).cloned().collect();
        let mut p = panel(
            &rows,
            model,
            cost_n,
            &costed,
            &style_of,
            x,
            Scale::Log10,
            &mut scratch,
        );
        p.title = format!("{model} n={cost_n}: accuracy against cost");
        p.y_label = y_label.into();
        cells.push(Some(p));
    }
    let style_all = |m: &str| field_style(m, &legend_order);
    let (title, lead) = match measure {
        Measure::Absolute => (
            "The field on one axis: ‖O − Ô‖₂ against exact softmax attention",
            "Grey: references (V-Mean, the top-2d oracle, the SVD floor, thick). One hue per family: \
             red low rank, blue random features, green sampling, purple sparse and hashing, orange \
             sparse + low rank.",
        ),
        Measure::Relative => (
            "The kernelized target: ‖C·V − Ô‖₂ / ‖C·V‖₂ (Gaussian kernel, docs/reference.md §6.4)",
            "Grey dashed: Ô = 0 (relative error 1). exact_kernelized (the exact product in the run's \
             dtype) is left out: its error is rounding only.",
        ),
    };
    Some(Figure {
        title: title.into(),
        legend: tally.legend(&legend_order, &style_all),
        notes: {
            let mut notes = tally.notes(format!(
                "{} over {}; x: d on log₂ spacing (last column: seconds per head); log y.",
                stat.lead(),
                tally.trials_text()
            ));
            notes.insert(1, lead.into());
            notes
        },
        cols: ns.len() + 1,
        empty_titles: vec![String::new(); cells.len()],
        cells,
        panel_w: 620,
        panel_h: 520,
    })
}

/// `field.png`, when the softmax rows hold a field run (any sparse or hybrid method).
pub fn field(rows: &[SummaryRow], stat: Statistic) -> Option<Figure> {
    let is_field = rows.iter().any(|r| {
        matches!(
            attention::describe(&r.method),
            Some((Family::Sparse | Family::Hybrid, _))
        )
    });
    if !is_field {
        return None;
    }
    target_figure(rows, Measure::Absolute, stat)
}

/// `kernelized.png`, from the rows of the kernelized target (mean relative error; the median
/// is not kept per relative error, so only the mean figure exists).
pub fn kernelized(rows: &[SummaryRow], stat: Statistic) -> Option<Figure> {
    if stat != Statistic::Mean || !rows.iter().all(|r| r.target == Target::Kernelized) {
        return None;
    }
    target_figure(rows, Measure::Relative, stat)
}
