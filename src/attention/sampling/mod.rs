//! Sampling methods: exact logits on sampled keys (or queries), with the rest filled in by an
//! estimate (Informer's lazy rows, Skeinformer's geometric-mean fill, or nothing).

pub mod column_uniform;
pub mod informer;
pub mod skeinformer;
