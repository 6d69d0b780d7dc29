use super::*;
use candle_core::DType;
use rand::SeedableRng;

use crate::attention::sparse::test_util::{
    assert_covering_budget_is_exact, assert_is_masked_softmax_of_its_sets, supports,
};
use crate::attention::test_util::{assert_seed_determines_output, random_head};

/// V_i as the method draws it from `seed`.
fn sets(h: &HeadInputs, d: usize, seed: u64) -> Vec<Vec<usize>> {
    let rounds = draw_rounds(&mut TrialRng::seed_from_u64(seed), h, d).unwrap();
    key_sets(&h.q, &h.k, d, &rounds).unwrap()
}

/// One round's V_i^(h) straight from the definition: chunk(j) ∈ {t, (t−1) mod m}.
fn round_sets(h: &HeadInputs, d: usize, lsh: &AngularLsh) -> Vec<Vec<usize>> {
    let n = h.n();
    let c = chunk_len(d);
    let m = n.div_ceil(c);
    let order = |x: &Tensor| {
        let b = lsh.hash(x).unwrap();
        let mut o: Vec<usize> = (0..n).collect();
        o.sort_by_key(|&i| (b[i], i));
        o
    };
    let (oq, ok) = (order(&h.q), order(&h.k));
    let mut chunk_q = vec![0; n];
    let mut chunk_k = vec![0; n];
    for r in 0..n {
        chunk_q[oq[r]] = r / c;
        chunk_k[ok[r]] = r / c;
    }
    (0..n)
        .map(|i| {
            let t = chunk_q[i];
            (0..n)
                .filter(|&j| chunk_k[j] == t || chunk_k[j] == (t + m - 1) % m)
                .collect()
        })
        .collect()
}

#[test]
fn sets_are_the_union_of_both_rounds_chunk_and_previous_chunk() {
    let (n, d) = (128, 16); // c = 8, m = 16, nb = 32
    let h = random_head(n, 16, 1, DType::F64);
    let rounds = draw_rounds(&mut TrialRng::seed_from_u64(4), &h, d).unwrap();
    assert_eq!(rounds.len(), 2);
    assert_eq!(rounds[0].buckets(), 32);
    let r1 = round_sets(&h, d, &rounds[0]);
    let r2 = round_sets(&h, d, &rounds[1]);
    let got = sets(&h, d, 4);
    let mut total = 0;
    for i in 0..n {
        assert_eq!(r1[i].len(), d, "round 1 visits 2c = d keys");
        assert_eq!(r2[i].len(), d);
        let mut union: Vec<usize> = r1[i].iter().chain(&r2[i]).copied().collect();
        union.sort_unstable();
        union.dedup();
        assert_eq!(got[i], union, "row {i}");
        assert!((d..=2 * d).contains(&got[i].len()));
        total += got[i].len();
    }
    // Two independent rounds rarely coincide: the union is well above d on average.
    assert!(
        total as f64 / n as f64 > 1.5 * d as f64,
        "{}",
        total as f64 / n as f64
    );
}

/// Weights are a distribution on exactly V_i (V = I_n), in f64 and f32.
#[test]
fn weights_sum_to_one_on_the_hashed_sets() {
    let (n, d) = (96, 8);
    for dtype in [DType::F64, DType::F32] {
        let h = random_head(n, 8, 2, dtype);
        assert_eq!(supports(&Reformer, &h, d, 9, 1e-6), sets(&h, d, 9));
    }
}

#[test]
fn equals_the_dense_masked_softmax_of_its_sets_in_float64() {
    let h = random_head(150, 16, 3, DType::F64);
    // f32 hashes its own (f32) projections; at these sizes no bucket flips, so the sets agree.
    assert_is_masked_softmax_of_its_sets(&Reformer, &h, &[1, 2, 9, 32, 80], 6, |d| sets(&h, d, 6));
}

/// m ≤ 2 chunks (d ≥ n) cover every key: exact attention.
#[test]
fn covering_budget_is_exact_attention() {
    let n = 100;
    let h = random_head(n, 32, 4, DType::F64);
    let ds = [100, 101, 150, 400];
    assert!(ds.iter().all(|&d| n.div_ceil(chunk_len(d)) <= 2));
    assert_covering_budget_is_exact(&Reformer, &h, &ds, &[1]);
    // d = 98 → c = 49, m = 3: no longer covering.
    assert!(sets(&h, 98, 1).iter().any(|s| s.len() < n));
}

/// With Q = K one order sorts both sides, so query i and key i share a chunk: every query
/// visits its own key (the rank alignment reduces to upstream's shared-QK chunks).
#[test]
fn shared_qk_always_visits_the_own_key() {
    let h0 = random_head(256, 16, 5, DType::F64);
    let h = HeadInputs::new(h0.q.clone(), h0.q.clone(), h0.v.clone()).unwrap();
    for d in [2, 8, 32] {
        let s = sets(&h, d, 3);
        assert!((0..256).all(|i| s[i].binary_search(&i).is_ok()), "d = {d}");
    }
}

#[test]
fn bucket_rule_and_cost() {
    assert_eq!(buckets(512, chunk_len(8)), 256);
    assert_eq!(buckets(512, chunk_len(256)), 8);
    assert_eq!(buckets(4096, chunk_len(8)), 2048);
    assert_eq!(buckets(4096, chunk_len(256)), 64);
    assert_eq!(buckets(1000, 8), 128); // 2·125 = 250 rounded down
    assert_eq!(buckets(3, 8), 2);
    assert_eq!(buckets(8, 8), 2);
    assert_eq!(chunk_len(1), 1);
    assert_eq!(chunk_len(7), 3);
    // Grid: 4ndp attention + 2np·nb = 8n²p/d hashing.
    let (n, p, d) = (4096.0, 64.0, 64.0);
    assert_eq!(
        Reformer.macs(4096, 64, 64),
        4.0 * n * d * p + 8.0 * n * n * p / d
    );
}

#[test]
fn seeded_reproducible() {
    let h = random_head(200, 16, 7, DType::F64);
    let a = assert_seed_determines_output(&Reformer, &h, 16, 33);
    assert!(a.normalizer.is_none());
    assert_eq!(sets(&h, 16, 33), sets(&h, 16, 33));
    assert_ne!(sets(&h, 16, 33), sets(&h, 16, 34));
}

/// §6.1.4's independent numpy run: q, k ~ 0.5·N(0, 1), n = 512, p = 64 — the union of the two
/// rounds holds 31.5 keys per query on average at d = 16 and 120 at d = 64 (the hash is
/// scale-free, so N(0, 1) inputs give the same sets).
#[test]
fn union_sizes_match_the_specs_independent_implementation() {
    for (d, want) in [(16, 31.5), (64, 120.0)] {
        let mut total = 0.0;
        let heads = 6;
        for s in 0..heads {
            let h = random_head(512, 64, 100 + s, DType::F64);
            let sizes: usize = sets(&h, d, 200 + s).iter().map(|v| v.len()).sum();
            total += sizes as f64 / 512.0;
        }
        let mean = total / heads as f64;
        assert!(
            (mean - want).abs() < 0.02 * want,
            "d = {d}: {mean} vs {want}"
        );
    }
}
