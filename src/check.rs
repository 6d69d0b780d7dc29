//! `approx-bench check`, the command: load both runs (or re-run the baseline's configuration with
//! [`crate::sweep`] for `--rerun`), ask [`crate::report::check`] to compare them, print the table,
//! write the report, return the exit status. The comparison reads runs; running one is this caller's job.

use std::path::PathBuf;

use anyhow::Result;

use crate::report::check::{check, load, render, CheckOptions};
use crate::usage;

/// The report's file name when no `--report` is given.
const REPORT_FILE: &str = "check.md";

/// What `approx-bench check` is asked to do (the CLI builds it from its flags).
#[derive(Debug, Clone, PartialEq)]
pub struct CheckRequest {
    /// A run directory (summary.csv, trials.csv, manifest.json) or a summary.csv file.
    pub baseline: PathBuf,
    /// The run to check.
    pub against: Against,
    /// The markdown report's path; None: `check.md` in the re-run's output directory, else in the
    /// working directory (never in the baseline or the run checked).
    pub report: Option<PathBuf>,
    pub options: CheckOptions,
    /// The command line, recorded in a re-run's manifest.
    pub command: Vec<String>,
}

/// The run a baseline is checked against.
#[derive(Debug, Clone, PartialEq)]
pub enum Against {
    /// A finished run: a run directory or a summary.csv file.
    Current(PathBuf),
    /// A re-run of the baseline's own configuration (from its manifest.json) into `out`, or into a
    /// new directory under the system temp dir.
    Rerun { out: Option<PathBuf> },
}

/// `approx-bench check`: loads (or re-runs) both sides, prints the table, writes the markdown
/// report and returns the exit status (0 pass, 1 fail; usage errors become 2 in `main`).
pub fn execute(req: &CheckRequest) -> Result<i32> {
    let opts = &req.options;
    let baseline = load(&req.baseline, "--baseline")?;
    // The report goes where --report says, else into the re-run's own output directory, else into
    // the working directory: never into the baseline or the run checked, which are inputs (a
    // committed baseline must not gain a file).
    let (current, report_dir, _lock) = match &req.against {
        Against::Current(path) => (load(path, "--current")?, PathBuf::new(), None),
        Against::Rerun { out } => {
            let manifest = baseline.manifest.as_ref().ok_or_else(|| {
                usage!(
                    "--rerun needs the baseline's manifest.json, and {} has none; give the baseline's run directory",
                    req.baseline.display()
                )
            })?;
            if !manifest.config.user_methods.is_empty() {
                let names: Vec<&str> = manifest
                    .config
                    .user_methods
                    .keys()
                    .map(String::as_str)
                    .collect();
                return Err(usage!(
                    "--rerun cannot run the baseline's own methods ({}): the CLI has only the built-in ones. \
                     Re-run your script (e.g. approx_bench.sweep) into a directory and check it with --current DIR",
                    names.join(", ")
                ));
            }
            let out = match out {
                Some(o) => o.clone(),
                None => {
                    let nanos = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_nanos())
                        .unwrap_or(0);
                    std::env::temp_dir()
                        .join(format!("approx-bench-rerun-{}-{nanos}", std::process::id()))
                }
            };
            eprintln!(
                "re-running the baseline's configuration into {}",
                out.display()
            );
            let sweep_opts = crate::sweep::SweepOptions {
                out: out.clone(),
                force: false,
                quiet: false,
                command: req.command.clone(),
                qkv_cache: Default::default(),
                shard: None,
            };
            // The outcome holds the re-run's lock until the report is written into it.
            let outcome = crate::sweep::run(&manifest.config, &sweep_opts)?;
            (load(&out, "--out")?, out, outcome.lock)
        }
    };
    let report = check(&baseline, &current, opts)?;
    print!("{}", render::table(&report));
    let p = req
        .report
        .clone()
        .unwrap_or_else(|| report_dir.join(REPORT_FILE));
    crate::atomic_file::write(&p, render::markdown(&report).as_bytes())
        .map_err(|e| usage!("--report {}: cannot write ({e:#})", p.display()))?;
    eprintln!("report written to {}", p.display());
    Ok(report.exit_code())
}
