//! `decoder.png` (docs/reference.md §7.6): causal runs (decoder attention). One row per model; one panel
//! per length (2048 and 8192 where present, else every length) of ‖O − Ô‖₂ against the keys each
//! query actually visited (log₂ x: restrict-and-renormalise methods do not all hit d), and a last
//! column of the mass those keys carry against the same x, at the largest length. Feature methods
//! (no key set) sit at x = d, their feature count. One hue per family; the oracles (`topk`, `h2o`,
//! `svd_optimal`) and `vmean` grey, as references.

use super::axis::{Axis, Scale, TickFormat};
use super::draw::Figure;
use super::field::shown_lengths;
use super::figs::{model_rows, SideColumn, Tally, XOf};
use super::style::field_style;
use super::{models, Statistic};
use crate::attention::Mask;
use crate::report::summary::SummaryRow;

/// The lengths the decoder figure shows when present (§7.6); otherwise every length.
const DECODER_LENGTHS: [usize; 2] = [2048, 8192];

/// The figure, when `rows` hold causal points.
pub fn decoder(rows: &[SummaryRow], stat: Statistic) -> Option<Figure> {
    // d ≥ n covers every row (exact by construction, error at rounding level): left out, so that
    // the log axis shows the budgets that matter.
    let rows: Vec<SummaryRow> = rows
        .iter()
        .filter(|r| r.mask == Mask::Causal && r.d < r.n)
        // The quantized family (d = 0, no key axis) has its own figure, quant.png.
        .filter(|r| r.d > 0)
        .cloned()
        .collect();
    if rows.is_empty() {
        return None;
    }
    let models = models(&rows);
    let ns = shown_lengths(&rows, &models, &DECODER_LENGTHS);

    let keys: Vec<f64> = rows
        .iter()
        .filter(|r| ns.contains(&r.n))
        .map(|r| r.keys_mean.unwrap_or(r.d as f64))
        .collect();
    let x_axis = Axis::fit(Scale::Log2, &keys, TickFormat::Number);
    const X_KEYS: &str = "keys per query (realised; features m for feature methods)";
    let mut tally = Tally::causal();
    // The mass column: the same x, y = mean mass captured (restricted methods only), at the
    // model's largest length with data.
    let mass = SideColumn {
        value: &|r: &SummaryRow| r.mass_mean,
        x: (XOf::Keys, x_axis.clone(), X_KEYS),
        y_scale: Scale::Linear,
        title: "mass captured",
        y_label: "mass on the visited keys, mean_i Σ_{j∈S_i} P_ij",
    };
    let x = (XOf::Keys, x_axis, X_KEYS);
    let (cells, legend_order) = model_rows(&rows, &ns, x, &mass, &mut tally);
    let style_all = |m: &str| field_style(m, &legend_order);
    Some(Figure {
        title: "Decoder attention (causal): ‖O − Ô‖₂ against keys per query".into(),
        legend: tally.legend(&legend_order, &style_all),
        notes: {
            let mut notes = tally.notes(format!(
                "{} over {}; x: realised keys per query on log₂ spacing; log y (last column: mass, linear).",
                stat.lead(),
                tally.trials_text()
            ));
            notes.insert(
                1,
                "Grey: references (V-Mean, the oracles top-k, H2O and the SVD floor). One hue per family."
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
    use super::super::draw::LegendItem;
    use super::super::style;
    use super::*;

    fn row(n: usize, method: &str, d: usize, keys: Option<f64>, mass: Option<f64>) -> SummaryRow {
        SummaryRow {
            model: "pretrained".into(),
            n,
            method: method.into(),
            d,
            trials: 4,
            mean: 10.0 / d as f64,
            stderr: 0.1,
            median: 10.0 / d as f64,
            rel_mean: 0.1,
            rel_stderr: 0.01,
            nonfinite_trials: 0,
            flagged_trials: 0,
            macs: 1.0,
            seconds_mean: 0.01,
            target: Default::default(),
            mask: Mask::Causal,
            keys_mean: keys,
            mass_mean: mass,
            cos_sim_mean: None,
            rel_l1_mean: None,
            rmse_mean: None,
            kv_bits: None,
            kv_read_mean: None,
            n_f: None,
            kv_union_mean: None,
        }
    }

    /// Causal rows make a figure of the preferred lengths plus the mass column; a restricted
    /// method is placed at its realised keys and a feature method at d; unmasked rows make none.
    #[test]
    fn causal_rows_are_drawn_against_realised_keys_with_a_mass_column() {
        let mut rows = vec![];
        for n in [512, 2048, 8192] {
            for d in [16, 64] {
                rows.push(row(n, "window", d, Some(d as f64 * 0.9), Some(0.3)));
                rows.push(row(n, "performer_favor", d, None, None));
            }
        }
        let f = decoder(&rows, Statistic::Mean).expect("a figure");
        assert_eq!(f.cols, 3, "n = 2048, 8192 and the mass column");
        assert_eq!(f.cells.len(), 3);
        let first = f.cells[0].as_ref().unwrap();
        let xs: Vec<Vec<f64>> = first
            .series
            .iter()
            .map(|s| s.points.iter().map(|p| p.x).collect())
            .collect();
        assert!(
            xs.contains(&vec![14.4, 57.6]),
            "window at its realised keys: {xs:?}"
        );
        assert!(
            xs.contains(&vec![16.0, 64.0]),
            "performer_favor at d: {xs:?}"
        );
        let mass = f.cells[2].as_ref().unwrap();
        assert_eq!(
            mass.series.len(),
            1,
            "only the restricted method has a mass"
        );
        assert!(mass.series[0]
            .points
            .iter()
            .all(|p| (p.y - 0.3).abs() < 1e-12));
        // Under the causal mask the oracle keeps d keys per query, and its label says so.
        rows.push(row(2048, "topk", 16, Some(16.0), Some(0.5)));
        let labels: Vec<String> = decoder(&rows, Statistic::Mean)
            .unwrap()
            .legend
            .iter()
            .filter_map(|item| match item {
                LegendItem::Series(label, _) => Some(label.clone()),
                _ => None,
            })
            .collect();
        assert!(
            labels.contains(&"Top-d keys (oracle)".to_string()),
            "{labels:?}"
        );
        assert_eq!(
            style::method_label_under("topk", Mask::None),
            "Top-2d keys (oracle)"
        );
        let unmasked: Vec<SummaryRow> = rows
            .iter()
            .map(|r| SummaryRow {
                mask: Mask::None,
                ..r.clone()
            })
            .collect();
        assert!(decoder(&unmasked, Statistic::Mean).is_none());
    }
}
