//! The four figures, built from combined summary rows (model = display label).

use std::collections::BTreeSet;

use super::axis::{Axis, Scale, TickFormat};
use super::draw::{Figure, LegendItem, Panel, Point, Series};
use super::style::{self, Marker, SeriesStyle};
use super::Statistic;
use super::{grid, lengths_of, skeinformer_panels, skyformer_panels};
use crate::attention::Mask;
use crate::config::{SKEINFORMER_FIGURE, SKYFORMER_FIGURE};
use crate::report::summary::SummaryRow;

pub(super) const X_FEATURES: &str = "number of features";
const Y_LOSS: &str = "Spectral Norm Loss";

/// Which x a point uses.
#[derive(Clone, Copy)]
pub(super) enum XOf {
    Features,
    Seconds,
    Macs,
    /// Realised keys per query (restrict-and-renormalise methods), else d (docs/reference.md §7.6).
    Keys,
    /// The fraction of dense f16 attention's K/V traffic (docs/reference.md §8.5); NaN without one.
    KvRead,
}

impl XOf {
    fn of(self, r: &SummaryRow) -> f64 {
        match self {
            XOf::Features => r.d as f64,
            XOf::Seconds => r.seconds_mean,
            XOf::Macs => r.macs,
            XOf::Keys => r.keys_mean.unwrap_or(r.d as f64),
            XOf::KvRead => r.kv_read_mean.unwrap_or(f64::NAN),
        }
    }
}

/// The rows of one curve, by d.
pub(super) fn curve_rows<'a>(
    rows: &'a [SummaryRow],
    model: &str,
    n: usize,
    method: &str,
) -> Vec<&'a SummaryRow> {
    let mut v: Vec<&SummaryRow> = rows
        .iter()
        .filter(|r| r.model == model && r.n == n && r.method == method)
        .collect();
    v.sort_by_key(|r| r.d);
    v
}

fn point(r: &SummaryRow, x: XOf) -> Point {
    Point {
        x: x.of(r),
        y: r.mean,
        se: r.stderr,
        nonfinite: r.flagged_trials.max(r.nonfinite_trials),
    }
}

/// Values an axis must show for these points: each mean and its ±SE bar (on log axes the lower
/// bar end is only followed down to half the mean; below that it is clipped at the axis).
fn y_extent(points: &[Point], scale: Scale) -> Vec<f64> {
    let mut v = vec![];
    for q in points.iter().filter(|q| q.y.is_finite()) {
        let se = if q.se.is_finite() { q.se } else { 0.0 };
        v.push(q.y);
        v.push(q.y + se);
        v.push(if scale == Scale::Linear {
            q.y - se
        } else {
            (q.y - se).max(q.y * 0.5)
        });
    }
    v
}

/// What the notes under the legend say about the points a figure uses.
#[derive(Default)]
pub(super) struct Tally {
    trials: BTreeSet<usize>,
    nonfinite: bool,
    missing: Vec<String>,
    methods: BTreeSet<(usize, String)>,
    /// The mask of the figure's runs, which some labels depend on.
    mask: Mask,
}

impl Tally {
    /// A tally for a figure of causal runs.
    pub(super) fn causal() -> Self {
        Self {
            mask: Mask::Causal,
            ..Self::default()
        }
    }

    pub(super) fn add(&mut self, r: &SummaryRow, placeable: bool) {
        if r.mean.is_finite() && placeable {
            self.trials.insert(r.trials + r.nonfinite_trials);
            self.nonfinite |= r.nonfinite_trials > 0 || r.flagged_trials > 0;
            self.methods.insert(style::method_rank(&r.method));
        } else {
            let why = if r.mean.is_finite() {
                "non-positive"
            } else {
                "no finite trial"
            };
            self.missing.push(format!(
                "{} n={} d={} ({why})",
                style::method_label_under(&r.method, self.mask),
                r.n,
                r.d
            ));
        }
    }

    pub(super) fn trials_text(&self) -> String {
        match (self.trials.first(), self.trials.last()) {
            (Some(a), Some(b)) if a == b => format!("{a} trials per point"),
            (Some(a), Some(b)) => format!("{a}–{b} trials per point"),
            _ => "no trials".into(),
        }
    }

    pub(super) fn notes(&self, first: String) -> Vec<String> {
        let mut notes = vec![first];
        if !self.missing.is_empty() {
            let shown: Vec<&str> = self.missing.iter().take(4).map(String::as_str).collect();
            let more = self.missing.len().saturating_sub(4);
            let tail = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            notes.push(format!("Not drawn: {}{tail}", shown.join("; ")));
        }
        notes
    }

    /// Legend entries of the methods drawn, in `order` (ids not in it follow in legend order).
    pub(super) fn legend(
        &self,
        order: &[String],
        style_of: &dyn Fn(&str) -> SeriesStyle,
    ) -> Vec<LegendItem> {
        let mut ids: Vec<&str> = order
            .iter()
            .map(String::as_str)
            .filter(|m| self.methods.iter().any(|(_, x)| x == m))
            .collect();
        ids.extend(
            self.methods
                .iter()
                .map(|(_, m)| m.as_str())
                .filter(|m| !order.iter().any(|o| o == m)),
        );
        let mut items: Vec<LegendItem> = ids
            .into_iter()
            .map(|m| LegendItem::Series(style::method_label_under(m, self.mask), style_of(m)))
            .collect();
        if self.nonfinite {
            items.push(LegendItem::Ring("flagged trials: non-finite rows or an estimated normalizer ≤ 0 (number beside the ring; non-finite trials are left out of every statistic)".into()));
        }
        items
    }
}

/// A panel of error against x for `methods` at (model, n).
#[allow(clippy::too_many_arguments)]
pub(super) fn panel(
    rows: &[SummaryRow],
    model: &str,
    n: usize,
    methods: &[String],
    style_of: &dyn Fn(&str) -> SeriesStyle,
    x: (XOf, Axis, &str),
    y_scale: Scale,
    tally: &mut Tally,
) -> Panel {
    let (xof, x_axis, x_label) = x;
    let mut series = vec![];
    for m in methods {
        let rs = curve_rows(rows, model, n, m);
        if rs.is_empty() {
            continue;
        }
        let mut pts: Vec<Point> = rs.iter().map(|r| point(r, xof)).collect();
        for (r, q) in rs.iter().zip(&pts) {
            tally.add(r, x_axis.scale.admits(q.x) && y_scale.admits(q.y));
        }
        if !matches!(xof, XOf::Features) {
            pts.retain(|q| x_axis.scale.admits(q.x));
        }
        series.push(Series {
            style: style_of(m),
            points: pts,
        });
    }
    let all: Vec<Point> = series
        .iter()
        .flat_map(|s| s.points.iter().cloned())
        .collect();
    let y = Axis::fit(y_scale, &y_extent(&all, y_scale), TickFormat::Number);
    Panel {
        title: format!("{model} n={n}"),
        x: x_axis,
        y,
        x_label: x_label.into(),
        y_label: Y_LOSS.into(),
        series,
    }
}

pub(super) fn ds_of(rows: &[SummaryRow], keep: impl Fn(&SummaryRow) -> bool) -> Vec<usize> {
    let ds: BTreeSet<usize> = rows.iter().filter(|r| keep(r)).map(|r| r.d).collect();
    ds.into_iter().collect()
}

/// What sets the two papers' Figure 1s apart.
struct PaperSpec {
    name: &'static str,
    methods: &'static [&'static str],
    style_of: fn(&str) -> Option<SeriesStyle>,
    y_scale: Scale,
    /// Models × lengths in a grid (Skyformer), or one row of panels (Skeinformer).
    grid_layout: bool,
}

/// A paper figure: the given panels, its four methods in the paper's styles.
fn paper_figure(
    rows: &[SummaryRow],
    panels: Vec<(String, usize)>,
    spec: &PaperSpec,
    stat: Statistic,
) -> Option<Figure> {
    if panels.is_empty() {
        return None;
    }
    let PaperSpec {
        name,
        methods,
        style_of,
        y_scale,
        grid_layout,
    } = *spec;
    let methods: Vec<String> = methods.iter().map(|s| s.to_string()).collect();
    let style_of = |m: &str| style_of(m).unwrap_or_else(|| style::all_methods_style(m, 0));
    let x_axis = Axis::features(&ds_of(rows, |r| {
        panels.iter().any(|(m, n)| *m == r.model && *n == r.n) && methods.contains(&r.method)
    }));
    let mut tally = Tally::default();
    let mut make = |m: &str, n: usize| {
        let x = (XOf::Features, x_axis.clone(), X_FEATURES);
        panel(rows, m, n, &methods, &style_of, x, y_scale, &mut tally)
    };
    let (cells, cols, empty_titles) = if grid_layout {
        let (models, ns) = grid(&panels);
        let mut cells = vec![];
        let mut titles = vec![];
        for m in &models {
            for &n in &ns {
                let present = panels.iter().any(|(pm, pn)| pm == m && *pn == n);
                cells.push(present.then(|| make(m, n)));
                titles.push(format!("{m} n={n}"));
            }
        }
        (cells, ns.len(), titles)
    } else {
        let cells: Vec<Option<Panel>> = panels.iter().map(|(m, n)| Some(make(m, *n))).collect();
        let k = cells.len();
        (cells, k, vec![String::new(); k])
    };
    let scale = if y_scale == Scale::Linear {
        "linear y"
    } else {
        "log y"
    };
    Some(Figure {
        title: format!("{name} Fig. 1 reproduction: ‖O − Ô‖₂ against exact softmax attention"),
        legend: tally.legend(&methods, &style_of),
        notes: tally.notes(format!(
            "{} over {}; x: d on log₂ spacing; {scale}.",
            stat.lead(),
            tally.trials_text()
        )),
        cols,
        cells,
        empty_titles,
        panel_w: 460,
        panel_h: 430,
    })
}

pub fn skyformer(rows: &[SummaryRow], stat: Statistic) -> Option<Figure> {
    let panels = skyformer_panels(rows);
    let spec = PaperSpec {
        name: "Skyformer",
        methods: SKYFORMER_FIGURE,
        style_of: style::skyformer_style,
        y_scale: Scale::Linear,
        grid_layout: true,
    };
    paper_figure(rows, panels, &spec, stat)
}

pub fn skeinformer(rows: &[SummaryRow], stat: Statistic) -> Option<Figure> {
    let panels = skeinformer_panels(rows);
    let spec = PaperSpec {
        name: "Skeinformer",
        methods: SKEINFORMER_FIGURE,
        style_of: style::skeinformer_style,
        y_scale: Scale::Log10,
        grid_layout: false,
    };
    paper_figure(rows, panels, &spec, stat)
}

/// Every method present for `model`, by legend order, with the floor (svd_optimal) first so
/// that the others are drawn over it.
fn methods_of(rows: &[SummaryRow], model: &str) -> Vec<String> {
    let set: BTreeSet<(usize, String)> = rows
        .iter()
        .filter(|r| r.model == model)
        .map(|r| style::method_rank(&r.method))
        .collect();
    let mut v: Vec<String> = set.into_iter().map(|(_, m)| m).collect();
    if let Some(i) = v.iter().position(|m| m == "svd_optimal") {
        let floor = v.remove(i);
        v.insert(0, floor);
    }
    v
}

/// A style per method, unknown ids numbered in order of appearance.
fn all_styles(methods: &[String], marker_for_floor: bool) -> impl Fn(&str) -> SeriesStyle + '_ {
    move |m: &str| {
        let unknown = methods
            .iter()
            .filter(|x| style::method_rank(x).0 == style::method_rank("?").0)
            .position(|x| x == m);
        let mut s = style::all_methods_style(m, unknown.unwrap_or(0));
        if marker_for_floor && m == "svd_optimal" {
            s.marker = Marker::Dot;
            s.width = 3;
        }
        s
    }
}

pub fn all_methods(rows: &[SummaryRow], model: &str, stat: Statistic) -> Option<Figure> {
    let ns = lengths_of(rows, model);
    if ns.is_empty() {
        return None;
    }
    let methods = methods_of(rows, model);
    let has_floor = methods.iter().any(|m| m == "svd_optimal");
    let style_of = all_styles(&methods, false);
    let x_axis = Axis::features(&ds_of(rows, |r| r.model == model));
    let mut tally = Tally::default();
    let cells: Vec<Option<Panel>> = ns
        .iter()
        .map(|&n| {
            let x = (XOf::Features, x_axis.clone(), X_FEATURES);
            Some(panel(
                rows,
                model,
                n,
                &methods,
                &style_of,
                x,
                Scale::Log10,
                &mut tally,
            ))
        })
        .collect();
    Some(Figure {
        title: format!("All methods, {model}: ‖O − Ô‖₂ against exact softmax attention"),
        legend: tally.legend(&[], &style_of),
        notes: tally.notes(format!(
            "{} over {}; x: d on log₂ spacing; log y.{}",
            stat.lead(),
            tally.trials_text(),
            if has_floor {
                " Thick grey: the best rank-d approximation (SVD), a floor for every method."
            } else {
                ""
            }
        )),
        cols: ns.len().min(2),
        empty_titles: vec![String::new(); cells.len()],
        cells,
        panel_w: 780,
        panel_h: 560,
    })
}

pub fn accuracy_cost(rows: &[SummaryRow], model: &str, stat: Statistic) -> Option<Figure> {
    let ns = lengths_of(rows, model);
    if ns.is_empty() {
        return None;
    }
    let methods = methods_of(rows, model);
    let style_of = all_styles(&methods, true);
    let mut tally = Tally::default();
    let mut cells = vec![];
    for &n in &ns {
        for (xof, fmt, label) in [
            (
                XOf::Seconds,
                TickFormat::Seconds,
                "seconds per head (measured)",
            ),
            (
                XOf::Macs,
                TickFormat::Power10,
                "multiply-adds per head (analytic)",
            ),
        ] {
            let keep = |r: &&SummaryRow| r.model == model && r.n == n && r.mean.is_finite();
            let xs: Vec<f64> = rows.iter().filter(keep).map(|r| xof.of(r)).collect();
            let x_axis = Axis::fit(Scale::Log10, &xs, fmt);
            // Each n is tallied once (on the seconds panel) so that notes do not repeat.
            let mut scratch = Tally::default();
            let t = if matches!(xof, XOf::Seconds) {
                &mut tally
            } else {
                &mut scratch
            };
            cells.push(Some(panel(
                rows,
                model,
                n,
                &methods,
                &style_of,
                (xof, x_axis, label),
                Scale::Log10,
                t,
            )));
        }
    }
    Some(Figure {
        title: format!("Accuracy against cost, {model}: ‖O − Ô‖₂ per method across d"),
        legend: tally.legend(&[], &style_of),
        notes: tally.notes(format!(
            "One point per d, joined in order of d; {} over {}; log–log axes.",
            stat.lead().to_lowercase(),
            tally.trials_text()
        )),
        cols: 2,
        empty_titles: vec![String::new(); cells.len()],
        cells,
        panel_w: 760,
        panel_h: 500,
    })
}

/// What a figure's last column plots for each method: another statistic of the same points
/// (decoder.png: the mass captured; quant.png: 1 − cos_sim), against the same x, at the model's
/// largest shown length with data; None when the model has no such length.
pub(super) struct SideColumn<'a> {
    /// The point's y, None where the method has no such statistic (it is then not drawn).
    pub value: &'a dyn Fn(&SummaryRow) -> Option<f64>,
    pub x: (XOf, Axis, &'a str),
    pub y_scale: Scale,
    /// Appended to "{model} n={n}: " in the panel title.
    pub title: &'a str,
    pub y_label: &'a str,
}

impl SideColumn<'_> {
    pub(super) fn panel(
        &self,
        rows: &[SummaryRow],
        model: &str,
        shown: &[usize],
        methods: &[String],
        style_of: &dyn Fn(&str) -> SeriesStyle,
    ) -> Option<Panel> {
        let n = super::lengths_of(rows, model)
            .into_iter()
            .filter(|n| shown.contains(n))
            .max()?;
        let side: Vec<SummaryRow> = rows
            .iter()
            .filter(|r| r.model == model && r.n == n)
            .filter_map(|r| {
                (self.value)(r).map(|y| SummaryRow {
                    mean: y,
                    stderr: 0.0,
                    ..r.clone()
                })
            })
            .collect();
        let with_value: Vec<String> = methods
            .iter()
            .filter(|m| side.iter().any(|r| &r.method == *m))
            .cloned()
            .collect();
        let mut scratch = Tally::default();
        let mut p = panel(
            &side,
            model,
            n,
            &with_value,
            style_of,
            self.x.clone(),
            self.y_scale,
            &mut scratch,
        );
        p.title = format!("{model} n={n}: {}", self.title);
        p.y_label = self.y_label.into();
        Some(p)
    }
}

/// The cells of a figure laid out one row per model (decoder.png, quant.png, decode.png): a panel
/// per shown length against `x`, then `side`'s column; with the legend's method order over every
/// model (first appearance). Methods keep one style per model, by their place in its legend.
pub(super) fn model_rows(
    rows: &[SummaryRow],
    ns: &[usize],
    x: (XOf, Axis, &str),
    side: &SideColumn,
    tally: &mut Tally,
) -> (Vec<Option<Panel>>, Vec<String>) {
    let (mut cells, mut legend_order) = (vec![], Vec::<String>::new());
    for model in &super::models(rows) {
        let (legend, draw) = super::style::ordered_methods(rows, model);
        for m in &legend {
            if !legend_order.contains(m) {
                legend_order.push(m.clone());
            }
        }
        let style_of = |m: &str| super::style::field_style(m, &legend);
        for &n in ns {
            let p = panel(
                rows,
                model,
                n,
                &draw,
                &style_of,
                x.clone(),
                Scale::Log10,
                tally,
            );
            cells.push(Some(p));
        }
        cells.push(side.panel(rows, model, ns, &draw, &style_of));
    }
    (cells, legend_order)
}
