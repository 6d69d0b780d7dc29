//! How the hub client is configured: the environment variables the Hugging Face tools read
//! (`HF_ENDPOINT`, `HF_TOKEN`, `HF_HOME`, `HF_HUB_CACHE`, `HF_HUB_OFFLINE`,
//! `HF_HUB_ETAG_TIMEOUT`, `HF_HUB_DOWNLOAD_TIMEOUT`, `HF_HUB_DISABLE_PROGRESS_BARS`) with the same
//! meaning and precedence as `huggingface_hub`, plus our TCP connect timeout.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Result;

use crate::usage;

/// Every wait on the network is bounded by one of these.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timeouts {
    /// TCP (and TLS) connection set-up: `APPROX_BENCH_CONNECT_TIMEOUT`, default 5 s.
    pub connect: Duration,
    /// From sending a request to its response headers: `HF_HUB_ETAG_TIMEOUT`, default 10 s
    /// (huggingface_hub's default for the metadata request).
    pub response: Duration,
    /// Longest silence while a body streams in (a stall): `HF_HUB_DOWNLOAD_TIMEOUT`, default
    /// 10 s, as in huggingface_hub, where it is the read timeout of the download.
    pub stall: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(5),
            response: Duration::from_secs(10),
            stall: Duration::from_secs(10),
        }
    }
}

/// Whether download progress may be drawn; `--quiet` turns it off for the whole process.
static PROGRESS_ALLOWED: AtomicBool = AtomicBool::new(true);

/// Turns the hub's progress output (bars and "downloading …" lines) on or off process-wide.
pub fn allow_progress(on: bool) {
    PROGRESS_ALLOWED.store(on, Ordering::Relaxed);
}

/// How downloads report themselves on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Nothing (`--quiet`, or `HF_HUB_DISABLE_PROGRESS_BARS=1` off a terminal).
    Silent,
    /// One line per file ("downloading X (N MB) from ENDPOINT") — stderr is not a terminal.
    Lines,
    /// An indicatif bar per file: name, size, rate, ETA.
    Bar,
}

/// The hub client's configuration.
#[derive(Clone, PartialEq)]
pub struct HubSettings {
    /// Base URL of the hub, without a trailing slash.
    pub endpoint: String,
    /// Sent as `Authorization: Bearer …`; never printed, never written anywhere.
    pub token: Option<String>,
    /// The cache directory (`…/hub`), laid out as huggingface_hub lays it out.
    pub cache_dir: PathBuf,
    /// Cache only: no network attempt at all.
    pub offline: bool,
    pub timeouts: Timeouts,
    /// Attempts per file for transient failures (timeouts, resets, 5xx, a bad checksum).
    pub attempts: u32,
    pub progress: Progress,
}

impl std::fmt::Debug for HubSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubSettings")
            .field("endpoint", &self.endpoint)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("cache_dir", &self.cache_dir)
            .field("offline", &self.offline)
            .field("timeouts", &self.timeouts)
            .field("attempts", &self.attempts)
            .field("progress", &self.progress)
            .finish()
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|s| !s.trim().is_empty())
}

/// huggingface_hub's truthy values for boolean variables.
fn truthy(name: &str) -> bool {
    var(name).is_some_and(|v| {
        matches!(
            v.trim().to_ascii_uppercase().as_str(),
            "1" | "ON" | "YES" | "TRUE"
        )
    })
}

fn seconds(name: &str, default: Duration) -> Result<Duration> {
    match var(name) {
        None => Ok(default),
        Some(s) => match s.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v > 0.0 && v < 1e6 => Ok(Duration::from_secs_f64(v)),
            _ => Err(usage!(
                "{name}={s}: expected a positive number of seconds, e.g. {name}={}",
                default.as_secs()
            )),
        },
    }
}

/// `HF_HOME`, else `~/.cache/huggingface`.
fn hf_home() -> PathBuf {
    if let Some(h) = var("HF_HOME") {
        return PathBuf::from(h);
    }
    let base = var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    base.join("huggingface")
}

impl HubSettings {
    /// Reads the environment as the Hugging Face tools do. Bad values are usage errors naming
    /// the variable.
    pub fn from_env() -> Result<Self> {
        let home = hf_home();
        let cache_dir = var("HF_HUB_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join("hub"));
        // HF_TOKEN first, then the token file (HF_TOKEN_PATH, else $HF_HOME/token).
        let token = var("HF_TOKEN").map(|t| t.trim().to_string()).or_else(|| {
            let path = var("HF_TOKEN_PATH")
                .map(PathBuf::from)
                .unwrap_or_else(|| home.join("token"));
            std::fs::read_to_string(path)
                .ok()
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
        });
        let defaults = Timeouts::default();
        let timeouts = Timeouts {
            connect: seconds("APPROX_BENCH_CONNECT_TIMEOUT", defaults.connect)?,
            response: seconds("HF_HUB_ETAG_TIMEOUT", defaults.response)?,
            stall: seconds("HF_HUB_DOWNLOAD_TIMEOUT", defaults.stall)?,
        };
        let progress = if !PROGRESS_ALLOWED.load(Ordering::Relaxed) {
            Progress::Silent
        } else if std::io::stderr().is_terminal() {
            if truthy("HF_HUB_DISABLE_PROGRESS_BARS") {
                Progress::Lines
            } else {
                Progress::Bar
            }
        } else {
            Progress::Lines
        };
        Ok(Self {
            endpoint: var("HF_ENDPOINT")
                .unwrap_or_else(|| "https://huggingface.co".to_string())
                .trim_end_matches('/')
                .to_string(),
            token,
            cache_dir,
            offline: truthy("HF_HUB_OFFLINE"),
            timeouts,
            attempts: 3,
            progress,
        })
    }
}
