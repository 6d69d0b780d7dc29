//! Skeinformer — implementation pending (issue 3).

use anyhow::{bail, Result};

use super::{Approximation, HeadInputs, Method};
use crate::numerics::sampling::TrialRng;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkeinVariant { Full, Uniform, NoNorm, SimpleNorm, NoPilot }
pub struct Skeinformer { pub variant: SkeinVariant }
impl Skeinformer { pub fn new(variant: SkeinVariant) -> Self { Self { variant } } }

impl Method for Skeinformer {
    fn id(&self) -> &'static str {
        match self.variant { SkeinVariant::Full => "skeinformer", SkeinVariant::Uniform => "skein_uniform", SkeinVariant::NoNorm => "skein_nonorm", SkeinVariant::SimpleNorm => "skein_simplenorm", SkeinVariant::NoPilot => "skein_nopilot" }
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
