//! Performer, FAVOR+ with positive orthogonal random features (Choromanski et al., ICLR 2021;
//! docs/reference.md §2.5), as in performer-pytorch's `softmax_kernel` + `linear_attention`.
//!
//! // Lemma 1 / Eq. (7): exp(x·y) = E_ω[exp(ω·x − ‖x‖²/2)·exp(ω·y − ‖y‖²/2)], ω ~ N(0, I_p)
//! // §2.4 (ORF): the rows of Ω are orthogonal within p×p blocks, each marginally N(0, I_p)
//! φ(x̃) = m^{-1/2}·[exp(ω_r·x̃ − ‖x̃‖²/2 − c) + ε]_r, ε = 1e-4 (added after the shift);
//! c = max_r ω_r·q̃ per query row, c = max_{j,r} ω_r·k̃_j one constant for all keys.
//! Ô = diag(φ(Q̃)·(φ(K̃)ᵀ1))⁻¹ · φ(Q̃)·(φ(K̃)ᵀV); the normalizer φ(Q̃)·(φ(K̃)ᵀ1) is returned.
//!
//! Two ids (docs/reference.md §2.5 [P≠C] double scaling):
//! - `performer`: the estimator the authors ran for Fig. 1. Their wrapper divides Q and K by
//!   p^{1/4} and the feature map multiplies by p^{-1/4} again, so the inputs are scaled by
//!   p^{-1/2} in total and it estimates **softmax(QKᵀ/p)V**, not softmax(QKᵀ/√p)V (a bias that
//!   does not vanish as m grows). Kept to reproduce the figure.
//! - `performer_favor`: textbook FAVOR+ (p^{-1/4} once), an estimator of softmax(QKᵀ/√p)V.
//!
//! Ω (m = d rows): ⌈m/p⌉ independent p×p blocks, each the Q factor of the QR decomposition of an
//! iid N(0,1) matrix (rows of Qᵀ), first m rows kept, row r multiplied by ‖g_r‖ with independent
//! g_r ~ N(0, I_p). Drawn on the host with nalgebra from the trial generator, then moved to the
//! device. No explicit sign fix is applied; nalgebra's QR returns R with a non-negative diagonal,
//! which makes Q Haar-distributed (unlike LAPACK/torch.qr, whose first column has Q₀₀ ≤ 0), so
//! each row is marginally N(0, I_p) as docs/reference.md §2.5 states.
//! Computed in the input dtype on the head's device (the shifts keep exp in range).
//!
//! Causal form, `performer_favor` only (docs/reference.md §7.4; Choromanski et al. 2021 §2.5
//! "unidirectional", `causal_numerator`/`causal_denominator` of google-research/performer):
//! Ô_i = φ(q_i)ᵀ(Σ_{j≤i} φ(k_j)v_jᵀ) / φ(q_i)ᵀ(Σ_{j≤i} φ(k_j)), the same φ, Ω and stabilisers. The
//! key shift is one max over all keys, as in the authors' code. docs/reference.md §7.4 calls it a constant
//! factor that cancels; it cancels in the exponential part only: ε is added after the shift, so a
//! later key can move row i's weights through the shift by a relative amount of order ε = 1e-4
//! (kept, to be the published estimator). The prefix sums run in chunks of rows: within a chunk the masked product
//! (φ(Q_c)φ(K_c)ᵀ ⊙ tril)·[V_c, 1], across chunks a running state Σ_{j<a} φ(k_j)[v_j, 1]ᵀ (m×(p+1))
//! kept in f64, so that a sum over 8k+ keys does not drift in f32.

use anyhow::Result;
use candle_core::{DType, Tensor, D};
use nalgebra::DMatrix;

use crate::attention::batch::each_head;
use crate::attention::{
    Approximation, Family, HeadBatch, HeadInputs, HeadTrials, Mask, Method, MethodInfo,
};
use crate::numerics::sampling::{normal_values, TrialRng};

#[path = "performer_causal.rs"]
mod causal;
use causal::{causal_products, windowed_causal_products, CAUSAL_CHUNK};

/// Additive stabiliser of the feature map (docs/reference.md §2.5).
pub const EPS: f64 = 1e-4;

pub struct Performer {
    pub double_scaled: bool,
}

impl Performer {
    /// `performer`: the double-scaled reference estimator of softmax(QKᵀ/p)V (Fig. 1).
    pub fn reference() -> Self {
        Self {
            double_scaled: true,
        }
    }
    /// `performer_favor`: textbook FAVOR+ for softmax(QKᵀ/√p)V.
    pub fn favor() -> Self {
        Self {
            double_scaled: false,
        }
    }
    /// Total input scale: p^{-1/2} (double-scaled) or p^{-1/4} (FAVOR+); x̃ = x·scale.
    pub fn input_scale(&self, p: usize) -> f64 {
        (p as f64).powf(if self.double_scaled { -0.5 } else { -0.25 })
    }

    /// [`Self::input_scale`] on `head`'s layer: FAVOR+'s p^{-1/4} becomes √τ where the layer's
    /// τ is not 1/√p (docs/reference.md §7.7.6, Scale), so that x̃_q·x̃_k = τ·q·k. The plain
    /// layer keeps p^{-1/4} itself (its bits, for the committed baselines).
    fn input_scale_on(&self, head: &HeadInputs) -> f64 {
        let p = head.p();
        if self.double_scaled || head.spec.scale == crate::attention::spec::default_scale(p) {
            self.input_scale(p)
        } else {
            head.spec.scale.sqrt()
        }
    }
}

/// Ω (m×p) with orthogonal p×p blocks and chi_p row lengths (see the module comment).
pub(crate) fn orthogonal_gaussian(rng: &mut TrialRng, m: usize, p: usize) -> DMatrix<f64> {
    let blocks = m.div_ceil(p);
    let mut omega = DMatrix::zeros(blocks * p, p);
    for b in 0..blocks {
        let g = DMatrix::from_row_slice(p, p, &normal_values(rng, p, p, 1.0));
        let q = g.qr().q(); // p×p orthogonal
        omega.view_mut((b * p, 0), (p, p)).copy_from(&q.transpose()); // rows of Qᵀ
    }
    let mut omega = omega.rows(0, m).into_owned();
    let lengths = normal_values(rng, m, p, 1.0);
    for r in 0..m {
        let len = lengths[r * p..(r + 1) * p]
            .iter()
            .map(|x| x * x)
            .sum::<f64>()
            .sqrt();
        omega.row_mut(r).scale_mut(len);
    }
    omega
}

/// How the feature map shifts the exponent before exp (all cancel in Ô, except through ε).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Shift {
    /// Per row: c_i = max_r ω_r·x̃_i (queries).
    PerRow,
    /// One constant: c = max_{j,r} ω_r·x̃_j (keys).
    Global,
    /// No shift: the unbiased, unnormalised estimate (`performer_gauss`, tests).
    None,
}

/// φ(x̃) (n×m) for scaled inputs x̃ (n×p) and Ω (m×p), both on the same device and dtype.
#[cfg(test)]
pub(crate) fn feature_map(xt: &Tensor, omega: &Tensor, shift: Shift, eps: f64) -> Result<Tensor> {
    feature_map_with_norms(xt, &half_sq_norms(xt)?, omega, shift, eps)
}

/// ‖x̃_i‖²/2 (n×1).
fn half_sq_norms(xt: &Tensor) -> Result<Tensor> {
    Ok((xt.sqr()?.sum_keepdim(D::Minus1)? * 0.5)?)
}

/// φ(x̃) given ‖x̃_i‖²/2 (`half_sq`, n×1), which does not depend on Ω.
fn feature_map_with_norms(
    xt: &Tensor,
    half_sq: &Tensor,
    omega: &Tensor,
    shift: Shift,
    eps: f64,
) -> Result<Tensor> {
    Ok(shifted_feature_map(xt, half_sq, omega, shift, eps)?.0)
}

/// The shifted feature map and its shift: (m^{-1/2}·[exp(ω_r·x̃ − ‖x̃‖²/2 − c) + ε]_r, c), with c
/// per row ([n, 1]), one constant ([1, 1]) or 0 ([1, 1]) as `shift` says. Batched inputs
/// ([B, n, p] with Ω [B, m, p]) get each head's own shifts. With ε = 0 the
/// unshifted features are φ(x̃_i) = e^{c_i}·(the first output's row i), which Scatterbrain
/// (§6.2.2) uses to merge the low-rank part with its exact sparse part.
pub(crate) fn shifted_feature_map(
    xt: &Tensor,
    half_sq: &Tensor,
    omega: &Tensor,
    shift: Shift,
    eps: f64,
) -> Result<(Tensor, Tensor)> {
    let m = omega.dim(D::Minus2)?;
    let proj = xt.matmul(&omega.t()?)?; // n×m, ω_r·x̃_i
    let e = proj.broadcast_sub(half_sq)?;
    let c = match shift {
        Shift::PerRow => proj.max_keepdim(D::Minus1)?,
        Shift::Global => proj.max_keepdim(D::Minus1)?.max_keepdim(D::Minus2)?,
        Shift::None => Tensor::zeros((1, 1), proj.dtype(), proj.device())?,
    };
    let e = e.broadcast_sub(&c)?;
    Ok((((e.exp()? + eps)? * (m as f64).powf(-0.5))?, c))
}

/// ‖x̃_i‖²/2 (n×1), for callers of [`shifted_feature_map`].
pub(crate) fn half_squared_norms(xt: &Tensor) -> Result<Tensor> {
    half_sq_norms(xt)
}

/// What the feature maps and the products need that does not depend on Ω, built once per head
/// and variant: x̃ = x·scale for Q and K with their ‖x̃‖²/2, and [V, 1] (numerator and
/// denominator share the products).
struct Operands {
    qt: Tensor,
    kt: Tensor,
    q_half_sq: Tensor,
    k_half_sq: Tensor,
    rhs: Tensor,
}

impl Operands {
    /// From q, k, v of one head ([n, p]) or a batch of heads ([B, n, p]).
    fn new(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64) -> Result<Self> {
        let (qt, kt) = ((q * scale)?, (k * scale)?);
        let ones = v.narrow(D::Minus1, 0, 1)?.ones_like()?;
        Ok(Self {
            q_half_sq: half_sq_norms(&qt)?,
            k_half_sq: half_sq_norms(&kt)?,
            qt,
            kt,
            rhs: Tensor::cat(&[v.clone(), ones], D::Minus1)?,
        })
    }

    fn memo_key(performer: &Performer) -> &'static str {
        if performer.double_scaled {
            "performer_operands"
        } else {
            "performer_favor_operands"
        }
    }

    fn of(head: &HeadInputs, performer: &Performer) -> Result<std::sync::Arc<Self>> {
        head.memo(Self::memo_key(performer), || {
            Self::new(&head.q, &head.k, &head.v, performer.input_scale_on(head))
        })
    }

    fn of_batch(batch: &HeadBatch, performer: &Performer) -> Result<std::sync::Arc<Self>> {
        batch.memo.get_or_compute(Self::memo_key(performer), || {
            Self::new(
                &batch.q,
                &batch.k,
                &batch.v,
                performer.input_scale(batch.p()),
            )
        })
    }
}

/// Ω of each seed's trial, drawn on the host's threads and stacked as [B, m, p] on `dev`.
pub(crate) fn stacked_omegas(
    seeds: &[u64],
    m: usize,
    p: usize,
    dev: &candle_core::Device,
    dtype: DType,
) -> Result<Tensor> {
    let omegas = crate::runtime::host_map(seeds, |&s| {
        orthogonal_gaussian(&mut crate::numerics::sampling::rng_from_seed(s), m, p)
    });
    let mut flat = Vec::with_capacity(seeds.len() * m * p);
    for o in &omegas {
        flat.extend_from_slice(o.transpose().as_slice()); // row-major
    }
    Ok(Tensor::from_vec(flat, (seeds.len(), m, p), dev)?.to_dtype(dtype)?)
}

const PERFORMER: MethodInfo = MethodInfo {
    id: "performer",
    family: Family::Features,
    meaning: "number of positive orthogonal random features m (inputs scaled by p^-1/2: estimates softmax(QKᵀ/p)V)",
    random: true,
    ..MethodInfo::BASE
};
const FAVOR: MethodInfo = MethodInfo {
    id: "performer_favor",
    family: Family::Features,
    meaning: "number of positive orthogonal random features m (FAVOR+ for softmax(QKᵀ/√p)V)",
    random: true,
    masks: MethodInfo::BOTH_MASKS,
    // §7.7.6: √τ on Q and K, the window by prefix sums, the sink in the denominator on the
    // kernel's scale; no capped form is published, so a capped layer refuses it (as specified).
    spec: crate::attention::SpecFeatures {
        softcap: false,
        ..crate::attention::SpecFeatures::ALL
    },
    ..MethodInfo::BASE
};

impl Method for Performer {
    fn approximate(
        &self,
        head: &HeadInputs,
        d: usize,
        rng: &mut TrialRng,
    ) -> Result<Approximation> {
        self.check(head.n(), d).map_err(anyhow::Error::msg)?;
        let p = head.p();
        let (dt, dev) = (head.dtype(), head.device());
        let omega = orthogonal_gaussian(rng, d, p);
        let omega = crate::tensor_util::from_dmatrix(&omega, dev, dt)?;
        let ops = Operands::of(head, self)?;
        let (phi_q, c_q) =
            shifted_feature_map(&ops.qt, &ops.q_half_sq, &omega, Shift::PerRow, EPS)?; // n×m
        let (phi_k, c_k) =
            shifted_feature_map(&ops.kt, &ops.k_half_sq, &omega, Shift::Global, EPS)?; // n×m
        let fr = match (head.mask, head.spec.window_within(head.n())) {
            (Mask::None, _) => phi_q.matmul(&phi_k.t()?.matmul(&ops.rhs)?)?, // n×(p+1) via m×(p+1)
            (Mask::Causal, window) => {
                anyhow::ensure!(!self.double_scaled, "performer has no causal form");
                match window {
                    None => causal_products(&phi_q, &phi_k, &ops.rhs)?,
                    Some(w) => windowed_causal_products(&phi_q, &phi_k, &ops.rhs, w)?,
                }
            }
        };
        // [V | 1] has p_v + 1 columns (p_v ≠ p for MLA's heads).
        let pv = ops.rhs.dim(1)? - 1;
        let mut den = fr.narrow(1, pv, 1)?;
        if let Some(sink) = head.spec.sink(0) {
            // §7.7.6: the sink's e^σ joins the denominator on the estimated kernel's scale,
            // which φ(q_i)·φ(k_j) carries as e^{q̃·k̃ − c_i − c_K}: e^{σ − c_i − c_K}.
            den = (den + (c_q.broadcast_add(&c_k)?.neg()? + sink)?.exp()?)?;
        }
        let out = fr.narrow(1, 0, pv)?.broadcast_div(&den)?;
        Ok(Approximation {
            output: out,
            normalizer: Some(den.squeeze(1)?.to_dtype(DType::F64)?),
            support: None,
        })
    }
    /// The bidirectional form batched over heads: each head's Ω from its own seed (drawn on the
    /// host's threads), then the same products as [B, ·, ·] kernels. The causal form runs head by
    /// head.
    fn approximate_heads(&self, trials: &HeadTrials) -> Result<Vec<Approximation>> {
        let (batch, d, seeds) = (trials.batch, trials.d, trials.seeds);
        if batch.mask() != Mask::None {
            return each_head(self, trials);
        }
        self.check(batch.n(), d).map_err(anyhow::Error::msg)?;
        let p = batch.p();
        let omega = stacked_omegas(seeds, d, p, batch.device(), batch.dtype())?;
        let ops = Operands::of_batch(batch, self)?;
        let phi_q = feature_map_with_norms(&ops.qt, &ops.q_half_sq, &omega, Shift::PerRow, EPS)?; // [B, n, m]
        let phi_k = feature_map_with_norms(&ops.kt, &ops.k_half_sq, &omega, Shift::Global, EPS)?;
        let fr = phi_q.matmul(&phi_k.t()?.matmul(&ops.rhs)?)?; // [B, n, p+1]
        let pv = ops.rhs.dim(2)? - 1;
        let den = fr.narrow(2, pv, 1)?;
        let out = fr.narrow(2, 0, pv)?.broadcast_div(&den)?;
        trials.per_head(&out, Some(&den.squeeze(2)?.to_dtype(DType::F64)?))
    }
    /// docs/reference.md §2.11: 4ndp, plus ⌈d/p⌉p³ for the QR blocks of Ω.
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        4.0 * (n * d * p) as f64 + (d.div_ceil(p) * p * p * p) as f64
    }
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(if self.double_scaled {
            &PERFORMER
        } else {
            &FAVOR
        })
    }
    /// Causal: the bidirectional count plus the prefix sums, n·m·p (docs/reference.md §7.4), and the
    /// chunks' masked products n·c·m (c = CAUSAL_CHUNK rows).
    fn macs_masked(&self, n: usize, p: usize, d: usize, mask: Mask) -> f64 {
        let base = self.macs(n, p, d);
        match mask {
            Mask::None => base,
            Mask::Causal => base + (n * d * p) as f64 + (n * CAUSAL_CHUNK.min(n) * d) as f64,
        }
    }
}

#[cfg(test)]
#[path = "performer_spec_tests.rs"]
mod spec_tests;

#[cfg(test)]
#[path = "performer_tests.rs"]
mod tests;
