//! The trial grid: lengths × windows × heads × methods × d. Q/K/V are computed once per window
//! and the exact target once per head; every trial's randomness comes from its own seed, so the
//! rows do not depend on order, resume or threads. Rows are appended as trials finish.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::DType;

use crate::attention::{self, Approximation, HeadInputs};
use crate::config::{Choice, RunConfig};
use crate::inputs;
use crate::numerics::agreement::{agreement, Agreement};
use crate::numerics::{sampling::TrialKey, spectral};
use crate::report::manifest::{self, InputFile, Manifest};
use crate::report::summary::{self, SummaryRow};
use crate::report::trials::{self, TrialRow, TrialWriter};
use crate::usage;

/// Options that do not change results.
#[derive(Debug, Clone)]
pub struct SweepOptions {
    pub out: PathBuf,
    pub force: bool,
    pub quiet: bool,
    pub command: Vec<String>,
    /// Run only this shard of the (n, window) units.
    pub shard: Option<crate::config::Shard>,
}

/// What a finished sweep reports.
pub struct SweepOutcome {
    pub out: PathBuf,
    pub summary: Vec<SummaryRow>,
    pub new_trials: usize,
    pub total_trials: usize,
}

mod device;
pub mod run_lock;
pub use device::{HEAD_BATCH_VAR, PROFILE_VAR};

/// Rows whose output is non-finite or whose estimated normalizer is ≤ 0 or non-finite.
pub fn flagged_rows(a: &Approximation) -> Result<usize> {
    // 0·x is 0 for finite x and NaN for ±∞ or NaN, so each row's sum is NaN exactly when the
    // row has a non-finite entry: one n-vector leaves the device instead of the n×p output.
    let out = a.output.to_dtype(DType::F64)?;
    let row_check: Vec<f64> = (&out * 0.0)?.sum(1)?.to_vec1()?;
    let norm: Option<Vec<f64>> = match &a.normalizer {
        Some(t) => Some(t.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?),
        None => None,
    };
    Ok(count_flagged(&row_check, norm.as_deref()))
}

/// Rows i with a non-finite `row_check[i]` (0·row summed) or, given normalizers, one that is
/// ≤ 0 or non-finite.
#[allow(clippy::neg_cmp_op_on_partial_ord)] // `!(n > 0.0)` is deliberately true for NaN too
fn count_flagged(row_check: &[f64], norm: Option<&[f64]>) -> usize {
    row_check
        .iter()
        .enumerate()
        .filter(|(i, c)| {
            !c.is_finite() || norm.is_some_and(|n| !(n[*i] > 0.0) || !n[*i].is_finite())
        })
        .count()
}

/// Creates `opts.out`, takes its lock (one writer per run directory) and clears or checks what it
/// holds; the lock is held until the returned value is dropped, at the end of the sweep.
fn prepare_out(cfg: &RunConfig, opts: &SweepOptions) -> Result<run_lock::RunLock> {
    std::fs::create_dir_all(&opts.out).map_err(|e| {
        usage!(
            "--out {}: cannot create the directory ({e}); choose a writable --out",
            opts.out.display()
        )
    })?;
    let lock = run_lock::acquire(&opts.out)?;
    check_out(cfg, opts)?;
    Ok(lock)
}

/// What `--out` holds: cleared with `--force`, else a resume of the same configuration only.
fn check_out(cfg: &RunConfig, opts: &SweepOptions) -> Result<()> {
    let probe = opts.out.join(".write-test");
    std::fs::write(&probe, b"ok").map_err(|e| {
        usage!(
            "--out {}: not writable ({e}); choose a writable --out",
            opts.out.display()
        )
    })?;
    let _ = std::fs::remove_file(&probe);
    let manifest_path = opts.out.join("manifest.json");
    if opts.force {
        // --force always starts over, whatever the directory holds.
        for f in ["trials.csv", "summary.csv", "manifest.json"] {
            let _ = std::fs::remove_file(opts.out.join(f));
        }
        return Ok(());
    }
    if manifest_path.exists() {
        let old = Manifest::read(&opts.out)?;
        let (a, b) = (
            serde_json::to_value(&old.config)?,
            serde_json::to_value(cfg)?,
        );
        if a != b {
            if opts.force {
                for f in ["trials.csv", "summary.csv", "manifest.json"] {
                    let _ = std::fs::remove_file(opts.out.join(f));
                }
            } else {
                let mut diff = Vec::new();
                manifest::json_diff("", &a, &b, &mut diff);
                return Err(usage!(
                    "--out {} holds a run with another configuration ({}); use another --out, or --force to start over",
                    opts.out.display(),
                    diff.join("; ")
                ));
            }
        }
    } else if opts.out.join("trials.csv").exists() && !opts.force {
        return Err(usage!(
            "--out {} holds a trials.csv without manifest.json; use another --out, or --force to start over",
            opts.out.display()
        ));
    } else if opts.force {
        let _ = std::fs::remove_file(opts.out.join("trials.csv"));
    }
    Ok(())
}

/// Runs (or resumes) a sweep into `opts.out`.
pub fn run(cfg: &RunConfig, opts: &SweepOptions) -> Result<SweepOutcome> {
    run_with(cfg, opts, Vec::new())
}

/// A sweep whose methods may include the caller's own (`extra`, e.g. Python functions): an id
/// of `cfg.methods` is looked up among `extra` first, then among the built-in methods.
pub fn run_with(
    cfg: &RunConfig,
    opts: &SweepOptions,
    mut extra: Vec<Box<dyn attention::Method>>,
) -> Result<SweepOutcome> {
    let _lock = prepare_out(cfg, opts)?;
    // The windows all start at the corpus's beginning: the longest length times the window count
    // is every token the run reads, so only that prefix is tokenized.
    let need = cfg.lengths.iter().max().copied().unwrap_or(0) * cfg.windows;
    let prepared = inputs::prepare_for(&cfg.inputs, need)?;
    // Decoders only: BERT's pipeline handles lengths past 512 by its embedding policy (§1.4).
    let decoder = matches!(prepared.model, inputs::Model::Decoder { .. });
    if let Some(&n) = cfg.lengths.iter().find(|&&n| n > prepared.max_positions()) {
        if decoder && !opts.quiet {
            eprintln!(
                "warning: n = {n} is beyond the model's max_position_embeddings ({}): it was not trained at that length (METHODS.md §7.6)",
                prepared.max_positions()
            );
        }
    }
    let all_heads = prepared.heads();
    let heads: Vec<usize> = match &cfg.heads {
        Some(h) => {
            if let Some(bad) = h.iter().find(|&&x| x >= all_heads) {
                return Err(usage!(
                    "--heads: head {bad} does not exist; the model has {all_heads} heads (0..={})",
                    all_heads - 1
                ));
            }
            h.clone()
        }
        None => (0..all_heads).collect(),
    };
    prepared.corpus.check_fits(&cfg.lengths, cfg.windows)?;
    let p = prepared.head_dim();
    let methods: Vec<Box<dyn attention::Method>> = cfg
        .methods
        .iter()
        .map(|m| match extra.iter().position(|e| e.id() == m) {
            Some(i) => Ok(extra.swap_remove(i)),
            None => attention::by_id(m).map_err(|e| usage!("{e}")),
        })
        .collect::<Result<_>>()?;
    for m in &methods {
        m.check_head_dim(p).map_err(|why| {
            usage!(
                "--methods {}: {why}; the model's heads have p = {p} — leave {} out for this model",
                m.id(),
                m.id()
            )
        })?;
    }

    let inputs_list = prepared
        .files
        .iter()
        .map(|(role, path)| InputFile::hashed(role, path))
        .collect::<Result<Vec<_>>>()?;
    let mut manifest = Manifest {
        model_id: prepared.model_id.clone(),
        heads: all_heads,
        head_dim: prepared.head_dim(),
        corpus_tokens: prepared.corpus.ids.len(),
        shard: opts.shard,
        ..Manifest::starting(opts.command.clone(), cfg.clone(), inputs_list)
    };
    manifest.write(&opts.out)?;

    let trials_path = opts.out.join("trials.csv");
    let (mut writer, old_rows) = TrialWriter::open(&trials_path)?;
    let done = trials::keys(&old_rows);
    let model_name = cfg.inputs.model.name().to_string();
    let units_taken = (0..cfg.lengths.len() * cfg.windows)
        .filter(|&u| opts.shard.is_none_or(|s| s.takes(u)))
        .count();
    let total = units_taken
        * heads.len()
        * methods
            .iter()
            .map(|m| attention::budgets(m.id(), &cfg.features).len())
            .sum::<usize>();
    let todo = total.saturating_sub(done.len());
    let bar = progress_bar(todo as u64, opts.quiet);
    let mut new_trials = 0;

    for (li, &n) in cfg.lengths.iter().enumerate() {
        for w in 0..cfg.windows {
            if opts.shard.is_some_and(|s| !s.takes(li * cfg.windows + w)) {
                continue;
            }
            let missing = |h: usize, m: &str, d: usize| {
                !done.contains(&(model_name.clone(), n, w, h, m.to_string(), d))
            };
            let head_needed = |h: usize| {
                methods.iter().any(|m| {
                    attention::budgets(m.id(), &cfg.features)
                        .into_iter()
                        .any(|d| missing(h, m.id(), d))
                })
            };
            let window_needed = heads.iter().any(|&h| head_needed(h));
            if !window_needed {
                continue;
            }
            let jobs: Vec<usize> = heads.iter().copied().filter(|&h| head_needed(h)).collect();
            let trial = TrialContext {
                cfg,
                n,
                window: w,
                model_name: &model_name,
                prepared: &prepared,
                methods: &methods,
                bar: &bar,
            };
            if device_path(&prepared.device) {
                // A device's work is issued from one host thread, batched over the window's
                // heads (device.rs); the window's rows are written when it finishes.
                let rows = crate::runtime::on_device_thread(&prepared.device, || {
                    trial.window_on_device(&jobs, &missing)
                })?;
                for row in rows {
                    writer.append(&row)?;
                    new_trials += 1;
                }
                continue;
            }
            let (q, k, v) = prepared.window_qkv(&cfg.inputs, n, w)?;
            // Heads run in parallel (each trial's result depends only on its own inputs and seed);
            // their rows are appended in head order through a reorder buffer, so trials.csv has
            // the same order whatever the thread count, and every finished head is on disk.
            std::thread::scope(|scope| -> Result<()> {
                let (tx, rx) = std::sync::mpsc::channel::<(usize, Result<Vec<TrialRow>>)>();
                let (q, k, v, jobs_ref, missing_ref, trial_ref) =
                    (&q, &k, &v, &jobs, &missing, &trial);
                scope.spawn(move || {
                    use rayon::prelude::*;
                    jobs_ref
                        .par_iter()
                        .enumerate()
                        .for_each_with(tx, |tx, (i, &h)| {
                            let rows = trial_ref.head_trials(h, q, k, v, missing_ref);
                            let _ = tx.send((i, rows));
                        });
                });
                let mut pending = std::collections::BTreeMap::new();
                let mut next = 0;
                for (i, rows) in rx {
                    pending.insert(i, rows);
                    while let Some(rows) = pending.remove(&next) {
                        for row in rows? {
                            writer.append(&row)?;
                            new_trials += 1;
                        }
                        next += 1;
                    }
                }
                Ok(())
            })?;
        }
    }
    bar.finish_and_clear();
    if let Some(report) = device::profile_report() {
        eprintln!("{report}");
    }
    let rows = trials::read_rows(&trials_path)?;
    let summary_rows = summary::summarize(&rows, &cfg.methods);
    summary::write(&opts.out.join("summary.csv"), &summary_rows)?;
    manifest.finished = Some(manifest::now());
    manifest.status = if opts.shard.is_some() {
        "partial".into()
    } else {
        "complete".into()
    };
    manifest.trials = rows.len();
    manifest.write(&opts.out)?;
    Ok(SweepOutcome {
        out: opts.out.clone(),
        summary: summary_rows,
        new_trials,
        total_trials: rows.len(),
    })
}

/// Set to 1, runs the device path of a sweep (the window's exact targets batched over heads, one
/// host thread issuing the work) on the CPU too, so that tests exercise on the CPU what a GPU runs.
pub const DEVICE_PATH_VAR: &str = "APPROX_BENCH_DEVICE_PATH";

/// Whether a sweep on `device` takes the device path: every non-CPU device, or the CPU when
/// [`DEVICE_PATH_VAR`] is 1.
pub fn device_path(device: &candle_core::Device) -> bool {
    !device.is_cpu() || std::env::var(DEVICE_PATH_VAR).is_ok_and(|v| v.trim() == "1")
}

/// What one window's trials share.
struct TrialContext<'a> {
    cfg: &'a RunConfig,
    n: usize,
    window: usize,
    model_name: &'a str,
    prepared: &'a inputs::Prepared,
    methods: &'a [Box<dyn attention::Method>],
    bar: &'a indicatif::ProgressBar,
}

impl TrialContext<'_> {
    /// Every missing trial of head `h`: the exact target once, then each method and d.
    fn head_trials(
        &self,
        h: usize,
        q: &candle_core::Tensor,
        k: &candle_core::Tensor,
        v: &candle_core::Tensor,
        missing: &(dyn Fn(usize, &str, usize) -> bool + Sync),
    ) -> Result<Vec<TrialRow>> {
        let (cfg, n, w) = (self.cfg, self.n, self.window);
        // Grouped-query heads (METHODS.md §7.1): query head h reads K/V head ⌊h·H_kv/H⌋.
        let kv_head = h * k.dim(0)? / q.dim(0)?;
        let (qh, kh, vh) = (q.get(h)?, k.get(kv_head)?, v.get(kv_head)?);
        let head = HeadInputs::masked(qh, kh, vh, cfg.mask)?;
        // The run's target in f64, once per head (error_norms then takes it as is), before any
        // method's clock starts; a sample of its rows is checked against float64 first.
        let exact64 = head
            .target_output(cfg.target)
            .with_context(|| format!("n = {n}, window {w}, head {h}"))?;
        let exact_norm = spectral::matrix_norms(&exact64)?.spectral;
        let mut rows = Vec::new();
        for m in self.methods {
            for d in attention::budgets(m.id(), &cfg.features) {
                if !missing(h, m.id(), d) {
                    continue;
                }
                let key = TrialKey {
                    seed: cfg.seed,
                    n,
                    window: w,
                    head: h,
                    method: m.id(),
                    d,
                };
                self.bar
                    .set_message(format!("n={n} w={w} {} d={d}", m.id()));
                let t0 = Instant::now();
                let trial_seed = key.derive_seed();
                let approx = m.approximate_trial(&head, d, trial_seed).with_context(|| {
                    format!(
                        "method {} at n = {n}, window {w}, head {h}, d = {d}",
                        m.id()
                    )
                })?;
                self.prepared.device.synchronize()?;
                let seconds = t0.elapsed().as_secs_f64();
                let result = TrialResult {
                    seed: trial_seed,
                    norms: spectral::error_norms(&exact64, &approx.output)?,
                    agreement: agreement(&exact64, &approx.output)?,
                    exact_norm,
                    nonfinite_rows: flagged_rows(&approx)?,
                    seconds,
                    mass: trial_mass(&approx, &head, cfg.target)?,
                    keys: approx.support.as_ref().map(|s| s.keys),
                };
                rows.push(self.row(h, kv_head, m.as_ref(), d, result));
                self.bar.inc(1);
            }
        }
        Ok(rows)
    }
}

/// The mass a restricted method captured, against the exact log-normaliser (softmax target
/// only: C·V has no normalised rows); None for every other method.
fn trial_mass(
    approx: &Approximation,
    head: &HeadInputs,
    target: attention::Target,
) -> Result<Option<f64>> {
    match (&approx.support, target) {
        (Some(_), attention::Target::Softmax) => approx.mass(head.exact()?.log_rowsum()?),
        _ => Ok(None),
    }
}

/// What one trial measured, before it becomes a row.
struct TrialResult {
    seed: u64,
    norms: spectral::ErrorNorms,
    agreement: Agreement,
    exact_norm: f64,
    nonfinite_rows: usize,
    seconds: f64,
    mass: Option<f64>,
    keys: Option<f64>,
}

impl TrialContext<'_> {
    /// The trials.csv row of head `h` (reading K/V head `kv_head`), method `m` at `d`.
    fn row(
        &self,
        h: usize,
        kv_head: usize,
        m: &dyn attention::Method,
        d: usize,
        r: TrialResult,
    ) -> TrialRow {
        let cfg = self.cfg;
        let (mass, keys, kv_bits, kv_read) = cache_columns(m, &r, self.n, cfg.mask);
        TrialRow {
            model: self.model_name.to_string(),
            model_id: self.prepared.model_id.clone(),
            layer: cfg.inputs.layer,
            n: self.n,
            window: self.window,
            head: h,
            method: m.id().to_string(),
            d,
            seed: r.seed,
            error: r.norms.spectral,
            rel_error: r.norms.spectral / r.exact_norm,
            frob_error: r.norms.frobenius,
            exact_norm: r.exact_norm,
            nonfinite_rows: r.nonfinite_rows,
            macs: m.macs_masked(self.n, self.prepared.head_dim(), d, cfg.mask),
            seconds: r.seconds,
            target: cfg.target,
            mask: cfg.mask,
            kv_head: Some(kv_head),
            mass,
            keys,
            cos_sim: Some(r.agreement.cos_sim),
            rel_l1: Some(r.agreement.rel_l1),
            rmse: Some(r.agreement.rmse),
            kv_bits,
            kv_read,
        }
    }
}

/// A trial's `mass`, `keys`, `kv_bits` and `kv_read` (METHODS.md §8.5): a method without a budget
/// (the §8 family) visits every key (the dense count, mass 1) at its own width; a
/// restrict-and-renormalise method (one with a key support) reads its keys from an f16 cache (16
/// bits); every other method reads no cache (all four empty but what it measured).
fn cache_columns(
    m: &dyn attention::Method,
    r: &TrialResult,
    n: usize,
    mask: attention::Mask,
) -> (Option<f64>, Option<f64>, Option<f64>, Option<f64>) {
    use attention::quantized::{dense_keys, kv_read};
    let (mass, keys) = if m.has_budget() {
        (r.mass, r.keys)
    } else {
        (Some(1.0), Some(dense_keys(n, mask)))
    };
    let kv_bits = m.kv_bits(n).or(r.keys.map(|_| 16.0));
    let read = match (kv_bits, keys) {
        (Some(b), Some(k)) => Some(kv_read(b, k, n, mask)),
        _ => None,
    };
    (mass, keys, kv_bits, read)
}

fn progress_bar(len: u64, quiet: bool) -> indicatif::ProgressBar {
    use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
    use std::io::IsTerminal;
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::hidden());
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} trials  {per_sec}  ETA {eta}  {msg}")
            .expect("valid template"),
    );
    bar
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor_util::test_device;
    use candle_core::Tensor;

    #[test]
    fn flagged_rows_counts_non_finite_rows_and_non_positive_normalizers() {
        let out = Tensor::new(
            &[
                [1f32, 2.0],
                [f32::INFINITY, 0.0],
                [0.0, f32::NAN],
                [1.0, 1.0],
                [3.0, 4.0],
            ],
            &test_device(),
        )
        .unwrap();
        let plain = Approximation {
            output: out.clone(),
            normalizer: None,
            support: None,
        };
        assert_eq!(flagged_rows(&plain).unwrap(), 2);
        let norm = Tensor::new(&[1f32, 1.0, 1.0, 0.0, -2.0], &test_device()).unwrap();
        let with_norm = Approximation {
            output: out,
            normalizer: Some(norm),
            support: None,
        };
        assert_eq!(flagged_rows(&with_norm).unwrap(), 4);
    }
}
