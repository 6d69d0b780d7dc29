//! The one-screen summary printed at the end of a sweep: where the files went and the best
//! method per (model, n, d).

use std::collections::BTreeMap;
use std::path::Path;

use crate::report::summary::SummaryRow;

/// Prints where a finished run's files are (`out`), how many trials it added (`new_trials`) and
/// holds (`total_trials`), and the best method per point of its `summary`.
pub fn print_summary(out: &Path, summary: &[SummaryRow], new_trials: usize, total_trials: usize) {
    eprintln!(
        "{new_trials} new trials ({total_trials} in total) → {}/trials.csv, summary.csv, manifest.json",
        out.display()
    );
    // Oracles (the SVD floor, top-k, the exact kernelized product) are yardsticks, not candidates.
    let oracle = |id: &str| crate::attention::describe(id).is_some_and(|(_, oracle)| oracle);
    let mut best: BTreeMap<(String, usize, usize), (String, f64, f64)> = BTreeMap::new();
    for r in summary {
        if !r.mean.is_finite() || oracle(&r.method) {
            continue;
        }
        let e =
            best.entry((r.model.clone(), r.n, r.d))
                .or_insert((r.method.clone(), r.mean, r.stderr));
        if r.mean < e.1 {
            *e = (r.method.clone(), r.mean, r.stderr);
        }
    }
    if !best.is_empty() {
        let target = match summary.first().map(|r| r.target) {
            Some(crate::attention::Target::Kernelized) => "C·V",
            _ => "O",
        };
        eprintln!(
            "{:<12} {:>6} {:>5}  best method (mean ± SE of ‖{target} − Ô‖₂)",
            "model", "n", "d"
        );
        for ((model, n, d), (m, mean, se)) in best {
            eprintln!("{model:<12} {n:>6} {d:>5}  {m} {mean:.4} ± {se:.4}");
        }
    }
    let flagged: usize = summary.iter().map(|r| r.nonfinite_trials).sum();
    if flagged > 0 {
        eprintln!("warning: {flagged} trials had non-finite errors and are excluded from the means (see nonfinite_trials in summary.csv)");
    }
}

/// Every registered method, one line each: id, family, the masks it has a form for, its target,
/// oracle or randomized, bits per K/V value read (`kv_bits` at n = 2048: the §8 formats, 16 for a
/// restrict-and-renormalise method reading an f16 cache, `-` for methods that read no cache) and
/// what d means (`approx-bench --list-methods`).
pub fn method_table() -> String {
    use crate::attention::{registry, Family, Mask};
    let methods = registry();
    // The id column fits the longest id (kvpress's `observed_attention_press`).
    let w = methods
        .iter()
        .map(|m| m.id().len())
        .max()
        .unwrap_or(6)
        .max(20);
    let mut out = format!(
        "{:<w$} {:<10} {:<12} {:<10} {:<7} {:>7}  {}\n",
        "method", "family", "masks", "target", "kind", "kv_bits", "what d means"
    );
    for m in methods {
        let masks: Vec<&str> = m
            .masks()
            .iter()
            .map(|k| match k {
                Mask::None => "none",
                Mask::Causal => "causal",
            })
            .collect();
        let targets: Vec<String> = m.targets().iter().map(|t| t.to_string()).collect();
        let kind = if m.is_oracle() {
            "oracle"
        } else if m.is_random() {
            "random"
        } else {
            "determ."
        };
        // Restrict-and-renormalise methods read keys from an f16 cache (docs/reference.md §8.5).
        let restricted = matches!(m.family(), Family::Sparse | Family::Prefill);
        let bits = match m.kv_bits(2048) {
            Some(b) => format!("{b:.2}"),
            None if restricted => "16".into(),
            None => "-".into(),
        };
        out.push_str(&format!(
            "{:<w$} {:<10} {:<12} {:<10} {:<7} {:>7}  {}\n",
            m.id(),
            m.family().name(),
            masks.join(","),
            targets.join(","),
            kind,
            bits,
            m.feature_meaning()
        ));
    }
    out.push_str("\npresets: all (every method of --target with a budget d), field, quant (the quantized family), figure, kernelized; under --decode: decode (the §9 methods), kvpress (kvpress's presses), quant, all\n");
    out
}
