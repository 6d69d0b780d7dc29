//! Random-feature methods: exp(q·k) written as an expectation over random features, so that
//! Ô = φ(Q̃)(φ(K̃)ᵀV) / φ(Q̃)(φ(K̃)ᵀ1) never forms an n×n matrix.

pub mod performer;
pub mod performer_gauss;
pub mod performer_trig;
pub mod rff_gauss;
