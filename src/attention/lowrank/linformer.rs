//! Linformer (Wang et al., 2020; docs/reference.md §2.7) and its unreduced-JLT form.
//!
//! - `linformer`: paper Eq. (7) with one projection shared by keys and values (E = F, as the
//!   reference code does): Ô = rowsoftmax(Q (EK)ᵀ/√p)·(EV), E ∈ ℝ^{d×n} iid N(0, 0.02²), drawn fresh per
//!   trial (the reference's "run_norm" init; [P≠C]: the paper learns E and F).
//! - `linformer_jlt`: the sketch of paper Eq. (5) / Thm 1 with R = Sᵀ (Skeinformer Table 1
//!   "w/ unreduced JLT"): Ô = P·S·(SᵀV) with the exact P = D⁻¹A and S ∈ ℝ^{n×d} iid N(0, 1/d), E[SSᵀ] = I.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};

use crate::attention::batch::each_head;
use crate::attention::exact::{map_score_blocks, scaled_operands};
use crate::attention::{Approximation, Family, HeadInputs, HeadTrials, Method, MethodInfo};
use crate::numerics::sampling::{normal_values, rng_from_seed, TrialRng};
use crate::tensor_util::from_f64;

/// Standard deviation of the reference projection E (docs/reference.md §2.7 [REC]).
pub const SIGMA: f64 = 0.02;

/// Linformer; `jlt` selects the unreduced JLT form.
pub struct Linformer {
    pub jlt: bool,
}

impl Linformer {
    /// `linformer`: E ~ N(0, 0.02²), shared by K and V.
    pub fn reference() -> Self {
        Self { jlt: false }
    }
    /// `linformer_jlt`: Ô = P·S·(SᵀV), S ~ N(0, 1/d).
    pub fn unreduced_jlt() -> Self {
        Self { jlt: true }
    }
}

/// E ∈ ℝ^{d×n}, iid N(0, 0.02²), drawn on the host from `rng`.
pub fn draw_projection(
    rng: &mut TrialRng,
    n: usize,
    d: usize,
    dev: &Device,
    dt: DType,
) -> Result<Tensor> {
    from_f64(normal_values(rng, d, n, SIGMA), (d, n), dev, dt)
}

/// S ∈ ℝ^{n×d}, iid N(0, 1/d) (so E[SSᵀ] = I), drawn on the host from `rng`.
pub fn draw_sketch(
    rng: &mut TrialRng,
    n: usize,
    d: usize,
    dev: &Device,
    dt: DType,
) -> Result<Tensor> {
    from_f64(
        normal_values(rng, n, d, 1.0 / (d as f64).sqrt()),
        (n, d),
        dev,
        dt,
    )
}

/// Ô = rowsoftmax(Q (EK)ᵀ/√p)·(EV) for a given projection E ([d, n], same dtype and device as Q).
/// For a batch of heads, q, k, v [B, n, p] and E [B, d, n].
pub fn with_projection(q: &Tensor, k: &Tensor, v: &Tensor, e: &Tensor) -> Result<Tensor> {
    let p = q.dim(candle_core::D::Minus1)?;
    let ek = e.matmul(k)?; // [d, p]
    let ev = e.matmul(v)?; // [d, p]
    let s = (q.matmul(&ek.t()?)? / (p as f64).sqrt())?; // [n, d]
    Ok(crate::attention::row_softmax(&s)?.matmul(&ev)?)
}

/// Ô = P·S·(SᵀV) for a given sketch S ([n, d]), with P = exp(QKᵀ/√p − log D) formed in row blocks
/// from the exact log row sums `log_rowsum` ([n]), so no n×n matrix is held. Each block computes
/// (P_b·S)·(SᵀV), the order of the method as written (cost n²(p + d) + 2ndp).
pub fn with_sketch(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    log_rowsum: &Tensor,
    s: &Tensor,
) -> Result<Tensor> {
    let stv = s.t()?.matmul(v)?; // [d, p]
    let (qs, kt) = scaled_operands(q, k)?;
    map_score_blocks(&qs, &kt, |start, len, logits| {
        let pb = logits
            .broadcast_sub(&log_rowsum.narrow(0, start, len)?.unsqueeze(1)?)?
            .exp()?; // rows of P
        Ok(pb.matmul(s)?.matmul(&stv)?)
    })
}

const LINFORMER: MethodInfo = MethodInfo {
    id: "linformer",
    family: Family::LowRank,
    meaning: "projected sequence length k: E is d×n with N(0, 0.02²) entries",
    random: true,
    ..MethodInfo::BASE
};
const LINFORMER_JLT: MethodInfo = MethodInfo {
    id: "linformer_jlt",
    family: Family::LowRank,
    meaning: "sketch width: S is n×d with N(0, 1/d) entries, Ô = P·S·SᵀV",
    random: true,
    ..MethodInfo::BASE
};

impl Method for Linformer {
    fn approximate(
        &self,
        head: &HeadInputs,
        d: usize,
        rng: &mut TrialRng,
    ) -> Result<Approximation> {
        self.check(head.n(), d).map_err(anyhow::Error::msg)?;
        let (n, dev, dt) = (head.n(), head.device(), head.dtype());
        let out = if self.jlt {
            let s = draw_sketch(rng, n, d, dev, dt)?;
            with_sketch(&head.q, &head.k, &head.v, head.exact()?.log_rowsum()?, &s)?
        } else {
            let e = draw_projection(rng, n, d, dev, dt)?;
            with_projection(&head.q, &head.k, &head.v, &e)?
        };
        Ok(Approximation::plain(out))
    }
    /// `linformer` batched over heads: each head's E from its own seed, drawn on the host's
    /// threads, then the products as [B, ·, ·] kernels (`linformer_jlt` runs head by head).
    fn approximate_heads(&self, trials: &HeadTrials) -> Result<Vec<Approximation>> {
        let (batch, d) = (trials.batch, trials.d);
        if self.jlt {
            return each_head(self, trials);
        }
        self.check(batch.n(), d).map_err(anyhow::Error::msg)?;
        let n = batch.n();
        let draws = crate::runtime::host_map(trials.seeds, |&s| {
            normal_values(&mut rng_from_seed(s), d, n, SIGMA)
        });
        let e = Tensor::from_vec(draws.concat(), (batch.len(), d, n), batch.device())?
            .to_dtype(batch.dtype())?;
        trials.per_head(&with_projection(&batch.q, &batch.k, &batch.v, &e)?, None)
    }
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        let (n, p, d) = (n as f64, p as f64, d as f64);
        if self.jlt {
            // n²(p + d) + 2ndp (docs/reference.md §2.11).
            n * n * (p + d) + 2.0 * n * d * p
        } else {
            // EK, EV, Q(EK)ᵀ, attention·(EV): 4ndp.
            4.0 * n * d * p
        }
    }
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(if self.jlt { &LINFORMER_JLT } else { &LINFORMER })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::spectral::error_norms;
    use crate::tensor_util::test_device;
    use rand::SeedableRng;

    use crate::attention::test_util::random_head as head;
    use crate::attention::test_util::*;

    #[test]
    fn identity_projection_is_exact() {
        let h = head(48, 8, 1, DType::F64);
        let eye = Tensor::eye(48, DType::F64, &test_device()).unwrap();
        let out = with_projection(&h.q, &h.k, &h.v, &eye).unwrap();
        assert!(exact_error(&h, &out) < 1e-12);
        // The unreduced JLT with S = I (d = n) is P·V = O as well.
        let out = with_sketch(
            &h.q,
            &h.k,
            &h.v,
            h.exact().unwrap().log_rowsum().unwrap(),
            &eye,
        )
        .unwrap();
        assert!(exact_error(&h, &out) < 1e-12);
    }

    #[test]
    fn projection_is_shared_and_rows_are_convex_combinations_of_ev() {
        // With Q = 0 the softmax is uniform: every row is mean_r (EV)_r, so E enters both K and V paths
        // only through EV here; check against a direct computation.
        let h = head(32, 8, 2, DType::F64);
        let mut rng = TrialRng::seed_from_u64(3);
        let e = from_f64(
            normal_values(&mut rng, 5, 32, SIGMA),
            (5, 32),
            &test_device(),
            DType::F64,
        )
        .unwrap();
        let zero = h.q.zeros_like().unwrap();
        let out = with_projection(&zero, &h.k, &h.v, &e).unwrap();
        let want = e
            .matmul(&h.v)
            .unwrap()
            .mean_keepdim(0)
            .unwrap()
            .broadcast_as((32, 8))
            .unwrap();
        assert!(error_norms(&want, &out).unwrap().spectral < 1e-14);
    }

    #[test]
    fn jlt_is_unbiased_on_average() {
        // E[S Sᵀ] = I, so the mean of Ô over many sketches approaches O (error ~ 1/√trials).
        let h = head(16, 4, 4, DType::F64);
        let m = Linformer::unreduced_jlt();
        let mut rng = TrialRng::seed_from_u64(5);
        let trials = 4000;
        let mut acc = h.exact().unwrap().output.zeros_like().unwrap();
        for _ in 0..trials {
            acc = (acc + m.approximate(&h, 4, &mut rng).unwrap().output).unwrap();
        }
        let mean = (acc / trials as f64).unwrap();
        let bias = exact_error(&h, &mean);
        let single = error_norms(
            &h.exact().unwrap().output,
            &m.approximate(&h, 4, &mut rng).unwrap().output,
        )
        .unwrap()
        .spectral;
        assert!(
            bias < 0.1 * single,
            "bias {bias} vs single-trial error {single}"
        );
    }

    #[test]
    fn seeded_reproducible_f32_agrees_and_finite() {
        let h64 = head(128, 16, 6, DType::F64);
        let h32 = in_f32(&h64);
        for m in [Linformer::reference(), Linformer::unreduced_jlt()] {
            let a = assert_seed_determines_output(&m, &h64, 16, 7).output;
            let b = run_seeded(&m, &h32, 16, 7).output;
            let scale = error_norms(&a, &a.zeros_like().unwrap()).unwrap().spectral;
            let diff = error_norms(&a, &b.to_dtype(DType::F64).unwrap())
                .unwrap()
                .spectral;
            assert!(
                diff < 1e-5 * scale.max(1.0),
                "{}: f32 vs f64 {diff}",
                m.id()
            );
            assert_all_finite(&b);
        }
    }

    #[test]
    fn projection_has_the_reference_scale() {
        let e = draw_projection(
            &mut TrialRng::seed_from_u64(1),
            300,
            64,
            &test_device(),
            DType::F64,
        )
        .unwrap();
        assert_eq!(e.dims2().unwrap(), (64, 300));
        let v: Vec<f64> = e.flatten_all().unwrap().to_vec1().unwrap();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let sd = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
        assert!(
            mean.abs() < 5.0 * SIGMA / (v.len() as f64).sqrt() && (sd / SIGMA - 1.0).abs() < 0.02,
            "{mean} {sd}"
        );
        let s = draw_sketch(
            &mut TrialRng::seed_from_u64(2),
            300,
            64,
            &test_device(),
            DType::F64,
        )
        .unwrap();
        assert_eq!(s.dims2().unwrap(), (300, 64));
        let ss: f64 = s.sqr().unwrap().sum_all().unwrap().to_scalar().unwrap();
        assert!(
            (ss / 300.0 - 1.0).abs() < 0.02,
            "mean diagonal of S Sᵀ {}",
            ss / 300.0
        );
    }
}
