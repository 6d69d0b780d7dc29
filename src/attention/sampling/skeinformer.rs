//! Skeinformer (Chen, Zeng, Hakkani-Tür, Jin, Ji, Yang, NAACL 2022; docs/reference.md §2.8): Algorithm 1 and
//! the ablations of Skeinformer Table 1.
//!
//! - Steps 1–2: pilot rows J (uniform, with replacement) and their exact attention rows B_J.
//! - Steps 3–4: column probabilities p̂_i ∝ ‖B_J[:,i]‖₂·‖v_i‖₂ (paper Eq. (5), the estimated optimal
//!   sampling probabilities of Prop. 1), d distinct columns J' drawn successively without replacement,
//!   unweighted ([P≠C]: Prop. 1 analyses the reweighted with-replacement sketch; Alg. 1 and the code do not reweight).
//! - Steps 5–9: adaptive row normalisation (paper Eq. (6)): the unselected entries of each row are filled
//!   with the geometric mean of its selected entries, δ_i = Σ_k A'_ik + (n − d)·g_i, R = δ⁻¹(A'V_{J'} + g·uᵀ).
//! - Step 10: pilot-sampling reutilisation, R[J,:] = B_J V.
//!
//! Stability (docs/reference.md §2.8 [REC]): row i is shifted by c_i = max_k L_ik before steps 5–6; A', g and δ
//! all scale by e^{−c_i}, so R is unchanged. The returned normalizer is that shifted δ (its sign is δ's).
//!
//! d is both the pilot size and the number of sampled columns, capped at n − 1 as the reference does
//! (min(d, m − 1)); every variant uses the capped d.

use anyhow::Result;
use candle_core::{Tensor, D};

use super::informer::replace_rows;
use crate::attention::{Approximation, Family, HeadInputs, Method, MethodInfo};
use crate::numerics::sampling::{
    uniform_with_replacement, uniform_without_replacement, weighted_without_replacement, TrialRng,
};
use crate::tensor_util::{index_tensor, to_vec_f64};

/// Skeinformer and its Table 1 ablations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkeinVariant {
    /// `skeinformer`: Algorithm 1, steps 1–10.
    Full,
    /// `skein_uniform` ("w/o column sampling"): no pilot, J' uniform without replacement, steps 5–9.
    Uniform,
    /// `skein_nonorm` ("w/o row normalisation"): steps 1–5, then R = D⁻¹A'V_{J'} with the exact D.
    NoNorm,
    /// `skein_simplenorm` ("w/ simple row normalisation"): steps 1–5, then R = rowsoftmax(L)·V_{J'}.
    SimpleNorm,
    /// `skein_nopilot` ("w/o pilot sampling reutilisation"): steps 1–9.
    NoPilot,
}

pub struct Skeinformer {
    pub variant: SkeinVariant,
}

impl Skeinformer {
    pub fn new(variant: SkeinVariant) -> Self {
        Self { variant }
    }
}

/// How the rows built from the sampled columns are normalised (what follows step 5).
#[derive(Clone, Copy)]
pub enum RowNorm<'a> {
    /// Steps 6–9: geometric-mean fill of the unselected columns and adaptive normalisation.
    Adaptive,
    /// Normalise over the selected columns only: rowsoftmax(L)·V_{J'}.
    Simple,
    /// Divide by the exact D, given as log D ([n]): R = exp(L − log D)·V_{J'}.
    Exact(&'a Tensor),
}

/// d actually used: min(d, n − 1) (reference cap).
pub fn effective_d(n: usize, d: usize) -> usize {
    d.min(n.saturating_sub(1))
}

/// Step 3: w_i = ‖B_J[:,i]‖₂ · ‖v_i‖₂ for pilot rows B_J ([d, n]).
pub fn column_weights(b: &Tensor, v: &Tensor) -> Result<Vec<f64>> {
    let col = b.sqr()?.sum(0)?.sqrt()?; // [n]
    let vn = v.sqr()?.sum(1)?.sqrt()?; // [n]
    to_vec_f64(&(col * vn)?)
}

/// Steps 5–9 (or the ablation's normalisation) for the selected columns `cols` (distinct).
/// Returns R ([n, p]) and the normaliser ([n], shifted by e^{−c_i}) where the method has one.
pub fn rows_from_columns(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cols: &[usize],
    norm: RowNorm,
) -> Result<(Tensor, Option<Tensor>)> {
    let (n, p) = q.dims2()?;
    let d = cols.len();
    let idx = index_tensor(cols, q.device())?;
    let (kj, vj) = (k.index_select(&idx, 0)?, v.index_select(&idx, 0)?);
    let l = (q.matmul(&kj.t()?)? / (p as f64).sqrt())?; // step 5: L = Q K_{J'}ᵀ/√p, [n, d]
    if let RowNorm::Exact(log_rowsum) = norm {
        // exp(L − log D) ≤ 1: overflow-free without a further shift.
        let a = l.broadcast_sub(&log_rowsum.unsqueeze(1)?)?.exp()?;
        return Ok((a.matmul(&vj)?, None));
    }
    let ls = l.broadcast_sub(&l.max_keepdim(D::Minus1)?)?; // L − c_i
    let a = ls.exp()?; // A'·e^{−c_i}
    let sum_a = a.sum_keepdim(D::Minus1)?; // [n, 1]
    let av = a.matmul(&vj)?; // [n, p]
    let (num, delta) = match norm {
        RowNorm::Simple => (av, sum_a),
        _ => {
            let g = ls.mean_keepdim(D::Minus1)?.exp()?; // step 6: geometric mean, [n, 1]
            let delta = (sum_a + (g.clone() * (n - d) as f64)?)?; // step 7
                                                                  // Step 8: u = Σ_{j∉J'} v_j, summed directly over the complement (no cancellation).
            let mut selected = vec![false; n];
            cols.iter().for_each(|&j| selected[j] = true);
            let rest: Vec<usize> = (0..n).filter(|&j| !selected[j]).collect();
            let u = if rest.is_empty() {
                v.narrow(0, 0, 1)?.zeros_like()?
            } else {
                v.index_select(&index_tensor(&rest, v.device())?, 0)?
                    .sum_keepdim(0)? // [1, p]
            };
            (av.add(&g.broadcast_mul(&u)?)?, delta) // step 9 numerator
        }
    };
    let r = num.broadcast_div(&delta)?;
    Ok((r, Some(delta.squeeze(1)?)))
}

/// One run with its random draws exposed (for tests and diagnostics).
pub struct SkeinRun {
    pub output: Tensor,
    pub normalizer: Option<Tensor>,
    /// Pilot rows J (with repeats), if the variant has a pilot.
    pub pilot: Option<Vec<usize>>,
    /// Selected columns J'.
    pub cols: Vec<usize>,
}

impl Skeinformer {
    /// Runs the variant with d features (capped at n − 1) on q, k, v; `log_rowsum` (log D) is used by NoNorm only.
    pub fn run(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        log_rowsum: &Tensor,
        d: usize,
        rng: &mut TrialRng,
    ) -> Result<SkeinRun> {
        let n = q.dims2()?.0;
        let d = effective_d(n, d);
        if self.variant == SkeinVariant::Uniform {
            let cols = uniform_without_replacement(rng, n, d);
            let (output, normalizer) = rows_from_columns(q, k, v, &cols, RowNorm::Adaptive)?;
            return Ok(SkeinRun {
                output,
                normalizer,
                pilot: None,
                cols,
            });
        }
        let pilot = uniform_with_replacement(rng, n, d); // step 1
        let qj = q.index_select(&index_tensor(&pilot, q.device())?, 0)?;
        let p = q.dims2()?.1;
        let b = crate::attention::row_softmax(&(qj.matmul(&k.t()?)? / (p as f64).sqrt())?)?; // step 2, [d, n]
        let w = column_weights(&b, v)?; // step 3
        let cols = weighted_without_replacement(rng, &w, d); // step 4
        let norm = match self.variant {
            SkeinVariant::NoNorm => RowNorm::Exact(log_rowsum),
            SkeinVariant::SimpleNorm => RowNorm::Simple,
            _ => RowNorm::Adaptive,
        };
        let (mut output, normalizer) = rows_from_columns(q, k, v, &cols, norm)?;
        if self.variant == SkeinVariant::Full {
            output = replace_rows(&output, &pilot, &b.matmul(v)?)?; // step 10: R[J,:] = B_J V
        }
        Ok(SkeinRun {
            output,
            normalizer,
            pilot: Some(pilot),
            cols,
        })
    }
}

const FULL: MethodInfo = MethodInfo {
    id: "skeinformer",
    family: Family::Sampling,
    meaning: "pilot rows = importance-sampled columns = min(d, n − 1)",
    random: true,
    ..MethodInfo::BASE
};
const UNIFORM: MethodInfo = MethodInfo {
    id: "skein_uniform",
    family: Family::Sampling,
    meaning: "uniformly sampled columns (no pilot), capped at n − 1",
    random: true,
    ..MethodInfo::BASE
};
const NO_NORM: MethodInfo = MethodInfo {
    id: "skein_nonorm",
    family: Family::Sampling,
    meaning: "pilot rows = importance-sampled columns = min(d, n − 1)",
    random: true,
    ..MethodInfo::BASE
};
const SIMPLE_NORM: MethodInfo = MethodInfo {
    id: "skein_simplenorm",
    family: Family::Sampling,
    meaning: "pilot rows = importance-sampled columns = min(d, n − 1)",
    random: true,
    ..MethodInfo::BASE
};
const NO_PILOT: MethodInfo = MethodInfo {
    id: "skein_nopilot",
    family: Family::Sampling,
    meaning: "pilot rows = importance-sampled columns = min(d, n − 1)",
    random: true,
    ..MethodInfo::BASE
};

impl Method for Skeinformer {
    fn approximate(
        &self,
        head: &HeadInputs,
        d: usize,
        rng: &mut TrialRng,
    ) -> Result<Approximation> {
        self.check(head.n(), d).map_err(anyhow::Error::msg)?;
        // log D costs a pass over QKᵀ: computed (once per head) only for the variant that needs it.
        let log_rowsum = if self.variant == SkeinVariant::NoNorm {
            head.exact()?.log_rowsum()?.clone()
        } else {
            Tensor::zeros(0, head.dtype(), head.device())?
        };
        let run = self.run(&head.q, &head.k, &head.v, &log_rowsum, d, rng)?;
        Ok(Approximation {
            output: run.output,
            normalizer: run.normalizer,
            support: None,
        })
    }
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        let ndp = (n * effective_d(n, d) * p) as f64;
        match self.variant {
            // Q_J Kᵀ, B_J V, Q K_{J'}ᵀ, A'V_{J'} (docs/reference.md §2.11: 4ndp + O(nd)).
            SkeinVariant::Full => 4.0 * ndp,
            // No B_J V.
            SkeinVariant::NoPilot | SkeinVariant::SimpleNorm => 3.0 * ndp,
            // Plus the exact D, n²p.
            SkeinVariant::NoNorm => 3.0 * ndp + (n * n * p) as f64,
            // No pilot at all.
            SkeinVariant::Uniform => 2.0 * ndp,
        }
    }
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(match self.variant {
            SkeinVariant::Full => &FULL,
            SkeinVariant::Uniform => &UNIFORM,
            SkeinVariant::NoNorm => &NO_NORM,
            SkeinVariant::SimpleNorm => &SIMPLE_NORM,
            SkeinVariant::NoPilot => &NO_PILOT,
        })
    }
    fn check(&self, n: usize, d: usize) -> std::result::Result<(), String> {
        if d == 0 {
            return Err("d must be at least 1".into());
        }
        if n < 2 {
            return Err(format!(
                "{} needs n ≥ 2 (d is capped at n − 1), got n = {n}",
                self.id()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "skeinformer_tests.rs"]
mod tests;
