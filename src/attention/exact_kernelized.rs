//! `exact_kernelized`: Kernelized Attention itself, O_C = C·V with the Gaussian kernel
//! (Skyformer §3; docs/reference.md §6.4.1), computed exactly in the run's dtype — the kernelized
//! target's counterpart of exact softmax attention. Its error is the run dtype's rounding (0 in
//! f64), and its time is the cost every approximation of C·V is measured against. Independent of d.

use anyhow::Result;

use super::{Approximation, Family, HeadInputs, Method, MethodInfo};
use crate::numerics::sampling::TrialRng;

pub struct ExactKernelized;

const EXACT_KERNELIZED: MethodInfo = MethodInfo {
    id: "exact_kernelized",
    family: Family::Reference,
    meaning: "ignored: the exact O(n²) product C·V in the run's dtype",
    random: false,
    // Not an approximation: the exact product, a yardstick of cost and rounding.
    oracle: true,
    targets: MethodInfo::KERNELIZED,
    ..MethodInfo::BASE
};

impl Method for ExactKernelized {
    fn approximate(&self, head: &HeadInputs, _: usize, _: &mut TrialRng) -> Result<Approximation> {
        Ok(Approximation::plain(super::exact::kernelized_output(
            &head.q,
            &head.k,
            &head.v,
            head.dtype(),
        )?))
    }
    /// docs/reference.md §6.4 summary: 2n²p (the n² exp are not MACs).
    fn macs(&self, n: usize, p: usize, _d: usize) -> f64 {
        2.0 * (n * n * p) as f64
    }
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(&EXACT_KERNELIZED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::test_util::{in_f32, random_head, relative_errors, run_seeded};
    use candle_core::DType;

    #[test]
    fn equals_the_f64_target_in_f64_and_carries_f32_rounding_only_in_f32() {
        let h = random_head(200, 16, 1, DType::F64);
        let target = h.kernelized().unwrap();
        let rel = |head: &HeadInputs| {
            relative_errors(target, &run_seeded(&ExactKernelized, head, 8, 0).output)[0]
        };
        assert_eq!(rel(&h), 0.0);
        let rel32 = rel(&in_f32(&h));
        assert!(rel32 > 0.0 && rel32 < 1e-6, "{rel32}");
    }
}
