//! The hub path against a loopback hub that misbehaves (tests/common/mock_hub.rs): every fault
//! of issue 12 ends in a bounded failure with its message and exit status, a healed cache, or
//! both runs succeeding. Library-level tests use short timeouts; the CLI tests run the binary
//! with the environment a user would set.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use approx_bench::inputs::hub::{Hub, HubSettings, Progress, Timeouts};
use common::mock_hub::{sha256, Fault, MockHub, COMMIT};
use common::wait;
use hf_hub::{Repo, RepoType};

const MODEL: &str = "tiny-org/tiny-bert";

fn settings(hub: &MockHub, cache: &Path) -> HubSettings {
    HubSettings {
        endpoint: hub.endpoint(),
        token: None,
        cache_dir: cache.to_path_buf(),
        offline: false,
        timeouts: Timeouts {
            connect: Duration::from_secs(2),
            response: Duration::from_millis(700),
            stall: Duration::from_millis(700),
        },
        attempts: 3,
        progress: Progress::Silent,
    }
}

fn model_repo() -> Repo {
    Repo::with_revision(MODEL.into(), RepoType::Model, "main".into())
}

/// A valid safetensors file of `n` f32 values (seeded bytes), so structure checks apply.
fn weights(n: usize) -> Vec<u8> {
    let header = format!(
        r#"{{"w":{{"dtype":"F32","shape":[{n}],"data_offsets":[0,{}]}}}}"#,
        4 * n
    );
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    let mut x = 0x2545f4914f6cdd1du64;
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&((x >> 40) as f32 / 1e7).to_le_bytes());
    }
    v
}

fn hub_with_files() -> (MockHub, Vec<u8>) {
    let hub = MockHub::start();
    let w = weights(50_000); // 200 kB
    hub.add(
        MODEL,
        "config.json",
        br#"{"hidden_size": 32}"#.to_vec(),
        false,
    );
    hub.add(MODEL, "model.safetensors", w.clone(), true);
    (hub, w)
}

fn no_blob_named(cache: &Path, sha: &str) -> bool {
    !cache
        .join("models--tiny-org--tiny-bert/blobs")
        .join(sha)
        .exists()
}

#[test]
fn a_cold_cache_is_filled_as_huggingface_hub_fills_it_and_then_used_without_the_network() {
    let (hub, w) = hub_with_files();
    let tmp = tempfile::tempdir().unwrap();
    let client = Hub::new(settings(&hub, tmp.path()));
    let p = client.file(&model_repo(), "model.safetensors").unwrap();
    let root = tmp.path().join("models--tiny-org--tiny-bert");
    assert_eq!(
        p,
        root.join("snapshots")
            .join(COMMIT)
            .join("model.safetensors")
    );
    assert_eq!(std::fs::read(&p).unwrap(), w);
    assert_eq!(
        std::fs::read_link(&p).unwrap(),
        PathBuf::from("../../blobs").join(sha256(&w))
    );
    assert_eq!(
        std::fs::read_to_string(root.join("refs/main")).unwrap(),
        COMMIT
    );
    let c = client.file(&model_repo(), "config.json").unwrap();
    assert_eq!(std::fs::read(&c).unwrap(), br#"{"hidden_size": 32}"#);
    let before = hub.log().len();
    client.file(&model_repo(), "model.safetensors").unwrap();
    client.file(&model_repo(), "config.json").unwrap();
    assert_eq!(
        hub.log().len(),
        before,
        "a verified cache hit needs no request"
    );
}

#[test]
fn a_hub_that_never_answers_fails_within_the_response_timeout() {
    let (hub, _) = hub_with_files();
    hub.fault("*", Fault::Silent, usize::MAX);
    let tmp = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let e = Hub::new(settings(&hub, tmp.path()))
        .file(&model_repo(), "config.json")
        .unwrap_err();
    // 3 attempts × 0.7 s + backoff 0.5 + 1 s.
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    let msg = format!("{e:#}");
    assert!(
        msg.contains("no response within") && msg.contains("HF_HUB_ETAG_TIMEOUT"),
        "{msg}"
    );
    assert!(
        msg.contains(&hub.endpoint()) && msg.contains("network failure"),
        "{msg}"
    );
    assert!(e.downcast_ref::<approx_bench::UsageError>().is_none());
    assert_eq!(hub.count("HEAD", "config.json"), 3);
}

#[test]
fn a_stalled_download_resumes_where_it_stopped() {
    let (hub, w) = hub_with_files();
    hub.fault("model.safetensors", Fault::StallAfter(70_000), 1);
    let tmp = tempfile::tempdir().unwrap();
    let p = Hub::new(settings(&hub, tmp.path()))
        .file(&model_repo(), "model.safetensors")
        .unwrap();
    assert_eq!(std::fs::read(p).unwrap(), w);
    let gets: Vec<_> = hub
        .log()
        .into_iter()
        .filter(|l| l.method == "GET" && l.path.starts_with("/cdn/"))
        .collect();
    assert_eq!(gets.len(), 2);
    assert_eq!(gets[0].headers.get("range"), None);
    assert_eq!(
        gets[1].headers.get("range").map(String::as_str),
        Some("bytes=70000-")
    );
}

#[test]
fn a_download_that_stalls_every_time_fails_naming_the_file_the_timeout_and_poisons_nothing() {
    let (hub, w) = hub_with_files();
    hub.fault("model.safetensors", Fault::StallAfter(1000), usize::MAX);
    let tmp = tempfile::tempdir().unwrap();
    let client = Hub::new(settings(&hub, tmp.path()));
    let t0 = Instant::now();
    let msg = format!(
        "{:#}",
        client.file(&model_repo(), "model.safetensors").unwrap_err()
    );
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert!(
        msg.contains("model.safetensors of tiny-org/tiny-bert"),
        "{msg}"
    );
    assert!(
        msg.contains("stalled") && msg.contains("HF_HUB_DOWNLOAD_TIMEOUT"),
        "{msg}"
    );
    assert!(no_blob_named(tmp.path(), &sha256(&w)));
    // The hub recovers: the next call heals without any cleanup.
    hub.clear_faults();
    let p = client.file(&model_repo(), "model.safetensors").unwrap();
    assert_eq!(std::fs::read(p).unwrap(), w);
}

#[test]
fn a_body_cut_short_without_content_length_is_never_cached_and_heals_on_the_next_run() {
    let (hub, w) = hub_with_files();
    // 3 attempts × 1000 bytes: resuming cannot complete it.
    hub.fault("model.safetensors", Fault::CutNoLength(1000), usize::MAX);
    let tmp = tempfile::tempdir().unwrap();
    let client = Hub::new(settings(&hub, tmp.path()));
    let msg = format!(
        "{:#}",
        client.file(&model_repo(), "model.safetensors").unwrap_err()
    );
    assert!(
        msg.contains("verification") && msg.contains("announced"),
        "{msg}"
    );
    assert!(no_blob_named(tmp.path(), &sha256(&w)));
    let root = tmp.path().join("models--tiny-org--tiny-bert");
    assert!(!root
        .join("snapshots")
        .join(COMMIT)
        .join("model.safetensors")
        .exists());
    hub.clear_faults();
    let p = client.file(&model_repo(), "model.safetensors").unwrap();
    assert_eq!(std::fs::read(p).unwrap(), w);
}

#[test]
fn cuts_with_and_without_content_length_are_resumed_within_one_call() {
    for fault in [Fault::CutNoLength(50_000), Fault::CutWithLength(50_000)] {
        let (hub, w) = hub_with_files();
        hub.fault("model.safetensors", fault, 1);
        let tmp = tempfile::tempdir().unwrap();
        let p = Hub::new(settings(&hub, tmp.path()))
            .file(&model_repo(), "model.safetensors")
            .unwrap();
        assert_eq!(std::fs::read(p).unwrap(), w, "{fault:?}");
        assert_eq!(hub.count("GET", "/cdn/"), 2, "{fault:?}");
    }
}

#[test]
fn a_corrupt_body_is_caught_by_its_sha256_and_fetched_again_whole() {
    let (hub, w) = hub_with_files();
    hub.fault("model.safetensors", Fault::Corrupt, 1);
    let tmp = tempfile::tempdir().unwrap();
    let p = Hub::new(settings(&hub, tmp.path()))
        .file(&model_repo(), "model.safetensors")
        .unwrap();
    assert_eq!(std::fs::read(p).unwrap(), w);
    let gets: Vec<_> = hub
        .log()
        .into_iter()
        .filter(|l| l.path.starts_with("/cdn/"))
        .collect();
    assert_eq!(gets.len(), 2);
    assert_eq!(
        gets[1].headers.get("range"),
        None,
        "nothing to resume from a bad hash"
    );
}

/// Writes a truncated copy of `w` into the cache under its real name, as an interrupted tool
/// without verification would have left it.
fn poison(cache: &Path, w: &[u8]) -> PathBuf {
    let root = cache.join("models--tiny-org--tiny-bert");
    let blob = root.join("blobs").join(sha256(w));
    std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
    std::fs::write(&blob, &w[..w.len() / 3]).unwrap();
    std::fs::create_dir_all(root.join("refs")).unwrap();
    std::fs::write(root.join("refs/main"), COMMIT).unwrap();
    let snap = root.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(&snap).unwrap();
    std::os::unix::fs::symlink(
        PathBuf::from("../../blobs").join(sha256(w)),
        snap.join("model.safetensors"),
    )
    .unwrap();
    blob
}

#[test]
fn a_truncated_file_in_the_cache_is_fetched_again_when_the_hub_is_reachable() {
    let (hub, w) = hub_with_files();
    let tmp = tempfile::tempdir().unwrap();
    poison(tmp.path(), &w);
    let p = Hub::new(settings(&hub, tmp.path()))
        .file(&model_repo(), "model.safetensors")
        .unwrap();
    assert_eq!(std::fs::read(p).unwrap(), w);
}

#[test]
fn a_truncated_file_in_the_cache_is_reported_with_its_path_when_the_hub_is_not() {
    let (hub, w) = hub_with_files();
    let tmp = tempfile::tempdir().unwrap();
    let blob = poison(tmp.path(), &w);
    let mut s = settings(&hub, tmp.path());
    s.offline = true;
    let e = Hub::new(s.clone())
        .file(&model_repo(), "model.safetensors")
        .unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains(&format!("{} is corrupt", blob.display())),
        "{msg}"
    );
    assert!(hub.log().is_empty(), "offline means no request");
    // Unreachable (not offline): the same path in the network failure's message.
    hub.fault("*", Fault::Silent, usize::MAX);
    s.offline = false;
    let msg = format!(
        "{:#}",
        Hub::new(s)
            .file(&model_repo(), "model.safetensors")
            .unwrap_err()
    );
    assert!(
        msg.contains("network failure") && msg.contains(&blob.display().to_string()),
        "{msg}"
    );
    assert_eq!(
        std::fs::metadata(&blob).unwrap().len(),
        (w.len() / 3) as u64,
        "not deleted"
    );
}

#[test]
fn hub_errors_say_what_the_user_should_change() {
    let (hub, _) = hub_with_files();
    let tmp = tempfile::tempdir().unwrap();
    let client = Hub::new(settings(&hub, tmp.path()));
    hub.add("org/no-weights", "config.json", b"{}".to_vec(), false);
    let no_weights = Repo::with_revision("org/no-weights".into(), RepoType::Model, "main".into());
    let e = client.file(&no_weights, "model.safetensors").unwrap_err();
    let msg = format!("{e:#}");
    assert!(e.downcast_ref::<approx_bench::UsageError>().is_some());
    assert!(
        msg.contains("no model.safetensors at revision main")
            && msg.contains("--model initialized"),
        "{msg}"
    );

    let unknown = Repo::with_revision("org/missing".into(), RepoType::Model, "main".into());
    let e = client.file(&unknown, "config.json").unwrap_err();
    let msg = format!("{e:#}");
    assert!(e.downcast_ref::<approx_bench::UsageError>().is_some());
    assert!(
        msg.contains("answered 401")
            && msg.contains("private or gated")
            && msg.contains("set HF_TOKEN"),
        "{msg}"
    );

    let rev = Repo::with_revision(MODEL.into(), RepoType::Model, "v9".into());
    let msg = format!("{:#}", client.file(&rev, "config.json").unwrap_err());
    assert!(
        msg.contains("revision v9 not found") && msg.contains("--revision"),
        "{msg}"
    );
    // None of these is retried: one request each.
    assert_eq!(hub.log().len(), 3);
}

#[test]
fn the_token_goes_to_the_hub_as_a_bearer_header_and_never_to_the_cdn() {
    let (hub, _) = hub_with_files();
    let tmp = tempfile::tempdir().unwrap();
    let mut s = settings(&hub, tmp.path());
    s.token = Some("hf_secret_123".into());
    assert!(
        !format!("{s:?}").contains("hf_secret_123"),
        "Debug hides the token"
    );
    Hub::new(s)
        .file(&model_repo(), "model.safetensors")
        .unwrap();
    for l in hub.log() {
        let auth = l.headers.get("authorization").map(String::as_str);
        if l.path.starts_with("/cdn/") {
            assert_eq!(auth, None, "{}", l.path);
        } else {
            assert_eq!(auth, Some("Bearer hf_secret_123"), "{}", l.path);
        }
    }
}

#[test]
fn offline_mode_serves_the_cache_and_never_touches_the_network() {
    let (hub, _) = hub_with_files();
    let tmp = tempfile::tempdir().unwrap();
    let mut s = settings(&hub, tmp.path());
    s.offline = true;
    let e = Hub::new(s.clone())
        .file(&model_repo(), "config.json")
        .unwrap_err();
    assert!(e.downcast_ref::<approx_bench::UsageError>().is_some());
    assert!(format!("{e:#}").contains("HF_HUB_OFFLINE is set"), "{e:#}");
    assert!(hub.log().is_empty());
    s.offline = false;
    Hub::new(s.clone())
        .file(&model_repo(), "config.json")
        .unwrap();
    let n = hub.log().len();
    s.offline = true;
    Hub::new(s).file(&model_repo(), "config.json").unwrap();
    assert_eq!(hub.log().len(), n);
}

// ---- the CLI, as a user runs it ----

/// The tiny model and corpus on a mock hub, as the CLI's default run fetches them.
fn hub_with_tiny_model(dir: &Path) -> MockHub {
    let model = common::tiny_model(&dir.join("model-src"), true);
    let hub = MockHub::start();
    for (f, lfs) in [
        ("config.json", false),
        ("vocab.txt", false),
        ("model.safetensors", true),
    ] {
        hub.add(MODEL, f, std::fs::read(model.join(f)).unwrap(), lfs);
    }
    let rows = approx_bench::inputs::corpus::text_rows(&common::corpus_path()).unwrap();
    let pq = dir.join("test.parquet");
    common::write_parquet(&pq, &rows);
    hub.add(
        "datasets/Salesforce/wikitext",
        "wikitext-2-raw-v1/test-00000-of-00001.parquet",
        std::fs::read(pq).unwrap(),
        true,
    );
    hub
}

fn sweep_args(out: &Path) -> Vec<String> {
    [
        "--model",
        "pretrained",
        "--model-id",
        MODEL,
        "--lengths",
        "16",
        "--windows",
        "2",
        "--methods",
        "vmean",
        "--features",
        "4",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(["--out".to_string(), out.display().to_string()])
    .chain(common::device_args())
    .collect()
}

fn spawn(args: &[String], env: &[(&str, String)]) -> Child {
    let mut c = Command::new(common::bin());
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for v in [
        "HF_TOKEN",
        "HF_HUB_OFFLINE",
        "HF_HUB_CACHE",
        "HF_ENDPOINT",
        "HF_HOME",
    ] {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

fn env(hub: &MockHub, home: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("HF_ENDPOINT", hub.endpoint()),
        ("HF_HOME", home.display().to_string()),
    ]
}

#[test]
fn cli_against_a_silent_hub_fails_by_itself_within_90_s_with_exit_1() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = hub_with_tiny_model(tmp.path());
    hub.fault("*", Fault::Silent, usize::MAX);
    // Default timeouts: what a user gets.
    let child = spawn(
        &sweep_args(&tmp.path().join("o")),
        &env(&hub, &tmp.path().join("hf")),
    );
    let (o, took) = wait(child, Duration::from_secs(150));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(took < Duration::from_secs(90), "took {took:?}: {err}");
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot fetch config.json of tiny-org/tiny-bert"),
        "{err}"
    );
    assert!(
        err.contains("no response within 10 s") && err.contains("--model-dir"),
        "{err}"
    );
}

#[test]
fn cli_sends_hf_token_as_a_bearer_header_and_writes_it_nowhere() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = hub_with_tiny_model(tmp.path());
    let out = tmp.path().join("o");
    let mut e = env(&hub, &tmp.path().join("hf"));
    e.push(("HF_TOKEN", "hf_cli_token_42".into()));
    let (o, _) = wait(spawn(&sweep_args(&out), &e), Duration::from_secs(120));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let hub_requests: Vec<_> = hub
        .log()
        .into_iter()
        .filter(|l| l.path.contains("/resolve/"))
        .collect();
    assert!(!hub_requests.is_empty());
    for l in hub_requests {
        assert_eq!(
            l.headers.get("authorization").map(String::as_str),
            Some("Bearer hf_cli_token_42")
        );
    }
    for f in ["manifest.json", "trials.csv", "summary.csv"] {
        assert!(!std::fs::read_to_string(out.join(f))
            .unwrap()
            .contains("hf_cli_token_42"));
    }
    assert!(
        !err.contains("hf_cli_token_42")
            && !String::from_utf8_lossy(&o.stdout).contains("hf_cli_token_42")
    );
    // Off a terminal, one line per download.
    assert!(
        err.contains("downloading model.safetensors (") && err.contains(&hub.endpoint()),
        "{err}"
    );
}

#[test]
fn cli_exit_status_separates_usage_errors_from_network_failures() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = hub_with_tiny_model(tmp.path());
    hub.fault(
        "model.safetensors",
        Fault::Status(404, "EntryNotFound"),
        usize::MAX,
    );
    let (o, _) = wait(
        spawn(
            &sweep_args(&tmp.path().join("a")),
            &env(&hub, &tmp.path().join("hf")),
        ),
        Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no model.safetensors") && err.contains("--model initialized"),
        "{err}"
    );

    let mut args = sweep_args(&tmp.path().join("b"));
    args[3] = "org/unknown".into();
    let (o, _) = wait(
        spawn(&args, &env(&hub, &tmp.path().join("hf"))),
        Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("private or gated") && err.contains("HF_TOKEN"),
        "{err}"
    );

    // Nothing listens on the endpoint: a network failure, exit 1, and the offline ways.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let (o, took) = wait(
        spawn(
            &sweep_args(&tmp.path().join("c")),
            &[
                ("HF_ENDPOINT", dead),
                ("HF_HOME", tmp.path().join("hf2").display().to_string()),
            ],
        ),
        Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    assert!(
        err.contains("connection refused") && err.contains("HF_HOME") && err.contains("--corpus"),
        "{err}"
    );

    // HF_HUB_OFFLINE with a cold cache: the user's setting to change (2), no request made.
    let before = hub.log().len();
    let mut e = env(&hub, &tmp.path().join("hf3"));
    e.push(("HF_HUB_OFFLINE", "1".into()));
    let (o, _) = wait(
        spawn(&sweep_args(&tmp.path().join("d")), &e),
        Duration::from_secs(60),
    );
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(hub.log().len(), before);

    // A bad timeout value names the variable.
    let mut e = env(&hub, &tmp.path().join("hf4"));
    e.push(("HF_HUB_DOWNLOAD_TIMEOUT", "soon".into()));
    let (o, _) = wait(
        spawn(&sweep_args(&tmp.path().join("e")), &e),
        Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("HF_HUB_DOWNLOAD_TIMEOUT=soon"), "{err}");
}

#[test]
fn two_shards_on_one_cold_cache_over_a_slow_link_both_finish_and_download_once() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = hub_with_tiny_model(tmp.path());
    let size = std::fs::read(tmp.path().join("model-src/model.safetensors"))
        .unwrap()
        .len();
    // About 3 s for the weights.
    hub.fault("model.safetensors", Fault::Slow(size / 3 + 1), usize::MAX);
    let home = tmp.path().join("hf");
    let shard = |k: &str| {
        let mut a = sweep_args(&tmp.path().join(format!("shard{}", &k[..1])));
        a.extend(["--shard".to_string(), k.to_string()]);
        spawn(&a, &env(&hub, &home))
    };
    let first = shard("1/2");
    let t0 = Instant::now();
    while hub.count("GET", "/cdn/") == 0 && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = shard("2/2");
    let (a, _) = wait(first, Duration::from_secs(120));
    let (b, _) = wait(second, Duration::from_secs(120));
    let (ea, eb) = (
        String::from_utf8_lossy(&a.stderr),
        String::from_utf8_lossy(&b.stderr),
    );
    assert!(a.status.success(), "{ea}");
    assert!(b.status.success(), "{eb}");
    assert!(
        eb.contains("waiting for another process downloading model.safetensors"),
        "{eb}"
    );
    let weights_sha =
        sha256(&std::fs::read(tmp.path().join("model-src/model.safetensors")).unwrap());
    assert_eq!(
        hub.count("GET", &format!("/cdn/{weights_sha}")),
        1,
        "downloaded once"
    );
}

/// Runs the binary with stderr on a pseudo-terminal and returns what the terminal showed.
fn run_on_a_terminal(
    args: &[String],
    env: &[(&str, String)],
    limit: Duration,
) -> (Option<i32>, String) {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    // SAFETY: plain POSIX pty calls on descriptors we own.
    let (master, slave) = unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(m >= 0);
        assert_eq!(libc::grantpt(m), 0);
        assert_eq!(libc::unlockpt(m), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(m, name.as_mut_ptr(), name.len()), 0);
        let s = libc::open(name.as_ptr(), libc::O_RDWR | libc::O_NOCTTY);
        assert!(s >= 0);
        let ws = libc::winsize {
            ws_row: 40,
            ws_col: 160,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        libc::ioctl(s, libc::TIOCSWINSZ, &ws);
        (std::fs::File::from_raw_fd(m), std::fs::File::from_raw_fd(s))
    };
    let mut c = Command::new(common::bin());
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(slave));
    for v in [
        "HF_TOKEN",
        "HF_HUB_OFFLINE",
        "HF_HUB_CACHE",
        "HF_HUB_DISABLE_PROGRESS_BARS",
    ] {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.env("TERM", "xterm");
    let child = c.spawn().unwrap();
    drop(c); // closes our copy of the slave, so the master sees EOF when the child exits
    let reader = std::thread::spawn(move || {
        let mut master = master;
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(k) = master.read(&mut buf) {
            if k == 0 {
                break;
            }
            all.extend_from_slice(&buf[..k]);
        }
        String::from_utf8_lossy(&all).to_string()
    });
    let (o, _) = wait(child, limit);
    (o.status.code(), reader.join().unwrap())
}

#[test]
fn a_download_on_a_terminal_shows_a_progress_bar_with_size_rate_and_eta() {
    let tmp = tempfile::tempdir().unwrap();
    let hub = hub_with_tiny_model(tmp.path());
    let size = std::fs::read(tmp.path().join("model-src/model.safetensors"))
        .unwrap()
        .len();
    hub.fault("model.safetensors", Fault::Slow(size / 2 + 1), usize::MAX);
    let (code, screen) = run_on_a_terminal(
        &sweep_args(&tmp.path().join("o")),
        &env(&hub, &tmp.path().join("hf")),
        Duration::from_secs(120),
    );
    assert_eq!(code, Some(0), "{screen}");
    assert!(
        screen.contains("downloading model.safetensors ["),
        "{screen}"
    );
    assert!(screen.contains("/s") && screen.contains("ETA"), "{screen}");
    let total = indicatif::HumanBytes(size as u64).to_string();
    assert!(screen.contains(&format!("/{total}")), "{total}: {screen}");

    // --quiet: nothing about downloads.
    let tmp2 = tempfile::tempdir().unwrap();
    let mut args = sweep_args(&tmp2.path().join("o"));
    args.push("--quiet".into());
    let (code, screen) = run_on_a_terminal(
        &args,
        &env(&hub, &tmp2.path().join("hf")),
        Duration::from_secs(120),
    );
    assert_eq!(code, Some(0), "{screen}");
    assert!(!screen.contains("downloading"), "{screen}");
}
