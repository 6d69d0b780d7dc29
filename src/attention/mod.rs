//! Attention: the exact softmax target and every approximation, one file per method, grouped by
//! family (`lowrank/`, `features/`, `sampling/`, `sparse/`, `hybrid/`, the causal `prefill/`);
//! `exact`, `vmean` and the `registry` stay at the top.
//!
//! A method sees one head's Q, K, V ([n, p] tensors on a candle `Device`, in the run's dtype)
//! plus shared per-head products ([`HeadInputs`]), and a seeded generator for its randomness.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};

use crate::numerics::sampling::TrialRng;

pub mod batch;
pub mod decode;
pub mod exact;
pub mod exact_kernelized;
pub mod features;
mod head_inputs;
pub mod hybrid;
pub mod latent;
pub mod lowrank;
pub mod prefill;
pub mod quantized;
mod registry;
pub mod sampling;
pub mod sparse;
pub mod spec;
pub mod target;
#[cfg(test)]
pub(crate) mod test_util;
pub mod vmean;
pub mod zero;

pub use batch::{HeadBatch, HeadTrials};
pub use head_inputs::{HeadInputs, Memo};
pub use registry::{
    budgets, by_id, decode_method_ids, decode_preset_ids, describe, family_method_ids,
    field_method_ids, field_method_ids_masked, layer_budgets, mask_method_ids, method_ids,
    press_method_ids, registry, target_method_ids, FIGURE_METHODS,
};
pub use spec::{AttentionSpec, LayerType, SpecFeatures};
pub use target::{Mask, Target};

// The flat paths from before the split into families (`attention::skyformer::…`) keep working.
pub use features::{performer, performer_gauss, performer_trig, rff_gauss};
pub use hybrid::scatterbrain;
pub use lowrank::{linformer, nystromformer, skyformer, skyformer_gauss, svd_optimal};
pub use sampling::{column_uniform, hyperattention, informer, kdeformer, skeinformer};
pub use sparse::{bigbird, reformer, topk, window};

/// What a method returns: Ô ([n, p]) and, for methods that divide by an estimated row
/// normalizer D̂, that normalizer ([n]) so that rows with D̂ ≤ 0 can be counted (never clamped).
pub struct Approximation {
    pub output: Tensor,
    pub normalizer: Option<Tensor>,
    /// For restrict-and-renormalise methods, the keys each row visited (trials.csv `keys` and
    /// `mass`, docs/reference.md §7.2); None for every other method.
    pub support: Option<KeySupport>,
}

/// What a restrict-and-renormalise method's rows visited.
pub struct KeySupport {
    /// The mean over rows of |S_i| (realised keys per query).
    pub keys: f64,
    /// log Σ_{j∈S_i} e^{s_ij} per row ([n], f64): with exact attention's log D_i, the mass the row
    /// captured is Σ_{j∈S_i} P_ij = exp(this − log D_i).
    pub log_restricted: Tensor,
    /// Decode methods (§9.1): the prompt keys the query head's K/V head holds for its group, the
    /// union of the group's sets (averaged over the continuation for per-query sets).
    pub kv_union: Option<f64>,
}

impl Approximation {
    pub fn plain(output: Tensor) -> Self {
        Self {
            output,
            normalizer: None,
            support: None,
        }
    }

    /// Ô of a key-set softmax run with its log-normaliser, and the mean keys per row.
    pub fn restricted(out: crate::numerics::key_sets::KeySetOutput, keys: f64) -> Result<Self> {
        let log_restricted = out.log_normalizer.ok_or_else(|| {
            anyhow::anyhow!("a restricted approximation needs its log-normaliser")
        })?;
        Ok(Self {
            output: out.output,
            normalizer: None,
            support: Some(KeySupport {
                keys,
                log_restricted,
                kv_union: None,
            }),
        })
    }

    /// The mean over rows of the exact attention mass on the visited keys, mean_i exp(log Z_{S_i} −
    /// log D_i), given exact attention's log D ([n]); None without a support.
    pub fn mass(&self, log_rowsum: &Tensor) -> Result<Option<f64>> {
        let Some(s) = &self.support else {
            return Ok(None);
        };
        let diff =
            (s.log_restricted.to_dtype(DType::F64)? - log_rowsum.to_dtype(DType::F64)?)?.exp()?;
        Ok(Some(diff.mean_all()?.to_scalar::<f64>()?))
    }
}

/// The kind of approximation a method is (ARCHITECTURE.md's directories), for presets, tables and
/// figure legends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// Not an approximation scheme but a yardstick: V-Mean (every row mean(V)).
    Reference,
    /// Rank-d factorisations of A or P (Nyström-type, projections, the SVD floor).
    LowRank,
    /// Random features of the softmax kernel.
    Features,
    /// Exact logits on sampled keys or queries, the rest estimated.
    Sampling,
    /// Restrict-and-renormalise on a structured or hashed key set per query (docs/reference.md §6.1).
    Sparse,
    /// Sparse + low-rank combinations (docs/reference.md §6.2.2).
    Hybrid,
    /// The LLM-era causal prefill patterns (docs/reference.md §7.5): restrict-and-renormalise on sinks,
    /// pages, blocks, columns and diagonals.
    Prefill,
    /// Quantized attention (docs/reference.md §8): every key, stored and multiplied at fewer bits (KV
    /// caches, SageAttention kernels); no budget d.
    Quantized,
    /// Decode-time KV-cache compression (docs/reference.md §9): the continuation reads a compressed
    /// prompt (`--decode N_F` only).
    Decode,
    /// A method defined outside the registry (a user's own, e.g. from Python); never a
    /// built-in one (a test checks).
    User,
}

impl Family {
    /// The lower-case name used in tables and listings.
    pub fn name(self) -> &'static str {
        match self {
            Family::Reference => "reference",
            Family::LowRank => "lowrank",
            Family::Features => "features",
            Family::Sampling => "sampling",
            Family::Sparse => "sparse",
            Family::Hybrid => "hybrid",
            Family::Prefill => "prefill",
            Family::Quantized => "quantized",
            Family::Decode => "decode",
            Family::User => "user",
        }
    }
}

/// Refuses `m` on a head whose spec has a feature beyond its mask (a window shorter than the
/// keys, a soft-cap, sinks, a scale other than 1/√p) that the method does not implement
/// ([`Method::spec_support`]): the one place every trial passes, prefill or decode, alone or
/// batched (docs/reference.md §7.7.6 gives each method's rules; until a method has them it does
/// not run there).
pub fn refuse_unimplemented_spec(m: &dyn Method, head: &HeadInputs) -> Result<()> {
    refuse_beyond(m, head, m.spec_support())
}

/// [`refuse_unimplemented_spec`] for a trial under the decode protocol, whose support is the
/// method's decode form's ([`decode::Decoding::decode_spec_support`]).
pub fn refuse_unimplemented_decode_spec(m: &dyn Method, head: &HeadInputs) -> Result<()> {
    refuse_beyond(m, head, spec_support_under(m, true))
}

/// What `m` implements of a layer's spec under the decode protocol (`decode`) or in prefill.
pub fn spec_support_under(m: &dyn Method, decode: bool) -> SpecFeatures {
    if decode {
        m.decoding()
            .map_or(SpecFeatures::NONE, |d| d.decode_spec_support())
    } else {
        m.spec_support()
    }
}

fn refuse_beyond(m: &dyn Method, head: &HeadInputs, support: SpecFeatures) -> Result<()> {
    let features = head.spec.features(head.p(), head.n());
    match features.first_missing(support) {
        Some(feature) => Err(crate::usage!(
            "{} does not yet implement {feature} (§7.7.6)",
            m.id()
        )),
        None => Ok(()),
    }
}

/// What a method is, declared once beside it: the descriptive methods of [`Method`] (`id`,
/// `family`, `is_oracle`, `feature_meaning`, `is_random`, `masks`, `targets`) read it through
/// [`Method::info`]. A method without one (a user's own, or one written before this existed)
/// implements those methods one by one instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MethodInfo {
    /// The CLI and CSV id.
    pub id: &'static str,
    pub family: Family,
    /// One line: what the feature count d means for this method.
    pub meaning: &'static str,
    /// Whether Ô depends on the random generator.
    pub random: bool,
    /// A quadratic oracle drawn as a reference curve (see [`Method::is_oracle`]).
    pub oracle: bool,
    /// The masks the method has a form for (see [`Method::masks`]).
    pub masks: &'static [Mask],
    /// The targets the method estimates (see [`Method::targets`]).
    pub targets: &'static [Target],
    /// The spec features beyond the mask the method implements (see [`Method::spec_support`]).
    pub spec: SpecFeatures,
    /// Whose keys a budget d counts (see [`BudgetRule`]).
    pub budget: BudgetRule,
}

/// Whose keys a budget d counts, for a method that selects keys (docs/reference.md §9.1, issue 58).
/// The method's id fixes it (a `_press` id is kvpress's rule); the manifests record it per method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetRule {
    /// Each query head selects its own d keys (the authors' codes, which run `repeat_kv` first):
    /// a K/V head holds the union of its group's sets.
    PerQueryHead,
    /// One set of d keys per K/V head, from scores averaged over its group (kvpress).
    PerKvHead,
    /// One set of d keys for the whole layer (windows, TOVA).
    PerLayer,
}

impl BudgetRule {
    pub fn name(self) -> &'static str {
        match self {
            BudgetRule::PerQueryHead => "per_query_head",
            BudgetRule::PerKvHead => "per_kv_head",
            BudgetRule::PerLayer => "per_layer",
        }
    }
}

impl MethodInfo {
    /// The common case, to complete with `..`: not an oracle, bidirectional only, estimating
    /// softmax attention (id, family, meaning and randomness are each method's own).
    pub const BASE: MethodInfo = MethodInfo {
        id: "",
        family: Family::User,
        meaning: "",
        random: false,
        oracle: false,
        masks: &[Mask::None],
        targets: &[Target::Softmax],
        spec: SpecFeatures::SCALE,
        budget: BudgetRule::PerQueryHead,
    };
    /// Both masks: a method with a causal form (docs/reference.md §7.4).
    pub const BOTH_MASKS: &'static [Mask] = &[Mask::None, Mask::Causal];
    /// The causal mask only: the LLM-era prefill methods (docs/reference.md §7.5).
    pub const CAUSAL_ONLY: &'static [Mask] = &[Mask::Causal];
    /// The kernelized target C·V only (docs/reference.md §6.4).
    pub const KERNELIZED: &'static [Target] = &[Target::Kernelized];
}

/// An attention approximation scored by the benchmark.
///
/// A registered method declares what it is in a [`MethodInfo`] ([`Method::info`]) and implements
/// `macs` and `approximate`; the descriptive methods below read the info unless overridden.
pub trait Method: Send + Sync {
    /// What the method is, declared once; None for a method that implements the descriptive
    /// methods itself (which it must then do: `id`, `feature_meaning` and `is_random` have no
    /// answer without one).
    fn info(&self) -> Option<&'static MethodInfo> {
        None
    }
    /// The CLI and CSV id.
    fn id(&self) -> &'static str {
        required_info(self, "id").id
    }
    /// The family the method belongs to. The default, `User`, is for methods defined outside
    /// the crate (so that they need not know the taxonomy); every registered method declares
    /// one, which a test checks.
    fn family(&self) -> Family {
        self.info().map_or(Family::User, |i| i.family)
    }
    /// Whether the method is a quadratic oracle drawn as a reference curve (`svd_optimal`,
    /// `topk`) rather than an efficient approximation; its d is a size, not a cost.
    fn is_oracle(&self) -> bool {
        self.info().is_some_and(|i| i.oracle)
    }
    /// Whose keys its budget d counts (a user's own method: per query head, as it is called per
    /// head).
    fn budget_rule(&self) -> BudgetRule {
        self.info().map_or(BudgetRule::PerQueryHead, |i| i.budget)
    }
    /// One line: what the feature count d means for this method.
    fn feature_meaning(&self) -> &'static str {
        required_info(self, "feature_meaning").meaning
    }
    /// The targets the method estimates (docs/reference.md §6.4.1: a method that row-normalises or is
    /// built from softmax blocks estimates softmax attention, not C·V). A user's own method
    /// (the default `Family::User`) is scored against whichever target the run has.
    /// The masks the method has a form for (docs/reference.md §7.4: a method without a published causal
    /// form is refused under the causal mask). A user's own method is told the run's mask
    /// (`HeadInputs::mask`) and may serve both.
    fn masks(&self) -> &'static [Mask] {
        if let Some(info) = self.info() {
            info.masks
        } else if self.family() == Family::User {
            &[Mask::None, Mask::Causal]
        } else {
            &[Mask::None]
        }
    }
    /// The features of a layer's spec beyond its mask that the method implements
    /// (docs/reference.md §7.7.6); a head whose spec has another refuses it
    /// ([`refuse_unimplemented_spec`]). The scale is implemented for a method by
    /// [`HeadInputs::method_inputs`] (Q and K rescaled) where the method reads Q and K only through
    /// scaled products q·k/√p, ranks of them, means of rows, and sign-of-projection hashes: then
    /// the method on the rescaled inputs is the method on the layer. A registered method declares
    /// it in its [`MethodInfo`] (the base has it); a user's own method has none yet.
    fn spec_support(&self) -> SpecFeatures {
        self.info().map_or(SpecFeatures::NONE, |i| i.spec)
    }
    /// Whether the method reads the head's spec itself (its τ, cap, sink and window, e.g.
    /// through [`HeadInputs::key_logits`]); otherwise a scaled head reaches it as rescaled inputs
    /// ([`HeadInputs::method_inputs`]). Rescaled inputs stand for a spec whose only feature is its
    /// scale, so a method that implements any other feature reads the spec, scale included.
    fn reads_spec(&self) -> bool {
        let s = self.spec_support();
        s.window || s.softcap || s.sinks
    }
    /// Leading multiply-adds under `mask`; the bidirectional count unless the method's causal
    /// form costs otherwise.
    fn macs_masked(&self, n: usize, p: usize, d: usize, mask: Mask) -> f64 {
        let _ = mask;
        self.macs(n, p, d)
    }
    fn targets(&self) -> &'static [Target] {
        if let Some(info) = self.info() {
            info.targets
        } else if self.family() == Family::User {
            &[Target::Softmax, Target::Kernelized]
        } else {
            &[Target::Softmax]
        }
    }
    /// Whether Ô depends on the random generator (deterministic methods give one value per head).
    fn is_random(&self) -> bool {
        required_info(self, "is_random").random
    }
    /// Leading multiply-add count (docs/reference.md §2.11).
    fn macs(&self, n: usize, p: usize, d: usize) -> f64;
    /// Why (n, d) cannot be run, if it cannot.
    fn check(&self, n: usize, d: usize) -> std::result::Result<(), String> {
        if d == 0 && self.has_budget() {
            return Err(
                "d must be at least 1: it is the method's budget (only the quantized family runs without one, at d = 0)"
                    .into(),
            );
        }
        let _ = n;
        Ok(())
    }
    /// Why a head of dimension p cannot be run, if it cannot (docs/reference.md §8.1: the ggml and KIVI
    /// formats store blocks of 32 along p). The sweep asks before its first window.
    fn check_head_dim(&self, p: usize) -> std::result::Result<(), String> {
        let _ = p;
        Ok(())
    }
    /// Whether the method runs on an MLA layer's latent row ([`HeadInputs::latent`]) rather than
    /// the materialised K/V: the §8 KV caches (docs/reference.md §7.7.6, MLA). A sweep refuses
    /// the other §8 methods on an MLA layer, and checks these against the latent's width.
    fn reads_mla_latent(&self) -> bool {
        false
    }
    /// Whether the method has a budget d. A method without one (the quantized family, §8.1) runs
    /// once per (window, head) with d = 0, whatever the d grid.
    fn has_budget(&self) -> bool {
        self.family() != Family::Quantized
    }
    /// Bits per K/V value the method reads at length n (`kv_bits`, docs/reference.md §8.5), for a method
    /// that declares its own: the §8 formats. The sweep gives a restrict-and-renormalise method
    /// (one that returns a key support) 16, an f16 cache's width, and every other method none.
    fn kv_bits(&self, n: usize) -> Option<f64> {
        let _ = n;
        None
    }
    /// The method under the decode protocol (§9.1), if it runs there: the §9 family and the §8
    /// KV caches. The prefill kernels (SageAttention) and every prefill or encoder method do not.
    /// The protocol is the method's own business only there: no other method sees it.
    fn decoding(&self) -> Option<&dyn decode::Decoding> {
        None
    }
    /// Computes Ô for one head with d features.
    fn approximate(&self, head: &HeadInputs, d: usize, rng: &mut TrialRng)
        -> Result<Approximation>;
    /// One trial: Ô with the generator of the trial's derived seed (what the sweep calls). A
    /// method that draws its randomness elsewhere (a user's Python function seeding a numpy
    /// Generator) overrides this to receive the seed itself.
    fn approximate_trial(&self, head: &HeadInputs, d: usize, seed: u64) -> Result<Approximation> {
        self.approximate(head, d, &mut crate::numerics::sampling::rng_from_seed(seed))
    }
    /// Ô for every head of a batch at one d, head b with the generator of its own trial's seed:
    /// what a sweep on a device calls once per window, method and d. The default runs the heads'
    /// trials one by one; a method whose products batch over heads overrides it, and its head b
    /// must equal `approximate_trial(&batch.heads[b], d, seeds[b])` within rounding (each such
    /// method has a test that checks so).
    fn approximate_heads(&self, trials: &HeadTrials) -> Result<Vec<Approximation>> {
        batch::each_head(self, trials)
    }
}

/// `m`'s info, for a descriptive method (`what`) that has no answer without it.
fn required_info<M: Method + ?Sized>(m: &M, what: &str) -> &'static MethodInfo {
    m.info()
        .unwrap_or_else(|| panic!("a Method implements `info` or `{what}` (see MethodInfo)"))
}

/// Row-wise max-shifted softmax over the last dimension (re-exported so methods share one).
pub fn row_softmax(x: &Tensor) -> Result<Tensor> {
    Ok(candle_nn::ops::softmax_last_dim(x)?)
}

/// x · p^{-1/4}: the input scaling under which q̃·k̃ = q·k/√p (docs/reference.md §1.1).
pub fn quarter_scale(x: &Tensor, p: usize) -> Result<Tensor> {
    Ok((x * (p as f64).powf(-0.25))?)
}

/// Ones column of length n, [n, 1].
pub fn ones_col(n: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    Ok(Tensor::ones((n, 1), dtype, device)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_every_method_has_a_family() {
        let ids = method_ids();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ids.len(), "duplicate ids in {ids:?}");
        for m in registry() {
            assert_ne!(m.family(), Family::User, "{} names no family", m.id());
        }
        let family = |id: &str| by_id(id).unwrap().family();
        assert_eq!(family("vmean"), Family::Reference);
        assert_eq!(family("skyformer"), Family::LowRank);
        assert_eq!(family("svd_optimal"), Family::LowRank);
        assert_eq!(family("performer_favor"), Family::Features);
        assert_eq!(family("performer_trig"), Family::Features);
        assert_eq!(family("skein_uniform"), Family::Sampling);
        assert_eq!(family("hyperattention"), Family::Sampling);
        assert_eq!(family("kdeformer"), Family::Sampling);
        assert_eq!(
            family_method_ids(Family::Hybrid),
            vec!["scatterbrain", "scatterbrain_local"]
        );
        assert_eq!(
            family_method_ids(Family::Sparse),
            vec!["window", "topk", "bigbird", "reformer"]
        );
        let oracles: Vec<&str> = registry()
            .iter()
            .filter(|m| m.is_oracle())
            .map(|m| m.id())
            .collect();
        assert_eq!(
            oracles,
            vec![
                "svd_optimal",
                "topk",
                "h2o",
                "topk_dec",
                "evict_oracle",
                "exact_kernelized"
            ]
        );
        assert_eq!(Family::LowRank.name(), "lowrank");
    }

    #[test]
    fn field_preset_is_every_registered_softmax_method_in_registry_order() {
        let softmax: Vec<&str> = registry()
            .iter()
            .filter(|m| m.targets() == [Target::Softmax] && m.masks().contains(&Mask::None))
            .filter(|m| m.family() != Family::Quantized)
            .map(|m| m.id())
            .collect();
        assert_eq!(field_method_ids(), softmax);
        let causal_only = family_method_ids(Family::Prefill);
        let decode = family_method_ids(Family::Decode);
        let quantized = family_method_ids(Family::Quantized);
        // Every registered method has exactly one target; together they are the registry.
        let kernelized = target_method_ids(Target::Kernelized);
        assert_eq!(
            kernelized,
            vec![
                "exact_kernelized",
                "zero",
                "skyformer_gauss",
                "skyformer_gauss_iter",
                "performer_gauss",
                "rff_gauss"
            ]
        );
        assert_eq!(
            softmax.len() + causal_only.len() + decode.len() + quantized.len() + kernelized.len(),
            method_ids().len()
        );
        // The Figure-1 methods keep their registry positions (legend order, baselines).
        assert_eq!(&method_ids()[..7], FIGURE_METHODS);
    }

    #[test]
    fn flat_paths_from_before_the_family_split_resolve() {
        // `attention::skyformer::…` etc. are re-exports of the family modules.
        assert_eq!(skyformer::GAMMA, lowrank::skyformer::GAMMA);
        assert_eq!(performer::EPS, features::performer::EPS);
        assert_eq!(
            informer::factor_and_top(512, 16),
            sampling::informer::factor_and_top(512, 16)
        );
        assert_eq!(bigbird::block_size(64), 16);
    }
}
