//! End-to-end tests of `approx-bench check` on two tiny sweeps of the self-made fixtures.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::*;

/// A tiny sweep into `out` (initialized weights, V-Mean, 2 lengths × 2 windows × 4 heads × 2 d).
fn sweep(model: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec![
        "--lengths",
        "16,20",
        "--windows",
        "2",
        "--methods",
        "vmean",
        "--features",
        "4,8",
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ];
    args.extend_from_slice(extra);
    let o = sweep_tiny(model, &args);
    assert!(o.status.success(), "sweep failed: {}", stderr(&o));
}

/// `approx-bench check` with `args`, run in the working directory `cwd` (where the report goes by
/// default when --current is given).
fn check_in(cwd: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let mut all = vec!["check"];
    all.extend_from_slice(args);
    let o = run_in(cwd, &all);
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr(&o),
    )
}

#[test]
fn identical_runs_pass_an_edited_baseline_fails_and_bad_files_are_usage_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(&tmp.path().join("m"), false);
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    sweep(&model, &a, &[]);
    sweep(&model, &b, &[]);
    let (sa, sb) = (a.to_str().unwrap(), b.to_str().unwrap());
    let cwd = tmp.path().join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    let check = |args: &[&str]| check_in(&cwd, args);

    // Identical runs: exit 0, paired test, markdown report in the working directory.
    let (code, out, err) = check(&["--baseline", sa, "--current", sb]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains("paired k=8") && out.contains("PASS (exit 0): 4 ok"),
        "{out}"
    );
    let md = std::fs::read_to_string(cwd.join("check.md")).unwrap();
    assert!(md.starts_with("# approx-bench check: PASS"), "{md}");
    // The same, trial by trial, and against the bare summary.csv (unpaired).
    let (code, out, _) = check(&[
        "--baseline",
        sa,
        "--current",
        sb,
        "--exact",
        "--report",
        tmp.path().join("x.md").to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("worst trial:") && out.contains("(relative 0)"),
        "{out}"
    );
    let (code, out, _) = check(&[
        "--baseline",
        sa,
        "--current",
        b.join("summary.csv").to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("unpaired") && out.contains("configuration not compared"),
        "{out}"
    );

    // A baseline whose summary.csv says one point was much better: a regression, exit 1.
    let edited = tmp.path().join("edited");
    std::fs::create_dir(&edited).unwrap();
    for f in ["trials.csv", "manifest.json"] {
        std::fs::copy(a.join(f), edited.join(f)).unwrap();
    }
    let mut summary = approx_bench::report::summary::read(&a.join("summary.csv")).unwrap();
    let target = summary.iter().position(|r| r.n == 20 && r.d == 8).unwrap();
    summary[target].mean *= 0.5;
    approx_bench::report::summary::write(&edited.join("summary.csv"), &summary).unwrap();
    let (code, out, err) = check(&["--baseline", edited.to_str().unwrap(), "--current", sb]);
    assert_eq!(code, Some(1), "{out}{err}");
    let first = out
        .lines()
        .find(|l| l.starts_with("REGRESSION"))
        .unwrap_or_default();
    assert!(
        first.contains(" 20 ") && first.contains("vmean") && first.contains(" 8 "),
        "{out}"
    );
    assert!(out.contains("does not reproduce"), "{out}");
    assert!(out.contains("FAIL (exit 1): 1 regression, 3 ok"), "{out}");

    // A changed configuration (another seed) fails unless allowed.
    let c = tmp.path().join("c");
    sweep(&model, &c, &["--seed", "5"]);
    let (code, out, _) = check(&["--baseline", sa, "--current", c.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("CONFIG CHANGE: seed: 0 → 5"), "{out}");
    let (code, out, _) = check(&[
        "--baseline",
        sa,
        "--current",
        c.to_str().unwrap(),
        "--allow-config-change",
    ]);
    assert_eq!(code, Some(0), "{out}");

    // Malformed and missing inputs: exit 2, the file named.
    let bad = tmp.path().join("bad");
    std::fs::create_dir(&bad).unwrap();
    std::fs::write(
        bad.join("summary.csv"),
        "model,n,method\ninitialized,sixteen,vmean\n",
    )
    .unwrap();
    let (code, _, err) = check(&["--baseline", bad.to_str().unwrap(), "--current", sb]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(&bad.join("summary.csv").display().to_string()),
        "{err}"
    );
    let trials_bad = tmp.path().join("trials_bad");
    std::fs::create_dir(&trials_bad).unwrap();
    std::fs::copy(a.join("summary.csv"), trials_bad.join("summary.csv")).unwrap();
    std::fs::write(trials_bad.join("trials.csv"), "model,n\nx,y\n").unwrap();
    let (code, _, err) = check(&["--baseline", sa, "--current", trials_bad.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("trials.csv") && err.contains("malformed"),
        "{err}"
    );
    let (code, _, err) = check(&[
        "--baseline",
        tmp.path().join("nope").to_str().unwrap(),
        "--current",
        sb,
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("nope: no such file or directory"), "{err}");
    let (code, _, _) = check(&["--baseline", sa]);
    assert_eq!(code, Some(2), "--current or --rerun is required");
}

#[test]
fn rerun_reproduces_the_baseline_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(&tmp.path().join("m"), false);
    let a = tmp.path().join("a");
    sweep(&model, &a, &[]);
    let out = tmp.path().join("rerun");
    let (code, stdout, err) = check_in(
        tmp.path(),
        &[
            "--baseline",
            a.to_str().unwrap(),
            "--rerun",
            "--out",
            out.to_str().unwrap(),
            "--exact",
        ],
    );
    assert_eq!(code, Some(0), "{stdout}{err}");
    assert!(out.join("trials.csv").is_file() && out.join("check.md").is_file());
    assert!(stdout.contains("PASS (exit 0): 4 ok"), "{stdout}");
    // --rerun needs the manifest.
    let (code, _, err) = check_in(
        tmp.path(),
        &[
            "--baseline",
            a.join("summary.csv").to_str().unwrap(),
            "--rerun",
        ],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--rerun needs the baseline's manifest.json"),
        "{err}"
    );
}

/// Every file under `dir`, relative to it.
fn files_under(dir: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(p.strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    out
}

#[test]
fn the_report_never_lands_in_the_baseline_or_the_checked_run() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(&tmp.path().join("m"), false);
    let (base, cur) = (tmp.path().join("base"), tmp.path().join("cur"));
    sweep(&model, &base, &[]);
    sweep(&model, &cur, &[]);
    let before = (files_under(&base), files_under(&cur));
    let unchanged = || {
        assert_eq!(
            files_under(&base),
            before.0,
            "the baseline gained or lost a file"
        );
        assert_eq!(
            files_under(&cur),
            before.1,
            "--current gained or lost a file"
        );
    };
    let (sb, sc) = (base.to_str().unwrap(), cur.to_str().unwrap());

    // No --report: check.md in the working directory, and nowhere else.
    let cwd = tmp.path().join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    let (code, out, err) = check_in(&cwd, &["--baseline", sb, "--current", sc]);
    assert_eq!(code, Some(0), "{out}{err}");
    unchanged();
    assert_eq!(
        files_under(&cwd),
        BTreeSet::from([PathBuf::from("check.md")])
    );
    let md = std::fs::read_to_string(cwd.join("check.md")).unwrap();
    assert!(md.starts_with("# approx-bench check: PASS"), "{md}");
    assert!(err.contains("report written to check.md"), "{err}");

    // The same with --current a summary.csv file (before: no report at all).
    let cwd2 = tmp.path().join("cwd2");
    std::fs::create_dir(&cwd2).unwrap();
    let summary = cur.join("summary.csv");
    let (code, out, err) = check_in(
        &cwd2,
        &["--baseline", sb, "--current", summary.to_str().unwrap()],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    unchanged();
    assert_eq!(
        files_under(&cwd2),
        BTreeSet::from([PathBuf::from("check.md")])
    );

    // --report FILE: there, and neither in the working directory nor in the inputs.
    let cwd3 = tmp.path().join("cwd3");
    std::fs::create_dir(&cwd3).unwrap();
    let report = tmp.path().join("elsewhere.md");
    let (code, out, err) = check_in(
        &cwd3,
        &[
            "--baseline",
            sb,
            "--current",
            sc,
            "--report",
            report.to_str().unwrap(),
        ],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    unchanged();
    assert!(files_under(&cwd3).is_empty());
    let md = std::fs::read_to_string(&report).unwrap();
    assert!(md.starts_with("# approx-bench check: PASS"), "{md}");
}
