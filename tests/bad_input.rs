//! Every mistake a user can make gets a clear message naming the input and the fix, exit 2.

mod common;

use common::*;

/// The tiny-fixture sweep arguments, with `extra` flags replacing the defaults of the same name.
fn with_tiny<'a>(model: &'a str, corpus: &'a str, out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let defaults = [
        ("--model", "initialized"),
        ("--model-dir", model),
        ("--corpus", corpus),
        ("--out", out),
        ("--windows", "1"),
        ("--lengths", "16"),
        ("--features", "4"),
        ("--methods", "vmean"),
    ];
    let mut v = vec!["--quiet"];
    for (flag, value) in defaults {
        if !extra.contains(&flag) {
            v.extend([flag, value]);
        }
    }
    v.extend_from_slice(extra);
    v
}

#[test]
fn bad_flag_values() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, c) = tiny_inputs(&tmp.path().join("m"), false);
    let o = tmp.path().join("o");
    let o = o.to_str().unwrap();
    expect_usage_error(
        &with_tiny(&m, &c, o, &["--lengths", "abc"]),
        "--lengths: 'abc' is not a positive integer",
    );
    expect_usage_error(
        &with_tiny(&m, &c, o, &["--lengths", ""]),
        "--lengths is empty",
    );
    expect_usage_error(
        &with_tiny(&m, &c, o, &["--features", "0"]),
        "--features: 0 is not allowed",
    );
    expect_usage_error(
        &with_tiny(&m, &c, o, &["--methods", "flash"]),
        "unknown method 'flash'; known methods: skyformer,",
    );
    expect_usage_error(&with_tiny(&m, &c, o, &["--windows", "0"]), "--windows 0");
    expect_usage_error(
        &with_tiny(&m, &c, o, &["--windows", "1000"]),
        "has 277 tokens: only 17 windows of n = 16 fit, but --windows 1000 were requested",
    );
    expect_usage_error(
        &with_tiny(&m, &c, o, &["--heads", "9"]),
        "--heads: head 9 does not exist; the model has 4 heads",
    );
    if !cfg!(feature = "cuda") {
        expect_usage_error(
            &with_tiny(&m, &c, o, &["--device", "cuda"]),
            "--device cuda: this build has no CUDA support",
        );
    }
    expect_usage_error(
        &with_tiny(&m, &c, o, &["--features", "4,32"]),
        "--features 32 exceeds the sequence length n = 16",
    );
    expect_usage_error(
        &with_tiny(
            &m,
            &c,
            o,
            &["--lengths", "1", "--features", "1", "--methods", "informer"],
        ),
        "method informer cannot run n = 1, d = 1:",
    );
    expect_usage_error(
        &with_tiny(&m, &c, o, &["--embedding-dropout", "1.5"]),
        "--embedding-dropout 1.5: must be in [0, 1)",
    );
}

#[test]
fn bad_files() {
    let tmp = tempfile::tempdir().unwrap();
    let (m, c) = tiny_inputs(&tmp.path().join("m"), false);
    let o = tmp.path().join("o");
    let o = o.to_str().unwrap();
    let missing = tmp.path().join("missing").to_str().unwrap().to_string();
    expect_usage_error(&with_tiny(&missing, &c, o, &[]), "not a directory");
    expect_usage_error(&with_tiny(&m, &missing, o, &[]), "cannot read it");
    let empty = tmp.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    expect_usage_error(
        &with_tiny(&m, empty.to_str().unwrap(), o, &[]),
        "the file is empty",
    );
    let bin = tmp.path().join("bin.dat");
    std::fs::write(&bin, [0u8, 159, 146, 150, 0, 1]).unwrap();
    expect_usage_error(
        &with_tiny(&m, bin.to_str().unwrap(), o, &[]),
        "the file is binary",
    );
    // Pretrained without weights.
    expect_usage_error(
        &with_tiny(&m, &c, o, &["--model", "pretrained"]),
        "model.safetensors is missing",
    );
    // Missing config and tokenizer.
    let nocfg = tiny_model(&tmp.path().join("nocfg"), false);
    std::fs::remove_file(nocfg.join("config.json")).unwrap();
    expect_usage_error(
        &with_tiny(nocfg.to_str().unwrap(), &c, o, &[]),
        "config.json is missing",
    );
    let notok = tiny_model(&tmp.path().join("notok"), false);
    std::fs::remove_file(notok.join("vocab.txt")).unwrap();
    expect_usage_error(
        &with_tiny(notok.to_str().unwrap(), &c, o, &[]),
        "neither tokenizer.json nor vocab.txt is present",
    );
    // Corrupt tokenizer.
    let badtok = tiny_model(&tmp.path().join("badtok"), false);
    std::fs::remove_file(badtok.join("vocab.txt")).unwrap();
    std::fs::write(badtok.join("tokenizer.json"), "{ \"model\": 17 }").unwrap();
    expect_usage_error(
        &with_tiny(badtok.to_str().unwrap(), &c, o, &[]),
        "not a valid tokenizer.json",
    );
    // Corrupt config.
    let bad = tiny_model(&tmp.path().join("badcfg"), false);
    std::fs::write(bad.join("config.json"), "{ not json").unwrap();
    expect_usage_error(
        &with_tiny(bad.to_str().unwrap(), &c, o, &[]),
        "config.json: not valid JSON",
    );
    // Corrupt weights.
    let badw = tiny_model(&tmp.path().join("badw"), false);
    std::fs::write(badw.join("model.safetensors"), b"garbage").unwrap();
    expect_usage_error(
        &with_tiny(badw.to_str().unwrap(), &c, o, &["--model", "pretrained"]),
        "not a readable safetensors file",
    );
    // Weights that do not fit the config (hidden size 16 weights for a 32 config).
    let misfit = tiny_model(&tmp.path().join("misfit"), true);
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(misfit.join("config.json")).unwrap())
            .unwrap();
    cfg["hidden_size"] = 16.into();
    std::fs::write(misfit.join("config.json"), cfg.to_string()).unwrap();
    expect_usage_error(
        &with_tiny(misfit.to_str().unwrap(), &c, o, &["--model", "pretrained"]),
        "the weights do not fit the config",
    );
    // A tokenizer from another model (more ids than the config's vocabulary).
    let other = tiny_model(&tmp.path().join("other"), false);
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(other.join("config.json")).unwrap()).unwrap();
    cfg["vocab_size"] = 20.into();
    std::fs::write(other.join("config.json"), cfg.to_string()).unwrap();
    expect_usage_error(
        &with_tiny(other.to_str().unwrap(), &c, o, &[]),
        "the tokenizer belongs to another model",
    );
}

#[test]
fn unwritable_out_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(&tmp.path().join("m"), false);
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let out = file.join("sub");
    expect_usage_error(
        &with_tiny(
            model.to_str().unwrap(),
            corpus_path().to_str().unwrap(),
            out.to_str().unwrap(),
            &[],
        ),
        "cannot create the directory",
    );
}

/// One writer per run directory (issue 32): while another process holds `--out`'s lock (here this
/// test, through the library), a sweep into it is refused with exit 2 naming the holder; once the
/// holder lets go, the same sweep runs.
#[test]
fn a_second_writer_into_one_out_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(&tmp.path().join("m"), false);
    let out = tmp.path().join("run");
    std::fs::create_dir_all(&out).unwrap();
    let corpus = corpus_path();
    let args = with_tiny(
        model.to_str().unwrap(),
        corpus.to_str().unwrap(),
        out.to_str().unwrap(),
        &[
            "--lengths",
            "16",
            "--windows",
            "1",
            "--features",
            "4",
            "--methods",
            "vmean",
        ],
    );
    let held = approx_bench::report::run_lock::acquire(&out).unwrap();
    expect_usage_error(&args, "is being written by another approx-bench run");
    assert!(
        !out.join("trials.csv").exists(),
        "the refused run wrote nothing"
    );
    drop(held);
    let o = run(&args, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
}
