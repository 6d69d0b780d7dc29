//! `reformer`: angular-LSH attention (Kitaev, Kaiser & Levskaya, ICLR 2020, "Reformer", §2
//! "Hashing attention", Eq. (3)–(4) and Fig. 2) adapted to separate Q and K (METHODS.md §6.1.4).
//!
//! With chunk length c, H = 2 rounds and nb buckets, per round h:
//!
//!   R_h ∈ ℝ^{p×nb/2} iid N(0, 1), one matrix for Q and K;  bucket_h(x) = argmax [xR_h, −xR_h]
//!   π_Q, π_K = positions sorted by (bucket, position), Q and K separately
//!   chunk(i) = ⌊rank of i in π_Q / c⌋,  chunk(j) = ⌊rank of j in π_K / c⌋,  m = ⌈n/c⌉ chunks
//!   V_i^(h) = { j : chunk(j) ∈ {t, (t − 1) mod m} },  t = chunk(i)      (cyclic look-back)
//!
//! V_i = V_i^(1) ∪ V_i^(2), each key once; Ô_i = Σ_{j∈V_i} softmax_{V_i}(q_i·k_j/√p) v_j (§6.1
//! common form: exact logits, no self-mask, no causal mask).
//!
//! Why rank alignment: upstream Reformer shares Q and K, so one sort orders both and chunk t of
//! queries and keys holds the same tokens. Separate Q and K cannot share an order; sorting each by
//! (bucket, position) and pairing chunks by rank keeps the fixed cost of 2c keys per query and
//! round and, where Q and K have similar bucket histograms, approximates bucket alignment.
//! Rounds are united (each key counted once) rather than combined by upstream's per-round
//! log-sum-exp weights, which count a key found in both rounds twice (§6.1.4 [P≠C] 3).
//!
//! What d means: chunk length c = max(1, ⌊d/2⌋), so each round visits 2c = d keys per query and
//! the union d…2d; nb = max(2, 2^⌊log₂(2⌊n/c⌋)⌋) buckets (HF's `_set_num_buckets`, never
//! factorised), = 4n/d on the grid. m ≤ 2 (d ≥ n) covers every key: exact.
//!
//! Cost: attention H·n·min(2c, n)·2p ≈ 4ndp, counted per round as upstream computes it (the union
//! computed here visits at most that), plus hashing H·n·p·nb/2 for Q and for K, = 2np·nb
//! (= 8n²p/d on the grid: quadratic in n, above the attention term when d² < 2n). The sorts are
//! O(n) counting sorts, not MACs.
//!
//! Randomness (§1.5): R_1 then R_2, fresh per trial; the sorts are deterministic.

use anyhow::Result;
use candle_core::Tensor;

use crate::attention::{Approximation, Family, HeadInputs, Method};
use crate::numerics::key_sets::{key_set_softmax, per_row_groups};
use crate::numerics::lsh::{ranks, sort_by_bucket, AngularLsh};
use crate::numerics::sampling::TrialRng;

pub struct Reformer;

/// H, hash rounds.
pub const ROUNDS: usize = 2;

/// c = max(1, ⌊d/2⌋).
pub fn chunk_len(d: usize) -> usize {
    (d / 2).max(1)
}

/// nb = max(2, 2^⌊log₂(2⌊n/c⌋)⌋): HF's bucket rule, 2⌊n/c⌋ rounded down to a power of two.
pub fn buckets(n: usize, c: usize) -> usize {
    let x = 2 * (n / c.max(1));
    if x < 2 {
        2
    } else {
        1 << (usize::BITS - 1 - x.leading_zeros())
    }
}

/// The H rounds' rotations, drawn in round order.
pub fn draw_rounds(rng: &mut TrialRng, head: &HeadInputs, d: usize) -> Result<Vec<AngularLsh>> {
    let nb = buckets(head.n(), chunk_len(d));
    (0..ROUNDS)
        .map(|_| AngularLsh::draw(rng, head.p(), nb, head.dtype(), head.device()))
        .collect()
}

/// V_i for every query (ascending key order) under the given rounds' hashes.
pub fn key_sets(
    q: &Tensor,
    k: &Tensor,
    d: usize,
    rounds: &[AngularLsh],
) -> Result<Vec<Vec<usize>>> {
    let n = q.dims2()?.0;
    anyhow::ensure!(
        k.dims2()?.0 == n,
        "reformer pairs query and key chunks by rank: it needs as many keys as queries"
    );
    let c = chunk_len(d);
    let m = n.div_ceil(c);
    // Per round: each query's rank in π_Q and the keys in π_K order.
    let sorted = rounds
        .iter()
        .map(|lsh| -> Result<(Vec<usize>, Vec<usize>)> {
            let nb = lsh.buckets();
            let q_rank = ranks(&sort_by_bucket(&lsh.hash(q)?, nb)?);
            Ok((q_rank, sort_by_bucket(&lsh.hash(k)?, nb)?))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut stamp = vec![usize::MAX; n]; // stamp[j] = i: key j is already in V_i
    let mut sets: Vec<Vec<usize>> = Vec::with_capacity(n);
    for i in 0..n {
        let mut set = Vec::with_capacity(2 * c * rounds.len());
        for (q_rank, k_order) in &sorted {
            let chunk = |u: usize| &k_order[u * c..((u + 1) * c).min(n)];
            let t = q_rank[i] / c;
            for &j in chunk(t).iter().chain(chunk((t + m - 1) % m)) {
                if stamp[j] != i {
                    stamp[j] = i;
                    set.push(j);
                }
            }
        }
        sets.push(set);
    }
    for set in &mut sets {
        set.sort_unstable();
    }
    Ok(sets)
}

impl Method for Reformer {
    fn id(&self) -> &'static str {
        "reformer"
    }
    fn family(&self) -> Family {
        Family::Sparse
    }
    fn feature_meaning(&self) -> &'static str {
        "chunk length c = ⌊d/2⌋ of 2 angular-LSH rounds (chunk + previous chunk): d keys per round, d…2d in the union"
    }
    fn is_random(&self) -> bool {
        true
    }
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        let c = chunk_len(d);
        let (nf, pf, h) = (n as f64, p as f64, ROUNDS as f64);
        let attention = h * super::pair_macs(nf * (2 * c).min(n) as f64, p);
        let hashing = h * 2.0 * nf * pf * (buckets(n, c) / 2) as f64;
        attention + hashing
    }
    fn approximate(
        &self,
        head: &HeadInputs,
        d: usize,
        rng: &mut TrialRng,
    ) -> Result<Approximation> {
        let rounds = draw_rounds(rng, head, d)?;
        let groups = per_row_groups(key_sets(&head.q, &head.k, d, &rounds)?);
        let out = key_set_softmax(&head.q, &head.k, &head.v, &groups, None, false)?;
        Ok(Approximation::plain(out.output))
    }
}

#[cfg(test)]
mod tests;
