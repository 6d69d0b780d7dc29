//! `score`: outputs computed outside approx-bench, on `dump-qkv` inputs, scored exactly as the
//! sweep scores a method: here the "user" writes V-Mean's outputs and Skeinformer's (through the
//! library, as a Python user would through approx_bench.approximate), and each scored row must
//! equal the sweep's row of that method, bit for bit.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Output;

use approx_bench::attention::{self, HeadInputs};
use approx_bench::numerics::sampling::{rng_from_seed, TrialKey};
use approx_bench::report::trials::read_rows;
use candle_core::{Device, Tensor};
use common::{corpus_path, run, stderr, sweep_tiny, tiny_model};

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

/// `approx-bench score` of the outputs `name` in `approx` on the dumps in `qkv` into `out`, with
/// `extra` flags after the others.
fn score(qkv: &Path, approx: &Path, name: &str, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
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
    args.extend_from_slice(extra);
    run(&args, &[])
}

/// Expects a usage error (exit 2) whose message contains `needle`.
fn assert_usage_error(o: &Output, needle: &str) {
    assert_eq!(o.status.code(), Some(2), "{}", stderr(o));
    assert!(stderr(o).contains(needle), "{}", stderr(o));
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
        let o = score(&qkv, &approx, name, &out, &[]);
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
        assert_eq!(score(&qkv, &approx, name, &out, &[]).status.code(), Some(2));
        assert!(score(&qkv, &approx, name, &out, &["--force"])
            .status
            .success());
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
    let o = score(&qkv, &approx, "my-vmean", &tmp.path().join("x"), &[]);
    assert_usage_error(&o, "lacks 1 file(s): my-vmean-n24-w1-d8.safetensors");
    let bad = HashMap::from([(
        "o_hat".to_string(),
        Tensor::zeros((4, 24, 3), candle_core::DType::F32, &Device::Cpu).unwrap(),
    )]);
    candle_core::safetensors::save(&bad, approx.join("my-vmean-n24-w1-d8.safetensors")).unwrap();
    let o = score(&qkv, &approx, "my-vmean", &tmp.path().join("y"), &[]);
    assert_usage_error(
        &o,
        "my-vmean-n24-w1-d8.safetensors: o_hat has shape [4, 24, 3]",
    );
    let o = score(&qkv, &approx, "nobody", &tmp.path().join("z"), &[]);
    assert_usage_error(&o, "no files named nobody-n<N>-w<W>-d<D>.safetensors");
}

/// The kernelized target end to end: a `--target kernelized` sweep writes `target` = kernelized,
/// draws kernelized.png, and `score --target kernelized` on a built-in method's outputs gives
/// its rows bit for bit (scored against C·V, not softmax).
#[test]
fn kernelized_runs_score_against_c_v() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(&tmp.path().join("m"), false);
    let (qkv, approx) = (tmp.path().join("qkv"), tmp.path().join("approx"));
    std::fs::create_dir_all(&qkv).unwrap();
    std::fs::create_dir_all(&approx).unwrap();
    let f = dump(&model, &qkv, 16, 0);
    write_outputs(&f, &approx, "my-rff", "rff_gauss", 16, 0, &[4, 8]);
    let sweep = tmp.path().join("sweep");
    let grid = [
        "--lengths",
        "16",
        "--windows",
        "1",
        "--features",
        "4,8",
        "--quiet",
    ];
    let o = sweep_tiny(
        &model,
        &[
            &["--target", "kernelized", "--out", sweep.to_str().unwrap()],
            &grid[..],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let reference = read_rows(&sweep.join("trials.csv")).unwrap();
    let methods: std::collections::BTreeSet<&str> =
        reference.iter().map(|r| r.method.as_str()).collect();
    assert_eq!(
        methods,
        attention::target_method_ids(attention::Target::Kernelized)
            .into_iter()
            .collect()
    );
    assert!(reference
        .iter()
        .all(|r| r.target == attention::Target::Kernelized));
    for r in reference.iter().filter(|r| r.method == "zero") {
        assert_eq!(r.rel_error, 1.0);
    }
    assert!(sweep.join("kernelized.png").is_file());
    assert!(!sweep.join("all-methods-initialized.png").exists());

    let out = tmp.path().join("scored");
    let o = score(&qkv, &approx, "my-rff", &out, &["--target", "kernelized"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = read_rows(&out.join("trials.csv")).unwrap();
    assert_eq!(rows.len(), 4 * 2); // 4 heads × 2 d
    for r in &rows {
        let s = reference
            .iter()
            .find(|s| (s.method.as_str(), s.head, s.d) == ("rff_gauss", r.head, r.d))
            .unwrap();
        assert_eq!(r.target, attention::Target::Kernelized);
        assert_eq!(r.error.to_bits(), s.error.to_bits(), "{r:?} vs {s:?}");
        assert_eq!(r.exact_norm.to_bits(), s.exact_norm.to_bits());
    }
    // Checking the kernelized run against a softmax one is refused, naming both.
    let soft = tmp.path().join("softmax");
    let o = sweep_tiny(
        &model,
        &[
            &["--methods", "vmean", "--out", soft.to_str().unwrap()],
            &grid[..],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(
        &[
            "check",
            "--baseline",
            soft.to_str().unwrap(),
            "--current",
            sweep.to_str().unwrap(),
        ],
        &[],
    );
    assert_usage_error(&o, "check compares runs of one target");
    // A softmax method under --target kernelized: exit 2, naming the methods that fit.
    let bad = tmp.path().join("bad");
    let o = sweep_tiny(
        &model,
        &[
            "--target",
            "kernelized",
            "--methods",
            "vmean",
            "--out",
            bad.to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("vmean does not approximate the kernelized target")
            && stderr(&o).contains("skyformer_gauss"),
        "{}",
        stderr(&o)
    );
}

/// Inputs `score` cannot measure are usage errors naming the file (issue 32): a Q/K/V dump with a
/// non-finite value (not blamed on the device), an integer Ô, and the kernelized target on a
/// causal model's dumps (the target is defined without a mask).
#[test]
fn corrupt_dumps_integer_outputs_and_a_masked_kernelized_target_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(&tmp.path().join("m"), false);
    let (qkv, approx) = (tmp.path().join("qkv"), tmp.path().join("approx"));
    std::fs::create_dir_all(&qkv).unwrap();
    std::fs::create_dir_all(&approx).unwrap();
    let f = dump(&model, &qkv, 16, 0);
    write_outputs(&f, &approx, "mine", "vmean", 16, 0, &[4]);
    let out = tmp.path().join("out");

    // An integer Ô.
    let ints = tmp.path().join("ints");
    std::fs::create_dir_all(&ints).unwrap();
    let o_hat =
        candle_core::safetensors::load(approx.join("mine-n16-w0-d4.safetensors"), &Device::Cpu)
            .unwrap()["o_hat"]
            .to_dtype(candle_core::DType::U32)
            .unwrap();
    candle_core::safetensors::save(
        &HashMap::from([("o_hat".to_string(), o_hat)]),
        ints.join("mine-n16-w0-d4.safetensors"),
    )
    .unwrap();
    assert_usage_error(
        &score(&qkv, &ints, "mine", &out, &[]),
        "o_hat holds U32 values",
    );

    // The kernelized target on dumps whose sidecar says causal.
    let side = qkv.join("qkv-n16-w0.safetensors.json");
    let mut info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&side).unwrap()).unwrap();
    info["mask"] = "causal".into();
    std::fs::write(&side, info.to_string()).unwrap();
    assert_usage_error(
        &score(&qkv, &approx, "mine", &out, &["--target", "kernelized"]),
        "the kernelized target is defined without a mask",
    );
    info.as_object_mut().unwrap().remove("mask");
    std::fs::write(&side, info.to_string()).unwrap();

    // A NaN in the dumped K.
    let mut t = candle_core::safetensors::load(&f, &Device::Cpu).unwrap();
    let k = &t["k"];
    let mut v: Vec<f32> = k.flatten_all().unwrap().to_vec1().unwrap();
    let p = k.dims()[2];
    v[16 * p + 3] = f32::INFINITY; // head 1, row 0, column 3
    let dims = k.dims().to_vec();
    t.insert("k".into(), Tensor::from_vec(v, dims, &Device::Cpu).unwrap());
    candle_core::safetensors::save(&t, &f).unwrap();
    let o = score(&qkv, &approx, "mine", &out, &[]);
    assert_usage_error(
        &o,
        "tensor k holds inf at index [1, 0, 3]: the input is corrupt",
    );
    assert!(!stderr(&o).contains("device"), "{}", stderr(&o));
}

/// Finite but huge values in a dump (head 1's Q and K ≈ 1e20 in one channel: logits past f32's
/// range) are an overflow of the f32 target, named with the dump and the head (exit 2), not a
/// device's wrong result.
#[test]
fn a_dump_whose_logits_overflow_f32_is_named_as_an_overflow() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(&tmp.path().join("m"), false);
    let (qkv, approx) = (tmp.path().join("qkv"), tmp.path().join("approx"));
    std::fs::create_dir_all(&qkv).unwrap();
    std::fs::create_dir_all(&approx).unwrap();
    let f = dump(&model, &qkv, 16, 0);
    write_outputs(&f, &approx, "mine", "vmean", 16, 0, &[4]);
    let mut t = candle_core::safetensors::load(&f, &Device::Cpu).unwrap();
    for key in ["q", "k"] {
        let x = &t[key];
        let p = x.dims()[2];
        let mut v: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
        for row in 0..16 {
            v[(16 + row) * p + 3] = 1e20; // head 1, every row, column 3
        }
        let dims = x.dims().to_vec();
        t.insert(key.into(), Tensor::from_vec(v, dims, &Device::Cpu).unwrap());
    }
    candle_core::safetensors::save(&t, &f).unwrap();
    let o = score(&qkv, &approx, "mine", &tmp.path().join("out"), &[]);
    let e = stderr(&o);
    assert_usage_error(
        &o,
        &format!(
            "--qkv {}: n = 16, window 0, head 1: the exact softmax target overflows",
            f.display()
        ),
    );
    assert!(e.contains("dump-qkv --dtype f64"), "{e}");
    assert!(!e.contains("device"), "{e}");
}

/// A score that did not finish (killed: its manifest still `running`, part of its rows) is
/// completed by the same command, without --force, to the rows of an uninterrupted score; a
/// finished one is still refused.
#[test]
fn rerunning_an_unfinished_score_completes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(&tmp.path().join("m"), false);
    let (qkv, approx) = (tmp.path().join("qkv"), tmp.path().join("approx"));
    std::fs::create_dir_all(&qkv).unwrap();
    std::fs::create_dir_all(&approx).unwrap();
    let f = dump(&model, &qkv, 16, 0);
    write_outputs(&f, &approx, "mine", "vmean", 16, 0, &[4, 8]);
    let out = tmp.path().join("out");
    let o = score(&qkv, &approx, "mine", &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let whole = std::fs::read_to_string(out.join("trials.csv")).unwrap();
    assert_usage_error(
        &score(&qkv, &approx, "mine", &out, &[]),
        "already holds a run; use another --out, or --force",
    );
    // What a kill mid-score leaves: the starting manifest and the first rows.
    let man = out.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&man).unwrap()).unwrap();
    m["status"] = "running".into();
    std::fs::write(&man, m.to_string()).unwrap();
    let cut: Vec<&str> = whole.lines().take(3).collect();
    std::fs::write(out.join("trials.csv"), cut.join("\n") + "\n").unwrap();
    let o = score(&qkv, &approx, "mine", &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        common::rows_without_timing(&out.join("trials.csv")),
        common::lines_without_column(&whole, "seconds")
    );
}

/// A dump whose sidecar and tensors state a causal, windowed, capped spec with sinks and its own
/// scale (docs/reference.md §7.7.0) is scored against the exact attention of that spec: Ô = the
/// float64 definition's O scores to rounding, Ô = the plain causal target does not.
#[test]
fn score_computes_the_target_under_the_dumps_spec() {
    use approx_bench::attention::spec::{exact_attention_reference, spec_sidecar};
    use approx_bench::attention::AttentionSpec;
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(&tmp.path().join("m"), false);
    let (qkv, approx) = (tmp.path().join("qkv"), tmp.path().join("approx"));
    std::fs::create_dir_all(&qkv).unwrap();
    std::fs::create_dir_all(&approx).unwrap();
    let n = 16;
    let f = dump(&model, &qkv, n, 0);
    let mut t = candle_core::safetensors::load(&f, &Device::Cpu).unwrap();
    let (heads, _, p) = t["q"].dims3().unwrap();
    let kv_heads = t["k"].dims()[0];
    let sinks: Vec<f64> = (0..heads).map(|h| 0.5 - h as f64 * 0.25).collect();
    let spec = AttentionSpec::causal(p, Some(5))
        .with_scale(0.3)
        .with_softcap(Some(2.0))
        .with_sinks(Some(sinks));
    let (fields, tensors) = spec_sidecar(&spec, p).unwrap();
    t.extend(tensors);
    candle_core::safetensors::save(&t, &f).unwrap();
    let side = approx_bench::score::sidecar(&f);
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&side).unwrap()).unwrap();
    json.as_object_mut().unwrap().extend(fields);
    json["mask"] = "causal".into();
    std::fs::write(&side, serde_json::to_string(&json).unwrap()).unwrap();
    let f64s = |x: &Tensor| -> Vec<f64> {
        x.to_dtype(candle_core::DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    let (q, k, v) = (f64s(&t["q"]), f64s(&t["k"]), f64s(&t["v"]));
    let dims = (heads, kv_heads, n, p, p);
    // The spec's sinks are f32 in the file: the definition with the stored values.
    let stored = AttentionSpec {
        sinks: Some(f64s(&t["sinks"])),
        ..spec.clone()
    };
    for (name, s) in [
        ("spec", &stored),
        ("plain", &AttentionSpec::causal(p, None)),
    ] {
        let o = exact_attention_reference(&q, &k, &v, dims, s);
        let o = Tensor::from_vec(o, (heads, n, p), &Device::Cpu).unwrap();
        let map = HashMap::from([("o_hat".to_string(), o)]);
        let file = approx.join(format!("{name}-n{n}-w0-d1.safetensors"));
        candle_core::safetensors::save(&map, file).unwrap();
        let out = tmp.path().join(format!("out-{name}"));
        let o = score(&qkv, &approx, name, &out, &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        let rows = read_rows(&out.join("trials.csv")).unwrap();
        assert_eq!(rows.len(), heads);
        for r in &rows {
            match name {
                "spec" => assert!(r.rel_error < 1e-5, "{name}: {}", r.rel_error),
                _ => assert!(r.rel_error > 1e-2, "{name}: {}", r.rel_error),
            }
        }
    }
}

/// `score` on the tool's own DeepSeek (MLA) dump (issue 57): V and Ô are d_v = 16 wide while Q and K
/// are p = 24 wide. Ô = the float64 definition's O under the dump's spec scores to rounding, Ô = 0
/// scores relative error 1, and an Ô of Q's width is refused naming the shape.
#[test]
fn score_takes_an_mla_dump_with_its_own_value_width() {
    use approx_bench::attention::spec::exact_attention_reference;
    use common::families::{dump as family_dump, family_dir};
    let tmp = tempfile::tempdir().unwrap();
    let (dir, corpus, _) = family_dir(tmp.path(), "deepseek_v2");
    let (qkv, approx) = (tmp.path().join("qkv"), tmp.path().join("approx"));
    std::fs::create_dir_all(&qkv).unwrap();
    std::fs::create_dir_all(&approx).unwrap();
    let file = qkv.join("mla-n40-w0.safetensors");
    let (t, side, _) = family_dump(&dir, &corpus, &file, "--layer 2");
    assert_eq!(side["head_dim_v"], 16);
    let (heads, n, p) = t["q"].dims3().unwrap();
    let (kv_heads, _, pv) = t["v"].dims3().unwrap();
    assert_eq!((p, pv), (24, 16));
    let info: approx_bench::inputs::dump::DumpInfo = serde_json::from_value(side).unwrap();
    let spec = info.spec(t.get("sinks"), "sidecar").unwrap();
    let f64s = |x: &Tensor| -> Vec<f64> {
        x.to_dtype(candle_core::DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    let o = exact_attention_reference(
        &f64s(&t["q"]),
        &f64s(&t["k"]),
        &f64s(&t["v"]),
        (heads, kv_heads, n, p, pv),
        &spec,
    );
    let exact = Tensor::from_vec(o, (heads, n, pv), &Device::Cpu).unwrap();
    let zero = exact.zeros_like().unwrap();
    let wide = Tensor::zeros((heads, n, p), candle_core::DType::F64, &Device::Cpu).unwrap();
    for (name, o) in [
        ("mine_exact", &exact),
        ("mine_zero", &zero),
        ("mine_wide", &wide),
    ] {
        let map = HashMap::from([("o_hat".to_string(), o.clone())]);
        candle_core::safetensors::save(&map, approx.join(format!("{name}-n{n}-w0-d1.safetensors")))
            .unwrap();
        let out = tmp.path().join(format!("out-{name}"));
        let o = score(&qkv, &approx, name, &out, &[]);
        if name == "mine_wide" {
            assert_usage_error(&o, "o_hat");
            continue;
        }
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let rows = read_rows(&out.join("trials.csv")).unwrap();
        assert_eq!(rows.len(), heads);
        for r in &rows {
            match name {
                "mine_exact" => assert!(r.rel_error < 1e-5, "{name}: {}", r.rel_error),
                _ => assert!((r.rel_error - 1.0).abs() < 1e-12, "{name}: {}", r.rel_error),
            }
        }
    }
}
