//! Decoder LLMs end to end (METHODS.md §7.1–7.4) on the tiny random models of
//! `fixtures/decoders` (made by transformers, tests/reference/generate_decoder_fixtures.py): the
//! CLI's defaults for a decoder, BOS-led windows, grouped-query heads in the rows and in
//! `dump-qkv`, bad decoder inputs, and a sharded checkpoint through a hub that fetches only the
//! shards the layer needs. No ../shared, no network.

mod common;

use std::path::Path;

use common::decoder_fixture::*;
use common::mock_hub::MockHub;
use common::*;

#[test]
fn a_decoder_runs_causal_by_default_with_its_causal_methods_and_grouped_heads() {
    let tmp = tempfile::tempdir().unwrap();
    let model = llama_dir(&tmp.path().join("llama"), true);
    let c = corpus(tmp.path());
    let out = tmp.path().join("out");
    let o = decoder_run(
        &model,
        &c,
        &out,
        "--model pretrained --lengths 32,64 --windows 2 --features 8,16 --layer 1",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let trials = out.join("trials.csv");
    assert!(column(&trials, "mask").iter().all(|m| m == "causal"));
    let heads = column(&trials, "head");
    let kv = column(&trials, "kv_head");
    for (h, g) in heads.iter().zip(&kv) {
        let h: usize = h.parse().unwrap();
        assert_eq!(g.parse::<usize>().unwrap(), h * 2 / 4, "query head {h}");
    }
    let mut methods = column(&trials, "method");
    methods.dedup();
    let mut seen: Vec<String> = Vec::new();
    for m in methods {
        if !seen.contains(&m) {
            seen.push(m);
        }
    }
    // Every method with a causal form and a budget d (METHODS.md §7.4–7.5), in registry order
    // (the quantized family, §8, is asked for by name).
    let causal: Vec<&str> = approx_bench::attention::mask_method_ids(
        approx_bench::attention::Target::Softmax,
        approx_bench::attention::Mask::Causal,
    )
    .into_iter()
    .filter(|id| approx_bench::attention::budgets(id, &[1]) == [1])
    // The decode family (§9) runs only under --decode.
    .filter(|id| {
        approx_bench::attention::describe(id).unwrap().0 != approx_bench::attention::Family::Decode
    })
    .collect();
    assert_eq!(seen, causal);
    assert!(
        causal.len() == 12
            && causal[..5] == ["vmean", "performer_favor", "svd_optimal", "window", "topk"]
    );
    // 2 lengths × 2 windows × 4 heads × 12 methods × 2 d.
    assert_eq!(heads.len(), 2 * 2 * 4 * 12 * 2);
    let manifest = std::fs::read_to_string(out.join("manifest.json")).unwrap();
    assert!(manifest.contains("\"mask\": \"causal\""));
    // The needed shards and the index are hashed, the one with only layer 2 and the head is not.
    assert!(manifest.contains("model-00003-of-00004.safetensors"));
    assert!(
        !manifest.contains("model-00004-of-00004.safetensors"),
        "{manifest}"
    );
}

/// `dump-qkv` writes Q [H, n, p] and K, V [H_kv, n, p], and a window starts with BOS exactly when
/// the tokenizer adds one (METHODS.md §7.1).
#[test]
fn dump_qkv_writes_kv_heads_and_windows_lead_with_bos_only_when_the_tokenizer_adds_it() {
    let tmp = tempfile::tempdir().unwrap();
    let c = corpus(tmp.path());
    for with_bos in [true, false] {
        let model = llama_dir(&tmp.path().join(format!("m{with_bos}")), with_bos);
        let f = tmp.path().join(format!("w{with_bos}.safetensors"));
        let flags = "dump-qkv --model pretrained --length 32 --window 1 --layer 1 --out";
        let o = decoder_cli(&model, &c, &format!("{flags} {}", f.display()));
        assert!(o.status.success(), "{}", stderr(&o));
        let t = candle_core::safetensors::load(&f, &candle_core::Device::Cpu).unwrap();
        assert_eq!(t["q"].dims(), [4, 32, 16]);
        assert_eq!(t["k"].dims(), [2, 32, 16]);
        assert_eq!(t["v"].dims(), [2, 32, 16]);
        let ids: Vec<u32> = t["token_ids"].to_vec1().unwrap();
        // The stream is a b c b a b c b …: ids 3 4 5 4 …; BOS is 1.
        if with_bos {
            assert_eq!(ids[0], 1, "{ids:?}");
            assert!(ids[1..].iter().all(|&i| i != 1));
        } else {
            assert!(ids.iter().all(|&i| i != 1), "{ids:?}");
        }
    }
}

#[test]
fn bad_decoder_inputs_are_usage_errors_naming_what_is_wrong() {
    let tmp = tempfile::tempdir().unwrap();
    let c = corpus(tmp.path());
    let with_config = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| {
        let dir = llama_dir(&tmp.path().join(name), true);
        let p = dir.join("config.json");
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        edit(&mut v);
        std::fs::write(&p, v.to_string()).unwrap();
        dir
    };
    let sweep = |dir: &Path| {
        let flags = "--model pretrained --lengths 32 --windows 1 --features 8 --force";
        decoder_run(dir, &c, &tmp.path().join("o"), flags)
    };
    let yarn = with_config("yarn", &|v| {
        v["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
    });
    let o = sweep(&yarn);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("yarn"), "{}", stderr(&o));
    let gpt2 = with_config("gpt2", &|v| v["model_type"] = "gpt_neox".into());
    let o = sweep(&gpt2);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("gpt_neox") && err.contains("llama"), "{err}");
    // A truncated GGUF: an error naming the file, never a panic.
    let dir = tmp.path().join("gguf");
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = std::fs::read(fixtures().join("llama_gguf.gguf")).unwrap();
    let cut = dir.join("model.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    std::fs::copy(
        fixtures().join("tokenizers/with_bos/tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    let o = sweep(&cut);
    let err = stderr(&o);
    assert!(matches!(o.status.code(), Some(1) | Some(2)), "{err}");
    assert!(
        err.contains("model.gguf") && !err.contains("panicked"),
        "{err}"
    );
    // Under the causal mask a method without a causal form is refused with those that have one.
    let model = llama_dir(&tmp.path().join("ok"), true);
    let o = decoder_run(
        &model,
        &c,
        &tmp.path().join("n"),
        "--lengths 32 --windows 1 --features 8 --methods nystromformer",
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("vmean, performer_favor, svd_optimal, window, topk"));
    // More windows than the corpus holds: the count it holds (600 tokens, n − 1 = 63 each: 9).
    let o = decoder_run(
        &model,
        &c,
        &tmp.path().join("w"),
        "--lengths 64 --windows 10 --features 8",
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("only 9 windows of n = 64 fit"),
        "{}",
        stderr(&o)
    );
}

/// A layer-1 run of the checkpoint sharded over four files, through a hub: the shard that holds
/// only layer 2 and the output head is never downloaded, and the rows equal the local run's.
#[test]
fn a_sharded_checkpoint_through_a_hub_fetches_only_the_shards_the_layer_needs() {
    let tmp = tempfile::tempdir().unwrap();
    let model = llama_dir(&tmp.path().join("llama"), true);
    let c = corpus(tmp.path());
    let hub = MockHub::start();
    const REPO: &str = "org/tiny-llama";
    for e in std::fs::read_dir(&model).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        let lfs = name.ends_with(".safetensors");
        hub.add(REPO, &name, std::fs::read(&p).unwrap(), lfs);
    }
    let args = |out: &Path, source: [&str; 2]| {
        vec![
            "--model".to_string(),
            "pretrained".into(),
            source[0].into(),
            source[1].into(),
            "--corpus".into(),
            c.display().to_string(),
            "--lengths".into(),
            "32".into(),
            "--windows".into(),
            "2".into(),
            "--features".into(),
            "8,16".into(),
            "--layer".into(),
            "1".into(),
            "--out".into(),
            out.display().to_string(),
            "--quiet".into(),
        ]
    };
    let home = tmp.path().join("hf");
    let via_hub = tmp.path().join("hub-run");
    let a = args(&via_hub, ["--model-id", REPO]);
    let a: Vec<&str> = a.iter().map(|s| s.as_str()).collect();
    let endpoint = hub.endpoint();
    let o = run(
        &a,
        &[
            ("HF_ENDPOINT", &endpoint),
            ("HF_HOME", home.to_str().unwrap()),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let later =
        hub.count("GET", "model-00004-of-00004") + hub.count("HEAD", "model-00004-of-00004");
    assert_eq!(later, 0, "the shard with only later layers was requested");
    assert!(hub.count("GET", "model-00003-of-00004") > 0);
    let local = tmp.path().join("local-run");
    let b = args(&local, ["--model-dir", model.to_str().unwrap()]);
    let b: Vec<&str> = b.iter().map(|s| s.as_str()).collect();
    let o = run(&b, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let strip = |p: &Path| -> Vec<String> {
        lines_without_column(&std::fs::read_to_string(p).unwrap(), "seconds")
            .into_iter()
            .map(|l| {
                l.split_once(',')
                    .unwrap()
                    .1
                    .split_once(',')
                    .unwrap()
                    .1
                    .to_string()
            })
            .collect()
    };
    // Same rows apart from the model id (hub id or directory name) and timing.
    assert_eq!(
        strip(&via_hub.join("trials.csv")),
        strip(&local.join("trials.csv"))
    );
}

/// `score` on a decoder's dump: K/V heads and the causal mask come from the dump's sidecar, and a
/// user's outputs equal to the built-in causal `window` score exactly as the sweep's window rows.
#[test]
fn score_takes_the_kv_heads_and_the_causal_mask_from_a_decoders_dump() {
    use approx_bench::attention::{self, HeadInputs, Mask};
    let tmp = tempfile::tempdir().unwrap();
    let model = llama_dir(&tmp.path().join("llama"), true);
    let c = corpus(tmp.path());
    let qkv = tmp.path().join("qkv");
    let approx = tmp.path().join("approx");
    std::fs::create_dir_all(&approx).unwrap();
    let common = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = ["--model", "pretrained", "--model-dir"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.push(model.display().to_string());
        a.extend([
            "--corpus".to_string(),
            c.display().to_string(),
            "--layer".into(),
            "1".into(),
        ]);
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let dumped = qkv.join("w0.safetensors");
    let mut a = vec!["dump-qkv".to_string()];
    a.extend(common(&[
        "--length",
        "32",
        "--window",
        "0",
        "--out",
        dumped.to_str().unwrap(),
    ]));
    let o = run(&a.iter().map(|s| s.as_str()).collect::<Vec<_>>(), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let side = std::fs::read_to_string(qkv.join("w0.safetensors.json")).unwrap();
    assert!(
        side.contains("\"kv_heads\": 2") && side.contains("\"mask\": \"causal\""),
        "{side}"
    );
    let t = candle_core::safetensors::load(&dumped, &candle_core::Device::Cpu).unwrap();
    let window = attention::by_id("window").unwrap();
    let outs: Vec<candle_core::Tensor> = (0..4)
        .map(|h| {
            let g = h * 2 / 4;
            let head = HeadInputs::masked(
                t["q"].get(h).unwrap(),
                t["k"].get(g).unwrap(),
                t["v"].get(g).unwrap(),
                Mask::Causal,
            )
            .unwrap();
            let mut rng = approx_bench::numerics::sampling::rng_from_seed(0);
            window.approximate(&head, 4, &mut rng).unwrap().output
        })
        .collect();
    let o_hat = candle_core::Tensor::stack(&outs, 0).unwrap();
    candle_core::safetensors::save(
        &std::collections::HashMap::from([("o_hat".to_string(), o_hat)]),
        approx.join("mine-n32-w0-d4.safetensors"),
    )
    .unwrap();
    let scored = tmp.path().join("scored");
    let o = run(
        &[
            "score",
            "--qkv",
            qkv.to_str().unwrap(),
            "--approx",
            approx.to_str().unwrap(),
            "--name",
            "mine",
            "--out",
            scored.to_str().unwrap(),
        ],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let swept = tmp.path().join("swept");
    let mut a = common(&[
        "--lengths",
        "32",
        "--windows",
        "1",
        "--features",
        "4",
        "--methods",
        "window",
        "--quiet",
        "--out",
        swept.to_str().unwrap(),
    ]);
    a.extend(["--dtype".to_string(), "f32".to_string()]);
    let o = run(&a.iter().map(|s| s.as_str()).collect::<Vec<_>>(), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mine = scored.join("trials.csv");
    let theirs = swept.join("trials.csv");
    assert_eq!(column(&mine, "mask"), column(&theirs, "mask"));
    assert_eq!(column(&mine, "kv_head"), column(&theirs, "kv_head"));
    assert_eq!(column(&mine, "exact_norm"), column(&theirs, "exact_norm"));
    // The dump holds f32 Q/K/V, as the sweep's working dtype: the same bits, the same errors.
    assert_eq!(column(&mine, "error"), column(&theirs, "error"));
}

/// The quantized family (METHODS.md §8) end to end on the tiny llama (p = 16, grouped heads): a
/// method whose formats take any p runs once per head at d = 0 beside a sparse method's d grid,
/// with the §8.5 columns; the ggml and KIVI formats refuse p = 16 with exit 2 naming the method,
/// and so does the kernelized target; `--list-methods` lists the family with its bits.
#[test]
fn quantized_methods_run_once_per_head_and_refuse_what_they_cannot_store() {
    let tmp = tempfile::tempdir().unwrap();
    let model = llama_dir(&tmp.path().join("llama"), true);
    let c = corpus(tmp.path());
    let out = tmp.path().join("out");
    let flags = "--model pretrained --lengths 64 --windows 2 --features 8,16 --layer 1 --dtype f64 --methods kv_f16,kv_fp8,sage2_4b,window";
    let o = decoder_run(&model, &c, &out, flags);
    assert!(o.status.success(), "{}", stderr(&o));
    let trials = out.join("trials.csv");
    let methods = column(&trials, "method");
    let d = column(&trials, "d");
    let num = |name: &str| -> Vec<Option<f64>> {
        column(&trials, name)
            .iter()
            .map(|s| (!s.is_empty()).then(|| s.parse().unwrap()))
            .collect()
    };
    let (bits, read, keys, mass, cos) = (
        num("kv_bits"),
        num("kv_read"),
        num("keys"),
        num("mass"),
        num("cos_sim"),
    );
    // 2 windows × 4 heads: one row per head for each §8 method, two (d = 8, 16) for the window.
    for (id, rows, want_bits) in [
        ("kv_f16", 8, 16.0),
        ("kv_fp8", 8, 8.0),
        ("sage2_4b", 8, 6.0),
    ] {
        let idx: Vec<usize> = (0..methods.len()).filter(|&i| methods[i] == id).collect();
        assert_eq!(idx.len(), rows, "{id}");
        for i in idx {
            assert_eq!(d[i], "0");
            assert_eq!(bits[i], Some(want_bits));
            assert_eq!(read[i], Some(want_bits / 16.0));
            // Every key of a causal n = 64: (n + 1)/2 per query, all of the mass.
            assert_eq!((keys[i], mass[i]), (Some(32.5), Some(1.0)));
            assert!(cos[i].unwrap() > 0.9 && cos[i].unwrap() <= 1.0 + 1e-12);
        }
    }
    let win: Vec<usize> = (0..methods.len())
        .filter(|&i| methods[i] == "window")
        .collect();
    assert_eq!(win.len(), 16);
    for i in win {
        assert_eq!(bits[i], Some(16.0));
        assert_eq!(read[i], Some(keys[i].unwrap() / 32.5));
    }
    // The device path (a window's heads batched, one issuing thread) on the CPU: the same rows
    // within the rounding of the batched f64 targets (f64 run: far below 1e-9).
    let dev_out = tmp.path().join("device-path");
    let mut args: Vec<String> = flags.split_whitespace().map(String::from).collect();
    for a in [
        "--model-dir",
        model.to_str().unwrap(),
        "--corpus",
        c.to_str().unwrap(),
    ] {
        args.push(a.into());
    }
    args.extend([
        "--out".into(),
        dev_out.to_str().unwrap().into(),
        "--quiet".into(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = run(&args, &[("APPROX_BENCH_DEVICE_PATH", "1")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let dev_trials = dev_out.join("trials.csv");
    assert_eq!(column(&dev_trials, "method"), methods);
    for name in ["error", "cos_sim", "rel_l1", "rmse", "kv_read"] {
        for (a, b) in column(&trials, name).iter().zip(column(&dev_trials, name)) {
            let (a, b): (f64, f64) = (a.parse().unwrap(), b.parse().unwrap());
            assert!(
                (a - b).abs() <= 1e-9 * a.abs().max(1e-12),
                "{name}: {a} vs {b}"
            );
        }
    }
    // A second run resumes with nothing left to do.
    let again = decoder_run(&model, &c, &out, flags);
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(column(&trials, "method").len(), methods.len());

    for (bad, needle) in [
        ("kv_q4_0", "p = 16"),
        ("kivi2", "p = 16"),
        (
            "kv_f16 --mask none --target kernelized",
            "kv_f16 does not approximate the kernelized target",
        ),
    ] {
        let o = decoder_run(
            &model,
            &c,
            &tmp.path().join("bad"),
            &format!("--model pretrained --lengths 64 --windows 1 --layer 1 --methods {bad}"),
        );
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(
            e.contains(bad.split(' ').next().unwrap()) && e.contains(needle),
            "{e}"
        );
    }
    let list = run(&["--list-methods"], &[]);
    assert!(list.status.success());
    let text = String::from_utf8_lossy(&list.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("kv_q4_0 "))
        .expect("kv_q4_0 listed");
    assert!(
        line.contains("quantized") && line.contains("4.50") && line.contains("none,causal"),
        "{line}"
    );
}

/// Documented behaviour (issue 32, docs/guide.md): a config.json beside a GGUF is read for its
/// `model_type` only; the GGUF's metadata is the configuration, so even a config.json whose sizes
/// disagree changes nothing in the Q/K/V.
#[test]
fn a_config_json_beside_a_gguf_is_read_for_model_type_only() {
    let tmp = tempfile::tempdir().unwrap();
    let c = corpus(tmp.path());
    let dump = |dir: &Path, with_config: bool| -> Vec<u8> {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::copy(fixtures().join("llama_gguf.gguf"), dir.join("model.gguf")).unwrap();
        std::fs::copy(
            fixtures().join("tokenizers/with_bos/tokenizer.json"),
            dir.join("tokenizer.json"),
        )
        .unwrap();
        if with_config {
            std::fs::write(
                dir.join("config.json"),
                r#"{"model_type": "llama", "hidden_size": 9999, "num_attention_heads": 7, "rope_theta": 1.0}"#,
            )
            .unwrap();
        }
        let out = dir.join("qkv.safetensors");
        let o = decoder_cli(
            dir,
            &c,
            &format!(
                "dump-qkv --model pretrained --length 32 --out {}",
                out.display()
            ),
        );
        assert!(o.status.success(), "{}", stderr(&o));
        std::fs::read(out).unwrap()
    };
    let plain = dump(&tmp.path().join("plain"), false);
    let with = dump(&tmp.path().join("with"), true);
    assert!(
        plain == with,
        "a config.json beside the GGUF changed the Q/K/V"
    );
}

/// The Q/K/V cache (issue 33): a second sweep of the same decoder inputs reads every window's
/// Q/K/V back instead of running the forward (the manifest counts the hits), and its rows equal
/// the uncached run's; an entry whose bytes were damaged is recomputed, with the same rows.
#[test]
fn a_second_decoder_sweep_reads_its_qkv_from_the_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let model = llama_dir(&tmp.path().join("llama"), true);
    let c = corpus(tmp.path());
    let cache = tmp.path().join("qkv-cache");
    let flags = |out: &str, extra: &str| {
        format!(
            "--model pretrained --layer 2 --lengths 32,64 --windows 2 --features 8 --methods window,topk --qkv-cache {} {extra} --out {} --quiet",
            cache.display(),
            tmp.path().join(out).display()
        )
    };
    let manifest = |out: &str| -> serde_json::Value {
        serde_json::from_str(
            &std::fs::read_to_string(tmp.path().join(out).join("manifest.json")).unwrap(),
        )
        .unwrap()
    };
    let plain = decoder_cli(
        &model,
        &c,
        &flags("plain", "").replace(
            &format!("--qkv-cache {}", cache.display()),
            "--qkv-cache off",
        ),
    );
    assert!(plain.status.success(), "{}", stderr(&plain));
    assert!(manifest("plain").get("qkv_cache").is_none());
    let first = decoder_cli(&model, &c, &flags("first", ""));
    assert!(first.status.success(), "{}", stderr(&first));
    assert_eq!(manifest("first")["qkv_cache"]["misses"], 4);
    assert_eq!(manifest("first")["qkv_cache"]["hits"], 0);
    let second = decoder_cli(&model, &c, &flags("second", ""));
    assert!(second.status.success(), "{}", stderr(&second));
    assert_eq!(
        manifest("second")["qkv_cache"]["hits"],
        4,
        "the forward was skipped"
    );
    assert_eq!(manifest("second")["qkv_cache"]["misses"], 0);
    for run in ["first", "second"] {
        assert_same_rows(
            &tmp.path().join(run).join("trials.csv"),
            &tmp.path().join("plain").join("trials.csv"),
        );
    }
    // Damage every entry's last byte: each is recomputed and replaced, the rows unchanged.
    for e in std::fs::read_dir(&cache).unwrap() {
        let p = e.unwrap().path();
        let mut b = std::fs::read(&p).unwrap();
        let last = b.len() - 1;
        b[last] ^= 0x11;
        std::fs::write(&p, b).unwrap();
    }
    let third = decoder_cli(&model, &c, &flags("second", "--force"));
    assert!(third.status.success(), "{}", stderr(&third));
    assert_eq!(manifest("second")["qkv_cache"]["rejected"], 4);
    assert_same_rows(
        &tmp.path().join("second").join("trials.csv"),
        &tmp.path().join("plain").join("trials.csv"),
    );
}

/// A config.json that is not JSON — a `NaN` literal, as Python's json writes one — is named as
/// such, not as "not a valid BERT config" (issue 57).
#[test]
fn a_nan_literal_in_config_json_is_named_as_not_json() {
    let dir = tempfile::tempdir().unwrap();
    let model = llama_dir(&dir.path().join("m"), true);
    let cfg = std::fs::read_to_string(model.join("config.json")).unwrap();
    let edited = cfg.replacen("\"rms_norm_eps\":", "\"rms_norm_eps\": NaN, \"was\":", 1);
    assert_ne!(cfg, edited);
    std::fs::write(model.join("config.json"), edited).unwrap();
    let corpus = dir.path().join("c.txt");
    std::fs::write(
        &corpus,
        "a b c d e f g h i j k l m n o p q r s t u v w x y z ".repeat(20),
    )
    .unwrap();
    let out = dir.path().join("d.safetensors");
    let o = decoder_cli(
        &model,
        &corpus,
        &format!("dump-qkv --length 16 --out {}", out.display()),
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("not valid JSON") && err.contains("NaN"),
        "{err}"
    );
    assert!(!err.contains("BERT"), "{err}");
}
