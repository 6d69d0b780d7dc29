//! The tiny decoder fixtures of `fixtures/decoders` (made by transformers,
//! tests/reference/generate_decoder_fixtures.py) in a directory of a test's own, a small corpus,
//! and the CLI run on them.

use std::path::{Path, PathBuf};

use super::run;

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/decoders")
}

/// The tiny llama (4 query heads over 2 K/V heads, llama3 RoPE, 3 layers sharded over 4 files)
/// with a tokenizer that adds BOS or one that does not, in a directory of its own.
pub fn llama_dir(dir: &Path, with_bos: bool) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    for e in std::fs::read_dir(fixtures().join("llama")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap();
        if name != "expected.safetensors" {
            std::fs::copy(&p, dir.join(name)).unwrap();
        }
    }
    let tok = if with_bos { "with_bos" } else { "without_bos" };
    std::fs::copy(
        fixtures()
            .join("tokenizers")
            .join(tok)
            .join("tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    dir.to_path_buf()
}

/// A corpus of the tokenizers' words (a, b, c), 600 tokens in 20 rows.
pub fn corpus(dir: &Path) -> PathBuf {
    let p = dir.join("abc.txt");
    let row: String = (0..30).map(|i| ["a ", "b ", "c ", "b "][i % 4]).collect();
    std::fs::write(&p, format!("{}\n", row.trim()).repeat(20)).unwrap();
    p
}

/// A sweep of `model` over `corpus` into `out` with `flags` (space-separated), quiet.
pub fn decoder_run(model: &Path, corpus: &Path, out: &Path, flags: &str) -> std::process::Output {
    decoder_cli(
        model,
        corpus,
        &format!("{flags} --out {} --quiet", out.display()),
    )
}

/// The binary with `flags` (space-separated; a subcommand first if any), then `model`'s directory
/// and `corpus`.
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

pub fn column(path: &Path, name: &str) -> Vec<String> {
    let mut rdr = csv::Reader::from_path(path).unwrap();
    let i = rdr
        .headers()
        .unwrap()
        .iter()
        .position(|h| h == name)
        .unwrap();
    rdr.records().map(|r| r.unwrap()[i].to_string()).collect()
}
