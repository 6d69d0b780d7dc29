//! The CLI side of the check: load or re-run, print, write the report, return the exit status.

use anyhow::Result;

use super::{check, load, render, CheckOptions};
use crate::cli::CheckArgs;
use crate::usage;

/// `approx-bench check`: loads (or re-runs) both sides, prints the table, writes the markdown
/// report and returns the exit status (0 pass, 1 fail; usage errors become 2 in `main`).
pub fn execute(args: &CheckArgs) -> Result<i32> {
    let opts = CheckOptions {
        alpha: args.alpha,
        slack: args.slack,
        two_sided: args.two_sided,
        allow_config_change: args.allow_config_change,
        exact: args.exact,
    };
    let baseline = load(&args.baseline, "--baseline")?;
    let current = match (&args.current, args.rerun) {
        (Some(path), false) => load(path, "--current")?,
        (None, true) => {
            let manifest = baseline.manifest.as_ref().ok_or_else(|| {
                usage!(
                    "--rerun needs the baseline's manifest.json, and {} has none; give the baseline's run directory",
                    args.baseline.display()
                )
            })?;
            let out = match &args.out {
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
                command: std::env::args().collect(),
                shard: None,
            };
            crate::sweep::run(&manifest.config, &sweep_opts)?;
            load(&out, "--out")?
        }
        _ => return Err(usage!("give either --current DIR_OR_SUMMARY or --rerun")),
    };
    let report = check(&baseline, &current, &opts)?;
    print!("{}", render::table(&report));
    let report_path = match &args.report {
        Some(p) => Some(p.clone()),
        None if current.is_dir() => Some(current.path.join("check.md")),
        None => None,
    };
    if let Some(p) = report_path {
        std::fs::write(&p, render::markdown(&report))
            .map_err(|e| usage!("--report {}: cannot write ({e})", p.display()))?;
        eprintln!("report written to {}", p.display());
    }
    Ok(report.exit_code())
}
