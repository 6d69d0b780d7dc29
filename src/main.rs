//! approx-bench: parse the command line, run the job, print errors. The work lives in the library.

mod cli;

use clap::Parser;

use approx_bench::config::{Choice, InputConfig, RunConfig};
use approx_bench::{sweep, UsageError, EXIT_RUNTIME, EXIT_USAGE};
use cli::{Cli, Command};

/// Without --mask, the model's own: causal for a decoder, none for BERT (docs/reference.md §7.2). Under
/// --decode the protocol's (causal), and the sweep refuses an encoder with the reason.
/// The run's options with the defaults that read the model: the layer when `--layer` was not
/// given (a family's global layer), and the model's own mask.
fn with_model_defaults(
    mut o: approx_bench::config::RunOptions,
    layer: Option<usize>,
) -> anyhow::Result<approx_bench::config::RunOptions> {
    if layer.is_none() {
        o.inputs.layer = approx_bench::inputs::decoder::default_layer(
            &InputConfig::new(&o.inputs)?,
            "approx-bench",
        )?;
    }
    if o.mask.is_none() && o.decode.is_none() {
        o.mask = Some(approx_bench::inputs::decoder::native_mask(
            &InputConfig::new(&o.inputs)?,
        )?);
    }
    Ok(o)
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        None if cli.sweep.list_methods => {
            print!("{}", approx_bench::report::console::method_table());
            Ok(0)
        }
        None => {
            approx_bench::inputs::hub::allow_progress(!cli.sweep.quiet);
            let cfg = RunConfig::new(&with_model_defaults(
                cli.sweep.options(),
                cli.sweep.inputs.layer,
            )?)?;
            let opts = sweep::SweepOptions {
                out: cli.sweep.out.clone(),
                force: cli.sweep.force,
                quiet: cli.sweep.quiet,
                command: std::env::args().collect(),
                qkv_cache: cli.sweep.inputs.qkv_cache(),
                shard: cli
                    .sweep
                    .shard
                    .as_deref()
                    .map(approx_bench::config::Shard::parse)
                    .transpose()?,
            };
            let outcome = sweep::run(&cfg, &opts)?;
            // The figures are redrawn from summary.csv; a drawing failure leaves the data intact.
            let figures = approx_bench::report::figures::draw_after_sweep(&outcome.out);
            if !opts.quiet {
                print_summary(&outcome);
                match &figures {
                    Ok(paths) if !paths.is_empty() => eprintln!(
                        "figures: {}",
                        paths
                            .iter()
                            .map(|p| p.display().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    _ => {}
                }
            }
            figures.map_err(|e| e.context("drawing the figures (the run's CSV files are complete; retry with `approx-bench plot`)"))?;
            Ok(0)
        }
        Some(Command::Bench(a)) => {
            let cfg = RunConfig::new(&with_model_defaults(
                a.sweep.options(),
                a.sweep.inputs.layer,
            )?)?;
            approx_bench::bench::run(&cfg, a.repeats)?;
            Ok(0)
        }
        Some(Command::Anchors(a)) => {
            use approx_bench::report::{anchors, figures};
            let mut rows = Vec::new();
            for d in &a.from {
                rows.extend(figures::load_run(d)?.rows);
            }
            if let Some(kind) = a.model {
                rows.retain(|r| r.model == kind.name());
            }
            let cmp = anchors::compare(&rows);
            if cmp.is_empty() {
                return Err(approx_bench::usage!("no point of the runs matches a published anchor (initialized/pretrained, n ∈ 512..4096, d ∈ 16..256)"));
            }
            print!("{}", anchors::markdown_table(&cmp));
            let score = anchors::calibration_score(&cmp).unwrap_or(f64::NAN);
            println!("\n{} matched points; calibration score (weighted median |ln(mean/anchor)|, Informer and V-Mean ×3): {score:.3} (ratio ×{:.2})", cmp.len(), score.exp());
            Ok(0)
        }
        Some(Command::Merge(a))
            if a.dirs
                .first()
                .is_some_and(|d| approx_bench::e2e::merge::is_e2e_run(d)) =>
        {
            let m = approx_bench::e2e::merge::merge(&a.dirs, &a.out)?;
            eprintln!(
                "{}: {} points from {} shard(s), {}; summary.csv and e2e.png recomputed over every window",
                a.out.display(),
                m.points,
                m.shards,
                m.status
            );
            Ok(0)
        }
        Some(Command::Merge(a)) => {
            let merged = approx_bench::report::merge::merge(&a.dirs, &a.out)?;
            approx_bench::report::console::print_summary(&a.out, &merged.summary, 0, merged.trials);
            Ok(0)
        }
        Some(Command::DumpQkv(a)) => {
            let mut inputs = InputConfig::new(&a.inputs.options())?;
            if a.inputs.layer.is_none() {
                inputs.layer = approx_bench::inputs::decoder::default_layer(&inputs, "dump-qkv")?;
            }
            approx_bench::inputs::dump::dump_qkv(
                &inputs,
                &a.inputs.qkv_cache(),
                a.length,
                a.window,
                &a.out,
            )?;
            Ok(0)
        }
        Some(Command::Plot(a)) => {
            use approx_bench::report::figures;
            let runs = a
                .from
                .iter()
                .map(|d| figures::load_run(d))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let first = &a.from[0];
            let out = match &a.out {
                Some(o) => o.clone(),
                None if first.is_file() => {
                    first.parent().map(|p| p.to_path_buf()).unwrap_or_default()
                }
                None => first.clone(),
            };
            let written = figures::draw_all(&runs, &out, a.statistic)?;
            if written.is_empty() {
                return Err(approx_bench::usage!(
                    "nothing to draw: no finite mean in {}",
                    a.from
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            for p in written {
                println!("{}", p.display());
            }
            Ok(0)
        }
        Some(Command::Score(a)) => {
            let outcome = approx_bench::score::score(&approx_bench::score::ScoreRequest {
                qkv: a.qkv,
                approx: a.approx,
                name: a.name,
                target: a.target,
                out: a.out,
                force: a.force,
                command: std::env::args().collect(),
                decode: a.decode,
            })?;
            print_summary(&outcome);
            Ok(0)
        }
        Some(Command::E2e(a)) => {
            approx_bench::inputs::hub::allow_progress(!a.quiet);
            let outcome = approx_bench::e2e::run(&a.request(std::env::args().collect())?)?;
            if !a.quiet {
                for (name, r) in &outcome.reports {
                    eprintln!("{}", approx_bench::e2e::format_report(name, r));
                }
            }
            if a.summary {
                print!("{}", approx_bench::e2e::summary::table(&outcome.out)?);
            }
            eprintln!(
                "{}: {} new points, {} in all (e2e.csv, e2e_layers.csv, summary.csv)",
                outcome.out.display(),
                outcome.new_points,
                outcome.total_points
            );
            Ok(0)
        }
        Some(Command::Check(a)) => {
            approx_bench::check::execute(&a.request(std::env::args().collect())?)
        }
    }
}

/// The console summary of a sweep's or a score's outcome.
fn print_summary(o: &sweep::SweepOutcome) {
    approx_bench::report::console::print_summary(&o.out, &o.summary, o.new_trials, o.total_trials);
}

fn main() {
    let cli = Cli::parse();
    let code = match approx_bench::runtime::configure(cli.threads)
        .and_then(|_| approx_bench::interrupt::install())
        .and_then(|_| approx_bench::numerics::flash::Simd::from_env().map(|_| ()))
        .and_then(|_| run(cli))
    {
        Ok(code) => code,
        Err(e) => {
            if let Some(i) = e.downcast_ref::<approx_bench::interrupt::Interrupted>() {
                // Not an error: what was computed is kept, and the message says how to go on.
                eprintln!("{i}");
                i.exit_code()
            } else {
                eprintln!("error: {e:#}");
                if e.downcast_ref::<UsageError>().is_some() {
                    EXIT_USAGE
                } else {
                    EXIT_RUNTIME
                }
            }
        }
    };
    std::process::exit(code);
}
