//! Figures: PNGs drawn from summary.csv (docs/reference.md §4).
//!
//! * `skyformer-fig1.png`: Skyformer Fig. 1 — {initialized, pretrained} × n ∈ {512, 1024, 2048, 4096};
//!   Skyformer, Nyströmformer, Performer, Informer in the paper's styles; linear y.
//! * `skeinformer-fig1.png`: Skeinformer Fig. 1 — initialized/pretrained × n ∈ {1024, 4096};
//!   Skeinformer, V-Mean, Informer, Linformer in the paper's styles; log y.
//! * `all-methods-<model>.png`: every method present, one panel per n, the SVD optimum as a grey floor; log y.
//! * `accuracy-cost-<model>.png`: per n, error against measured seconds per head and against
//!   analytic multiply-adds, one series per method across d.
//! * `quant.png` (a run with the quantized family, docs/reference.md §8.5): see `quant.rs`.
//! * `decode.png` (a `--decode` run, docs/reference.md §9.3): see `decode.rs`; its rows are in no other
//!   figure.
//! * `field.png` (a run with the field's sparse or hybrid methods) and `kernelized.png` (a
//!   `--target kernelized` run): see `field.rs`. Kernelized rows appear in no other figure.
//!
//! Only panels with data are drawn. Results from a model other than bert-base-cased (a stand-in)
//! say so in every panel title. Points whose mean is NaN (no finite trial) are left out, never
//! drawn at 0; points with some non-finite trials get a ring and their count.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::manifest::Manifest;
use super::summary::{self, SummaryRow};
use crate::config::{choice, Choice, SKEINFORMER_FIGURE, SKYFORMER_FIGURE};

mod axis;
mod decode;
mod decoder;
mod draw;
pub mod e2e;
mod field;
mod figs;
mod quant;
mod style;

pub use draw::Figure;

/// One run's summary and what identifies its model.
#[derive(Debug, Clone, PartialEq)]
pub struct RunData {
    /// The model the Q/K/V came from (manifest `model_id`, e.g. `bert-base-cased`); `unknown` without a manifest.
    pub model_id: String,
    /// Source of the embedding tables (`pretrained`/`initialized`) when the manifest records it.
    /// Shown in the titles when it differs from the rows' `model` (the Q/K/V weights).
    pub embeddings_from: Option<String>,
    pub rows: Vec<SummaryRow>,
}

impl RunData {
    pub fn new(model_id: impl Into<String>, rows: Vec<SummaryRow>) -> Self {
        Self {
            model_id: model_id.into(),
            embeddings_from: None,
            rows,
        }
    }
}

/// Loads a run: `dir/summary.csv` and `dir/manifest.json`. `dir` may also be a summary.csv file;
/// a manifest.json beside it is used when present, otherwise the model is `unknown`.
pub fn load_run(dir: &Path) -> Result<RunData> {
    if dir.is_dir() {
        super::manifest::refuse_e2e_run(dir)?;
    }
    let (summary_path, run_dir) = if dir.is_file() {
        (
            dir.to_path_buf(),
            dir.parent().map(Path::to_path_buf).unwrap_or_default(),
        )
    } else {
        (dir.join("summary.csv"), dir.to_path_buf())
    };
    if !summary_path.is_file() {
        return Err(crate::usage!(
            "{}: not found (give a directory written by an approx-bench sweep, or a summary.csv file)",
            summary_path.display()
        ));
    }
    let rows = summary::read(&summary_path)?;
    let manifest_dir = if run_dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        run_dir.as_path()
    };
    let (model_id, embeddings_from) = if manifest_dir.join("manifest.json").is_file() {
        let m = Manifest::read(manifest_dir)?;
        // Runs of one model at two layers (the decoder reproduction: layers 0 and 15) are two
        // models in a figure, not duplicates of one. Decoder runs name layer 0 too (a decoder
        // figure sets layers side by side); BERT's layer 0, the papers' setting, goes unnamed.
        let id = match (m.config.inputs.layer, m.config.mask) {
            (0, crate::attention::Mask::None) => m.model_id,
            (l, _) => format!("{} layer {l}", m.model_id),
        };
        (id, Some(m.config.inputs.embeddings_from.name().to_string()))
    } else {
        ("unknown".to_string(), None)
    };
    Ok(RunData {
        model_id,
        embeddings_from,
        rows,
    })
}

/// Whether `name` is one of the figures [`draw_all`] writes (what `--force` removes).
pub fn is_figure_name(name: &str) -> bool {
    let Some(stem) = name.strip_suffix(".png") else {
        return false;
    };
    let stem = stem.strip_suffix("-median").unwrap_or(stem);
    matches!(
        stem,
        "decode"
            | "decoder"
            | "quant"
            | "field"
            | "kernelized"
            | "skyformer-fig1"
            | "skeinformer-fig1"
    ) || stem.starts_with("all-methods-")
        || stem.starts_with("accuracy-cost-")
}

/// Loads the run in `out_dir` and draws its figures into it.
pub fn draw_after_sweep(out_dir: &Path) -> Result<Vec<PathBuf>> {
    let run = load_run(out_dir)?;
    draw_all(&[run], out_dir, Statistic::Mean)
}

/// What a figure's points show; each value's meaning is its [`Choice::help`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Statistic {
    #[default]
    Mean,
    Median,
}

choice!(Statistic {
    Mean = "mean" "Mean ± 1 standard error (the papers' figures)",
    Median = "median"
        "The median of the finite trials, without error bars: the typical trial where a few \
         trials are wild (summary.csv's `median` column)",
});

impl Statistic {
    /// The caption's opening words.
    pub fn lead(self) -> &'static str {
        match self {
            Self::Mean => "Mean ± 1 standard error",
            Self::Median => "Median (no error bars)",
        }
    }

    /// The rows with the plotted value in `mean` and its bar half-width in `stderr`.
    fn apply(self, rows: Vec<SummaryRow>) -> Vec<SummaryRow> {
        match self {
            Self::Mean => rows,
            Self::Median => rows
                .into_iter()
                .map(|r| SummaryRow {
                    mean: r.median,
                    stderr: f64::NAN,
                    ..r
                })
                .collect(),
        }
    }

    /// File-name suffix, so that median figures sit beside the mean ones.
    fn suffix(self) -> &'static str {
        match self {
            Self::Mean => "",
            Self::Median => "-median",
        }
    }
}

/// Draws every figure there is data for into `out_dir` (created if missing); returns the paths.
/// Rows of several runs are combined; where two runs hold the same (model, n, method, d) the
/// earlier run wins. `stat` picks what the points show (median figures get a `-median` suffix).
/// `approx-bench plot`: the figures of the runs in `from`, into `out` or else beside the first run
/// (its directory, or the directory of a summary.csv given); a usage error when nothing is finite.
pub fn plot(from: &[PathBuf], out: Option<&Path>, stat: Statistic) -> Result<Vec<PathBuf>> {
    let runs = from
        .iter()
        .map(|d| load_run(d))
        .collect::<Result<Vec<_>>>()?;
    let first = &from[0];
    let out = match out {
        Some(o) => o.to_path_buf(),
        None if first.is_file() => first.parent().map(|p| p.to_path_buf()).unwrap_or_default(),
        None => first.clone(),
    };
    let written = draw_all(&runs, &out, stat)?;
    if written.is_empty() {
        return Err(crate::usage!(
            "nothing to draw: no finite mean in {}",
            from.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(written)
}

pub fn draw_all(runs: &[RunData], out_dir: &Path, stat: Statistic) -> Result<Vec<PathBuf>> {
    // Causal rows (decoder attention) belong to no encoder figure; the decoder figure is their own.
    let all = combine(runs);
    // Decode rows (docs/reference.md §9: the continuation's rows) are decode.png's alone.
    let (decoding, all): (Vec<SummaryRow>, Vec<SummaryRow>) =
        all.into_iter().partition(|r| r.n_f.is_some());
    let decode_fig = decode::decode(&stat.apply(decoding), stat);
    let quant_fig = quant::quant(&stat.apply(all.clone()), stat);
    // The quantized family (d = 0, no budget axis) is drawn in quant.png only.
    let (causal, rows): (Vec<SummaryRow>, Vec<SummaryRow>) = all
        .into_iter()
        .filter(|r| r.d > 0)
        .partition(|r| r.mask == crate::attention::Mask::Causal);
    let (kernelized, rows): (Vec<SummaryRow>, Vec<SummaryRow>) = rows
        .into_iter()
        .partition(|r| r.target == crate::attention::Target::Kernelized);
    let rows = stat.apply(rows);
    let sfx = stat.suffix();
    let mut figures: Vec<(String, Figure)> = vec![];
    if let Some(f) = decoder::decoder(&stat.apply(causal), stat) {
        figures.push((format!("decoder{sfx}.png"), f));
    }
    if let Some(f) = decode_fig {
        figures.push((format!("decode{sfx}.png"), f));
    }
    if let Some(f) = quant_fig {
        figures.push((format!("quant{sfx}.png"), f));
    }
    if let Some(f) = field::field(&rows, stat) {
        figures.push((format!("field{sfx}.png"), f));
    }
    if let Some(f) = field::kernelized(&kernelized, stat) {
        figures.push(("kernelized.png".to_string(), f));
    }
    if let Some(f) = figs::skyformer(&rows, stat) {
        figures.push((format!("skyformer-fig1{sfx}.png"), f));
    }
    if let Some(f) = figs::skeinformer(&rows, stat) {
        figures.push((format!("skeinformer-fig1{sfx}.png"), f));
    }
    for model in models(&rows) {
        if let Some(f) = figs::all_methods(&rows, &model, stat) {
            figures.push((format!("all-methods-{}{sfx}.png", slug(&model)), f));
        }
        if let Some(f) = figs::accuracy_cost(&rows, &model, stat) {
            figures.push((format!("accuracy-cost-{}{sfx}.png", slug(&model)), f));
        }
    }
    if figures.is_empty() {
        return Ok(vec![]);
    }
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let mut written = vec![];
    for (name, f) in figures {
        let path = out_dir.join(name);
        // Drawn under a temporary name and renamed: a kill or a full disk mid-drawing leaves the
        // previous figure, never a torn one.
        crate::atomic_file::write_with(&path, |tmp| f.save_png(tmp))?;
        written.push(path);
    }
    Ok(written)
}

/// The model ids that are the real thing; anything else is a stand-in and is named in titles.
fn is_reference_model(model_id: &str) -> bool {
    matches!(model_id, "bert-base-cased" | "google-bert/bert-base-cased")
}

/// The label that identifies a curve's model in titles: `initialized`, `pretrained`, or with a
/// parenthesis naming a stand-in model and/or embeddings from the other source, e.g.
/// `pretrained (all-MiniLM-L6-v2)` or `initialized (pretrained embeddings)`.
pub fn model_label(kind: &str, model_id: &str, embeddings_from: Option<&str>) -> String {
    let mut extra = vec![];
    if !is_reference_model(model_id) {
        extra.push(if model_id == "unknown" {
            "model unknown".to_string()
        } else {
            model_id.to_string()
        });
    }
    if let Some(e) = embeddings_from.filter(|e| *e != kind) {
        extra.push(format!("{e} embeddings"));
    }
    if extra.is_empty() {
        kind.to_string()
    } else {
        format!("{kind} ({})", extra.join("; "))
    }
}

/// All runs' rows with `model` replaced by [`model_label`]; the first of duplicate points wins.
fn combine(runs: &[RunData]) -> Vec<SummaryRow> {
    let mut seen = BTreeSet::new();
    let mut out = vec![];
    for run in runs {
        for r in &run.rows {
            let label = model_label(&r.model, &run.model_id, run.embeddings_from.as_deref());
            if seen.insert((
                r.target,
                r.mask,
                r.n_f,
                label.clone(),
                r.n,
                r.method.clone(),
                r.d,
            )) {
                out.push(SummaryRow {
                    model: label,
                    ..r.clone()
                });
            }
        }
    }
    out
}

fn slug(label: &str) -> String {
    let s: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    s.split('-')
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

/// Sort key of a model label: initialized first, then pretrained, then anything else.
fn model_rank(label: &str) -> (usize, String) {
    let r = if label.starts_with("initialized") {
        0
    } else if label.starts_with("pretrained") {
        1
    } else {
        2
    };
    (r, label.to_string())
}

/// The model labels in the rows, initialized first.
pub fn models(rows: &[SummaryRow]) -> Vec<String> {
    let set: BTreeSet<(usize, String)> = rows.iter().map(|r| model_rank(&r.model)).collect();
    set.into_iter().map(|(_, m)| m).collect()
}

pub const PAPER_LENGTHS: [usize; 4] = [512, 1024, 2048, 4096];

/// Whether any of `methods` has a finite mean at (model, n).
fn has_data(rows: &[SummaryRow], model: &str, n: usize, methods: &[&str]) -> bool {
    rows.iter().any(|r| {
        r.model == model && r.n == n && methods.contains(&r.method.as_str()) && r.mean.is_finite()
    })
}

/// Panels of the Skyformer figure that have data: (model, n), models initialized first, n ascending.
pub fn skyformer_panels(rows: &[SummaryRow]) -> Vec<(String, usize)> {
    models(rows)
        .into_iter()
        .flat_map(|m| PAPER_LENGTHS.iter().map(move |&n| (m.clone(), n)))
        .filter(|(m, n)| has_data(rows, m, *n, SKYFORMER_FIGURE))
        .collect()
}

/// Panels of the Skeinformer figure that have data, in the paper's order
/// (initialized 1024, initialized 4096, pretrained 1024, pretrained 4096).
pub fn skeinformer_panels(rows: &[SummaryRow]) -> Vec<(String, usize)> {
    models(rows)
        .into_iter()
        .flat_map(|m| [1024, 4096].into_iter().map(move |n| (m.clone(), n)))
        .filter(|(m, n)| has_data(rows, m, *n, SKEINFORMER_FIGURE))
        .collect()
}

/// Row labels and column lengths of a grid holding `panels` (each model one row, the union of
/// their n as columns).
pub fn grid(panels: &[(String, usize)]) -> (Vec<String>, Vec<usize>) {
    let mut models: Vec<String> = vec![];
    for (m, _) in panels {
        if !models.contains(m) {
            models.push(m.clone());
        }
    }
    let ns: BTreeSet<usize> = panels.iter().map(|(_, n)| *n).collect();
    (models, ns.into_iter().collect())
}

/// The lengths n with at least one finite mean for `model`, ascending.
pub fn lengths_of(rows: &[SummaryRow], model: &str) -> Vec<usize> {
    let ns: BTreeSet<usize> = rows
        .iter()
        .filter(|r| r.model == model && r.mean.is_finite())
        .map(|r| r.n)
        .collect();
    ns.into_iter().collect()
}

#[cfg(test)]
mod tests;
