//! Shared numerics, written once: the fused exact-attention kernel (`flash`, the target's and the
//! decoder forward's), the spectral norm (the metric), matrix inverses used by the
//! Nyström-type methods, seeded sampling, the vectorised row exponentials of exact attention,
//! softmax over gathered key sets (the sparse methods) and LSH hashing with bucket sorts.
//! `formats` holds the number formats of §8.2 (f16, bf16, E4M3, ggml blocks, integer groups).

pub mod agreement;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod flash;
pub mod formats;
pub mod gqa;
pub mod inverse;
pub mod key_sets;
pub mod lsh;
pub mod next_token;
pub mod pooling;
pub mod rope;
pub mod sampling;
pub mod shifted_exp;
pub mod spectral;
pub mod visible;
