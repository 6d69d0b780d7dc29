//! What differs between the configurations of two runs, field by field, from their manifests:
//! the changes that make results incomparable, and the harmless ones (a moved directory with
//! identical files, another device, another tool version) that are only noted.

use crate::config::{Choice, ModelKind};
use crate::report::manifest::Manifest;

/// One difference between the baseline's and the current run's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// What changed, e.g. `corpus sha256`.
    pub what: String,
    pub from: String,
    pub to: String,
    /// Whether the change alters results (a configuration change) or is only noted.
    pub material: bool,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} → {}", self.what, self.from, self.to)
    }
}

/// A sha256 shortened for messages: the first 12 hex digits and an ellipsis.
pub fn short_sha(s: &str) -> String {
    if s.len() > 12 {
        format!("{}…", &s[..12])
    } else {
        s.to_string()
    }
}

fn sha_of<'a>(m: &'a Manifest, role: &str) -> Option<&'a str> {
    m.inputs
        .iter()
        .find(|f| f.role == role)
        .map(|f| f.sha256.as_str())
}

fn list<T: Ord + Clone + std::fmt::Display>(v: &[T]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn sorted<T: Ord + Clone>(v: &[T]) -> Vec<T> {
    let mut v = v.to_vec();
    v.sort();
    v.dedup();
    v
}

fn json_str<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string())
        })
        .unwrap_or_default()
}

/// Every difference between the two runs' configurations and input files.
pub fn compare(b: &Manifest, c: &Manifest) -> Vec<Change> {
    let mut out = Vec::new();
    let mut push = |what: &str, from: String, to: String, material: bool| {
        if from != to {
            out.push(Change {
                what: what.to_string(),
                from,
                to,
                material,
            });
        }
    };
    let (bi, ci) = (&b.config.inputs, &c.config.inputs);
    push(
        "model kind",
        bi.model.name().into(),
        ci.model.name().into(),
        true,
    );
    push(
        "embeddings from",
        bi.embeddings_from.name().into(),
        ci.embeddings_from.name().into(),
        true,
    );
    // A model directory or corpus file that moved but whose files are byte-identical is noted only.
    let model_files_same = ["config", "tokenizer", "weights"]
        .iter()
        .all(|r| sha_of(b, r) == sha_of(c, r));
    let both_dirs = bi.model_source.starts_with("dir:") && ci.model_source.starts_with("dir:");
    if bi.model_source != ci.model_source && both_dirs && model_files_same {
        push(
            "model directory (files identical by sha256)",
            bi.model_source.clone(),
            ci.model_source.clone(),
            false,
        );
    } else {
        push(
            "model source",
            bi.model_source.clone(),
            ci.model_source.clone(),
            true,
        );
    }
    let uses_init = |i: &crate::config::InputConfig| {
        i.model == ModelKind::Initialized || i.embeddings_from == ModelKind::Initialized
    };
    push(
        "model seed",
        bi.model_seed.to_string(),
        ci.model_seed.to_string(),
        uses_init(bi) || uses_init(ci),
    );
    push(
        "embedding policy",
        json_str(&bi.embedding),
        json_str(&ci.embedding),
        true,
    );
    push("layer", bi.layer.to_string(), ci.layer.to_string(), true);
    push(
        "linear init",
        json_str(&bi.init),
        json_str(&ci.init),
        uses_init(bi) || uses_init(ci),
    );
    push(
        "embedding dropout",
        bi.embedding_dropout.to_string(),
        ci.embedding_dropout.to_string(),
        true,
    );
    let corpus_same = sha_of(b, "corpus") == sha_of(c, "corpus") && sha_of(b, "corpus").is_some();
    push(
        if corpus_same {
            "corpus source (file identical by sha256)"
        } else {
            "corpus source"
        },
        bi.corpus.clone(),
        ci.corpus.clone(),
        !corpus_same,
    );
    push("dtype", json_str(&bi.dtype), json_str(&ci.dtype), true);
    for role in ["corpus", "weights", "config", "tokenizer"] {
        let show = |m: &Manifest| {
            sha_of(m, role)
                .map(short_sha)
                .unwrap_or_else(|| "(none)".into())
        };
        if sha_of(b, role) != sha_of(c, role) {
            push(&format!("{role} sha256"), show(b), show(c), true);
        }
    }
    push(
        "seed",
        b.config.seed.to_string(),
        c.config.seed.to_string(),
        true,
    );
    push(
        "lengths",
        list(&sorted(&b.config.lengths)),
        list(&sorted(&c.config.lengths)),
        true,
    );
    push(
        "features",
        list(&sorted(&b.config.features)),
        list(&sorted(&c.config.features)),
        true,
    );
    push(
        "methods",
        list(&sorted(&b.config.methods)),
        list(&sorted(&c.config.methods)),
        true,
    );
    push(
        "windows",
        b.config.windows.to_string(),
        c.config.windows.to_string(),
        true,
    );
    let heads = |m: &Manifest| match &m.config.heads {
        Some(h) => list(&sorted(h)),
        None => list(&(0..m.heads).collect::<Vec<_>>()),
    };
    push("heads", heads(b), heads(c), true);
    push("device", bi.device.clone(), ci.device.clone(), false);
    push(
        "approx-bench version",
        b.version.clone(),
        c.version.clone(),
        false,
    );
    push(
        "numerical dependencies",
        b.dependencies.clone(),
        c.dependencies.clone(),
        false,
    );
    // Manifests from before builds were recorded have none to compare.
    if !b.build.is_empty() && !c.build.is_empty() {
        push("build (commit)", b.build.clone(), c.build.clone(), false);
    }
    out
}

/// Whether the current configuration's grid contains the point (so that a point missing from
/// the current run is not explained by an allowed configuration change).
pub fn grid_contains(m: &Manifest, model: &str, n: usize, method: &str, d: usize) -> bool {
    let cfg = &m.config;
    cfg.inputs.model.name() == model
        && cfg.lengths.contains(&n)
        && cfg.methods.iter().any(|x| x == method)
        && crate::attention::layer_budgets(method, &cfg.features, m.sliding_window).contains(&d)
}
