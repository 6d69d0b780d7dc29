//! Decoder weights for the embeddings and layers 0..=L (docs/reference.md §7.1 "Weights",
//! "`--model initialized`"): from Hugging Face safetensors (one file, or only the shards of a
//! sharded checkpoint that hold what layer L needs), or initialized as transformers'
//! `_init_weights` does. The GGUF route (`gguf.rs`) fills the same struct through the same
//! [`TensorSource`] interface, so the layer layout is written once.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use anyhow::Result;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use rand::SeedableRng;

use super::blocks::{Linear, OutputHead, Weight, WeightForm};
use super::decoder_config::DecoderConfig;
use super::llama::{DecoderLayerWeights, DecoderWeights, LayerRest};
use crate::numerics::sampling::{derive_labeled_seed, normal_values, TrialRng};
use crate::usage;

/// How transformers' `_init_weights` initializes a parameter (for the initialized source; the
/// pretrained sources ignore it).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Init {
    /// N(0, initializer_range²): Linear and Embedding weights.
    Normal,
    /// N(0, initializer_range²) with row `pad` zeroed (nn.Embedding with padding_idx).
    NormalPadRow(Option<usize>),
    /// Linear biases.
    Zeros,
    /// RMSNorm weights.
    Ones,
}

/// Named tensors (Hugging Face names, `model.` prefix) of known shapes, f32, on the device.
pub(crate) trait TensorSource {
    fn get(&mut self, name: &str, shape: &[usize], init: Init) -> Result<Tensor>;
    /// A weight matrix ([`Weight`]): widened to f32 like [`Self::get`], unless the source keeps
    /// weights as stored (issue 56).
    fn weight(&mut self, name: &str, shape: &[usize], init: Init) -> Result<Weight> {
        Ok(Weight::Float(self.get(name, shape, init)?))
    }
}

/// How much of a decoder to load: through the measured layer L (a Q/K/V dump: layers 0..=L,
/// layer L without o_proj and the MLP), or the whole model (every layer, the final norm and the
/// LM head: docs/reference.md §10.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    Through(usize),
    Whole,
}

impl From<usize> for Depth {
    fn from(layer: usize) -> Self {
        Depth::Through(layer)
    }
}

impl Depth {
    /// The last layer loaded, and whether it is loaded whole (o_proj, MLP).
    fn last_layer(self, cfg: &DecoderConfig) -> (usize, bool) {
        match self {
            Depth::Through(l) => (l, false),
            Depth::Whole => (cfg.num_hidden_layers.saturating_sub(1), true),
        }
    }
}

/// The embeddings and layers of `depth` from `src`.
pub(crate) fn build(
    src: &mut dyn TensorSource,
    cfg: &DecoderConfig,
    depth: Depth,
) -> Result<DecoderWeights> {
    let (layer, last_whole) = depth.last_layer(cfg);
    if layer >= cfg.num_hidden_layers {
        return Err(usage!(
            "--layer {layer} is beyond the model: it has {} layers (0..={})",
            cfg.num_hidden_layers,
            cfg.num_hidden_layers.saturating_sub(1)
        ));
    }
    let (hid, p) = (cfg.hidden_size, cfg.head_dim);
    let (qd, kvd, inter) = (
        cfg.num_attention_heads * p,
        cfg.num_key_value_heads * p,
        cfg.intermediate_size,
    );
    let embed = src.weight(
        "model.embed_tokens.weight",
        &[cfg.vocab_size, hid],
        Init::NormalPadRow(cfg.pad_token_id),
    )?;
    let lin = |src: &mut dyn TensorSource, name: &str, out: usize, inp: usize, bias: bool| {
        Ok::<_, anyhow::Error>(Linear {
            weight: src.weight(&format!("{name}.weight"), &[out, inp], Init::Normal)?,
            bias: if bias {
                Some(src.get(&format!("{name}.bias"), &[out], Init::Zeros)?)
            } else {
                None
            },
        })
    };
    let mut layers = Vec::with_capacity(layer + 1);
    for l in 0..=layer {
        let pre = format!("model.layers.{l}");
        let a = format!("{pre}.self_attn");
        let m = format!("{pre}.mlp");
        let rest = if l < layer || last_whole {
            Some(LayerRest {
                o: lin(src, &format!("{a}.o_proj"), hid, qd, cfg.o_bias)?,
                post_norm: src.get(
                    &format!("{pre}.post_attention_layernorm.weight"),
                    &[hid],
                    Init::Ones,
                )?,
                gate: lin(src, &format!("{m}.gate_proj"), inter, hid, cfg.mlp_bias)?,
                up: lin(src, &format!("{m}.up_proj"), inter, hid, cfg.mlp_bias)?,
                down: lin(src, &format!("{m}.down_proj"), hid, inter, cfg.mlp_bias)?,
            })
        } else {
            None
        };
        let norm = |src: &mut dyn TensorSource, which: &str| -> Result<Option<Tensor>> {
            cfg.qk_norm
                .then(|| src.get(&format!("{a}.{which}.weight"), &[p], Init::Ones))
                .transpose()
        };
        layers.push(DecoderLayerWeights {
            input_norm: src.get(&format!("{pre}.input_layernorm.weight"), &[hid], Init::Ones)?,
            q: lin(src, &format!("{a}.q_proj"), qd, hid, cfg.qkv_bias)?,
            k: lin(src, &format!("{a}.k_proj"), kvd, hid, cfg.qkv_bias)?,
            v: lin(src, &format!("{a}.v_proj"), kvd, hid, cfg.qkv_bias)?,
            q_norm: norm(src, "q_norm")?,
            k_norm: norm(src, "k_norm")?,
            rest,
        });
    }
    let head = if depth == Depth::Whole {
        let norm = src.get("model.norm.weight", &[hid], Init::Ones)?;
        // A tied head is the embedding matrix itself (SmolLM2's `token_embd`).
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(src.weight("lm_head.weight", &[cfg.vocab_size, hid], Init::Normal)?)
        };
        Some(OutputHead { norm, lm_head })
    } else {
        None
    };
    Ok(DecoderWeights {
        embed,
        layers,
        head,
    })
}

/// Whether a tensor name belongs to the embeddings or layers 0..=`layer` (with or without the
/// `model.` prefix, or a multimodal gemma3's `language_model.model.` / `model.language_model.`):
/// what a sharded checkpoint must provide for layer L, and nothing else. The whole model needs
/// every tensor.
fn needed_for(name: &str, depth: Depth) -> bool {
    let Depth::Through(layer) = depth else {
        return true;
    };
    let name = ["language_model.model.", "model.language_model.", "model."]
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .unwrap_or(name);
    if name == "embed_tokens.weight" {
        return true;
    }
    name.strip_prefix("layers.")
        .and_then(|rest| rest.split('.').next())
        .and_then(|l| l.parse::<usize>().ok())
        .is_some_and(|l| l <= layer)
}

/// The shard files (names as in the index, sorted) of a sharded safetensors checkpoint that hold
/// `model.embed_tokens.weight` and `model.layers.{0..=layer}.*`: the only ones to fetch and read
/// (docs/reference.md §7.1 "Weights": layer 0 of a 70B model is one shard, not the whole model).
pub fn shards_needed(index_json: &Path, depth: impl Into<Depth>) -> Result<Vec<String>> {
    let depth = depth.into();
    let text = std::fs::read_to_string(index_json).map_err(|e| {
        usage!(
            "weights index {}: cannot read it ({e})",
            index_json.display()
        )
    })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        usage!(
            "weights index {}: not valid JSON ({e})",
            index_json.display()
        )
    })?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| {
            usage!(
                "weights index {}: no \"weight_map\" object; not a safetensors index",
                index_json.display()
            )
        })?;
    let mut files = BTreeSet::new();
    for (name, file) in map {
        if needed_for(name, depth) {
            let file = file.as_str().ok_or_else(|| {
                usage!(
                    "weights index {}: the file of tensor '{name}' is not a string",
                    index_json.display()
                )
            })?;
            files.insert(file.to_string());
        }
    }
    if files.is_empty() {
        return Err(usage!(
            "weights index {}: no shard holds model.embed_tokens or the layers of {depth:?}",
            index_json.display()
        ));
    }
    Ok(files.into_iter().collect())
}

/// Pretrained weights from memory-mapped safetensors files.
struct Safetensors {
    st: MmapedSafetensors,
    names: HashSet<String>,
    /// What errors name: the file, or the index of a sharded checkpoint.
    what: String,
    family: &'static str,
    device: Device,
    /// Whether weight matrices are kept as stored ([`TensorSource::weight`]).
    keep_stored: bool,
}

impl TensorSource for Safetensors {
    fn get(&mut self, name: &str, shape: &[usize], _init: Init) -> Result<Tensor> {
        // bf16/f16 checkpoints are widened once on load (docs/reference.md §7.1 "Weights").
        Ok(self.stored(name, shape)?.to_dtype(DType::F32)?)
    }

    /// bf16/f16 values kept as stored where asked (issue 56): widened where a product reads them.
    fn weight(&mut self, name: &str, shape: &[usize], init: Init) -> Result<Weight> {
        if !self.keep_stored {
            return Ok(Weight::Float(self.get(name, shape, init)?));
        }
        Ok(Weight::Float(self.stored(name, shape)?))
    }
}

impl Safetensors {
    /// The tensor `name` in its stored dtype, checked to have `shape` and finite values.
    fn stored(&mut self, name: &str, shape: &[usize]) -> Result<Tensor> {
        // Checkpoints of the bare base model (LlamaModel) have no `model.` prefix.
        let bare = name.strip_prefix("model.").unwrap_or(name);
        let found = [name, bare]
            .into_iter()
            .find(|c| self.names.contains(*c))
            .ok_or_else(|| {
                usage!(
                    "weights {}: tensor '{name}' is missing (also tried '{bare}'); the checkpoint does not hold a {} model matching config.json",
                    self.what,
                    self.family
                )
            })?;
        let t = self.st.load(found, &self.device).map_err(|e| {
            let em = crate::tensor_util::candle_message(&e);
            usage!("weights {}: cannot read tensor '{found}' ({em})", self.what)
        })?;
        if t.dims() != shape {
            return Err(usage!(
                "weights {}: tensor '{found}' has shape {:?} but config.json implies {:?}; the weights do not fit the config",
                self.what,
                t.dims(),
                shape
            ));
        }
        super::blocks::check_float(&t, found, &self.what)?;
        crate::tensor_util::check_finite(&t, || {
            format!("weights {}: tensor '{found}'", self.what)
        })?;
        Ok(t)
    }
}

/// Loads the embeddings and layers 0..=`layer` from `path`: a `.safetensors` file, or a
/// `model.safetensors.index.json`, of which only the shards from [`shards_needed`] are read.
pub fn load_safetensors(
    cfg: &DecoderConfig,
    depth: impl Into<Depth>,
    path: &Path,
    device: &Device,
) -> Result<DecoderWeights> {
    load_safetensors_as(cfg, depth, path, device, WeightForm::Widened)
}

/// [`load_safetensors`] with the weight matrices kept in `form`.
pub fn load_safetensors_as(
    cfg: &DecoderConfig,
    depth: impl Into<Depth>,
    path: &Path,
    device: &Device,
    form: WeightForm,
) -> Result<DecoderWeights> {
    let depth = depth.into();
    let is_index = path.extension().is_some_and(|e| e == "json");
    let files: Vec<PathBuf> = if is_index {
        let dir = path.parent().unwrap_or(Path::new("."));
        shards_needed(path, depth)?
            .into_iter()
            .map(|f| dir.join(f))
            .collect()
    } else {
        vec![path.to_path_buf()]
    };
    if let Some(missing) = files.iter().find(|f| !f.is_file()) {
        return Err(usage!(
            "weights {}: shard {} is not there; fetch it (it holds the layers of {depth:?} or the embeddings)",
            path.display(),
            missing.display()
        ));
    }
    // SAFETY: the files are mapped read-only and not modified while the run holds them.
    let st = unsafe { MmapedSafetensors::multi(&files) }.map_err(|e| {
        let em = crate::tensor_util::candle_message(&e);
        usage!(
            "weights {}: not readable safetensors ({em}); re-download it",
            path.display()
        )
    })?;
    let names = st.tensors().into_iter().map(|(n, _)| n).collect();
    let mut src = Safetensors {
        st,
        names,
        what: path.display().to_string(),
        family: cfg.family.model_type(),
        device: device.clone(),
        keep_stored: form == WeightForm::Stored,
    };
    build(&mut src, cfg, depth)
}

/// transformers' `_init_weights`, each tensor from its own seed (model seed, tensor name), rows
/// from (that seed, row), as the BERT path does (docs/reference.md §1.4): the values do not depend on
/// which tensors are built, in which order, or on the thread count.
struct Initialized {
    seed: u64,
    std: f64,
    device: Device,
}

impl TensorSource for Initialized {
    fn get(&mut self, name: &str, shape: &[usize], init: Init) -> Result<Tensor> {
        use rayon::prelude::*;
        let cols: usize = shape[1..].iter().product();
        let numel: usize = shape.iter().product();
        Ok(match init {
            Init::Zeros => Tensor::zeros(shape, DType::F32, &self.device)?,
            Init::Ones => Tensor::ones(shape, DType::F32, &self.device)?,
            Init::Normal | Init::NormalPadRow(_) => {
                let base = derive_labeled_seed(self.seed, name);
                let mut v = vec![0f32; numel];
                v.par_chunks_mut(cols.max(1))
                    .enumerate()
                    .for_each(|(r, row)| {
                        let mut rng = TrialRng::seed_from_u64(
                            base ^ (r as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                        );
                        let vals = normal_values(&mut rng, 1, row.len(), self.std);
                        row.iter_mut().zip(vals).for_each(|(x, y)| *x = y as f32);
                    });
                if let Init::NormalPadRow(Some(pad)) = init {
                    if pad < shape[0] {
                        v[pad * cols..(pad + 1) * cols].fill(0.0);
                    }
                }
                Tensor::from_vec(v, shape, &self.device)?
            }
        })
    }
}

/// Freshly initialized embeddings and layers 0..=`layer` (docs/reference.md §7.1 "`--model
/// initialized`"): Linear and Embedding N(0, initializer_range²), biases 0, RMSNorm weights 1.
pub fn initialize(
    cfg: &DecoderConfig,
    depth: impl Into<Depth>,
    seed: u64,
    device: &Device,
) -> Result<DecoderWeights> {
    let mut src = Initialized {
        seed,
        std: cfg.initializer_range,
        device: device.clone(),
    };
    build(&mut src, cfg, depth.into())
}
