//! Looks: the embedded font, the papers' line styles, a distinct style per method for the
//! all-methods figures, and display names.

use std::sync::OnceLock;

use anyhow::{anyhow, Result};
use plotters::style::{FontStyle, RGBColor};

use crate::attention::{self, Family, Mask};
use crate::report::summary::SummaryRow;

/// DejaVu Sans (assets/LICENSE-DejaVu.txt): figures render the same without system fonts.
static DEJAVU_SANS: &[u8] = include_bytes!("../../../assets/DejaVuSans.ttf");

/// The family every text style in the figures uses (registered by [`ensure_font`]).
pub const FONT: &str = "sans-serif";

/// Registers the embedded font with plotters' ab_glyph text support (once per process).
pub fn ensure_font() -> Result<()> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        [FontStyle::Normal, FontStyle::Bold]
            .into_iter()
            .all(|s| plotters::style::register_font(FONT, s, DEJAVU_SANS).is_ok())
    });
    if ok {
        Ok(())
    } else {
        Err(anyhow!(
            "the embedded font assets/DejaVuSans.ttf could not be loaded"
        ))
    }
}

/// Point marker shapes, drawn in pixel units around the data point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    None,
    /// Small filled circle (the papers' "dots").
    Dot,
    Square,
    TriUp,
    /// ▼ (the papers' Informer / Linformer marker).
    TriDown,
    Diamond,
    Cross,
    Plus,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SeriesStyle {
    pub color: RGBColor,
    pub dashed: bool,
    pub width: u32,
    pub marker: Marker,
}

const RED: RGBColor = RGBColor(214, 39, 40);
const BLUE: RGBColor = RGBColor(31, 90, 200);
const BLACK: RGBColor = RGBColor(0, 0, 0);
pub const GREY: RGBColor = RGBColor(165, 165, 165);

const fn st(color: RGBColor, dashed: bool, marker: Marker) -> SeriesStyle {
    SeriesStyle {
        color,
        dashed,
        width: 3,
        marker,
    }
}

/// Skyformer Fig. 1: Skyformer red solid; Nyströmformer blue dashed with dots; Performer black
/// dashed with dots; Informer blue solid with ▼ (docs/reference.md §4.1).
pub fn skyformer_style(method: &str) -> Option<SeriesStyle> {
    Some(match method {
        "skyformer" => st(RED, false, Marker::None),
        "nystromformer" => st(BLUE, true, Marker::Dot),
        "performer" => st(BLACK, true, Marker::Dot),
        "informer" => st(BLUE, false, Marker::TriDown),
        _ => return None,
    })
}

/// Skeinformer Fig. 1: Skeinformer red solid; V-Mean blue dashed with dots; Informer black
/// dashed with dots; Linformer blue solid with ▼ (docs/reference.md §4.2).
pub fn skeinformer_style(method: &str) -> Option<SeriesStyle> {
    Some(match method {
        "skeinformer" => st(RED, false, Marker::None),
        "vmean" => st(BLUE, true, Marker::Dot),
        "informer" => st(BLACK, true, Marker::Dot),
        "linformer" => st(BLUE, false, Marker::TriDown),
        _ => return None,
    })
}

/// The floor: the best rank-d approximation (SVD), drawn as a plain grey line.
pub fn floor_style() -> SeriesStyle {
    SeriesStyle {
        color: GREY,
        dashed: false,
        width: 6,
        marker: Marker::None,
    }
}

/// A fixed, distinct style per method id (families share a hue; variants differ in dash/marker).
pub fn all_methods_style(method: &str, unknown_index: usize) -> SeriesStyle {
    let c = |r, g, b| RGBColor(r, g, b);
    match method {
        "svd_optimal" => floor_style(),
        "skyformer" => st(RED, false, Marker::Dot),
        "skyformer_iter" => st(c(255, 120, 110), true, Marker::Square),
        "nystromformer" => st(BLUE, true, Marker::Dot),
        "performer" => st(BLACK, true, Marker::Dot),
        "performer_favor" => st(c(90, 90, 90), false, Marker::Cross),
        "informer" => st(c(23, 170, 200), false, Marker::TriDown),
        "informer_mask" => st(c(23, 170, 200), true, Marker::TriUp),
        "skeinformer" => st(c(255, 127, 14), false, Marker::Diamond),
        "skein_uniform" => st(c(200, 150, 0), true, Marker::Square),
        "skein_nonorm" => st(c(230, 90, 0), true, Marker::TriUp),
        "skein_simplenorm" => st(c(190, 110, 60), true, Marker::Plus),
        "skein_nopilot" => st(c(255, 170, 80), true, Marker::Cross),
        // References (issue 13): grey, whatever their family.
        "vmean" => st(c(128, 128, 128), true, Marker::Square),
        "topk" => st(c(150, 150, 150), true, Marker::Diamond),
        "linformer" => st(c(44, 160, 44), false, Marker::TriDown),
        "linformer_jlt" => st(c(44, 160, 44), true, Marker::TriUp),
        "column_uniform" => st(c(227, 119, 194), false, Marker::Plus),
        // Features: Performer's greys and blacks.
        "performer_trig" => st(c(60, 60, 60), true, Marker::TriUp),
        // Sparse and hashing: teals.
        "window" => st(c(0, 128, 128), false, Marker::Square),
        "bigbird" => st(c(60, 170, 140), true, Marker::TriUp),
        "reformer" => st(c(0, 90, 90), true, Marker::Cross),
        // Sampling with guarantees: Skeinformer's oranges and Informer's cyans.
        "hyperattention" => st(c(210, 160, 0), false, Marker::TriDown),
        "kdeformer" => st(c(0, 120, 200), true, Marker::Diamond),
        // Hybrid: magenta.
        "scatterbrain" => st(c(190, 0, 120), false, Marker::Dot),
        "scatterbrain_local" => st(c(190, 0, 120), true, Marker::Cross),
        // The kernelized target (§6.4): its reference grey, Skyformer's reds, Performer's black.
        "zero" => st(c(128, 128, 128), true, Marker::Square),
        "exact_kernelized" => floor_style(),
        "skyformer_gauss" => st(RED, false, Marker::Dot),
        "skyformer_gauss_iter" => st(c(255, 120, 110), true, Marker::Square),
        "performer_gauss" => st(BLACK, true, Marker::Dot),
        "rff_gauss" => st(c(0, 128, 128), false, Marker::Diamond),
        _ => {
            const EXTRA: [RGBColor; 5] = [
                RGBColor(140, 86, 75),
                RGBColor(188, 189, 34),
                RGBColor(0, 128, 128),
                RGBColor(120, 0, 160),
                RGBColor(160, 0, 60),
            ];
            const MARKS: [Marker; 4] = [
                Marker::Square,
                Marker::Diamond,
                Marker::TriUp,
                Marker::Cross,
            ];
            st(
                EXTRA[unknown_index % EXTRA.len()],
                unknown_index / EXTRA.len() % 2 == 1,
                MARKS[unknown_index % MARKS.len()],
            )
        }
    }
}

/// The order in which legends list methods: the registry order, unknown ids last by name.
pub fn method_rank(method: &str) -> (usize, String) {
    static ORDER: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    let order = ORDER.get_or_init(crate::attention::method_ids);
    (
        order
            .iter()
            .position(|m| *m == method)
            .unwrap_or(order.len()),
        method.to_string(),
    )
}

/// Legend label of a method id in a figure of `mask`'s runs: under the causal mask `topk` keeps d
/// keys per query, not 2d (docs/reference.md §7.3).
pub fn method_label_under(method: &str, mask: Mask) -> String {
    match (method, mask) {
        ("topk", Mask::Causal) => "Top-d keys (oracle)".into(),
        _ => method_label(method),
    }
}

/// Legend label of a method id.
pub fn method_label(method: &str) -> String {
    match method {
        "skyformer" => "Skyformer",
        "skyformer_iter" => "Skyformer (iterative inverse)",
        "nystromformer" => "Nyströmformer",
        "performer" => "Performer",
        "performer_favor" => "Performer (textbook FAVOR+)",
        "informer" => "Informer",
        "informer_mask" => "Informer (mask variant, u = d)",
        "skeinformer" => "Skeinformer",
        "skein_uniform" => "Skeinformer (uniform columns)",
        "skein_nonorm" => "Skeinformer (no normalisation)",
        "skein_simplenorm" => "Skeinformer (simple normalisation)",
        "skein_nopilot" => "Skeinformer (no pilot reuse)",
        "vmean" => "V-Mean",
        "linformer" => "Linformer",
        "linformer_jlt" => "Linformer (unreduced JLT)",
        "column_uniform" => "Column sampling (uniform)",
        "svd_optimal" => "SVD optimum (floor)",
        "topk" => "Top-2d keys (oracle)",
        "window" => "Sliding window",
        "bigbird" => "BigBird",
        "reformer" => "Reformer (LSH)",
        "performer_trig" => "Performer (trigonometric features)",
        "hyperattention" => "HyperAttention",
        "kdeformer" => "KDEformer",
        "scatterbrain" => "Scatterbrain",
        "scatterbrain_local" => "Scatterbrain (local + low rank)",
        "exact_kernelized" => "Exact C·V (run dtype)",
        "zero" => "Zero (Ô = 0)",
        "skyformer_gauss" => "Skyformer (Gaussian kernel)",
        "skyformer_gauss_iter" => "Skyformer (Gaussian kernel, iterative inverse)",
        "performer_gauss" => "Positive random features",
        "rff_gauss" => "Random Fourier features",
        other => other,
    }
    .to_string()
}

/// A method's family and whether it is drawn as a reference (grey): V-Mean, `zero` and the
/// oracles. A user's method is `(User, false)`.
fn family_of(method: &str) -> (Family, bool) {
    attention::describe(method).map_or((Family::User, false), |(family, oracle)| {
        (family, family == Family::Reference || oracle)
    })
}

/// Whether `method` is a registered oracle (`svd_optimal`, `topk`, `exact_kernelized`).
pub(super) fn is_oracle(method: &str) -> bool {
    attention::describe(method).is_some_and(|(_, oracle)| oracle)
}

/// One hue per family, shades and markers for its members; references grey; a user's method
/// black (it is what the figure is about).
pub(super) fn field_style(method: &str, methods: &[String]) -> SeriesStyle {
    const MARKS: [Marker; 6] = [
        Marker::Dot,
        Marker::Square,
        Marker::TriUp,
        Marker::Diamond,
        Marker::TriDown,
        Marker::Cross,
    ];
    let palette = |f: Family| -> &'static [RGBColor] {
        match f {
            Family::LowRank => &[
                RGBColor(214, 39, 40),
                RGBColor(160, 20, 30),
                RGBColor(255, 110, 100),
                RGBColor(120, 0, 0),
            ],
            Family::Features => &[
                RGBColor(31, 90, 200),
                RGBColor(90, 150, 240),
                RGBColor(10, 40, 120),
            ],
            Family::Sampling => &[
                RGBColor(44, 160, 44),
                RGBColor(0, 100, 0),
                RGBColor(120, 200, 90),
                RGBColor(20, 130, 100),
            ],
            Family::Sparse => &[
                RGBColor(148, 60, 190),
                RGBColor(90, 20, 140),
                RGBColor(200, 130, 230),
            ],
            Family::Hybrid => &[RGBColor(230, 130, 0), RGBColor(170, 90, 0)],
            Family::Prefill => &[
                RGBColor(23, 190, 207),
                RGBColor(0, 120, 140),
                RGBColor(140, 86, 75),
                RGBColor(188, 189, 34),
            ],
            // The decode family (§9): blues and greens, the oracles grey elsewhere.
            Family::Decode => &[
                RGBColor(31, 119, 180),
                RGBColor(255, 127, 14),
                RGBColor(60, 180, 75),
                RGBColor(170, 220, 120),
                RGBColor(230, 25, 75),
                RGBColor(145, 30, 180),
                RGBColor(70, 70, 200),
                RGBColor(240, 50, 230),
                RGBColor(0, 128, 128),
                // With kvpress's presses (issue 58) the family has 19 methods: two more colours
                // keep them within two cycles (solid, then dashed).
                RGBColor(128, 0, 0),
                RGBColor(0, 0, 128),
            ],
            // The quantized family (one colour each, registry order): the float caches in
            // browns, llama.cpp's blocks from orange (8 bits) to deep red (4), KIVI in olive,
            // SageAttention in magentas.
            Family::Quantized => &[
                RGBColor(140, 86, 75),
                RGBColor(196, 156, 148),
                RGBColor(90, 50, 30),
                RGBColor(255, 170, 60),
                RGBColor(250, 120, 30),
                RGBColor(230, 85, 13),
                RGBColor(200, 40, 20),
                RGBColor(150, 0, 0),
                RGBColor(150, 150, 0),
                RGBColor(90, 100, 0),
                RGBColor(230, 90, 200),
                RGBColor(180, 0, 140),
                RGBColor(110, 0, 90),
            ],
            // Two greys: the references differ by marker, and past six markers by shade.
            Family::Reference => &[RGBColor(150, 150, 150), RGBColor(70, 70, 70)],
            Family::User => &[RGBColor(0, 0, 0)],
        }
    };
    let (family, reference) = family_of(method);
    if method == "svd_optimal" || method == "exact_kernelized" {
        return floor_style();
    }
    // The method's index among the drawn methods of its family, for shade, dash and marker; a
    // reference's among the references, which all share one grey (so V-Mean and an oracle of
    // another family, `h2o` beside `vmean`, never share a marker too).
    let same: Vec<&String> = methods
        .iter()
        .filter(|m| {
            let (f, r) = family_of(m);
            if reference {
                r
            } else {
                f == family
            }
        })
        .collect();
    let i = same.iter().position(|m| *m == method).unwrap_or(0);
    let colors = if reference {
        palette(Family::Reference)
    } else {
        palette(family)
    };
    let shade = if reference { i / MARKS.len() } else { i };
    SeriesStyle {
        color: colors[shade % colors.len()],
        dashed: reference || (i / colors.len()) % 2 == 1,
        width: if reference { 2 } else { 3 },
        marker: MARKS[i % MARKS.len()],
    }
}

/// The methods present for `model`, ordered by family then registry order, references last
/// in the legend (drawn first, under the others).
pub(super) fn ordered_methods(rows: &[SummaryRow], model: &str) -> (Vec<String>, Vec<String>) {
    let mut ms: Vec<(bool, Family, usize, String)> = vec![];
    for r in rows.iter().filter(|r| r.model == model) {
        if ms.iter().any(|m| m.3 == r.method) {
            continue;
        }
        let (family, reference) = family_of(&r.method);
        ms.push((
            reference,
            family,
            method_rank(&r.method).0,
            r.method.clone(),
        ));
    }
    ms.sort();
    let legend: Vec<String> = ms.iter().map(|m| m.3.clone()).collect();
    let mut draw = legend.clone();
    draw.sort_by_key(|m| !ms.iter().any(|x| x.3 == *m && x.0)); // references first
    (legend, draw)
}
