//! Where a decoder's files come from and how they become a [`super::Prepared`] model
//! (docs/reference.md §7.1): a local directory (config.json + model.safetensors, a sharded checkpoint's
//! index, or a .gguf beside tokenizer.json), a .gguf file given directly, or a hub repo whose
//! config.json names a decoder family. Of a sharded checkpoint only the shards holding the
//! embeddings and layers 0..=L are read, and from the hub only those are downloaded.

use std::path::{Path, PathBuf};

use anyhow::Result;
use hf_hub::{Repo, RepoType};

use super::hub::{Hub, ModelSource};
use super::models::{self, DecoderConfig, DecoderWeights};
use crate::config::{InputConfig, ModelKind};
use crate::usage;

/// A decoder's files, resolved (local, or in the hub cache).
pub struct DecoderFiles {
    /// config.json, or a GGUF file whose metadata is the configuration.
    pub config: PathBuf,
    pub tokenizer: PathBuf,
    pub tokenizer_config: Option<PathBuf>,
    pub weights: Option<Weights>,
}

/// Pretrained weights of a decoder.
pub enum Weights {
    /// model.safetensors, or a sharded checkpoint's index (its needed shards beside it).
    Safetensors {
        path: PathBuf,
        shards: Vec<PathBuf>,
    },
    Gguf(PathBuf),
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

fn is_gguf(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// The only .gguf file of a directory, if it holds exactly one.
fn single_gguf(dir: &Path) -> Result<Option<PathBuf>> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| usage!("--model-dir {}: cannot list it ({e})", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && is_gguf(p))
        .collect();
    found.sort();
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        _ => Err(usage!(
            "--model-dir {}: holds several GGUF files ({}); give the one to use as --model-dir FILE.gguf",
            dir.display(),
            found
                .iter()
                .filter_map(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// A config.json's `model_type` that is neither BERT nor a decoder family: a usage error naming
/// it and what is supported (instead of a BERT parse error about missing fields).
fn check_model_type(text: &str, file: &Path) -> Result<()> {
    let v: serde_json::Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(_) => return Ok(()), // the loader reports a malformed config with its own error
    };
    match v.get("model_type").and_then(|t| t.as_str()) {
        Some(t) if t != "bert" && models::decoder_family(text).is_none() => Err(usage!(
            "config {}: model_type {t} is not supported; encoders: bert; decoders: {}",
            file.display(),
            models::SUPPORTED_FAMILIES
        )),
        _ => Ok(()),
    }
}

/// Resolves the decoder's files when `source` is a decoder (a .gguf, or a config.json whose
/// `model_type` is a decoder family); None for anything else (BERT keeps its own path).
pub fn resolve(
    source: &ModelSource,
    inputs: &InputConfig,
    depth: models::Depth,
    hub: impl Fn() -> Result<Hub>,
) -> Result<Option<DecoderFiles>> {
    let need_weights = inputs.model == ModelKind::Pretrained;
    match source {
        ModelSource::Dir(path) if path.is_file() => {
            if !is_gguf(path) {
                return Err(usage!(
                    "--model-dir {}: a file, but not a .gguf; give a model directory or a GGUF file",
                    path.display()
                ));
            }
            let dir = path.parent().unwrap_or(Path::new("."));
            Ok(Some(DecoderFiles {
                config: path.clone(),
                tokenizer: beside_tokenizer(dir, path)?,
                tokenizer_config: Some(dir.join("tokenizer_config.json")).filter(|p| p.is_file()),
                weights: need_weights.then(|| Weights::Gguf(path.clone())),
            }))
        }
        ModelSource::Dir(dir) => {
            let config = dir.join("config.json");
            let gguf = if dir.is_dir() {
                single_gguf(dir)?
            } else {
                None
            };
            let text = read(&config);
            if let Some(t) = &text {
                check_model_type(t, &config)?;
            }
            let is_decoder = text
                .map(|t| models::decoder_family(&t).is_some())
                .unwrap_or(false);
            // A decoder: its config.json names a decoder family, or it holds a GGUF and no config.
            let gguf_only = gguf.is_some() && !config.is_file();
            if !is_decoder && !gguf_only {
                return Ok(None);
            }
            let weights = if !need_weights {
                None
            } else if dir.join("model.safetensors.index.json").is_file() {
                let index = dir.join("model.safetensors.index.json");
                let shards = models::shards_needed(&index, depth)?
                    .into_iter()
                    .map(|f| dir.join(f))
                    .collect();
                Some(Weights::Safetensors {
                    path: index,
                    shards,
                })
            } else if dir.join("model.safetensors").is_file() {
                let path = dir.join("model.safetensors");
                Some(Weights::Safetensors {
                    shards: vec![path.clone()],
                    path,
                })
            } else if let Some(g) = &gguf {
                Some(Weights::Gguf(g.clone()))
            } else {
                return Err(usage!(
                    "--model-dir {}: no weights (model.safetensors, model.safetensors.index.json or one .gguf); \
                     --model initialized needs only config.json and tokenizer.json",
                    dir.display()
                ));
            };
            // A GGUF's own metadata is its configuration (a config.json beside it may be an
            // export of it, or of another checkpoint).
            let config = match (&weights, &gguf) {
                (Some(Weights::Gguf(g)), _) => g.clone(),
                (None, Some(g)) if !config.is_file() => g.clone(),
                _ => config,
            };
            Ok(Some(DecoderFiles {
                config,
                tokenizer: beside_tokenizer(dir, dir)?,
                tokenizer_config: Some(dir.join("tokenizer_config.json")).filter(|p| p.is_file()),
                weights,
            }))
        }
        ModelSource::Hub { id, revision } => {
            let hub = hub()?;
            let repo = Repo::with_revision(id.clone(), RepoType::Model, revision.clone());
            let config = hub.file(&repo, "config.json")?;
            let text = read(&config).unwrap_or_default();
            check_model_type(&text, &config)?;
            if models::decoder_family(&text).is_none() {
                return Ok(None);
            }
            let tokenizer = hub.file(&repo, "tokenizer.json")?;
            // Optional: without it the tokenizer's own post-processor decides the BOS policy.
            let tokenizer_config = hub.file(&repo, "tokenizer_config.json").ok();
            let weights = if !need_weights {
                None
            } else {
                // A sharded checkpoint's index first: then only the shards that hold the
                // embeddings and layers 0..=L are downloaded (layer 0 of a 70B model is one
                // shard of ~5 GB, not 140 GB).
                match hub.file(&repo, "model.safetensors.index.json") {
                    Ok(index) => {
                        let mut shards = Vec::new();
                        for f in models::shards_needed(&index, depth)? {
                            shards.push(hub.file(&repo, &f)?);
                        }
                        Some(Weights::Safetensors {
                            path: index,
                            shards,
                        })
                    }
                    Err(_) => {
                        let path = hub.file(&repo, "model.safetensors")?;
                        Some(Weights::Safetensors {
                            shards: vec![path.clone()],
                            path,
                        })
                    }
                }
            };
            Ok(Some(DecoderFiles {
                config,
                tokenizer,
                tokenizer_config,
                weights,
            }))
        }
    }
}

/// tokenizer.json in `dir` (the GGUF's own `tokenizer.ggml.*` vocabulary is not read).
fn beside_tokenizer(dir: &Path, model: &Path) -> Result<PathBuf> {
    let t = dir.join("tokenizer.json");
    if t.is_file() {
        Ok(t)
    } else {
        Err(usage!(
            "{}: no tokenizer.json beside it; put the model's tokenizer.json in {} (building the tokenizer \
             from a GGUF's own vocabulary is not supported)",
            model.display(),
            dir.display()
        ))
    }
}

/// The decoder's configuration and weights of embeddings and layers 0..=L.
pub fn load(
    files: &DecoderFiles,
    inputs: &InputConfig,
    depth: models::Depth,
    device: &candle_core::Device,
) -> Result<(DecoderConfig, DecoderWeights)> {
    if inputs.embeddings_from != inputs.model {
        return Err(usage!(
            "--embeddings-from applies to BERT only; a decoder's embeddings come with its weights"
        ));
    }
    // The whole model has no measured layer to check.
    let layer = match depth {
        models::Depth::Through(l) => l,
        models::Depth::Whole => 0,
    };
    let (cfg, weights) = match &files.weights {
        Some(Weights::Gguf(g)) => models::load_gguf(g, depth, device)?,
        weights => {
            let cfg = if is_gguf(&files.config) {
                models::GgufFile::open(&files.config)?.config()?
            } else {
                DecoderConfig::load(&files.config)?
            };
            check_layer(&cfg, layer)?;
            let w = match weights {
                Some(Weights::Safetensors { path, .. }) => {
                    models::load_safetensors(&cfg, depth, path, device)?
                }
                _ => models::initialize(&cfg, depth, inputs.model_seed, device)?,
            };
            (cfg, w)
        }
    };
    check_layer(&cfg, layer)?;
    Ok((cfg, weights))
}

fn check_layer(cfg: &DecoderConfig, layer: usize) -> Result<()> {
    if layer >= cfg.num_hidden_layers {
        return Err(usage!(
            "--layer {layer}: the model has {} layers (0..={})",
            cfg.num_hidden_layers,
            cfg.num_hidden_layers - 1
        ));
    }
    Ok(())
}

/// Whether `source` is a decoder, from its config.json or GGUF alone (no weights are read):
/// what sets the default mask before a run is configured.
pub fn is_decoder(source: &ModelSource, hub: impl Fn() -> Result<Hub>) -> Result<bool> {
    Ok(match source {
        ModelSource::Dir(p) if p.is_file() => is_gguf(p),
        ModelSource::Dir(d) => match read(&d.join("config.json")) {
            Some(t) => models::decoder_family(&t).is_some(),
            None => d.is_dir() && single_gguf(d)?.is_some(),
        },
        ModelSource::Hub { id, revision } => {
            let repo = Repo::with_revision(id.clone(), RepoType::Model, revision.clone());
            let config = hub()?.file(&repo, "config.json")?;
            read(&config)
                .and_then(|t| models::decoder_family(&t))
                .is_some()
        }
    })
}

/// The mask of the model's own attention (docs/reference.md §7.2): causal for a decoder, none for BERT.
pub fn native_mask(inputs: &InputConfig) -> Result<crate::attention::Mask> {
    Ok(if is_decoder(&inputs.source(), Hub::from_env)? {
        crate::attention::Mask::Causal
    } else {
        crate::attention::Mask::None
    })
}
