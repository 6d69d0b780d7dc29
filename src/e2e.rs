//! `approx-bench e2e` (docs/reference.md §10): the face over the end-to-end protocol. It loads the
//! whole decoder, takes the windows (from the corpus or an ids file), runs the exact run once per
//! window and every (method, d) point against it, and writes `e2e.csv`, `e2e_layers.csv`,
//! (with `--positions`) `e2e_positions.csv`, (with `--per-head`) `e2e_heads.csv`, `ids.txt`, `summary.csv` and a manifest. Rows are
//! appended as points finish; a rerun of the same command skips the points already written.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::config::InputConfig;
use crate::inputs;
use crate::models::Depth;
use crate::numerics::next_token::KldReport;
use crate::protocol::end_to_end::{
    checked_head_dim, default_one_layer, refuse_unsupported, E2eMethod, E2ePoint, Window,
};
use crate::usage;

mod files;
mod ids;
pub mod merge;
pub mod summary;

pub use files::E2E_COLUMNS;
pub use ids::read_ids;

/// What `approx-bench e2e` runs.
#[derive(Debug, Clone)]
pub struct E2eRequest {
    pub inputs: InputConfig,
    pub lengths: Vec<usize>,
    pub windows: usize,
    pub n_f: usize,
    pub methods: Vec<String>,
    pub features: Vec<usize>,
    /// Token ids from a file instead of the corpus (each line, or .npy row, one window).
    pub ids_file: Option<PathBuf>,
    pub out: PathBuf,
    pub seed: u64,
    /// The layers ℓ* of the one-layer view (default 0 and ⌊L/2⌋).
    pub one_layer: Option<Vec<usize>>,
    pub positions: bool,
    /// Also write e2e_heads.csv: every layer's error columns per query head.
    pub per_head: bool,
    pub quiet: bool,
    pub command: Vec<String>,
    /// Run only shard K of N: the windows w with w mod N = K − 1 (`merge` joins the shards).
    /// Where each user's method (the Python face's callables) comes from: recorded in the
    /// manifest, and a resume whose function of the same name changed is refused (issue 57).
    pub user_methods: std::collections::BTreeMap<String, crate::config::UserMethod>,
    pub shard: Option<crate::config::Shard>,
}

/// Refuses a run whose weights (as kept, their estimate made before loading) and activations
/// (`activations`, for windows of up to `n` tokens) exceed the memory available (issue 56),
/// before any window runs.
fn check_run_memory(prepared: &inputs::Prepared, activations: u64, n: usize) -> Result<()> {
    let weights = prepared
        .weight_plan
        .and_then(|p| p.estimate_bytes)
        .unwrap_or(0);
    if let Some(avail) = crate::runtime::memory_available()? {
        if weights + activations > avail {
            let gb = |b: u64| b as f64 / 1e9;
            return Err(usage!(
                "{}: this run needs about {:.2} GB ({:.2} GB of weights and {:.2} GB of activations for windows of n = {n}), but {:.2} GB of memory are available; use a shorter n, a smaller --n-f, --dtype f32, or free memory",
                prepared.model_id,
                gb(weights + activations),
                gb(weights),
                gb(activations),
                gb(avail)
            ));
        }
    }
    Ok(())
}

/// What a finished run reports: the llama.cpp-style statistics of each point computed now (over
/// its windows' positions), and the counts.
pub struct E2eOutcome {
    pub out: PathBuf,
    pub reports: Vec<(String, KldReport)>,
    pub new_points: usize,
    pub total_points: usize,
}

/// One (mode, method, d) point's key in the files.
pub type PointKey = (usize, String, String, usize);

/// `approx-bench e2e`: runs the request and says what it did on stderr (each method's report unless
/// `quiet`, the predictor table on stdout with `summary`, then where the points are).
pub fn run_and_report(req: &E2eRequest, summary: bool) -> Result<()> {
    let outcome = run(req)?;
    if !req.quiet {
        for (name, r) in &outcome.reports {
            eprintln!("{}", format_report(name, r));
        }
    }
    if summary {
        print!("{}", summary::table(&outcome.out)?);
    }
    eprintln!(
        "{}: {} new points, {} in all (e2e.csv, e2e_layers.csv, summary.csv)",
        outcome.out.display(),
        outcome.new_points,
        outcome.total_points
    );
    Ok(())
}

/// Runs the request; see the module doc.
pub fn run(req: &E2eRequest) -> Result<E2eOutcome> {
    run_with(req, Vec::new())
}

/// [`run`] with methods defined outside the registry (a user's Python callable): a name in
/// `req.methods` that one of `extra` bears is that method, in the mode it was given.
pub fn run_with(req: &E2eRequest, extra: Vec<E2eMethod>) -> Result<E2eOutcome> {
    check_request(req)?;
    let methods = resolve_methods(&req.methods, extra)?;
    // The windows of an --ids run are the file's: no corpus is tokenized, or downloaded (issue 57).
    let need = match req.ids_file {
        Some(_) => 0,
        None => req.lengths.iter().max().copied().unwrap_or(0) * (req.windows + 1) * 2,
    };
    let prepared = inputs::prepare_depth(&req.inputs, need, Depth::Whole)?;
    let model = prepared
        .whole_decoder()
        .expect("prepare_depth refuses an encoder at Depth::Whole");
    let windows = match &req.ids_file {
        Some(f) => read_ids(f, model.shape().vocab_size)?,
        None => corpus_windows(&prepared, req)?,
    };
    let n_max = windows.iter().map(Vec::len).max().unwrap_or(0);
    refuse_unsupported(model, &methods, n_max)?;
    let one_layer = one_layer_view(req, model.shape().layers)?;
    refuse_points(req, model, &methods, &windows)?;
    let activations = model.shape().e2e_activation_bytes(
        n_max,
        req.n_f,
        req.inputs.candle_dtype().size_in_bytes(),
        methods.iter().any(|m| m.decode),
    );
    check_run_memory(&prepared, activations, n_max)?;
    let _lock = crate::report::run_lock::create_and_lock(&req.out)?;
    // The model's files by content (the corpus is in the windows' own hashes, and an --ids run
    // reads no corpus rows).
    let inputs_list = prepared
        .files
        .iter()
        .filter(|(role, _)| role != "corpus")
        .map(|(role, path)| crate::report::manifest::InputFile::hashed(role, path))
        .collect::<Result<Vec<_>>>()?;
    let (reports, new_points, total_points) = run_points(
        req,
        &prepared,
        &methods,
        &windows,
        &one_layer,
        &inputs_list,
        activations,
    )?;
    Ok(E2eOutcome {
        out: req.out.clone(),
        reports,
        new_points,
        total_points,
    })
}

/// The run's methods by id: the caller's own (`extra`) first, then the registry's.
fn resolve_methods(ids: &[String], mut extra: Vec<E2eMethod>) -> Result<Vec<E2eMethod>> {
    let methods = ids
        .iter()
        .map(|id| match extra.iter().position(|m| &m.name == id) {
            Some(i) => Ok(extra.remove(i)),
            None => E2eMethod::resolve(id),
        })
        .collect::<Result<Vec<_>>>()?;
    if methods.is_empty() {
        return Err(usage!("--methods: name at least one method"));
    }
    Ok(methods)
}

/// The layers of the one-layer view (--one-layer, default 0 and L/2), each within the model.
fn one_layer_view(req: &E2eRequest, layers: usize) -> Result<Vec<usize>> {
    let one_layer = req
        .one_layer
        .clone()
        .unwrap_or_else(|| default_one_layer(layers));
    if let Some(&l) = one_layer.iter().find(|&&l| l >= layers) {
        return Err(usage!(
            "--one-layer {l}: the model has {layers} layers (0..={})",
            layers - 1
        ));
    }
    Ok(one_layer)
}

/// Every point's refusals before anything runs: a continuation that leaves no prompt, a budget
/// the method refuses at that n, a head dimension it cannot take.
fn refuse_points(
    req: &E2eRequest,
    model: &dyn crate::models::Decoder,
    methods: &[E2eMethod],
    windows: &[Vec<u32>],
) -> Result<()> {
    for (m, d) in methods
        .iter()
        .flat_map(|m| m.budgets(&req.features).into_iter().map(move |d| (m, d)))
    {
        for ids in windows {
            let n = ids.len();
            if req.n_f >= n {
                return Err(usage!(
                    "--n-f {}: the continuation must leave a prompt of at least one token in a window of n = {n}; give --n-f below n",
                    req.n_f
                ));
            }
            let budget_n = if m.decode { n - req.n_f } else { n };
            m.method
                .check(budget_n, d)
                .map_err(|e| usage!("{} at d = {d}: {e}", m.name))?;
            m.method
                .check_head_dim(checked_head_dim(model, m))
                .map_err(|e| usage!("{}: {e}", m.name))?;
        }
    }
    Ok(())
}

/// The points not yet in --out, window-major, and each point's KL report over the windows run
/// now: (reports, points written now, points in the run).
fn run_points(
    req: &E2eRequest,
    prepared: &inputs::Prepared,
    methods: &[E2eMethod],
    windows: &[Vec<u32>],
    one_layer: &[usize],
    inputs_list: &[crate::report::manifest::InputFile],
    activations: u64,
) -> Result<(Vec<(String, KldReport)>, usize, usize)> {
    let model = prepared
        .whole_decoder()
        .expect("prepare_depth refuses an encoder at Depth::Whole");
    let mut store = files::Store::open(
        &req.out,
        req,
        windows,
        &prepared.model_id,
        inputs_list,
        one_layer,
    )?;
    store.record_weights(prepared.weight_plan, Some(activations));
    let dtype = req.inputs.candle_dtype();
    let mut reports = Vec::new();
    let mut new_points = 0;
    // Decode points run on the exact run's prompt rows (models::continuation) where the model
    // has that forward; a family's run the whole window, whose prompt rows are exact.
    let keep_prompt = methods.iter().any(|m| m.decode);
    let points: Vec<(&E2eMethod, usize)> = methods
        .iter()
        .flat_map(|m| m.budgets(&req.features).into_iter().map(move |d| (m, d)))
        .collect();
    // Each point's scored positions over the windows computed now, for its KL report.
    let mut positions: Vec<crate::numerics::next_token::PositionScores> =
        points.iter().map(|_| Default::default()).collect();
    // Window-major: one exact run per window serves every point (the store keeps one), and an
    // interrupted run leaves whole windows behind it.
    let mut run_all = |store: &mut files::Store| -> Result<()> {
        for (w, ids) in windows.iter().enumerate() {
            if req.shard.is_some_and(|s| !s.takes(w)) {
                continue;
            }
            let window = Window {
                model,
                ids,
                n_f: req.n_f,
                dtype,
                seed: req.seed,
                index: w,
                one_layer: one_layer.to_vec(),
                keep_prompt,
            };
            for (i, &(m, d)) in points.iter().enumerate() {
                // A signal: the points written stand; the rest wait for the rerun.
                if crate::interrupt::requested().is_some() {
                    return Ok(());
                }
                let mode = m.mode(req.n_f).name();
                if store.done(&(w, mode.to_string(), m.name.clone(), d)) {
                    continue;
                }
                let exact = store.exact_run(&window)?;
                let point = window.point(exact, m, d).with_context(|| {
                    format!(
                        "{} ({mode}) at d = {d}, window {w} (n = {})",
                        m.name,
                        ids.len()
                    )
                })?;
                store.append(w, ids.len(), m, d, &point)?;
                log_point(req, w, m, d, &point);
                extend(&mut positions[i], &point);
                new_points += 1;
            }
        }
        Ok(())
    };
    // While it runs, a signal only sets the flag (the CLI's handlers): the forward stops between
    // layers, the loop between points, and the manifest says `interrupted`.
    let polling = crate::interrupt::polling();
    let ran = run_all(&mut store);
    if let Some(signal) = crate::interrupt::requested() {
        store.stopped();
        drop(polling);
        return Err(crate::interrupt::Interrupted {
            signal,
            progress: Some(format!(
                "after {} points ({new_points} in this session); rerun the same command to resume",
                store.points()
            )),
        }
        .into());
    }
    if let Err(e) = ran {
        store.stopped();
        return Err(e);
    }
    for (&(m, d), positions) in points.iter().zip(&positions) {
        if !positions.is_empty() {
            let mode = m.mode(req.n_f).name();
            reports.push((
                format!("{} ({mode}) d = {d}", m.name),
                KldReport::new(positions),
            ));
        }
    }
    let total_points = store.finish()?;
    drop(polling);
    Ok((reports, new_points, total_points))
}

/// What the request must hold before anything is read or written (issue 57): a refused run leaves
/// no directory that blocks the corrected command.
fn check_request(req: &E2eRequest) -> Result<()> {
    if req.n_f == 0 {
        return Err(usage!(
            "--n-f 0: no position would be scored; give the continuation's length (e.g. --n-f 256)"
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    if let Some(n) = req.lengths.iter().find(|&&n| !seen.insert(n)) {
        return Err(usage!(
            "--lengths: {n} is named twice; its windows would run twice. Name each length once"
        ));
    }
    if let Some(one) = &req.one_layer {
        let mut seen = std::collections::BTreeSet::new();
        if let Some(l) = one.iter().find(|&&l| !seen.insert(l)) {
            return Err(usage!(
                "--one-layer: layer {l} is named twice; name each layer once"
            ));
        }
    }
    Ok(())
}

/// The method list with the presets expanded (§10.2), duplicates dropped, order kept.
pub fn expand_methods(list: &[String]) -> Vec<String> {
    use crate::attention::{family_method_ids, Family};
    let prefill = || {
        let mut v = vec!["window", "topk"];
        v.extend(family_method_ids(Family::Prefill));
        v
    };
    let decode = || {
        let mut v = crate::attention::decode_preset_ids();
        v.extend(["dkv_q4_0", "dkivi2"]);
        v
    };
    let mut out: Vec<String> = Vec::new();
    for id in list {
        let ids: Vec<&str> = match id.as_str() {
            "prefill" => prefill(),
            "quant" => family_method_ids(Family::Quantized),
            "decode" => decode(),
            "kvpress" => crate::attention::press_method_ids(),
            "all" => [prefill(), family_method_ids(Family::Quantized), decode()].concat(),
            other => vec![other],
        };
        for i in ids {
            if !out.iter().any(|o| o == i) {
                out.push(i.to_string());
            }
        }
    }
    out
}

/// The corpus windows of every length, in the order lengths × windows (the `window` column is
/// the index in that order: the line of `ids.txt`).
fn corpus_windows(prepared: &inputs::Prepared, req: &E2eRequest) -> Result<Vec<Vec<u32>>> {
    if req.lengths.is_empty() || req.windows == 0 {
        return Err(usage!(
            "--lengths and --windows: name at least one length and one window"
        ));
    }
    let mut out = Vec::new();
    for &n in &req.lengths {
        for w in 0..req.windows {
            out.push(prepared.corpus.window(n, w)?);
        }
    }
    Ok(out)
}

fn extend(all: &mut crate::numerics::next_token::PositionScores, p: &E2ePoint) {
    let s = &p.scores;
    all.kl.extend(&s.kl);
    all.argmax_exact.extend(&s.argmax_exact);
    all.argmax_method.extend(&s.argmax_method);
    all.nll_exact.extend(&s.nll_exact);
    all.nll_method.extend(&s.nll_method);
}

fn log_point(req: &E2eRequest, w: usize, m: &E2eMethod, d: usize, p: &E2ePoint) {
    if req.quiet {
        return;
    }
    let o = p.scores.metrics();
    let op = p.layers.iter().map(|l| l.abs_error()).sum::<f64>() / p.layers.len() as f64;
    eprintln!(
        "window {w}: {} d = {d}: KL {:.4e}, top-1 {:.3}, ΔNLL {:+.4}, layer-mean ‖E‖₂ {op:.4} ({:.1} s)",
        m.name, o.kl_mean, o.top1, o.dnll, p.seconds
    );
}

/// The KL report of one point, as llama.cpp's `llama-perplexity --kl-divergence` prints its own.
pub fn format_report(name: &str, r: &KldReport) -> String {
    let pct = |x: f64| 100.0 * x;
    format!(
        "====== {name} against the exact run ({} positions) ======\n\
         Mean PPL(exact)               : {:10.6} ± {:.6}\n\
         Mean PPL(method)              : {:10.6} ± {:.6}\n\
         Cor(ln(PPL(method)), ln(PPL(exact))): {:6.2}%\n\
         Mean PPL(method)/PPL(exact)   : {:10.6} ± {:.6}\n\
         Mean    KLD: {:10.6} ± {:.6}\n\
         Maximum KLD: {:10.6}\n\
         99.9%   KLD: {:10.6}\n\
         99.0%   KLD: {:10.6}\n\
         95.0%   KLD: {:10.6}\n\
         90.0%   KLD: {:10.6}\n\
         Median  KLD: {:10.6}\n\
         RMS Δp     : {:7.3} ± {:.3} %\n\
         Same top p : {:7.3} ± {:.3} %\n",
        r.positions,
        r.ppl_exact,
        r.ppl_exact_se,
        r.ppl_method,
        r.ppl_method_se,
        pct(r.ln_ppl_correlation),
        r.ppl_ratio,
        r.ppl_ratio_se,
        r.kld_mean,
        r.kld_se,
        r.kld_max,
        r.kld_p999,
        r.kld_p99,
        r.kld_p95,
        r.kld_p90,
        r.kld_median,
        pct(r.rms_dp),
        pct(r.rms_dp_se),
        pct(r.same_top),
        pct(r.same_top_se),
    )
}

/// The `window`, `mode`, `method`, `d` of every point a run directory's `e2e.csv` holds.
pub fn points_in(out: &Path) -> Result<BTreeSet<PointKey>> {
    files::read_points(&out.join("e2e.csv"))
}
