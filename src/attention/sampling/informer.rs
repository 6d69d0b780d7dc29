//! Informer's ProbSparse self-attention (Zhou et al., AAAI 2021; docs/reference.md §2.6), as run in the
//! Skyformer/Skeinformer norm experiment (reference `attention_informer.py`, adapted from Informer2020).
//!
//! - Sparsity measure: paper Eq. (2) M(q_i, K) = ln Σ_j e^{q_i·k_j/√d} − (1/L_K) Σ_j q_i·k_j/√d;
//!   it is replaced by its max-mean bound (paper Eq. (4), Lemma 1) M̄ = max_j q_i·k_j − (1/L_K) Σ_j q_i·k_j
//!   on U = c·⌈ln n⌉ sampled keys per query (paper Prop. 1); the sampled sum is divided by n, as
//!   the code does ([P≠C] in docs/reference.md: the paper's mean would divide by U), on unscaled logits.
//! - Output: paper Eq. (3): the top-u queries get exact softmax rows; the other ("lazy") rows get mean(V).
//! - `informer` maps d to the factor c = ⌈d / ln n⌉ and u = U = min(c·⌈ln n⌉, n) (the class used for the
//!   norm runs); `informer_mask` (`attention_informermask.py`) uses u = U = min(d, n) directly.

use anyhow::Result;
use candle_core::{Tensor, D};

use crate::attention::{
    Approximation, Family, HeadBatch, HeadInputs, HeadTrials, Method, MethodInfo,
};
use crate::numerics::sampling::{rng_from_seed, uniform_with_replacement, TrialRng};
use crate::tensor_util::{index_tensor, to_vec_f64};

/// Informer; `direct` selects the masked-class mapping u = U = min(d, n).
pub struct Informer {
    pub direct: bool,
}

impl Informer {
    /// `informer`: c = ⌈d/ln n⌉, u = U = min(c·⌈ln n⌉, n) (docs/reference.md §2.6 [REC]).
    pub fn log_factor() -> Self {
        Self { direct: false }
    }
    /// `informer_mask`: u = U = min(d, n) (the padding-mask class; with full windows only the map differs).
    pub fn direct() -> Self {
        Self { direct: true }
    }

    /// (U, u): sampled keys per query and number of exact rows.
    fn sizes(&self, n: usize, d: usize) -> (usize, usize) {
        if self.direct {
            let u = d.min(n);
            (u, u)
        } else {
            let (_, u) = factor_and_top(n, d);
            (u, u)
        }
    }
}

/// The reference mapping: c = ⌈d / ln n⌉ and u = U = min(c·⌈ln n⌉, n), natural log (docs/reference.md §2.6).
/// Needs n ≥ 2 (ln 1 = 0).
pub fn factor_and_top(n: usize, d: usize) -> (usize, usize) {
    let ln_n = (n as f64).ln();
    let c = (d as f64 / ln_n).ceil() as usize;
    let u = (c * ln_n.ceil() as usize).min(n);
    (c, u)
}

/// Rows per block so that a block of sampled keys [rows, U, p] holds about 1 M entries (measured on
/// 2 CPU cores at n = 4096, U = 279: 1 M beats 256 K and 4 M by 1.2–3×; larger blocks page-fault).
fn block_rows(n: usize, u: usize, p: usize) -> usize {
    ((1 << 20) / (u * p).max(1)).clamp(1, n.max(1))
}

/// The sparsity measure M̄_i = max_{j∈T_i} q_i·k_j − (1/n)·Σ_{j∈T_i} q_i·k_j on unscaled logits, for
/// the sampled key indices `samples` (row-major [n, U]). Only the n·U sampled logits are formed,
/// in query blocks: gather the U key rows of each query and take a batched dot with q_i.
pub fn sparsity_measure(
    q: &Tensor,
    k: &Tensor,
    samples: &[usize],
    big_u: usize,
) -> Result<Vec<f64>> {
    let (n, p) = q.dims2()?;
    assert_eq!(samples.len(), n * big_u, "samples must be [n, U]");
    let step = block_rows(n, big_u, p);
    let mut out = Vec::with_capacity(n);
    let mut start = 0;
    while start < n {
        let len = step.min(n - start);
        let idx = index_tensor(&samples[start * big_u..(start + len) * big_u], q.device())?;
        let ks = k.index_select(&idx, 0)?.reshape((len, big_u, p))?; // [len, U, p]
        let qs = q.narrow(0, start, len)?.unsqueeze(2)?; // [len, p, 1]
        let logits = ks.matmul(&qs)?.squeeze(2)?; // [len, U] = q_i·k_{T_i}, a batched dot
        let m = (logits.max(D::Minus1)? - (logits.sum(D::Minus1)? / n as f64)?)?;
        out.extend(to_vec_f64(&m)?);
        start += len;
    }
    Ok(out)
}

/// Every head's sampled keys as rows of the flattened keys [B·n, p]: [B, n, U] u32 on `dev`,
/// head b's drawn from `seeds[b]`'s generator (the draws of its own trial) on the host's threads.
pub fn sample_index(
    seeds: &[u64],
    n: usize,
    big_u: usize,
    dev: &candle_core::Device,
) -> Result<Tensor> {
    Ok(Tensor::from_vec(
        sample_rows(seeds, n, big_u),
        (seeds.len(), n, big_u),
        dev,
    )?)
}

/// [`sample_index`]'s values on the host: each head's n·U draws written in place into one buffer
/// (on the host's threads, a head per task), the same values as [`uniform_with_replacement`] from
/// the head's seed offset by b·n. No per-head vectors of usize and no concatenation: at n = 4096,
/// U = 279 and 12 heads these were 110 MB of fresh allocations and a 55 MB copy per call.
fn sample_rows(seeds: &[u64], n: usize, big_u: usize) -> Vec<u32> {
    use rand::Rng;
    use rayon::prelude::*;
    let per = n * big_u;
    let mut flat = vec![0u32; seeds.len() * per];
    if per > 0 {
        crate::runtime::host_install(|| {
            flat.par_chunks_mut(per).enumerate().for_each(|(b, rows)| {
                let mut rng = rng_from_seed(seeds[b]);
                let offset = b * n;
                for x in rows {
                    *x = (offset + rng.random_range(0..n)) as u32;
                }
            })
        });
    }
    flat
}

/// [`sparsity_measure`] for a batch of heads: q, k [B, n, p] and the sampled keys `idx` of
/// [`sample_index`]; each head's M̄ ([n] values). The sampled keys of all heads are gathered at
/// once, in row blocks of about 64 M entries.
pub fn sparsity_measure_heads(q: &Tensor, k: &Tensor, idx: &Tensor) -> Result<Vec<Vec<f64>>> {
    // On a CUDA device, one kernel reads each sampled key where it lies instead of gathering the
    // [B, n, U, p] block (issue 34); the same values to rounding.
    #[cfg(feature = "cuda")]
    if let Some(m) = crate::numerics::cuda::sampled_logits::sparsity_measure(q, k, idx)? {
        let n = q.dim(1)?;
        return Ok(to_vec_f64(&m)?.chunks(n).map(<[f64]>::to_vec).collect());
    }
    sparsity_measure_heads_in_blocks(q, k, idx, 1 << 26)
}

/// [`sparsity_measure_heads`] with blocks of about `entries` gathered key entries.
fn sparsity_measure_heads_in_blocks(
    q: &Tensor,
    k: &Tensor,
    idx: &Tensor,
    entries: usize,
) -> Result<Vec<Vec<f64>>> {
    let (b, n, p) = q.dims3()?;
    let big_u = idx.dim(2)?;
    let k_flat = k.reshape((b * n, p))?;
    let step = (entries / (b * big_u * p).max(1)).clamp(1, n.max(1));
    let mut blocks = Vec::new();
    for start in (0..n).step_by(step) {
        let len = step.min(n - start);
        let rows = idx.narrow(1, start, len)?.flatten_all()?;
        let ks = k_flat.index_select(&rows, 0)?.reshape((b, len, big_u, p))?;
        let qs = q.narrow(1, start, len)?.contiguous()?.unsqueeze(3)?; // [B, len, p, 1]
        let logits = ks.matmul(&qs)?.squeeze(3)?; // [B, len, U]
        blocks.push((logits.max(D::Minus1)? - (logits.sum(D::Minus1)? / n as f64)?)?);
    }
    let m = to_vec_f64(&Tensor::cat(&blocks, 1)?)?;
    Ok(m.chunks(n).map(<[f64]>::to_vec).collect())
}

/// Indices of the `u` largest values (ties to the lower index; NaN ranks lowest), in index order.
pub fn top_indices(m: &[f64], u: usize) -> Vec<usize> {
    let key = |x: f64| if x.is_nan() { f64::NEG_INFINITY } else { x };
    let mut order: Vec<usize> = (0..m.len()).collect();
    order.sort_by(|&a, &b| key(m[b]).total_cmp(&key(m[a])).then(a.cmp(&b)));
    order.truncate(u);
    order.sort_unstable();
    order
}

/// `base` ([n, p]) with rows `rows[r]` replaced by row r of `values` ([len(rows), p]), by one
/// gather from cat([base; values]) so the copied rows are bit-exact. A repeated row index takes
/// its last occurrence.
pub(crate) fn replace_rows(base: &Tensor, rows: &[usize], values: &Tensor) -> Result<Tensor> {
    let n = base.dims2()?.0;
    let mut map: Vec<usize> = (0..n).collect();
    for (r, &i) in rows.iter().enumerate() {
        map[i] = n + r;
    }
    let all = Tensor::cat(&[base, values], 0)?;
    Ok(all.index_select(&index_tensor(&map, base.device())?, 0)?)
}

/// Exact, max-shifted softmax rows softmax(q_i Kᵀ/√p)·V for the queries in `rows` ([len, p]).
pub(crate) fn exact_rows(q: &Tensor, k: &Tensor, v: &Tensor, rows: &[usize]) -> Result<Tensor> {
    let p = q.dims2()?.1;
    let qs = q.index_select(&index_tensor(rows, q.device())?, 0)?;
    let s = (qs.matmul(&k.t()?)? / (p as f64).sqrt())?;
    Ok(crate::attention::row_softmax(&s)?.matmul(v)?)
}

/// Informer's output for given per-query key samples ([n, U], row-major) and top count u.
/// Returns Ô and the selected (exact) rows.
pub fn with_samples(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    samples: &[usize],
    big_u: usize,
    u: usize,
) -> Result<(Tensor, Vec<usize>)> {
    let m = sparsity_measure(q, k, samples, big_u)?;
    let top = top_indices(&m, u);
    let lazy = v.mean_keepdim(0)?.broadcast_as(v.shape())?.contiguous()?; // (1/n)·1ᵀV on every row
    if top.is_empty() {
        return Ok((lazy, top));
    }
    let exact = exact_rows(q, k, v, &top)?;
    Ok((replace_rows(&lazy, &top, &exact)?, top))
}

const INFORMER: MethodInfo = MethodInfo {
    id: "informer",
    family: Family::Sampling,
    meaning: "factor c = ⌈d/ln n⌉; u = U = min(c·⌈ln n⌉, n) exact rows and sampled keys per query",
    random: true,
    ..MethodInfo::BASE
};
const INFORMER_MASK: MethodInfo = MethodInfo {
    id: "informer_mask",
    family: Family::Sampling,
    meaning: "u = U = min(d, n): exact rows and sampled keys per query",
    random: true,
    ..MethodInfo::BASE
};

impl Method for Informer {
    fn approximate(
        &self,
        head: &HeadInputs,
        d: usize,
        rng: &mut TrialRng,
    ) -> Result<Approximation> {
        self.check(head.n(), d).map_err(anyhow::Error::msg)?;
        let n = head.n();
        let (big_u, u) = self.sizes(n, d);
        // Per query, U keys iid uniform with replacement (independent across queries).
        let samples = uniform_with_replacement(rng, n, n * big_u);
        let (out, _) = with_samples(&head.q, &head.k, &head.v, &samples, big_u, u)?;
        Ok(Approximation::plain(out))
    }
    /// Each head's samples from its own seed (drawn on the host's threads), then the sampled
    /// logits, the exact rows and the row replacement batched over heads; the top-u choice per
    /// head on the host.
    fn approximate_heads(&self, trials: &HeadTrials) -> Result<Vec<Approximation>> {
        let (batch, d, seeds) = (trials.batch, trials.d, trials.seeds);
        let n = batch.n();
        self.check(n, d).map_err(anyhow::Error::msg)?;
        let (big_u, u) = self.sizes(n, d);
        let idx = sample_index(seeds, n, big_u, batch.device())?;
        let m = sparsity_measure_heads(&batch.q, &batch.k, &idx)?;
        let top = crate::runtime::host_map(&m, |m| top_indices(m, u));
        let (b, _, p) = batch.q.dims3()?;
        let dev = batch.device();
        let lazy = batch
            .v
            .mean_keepdim(1)?
            .broadcast_as(batch.v.shape())?
            .contiguous()?;
        let out = if u == 0 {
            lazy
        } else {
            // Exact rows of every head at once: [B, u, p] queries against their head's K and V.
            let qs = batch
                .q
                .reshape((b * n, p))?
                .index_select(&HeadBatch::flat_index(&top, n, dev)?, 0)?
                .reshape((b, u, p))?;
            let s = (qs.matmul(&batch.k.t()?)? / (p as f64).sqrt())?;
            let exact = crate::attention::row_softmax(&s)?.matmul(&batch.v)?;
            // Row i of head b: row n + r of [lazy_b; exact_b] if i is its r-th top row, else i.
            let map: Vec<Vec<usize>> = top
                .iter()
                .map(|t| {
                    let mut map: Vec<usize> = (0..n).collect();
                    for (r, &i) in t.iter().enumerate() {
                        map[i] = n + r;
                    }
                    map
                })
                .collect();
            Tensor::cat(&[&lazy, &exact], 1)?
                .reshape((b * (n + u), p))?
                .index_select(&HeadBatch::flat_index(&map, n + u, dev)?, 0)?
                .reshape((b, n, p))?
        };
        trials.per_head(&out, None)
    }
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        // nUp (sampled logits) + 2unp (exact rows) (docs/reference.md §2.11).
        let (big_u, u) = self.sizes(n, d);
        ((big_u + 2 * u) * n * p) as f64
    }
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(if self.direct {
            &INFORMER_MASK
        } else {
            &INFORMER
        })
    }
    fn check(&self, n: usize, d: usize) -> std::result::Result<(), String> {
        if d == 0 {
            return Err("d must be at least 1".into());
        }
        if !self.direct && n < 2 {
            return Err(format!(
                "{} needs n ≥ 2 (the factor divides by ln n), got n = {n}",
                self.id()
            ));
        }
        if n == 0 {
            return Err("n must be at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    /// The batched measure, in blocks of a few rows (n not a multiple of the block), is each
    /// head's own [`sparsity_measure`] on its own trial's draws.
    #[test]
    fn the_batched_measure_is_each_head_s_own_in_any_block_size() {
        use crate::tensor_util::test_device;
        let dev = test_device();
        let (b, n, p, big_u) = (3, 37, 8, 5);
        let q = Tensor::randn(0f32, 1.0, (b, n, p), &dev).unwrap();
        let k = Tensor::randn(0f32, 1.0, (b, n, p), &dev).unwrap();
        let seeds = [11u64, 12, 13];
        let idx = sample_index(&seeds, n, big_u, &dev).unwrap();
        let want: Vec<Vec<f64>> = (0..b)
            .map(|i| {
                let samples = uniform_with_replacement(&mut rng_from_seed(seeds[i]), n, n * big_u);
                sparsity_measure(&q.get(i).unwrap(), &k.get(i).unwrap(), &samples, big_u).unwrap()
            })
            .collect();
        for entries in [1, b * big_u * p * 4, 1 << 26] {
            let got = sparsity_measure_heads_in_blocks(&q, &k, &idx, entries).unwrap();
            assert_eq!(got, want, "blocks of {entries} entries");
        }
    }

    use super::*;
    use crate::attention::test_util::exact_error;
    use crate::numerics::spectral::error_norms;
    use candle_core::DType;
    use rand::SeedableRng;

    use crate::attention::test_util::random_head as head;
    use crate::attention::test_util::{
        assert_all_finite, assert_seed_determines_output, in_f32, run_seeded, vmean_error,
    };

    #[test]
    fn in_place_draws_are_each_head_s_own_stream() {
        let (seeds, n, big_u) = ([11u64, 12, 13], 37, 5);
        let flat = sample_rows(&seeds, n, big_u);
        for (b, &s) in seeds.iter().enumerate() {
            let want: Vec<u32> = uniform_with_replacement(&mut rng_from_seed(s), n, n * big_u)
                .into_iter()
                .map(|j| (b * n + j) as u32)
                .collect();
            assert_eq!(
                &flat[b * n * big_u..(b + 1) * n * big_u],
                &want[..],
                "head {b}"
            );
        }
    }

    #[test]
    fn factor_and_top_table() {
        // docs/reference.md §2.6 table: (c, u) per n (rows) and d = 8, 16, 32, 64, 128, 256 (columns).
        let table: [(usize, [(usize, usize); 6]); 4] = [
            (
                512,
                [(2, 14), (3, 21), (6, 42), (11, 77), (21, 147), (42, 294)],
            ),
            (
                1024,
                [(2, 14), (3, 21), (5, 35), (10, 70), (19, 133), (37, 259)],
            ),
            (
                2048,
                [(2, 16), (3, 24), (5, 40), (9, 72), (17, 136), (34, 272)],
            ),
            (
                4096,
                [(1, 9), (2, 18), (4, 36), (8, 72), (16, 144), (31, 279)],
            ),
        ];
        for (n, row) in table {
            for (d, want) in [8, 16, 32, 64, 128, 256].into_iter().zip(row) {
                assert_eq!(factor_and_top(n, d), want, "n = {n}, d = {d}");
            }
        }
        // u is capped at n.
        assert_eq!(factor_and_top(20, 64).1, 20);
        assert_eq!(Informer::direct().sizes(100, 300), (100, 100));
    }

    #[test]
    fn top_indices_ranks_descending_with_ties_low_first() {
        assert_eq!(
            top_indices(&[1.0, 3.0, 3.0, f64::NAN, 2.0], 3),
            vec![1, 2, 4]
        );
        assert_eq!(top_indices(&[1.0, 2.0], 0), Vec::<usize>::new());
    }

    #[test]
    fn sparsity_measure_matches_naive() {
        let h = head(40, 8, 1, DType::F64);
        let mut rng = TrialRng::seed_from_u64(2);
        let big_u = 7;
        let s = uniform_with_replacement(&mut rng, 40, 40 * big_u);
        let m = sparsity_measure(&h.q, &h.k, &s, big_u).unwrap();
        let q: Vec<Vec<f64>> = h.q.to_vec2().unwrap();
        let k: Vec<Vec<f64>> = h.k.to_vec2().unwrap();
        for i in 0..40 {
            let l: Vec<f64> = (0..big_u)
                .map(|t| {
                    q[i].iter()
                        .zip(&k[s[i * big_u + t]])
                        .map(|(a, b)| a * b)
                        .sum()
                })
                .collect();
            let want =
                l.iter().cloned().fold(f64::NEG_INFINITY, f64::max) - l.iter().sum::<f64>() / 40.0;
            assert!((m[i] - want).abs() < 1e-12, "row {i}");
        }
    }

    #[test]
    fn all_rows_selected_is_exact() {
        // informer_mask with d = n selects every query: Ô = O.
        let h = head(64, 16, 3, DType::F64);
        let mut rng = TrialRng::seed_from_u64(4);
        let out = Informer::direct()
            .approximate(&h, 64, &mut rng)
            .unwrap()
            .output;
        assert!(exact_error(&h, &out) < 1e-12);
        // So does `informer` once c·⌈ln n⌉ ≥ n (capped at n).
        let out = Informer::log_factor()
            .approximate(&h, 1000, &mut rng)
            .unwrap()
            .output;
        assert!(exact_error(&h, &out) < 1e-12);
    }

    #[test]
    fn lazy_rows_are_mean_v_and_selected_rows_exact() {
        let (n, p) = (96, 16);
        let h = head(n, p, 5, DType::F64);
        let mut rng = TrialRng::seed_from_u64(6);
        let (big_u, u) = factor_and_top(n, 8);
        let samples = uniform_with_replacement(&mut rng, n, n * big_u);
        let (out, top) = with_samples(&h.q, &h.k, &h.v, &samples, big_u, u).unwrap();
        assert_eq!(top.len(), u);
        let o: Vec<Vec<f64>> = out.to_vec2().unwrap();
        let mean: Vec<f64> =
            h.v.mean_keepdim(0)
                .unwrap()
                .squeeze(0)
                .unwrap()
                .to_vec1()
                .unwrap();
        let exact: Vec<Vec<f64>> = h.exact().unwrap().output.to_vec2().unwrap();
        for i in 0..n {
            if top.contains(&i) {
                for c in 0..p {
                    assert!((o[i][c] - exact[i][c]).abs() < 1e-12);
                }
            } else {
                assert_eq!(o[i], mean, "lazy row {i} must be mean(V) exactly");
            }
        }
        // The selected rows are those with the u largest sparsity measures.
        let m = sparsity_measure(&h.q, &h.k, &samples, big_u).unwrap();
        let min_top = top.iter().map(|&i| m[i]).fold(f64::INFINITY, f64::min);
        assert!((0..n).filter(|i| !top.contains(i)).all(|i| m[i] <= min_top));
    }

    #[test]
    fn seeded_reproducible_and_f32_agrees_with_f64() {
        let h64 = head(128, 16, 7, DType::F64);
        let m = Informer::log_factor();
        let a = assert_seed_determines_output(&m, &h64, 16, 9).output;
        let b = run_seeded(&m, &in_f32(&h64), 16, 9).output;
        let diff = error_norms(&a, &b.to_dtype(DType::F64).unwrap())
            .unwrap()
            .spectral;
        assert!(diff < 1e-4, "f32 vs f64: {diff}");
        assert_all_finite(&b);
        // Error is below V-Mean's (the selected rows are exact), and positive.
        let err = exact_error(&h64, &a);
        let vmean = vmean_error(&h64);
        assert!(err > 0.0 && err <= vmean + 1e-12, "{err} vs {vmean}");
    }

    #[test]
    fn check_rejects_impossible() {
        assert!(Informer::log_factor().check(1, 8).is_err());
        assert!(Informer::log_factor().check(512, 0).is_err());
        assert!(Informer::direct().check(1, 8).is_ok());
    }
}
