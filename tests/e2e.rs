//! `approx-bench e2e` on the tiny llama fixture (3 layers, 4 query heads over 2 K/V heads, p = 16):
//! a rerun is identical, an interrupted run resumes to the same rows, and bad input is exit 2
//! with the input named and nothing already written lost.

mod common;

use std::path::Path;

use common::decoder_fixture::*;
use common::*;

/// The run with `extra` flags, and the defaults below for each flag `extra` does not set.
fn e2e(model: &Path, corpus: &Path, out: &Path, extra: &str) -> std::process::Output {
    let mut flags = format!(
        "e2e --features 8,16 --quiet --out {} {extra}",
        out.display()
    );
    for (flag, value) in [
        ("--n-f", "16"),
        ("--methods", "window,streaming,snapkv,topk_dec"),
        ("--windows", "2"),
        ("--lengths", "64"),
    ] {
        if !extra.contains(flag) {
            flags += &format!(" {flag} {value}");
        }
    }
    decoder_cli(model, corpus, &flags)
}

/// The rows of a CSV without its `seconds` column, sorted.
fn rows_without_seconds(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let header: Vec<&str> = text.lines().next().unwrap().split(',').collect();
    let drop = header.iter().position(|h| *h == "seconds");
    let mut rows: Vec<String> = text
        .lines()
        .map(|l| {
            l.split(',')
                .enumerate()
                .filter(|(i, _)| Some(*i) != drop)
                .map(|(_, f)| f)
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    rows.sort();
    rows
}

#[test]
fn a_rerun_is_identical_and_an_interrupted_run_resumes_to_the_same_rows() {
    let dir = tempfile::tempdir().unwrap();
    let model = llama_dir(&dir.path().join("m"), true);
    let corpus = corpus(dir.path());
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let o = e2e(&model, &corpus, &a, "");
    assert!(o.status.success(), "{}", stderr(&o));
    // 2 windows × (4 methods × 2 budgets) points, 3 layers each.
    assert_eq!(rows_without_seconds(&a.join("e2e.csv")).len(), 1 + 16);
    assert_eq!(
        rows_without_seconds(&a.join("e2e_layers.csv")).len(),
        1 + 16 * 3
    );
    let o = e2e(&model, &corpus, &b, "");
    assert!(o.status.success(), "{}", stderr(&o));
    for f in ["e2e.csv", "e2e_layers.csv", "ids.txt", "summary.csv"] {
        assert_eq!(
            rows_without_seconds(&a.join(f)),
            rows_without_seconds(&b.join(f)),
            "{f}"
        );
    }
    // An interruption after a point's layer rows but before its e2e.csv row, with a torn row.
    let e2e_csv = std::fs::read_to_string(b.join("e2e.csv")).unwrap();
    let keep: Vec<&str> = e2e_csv.lines().take(10).collect();
    let torn = &e2e_csv.lines().nth(10).unwrap()[..20];
    std::fs::write(b.join("e2e.csv"), format!("{}\n{torn}", keep.join("\n"))).unwrap();
    let layers = std::fs::read_to_string(b.join("e2e_layers.csv")).unwrap();
    let cut: String = layers.lines().take(30).map(|l| format!("{l}\n")).collect();
    std::fs::write(b.join("e2e_layers.csv"), format!("{cut}0,prefill,win")).unwrap();
    let o = e2e(&model, &corpus, &b, "");
    assert!(o.status.success(), "{}", stderr(&o));
    for f in ["e2e.csv", "e2e_layers.csv", "summary.csv"] {
        assert_eq!(
            rows_without_seconds(&a.join(f)),
            rows_without_seconds(&b.join(f)),
            "{f}"
        );
    }
    let manifest = std::fs::read_to_string(b.join("manifest.json")).unwrap();
    assert!(manifest.contains("\"status\": \"complete\""), "{manifest}");
}

#[test]
fn bad_input_is_exit_2_naming_it_and_keeps_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let model = llama_dir(&dir.path().join("m"), true);
    let corpus = corpus(dir.path());
    let out = dir.path().join("run");
    let o = e2e(&model, &corpus, &out, "");
    assert!(o.status.success(), "{}", stderr(&o));
    let before = std::fs::read(out.join("e2e.csv")).unwrap();
    let usage = |extra: &str, want: &str| {
        let o = e2e(&model, &corpus, &out, extra);
        assert_eq!(o.status.code(), Some(2), "{extra}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{extra}: {}", stderr(&o));
        assert_eq!(
            std::fs::read(out.join("e2e.csv")).unwrap(),
            before,
            "{extra}"
        );
    };
    usage("--n-f 64", "--n-f 64");
    usage("--methods skyformer", "skyformer");
    let ids = dir.path().join("ids.txt");
    std::fs::write(&ids, "1 2 3 4 5 6 7 8 500 9\n").unwrap();
    usage(&format!("--ids {}", ids.display()), "token id 500");
    let npy = dir.path().join("ids.npy");
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    let header = "{'descr': '<f8', 'fortran_order': False, 'shape': (4,), }          \n";
    bytes.extend((header.len() as u16).to_le_bytes());
    bytes.extend(header.as_bytes());
    bytes.extend([0u8; 32]);
    std::fs::write(&npy, bytes).unwrap();
    usage(&format!("--ids {}", npy.display()), "'<f8'");
    // Another configuration into the same directory is refused, naming what differs.
    usage("--seed 3", "seed");
    // So is the same command after the model's files changed under the same directory name.
    let config = model.join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}\n")).unwrap();
    usage("", "changed since this run started");
}

#[test]
fn ids_from_a_file_are_the_windows_and_ids_txt_gives_them_back() {
    let dir = tempfile::tempdir().unwrap();
    let model = llama_dir(&dir.path().join("m"), true);
    let corpus = corpus(dir.path());
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let o = e2e(&model, &corpus, &a, "");
    assert!(o.status.success(), "{}", stderr(&o));
    let o = e2e(
        &model,
        &corpus,
        &b,
        &format!("--ids {}", a.join("ids.txt").display()),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        rows_without_seconds(&a.join("e2e.csv")),
        rows_without_seconds(&b.join("e2e.csv"))
    );
    // The ids decide the windows: without --corpus nothing is tokenized or fetched (issue 57: the
    // default corpus is Wikitext-2 from the hub, which an offline run cannot reach), same rows.
    let c = dir.path().join("c");
    let ids = a.join("ids.txt");
    let args = [
        "e2e",
        "--features",
        "8,16",
        "--quiet",
        "--n-f",
        "16",
        "--methods",
        "window,streaming,snapkv,topk_dec",
        "--model-dir",
        model.to_str().unwrap(),
        "--ids",
        ids.to_str().unwrap(),
        "--out",
        c.to_str().unwrap(),
    ];
    let o = run(
        &args,
        &[
            ("HF_HUB_OFFLINE", "1"),
            ("HF_ENDPOINT", "http://127.0.0.1:9"),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        rows_without_seconds(&a.join("e2e.csv")),
        rows_without_seconds(&c.join("e2e.csv"))
    );
}

#[test]
fn more_windows_extend_a_run_and_other_windows_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = llama_dir(&dir.path().join("m"), true);
    let corpus = corpus(dir.path());
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let o = e2e(&model, &corpus, &a, "");
    assert!(o.status.success(), "{}", stderr(&o));
    let o = e2e(&model, &corpus, &b, "--windows 1");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(rows_without_seconds(&b.join("e2e.csv")).len(), 1 + 8);
    let o = e2e(&model, &corpus, &b, "");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        rows_without_seconds(&a.join("e2e.csv")),
        rows_without_seconds(&b.join("e2e.csv"))
    );
    let o = e2e(&model, &corpus, &b, "--lengths 48");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("other windows"), "{}", stderr(&o));
}

#[test]
fn shards_merged_are_the_unsharded_run() {
    let dir = tempfile::tempdir().unwrap();
    let model = llama_dir(&dir.path().join("m"), true);
    let corpus = corpus(dir.path());
    let whole = dir.path().join("whole");
    let o = e2e(&model, &corpus, &whole, "--windows 3");
    assert!(o.status.success(), "{}", stderr(&o));
    let shards: Vec<_> = (1..=2).map(|k| dir.path().join(format!("s{k}"))).collect();
    for (k, s) in shards.iter().enumerate() {
        let o = e2e(
            &model,
            &corpus,
            s,
            &format!("--windows 3 --shard {}/2", k + 1),
        );
        assert!(o.status.success(), "{}", stderr(&o));
        let manifest = std::fs::read_to_string(s.join("manifest.json")).unwrap();
        assert!(manifest.contains("\"status\": \"partial\""), "{manifest}");
    }
    // Shard 1 of 2 holds windows 0 and 2, shard 2 window 1: 8 points per window.
    assert_eq!(
        rows_without_seconds(&shards[0].join("e2e.csv")).len(),
        1 + 16
    );
    assert_eq!(
        rows_without_seconds(&shards[1].join("e2e.csv")).len(),
        1 + 8
    );
    let merged = dir.path().join("merged");
    let merge = |dirs: &[&Path], out: &Path| {
        let mut args = vec!["merge", "--out", out.to_str().unwrap()];
        args.extend(dirs.iter().map(|d| d.to_str().unwrap()));
        run(&args, &[])
    };
    let o = merge(&[&shards[0], &shards[1]], &merged);
    assert!(o.status.success(), "{}", stderr(&o));
    for f in ["e2e.csv", "e2e_layers.csv", "ids.txt", "summary.csv"] {
        assert_eq!(
            rows_without_seconds(&whole.join(f)),
            rows_without_seconds(&merged.join(f)),
            "{f}"
        );
    }
    let manifest = std::fs::read_to_string(merged.join("manifest.json")).unwrap();
    assert!(manifest.contains("\"status\": \"complete\""), "{manifest}");
    // The same merge again is allowed (in any order); a merge into another run is refused and
    // leaves that run's manifest as it was (issue 57).
    let o = merge(&[&shards[1], &shards[0]], &merged);
    assert!(o.status.success(), "{}", stderr(&o));
    let before = std::fs::read_to_string(whole.join("manifest.json")).unwrap();
    let o = merge(&[&shards[0], &shards[1]], &whole);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("another run"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(whole.join("manifest.json")).unwrap(),
        before
    );
    // A point of shard 1 copied into shard 2 would be counted twice: refused, naming it.
    let row = std::fs::read_to_string(shards[0].join("e2e.csv"))
        .unwrap()
        .lines()
        .nth(1)
        .unwrap()
        .to_string();
    let mut second = std::fs::read_to_string(shards[1].join("e2e.csv")).unwrap();
    second += &format!("{row}\n");
    std::fs::write(shards[1].join("e2e.csv"), second).unwrap();
    let o = merge(&[&shards[0], &shards[1]], &dir.path().join("dup"));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("also in another shard"),
        "{}",
        stderr(&o)
    );
    // A shard given twice, an unsharded run and a shard of another command are refused.
    for (dirs, want) in [
        (vec![&shards[0], &shards[0]], "given twice"),
        (vec![&shards[0], &whole], "not a shard"),
    ] {
        let o = merge(
            &dirs.iter().map(|d| d.as_path()).collect::<Vec<_>>(),
            &dir.path().join("x"),
        );
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains(want), "{}", stderr(&o));
    }
    let other = dir.path().join("other");
    let o = e2e(&model, &corpus, &other, "--windows 3 --shard 2/2 --seed 7");
    assert!(o.status.success(), "{}", stderr(&o));
    let o = merge(&[&shards[0], &other], &dir.path().join("y"));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("seed differs"), "{}", stderr(&o));
    // A shard of the same run but other --methods would leave holes: refused, naming the points.
    let fewer = dir.path().join("fewer");
    let o = e2e(
        &model,
        &corpus,
        &fewer,
        "--windows 3 --shard 2/2 --methods window,streaming,snapkv",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = merge(&[&shards[0], &fewer], &dir.path().join("z"));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("ran other points") && stderr(&o).contains("topk_dec"),
        "{}",
        stderr(&o)
    );
    assert!(!dir.path().join("z").join("manifest.json").exists());
}

#[test]
fn per_head_rows_average_to_the_layer_rows_and_a_resume_keeps_the_optional_files() {
    let dir = tempfile::tempdir().unwrap();
    let model = llama_dir(&dir.path().join("m"), true);
    let corpus = corpus(dir.path());
    let out = dir.path().join("run");
    let o = e2e(&model, &corpus, &out, "--per-head --windows 1");
    assert!(o.status.success(), "{}", stderr(&o));
    let read = |f: &str| -> Vec<Vec<String>> {
        std::fs::read_to_string(out.join(f))
            .unwrap()
            .lines()
            .skip(1)
            .map(|l| l.split(',').map(String::from).collect())
            .collect()
    };
    let (layers, heads) = (read("e2e_layers.csv"), read("e2e_heads.csv"));
    // 8 points × 3 layers, 4 query heads each.
    assert_eq!((layers.len(), heads.len()), (24, 96));
    for row in &layers {
        let mine: Vec<&Vec<String>> = heads.iter().filter(|h| h[..5] == row[..5]).collect();
        assert_eq!(mine.len(), 4, "{row:?}");
        for c in 0..6 {
            let want: f64 = row[5 + c].parse().unwrap();
            let mean = mine
                .iter()
                .map(|h| h[6 + c].parse::<f64>().unwrap())
                .sum::<f64>()
                / 4.0;
            assert!(
                (want.is_nan() && mean.is_nan())
                    || (want - mean).abs() <= 1e-12 * want.abs().max(1e-30),
                "{row:?} column {c}: mean over heads {mean}"
            );
        }
    }
    // A rerun without the flag would leave e2e_heads.csv without the new points: refused.
    let o = e2e(&model, &corpus, &out, "--windows 2");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("per_head"), "{}", stderr(&o));
    let o = e2e(&model, &corpus, &out, "--per-head --windows 2");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(read("e2e_heads.csv").len(), 192);
}

/// The Mistral fixture (sliding window 16) with the BOS tokenizer, in a directory of its own.
fn mistral_dir(tmp: &Path) -> std::path::PathBuf {
    let model = tmp.join("mistral");
    std::fs::create_dir_all(&model).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixtures().join("mistral").join(f), model.join(f)).unwrap();
    }
    std::fs::copy(
        fixtures().join("tokenizers/with_bos/tokenizer.json"),
        model.join("tokenizer.json"),
    )
    .unwrap();
    model
}

/// Mistral's sliding window (16 keys on the fixture) changes every layer's exact target at
/// n = 32, and each method follows its rules there (docs/reference.md §7.7.6): at d ≥ W every
/// method reproduces the exact run (the window holds at most W keys, so it keeps them all), below
/// it the output moves; a method without a windowed form (KIVI's decode cache) is refused before
/// any window runs, naming the layer and the window.
#[test]
fn a_sliding_window_is_each_layers_own_target_and_d_at_least_w_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let model = mistral_dir(dir.path());
    let corpus = corpus(dir.path());
    let out = dir.path().join("a");
    let o = e2e(
        &model,
        &corpus,
        &out,
        "--lengths 32 --windows 1 --n-f 8 --dtype f64 --methods window,topk,snapkv,dec_window --features 8,16",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = csv_records(&out.join("e2e.csv"));
    assert_eq!(rows.len(), 8);
    for r in &rows {
        let kl: f64 = r["kl_mean"].parse().unwrap();
        match r["d"].as_str() {
            // f64 rounding through two layers' different summation orders.
            "16" => assert!(kl < 1e-13, "{} at d = W: kl_mean {kl}", r["method"]),
            _ => assert!(kl > 1e-4, "{} at d = 8 < W: kl_mean {kl}", r["method"]),
        }
    }
    let o = e2e(
        &model,
        &corpus,
        &dir.path().join("b"),
        "--lengths 32 --n-f 8 --methods snapkv,dkivi2 --features 8",
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--methods dkivi2: layer 0 has a sliding window (causal, window 16"),
        "{}",
        stderr(&o)
    );
}

/// The sweep and dump-qkv score a sliding layer against its windowed target too (issue 54: they
/// used the plain causal one while e2e used the window). On the Mistral fixture at n = 32 > W = 16,
/// layer 1: `window` at d = W is the layer's own attention (error at f64 rounding), below W it is not;
/// the manifest records the window. transformers' own output is pinned in src/models/llama_tests.rs.
#[test]
fn the_sweep_scores_a_sliding_layer_against_its_window() {
    let dir = tempfile::tempdir().unwrap();
    let model = mistral_dir(dir.path());
    let corpus = corpus(dir.path());
    let out = dir.path().join("sweep");
    let o = decoder_run(
        &model,
        &corpus,
        &out,
        "--model pretrained --layer 1 --lengths 32 --windows 1 --dtype f64 --methods window --features 8,16",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = csv_records(&out.join("trials.csv"));
    assert_eq!(rows.len(), 8, "4 heads × 2 budgets");
    for r in &rows {
        let e: f64 = r["rel_error"].parse().unwrap();
        match r["d"].as_str() {
            "16" => assert!(e < 1e-12, "head {} at d = W: rel_error {e}", r["head"]),
            _ => assert!(e > 1e-4, "head {} at d = 8 < W: rel_error {e}", r["head"]),
        }
    }
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["sliding_window"], 16);
}

/// SIGINT stops the run between points (or between a forward's layers): exit 130 saying how far
/// it got, the manifest `interrupted`, every written point kept, and the rerun completes exactly
/// the rows of an uninterrupted run.
#[test]
fn a_signal_stops_between_points_and_the_rerun_completes_the_same_rows() {
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let model = llama_dir(&dir.path().join("m"), true);
    let corpus = corpus(dir.path());
    let extra = "--lengths 32 --n-f 8 --windows 18 --methods window,topk,streaming,snapkv,tova,adakv,topk_dec,dec_window,h2o_dec,quest_dec";
    let full = dir.path().join("full");
    let o = e2e(&model, &corpus, &full, extra);
    assert!(o.status.success(), "{}", stderr(&o));
    let cut = dir.path().join("cut");
    let args = format!(
        "e2e --features 8,16 --quiet --out {} {extra} --model-dir {} --corpus {}",
        cut.display(),
        model.display(),
        corpus.display()
    );
    let mut child = Command::new(bin())
        .args(args.split_whitespace())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let csv = cut.join("e2e.csv");
    loop {
        let lines = std::fs::read_to_string(&csv)
            .map(|s| s.lines().count())
            .unwrap_or(0);
        if lines > 20 {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run finished before the signal; enlarge it"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let (o, _) = wait(child, std::time::Duration::from_secs(120));
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(130), "{e}");
    assert!(
        e.contains("interrupted by SIGINT after") && e.contains("rerun the same command to resume"),
        "{e}"
    );
    let manifest = std::fs::read_to_string(cut.join("manifest.json")).unwrap();
    assert!(
        manifest.contains("\"status\": \"interrupted\""),
        "{manifest}"
    );
    let kept = rows_without_seconds(&csv).len() - 1;
    assert!((20..360).contains(&kept), "{kept}");
    let o = e2e(&model, &corpus, &cut, extra);
    assert!(o.status.success(), "{}", stderr(&o));
    for f in ["e2e.csv", "e2e_layers.csv", "summary.csv"] {
        assert_eq!(
            rows_without_seconds(&full.join(f)),
            rows_without_seconds(&cut.join(f)),
            "{f}"
        );
    }
}

/// A resumed run with other initialized weights is refused (issue 57): two `--model initialized`
/// runs share every file, so the seed and the scheme are recorded and compared. The same seed resumes.
#[test]
fn a_resume_with_another_initialized_model_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = llama_dir(&dir.path().join("m"), true);
    let corpus = corpus(dir.path());
    let out = dir.path().join("a");
    let flags = "--model initialized --methods window";
    let o = e2e(
        &model,
        &corpus,
        &out,
        &format!("{flags} --windows 1 --model-seed 1"),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = e2e(
        &model,
        &corpus,
        &out,
        &format!("{flags} --windows 2 --model-seed 2"),
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("weights"), "{}", stderr(&o));
    let o = e2e(
        &model,
        &corpus,
        &out,
        &format!("{flags} --windows 2 --model-seed 1 --init pytorch"),
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = e2e(
        &model,
        &corpus,
        &out,
        &format!("{flags} --windows 2 --model-seed 1"),
    );
    assert!(o.status.success(), "{}", stderr(&o));
}

/// A row of a window the run does not have is refused on resume (issue 57), not counted as a point.
#[test]
fn a_resume_refuses_rows_of_windows_beyond_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let model = llama_dir(&dir.path().join("m"), true);
    let corpus = corpus(dir.path());
    let out = dir.path().join("a");
    let o = e2e(&model, &corpus, &out, "--windows 1 --methods window");
    assert!(o.status.success(), "{}", stderr(&o));
    let path = out.join("e2e.csv");
    let text = std::fs::read_to_string(&path).unwrap();
    let row = text.lines().nth(1).unwrap();
    let stray = format!("7{}", &row[row.find(',').unwrap()..]);
    std::fs::write(&path, format!("{text}{stray}\n")).unwrap();
    let o = e2e(&model, &corpus, &out, "--windows 1 --methods window");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("window 7"), "{}", stderr(&o));
}

/// Bad e2e requests are refused before anything is written, so the corrected command runs (issue 57):
/// `--n-f 0`, a length or a one-layer named twice, and the sweep's `--layer` and
/// `--embedding-dropout`, which e2e has no use for. A refused resume names another --out, not the
/// sweep's --force; the same files in a renamed directory resume.
#[test]
fn bad_requests_are_refused_before_writing_and_a_renamed_model_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let model = llama_dir(&dir.path().join("m"), true);
    let corpus = corpus(dir.path());
    let out = dir.path().join("a");
    for (flags, needle) in [
        ("--n-f 0", "--n-f 0"),
        ("--lengths 64,64", "named twice"),
        ("--one-layer 0,0", "named twice"),
        ("--layer 1", "--layer 1"),
        ("--embedding-dropout 0.1", "--embedding-dropout"),
    ] {
        let o = e2e(
            &model,
            &corpus,
            &out,
            &format!("--windows 1 --methods window {flags}"),
        );
        assert_eq!(o.status.code(), Some(2), "{flags}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{flags}: {}", stderr(&o));
        assert!(
            !out.join("manifest.json").exists(),
            "{flags} wrote a manifest"
        );
    }
    let o = e2e(&model, &corpus, &out, "--windows 1 --methods window");
    assert!(o.status.success(), "{}", stderr(&o));
    // The same files under another directory name: the same model, resumed (and extended).
    let renamed = dir.path().join("renamed");
    std::fs::rename(&model, &renamed).unwrap();
    let o = e2e(&renamed, &corpus, &out, "--windows 2 --methods window");
    assert!(o.status.success(), "{}", stderr(&o));
    // Another checkpoint under the run: refused without pointing at a --force that e2e lacks.
    let other = llama_dir(&dir.path().join("other"), false);
    let o = e2e(&other, &corpus, &out, "--windows 2 --methods window");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(!stderr(&o).contains("--force"), "{}", stderr(&o));
}

/// An e2e run's directory given to plot, anchors or check, or as a sweep's --out (even with
/// --force), is named as an e2e run (issue 57), and the run is left as it was.
#[test]
fn an_e2e_directory_is_named_as_one_by_the_sweeps_tools() {
    let dir = tempfile::tempdir().unwrap();
    let model = llama_dir(&dir.path().join("m"), true);
    let corpus = corpus(dir.path());
    let out = dir.path().join("a");
    let o = e2e(&model, &corpus, &out, "--windows 1 --methods window");
    assert!(o.status.success(), "{}", stderr(&o));
    let before = std::fs::read_to_string(out.join("e2e.csv")).unwrap();
    let d = out.to_str().unwrap();
    for args in [
        vec!["plot", "--from", d],
        vec!["anchors", "--from", d],
        vec!["check", "--baseline", d, "--current", d],
    ] {
        let o = run(&args, &[]);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("this is an e2e run"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
    let o = decoder_run(
        &model,
        &corpus,
        &out,
        "--lengths 32 --windows 1 --methods window --features 8 --force",
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("this is an e2e run"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read_to_string(out.join("e2e.csv")).unwrap(),
        before
    );
}

/// A --model-dir that does not exist is named as missing (it was called "not a BERT encoder").
#[test]
fn a_missing_model_directory_is_named_as_missing() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = corpus(dir.path());
    let o = e2e(
        &dir.path().join("nowhere"),
        &corpus,
        &dir.path().join("a"),
        "--windows 1",
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no such file or directory"),
        "{}",
        stderr(&o)
    );
}

/// A rerun of a finished run that has nothing to compute never marks it `running` (issue 57): a
/// rerun killed at any moment leaves it `complete`. The manifest is watched through the rerun.
#[test]
fn a_rerun_of_a_complete_run_never_says_running() {
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let model = llama_dir(&dir.path().join("m"), true);
    let corpus = corpus(dir.path());
    let out = dir.path().join("run");
    let o = e2e(&model, &corpus, &out, "--windows 1");
    assert!(o.status.success(), "{}", stderr(&o));
    let manifest = out.join("manifest.json");
    assert!(std::fs::read_to_string(&manifest)
        .unwrap()
        .contains("\"status\": \"complete\""));
    let args = format!(
        "e2e --features 8,16 --quiet --out {} --windows 1 --n-f 16 --methods window,streaming,snapkv,topk_dec --lengths 64 --model-dir {} --corpus {}",
        out.display(),
        model.display(),
        corpus.display()
    );
    let mut child = Command::new(bin())
        .args(args.split_whitespace())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut seen_running = false;
    while child.try_wait().unwrap().is_none() {
        let text = std::fs::read_to_string(&manifest).unwrap_or_default();
        if text.contains("\"status\": \"running\"") {
            seen_running = true;
            let _ = child.kill();
            break;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    let o = child.wait_with_output().unwrap();
    assert!(
        !seen_running,
        "a rerun with nothing to do marked the run running"
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::read_to_string(&manifest)
        .unwrap()
        .contains("\"status\": \"complete\""));
}

/// The activations count too (issue 56): a run whose weights fit the memory a run may take but
/// whose weights and activations do not is refused before any window runs, with both estimates;
/// the manifest records them.
#[test]
fn a_run_whose_activations_do_not_fit_is_refused_before_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let model = llama_dir(&dir.path().join("m"), true);
    let corpus = corpus(dir.path());
    let out = dir.path().join("run");
    let o = e2e(&model, &corpus, &out, "--windows 1");
    assert!(o.status.success(), "{}", stderr(&o));
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    let weights = m["memory"]["weights_estimate_bytes"].as_u64().unwrap();
    let activations = m["memory"]["activations_estimate_bytes"].as_u64().unwrap();
    assert!(weights > 0 && activations > 0, "{m}");
    let gb = format!("{}", (weights + activations / 2) as f64 / 1e9);
    let refused = dir.path().join("refused");
    let args = format!(
        "e2e --features 8,16 --quiet --out {} --windows 1 --n-f 16 --methods window,streaming,snapkv,topk_dec --lengths 64 --model-dir {} --corpus {}",
        refused.display(),
        model.display(),
        corpus.display()
    );
    let args: Vec<&str> = args.split_whitespace().collect();
    let env = [
        ("APPROX_BENCH_MEMORY_GB", gb.as_str()),
        ("APPROX_BENCH_WEIGHTS", "widened"),
    ];
    let o = run(&args, &env);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("of activations for windows of n = 64"),
        "{}",
        stderr(&o)
    );
    assert!(!refused.join("e2e.csv").exists());
}
