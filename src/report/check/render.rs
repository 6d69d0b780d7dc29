//! The check's output: a plain-text table for the terminal and a markdown report, worst first.

use std::fmt::Write;

use super::{CheckReport, PointResult, SideStat, Status, Test, EXACT_REL_TOL};

/// A number with 4 significant digits (fixed notation for moderate magnitudes); "—" for NaN.
pub fn num(x: f64) -> String {
    if x.is_nan() {
        return "—".into();
    }
    if x == 0.0 {
        return "0".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "∞".into() } else { "-∞".into() };
    }
    let a = x.abs();
    if (1e-3..1e5).contains(&a) {
        let decimals = (3 - a.log10().floor() as i32).max(0) as usize;
        format!("{x:.decimals$}")
    } else {
        format!("{x:.3e}")
    }
}

/// A relative difference in scientific notation, or "0".
pub fn rel(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else {
        format!("{x:.2e}")
    }
}

/// A number with all 17 significant digits (for trial-level comparisons).
pub fn full(x: f64) -> String {
    format!("{x:.16e}")
}

fn signed(x: f64) -> String {
    if x.is_finite() && x > 0.0 {
        format!("+{}", num(x))
    } else {
        num(x)
    }
}

fn side(s: &Option<SideStat>) -> String {
    match s {
        Some(s) => format!("{} ± {}", num(s.mean), num(s.se)),
        None => "—".into(),
    }
}

fn test_text(p: &PointResult) -> String {
    let q = |p: &PointResult| {
        if p.df.is_finite() {
            format!("t{}={:.2}", p.df.floor(), p.critical)
        } else {
            format!("z={:.2}", p.critical)
        }
    };
    match &p.test {
        Test::Paired { pairs } => format!("paired k={pairs}, {}", q(p)),
        Test::Unpaired => format!("unpaired, {}", q(p)),
        Test::Exact { worst_rel } => format!("exact, worst rel {}", rel(*worst_rel)),
        Test::None => "—".into(),
    }
}

fn bound_text(p: &PointResult) -> String {
    match p.test {
        Test::Exact { .. } => format!("rel {EXACT_REL_TOL:.0e}"),
        _ => num(p.bound),
    }
}

const HEADERS: [&str; 10] = [
    "status",
    "model",
    "n",
    "method",
    "d",
    "baseline mean ± SE",
    "current mean ± SE",
    "difference",
    "bound",
    "test",
];

fn cells(p: &PointResult) -> [String; 10] {
    [
        p.status.label().to_string(),
        p.model.clone(),
        p.n.to_string(),
        p.method.clone(),
        p.d.to_string(),
        side(&p.baseline),
        side(&p.current),
        signed(p.difference),
        bound_text(p),
        test_text(p),
    ]
}

fn scope(r: &CheckReport) -> String {
    let o = &r.options;
    if o.exact {
        format!("trial-level equality of the error within {EXACT_REL_TOL:.0e} relative (--exact)")
    } else {
        format!(
            "{} points compared; family-wise false-positive rate α = {} (Bonferroni, {}); slack {} % of the baseline mean",
            r.compared,
            o.alpha,
            if o.two_sided { "two-sided" } else { "one-sided: improvements are reported, not failed" },
            o.slack * 100.0
        )
    }
}

fn verdict(r: &CheckReport) -> String {
    let mut parts = Vec::new();
    for (s, what) in [
        (Status::Regression, "regression"),
        (Status::ExactMismatch, "not exact"),
        (Status::NewNonFinite, "new non-finite"),
        (Status::Missing, "missing"),
        (Status::Improvement, "improved"),
        (Status::Dropped, "dropped"),
        (Status::New, "new"),
        (Status::NotComparable, "not comparable"),
        (Status::Pass, "ok"),
    ] {
        let k = r.count(s);
        if k > 0 {
            parts.push(format!("{k} {what}"));
        }
    }
    let nonfinite_extra = r
        .points
        .iter()
        .filter(|p| p.status != Status::NewNonFinite && p.notes.iter().any(|n| n.contains("rose")))
        .count();
    if nonfinite_extra > 0 {
        parts.push(format!("{nonfinite_extra} more with new non-finite trials"));
    }
    let config = r.findings.iter().filter(|f| f.failing).count();
    if config > 0 {
        parts.push(format!("{config} failing finding(s)"));
    }
    format!(
        "{} (exit {}): {}",
        if r.failed() { "FAIL" } else { "PASS" },
        r.exit_code(),
        parts.join(", ")
    )
}

/// The terminal table, with findings above it and per-point notes and the verdict below.
pub fn table(r: &CheckReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "approx-bench check: baseline {} → current {}",
        r.baseline.display(),
        r.current.display()
    );
    let _ = writeln!(s, "{}", scope(r));
    for f in &r.findings {
        let kind = if f.failing {
            f.kind.to_uppercase()
        } else {
            f.kind.to_string()
        };
        let _ = writeln!(s, "{kind}: {}", f.message);
    }
    let rows: Vec<[String; 10]> = r.points.iter().map(cells).collect();
    let mut width = HEADERS.map(|h| h.chars().count());
    for row in &rows {
        for (w, c) in width.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cols: &[String]| {
        let mut l = String::new();
        for (i, (c, w)) in cols.iter().zip(width).enumerate() {
            let pad = w - c.chars().count();
            // Text columns left-aligned, numbers right-aligned.
            if matches!(i, 0 | 1 | 3 | 9) {
                l.push_str(c);
                l.push_str(&" ".repeat(pad));
            } else {
                l.push_str(&" ".repeat(pad));
                l.push_str(c);
            }
            l.push_str("  ");
        }
        l.trim_end().to_string()
    };
    let _ = writeln!(s, "{}", line(&HEADERS.map(String::from)));
    for row in &rows {
        let _ = writeln!(s, "{}", line(row));
    }
    let notes = note_lines(r);
    if !notes.is_empty() {
        let _ = writeln!(s, "notes:");
        for n in notes {
            let _ = writeln!(s, "  {n}");
        }
    }
    if let Some(w) = worst_trial_text(r) {
        let _ = writeln!(s, "worst trial: {w}");
    }
    let _ = writeln!(s, "{}", verdict(r));
    s
}

/// The markdown report: verdict, scope, findings, the table, notes and how the bound is made.
pub fn markdown(r: &CheckReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# approx-bench check: {}\n",
        if r.failed() { "FAIL" } else { "PASS" }
    );
    let _ = writeln!(s, "- baseline: `{}`", r.baseline.display());
    let _ = writeln!(s, "- current: `{}`", r.current.display());
    let _ = writeln!(s, "- {}", scope(r));
    let _ = writeln!(s, "- **{}**\n", verdict(r));
    if !r.findings.is_empty() {
        let _ = writeln!(s, "## Findings\n");
        for f in &r.findings {
            let _ = writeln!(
                s,
                "- {}{}: {}",
                f.kind,
                if f.failing { " (fails the check)" } else { "" },
                f.message
            );
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(s, "## Points, worst first\n");
    let _ = writeln!(s, "| {} |", HEADERS.join(" | "));
    let _ = writeln!(s, "|{}", " --- |".repeat(HEADERS.len()));
    for p in &r.points {
        let mut c = cells(p);
        if p.failing {
            c[0] = format!("**{}**", c[0]);
        }
        let _ = writeln!(s, "| {} |", c.join(" | "));
    }
    let notes = note_lines(r);
    if !notes.is_empty() {
        let _ = writeln!(s, "\n## Notes\n");
        for n in notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    if let Some(w) = worst_trial_text(r) {
        let _ = writeln!(s, "\nWorst trial: {w}.");
    }
    let _ = writeln!(
        s,
        "\n## How the bound is made\n\n\
         difference = current − baseline mean of ‖O − Ô‖₂. A point regresses when difference > q·SE + slack·|baseline mean|, \
         and improves when difference < −(q·SE + slack·|baseline mean|). \
         *paired*: SE is the standard error of the per-trial differences matched on (window, head), used when both runs have \
         trials.csv with the same trials for the point (shared window/head variation cancels; a deterministic method has SE = 0). \
         *unpaired*: SE = √(SE_b² + SE_c²) from the summaries. q is the upper α/m quantile (α/2m two-sided) of Student's t with \
         the test's degrees of freedom (pairs − 1, or Welch–Satterthwaite), shown as t<df>; with many trials it is \
         z = Φ⁻¹(1 − α/m), shown as z."
    );
    s
}

/// "model n=… method d=…: notes" for every point with notes (shared by the text and markdown reports).
fn note_lines(r: &CheckReport) -> Vec<String> {
    r.points
        .iter()
        .filter(|p| !p.notes.is_empty())
        .map(|p| {
            format!(
                "{} n={} {} d={}: {}",
                p.model,
                p.n,
                p.method,
                p.d,
                p.notes.join("; ")
            )
        })
        .collect()
}

/// The worst trial of `--exact`, as one sentence without the leading label.
fn worst_trial_text(r: &CheckReport) -> Option<String> {
    r.worst_trial.as_ref().map(|w| {
        format!(
            "{} n={} {} d={} window {} head {}: {} → {} (relative {})",
            w.point.0,
            w.point.1,
            w.point.2,
            w.point.3,
            w.window,
            w.head,
            full(w.baseline),
            full(w.current),
            rel(w.rel)
        )
    })
}
