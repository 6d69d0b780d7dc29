//! Resolving model and dataset files: through hf-hub's sync API and its cache (HF_HOME), or from
//! local paths. A cache hit needs no network; a miss checks reachability with a short timeout
//! first, so an offline machine gets a clear message instead of a hang.

use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};

use crate::usage;

/// The Wikitext-2 raw test split on the hub (parquet).
pub const WIKITEXT_REPO: &str = "Salesforce/wikitext";
pub const WIKITEXT_CONFIG: &str = "wikitext-2-raw-v1";

/// Where the model files come from.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub enum ModelSource {
    Hub { id: String, revision: String },
    Dir(PathBuf),
}

/// Paths of the files a model needs.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelFiles {
    pub config: PathBuf,
    /// tokenizer.json, or vocab.txt when no tokenizer.json exists.
    pub tokenizer: PathBuf,
    /// model.safetensors; only resolved when pretrained weights are needed.
    pub weights: Option<PathBuf>,
}

fn connect_timeout() -> Duration {
    let secs = std::env::var("APPROX_BENCH_CONNECT_TIMEOUT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    Duration::from_secs(secs)
}

/// The hub endpoint (HF_ENDPOINT or huggingface.co).
fn endpoint() -> String {
    std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".to_string())
}

/// Fails fast (within the connect timeout) when the endpoint cannot be reached.
fn check_reachable(what: &str) -> Result<()> {
    let ep = endpoint();
    let host = ep
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let host = host.split('/').next().unwrap_or(host);
    let hostport = if host.contains(':') {
        host.to_string()
    } else if ep.starts_with("http://") {
        format!("{host}:80")
    } else {
        format!("{host}:443")
    };
    let timeout = connect_timeout();
    let ok = hostport
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.find_map(|a| TcpStream::connect_timeout(&a, timeout).ok()))
        .is_some();
    if ok {
        Ok(())
    } else {
        Err(usage!(
            "cannot fetch {what}: it is not in the Hugging Face cache ({}) and {ep} is unreachable. \
             Either put the files in the cache (set HF_HOME to a directory laid out as the hub does: \
             hub/<type>s--<org>--<name>/refs/main and snapshots/<commit>/<file>), or pass local files \
             with --model-dir DIR (config.json, tokenizer.json or vocab.txt, model.safetensors) and --corpus FILE.",
            Cache::from_env().path().display()
        ))
    }
}

/// Gets one file of a hub repo: the cache first, then a bounded download.
pub fn hub_file(repo: &Repo, filename: &str) -> Result<PathBuf> {
    let cache = Cache::from_env();
    if let Some(p) = cache.repo(repo.clone()).get(filename) {
        return Ok(p);
    }
    let what = format!("{filename} of {}", repo.url());
    check_reachable(&what)?;
    let api = ApiBuilder::from_env()
        .with_progress(false)
        .with_retries(1)
        .build()
        .with_context(|| format!("building the hub client for {what}"))?;
    api.repo(repo.clone()).get(filename).map_err(|e| {
        usage!("could not download {what}: {e}. Check the model id and --revision, or use --model-dir/--corpus with local files.")
    })
}

/// Whether a hub repo has a file, looking only in the cache.
fn in_cache(repo: &Repo, filename: &str) -> bool {
    Cache::from_env().repo(repo.clone()).get(filename).is_some()
}

/// Resolves the model's files. `need_weights` is false for `--model initialized`.
pub fn model_files(source: &ModelSource, need_weights: bool) -> Result<ModelFiles> {
    match source {
        ModelSource::Dir(dir) => {
            if !dir.is_dir() {
                return Err(usage!("--model-dir {}: not a directory", dir.display()));
            }
            let config = dir.join("config.json");
            if !config.is_file() {
                return Err(usage!(
                    "--model-dir {}: config.json is missing",
                    dir.display()
                ));
            }
            let tokenizer = [dir.join("tokenizer.json"), dir.join("vocab.txt")]
                .into_iter()
                .find(|p| p.is_file())
                .ok_or_else(|| {
                    usage!(
                        "--model-dir {}: neither tokenizer.json nor vocab.txt is present",
                        dir.display()
                    )
                })?;
            let weights = if need_weights {
                let w = dir.join("model.safetensors");
                if !w.is_file() {
                    return Err(usage!(
                        "--model-dir {}: model.safetensors is missing (needed for --model pretrained; \
                         --model initialized needs only config and tokenizer)",
                        dir.display()
                    ));
                }
                Some(w)
            } else {
                None
            };
            Ok(ModelFiles {
                config,
                tokenizer,
                weights,
            })
        }
        ModelSource::Hub { id, revision } => {
            let repo = Repo::with_revision(id.clone(), RepoType::Model, revision.clone());
            let config = hub_file(&repo, "config.json")?;
            // Prefer tokenizer.json; fall back to vocab.txt when only that one is cached or exists.
            let tokenizer = if in_cache(&repo, "tokenizer.json") || !in_cache(&repo, "vocab.txt") {
                match hub_file(&repo, "tokenizer.json") {
                    Ok(p) => p,
                    Err(e) => hub_file(&repo, "vocab.txt").map_err(|_| e)?,
                }
            } else {
                hub_file(&repo, "vocab.txt")?
            };
            let weights = if need_weights {
                Some(hub_file(&repo, "model.safetensors")?)
            } else {
                None
            };
            Ok(ModelFiles {
                config,
                tokenizer,
                weights,
            })
        }
    }
}

/// Resolves the default corpus: the Wikitext-2 raw split as parquet from the hub dataset.
pub fn wikitext_parquet(split: &str) -> Result<PathBuf> {
    let repo = Repo::with_revision(
        WIKITEXT_REPO.to_string(),
        RepoType::Dataset,
        "main".to_string(),
    );
    hub_file(
        &repo,
        &format!("{WIKITEXT_CONFIG}/{split}-00000-of-00001.parquet"),
    )
}

/// A short display name of a model source (for CSV `model_id`).
pub fn source_name(source: &ModelSource) -> String {
    match source {
        ModelSource::Hub { id, .. } => id.clone(),
        ModelSource::Dir(d) => dir_name(d),
    }
}

fn dir_name(d: &Path) -> String {
    d.canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| d.display().to_string())
}
