//! What a run approximates (docs/reference.md §1.1 and §6.4.1):
//!
//! - `softmax`: O = softmax(QKᵀ/√p)V, the two papers' Figure 1 target (computed by [`super::exact`]);
//! - `kernelized`: O_C = C·V with Skyformer's Gaussian kernel (Chen et al., NeurIPS 2021, §3,
//!   "Kernelized Attention"): C_ij = κ(q̃_i, k̃_j) = exp(−‖q̃_i − k̃_j‖²/2)
//!   = exp(q̃_i·k̃_j − ‖q̃_i‖²/2 − ‖k̃_j‖²/2), q̃ = q·p^{-1/4}, k̃ = k·p^{-1/4}, no row normalisation.
//!
//! Each method declares the targets it estimates ([`super::Method::targets`]); a run pairs one
//! target with methods that estimate it.

use serde::{Deserialize, Serialize};

use crate::numerics::visible::Visible;

/// The matrix a run's methods approximate and are scored against.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    #[default]
    Softmax,
    Kernelized,
}

crate::choice::choice!(Target {
    Softmax = "softmax" "O = softmax(QKᵀ/√p)V (both papers' Figure 1)",
    Kernelized = "kernelized"
        "O = C·V with the Gaussian kernel C_ij = exp(−‖q̃_i − k̃_j‖²/2), q̃ = q·p^-1/4, no normalisation (Skyformer's Kernelized Attention, docs/reference.md §6.4)",
});

/// Which keys a query attends to (docs/reference.md §7.2). A property of the target: the exact
/// attention a run scores against, and what every method must reproduce.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Mask {
    /// Every query attends to every key (bidirectional encoders: BERT).
    #[default]
    None,
    /// Query i attends to keys j ≤ i (decoder LLMs).
    Causal,
}

crate::choice::choice!(Mask {
    None = "none" "every query attends to every key (encoders; the default for BERT)",
    Causal = "causal" "query i attends to keys j ≤ i (decoders; the default for llama, mistral, qwen2, qwen3; docs/reference.md §7.2)",
});

impl Mask {
    /// Whether this is the bidirectional default (manifests of such runs omit the field, so that
    /// runs made before masks existed stay comparable).
    pub fn is_none(&self) -> bool {
        *self == Mask::None
    }

    /// The keys a query sees under this mask (no window).
    pub fn visible(self) -> Visible {
        Visible::new(self == Mask::Causal, None)
    }

    /// The lower-case name (as in trials.csv).
    pub fn label(self) -> &'static str {
        match self {
            Mask::None => "none",
            Mask::Causal => "causal",
        }
    }
}

impl Target {
    /// Whether this is the default target (manifests of softmax runs omit the field, so runs
    /// made before targets existed stay comparable).
    pub fn is_softmax(&self) -> bool {
        *self == Target::Softmax
    }
}
