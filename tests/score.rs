//! `score`: outputs computed outside approx-bench, on `dump-qkv` inputs, scored exactly as the
//! sweep scores a method: here the "user" writes V-Mean's outputs and Skeinformer's (through the
//! library, as a Python user would through approx_bench.approximate), and each scored row must
//! equal the sweep's row of that method, bit for bit.

mod common;

use std::collections::HashMap;
use std::path::Path;

use approx_bench::attention::{self, HeadInputs};
use approx_bench::numerics::sampling::{rng_from_seed, TrialKey};
use approx_bench::report::trials::read_rows;
use candle_core::{Device, Tensor};
use common::{corpus_path, run, stderr, tiny_model};

fn dump(model: &Path, dir: &Path, n: usize, w: usize) -> std::path::PathBuf {
    let out = dir.join(format!("qkv-n{n}-w{w}.safetensors"));
    let o = run(
        &[
            "dump-qkv",
            "--model",
            "initialized",
            "--model-dir",
            model.to_str().unwrap(),
            "--corpus",
            corpus_path().to_str().unwrap(),
            "--length",
            &n.to_string(),
            "--window",
            &w.to_string(),
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    out
}

/// Writes `<name>-n-w-d.safetensors` files of built-in `method` ([heads, n, p] `o_hat`), each
/// head seeded as the sweep seeds the built-in method's trial.
fn write_outputs(
    qkv: &Path,
    approx: &Path,
    name: &str,
    method: &str,
    n: usize,
    w: usize,
    ds: &[usize],
) {
    let t = candle_core::safetensors::load(qkv, &Device::Cpu).unwrap();
    let m = attention::by_id(method).unwrap();
    let heads = t["q"].dims()[0];
    for &d in ds {
        let mut outs = Vec::new();
        for h in 0..heads {
            let head = HeadInputs::new(
                t["q"].get(h).unwrap(),
                t["k"].get(h).unwrap(),
                t["v"].get(h).unwrap(),
            )
            .unwrap();
            let seed = TrialKey {
                seed: 0,
                n,
                window: w,
                head: h,
                method,
                d,
            }
            .derive_seed();
            outs.push(
                m.approximate(&head, d, &mut rng_from_seed(seed))
                    .unwrap()
                    .output,
            );
        }
        let map = HashMap::from([("o_hat".to_string(), Tensor::stack(&outs, 0).unwrap())]);
        candle_core::safetensors::save(
            &map,
            approx.join(format!("{name}-n{n}-w{w}-d{d}.safetensors")),
        )
        .unwrap();
    }
}

#[test]
fn scored_files_give_the_sweeps_rows_and_bad_files_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(&tmp.path().join("m"), false);
    let (qkv, approx) = (tmp.path().join("qkv"), tmp.path().join("approx"));
    std::fs::create_dir_all(&qkv).unwrap();
    std::fs::create_dir_all(&approx).unwrap();
    for n in [16, 24] {
        for w in 0..2 {
            let f = dump(&model, &qkv, n, w);
            write_outputs(&f, &approx, "my-vmean", "vmean", n, w, &[4, 8]);
            write_outputs(&f, &approx, "my-skein", "skeinformer", n, w, &[4, 8]);
        }
    }
    // The sweep of the same configuration.
    let sweep = tmp.path().join("sweep");
    let o = run(
        &[
            "--model",
            "initialized",
            "--model-dir",
            model.to_str().unwrap(),
            "--corpus",
            corpus_path().to_str().unwrap(),
            "--lengths",
            "16,24",
            "--windows",
            "2",
            "--methods",
            "vmean,skeinformer",
            "--features",
            "4,8",
            "--out",
            sweep.to_str().unwrap(),
            "--quiet",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let reference = read_rows(&sweep.join("trials.csv")).unwrap();
    for (name, method) in [("my-vmean", "vmean"), ("my-skein", "skeinformer")] {
        let out = tmp.path().join(name);
        let args = [
            "score",
            "--qkv",
            qkv.to_str().unwrap(),
            "--approx",
            approx.to_str().unwrap(),
            "--name",
            name,
            "--out",
            out.to_str().unwrap(),
        ];
        let o = run(&args, &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        let rows = read_rows(&out.join("trials.csv")).unwrap();
        assert_eq!(rows.len(), 2 * 2 * 4 * 2);
        for r in &rows {
            let s = reference
                .iter()
                .find(|s| {
                    (s.method.as_str(), s.n, s.window, s.head, s.d)
                        == (method, r.n, r.window, r.head, r.d)
                })
                .unwrap();
            assert_eq!(r.method, name);
            assert_eq!((r.model.as_str(), r.layer), (s.model.as_str(), s.layer));
            assert_eq!(r.error.to_bits(), s.error.to_bits(), "{r:?} vs {s:?}");
            assert_eq!(r.frob_error.to_bits(), s.frob_error.to_bits());
            assert_eq!(r.exact_norm.to_bits(), s.exact_norm.to_bits());
        }
        let manifest = std::fs::read_to_string(out.join("manifest.json")).unwrap();
        assert!(manifest.contains("\"score files\"") && manifest.contains("\"complete\""));
        // Again without --force: refused; with it: replaced.
        assert_eq!(run(&args, &[]).status.code(), Some(2));
        let mut forced = args.to_vec();
        forced.push("--force");
        assert!(run(&forced, &[]).status.success());
    }
    // The user's run draws beside the sweep's.
    let figs = tmp.path().join("figs");
    let o = run(
        &[
            "plot",
            "--from",
            sweep.to_str().unwrap(),
            "--from",
            tmp.path().join("my-skein").to_str().unwrap(),
            "--out",
            figs.to_str().unwrap(),
        ],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));

    // A missing file, a wrong shape and a name without files are named.
    std::fs::remove_file(approx.join("my-vmean-n24-w1-d8.safetensors")).unwrap();
    let o = run(
        &[
            "score",
            "--qkv",
            qkv.to_str().unwrap(),
            "--approx",
            approx.to_str().unwrap(),
            "--name",
            "my-vmean",
            "--out",
            tmp.path().join("x").to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("lacks 1 file(s): my-vmean-n24-w1-d8.safetensors"),
        "{}",
        stderr(&o)
    );
    let bad = HashMap::from([(
        "o_hat".to_string(),
        Tensor::zeros((4, 24, 3), candle_core::DType::F32, &Device::Cpu).unwrap(),
    )]);
    candle_core::safetensors::save(&bad, approx.join("my-vmean-n24-w1-d8.safetensors")).unwrap();
    let o = run(
        &[
            "score",
            "--qkv",
            qkv.to_str().unwrap(),
            "--approx",
            approx.to_str().unwrap(),
            "--name",
            "my-vmean",
            "--out",
            tmp.path().join("y").to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("my-vmean-n24-w1-d8.safetensors: o_hat has shape [4, 24, 3]"),
        "{}",
        stderr(&o)
    );
    let o = run(
        &[
            "score",
            "--qkv",
            qkv.to_str().unwrap(),
            "--approx",
            approx.to_str().unwrap(),
            "--name",
            "nobody",
            "--out",
            tmp.path().join("z").to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("no files named nobody-n<N>-w<W>-d<D>.safetensors"),
        "{}",
        stderr(&o)
    );
}
