//! One file from the hub's resolve API into the cache, on ureq with a bound on every wait.
//!
//! Why not a crate's downloader: measured against a loopback hub that injects faults (see the
//! commit introducing this file), hf-hub 0.5's sync API sets no HTTP timeout (a silent hub or a
//! stalled body hangs forever), links a body cut short without Content-Length as complete, and
//! fails a second process with "Lock acquisition failed"; hf-hub 1.0 (reqwest + tokio + hf-xet)
//! still links a short body without checking its size or sha256 and gives up on a held lock
//! after 10 s. ureq 3 (hf-hub 0.5's own HTTP client) has the timeouts — connect, response
//! headers, and a per-read stall timeout — so what is written here is the protocol: metadata,
//! resume, verification, cooperation and progress.
//!
//! The protocol is huggingface_hub's: HEAD `{endpoint}/{repo}/resolve/{revision}/{file}`
//! following only relative redirects; `X-Repo-Commit` is the commit, `X-Linked-Etag` (LFS: the
//! sha256) else `ETag` the blob name, `X-Linked-Size` else `Content-Length` the size; then GET
//! the same URL (redirected to the CDN for LFS files) into `blobs/<etag>.incomplete`, resuming
//! with `Range` after a cut, verify, rename to `blobs/<etag>`, link the snapshot entry. Files
//! are fetched over plain HTTP even where the hub stores them with Xet: the resolve URL serves
//! every file, and Xet's chunk protocol would only pay off for re-downloads of changed files.

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use super::settings::{HubSettings, Progress};
use super::verify;

/// Why a request failed, sorted by what the user should do about it.
#[derive(Debug)]
pub enum Failure {
    /// 404 with `X-Error-Code: EntryNotFound`: the repo exists, the file does not.
    NoSuchFile,
    /// 404 `RevisionNotFound`.
    NoSuchRevision,
    /// 401/403, or 404 `RepositoryNotFound`: not found, private or gated.
    NoAccess(u16),
    /// Worth another attempt: timeouts, refused or reset connections, 5xx, 429, a body cut short
    /// or failing its checksum.
    Transient(String),
    /// The hub answered something we cannot use (missing headers); retrying will not help.
    Protocol(String),
    /// A local I/O error (disk full, permissions).
    Io(String),
}

/// What the metadata request told us.
#[derive(Debug, Clone)]
pub struct Remote {
    pub commit: String,
    pub etag: String,
    pub size: Option<u64>,
}

/// The two HTTP agents: metadata requests follow no redirect (we follow relative ones ourselves,
/// as the CDN's redirect target knows nothing of the repo), downloads follow them.
pub struct Http {
    head: ureq::Agent,
    get: ureq::Agent,
    token: Option<String>,
}

impl Http {
    pub fn new(s: &HubSettings) -> Self {
        let base = |redirects: u32, per_read: Option<Duration>| {
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .max_redirects(redirects)
                // The token goes to the hub only, never to the CDN a redirect names.
                .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
                .timeout_connect(Some(s.timeouts.connect))
                .timeout_resolve(Some(s.timeouts.connect))
                .timeout_send_request(Some(s.timeouts.response))
                .timeout_recv_response(Some(s.timeouts.response))
                .timeout_per_read(per_read)
                .user_agent(concat!("approx-bench/", env!("CARGO_PKG_VERSION")))
                .build()
                .new_agent()
        };
        Self {
            // A metadata request has no body: its one wait is for the response.
            head: base(0, None),
            get: base(10, Some(s.timeouts.stall)),
            token: s.token.clone(),
        }
    }

    fn auth<B>(&self, r: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        // identity: the bytes must be the file's bytes, whose size and hash we check.
        let r = r.header("Accept-Encoding", "identity");
        match &self.token {
            Some(t) => r.header("Authorization", format!("Bearer {t}")),
            None => r,
        }
    }
}

fn transient(e: ureq::Error, timeouts: &super::settings::Timeouts) -> Failure {
    use ureq::Error as E;
    let why = match &e {
        E::Timeout(t) => {
            let (what, var, v) = match t {
                ureq::Timeout::Connect | ureq::Timeout::Resolve => (
                    "no connection",
                    "APPROX_BENCH_CONNECT_TIMEOUT",
                    timeouts.connect,
                ),
                ureq::Timeout::PerRead | ureq::Timeout::RecvBody => (
                    "the transfer stalled",
                    "HF_HUB_DOWNLOAD_TIMEOUT",
                    timeouts.stall,
                ),
                _ => ("no response", "HF_HUB_ETAG_TIMEOUT", timeouts.response),
            };
            format!(
                "{what} within {:.0} s (timeout {t}; set {var} to change it)",
                v.as_secs_f64()
            )
        }
        E::HostNotFound => "host not found (no network, or a wrong HF_ENDPOINT)".to_string(),
        E::ConnectionFailed => "connection refused".to_string(),
        E::Io(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            "connection refused (nothing listens at the endpoint)".to_string()
        }
        other => other.to_string(),
    };
    Failure::Transient(why)
}

fn header(r: &ureq::http::Response<ureq::Body>, name: &str) -> Option<String> {
    r.headers()
        .get(name)?
        .to_str()
        .ok()
        .map(|s| s.trim().to_string())
}

/// `"abc"`, `W/"abc"` → `abc`.
fn clean_etag(raw: &str) -> String {
    raw.trim_start_matches("W/").trim_matches('"').to_string()
}

fn status_failure(status: u16, error_code: Option<&str>) -> Failure {
    match (status, error_code) {
        (404, Some("EntryNotFound")) => Failure::NoSuchFile,
        (404, Some("RevisionNotFound")) => Failure::NoSuchRevision,
        (401 | 403, _) | (404, _) => Failure::NoAccess(status),
        (s, _) if s == 429 || s >= 500 => Failure::Transient(format!("the hub answered HTTP {s}")),
        (s, _) => Failure::Protocol(format!("the hub answered HTTP {s}")),
    }
}

/// HEAD on the resolve URL, following relative redirects only (a renamed repo), never the CDN.
pub fn metadata(http: &Http, s: &HubSettings, url: &str) -> Result<Remote, Failure> {
    let mut url = url.to_string();
    for _ in 0..5 {
        let r = http
            .auth(http.head.head(&url))
            .call()
            .map_err(|e| transient(e, &s.timeouts))?;
        let status = r.status().as_u16();
        if (300..400).contains(&status) {
            if let Some(loc) = header(&r, "location").filter(|l| l.starts_with('/')) {
                let origin_end = url[url.find("://").map_or(0, |i| i + 3)..]
                    .find('/')
                    .map_or(url.len(), |i| i + url.find("://").map_or(0, |j| j + 3));
                url = format!("{}{loc}", &url[..origin_end]);
                continue;
            }
        } else if !(200..300).contains(&status) {
            return Err(status_failure(
                status,
                header(&r, "x-error-code").as_deref(),
            ));
        }
        let commit = header(&r, "x-repo-commit")
            .ok_or_else(|| Failure::Protocol("no X-Repo-Commit header in the answer".into()))?;
        let etag = header(&r, "x-linked-etag")
            .or_else(|| header(&r, "etag"))
            .map(|e| clean_etag(&e))
            .filter(|e| !e.is_empty() && !e.contains('/') && !e.contains(".."))
            .ok_or_else(|| Failure::Protocol("no usable ETag header in the answer".into()))?;
        let size = header(&r, "x-linked-size")
            .or_else(|| header(&r, "content-length"))
            .and_then(|v| v.parse().ok());
        return Ok(Remote { commit, etag, size });
    }
    Err(Failure::Protocol("more than 5 redirects".into()))
}

/// Draws the progress of one download.
struct Meter {
    bar: Option<indicatif::ProgressBar>,
}

impl Meter {
    fn start(s: &HubSettings, filename: &str, size: Option<u64>, done: u64) -> Self {
        let mb = size.map(|b| format!("{:.1} MB", b as f64 / 1e6));
        match s.progress {
            Progress::Silent => Self { bar: None },
            Progress::Lines => {
                eprintln!(
                    "downloading {filename} ({}) from {}{}",
                    mb.as_deref().unwrap_or("size unknown"),
                    s.endpoint,
                    if done > 0 {
                        format!(", resuming at {:.1} MB", done as f64 / 1e6)
                    } else {
                        String::new()
                    }
                );
                Self { bar: None }
            }
            Progress::Bar => {
                let bar = indicatif::ProgressBar::with_draw_target(
                    size,
                    indicatif::ProgressDrawTarget::stderr(),
                );
                let style = indicatif::ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
                )
                .expect("static template")
                .progress_chars("=> ");
                bar.set_style(style);
                bar.set_prefix(format!("downloading {filename}"));
                bar.set_position(done);
                bar.reset_eta();
                Self { bar: Some(bar) }
            }
        }
    }
    fn inc(&self, k: u64) {
        if let Some(b) = &self.bar {
            b.inc(k);
        }
    }
    fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}

fn io<'a>(what: &'static str, p: &'a Path) -> impl FnOnce(std::io::Error) -> Failure + 'a {
    move |e| Failure::Io(format!("{what} {}: {e}", p.display()))
}

/// GETs `url` into `part`, resuming from what `part` already holds; returns once the body ended
/// (the caller verifies it). A partial file is left in place for the next attempt.
pub fn fetch(
    http: &Http,
    s: &HubSettings,
    url: &str,
    filename: &str,
    remote: &Remote,
    part: &Path,
) -> Result<(), Failure> {
    let mut have = std::fs::metadata(part).map(|m| m.len()).unwrap_or(0);
    if remote.size.is_some_and(|size| have >= size) {
        // Complete or overlong: start again rather than trust it blindly.
        have = 0;
    }
    let mut req = http.auth(http.get.get(url));
    if have > 0 {
        req = req.header("Range", format!("bytes={have}-"));
    }
    let mut r = req.call().map_err(|e| transient(e, &s.timeouts))?;
    let status = r.status().as_u16();
    let resumed = status == 206
        && header(&r, "content-range").is_some_and(|cr| cr.starts_with(&format!("bytes {have}-")));
    if status == 416 || (200..300).contains(&status) && !resumed {
        have = 0;
    }
    if status == 416 {
        // The range no longer fits the file: fetch it whole on the next attempt.
        let _ = std::fs::remove_file(part);
        return Err(Failure::Transient(
            "the server refused to resume (HTTP 416)".into(),
        ));
    }
    if !(200..300).contains(&status) {
        return Err(status_failure(
            status,
            header(&r, "x-error-code").as_deref(),
        ));
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(have > 0)
        .truncate(have == 0)
        .open(part)
        .map_err(io("writing", part))?;
    let meter = Meter::start(s, filename, remote.size, have);
    let mut body = r.body_mut().as_reader();
    let mut buf = vec![0u8; 256 << 10];
    let result = loop {
        match body.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(k) => {
                if let Err(e) = file.write_all(&buf[..k]) {
                    break Err(io("writing", part)(e));
                }
                meter.inc(k as u64);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                let timed_out = matches!(
                    e.kind(),
                    std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                ) || e.to_string().contains("timeout");
                break Err(Failure::Transient(if timed_out {
                    format!(
                        "the transfer stalled: no data for {:.0} s (set HF_HUB_DOWNLOAD_TIMEOUT to change it)",
                        s.timeouts.stall.as_secs_f64()
                    )
                } else {
                    format!("the transfer broke off: {e}")
                }));
            }
        }
    };
    meter.finish();
    file.flush().map_err(io("writing", part))?;
    result
}

/// Verifies a finished `part` against the metadata; a wrong length keeps it for a resume, a
/// wrong hash (nothing to resume from) deletes it.
pub fn verify_part(part: &Path, filename: &str, remote: &Remote) -> Result<(), Failure> {
    let expected = verify::Expected {
        size: remote.size,
        etag: Some(&remote.etag),
    };
    verify::check(part, filename, &expected).map_err(|why| {
        let short = remote
            .size
            .zip(std::fs::metadata(part).ok().map(|m| m.len()))
            .is_some_and(|(want, got)| got < want);
        if !short {
            let _ = std::fs::remove_file(part);
        }
        Failure::Transient(format!("the download failed verification: {why}"))
    })
}

/// Sleeps before attempt `attempt` (1-based; none before the first).
pub fn backoff(attempt: u32) {
    if attempt > 1 {
        std::thread::sleep(Duration::from_millis(500 * u64::from(attempt - 1)));
    }
}

/// The resolve URL of a file.
pub fn resolve_url(endpoint: &str, repo: &hf_hub::Repo, filename: &str) -> String {
    format!(
        "{endpoint}/{}/resolve/{}/{filename}",
        repo.url(),
        repo.url_revision()
    )
}
