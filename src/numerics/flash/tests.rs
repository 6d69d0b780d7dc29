//! The fused kernel against float64 on every path this CPU runs, its determinism and its
//! grouped heads.

use super::*;
use crate::numerics::sampling::{normal_values, TrialRng};
use rand::SeedableRng;

/// Float64 reference: softmax rows of the visible keys, two passes.
fn reference(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    n: usize,
    nk: usize,
    p: usize,
    vis: Visible,
) -> (Vec<f64>, Vec<f64>) {
    let mut o = vec![0.0; n * p];
    let mut ld = vec![0.0; n];
    for i in 0..n {
        let s: Vec<f64> = (0..nk)
            .map(|j| {
                if vis.sees(i, j) {
                    (0..p).map(|c| q[i * p + c] * k[j * p + c]).sum()
                } else {
                    f64::NEG_INFINITY
                }
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        for c in 0..p {
            o[i * p + c] = (0..nk).map(|j| e[j] * v[j * p + c]).sum::<f64>() / z;
        }
        ld[i] = m + z.ln();
    }
    (o, ld)
}

/// Every path this CPU runs (portable, AVX2, AVX-512), each named explicitly.
#[test]
fn agrees_with_float64_for_every_mask_and_ragged_sizes() {
    for simd in Simd::runnable() {
        agrees_with_float64_on(simd);
    }
}

fn agrees_with_float64_on(simd: Simd) {
    let mut rng = TrialRng::seed_from_u64(3);
    let p = 16;
    for (n, vis) in [
        (1, Visible::All),
        (300, Visible::All),
        (300, Visible::Causal { window: None }),
        (577, Visible::Causal { window: None }),
        (577, Visible::Causal { window: Some(100) }),
        (64, Visible::Causal { window: Some(1) }),
    ] {
        let q = normal_values(&mut rng, n, p, 0.7);
        let k = normal_values(&mut rng, n, p, 0.7);
        let v = normal_values(&mut rng, n, p, 1.0);
        let (want, want_ld) = reference(&q, &k, &v, n, n, p, vis);
        let (got, got_ld) = attention_with(simd, &q, &k, &v, 1, 1, p, vis, Logits::PLAIN);
        for (a, b) in got.iter().zip(&want).chain(got_ld.iter().zip(&want_ld)) {
            assert!(
                (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                "{simd:?} {vis:?} n={n}: {a} vs {b}"
            );
        }
        let f = |x: &[f64]| x.iter().map(|&y| y as f32).collect::<Vec<f32>>();
        let (got32, _) = attention_with(simd, &f(&q), &f(&k), &f(&v), 1, 1, p, vis, Logits::PLAIN);
        let scale = want.iter().fold(0f64, |a, b| a.max(b.abs()));
        for (a, b) in got32.iter().zip(&want) {
            assert!(
                (*a as f64 - b).abs() <= 2e-6 * scale,
                "{simd:?} f32 {vis:?} n={n}: {a} vs {b}"
            );
        }
    }
}

/// The two microkernel paths give the same bits (their arithmetic is the same operation for
/// operation, tiles/avx512.rs), at a head size with an odd number of 16-column panels and
/// one with an even number, for every mask.
#[test]
fn the_microkernel_paths_give_the_same_bits() {
    let paths: Vec<Simd> = Simd::runnable()
        .into_iter()
        .filter(|&s| s >= Simd::Avx2)
        .collect();
    let mut rng = TrialRng::seed_from_u64(5);
    let f = |x: Vec<f64>| x.iter().map(|&y| y as f32).collect::<Vec<f32>>();
    for (n, p, vis) in [
        (700, 48, Visible::All),
        (700, 64, Visible::Causal { window: None }),
        (333, 32, Visible::Causal { window: Some(90) }),
    ] {
        let q = f(normal_values(&mut rng, 2 * n, p, 0.5));
        let k = f(normal_values(&mut rng, n, p, 0.5));
        let v = f(normal_values(&mut rng, n, p, 1.0));
        let runs: Vec<_> = paths
            .iter()
            .map(|&simd| attention_with(simd, &q, &k, &v, 2, 1, p, vis, Logits::PLAIN))
            .collect();
        let bits = |x: &[f32]| x.iter().map(|y| y.to_bits()).collect::<Vec<_>>();
        for (simd, (o, d)) in paths.iter().zip(&runs) {
            assert!(bits(o) == bits(&runs[0].0), "{simd:?} O {vis:?} p={p}");
            assert!(bits(d) == bits(&runs[0].1), "{simd:?} log D {vis:?} p={p}");
        }
    }
}

#[test]
fn grouped_heads_read_their_kv_head_and_a_nan_logit_poisons_only_its_row() {
    let mut rng = TrialRng::seed_from_u64(9);
    let (n, p, h, hkv) = (130, 8, 4, 2);
    let q = normal_values(&mut rng, h * n, p, 1.0);
    let k = normal_values(&mut rng, hkv * n, p, 1.0);
    let v = normal_values(&mut rng, hkv * n, p, 1.0);
    let vis = Visible::Causal { window: None };
    let (all, _) = attention(&q, &k, &v, h, hkv, p, vis, Logits::PLAIN);
    for head in 0..h {
        let kv = head * hkv / h;
        let (one, _) = attention(
            &q[head * n * p..(head + 1) * n * p],
            &k[kv * n * p..(kv + 1) * n * p],
            &v[kv * n * p..(kv + 1) * n * p],
            1,
            1,
            p,
            vis,
            Logits::PLAIN,
        );
        assert!(one == all[head * n * p..(head + 1) * n * p], "head {head}");
    }
    let mut k2 = k.clone();
    k2[5 * p] = f64::NAN; // key 5 of K/V head 0: rows ≥ 5 of heads 0, 1 see it
    let (bad, _) = attention(&q, &k2, &v, h, hkv, p, vis, Logits::PLAIN);
    assert!(bad[..5 * p].iter().all(|x| x.is_finite()));
    assert!(bad[5 * p..6 * p].iter().all(|x| x.is_nan()));
    assert!(
        bad[2 * n * p..].iter().all(|x| x.is_finite()),
        "heads 2, 3 read K/V head 1"
    );
}

#[test]
fn the_bits_do_not_depend_on_the_thread_count() {
    for simd in Simd::runnable() {
        the_bits_do_not_depend_on_the_thread_count_on(simd);
    }
}

fn the_bits_do_not_depend_on_the_thread_count_on(simd: Simd) {
    let mut rng = TrialRng::seed_from_u64(11);
    let (n, p) = (1000, 32);
    let q: Vec<f32> = normal_values(&mut rng, n, p, 0.5)
        .iter()
        .map(|&x| x as f32)
        .collect();
    let k: Vec<f32> = normal_values(&mut rng, n, p, 0.5)
        .iter()
        .map(|&x| x as f32)
        .collect();
    let v: Vec<f32> = normal_values(&mut rng, n, p, 1.0)
        .iter()
        .map(|&x| x as f32)
        .collect();
    let causal = Visible::Causal { window: None };
    let run = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| attention_with(simd, &q, &k, &v, 1, 1, p, causal, Logits::PLAIN))
    };
    let one = run(1);
    for t in [2, 8] {
        let other = run(t);
        assert!(
            one.0
                .iter()
                .zip(&other.0)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{simd:?} {t} threads"
        );
        assert!(one
            .1
            .iter()
            .zip(&other.1)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}
