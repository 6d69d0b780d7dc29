//! approx-bench: parse the command line, run the job, print errors. The work lives in the library.

use clap::Parser;

use approx_bench::cli::{Cli, Command};
use approx_bench::config::{InputConfig, RunConfig};
use approx_bench::{sweep, UsageError, EXIT_RUNTIME, EXIT_USAGE};

fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        None => {
            let cfg = RunConfig::from_args(&cli.sweep)?;
            let opts = sweep::SweepOptions {
                out: cli.sweep.out.clone(),
                force: cli.sweep.force,
                quiet: cli.sweep.quiet,
                command: std::env::args().collect(),
            };
            let outcome = sweep::run(&cfg, &opts)?;
            if !opts.quiet {
                approx_bench::report::console::print_summary(&outcome);
            }
            Ok(0)
        }
        Some(Command::DumpQkv(a)) => {
            let inputs = InputConfig::from_args(&a.inputs)?;
            sweep::dump_qkv(&inputs, a.length, a.window, &a.out)?;
            Ok(0)
        }
        Some(Command::Check(a)) => approx_bench::report::check::execute(&a),
    }
}

fn main() {
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.downcast_ref::<UsageError>().is_some() {
                EXIT_USAGE
            } else {
                EXIT_RUNTIME
            }
        }
    };
    std::process::exit(code);
}
