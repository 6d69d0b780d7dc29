//! `approx-bench score`: a method computed anywhere (any language) scored like a built-in one.
//!
//! Inputs are `dump-qkv` files (`<file>.safetensors` with q, k, v [heads, n, p] and the sidecar
//! `<file>.safetensors.json` naming the configuration they came from); the user writes one Ô file
//! per (n, window, d): `<NAME>-n<N>-w<W>-d<D>.safetensors` holding one tensor `o_hat`
//! [heads, n, p] (any float dtype). Every head is scored against exact attention computed from
//! the dumped Q, K, V with the sweep's own code, and the run is written in the standard format
//! (trials.csv, summary.csv, manifest.json), so `plot`, `check` and `merge` take it like any run.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};

use crate::attention::spec::SINKS_TENSOR;
use crate::attention::Approximation;
use crate::config::{Choice, RunConfig, UserMethod};
use crate::numerics::sampling::TrialKey;
use crate::protocol::pipeline::{self, HeadTarget, Protocol, RowAt};
use crate::report::manifest::{self, InputFile, Manifest};
use crate::report::summary;
use crate::report::trials::{TrialRow, TrialWriter};
use crate::sweep::SweepOutcome;
use crate::usage;

pub use crate::inputs::dump::{sidecar, DumpInfo};

/// What `score` needs to know.
#[derive(Debug, Clone)]
pub struct ScoreRequest {
    pub qkv: PathBuf,
    pub approx: PathBuf,
    pub name: String,
    /// What the Ô files approximate: softmax attention or C·V (docs/reference.md §6.4.1).
    pub target: crate::attention::Target,
    pub out: PathBuf,
    pub force: bool,
    pub command: Vec<String>,
    /// The decode protocol's n_f (docs/reference.md §9.1): the Ô files hold the continuation's rows,
    /// [heads, n_f, p], scored against the exact causal rows n − n_f..n of each window.
    pub decode: Option<usize>,
}

struct Dump {
    path: PathBuf,
    info: DumpInfo,
}

fn safetensors_in(dir: &Path, flag: &str) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| usage!("{flag} {}: cannot read the directory ({e})", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    Ok(files)
}

fn read_dumps(dir: &Path) -> Result<Vec<Dump>> {
    let mut dumps = Vec::new();
    for path in safetensors_in(dir, "--qkv")? {
        let side = sidecar(&path);
        let text = std::fs::read_to_string(&side).map_err(|_| {
            usage!(
                "--qkv: {} has no {}; write the inputs with `approx-bench dump-qkv`, which adds it",
                path.display(),
                side.display()
            )
        })?;
        let info: DumpInfo = serde_json::from_str(&text)
            .map_err(|e| usage!("--qkv: {} is not a dump-qkv sidecar ({e})", side.display()))?;
        dumps.push(Dump { path, info });
    }
    if dumps.is_empty() {
        return Err(usage!(
            "--qkv {}: no dump-qkv files (*.safetensors with their .json sidecar)",
            dir.display()
        ));
    }
    let first = &dumps[0];
    for d in &dumps[1..] {
        if d.info.inputs != first.info.inputs || d.info.model_id != first.info.model_id {
            return Err(usage!(
                "--qkv: {} and {} come from different configurations; score one configuration at a time",
                first.path.display(),
                d.path.display()
            ));
        }
    }
    Ok(dumps)
}

/// The layer's spec a dump states (its sidecar's fields, its `sinks` tensor if it has one).
fn dump_spec(dump: &Dump) -> Result<crate::attention::AttentionSpec> {
    let what = format!("--qkv {}", sidecar(&dump.path).display());
    let sinks = if tensor_names(&dump.path)?.iter().any(|k| k == SINKS_TENSOR) {
        Some(load_tensor(&dump.path, SINKS_TENSOR, &[dump.info.heads])?)
    } else {
        None
    };
    dump.info.spec(sinks.as_ref(), &what)
}

/// The tensors' names of a safetensors file, from its header.
fn tensor_names(path: &Path) -> Result<Vec<String>> {
    // SAFETY: mapped read-only; only the header is read here.
    let st = unsafe { candle_core::safetensors::MmapedSafetensors::new(path) }.map_err(|e| {
        let em = crate::tensor_util::candle_message(&e);
        usage!("{}: not a readable safetensors file ({em})", path.display())
    })?;
    Ok(st.tensors().into_iter().map(|(name, _)| name).collect())
}

/// `<name>-n<N>-w<W>-d<D>.safetensors` → (n, window, d) when the name matches.
fn parse_approx_name(file: &str, name: &str) -> Option<(usize, usize, usize)> {
    let rest = file.strip_prefix(name)?.strip_prefix("-n")?;
    let rest = rest.strip_suffix(".safetensors")?;
    let (n, rest) = rest.split_once("-w")?;
    let (w, d) = rest.split_once("-d")?;
    Some((n.parse().ok()?, w.parse().ok()?, d.parse().ok()?))
}

/// The tensor `key` of a safetensors file (or its only tensor), read from the header alone:
/// its shape must be `shape` and its values floating point.
fn check_header(path: &Path, key: &str, shape: &[usize]) -> Result<()> {
    // SAFETY: mapped read-only; only the header is read here.
    let st = unsafe { candle_core::safetensors::MmapedSafetensors::new(path) }.map_err(|e| {
        let em = crate::tensor_util::candle_message(&e);
        usage!("{}: not a readable safetensors file ({em})", path.display())
    })?;
    let tensors = st.tensors();
    let view = match tensors.iter().find(|(n, _)| n == key) {
        Some((_, v)) => v,
        None if tensors.len() == 1 => &tensors[0].1,
        None => {
            return Err(usage!(
                "{}: no tensor named {key} (it holds {})",
                path.display(),
                tensors
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
    };
    use safetensors::Dtype as D;
    if view.shape() != shape {
        return Err(usage!(
            "{}: {key} has shape {:?}; expected [heads, rows, p] = {shape:?} (rows = n, or n_f under --decode)",
            path.display(),
            view.shape()
        ));
    }
    if !matches!(view.dtype(), D::F16 | D::BF16 | D::F32 | D::F64) {
        return Err(usage!(
            "{}: {key} holds {:?} values; write it as floating point (f16, bf16, f32 or f64)",
            path.display(),
            view.dtype()
        ));
    }
    Ok(())
}

fn load_tensor(path: &Path, key: &str, shape: &[usize]) -> Result<Tensor> {
    let map = candle_core::safetensors::load(path, &Device::Cpu).map_err(|e| {
        let em = crate::tensor_util::candle_message(&e);
        usage!("{}: not a readable safetensors file ({em})", path.display())
    })?;
    let t = match map.get(key) {
        Some(t) => t.clone(),
        None if map.len() == 1 => map.into_values().next().expect("one tensor"),
        None => {
            return Err(usage!(
                "{}: no tensor named {key} (it holds {})",
                path.display(),
                map.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        }
    };
    if t.dims() != shape {
        return Err(usage!(
            "{}: {key} has shape {:?}; expected [heads, rows, p] = {shape:?} (rows = n, or n_f under --decode)",
            path.display(),
            t.dims()
        ));
    }
    if !t.dtype().is_float() {
        return Err(usage!(
            "{}: {key} holds {:?} values; write it as floating point (f16, bf16, f32 or f64)",
            path.display(),
            t.dtype()
        ));
    }
    Ok(t)
}

/// Whether `out` holds this very score (same configuration, input files of the same sha256)
/// that did not finish: its manifest is not `complete`.
fn unfinished_same_score(out: &Path, cfg: &RunConfig, files: &[InputFile]) -> Result<bool> {
    if !out.join("manifest.json").is_file() {
        return Ok(false);
    }
    let old = Manifest::read(out)?;
    let (a, b) = crate::report::manifest::comparable_configs(&old.config, cfg)?;
    let hashes = |f: &[InputFile]| {
        let mut h: Vec<(String, String)> = f
            .iter()
            .map(|x| (x.role.clone(), x.sha256.clone()))
            .collect();
        h.sort();
        h
    };
    Ok(old.status != "complete" && a == b && hashes(&old.inputs) == hashes(files))
}

/// Scores the Ô files against the dumps and writes the run into `req.out`.
pub fn score(req: &ScoreRequest) -> Result<SweepOutcome> {
    crate::config::check_user_name(&req.name)?;
    let dumps = read_dumps(&req.qkv)?;
    let info0 = dumps[0].info.clone();
    if req.target == crate::attention::Target::Kernelized && !info0.mask.is_none() {
        return Err(usage!(
            "--target kernelized: the kernelized target is defined without a mask, and the dumps in --qkv {} are of a {} model; score them against the softmax target",
            req.qkv.display(),
            info0.mask
        ));
    }
    let by_unit: BTreeMap<(usize, usize), &Dump> = dumps
        .iter()
        .map(|d| ((d.info.n, d.info.window), d))
        .collect();
    let approx = approx_files(req, &by_unit)?;
    let (lengths, features, windows) = whole_grid(req, &by_unit, &approx)?;

    refuse_decode(req, &info0, &lengths)?;
    // The rows an Ô file holds: the window's, or the continuation's under --decode.
    let scored = |n: usize| req.decode.unwrap_or(n);
    // Every Ô file's header is checked before anything is written: a refused score leaves --out
    // as it was.
    for (&(n, w, _), path) in &approx {
        let dump = by_unit[&(n, w)];
        let info = &dump.info;
        let pv = info.head_dim_v(&dump.path.display().to_string())?;
        check_header(path, "o_hat", &[info.heads, scored(n), pv])?;
    }
    let files = dumps
        .iter()
        .map(|d| ("qkv", d.path.clone()))
        .chain(approx.values().map(|p| ("approx", p.clone())))
        .map(|(role, path)| InputFile::hashed(role, &path))
        .collect::<Result<Vec<_>>>()?;
    let cfg = score_config(req, &info0, (&lengths, &features, windows), &files);

    let lock = crate::report::run_lock::create_and_lock(&req.out)?;
    crate::report::run_lock::probe_writable(&req.out)?;
    let trials_path = req.out.join("trials.csv");
    // A score stopped before it finished (a signal, a kill, an error) is redone whole by the same
    // command: rerunning resumes, as the README promises, without --force.
    if req.force || unfinished_same_score(&req.out, &cfg, &files)? {
        crate::report::remove_run_outputs(&req.out)?;
    } else if trials_path.exists() {
        return Err(usage!(
            "--out {} already holds a run; use another --out, or --force to replace it",
            req.out.display()
        ));
    }
    let mut manifest = Manifest {
        model_id: info0.model_id.clone(),
        heads: info0.heads,
        head_dim: info0.head_dim,
        ..Manifest::starting(req.command.clone(), cfg.clone(), files)
    };
    manifest.write(&req.out)?;
    let (mut writer, _) = TrialWriter::open(&trials_path)?;
    let mut rows = Vec::new();
    for &n in &lengths {
        for w in 0..windows {
            rows.extend(score_window(
                req,
                &cfg,
                by_unit[&(n, w)],
                (n, w),
                &features,
                &approx,
                &mut writer,
            )?);
        }
    }
    let summary_rows = summary::summarize(&rows, &cfg.methods);
    summary::write(&req.out.join("summary.csv"), &summary_rows)?;
    manifest.finished = Some(manifest::now());
    manifest.status = "complete".into();
    manifest.trials = rows.len();
    manifest.write(&req.out)?;
    Ok(SweepOutcome {
        out: req.out.clone(),
        summary: summary_rows,
        new_trials: rows.len(),
        total_trials: rows.len(),
        lock: Some(lock),
    })
}

/// The Ô files of the method `req.name` in --approx, by (n, window, d); each must have its dump.
fn approx_files(
    req: &ScoreRequest,
    by_unit: &BTreeMap<(usize, usize), &Dump>,
) -> Result<BTreeMap<(usize, usize, usize), PathBuf>> {
    let mut approx: BTreeMap<(usize, usize, usize), PathBuf> = BTreeMap::new();
    for path in safetensors_in(&req.approx, "--approx")? {
        let file = path.file_name().unwrap_or_default().to_string_lossy();
        if let Some(key) = parse_approx_name(&file, &req.name) {
            if !by_unit.contains_key(&(key.0, key.1)) {
                return Err(usage!(
                    "--approx: {} is for n = {}, window {}, which has no dump in --qkv {}",
                    path.display(),
                    key.0,
                    key.1,
                    req.qkv.display()
                ));
            }
            approx.insert(key, path);
        }
    }
    if approx.is_empty() {
        return Err(usage!(
            "--approx {}: no files named {}-n<N>-w<W>-d<D>.safetensors",
            req.approx.display(),
            req.name
        ));
    }
    Ok(approx)
}

/// The grid the files cover, (lengths, budgets, windows per length): it must be whole, windows
/// 0..W of every n at every d.
fn whole_grid(
    req: &ScoreRequest,
    by_unit: &BTreeMap<(usize, usize), &Dump>,
    approx: &BTreeMap<(usize, usize, usize), PathBuf>,
) -> Result<(Vec<usize>, Vec<usize>, usize)> {
    let lengths: Vec<usize> = by_unit
        .keys()
        .map(|k| k.0)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let features: Vec<usize> = approx
        .keys()
        .map(|k| k.2)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let windows = lengths
        .iter()
        .map(|&n| by_unit.keys().filter(|k| k.0 == n).count())
        .min()
        .unwrap_or(0);
    let mut missing = Vec::new();
    for &n in &lengths {
        for w in 0..windows {
            for &d in &features {
                if !approx.contains_key(&(n, w, d)) {
                    missing.push(format!("{}-n{n}-w{w}-d{d}.safetensors", req.name));
                }
            }
        }
    }
    if !missing.is_empty() {
        return Err(usage!(
            "--approx {}: the grid n ∈ {lengths:?} × windows 0..{windows} × d ∈ {features:?} lacks {} file(s): {}",
            req.approx.display(),
            missing.len(),
            missing.iter().take(5).cloned().collect::<Vec<_>>().join(", ")
        ));
    }

    Ok((lengths, features, windows))
}

/// The decode protocol needs causal dumps (a decoder's) and a prompt at every length.
fn refuse_decode(req: &ScoreRequest, info0: &DumpInfo, lengths: &[usize]) -> Result<()> {
    if let Some(n_f) = req.decode {
        if n_f == 0 {
            return Err(usage!(
                "--decode 0: give the continuation length n_f, at least 1"
            ));
        }
        if info0.mask != crate::attention::Mask::Causal
            || req.target != crate::attention::Target::Softmax
        {
            return Err(usage!(
                "--decode {n_f}: the continuation protocol scores causal softmax attention (docs/reference.md §9.1); the dumps in --qkv {} are under the {} mask (dump a decoder's Q/K/V)",
                req.qkv.display(),
                info0.mask
            ));
        }
        if let Some(&n) = lengths.iter().find(|&&n| n <= n_f) {
            return Err(usage!(
                "--decode {n_f} leaves no prompt at n = {n}: every dumped length must exceed n_f"
            ));
        }
    }
    Ok(())
}

/// The run configuration of a score: the dumps' inputs, the grid, the method as a user's own
/// (its origin and the hash of its files).
fn score_config(
    req: &ScoreRequest,
    info0: &DumpInfo,
    (lengths, features, windows): (&[usize], &[usize], usize),
    files: &[InputFile],
) -> RunConfig {
    use sha2::Digest;
    let approx_sha = format!(
        "{:x}",
        sha2::Sha256::digest(
            files
                .iter()
                .filter(|f| f.role == "approx")
                .map(|f| f.sha256.as_str())
                .collect::<String>()
        )
    );
    RunConfig {
        inputs: info0.inputs.clone(),
        target: req.target,
        mask: info0.mask,
        lengths: lengths.to_vec(),
        features: features.to_vec(),
        methods: vec![req.name.clone()],
        windows,
        heads: None,
        seed: 0,
        user_methods: BTreeMap::from([(
            req.name.clone(),
            UserMethod {
                kind: "score files".into(),
                origin: req.approx.display().to_string(),
                sha256: approx_sha,
            },
        )]),
        decode: req.decode,
    }
}

/// The rows of one dumped window (n, w): every head at every d of the grid, each appended to
/// trials.csv as it is scored.
fn score_window(
    req: &ScoreRequest,
    cfg: &RunConfig,
    dump: &Dump,
    (n, w): (usize, usize),
    features: &[usize],
    approx: &BTreeMap<(usize, usize, usize), PathBuf>,
    writer: &mut TrialWriter,
) -> Result<Vec<TrialRow>> {
    let scored = |n: usize| req.decode.unwrap_or(n);
    let mut rows = Vec::new();
    // MLA's V (and O) are d_v wide, Q and K p wide (issue 57): V is checked at its own width.
    let pv = dump.info.head_dim_v(&dump.path.display().to_string())?;
    let shape = [dump.info.heads, n, dump.info.head_dim];
    let kv_shape = [dump.info.kv_heads(), n, dump.info.head_dim];
    let q = load_tensor(&dump.path, "q", &shape);
    let k = load_tensor(&dump.path, "k", &kv_shape);
    let v = load_tensor(&dump.path, "v", &[dump.info.kv_heads(), n, pv]);
    let (q, k, v) = (q?, k?, v?);
    let spec = dump_spec(dump)?;
    // A non-finite input would surface as a failed exact target (the device message).
    for (name, t) in [("q", &q), ("k", &k), ("v", &v)] {
        crate::tensor_util::check_finite(t, || {
            format!("--qkv {}: tensor {name}", dump.path.display())
        })?;
    }
    let q = q.to_dtype(cfg.inputs.candle_dtype())?;
    let k = k.to_dtype(cfg.inputs.candle_dtype())?;
    let v = v.to_dtype(cfg.inputs.candle_dtype())?;
    let o_shape = [dump.info.heads, scored(n), pv];
    let outs: Vec<Tensor> = features
        .iter()
        .map(|d| load_tensor(&approx[&(n, w, *d)], "o_hat", &o_shape))
        .collect::<Result<_>>()?;
    let model = cfg.inputs.model.name();
    let protocol = Protocol::of(req.decode);
    for h in 0..dump.info.heads {
        let lh = pipeline::layer_head(&q, &k, &v, h, &spec, None, None)?;
        let kv_head = lh.kv_head;
        let target = HeadTarget::new(&lh.head, None, req.target, protocol).with_context(|| {
            format!(
                "--qkv {}: n = {n}, window {w}, head {h}",
                dump.path.display()
            )
        })?;
        for (&d, o) in features.iter().zip(&outs) {
            let o_hat = Approximation::plain(o.get(h)?.to_dtype(DType::F64)?);
            let seed = TrialKey {
                seed: cfg.seed,
                n,
                window: w,
                head: h,
                method: &req.name,
                d,
            }
            .derive_seed();
            // A user's file: no method here made it, so no cost or cache columns, and
            // its time is not ours to report.
            let measured = target
                .measure(None, d, &o_hat, seed, f64::NAN)
                .with_context(|| {
                    format!(
                        "scoring {} at n = {n}, window {w}, head {h}, d = {d}",
                        req.name
                    )
                })?;
            let row = RowAt {
                model,
                model_id: &dump.info.model_id,
                layer: cfg.inputs.layer,
                n,
                window: w,
                head: h,
                kv_head,
                method: &req.name,
                d,
                target: req.target,
                mask: dump.info.mask,
                protocol,
                spec: &target.head.spec,
            }
            .row(&measured);
            writer.append(&row)?;
            rows.push(row);
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approx_file_names_are_parsed_for_their_method_only() {
        assert_eq!(
            parse_approx_name("mine-n1024-w3-d64.safetensors", "mine"),
            Some((1024, 3, 64))
        );
        assert_eq!(
            parse_approx_name("my-method-n16-w0-d4.safetensors", "my-method"),
            Some((16, 0, 4))
        );
        assert_eq!(
            parse_approx_name("other-n16-w0-d4.safetensors", "mine"),
            None
        );
        assert_eq!(parse_approx_name("mine-n16-w0-d4.bin", "mine"), None);
        assert_eq!(
            parse_approx_name("mine-n16-wx-d4.safetensors", "mine"),
            None
        );
    }
}
