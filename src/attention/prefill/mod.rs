//! LLM-era sparse prefill methods (docs/reference.md §7.5), each a causal restrict-and-renormalise
//! pattern on one axis — d = keys per query (§7.3):
//!
//! - `streaming` (§7.5.1): 4 attention sinks + a recent window (StreamingLLM; MInference's A-shape);
//! - `h2o` (§7.5.2, an **oracle**: it reads exact causal rows): heavy hitters + a recent window;
//! - `quest`, `moba` (§7.5.3, §7.5.4): one page selector ([`select::page_sets`]) with two scores;
//! - `block_sparse`, `xattention` (§7.5.5, §7.5.7): one block selector ([`select::block_pattern`])
//!   with two estimators;
//! - `vertical_slash` (§7.5.6): columns and diagonals estimated from the last 64 queries.
//!
//! Common form (§7.5): S_i ⊆ {0..i}, i ∈ S_i, Ô_i = softmax over S_i of s_ij = q_i·k_j/√p times V,
//! computed by the shared [`crate::numerics::key_sets::key_set_softmax`]; every method returns its
//! realised mean |S_i| and its log-normaliser ([`crate::attention::Approximation::restricted`]) so that
//! trials.csv gets `keys` and `mass`. All are causal-only (`masks() = [Causal]`); under `Mask::None`
//! `approximate` is an error. Cost: 2p MACs per visited pair plus the estimator (§7.5 per method).
//! Blocks and pages have b = 16 keys ([`select::B`]). GQA changes only which K and V a head reads
//! (the sweep hands each query head its K/V head ⌊h·H_kv/H⌋).

pub mod block_sparse;
pub mod h2o;
pub mod moba;
pub mod quest;
pub mod select;
pub mod streaming;
pub mod vertical_slash;
pub mod xattention;

#[cfg(test)]
pub(crate) mod test_util;

#[cfg(test)]
mod tests;

/// What the prefill methods share in their [`crate::attention::MethodInfo`]: the family, causal
/// only, deterministic (each method adds its id and what d means).
pub const PREFILL: crate::attention::MethodInfo = crate::attention::MethodInfo {
    family: crate::attention::Family::Prefill,
    masks: crate::attention::MethodInfo::CAUSAL_ONLY,
    ..crate::attention::MethodInfo::BASE
};

/// A prefill method's descriptor: [`PREFILL`] with its id and what d means.
pub const fn prefill(id: &'static str, meaning: &'static str) -> crate::attention::MethodInfo {
    crate::attention::MethodInfo {
        id,
        meaning,
        ..PREFILL
    }
}

// The seven descriptors, side by side (what d means for each is in docs/reference.md §7.5).
use crate::attention::MethodInfo;

/// §7.7.6 for the methods whose sets come from ranks and fixed structure alone (the scale and a
/// cap leave ranks unchanged), and for `h2o`, whose accumulator reads the target's own rows:
/// every layer spec, through [`select::restricted`], which intersects the sets with V_i (fixed
/// keys outside the window dropped, not replaced) and forms the kept keys' logits with τ, the cap
/// and the sink.
const EVERY_SPEC: crate::attention::SpecFeatures = crate::attention::SpecFeatures::ALL;

pub const STREAMING: MethodInfo = MethodInfo {
    spec: EVERY_SPEC,
    ..prefill(
        "streaming",
        "keys per query: the 4 sink tokens + the d − 4 most recent keys (StreamingLLM; d ≥ 8)",
    )
};

pub const H2O: MethodInfo = MethodInfo {
    oracle: true,
    spec: EVERY_SPEC,
    ..prefill(
        "h2o",
        "keys per query: ⌊d/2⌋ heavy hitters by accumulated exact attention + ⌈d/2⌉ recent keys (H2O; an oracle)",
    )
};

pub const QUEST: MethodInfo = MethodInfo {
    spec: EVERY_SPEC,
    ..prefill(
        "quest",
        "keys per query in pages of 16: the own page + ⌈d/16⌉ − 1 past pages by Quest's min/max upper bound",
    )
};

pub const MOBA: MethodInfo = MethodInfo {
    spec: EVERY_SPEC,
    ..prefill(
        "moba",
        "keys per query in pages of 16: the own page + ⌈d/16⌉ − 1 past pages by q·(mean key) (MoBA's gate)",
    )
};

pub const BLOCK_SPARSE: MethodInfo = MethodInfo {
    spec: EVERY_SPEC,
    ..prefill(
        "block_sparse",
        "keys per query in blocks of 16: diagonal + first block + ⌈d/16⌉ − 2 blocks by mean-pooled Q̄·K̄ (MInference block-sparse)",
    )
};

pub const XATTENTION: MethodInfo = MethodInfo {
    spec: EVERY_SPEC,
    ..prefill(
        "xattention",
        "keys per query in blocks of 16: diagonal + first block + ⌈d/16⌉ − 2 blocks by antidiagonal (stride 4) scores (XAttention, fixed count)",
    )
};

pub const VERTICAL_SLASH: MethodInfo = MethodInfo {
    spec: EVERY_SPEC,
    ..prefill(
        "vertical_slash",
        "keys per query: ⌊d/2⌋ columns (4 sinks first) + ⌈d/2⌉ diagonals estimated from the last 64 queries (MInference)",
    )
};
