//! Sampling methods: exact logits on sampled keys (or queries), with the rest filled in by an
//! estimate (Informer's lazy rows, Skeinformer's geometric-mean fill, or nothing), or sortLSH
//! blocks computed exactly plus a sampled residual (HyperAttention, KDEformer; docs/reference.md §6.3).

pub mod column_uniform;
pub mod hyperattention;
pub mod informer;
pub mod kdeformer;
pub mod skeinformer;
