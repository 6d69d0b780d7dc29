//! `decode.png` (docs/reference.md §9.3): decode-time KV-cache compression. One row per (model, layer),
//! one panel per length (2048 and 8192 where present); x = `kv_read`, the continuation's K/V
//! traffic relative to dense f16 attention (log₂), y = ‖O_F − Ô_F‖₂ over the n_f continuation rows
//! (log). The §9 methods are lines over d, the oracles (`topk_dec`, `evict_oracle`) grey, and the
//! §8 caches run under the protocol (`kv_q4_0`, `kv_q8_0`, `kivi2`, …) single points in their own
//! colours. A last column: `mass` against realised keys per continuation query, at the largest
//! length.
//!
//! Left out: budgets d ≥ n_p (every prompt key kept: exact by construction, as decoder.png leaves
//! out d ≥ n) and the SnapKV-scored methods' rows at d ≤ w = 32, which are `dec_window`'s (the
//! authors' code refuses them, §9.2); the caption says so.

use super::axis::{Axis, Scale, TickFormat};
use super::draw::Figure;
use super::field::shown_lengths;
use super::figs::{model_rows, SideColumn, Tally, XOf};
use super::style::field_style;
use super::{models, Statistic};
use crate::attention::decode::budgets::WINDOW;
use crate::report::summary::SummaryRow;

/// The lengths the figure shows when present (§9.3); otherwise every length.
const DECODE_LENGTHS: [usize; 2] = [2048, 8192];
/// The methods whose rows at d ≤ w are `dec_window`'s (§9.2).
const SNAP_SCORED: [&str; 4] = ["snapkv", "snapkv_avg5", "pyramidkv", "adakv"];
const X_READ: &str = "K/V bytes read by the continuation, relative to dense f16 (kv_read)";
const X_KEYS: &str = "keys per continuation query (realised)";

/// Whether a decode row is drawn: a §8 point, or a budget below the prompt that is the method's
/// own (not `dec_window`'s fallback).
fn drawn(r: &SummaryRow) -> bool {
    let Some(n_f) = r.n_f else { return false };
    if r.d == 0 {
        return r.kv_read_mean.is_some();
    }
    r.d < r.n.saturating_sub(n_f) && !(SNAP_SCORED.contains(&r.method.as_str()) && r.d <= WINDOW)
}

/// The figure, when `rows` hold decode points (rows with an n_f).
pub fn decode(rows: &[SummaryRow], stat: Statistic) -> Option<Figure> {
    let rows: Vec<SummaryRow> = rows
        .iter()
        .filter(|r| drawn(r) && r.kv_read_mean.is_some_and(|x| x > 0.0))
        .cloned()
        .collect();
    if rows.is_empty() {
        return None;
    }
    let n_fs: std::collections::BTreeSet<usize> = rows.iter().filter_map(|r| r.n_f).collect();
    let models = models(&rows);
    let ns = shown_lengths(&rows, &models, &DECODE_LENGTHS);
    let shown = |r: &&SummaryRow| ns.contains(&r.n);
    let reads: Vec<f64> = rows
        .iter()
        .filter(shown)
        .filter_map(|r| r.kv_read_mean)
        .collect();
    let keys: Vec<f64> = rows
        .iter()
        .filter(shown)
        .filter_map(|r| r.keys_mean)
        .collect();
    let x_read = Axis::fit(Scale::Log2, &reads, TickFormat::Number);
    let x_keys = Axis::fit(Scale::Log2, &keys, TickFormat::Number);
    let mut tally = Tally::causal();
    let mass = SideColumn {
        value: &|r: &SummaryRow| r.mass_mean,
        x: (XOf::Keys, x_keys, X_KEYS),
        y_scale: Scale::Linear,
        title: "mass captured",
        y_label: "mass on the visited keys, mean_t Σ_{j∈S_t} P_tj",
    };
    let x = (XOf::KvRead, x_read, X_READ);
    let (cells, legend_order) = model_rows(&rows, &ns, x, &mass, &mut tally);
    let style_all = |m: &str| field_style(m, &legend_order);
    let n_f_text = n_fs
        .iter()
        .map(|n| n.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    Some(Figure {
        title: format!(
            "Decode-time KV-cache compression (n_f = {n_f_text}): the continuation's ‖O_F − Ô_F‖₂ against K/V bytes read"
        ),
        legend: tally.legend(&legend_order, &style_all),
        notes: {
            let mut notes = tally.notes(format!(
                "{} over {}; x: the continuation's K/V traffic relative to dense f16 attention on log₂ spacing; log y (last column: mass against keys, linear).",
                stat.lead(),
                tally.trials_text()
            ));
            notes.insert(
                1,
                format!(
                    "Lines: §9 methods over d (left out: d ≥ n_p, exact; SnapKV-scored d ≤ {WINDOW}, = dec_window). Points: §8 caches. Grey: oracles."
                                ),
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
    use crate::attention::Mask;

    fn row(n: usize, method: &str, d: usize, read: f64, keys: f64) -> SummaryRow {
        SummaryRow {
            model: "pretrained".into(),
            n,
            method: method.into(),
            d,
            trials: 4,
            mean: 1.0 / (1.0 + d as f64),
            stderr: 0.01,
            median: 1.0 / (1.0 + d as f64),
            rel_mean: 0.1,
            rel_stderr: 0.01,
            nonfinite_trials: 0,
            flagged_trials: 0,
            macs: 1.0,
            seconds_mean: 0.01,
            target: Default::default(),
            mask: Mask::Causal,
            keys_mean: Some(keys),
            mass_mean: Some(0.9),
            cos_sim_mean: Some(0.99),
            rel_l1_mean: None,
            rmse_mean: None,
            kv_bits: Some(16.0 * read),
            kv_read_mean: Some(read),
            n_f: Some(256),
            kv_union_mean: None,
        }
    }

    /// Decode rows make the figure; d ≥ n_p and the SnapKV rows at d ≤ 32 are left out; a
    /// prefill run (no n_f) makes none.
    #[test]
    fn decode_rows_on_kv_read_with_the_fallback_and_exact_budgets_left_out() {
        let mut rows = vec![row(2048, "kv_q4_0", 0, 0.28, 1152.0)];
        for d in [16, 32, 64, 256, 1792, 2048] {
            let read = d as f64 / 1152.0;
            rows.push(row(2048, "snapkv", d, read, d as f64 + 128.5));
            rows.push(row(2048, "tova", d, read, d as f64 + 128.5));
        }
        let f = decode(&rows, Statistic::Mean).expect("a figure");
        assert_eq!(f.cols, 2);
        let panel = f.cells[0].as_ref().unwrap();
        let round = |v: &[super::super::draw::Point]| -> Vec<usize> {
            v.iter().map(|p| (p.x * 1152.0).round() as usize).collect()
        };
        let mut lines: Vec<Vec<usize>> = panel.series.iter().map(|s| round(&s.points)).collect();
        lines.sort();
        // kv_q4_0's one point (0.28 · 1152 = 323), snapkv without d ≤ 32 and d ≥ n_p = 1792, tova
        // without d ≥ n_p.
        assert_eq!(lines, vec![vec![16, 32, 64, 256], vec![64, 256], vec![323]]);
        let prefill: Vec<SummaryRow> = rows
            .into_iter()
            .map(|r| SummaryRow { n_f: None, ..r })
            .collect();
        assert!(decode(&prefill, Statistic::Mean).is_none());
    }
}
