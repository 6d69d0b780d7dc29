//! `hyperattention`: sortLSH block diagonal + uniform column sampling, non-causal (Han, Jayaram,
//! Karbasi, Mirrokni, Woodruff & Zandieh, ICLR 2024, "HyperAttention: Long-context Attention in
//! Near-Linear Time": Alg. 1 sortLSH, Alg. 2 ApproxD, Alg. 3 AMM, Thm. 1), as the authors' code
//! (`insuhan/hyper-attn`, `hyper_attn.py` + `add_self_attentions`) computes it; docs/reference.md §6.3.1:
//!
//!   b = min(d, n) block size, m = d samples, r = 7 hash bits
//!   1  sortLSH (§6.3.0, `numerics::lsh::sort_lsh_blocks`) → β_Q, β_K; block part
//!      u_i = Σ_{j: β_K(j) = β_Q(i)} e^{s_ij} [v_j, 1]
//!   2  J = (j_1..j_m) iid Uniform{0..n−1}, one draw shared by every query
//!   3  μ_iℓ = [β_K(j_ℓ) ≠ β_Q(i)]  (samples in the query's own block are dropped)
//!   4  r_i = (n/m) Σ_ℓ μ_iℓ e^{s_{i j_ℓ}} [v_{j_ℓ}, 1]
//!   5  [num_i, D̃_i] = u_i + r_i,  Ô_i = num_i / D̃_i
//!
//! E[D̃_i | Ω] = D_i (unbiased); D̃_i ≥ the block sum > 0, so every row is finite and a convex
//! combination of rows of V. Following the code (§6.3.1 [P≠C]): no ApproxD thresholds or caps,
//! one J for D̃ and for AV; the own block is masked (the Triton path and the paper's
//! (1 − M^H) ⊙ A), `mask_own_block = false` keeps the unmasked fp32 path as a diagnostic;
//! always approximate (min_seq_len = 0).
//!
//! The block part is the shared key-set softmax (with its log-normaliser); the sampled part is
//! one [n, m] product Q K_Jᵀ, exponentiated on the host in f64 with the log weights and the mask
//! folded in and a per-row shift, then E·V_J; the two parts merge by their log-normalisers
//! (the code's `add_self_attentions`). No n×n matrix is formed.
//!
//! What d means: b = m = d, so each query visits ≈ 2d keys (b in its block + m sampled − ≈ mb/n
//! masked), cost parity with the 4ndp methods.
//!
//! Cost (MACs): block pairs·(2p + 1) + n·m·(2p + 1) + hashing 2nrp = 14np ≈ 4ndp + 2nd + 14np
//! (pairs = n·b when b | n). Two O(n) counting sorts and n·m integer compares, not MACs.
//!
//! Randomness (§1.5): Ω (p·r normals), then J; fresh per trial.
//!
//! [`blocks_plus_samples`] is shared with `kdeformer` (§6.3.2), which differs only in the law of J
//! and its weights.

use anyhow::{ensure, Result};
use candle_core::Tensor;
use rayon::prelude::*;

use crate::attention::{Approximation, Family, HeadInputs, Method, MethodInfo};
use crate::numerics::key_sets::key_set_softmax;
use crate::numerics::lsh::{sort_lsh_blocks, BucketOrder, SortLshBlocks, SORT_LSH_BITS};
use crate::numerics::sampling::{normal_values, uniform_with_replacement, TrialRng};
use crate::tensor_util::{from_f64, index_tensor, to_vec_f64};

pub struct HyperAttention {
    /// Drop the samples that fall in the query's own block (§6.3.1 [REC]); `false` is the
    /// authors' fp32/fp64 path, a diagnostic.
    pub mask_own_block: bool,
    /// sortLSH bucket order (§6.3.0 [REC]: the code's).
    pub order: BucketOrder,
}

impl HyperAttention {
    /// The registered `hyperattention`: own block masked, code bucket order.
    pub fn reference() -> Self {
        Self {
            mask_own_block: true,
            order: BucketOrder::Code,
        }
    }
}

/// b = min(d, n) (at least 1): the sortLSH block size of both §6.3 methods.
pub fn block_size(n: usize, d: usize) -> usize {
    d.min(n).max(1)
}

/// Ω ∈ ℝ^{p×r}, iid N(0, 1), r = 7: the one draw shared by Q and K (§6.3.0).
pub(crate) fn draw_omega(rng: &mut TrialRng, head: &HeadInputs) -> Result<Tensor> {
    let p = head.p();
    from_f64(
        normal_values(rng, p, SORT_LSH_BITS, 1.0),
        (p, SORT_LSH_BITS),
        head.device(),
        head.dtype(),
    )
}

/// Ω (one draw from `rng`), then the sortLSH blocks of size b = [`block_size`] for the head's
/// Q and K: step 1 of both §6.3 methods.
pub(crate) fn draw_blocks(
    rng: &mut TrialRng,
    head: &HeadInputs,
    d: usize,
    order: BucketOrder,
) -> Result<SortLshBlocks> {
    let omega = draw_omega(rng, head)?;
    sort_lsh_blocks(&head.q, &head.k, &omega, block_size(head.n(), d), order)
}

/// MACs of the block part and the sampled part with weights [v, 1], plus the hashing.
pub(crate) fn block_and_sample_macs(n: usize, p: usize, d: usize) -> f64 {
    let b = block_size(n, d);
    let pairs = ((n / b) * b * b + (n % b) * (n % b)) as f64;
    let per_pair = (2 * p + 1) as f64;
    pairs * per_pair + (n * d) as f64 * per_pair + (2 * n * SORT_LSH_BITS * p) as f64
}

/// The shared sample set J and each sample's log weight (ln(n/m) uniform, −ln(mπ_j) KDEformer).
pub(crate) struct Samples {
    pub keys: Vec<usize>,
    pub log_weights: Vec<f64>,
}

/// Ô and ln D̃ (f64, per row) of the estimator u_i + r_i (steps 1–5 above) for given blocks and
/// samples.
pub(crate) struct BlockSampleOutput {
    pub output: Tensor,
    /// Read by the tests (E[D̃ | Ω] = D).
    #[cfg_attr(not(test), allow(dead_code))]
    pub log_denominator: Vec<f64>,
}

/// Block part (exact, via the key-set softmax) plus the weighted sampled residual, merged by
/// their log-normalisers; see the module comment.
pub(crate) fn blocks_plus_samples(
    head: &HeadInputs,
    blocks: &SortLshBlocks,
    samples: &Samples,
    mask_own_block: bool,
) -> Result<BlockSampleOutput> {
    let (n, p) = (head.n(), head.p());
    let pv = head.v.dim(1)?;
    let m = samples.keys.len();
    ensure!(
        m == samples.log_weights.len() && m >= 1,
        "need ≥ 1 weighted sample"
    );
    let dev = head.device();

    let blk = key_set_softmax(&head.q, &head.k, &head.v, &blocks.groups, None, true)?;
    let o_blk = to_vec_f64(&blk.output)?;
    let lse_blk = to_vec_f64(&blk.log_normalizer.expect("requested"))?;

    // Sampled logits s_{i j_ℓ} ([n, m]) on the device, exponentiated on the host in f64 with
    // the log weight added, the mask applied and a per-row shift c_i.
    let idx = index_tensor(&samples.keys, dev)?;
    let (kj, vj) = (head.k.index_select(&idx, 0)?, head.v.index_select(&idx, 0)?);
    let s = to_vec_f64(&(head.q.matmul(&kj.t()?)? * (1.0 / (p as f64).sqrt()))?)?;
    let mut e = vec![0f64; n * m];
    let stats: Vec<(f64, f64)> = e
        .par_chunks_mut(m)
        .zip(s.par_chunks(m))
        .enumerate()
        .map(|(i, (e_row, s_row))| {
            let on =
                |l: usize| !mask_own_block || blocks.k_block[samples.keys[l]] != blocks.q_block[i];
            let c = (0..m)
                .filter(|&l| on(l))
                .map(|l| s_row[l] + samples.log_weights[l])
                .fold(f64::NEG_INFINITY, f64::max);
            if c == f64::NEG_INFINITY {
                return (c, 0.0); // every sample in the own block: no residual
            }
            let mut z = 0.0;
            for l in (0..m).filter(|&l| on(l)) {
                e_row[l] = (s_row[l] + samples.log_weights[l] - c).exp();
                z += e_row[l];
            }
            (c, z)
        })
        .collect();
    let ev = to_vec_f64(&from_f64(e, (n, m), dev, head.dtype())?.matmul(&vj)?)?;

    // Merge: [num, D̃] = e^{lse_blk}[O_blk, 1] + e^{c}[E·V_J, z], shifted by L = max.
    let mut out = vec![0f64; n * pv];
    let log_den: Vec<f64> = out
        .par_chunks_mut(pv)
        .enumerate()
        .map(|(i, row)| {
            let (c, z) = stats[i];
            let lse_res = if z > 0.0 {
                c + z.ln()
            } else {
                f64::NEG_INFINITY
            };
            let top = lse_blk[i].max(lse_res);
            let a = (lse_blk[i] - top).exp();
            let w = if z > 0.0 { (c - top).exp() } else { 0.0 };
            let den = a + w * z;
            for (col, x) in row.iter_mut().enumerate() {
                *x = (a * o_blk[i * pv + col] + w * ev[i * pv + col]) / den;
            }
            top + den.ln()
        })
        .collect();
    Ok(BlockSampleOutput {
        output: from_f64(out, (n, pv), dev, head.dtype())?,
        log_denominator: log_den,
    })
}

impl HyperAttention {
    /// Ô and ln D̃ of one trial (Ω, then J).
    pub(crate) fn estimate(
        &self,
        head: &HeadInputs,
        d: usize,
        rng: &mut TrialRng,
    ) -> Result<BlockSampleOutput> {
        let n = head.n();
        let blocks = draw_blocks(rng, head, d, self.order)?;
        let m = d.max(1);
        let samples = Samples {
            keys: uniform_with_replacement(rng, n, m),
            log_weights: vec![(n as f64 / m as f64).ln(); m],
        };
        blocks_plus_samples(head, &blocks, &samples, self.mask_own_block)
    }
}

const HYPER_ATTENTION: MethodInfo = MethodInfo {
    id: "hyperattention",
    family: Family::Sampling,
    meaning: "sortLSH block size b = d (r = 7 sign bits) + m = d uniform key samples shared by all queries (n/m weights, own block masked): ≈ 2d keys per query",
    random: true,
    ..MethodInfo::BASE
};

impl Method for HyperAttention {
    fn approximate(
        &self,
        head: &HeadInputs,
        d: usize,
        rng: &mut TrialRng,
    ) -> Result<Approximation> {
        // Plain: D̃ ≥ the block sum > 0 by construction, and D̃ itself (held as ln D̃) would
        // overflow f32 if returned as the normaliser.
        Ok(Approximation::plain(self.estimate(head, d, rng)?.output))
    }
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        block_and_sample_macs(n, p, d)
    }
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(&HYPER_ATTENTION)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::attention::test_util::*;
    use crate::numerics::lsh::gray_code;
    use candle_core::DType;
    use rand::SeedableRng;

    /// A head with iid N(0, std²) entries (§6.3.4's synthetic data: std = 0.5).
    pub(crate) fn synthetic(n: usize, p: usize, std: f64, seed: u64) -> HeadInputs {
        let mut rng = TrialRng::seed_from_u64(seed);
        let mut mk = || {
            from_f64(
                normal_values(&mut rng, n, p, std),
                (n, p),
                &crate::tensor_util::test_device(),
                DType::F64,
            )
            .unwrap()
        };
        let (q, k, v) = (mk(), mk(), mk());
        HeadInputs::new(q, k, v).unwrap()
    }

    /// A direct float64 implementation of steps 1–5 from the drawn Ω, J and weights: hash by
    /// sign bits, stable sort by g(h), blocks by rank, then per row u_i + r_i, dense loops.
    pub(crate) fn direct_f64(
        h: &HeadInputs,
        b: usize,
        omega: &[f64], // p×r row-major
        keys: &[usize],
        weights: &[f64],
        mask: bool,
    ) -> Vec<Vec<f64>> {
        let [q, k, v] = host_rows(h);
        let (n, p, r) = (q.len(), q[0].len(), omega.len() / q[0].len());
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        let block = |x: &Vec<Vec<f64>>| -> Vec<usize> {
            let kappa: Vec<usize> = x
                .iter()
                .map(|row| {
                    let h: usize = (0..r)
                        .map(|t| {
                            let proj: f64 = (0..p).map(|c| row[c] * omega[c * r + t]).sum();
                            usize::from(proj > 0.0) << t
                        })
                        .sum();
                    gray_code(h)
                })
                .collect();
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by_key(|&i| kappa[i]); // stable
            let mut blk = vec![0; n];
            for (pos, &i) in order.iter().enumerate() {
                blk[i] = pos / b;
            }
            blk
        };
        let (bq, bk) = (block(&q), block(&k));
        let sc = 1.0 / (p as f64).sqrt();
        (0..n)
            .map(|i| {
                let a = |j: usize| (dot(&q[i], &k[j]) * sc).exp(); // e^{q_i·k_j/√p}
                let block = (0..n).filter(|&j| bk[j] == bq[i]).map(|j| (a(j), j));
                let sampled = keys
                    .iter()
                    .zip(weights)
                    .filter(|&(&j, _)| !(mask && bk[j] == bq[i]))
                    .map(|(&j, &w)| (w * a(j), j));
                weighted_mean_row(&v, block.chain(sampled))
            })
            .collect()
    }

    #[test]
    fn agrees_with_a_direct_f64_implementation_ragged_and_unmasked() {
        let h = synthetic(100, 8, 1.0, 3); // b = 16 ∤ 100: a ragged last block
        for mask in [true, false] {
            let m = HyperAttention {
                mask_own_block: mask,
                order: BucketOrder::Code,
            };
            let got = run_seeded(&m, &h, 16, 7).output.to_vec2::<f64>().unwrap();
            // The same draws: Ω, then J.
            let mut rng = TrialRng::seed_from_u64(7);
            let omega = normal_values(&mut rng, 8, SORT_LSH_BITS, 1.0);
            let keys = uniform_with_replacement(&mut rng, 100, 16);
            let want = direct_f64(&h, 16, &omega, &keys, &[100.0 / 16.0; 16], mask);
            assert_close_per_entry(&got, &want, 1e-10);
        }
    }

    /// At every d of `ds` (a budget whose blocks and samples cover every key), `m` is exact
    /// attention to 1e-12 on a §6.3.4 head.
    fn assert_covering_budget_is_exact(m: &dyn Method, ds: &[usize]) {
        let h = synthetic(128, 16, 0.5, 1);
        for &d in ds {
            let e = exact_error(&h, &run_seeded(m, &h, d, 2).output);
            assert!(e < 1e-12, "{} d = {d}: {e}", m.id());
        }
    }

    /// Every row of `m`'s weights is a distribution (n = 96), and f32 on a ragged n = 300
    /// (b = 64) stays finite.
    fn assert_weights_are_distributions_and_f32_is_finite(m: &dyn Method) {
        let h = synthetic(96, 8, 1.0, 4);
        assert_rows_are_distributions(&weight_matrix(m, &h, 16, 5), 1e-12);
        let h32 = in_f32(&synthetic(300, 16, 0.5, 6));
        assert_all_finite(&run_seeded(m, &h32, 64, 1).output);
    }

    /// `m` is a function of its seed, and its error at seed 11 (n = 256, d = 16) is `pinned`.
    fn assert_seeded_with_pinned_error(m: &dyn Method, pinned: f64) {
        let h = synthetic(256, 16, 0.5, 8);
        let e = exact_error(&h, &assert_seed_determines_output(m, &h, 16, 11).output);
        assert!((e - pinned).abs() < 1e-9 * pinned, "{} {e}", m.id());
    }

    /// The basic checks of a sortLSH-blocks-plus-samples method: exact attention at the
    /// covering budgets `covering`, weights and f32, and the error `pinned` at seed 11.
    pub(crate) fn assert_sort_lsh_basics(m: &dyn Method, covering: &[usize], pinned: f64) {
        assert_covering_budget_is_exact(m, covering);
        assert_weights_are_distributions_and_f32_is_finite(m);
        assert_seeded_with_pinned_error(m, pinned);
    }

    /// With Ω (hence the blocks) fixed, fresh samples from `draw` each trial: the mean of
    /// D̃_i / D_i over 3000 trials is 1 within 5 standard errors, a z-test per row.
    pub(crate) fn assert_denominator_unbiased_given_the_blocks(
        h: &HeadInputs,
        d: usize,
        mut draw: impl FnMut(&mut TrialRng) -> Samples,
    ) {
        let n = h.n();
        let mut rng = TrialRng::seed_from_u64(1);
        let omega = draw_omega(&mut rng, h).unwrap();
        let blocks = sort_lsh_blocks(&h.q, &h.k, &omega, d, BucketOrder::Code).unwrap();
        let log_d = to_vec_f64(h.exact().unwrap().log_rowsum().unwrap()).unwrap();
        let trials = 3000;
        let (mut sum, mut sq) = (vec![0.0; n], vec![0.0; n]);
        for _ in 0..trials {
            let r = blocks_plus_samples(h, &blocks, &draw(&mut rng), true).unwrap();
            for i in 0..n {
                let x = (r.log_denominator[i] - log_d[i]).exp(); // D̃_i / D_i
                sum[i] += x;
                sq[i] += x * x;
            }
        }
        for i in 0..n {
            let mean = sum[i] / trials as f64;
            let se = ((sq[i] / trials as f64 - mean * mean) / trials as f64).sqrt();
            assert!(
                (mean - 1.0).abs() < 5.0 * se + 1e-12,
                "row {i}: {mean} ± {se}"
            );
        }
    }

    /// §6.3.4's synthetic data (n = 512, p = 64, entries N(0, 0.5²)): the mean error of 4
    /// trials on 2 heads is within 10 % of each `(d, want)` of an independent implementation
    /// (20 trials), and strictly falls in d.
    pub(crate) fn assert_synthetic_errors_fall_with_d(m: &dyn Method, wants: &[(usize, f64)]) {
        let heads: Vec<HeadInputs> = (0..2).map(|s| synthetic(512, 64, 0.5, 100 + s)).collect();
        let mut last = f64::INFINITY;
        for &(d, want) in wants {
            let mut total = 0.0;
            for (hi, h) in heads.iter().enumerate() {
                for s in 0..2 {
                    total += exact_error(h, &run_seeded(m, h, d, (10 * hi + s) as u64).output);
                }
            }
            let mean = total / 4.0;
            assert!(
                (mean / want - 1.0).abs() < 0.1,
                "{} d = {d}: {mean} vs {want}",
                m.id()
            );
            assert!(mean < last);
            last = mean;
        }
    }

    /// Exact at a covering budget, weights that are distributions, finite in f32, and a
    /// function of the seed with its pinned error.
    #[test]
    fn covering_budget_weights_and_seed() {
        assert_sort_lsh_basics(&HyperAttention::reference(), &[128, 500], 6.411626894300392);
    }

    #[test]
    fn denominator_is_unbiased_given_the_blocks() {
        // Uniform J, weights n/m: E[D̃_i] = D_i.
        let (n, d) = (128, 16);
        let h = synthetic(n, 8, 0.7, 9);
        assert_denominator_unbiased_given_the_blocks(&h, d, |rng| Samples {
            keys: uniform_with_replacement(rng, n, d),
            log_weights: vec![(n as f64 / d as f64).ln(); d],
        });
    }

    /// §6.3.4 synthetic evidence: 21.7 / 9.87 / 3.00 at d = 16 / 64 / 256.
    #[test]
    fn synthetic_errors_match_the_spec_and_fall_with_d() {
        let wants = [(16, 21.7), (64, 9.87), (256, 3.00)];
        assert_synthetic_errors_fall_with_d(&HyperAttention::reference(), &wants);
    }

    #[test]
    fn cost_is_4ndp_plus_hashing() {
        let m = HyperAttention::reference();
        let (n, p, d) = (4096, 64, 64);
        let want = (4 * n * d * p + 2 * n * d + 14 * n * p) as f64;
        assert_eq!(m.macs(n, p, d), want);
    }
}
