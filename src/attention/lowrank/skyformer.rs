//! Skyformer, Figure-1 variant: the modified Nyström method applied to the raw score matrix
//! A = exp(QKᵀ/√p) (Chen et al., NeurIPS 2021; docs/reference.md §2.3).
//!
//! X = [Q̃; K̃] (2n×p), Ā = exp(XXᵀ) is PSD (Lemma 1) and A is its upper-right block.
//! // Eq. (5): Ā̃ = ĀS (SᵀĀS)^† SᵀĀ, Ã = (I, 0) Ā̃ (0, I)ᵀ.
//! // Fig. 1 caption: D̂ = Ã1 ("first approximate A, and then approximate D"), Ô = diag(D̂)⁻¹ÃV.
//! With F = exp(Q̃Zᵀ), G = exp(K̃Zᵀ), M = exp(ZZᵀ) for the d landmark rows Z of X:
//! num = F·(W·(GᵀV)), den = F·(W·(Gᵀ1)), Ô = diag(den)⁻¹ num; Ã (n×n) is never formed.
//!
//! Two ids:
//! - `skyformer`: W = M^† (paper Eq. (5)), a float64 symmetric-eigen pseudo-inverse with
//!   eigenvalues below 1e-10·λ_max dropped, no γ (docs/reference.md §2.3 [REC]).
//! - `skyformer_iter`: the reference code path, W = D_δ^{-1/2}·IterInv(N, 6)·D_δ^{-1/2} with
//!   Mγ = M + 0.1·I, δ = Mγ1, N = D_δ^{-1/2} Mγ D_δ^{-1/2} (Razavi et al. 2014 iteration).
//!
//! Landmarks (docs/reference.md §2.3 [P≠C] sampling, follow the code): ⌈d/2⌉ rows of Q̃ and ⌊d/2⌋
//! rows of K̃, each iid uniform with replacement (stratified). For odd d the extra landmark comes
//! from Q (the spec only defines even d). The 0/1 selection is used (no 1/√d column scaling).
//!
//! Numerics: everything is computed in float64 whatever the input dtype. No per-row shift is
//! possible (Ā has no row invariance), so one global scalar c = max of all logits of F, G and M
//! is subtracted before exp: F, G, M all scale by e^{-c}, so F M^† Gᵀ scales by e^{-c} and the
//! ratio num/den is unchanged. For the iterative path γ is scaled by e^{-c} too, so that
//! (M + γI) is exactly the unshifted matrix times e^{-c} (the D_M scaling and the iteration are
//! scale-equivariant). c ≥ 0 always (M's diagonal is ‖z‖² ≥ 0), so e^{-c} never overflows.
//! The normalizer den is returned unclamped (rows with den ≤ 0 are counted by the caller).

use anyhow::Result;
use candle_core::{DType, Tensor, D};

use crate::attention::{
    Approximation, Family, HeadBatch, HeadInputs, HeadTrials, Method, MethodInfo,
};
use crate::numerics::inverse::{iterative_inverse, symmetric_pinv_tensor, PINV_REL_CUTOFF};
use crate::numerics::sampling::{rng_from_seed, uniform_with_replacement, TrialRng};
use crate::numerics::shifted_exp::exp_minus_each;
use crate::tensor_util::{index_tensor, to_vec_f64};

/// Ridge of the reference code path (`skyformer_iter`), docs/reference.md §2.3.
pub const GAMMA: f64 = 0.1;
/// Iterations of the Razavi et al. inverse in the code path.
pub const ITER_STEPS: usize = 6;

pub struct Skyformer {
    pub iterative: bool,
}

impl Skyformer {
    /// `skyformer`: paper Eq. (5) with the Moore–Penrose pseudo-inverse.
    pub fn pseudo_inverse() -> Self {
        Self { iterative: false }
    }
    /// `skyformer_iter`: the reference code path (γ = 0.1, D_M scaling, 6 iterations).
    pub fn iterative() -> Self {
        Self { iterative: true }
    }
}

/// The core inverse W ≈ M^{-1} used between F and Gᵀ.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum CoreInverse {
    /// Pseudo-inverse with eigenvalue cut-off `PINV_REL_CUTOFF`·λ_max.
    Pinv,
    /// (M + γI)⁻¹ by the D_M-normalised iterative inverse with the given steps.
    Iterative { gamma: f64, steps: usize },
}

impl CoreInverse {
    /// The paper's iterative inverse (γ = GAMMA, ITER_STEPS steps) or the pseudo-inverse: the
    /// core of the `_iter` variants and of the others.
    pub(crate) fn of_variant(iterative: bool) -> Self {
        if iterative {
            CoreInverse::Iterative {
                gamma: GAMMA,
                steps: ITER_STEPS,
            }
        } else {
            CoreInverse::Pinv
        }
    }
}

/// Landmark rows: ⌈d/2⌉ from Q̃, ⌊d/2⌋ from K̃, iid uniform with replacement (Q indices drawn first).
pub(crate) fn draw_landmarks(rng: &mut TrialRng, n: usize, d: usize) -> (Vec<usize>, Vec<usize>) {
    let iq = uniform_with_replacement(rng, n, d.div_ceil(2));
    let ik = uniform_with_replacement(rng, n, d / 2);
    (iq, ik)
}

/// The per-head operands in float64, built once and shared by every d and trial (and by both
/// ids, and by the Gaussian-kernel variants of `skyformer_gauss`): Q̃ = Q/p^¼, K̃ = K/p^¼, their
/// ‖x̃‖²/2 and [V, 1] (numerator and denominator share every product).
pub(crate) struct Operands {
    qt: Tensor,
    kt: Tensor,
    q_half_sq: Tensor,
    k_half_sq: Tensor,
    rhs: Tensor,
}

impl Operands {
    /// From one head's q, k, v ([n, p]) or a batch of heads' ([B, n, p]).
    pub(crate) fn new(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Self> {
        let p = q.dim(D::Minus1)?;
        let s = (p as f64).powf(-0.25);
        let v64 = v.to_dtype(DType::F64)?;
        let ones = v64.narrow(D::Minus1, 0, 1)?.ones_like()?;
        let qt = (q.to_dtype(DType::F64)? * s)?;
        let kt = (k.to_dtype(DType::F64)? * s)?;
        Ok(Self {
            q_half_sq: half_sq_norms(&qt)?,
            k_half_sq: half_sq_norms(&kt)?,
            qt,
            kt,
            rhs: Tensor::cat(&[v64, ones], D::Minus1)?, // n×(p+1)
        })
    }

    /// The head's operands from its memo.
    pub(crate) fn of(head: &HeadInputs) -> Result<std::sync::Arc<Self>> {
        head.memo("skyformer_operands", || {
            Self::new(&head.q, &head.k, &head.v)
        })
    }

    /// The batch's operands ([B, n, ·]) from its memo.
    pub(crate) fn of_batch(batch: &HeadBatch) -> Result<std::sync::Arc<Self>> {
        batch.memo.get_or_compute("skyformer_operands", || {
            Self::new(&batch.q, &batch.k, &batch.v)
        })
    }
}

/// ‖x_i‖²/2 (n×1).
fn half_sq_norms(x: &Tensor) -> Result<Tensor> {
    Ok((x.sqr()?.sum_keepdim(D::Minus1)? * 0.5)?)
}

/// Which kernel of the 2n×2n completion the core approximates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum CoreKernel {
    /// The softmax kernel exp(x·y) of Ā (Figure-1 Skyformer, §2.3): one global shift c of every
    /// logit (it cancels in num/den), output num/den.
    Softmax,
    /// The Gaussian kernel κ(x, y) = exp(x·y − ‖x‖²/2 − ‖y‖²/2) of C (§6.4.2): every entry lies
    /// in (0, 1], so no shift; output the numerator C̃V, unnormalised.
    Gaussian,
}

/// For the landmarks Q̃[iq] and K̃[ik]: Ô (f64, n×p) and den = Ã1 (f64, n) under
/// `CoreKernel::Softmax`; C̃V (f64, n×p) and C̃1 under `CoreKernel::Gaussian`.
pub(crate) fn skyformer_core(
    ops: &Operands,
    iq: &[usize],
    ik: &[usize],
    inverse: CoreInverse,
    kernel: CoreKernel,
) -> Result<(Tensor, Tensor)> {
    let dev = ops.qt.device();
    let mut parts = Vec::with_capacity(2);
    if !iq.is_empty() {
        parts.push(ops.qt.index_select(&index_tensor(iq, dev)?, 0)?);
    }
    if !ik.is_empty() {
        parts.push(ops.kt.index_select(&index_tensor(ik, dev)?, 0)?);
    }
    anyhow::ensure!(!parts.is_empty(), "skyformer needs at least one landmark");
    core_products(ops, &Tensor::cat(&parts, 0)?, inverse, kernel)
}

/// [`skyformer_core`] for a batch of heads: operands [B, n, ·], head b's landmarks
/// `landmarks[b]` (the same count for every head); Ô or C̃V [B, n, p] and the normaliser [B, n].
pub(crate) fn skyformer_core_heads(
    ops: &Operands,
    landmarks: &[(Vec<usize>, Vec<usize>)],
    inverse: CoreInverse,
    kernel: CoreKernel,
) -> Result<(Tensor, Tensor)> {
    let (b, n, p) = ops.qt.dims3()?;
    // Landmark rows of X = [Q̃; K̃] per head, gathered from the flattened [B·2n, p] in one go.
    let rows: Vec<Vec<usize>> = landmarks
        .iter()
        .map(|(iq, ik)| {
            iq.iter()
                .copied()
                .chain(ik.iter().map(|&j| n + j))
                .collect()
        })
        .collect();
    let d = rows.first().map_or(0, Vec::len);
    anyhow::ensure!(d > 0, "skyformer needs at least one landmark");
    anyhow::ensure!(
        rows.iter().all(|r| r.len() == d),
        "every head of a batch has the same landmark count"
    );
    let x = Tensor::cat(&[&ops.qt, &ops.kt], 1)?.reshape((b * 2 * n, p))?;
    let idx = HeadBatch::flat_index(&rows, 2 * n, x.device())?;
    let z = x.index_select(&idx, 0)?.reshape((b, d, p))?;
    core_products(ops, &z, inverse, kernel)
}

/// The products after the landmarks z ([d, p], or [B, d, p] for a batch of heads; see the module
/// comment), each head with its own shift c.
fn core_products(
    ops: &Operands,
    z: &Tensor,
    inverse: CoreInverse,
    kernel: CoreKernel,
) -> Result<(Tensor, Tensor)> {
    let Operands {
        qt,
        kt,
        q_half_sq,
        k_half_sq,
        rhs,
    } = ops;
    let p = rhs.dim(D::Minus1)? - 1;
    let dev = qt.device();
    let d = z.dim(D::Minus2)?;
    let zt = z.t()?.contiguous()?;

    let mut lf = qt.matmul(&zt)?; // n×d logits of F
    let mut lg = kt.matmul(&zt)?; // n×d logits of G
    let mut lm = z.matmul(&zt)?; // d×d logits of M
                                 // One shift per head: the largest logit of its F, G and M.
    let c: Vec<f64> = match kernel {
        CoreKernel::Softmax => {
            let gmax = |t: &Tensor| -> Result<Tensor> {
                Ok(t.max_keepdim(D::Minus1)?.max_keepdim(D::Minus2)?)
            };
            to_vec_f64(&gmax(&lf)?.maximum(&gmax(&lg)?)?.maximum(&gmax(&lm)?)?)?
        }
        CoreKernel::Gaussian => {
            // x·z − ‖x‖²/2 − ‖z‖²/2 = −‖x − z‖²/2 ≤ 0: nothing to shift.
            let z_half = half_sq_norms(z)?.t()?; // 1×d
            let with_norms = |l: Tensor, rows: &Tensor| -> Result<Tensor> {
                Ok(l.broadcast_sub(rows)?.broadcast_sub(&z_half)?)
            };
            lf = with_norms(lf, q_half_sq)?;
            lg = with_norms(lg, k_half_sq)?;
            lm = with_norms(lm, &z_half.t()?)?;
            vec![0.0; c_count(z)?]
        }
    };
    // In place over the fresh logits (one matrix): the same bits as (logits − c).exp().
    let f = exp_minus_each(lf, &c)?;
    let g = exp_minus_each(lg, &c)?;
    let m = exp_minus_each(lm, &c)?;

    let w = match inverse {
        CoreInverse::Pinv => {
            if m.rank() == 2 {
                symmetric_pinv_tensor(&m, PINV_REL_CUTOFF)?
            } else {
                symmetric_pinv_heads(&m, PINV_REL_CUTOFF)?
            }
        }
        CoreInverse::Iterative { gamma, steps } => {
            // γ on the e^{-c} scale of the shifted M (see the module comment), per head.
            let ridge: Vec<f64> = c.iter().map(|c| gamma * (-c).exp()).collect();
            let ridge = Tensor::from_vec(ridge, per_head_shape(z)?, dev)?;
            let eye = Tensor::eye(d, DType::F64, dev)?;
            let mg = (&m + eye.broadcast_mul(&ridge)?)?;
            let inv_sqrt = mg.sum_keepdim(D::Minus1)?.sqrt()?.recip()?; // d×1, δ^{-1/2}
            let scale = |t: &Tensor| -> Result<Tensor> {
                Ok(t.broadcast_mul(&inv_sqrt)?.broadcast_mul(&inv_sqrt.t()?)?)
            };
            let nmat = scale(&mg)?;
            scale(&iterative_inverse(&nmat, steps)?)?
        }
    };

    let gtr = g.t()?.matmul(rhs)?; // d×(p+1)
    let fr = f.matmul(&w.matmul(&gtr)?)?; // n×(p+1)
    let num = fr.narrow(D::Minus1, 0, p)?;
    let den = fr.narrow(D::Minus1, p, 1)?;
    let out = match kernel {
        CoreKernel::Softmax => num.broadcast_div(&den)?,
        CoreKernel::Gaussian => num.contiguous()?,
    };
    Ok((out, den.squeeze(D::Minus1)?))
}

/// How many heads z ([d, p] or [B, d, p]) holds.
fn c_count(z: &Tensor) -> Result<usize> {
    Ok(if z.rank() == 3 { z.dim(0)? } else { 1 })
}

/// The shape of one value per head that broadcasts over a head's d×d matrix.
fn per_head_shape(z: &Tensor) -> Result<Vec<usize>> {
    Ok(if z.rank() == 3 {
        vec![z.dim(0)?, 1, 1]
    } else {
        vec![1, 1]
    })
}

/// [`symmetric_pinv_tensor`] for each matrix of [B, d, d]: one copy to the host, the B
/// eigen-decompositions on the host's threads (faer's solver: 3× nalgebra's at d = 256, the
/// semantics of [`crate::numerics::inverse::symmetric_pinv`] to rounding), one copy back. The device path's batches only:
/// the per-head CPU path keeps nalgebra, so its rows do not move.
fn symmetric_pinv_heads(m: &Tensor, rel_cutoff: f64) -> Result<Tensor> {
    let (b, d, _) = m.dims3()?;
    let host = to_vec_f64(m)?;
    let heads: Vec<usize> = (0..b).collect();
    let inv = crate::runtime::host_map(&heads, |&i| {
        crate::numerics::inverse::symmetric_pinv_faer(
            &host[i * d * d..(i + 1) * d * d],
            d,
            rel_cutoff,
        )
    });
    let mut flat = Vec::with_capacity(b * d * d);
    for w in inv {
        flat.extend(w?);
    }
    Ok(Tensor::from_vec(flat, (b, d, d), m.device())?)
}

const SKYFORMER: MethodInfo = MethodInfo {
    id: "skyformer",
    family: Family::LowRank,
    meaning: "total landmarks of the 2n×2n completion: ⌈d/2⌉ rows of Q̃ and ⌊d/2⌋ rows of K̃, uniform with replacement",
    random: true,
    ..MethodInfo::BASE
};
const SKYFORMER_ITER: MethodInfo = MethodInfo {
    id: "skyformer_iter",
    family: Family::LowRank,
    meaning: "total landmarks of the 2n×2n completion: ⌈d/2⌉ rows of Q̃ and ⌊d/2⌋ rows of K̃, uniform with replacement",
    random: true,
    ..MethodInfo::BASE
};

impl Method for Skyformer {
    fn approximate(
        &self,
        head: &HeadInputs,
        d: usize,
        rng: &mut TrialRng,
    ) -> Result<Approximation> {
        let (iq, ik) = draw_landmarks(rng, head.n(), d);
        let inverse = CoreInverse::of_variant(self.iterative);
        let (out, den) = skyformer_core(
            &*Operands::of(head)?,
            &iq,
            &ik,
            inverse,
            CoreKernel::Softmax,
        )?;
        Ok(Approximation {
            output: out.to_dtype(head.dtype())?,
            normalizer: Some(den),
            support: None,
        })
    }
    /// The heads' landmarks from their own seeds, then every product batched over heads (the
    /// pseudo-inverses' eigen-decompositions on the host's threads).
    fn approximate_heads(&self, trials: &HeadTrials) -> Result<Vec<Approximation>> {
        let (batch, d, seeds) = (trials.batch, trials.d, trials.seeds);
        let n = batch.n();
        let landmarks: Vec<_> = seeds
            .iter()
            .map(|&s| draw_landmarks(&mut rng_from_seed(s), n, d))
            .collect();
        let inverse = CoreInverse::of_variant(self.iterative);
        let (out, den) = skyformer_core_heads(
            &*Operands::of_batch(batch)?,
            &landmarks,
            inverse,
            CoreKernel::Softmax,
        )?;
        trials.per_head(&out.to_dtype(batch.dtype())?, Some(&den))
    }
    /// docs/reference.md §2.11: 4ndp + 24d³ (the table's one formula for both inverses; the
    /// pseudo-inverse's eigendecomposition is also O(d³)).
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        let (n, p, d) = (n as f64, p as f64, d as f64);
        4.0 * n * d * p + 24.0 * d * d * d
    }
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(if self.iterative {
            &SKYFORMER_ITER
        } else {
            &SKYFORMER
        })
    }
}

#[cfg(test)]
#[path = "skyformer_tests.rs"]
pub(crate) mod tests;
