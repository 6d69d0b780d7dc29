//! `scatterbrain`: FAVOR+ low rank + exact sparse correction (Chen, Dao, Winsor, Song, Rudra & Ré,
//! NeurIPS 2021, "Scatterbrain: Unifying Sparse and Low-rank Attention Approximation", §3
//! Eq. (1)–(2) and Alg. 1; support from the authors' `SBSmyrfAttention`, HazyResearch/fly);
//! docs/reference.md §6.2.2:
//!
//!   Â = Φ_QΦ_Kᵀ + S, S_ij = A_ij − φ(q̃_i)·φ(k̃_j) on 𝒮, 0 elsewhere;  Ô = diag(Â1)⁻¹ÂV
//!   i.e. Â = A on 𝒮 and Φ_QΦ_Kᵀ off 𝒮.
//!
//! Features: FAVOR+ positive orthogonal features of `performer_favor` (the same Ω and feature map,
//! `features::performer`), ε = 0, m = ⌊d/2⌋, x̃ = x·p^{-1/4} once.
//!
//! Support (SMYRF balanced LSH, one round): c = min(d, n), B = ⌈n/c⌉; XBOX+ lifts
//! q' = [q̃, 0, √(M − ‖q̃‖²)], k' = [k̃, √(M − ‖k̃‖²), 0] with M = max‖q̃‖² + max‖k̃‖²; one
//! α ~ N(0, I_{p+2}); π_Q, π_K stable argsorts of α·q', α·k'; both cut into B consecutive groups
//! as np.array_split does; 𝒮 = ⋃_b Q-group b × K-group b. `scatterbrain_local` (diagnostic):
//! position blocks (π = identity), the blocked analogue of the authors' `SBLocalAttention`.
//!
//! Computation (§6.2.2, no n·c·m term): T_b = Σ_{j∈K_b} φ(k̃_j)[v_j, 1]ᵀ; T̄_b = Σ_{b'≠b} T_{b'}
//! from prefix + suffix sums (never T − T_b); for query i in group b
//! num_i = Σ_{j∈K_b} e^{q̃_i·k̃_j}[v_j, 1] + φ(q̃_i)ᵀT̄_b, Ô_i = num_i[..p] / num_i[p]. The block
//! part is the shared key-set softmax (with log-normalisers); the features carry shifts
//! φ(q̃_i) = e^{a_i}f_i (a_i = max_r ω_r·q̃_i), φ(k̃_j) = e^{c_K}g_j (c_K = max_{j,r} ω_r·k̃_j),
//! and the two parts merge on the host in f64 by row shift max(lse_i, a_i + c_K), which cancels.
//! The denominator is a sum of positive terms; it is returned (counted, never clamped).
//!
//! What d means: m = ⌊d/2⌋ random features and c = d keys per query (d ≥ 2).
//!
//! Cost (MACs): features 2nmp, all T_b nm(p+1), φ(q̃)·T̄ nm(p+1), block pairs·2p (pairs = nc when
//! c | n) → 4ndp; + XBOX+ hash 2n(p+2) (`scatterbrain` only) + ⌈m/p⌉p³ QR. Sorts are not MACs.
//!
//! Randomness (§1.5): α (hash, `scatterbrain` only), then Ω, fresh per trial.
//!
//! §6.2.2 [P≠C], following the [REC]s: one hash round with c = d (not 2 rounds of 16), plain
//! positive features (not the cosh map), Ω fresh per trial, the unrounded E2LSH projection (only
//! its order is used, β irrelevant), no clamp of the normaliser.

use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};
use rayon::prelude::*;

use crate::attention::features::performer::{
    half_squared_norms, orthogonal_gaussian, shifted_feature_map, Shift,
};
use crate::attention::{
    ones_col, quarter_scale, Approximation, Family, HeadInputs, Method, MethodInfo,
};
use crate::numerics::key_sets::{key_set_softmax, KeyGroup};
use crate::numerics::sampling::{normal_values, TrialRng};
use crate::tensor_util::{from_dmatrix, from_f64, index_tensor, to_vec_f64};

/// How the sparse support 𝒮 is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// SMYRF balanced clusters of one XBOX+ projection (`scatterbrain`).
    Smyrf,
    /// Consecutive position blocks (`scatterbrain_local`, diagnostic).
    Local,
}

pub struct Scatterbrain {
    pub support: Support,
}

impl Scatterbrain {
    pub fn smyrf() -> Self {
        Self {
            support: Support::Smyrf,
        }
    }
    pub fn local() -> Self {
        Self {
            support: Support::Local,
        }
    }
}

/// m = ⌊d/2⌋ features.
pub fn features(d: usize) -> usize {
    d / 2
}

/// c = min(d, n) keys per query.
pub fn cluster_size(n: usize, d: usize) -> usize {
    d.min(n).max(1)
}

/// np.array_split of 0..n into B = ⌈n/c⌉ groups: the first n mod B have ⌊n/B⌋ + 1 entries.
pub fn array_split(n: usize, c: usize) -> Vec<std::ops::Range<usize>> {
    let b = n.div_ceil(c);
    let (base, rem) = (n / b, n % b);
    let mut start = 0;
    (0..b)
        .map(|t| {
            let len = base + usize::from(t < rem);
            start += len;
            start - len..start
        })
        .collect()
}

/// The positions 0..n stably sorted by `key` (ties keep index order; NaN sorts last).
fn stable_argsort(key: &[f64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..key.len()).collect();
    order.sort_by(|&a, &b| key[a].total_cmp(&key[b]));
    order
}

/// π_Q and π_K of the SMYRF support: stable argsorts of α·q' and α·k' (XBOX+ lifts of q̃, k̃,
/// both [n, p] on the host, row-major); α has p + 2 entries.
pub fn smyrf_orders(qt: &[f64], kt: &[f64], p: usize, alpha: &[f64]) -> (Vec<usize>, Vec<usize>) {
    let sq =
        |x: &[f64]| -> Vec<f64> { x.chunks(p).map(|r| r.iter().map(|y| y * y).sum()).collect() };
    let (nq, nk) = (sq(qt), sq(kt));
    let big = nq.iter().cloned().fold(0.0, f64::max) + nk.iter().cloned().fold(0.0, f64::max);
    let proj = |x: &[f64], norms: &[f64], lift: f64| -> Vec<f64> {
        x.chunks(p)
            .zip(norms)
            .map(|(r, &s)| {
                let dot: f64 = r.iter().zip(alpha).map(|(a, b)| a * b).sum();
                dot + lift * (big - s).max(0.0).sqrt()
            })
            .collect()
    };
    // q' = [q̃, 0, √(M − ‖q̃‖²)], k' = [k̃, √(M − ‖k̃‖²), 0].
    (
        stable_argsort(&proj(qt, &nq, alpha[p + 1])),
        stable_argsort(&proj(kt, &nk, alpha[p])),
    )
}

impl Scatterbrain {
    /// The support as key groups (Q-group b × K-group b), drawing α first for `Smyrf`.
    fn support_groups(
        &self,
        rng: &mut TrialRng,
        qt: &Tensor,
        kt: &Tensor,
        c: usize,
    ) -> Result<Vec<KeyGroup>> {
        let (n, p) = qt.dims2()?;
        let (q_order, k_order) = match self.support {
            Support::Local => ((0..n).collect(), (0..n).collect()),
            Support::Smyrf => {
                let alpha = normal_values(rng, p + 2, 1, 1.0);
                smyrf_orders(&to_vec_f64(qt)?, &to_vec_f64(kt)?, p, &alpha)
            }
        };
        Ok(array_split(n, c)
            .into_iter()
            .map(|r| KeyGroup {
                rows: q_order[r.clone()].to_vec(),
                keys: k_order[r].to_vec(),
            })
            .collect::<Vec<_>>())
    }
}

/// Rows of `x` gathered per group into a zero-padded [B, cmax, width] batch (`pick` lists each
/// group's rows).
fn padded_gather(x: &Tensor, lists: &[&[usize]], cmax: usize) -> Result<Tensor> {
    let (b, width) = (lists.len(), x.dim(1)?);
    let mut idx = Vec::with_capacity(b * cmax);
    let mut keep = Vec::with_capacity(b * cmax);
    for l in lists {
        for s in 0..cmax {
            idx.push(l.get(s).copied().unwrap_or(l[0]));
            keep.push(if s < l.len() { 1.0 } else { 0.0 });
        }
    }
    let g = x.index_select(&index_tensor(&idx, x.device())?, 0)?;
    let keep = from_f64(keep, (b * cmax, 1), x.device(), x.dtype())?;
    Ok(g.broadcast_mul(&keep)?.reshape((b, cmax, width))?)
}

const SMYRF: MethodInfo = MethodInfo {
    id: "scatterbrain",
    family: Family::Hybrid,
    meaning: "⌊d/2⌋ FAVOR+ features + exact logits on d keys per query (one SMYRF XBOX+ hash round, balanced clusters of d)",
    random: true,
    ..MethodInfo::BASE
};
const LOCAL: MethodInfo = MethodInfo {
    id: "scatterbrain_local",
    family: Family::Hybrid,
    meaning:
        "⌊d/2⌋ FAVOR+ features + exact logits on the query's position block of d keys (diagnostic)",
    random: true,
    ..MethodInfo::BASE
};

impl Method for Scatterbrain {
    fn approximate(
        &self,
        head: &HeadInputs,
        d: usize,
        rng: &mut TrialRng,
    ) -> Result<Approximation> {
        let (n, p) = (head.n(), head.p());
        ensure!(d >= 2, "{} needs d ≥ 2", self.id());
        ensure!(
            head.k.dim(0)? == n,
            "{} needs as many keys as queries",
            self.id()
        );
        let (dev, dt) = (head.device(), head.dtype());
        let pv = head.v.dim(1)?;
        let (m, c) = (features(d), cluster_size(n, d));
        let (qt, kt) = (quarter_scale(&head.q, p)?, quarter_scale(&head.k, p)?);

        // α (inside `support_groups`), then Ω.
        let groups = self.support_groups(rng, &qt, &kt, c)?;
        let omega = from_dmatrix(&orthogonal_gaussian(rng, m, p), dev, dt)?;
        let (fq, aq) =
            shifted_feature_map(&qt, &half_squared_norms(&qt)?, &omega, Shift::PerRow, 0.0)?;
        let (fk, ck) =
            shifted_feature_map(&kt, &half_squared_norms(&kt)?, &omega, Shift::Global, 0.0)?;
        let vp = Tensor::cat(&[&head.v, &ones_col(n, dt, dev)?], 1)?; // [n, p_v + 1]

        // T_b = g_{K_b}ᵀ V'_{K_b} for every group, batched over zero-padded groups.
        let nb = groups.len();
        let cmax = groups.iter().map(|g| g.keys.len()).max().unwrap_or(1);
        let keys: Vec<&[usize]> = groups.iter().map(|g| g.keys.as_slice()).collect();
        let rows: Vec<&[usize]> = groups.iter().map(|g| g.rows.as_slice()).collect();
        let t = padded_gather(&fk, &keys, cmax)?
            .transpose(1, 2)?
            .contiguous()?
            .matmul(&padded_gather(&vp, &keys, cmax)?)?; // [B, m, p_v + 1]
                                                         // T̄_b = prefix_b + suffix_b on the host in f64.
        let w = m * (pv + 1);
        let t = to_vec_f64(&t)?;
        let mut bar = vec![0f64; nb * w];
        let mut acc = vec![0f64; w];
        for b in 0..nb {
            bar[b * w..][..w].copy_from_slice(&acc);
            acc.iter_mut()
                .zip(&t[b * w..][..w])
                .for_each(|(a, x)| *a += x);
        }
        acc.iter_mut().for_each(|a| *a = 0.0);
        for b in (0..nb).rev() {
            bar[b * w..][..w]
                .iter_mut()
                .zip(&acc)
                .for_each(|(x, a)| *x += a);
            acc.iter_mut()
                .zip(&t[b * w..][..w])
                .for_each(|(a, x)| *a += x);
        }
        let bar = Tensor::from_vec(bar, (nb, m, pv + 1), dev)?.to_dtype(dt)?;
        // Low-rank part f_i·T̄_b per query, back in row order.
        let lr = padded_gather(&fq, &rows, cmax)?.matmul(&bar)?; // [B, cmax, p_v + 1]
        let mut slot = vec![0usize; n];
        for (b, g) in groups.iter().enumerate() {
            for (s, &i) in g.rows.iter().enumerate() {
                slot[i] = b * cmax + s;
            }
        }
        let lr = lr
            .reshape((nb * cmax, pv + 1))?
            .index_select(&index_tensor(&slot, dev)?, 0)?;
        let lr = to_vec_f64(&lr)?;

        // Exact part on 𝒮 and the merge.
        let blk = key_set_softmax(&head.q, &head.k, &head.v, &groups, None, true)?;
        let o_blk = to_vec_f64(&blk.output)?;
        let lse = to_vec_f64(&blk.log_normalizer.expect("requested"))?;
        let aq = to_vec_f64(&aq)?;
        let ck = to_vec_f64(&ck)?[0];
        let mut out = vec![0f64; n * pv];
        let den: Vec<f64> = out
            .par_chunks_mut(pv)
            .enumerate()
            .map(|(i, row)| {
                let lr_shift = aq[i] + ck;
                let top = lse[i].max(lr_shift);
                let (w1, w2) = ((lse[i] - top).exp(), (lr_shift - top).exp());
                let lri = &lr[i * (pv + 1)..][..pv + 1];
                let den = w1 + w2 * lri[pv];
                for (col, x) in row.iter_mut().enumerate() {
                    *x = (w1 * o_blk[i * pv + col] + w2 * lri[col]) / den;
                }
                den * top.exp()
            })
            .collect();
        Ok(Approximation {
            output: from_f64(out, (n, pv), dev, dt)?,
            normalizer: Some(Tensor::from_vec(den, n, dev)?.to_dtype(DType::F64)?),
            support: None,
        })
    }
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        let (m, c) = (features(d), cluster_size(n, d));
        let pairs: usize = array_split(n, c).iter().map(|r| r.len() * r.len()).sum();
        let (nf, mf, pf) = (n as f64, m as f64, p as f64);
        let hash = match self.support {
            Support::Smyrf => 2.0 * nf * (pf + 2.0),
            Support::Local => 0.0,
        };
        2.0 * nf * mf * pf
            + 2.0 * nf * mf * (pf + 1.0)
            + 2.0 * pf * pairs as f64
            + hash
            + (m.div_ceil(p) * p * p * p) as f64
    }
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(match self.support {
            Support::Smyrf => &SMYRF,
            Support::Local => &LOCAL,
        })
    }
    fn check(&self, n: usize, d: usize) -> std::result::Result<(), String> {
        let _ = n;
        if d < 2 {
            return Err(format!("{} needs d ≥ 2 (⌊d/2⌋ features)", self.id()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::sampling::hyperattention::tests::synthetic;
    use crate::attention::test_util::*;
    use rand::SeedableRng;

    /// The paper's dense formula in f64 with an n×n support mask (test only): Â = A on 𝒮 and
    /// φ(q̃_i)·φ(k̃_j) (unshifted, ε = 0) off 𝒮, Ô = diag(Â1)⁻¹ÂV; the support rebuilt here
    /// from the same draws (α, then Ω).
    fn dense_paper(h: &HeadInputs, d: usize, seed: u64, support: Support) -> Vec<Vec<f64>> {
        let [q, k, v] = host_rows(h);
        let (n, p) = (q.len(), q[0].len());
        let s = (p as f64).powf(-0.25);
        let qt: Vec<Vec<f64>> = q
            .iter()
            .map(|r| r.iter().map(|x| x * s).collect())
            .collect();
        let kt: Vec<Vec<f64>> = k
            .iter()
            .map(|r| r.iter().map(|x| x * s).collect())
            .collect();
        let mut rng = TrialRng::seed_from_u64(seed);
        let (qo, ko): (Vec<usize>, Vec<usize>) = match support {
            Support::Local => ((0..n).collect(), (0..n).collect()),
            Support::Smyrf => {
                let alpha = normal_values(&mut rng, p + 2, 1, 1.0);
                let nq: Vec<f64> = qt.iter().map(|r| r.iter().map(|x| x * x).sum()).collect();
                let nk: Vec<f64> = kt.iter().map(|r| r.iter().map(|x| x * x).sum()).collect();
                let big =
                    nq.iter().cloned().fold(0.0, f64::max) + nk.iter().cloned().fold(0.0, f64::max);
                let pq: Vec<f64> = (0..n)
                    .map(|i| {
                        (0..p).map(|c| qt[i][c] * alpha[c]).sum::<f64>()
                            + alpha[p + 1] * (big - nq[i]).sqrt()
                    })
                    .collect();
                let pk: Vec<f64> = (0..n)
                    .map(|j| {
                        (0..p).map(|c| kt[j][c] * alpha[c]).sum::<f64>()
                            + alpha[p] * (big - nk[j]).sqrt()
                    })
                    .collect();
                let mut a: Vec<usize> = (0..n).collect();
                a.sort_by(|&x, &y| pq[x].partial_cmp(&pq[y]).unwrap());
                let mut b: Vec<usize> = (0..n).collect();
                b.sort_by(|&x, &y| pk[x].partial_cmp(&pk[y]).unwrap());
                (a, b)
            }
        };
        let m = d / 2;
        let om = orthogonal_gaussian(&mut rng, m, p);
        let phi = |x: &[f64]| -> Vec<f64> {
            let hs: f64 = x.iter().map(|y| y * y).sum::<f64>() / 2.0;
            (0..m)
                .map(|r| {
                    ((0..p).map(|c| om[(r, c)] * x[c]).sum::<f64>() - hs).exp() / (m as f64).sqrt()
                })
                .collect()
        };
        let (pq, pk): (Vec<Vec<f64>>, Vec<Vec<f64>>) = (
            qt.iter().map(|r| phi(r)).collect(),
            kt.iter().map(|r| phi(r)).collect(),
        );
        // Group of each query and key (array_split of the orders), then the n×n mask.
        let mut gq = vec![0; n];
        let mut gk = vec![0; n];
        for (b, r) in array_split(n, d.min(n)).into_iter().enumerate() {
            r.clone().for_each(|t| gq[qo[t]] = b);
            r.for_each(|t| gk[ko[t]] = b);
        }
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        (0..n)
            .map(|i| {
                let terms = (0..n).map(|j| {
                    let a = if gq[i] == gk[j] {
                        dot(&qt[i], &kt[j]).exp()
                    } else {
                        dot(&pq[i], &pk[j])
                    };
                    (a, j)
                });
                weighted_mean_row(&v, terms)
            })
            .collect()
    }

    #[test]
    fn agrees_with_the_dense_paper_formula_in_f64() {
        for (n, d, support) in [
            (96, 16, Support::Smyrf),
            (100, 16, Support::Smyrf), // c ∤ n: array_split groups of 15 and 14... (7 groups)
            (100, 16, Support::Local),
            (64, 8, Support::Smyrf),
        ] {
            let h = synthetic(n, 8, 0.8, n as u64);
            let m = Scatterbrain { support };
            let got = run_seeded(&m, &h, d, 21).output.to_vec2::<f64>().unwrap();
            let want = dense_paper(&h, d, 21, support);
            assert_close_per_entry(&got, &want, 1e-9);
        }
    }

    #[test]
    fn covering_budget_is_exact_attention() {
        let h = synthetic(128, 16, 0.5, 1);
        for m in [Scatterbrain::smyrf(), Scatterbrain::local()] {
            for d in [128, 300] {
                let o = run_seeded(&m, &h, d, 2).output;
                assert!(exact_error(&h, &o) < 1e-12, "{} d = {d}", m.id());
            }
        }
    }

    #[test]
    fn array_split_matches_numpy() {
        let lens = |n, c| {
            array_split(n, c)
                .iter()
                .map(|r| r.len())
                .collect::<Vec<_>>()
        };
        assert_eq!(lens(100, 16), vec![15, 15, 14, 14, 14, 14, 14]);
        assert_eq!(lens(64, 16), vec![16; 4]);
        assert_eq!(lens(5, 8), vec![5]);
    }

    #[test]
    fn rows_of_weights_are_distributions_and_f32_is_finite() {
        let h = synthetic(96, 8, 1.0, 4);
        let m = Scatterbrain::smyrf();
        assert_rows_are_distributions(&weight_matrix(&m, &h, 16, 5), 1e-12);
        let h32 = in_f32(&synthetic(300, 16, 0.5, 6));
        let a = run_seeded(&m, &h32, 64, 1);
        assert_all_finite(&a.output);
        let den = to_vec_f64(a.normalizer.as_ref().unwrap()).unwrap();
        assert!(den.iter().all(|&x| x > 0.0));
    }

    #[test]
    fn seeded_and_reproducible() {
        let h = synthetic(256, 16, 0.5, 8);
        let a = assert_seed_determines_output(&Scatterbrain::smyrf(), &h, 16, 11);
        let e = exact_error(&h, &a.output);
        assert!((e - PINNED_ERR).abs() < 1e-9 * PINNED_ERR, "{e}");
        assert!(Scatterbrain::smyrf().check(512, 1).is_err());
    }
    const PINNED_ERR: f64 = 0.8105637339489735;

    /// §6.2 Evidence (n = 512, p = 64, entries 0.5·N(0, 1), 8 draws of an independent
    /// implementation): scatterbrain 3.22 / 2.84 at d = 16 / 32. Ours, 16 trials (4 heads × 4
    /// seeds): 3.75 / 2.56, within 25 % (the errors are heavy-tailed: s.e. ≈ 0.24 / 0.14 here, and
    /// ≈ 0.35 on the spec's 8 draws); the mean falls from d = 16 to 64 to 256 (1.68, 0.675). At
    /// d = 64 / 256 the spec's 2.22 / 0.893 lie 3σ above ours; the f64 dense paper formula
    /// agrees with the product to 1e-9 (docs/decisions.md).
    #[test]
    fn synthetic_errors_match_the_spec_and_fall_with_d() {
        let heads: Vec<HeadInputs> = (0..4).map(|s| synthetic(512, 64, 0.5, 100 + s)).collect();
        let m = Scatterbrain::smyrf();
        let mean = |d: usize| {
            let mut total = 0.0;
            for (hi, h) in heads.iter().enumerate() {
                for s in 0..4 {
                    total += exact_error(h, &run_seeded(&m, h, d, (10 * hi + s) as u64).output);
                }
            }
            total / 16.0
        };
        let (e16, e32, e64, e256) = (mean(16), mean(32), mean(64), mean(256));
        for (got, want) in [(e16, 3.22), (e32, 2.84)] {
            assert!((got / want - 1.0).abs() < 0.25, "{got} vs {want}");
        }
        assert!(e16 > e64 && e64 > e256, "{e16} {e64} {e256}");
    }

    #[test]
    fn cost_is_4ndp_plus_hash_and_qr() {
        let (n, p, d) = (4096, 64, 64);
        let (nf, pf, df) = (n as f64, p as f64, d as f64);
        let main = 4.0 * nf * df * pf + nf * df; // 2nmp + 2nm(p+1) + 2ncp, m = d/2, c = d
        assert_eq!(Scatterbrain::local().macs(n, p, d), main + pf.powi(3));
        assert_eq!(
            Scatterbrain::smyrf().macs(n, p, d),
            main + 2.0 * nf * (pf + 2.0) + pf.powi(3)
        );
    }
}
