//! The published values of both papers' Figure 1 (METHODS.md §4.1 and §4.2, read off the
//! rasters: about ±0.01–0.02 on linear panels, ±1–2 % on log panels, ±0.05 where marked
//! approximate), and the comparison of a run against them.

use crate::report::summary::SummaryRow;

/// One published point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Anchor {
    pub figure: &'static str,
    pub model: &'static str,
    pub n: usize,
    pub method: &'static str,
    pub d: usize,
    pub value: f64,
    /// Hidden or merged marker, extrapolated from the line segments (about ±0.05).
    pub approximate: bool,
}

/// Every anchor point of both figures.
pub const ANCHORS: &[Anchor] = &[
    Anchor { figure: "skyformer", model: "initialized", n: 512, method: "skyformer", d: 16, value: 1.46, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 512, method: "skyformer", d: 32, value: 1.14, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 512, method: "skyformer", d: 64, value: 0.89, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 512, method: "skyformer", d: 128, value: 0.61, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 512, method: "skyformer", d: 256, value: 0.36, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 512, method: "nystromformer", d: 16, value: 1.34, approximate: true },
    Anchor { figure: "skyformer", model: "initialized", n: 512, method: "nystromformer", d: 32, value: 1.34, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 512, method: "nystromformer", d: 64, value: 1.3, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 512, method: "nystromformer", d: 128, value: 1.18, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 512, method: "nystromformer", d: 256, value: 0.93, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 512, method: "performer", d: 16, value: 1.82, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 512, method: "performer", d: 32, value: 1.62, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 512, method: "performer", d: 64, value: 1.45, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 512, method: "performer", d: 128, value: 1.21, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 512, method: "performer", d: 256, value: 1.2, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 512, method: "informer", d: 16, value: 1.32, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 512, method: "informer", d: 32, value: 1.29, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 512, method: "informer", d: 64, value: 1.23, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 512, method: "informer", d: 128, value: 1.11, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 512, method: "informer", d: 256, value: 0.86, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 1024, method: "skyformer", d: 16, value: 2.18, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 1024, method: "skyformer", d: 32, value: 1.74, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 1024, method: "skyformer", d: 64, value: 1.31, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 1024, method: "skyformer", d: 128, value: 0.91, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 1024, method: "skyformer", d: 256, value: 0.54, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 1024, method: "nystromformer", d: 16, value: 2.07, approximate: true },
    Anchor { figure: "skyformer", model: "initialized", n: 1024, method: "nystromformer", d: 32, value: 2.05, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 1024, method: "nystromformer", d: 64, value: 2.04, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 1024, method: "nystromformer", d: 128, value: 2.01, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 1024, method: "nystromformer", d: 256, value: 1.91, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 1024, method: "performer", d: 16, value: 2.56, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 1024, method: "performer", d: 32, value: 1.99, approximate: true },
    Anchor { figure: "skyformer", model: "initialized", n: 1024, method: "performer", d: 64, value: 1.88, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 1024, method: "performer", d: 128, value: 1.8, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 1024, method: "performer", d: 256, value: 1.86, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 1024, method: "informer", d: 16, value: 2.06, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 1024, method: "informer", d: 32, value: 2.03, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 1024, method: "informer", d: 64, value: 1.98, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 1024, method: "informer", d: 128, value: 1.87, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 1024, method: "informer", d: 256, value: 1.67, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 2048, method: "skyformer", d: 16, value: 3.1, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 2048, method: "skyformer", d: 32, value: 2.46, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 2048, method: "skyformer", d: 64, value: 1.92, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 2048, method: "skyformer", d: 128, value: 1.33, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 2048, method: "skyformer", d: 256, value: 0.81, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 2048, method: "nystromformer", d: 16, value: 2.88, approximate: true },
    Anchor { figure: "skyformer", model: "initialized", n: 2048, method: "nystromformer", d: 32, value: 2.86, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 2048, method: "nystromformer", d: 64, value: 2.85, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 2048, method: "nystromformer", d: 128, value: 2.85, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 2048, method: "nystromformer", d: 256, value: 2.75, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 2048, method: "performer", d: 16, value: 4.45, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 2048, method: "performer", d: 32, value: 2.68, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 2048, method: "performer", d: 64, value: 2.65, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 2048, method: "performer", d: 128, value: 2.93, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 2048, method: "performer", d: 256, value: 2.55, approximate: true },
    Anchor { figure: "skyformer", model: "initialized", n: 2048, method: "informer", d: 16, value: 2.88, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 2048, method: "informer", d: 32, value: 2.86, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 2048, method: "informer", d: 64, value: 2.82, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 2048, method: "informer", d: 128, value: 2.74, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 2048, method: "informer", d: 256, value: 2.58, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 4096, method: "skyformer", d: 16, value: 4.7, approximate: true },
    Anchor { figure: "skyformer", model: "initialized", n: 4096, method: "skyformer", d: 32, value: 3.71, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 4096, method: "skyformer", d: 64, value: 2.89, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 4096, method: "skyformer", d: 128, value: 2.01, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 4096, method: "skyformer", d: 256, value: 1.2, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 4096, method: "nystromformer", d: 16, value: 4.67, approximate: true },
    Anchor { figure: "skyformer", model: "initialized", n: 4096, method: "nystromformer", d: 32, value: 4.65, approximate: true },
    Anchor { figure: "skyformer", model: "initialized", n: 4096, method: "nystromformer", d: 64, value: 4.62, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 4096, method: "nystromformer", d: 128, value: 4.64, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 4096, method: "nystromformer", d: 256, value: 4.62, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 4096, method: "performer", d: 16, value: 4.52, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 4096, method: "performer", d: 32, value: 4.32, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 4096, method: "performer", d: 64, value: 4.03, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 4096, method: "performer", d: 128, value: 4.41, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 4096, method: "performer", d: 256, value: 4.13, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 4096, method: "informer", d: 16, value: 4.67, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 4096, method: "informer", d: 32, value: 4.65, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 4096, method: "informer", d: 64, value: 4.62, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 4096, method: "informer", d: 128, value: 4.56, approximate: false },
    Anchor { figure: "skyformer", model: "initialized", n: 4096, method: "informer", d: 256, value: 4.43, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 512, method: "skyformer", d: 16, value: 2.14, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 512, method: "skyformer", d: 32, value: 1.47, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 512, method: "skyformer", d: 64, value: 1.06, approximate: true },
    Anchor { figure: "skyformer", model: "pretrained", n: 512, method: "skyformer", d: 128, value: 0.76, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 512, method: "skyformer", d: 256, value: 0.52, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 512, method: "nystromformer", d: 16, value: 1.15, approximate: true },
    Anchor { figure: "skyformer", model: "pretrained", n: 512, method: "nystromformer", d: 32, value: 1.14, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 512, method: "nystromformer", d: 64, value: 1.08, approximate: true },
    Anchor { figure: "skyformer", model: "pretrained", n: 512, method: "nystromformer", d: 128, value: 0.95, approximate: true },
    Anchor { figure: "skyformer", model: "pretrained", n: 512, method: "nystromformer", d: 256, value: 0.66, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 512, method: "performer", d: 16, value: 1.54, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 512, method: "performer", d: 32, value: 1.25, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 512, method: "performer", d: 64, value: 1.11, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 512, method: "performer", d: 128, value: 1.06, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 512, method: "performer", d: 256, value: 1.07, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 512, method: "informer", d: 16, value: 1.15, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 512, method: "informer", d: 32, value: 1.12, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 512, method: "informer", d: 64, value: 1.06, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 512, method: "informer", d: 128, value: 0.95, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 512, method: "informer", d: 256, value: 0.73, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 1024, method: "skyformer", d: 16, value: 2.53, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 1024, method: "skyformer", d: 32, value: 1.79, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 1024, method: "skyformer", d: 64, value: 1.31, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 1024, method: "skyformer", d: 128, value: 0.98, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 1024, method: "skyformer", d: 256, value: 0.69, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 1024, method: "nystromformer", d: 16, value: 1.5, approximate: true },
    Anchor { figure: "skyformer", model: "pretrained", n: 1024, method: "nystromformer", d: 32, value: 1.47, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 1024, method: "nystromformer", d: 64, value: 1.45, approximate: true },
    Anchor { figure: "skyformer", model: "pretrained", n: 1024, method: "nystromformer", d: 128, value: 1.39, approximate: true },
    Anchor { figure: "skyformer", model: "pretrained", n: 1024, method: "nystromformer", d: 256, value: 1.18, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 1024, method: "performer", d: 16, value: 1.86, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 1024, method: "performer", d: 32, value: 1.56, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 1024, method: "performer", d: 64, value: 1.44, approximate: true },
    Anchor { figure: "skyformer", model: "pretrained", n: 1024, method: "performer", d: 128, value: 1.37, approximate: true },
    Anchor { figure: "skyformer", model: "pretrained", n: 1024, method: "performer", d: 256, value: 1.36, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 1024, method: "informer", d: 16, value: 1.48, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 1024, method: "informer", d: 32, value: 1.46, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 1024, method: "informer", d: 64, value: 1.41, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 1024, method: "informer", d: 128, value: 1.33, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 1024, method: "informer", d: 256, value: 1.18, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 2048, method: "skyformer", d: 16, value: 3.01, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 2048, method: "skyformer", d: 32, value: 2.14, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 2048, method: "skyformer", d: 64, value: 1.64, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 2048, method: "skyformer", d: 128, value: 1.26, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 2048, method: "skyformer", d: 256, value: 0.92, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 2048, method: "nystromformer", d: 16, value: 1.88, approximate: true },
    Anchor { figure: "skyformer", model: "pretrained", n: 2048, method: "nystromformer", d: 32, value: 1.86, approximate: true },
    Anchor { figure: "skyformer", model: "pretrained", n: 2048, method: "nystromformer", d: 64, value: 1.86, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 2048, method: "nystromformer", d: 128, value: 1.83, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 2048, method: "nystromformer", d: 256, value: 1.74, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 2048, method: "performer", d: 16, value: 2.8, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 2048, method: "performer", d: 32, value: 1.8, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 2048, method: "performer", d: 64, value: 1.76, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 2048, method: "performer", d: 128, value: 1.75, approximate: true },
    Anchor { figure: "skyformer", model: "pretrained", n: 2048, method: "performer", d: 256, value: 1.72, approximate: true },
    Anchor { figure: "skyformer", model: "pretrained", n: 2048, method: "informer", d: 16, value: 1.88, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 2048, method: "informer", d: 32, value: 1.85, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 2048, method: "informer", d: 64, value: 1.83, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 2048, method: "informer", d: 128, value: 1.76, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 2048, method: "informer", d: 256, value: 1.66, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 4096, method: "skyformer", d: 16, value: 3.79, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 4096, method: "skyformer", d: 32, value: 2.77, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 4096, method: "skyformer", d: 64, value: 2.16, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 4096, method: "skyformer", d: 128, value: 1.72, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 4096, method: "skyformer", d: 256, value: 1.27, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 4096, method: "nystromformer", d: 16, value: 2.53, approximate: true },
    Anchor { figure: "skyformer", model: "pretrained", n: 4096, method: "nystromformer", d: 32, value: 2.51, approximate: true },
    Anchor { figure: "skyformer", model: "pretrained", n: 4096, method: "nystromformer", d: 64, value: 2.5, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 4096, method: "nystromformer", d: 128, value: 2.49, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 4096, method: "nystromformer", d: 256, value: 2.45, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 4096, method: "performer", d: 16, value: 2.91, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 4096, method: "performer", d: 32, value: 2.66, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 4096, method: "performer", d: 64, value: 2.33, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 4096, method: "performer", d: 128, value: 2.39, approximate: true },
    Anchor { figure: "skyformer", model: "pretrained", n: 4096, method: "performer", d: 256, value: 2.31, approximate: true },
    Anchor { figure: "skyformer", model: "pretrained", n: 4096, method: "informer", d: 16, value: 2.52, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 4096, method: "informer", d: 32, value: 2.5, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 4096, method: "informer", d: 64, value: 2.48, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 4096, method: "informer", d: 128, value: 2.43, approximate: false },
    Anchor { figure: "skyformer", model: "pretrained", n: 4096, method: "informer", d: 256, value: 2.34, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 1024, method: "skeinformer", d: 16, value: 2.02, approximate: true },
    Anchor { figure: "skeinformer", model: "initialized", n: 1024, method: "skeinformer", d: 32, value: 1.99, approximate: true },
    Anchor { figure: "skeinformer", model: "initialized", n: 1024, method: "skeinformer", d: 64, value: 1.89, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 1024, method: "skeinformer", d: 128, value: 1.71, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 1024, method: "skeinformer", d: 256, value: 1.37, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 1024, method: "vmean", d: 16, value: 2.08, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 1024, method: "vmean", d: 32, value: 2.08, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 1024, method: "vmean", d: 64, value: 2.08, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 1024, method: "vmean", d: 128, value: 2.08, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 1024, method: "vmean", d: 256, value: 2.08, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 1024, method: "informer", d: 16, value: 2.06, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 1024, method: "informer", d: 32, value: 2.03, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 1024, method: "informer", d: 64, value: 1.98, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 1024, method: "informer", d: 128, value: 1.87, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 1024, method: "informer", d: 256, value: 1.67, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 1024, method: "linformer", d: 16, value: 34.2, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 1024, method: "linformer", d: 32, value: 30.0, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 1024, method: "linformer", d: 64, value: 27.7, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 1024, method: "linformer", d: 128, value: 26.2, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 1024, method: "linformer", d: 256, value: 25.5, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 4096, method: "skeinformer", d: 16, value: 4.65, approximate: true },
    Anchor { figure: "skeinformer", model: "initialized", n: 4096, method: "skeinformer", d: 32, value: 4.62, approximate: true },
    Anchor { figure: "skeinformer", model: "initialized", n: 4096, method: "skeinformer", d: 64, value: 4.56, approximate: true },
    Anchor { figure: "skeinformer", model: "initialized", n: 4096, method: "skeinformer", d: 128, value: 4.46, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 4096, method: "skeinformer", d: 256, value: 4.24, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 4096, method: "vmean", d: 16, value: 4.72, approximate: true },
    Anchor { figure: "skeinformer", model: "initialized", n: 4096, method: "vmean", d: 32, value: 4.72, approximate: true },
    Anchor { figure: "skeinformer", model: "initialized", n: 4096, method: "vmean", d: 64, value: 4.72, approximate: true },
    Anchor { figure: "skeinformer", model: "initialized", n: 4096, method: "vmean", d: 128, value: 4.72, approximate: true },
    Anchor { figure: "skeinformer", model: "initialized", n: 4096, method: "vmean", d: 256, value: 4.72, approximate: true },
    Anchor { figure: "skeinformer", model: "initialized", n: 4096, method: "informer", d: 16, value: 4.67, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 4096, method: "informer", d: 32, value: 4.66, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 4096, method: "informer", d: 64, value: 4.62, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 4096, method: "informer", d: 128, value: 4.56, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 4096, method: "informer", d: 256, value: 4.44, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 4096, method: "linformer", d: 16, value: 104.0, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 4096, method: "linformer", d: 32, value: 82.4, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 4096, method: "linformer", d: 64, value: 67.8, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 4096, method: "linformer", d: 128, value: 58.2, approximate: false },
    Anchor { figure: "skeinformer", model: "initialized", n: 4096, method: "linformer", d: 256, value: 54.3, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 1024, method: "skeinformer", d: 16, value: 1.46, approximate: true },
    Anchor { figure: "skeinformer", model: "pretrained", n: 1024, method: "skeinformer", d: 32, value: 1.44, approximate: true },
    Anchor { figure: "skeinformer", model: "pretrained", n: 1024, method: "skeinformer", d: 64, value: 1.35, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 1024, method: "skeinformer", d: 128, value: 1.22, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 1024, method: "skeinformer", d: 256, value: 0.98, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 1024, method: "vmean", d: 16, value: 1.5, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 1024, method: "vmean", d: 32, value: 1.5, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 1024, method: "vmean", d: 64, value: 1.5, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 1024, method: "vmean", d: 128, value: 1.5, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 1024, method: "vmean", d: 256, value: 1.5, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 1024, method: "informer", d: 16, value: 1.48, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 1024, method: "informer", d: 32, value: 1.46, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 1024, method: "informer", d: 64, value: 1.41, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 1024, method: "informer", d: 128, value: 1.33, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 1024, method: "informer", d: 256, value: 1.18, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 1024, method: "linformer", d: 16, value: 23.8, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 1024, method: "linformer", d: 32, value: 19.2, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 1024, method: "linformer", d: 64, value: 16.0, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 1024, method: "linformer", d: 128, value: 14.2, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 1024, method: "linformer", d: 256, value: 13.4, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 4096, method: "skeinformer", d: 16, value: 2.51, approximate: true },
    Anchor { figure: "skeinformer", model: "pretrained", n: 4096, method: "skeinformer", d: 32, value: 2.5, approximate: true },
    Anchor { figure: "skeinformer", model: "pretrained", n: 4096, method: "skeinformer", d: 64, value: 2.45, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 4096, method: "skeinformer", d: 128, value: 2.38, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 4096, method: "skeinformer", d: 256, value: 2.25, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 4096, method: "vmean", d: 16, value: 2.55, approximate: true },
    Anchor { figure: "skeinformer", model: "pretrained", n: 4096, method: "vmean", d: 32, value: 2.55, approximate: true },
    Anchor { figure: "skeinformer", model: "pretrained", n: 4096, method: "vmean", d: 64, value: 2.55, approximate: true },
    Anchor { figure: "skeinformer", model: "pretrained", n: 4096, method: "vmean", d: 128, value: 2.55, approximate: true },
    Anchor { figure: "skeinformer", model: "pretrained", n: 4096, method: "vmean", d: 256, value: 2.55, approximate: true },
    Anchor { figure: "skeinformer", model: "pretrained", n: 4096, method: "informer", d: 16, value: 2.53, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 4096, method: "informer", d: 32, value: 2.51, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 4096, method: "informer", d: 64, value: 2.48, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 4096, method: "informer", d: 128, value: 2.43, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 4096, method: "informer", d: 256, value: 2.34, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 4096, method: "linformer", d: 16, value: 89.2, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 4096, method: "linformer", d: 32, value: 65.2, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 4096, method: "linformer", d: 64, value: 47.1, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 4096, method: "linformer", d: 128, value: 35.7, approximate: false },
    Anchor { figure: "skeinformer", model: "pretrained", n: 4096, method: "linformer", d: 256, value: 30.3, approximate: false },
];

/// A reproduced point next to its anchor.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub anchor: Anchor,
    pub mean: f64,
    pub stderr: f64,
    /// mean / anchor.
    pub ratio: f64,
}

/// Matches summary rows (of one model kind) to the anchors.
pub fn compare(rows: &[SummaryRow]) -> Vec<Comparison> {
    ANCHORS
        .iter()
        .filter_map(|a| {
            rows.iter()
                .find(|r| r.model == a.model && r.n == a.n && r.method == a.method && r.d == a.d && r.mean.is_finite())
                .map(|r| Comparison { anchor: *a, mean: r.mean, stderr: r.stderr, ratio: r.mean / a.value })
        })
        .collect()
}

/// The calibration criterion: the weighted median of |ln(mean/anchor)| over the matched points,
/// with Informer and V-Mean weighted 3 (the least random methods, and shared by both figures)
/// and every other method 1; points marked approximate count half.
pub fn calibration_score(cmp: &[Comparison]) -> Option<f64> {
    let mut w: Vec<(f64, f64)> = cmp
        .iter()
        .map(|c| {
            let base = if matches!(c.anchor.method, "informer" | "vmean") { 3.0 } else { 1.0 };
            (c.ratio.ln().abs(), if c.anchor.approximate { base / 2.0 } else { base })
        })
        .collect();
    if w.is_empty() {
        return None;
    }
    w.sort_by(|a, b| a.0.partial_cmp(&b.0).expect("finite"));
    let total: f64 = w.iter().map(|x| x.1).sum();
    let mut acc = 0.0;
    for (v, wt) in &w {
        acc += wt;
        if acc >= total / 2.0 {
            return Some(*v);
        }
    }
    w.last().map(|x| x.0)
}

/// Markdown table of the comparisons: figure, panel, method, d, anchor, mean ± SE, ratio.
pub fn markdown_table(cmp: &[Comparison]) -> String {
    let mut s = String::from("| figure | panel | method | d | published | reproduced (mean ± SE) | ratio |\n|---|---|---|---|---|---|---|\n");
    for c in cmp {
        let a = &c.anchor;
        s.push_str(&format!(
            "| {} | {} n={} | {} | {} | {}{:.2} | {:.3} ± {:.3} | {:.2} |\n",
            a.figure, a.model, a.n, a.method, a.d, if a.approximate { "≈" } else { "" }, a.value, c.mean, c.stderr, c.ratio
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_are_complete_and_informer_agrees_across_figures() {
        // 8 panels × 4 methods × 5 d + 4 panels × 4 methods × 5 d.
        assert_eq!(ANCHORS.len(), 160 + 80);
        // METHODS.md §4.3: Informer's values are the same in both figures within 0.01.
        for a in ANCHORS.iter().filter(|a| a.figure == "skeinformer" && a.method == "informer") {
            let b = ANCHORS.iter().find(|b| b.figure == "skyformer" && b.method == "informer" && b.model == a.model && b.n == a.n && b.d == a.d).unwrap();
            assert!((a.value - b.value).abs() <= 0.011, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn score_is_zero_for_a_perfect_match_and_symmetric_in_log_ratio() {
        let row = |m: &str, d, mean| SummaryRow {
            model: "initialized".into(), n: 1024, method: m.into(), d, trials: 10, mean, stderr: 0.01, rel_mean: 0.1,
            rel_stderr: 0.0, nonfinite_trials: 0, flagged_trials: 0, macs: 0.0, seconds_mean: 0.0,
        };
        let exact: Vec<SummaryRow> = ANCHORS.iter().filter(|a| a.model == "initialized" && a.n == 1024).map(|a| row(a.method, a.d, a.value)).collect();
        let cmp = compare(&exact);
        assert_eq!(calibration_score(&cmp), Some(0.0));
        let double: Vec<SummaryRow> = exact.iter().map(|r| SummaryRow { mean: r.mean * 2.0, ..r.clone() }).collect();
        let half: Vec<SummaryRow> = exact.iter().map(|r| SummaryRow { mean: r.mean / 2.0, ..r.clone() }).collect();
        let (a, b) = (calibration_score(&compare(&double)).unwrap(), calibration_score(&compare(&half)).unwrap());
        assert!((a - 2f64.ln()).abs() < 1e-12 && (b - 2f64.ln()).abs() < 1e-12);
    }
}
