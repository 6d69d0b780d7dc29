//! The trial grid: lengths × windows × heads × methods × d. Q/K/V are computed once per window
//! and the exact target once per head; every trial's randomness comes from its own seed, so the
//! rows do not depend on order, resume or threads. Rows are appended as trials finish.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::DType;

use crate::attention::{self, Approximation, HeadInputs};
use crate::config::RunConfig;
use crate::inputs::{self, qkv};
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
}

/// What a finished sweep reports.
pub struct SweepOutcome {
    pub out: PathBuf,
    pub summary: Vec<SummaryRow>,
    pub new_trials: usize,
    pub total_trials: usize,
}

/// Field-by-field differences between two JSON values (for "configuration differs" messages).
pub fn json_diff(prefix: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let p = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                json_diff(&p, x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null), out);
            }
        }
        _ if a != b => out.push(format!("{prefix}: {a} → {b}")),
        _ => {}
    }
}

/// Rows whose output is non-finite or whose estimated normalizer is ≤ 0 or non-finite.
pub fn flagged_rows(a: &Approximation) -> Result<usize> {
    let out: Vec<Vec<f64>> = a.output.to_dtype(DType::F64)?.to_vec2()?;
    let norm: Option<Vec<f64>> = match &a.normalizer {
        Some(t) => Some(t.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?),
        None => None,
    };
    Ok(out
        .iter()
        .enumerate()
        .filter(|(i, row)| {
            row.iter().any(|x| !x.is_finite()) || norm.as_ref().is_some_and(|n| !(n[*i] > 0.0) || !n[*i].is_finite())
        })
        .count())
}

fn prepare_out(cfg: &RunConfig, opts: &SweepOptions) -> Result<()> {
    std::fs::create_dir_all(&opts.out)
        .map_err(|e| usage!("--out {}: cannot create the directory ({e}); choose a writable --out", opts.out.display()))?;
    let probe = opts.out.join(".write-test");
    std::fs::write(&probe, b"ok").map_err(|e| usage!("--out {}: not writable ({e}); choose a writable --out", opts.out.display()))?;
    let _ = std::fs::remove_file(&probe);
    let manifest_path = opts.out.join("manifest.json");
    if manifest_path.exists() {
        let old = Manifest::read(&opts.out)?;
        let (a, b) = (serde_json::to_value(&old.config)?, serde_json::to_value(cfg)?);
        if a != b {
            if opts.force {
                for f in ["trials.csv", "summary.csv", "manifest.json"] {
                    let _ = std::fs::remove_file(opts.out.join(f));
                }
            } else {
                let mut diff = Vec::new();
                json_diff("", &a, &b, &mut diff);
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
    prepare_out(cfg, opts)?;
    let prepared = inputs::prepare(&cfg.inputs)?;
    let all_heads = prepared.heads();
    let heads: Vec<usize> = match &cfg.heads {
        Some(h) => {
            if let Some(bad) = h.iter().find(|&&x| x >= all_heads) {
                return Err(usage!("--heads: head {bad} does not exist; the model has {all_heads} heads (0..={})", all_heads - 1));
            }
            h.clone()
        }
        None => (0..all_heads).collect(),
    };
    prepared.corpus.check_fits(&cfg.lengths, cfg.windows)?;
    let methods: Vec<Box<dyn attention::Method>> =
        cfg.methods.iter().map(|m| attention::by_id(m).map_err(|e| usage!("{e}"))).collect::<Result<_>>()?;

    let mut inputs_list = Vec::new();
    for (role, path) in &prepared.files {
        let (sha256, bytes) = manifest::sha256_file(path)?;
        inputs_list.push(InputFile { role: role.clone(), path: path.display().to_string(), sha256, bytes });
    }
    let mut manifest = Manifest {
        tool: "approx-bench".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        dependencies: env!("APPROX_BENCH_DEPS").into(),
        command: opts.command.clone(),
        config: cfg.clone(),
        model_id: prepared.model_id.clone(),
        heads: all_heads,
        head_dim: prepared.head_dim(),
        corpus_tokens: prepared.corpus.ids.len(),
        inputs: inputs_list,
        started: manifest::now(),
        finished: None,
        status: "running".into(),
        trials: 0,
        threads: rayon::current_num_threads(),
        features_cuda: cfg!(feature = "cuda"),
    };
    manifest.write(&opts.out)?;

    let trials_path = opts.out.join("trials.csv");
    let (mut writer, old_rows) = TrialWriter::open(&trials_path)?;
    let done = trials::keys(&old_rows);
    let model_name = cfg.inputs.model.name().to_string();
    let total = cfg.lengths.len() * cfg.windows * heads.len() * methods.len() * cfg.features.len();
    let todo = total.saturating_sub(done.len());
    let bar = progress_bar(todo as u64, opts.quiet);
    let dtype = cfg.inputs.candle_dtype();
    let mut new_trials = 0;

    for &n in &cfg.lengths {
        for w in 0..cfg.windows {
            let missing = |h: usize, m: &str, d: usize| !done.contains(&(model_name.clone(), n, w, h, m.to_string(), d));
            let window_needed = heads.iter().any(|&h| methods.iter().any(|m| cfg.features.iter().any(|&d| missing(h, m.id(), d))));
            if !window_needed {
                continue;
            }
            let ids = prepared.corpus.window(n, w)?;
            let (q, k, v) = qkv::window_qkv(&prepared.weights, &prepared.config, ids, cfg.inputs.embedding, dtype)?;
            for &h in &heads {
                let head = HeadInputs::new(q.get(h)?, k.get(h)?, v.get(h)?)?;
                let exact_norm = head.exact.norm()?;
                for m in &methods {
                    for &d in &cfg.features {
                        if !missing(h, m.id(), d) {
                            continue;
                        }
                        let key = TrialKey { seed: cfg.seed, n, window: w, head: h, method: m.id(), d };
                        let mut rng = key.rng();
                        bar.set_message(format!("n={n} w={w} h={h} {} d={d}", m.id()));
                        let t0 = Instant::now();
                        let approx = m
                            .approximate(&head, d, &mut rng)
                            .with_context(|| format!("method {} at n = {n}, window {w}, head {h}, d = {d}", m.id()))?;
                        prepared.device.synchronize()?;
                        let seconds = t0.elapsed().as_secs_f64();
                        let norms = spectral::error_norms(&head.exact.output, &approx.output)?;
                        let row = TrialRow {
                            model: model_name.clone(),
                            model_id: prepared.model_id.clone(),
                            layer: cfg.inputs.layer,
                            n,
                            window: w,
                            head: h,
                            method: m.id().to_string(),
                            d,
                            seed: key.derive_seed(),
                            error: norms.spectral,
                            rel_error: norms.spectral / exact_norm,
                            frob_error: norms.frobenius,
                            exact_norm,
                            nonfinite_rows: flagged_rows(&approx)?,
                            macs: m.macs(n, prepared.head_dim(), d),
                            seconds,
                        };
                        writer.append(&row)?;
                        new_trials += 1;
                        bar.inc(1);
                    }
                }
            }
        }
    }
    bar.finish_and_clear();
    let rows = trials::read_rows(&trials_path)?;
    let summary_rows = summary::summarize(&rows, &cfg.methods);
    summary::write(&opts.out.join("summary.csv"), &summary_rows)?;
    manifest.finished = Some(manifest::now());
    manifest.status = "complete".into();
    manifest.trials = rows.len();
    manifest.write(&opts.out)?;
    Ok(SweepOutcome { out: opts.out.clone(), summary: summary_rows, new_trials, total_trials: rows.len() })
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

/// Writes one window's Q, K, V ([heads, n, p], f32) and token ids to a safetensors file.
pub fn dump_qkv(inputs_cfg: &crate::config::InputConfig, n: usize, window: usize, out: &Path) -> Result<()> {
    let prepared = inputs::prepare(inputs_cfg)?;
    let ids = prepared.corpus.window(n, window)?;
    let (q, k, v) = qkv::window_qkv(&prepared.weights, &prepared.config, ids, inputs_cfg.embedding, inputs_cfg.candle_dtype())?;
    let cpu = candle_core::Device::Cpu;
    let mut map = std::collections::HashMap::new();
    map.insert("q".to_string(), q.to_dtype(DType::F32)?.to_device(&cpu)?);
    map.insert("k".to_string(), k.to_dtype(DType::F32)?.to_device(&cpu)?);
    map.insert("v".to_string(), v.to_dtype(DType::F32)?.to_device(&cpu)?);
    map.insert("token_ids".to_string(), candle_core::Tensor::from_vec(ids.to_vec(), ids.len(), &cpu)?);
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| usage!("--out {}: cannot create its directory ({e})", out.display()))?;
    }
    candle_core::safetensors::save(&map, out).map_err(|e| usage!("--out {}: cannot write ({e})", out.display()))?;
    Ok(())
}
