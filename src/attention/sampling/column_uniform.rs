//! Uniform column (key) sampling, the self-normalised textbook sketch (a reference curve; cf. the
//! "w/o column sampling" ablation of Skeinformer Table 1 without its geometric-mean fill, docs/reference.md §2.8):
//! J ← d keys uniform without replacement; Ô = rowsoftmax(Q K_Jᵀ/√p)·V_J, the softmax taken over the
//! sampled keys only. d ≥ n takes every key and is exact.

use anyhow::Result;
use candle_core::Tensor;

use crate::attention::{Approximation, Family, HeadInputs, Method, MethodInfo};
use crate::numerics::sampling::{uniform_without_replacement, TrialRng};
use crate::tensor_util::index_tensor;

pub struct ColumnUniform;

/// Ô = rowsoftmax(Q K_Jᵀ/√p)·V_J for the given key indices J.
pub fn with_columns(q: &Tensor, k: &Tensor, v: &Tensor, cols: &[usize]) -> Result<Tensor> {
    let p = q.dims2()?.1;
    let idx = index_tensor(cols, q.device())?;
    let (kj, vj) = (k.index_select(&idx, 0)?, v.index_select(&idx, 0)?);
    let s = (q.matmul(&kj.t()?)? / (p as f64).sqrt())?; // [n, d]
    Ok(crate::attention::row_softmax(&s)?.matmul(&vj)?)
}

const COLUMN_UNIFORM: MethodInfo = MethodInfo {
    id: "column_uniform",
    family: Family::Sampling,
    meaning:
        "keys sampled uniformly without replacement (min(d, n)); softmax over the sampled keys only",
    random: true,
    ..MethodInfo::BASE
};

impl Method for ColumnUniform {
    fn approximate(
        &self,
        head: &HeadInputs,
        d: usize,
        rng: &mut TrialRng,
    ) -> Result<Approximation> {
        self.check(head.n(), d).map_err(anyhow::Error::msg)?;
        let n = head.n();
        let cols = uniform_without_replacement(rng, n, d.min(n));
        Ok(Approximation::plain(with_columns(
            &head.q, &head.k, &head.v, &cols,
        )?))
    }
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        // Q K_Jᵀ and softmax·V_J: 2ndp.
        2.0 * (n * d.min(n) * p) as f64
    }
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(&COLUMN_UNIFORM)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::numerics::spectral::error_norms;

    use candle_core::DType;
    use rand::SeedableRng;

    use crate::attention::test_util::random_head as head;
    use crate::attention::test_util::*;

    #[test]
    fn all_keys_is_exact() {
        let h = head(50, 8, 1, DType::F64);
        for d in [50, 80] {
            let out = ColumnUniform
                .approximate(&h, d, &mut TrialRng::seed_from_u64(2))
                .unwrap()
                .output;
            assert!(exact_error(&h, &out) < 1e-12, "d = {d}");
        }
    }

    #[test]
    fn matches_naive_softmax_over_sampled_keys() {
        let h = head(30, 4, 3, DType::F64);
        let cols = [4usize, 17, 2, 29, 11];
        let out: Vec<Vec<f64>> = with_columns(&h.q, &h.k, &h.v, &cols)
            .unwrap()
            .to_vec2()
            .unwrap();
        let m = |t: &Tensor| -> Vec<Vec<f64>> { t.to_vec2().unwrap() };
        let (q, k, v) = (m(&h.q), m(&h.k), m(&h.v));
        for i in 0..30 {
            let a: Vec<f64> = cols
                .iter()
                .map(|&j| (q[i].iter().zip(&k[j]).map(|(x, y)| x * y).sum::<f64>() / 2.0).exp())
                .collect();
            let z: f64 = a.iter().sum();
            for c in 0..4 {
                let want = cols.iter().zip(&a).map(|(&j, w)| w * v[j][c]).sum::<f64>() / z;
                assert!((out[i][c] - want).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn seeded_reproducible_f32_agrees_and_finite() {
        let h64 = head(128, 16, 4, DType::F64);
        let a = assert_seed_determines_output(&ColumnUniform, &h64, 16, 5).output;
        let b = run_seeded(&ColumnUniform, &in_f32(&h64), 16, 5).output;
        assert!(
            error_norms(&a, &b.to_dtype(DType::F64).unwrap())
                .unwrap()
                .spectral
                < 1e-5
        );
        assert_all_finite(&b);
    }
}
