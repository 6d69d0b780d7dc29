//! `zero`: Ô = 0, the kernelized target's trivial baseline (docs/reference.md §6.4.1 [REC]). Its error is
//! ‖C·V‖₂ and its relative error exactly 1; a method above it does worse than outputting nothing.
//! V-Mean plays this role for softmax only (its 1/n row scale belongs to softmax). Independent of d.

use anyhow::Result;
use candle_core::Tensor;

use super::{Approximation, Family, HeadInputs, Method, MethodInfo};
use crate::numerics::sampling::TrialRng;

pub struct Zero;

const ZERO: MethodInfo = MethodInfo {
    id: "zero",
    family: Family::Reference,
    meaning: "ignored: Ô = 0 (relative error exactly 1)",
    random: false,
    targets: MethodInfo::KERNELIZED,
    ..MethodInfo::BASE
};

impl Method for Zero {
    fn approximate(&self, head: &HeadInputs, _: usize, _: &mut TrialRng) -> Result<Approximation> {
        Ok(Approximation::plain(Tensor::zeros(
            head.v.shape(),
            head.dtype(),
            head.device(),
        )?))
    }
    fn macs(&self, _n: usize, _p: usize, _d: usize) -> f64 {
        0.0
    }
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(&ZERO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::test_util::{random_head, relative_errors, run_seeded};
    use candle_core::DType;

    /// ‖C·V − 0‖ = ‖C·V‖: relative error 1 in both norms.
    #[test]
    fn error_is_the_norm_of_the_target() {
        let h = random_head(64, 8, 2, DType::F64);
        let out = run_seeded(&Zero, &h, 8, 0).output;
        for rel in relative_errors(h.kernelized().unwrap(), &out) {
            assert!((rel - 1.0).abs() < 1e-12);
        }
    }
}
