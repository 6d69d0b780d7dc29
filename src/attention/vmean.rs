//! V-Mean, Skeinformer's artificial baseline (Skeinformer §5; METHODS.md §2.1):
//! Ô = (1/n)·1·1ᵀV, every row the column mean of V. Independent of d.

use anyhow::Result;

use super::{Approximation, HeadInputs, Method};
use crate::numerics::sampling::TrialRng;

pub struct VMean;

impl Method for VMean {
    fn family(&self) -> crate::attention::Family {
        crate::attention::Family::Reference
    }
    fn id(&self) -> &'static str {
        "vmean"
    }
    fn feature_meaning(&self) -> &'static str {
        "ignored: every row of Ô is mean(V)"
    }
    fn is_random(&self) -> bool {
        false
    }
    fn macs(&self, n: usize, p: usize, _d: usize) -> f64 {
        (n * p) as f64
    }
    fn approximate(
        &self,
        head: &HeadInputs,
        _d: usize,
        _rng: &mut TrialRng,
    ) -> Result<Approximation> {
        let v = &head.v;
        let mean = v.mean_keepdim(0)?; // 1ᵀV / n
        Ok(Approximation::plain(
            mean.broadcast_as(v.shape())?.contiguous()?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor_util::test_device;
    use candle_core::Tensor;
    use rand::SeedableRng;

    #[test]
    fn every_row_is_the_mean_and_equals_uniform_attention() {
        let dev = test_device();
        let v = Tensor::new(&[[1f64, 2.0], [3.0, 6.0], [5.0, 10.0]], &dev).unwrap();
        // Q = 0 makes softmax uniform, so exact attention equals V-Mean exactly.
        let q = Tensor::zeros((3, 2), candle_core::DType::F64, &dev).unwrap();
        let head = HeadInputs::new(q.clone(), q, v).unwrap();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let out = VMean.approximate(&head, 16, &mut rng).unwrap().output;
        assert_eq!(out.to_vec2::<f64>().unwrap(), vec![vec![3.0, 6.0]; 3]);
        let err =
            crate::numerics::spectral::error_norms(&head.exact().unwrap().output, &out).unwrap();
        assert!(err.spectral < 1e-12);
    }
}
