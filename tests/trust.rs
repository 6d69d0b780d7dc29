//! What the tool promises on failure (issue 32; docs/guide.md "What the tool promises on
//! failure"): one writer per run directory, resumes that check their inputs and rows, signals
//! that stop between trials and lose nothing, corrupt inputs named as such, never a panic.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::*;

/// The tiny sweep's arguments into `out`, with `extra` flags after them.
fn grid(m: &str, c: &str, out: &Path, extra: &[&str]) -> Vec<String> {
    [
        "--model",
        "initialized",
        "--model-dir",
        m,
        "--corpus",
        c,
        "--methods",
        "vmean,informer,skeinformer",
        "--lengths",
        "16,32",
        "--windows",
        "2",
        "--features",
        "2,4,8",
        "--quiet",
        "--out",
        out.to_str().unwrap(),
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect()
}

fn sweep(args: &[String]) -> std::process::Output {
    Command::new(bin()).args(args).output().unwrap()
}

fn manifest(out: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap()
}

/// SIGINT and SIGTERM stop the sweep between trials: it says how far it got and how to go on,
/// exits 130 / 143, keeps every finished row, and the rerun completes exactly the rows of an
/// uninterrupted run.
#[test]
fn a_signal_stops_between_trials_and_the_rerun_completes_the_same_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, c) = tiny_inputs(&tmp.path().join("m"), false);
    let features: String = (1..=48)
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let big = |out: &Path| -> Vec<String> {
        let mut a = grid(&m, &c, out, &[]);
        let i = a.iter().position(|x| x == "--features").unwrap();
        a[i + 1] = features.clone();
        let i = a.iter().position(|x| x == "--lengths").unwrap();
        a[i + 1] = "64,128".into();
        a
    };
    let full = tmp.path().join("full");
    let o = sweep(&big(&full));
    assert!(o.status.success(), "{}", stderr(&o));
    let count = |p: &Path| approx_bench::report::trials::read_rows(p).unwrap().len();
    let total = count(&full.join("trials.csv"));
    for (signal, code, name) in [
        (libc::SIGINT, 130, "SIGINT"),
        (libc::SIGTERM, 143, "SIGTERM"),
    ] {
        let cut = tmp.path().join(name);
        let trials = cut.join("trials.csv");
        let mut child = Command::new(bin())
            .args(big(&cut))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        loop {
            let lines = std::fs::read_to_string(&trials)
                .map(|s| s.lines().count())
                .unwrap_or(0);
            if lines > 100 {
                break;
            }
            assert!(
                child.try_wait().unwrap().is_none(),
                "the sweep finished before the signal; enlarge the grid"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(child.id() as i32, signal) }, 0);
        let (o, _) = wait(child, std::time::Duration::from_secs(120));
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(code), "{e}");
        assert!(
            e.contains(&format!("interrupted by {name} after"))
                && e.contains(&format!("of {total} trials"))
                && e.contains("rerun the same command to resume"),
            "{e}"
        );
        assert!(!e.contains("panicked"), "{e}");
        let kept = count(&trials);
        assert!(kept > 0 && kept < total, "{kept} of {total}");
        let man = manifest(&cut);
        assert_eq!(man["status"], "interrupted");
        assert_eq!(man["trials"], kept);
        let o = sweep(&big(&cut));
        assert!(o.status.success(), "{}", stderr(&o));
        assert_same_rows(&trials, &full.join("trials.csv"));
        assert_eq!(manifest(&cut)["status"], "complete");
    }
}

/// Two sweeps started together into one directory: one writes, the other is refused (or, if it
/// starts after the first finished, resumes with nothing to do); never a duplicated row.
#[test]
fn two_writers_racing_for_one_out_never_duplicate_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, c) = tiny_inputs(&tmp.path().join("m"), false);
    let out = tmp.path().join("run");
    let args = grid(&m, &c, &out, &[]);
    let spawn = || {
        Command::new(bin())
            .args(&args)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (oa, _) = wait(a, std::time::Duration::from_secs(120));
    let (ob, _) = wait(b, std::time::Duration::from_secs(120));
    let mut ok = 0;
    for o in [&oa, &ob] {
        match o.status.code() {
            Some(0) => ok += 1,
            Some(2) => assert!(
                stderr(o).contains("is being written by another approx-bench run (process "),
                "{}",
                stderr(o)
            ),
            other => panic!("exit {other:?}: {}", stderr(o)),
        }
    }
    assert!(ok >= 1);
    let rows = rows_without_timing(&out.join("trials.csv"));
    assert_eq!(rows[0].split(',').next(), Some("model"), "the header, once");
    let rows = &rows[1..];
    let mut unique = rows.to_vec();
    unique.sort();
    unique.dedup();
    assert_eq!(rows.len(), unique.len(), "a duplicated row");
    // 2 lengths × 2 windows × 4 heads × 3 methods × 3 d.
    assert_eq!(rows.len(), 144);
}

/// A resume compares the inputs with the manifest: a corpus edited between two runs into one
/// directory is refused naming the file, and the refused run leaves the manifest as it was.
#[test]
fn a_resume_over_a_changed_corpus_is_refused_and_leaves_the_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, _) = tiny_inputs(&tmp.path().join("m"), false);
    let corpus = tmp.path().join("corpus.txt");
    std::fs::copy(corpus_path(), &corpus).unwrap();
    let out = tmp.path().join("run");
    let args = grid(&m, corpus.to_str().unwrap(), &out, &[]);
    assert!(sweep(&args).status.success());
    let before = std::fs::read(out.join("manifest.json")).unwrap();
    let mut text = std::fs::read_to_string(&corpus).unwrap();
    text.insert_str(0, "an edited first line .\n");
    std::fs::write(&corpus, text).unwrap();
    let o = sweep(&args);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("the corpus")
            && e.contains("corpus.txt")
            && e.contains("changed since this run started")
            && e.contains("--force"),
        "{e}"
    );
    assert_eq!(std::fs::read(out.join("manifest.json")).unwrap(), before);
    // --force starts over from the new corpus.
    let mut forced = args.clone();
    forced.push("--force".into());
    assert!(sweep(&forced).status.success());
}

/// Rows that are not trials of the run (here: a head outside --heads) are refused on resume,
/// naming the first, and the manifest is left as it was.
#[test]
fn a_resume_refuses_rows_outside_its_grid() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, c) = tiny_inputs(&tmp.path().join("m"), false);
    let out = tmp.path().join("run");
    let args = grid(&m, &c, &out, &["--heads", "0,1"]);
    assert!(sweep(&args).status.success());
    let trials = out.join("trials.csv");
    let text = std::fs::read_to_string(&trials).unwrap();
    let header: Vec<&str> = text.lines().next().unwrap().split(',').collect();
    let head_col = header.iter().position(|h| *h == "head").unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let mut cells: Vec<String> = lines[3].split(',').map(String::from).collect();
    cells[head_col] = "3".into();
    lines[3] = cells.join(",");
    std::fs::write(&trials, lines.join("\n") + "\n").unwrap();
    let before = std::fs::read(out.join("manifest.json")).unwrap();
    let o = sweep(&args);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("row 4 is not a trial of this run: head 3 (not in --heads)"),
        "{e}"
    );
    assert_eq!(std::fs::read(out.join("manifest.json")).unwrap(), before);
}

/// `--heads 0,2,0,2` measures heads 0 and 2 once each, as --lengths and --methods deduplicate.
#[test]
fn repeated_heads_are_measured_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, c) = tiny_inputs(&tmp.path().join("m"), false);
    let out = tmp.path().join("run");
    let o = sweep(&grid(&m, &c, &out, &["--heads", "0,2,0,2"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = approx_bench::report::trials::read_rows(&out.join("trials.csv")).unwrap();
    // 2 lengths × 2 windows × 2 heads × 3 methods × 3 d.
    assert_eq!(rows.len(), 72);
    let heads: std::collections::BTreeSet<usize> = rows.iter().map(|r| r.head).collect();
    assert_eq!(heads, [0, 2].into());
}

/// `--force` removes the previous run's figures with its rows; files that are not the run's stay.
#[test]
fn force_removes_the_previous_runs_figures_too() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, c) = tiny_inputs(&tmp.path().join("m"), false);
    let out = tmp.path().join("run");
    assert!(sweep(&grid(&m, &c, &out, &[])).status.success());
    // A figure an encoder run never draws, as a previous decoder run into this directory left it.
    std::fs::write(out.join("decoder.png"), b"old figure").unwrap();
    std::fs::write(out.join("notes.txt"), b"mine").unwrap();
    let o = sweep(&grid(&m, &c, &out, &["--seed", "7", "--force"]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!out.join("decoder.png").exists());
    assert!(out.join("notes.txt").exists());
    let leftovers: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".partial-"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

/// Lengths are validated in one place for the sweep and dump-qkv: 0 and lengths past 2^24 are
/// usage errors (not a panic, not a wrapped-around message), and a window past the corpus's end
/// names dump-qkv's own flags.
#[test]
fn lengths_and_windows_are_validated_once_for_every_command() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, c) = tiny_inputs(&tmp.path().join("m"), false);
    let out = tmp.path().join("d.safetensors");
    let dump = |length: &str, window: &str| {
        vec![
            "dump-qkv",
            "--model",
            "initialized",
            "--model-dir",
            &m,
            "--corpus",
            &c,
            "--length",
            length,
            "--window",
            window,
            "--out",
            out.to_str().unwrap(),
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>()
    };
    let usage = |args: Vec<String>, needle: &str| {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        expect_usage_error(&a, needle);
    };
    usage(dump("0", "0"), "--length: 0 is not allowed");
    usage(
        dump("4294967296", "0"),
        "--length 4294967296: longer than the 16777216 tokens",
    );
    let past = dump("16", "5000");
    let a: Vec<&str> = past.iter().map(String::as_str).collect();
    expect_usage_error(&a, "window 5000 (0-based) does not exist");
    let o = run(&a, &[]);
    assert!(!stderr(&o).contains("--windows"), "{}", stderr(&o));
    let run_dir = tmp.path().join("run");
    let mut s = grid(&m, &c, &run_dir, &[]);
    let i = s.iter().position(|x| x == "--lengths").unwrap();
    s[i + 1] = "4294967296".into();
    usage(
        s.clone(),
        "--lengths 4294967296: longer than the 16777216 tokens",
    );
    s[i + 1] = "100000".into();
    let j = s.iter().position(|x| x == "--features").unwrap();
    s[j + 1] = "4".into();
    usage(s, "no window of n = 100000 fits");
}

/// A NaN in a safetensors weight is named as a corrupt file (exit 2), not blamed on the device.
#[test]
fn a_non_finite_weight_is_a_usage_error_naming_the_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(&tmp.path().join("m"), true);
    let weights = model.join("model.safetensors");
    let mut map = candle_core::safetensors::load(&weights, &candle_core::Device::Cpu).unwrap();
    let name = map
        .keys()
        .find(|k| k.ends_with("layer.0.attention.self.key.weight"))
        .unwrap()
        .clone();
    let t = &map[&name];
    let mut v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
    v[5] = f32::NAN;
    let dims = t.dims().to_vec();
    map.insert(
        name.clone(),
        candle_core::Tensor::from_vec(v, dims, &candle_core::Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&map, &weights).unwrap();
    let out = tmp.path().join("run");
    let mut args = grid(
        model.to_str().unwrap(),
        corpus_path().to_str().unwrap(),
        &out,
        &["--layer", "0"],
    );
    args[1] = "pretrained".into();
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    expect_usage_error(
        &a,
        &format!("tensor '{name}' holds NaN at index [0, 5]: the input is corrupt"),
    );
}

/// A command that does not poll for signals (here `bench`) ends at the first SIGINT, with the
/// shell's status 130, rather than waiting for a second one.
#[test]
fn a_signal_ends_a_command_that_does_not_poll_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, c) = tiny_inputs(&tmp.path().join("m"), false);
    // The fixture corpus holds a few hundred tokens; a window of 16384 needs a longer one.
    let text = std::fs::read_to_string(&c).unwrap();
    let c = tmp.path().join("long-corpus.txt");
    std::fs::write(&c, text.repeat(80)).unwrap();
    let c = c.to_str().unwrap().to_string();
    let mut child = Command::new(bin())
        .args([
            "bench",
            "--model",
            "initialized",
            "--model-dir",
            &m,
            "--corpus",
            &c,
            "--lengths",
            "16384",
            "--methods",
            "vmean",
            "--features",
            "8",
            "--repeats",
            "1000",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    if child.try_wait().unwrap().is_some() {
        let (o, _) = wait(child, std::time::Duration::from_secs(1));
        panic!(
            "bench ended before the signal ({:?}): {}",
            o.status,
            stderr(&o)
        );
    }
    let t0 = std::time::Instant::now();
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let (o, _) = wait(child, std::time::Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
}

// Issue 44: overflow named as overflow, decode with the kernelized target, merges that check
// their rows and paths and resume when interrupted.

/// The tiny pretrained model under `dir` with layer 0's `which` bias ("query", "key", "value")
/// set to `value` in channel 3 (head 0's): finite weights whose Q/K/V are finite but huge.
fn huge_bias_model(dir: &Path, which: &[&str], value: f32) -> String {
    let model = tiny_model(dir, true);
    let weights = model.join("model.safetensors");
    let mut map = candle_core::safetensors::load(&weights, &candle_core::Device::Cpu).unwrap();
    for w in which {
        let name = map
            .keys()
            .find(|k| k.ends_with(&format!("layer.0.attention.self.{w}.bias")))
            .unwrap()
            .clone();
        let mut v: Vec<f32> = map[&name].to_vec1().unwrap();
        v[3] = value;
        let n = v.len();
        map.insert(
            name,
            candle_core::Tensor::from_vec(v, n, &candle_core::Device::Cpu).unwrap(),
        );
    }
    candle_core::safetensors::save(&map, &weights).unwrap();
    model.to_str().unwrap().to_string()
}

/// Replaces the value of `flag` in `args`.
fn set_flag(args: &mut [String], flag: &str, value: &str) {
    let i = args.iter().position(|x| x == flag).unwrap();
    args[i + 1] = value.into();
}

/// Logits beyond f32's range (|q|, |k| ≈ 1e20 in one channel) and V whose sums over keys pass
/// it (|v| ≈ 3e38) are finite inputs that overflow an f32 forward: exit 2 naming the overflow,
/// the head and the input, suggesting --dtype f64 (which runs the same head), never the device.
/// (The sums of V overflow where V is summed before it is normalised, as on the CPU path.)
#[test]
fn finite_but_huge_qkv_are_named_as_an_overflow_not_blamed_on_the_device() {
    let tmp = tempfile::tempdir().unwrap();
    let c = corpus_path().to_str().unwrap().to_string();
    let cases: [(&str, &[&str], f32, &str); 2] = [
        ("qk", &["query", "key"], 1e20, "its logits (Q·Kᵀ) reach"),
        (
            "v",
            &["value"],
            3e38,
            "the sum over keys of V's column 3 reaches",
        ),
    ];
    for (tag, which, value, cause) in cases {
        let m = huge_bias_model(&tmp.path().join(tag), which, value);
        let out = tmp.path().join(format!("run-{tag}"));
        let mut args = grid(&m, &c, &out, &["--layer", "0"]);
        args[1] = "pretrained".into();
        set_flag(&mut args, "--methods", "vmean");
        let o = sweep(&args);
        let e = stderr(&o);
        assert!(
            !e.contains("device") && !e.contains("panicked"),
            "{tag}: {e}"
        );
        if tag == "v" && o.status.success() {
            // A product path that normalises before it sums V (the batched device path) does
            // not overflow, and its target passed the check: right rows, no error to name.
            let rows = approx_bench::report::trials::read_rows(&out.join("trials.csv")).unwrap();
            assert!(rows.iter().all(|r| r.exact_norm.is_finite()), "{tag}");
            continue;
        }
        assert_eq!(o.status.code(), Some(2), "{tag}: {e}");
        assert!(
            e.contains("layer 0, n = 16, window 0")
                && e.contains("head 0")
                && e.contains("the exact softmax target overflows"),
            "{tag}: {e}"
        );
        assert!(e.contains(cause) && e.contains("--dtype f64"), "{tag}: {e}");
        // The run stopped: its manifest says so rather than `running`.
        assert_eq!(manifest(&out)["status"], "failed", "{tag}");
        let out64 = tmp.path().join(format!("run-{tag}-f64"));
        let mut args = grid(&m, &c, &out64, &["--layer", "0"]);
        args[1] = "pretrained".into();
        set_flag(&mut args, "--methods", "vmean");
        args.extend(["--dtype".to_string(), "f64".to_string()]);
        let o = sweep(&args);
        assert!(o.status.success(), "{tag} in f64: {}", stderr(&o));
    }
}

/// `--decode N_F --target kernelized` is refused when the configuration is read, by the sweep
/// and by `bench`, as `--target kernelized --mask causal` is (it reached the device check and
/// was blamed on the device), here on the tiny llama.
#[test]
fn decode_with_the_kernelized_target_is_refused() {
    use common::decoder_fixture::{corpus, decoder_cli, decoder_run, llama_dir};
    let tmp = tempfile::tempdir().unwrap();
    let model = llama_dir(&tmp.path().join("llama"), true);
    let c = corpus(tmp.path());
    let out = tmp.path().join("run");
    let flags = "--model pretrained --lengths 64 --windows 1 --decode 16 --features 8 --layer 1 \
                 --methods decode --target kernelized";
    for o in [
        decoder_run(&model, &c, &out, flags),
        decoder_cli(&model, &c, &format!("bench {flags} --repeats 1")),
    ] {
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{e}");
        assert!(e.contains("--decode 16 with --target kernelized"), "{e}");
        assert!(!e.contains("device"), "{e}");
    }
    assert!(!out.exists());
}

/// Two shards of the tiny grid, run into `tmp/s1` and `tmp/s2`.
fn two_shards(tmp: &Path, m: &str, c: &str) -> Vec<std::path::PathBuf> {
    (1..=2)
        .map(|k| {
            let dir = tmp.join(format!("s{k}"));
            let o = sweep(&grid(m, c, &dir, &["--shard", &format!("{k}/2")]));
            assert!(o.status.success(), "{}", stderr(&o));
            dir
        })
        .collect()
}

fn merge(dirs: &[&Path], out: &Path) -> std::process::Output {
    let mut args = vec!["merge".to_string()];
    args.extend(dirs.iter().map(|d| d.to_str().unwrap().to_string()));
    args.extend(["--out".to_string(), out.to_str().unwrap().to_string()]);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    run(&a, &[])
}

/// `merge` refuses a row that is no trial of the run (head 99 of a 4-head model), naming it,
/// as a resume does, instead of writing a "complete" run with a real trial missing.
#[test]
fn merge_refuses_a_row_that_is_no_trial_of_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, c) = tiny_inputs(&tmp.path().join("m"), false);
    let shards = two_shards(tmp.path(), &m, &c);
    let trials = shards[1].join("trials.csv");
    let text = std::fs::read_to_string(&trials).unwrap();
    let header: Vec<&str> = text.lines().next().unwrap().split(',').collect();
    let head_col = header.iter().position(|h| *h == "head").unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let mut cells: Vec<String> = lines[5].split(',').map(String::from).collect();
    cells[head_col] = "99".into();
    lines[5] = cells.join(",");
    std::fs::write(&trials, lines.join("\n") + "\n").unwrap();
    let out = tmp.path().join("merged");
    let o = merge(&[&shards[0], &shards[1]], &out);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains(&format!(
            "{}: row 6 is not a trial of this run: head 99 (the model has 4 heads)",
            trials.display()
        )),
        "{e}"
    );
    assert!(!out.join("manifest.json").exists());
}

/// A shard path that does not exist, an empty directory or a file: exit 2 naming the path and
/// what to give instead, not a raw "No such file or directory".
#[test]
fn merge_of_a_missing_empty_or_file_path_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, c) = tiny_inputs(&tmp.path().join("m"), false);
    let good = tmp.path().join("good");
    assert!(sweep(&grid(&m, &c, &good, &[])).status.success());
    let missing = tmp.path().join("missing");
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let file = good.join("trials.csv");
    let out = tmp.path().join("merged");
    for (bad, what) in [
        (&missing, "does not exist"),
        (&empty, "holds no manifest.json"),
        (&file, "is a file, not a run directory"),
    ] {
        for dirs in [[bad, &good], [&good, bad]] {
            let o = merge(&[dirs[0], dirs[1]], &out);
            let e = stderr(&o);
            assert_eq!(o.status.code(), Some(2), "{e}");
            assert!(
                e.contains(&format!("merge: {} {what}", bad.display()))
                    && e.contains("give the --out directories of the shards"),
                "{e}"
            );
            assert!(!e.contains("No such file"), "{e}");
        }
    }
}

/// `merge SHARDS --out out` killed while it writes trials.csv: by SIGXFSZ, under a file-size
/// limit of 8 kB (below the merged trials.csv's size).
fn interrupted_merge(shards: &[std::path::PathBuf], out: &Path) {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(bin());
    cmd.arg("merge")
        .args(shards)
        .arg("--out")
        .arg(out)
        .stderr(Stdio::piped());
    // SAFETY: setrlimit(2) in the child before exec, on plain integers.
    unsafe {
        cmd.pre_exec(|| {
            let limit = |bytes| libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &limit(0));
            libc::setrlimit(libc::RLIMIT_FSIZE, &limit(8192));
            Ok(())
        });
    }
    let o = cmd.output().unwrap();
    assert!(!o.status.success(), "the merge was not interrupted");
    assert!(!out.join("manifest.json").exists());
}

/// A merge killed while writing (here by SIGXFSZ, a file-size limit below trials.csv's size)
/// is completed by rerunning the same command: the rows and summary of an uninterrupted merge,
/// manifest complete, no temporary or marker left.
#[test]
fn an_interrupted_merge_is_completed_by_the_same_command() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, c) = tiny_inputs(&tmp.path().join("m"), false);
    let shards = two_shards(tmp.path(), &m, &c);
    let whole = tmp.path().join("whole");
    let o = merge(&[&shards[0], &shards[1]], &whole);
    assert!(o.status.success(), "{}", stderr(&o));
    let size = std::fs::metadata(whole.join("trials.csv")).unwrap().len();
    assert!(size > 16384, "{size} bytes: enlarge the grid");
    let out = tmp.path().join("cut");
    interrupted_merge(&shards, &out);
    let o = merge(&[&shards[0], &shards[1]], &out);
    assert!(o.status.success(), "{}", stderr(&o));
    for f in ["trials.csv", "summary.csv"] {
        assert_eq!(
            std::fs::read(out.join(f)).unwrap(),
            std::fs::read(whole.join(f)).unwrap(),
            "{f}"
        );
    }
    assert_eq!(manifest(&out)["status"], "complete");
    let left: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("partial") || n.contains("merge"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// `bench --repeats 0` would print a median of no timing, and `bench --decode` on an encoder
/// has no continuation: both are refused, the latter as the sweep refuses it.
#[test]
fn bench_refuses_zero_repeats_and_decode_on_an_encoder() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, c) = tiny_inputs(&tmp.path().join("m"), false);
    let base = [
        "bench",
        "--model",
        "initialized",
        "--model-dir",
        &m,
        "--corpus",
        &c,
        "--lengths",
        "16",
        "--methods",
        "vmean",
        "--features",
        "4",
    ];
    let mut zero = base.to_vec();
    zero.extend(["--repeats", "0"]);
    expect_usage_error(&zero, "--repeats 0: give at least 1 timed repetition");
    let mut decode = base.to_vec();
    decode[10] = "decode";
    // dec_streaming keeps 4 sink tokens and needs d ≥ 8.
    decode[8] = "32";
    decode[12] = "8";
    decode.extend(["--decode", "4", "--repeats", "1"]);
    expect_usage_error(
        &decode,
        "is an encoder (BERT), which has no causal continuation",
    );
}

/// An all-zero V (layer 0's value weights and bias zeroed) makes O = 0: every row's rel_error
/// and cos_sim are defined (0 and 1 where Ô = O = 0), not the NaN of 0/0 that the summary would
/// drop without a word.
#[test]
fn an_all_zero_v_gives_defined_relative_measures() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(&tmp.path().join("m"), true);
    let weights = model.join("model.safetensors");
    let mut map = candle_core::safetensors::load(&weights, &candle_core::Device::Cpu).unwrap();
    let names: Vec<String> = map
        .keys()
        .filter(|k| k.contains("layer.0.attention.self.value."))
        .cloned()
        .collect();
    assert_eq!(names.len(), 2);
    for name in names {
        let zero = map[&name].zeros_like().unwrap();
        map.insert(name, zero);
    }
    candle_core::safetensors::save(&map, &weights).unwrap();
    let out = tmp.path().join("run");
    let c = corpus_path().to_str().unwrap().to_string();
    let mut args = grid(model.to_str().unwrap(), &c, &out, &["--layer", "0"]);
    args[1] = "pretrained".into();
    let o = sweep(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = approx_bench::report::trials::read_rows(&out.join("trials.csv")).unwrap();
    assert_eq!(rows.len(), 144);
    for r in rows {
        assert_eq!(r.exact_norm, 0.0, "{:?}", r.key());
        assert_eq!((r.rel_error, r.cos_sim), (0.0, Some(1.0)), "{:?}", r.key());
    }
}

/// A malformed `APPROX_BENCH_QKV_CACHE_MAX_GB` is refused when the cache is opened (exit 2
/// naming the variable and its value), instead of silently capping the cache at 16 GB.
#[test]
fn a_malformed_cache_cap_is_a_usage_error() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, c) = tiny_inputs(&tmp.path().join("m"), false);
    let cache = tmp.path().join("cache");
    let out = tmp.path().join("run");
    let mut args = grid(&m, &c, &out, &["--qkv-cache", cache.to_str().unwrap()]);
    set_flag(&mut args, "--methods", "vmean");
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    for bad in ["abc", "-1", "nan"] {
        let o = run(&a, &[("APPROX_BENCH_QKV_CACHE_MAX_GB", bad)]);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{bad}: {e}");
        assert!(
            e.contains(&format!(
                "APPROX_BENCH_QKV_CACHE_MAX_GB=\"{bad}\": not a size in GB"
            )),
            "{e}"
        );
    }
    let o = run(&a, &[("APPROX_BENCH_QKV_CACHE_MAX_GB", "0.5")]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// The same `--methods` in another order are the same trials: a resume goes on (nothing to
/// redo, the run keeps its order) and shards run with either order merge.
#[test]
fn the_same_methods_in_another_order_resume_and_merge() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, c) = tiny_inputs(&tmp.path().join("m"), false);
    let out = tmp.path().join("run");
    assert!(sweep(&grid(&m, &c, &out, &[])).status.success());
    let before = std::fs::read(out.join("trials.csv")).unwrap();
    let mut args = grid(&m, &c, &out, &[]);
    set_flag(&mut args, "--methods", "skeinformer,vmean,informer");
    let o = sweep(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(out.join("trials.csv")).unwrap(), before);
    assert_eq!(
        manifest(&out)["config"]["methods"],
        serde_json::json!(["vmean", "informer", "skeinformer"])
    );
    let s1 = tmp.path().join("s1");
    assert!(sweep(&grid(&m, &c, &s1, &["--shard", "1/2"]))
        .status
        .success());
    let s2 = tmp.path().join("s2");
    let mut args = grid(&m, &c, &s2, &["--shard", "2/2"]);
    set_flag(&mut args, "--methods", "informer,skeinformer,vmean");
    assert!(sweep(&args).status.success());
    let merged = tmp.path().join("merged");
    let o = merge(&[&s1, &s2], &merged);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        rows_without_timing(&merged.join("trials.csv")),
        rows_without_timing(&out.join("trials.csv"))
    );
}

/// `trials.csv` of `dir` with column `col` of data row `row` (1-based) set to `value`.
fn edit_cell(dir: &Path, row: usize, col: &str, value: &str) {
    let trials = dir.join("trials.csv");
    let text = std::fs::read_to_string(&trials).unwrap();
    let header: Vec<&str> = text.lines().next().unwrap().split(',').collect();
    let i = header.iter().position(|h| *h == col).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let mut cells: Vec<String> = lines[row].split(',').map(String::from).collect();
    cells[i] = value.into();
    lines[row] = cells.join(",");
    std::fs::write(&trials, lines.join("\n") + "\n").unwrap();
}

/// A row that contradicts itself (a seed that is not its trial's, a negative error) is refused
/// by a resume and by `merge`, naming it, instead of passing for a measurement.
#[test]
fn rows_that_contradict_themselves_are_refused_by_resume_and_merge() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, c) = tiny_inputs(&tmp.path().join("m"), false);
    let shards = two_shards(tmp.path(), &m, &c);
    let s1 = shards[0].as_path();
    edit_cell(s1, 3, "seed", "12345");
    let o = sweep(&grid(&m, &c, s1, &["--shard", "1/2"]));
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("row 4 is not a trial of this run: seed 12345 (this trial's seed"),
        "{e}"
    );
    let o = merge(&[s1, &shards[1]], &tmp.path().join("merged"));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("seed 12345"), "{}", stderr(&o));
    let s2 = shards[1].as_path();
    edit_cell(s2, 2, "error", "-0.5");
    let o = merge(&[s2], &tmp.path().join("merged2"));
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("row 3 is not a trial of this run: error -0.5 (an error is at least 0)"),
        "{e}"
    );
}

/// A run of budget-free methods only (the quantized family, d = 0) ignores `--features`, so a
/// resume with other `--features` is the same run: nothing to redo, the run keeps its own.
#[test]
fn a_quantized_only_run_resumes_whatever_its_features() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, c) = tiny_inputs(&tmp.path().join("m"), false);
    let out = tmp.path().join("run");
    let mut args = grid(&m, &c, &out, &[]);
    set_flag(&mut args, "--methods", "kv_f16,kv_fp8");
    let o = sweep(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let before = std::fs::read(out.join("trials.csv")).unwrap();
    set_flag(&mut args, "--features", "4,16");
    let o = sweep(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(out.join("trials.csv")).unwrap(), before);
    assert_eq!(
        manifest(&out)["config"]["features"],
        serde_json::json!([2, 4, 8])
    );
    // With a method that has a d axis, other --features are another configuration.
    set_flag(&mut args, "--methods", "kv_f16,vmean");
    let o = sweep(&args);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// The directory of an interrupted merge that a run has taken over since (`--force`) is that
/// run's: a merge into it is refused as into any run, not rewritten.
#[test]
fn a_run_started_over_an_interrupted_merge_is_not_overwritten_by_a_merge() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, c) = tiny_inputs(&tmp.path().join("m"), false);
    let shards = two_shards(tmp.path(), &m, &c);
    let out = tmp.path().join("cut");
    interrupted_merge(&shards, &out);
    let o = sweep(&grid(&m, &c, &out, &["--force", "--heads", "0"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let run = std::fs::read(out.join("trials.csv")).unwrap();
    let o = merge(&[&shards[0], &shards[1]], &out);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("already holds a trials.csv"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(out.join("trials.csv")).unwrap(), run);
}
