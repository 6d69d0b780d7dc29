//! The §7.7 families' tiny transformers models (`fixtures/families`) and the CLI over them.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use serde_json::Value;

use super::{run, stderr};

pub fn family_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/families")
        .join(name)
}

/// The fixture `name`'s model in a directory of its own, with its word-level tokenizer (word `t{i}`
/// is token i, no BOS) and its corpus.txt, which tokenizes to the fixture's expected ids.
pub fn family_dir(tmp: &Path, name: &str) -> (PathBuf, PathBuf, Vec<u32>) {
    let dir = tmp.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(family_fixture(name).join(f), dir.join(f)).unwrap();
    }
    let ids = expected(name, "expected.safetensors")["ids"]
        .to_dtype(DType::I64)
        .unwrap()
        .to_vec1::<i64>()
        .unwrap();
    (
        dir,
        family_fixture(name).join("corpus.txt"),
        ids.into_iter().map(|i| i as u32).collect(),
    )
}

pub fn expected(name: &str, file: &str) -> std::collections::HashMap<String, Tensor> {
    candle_core::safetensors::load(family_fixture(name).join(file), &Device::Cpu).unwrap()
}

pub fn decoder_cli(model: &Path, corpus: &Path, flags: &str) -> std::process::Output {
    let mut args: Vec<&str> = flags.split_whitespace().collect();
    args.extend([
        "--model-dir",
        model.to_str().unwrap(),
        "--corpus",
        corpus.to_str().unwrap(),
    ]);
    run(&args, &[])
}

/// max |a − b| / max |b|.
pub fn rel(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims());
    let a = a.to_dtype(DType::F64).unwrap();
    let b = b.to_dtype(DType::F64).unwrap();
    let num = (a - &b).unwrap().abs().unwrap().max_all().unwrap();
    let den = b.abs().unwrap().max_all().unwrap();
    num.to_scalar::<f64>().unwrap() / den.to_scalar::<f64>().unwrap()
}

/// `dump-qkv` of `dir` over `corpus` with `flags`; the dump's tensors and sidecar.
pub fn dump(
    dir: &Path,
    corpus: &Path,
    out: &Path,
    flags: &str,
) -> (std::collections::HashMap<String, Tensor>, Value, String) {
    let o = decoder_cli(
        dir,
        corpus,
        &format!("dump-qkv --length 40 {flags} --out {}", out.display()),
    );
    assert!(o.status.success(), "{flags}: {}", stderr(&o));
    let t = candle_core::safetensors::load(out, &Device::Cpu).unwrap();
    let side = std::fs::read_to_string(format!("{}.json", out.display())).unwrap();
    (t, serde_json::from_str(&side).unwrap(), stderr(&o))
}

/// A sweep of fixture `name` with `flags` (an `--out` of its own in `tmp` added), which must
/// succeed: its trials.csv's header and rows.
pub fn family_sweep(
    tmp: &Path,
    name: &str,
    flags: &str,
) -> (csv::StringRecord, Vec<csv::StringRecord>) {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let (dir, corpus, _) = family_dir(tmp, name);
    let run_no = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = tmp.join(format!("sweep-{name}-{run_no}"));
    let o = decoder_cli(
        &dir,
        &corpus,
        &format!("{flags} --out {} --quiet", out.display()),
    );
    assert!(o.status.success(), "{name} {flags}: {}", stderr(&o));
    let mut rows = csv::Reader::from_path(out.join("trials.csv")).unwrap();
    let header = rows.headers().unwrap().clone();
    (header, rows.records().map(|r| r.unwrap()).collect())
}
