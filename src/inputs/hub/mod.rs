//! Resolving model and dataset files: from the Hugging Face hub through its cache, or from
//! local paths.
//!
//! A cached file is used without touching the network, after checking that it is whole
//! ([`verify`]); a corrupt one is fetched again. A download is bounded in time at every step
//! ([`settings::Timeouts`]), resumed after a cut, verified against the size and hash the hub
//! announced before it is linked into the cache, shared with other processes through the
//! cache's lock files ([`lock`]), and shown as a progress bar (or one line off a terminal).
//! Exit status: what the user must change (an unknown repo or file, HF_HUB_OFFLINE with a cold
//! cache) is a usage error (2); a network or disk failure a runtime error (1).

mod cache;
mod download;
mod lock;
mod settings;
pub mod verify;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, Result};
use hf_hub::{Repo, RepoType};

pub use settings::{allow_progress, HubSettings, Progress, Timeouts};

use crate::usage;
use download::Failure;

// The configuration's names for where files come from (defined there: the configuration states
// the sources, this module resolves them).
pub use crate::config::{ModelSource, WIKITEXT_CONFIG, WIKITEXT_REPO};

/// Paths of the files a model needs.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelFiles {
    pub config: PathBuf,
    /// tokenizer.json, or vocab.txt when no tokenizer.json exists.
    pub tokenizer: PathBuf,
    /// model.safetensors; only resolved when pretrained weights are needed.
    pub weights: Option<PathBuf>,
}

/// A hub client: settings plus its HTTP agents.
pub struct Hub {
    settings: HubSettings,
    http: download::Http,
}

const OFFLINE_WAYS: &str = "put the files in the cache (HF_HOME or HF_HUB_CACHE laid out as the hub does: \
     hub/<type>s--<org>--<name>/refs/main and snapshots/<commit>/<file>), or pass local files with \
     --model-dir DIR (config.json, tokenizer.json or vocab.txt, model.safetensors) and --corpus FILE";

fn describe(repo: &Repo, filename: &str) -> String {
    format!("{filename} of {}", repo.url())
}

impl Hub {
    pub fn new(settings: HubSettings) -> Self {
        let http = download::Http::new(&settings);
        Self { settings, http }
    }

    /// A client configured from the environment (see [`HubSettings::from_env`]).
    pub fn from_env() -> Result<Self> {
        Ok(Self::new(HubSettings::from_env()?))
    }

    pub fn settings(&self) -> &HubSettings {
        &self.settings
    }

    fn say(&self, msg: impl std::fmt::Display) {
        if self.settings.progress != Progress::Silent {
            eprintln!("{msg}");
        }
    }

    /// Gets one file of a hub repo: a verified cache hit, else a verified download.
    pub fn file(&self, repo: &Repo, filename: &str) -> Result<PathBuf> {
        let what = describe(repo, filename);
        let cache = cache::CacheRepo::new(&self.settings.cache_dir, repo);
        let mut corrupt: Option<(PathBuf, String)> = None;
        if let Some(pointer) = cache.cached(filename) {
            let blob = cache::blob_of(&pointer);
            let name = blob.file_name().map(|n| n.to_string_lossy().into_owned());
            let expected = verify::Expected {
                size: None,
                etag: name.as_deref(),
            };
            match verify::check(&blob, filename, &expected) {
                Ok(()) => return Ok(pointer),
                Err(why) => corrupt = Some((blob, why)),
            }
        }
        let corrupt_note = corrupt.as_ref().map(|(blob, why)| {
            format!(
                " The cached copy {} is corrupt ({why}): remove it and rerun with the hub reachable.",
                blob.display()
            )
        });
        if self.settings.offline {
            return Err(usage!(
                "cannot fetch {what}: HF_HUB_OFFLINE is set and {}{}. Unset HF_HUB_OFFLINE to \
                 download it, or {OFFLINE_WAYS}.",
                if corrupt.is_some() {
                    "the cached copy is unusable".to_string()
                } else {
                    format!(
                        "it is not in the cache ({})",
                        self.settings.cache_dir.display()
                    )
                },
                corrupt_note.as_deref().unwrap_or("")
            ));
        }
        if let Some((blob, why)) = &corrupt {
            self.say(format!(
                "the cached {filename} ({}) is corrupt: {why}; downloading it again",
                blob.display()
            ));
        }
        self.download(repo, filename, &cache)
            .map_err(|f| self.explain(f, repo, filename, corrupt_note.as_deref().unwrap_or("")))
    }

    fn download(
        &self,
        repo: &Repo,
        filename: &str,
        cache: &cache::CacheRepo,
    ) -> Result<PathBuf, Failure> {
        let s = &self.settings;
        let url = download::resolve_url(&s.endpoint, repo, filename);
        let mut last = Failure::Transient("no attempt made".into());
        for attempt in 1..=s.attempts.max(1) {
            download::backoff(attempt);
            let remote = match download::metadata(&self.http, s, &url) {
                Ok(r) => r,
                Err(f @ Failure::Transient(_)) => {
                    last = f;
                    continue;
                }
                Err(f) => return Err(f),
            };
            let blob = cache.blob(&remote.etag);
            let part = cache.incomplete(&remote.etag);
            let link = |remote: &download::Remote| {
                cache
                    .link(&remote.commit, filename, &remote.etag)
                    .map_err(|e| Failure::Io(format!("linking {filename} into the cache: {e}")))
            };
            let expected = verify::Expected {
                size: remote.size,
                etag: Some(&remote.etag),
            };
            if verify::check(&blob, filename, &expected).is_ok() {
                // Same bytes under another revision or file name.
                return link(&remote);
            }
            // A holder with no progress for this long has failed; its own timeouts are shorter.
            let patience = (s.timeouts.connect + s.timeouts.response + s.timeouts.stall) * 3
                + Duration::from_secs(10);
            let _lock = match lock::acquire(&cache.lock(&remote.etag), &part, patience, || {
                self.say(format!(
                    "waiting for another process downloading {filename} (lock {})",
                    cache.lock(&remote.etag).display()
                ))
            }) {
                Ok(lock::Acquired::Free(l)) => l,
                Ok(lock::Acquired::AfterWaiting(l)) => {
                    if verify::check(&blob, filename, &expected).is_ok() {
                        self.say(format!(
                            "using {filename} as the other process downloaded it"
                        ));
                        return link(&remote);
                    }
                    l
                }
                Err(e) => return Err(Failure::Io(format!("{e:#}"))),
            };
            if let Some(dir) = part.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| Failure::Io(format!("creating {}: {e}", dir.display())))?;
            }
            let fetched = download::fetch(&self.http, s, &url, filename, &remote, &part)
                .and_then(|()| download::verify_part(&part, filename, &remote));
            match fetched {
                Ok(()) => {
                    std::fs::rename(&part, &blob).map_err(|e| {
                        Failure::Io(format!("moving {} into place: {e}", part.display()))
                    })?;
                    return link(&remote);
                }
                Err(f @ Failure::Transient(_)) => {
                    if let Failure::Transient(why) = &f {
                        if attempt < s.attempts {
                            self.say(format!(
                                "{filename}: {why}; retrying ({}/{})",
                                attempt + 1,
                                s.attempts
                            ));
                        }
                    }
                    last = f;
                }
                Err(f) => return Err(f),
            }
        }
        Err(last)
    }

    /// Turns a failure into the error the user reads: what, where, and what to do.
    fn explain(&self, f: Failure, repo: &Repo, filename: &str, note: &str) -> anyhow::Error {
        let what = describe(repo, filename);
        let ep = &self.settings.endpoint;
        let rev = repo.revision();
        match f {
            Failure::NoSuchFile if filename == "model.safetensors" => usage!(
                "cannot fetch {what}: the repository has no model.safetensors at revision {rev} \
                 ({ep}). Run with --model initialized (needs only config and tokenizer), or pass a \
                 local checkpoint with --model-dir DIR.{note}"
            ),
            Failure::NoSuchFile => usage!(
                "cannot fetch {what}: the repository has no {filename} at revision {rev} ({ep}).{note}"
            ),
            Failure::NoSuchRevision => usage!(
                "cannot fetch {what}: revision {rev} not found on {ep}; check --revision.{note}"
            ),
            Failure::NoAccess(code) => usage!(
                "cannot fetch {what}: {} answered {code}: the repository was not found, or is \
                 private or gated. Check the id{}.{note}",
                ep,
                if self.settings.token.is_some() {
                    ", or whether the token in use (HF_TOKEN or the token file) has access"
                } else {
                    ", or set HF_TOKEN to a token with access"
                }
            ),
            Failure::Transient(why) | Failure::Protocol(why) => anyhow!(
                "cannot fetch {what} from {ep}: {why}. This is a network failure, not a problem \
                 with the input: check the connection, a proxy (HTTPS_PROXY) or HF_ENDPOINT and \
                 rerun (a partial download resumes); or work offline: {OFFLINE_WAYS}.{note}"
            ),
            Failure::Io(why) => anyhow!("cannot fetch {what}: {why}.{note}"),
        }
    }
}

/// Whether a hub repo has a file, looking only in the cache.
fn in_cache(hub: &Hub, repo: &Repo, filename: &str) -> bool {
    cache::CacheRepo::new(&hub.settings.cache_dir, repo)
        .cached(filename)
        .is_some()
}

/// Resolves the model's files. `need_weights` is false for `--model initialized`; the hub client
/// is made only when the source is the hub (so a bad HF_* variable cannot fail a local run).
pub fn model_files(
    source: &ModelSource,
    need_weights: bool,
    hub: impl FnOnce() -> Result<Hub>,
) -> Result<ModelFiles> {
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
            let hub = &hub()?;
            let repo = Repo::with_revision(id.clone(), RepoType::Model, revision.clone());
            let config = hub.file(&repo, "config.json")?;
            // Prefer tokenizer.json; fall back to vocab.txt when only that one is cached or exists.
            let tokenizer =
                if in_cache(hub, &repo, "tokenizer.json") || !in_cache(hub, &repo, "vocab.txt") {
                    match hub.file(&repo, "tokenizer.json") {
                        Ok(p) => p,
                        Err(e) => hub.file(&repo, "vocab.txt").map_err(|_| e)?,
                    }
                } else {
                    hub.file(&repo, "vocab.txt")?
                };
            let weights = if need_weights {
                Some(hub.file(&repo, "model.safetensors")?)
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
pub fn wikitext_parquet(hub: &Hub, split: &str) -> Result<PathBuf> {
    let repo = Repo::with_revision(
        WIKITEXT_REPO.to_string(),
        RepoType::Dataset,
        "main".to_string(),
    );
    hub.file(
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
