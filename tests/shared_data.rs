//! Tests on the real third-party data in ../shared/data (bert-base-cased tokenizer and config,
//! Wikitext-2 raw, all-MiniLM-L6-v2 weights). They are #[ignore]d so that `cargo test` passes on
//! a fresh clone without ../shared; `.ci/run` runs them with `-- --ignored`.

mod common;

use std::path::{Path, PathBuf};

use approx_bench::config::{Choice, EmbeddingPolicy, InitScheme};
use approx_bench::inputs::{corpus, model, qkv};
use candle_core::{DType, Device, Tensor};

fn shared(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/data")
        .join(rel)
}

/// |a − b| ≤ 1e-4 · max(|b|, 0.1·rms(b)): relative agreement, with a floor so that entries near
/// zero are judged against the tensor's scale.
fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let rms = (want.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / want.len() as f64).sqrt();
    let mut worst = 0.0f64;
    for (g, w) in got.iter().zip(want) {
        let tol = 1e-4 * (w.abs() as f64).max(0.1 * rms);
        let err = (*g as f64 - *w as f64).abs();
        worst = worst.max(err / tol);
    }
    assert!(
        worst <= 1.0,
        "{what}: worst error is {worst:.3}× the 1e-4 relative tolerance"
    );
}

fn case_values(case: &serde_json::Value, key: &str) -> Vec<f32> {
    case[key]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|h| {
            h.as_array().unwrap().iter().flat_map(|t| {
                t.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
            })
        })
        .collect()
}

fn heads_values(t: &Tensor, heads: &[usize]) -> Vec<f32> {
    heads
        .iter()
        .flat_map(|&h| {
            t.get(h)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        })
        .collect()
}

/// Q/K/V of all-MiniLM-L6-v2 from Hugging Face transformers (tests/reference/generate_minilm_qkv.py).
fn hf_fixture() -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hf_minilm_qkv.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
#[ignore = "needs ../shared/data"]
fn minilm_qkv_matches_hugging_face_transformers() {
    let fixture = hf_fixture();
    let dir = shared("all-MiniLM-L6-v2");
    let cfg = model::load_config(&dir.join("config.json")).unwrap();
    let ids: Vec<u32> = fixture["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    // Our tokenizer path gives Hugging Face's ids for the fixture text.
    let tok = corpus::load_tokenizer(&dir.join("tokenizer.json")).unwrap();
    let enc = tok
        .encode(fixture["text"].as_str().unwrap(), false)
        .unwrap();
    assert_eq!(enc.get_ids(), ids.as_slice());
    let heads: Vec<usize> = fixture["heads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect();
    let weights_path = dir.join("model.safetensors");
    for case in fixture["cases"].as_array().unwrap() {
        let layer = case["layer"].as_u64().unwrap() as usize;
        let policy = match case["embedding"].as_str().unwrap() {
            "word_pos_type" => EmbeddingPolicy::WordPosType,
            "word_pos" => EmbeddingPolicy::WordPos,
            other => panic!("unknown case {other}"),
        };
        let src = model::WeightSource::Pretrained(&weights_path);
        let w = model::load(&cfg, layer, &src, &src, &common::test_device()).unwrap();
        let (q, k, v) = qkv::window_qkv(&w, &cfg, &ids, policy, DType::F32).unwrap();
        for (name, t) in [("q", &q), ("k", &k), ("v", &v)] {
            assert_close(
                &heads_values(t, &heads),
                &case_values(case, name),
                &format!("{} layer {layer} {name}", policy.name()),
            );
        }
    }
}

#[test]
#[ignore = "needs ../shared/data"]
fn dump_qkv_of_minilm_matches_hugging_face_transformers() {
    let fixture = hf_fixture();
    let tmp = tempfile::tempdir().unwrap();
    let text = tmp.path().join("text.raw");
    std::fs::write(
        &text,
        format!(" \r\n {} \r\n", fixture["text"].as_str().unwrap()),
    )
    .unwrap();
    let out = tmp.path().join("qkv.safetensors");
    let n = fixture["n"].as_u64().unwrap().to_string();
    let o = common::run(
        &[
            "dump-qkv",
            "--model",
            "pretrained",
            "--model-dir",
            shared("all-MiniLM-L6-v2").to_str().unwrap(),
            "--corpus",
            text.to_str().unwrap(),
            "--length",
            &n,
            "--embedding",
            "word-pos-type",
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
    );
    assert!(o.status.success(), "{}", common::stderr(&o));
    let t = candle_core::safetensors::load(&out, &Device::Cpu).unwrap();
    let heads: Vec<usize> = fixture["heads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect();
    let case = &fixture["cases"][0];
    assert_eq!(case["layer"], 0);
    for name in ["q", "k", "v"] {
        assert_close(
            &heads_values(&t[name], &heads),
            &case_values(case, name),
            name,
        );
    }
}

/// A corpus without newlines is tokenized in pieces of at most 16 kB (issue 32), and the pieces
/// give the tokens the whole line gives, with BERT's WordPiece and with SmolLM2's byte-level BPE.
#[test]
#[ignore = "needs ../shared/data"]
fn a_corpus_without_newlines_tokenizes_as_its_whole_line() {
    let text = std::fs::read_to_string(shared("wikitext-2/wiki.test.raw")).unwrap();
    // ~200 kB of Wikitext as one line (each newline a space).
    let line: String = text
        .chars()
        .take(200_000)
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("one-line.txt");
    std::fs::write(&path, format!("{line}\n")).unwrap();
    let rows = corpus::text_rows(&path).unwrap();
    assert!(rows.len() > 10, "split into pieces: {}", rows.len());
    for (tok, vocab) in [
        ("bert-base-cased/tokenizer.json", 28996),
        ("SmolLM2-135M-Instruct-Q4_1/tokenizer.json", 49152),
    ] {
        let t = corpus::load_tokenizer(&shared(tok)).unwrap();
        let whole = t
            .encode(format!("{line}\n"), false)
            .unwrap()
            .get_ids()
            .to_vec();
        let pieces = corpus::tokenize(&path, &t, vocab).unwrap().ids;
        assert_eq!(pieces.len(), whole.len(), "{tok}");
        assert!(pieces == whole, "{tok}: the pieces tokenize differently");
    }
}

#[test]
#[ignore = "needs ../shared/data"]
fn wikitext2_token_counts_with_the_bert_base_cased_tokenizer() {
    let tok = corpus::load_tokenizer(&shared("bert-base-cased/tokenizer.json")).unwrap();
    let test = corpus::tokenize(&shared("wikitext-2/wiki.test.raw"), &tok, 28996).unwrap();
    assert_eq!(test.ids.len(), 281_595);
    assert_eq!(test.windows_available(4096), 68);
    assert_eq!(test.windows_available(1024), 274);
    let valid = corpus::tokenize(&shared("wikitext-2/wiki.valid.raw"), &tok, 28996).unwrap();
    assert_eq!(valid.ids.len(), 245_699);
    // The vocab.txt route builds the same tokenizer.
    let tok2 = corpus::load_tokenizer(&shared("bert-base-cased/vocab.txt")).unwrap();
    let test2 = corpus::tokenize(&shared("wikitext-2/wiki.test.raw"), &tok2, 28996).unwrap();
    assert_eq!(test2.ids, test.ids);
}

#[test]
#[ignore = "needs ../shared/data"]
fn initialized_bert_base_cased_qkv_have_the_hf_init_distribution() {
    let dir = shared("bert-base-cased");
    let cfg = model::load_config(&dir.join("config.json")).unwrap();
    let src = model::WeightSource::Initialized {
        seed: 12345,
        scheme: InitScheme::Hf,
    };
    let w = model::load(&cfg, 0, &src, &src, &common::test_device()).unwrap();
    let tok = corpus::load_tokenizer(&dir.join("tokenizer.json")).unwrap();
    let c = corpus::tokenize(&shared("wikitext-2/wiki.test.raw"), &tok, cfg.vocab_size).unwrap();
    let (q, _k, v) = qkv::window_qkv(
        &w,
        &cfg,
        &c.window(512, 0).unwrap(),
        EmbeddingPolicy::WordPos,
        DType::F64,
    )
    .unwrap();
    // X rows are LayerNorm-ed (mean 0, variance 1 per row), W ~ N(0, 0.02²), b = 0, so every
    // entry of Q and V has mean 0 and variance 768·0.02² = 0.3072.
    for (name, t) in [("q", &q), ("v", &v)] {
        let vals: Vec<f64> = t.flatten_all().unwrap().to_vec1().unwrap();
        let n = vals.len() as f64;
        let mean = vals.iter().sum::<f64>() / n;
        let var = vals.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        assert!(mean.abs() < 0.02, "{name} mean {mean}");
        assert!((var - 0.3072).abs() < 0.03, "{name} var {var}");
    }
    let word: Vec<f32> = w
        .embeddings
        .word
        .get(cfg.pad_token_id)
        .unwrap()
        .to_vec1()
        .unwrap();
    assert!(word.iter().all(|&x| x == 0.0));
}

/// The real hub code path, offline: ../shared/data laid out as a Hugging Face cache in a temp
/// HF_HOME (bert-base-cased config and tokenizer, all-MiniLM-L6-v2 with weights, Wikitext-2 test
/// split as the hub's parquet), run without --model-dir/--corpus, and compared with the run on
/// the same files given locally.
#[test]
#[ignore = "needs ../shared/data"]
fn end_to_end_through_a_laid_out_hf_cache_matches_local_files() {
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("hf");
    let bert = shared("bert-base-cased");
    let minilm = shared("all-MiniLM-L6-v2");
    let f = |d: &Path, n: &str| d.join(n);
    common::hf_cache_repo(
        &home,
        "model",
        "bert-base-cased",
        &[
            ("config.json", &f(&bert, "config.json")),
            ("tokenizer.json", &f(&bert, "tokenizer.json")),
            ("vocab.txt", &f(&bert, "vocab.txt")),
        ],
    );
    common::hf_cache_repo(
        &home,
        "model",
        "sentence-transformers/all-MiniLM-L6-v2",
        &[
            ("config.json", &f(&minilm, "config.json")),
            ("tokenizer.json", &f(&minilm, "tokenizer.json")),
            ("model.safetensors", &f(&minilm, "model.safetensors")),
        ],
    );
    let rows = corpus::text_rows(&shared("wikitext-2/wiki.test.raw")).unwrap();
    let pq = tmp.path().join("test.parquet");
    common::write_parquet(&pq, &rows);
    common::hf_cache_repo(
        &home,
        "dataset",
        "Salesforce/wikitext",
        &[("wikitext-2-raw-v1/test-00000-of-00001.parquet", &pq)],
    );
    let methods = std::env::var("APPROX_BENCH_CI_METHODS").unwrap_or_else(|_| "all".into());
    for (kind, id, dir) in [
        ("initialized", "bert-base-cased", &bert),
        (
            "pretrained",
            "sentence-transformers/all-MiniLM-L6-v2",
            &minilm,
        ),
    ] {
        let hub_out = tmp.path().join(format!("hub-{kind}"));
        let common_args = [
            "--model",
            kind,
            "--lengths",
            "512,1024",
            "--windows",
            "1",
            "--methods",
            &methods,
            "--features",
            "16,64",
            "--quiet",
        ];
        let mut args: Vec<&str> = common_args.to_vec();
        args.extend(["--model-id", id, "--out", hub_out.to_str().unwrap()]);
        let o = common::run(&args, &[("HF_HOME", home.to_str().unwrap())]);
        assert!(o.status.success(), "{kind} via hub: {}", common::stderr(&o));
        let local_out = tmp.path().join(format!("local-{kind}"));
        let corpus_file = shared("wikitext-2/wiki.test.raw");
        let mut args: Vec<&str> = common_args.to_vec();
        args.extend([
            "--model-dir",
            dir.to_str().unwrap(),
            "--corpus",
            corpus_file.to_str().unwrap(),
            "--out",
            local_out.to_str().unwrap(),
        ]);
        let o = common::run(&args, &[]);
        assert!(o.status.success(), "{kind} local: {}", common::stderr(&o));
        let a = approx_bench::report::trials::read_rows(&hub_out.join("trials.csv")).unwrap();
        let b = approx_bench::report::trials::read_rows(&local_out.join("trials.csv")).unwrap();
        assert_eq!(a.len(), b.len());
        let heads = 12; // bert-base-cased and all-MiniLM-L6-v2 both have 12 heads
        let n_methods = a
            .iter()
            .map(|r| r.method.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        assert_eq!(a.len(), 2 * heads * n_methods * 2);
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.model_id, id);
            assert_eq!(
                (x.n, x.window, x.head, &x.method, x.d),
                (y.n, y.window, y.head, &y.method, y.d)
            );
            assert_eq!(
                x.error.to_bits(),
                y.error.to_bits(),
                "{kind} {} d={}",
                x.method,
                x.d
            );
            // Every method's error is finite except where a row is flagged (non-finite Ô or D̂ ≤ 0).
            assert!(
                x.error.is_finite() || x.nonfinite_rows > 0,
                "{kind} {} n={} d={}: error {}",
                x.method,
                x.n,
                x.d,
                x.error
            );
            assert!(x.error >= 0.0 || x.error.is_nan());
        }
    }
}

/// max |a − b| / max |b|.
fn max_rel(got: &Tensor, want: &Tensor) -> f64 {
    assert_eq!(got.dims(), want.dims());
    let g: Vec<f64> = got
        .to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let w: Vec<f64> = want
        .to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    g.iter()
        .zip(&w)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max)
        / scale
}

/// SmolLM2-135M-Instruct's Q4_1 GGUF through our GGUF route (dequantize, undo llama.cpp's q/k
/// permutation, rotate-half RoPE) against transformers' own GGUF loader
/// (tests/reference/generate_smollm2_fixture.py): the logits QKᵀ/√p of every query head, V and the
/// exact causal output of layers 0 and 15 agree to 1e-4 relative on the first 64 Wikitext-2 tokens.
#[test]
#[ignore = "needs ../shared/data"]
fn smollm2_gguf_attention_matches_transformers() {
    use approx_bench::inputs::models::{self, DecoderConfig};
    let dir = shared("SmolLM2-135M-Instruct-Q4_1");
    let gguf = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    let dev = common::test_device();
    let fixture = candle_core::safetensors::load(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/smollm2_layer0_15.safetensors"),
        &dev,
    )
    .unwrap();
    // The fixture's tokens: the first 2000 characters of wiki.test.raw, no special tokens.
    let raw = std::fs::read_to_string(shared("wikitext-2/wiki.test.raw")).unwrap();
    let text: String = raw.chars().take(2000).collect();
    let tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let ids: Vec<u32> = tok.encode(text, false).unwrap().get_ids()[..64].to_vec();
    let want_ids: Vec<u32> = fixture["ids"]
        .to_vec1::<i64>()
        .unwrap()
        .iter()
        .map(|&i| i as u32)
        .collect();
    assert_eq!(ids, want_ids);
    // SmolLM2 adds no BOS by default (METHODS.md §7.1 "Tokens").
    let bos = models::bos_token(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )
    .unwrap();
    assert_eq!(bos, None);
    for layer in [0usize, 15] {
        let (cfg, w) = models::load_gguf(&gguf, layer, &dev).unwrap();
        // The config.json that transformers exported beside the GGUF says the same.
        let json = DecoderConfig::load(&dir.join("config.json")).unwrap();
        assert_eq!(cfg, json);
        let model = models::Llama {
            cfg: cfg.clone(),
            weights: w,
        };
        let dump = models::Decoder::layer_dump(&model, &ids, DType::F32).unwrap();
        let (q, k, v) = (dump.q, dump.k, dump.v);
        let p = cfg.head_dim as f64;
        let logits: Vec<Tensor> = (0..cfg.num_attention_heads)
            .map(|h| {
                let kh = k.get(cfg.kv_head(h)).unwrap();
                (q.get(h).unwrap().matmul(&kh.t().unwrap()).unwrap() / p.sqrt()).unwrap()
            })
            .collect();
        let logits = Tensor::stack(&logits, 0).unwrap();
        let o = models::causal_attention(&q, &k, &v, None).unwrap();
        for (name, got) in [("logits", &logits), ("v", &v), ("causal_output", &o)] {
            let r = max_rel(got, &fixture[&format!("layer{layer}.{name}")]);
            println!("SmolLM2 layer {layer} {name}: max rel diff {r:.2e}");
            assert!(r <= 1e-4, "layer {layer} {name}: {r:.3e} > 1e-4");
        }
    }
}
