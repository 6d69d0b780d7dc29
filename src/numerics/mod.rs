//! Shared numerics, written once: the spectral norm (the metric), matrix inverses used by the
//! Nyström-type methods, seeded sampling, and the vectorised row exponentials of exact attention.

pub mod inverse;
pub mod sampling;
pub mod shifted_exp;
pub mod spectral;
