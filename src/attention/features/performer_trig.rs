//! `performer_trig`: trigonometric random features of the softmax kernel — FAVOR's "SM_trig"
//! (Choromanski et al., ICLR 2021, §2.3 Eq. (5) with h(x) = exp(‖x‖²/2), f₁ = sin, f₂ = cos;
//! docs/reference.md §6.2.1). From exp(x·y) = e^{‖x‖²/2} e^{‖y‖²/2} exp(−‖x−y‖²/2) and
//! exp(−‖x−y‖²/2) = E_ω[cos ω·(x−y)], ω ~ N(0, I_p):
//!
//!   φ(x) = m^{-1/2} e^{‖x‖²/2} [cos(Ωx), sin(Ωx)] ∈ ℝ^{2m},   x̃ = x·p^{-1/4} (once),
//!   Ô = diag(φ(Q̃)(φ(K̃)ᵀ1))⁻¹ φ(Q̃)(φ(K̃)ᵀV).
//!
//! Ω = Ω(m) is FAVOR+'s orthogonal random matrix (⌈m/p⌉ QR blocks, χ_p row lengths; shared with
//! `performer`), fresh per trial.
//!
//! What d means: the feature dimension 2m, i.e. m = ⌊d/2⌋ frequencies, each giving a cos and a
//! sin column (upstream's `nb_features` counts frequencies, so its "256 features" are 512
//! columns). d odd uses ⌊d/2⌋ (dimension d − 1); d < 2 is refused.
//!
//! Stability: the query factor e^{‖q̃‖²/2} and m^{-1/2} cancel in num/den and are dropped. The key
//! factor becomes e^{‖k̃_j‖²/2 − max_j ‖k̃_j‖²/2} (one global shift, which cancels); no other
//! shift exists, since cos and sin are bounded.
//!
//! Known failure, kept (§6.2.1): φ(q)·φ(k) has no sign, so D̂_i = φ(q̃_i)·Σ_j φ(k̃_j) can be ≤ 0 or
//! ≈ 0. No ε, no clamp, no guard (upstream nudges R ≤ 1e-6 by 2e-6, §6.2.1 [P≠C] (c)); D̂ is
//! returned so that rows with D̂ ≤ 0 are counted.
//!
//! Cost: Q̃Ωᵀ and K̃Ωᵀ 2nmp, φ(K̃)ᵀ[V 1] and φ(Q̃)(·) 2·n·2m·p → 6nmp = 3ndp (d even), plus
//! ⌈m/p⌉p³ for Ω's QR blocks (the n·2m sin/cos are not MACs). Below FAVOR+'s 4ndp: at equal
//! feature dimension only d/2 projections are needed.

use anyhow::Result;
use candle_core::{DType, Tensor, D};

use super::performer::orthogonal_gaussian;
use crate::attention::{Approximation, Family, HeadInputs, Method, MethodInfo};
use crate::numerics::sampling::TrialRng;
use crate::tensor_util::from_dmatrix;

pub struct PerformerTrig;

/// m = ⌊d/2⌋ frequencies.
pub fn frequencies(d: usize) -> usize {
    d / 2
}

/// Multiply-adds of trigonometric features of dimension d (shared with `rff_gauss`): projections
/// 2nmp, then φ(K̃)ᵀ[V …] and φ(Q̃)(·) 2·n·2m·p → 6nmp = 3ndp, plus ⌈m/p⌉p³ for Ω's QR blocks.
pub(crate) fn trig_macs(n: usize, p: usize, d: usize) -> f64 {
    let m = frequencies(d);
    6.0 * (n * m * p) as f64 + (m.div_ceil(p) * p * p * p) as f64
}

/// Trigonometric features need one sin/cos pair: d ≥ 2.
pub(crate) fn check_trig(id: &str, d: usize) -> std::result::Result<(), String> {
    if d < 2 {
        return Err(format!("{id} needs d ≥ 2 (one sin/cos frequency pair)"));
    }
    Ok(())
}

/// Per head, independent of Ω: Q̃, K̃ (scaled by p^{-1/4}), the key weights
/// e^{‖k̃_j‖²/2 − max_j ‖k̃_j‖²/2} ([n, 1]) and [V, 1].
struct Operands {
    qt: Tensor,
    kt: Tensor,
    key_weight: Tensor,
    rhs: Tensor,
}

impl Operands {
    fn of(head: &HeadInputs) -> Result<std::sync::Arc<Self>> {
        head.memo("performer_trig_operands", || {
            let s = (head.p() as f64).powf(-0.25);
            let (qt, kt) = ((&head.q * s)?, (&head.k * s)?);
            let half_sq = (kt.sqr()?.sum_keepdim(D::Minus1)? * 0.5)?;
            let key_weight = half_sq.broadcast_sub(&half_sq.max_keepdim(0)?)?.exp()?;
            let ones = Tensor::ones((head.n(), 1), head.dtype(), head.device())?;
            Ok(Self {
                qt,
                kt,
                key_weight,
                rhs: Tensor::cat(&[head.v.clone(), ones], 1)?,
            })
        })
    }
}

/// [cos(x̃Ωᵀ), sin(x̃Ωᵀ)] ([n, 2m]) for Ω ([m, p]).
pub(crate) fn trig_features(xt: &Tensor, omega: &Tensor) -> Result<Tensor> {
    let proj = xt.matmul(&omega.t()?)?;
    Ok(Tensor::cat(&[proj.cos()?, proj.sin()?], 1)?)
}

/// (Ô, D̂) for a given Ω: the factors that cancel are dropped (see the module comment).
fn with_omega(ops: &Operands, omega: &Tensor) -> Result<(Tensor, Tensor)> {
    let p = ops.rhs.dim(1)? - 1;
    let phi_q = trig_features(&ops.qt, omega)?; // n×2m
    let phi_k = trig_features(&ops.kt, omega)?.broadcast_mul(&ops.key_weight)?; // n×2m
    let fr = phi_q.matmul(&phi_k.t()?.matmul(&ops.rhs)?)?; // n×(p+1)
    let den = fr.narrow(1, p, 1)?;
    let out = fr.narrow(1, 0, p)?.broadcast_div(&den)?;
    Ok((out, den.squeeze(1)?.to_dtype(DType::F64)?))
}

const PERFORMER_TRIG: MethodInfo = MethodInfo {
    id: "performer_trig",
    family: Family::Features,
    meaning: "feature dimension: ⌊d/2⌋ orthogonal random frequencies, each a cos and a sin column (trigonometric softmax features)",
    random: true,
    ..MethodInfo::BASE
};

impl Method for PerformerTrig {
    fn approximate(
        &self,
        head: &HeadInputs,
        d: usize,
        rng: &mut TrialRng,
    ) -> Result<Approximation> {
        self.check(head.n(), d).map_err(anyhow::Error::msg)?;
        let omega = orthogonal_gaussian(rng, frequencies(d), head.p());
        let omega = from_dmatrix(&omega, head.device(), head.dtype())?;
        let (output, den) = with_omega(&*Operands::of(head)?, &omega)?;
        Ok(Approximation {
            output,
            normalizer: Some(den),
            support: None,
        })
    }
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        trig_macs(n, p, d)
    }
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(&PERFORMER_TRIG)
    }
    fn check(&self, _n: usize, d: usize) -> std::result::Result<(), String> {
        check_trig(self.id(), d)
    }
}

#[cfg(test)]
mod tests;
