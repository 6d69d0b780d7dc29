//! Rendering: a figure is a title, a legend strip and a grid of panels. Axes and grid come from
//! plotters' chart mesh; curves, error bars and markers are drawn in pixel space on top.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::axis::Axis;
use super::style::{ensure_font, Marker, SeriesStyle, FONT};

/// One plotted point (raw values); `y` NaN (or not placeable) breaks the line and is not drawn.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub x: f64,
    pub y: f64,
    pub se: f64,
    pub nonfinite: usize,
}

#[derive(Debug, Clone)]
pub struct Series {
    pub style: SeriesStyle,
    pub points: Vec<Point>,
}

#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    pub x: Axis,
    pub y: Axis,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

#[derive(Debug, Clone)]
pub enum LegendItem {
    Series(String, SeriesStyle),
    /// The ring drawn around points with non-finite trials.
    Ring(String),
}

#[derive(Debug, Clone)]
pub struct Figure {
    pub title: String,
    pub legend: Vec<LegendItem>,
    pub notes: Vec<String>,
    pub cols: usize,
    /// Row-major; `None` is an empty cell ("no data") that keeps the grid aligned.
    pub cells: Vec<Option<Panel>>,
    /// Panel titles of the empty cells (same indexing as `cells`).
    pub empty_titles: Vec<String>,
    pub panel_w: u32,
    pub panel_h: u32,
}

pub const MARGIN: u32 = 20;
pub const MIN_WIDTH: u32 = 1000;
const TITLE_H: u32 = 48;
const TITLE_PX: u32 = 24;
const LEGEND_PX: u32 = 19;
const LEGEND_ROW_H: u32 = 32;
const NOTE_PX: u32 = 17;
const NOTE_ROW_H: u32 = 26;
const SAMPLE_W: i32 = 56;
const ITEM_GAP: i32 = 34;
const PANEL_TITLE_PX: u32 = 20;
const PANEL_TITLE_MIN_PX: u32 = 17;
const PANEL_TITLE_H: u32 = 34;
const TICK_PX: u32 = 17;
const DESC_PX: u32 = 19;

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing failed: {e}")
}

fn text_w(text: &str, px: u32) -> i32 {
    (FONT, px)
        .into_font()
        .box_size(text)
        .map(|(w, _)| w as i32)
        .unwrap_or(text.chars().count() as i32 * px as i32 * 6 / 10)
}

impl Figure {
    pub fn rows(&self) -> usize {
        self.cells.len().div_ceil(self.cols.max(1))
    }

    /// Panel width after widening narrow figures to [`MIN_WIDTH`].
    pub fn cell_w(&self) -> u32 {
        let cols = self.cols.max(1) as u32;
        self.panel_w.max((MIN_WIDTH - 2 * MARGIN).div_ceil(cols))
    }

    pub fn width(&self) -> u32 {
        self.cell_w() * self.cols.max(1) as u32 + 2 * MARGIN
    }

    /// Items of each legend row (indices into `legend`), wrapped to the figure width.
    fn legend_rows(&self) -> Vec<Vec<usize>> {
        let avail = (self.width() - 2 * MARGIN) as i32;
        let mut rows: Vec<Vec<usize>> = vec![];
        let mut used = 0;
        for (i, item) in self.legend.iter().enumerate() {
            let label = match item {
                LegendItem::Series(l, _) | LegendItem::Ring(l) => l,
            };
            let w = SAMPLE_W + 10 + text_w(label, LEGEND_PX) + ITEM_GAP;
            if rows.is_empty() || used + w - ITEM_GAP > avail {
                rows.push(vec![]);
                used = 0;
            }
            rows.last_mut().expect("row").push(i);
            used += w;
        }
        rows
    }

    fn legend_h(&self) -> u32 {
        self.legend_rows().len() as u32 * LEGEND_ROW_H + self.notes.len() as u32 * NOTE_ROW_H + 10
    }

    /// Height of the panel title band: room for two lines when some title needs them.
    fn panel_title_h(&self) -> u32 {
        let titles = self.cells.iter().enumerate().map(|(i, c)| match c {
            Some(p) => p.title.as_str(),
            None => self.empty_titles.get(i).map(String::as_str).unwrap_or(""),
        });
        let two = titles
            .into_iter()
            .any(|t| title_lines(t, self.cell_w()).1.len() > 1);
        if two {
            2 * (PANEL_TITLE_MIN_PX + 5) + 12
        } else {
            PANEL_TITLE_H
        }
    }

    /// (width, height) in pixels.
    pub fn size(&self) -> (u32, u32) {
        (
            self.width(),
            TITLE_H + self.legend_h() + self.rows() as u32 * self.panel_h + MARGIN,
        )
    }

    pub fn save_png(&self, path: &Path) -> Result<()> {
        ensure_font()?;
        let root = BitMapBackend::new(path, self.size()).into_drawing_area();
        self.render(&root)?;
        root.present()
            .map_err(|e| anyhow!("writing {}: {e}", path.display()))
    }

    pub fn render<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        ensure_font()?;
        root.fill(&WHITE).map_err(err)?;
        let w = self.width() as i32;
        let center = Pos::new(HPos::Center, VPos::Center);
        root.draw_text(
            &self.title,
            &(FONT, TITLE_PX).into_font().color(&BLACK).pos(center),
            (w / 2, TITLE_H as i32 / 2 + 2),
        )
        .map_err(err)?;
        let mut y = TITLE_H as i32;
        for row in self.legend_rows() {
            let cy = y + LEGEND_ROW_H as i32 / 2;
            let total: i32 = row
                .iter()
                .map(|&i| match &self.legend[i] {
                    LegendItem::Series(l, _) | LegendItem::Ring(l) => {
                        SAMPLE_W + 10 + text_w(l, LEGEND_PX) + ITEM_GAP
                    }
                })
                .sum::<i32>()
                - ITEM_GAP;
            let mut x = (w - total) / 2;
            for &i in &row {
                let label = match &self.legend[i] {
                    LegendItem::Series(l, s) => {
                        draw_line(root, &[(x, cy), (x + SAMPLE_W, cy)], s)?;
                        draw_marker(root, (x + SAMPLE_W / 2, cy), s)?;
                        l
                    }
                    LegendItem::Ring(l) => {
                        draw_ring(root, (x + SAMPLE_W / 2, cy), &BLACK, None)?;
                        l
                    }
                };
                let left = Pos::new(HPos::Left, VPos::Center);
                root.draw_text(
                    label,
                    &(FONT, LEGEND_PX).into_font().color(&BLACK).pos(left),
                    (x + SAMPLE_W + 10, cy),
                )
                .map_err(err)?;
                x += SAMPLE_W + 10 + text_w(label, LEGEND_PX) + ITEM_GAP;
            }
            y += LEGEND_ROW_H as i32;
        }
        for note in &self.notes {
            let style = (FONT, NOTE_PX)
                .into_font()
                .color(&RGBColor(60, 60, 60))
                .pos(center);
            root.draw_text(note, &style, (w / 2, y + NOTE_ROW_H as i32 / 2))
                .map_err(err)?;
            y += NOTE_ROW_H as i32;
        }
        let top = (TITLE_H + self.legend_h()) as i32;
        let (cw, ch) = (self.cell_w() as i32, self.panel_h as i32);
        let cols = self.cols.max(1);
        let title_h = self.panel_title_h();
        for (i, cell) in self.cells.iter().enumerate() {
            let (r, c) = ((i / cols) as i32, (i % cols) as i32);
            let x0 = MARGIN as i32 + c * cw;
            let y0 = top + r * ch;
            let area = root.clone().shrink((x0, y0), (cw as u32, ch as u32));
            match cell {
                Some(p) => draw_panel(root, &area, p, title_h)?,
                None => draw_empty(
                    &area,
                    self.empty_titles.get(i).map(String::as_str).unwrap_or(""),
                    title_h,
                )?,
            }
        }
        Ok(())
    }
}

/// A panel title as lines and font size: one line at 20 px, else at 17 px, else split before " n=".
pub(super) fn title_lines(title: &str, width: u32) -> (u32, Vec<String>) {
    let avail = width as i32 - 16;
    for px in [PANEL_TITLE_PX, PANEL_TITLE_MIN_PX] {
        if text_w(title, px) <= avail {
            return (px, vec![title.to_string()]);
        }
    }
    match title.rfind(" n=") {
        Some(i) => (
            PANEL_TITLE_MIN_PX,
            vec![title[..i].to_string(), title[i + 1..].to_string()],
        ),
        None => (PANEL_TITLE_MIN_PX, vec![title.to_string()]),
    }
}

fn draw_title<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    title_h: u32,
) -> Result<()> {
    let (w, _) = area.dim_in_pixel();
    let (px, lines) = title_lines(title, w);
    let style = (FONT, px)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Center));
    let line_h = px as i32 + 5;
    let y0 = title_h as i32 / 2 + 4 - (lines.len() as i32 - 1) * line_h / 2;
    for (k, line) in lines.iter().enumerate() {
        area.draw_text(line, &style, (w as i32 / 2, y0 + k as i32 * line_h))
            .map_err(err)?;
    }
    Ok(())
}

fn draw_empty<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    title_h: u32,
) -> Result<()> {
    draw_title(area, title, title_h)?;
    let (w, h) = area.dim_in_pixel();
    let style = (FONT, PANEL_TITLE_PX)
        .into_font()
        .color(&RGBColor(150, 150, 150))
        .pos(Pos::new(HPos::Center, VPos::Center));
    area.draw_text("no data", &style, (w as i32 / 2, h as i32 / 2))
        .map_err(err)?;
    Ok(())
}

fn draw_panel<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    area: &DrawingArea<DB, Shift>,
    p: &Panel,
    title_h: u32,
) -> Result<()> {
    draw_title(area, &p.title, title_h)?;
    let (_, body) = area.split_vertically(title_h + 6);
    let (xr, yr) = (AxisCoord::new(&p.x), AxisCoord::new(&p.y));
    let mut chart = ChartBuilder::on(&body)
        .margin_left(4)
        .margin_right(36)
        .margin_bottom(6)
        .x_label_area_size(58)
        .y_label_area_size(82)
        .build_cartesian_2d(xr, yr)
        .map_err(err)?;
    let xf = |v: &f64| p.x.label_at(*v);
    let yf = |v: &f64| p.y.label_at(*v);
    chart
        .configure_mesh()
        .x_desc(p.x_label.as_str())
        .y_desc(p.y_label.as_str())
        .label_style((FONT, TICK_PX))
        .axis_desc_style((FONT, DESC_PX))
        .x_label_formatter(&xf)
        .y_label_formatter(&yf)
        .bold_line_style(RGBColor(212, 212, 212))
        .light_line_style(RGBColor(238, 238, 238))
        .axis_style(BLACK)
        .draw()
        .map_err(err)?;
    let px = |x: f64, y: f64| chart.backend_coord(&(p.x.scale.fwd(x), p.y.scale.fwd(y)));
    // Error bars first, then lines, then markers on top.
    for s in &p.series {
        let bar = s.style.color.stroke_width(2);
        for q in s.points.iter().filter(|q| placeable(p, q)) {
            if !(q.se.is_finite() && q.se > 0.0) {
                continue;
            }
            let (x, top) = px(q.x, p.y.clamp(q.y + q.se));
            let (_, bottom) = px(q.x, p.y.clamp(q.y - q.se));
            if bottom - top < 2 {
                continue;
            }
            root.draw(&PathElement::new(vec![(x, top), (x, bottom)], bar))
                .map_err(err)?;
            for yy in [top, bottom] {
                root.draw(&PathElement::new(vec![(x - 5, yy), (x + 5, yy)], bar))
                    .map_err(err)?;
            }
        }
    }
    for s in &p.series {
        for run in s.points.split(|q| !placeable(p, q)) {
            let pts: Vec<(i32, i32)> = run.iter().map(|q| px(q.x, q.y)).collect();
            if pts.len() >= 2 {
                draw_line(root, &pts, &s.style)?;
            }
        }
    }
    for s in &p.series {
        let lone = |i: usize| {
            let ok = |j: Option<usize>| {
                j.and_then(|j| s.points.get(j))
                    .is_some_and(|q| placeable(p, q))
            };
            !ok(i.checked_sub(1)) && !ok(Some(i + 1))
        };
        for (i, q) in s.points.iter().enumerate() {
            if !placeable(p, q) {
                continue;
            }
            let at = px(q.x, q.y);
            if s.style.marker == Marker::None && lone(i) {
                // A line-only style would leave an isolated point invisible.
                root.draw(&Circle::new(at, 5, s.style.color.filled()))
                    .map_err(err)?;
            }
            draw_marker(root, at, &s.style)?;
            if q.nonfinite > 0 {
                draw_ring(root, at, &s.style.color, Some(q.nonfinite))?;
            }
        }
    }
    Ok(())
}

/// A linear coordinate over the axis' transformed range whose tick and grid positions are the
/// axis' own (plotters' float coordinates choose their own ticks and need a value formatter).
struct AxisCoord {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
    minor: Vec<f64>,
}

impl AxisCoord {
    fn new(a: &Axis) -> Self {
        let r = a.range();
        let fwd = |v: &Vec<f64>| v.iter().map(|&x| a.scale.fwd(x)).collect();
        Self {
            lo: r.start,
            hi: r.end,
            ticks: fwd(&a.ticks),
            minor: fwd(&a.minor),
        }
    }
}

impl Ranged for AxisCoord {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let span = self.hi - self.lo;
        if span == 0.0 || !v.is_finite() {
            return (limit.0 + limit.1) / 2;
        }
        let t = (v - self.lo) / span;
        limit.0 + ((limit.1 - limit.0) as f64 * t + 1e-3).floor() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.minor.clone()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

fn placeable(p: &Panel, q: &Point) -> bool {
    p.x.scale.admits(q.x) && p.y.scale.admits(q.y)
}

fn draw_line<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    pts: &[(i32, i32)],
    s: &SeriesStyle,
) -> Result<()> {
    let style = s.color.stroke_width(s.width);
    if s.dashed {
        area.draw(&DashedPathElement::new(pts.to_vec(), 12, 7, style))
            .map_err(err)?;
    } else {
        area.draw(&PathElement::new(pts.to_vec(), style))
            .map_err(err)?;
    }
    Ok(())
}

fn draw_marker<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x, y): (i32, i32),
    s: &SeriesStyle,
) -> Result<()> {
    let fill = s.color.filled();
    let stroke = s.color.stroke_width(3);
    match s.marker {
        Marker::None => Ok(()),
        Marker::Dot => area.draw(&Circle::new((x, y), 5, fill)),
        Marker::Square => area.draw(&Rectangle::new([(x - 5, y - 5), (x + 5, y + 5)], fill)),
        Marker::TriUp => area.draw(&Polygon::new(
            vec![(x, y - 8), (x - 7, y + 5), (x + 7, y + 5)],
            fill,
        )),
        Marker::TriDown => area.draw(&Polygon::new(
            vec![(x, y + 8), (x - 7, y - 5), (x + 7, y - 5)],
            fill,
        )),
        Marker::Diamond => area.draw(&Polygon::new(
            vec![(x, y - 8), (x + 7, y), (x, y + 8), (x - 7, y)],
            fill,
        )),
        Marker::Cross => area
            .draw(&PathElement::new(
                vec![(x - 6, y - 6), (x + 6, y + 6)],
                stroke,
            ))
            .and_then(|_| {
                area.draw(&PathElement::new(
                    vec![(x - 6, y + 6), (x + 6, y - 6)],
                    stroke,
                ))
            }),
        Marker::Plus => area
            .draw(&PathElement::new(vec![(x - 7, y), (x + 7, y)], stroke))
            .and_then(|_| area.draw(&PathElement::new(vec![(x, y - 7), (x, y + 7)], stroke))),
    }
    .map_err(err)
}

/// A hollow ring around a point with non-finite trials, and their count beside it (the number
/// alone: the legend explains the rings, and longer labels collide along a curve).
fn draw_ring<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x, y): (i32, i32),
    color: &RGBColor,
    count: Option<usize>,
) -> Result<()> {
    area.draw(&Circle::new((x, y), 12, color.stroke_width(2)))
        .map_err(err)?;
    if let Some(k) = count {
        let style = (FONT, 16)
            .into_font()
            .color(color)
            .pos(Pos::new(HPos::Left, VPos::Bottom));
        area.draw_text(&k.to_string(), &style, (x + 9, y - 9))
            .map_err(err)?;
    }
    Ok(())
}
