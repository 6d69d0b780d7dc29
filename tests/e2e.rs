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
