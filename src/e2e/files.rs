//! The run directory of `approx-bench e2e` (docs/reference.md §10.3): rows appended as points finish,
//! a torn last row dropped on the next start, every other file written whole under a temporary
//! name and renamed into place.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::{E2eRequest, PointKey};
use crate::protocol::end_to_end::{E2eMethod, E2ePoint, ExactRun, Window};
use crate::report::manifest::{check_same_inputs, InputFile};
use crate::usage;

/// `e2e.csv`'s columns before the one-layer view's and `seconds` (§10.3).
pub const E2E_COLUMNS: &[&str] = &[
    "window",
    "mode",
    "method",
    "d",
    "n",
    "n_f",
    "dtype",
    "kl_mean",
    "kl_p99",
    "kl_max",
    "top1",
    "nll_exact",
    "nll_method",
    "dnll",
    "ppl_ratio",
    "op_err_mean",
    "op_rel_err_mean",
    "op_1mcos_mean",
    "keys_mean",
    "kv_read",
    "mass_mean",
];

const LAYER_COLUMNS: &[&str] = &[
    "window",
    "mode",
    "method",
    "d",
    "layer",
    "abs_error",
    "rel_error",
    "one_minus_cos",
    "keys",
    "mass",
    "kv_read",
];

/// Per query head (`--per-head`): what e2e_layers.csv holds as means over the heads. §10.3 puts
/// these values in the manifest; a CSV instead, since the manifest is rewritten whole on every
/// point and 16 windows × 55 points × 30 layers × 9 heads would make each rewrite megabytes.
const HEAD_COLUMNS: &[&str] = &[
    "window",
    "mode",
    "method",
    "d",
    "layer",
    "head",
    "abs_error",
    "rel_error",
    "one_minus_cos",
    "keys",
    "mass",
    "kv_read",
];

const POSITION_COLUMNS: &[&str] = &[
    "window",
    "mode",
    "method",
    "d",
    "position",
    "kl",
    "argmax_exact",
    "argmax_method",
    "nll_exact",
    "nll_method",
];

/// `e2e.csv`'s header for the one-layer view's layers.
pub fn e2e_header(one_layer: &[usize]) -> Vec<String> {
    let mut h: Vec<String> = E2E_COLUMNS.iter().map(|s| s.to_string()).collect();
    for l in one_layer {
        h.push(format!("one_layer_err_l{l}"));
        h.push(format!("one_layer_1mcos_l{l}"));
    }
    h.push("seconds".into());
    h
}

/// The open run directory.
pub struct Store {
    out: PathBuf,
    done: BTreeSet<PointKey>,
    e2e: File,
    layers: File,
    positions: Option<File>,
    heads: Option<File>,
    dtype: String,
    n_f: usize,
    manifest: serde_json::Value,
    exact: Option<(usize, ExactRun)>,
    /// A rerun of a finished run says `running` only once it writes a new point (issue 57): a
    /// rerun killed before that leaves the run `complete` (or `partial`), as it is.
    running_pending: bool,
}

impl Store {
    /// Opens (or resumes) `out` for `req` over `windows`.
    pub fn open(
        out: &Path,
        req: &E2eRequest,
        windows: &[Vec<u32>],
        model_id: &str,
        inputs: &[InputFile],
        one_layer: &[usize],
    ) -> Result<Self> {
        let ids_text: String = windows
            .iter()
            .map(|w| {
                w.iter()
                    .map(|i| i.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
                    + "\n"
            })
            .collect();
        let manifest = serde_json::json!({
            "kind": "e2e",
            "model_id": model_id,
            "dtype": format!("{:?}", req.inputs.dtype).to_lowercase(),
            "n_f": req.n_f,
            "seed": req.seed,
            "one_layer": one_layer,
            "inputs": inputs,
            "shard": req.shard.map(|s| format!("{}/{}", s.index, s.count)),
            "positions": req.positions,
            "per_head": req.per_head,
            "user_methods": req.user_methods,
            // Whose keys each method's d counts (issue 58): fixed by the id, recorded for a reader.
            "budget_rules": super::expand_methods(&req.methods)
                .iter()
                .filter_map(|id| crate::attention::by_id(id).ok())
                .filter(|m| m.decoding().is_some() && m.has_budget())
                .map(|m| (m.id().to_string(), m.budget_rule().name()))
                .collect::<std::collections::BTreeMap<_, _>>(),
            // Which weights (issue 57): two initialized models share every file, so their seed
            // and scheme are what tells them apart.
            "weights": match req.inputs.model {
                crate::config::ModelKind::Pretrained => serde_json::json!("pretrained"),
                crate::config::ModelKind::Initialized => serde_json::json!({
                    "initialized": {
                        "model_seed": req.inputs.model_seed,
                        "init": format!("{:?}", req.inputs.init).to_lowercase(),
                    }
                }),
            },
            // One hash per window: a rerun with more windows extends the run (the old windows
            // must be its first ones), one with other windows is refused.
            "window_sha256": windows
                .iter()
                .map(|w| sha256_hex(w.iter().map(|i| format!("{i} ")).collect::<String>().as_bytes()))
                .collect::<Vec<_>>(),
        });
        check_same_run(out, &manifest)?;
        crate::atomic_file::write(&out.join("ids.txt"), ids_text.as_bytes())?;
        let header = e2e_header(one_layer);
        let done = keep_complete_rows(&out.join("e2e.csv"), &header, None)?;
        // A row of a window this run does not have is no point of it (issue 57): it would be
        // counted and summarised as one.
        if let Some((w, mode, method, d)) = done.iter().find(|(w, ..)| *w >= windows.len()) {
            return Err(usage!(
                "{}: holds a row of window {w} ({mode} {method} at d = {d}), beyond this run's {} windows; the file was edited or belongs to another run: give another --out",
                out.join("e2e.csv").display(),
                windows.len()
            ));
        }
        let strs = |c: &[&str]| c.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        keep_complete_rows(
            &out.join("e2e_layers.csv"),
            &strs(LAYER_COLUMNS),
            Some(&done),
        )?;
        let positions = if req.positions {
            let path = out.join("e2e_positions.csv");
            keep_complete_rows(&path, &strs(POSITION_COLUMNS), Some(&done))?;
            Some(append(&path, &strs(POSITION_COLUMNS))?)
        } else {
            None
        };
        let heads = if req.per_head {
            let path = out.join("e2e_heads.csv");
            keep_complete_rows(&path, &strs(HEAD_COLUMNS), Some(&done))?;
            Some(append(&path, &strs(HEAD_COLUMNS))?)
        } else {
            None
        };
        let mut store = Self {
            out: out.to_path_buf(),
            e2e: append(&out.join("e2e.csv"), &header)?,
            layers: append(&out.join("e2e_layers.csv"), &strs(LAYER_COLUMNS))?,
            positions,
            heads,
            done,
            dtype: manifest["dtype"].as_str().unwrap_or("").to_string(),
            n_f: req.n_f,
            manifest,
            exact: None,
            running_pending: false,
        };
        store.manifest["command"] = serde_json::json!(req.command);
        let finished = std::fs::read_to_string(out.join("manifest.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|m| m["status"] == "complete" || m["status"] == "partial");
        if finished {
            store.running_pending = true;
        } else {
            store.write_manifest("running")?;
        }
        Ok(store)
    }

    /// The points written so far.
    pub fn points(&self) -> usize {
        self.done.len()
    }

    pub fn done(&self, key: &PointKey) -> bool {
        self.done.contains(key)
    }

    /// The exact run of `window`, computed once per window (points go window by window within a
    /// method, so the last one is kept).
    pub fn exact_run(&mut self, window: &Window) -> Result<&ExactRun> {
        if self.exact.as_ref().is_none_or(|(w, _)| *w != window.index) {
            let run = window
                .exact()
                .with_context(|| format!("the exact run of window {}", window.index))?;
            self.exact = Some((window.index, run));
        }
        Ok(&self.exact.as_ref().expect("just set").1)
    }

    /// Writes a point: its layer rows, head rows and positions, then its e2e.csv row (the row that
    /// marks it done).
    pub fn append(
        &mut self,
        w: usize,
        n: usize,
        m: &E2eMethod,
        d: usize,
        p: &E2ePoint,
    ) -> Result<()> {
        if std::mem::take(&mut self.running_pending) {
            self.write_manifest("running")?;
        }
        let mode = m.mode(self.n_f).name();
        let key = format!("{w},{mode},{},{d}", m.name);
        let mut text = String::new();
        for (l, e) in p.layers.iter().enumerate() {
            text += &format!(
                "{key},{l},{},{},{},{},{},{}\n",
                e.abs_error(),
                e.rel_error(),
                e.one_minus_cos(),
                e.keys(),
                e.mass(),
                e.kv_read()
            );
        }
        write_rows(&mut self.layers, &text, &self.out.join("e2e_layers.csv"))?;
        if let Some(f) = self.heads.as_mut() {
            let mut text = String::new();
            for (l, e) in p.layers.iter().enumerate() {
                for (h, c) in e.heads.iter().enumerate() {
                    text += &format!(
                        "{key},{l},{h},{},{},{},{},{},{}\n",
                        c[0], c[1], c[2], c[3], c[4], c[5]
                    );
                }
            }
            write_rows(f, &text, &self.out.join("e2e_heads.csv"))?;
        }
        if let Some(f) = self.positions.as_mut() {
            let s = &p.scores;
            let mut text = String::new();
            for i in 0..s.len() {
                text += &format!(
                    "{key},{},{},{},{},{},{}\n",
                    n - self.n_f - 1 + i,
                    s.kl[i],
                    s.argmax_exact[i],
                    s.argmax_method[i],
                    s.nll_exact[i],
                    s.nll_method[i]
                );
            }
            write_rows(f, &text, &self.out.join("e2e_positions.csv"))?;
        }
        let row = e2e_row(&key, n, self.n_f, &self.dtype, p);
        write_rows(&mut self.e2e, &row, &self.out.join("e2e.csv"))?;
        self.done.insert((w, mode.to_string(), m.name.clone(), d));
        Ok(())
    }

    /// Marks the run complete (`partial`: one shard of it) and writes `summary.csv` and the
    /// figure; returns the number of points.
    pub fn finish(&mut self) -> Result<usize> {
        super::summary::write(&self.out)?;
        crate::report::figures::e2e::draw(&self.out)?;
        let status = if self.manifest["shard"].is_null() {
            "complete"
        } else {
            "partial"
        };
        self.write_manifest(status)?;
        Ok(self.done.len())
    }

    /// Marks the run `interrupted` (a signal) or `failed` (an error) before the error is returned:
    /// its rows stand, and the same command completes it.
    pub fn stopped(&mut self) {
        if self.running_pending {
            return; // nothing was written: the finished run stands as it was
        }
        let status = if crate::interrupt::requested().is_some() {
            "interrupted"
        } else {
            "failed"
        };
        let _ = self.write_manifest(status);
    }

    /// Records how the model's weights are kept (issue 56); each manifest write then adds the
    /// process's peak resident memory so far.
    pub fn record_weights(
        &mut self,
        plan: Option<crate::models::blocks::WeightPlan>,
        activations: Option<u64>,
    ) {
        if let Some(mut memory) = crate::report::manifest::memory_record(plan) {
            memory["activations_estimate_bytes"] = serde_json::json!(activations);
            self.manifest["memory"] = memory;
        }
    }

    fn write_manifest(&mut self, status: &str) -> Result<()> {
        self.manifest["status"] = serde_json::json!(status);
        if let (Some(m), Some(peak)) = (
            self.manifest
                .get_mut("memory")
                .and_then(|m| m.as_object_mut()),
            crate::runtime::peak_resident_bytes(),
        ) {
            m.insert("peak_resident_bytes".into(), serde_json::json!(peak));
        }
        let text = serde_json::to_string_pretty(&self.manifest)?;
        crate::atomic_file::write(&self.out.join("manifest.json"), text.as_bytes())
    }
}

/// The e2e.csv row of a point: the output metrics, the layer means, the one-layer view.
fn e2e_row(key: &str, n: usize, n_f: usize, dtype: &str, p: &E2ePoint) -> String {
    let o = p.scores.metrics();
    let l = p.layers.len() as f64;
    let mean = |f: &dyn Fn(&crate::protocol::layer_hook::LayerError) -> f64| {
        p.layers.iter().map(f).sum::<f64>() / l
    };
    let mut row = format!(
        "{key},{n},{n_f},{dtype},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
        o.kl_mean,
        o.kl_p99,
        o.kl_max,
        o.top1,
        o.nll_exact,
        o.nll_method,
        o.dnll,
        o.ppl_ratio,
        mean(&|e| e.abs_error()),
        mean(&|e| e.rel_error()),
        mean(&|e| e.one_minus_cos()),
        mean(&|e| e.keys()),
        mean(&|e| e.kv_read()),
        mean(&|e| e.mass()),
    );
    for (_, e) in &p.one_layer {
        row += &format!(",{},{}", e.abs_error(), e.one_minus_cos());
    }
    row += &format!(",{}\n", p.seconds);
    row
}

/// A resumed run must be the same run: same model, dtype, split, seed, view and windows.
fn check_same_run(out: &Path, manifest: &serde_json::Value) -> Result<()> {
    let path = out.join("manifest.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        if out.join("e2e.csv").exists() {
            return Err(usage!(
                "{}: holds an e2e.csv but no manifest.json; it is not a run this tool can resume: use another --out",
                out.display()
            ));
        }
        return Ok(());
    };
    let old: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        usage!(
            "{}: not valid JSON ({e}); use another --out",
            path.display()
        )
    })?;
    // A user's method of the same name must be the same function: its rows would otherwise be
    // two functions' under one name (issue 57). One added or left out changes no row.
    if let (Some(was), Some(now)) = (
        old["user_methods"].as_object(),
        manifest["user_methods"].as_object(),
    ) {
        for (name, m) in now {
            if let Some(w) = was.get(name).filter(|w| w["sha256"] != m["sha256"]) {
                return Err(usage!(
                    "{}: holds rows of the method '{name}' from another function ({} with sha256 {}…; now {} with {}…); rerun with the function as it was, give it another name, or give another --out",
                    out.display(),
                    w["origin"].as_str().unwrap_or("?"),
                    w["sha256"].as_str().unwrap_or("?").get(..12).unwrap_or("?"),
                    m["origin"].as_str().unwrap_or("?"),
                    m["sha256"].as_str().unwrap_or("?").get(..12).unwrap_or("?")
                ));
            }
        }
    }
    let (old_w, new_w) = (&old["window_sha256"], &manifest["window_sha256"]);
    let prefix = match (old_w.as_array(), new_w.as_array()) {
        (Some(o), Some(n)) => o.len() <= n.len() && n[..o.len()] == o[..],
        _ => false,
    };
    if !prefix {
        return Err(usage!(
            "{}: holds a run of other windows (other lengths, corpus, ids, or fewer --windows); rerun the same command to resume it, or give another --out",
            out.display()
        ));
    }
    // The model's files by content, whatever their paths: a resume never mixes the rows of two
    // checkpoints that share a directory name. A run from before the inputs were recorded
    // resumes as before.
    if let Some(was) = old.get("inputs") {
        let parse = |v: &serde_json::Value| -> Result<Vec<InputFile>> {
            serde_json::from_value(v.clone()).map_err(|e| {
                usage!(
                    "{}: its inputs are not readable ({e}); use another --out",
                    path.display()
                )
            })
        };
        // e2e has no --force: another --out is the way to start over (issue 57).
        check_same_inputs(
            &parse(was)?,
            &parse(&manifest["inputs"])?,
            out,
            "use another --out",
        )?;
    }
    // The optional files must cover every point or none (a run from before they were recorded
    // has no such keys and resumes as before).
    let optional = ["positions", "per_head", "weights"]
        .into_iter()
        .filter(|k| old.get(*k).is_some());
    // With the inputs recorded, the files are compared by content above: the same files in a
    // directory of another name (another `model_id`) are the same model (issue 57).
    let model_id = (old.get("inputs").is_none()).then_some("model_id");
    let keys = ["kind", "dtype", "n_f", "seed", "one_layer", "shard"];
    for key in keys.into_iter().chain(model_id).chain(optional) {
        if old[key] != manifest[key] {
            return Err(usage!(
                "{}: holds a run with {key} = {} where this command has {}; rerun the same command to resume it, or give another --out",
                out.display(),
                old[key],
                manifest[key]
            ));
        }
    }
    Ok(())
}

/// Keeps the complete rows of `path` (those ending in a newline with the header's field count),
/// and of those only the rows whose point is in `done` (a point's layer and position rows are
/// written before its e2e.csv row); rewrites the file whole if anything was dropped. Returns the
/// points of the kept rows.
fn keep_complete_rows(
    path: &Path,
    header: &[String],
    done: Option<&BTreeSet<PointKey>>,
) -> Result<BTreeSet<PointKey>> {
    let mut points = BTreeSet::new();
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(points);
    };
    let mut lines = text.split_inclusive('\n');
    let head = lines.next().unwrap_or("");
    if head.trim_end() != header.join(",") {
        return Err(usage!(
            "{}: its header is not this run's ({}); give another --out",
            path.display(),
            header.join(",")
        ));
    }
    let mut kept = head.to_string();
    let mut dropped = false;
    for line in lines {
        let fields: Vec<&str> = line.trim_end().split(',').collect();
        let key = line
            .ends_with('\n')
            .then_some(())
            .filter(|_| fields.len() == header.len())
            .and_then(|_| {
                Some((
                    fields[0].parse().ok()?,
                    fields[1].into(),
                    fields[2].into(),
                    fields[3].parse().ok()?,
                ))
            });
        match key {
            Some(k) if done.is_none_or(|d| d.contains(&k)) => {
                kept += line;
                points.insert(k);
            }
            _ => dropped = true,
        }
    }
    if dropped {
        crate::atomic_file::write(path, kept.as_bytes())?;
    }
    Ok(points)
}

/// `path` opened for appending, with `header` written first if it is new.
fn append(path: &Path, header: &[String]) -> Result<File> {
    let new = !path.exists();
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| usage!("{}: cannot open it for writing ({e})", path.display()))?;
    if new {
        write_rows(&mut f, &(header.join(",") + "\n"), path)?;
    }
    Ok(f)
}

fn write_rows(f: &mut File, text: &str, path: &Path) -> Result<()> {
    f.write_all(text.as_bytes())
        .and_then(|_| f.flush())
        .map_err(|e| {
            // A runtime failure (exit 1), as the sweep's full disk is (issue 57), not a usage error.
            anyhow::anyhow!(
                "{}: cannot write rows ({e}); free space or fix permissions, then rerun to resume",
                path.display()
            )
        })
}

/// The points of an `e2e.csv`.
pub fn read_points(path: &Path) -> Result<BTreeSet<PointKey>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| usage!("{}: cannot read it ({e})", path.display()))?;
    let header: Vec<String> = text
        .lines()
        .next()
        .unwrap_or("")
        .split(',')
        .map(String::from)
        .collect();
    keep_complete_rows_readonly(&text, header.len())
}

fn keep_complete_rows_readonly(text: &str, width: usize) -> Result<BTreeSet<PointKey>> {
    Ok(text
        .split_inclusive('\n')
        .skip(1)
        .filter(|l| l.ends_with('\n'))
        .map(|l| l.trim_end().split(',').collect::<Vec<_>>())
        .filter(|f| f.len() == width)
        .filter_map(|f| {
            Some((
                f[0].parse().ok()?,
                f[1].into(),
                f[2].into(),
                f[3].parse().ok()?,
            ))
        })
        .collect())
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full disk while rows are written is a runtime failure (exit 1), naming the file and
    /// saying that a rerun resumes; never a usage error (exit 2).
    #[test]
    fn a_full_disk_is_a_runtime_failure() {
        let full = Path::new("/dev/full");
        if !full.exists() {
            return;
        }
        let mut f = OpenOptions::new().append(true).open(full).unwrap();
        let e = write_rows(&mut f, "0,window\n", full).unwrap_err();
        assert!(e.downcast_ref::<crate::UsageError>().is_none(), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("/dev/full") && msg.contains("rerun to resume"),
            "{msg}"
        );
    }
}
