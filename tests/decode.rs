//! The decode protocol end to end (METHODS.md §9, `--decode N_F`) on the tiny decoder fixture: the
//! rows, columns and manifest of a decode run, exactness at d ≥ n_p, the same rows whatever the
//! thread count, resume, and the refusals (an encoder, a prefill method, a §9 method without the
//! protocol, a continuation that leaves no prompt). No ../shared, no network.

mod common;

use common::decoder_fixture::*;
use common::*;

/// 2 windows of n = 64 split 48 + 16 over the tiny llama's layer 1 (4 query heads on 2 K/V heads,
/// 3 layers).
const FLAGS: &str = "--model pretrained --lengths 64 --windows 2 --decode 16 --features 8,16,33,48 --layer 1 --methods decode";

#[test]
fn a_decode_run_scores_the_continuation_rows_of_every_method() {
    let tmp = tempfile::tempdir().unwrap();
    let model = llama_dir(&tmp.path().join("llama"), true);
    let c = corpus(tmp.path());
    let out = tmp.path().join("out");
    let o = decoder_run(&model, &c, &out, FLAGS);
    assert!(o.status.success(), "{}", stderr(&o));
    let trials = out.join("trials.csv");
    let family =
        approx_bench::attention::family_method_ids(approx_bench::attention::Family::Decode);
    // The §9 methods of the `decode` preset and kvpress's ten presses (preset `kvpress`).
    assert_eq!(family.len(), 21);
    assert_eq!(approx_bench::attention::decode_preset_ids().len(), 11);
    assert_eq!(approx_bench::attention::press_method_ids().len(), 10);
    // 2 windows × 4 heads × 11 methods × 4 d.
    assert_eq!(column(&trials, "method").len(), 2 * 4 * 11 * 4);
    assert!(column(&trials, "n_f").iter().all(|v| v == "16"));
    assert!(column(&trials, "kv_union").iter().all(|v| !v.is_empty()));
    let (ds, errs, rel) = (
        column(&trials, "d"),
        column(&trials, "error"),
        column(&trials, "rel_error"),
    );
    let keys = column(&trials, "keys");
    for i in 0..ds.len() {
        let d: usize = ds[i].parse().unwrap();
        let k: f64 = keys[i].parse().unwrap();
        // keys = |C| + (n_f + 1)/2 with |C| ≤ n_p = 48 (Ada-KV's caps may pass d per head).
        assert!(k <= 48.0 + 8.5 + 1e-9, "row {i}: keys {k}");
        if d >= 48 {
            // Every prompt key kept: exact (rounding only), keys the dense continuation count.
            let r: f64 = rel[i].parse().unwrap();
            assert!(r < 1e-5, "row {i}: d = {d}, rel_error {r}");
            assert_eq!(k, 48.0 + 8.5);
        } else {
            assert!(errs[i].parse::<f64>().unwrap() > 0.0, "row {i}");
        }
    }
    let man: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(
        (
            &man["decode"]["n_f"],
            &man["decode"]["layer"],
            &man["decode"]["layers"]
        ),
        (
            &serde_json::json!(16),
            &serde_json::json!(1),
            &serde_json::json!(3)
        )
    );
    // Whose keys each method's d counts (issue 58), one entry per method of the run.
    let rules = man["decode"]["budget_rules"].as_object().unwrap();
    assert_eq!(rules.len(), 11);
    assert_eq!(rules["snapkv"], "per_query_head");
    assert_eq!(rules["tova"], "per_layer");
    assert_eq!(man["config"]["decode"], 16);
    assert!(out.join("decode.png").is_file());
    assert!(!out.join("decoder.png").exists());
    // The summary keeps n_f as the points' identity.
    let summary = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    assert!(summary.lines().next().unwrap().contains("n_f"));

    // A rerun resumes with nothing to do; another n_f into the same directory is refused.
    let before = std::fs::read(&trials).unwrap();
    let o = decoder_run(&model, &c, &out, FLAGS);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(&trials).unwrap(), before);
    let o = decoder_run(
        &model,
        &c,
        &out,
        &FLAGS.replace("--decode 16", "--decode 8"),
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));

    // Two shards merge into the unsharded run's rows (the manifest keeps the protocol).
    let mut parts = vec![];
    for k in 1..=2 {
        let part = tmp.path().join(format!("shard{k}"));
        let o = decoder_run(&model, &c, &part, &format!("{FLAGS} --shard {k}/2"));
        assert!(o.status.success(), "{}", stderr(&o));
        parts.push(part.to_str().unwrap().to_string());
    }
    let merged = tmp.path().join("merged");
    let mut args = vec!["merge"];
    args.extend(parts.iter().map(String::as_str));
    args.extend(["--out", merged.to_str().unwrap()]);
    let o = run(&args, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_same_rows(&merged.join("trials.csv"), &trials);
    let merged_man = std::fs::read_to_string(merged.join("manifest.json")).unwrap();
    assert!(merged_man.contains("\"n_f\": 16"), "{merged_man}");

    // `check` compares runs of one protocol: a run against itself passes, against another n_f is
    // refused naming both.
    let other = tmp.path().join("other");
    let o = decoder_run(
        &model,
        &c,
        &other,
        &FLAGS.replace("--decode 16", "--decode 8"),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let check = |cur: &std::path::Path| {
        run(
            &[
                "check",
                "--baseline",
                out.to_str().unwrap(),
                "--current",
                cur.to_str().unwrap(),
                "--report",
                tmp.path().join("check.md").to_str().unwrap(),
            ],
            &[],
        )
    };
    let o = check(&merged);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = check(&other);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("n_f = 16") && e.contains("n_f = 8") && e.contains("one protocol"),
        "{e}"
    );
}

/// The rows do not depend on the thread count (layer-level methods share one context per window
/// across heads running in parallel) nor on the path a device takes.
#[test]
fn decode_rows_are_the_same_on_one_thread_and_many() {
    let tmp = tempfile::tempdir().unwrap();
    let model = llama_dir(&tmp.path().join("llama"), true);
    let c = corpus(tmp.path());
    let mut outs = vec![];
    // One thread, four, and the device path on the CPU (heads one after another from the device's
    // host thread, as on a GPU).
    for (threads, device_path) in [("1", "0"), ("4", "0"), ("4", "1")] {
        let out = tmp.path().join(format!("t{threads}-{device_path}"));
        let mut args: Vec<String> = FLAGS.split_whitespace().map(String::from).collect();
        args.extend(
            [
                "--model-dir",
                model.to_str().unwrap(),
                "--corpus",
                c.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "--quiet",
            ]
            .map(String::from),
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = run(
            &args,
            &[
                ("RAYON_NUM_THREADS", threads),
                ("APPROX_BENCH_DEVICE_PATH", device_path),
            ],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        outs.push(out.join("trials.csv"));
    }
    assert_same_rows(&outs[0], &outs[1]);
    assert_same_rows(&outs[0], &outs[2]);
}

#[test]
fn what_the_protocol_cannot_run_is_refused_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let model = llama_dir(&tmp.path().join("llama"), true);
    let c = corpus(tmp.path());
    let refused = |flags: &str, needle: &str| {
        let o = decoder_run(&model, &c, &tmp.path().join("x"), flags);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{flags}: {e}");
        assert!(e.contains(needle), "{flags}: {e}");
        assert!(!e.contains("panicked"), "{e}");
    };
    refused(
        "--lengths 64 --windows 1 --decode 16 --methods window",
        "not a method of the decode protocol",
    );
    refused(
        "--lengths 64 --windows 1 --methods snapkv",
        "add --decode N_F",
    );
    refused(
        "--lengths 64 --windows 1 --decode 64 --methods decode",
        "leaves no prompt",
    );
    refused(
        "--lengths 64 --windows 1 --decode 16 --mask none",
        "drop --mask none",
    );
    refused(
        "--lengths 64 --windows 1 --decode 16 --methods sage1",
        "not a method of the decode protocol",
    );
    // An encoder has no causal continuation.
    let (m, corpus) = tiny_inputs(&tmp.path().join("bert"), false);
    let o = run(
        &[
            "--model-dir",
            &m,
            "--corpus",
            &corpus,
            "--lengths",
            "16",
            "--windows",
            "1",
            "--model",
            "initialized",
            "--decode",
            "4",
            "--features",
            "8",
            "--out",
            tmp.path().join("b").to_str().unwrap(),
            "--quiet",
        ],
        &[],
    );
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("is an encoder"), "{e}");
}

/// `score --decode N_F` scores a user's continuation rows (files of [heads, N_F, p]) against the
/// same exact rows as the sweep: Ô = 0 has relative error 1 and ‖O_F‖₂ is the sweep's exact_norm.
#[test]
fn score_under_decode_takes_the_continuation_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let model = llama_dir(&tmp.path().join("llama"), true);
    let c = corpus(tmp.path());
    let qkv = tmp.path().join("qkv");
    std::fs::create_dir_all(&qkv).unwrap();
    let o = decoder_cli(
        &model,
        &c,
        &format!(
            "dump-qkv --model pretrained --layer 1 --length 64 --window 0 --out {}",
            qkv.join("w0.safetensors").display()
        ),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let head_dim = {
        let t =
            candle_core::safetensors::load(qkv.join("w0.safetensors"), &candle_core::Device::Cpu)
                .unwrap();
        t["q"].dims()[2]
    };
    let approx = tmp.path().join("approx");
    std::fs::create_dir_all(&approx).unwrap();
    let zeros = candle_core::Tensor::zeros(
        (4, 16, head_dim),
        candle_core::DType::F32,
        &candle_core::Device::Cpu,
    )
    .unwrap();
    candle_core::safetensors::save(
        &std::collections::HashMap::from([("o_hat".to_string(), zeros)]),
        approx.join("mine-n64-w0-d8.safetensors"),
    )
    .unwrap();
    let out = tmp.path().join("scored");
    let args = |decode: &str| {
        vec![
            "score".to_string(),
            "--qkv".into(),
            qkv.to_str().unwrap().into(),
            "--approx".into(),
            approx.to_str().unwrap().into(),
            "--name".into(),
            "mine".into(),
            "--out".into(),
            out.to_str().unwrap().into(),
            "--decode".into(),
            decode.into(),
        ]
    };
    let strs = |v: &[String]| v.iter().map(String::as_str).collect::<Vec<_>>().join(" ");
    let o = run(&strs(&args("16")).split(' ').collect::<Vec<_>>(), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let trials = out.join("trials.csv");
    assert!(column(&trials, "rel_error").iter().all(|r| r == "1.0"));
    assert!(column(&trials, "n_f").iter().all(|r| r == "16"));
    // The sweep's exact rows for the same window.
    let sweep = tmp.path().join("sweep");
    let o = decoder_run(&model, &c, &sweep, "--model pretrained --lengths 64 --windows 1 --decode 16 --features 8 --layer 1 --methods dec_window");
    assert!(o.status.success(), "{}", stderr(&o));
    let (a, b) = (
        column(&trials, "exact_norm"),
        column(&sweep.join("trials.csv"), "exact_norm"),
    );
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        let (x, y): (f64, f64) = (x.parse().unwrap(), y.parse().unwrap());
        assert!((x - y).abs() <= 1e-6 * y, "{x} vs {y}");
    }
    // Files of the window's rows are refused under --decode, naming the shape.
    let o = run(
        &strs(&args("8"))
            .replace("--out", "--force --out")
            .split(' ')
            .collect::<Vec<_>>(),
        &[],
    );
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("n_f under --decode"), "{e}");
}

/// `bench --decode N_F` times the §9 methods on a fresh layer context per repeat.
#[test]
fn bench_times_decode_methods_under_the_protocol() {
    let tmp = tempfile::tempdir().unwrap();
    let model = llama_dir(&tmp.path().join("llama"), true);
    let c = corpus(tmp.path());
    let o = decoder_cli(
        &model,
        &c,
        "bench --model pretrained --lengths 64 --decode 16 --features 16 --layer 1 --repeats 1 --methods tova,adakv,topk_dec,kv_f16",
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", stderr(&o));
    for m in ["tova", "adakv", "topk_dec", "kv_f16"] {
        assert!(out.contains(m), "{out}");
    }
}
