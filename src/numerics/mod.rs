//! Shared numerics, written once: the spectral norm (the metric), matrix inverses used by the
//! Nyström-type methods, and seeded sampling.

pub mod inverse;
pub mod sampling;
pub mod spectral;
