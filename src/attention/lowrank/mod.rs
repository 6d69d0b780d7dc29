//! Low-rank methods: Ô through a rank-d factorisation of A or P (Nyström-type completions,
//! projections of the key axis) and the Eckart–Young floor they are measured against.

pub mod linformer;
pub mod nystromformer;
pub mod skyformer;
pub mod skyformer_gauss;
pub mod svd_optimal;
