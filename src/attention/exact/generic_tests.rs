//! The generic path (candle's ops, what every non-CPU device runs) and the head-batched path,
//! run on the test device against float64 at the lengths where issue 21's race showed (n = 4096
//! and 8192: 16 and 32 row blocks), on 1, 2 and 8 threads. A result that depended on which
//! thread ran which block, or on the order of a device's work, would differ here.

use candle_core::{DType, Tensor};
use rand::SeedableRng;

use super::{ExactAttention, ExactKernel};
use crate::numerics::sampling::{normal_values, TrialRng};
use crate::tensor_util::{from_f64, test_device};

fn inputs(heads: usize, n: usize, p: usize, seed: u64) -> Vec<Vec<f64>> {
    let mut rng = TrialRng::seed_from_u64(seed);
    // Logits up to about ±15, like BERT's first layer (std 0.9 per entry, p = 64).
    [0.9, 0.9, 1.0]
        .iter()
        .map(|&std| normal_values(&mut rng, heads * n, p, std))
        .collect()
}

fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

/// max |a − b| / max |b|.
fn rel_max_diff(a: &Tensor, b: &Tensor) -> f64 {
    let a = a.to_dtype(DType::F64).unwrap();
    let b = b.to_dtype(DType::F64).unwrap();
    let d = (a - &b).unwrap().abs().unwrap().max_all().unwrap();
    let s = b.abs().unwrap().max_all().unwrap();
    d.to_scalar::<f64>().unwrap() / s.to_scalar::<f64>().unwrap()
}

#[test]
fn generic_path_matches_f64_at_4096_and_8192_on_any_thread_count() {
    let dev = test_device();
    let p = 64;
    for n in [4096, 8192] {
        assert!(n / super::block_rows(n) >= 16, "several row blocks");
        let [q, k, v] = inputs(1, n, p, n as u64)
            .into_iter()
            .map(|x| from_f64(x, (n, p), &dev, DType::F64).unwrap())
            .collect::<Vec<_>>()
            .try_into()
            .unwrap();
        let reference = ExactAttention::compute(&q, &k, &v).unwrap();
        let f32t = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
        let (q32, k32, v32) = (f32t(&q), f32t(&k), f32t(&v));
        let mut first: Option<Vec<u32>> = None;
        for threads in [1, 2, 8] {
            let got = in_pool(threads, || {
                ExactAttention::compute_with(
                    &q32,
                    &k32,
                    &v32,
                    crate::attention::Mask::None,
                    ExactKernel::Generic,
                )
                .unwrap()
                .output
            });
            let e = rel_max_diff(&got, &reference.output);
            assert!(e < 2e-6, "n = {n}, {threads} threads: {e:e} of max |O|");
            let b = bits(&got);
            match &first {
                None => first = Some(b),
                Some(f) => assert!(f == &b, "n = {n}: {threads} threads changed bits"),
            }
        }
    }
}

/// The head-batched path with grouped-query heads (4 query heads over 2 K/V heads) against each
/// head's f64 target, on any thread count; and its log D against the per-head one.
#[test]
fn batched_heads_with_shared_kv_match_f64_per_head_on_any_thread_count() {
    let dev = test_device();
    let (h, hkv, n, p) = (4, 2, 4096, 64);
    let x = inputs(h, n, p, 21);
    let t3 = |data: &[f64], heads: usize| {
        from_f64(
            data[..heads * n * p].to_vec(),
            (heads * n, p),
            &dev,
            DType::F64,
        )
        .unwrap()
        .reshape((heads, n, p))
        .unwrap()
    };
    let (q, k, v) = (t3(&x[0], h), t3(&x[1], hkv), t3(&x[2], hkv));
    let per_head: Vec<ExactAttention> = (0..h)
        .map(|i| {
            let g = i * hkv / h; // ⌊i·H_kv/H⌋
            ExactAttention::compute(&q.get(i).unwrap(), &k.get(g).unwrap(), &v.get(g).unwrap())
                .unwrap()
        })
        .collect();
    // In f64 the batched path is the same computation up to the order of a few sums.
    let b64 = ExactAttention::compute_heads(&q, &k, &v).unwrap();
    for i in 0..h {
        let e = rel_max_diff(&b64[i].output, &per_head[i].output);
        assert!(e < 1e-12, "f64 head {i}: {e:e}");
        let ld = rel_max_diff(
            b64[i].log_rowsum().unwrap(),
            per_head[i].log_rowsum().unwrap(),
        );
        assert!(ld < 1e-12, "f64 head {i} log D: {ld:e}");
    }
    let f32t = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let (q32, k32, v32) = (f32t(&q), f32t(&k), f32t(&v));
    let mut first: Option<Vec<Vec<u32>>> = None;
    for threads in [1, 2, 8] {
        let got = in_pool(threads, || {
            ExactAttention::compute_heads(&q32, &k32, &v32).unwrap()
        });
        // 2e-6 of max |O| on the CPU; a GPU's f32 GEMMs sum in another order (2.3e-6 measured
        // on an H200), hence 4e-6 there.
        let bound = if dev.is_cpu() { 2e-6 } else { 4e-6 };
        for i in 0..h {
            let e = rel_max_diff(&got[i].output, &per_head[i].output);
            assert!(e < bound, "head {i}, {threads} threads: {e:e} of max |O|");
        }
        let b: Vec<Vec<u32>> = got.iter().map(|e| bits(&e.output)).collect();
        match &first {
            None => first = Some(b),
            Some(f) => assert!(f == &b, "{threads} threads changed bits"),
        }
    }
}

/// Mismatched head counts are an error, not a panic or a silent broadcast.
#[test]
fn batched_heads_refuse_kv_heads_that_do_not_divide_the_query_heads() {
    let dev = test_device();
    let q = Tensor::zeros((3, 8, 4), DType::F32, &dev).unwrap();
    let k = Tensor::zeros((2, 8, 4), DType::F32, &dev).unwrap();
    let err = ExactAttention::compute_heads(&q, &k, &k).err().unwrap();
    assert!(format!("{err}").contains("K/V heads must divide"));
}
