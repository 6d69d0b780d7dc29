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
    pub tokenizer: TokenizerFile,
    pub tokenizer_config: Option<PathBuf>,
    pub weights: Option<Weights>,
}

/// Where a decoder's tokenizer comes from (docs/reference.md §7.1 "Tokens").
#[derive(Clone, Debug, PartialEq)]
pub enum TokenizerFile {
    /// The model's tokenizer.json (preferred where it is there: the checkpoint's own).
    Json(PathBuf),
    /// A GGUF's `tokenizer.ggml.*` metadata ([`super::gguf_tokenizer`]), when no tokenizer.json is beside it.
    Gguf(PathBuf),
}

impl TokenizerFile {
    /// The file the manifest records under the role `tokenizer`.
    pub fn path(&self) -> &Path {
        match self {
            TokenizerFile::Json(p) | TokenizerFile::Gguf(p) => p,
        }
    }
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

/// The §7.7 family (docs/reference.md §7.7) a config.json text names, if any.
fn family_of(text: &str) -> Option<&'static models::registry::FamilyEntry> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    models::registry::family_entry(v.get("model_type")?.as_str()?)
}

/// Whether a config.json text names a decoder: a Llama-style family or a §7.7 one.
fn names_decoder(text: &str) -> bool {
    models::decoder_family(text).is_some() || family_of(text).is_some()
}

/// A config.json's `model_type` that is neither BERT nor a decoder family: a usage error naming
/// it and what is supported (instead of a BERT parse error about missing fields).
fn check_model_type(text: &str, file: &Path) -> Result<()> {
    // Not JSON (a `NaN` or `Infinity` literal, which Python's json writes, is a common cause):
    // said here, before the encoder's reader would call it "not a valid BERT config" (issue 57).
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        let hint = if text.contains("NaN") || text.contains("Infinity") {
            "; NaN and Infinity are not JSON numbers: write a finite number (or null where the field may be absent)"
        } else {
            "; fix the file or download it again"
        };
        usage!("config {}: not valid JSON ({e}){hint}", file.display())
    })?;
    match v.get("model_type").and_then(|t| t.as_str()) {
        Some(t) if t != "bert" && !names_decoder(text) => {
            let families: Vec<&str> = models::registry::FAMILIES
                .iter()
                .flat_map(|f| f.model_types.iter().copied())
                .collect();
            Err(usage!(
                "config {}: model_type {t} is not supported; encoders: bert; decoders: {}, {}",
                file.display(),
                models::SUPPORTED_FAMILIES,
                families.join(", ")
            ))
        }
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
                tokenizer: beside_tokenizer(dir, Some(path))
                    .unwrap_or_else(|| TokenizerFile::Gguf(path.clone())),
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
            let is_decoder = text.map(|t| names_decoder(&t)).unwrap_or(false);
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
                tokenizer: match beside_tokenizer(dir, gguf.as_deref()) {
                    Some(t) => t,
                    None => return Err(no_tokenizer(dir)),
                },
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
            if !names_decoder(&text) {
                return Ok(None);
            }
            let tokenizer = TokenizerFile::Json(hub.file(&repo, "tokenizer.json")?);
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

/// tokenizer.json in `dir` where it is there, else the GGUF's own tokenizer; None with neither.
/// A GGUF given alone is enough: llama.cpp and transformers build the tokenizer from its metadata.
fn beside_tokenizer(dir: &Path, gguf: Option<&Path>) -> Option<TokenizerFile> {
    let json = dir.join("tokenizer.json");
    if json.is_file() {
        Some(TokenizerFile::Json(json))
    } else {
        gguf.map(|g| TokenizerFile::Gguf(g.to_path_buf()))
    }
}

fn no_tokenizer(dir: &Path) -> anyhow::Error {
    usage!(
        "--model-dir {}: no tokenizer.json and no .gguf (whose own tokenizer would do); put the model's \
         tokenizer.json in it",
        dir.display()
    )
}

/// How the weight matrices of `files` are kept (issue 56): `APPROX_BENCH_WEIGHTS=stored` or
/// `widened` where set; else widened to f32 at load (the fastest forward) when that takes at most
/// half the memory available now, and as stored otherwise. Both give the same bits.
pub fn weight_form(files: &DecoderFiles) -> Result<models::blocks::WeightForm> {
    form_for(footprint(files)?.as_ref())
}

/// [`weight_form`] of a checkpoint whose [`footprint`] is `f` (None: no file).
fn form_for(f: Option<&models::gguf::Footprint>) -> Result<models::blocks::WeightForm> {
    use models::blocks::WeightForm;
    match std::env::var("APPROX_BENCH_WEIGHTS").as_deref() {
        Ok("stored") => return Ok(WeightForm::Stored),
        Ok("widened") => return Ok(WeightForm::Widened),
        Ok("") | Ok("auto") | Err(_) => {}
        Ok(other) => {
            return Err(usage!(
                "APPROX_BENCH_WEIGHTS={other}: give stored, widened or auto (the default)"
            ))
        }
    }
    let widened = f.map_or(0, |f| f.widened);
    Ok(match crate::runtime::memory_available()? {
        Some(avail) if widened > avail / 2 => WeightForm::Stored,
        _ => WeightForm::Widened,
    })
}

/// What the weights of `files` take in memory; None for an initialized model (no file).
fn footprint(files: &DecoderFiles) -> Result<Option<models::gguf::Footprint>> {
    Ok(match &files.weights {
        Some(Weights::Gguf(g)) => Some(models::GgufFile::open(g)?.footprint()),
        // From the file sizes: bf16/f16 values double when widened (an f32 checkpoint's do not,
        // so this bounds it), and the largest matrix and layer are not read from the headers.
        Some(Weights::Safetensors { shards, .. }) => {
            let bytes: u64 = shards
                .iter()
                .map(|s| std::fs::metadata(s).map(|m| m.len()).unwrap_or(0))
                .sum();
            Some(models::gguf::Footprint {
                stored: bytes,
                widened: 2 * bytes,
                largest: 0,
                layer: 0,
            })
        }
        None => None,
    })
}

/// Refuses, before anything is loaded, a model whose weights alone would need more memory than
/// is available (issue 56): kept in `form`, plus what a forward in `dtype_bytes` widens at a
/// time. The activations come on top (the message says what lowers them).
fn check_memory(
    files: &DecoderFiles,
    f: Option<&models::gguf::Footprint>,
    form: models::blocks::WeightForm,
    dtype_bytes: u64,
) -> Result<Option<u64>> {
    let Some(f) = f else {
        return Ok(None);
    };
    let need = f.peak(form, dtype_bytes);
    if let Some(avail) = crate::runtime::memory_available()? {
        if need > avail {
            let gb = |b: u64| b as f64 / 1e9;
            return Err(usage!(
                "{}: its weights need about {:.1} GB in this run ({:.1} GB kept {}, and what a forward widens at a time in {}), but {:.1} GB of memory are available; free memory, use --dtype f32, or a smaller model (a shorter n and fewer --threads lower the activations on top)",
                files.config.display(),
                gb(need),
                gb(if form == models::blocks::WeightForm::Stored { f.stored } else { f.widened }),
                format!("{form:?}").to_lowercase(),
                if dtype_bytes == 8 { "f64" } else { "f32" },
                gb(avail)
            ));
        }
    }
    Ok(Some(need))
}

/// The decoder's configuration and weights of embeddings and layers 0..=L.
pub fn load(
    files: &DecoderFiles,
    inputs: &InputConfig,
    depth: models::Depth,
    device: &candle_core::Device,
    form: models::blocks::WeightForm,
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
        Some(Weights::Gguf(g)) => models::gguf::load_gguf_as(g, depth, device, form)?,
        weights => {
            let cfg = if is_gguf(&files.config) {
                models::GgufFile::open(&files.config)?.config()?
            } else {
                DecoderConfig::load(&files.config)?
            };
            check_layer(&cfg, layer)?;
            let w = match weights {
                Some(Weights::Safetensors { path, .. }) => {
                    models::weights::load_safetensors_as(&cfg, depth, path, device, form)?
                }
                _ => models::initialize(&cfg, depth, inputs.model_seed, device)?,
            };
            (cfg, w)
        }
    };
    check_layer(&cfg, layer)?;
    Ok((cfg, weights))
}

pub use models::blocks::WeightPlan;

/// The decoder of `files` loaded to `depth`: a §7.7 family where config.json or the GGUF's
/// architecture names one, else a Llama-style decoder; and how its weights are kept. A model
/// whose weights cannot fit the memory available is refused before it loads.
pub fn load_decoder(
    files: &DecoderFiles,
    inputs: &InputConfig,
    depth: models::Depth,
    device: &candle_core::Device,
) -> Result<(Box<dyn models::Decoder>, WeightPlan)> {
    // The checkpoint's footprint, read once: what decides the form and the memory check.
    let f = footprint(files)?;
    let form = form_for(f.as_ref())?;
    let dtype_bytes = inputs.candle_dtype().size_in_bytes() as u64;
    let estimate_bytes = check_memory(files, f.as_ref(), form, dtype_bytes)?;
    let plan = WeightPlan {
        form,
        estimate_bytes,
    };
    if let Some(model) = load_family(files, inputs, depth, device, form)? {
        return Ok((model, plan));
    }
    let (cfg, weights) = load(files, inputs, depth, device, form)?;
    Ok((Box::new(models::Llama { cfg, weights }), plan))
}

/// A §7.7 family model (docs/reference.md §7.7) loaded through layer L from its safetensors
/// (one file, or only the shards of layers 0..=L), when config.json names a family; None for
/// anything else (the Llama-style path).
pub fn load_family(
    files: &DecoderFiles,
    inputs: &InputConfig,
    depth: models::Depth,
    device: &candle_core::Device,
    form: models::blocks::WeightForm,
) -> Result<Option<Box<dyn models::Decoder>>> {
    if let Some(Weights::Gguf(g)) = &files.weights {
        let stored = form == models::blocks::WeightForm::Stored;
        return load_family_gguf(g, inputs, depth, device, stored);
    }
    let Some(text) = read(&files.config).filter(|_| !is_gguf(&files.config)) else {
        return Ok(None);
    };
    let Some(entry) = family_of(&text) else {
        return Ok(None);
    };
    let config: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| usage!("config {}: not valid JSON ({e})", files.config.display()))?;
    let model_type = config["model_type"].as_str().unwrap_or_default();
    check_family_inputs(inputs)?;
    let (path, shards) = match &files.weights {
        Some(Weights::Safetensors { path, shards }) => (path, shards),
        _ => {
            return Err(usage!(
                "--model initialized: a {model_type} model is read from its pretrained weights only; use --model pretrained with its model.safetensors"
            ))
        }
    };
    let stored = form == models::blocks::WeightForm::Stored;
    let mut weights =
        models::named_tensors::NamedTensors::open(shards, &path.display().to_string(), device)?
            .keep_stored(stored);
    Ok(Some((entry.load)(&config, &mut weights, depth)?))
}

/// A §7.7 family from a GGUF file whose architecture one of them reads (its metadata is the
/// configuration, as for the Llama-style GGUF route); None for any other architecture.
fn load_family_gguf(
    path: &Path,
    inputs: &InputConfig,
    depth: models::Depth,
    device: &candle_core::Device,
    stored: bool,
) -> Result<Option<Box<dyn models::Decoder>>> {
    let file = models::GgufFile::open(path)?;
    let arch = file.architecture()?;
    let Some((entry, from_gguf)) = models::registry::gguf_family_entry(&arch) else {
        if !models::gguf::LLAMA_ARCHS.contains(&arch.as_str()) {
            let families: Vec<&str> = models::registry::FAMILIES
                .iter()
                .flat_map(|f| f.gguf.iter().map(|(a, _)| *a))
                .collect();
            return Err(usage!(
                "GGUF {}: architecture \"{arch}\" is not supported; supported: {}; §7.7 families (a layer's dump and sweep): {}",
                path.display(),
                models::gguf::LLAMA_ARCHS.join(", "),
                families.join(", ")
            ));
        }
        return Ok(None);
    };
    check_family_inputs(inputs)?;
    let (config, weights) = from_gguf(file, device)?;
    let mut weights = weights.keep_stored(stored);
    Ok(Some((entry.load)(&config, &mut weights, depth)?))
}

/// Refuses the options a family run does not take.
fn check_family_inputs(inputs: &InputConfig) -> Result<()> {
    if inputs.embeddings_from != inputs.model {
        return Err(usage!(
            "--embeddings-from applies to BERT only; a decoder's embeddings come with its weights"
        ));
    }
    Ok(())
}

/// `--layer`'s default where none is given.
const DEFAULT_LAYER: usize = 0;

/// The layer a sweep, `bench` or `dump-qkv` (`command`, for the message) measures when `--layer` is
/// not given: [`DEFAULT_LAYER`], except for a §7.7 family with sliding layers, where it is a global
/// (full-attention) layer (docs/reference.md §7.7.6 [REC]): the model is loaded through layer 0 on
/// the host to read every layer's spec.
pub fn default_layer(inputs: &InputConfig, command: &str) -> Result<usize> {
    let depth = models::Depth::Through(DEFAULT_LAYER);
    let device = candle_core::Device::Cpu;
    let Some(files) = resolve(&inputs.source(), inputs, depth, super::hub::Hub::from_env)? else {
        return Ok(DEFAULT_LAYER);
    };
    let form = weight_form(&files)?;
    let Some(model) = load_family(&files, inputs, depth, &device, form)? else {
        return Ok(DEFAULT_LAYER);
    };
    let layer = default_family_layer(model.as_ref(), DEFAULT_LAYER);
    if layer != DEFAULT_LAYER {
        eprintln!(
            "{command}: no --layer given; layer {layer}, the first full-attention layer of this {} model (layer {DEFAULT_LAYER} slides)",
            model.model_type()
        );
    }
    Ok(layer)
}

/// The last full-attention layer ≤ `rule` (the default rule's layer); when none is (the rule
/// gives 0, and gemma2/gemma3's layer 0 slides), the first full-attention layer above it; when
/// the model has none (phi3's window on every layer), `rule` itself.
fn default_family_layer(model: &dyn models::Decoder, rule: usize) -> usize {
    let layers = model.shape().layers;
    let full = |l: &usize| model.window(*l).is_none();
    (0..=rule.min(layers - 1))
        .rev()
        .find(full)
        .or_else(|| (rule..layers).find(full))
        .unwrap_or(rule)
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
            Some(t) => names_decoder(&t),
            None => d.is_dir() && single_gguf(d)?.is_some(),
        },
        ModelSource::Hub { id, revision } => {
            let repo = Repo::with_revision(id.clone(), RepoType::Model, revision.clone());
            let config = hub()?.file(&repo, "config.json")?;
            read(&config).is_some_and(|t| names_decoder(&t))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF of an architecture neither path reads is refused naming it, the Llama-style
    /// architectures and every family's (the registry's list, read here: models/gguf.rs does not
    /// import the registry, so no import circle runs through it).
    #[test]
    fn an_unknown_gguf_architecture_names_every_supported_one() {
        let mut arch = 5u64.to_le_bytes().to_vec();
        arch.extend(b"mamba");
        let bytes =
            crate::models::gguf_table::tests::gguf(&[("general.architecture", 8, arch)], &[]);
        let f = tempfile::Builder::new().suffix(".gguf").tempfile().unwrap();
        std::fs::write(f.path(), bytes).unwrap();
        let inputs = InputConfig::new(&crate::config::InputOptions::default()).unwrap();
        let e = match load_family_gguf(
            f.path(),
            &inputs,
            models::Depth::Whole,
            &candle_core::Device::Cpu,
            false,
        ) {
            Ok(_) => panic!("accepted"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains("\"mamba\"")
                && e.contains("qwen3")
                && e.contains("gemma3")
                && e.contains("deepseek2"),
            "{e}"
        );
    }

    fn fixture_model(name: &str, layer: usize) -> Box<dyn models::Decoder> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/families")
            .join(name);
        let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
        let entry = family_of(&text).unwrap();
        let dev = candle_core::Device::Cpu;
        let mut w =
            models::named_tensors::NamedTensors::open_file(&dir.join("model.safetensors"), &dev)
                .unwrap();
        (entry.load)(
            &serde_json::from_str(&text).unwrap(),
            &mut w,
            models::Depth::Through(layer),
        )
        .unwrap()
    }

    #[test]
    fn a_familys_default_layer_is_a_global_one() {
        // gemma2 alternates (0 slides, 1 is global), gemma3 has 5 local : 1 global.
        assert_eq!(
            default_family_layer(fixture_model("gemma2", 0).as_ref(), 0),
            1
        );
        assert_eq!(
            default_family_layer(fixture_model("gemma3", 0).as_ref(), 0),
            5
        );
        // The last global layer at or below the rule's layer.
        assert_eq!(
            default_family_layer(fixture_model("gemma2", 0).as_ref(), 2),
            1
        );
        // phi3 has a window on every layer: the rule's layer stays.
        assert_eq!(
            default_family_layer(fixture_model("phi3", 0).as_ref(), 0),
            0
        );
        // phi3-longrope has none: layer 0 is global.
        assert_eq!(
            default_family_layer(fixture_model("phi3-longrope", 0).as_ref(), 0),
            0
        );
    }

    #[test]
    fn family_model_types_are_decoders_and_others_are_refused_naming_them() {
        assert!(names_decoder(r#"{"model_type": "gemma3_text"}"#));
        assert!(names_decoder(r#"{"model_type": "phi3"}"#));
        let e = check_model_type(r#"{"model_type": "mamba"}"#, Path::new("c.json")).unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains("mamba") && e.contains("gemma2") && e.contains("phi3"),
            "{e}"
        );
    }

    #[test]
    fn a_multimodal_gemma3_index_needs_only_its_language_models_early_shards() {
        let tmp = tempfile::tempdir().unwrap();
        let index = tmp.path().join("model.safetensors.index.json");
        let map = serde_json::json!({"weight_map": {
            "language_model.model.embed_tokens.weight": "a",
            "language_model.model.layers.1.self_attn.q_proj.weight": "b",
            "language_model.model.layers.2.self_attn.q_proj.weight": "c",
            "model.language_model.layers.0.mlp.up_proj.weight": "d",
            "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight": "e"
        }});
        std::fs::write(&index, map.to_string()).unwrap();
        assert_eq!(models::shards_needed(&index, 1).unwrap(), ["a", "b", "d"]);
    }
}

/// The run's options with the defaults that read the model: the layer when `--layer` was not given
/// (`layer` None: a family's global layer), and, without `--mask`, the model's own (causal for a
/// decoder, none for BERT; docs/reference.md §7.2). Under `--decode` the protocol's (causal), and the
/// sweep refuses an encoder with the reason.
pub fn with_model_defaults(
    mut o: crate::config::RunOptions,
    layer: Option<usize>,
) -> Result<crate::config::RunOptions> {
    if layer.is_none() {
        o.inputs.layer = default_layer(&InputConfig::new(&o.inputs)?, "approx-bench")?;
    }
    if o.mask.is_none() && o.decode.is_none() {
        o.mask = Some(native_mask(&InputConfig::new(&o.inputs)?)?);
    }
    Ok(o)
}
