//! approx-bench: how well do fast-attention approximations reproduce exact softmax attention?
//!
//! The data flows one way, and the modules are named after the stages:
//! `inputs` (hub, corpus, model, Q/K/V; `dump-qkv`) → `attention` (exact target and
//! approximations) → `numerics` (spectral norm, inverses, sampling, shifted exponentials) →
//! `sweep` (the trial grid) → `report` (CSV, manifest, shard merge, figures, regression check).
//! `check` runs the `check` command (re-running a baseline with `sweep` for `--rerun`, comparing
//! with `report`, which reads runs and runs none). `runtime` sets the process-wide thread budget
//! and allocator behaviour once at start-up; `bench` times the stages. The ground floor (`choice`,
//! `device`, `tensor_util`, `file_hash`, `runtime`, `interrupt`, `atomic_file`) imports nothing of the house.
//!
//! The library takes plain configuration (`config`: [`config::RunOptions`] →
//! [`config::RunConfig`], [`check::CheckRequest`], …) and knows nothing of the command line:
//! the CLI (`src/main.rs`, `src/cli.rs`, in the binary) turns its arguments into it at the edge.

pub mod atomic_file;
pub mod attention;
pub mod bench;
pub mod check;
pub mod choice;
pub mod config;
pub mod device;
pub mod e2e;
pub mod file_hash;
pub mod inputs;
pub mod interrupt;
pub mod models;
pub mod numerics;
pub mod protocol;
pub mod report;
pub mod runtime;
pub mod score;
pub mod sweep;
pub mod tensor_util;

/// Exit status for usage errors (bad flags, bad input files).
pub const EXIT_USAGE: i32 = 2;
/// Exit status for runtime failures.
pub const EXIT_RUNTIME: i32 = 1;

/// An error that is the user's to fix: bad flag values, missing or malformed input files.
/// `main` maps it to exit status 2; every other error exits with 1.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Shorthand for returning a [`UsageError`] wrapped in `anyhow`.
#[macro_export]
macro_rules! usage {
    ($($arg:tt)*) => { ::anyhow::Error::new($crate::UsageError(format!($($arg)*))) };
}
