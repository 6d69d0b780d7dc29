//! The validated run configuration: the one place that knows defaults, method groups and what
//! makes two runs comparable (everything here changes results; output paths and verbosity don't).
//!
//! A caller (the CLI, the Python package) states what it wants in plain option structs
//! ([`InputOptions`], [`RunOptions`]); [`InputConfig::new`] and [`RunConfig::new`] validate them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::attention::{self, Mask, Target};
use crate::usage;

mod choices;
mod methods;
pub(crate) use choices::choice;
pub use choices::{Choice, Dtype, EmbeddingPolicy, FigurePreset, InitScheme, ModelKind};
pub use methods::{
    check_user_name, parse_methods, parse_methods_decode, parse_methods_masked, parse_methods_with,
    PRESETS,
};

/// The methods of both papers' Figure 1 (Skyformer's four, Skeinformer's four; Informer is
/// shared), first in the registry.
pub use crate::attention::FIGURE_METHODS;

/// Skyformer Figure 1's methods (Chen et al., NeurIPS 2021).
pub const SKYFORMER_FIGURE: &[&str] = &["skyformer", "nystromformer", "performer", "informer"];
/// Skeinformer Figure 1's methods (Chen et al., NAACL 2022).
pub const SKEINFORMER_FIGURE: &[&str] = &["skeinformer", "vmean", "informer", "linformer"];

/// A `--shard K/N` spec: this run takes the (n, window) units whose index ≡ K − 1 (mod N).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Shard {
    pub fn parse(spec: &str) -> Result<Self> {
        let bad = || usage!("--shard {spec}: expected K/N with 1 ≤ K ≤ N, e.g. --shard 2/8");
        let (k, n) = spec.split_once('/').ok_or_else(bad)?;
        let (index, count): (usize, usize) = (
            k.trim().parse().map_err(|_| bad())?,
            n.trim().parse().map_err(|_| bad())?,
        );
        if count == 0 || index == 0 || index > count {
            return Err(bad());
        }
        Ok(Self { index, count })
    }

    /// Whether unit number `unit` (0-based, in grid order) belongs to this shard.
    pub fn takes(&self, unit: usize) -> bool {
        unit % self.count == self.index - 1
    }
}

/// Model, corpus and Q/K/V options as a caller states them (the CLI's flags of the same names).
#[derive(Debug, Clone, PartialEq)]
pub struct InputOptions {
    pub model: ModelKind,
    /// Hugging Face model id (used when no `model_dir` is given).
    pub model_id: String,
    /// Hub revision of `model_id`.
    pub revision: String,
    /// Local model directory instead of the hub.
    pub model_dir: Option<PathBuf>,
    pub model_seed: u64,
    pub init: InitScheme,
    /// In [0, 1).
    pub embedding_dropout: f64,
    /// None: the same as `model`.
    pub embeddings_from: Option<ModelKind>,
    pub embedding: EmbeddingPolicy,
    pub layer: usize,
    /// Local corpus file instead of the hub dataset.
    pub corpus: Option<PathBuf>,
    /// Split of the hub dataset (used when no `corpus` is given).
    pub split: String,
    pub device: String,
    pub dtype: Dtype,
}

impl Default for InputOptions {
    /// The CLI's defaults (a test in cli.rs holds the two together).
    fn default() -> Self {
        Self {
            model: ModelKind::Pretrained,
            model_id: "bert-base-cased".into(),
            revision: "main".into(),
            model_dir: None,
            model_seed: 12345,
            init: InitScheme::Hf,
            embedding_dropout: 0.0,
            embeddings_from: None,
            embedding: EmbeddingPolicy::WordPosFirst,
            layer: 0,
            corpus: None,
            split: "test".into(),
            device: "cpu".into(),
            dtype: Dtype::F32,
        }
    }
}

/// Sweep options as a caller states them (the CLI's flags of the same names); lists are the
/// flags' raw comma-separated items, None for the default (of `figure`, if given).
#[derive(Debug, Clone, PartialEq)]
pub struct RunOptions {
    pub inputs: InputOptions,
    /// What the methods approximate and are scored against.
    pub target: Target,
    /// Which keys a query attends to; None: the model's default (causal for decoders, resolved by
    /// the caller, e.g. `inputs::default_mask`), else none.
    pub mask: Option<Mask>,
    pub figure: Option<FigurePreset>,
    pub lengths: Option<Vec<String>>,
    pub features: Option<Vec<String>>,
    pub methods: Option<Vec<String>>,
    pub windows: usize,
    /// None = all heads.
    pub heads: Option<Vec<usize>>,
    pub seed: u64,
    /// The caller's own methods (e.g. Python functions), by the names `methods` uses for them.
    pub user_methods: BTreeMap<String, UserMethod>,
    /// The decode protocol's continuation length n_f (docs/reference.md §9.1, `--decode N_F`); None:
    /// prefill (every row scored).
    pub decode: Option<usize>,
}

impl Default for RunOptions {
    /// The CLI's defaults: the default grid (or a figure's), 64 windows, seed 0.
    fn default() -> Self {
        Self {
            inputs: InputOptions::default(),
            target: Target::Softmax,
            mask: None,
            figure: None,
            lengths: None,
            features: None,
            methods: None,
            windows: 64,
            heads: None,
            seed: 0,
            user_methods: BTreeMap::new(),
            decode: None,
        }
    }
}

/// Where a user's method comes from: it changes results, so it is part of the configuration
/// (a resumed run with an edited function is refused like any other change).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserMethod {
    /// The language and kind, e.g. "python function" or "score files".
    pub kind: String,
    /// Module and qualified name, or the directory the files came from.
    pub origin: String,
    /// sha256 of the function's source (or of the files).
    pub sha256: String,
}

/// The Wikitext-2 raw test split on the hub (parquet).
pub const WIKITEXT_REPO: &str = "Salesforce/wikitext";
pub const WIKITEXT_CONFIG: &str = "wikitext-2-raw-v1";

/// Where the model files come from.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub enum ModelSource {
    Hub { id: String, revision: String },
    Dir(PathBuf),
}

/// Validated input options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputConfig {
    pub model: ModelKind,
    pub embeddings_from: ModelKind,
    /// `hub:<id>@<revision>` or `dir:<path>`.
    pub model_source: String,
    pub model_seed: u64,
    pub embedding: EmbeddingPolicy,
    pub layer: usize,
    /// `file:<path>` or `hub:Salesforce/wikitext/wikitext-2-raw-v1/<split>`.
    pub corpus: String,
    pub device: String,
    pub dtype: Dtype,
    #[serde(default)]
    pub init: InitScheme,
    #[serde(default)]
    pub embedding_dropout: f64,
}

/// Validated sweep options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    pub inputs: InputConfig,
    /// Absent from manifests of softmax runs (the default), so runs made before targets existed
    /// stay comparable and resumable.
    #[serde(default, skip_serializing_if = "Target::is_softmax")]
    pub target: Target,
    /// Absent from manifests of unmasked runs (the default), as `target` is.
    #[serde(default, skip_serializing_if = "Mask::is_none")]
    pub mask: Mask,
    pub lengths: Vec<usize>,
    pub features: Vec<usize>,
    pub methods: Vec<String>,
    pub windows: usize,
    /// None = all heads.
    pub heads: Option<Vec<usize>>,
    pub seed: u64,
    /// The user's methods among `methods` (absent from manifests of runs without any).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub user_methods: BTreeMap<String, UserMethod>,
    /// The decode protocol's n_f (docs/reference.md §9.1); absent from manifests of prefill runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode: Option<usize>,
}

impl InputConfig {
    pub fn new(a: &InputOptions) -> Result<Self> {
        if !(0.0..1.0).contains(&a.embedding_dropout) {
            return Err(usage!(
                "--embedding-dropout {}: must be in [0, 1)",
                a.embedding_dropout
            ));
        }
        if a.split.is_empty() || a.split.contains('/') {
            return Err(usage!(
                "--split '{}': expected a split name such as test or validation",
                a.split
            ));
        }
        Ok(Self {
            model: a.model,
            embeddings_from: a.embeddings_from.unwrap_or(a.model),
            model_source: match &a.model_dir {
                Some(d) => format!("dir:{}", d.display()),
                None => format!("hub:{}@{}", a.model_id, a.revision),
            },
            model_seed: a.model_seed,
            embedding: a.embedding,
            layer: a.layer,
            corpus: match &a.corpus {
                Some(f) => format!("file:{}", f.display()),
                None => format!("hub:{}/{}/{}", WIKITEXT_REPO, WIKITEXT_CONFIG, a.split),
            },
            device: a.device.clone(),
            dtype: a.dtype,
            init: a.init,
            embedding_dropout: a.embedding_dropout,
        })
    }

    pub fn source(&self) -> ModelSource {
        if let Some(d) = self.model_source.strip_prefix("dir:") {
            ModelSource::Dir(d.into())
        } else {
            let s = self.model_source.trim_start_matches("hub:");
            let (id, rev) = s.rsplit_once('@').unwrap_or((s, "main"));
            ModelSource::Hub {
                id: id.to_string(),
                revision: rev.to_string(),
            }
        }
    }

    pub fn needs_pretrained_weights(&self) -> bool {
        self.model == ModelKind::Pretrained || self.embeddings_from == ModelKind::Pretrained
    }

    /// Embedding dropout (p, seed) for window `window` of length `n`, if enabled.
    pub fn dropout_for(&self, n: usize, window: usize) -> Option<(f64, u64)> {
        (self.embedding_dropout > 0.0).then(|| {
            (
                self.embedding_dropout,
                crate::numerics::sampling::derive_labeled_seed(
                    self.model_seed,
                    &format!("embedding-dropout/{n}/{window}"),
                ),
            )
        })
    }

    pub fn candle_dtype(&self) -> candle_core::DType {
        self.dtype.candle()
    }
}

/// Parses a comma-separated list of positive integers for `flag`.
/// The longest window accepted (2²⁴ tokens): far past any model's context, and small enough that
/// no product of a length with a window count, a head count or a head dimension wraps around.
pub const MAX_LENGTH: usize = 1 << 24;

/// The most windows per length accepted (every window is a separate forward).
pub const MAX_WINDOWS: usize = 1 << 20;

/// Checks a window length `n` given by `flag` (`--lengths` of the sweep, `--length` of
/// `dump-qkv`): the one place that says what a length may be.
pub fn check_length(flag: &str, n: usize) -> Result<usize> {
    if n == 0 {
        return Err(usage!(
            "{flag}: 0 is not allowed; a window holds at least 1 token"
        ));
    }
    if n > MAX_LENGTH {
        return Err(usage!(
            "{flag} {n}: longer than the {MAX_LENGTH} tokens a window may hold; give a length of at most {MAX_LENGTH}"
        ));
    }
    Ok(n)
}

/// Checks a window count (`--windows`).
pub fn check_windows(count: usize) -> Result<usize> {
    match count {
        0 => Err(usage!(
            "--windows 0: at least one window per length is needed"
        )),
        c if c > MAX_WINDOWS => Err(usage!(
            "--windows {c}: more than {MAX_WINDOWS} windows per length; give at most {MAX_WINDOWS}"
        )),
        c => Ok(c),
    }
}

pub fn parse_positive_list(flag: &str, values: &[String]) -> Result<Vec<usize>> {
    let values: Vec<&str> = values
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .collect();
    if values.is_empty() {
        return Err(usage!(
            "{flag} is empty: give comma-separated positive integers, e.g. {flag} 512,1024"
        ));
    }
    let mut out = Vec::with_capacity(values.len());
    for v in values {
        let x: usize = v
            .parse()
            .map_err(|_| usage!("{flag}: '{v}' is not a positive integer; give comma-separated positive integers, e.g. {flag} 512,1024"))?;
        if x == 0 {
            return Err(usage!(
                "{flag}: 0 is not allowed; every value must be at least 1"
            ));
        }
        if !out.contains(&x) {
            out.push(x);
        }
    }
    Ok(out)
}

impl RunConfig {
    pub fn new(a: &RunOptions) -> Result<Self> {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // The decode protocol (§9.1) is causal: a continuation reads the tokens before it.
        if let (Some(n_f), Some(Mask::None)) = (a.decode, a.mask) {
            return Err(usage!(
                "--decode {n_f} with --mask none: a continuation query reads only the tokens before it (docs/reference.md §9.1); drop --mask none"
            ));
        }
        // The continuation protocol scores causal softmax attention (§9.1); the kernelized
        // target has no mask, so its exact target would be computed over keys a continuation
        // query never reads (issue 44: it reached the device check as a "wrong result").
        if let (Some(n_f), Target::Kernelized) = (a.decode, a.target) {
            return Err(usage!(
                "--decode {n_f} with --target kernelized: the decode protocol scores causal softmax attention (docs/reference.md §9.1) and the kernelized target is defined without a mask (§7.2); drop --target kernelized, or drop --decode"
            ));
        }
        if a.decode == Some(0) {
            return Err(usage!(
                "--decode 0: give the continuation length n_f, at least 1 ({} recommended)",
                attention::decode::RECOMMENDED_N_F
            ));
        }
        if let (Some(_), Some(fig)) = (a.decode, a.figure) {
            return Err(usage!(
                "--figure {fig} reproduces a prefill figure; drop --decode"
            ));
        }
        let mask = if a.decode.is_some() {
            Mask::Causal
        } else {
            a.mask.unwrap_or_default()
        };
        if let (Some(fig), Mask::Causal) = (a.figure, mask) {
            return Err(usage!(
                "--figure {fig} reproduces a bidirectional (BERT) figure; drop --mask causal"
            ));
        }
        let (def_lengths, def_methods) = match a.figure {
            Some(FigurePreset::Skyformer) => (
                strings(&["512", "1024", "2048", "4096"]),
                strings(SKYFORMER_FIGURE),
            ),
            Some(FigurePreset::Skeinformer) => {
                (strings(&["1024", "4096"]), strings(SKEINFORMER_FIGURE))
            }
            None => (
                strings(&["512", "1024", "2048", "4096"]),
                // The default methods are the papers' (softmax) or every kernelized-target method.
                strings(&[match a.target {
                    Target::Softmax => "figure",
                    Target::Kernelized => "kernelized",
                }]),
            ),
        };
        if let (Some(fig), Target::Kernelized) = (a.figure, a.target) {
            return Err(usage!(
                "--figure {fig} reproduces a softmax-attention figure; drop --target kernelized, or use --methods kernelized without --figure"
            ));
        }
        // Under the causal mask (docs/reference.md §7.3) d is keys per query on 16..2048, at the lengths
        // of decoder prefills (SmolLM2's trained context is 8192), every causal method.
        let (def_lengths, def_methods) = match (mask, a.decode) {
            (Mask::Causal, Some(_)) => (strings(&["2048", "8192"]), strings(&["decode"])),
            (Mask::Causal, None) => (strings(&["2048", "8192"]), strings(&["all"])),
            (Mask::None, _) => (def_lengths, def_methods),
        };
        let def_features = match mask {
            Mask::Causal => strings(&["16", "32", "64", "128", "256", "512", "1024", "2048"]),
            Mask::None => strings(&["8", "16", "32", "64", "128", "256"]),
        };
        let lengths = parse_positive_list("--lengths", a.lengths.as_ref().unwrap_or(&def_lengths))?;
        for &n in &lengths {
            check_length("--lengths", n)?;
        }
        let features =
            parse_positive_list("--features", a.features.as_ref().unwrap_or(&def_features))?;
        for name in a.user_methods.keys() {
            check_user_name(name)?;
        }
        let methods = parse_methods_decode(
            a.methods.as_ref().unwrap_or(&def_methods),
            &a.user_methods,
            a.target,
            mask,
            a.decode,
        )?;
        if let Some(n_f) = a.decode {
            if let Some(&n) = lengths.iter().find(|&&n| n <= n_f) {
                return Err(usage!(
                    "--decode {n_f} leaves no prompt at n = {n}: every length must exceed n_f (the prompt is n − n_f tokens)"
                ));
            }
        }
        check_windows(a.windows)?;
        // d > n asks for more features (landmarks, samples, projected rows) than there are tokens:
        // no figure does it and most methods would silently cap it, so it is refused.
        // (A run of budget-free methods only, the quantized family, ignores the d grid.)
        let any_budget = methods.iter().any(|m| attention::budgets(m, &[1]) == [1]);
        for &n in lengths.iter().filter(|_| any_budget) {
            if let Some(&d) = features.iter().find(|&&d| d > n) {
                return Err(usage!("--features {d} exceeds the sequence length n = {n}: every d must be at most the smallest of --lengths"));
            }
        }
        for m in methods.iter().filter(|m| !a.user_methods.contains_key(*m)) {
            let method = attention::by_id(m).map_err(|e| usage!("{e}"))?;
            for &n in &lengths {
                for &d in &features {
                    method
                        .check(n, d)
                        .map_err(|why| usage!("method {m} cannot run n = {n}, d = {d}: {why}"))?;
                }
            }
        }
        Ok(Self {
            inputs: InputConfig::new(&a.inputs)?,
            target: a.target,
            mask,
            lengths,
            features,
            methods,
            windows: a.windows,
            heads: a.heads.clone(),
            seed: a.seed,
            user_methods: a.user_methods.clone(),
            decode: a.decode,
        })
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
