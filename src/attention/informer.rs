//! Informer — implementation pending (issue 3).

use anyhow::{bail, Result};

use super::{Approximation, HeadInputs, Method};
use crate::numerics::sampling::TrialRng;

pub struct Informer { pub direct: bool }
impl Informer { pub fn log_factor() -> Self { Self { direct: false } } pub fn direct() -> Self { Self { direct: true } } }

impl Method for Informer {
    fn id(&self) -> &'static str {
        if self.direct { "informer_mask" } else { "informer" }
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
