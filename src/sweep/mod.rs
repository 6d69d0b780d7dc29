//! The trial grid: lengths × windows × heads × methods × d. Q/K/V are computed once per window
//! and the exact target once per head; every trial's randomness comes from its own seed, so the
//! rows do not depend on order, resume or threads. Rows are appended as trials finish.

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::attention;
use crate::config::{Choice, RunConfig};
use crate::inputs;
use crate::numerics::sampling::TrialKey;
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
    /// Where the windows' Q/K/V are cached (decoders by default).
    pub qkv_cache: inputs::qkv_cache::CacheSetting,
}

/// What a finished sweep reports.
pub struct SweepOutcome {
    pub out: PathBuf,
    pub summary: Vec<SummaryRow>,
    pub new_trials: usize,
    pub total_trials: usize,
    /// The run directory's lock, held until the outcome is dropped: the caller draws the figures
    /// under it.
    pub lock: Option<RunLock>,
}

mod device;
pub(crate) mod spec_refusals;
pub use device::{HEAD_BATCH_VAR, PROFILE_VAR};

use crate::report::run_lock::RunLock;

// One trial's measurement is the protocols' (prefill, decode, end to end): written once there.
use crate::protocol::pipeline::{self, HeadTarget, Protocol, RowAt};
pub use crate::protocol::trial::flagged_rows;

/// Creates `opts.out`, takes its lock (one writer per run directory) and clears or checks what it
/// holds; the lock is held until the returned value is dropped, after the figures are drawn.
/// Returns the manifest of the run being resumed, if any.
fn prepare_out(cfg: &RunConfig, opts: &SweepOptions) -> Result<(RunLock, Option<Manifest>)> {
    let lock = crate::report::run_lock::create_and_lock(&opts.out)?;
    let resumed = check_out(cfg, opts)?;
    Ok((lock, resumed))
}

/// What `--out` holds: cleared with `--force` (the previous run's figures too), else a resume of
/// the same configuration only, whose manifest is returned.
fn check_out(cfg: &RunConfig, opts: &SweepOptions) -> Result<Option<Manifest>> {
    crate::report::run_lock::probe_writable(&opts.out)?;
    // Not even --force clears an e2e run: its points took hours.
    manifest::refuse_e2e_run(&opts.out)?;
    if opts.force {
        // --force always starts over, whatever the directory holds.
        crate::report::remove_run_outputs(&opts.out)?;
        return Ok(None);
    }
    if opts.out.join("manifest.json").exists() {
        let old = Manifest::read(&opts.out)?;
        let (a, b) = manifest::comparable_configs(&old.config, cfg)?;
        if a != b {
            let mut diff = Vec::new();
            manifest::json_diff("", &a, &b, &mut diff);
            return Err(usage!(
                "--out {} holds a run with another configuration ({}); use another --out, or --force to start over",
                opts.out.display(),
                diff.join("; ")
            ));
        }
        return Ok(Some(old));
    }
    if opts.out.join("trials.csv").exists() {
        return Err(usage!(
            "--out {} holds a trials.csv without manifest.json; use another --out, or --force to start over",
            opts.out.display()
        ));
    }
    Ok(None)
}

/// The decode protocol (§9.1) needs a causal continuation: an encoder has none. Checked once the
/// model is read (the sweep, `bench`).
pub fn refuse_decode_of_encoder(cfg: &RunConfig, prepared: &inputs::Prepared) -> Result<()> {
    let decoder = prepared.model.decoder().is_some();
    if let (Some(n_f), false) = (cfg.decode, decoder) {
        return Err(usage!(
            "--decode {n_f}: {} is an encoder (BERT), which has no causal continuation to decode (docs/reference.md §9.1); use a decoder model (--model-dir with a Llama, Mistral or Qwen checkpoint or GGUF)",
            prepared.model_id
        ));
    }
    Ok(())
}

/// The sweep as the command line runs it: the run, then its figures redrawn from summary.csv and,
/// unless quiet, the console summary and where the figures went. A drawing failure leaves the run's
/// CSV files complete and says how to retry.
pub fn run_and_report(cfg: &RunConfig, opts: &SweepOptions) -> Result<()> {
    let outcome = run(cfg, opts)?;
    let figures = crate::report::figures::draw_after_sweep(&outcome.out);
    if !opts.quiet {
        crate::report::console::print_summary(
            &outcome.out,
            &outcome.summary,
            outcome.new_trials,
            outcome.total_trials,
        );
        if let Ok(paths) = &figures {
            if !paths.is_empty() {
                let list: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
                eprintln!("figures: {}", list.join(", "));
            }
        }
    }
    figures.map_err(|e| {
        e.context("drawing the figures (the run's CSV files are complete; retry with `approx-bench plot`)")
    })?;
    Ok(())
}

/// The heads `--heads` selects (each once, in the order given: a repeated head would weigh twice
/// in the means and fake a standard error), or every head.
fn selected_heads(selected: Option<&[usize]>, all_heads: usize) -> Result<Vec<usize>> {
    let Some(h) = selected else {
        return Ok((0..all_heads).collect());
    };
    if let Some(bad) = h.iter().find(|&&x| x >= all_heads) {
        return Err(usage!(
            "--heads: head {bad} does not exist; the model has {all_heads} heads (0..={})",
            all_heads - 1
        ));
    }
    let mut unique = Vec::with_capacity(h.len());
    for &x in h {
        if !unique.contains(&x) {
            unique.push(x);
        }
    }
    Ok(unique)
}

/// The run's methods by id: the caller's own (`extra`) first, then the built-in ones.
fn resolve_methods(
    ids: &[String],
    extra: &mut Vec<Box<dyn attention::Method>>,
) -> Result<Vec<Box<dyn attention::Method>>> {
    ids.iter()
        .map(|m| match extra.iter().position(|e| e.id() == m) {
            Some(i) => Ok(extra.swap_remove(i)),
            None => attention::by_id(m).map_err(|e| usage!("{e}")),
        })
        .collect()
}

/// The manifest of a run that starts (or resumes), with the decode protocol's record.
fn starting_manifest(
    cfg: &RunConfig,
    opts: &SweepOptions,
    prepared: &inputs::Prepared,
    methods: &[Box<dyn attention::Method>],
    sliding_window: Option<usize>,
    inputs_list: Vec<InputFile>,
) -> Manifest {
    let mut manifest = Manifest {
        model_id: prepared.model_id.clone(),
        heads: prepared.heads(),
        head_dim: prepared.head_dim(),
        corpus_tokens: prepared.corpus.ids.len(),
        shard: opts.shard,
        sliding_window,
        memory: manifest::memory_record(prepared.weight_plan),
        ..Manifest::starting(opts.command.clone(), cfg.clone(), inputs_list)
    };
    manifest.decode = cfg.decode.map(|n_f| manifest::DecodeInfo {
        n_f,
        layer: cfg.inputs.layer,
        layers: prepared.layers(),
        budget_rules: methods
            .iter()
            .filter(|m| m.decoding().is_some() && m.has_budget())
            .map(|m| (m.id().to_string(), m.budget_rule().name().to_string()))
            .collect(),
    });
    manifest
}

/// Runs `head_trials` for every head of `jobs` in parallel (each trial's result depends only on
/// its own inputs and seed) and appends their rows in head order through a reorder buffer, so
/// trials.csv has the same order whatever the thread count, and every finished head is on disk.
/// Returns the rows written.
fn heads_in_order(
    writer: &mut TrialWriter,
    jobs: &[usize],
    head_trials: impl Fn(usize) -> Result<Vec<TrialRow>> + Sync,
) -> Result<usize> {
    let mut written = 0;
    std::thread::scope(|scope| -> Result<()> {
        let (tx, rx) = std::sync::mpsc::channel::<(usize, Result<Vec<TrialRow>>)>();
        let head_trials = &head_trials;
        scope.spawn(move || {
            use rayon::prelude::*;
            jobs.par_iter()
                .enumerate()
                .for_each_with(tx, |tx, (i, &h)| {
                    let _ = tx.send((i, head_trials(h)));
                });
        });
        let mut pending = std::collections::BTreeMap::new();
        let mut next = 0;
        for (i, rows) in rx {
            pending.insert(i, rows);
            while let Some(rows) = pending.remove(&next) {
                for row in rows? {
                    writer.append(&row)?;
                    written += 1;
                }
                next += 1;
            }
        }
        Ok(())
    })?;
    Ok(written)
}

/// The model's and corpus's files with their hashes; a resume must read the same files.
fn hashed_inputs(
    prepared: &inputs::Prepared,
    resumed: Option<&Manifest>,
    opts: &SweepOptions,
) -> Result<Vec<InputFile>> {
    let inputs_list = prepared
        .files
        .iter()
        .map(|(role, path)| InputFile::hashed(role, path))
        .collect::<Result<Vec<_>>>()?;
    if let Some(old) = resumed {
        manifest::check_same_inputs(
            &old.inputs,
            &inputs_list,
            &opts.out,
            "use another --out, or --force to start over",
        )?;
    }
    Ok(inputs_list)
}

/// A refusal or a failure mid-run (an overflowing head, a full disk): the manifest says the run
/// stopped, rather than `running` for ever; its rows stay and a rerun resumes. Best effort: the
/// error that stopped the run is the one to report.
fn record_failure(manifest: &mut Manifest, trials_path: &std::path::Path, out: &std::path::Path) {
    manifest.finished = Some(manifest::now());
    manifest.status = "failed".into();
    if let Ok(rows) = trials::read_rows(trials_path) {
        manifest.trials = rows.len();
    }
    let _ = manifest.write(out);
}

/// How the run ended (interrupted, a shard's part, complete), its rows, memory and Q/K/V cache.
fn record_end(
    manifest: &mut Manifest,
    prepared: &inputs::Prepared,
    rows: usize,
    interrupted: bool,
    opts: &SweepOptions,
) -> Result<()> {
    manifest.finished = Some(manifest::now());
    manifest.status = match (interrupted, opts.shard) {
        (true, _) => "interrupted".into(),
        (false, Some(_)) => "partial".into(),
        (false, None) => "complete".into(),
    };
    manifest.trials = rows;
    manifest.memory = manifest::memory_record(prepared.weight_plan);
    manifest.qkv_cache = prepared.qkv_cache.as_ref().map(|c| {
        let u = c.usage();
        manifest::QkvCacheUse {
            dir: u.dir,
            hits: u.hits,
            misses: u.misses,
            rejected: u.rejected,
        }
    });
    manifest.write(&opts.out)
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
    let (lock, resumed) = prepare_out(cfg, opts)?;
    // A resume goes on in the run's own configuration where `check_out` accepted another form
    // of it (its methods in another order, --features of budget-free methods): its rows,
    // summary and manifest stay those of one configuration.
    let resumed_cfg;
    let cfg = match &resumed {
        Some(old) => {
            resumed_cfg = RunConfig {
                methods: old.config.methods.clone(),
                features: old.config.features.clone(),
                ..cfg.clone()
            };
            &resumed_cfg
        }
        None => cfg,
    };
    // The windows all start at the corpus's beginning: the longest length times the window count
    // is every token the run reads, so only that prefix is tokenized.
    let need = cfg.lengths.iter().max().copied().unwrap_or(0) * cfg.windows;
    let mut prepared = inputs::prepare_for(&cfg.inputs, need)?;
    prepared.check_family_sweep(cfg.mask)?;
    prepared.use_qkv_cache(&opts.qkv_cache, &cfg.inputs)?;
    // Decoders only: BERT's pipeline handles lengths past 512 by its embedding policy (§1.4).
    let decoder = prepared.model.decoder().is_some();
    if let Some(&n) = cfg.lengths.iter().find(|&&n| n > prepared.max_positions()) {
        if decoder && !opts.quiet {
            eprintln!(
                "warning: n = {n} is beyond the model's max_position_embeddings ({}): it was not trained at that length (docs/reference.md §7.6)",
                prepared.max_positions()
            );
        }
    }
    refuse_decode_of_encoder(cfg, &prepared)?;
    let all_heads = prepared.heads();
    let heads = selected_heads(cfg.heads.as_deref(), all_heads)?;
    prepared.corpus.check_fits(&cfg.lengths, cfg.windows)?;
    let p = prepared.head_dim();
    let methods = resolve_methods(&cfg.methods, &mut extra)?;
    spec_refusals::refuse_for_layer(cfg, &prepared, &methods)?;
    let layer_spec = prepared.layer_spec(cfg.inputs.layer, cfg.mask, p);

    let inputs_list = hashed_inputs(&prepared, resumed.as_ref(), opts)?;
    let model_name = cfg.inputs.model.name().to_string();
    let trials_path = opts.out.join("trials.csv");
    let (mut writer, old_rows) = TrialWriter::open(&trials_path)?;
    crate::report::grid::Grid {
        cfg,
        model: &model_name,
        heads: &heads,
        shard: opts.shard,
        sliding_window: layer_spec.window,
    }
    .check(
        &old_rows,
        &trials_path,
        "this directory holds rows of another run. Use another --out, or --force to start over",
    )?;
    // Every check is done: only now is the manifest rewritten (a refused resume leaves it as it was).
    let mut manifest = starting_manifest(
        cfg,
        opts,
        &prepared,
        &methods,
        layer_spec.window,
        inputs_list,
    );
    manifest.write(&opts.out)?;

    let done = trials::keys(&old_rows);
    let units_taken = (0..cfg.lengths.len() * cfg.windows)
        .filter(|&u| opts.shard.is_none_or(|s| s.takes(u)))
        .count();
    let total = units_taken
        * heads.len()
        * methods
            .iter()
            .map(|m| attention::layer_budgets(m.id(), &cfg.features, layer_spec.window).len())
            .sum::<usize>();
    let todo = total.saturating_sub(done.len());
    let bar = progress_bar(todo as u64, opts.quiet);
    let mut new_trials = 0;

    let sweep = SweepRun {
        cfg,
        opts,
        prepared: &prepared,
        methods: &methods,
        layer_spec: &layer_spec,
        model_name: &model_name,
        heads: &heads,
        done: &done,
        bar: &bar,
    };
    // Held until the manifest says how the run ended: a signal that arrives while the summary
    // and manifest are written only sets the flag, instead of ending the process with the
    // manifest still at `running`.
    let polling = crate::interrupt::polling();
    let ran = sweep.run_units(&mut writer).map(|n| new_trials = n);
    bar.finish_and_clear();
    let interrupted = crate::interrupt::requested();
    if let (None, Err(e)) = (interrupted, ran) {
        record_failure(&mut manifest, &trials_path, &opts.out);
        return Err(e);
    }
    if let Some(report) = device::profile_report() {
        eprintln!("{report}");
    }
    let rows = trials::read_rows(&trials_path)?;
    let summary_rows = summary::summarize(&rows, &cfg.methods);
    summary::write(&opts.out.join("summary.csv"), &summary_rows)?;
    record_end(
        &mut manifest,
        &prepared,
        rows.len(),
        interrupted.is_some(),
        opts,
    )?;
    drop(polling);
    if let Some(signal) = interrupted {
        return Err(crate::interrupt::Interrupted {
            signal,
            progress: Some(format!(
                "after {} of {} trials ({new_trials} in this session); rerun the same command to resume",
                rows.len(),
                total
            )),
        }
        .into());
    }
    Ok(SweepOutcome {
        out: opts.out.clone(),
        summary: summary_rows,
        new_trials,
        total_trials: rows.len(),
        lock: Some(lock),
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

/// The window's layer context under the decode protocol (docs/reference.md §9.1), None otherwise: what
/// every head's decode trial may read of the whole layer (the sweep's, and `bench`'s per repeat).
pub fn layer_context(
    cfg: &RunConfig,
    prepared: &inputs::Prepared,
    q: &candle_core::Tensor,
    k: &candle_core::Tensor,
    v: &candle_core::Tensor,
) -> Result<Option<std::sync::Arc<attention::decode::LayerContext>>> {
    let Some(n_f) = cfg.decode else {
        return Ok(None);
    };
    Ok(Some(std::sync::Arc::new(
        attention::decode::LayerContext::new(
            q.clone(),
            k.clone(),
            v.clone(),
            n_f,
            cfg.inputs.layer,
            prepared.layers(),
        )?
        .with_spec(prepared.layer_spec(cfg.inputs.layer, cfg.mask, q.dims3()?.2))?
        .with_rope(
            prepared
                .model
                .decoder()
                .and_then(|m| m.layer_rope(cfg.inputs.layer)),
        ),
    )))
}

/// What every window of a sweep shares.
struct SweepRun<'a> {
    cfg: &'a RunConfig,
    opts: &'a SweepOptions,
    prepared: &'a inputs::Prepared,
    methods: &'a [Box<dyn attention::Method>],
    layer_spec: &'a attention::AttentionSpec,
    model_name: &'a str,
    heads: &'a [usize],
    done: &'a std::collections::HashSet<trials::TrialKeyOwned>,
    bar: &'a indicatif::ProgressBar,
}

impl SweepRun<'_> {
    /// The units in order, the rows written; stops between windows once a signal arrived (every
    /// finished row is on disk), returning Ok so that the run's files are brought up to date.
    fn run_units(&self, writer: &mut TrialWriter) -> Result<usize> {
        let (cfg, mut written) = (self.cfg, 0);
        for (li, &n) in cfg.lengths.iter().enumerate() {
            for w in 0..cfg.windows {
                if self
                    .opts
                    .shard
                    .is_some_and(|s| !s.takes(li * cfg.windows + w))
                {
                    continue;
                }
                if crate::interrupt::requested().is_some() {
                    return Ok(written);
                }
                match self.window(n, w, writer)? {
                    Some(rows) => written += rows,
                    None => return Ok(written),
                }
            }
        }
        Ok(written)
    }

    /// Window `w` of length `n`: its missing trials, the rows written (None: interrupted while
    /// its Q/K/V were computed).
    fn window(&self, n: usize, w: usize, writer: &mut TrialWriter) -> Result<Option<usize>> {
        let missing = |h: usize, m: &str, d: usize| {
            !self
                .done
                .contains(&(self.model_name.to_string(), n, w, h, m.to_string(), d))
        };
        let head_needed = |h: usize| {
            self.methods.iter().any(|m| {
                attention::layer_budgets(m.id(), &self.cfg.features, self.layer_spec.window)
                    .into_iter()
                    .any(|d| missing(h, m.id(), d))
            })
        };
        let window_needed = self.heads.iter().any(|&h| head_needed(h));
        if !window_needed {
            return Ok(Some(0));
        }
        let jobs: Vec<usize> = self
            .heads
            .iter()
            .copied()
            .filter(|&h| head_needed(h))
            .collect();
        let (cfg, prepared) = (self.cfg, self.prepared);
        let trial = TrialContext {
            cfg,
            n,
            window: w,
            model_name: self.model_name,
            prepared,
            methods: self.methods,
            bar: self.bar,
            spec: self.layer_spec,
        };
        // The batched path builds the window's heads under the plain mask: a family's
        // layer spec takes the per-head path (device-generic too).
        let family = prepared.model.family().is_some();
        if device_path(&prepared.device) && cfg.decode.is_none() && !family {
            // A device's work is issued from one host thread, batched over the window's
            // heads (device.rs); the window's rows are written when it finishes.
            let rows = crate::runtime::on_device_thread(&prepared.device, || {
                trial.window_on_device(&jobs, &missing)
            })?;
            let written = rows.len();
            for row in rows {
                writer.append(&row)?;
            }
            return Ok(Some(written));
        }
        // On an MLA layer the window's latent view comes with it (the §8 caches read it).
        let qkv = match prepared.window_qkv_latent(&cfg.inputs, n, w) {
            Ok(qkv) => qkv,
            Err(e) if e.downcast_ref::<crate::interrupt::Interrupted>().is_some() => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        // Under the decode protocol every head's trial may read the whole layer (§9.2's
        // layer-level methods): one context per window, shared by its heads.
        let layer = layer_context(cfg, prepared, &qkv.0, &qkv.1, &qkv.2)?;
        if device_path(&prepared.device) {
            // A decode run on a device: its heads one after another from one host thread
            // (the device path's batching over heads is for the prefill targets).
            let rows = crate::runtime::on_device_thread(&prepared.device, || {
                let mut rows = Vec::new();
                for &h in &jobs {
                    rows.extend(trial.head_trials(h, &qkv, layer.as_ref(), &missing)?);
                }
                Ok::<_, anyhow::Error>(rows)
            })?;
            let written = rows.len();
            for row in rows {
                writer.append(&row)?;
            }
            return Ok(Some(written));
        }
        let written = heads_in_order(writer, &jobs, |h| {
            trial.head_trials(h, &qkv, layer.as_ref(), &missing)
        })?;
        Ok(Some(written))
    }
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
    /// The layer's exact attention (every head's; each head's trials read its own sink).
    spec: &'a attention::AttentionSpec,
}

impl<'a> TrialContext<'a> {
    /// Every missing trial of head `h`: the exact target once, then each method and d, through
    /// the protocols' pipeline.
    fn head_trials(
        &self,
        h: usize,
        (q, k, v, latent): &inputs::WindowQkv,
        layer: Option<&std::sync::Arc<attention::decode::LayerContext>>,
        missing: &(dyn Fn(usize, &str, usize) -> bool + Sync),
    ) -> Result<Vec<TrialRow>> {
        let (cfg, n, w) = (self.cfg, self.n, self.window);
        let lh = pipeline::layer_head(q, k, v, h, self.spec, layer, latent.as_ref())?;
        let (head, kv_head) = (&lh.head, lh.kv_head);
        // The run's target in f64, once per head, before any method's clock starts; a sample of
        // its rows is checked against float64 first.
        let target = HeadTarget::new(
            head,
            lh.decode.as_ref(),
            cfg.target,
            Protocol::of(cfg.decode),
        )
        .with_context(|| format!("layer {}, n = {n}, window {w}, head {h}", cfg.inputs.layer))?;
        let mut rows = Vec::new();
        for m in self.methods {
            for d in attention::layer_budgets(m.id(), &cfg.features, self.spec.window) {
                if !missing(h, m.id(), d) {
                    continue;
                }
                // A signal: the finished trials are returned (and written), the rest wait for
                // the resume.
                if crate::interrupt::requested().is_some() {
                    return Ok(rows);
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
                let (_, measured) = target
                    .trial(m.as_ref(), d, key.derive_seed())
                    .with_context(|| {
                        format!(
                            "method {} at n = {n}, window {w}, head {h}, d = {d}",
                            m.id()
                        )
                    })?;
                rows.push(self.row_at(h, kv_head, m.id(), d).row(&measured));
                self.bar.inc(1);
            }
        }
        Ok(rows)
    }

    /// The identity columns of head `h`'s (reading K/V head `kv_head`) trial of `method` at `d`.
    fn row_at<'m>(&self, h: usize, kv_head: usize, method: &'m str, d: usize) -> RowAt<'m>
    where
        'a: 'm,
    {
        RowAt {
            model: self.model_name,
            model_id: &self.prepared.model_id,
            layer: self.cfg.inputs.layer,
            n: self.n,
            window: self.window,
            head: h,
            kv_head,
            method,
            d,
            target: self.cfg.target,
            mask: self.cfg.mask,
            protocol: Protocol::of(self.cfg.decode),
            spec: self.spec,
        }
    }
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
