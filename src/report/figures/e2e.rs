//! `e2e.png` (docs/reference.md §10.3): the damage at the output against bytes read and against the
//! operator error. Left: x = `kv_read` (log₂), y = `kl_mean` (log), the sparse and §9 methods as
//! lines over d, the §8 methods as single points, oracles grey. Right: y = `kl_mean` against the
//! layer-mean operator error `op_err_mean` (log–log), one point per (mode, method, d), with
//! Spearman's ρ in the panel title. Each point is the mean over the run's windows.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::axis::{Axis, Scale, TickFormat};
use super::draw::{Figure, LegendItem, Panel, Point, Series};
use super::style::field_style;
use super::style::GREY;
use crate::numerics::next_token::spearman;

/// One (mode, method, d) point: means over windows of kv_read, op_err_mean and kl_mean.
#[derive(Debug, Clone, PartialEq)]
pub struct E2eMean {
    pub mode: String,
    pub method: String,
    pub d: usize,
    pub kv_read: f64,
    pub op_err: f64,
    pub kl: f64,
}

/// The points of a run directory's `e2e.csv`.
pub fn load(out: &Path) -> Result<Vec<E2eMean>> {
    let t = crate::report::e2e_rows::E2eRows::read(&out.join("e2e.csv"))?;
    let cols = [t.col("kv_read")?, t.col("op_err_mean")?, t.col("kl_mean")?];
    let mut sums: BTreeMap<(String, String, usize), ([f64; 3], usize)> = BTreeMap::new();
    for r in &t.rows {
        let e = sums.entry(r.point.clone()).or_insert(([0.0; 3], 0));
        for (s, &i) in e.0.iter_mut().zip(&cols) {
            *s += r.values[i];
        }
        e.1 += 1;
    }
    Ok(sums
        .into_iter()
        .map(|((mode, method, d), (s, c))| E2eMean {
            mode,
            method,
            d,
            kv_read: s[0] / c as f64,
            op_err: s[1] / c as f64,
            kl: s[2] / c as f64,
        })
        .collect())
}

/// The style of a point's method: the field figure's, a decode cache read (`dkv_…`) dashed in
/// its cache's colour, the oracles grey.
fn style_of(m: &E2eMean, methods: &[String]) -> super::style::SeriesStyle {
    let base = m.method.strip_prefix('d').filter(|c| {
        crate::attention::describe(c).is_some() && crate::attention::describe(&m.method).is_none()
    });
    let mut s = field_style(base.unwrap_or(&m.method), methods);
    s.dashed = base.is_some();
    if crate::attention::describe(&m.method).is_some_and(|(_, oracle)| oracle) {
        s.color = GREY;
    }
    s
}

/// The figure of `points`, None when no point can be drawn on log axes.
pub fn figure(points: &[E2eMean]) -> Option<Figure> {
    let drawable: Vec<&E2eMean> = points
        .iter()
        .filter(|p| p.kl > 0.0 && p.kl.is_finite())
        .collect();
    if drawable.is_empty() {
        return None;
    }
    let methods: Vec<String> = {
        let mut m: Vec<String> = drawable.iter().map(|p| p.method.clone()).collect();
        m.dedup();
        m
    };
    let mut by_method: BTreeMap<&str, Vec<&E2eMean>> = BTreeMap::new();
    for p in &drawable {
        by_method.entry(p.method.as_str()).or_default().push(p);
    }
    let pt = |x: f64, y: f64| Point {
        x,
        y,
        se: 0.0,
        nonfinite: 0,
    };
    let (mut left, mut right, mut legend) = (Vec::new(), Vec::new(), Vec::new());
    for (method, mut ps) in by_method {
        ps.sort_by(|a, b| a.kv_read.total_cmp(&b.kv_read));
        let style = style_of(ps[0], &methods);
        legend.push(LegendItem::Series(method.to_string(), style.clone()));
        left.push(Series {
            style: style.clone(),
            points: ps.iter().map(|p| pt(p.kv_read, p.kl)).collect(),
        });
        for p in ps {
            right.push(Series {
                style: style.clone(),
                points: vec![pt(p.op_err, p.kl)],
            });
        }
    }
    let kls: Vec<f64> = drawable.iter().map(|p| p.kl).collect();
    let pairs: Vec<(f64, f64)> = drawable
        .iter()
        .map(|p| (p.op_err, p.kl))
        .filter(|(x, _)| x.is_finite())
        .collect();
    let (xs, ys): (Vec<f64>, Vec<f64>) = pairs.iter().copied().unzip();
    let rho = if xs.len() >= 3 {
        spearman(&xs, &ys)
    } else {
        f64::NAN
    };
    let y = Axis::fit(Scale::Log10, &kls, TickFormat::Number);
    let reads: Vec<f64> = drawable.iter().map(|p| p.kv_read).collect();
    let panel = |title: String, x: Axis, x_label: &str, series| Panel {
        title,
        x,
        y: y.clone(),
        x_label: x_label.into(),
        y_label: "next-token KL to the exact model (nats)".into(),
        series,
    };
    Some(Figure {
        title: "A method in every layer: the damage at the output".into(),
        legend,
        notes: vec!["means over windows; dashed: the §8 caches read under the decode protocol; grey: oracles".into()],
        cols: 2,
        cells: vec![
            Some(panel("KL against K/V bytes read".into(), Axis::fit(Scale::Log2, &reads, TickFormat::Number), "K/V bytes read, relative to dense f16 attention (kv_read)", left)),
            Some(panel(format!("KL against the layer-mean operator error (Spearman ρ = {rho:.2}, {} points)", xs.len()), Axis::fit(Scale::Log10, &xs, TickFormat::Number), "layer-mean ‖O − Ô‖₂ (op_err_mean)", right)),
        ],
        empty_titles: vec![String::new(), String::new()],
        panel_w: 640,
        panel_h: 480,
    })
}

/// Draws `e2e.png` into `out` from its e2e.csv; None when there is nothing to draw.
pub fn draw(out: &Path) -> Result<Option<PathBuf>> {
    let Some(fig) = figure(&load(out)?) else {
        return Ok(None);
    };
    let path = out.join("e2e.png");
    crate::atomic_file::write_with(&path, |tmp| fig.save_png(tmp))?;
    Ok(Some(path))
}
