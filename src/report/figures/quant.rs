//! `quant.png` (docs/reference.md §8.5): quantized attention beside sparse attention on one axis of
//! bytes read. One row per (model, layer), one panel per length (2048 and 8192 where present);
//! x = `kv_read`, the fraction of dense f16 attention's K/V traffic (log₂), y = ‖O − Ô‖₂ (log);
//! restrict-and-renormalise methods as lines over d, each §8 method (d = 0) a single point in its
//! own colour and marker; a last column of 1 − cos_sim against the same x at the largest length.
//! Of the restrict-and-renormalise methods, `window`, `streaming`, `quest`, `xattention` and the
//! `topk` oracle are drawn (§8.5's committed figure); methods that read no cache (features, low
//! rank, V-Mean) have no `kv_read` and are not drawn.

use super::axis::{Axis, Scale, TickFormat};
use super::draw::Figure;
use super::field::shown_lengths;
use super::figs::{model_rows, SideColumn, Tally, XOf};
use super::style::field_style;
use super::{models, Statistic};
use crate::attention::Mask;
use crate::report::summary::SummaryRow;

/// The lengths the figure shows when present (§8.5); otherwise every length.
const QUANT_LENGTHS: [usize; 2] = [2048, 8192];
/// The restrict-and-renormalise methods drawn beside the quantized family (§8.5): the sliding
/// window, attention sinks, a page and a block selector, and the top-k oracle.
const SPARSE_SHOWN: [&str; 5] = ["window", "streaming", "quest", "xattention", "topk"];

/// A row's `kv_read`: its own, or for a restrict-and-renormalise method of a run that predates the
/// column, keys_mean/mean|D_i| (keys read from an f16 cache, §8.5).
fn with_kv_read(r: &SummaryRow) -> Option<SummaryRow> {
    use crate::attention::{describe, quantized::dense_keys, Family};
    let family = describe(&r.method).map(|(f, _)| f);
    let read = match (r.kv_read_mean, family) {
        (_, Some(Family::Quantized)) => r.kv_read_mean,
        (_, Some(Family::Sparse | Family::Prefill))
            if SPARSE_SHOWN.contains(&r.method.as_str()) =>
        {
            r.kv_read_mean
                .or_else(|| r.keys_mean.map(|k| k / dense_keys(r.n, r.mask)))
        }
        // A user's method with the column (none today) is drawn as it is.
        (Some(x), None) => Some(x),
        _ => None,
    }?;
    Some(SummaryRow {
        kv_read_mean: Some(read),
        ..r.clone()
    })
}
const X_READ: &str = "K/V bytes read, relative to dense f16 attention (kv_read)";

/// The figure, when `rows` hold points of the quantized family (d = 0 with a `kv_read`). Causal
/// rows are drawn when there are any, else bidirectional ones.
pub fn quant(rows: &[SummaryRow], stat: Statistic) -> Option<Figure> {
    let has_quant = |m: Mask| {
        rows.iter()
            .any(|r| r.mask == m && r.d == 0 && r.kv_read_mean.is_some())
    };
    let mask = if has_quant(Mask::Causal) {
        Mask::Causal
    } else if has_quant(Mask::None) {
        Mask::None
    } else {
        return None;
    };
    // Budgets d ≥ n cover every key (exact by construction): left out, as in decoder.png.
    let rows: Vec<SummaryRow> = rows
        .iter()
        .filter(|r| r.mask == mask && r.d < r.n)
        .filter_map(with_kv_read)
        .filter(|r| r.kv_read_mean.is_some_and(|x| x > 0.0))
        .collect();
    let models = models(&rows);
    let ns = shown_lengths(&rows, &models, &QUANT_LENGTHS);
    let reads: Vec<f64> = rows
        .iter()
        .filter(|r| ns.contains(&r.n))
        .filter_map(|r| r.kv_read_mean)
        .collect();
    let x_axis = Axis::fit(Scale::Log2, &reads, TickFormat::Number);
    let mut tally = if mask == Mask::Causal {
        Tally::causal()
    } else {
        Tally::default()
    };
    // 1 − cos_sim at the model's largest length (the papers' unit, on a log axis).
    let cos = SideColumn {
        value: &|r: &SummaryRow| r.cos_sim_mean.map(|c| 1.0 - c),
        x: (XOf::KvRead, x_axis.clone(), X_READ),
        y_scale: Scale::Log10,
        title: "1 − cos_sim",
        y_label: "1 − ⟨O, Ô⟩/(‖O‖_F‖Ô‖_F), mean over heads",
    };
    let x = (XOf::KvRead, x_axis, X_READ);
    let (cells, legend_order) = model_rows(&rows, &ns, x, &cos, &mut tally);
    let style_all = |m: &str| field_style(m, &legend_order);
    Some(Figure {
        title: format!(
            "Quantized and sparse attention ({}) on one axis of K/V bytes read",
            if mask == Mask::Causal {
                "causal"
            } else {
                "bidirectional"
            }
        ),
        legend: tally.legend(&legend_order, &style_all),
        notes: {
            let mut notes = tally.notes(format!(
                "{} over {}; x: K/V traffic relative to dense f16 attention on log₂ spacing; log y.",
                stat.lead(),
                tally.trials_text()
            ));
            notes.insert(
                1,
                "Single points: the quantized family (every key, fewer bits; docs/reference.md §8). Lines: restrict-and-renormalise methods over d (keys read from an f16 cache). Grey: the oracles."
                    .into(),
            );
            notes
        },
        cols: ns.len() + 1,
        empty_titles: vec![String::new(); cells.len()],
        cells,
        panel_w: 620,
        panel_h: 520,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(n: usize, method: &str, d: usize, keys: Option<f64>, read: Option<f64>) -> SummaryRow {
        SummaryRow {
            model: "pretrained".into(),
            n,
            method: method.into(),
            d,
            trials: 4,
            mean: 1.0 + d as f64,
            stderr: 0.1,
            median: 1.0 + d as f64,
            rel_mean: 0.1,
            rel_stderr: 0.01,
            nonfinite_trials: 0,
            flagged_trials: 0,
            macs: 1.0,
            seconds_mean: 0.01,
            target: Default::default(),
            mask: Mask::Causal,
            keys_mean: keys,
            mass_mean: None,
            cos_sim_mean: Some(0.99),
            rel_l1_mean: None,
            rmse_mean: None,
            kv_bits: read.map(|r| 16.0 * r),
            kv_read_mean: read,
            n_f: None,
            kv_union_mean: None,
        }
    }

    /// The §8 points and the shown sparse methods' lines at their kv_read (computed from keys for
    /// a run that predates the column), a 1 − cos_sim column; no figure without a §8 point.
    #[test]
    fn quantized_points_beside_sparse_lines_on_kv_read() {
        let mut rows = vec![];
        for n in [2048, 8192] {
            let dense = (n as f64 + 1.0) / 2.0;
            rows.push(row(n, "kv_q4_0", 0, Some(dense), Some(4.5 / 16.0)));
            rows.push(row(n, "kivi2", 0, Some(dense), Some(0.21)));
            for d in [16, 64, 256] {
                // window rows as results/decoder holds them: keys, no kv_read.
                rows.push(row(n, "window", d, Some(d as f64), None));
                rows.push(row(n, "h2o", d, Some(d as f64), None));
                rows.push(row(n, "vmean", d, None, None));
            }
        }
        let f = quant(&rows, Statistic::Mean).expect("a figure");
        assert_eq!(f.cols, 3);
        let first = f.cells[0].as_ref().unwrap();
        // kv_q4_0, kivi2 and window; not h2o (not among the shown) nor vmean (no cache).
        assert_eq!(first.series.len(), 3);
        let xs: Vec<Vec<f64>> = first
            .series
            .iter()
            .map(|s| s.points.iter().map(|p| p.x).collect())
            .collect();
        assert!(xs.contains(&vec![4.5 / 16.0]));
        assert!(xs.contains(&vec![16.0 / 1024.5, 64.0 / 1024.5, 256.0 / 1024.5]));
        // The last column: 1 − cos_sim.
        let cos = f.cells[2].as_ref().unwrap();
        assert!(cos
            .series
            .iter()
            .all(|s| s.points.iter().all(|p| (p.y - 0.01).abs() < 1e-12)));
        let sparse_only: Vec<SummaryRow> = rows.into_iter().filter(|r| r.d > 0).collect();
        assert!(quant(&sparse_only, Statistic::Mean).is_none());
    }
}
