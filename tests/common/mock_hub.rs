//! A loopback imitation of the Hugging Face hub's resolve API, with faults on demand.
//!
//! `HEAD|GET /{repo}/resolve/{revision}/{file}` answers as the hub does: small files directly
//! (`ETag` = git blob id, `X-Repo-Commit`, `Content-Length`), LFS files with a 302 to
//! `/cdn/{sha256}` carrying `X-Linked-Etag` (the sha256) and `X-Linked-Size`; the CDN serves
//! `Range` requests with 206 and `Content-Range`. An unknown repo is 401 `RepositoryNotFound`
//! (the hub's answer to anonymous requests), an unknown file 404 `EntryNotFound`, an unknown
//! revision 404 `RevisionNotFound`. Every request is logged with its headers.
//!
//! Faults ([`Fault`]) are attached to a file name for a number of requests. The server never
//! keeps a connection longer than [`HOLD_LIMIT`] and stops when dropped, so no test can hang on it.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

pub const COMMIT: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678";
/// The longest a faulty connection is held open (silent hub, stalled body).
pub const HOLD_LIMIT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// Accept, read the request, never answer.
    Silent,
    /// Answer the resolve request with this status and `X-Error-Code`.
    Status(u16, &'static str),
    /// Send the headers (with Content-Length) and this many body bytes, then go silent.
    StallAfter(usize),
    /// No Content-Length; send this many bytes and close (a cut the client can't see).
    CutNoLength(usize),
    /// Full Content-Length; send this many bytes and close.
    CutWithLength(usize),
    /// The right length, one byte wrong.
    Corrupt,
    /// Send the body at this many bytes per second.
    Slow(usize),
}

#[derive(Debug, Clone)]
pub struct Logged {
    pub method: String,
    pub path: String,
    pub headers: HashMap<String, String>,
}

struct File {
    bytes: Vec<u8>,
    lfs: bool,
}

#[derive(Default)]
struct Inner {
    /// repo url prefix ("org/name" or "datasets/org/name") → file name → file
    repos: HashMap<String, HashMap<String, File>>,
    /// file name → (fault, remaining requests it applies to)
    faults: HashMap<String, (Fault, usize)>,
    log: Vec<Logged>,
}

pub struct MockHub {
    pub addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    stop: Arc<AtomicBool>,
}

pub fn sha256(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

fn git_sha1(bytes: &[u8]) -> String {
    use sha1::Digest as _;
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", bytes.len()).as_bytes());
    h.update(bytes);
    format!("{:x}", h.finalize())
}

impl MockHub {
    pub fn start() -> Self {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let stop = Arc::new(AtomicBool::new(false));
        // The CDN is another host, as on the real hub (a token must not follow a redirect
        // there): a second listener on 127.0.0.2, loopback like 127.0.0.1.
        let cdn = TcpListener::bind("127.0.0.2:0")
            .or_else(|_| TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let cdn_addr = cdn.local_addr().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        for l in [listener, cdn] {
            l.set_nonblocking(true).unwrap();
            let (i2, s2) = (inner.clone(), stop.clone());
            std::thread::spawn(move || {
                while !s2.load(Ordering::Relaxed) {
                    match l.accept() {
                        Ok((conn, _)) => {
                            conn.set_nonblocking(false).unwrap();
                            let (i3, s3) = (i2.clone(), s2.clone());
                            std::thread::spawn(move || serve(conn, cdn_addr, &i3, &s3));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            });
        }
        Self { addr, inner, stop }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Adds a file; `repo` is the URL prefix ("org/name" for models, "datasets/org/name").
    pub fn add(&self, repo: &str, name: &str, bytes: Vec<u8>, lfs: bool) {
        self.inner
            .lock()
            .unwrap()
            .repos
            .entry(repo.to_string())
            .or_default()
            .insert(name.to_string(), File { bytes, lfs });
    }

    /// Applies `fault` to the next `times` requests concerning file `name` (usize::MAX: always).
    pub fn fault(&self, name: &str, fault: Fault, times: usize) {
        self.inner
            .lock()
            .unwrap()
            .faults
            .insert(name.to_string(), (fault, times));
    }

    pub fn clear_faults(&self) {
        self.inner.lock().unwrap().faults.clear();
    }

    pub fn log(&self) -> Vec<Logged> {
        self.inner.lock().unwrap().log.clone()
    }

    /// Requests whose path contains `part`, with method `method`.
    pub fn count(&self, method: &str, part: &str) -> usize {
        self.log()
            .iter()
            .filter(|l| l.method == method && l.path.contains(part))
            .count()
    }
}

impl Drop for MockHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn take_fault(inner: &Mutex<Inner>, name: &str) -> Option<Fault> {
    let mut g = inner.lock().unwrap();
    // "*" applies to every file.
    let key = if g.faults.contains_key(name) {
        name
    } else {
        "*"
    };
    let (fault, left) = g.faults.get_mut(key)?;
    if *left == 0 {
        return None;
    }
    if *left != usize::MAX {
        *left -= 1;
    }
    Some(*fault)
}

fn hold(stop: &AtomicBool) {
    let t0 = Instant::now();
    while !stop.load(Ordering::Relaxed) && t0.elapsed() < HOLD_LIMIT {
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read_request(conn: &mut TcpStream) -> Option<Logged> {
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut buf = Vec::new();
    let mut b = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let k = conn.read(&mut b).ok()?;
        if k == 0 || buf.len() > 64 << 10 {
            return None;
        }
        buf.extend_from_slice(&b[..k]);
    }
    let text = String::from_utf8_lossy(&buf).to_string();
    let mut lines = text.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let (method, path) = (first.next()?.to_string(), first.next()?.to_string());
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Some(Logged {
        method,
        path,
        headers,
    })
}

fn head(conn: &mut TcpStream, status: u16, headers: &[(&str, String)]) -> bool {
    let reason = match status {
        200 => "OK",
        206 => "Partial Content",
        302 => "Found",
        401 => "Unauthorized",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        _ => "Status",
    };
    let mut s = format!("HTTP/1.1 {status} {reason}\r\nConnection: close\r\n");
    for (k, v) in headers {
        s.push_str(&format!("{k}: {v}\r\n"));
    }
    s.push_str("\r\n");
    conn.write_all(s.as_bytes()).is_ok()
}

fn serve(mut conn: TcpStream, cdn: SocketAddr, inner: &Mutex<Inner>, stop: &AtomicBool) {
    let Some(req) = read_request(&mut conn) else {
        return;
    };
    inner.lock().unwrap().log.push(req.clone());
    let is_head = req.method == "HEAD";
    if let Some(sha) = req.path.strip_prefix("/cdn/") {
        let found = {
            let g = inner.lock().unwrap();
            g.repos
                .values()
                .flat_map(|files| files.iter())
                .find(|(_, f)| sha256(&f.bytes) == sha)
                .map(|(n, f)| (n.clone(), f.bytes.clone()))
        };
        match found {
            Some((name, bytes)) => body(&mut conn, &req, &name, &bytes, inner, stop, is_head),
            None => {
                head(&mut conn, 404, &[("Content-Length", "0".into())]);
            }
        }
        return;
    }
    let Some((repo, rest)) = req.path.trim_start_matches('/').split_once("/resolve/") else {
        head(&mut conn, 404, &[("Content-Length", "0".into())]);
        return;
    };
    let (rev, name) = rest.split_once('/').unwrap_or((rest, ""));
    if let Some(f) = take_fault(inner, name) {
        match f {
            Fault::Silent => return hold(stop),
            Fault::Status(code, error) => {
                head(
                    &mut conn,
                    code,
                    &[
                        ("X-Error-Code", error.into()),
                        ("Content-Length", "0".into()),
                    ],
                );
                return;
            }
            // Body faults: put back for the body request.
            _ => {
                let mut g = inner.lock().unwrap();
                let key = if g.faults.contains_key(name) {
                    name
                } else {
                    "*"
                };
                let e = g.faults.get_mut(key).unwrap();
                if e.1 != usize::MAX {
                    e.1 += 1;
                }
            }
        }
    }
    let file = {
        let g = inner.lock().unwrap();
        match g.repos.get(repo) {
            None => Err((401, "RepositoryNotFound")),
            Some(_) if rev != "main" && rev != COMMIT => Err((404, "RevisionNotFound")),
            Some(files) => files
                .get(name)
                .map(|f| (f.bytes.clone(), f.lfs))
                .ok_or((404, "EntryNotFound")),
        }
    };
    match file {
        Err((code, error)) => {
            head(
                &mut conn,
                code,
                &[
                    ("X-Error-Code", error.into()),
                    ("Content-Length", "0".into()),
                ],
            );
        }
        Ok((bytes, true)) => {
            let sha = sha256(&bytes);
            head(
                &mut conn,
                302,
                &[
                    ("Location", format!("http://{cdn}/cdn/{sha}")),
                    ("X-Repo-Commit", COMMIT.into()),
                    ("X-Linked-Etag", format!("\"{sha}\"")),
                    ("X-Linked-Size", bytes.len().to_string()),
                    ("ETag", format!("\"{}\"", git_sha1(b"pointer"))),
                    ("Content-Length", "0".into()),
                ],
            );
        }
        Ok((bytes, false)) => {
            let extra = [
                ("X-Repo-Commit", COMMIT.to_string()),
                ("ETag", format!("\"{}\"", git_sha1(&bytes))),
            ];
            body_with(&mut conn, &req, name, &bytes, inner, stop, is_head, &extra);
        }
    }
}

fn body(
    conn: &mut TcpStream,
    req: &Logged,
    name: &str,
    bytes: &[u8],
    inner: &Mutex<Inner>,
    stop: &AtomicBool,
    is_head: bool,
) {
    body_with(conn, req, name, bytes, inner, stop, is_head, &[])
}

#[allow(clippy::too_many_arguments)]
fn body_with(
    conn: &mut TcpStream,
    req: &Logged,
    name: &str,
    bytes: &[u8],
    inner: &Mutex<Inner>,
    stop: &AtomicBool,
    is_head: bool,
    extra: &[(&str, String)],
) {
    let total = bytes.len();
    let start = req
        .headers
        .get("range")
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split('-').next())
        .and_then(|s| s.parse::<usize>().ok());
    let mut headers: Vec<(&str, String)> = extra.to_vec();
    let (status, slice) = match start {
        Some(s) if s >= total => {
            headers.push(("Content-Range", format!("bytes */{total}")));
            headers.push(("Content-Length", "0".into()));
            head(conn, 416, &headers);
            return;
        }
        Some(s) => {
            headers.push(("Content-Range", format!("bytes {s}-{}/{total}", total - 1)));
            (206, &bytes[s..])
        }
        None => (200, bytes),
    };
    let fault = if is_head {
        None
    } else {
        take_fault(inner, name)
    };
    let mut data = slice.to_vec();
    let (send, close_early) = match fault {
        Some(Fault::StallAfter(k)) => (k.min(data.len()), false),
        Some(Fault::CutNoLength(k)) | Some(Fault::CutWithLength(k)) => (k.min(data.len()), true),
        Some(Fault::Corrupt) => {
            let mid = data.len() / 2;
            data[mid] ^= 0xff;
            (data.len(), true)
        }
        _ => (data.len(), true),
    };
    if !matches!(fault, Some(Fault::CutNoLength(_))) {
        headers.push(("Content-Length", data.len().to_string()));
    }
    if !head(conn, status, &headers) || is_head {
        return;
    }
    match fault {
        Some(Fault::Slow(rate)) => {
            let chunk = (rate / 20).max(1);
            for piece in data.chunks(chunk) {
                if stop.load(Ordering::Relaxed) || conn.write_all(piece).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        _ => {
            let _ = conn.write_all(&data[..send]);
            let _ = conn.flush();
        }
    }
    if !close_early {
        hold(stop);
    }
}
