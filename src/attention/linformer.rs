//! Linformer — implementation pending (issue 3).

use anyhow::{bail, Result};

use super::{Approximation, HeadInputs, Method};
use crate::numerics::sampling::TrialRng;

pub struct Linformer { pub jlt: bool }
impl Linformer { pub fn reference() -> Self { Self { jlt: false } } pub fn unreduced_jlt() -> Self { Self { jlt: true } } }

impl Method for Linformer {
    fn id(&self) -> &'static str {
        if self.jlt { "linformer_jlt" } else { "linformer" }
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
