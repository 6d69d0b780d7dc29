//! Sparse + low-rank hybrids (docs/reference.md §6.2.2): a low-rank (random-feature) estimate of the
//! whole attention matrix, replaced by the exact entries on a sparse support.

pub mod scatterbrain;
