//! The end-to-end protocol's exactness limits (docs/reference.md §10.4), determinism and thread
//! invariance, on the qwen3 fixture's config (p = 32, GQA 4:2, tied head) with weights initialized
//! at a larger spread than transformers' 0.02, so that attention is far from uniform.

use super::*;
use crate::models::{initialize, DecoderConfig, Depth, Llama};
use candle_core::Device;

/// The model, leaked: a test's windows borrow it for the whole test.
fn model() -> (&'static DecoderConfig, &'static Llama) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/decoders/qwen3/config.json");
    let mut cfg = DecoderConfig::load(&path).unwrap();
    cfg.initializer_range = 0.3;
    let weights = initialize(&cfg, Depth::Whole, 11, &Device::Cpu).unwrap();
    let model: &'static Llama = Box::leak(Box::new(Llama { cfg, weights }));
    (&model.cfg, model)
}

fn ids(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 5) % 128).collect()
}

fn window<'a>(
    cfg: &DecoderConfig,
    w: &'a Llama,
    ids: &'a [u32],
    n_f: usize,
    dtype: DType,
) -> Window<'a> {
    Window {
        model: w,
        ids,
        n_f,
        dtype,
        seed: 7,
        index: 0,
        one_layer: default_one_layer(cfg.num_hidden_layers),
        keep_prompt: true,
    }
}

/// §10.4's exactness limit: every position's NLL within 1e-12 relative of the exact run's, and
/// the KL at f64's rounding floor (a 1e-7 relative change of the logits already gives ~1e-12).
fn assert_reproduces_exact(id: &str, s: &PositionScores) {
    let kl_max = s.kl.iter().copied().fold(0.0, f64::max);
    assert!(kl_max < 1e-13, "{id}: kl_max {kl_max}");
    for (a, b) in s.nll_exact.iter().zip(&s.nll_method) {
        assert!(
            (a - b).abs() <= 1e-12 * a.abs(),
            "{id}: NLL {b} against {a}"
        );
    }
    assert_eq!(s.argmax_exact, s.argmax_method, "{id}");
}

#[test]
fn prefill_methods_at_a_covering_budget_reproduce_the_exact_logits() {
    let (cfg, w) = model();
    let ids = ids(48);
    let win = window(cfg, w, &ids, 16, DType::F64);
    let exact = win.exact().unwrap();
    assert!(exact.logp.iter().flatten().all(|x| x.is_finite()));
    for id in ["window", "topk", "streaming"] {
        let m = E2eMethod::resolve(id).unwrap();
        assert!(!m.decode);
        let p = win.point(&exact, &m, 48).unwrap();
        let met = p.scores.metrics();
        assert_reproduces_exact(id, &p.scores);
        assert_eq!(met.top1, 1.0);
        assert!(p.layers.iter().all(|l| l.abs_error() < 1e-12), "{id}");
        assert_eq!(p.layers.len(), cfg.num_hidden_layers);
        // Control: a small budget does change the output.
        let small = win.point(&exact, &m, 8).unwrap().scores.metrics();
        assert!(small.kl_mean > 1e-6, "{id} at d = 8: kl {}", small.kl_mean);
    }
}

#[test]
fn decode_methods_keeping_the_whole_prompt_reproduce_the_exact_logits() {
    let (cfg, w) = model();
    let ids = ids(48);
    let win = window(cfg, w, &ids, 16, DType::F64);
    let exact = win.exact().unwrap();
    let decode: Vec<&str> = crate::attention::family_method_ids(Family::Decode);
    assert!(decode.len() >= 10, "{decode:?}");
    for id in decode {
        let m = E2eMethod::resolve(id).unwrap();
        assert!(m.decode, "{id}");
        let p = win.point(&exact, &m, win.n_p()).unwrap();
        assert_reproduces_exact(id, &p.scores);
        // The first scored position is the prefill's own prediction: exact by construction.
        assert!(p.scores.kl[0] < 1e-13, "{id}: {}", p.scores.kl[0]);
    }
    // At a small budget the continuation reads a compressed prompt: the output moves, except at
    // the first scored position.
    let m = E2eMethod::resolve("snapkv").unwrap();
    let p = win.point(&exact, &m, 2).unwrap();
    assert!(p.scores.kl[0] < 1e-13 && p.scores.metrics().kl_mean > 1e-6);
}

/// Decode mode's continuation-only forward (on the exact run's prompt rows) against the whole
/// window through every layer: the same logits and layer errors, within f64's rounding (f64) and
/// f32's (f32: the prompt rows of the whole-window forward come from the per-head exact kernel,
/// the exact run's from the batched one).
#[test]
fn the_continuation_only_forward_is_the_whole_window_forward() {
    let (cfg, w) = model();
    let ids = ids(64);
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-4)] {
        let fast = window(cfg, w, &ids, 24, dtype);
        let whole = Window {
            keep_prompt: false,
            ..window(cfg, w, &ids, 24, dtype)
        };
        let (exact_fast, exact_whole) = (fast.exact().unwrap(), whole.exact().unwrap());
        assert!(exact_fast.prompt.is_some() && exact_whole.prompt.is_none());
        assert_eq!(exact_fast.logp, exact_whole.logp);
        for (id, d) in [
            ("snapkv", 8),
            ("adakv", 8),
            ("dec_window", 8),
            ("dkv_q4_0", 0),
        ] {
            let m = E2eMethod::resolve(id).unwrap();
            let a = fast.point(&exact_fast, &m, d).unwrap();
            let b = whole.point(&exact_whole, &m, d).unwrap();
            assert!(b.scores.metrics().kl_mean > 1e-6, "{id}: the control moves");
            for (x, y) in a.scores.nll_method.iter().zip(&b.scores.nll_method) {
                assert!(
                    (x - y).abs() <= tol * y.abs().max(1.0),
                    "{id} {dtype:?}: NLL {x} against {y}"
                );
            }
            for (x, y) in a.scores.kl.iter().zip(&b.scores.kl) {
                assert!(
                    (x - y).abs() <= tol * y.abs().max(1e-3),
                    "{id} {dtype:?}: KL {x} against {y}"
                );
            }
            assert_eq!(
                a.scores.argmax_method, b.scores.argmax_method,
                "{id} {dtype:?}"
            );
            for (la, lb) in a.layers.iter().zip(&b.layers) {
                for c in 0..6 {
                    let (x, y) = (la.mean(c), lb.mean(c));
                    assert!(
                        (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol * y.abs().max(1.0),
                        "{id} {dtype:?}: layer column {c}: {x} against {y}"
                    );
                }
            }
        }
    }
}

/// §10.4's exactness limit for §8: each method's machinery with every format replaced by the
/// identity (a cache that stores K, V and Q as they are; SageAttention's smoothing of Q and K with
/// identity quantizers and P; KIVI's groups and residual kept as they are) reproduces the exact
/// run's logits, in prefill and, for the caches, in decode mode. Past KIVI's residual of 128
/// tokens, so that its quantized groups are all visited.
#[test]
fn quantized_methods_with_identity_formats_reproduce_the_exact_logits() {
    use crate::attention::quantized::{kivi::Kivi, kv_cache, sage};
    let (cfg, w) = model();
    let ids = ids(200);
    let win = window(cfg, w, &ids, 16, DType::F64);
    let exact = win.exact().unwrap();
    let cache = || -> Box<dyn Method> {
        Box::new(kv_cache::KvCache {
            format: kv_cache::CacheFormat::Identity,
        })
    };
    let methods: Vec<(&str, Box<dyn Method>, bool)> = vec![
        ("kv_identity", cache(), false),
        ("dkv_identity", cache(), true),
        ("kivi_identity", Box::new(Kivi { bits: 0 }), false),
        ("dkivi_identity", Box::new(Kivi { bits: 0 }), true),
        (
            "sage_identity",
            Box::new(sage::Sage {
                kernel: sage::SageKernel::Identity,
            }),
            false,
        ),
    ];
    for (name, method, decode) in methods {
        let m = E2eMethod {
            name: name.to_string(),
            method,
            decode,
        };
        let p = win.point(&exact, &m, 0).unwrap();
        assert_reproduces_exact(name, &p.scores);
        assert!(p.layers.iter().all(|l| l.abs_error() < 1e-12), "{name}");
    }
    // Control: the real formats do move the output.
    for id in ["kv_q4_0", "dkv_q4_0", "kivi2", "sage2_4b"] {
        let p = win
            .point(&exact, &E2eMethod::resolve(id).unwrap(), 0)
            .unwrap();
        assert!(p.scores.metrics().kl_mean > 1e-8, "{id}");
    }
}

#[test]
fn cache_reads_under_the_decode_protocol_and_refusals_resolve_as_section_10_2_says() {
    let m = E2eMethod::resolve("dkv_q4_0").unwrap();
    assert!(m.decode && m.method.id() == "kv_q4_0" && m.name == "dkv_q4_0");
    assert_eq!(m.budgets(&[16, 64]), vec![0]);
    let m = E2eMethod::resolve("kv_q4_0").unwrap();
    assert!(!m.decode);
    for bad in ["skyformer", "dsage1", "nonsense"] {
        let e = E2eMethod::resolve(bad).err().expect(bad);
        assert!(
            e.downcast_ref::<crate::UsageError>().is_some(),
            "{bad}: {e}"
        );
        assert!(e.to_string().contains(bad), "{e}");
    }
}

#[test]
fn quantized_prefill_and_decode_cache_reads_run_every_layer() {
    let (cfg, w) = model();
    // Past KIVI's full-precision residual of 128 tokens, so that every method quantizes something.
    let ids = ids(200);
    let win = window(cfg, w, &ids, 16, DType::F32);
    let exact = win.exact().unwrap();
    for id in ["kv_q4_0", "dkv_q4_0", "kivi2", "sage2_8b"] {
        let p = win
            .point(&exact, &E2eMethod::resolve(id).unwrap(), 0)
            .unwrap();
        let met = p.scores.metrics();
        assert!(
            met.kl_mean > 0.0 && met.kl_mean.is_finite(),
            "{id}: {met:?}"
        );
        assert!(
            p.layers
                .iter()
                .all(|l| l.kv_read() > 0.0 && l.kv_read() < 1.0),
            "{id}"
        );
    }
}

#[test]
fn a_rerun_and_another_thread_count_give_identical_bits() {
    let (cfg, w) = model();
    let ids = ids(64);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let win = window(cfg, w, &ids, 16, DType::F32);
            let exact = win.exact().unwrap();
            let mut out = Vec::new();
            for (id, d) in [("xattention", 16), ("snapkv", 16), ("kv_q4_0", 0)] {
                let p = win
                    .point(&exact, &E2eMethod::resolve(id).unwrap(), d)
                    .unwrap();
                out.push((p.scores, p.layers, p.one_layer));
            }
            out
        })
    };
    let one = run(1);
    assert_eq!(one, run(1));
    assert_eq!(one, run(3));
}

#[test]
fn a_continuation_as_long_as_the_window_is_a_usage_error() {
    let (cfg, w) = model();
    let ids = ids(16);
    let win = window(cfg, w, &ids, 16, DType::F32);
    let e = win.exact().err().unwrap();
    assert!(e.downcast_ref::<crate::UsageError>().is_some(), "{e}");
    assert!(e.to_string().contains("--n-f 16"), "{e}");
}
