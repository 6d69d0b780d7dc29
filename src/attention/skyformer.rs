//! Skyformer — implementation pending (issue 3).

use anyhow::{bail, Result};

use super::{Approximation, HeadInputs, Method};
use crate::numerics::sampling::TrialRng;

pub struct Skyformer { pub iterative: bool }
impl Skyformer { pub fn pseudo_inverse() -> Self { Self { iterative: false } } pub fn iterative() -> Self { Self { iterative: true } } }

impl Method for Skyformer {
    fn id(&self) -> &'static str {
        if self.iterative { "skyformer_iter" } else { "skyformer" }
    }
    fn feature_meaning(&self) -> &'static str {
        "pending"
    }
    fn is_random(&self) -> bool {
        true
    }
    fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
        4.0 * (n * d * p) as f64
    }
    fn approximate(&self, _head: &HeadInputs, _d: usize, _rng: &mut TrialRng) -> Result<Approximation> {
        bail!("method {} is not implemented yet", self.id())
    }
}
