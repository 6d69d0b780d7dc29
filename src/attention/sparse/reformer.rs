//! `reformer`: angular-LSH attention (Kitaev, Kaiser & Levskaya, ICLR 2020, "Reformer", §2
//! "Hashing attention", Eq. (3)–(4) and Fig. 2) adapted to separate Q and K (docs/reference.md §6.1.4).
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
use candle_core::{DType, Tensor};

use crate::attention::{Approximation, Family, HeadInputs, Method, MethodInfo};
use crate::numerics::key_sets::{key_set_softmax, KeyGroup};
use crate::numerics::lsh::{ranks, sort_by_bucket, AngularLsh};
use crate::numerics::sampling::TrialRng;

pub struct Reformer;

/// H, hash rounds.
pub const ROUNDS: usize = 2;
// `overlaps` and `union_from_rounds` unite exactly two rounds.
const _: () = assert!(ROUNDS == 2);

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

/// One round's sorts: queries and keys ordered by (bucket, position), and each query's rank.
pub struct RoundOrder {
    q_order: Vec<usize>,
    q_rank: Vec<usize>,
    k_order: Vec<usize>,
}

/// Hashes and sorts Q and K for every round. Rank alignment pairs query chunk t with key chunk
/// t, so it needs as many keys as queries.
pub fn round_orders(q: &Tensor, k: &Tensor, rounds: &[AngularLsh]) -> Result<Vec<RoundOrder>> {
    let n = q.dims2()?.0;
    anyhow::ensure!(
        k.dims2()?.0 == n,
        "reformer pairs query and key chunks by rank: it needs as many keys as queries"
    );
    rounds
        .iter()
        .map(|lsh| {
            let nb = lsh.buckets();
            let q_order = sort_by_bucket(&lsh.hash(q)?, nb)?;
            Ok(RoundOrder {
                q_rank: ranks(&q_order),
                q_order,
                k_order: sort_by_bucket(&lsh.hash(k)?, nb)?,
            })
        })
        .collect()
}

impl RoundOrder {
    /// Keys of key chunk u (positions u·c.. of π_K).
    fn chunk(&self, u: usize, c: usize) -> &[usize] {
        let n = self.k_order.len();
        &self.k_order[(u * c).min(n)..((u + 1) * c).min(n)]
    }

    /// V_i^(h): key chunks t and (t − 1) mod m of query i's chunk t (one chunk when m = 1).
    fn keys_of(&self, i: usize, c: usize) -> impl Iterator<Item = usize> + '_ {
        let m = self.k_order.len().div_ceil(c);
        let t = self.q_rank[i] / c;
        let prev = (t + m - 1) % m;
        let second = if prev == t {
            &[][..]
        } else {
            self.chunk(prev, c)
        };
        self.chunk(t, c).iter().chain(second).copied()
    }

    /// The round as blocks: query chunk t with key chunks t and t − 1 (upstream's computation).
    fn groups(&self, c: usize) -> Vec<KeyGroup> {
        let n = self.q_order.len();
        (0..n.div_ceil(c))
            .map(|t| {
                let rows = self.q_order[t * c..((t + 1) * c).min(n)].to_vec();
                let keys = self.keys_of(rows[0], c).collect();
                KeyGroup { rows, keys }
            })
            .collect()
    }
}

/// V_i = V_i^(1) ∪ V_i^(2) for every query (ascending key order): the definition, used by the
/// tests; the product never lists the unions (see [`Reformer::approximate`]).
pub fn key_sets(
    q: &Tensor,
    k: &Tensor,
    d: usize,
    rounds: &[AngularLsh],
) -> Result<Vec<Vec<usize>>> {
    let c = chunk_len(d);
    let orders = round_orders(q, k, rounds)?;
    let n = q.dims2()?.0;
    let mut stamp = vec![usize::MAX; n]; // stamp[j] = i: key j is already in V_i
    Ok((0..n)
        .map(|i| {
            let mut set: Vec<usize> = orders
                .iter()
                .flat_map(|o| o.keys_of(i, c))
                .filter(|&j| std::mem::replace(&mut stamp[j], i) != i)
                .collect();
            set.sort_unstable();
            set
        })
        .collect())
}

/// V_i^(1) ∩ V_i^(2) for every query: the keys the per-round sums count twice.
fn overlaps(orders: &[RoundOrder], n: usize, c: usize) -> Vec<Vec<usize>> {
    let mut stamp = vec![usize::MAX; n];
    (0..n)
        .map(|i| {
            orders[0].keys_of(i, c).for_each(|j| stamp[j] = i);
            orders[1].keys_of(i, c).filter(|&j| stamp[j] == i).collect()
        })
        .collect()
}

/// Ô over the union from the two rounds' outputs and log-normalisers, minus the keys both
/// rounds visited (on the host, in f64): with L_i = max_h lse_h,
/// num = Σ_h e^{lse_h − L}[O_h, 1] − Σ_{j∈V¹∩V²} e^{s_ij − L}[v_j, 1], Ô_i = num / den.
/// When the rounds coincide the subtraction cancels two of three equal terms; the f32 outputs
/// keep their relative error (about 1e-7) up to a factor 2.
fn union_from_rounds(
    head: &HeadInputs,
    per_round: &[(Tensor, Tensor)],
    overlap: &[Vec<usize>],
) -> Result<Tensor> {
    let (n, p) = (head.n(), head.p());
    let pv = head.v.dim(1)?;
    let host =
        |t: &Tensor| -> Result<Vec<f64>> { Ok(t.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?) };
    let (q, k, v) = (host(&head.q)?, host(&head.k)?, host(&head.v)?);
    let (o1, o2) = (host(&per_round[0].0)?, host(&per_round[1].0)?);
    let (l1, l2) = (host(&per_round[0].1)?, host(&per_round[1].1)?);
    let scale = 1.0 / (p as f64).sqrt();
    let mut out = vec![0f64; n * pv];
    for i in 0..n {
        let top = l1[i].max(l2[i]);
        let (w1, w2) = ((l1[i] - top).exp(), (l2[i] - top).exp());
        let row = &mut out[i * pv..][..pv];
        for (c, x) in row.iter_mut().enumerate() {
            *x = w1 * o1[i * pv + c] + w2 * o2[i * pv + c];
        }
        let mut den = w1 + w2;
        let qi = &q[i * p..][..p];
        for &j in &overlap[i] {
            let s: f64 = qi.iter().zip(&k[j * p..][..p]).map(|(a, b)| a * b).sum();
            let e = (s * scale - top).exp();
            den -= e;
            for (x, vc) in row.iter_mut().zip(&v[j * pv..][..pv]) {
                *x -= e * vc;
            }
        }
        row.iter_mut().for_each(|x| *x /= den);
    }
    Ok(Tensor::from_vec(out, (n, pv), head.device())?.to_dtype(head.dtype())?)
}

const REFORMER: MethodInfo = MethodInfo {
    id: "reformer",
    family: Family::Sparse,
    meaning: "chunk length c = ⌊d/2⌋ of 2 angular-LSH rounds (chunk + previous chunk): d keys per round, d…2d in the union",
    random: true,
    ..MethodInfo::BASE
};

impl Method for Reformer {
    fn approximate(
        &self,
        head: &HeadInputs,
        d: usize,
        rng: &mut TrialRng,
    ) -> Result<Approximation> {
        let rounds = draw_rounds(rng, head, d)?;
        let orders = round_orders(&head.q, &head.k, &rounds)?;
        let c = chunk_len(d);
        // Each round as upstream computes it: query chunk × (key chunk, previous key chunk)
        // blocks, batched; then the union from the two rounds, each key counted once.
        let per_round = orders
            .iter()
            .map(|o| {
                let r = key_set_softmax(&head.q, &head.k, &head.v, &o.groups(c), None, true)?;
                Ok((r.output, r.log_normalizer.expect("requested")))
            })
            .collect::<Result<Vec<_>>>()?;
        let out = union_from_rounds(head, &per_round, &overlaps(&orders, head.n(), c))?;
        Ok(Approximation::plain(out))
    }
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        let c = chunk_len(d);
        let (nf, pf, h) = (n as f64, p as f64, ROUNDS as f64);
        let attention = h * super::pair_macs(nf * (2 * c).min(n) as f64, p);
        let hashing = h * 2.0 * nf * pf * (buckets(n, c) / 2) as f64;
        attention + hashing
    }
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(&REFORMER)
    }
}

#[cfg(test)]
mod tests;
