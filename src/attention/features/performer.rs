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
mod tests {
    use super::*;
    use crate::tensor_util::test_device;
    use crate::tensor_util::{from_dmatrix, to_dmatrix};
    use rand::SeedableRng;

    use crate::attention::test_util::{gauss, out_matrix};
    fn t64(m: &DMatrix<f64>) -> Tensor {
        from_dmatrix(m, &test_device(), DType::F64).unwrap()
    }
    /// The row-wise max-shifted softmax of a logits matrix, on the host.
    fn row_softmax(mut a: DMatrix<f64>) -> DMatrix<f64> {
        for mut r in a.row_iter_mut() {
            let mx = r.max();
            r.apply(|x| *x = (*x - mx).exp());
            let s = r.sum();
            r.apply(|x| *x /= s);
        }
        a
    }

    #[test]
    fn omega_blocks_are_orthogonal_with_chi_lengths() {
        let mut rng = TrialRng::seed_from_u64(1);
        let (m, p) = (20, 8);
        let om = orthogonal_gaussian(&mut rng, m, p);
        assert_eq!(om.shape(), (m, p));
        for r in 0..m {
            for s in 0..m {
                let dot = om.row(r).dot(&om.row(s));
                if r != s && r / p == s / p {
                    assert!(dot.abs() < 1e-12, "rows {r},{s} of one block: {dot}");
                }
            }
        }
        // Row lengths are chi_p: mean of ‖ω‖² over many rows ≈ p.
        let big = orthogonal_gaussian(&mut rng, 4000, p);
        let mean_sq = big.row_iter().map(|r| r.norm_squared()).sum::<f64>() / 4000.0;
        assert!((mean_sq - p as f64).abs() < 0.3, "{mean_sq}");
        // Reproducible from the generator alone.
        let a = orthogonal_gaussian(&mut TrialRng::seed_from_u64(5), m, p);
        let b = orthogonal_gaussian(&mut TrialRng::seed_from_u64(5), m, p);
        assert_eq!(a, b);
    }

    /// Mean and standard error over `draws` fresh Ω of φ(q̃)·φ(k̃) with ε = 0 and no shift.
    fn kernel_estimate(
        method: &Performer,
        q: &[f64],
        k: &[f64],
        m: usize,
        draws: usize,
    ) -> (f64, f64) {
        let p = q.len();
        let s = method.input_scale(p);
        let qt = Tensor::new(q, &test_device())
            .unwrap()
            .reshape((1, p))
            .unwrap();
        let kt = Tensor::new(k, &test_device())
            .unwrap()
            .reshape((1, p))
            .unwrap();
        let (qt, kt) = ((qt * s).unwrap(), (kt * s).unwrap());
        let mut rng = TrialRng::seed_from_u64(42);
        let vals: Vec<f64> = (0..draws)
            .map(|_| {
                let om = t64(&orthogonal_gaussian(&mut rng, m, p));
                let fq = feature_map(&qt, &om, Shift::None, 0.0).unwrap();
                let fk = feature_map(&kt, &om, Shift::None, 0.0).unwrap();
                crate::tensor_util::scalar(&fq.matmul(&fk.t().unwrap()).unwrap()).unwrap()
            })
            .collect();
        let mean = vals.iter().sum::<f64>() / draws as f64;
        let var = vals.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (draws - 1) as f64;
        (mean, (var / draws as f64).sqrt())
    }

    #[test]
    fn features_are_unbiased_for_the_targeted_kernel() {
        // q + k points mostly along the first axis: a LAPACK-style sign convention (Q₀₀ ≤ 0)
        // would bias this strongly. m = 6 > p = 4 covers a partial second block.
        let p = 4;
        let q = [0.9, 0.2, -0.2, 0.1];
        let k = [0.6, -0.3, 0.1, 0.2];
        let qk: f64 = q.iter().zip(&k).map(|(a, b)| a * b).sum();
        for (method, target) in [
            (Performer::reference(), (qk / p as f64).exp()), // exp(q·k/p)
            (Performer::favor(), (qk / (p as f64).sqrt()).exp()), // exp(q·k/√p)
        ] {
            let (mean, se) = kernel_estimate(&method, &q, &k, 6, 20_000);
            assert!(
                (mean - target).abs() < 4.0 * se,
                "{}: {mean} ± {se} vs {target}",
                method.id()
            );
            assert!(se < 0.01 * target, "{}: se {se}", method.id());
        }
    }

    #[test]
    fn many_features_converge_to_each_ids_own_softmax() {
        // Small logits: positive random features are heavy-tailed (per-feature relative variance
        // e^{‖q̃+k̃‖²} − 1) and Ô is a ratio estimator, so large logits converge very slowly; the
        // error relative to the gap between the two targets shrinks like m^{-1/2} at any scale.
        let mut rng = TrialRng::seed_from_u64(2);
        let (n, p) = (12, 8);
        let (q, k, v) = (
            gauss(&mut rng, n, p, 0.3),
            gauss(&mut rng, n, p, 0.3),
            gauss(&mut rng, n, p, 1.0),
        );
        let head = HeadInputs::new(t64(&q), t64(&k), t64(&v)).unwrap();
        let flat = row_softmax(&q * k.transpose() * (1.0 / p as f64)) * &v; // softmax(QKᵀ/p)V
        let sharp = row_softmax(&q * k.transpose() * (1.0 / (p as f64).sqrt())) * &v; // the real target
        assert!(
            (&sharp - to_dmatrix(&head.exact().unwrap().output).unwrap())
                .abs()
                .max()
                < 1e-12
        );
        let dist = |a: &DMatrix<f64>, b: &DMatrix<f64>| (a - b).abs().max();
        let gap = dist(&flat, &sharp);
        assert!(gap > 0.02, "targets too close to tell apart: {gap}");
        for (method, own, other) in [
            (Performer::reference(), &flat, &sharp),
            (Performer::favor(), &sharp, &flat),
        ] {
            let a = method
                .approximate(&head, 16384, &mut TrialRng::seed_from_u64(3))
                .unwrap();
            let o = to_dmatrix(&a.output).unwrap();
            assert!(
                dist(&o, own) < 0.3 * gap,
                "{}: {} vs gap {gap}",
                method.id(),
                dist(&o, own)
            );
            assert!(
                dist(&o, other) > 0.7 * gap,
                "{}: {} vs gap {gap}",
                method.id(),
                dist(&o, other)
            );
            assert!(a
                .normalizer
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
                .iter()
                .all(|&x| x > 0.0));
        }
    }

    #[test]
    fn seeded_reproducible_finite_and_f32_agrees_with_f64() {
        let mut rng = TrialRng::seed_from_u64(4);
        let (n, p) = (200, 64);
        let (q, k, v) = (
            gauss(&mut rng, n, p, 0.6),
            gauss(&mut rng, n, p, 0.6),
            gauss(&mut rng, n, p, 1.0),
        );
        let h64 = HeadInputs::new(t64(&q), t64(&k), t64(&v)).unwrap();
        let t32 = |m: &DMatrix<f64>| from_dmatrix(m, &test_device(), DType::F32).unwrap();
        let h32 = HeadInputs::new(t32(&q), t32(&k), t32(&v)).unwrap();
        for method in [Performer::reference(), Performer::favor()] {
            for d in [1, 16, 70, 256] {
                let a = out_matrix(&method, &h64, d, 9);
                let b = out_matrix(&method, &h64, d, 9);
                assert_eq!(a, b);
                assert!(a.iter().all(|x| x.is_finite()));
                let c = method
                    .approximate(&h32, d, &mut TrialRng::seed_from_u64(9))
                    .unwrap();
                assert_eq!(c.output.dtype(), DType::F32);
                let c = to_dmatrix(&c.output).unwrap();
                let rel = (&c - &a).abs().max() / a.abs().max();
                assert!(rel < 1e-3, "{} d={d}: {rel}", method.id());
            }
            let x = out_matrix(&method, &h64, 16, 1);
            let y = out_matrix(&method, &h64, 16, 2);
            assert_ne!(x, y);
        }
        assert_eq!(Performer::reference().id(), "performer");
        assert_eq!(Performer::favor().id(), "performer_favor");
        assert_eq!(
            Performer::reference().macs(512, 64, 100),
            4.0 * 512.0 * 100.0 * 64.0 + 2.0 * 64f64.powi(3)
        );
    }

    #[test]
    fn shifts_cancel_except_through_eps() {
        // With ε = 0 the per-row and global shifts cancel exactly in Ô.
        let mut rng = TrialRng::seed_from_u64(6);
        let (n, p, m) = (10, 4, 12);
        let (q, k, v) = (
            gauss(&mut rng, n, p, 1.0),
            gauss(&mut rng, n, p, 1.0),
            gauss(&mut rng, n, p, 1.0),
        );
        let om = t64(&orthogonal_gaussian(&mut rng, m, p));
        let out = |sq: Shift, sk: Shift| {
            let fq = to_dmatrix(&feature_map(&t64(&q), &om, sq, 0.0).unwrap()).unwrap();
            let fk = to_dmatrix(&feature_map(&t64(&k), &om, sk, 0.0).unwrap()).unwrap();
            let a = fq * fk.transpose();
            let mut o = &a * &v;
            for i in 0..n {
                o.row_mut(i).scale_mut(1.0 / a.row(i).sum());
            }
            o
        };
        let diff = (out(Shift::PerRow, Shift::Global) - out(Shift::None, Shift::None))
            .abs()
            .max();
        assert!(diff < 1e-12, "{diff}");
    }

    /// The causal form against its definition in f64, entry by entry, with the feature map
    /// written out as §2.5 gives it (the same Ω from the same seed, the stabilisers included):
    /// Ô_i = Σ_{j≤i} (φ_q,i·φ_k,j) v_j / Σ_{j≤i} φ_q,i·φ_k,j. n = 300 spans three chunks, the last
    /// one short. The last row sees every key, so it equals the bidirectional estimator's.
    #[test]
    fn causal_favor_equals_the_masked_ratio_of_feature_products() {
        use crate::attention::Mask;
        let (n, p, m) = (300, 8, 16);
        let mut rng = TrialRng::seed_from_u64(9);
        let mut mk = || gauss(&mut rng, n, p, 0.7);
        let (q, k, v) = (mk(), mk(), mk());
        let fav = Performer::favor();
        let run = |mask: Mask| {
            let head = HeadInputs::masked(t64(&q), t64(&k), t64(&v), mask).unwrap();
            let out = fav
                .approximate(&head, m, &mut TrialRng::seed_from_u64(3))
                .unwrap();
            to_dmatrix(&out.output).unwrap()
        };
        let got = run(Mask::Causal);
        let omega = orthogonal_gaussian(&mut TrialRng::seed_from_u64(3), m, p);
        let s = fav.input_scale(p);
        let logits = |x: &DMatrix<f64>| (x * s) * omega.transpose(); // n×m: ω_r·x̃_i
        let half = |x: &DMatrix<f64>| (x * s).map(|e| e * e).column_sum() / 2.0;
        let (lq, lk, hq, hk) = (logits(&q), logits(&k), half(&q), half(&k));
        let ck = lk.max(); // one shift for all keys
        let fq = DMatrix::from_fn(n, m, |i, r| {
            let c = lq.row(i).max(); // per query row
            (lq[(i, r)] - hq[i] - c).exp() + EPS
        });
        let fk = DMatrix::from_fn(n, m, |j, r| (lk[(j, r)] - hk[j] - ck).exp() + EPS);
        let want = DMatrix::from_fn(n, p, |i, c| {
            let w: Vec<f64> = (0..=i).map(|j| fq.row(i).dot(&fk.row(j))).collect();
            let z: f64 = w.iter().sum();
            (0..=i).map(|j| w[j] * v[(j, c)]).sum::<f64>() / z
        });
        let err = (&got - &want).abs().max();
        assert!(err < 1e-10, "causal FAVOR+ against its definition: {err:e}");
        let last = run(Mask::None);
        for c in 0..p {
            assert!((got[(n - 1, c)] - last[(n - 1, c)]).abs() < 1e-10);
        }
        // The double-scaled `performer` has no causal form.
        assert!(!Performer::reference().masks().contains(&Mask::Causal));
    }
}
