//! manifest.json: the full configuration, crate versions, sha256 of every input file, and
//! start/end times — what makes a run comparable and reproducible.

use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::config::RunConfig;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InputFile {
    pub role: String,
    pub path: String,
    pub sha256: String,
    pub bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub tool: String,
    pub version: String,
    /// Versions of the numerical dependencies (from Cargo.lock at build time).
    pub dependencies: String,
    /// The commit the binary that wrote this manifest was built from (build.rs: short hash,
    /// "-dirty" when tracked files differed, "unknown" outside a checkout); empty in manifests
    /// from before it was recorded.
    #[serde(default)]
    pub build: String,
    pub command: Vec<String>,
    pub config: RunConfig,
    pub model_id: String,
    pub heads: usize,
    pub head_dim: usize,
    /// Tokens of the corpus that were tokenized: the whole corpus, or (since the sweep tokenizes
    /// only the prefix its windows read) at least longest n × windows.
    pub corpus_tokens: usize,
    pub inputs: Vec<InputFile>,
    pub started: String,
    pub finished: Option<String>,
    /// `running`, `complete` or `partial` (a shard).
    pub status: String,
    pub trials: usize,
    pub threads: usize,
    pub features_cuda: bool,
    /// The shard this run covered (`--shard K/N`), if any.
    #[serde(default)]
    pub shard: Option<crate::config::Shard>,
    /// A merged run's sources, flattened through earlier merges: which build computed which
    /// trials. Absent from unmerged runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merged_from: Vec<MergedPart>,
    /// How the run's windows' Q/K/V came: from the cache or computed (absent: no cache used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qkv_cache: Option<QkvCacheUse>,
    /// The decode protocol (docs/reference.md §9.1): n_f, and the layer ℓ of the model's L that
    /// PyramidKV's schedule read. Absent from prefill runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode: Option<DecodeInfo>,
    /// The measured layer's sliding window W (docs/reference.md §7.7.6), which ends the run's d
    /// grid at its first d ≥ W ([`crate::attention::layer_budgets`]). Absent without a window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<usize>,
    /// A decoder's weights in memory (issue 56): kept `stored` or `widened`, the estimate the run
    /// was admitted on, and the process's peak resident memory when the manifest was written.
    /// Absent for BERT and from runs before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<serde_json::Value>,
}

/// The `memory` record of a run whose decoder's weights were kept as `plan` says, with the
/// process's peak resident memory so far.
pub fn memory_record(plan: Option<crate::models::blocks::WeightPlan>) -> Option<serde_json::Value> {
    plan.map(|plan| {
        serde_json::json!({
            "weights": format!("{:?}", plan.form).to_lowercase(),
            "weights_estimate_bytes": plan.estimate_bytes,
            "peak_resident_bytes": crate::runtime::peak_resident_bytes(),
        })
    })
}

/// A decode run's protocol and the layer's place in the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecodeInfo {
    pub n_f: usize,
    pub layer: usize,
    pub layers: usize,
    /// Whose keys each method's d counts (issue 58: `per_query_head`, `per_kv_head`,
    /// `per_layer`), fixed by the id; absent in runs from before it was recorded.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub budget_rules: std::collections::BTreeMap<String, String>,
}

/// A run's use of the Q/K/V cache (`--qkv-cache`): windows read back (`hits`), computed and
/// stored (`misses`), and of those, entries that failed verification and were replaced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QkvCacheUse {
    pub dir: String,
    pub hits: usize,
    pub misses: usize,
    pub rejected: usize,
}

/// One directory that went into a merge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MergedPart {
    pub path: String,
    /// The build that ran it ("" if its manifest predates the field).
    pub build: String,
    pub shard: Option<crate::config::Shard>,
    pub trials: usize,
    pub started: String,
    pub finished: Option<String>,
}

impl InputFile {
    /// The file at `path` under `role`, with its sha256 and size.
    pub fn hashed(role: &str, path: &Path) -> Result<Self> {
        let (sha256, bytes) = sha256_file(path)?;
        Ok(Self {
            role: role.into(),
            path: path.display().to_string(),
            sha256,
            bytes,
        })
    }
}

/// This binary's build (see `Manifest::build`).
pub const BUILD: &str = env!("APPROX_BENCH_BUILD");

/// sha256 of a file, streamed (memoized: the hub cache's verification hashed it already).
pub use crate::file_hash::sha256_file;

pub fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

impl Manifest {
    /// A run's manifest as it starts (status `running`, no trials yet): this binary's identity,
    /// the command, the configuration and the input files. The caller sets what it read from the
    /// model (`model_id`, `heads`, `head_dim`, `corpus_tokens`) and its `shard`.
    pub fn starting(command: Vec<String>, config: RunConfig, inputs: Vec<InputFile>) -> Self {
        Self {
            tool: "approx-bench".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            dependencies: env!("APPROX_BENCH_DEPS").into(),
            build: BUILD.into(),
            command,
            config,
            model_id: String::new(),
            heads: 0,
            head_dim: 0,
            corpus_tokens: 0,
            inputs,
            started: now(),
            finished: None,
            status: "running".into(),
            trials: 0,
            threads: rayon::current_num_threads(),
            features_cuda: cfg!(feature = "cuda"),
            shard: None,
            merged_from: Vec::new(),
            qkv_cache: None,
            decode: None,
            sliding_window: None,
            memory: None,
        }
    }

    pub fn write(&self, dir: &Path) -> Result<()> {
        crate::atomic_file::write(
            &dir.join("manifest.json"),
            (serde_json::to_string_pretty(self)? + "\n").as_bytes(),
        )
    }

    pub fn read(dir: &Path) -> Result<Self> {
        refuse_e2e_run(dir)?;
        let p = dir.join("manifest.json");
        let s = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        serde_json::from_str(&s)
            .map_err(|e| crate::usage!("{}: not a valid approx-bench manifest ({e})", p.display()))
    }
}

/// An `approx-bench e2e` run's directory is no sweep (issue 57): plot, anchors, check and a sweep
/// into it say so, where they would otherwise fail on its other files.
pub fn refuse_e2e_run(dir: &Path) -> Result<()> {
    let e2e = dir.join("e2e.csv").is_file()
        || std::fs::read_to_string(dir.join("manifest.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|m| m["kind"] == "e2e");
    if e2e {
        return Err(crate::usage!(
            "{}: this is an e2e run (e2e.csv, e2e_layers.csv), not a sweep: plot, anchors, check and the sweep read sweep runs. Its figure e2e.png and summary.csv are redrawn by rerunning its e2e command; a sweep needs another --out",
            dir.display()
        ));
    }
    Ok(())
}

/// Whether two runs' `--methods` are the same methods, in any order.
fn same_methods(a: &[String], b: &[String]) -> bool {
    let sorted = |v: &[String]| {
        let mut v = v.to_vec();
        v.sort();
        v
    };
    sorted(a) == sorted(b)
}

/// Two runs' configurations as JSON, `b`'s made equal to `a`'s where the difference does not
/// change a trial (issue 44), so that a resume or a merge accepts it: the same methods in another
/// order (a trial's seed and result do not depend on the order), and `--features` where both
/// runs hold budget-free methods only (the quantized family ignores the d grid).
pub fn comparable_configs(
    a: &RunConfig,
    b: &RunConfig,
) -> Result<(serde_json::Value, serde_json::Value)> {
    let (x, mut y) = (serde_json::to_value(a)?, serde_json::to_value(b)?);
    if same_methods(&a.methods, &b.methods) {
        y["methods"] = x["methods"].clone();
    }
    let budget_free = |c: &RunConfig| {
        c.methods
            .iter()
            .all(|m| crate::attention::budgets(m, &[1]) == [0])
    };
    if budget_free(a) && budget_free(b) {
        y["features"] = x["features"].clone();
    }
    Ok((x, y))
}

/// Field-by-field differences between two JSON values (for "configuration differs" messages).
pub fn json_diff(
    prefix: &str,
    a: &serde_json::Value,
    b: &serde_json::Value,
    out: &mut Vec<String>,
) {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                json_diff(
                    &p,
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        _ if a != b => out.push(format!("{prefix}: {a} → {b}")),
        _ => {}
    }
}

/// A resume continues only what was computed from the same inputs: for every role (corpus,
/// tokenizer, config, weights — a sharded checkpoint has several weight files) the resumed run and
/// this one read files of the same sha256s, whatever their paths (a run moved to another machine
/// resumes). The run hashes its inputs anyway for its manifest, memoized per process, so comparing
/// hashes costs nothing more than a size-and-mtime shortcut would. The sweep's resume and the
/// end-to-end run's both check so.
pub fn check_same_inputs(
    old: &[InputFile],
    new: &[InputFile],
    out: &std::path::Path,
    fix: &str,
) -> Result<()> {
    let hashes = |files: &[InputFile], role: &str| -> Vec<String> {
        let mut h: Vec<String> = files
            .iter()
            .filter(|f| f.role == role)
            .map(|f| f.sha256.clone())
            .collect();
        h.sort();
        h
    };
    let mut roles: Vec<&str> = old.iter().chain(new).map(|f| f.role.as_str()).collect();
    roles.sort();
    roles.dedup();
    for role in roles {
        let (was, now) = (hashes(old, role), hashes(new, role));
        if was == now {
            continue;
        }
        // Name a file of this run whose content the resumed run did not read, else one that it
        // read and this run does not.
        let changed = new
            .iter()
            .find(|f| f.role == role && !was.contains(&f.sha256))
            .map(|f| {
                format!(
                    "the {role} {} changed since this run started (its sha256 is now {}…)",
                    f.path,
                    &f.sha256[..f.sha256.len().min(12)]
                )
            })
            .or_else(|| {
                old.iter()
                    .find(|f| f.role == role && !now.contains(&f.sha256))
                    .map(|f| {
                        format!(
                            "the run being resumed read a {role} ({}) that this run does not",
                            f.path
                        )
                    })
            })
            .unwrap_or_else(|| format!("the {role} files differ"));
        return Err(crate::usage!(
            "--out {}: {changed}; its rows would mix two inputs. Restore the file, or {fix}",
            out.display()
        ));
    }
    Ok(())
}
