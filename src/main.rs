//! approx-bench: parse the command line, run the job, print errors. The work lives in the library.

mod cli;

use clap::Parser;

use approx_bench::config::{InputConfig, RunConfig};
use approx_bench::{sweep, UsageError, EXIT_RUNTIME, EXIT_USAGE};
use cli::{Cli, Command};

fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        None if cli.sweep.list_methods => {
            print!("{}", approx_bench::report::console::method_table());
            Ok(0)
        }
        None => {
            approx_bench::inputs::hub::allow_progress(!cli.sweep.quiet);
            let cfg = RunConfig::new(&approx_bench::inputs::decoder::with_model_defaults(
                cli.sweep.options(),
                cli.sweep.inputs.layer,
            )?)?;
            sweep::run_and_report(&cfg, &cli.sweep.sweep_options(std::env::args().collect())?)?;
            Ok(0)
        }
        Some(Command::Bench(a)) => {
            let cfg = RunConfig::new(&approx_bench::inputs::decoder::with_model_defaults(
                a.sweep.options(),
                a.sweep.inputs.layer,
            )?)?;
            approx_bench::bench::run(&cfg, a.repeats)?;
            Ok(0)
        }
        Some(Command::Anchors(a)) => {
            print!(
                "{}",
                approx_bench::report::anchors::report(&a.from, a.model)?
            );
            Ok(0)
        }
        Some(Command::Merge(a)) => {
            if let Some(said) = approx_bench::e2e::merge::merge_runs(&a.dirs, &a.out)? {
                eprintln!("{said}");
            }
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
            let written =
                approx_bench::report::figures::plot(&a.from, a.out.as_deref(), a.statistic)?;
            for p in written {
                println!("{}", p.display());
            }
            Ok(0)
        }
        Some(Command::Score(a)) => {
            print_summary(&approx_bench::score::score(
                &a.request(std::env::args().collect()),
            )?);
            Ok(0)
        }
        Some(Command::E2e(a)) => {
            approx_bench::inputs::hub::allow_progress(!a.quiet);
            approx_bench::e2e::run_and_report(&a.request(std::env::args().collect())?, a.summary)?;
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
