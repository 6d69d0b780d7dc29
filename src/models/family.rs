//! The families of docs/reference.md §7.7 (gemma2, gemma3, phi3, gpt_oss, deepseek_v2/v3): each is
//! one file that turns config.json and its weights into a [`FamilyModel`], plus one line in
//! [`FAMILIES`]. A family's forward runs the layers before L as transformers' eager forward of that
//! family does, each layer's attention through its own [`AttentionSpec`], and stops at layer L
//! with the post-RoPE Q, K, V (not multiplied by τ) and the layer's spec: the dump.
//!
//! The Llama-style families (llama, mistral, qwen2, qwen3) keep their own path (`llama.rs`), which
//! also serves the whole-model view of §10.

use std::collections::HashSet;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::Result;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use serde_json::{Map, Value};

use super::continuation::PromptCache;
use super::gguf::GgufFile;
use super::llama::AttentionHook;
use super::weights::Depth;
use crate::attention::spec::AttentionSpec;
use crate::usage;

/// The head layout and size of a family model.
#[derive(Debug, Clone, PartialEq)]
pub struct FamilyShape {
    /// H: query heads.
    pub heads: usize,
    /// H_kv: K/V heads of the dumped view (H for MLA's materialised K/V).
    pub kv_heads: usize,
    /// p_qk.
    pub head_dim: usize,
    /// p_v (≠ p_qk for MLA).
    pub head_dim_v: usize,
    pub layers: usize,
    pub max_position_embeddings: usize,
    pub vocab_size: usize,
}

/// Layer L's dump: what `dump-qkv` writes and a sweep measures.
pub struct LayerDump {
    /// [H, n, p_qk], post-RoPE (and post q/k-norm), not multiplied by τ.
    pub q: Tensor,
    /// [H_kv, n, p_qk].
    pub k: Tensor,
    /// [H_kv, n, p_v].
    pub v: Tensor,
    /// Layer L's exact attention.
    pub spec: AttentionSpec,
    /// Further tensors of the dump: `sinks` [H] (f32), MLA's `kv_latent` [n, r + d_R] and
    /// `w_kv_b` [H, d_nope + d_v, r].
    pub extra: Vec<(String, Tensor)>,
    /// Further sidecar fields: phi3's `rope_factors`, MLA's `mla` object.
    pub sidecar: Map<String, Value>,
}

/// A decoder of a §7.7 family, loaded through layer L.
pub trait FamilyModel: Send + Sync {
    /// config.json's `model_type`.
    fn model_type(&self) -> &'static str;
    fn shape(&self) -> FamilyShape;
    /// Whether the layers are Multi-head Latent Attention (docs/reference.md §7.7.5): what a
    /// deployed cache holds is then the latent row, not the materialised per-head K/V.
    fn is_mla(&self) -> bool {
        false
    }
    /// On an MLA layer, the values of its latent row, r + d_R (what a §8 cache stores per token).
    fn mla_latent_width(&self) -> Option<usize> {
        None
    }
    /// Layer `layer`'s exact attention, for a loaded layer (0..=L): from the config, and for
    /// gpt-oss the sinks of its weights.
    fn attention_spec(&self, layer: usize) -> AttentionSpec;
    /// Layer `layer`'s sliding window, for any layer of the model: from the config alone.
    fn window(&self, layer: usize) -> Option<usize> {
        self.attention_spec(layer).window
    }
    /// Layer L's dump for the token window `ids` at positions 0..n−1, in `dtype` (f32 or f64).
    fn layer_dump(&self, ids: &[u32], dtype: DType) -> Result<LayerDump>;
    /// The logits [rows, vocab] (in `dtype`) of the whole model (loaded at [`Depth::Whole`]) on
    /// the window `ids`, every layer's attention through `hook` with that layer's spec; only the
    /// rows `rows` go through the final norm and the LM head (docs/reference.md §10.1).
    fn forward_logits(
        &self,
        ids: &[u32],
        dtype: DType,
        hook: &dyn AttentionHook,
        rows: Range<usize>,
    ) -> Result<Tensor> {
        let _ = (ids, dtype, hook, rows);
        Err(usage!(
            "an end-to-end run of a {} model is not supported yet (docs/reference.md §10); e2e reads {}",
            self.model_type(),
            super::SUPPORTED_FAMILIES
        ))
    }
    /// Whether [`Self::continuation_logits`] is there.
    fn has_continuation(&self) -> bool {
        false
    }
    /// Decode mode's continuation-only forward (docs/reference.md §10.1 [REC], as
    /// [`super::continuation_logits`] for the Llama-style decoders): the logits of `rows` (in
    /// n_p..n) with every layer's prompt rows from `prompt`; None where the family has none.
    fn continuation_logits(
        &self,
        ids: &[u32],
        dtype: DType,
        hook: &dyn AttentionHook,
        prompt: &PromptCache,
        rows: Range<usize>,
    ) -> Option<Result<Tensor>> {
        let _ = (ids, dtype, hook, prompt, rows);
        None
    }
}

/// Loads a family model from its parsed config.json and its weights: through layer L for a dump,
/// or whole for the end-to-end forward.
pub type Loader =
    fn(config: &Value, weights: &mut NamedTensors, depth: Depth) -> Result<Box<dyn FamilyModel>>;

/// One family: the `model_type` values it answers to, and its loader.
pub struct FamilyEntry {
    pub model_types: &'static [&'static str],
    pub load: Loader,
    /// The GGUF `general.architecture` values the family reads, each with its reader (none where
    /// the family has no GGUF route).
    pub gguf: &'static [(&'static str, GgufLoader)],
}

/// Reads a family's GGUF file as the config.json it describes and its tensors under Hugging Face
/// names, for [`Loader`].
pub type GgufLoader = fn(file: GgufFile, device: &Device) -> Result<(Value, NamedTensors)>;

/// The §7.7 families, one line each.
pub const FAMILIES: &[FamilyEntry] = &[
    FamilyEntry {
        model_types: &["gemma2", "gemma3_text", "gemma3"],
        load: super::gemma::load,
        gguf: &[
            ("gemma2", super::gemma_gguf::from_gguf),
            ("gemma3", super::gemma_gguf::from_gguf),
        ],
    },
    FamilyEntry {
        model_types: &["phi3"],
        load: super::phi3::load,
        gguf: &[("phi3", super::phi3::from_gguf)],
    },
    FamilyEntry {
        model_types: &["gpt_oss"],
        load: super::gpt_oss::load,
        gguf: &[("gpt-oss", super::gpt_oss_gguf::from_gguf)],
    },
    FamilyEntry {
        model_types: &["deepseek_v2", "deepseek_v3"],
        load: super::deepseek::load,
        gguf: &[("deepseek2", super::deepseek_gguf::from_gguf)],
    },
];

/// The family entry of a GGUF `general.architecture` and its reader, if a §7.7 family reads it.
pub fn gguf_family_entry(arch: &str) -> Option<(&'static FamilyEntry, GgufLoader)> {
    FAMILIES.iter().find_map(|f| {
        f.gguf
            .iter()
            .find(|(a, _)| *a == arch)
            .map(|&(_, read)| (f, read))
    })
}

/// The family entry of a `model_type`, if it is a §7.7 family.
pub fn family_entry(model_type: &str) -> Option<&'static FamilyEntry> {
    FAMILIES
        .iter()
        .find(|f| f.model_types.contains(&model_type))
}

/// Named tensors of a checkpoint by their Hugging Face names, with errors that name the file and
/// the tensor: memory-mapped safetensors (one file, or the shards of a sharded one), or a GGUF
/// file whose tensors a family renames from llama.cpp's names ([`NamedTensors::from_gguf`]).
pub struct NamedTensors {
    store: Store,
    what: String,
    device: Device,
}

enum Store {
    Safetensors {
        st: MmapedSafetensors,
        names: HashSet<String>,
    },
    /// Tensors are read and dequantized one at a time, when asked for: a loader through layer L
    /// reads no later layer.
    Gguf {
        file: Mutex<GgufFile>,
        /// A Hugging Face name to the GGUF name and what to do to the stored values.
        rename: GgufRename,
        /// The last stack read for [`GgufValues::Expert`]: its GGUF name and values.
        stack: Mutex<Option<(String, Tensor)>>,
    },
}

/// A Hugging Face tensor name to its GGUF name and the change from the stored values to the
/// checkpoint's (e.g. gemma's norms, which llama.cpp's converter stores as 1 + w), or None when
/// the file has no such tensor.
pub type GgufRename = Box<dyn Fn(&str) -> Option<(String, GgufValues)> + Send + Sync>;

/// How a GGUF tensor's values relate to the checkpoint's.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValues {
    /// As stored.
    Same,
    /// The stored values minus this (gemma's norms: stored 1 + w, the checkpoint holds w).
    Shifted(f64),
    /// The stored tensor with its last two axes swapped (gpt-oss's `ffn_down_exps`, stored
    /// [E, hidden, I] for the checkpoint's [E, I, hidden]).
    Transposed,
    /// The stored tensor (the even entries of the last axis) interleaved with the tensor `odd`
    /// (the odd ones), each first transposed (last two axes) when `transpose`: gpt-oss's fused
    /// gate_up [E, hidden, 2I], which the converter splits into `ffn_gate_exps` and
    /// `ffn_up_exps` [E, I, hidden] (and their biases [E, I], untransposed).
    Interleaved { odd: String, transpose: bool },
    /// Entry `e` along the first axis of the stored stack (DeepSeek's `ffn_*_exps` [E, out, in]
    /// for the checkpoint's per-expert [out, in]); the last stack read is kept, so the experts of
    /// a layer dequantize it once.
    Expert(usize),
    /// MLA's `kv_b_proj` [H·(d_nope + d_v), r] from the stored `attn_k_b` [H, r, d_nope]
    /// (transposed per head by the converter) and `v_b` [H, d_v, r].
    KvB { v_b: String },
}

impl NamedTensors {
    /// Maps `files` (their union of names); `what` names the checkpoint in errors.
    pub fn open(files: &[PathBuf], what: &str, device: &Device) -> Result<Self> {
        if let Some(missing) = files.iter().find(|f| !f.is_file()) {
            return Err(usage!(
                "weights {what}: {} is not there; fetch it",
                missing.display()
            ));
        }
        // SAFETY: the files are mapped read-only and not modified while the run holds them.
        let st = unsafe { MmapedSafetensors::multi(files) }.map_err(|e| {
            let em = crate::tensor_util::candle_message(&e);
            usage!("weights {what}: not readable safetensors ({em}); re-download it")
        })?;
        let names = st.tensors().into_iter().map(|(n, _)| n).collect();
        Ok(Self {
            store: Store::Safetensors { st, names },
            what: what.to_string(),
            device: device.clone(),
        })
    }

    /// One safetensors file.
    pub fn open_file(path: &Path, device: &Device) -> Result<Self> {
        Self::open(&[path.to_path_buf()], &path.display().to_string(), device)
    }

    /// A GGUF file's tensors under Hugging Face names, through the family's `rename`.
    pub fn from_gguf(file: GgufFile, rename: GgufRename, device: &Device) -> Self {
        Self {
            what: file.path().to_string(),
            store: Store::Gguf {
                file: Mutex::new(file),
                rename,
                stack: Mutex::new(None),
            },
            device: device.clone(),
        }
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Whether the checkpoint holds `name`.
    pub fn has(&self, name: &str) -> bool {
        match &self.store {
            Store::Safetensors { names, .. } => names.contains(name),
            Store::Gguf { file, rename, .. } => rename(name).is_some_and(|(g, values)| {
                let file = file.lock().expect("GGUF file lock");
                file.has_tensor(&g)
                    && match values {
                        GgufValues::Interleaved { odd, .. } => file.has_tensor(&odd),
                        GgufValues::KvB { v_b } => file.has_tensor(&v_b),
                        GgufValues::Expert(e) => file
                            .tensor_dims(&g)
                            .is_some_and(|d| d.len() == 3 && e < d[0]),
                        _ => true,
                    }
            }),
        }
    }

    /// The tensor `name` as stored (its own dtype: bf16, f32, or U8 blocks of MXFP4/FP8); from a
    /// GGUF file, dequantized to f32 and with the family's value change undone.
    pub fn raw(&self, name: &str) -> Result<Tensor> {
        if !self.has(name) {
            return Err(usage!(
                "weights {}: tensor '{name}' is missing; the checkpoint does not match its config",
                self.what
            ));
        }
        match &self.store {
            Store::Safetensors { st, .. } => st.load(name, &self.device).map_err(|e| {
                let em = crate::tensor_util::candle_message(&e);
                usage!("weights {}: cannot read tensor '{name}' ({em})", self.what)
            }),
            Store::Gguf {
                file,
                rename,
                stack,
            } => {
                let (g, values) = rename(name).expect("has() found it");
                let mut file = file.lock().expect("GGUF file lock");
                if let GgufValues::Expert(e) = values {
                    let mut stack = stack.lock().expect("GGUF stack lock");
                    if stack.as_ref().is_none_or(|(n, _)| *n != g) {
                        *stack = Some((g.clone(), file.dequantized(&g)?));
                    }
                    let t = &stack.as_ref().expect("just read").1;
                    return Ok(t.get(e)?.to_device(&self.device)?);
                }
                let t = file.dequantized(&g)?;
                let swap = |t: Tensor| -> Result<Tensor> {
                    let r = t.rank();
                    Ok(t.transpose(r - 2, r - 1)?.contiguous()?)
                };
                let t = match values {
                    GgufValues::Same => t,
                    GgufValues::Shifted(s) => (t - s)?,
                    GgufValues::Transposed => swap(t)?,
                    GgufValues::Interleaved { odd, transpose } => {
                        let o = file.dequantized(&odd)?;
                        if o.dims() != t.dims() {
                            return Err(usage!(
                                "weights {}: tensors '{g}' {:?} and '{odd}' {:?} differ in shape; they must pair",
                                self.what,
                                t.dims(),
                                o.dims()
                            ));
                        }
                        let (e, o) = if transpose {
                            (swap(t)?, swap(o)?)
                        } else {
                            (t, o)
                        };
                        let mut dims = e.dims().to_vec();
                        let r = dims.len();
                        dims[r - 1] *= 2;
                        Tensor::stack(&[e, o], r)?.reshape(dims)?
                    }
                    GgufValues::KvB { v_b } => {
                        let v = file.dequantized(&v_b)?;
                        let (stored, dv) = (t.dims().to_vec(), v.dims().to_vec());
                        if stored.len() != 3 || dv.len() != 3 {
                            return Err(usage!(
                                "weights {}: tensors '{g}' {stored:?} and '{v_b}' {dv:?} are not one kv_b split per head ([H, r, d_nope] and [H, d_v, r])",
                                self.what
                            ));
                        }
                        let k = swap(t)?;
                        let dk = k.dims().to_vec();
                        if dk[0] != dv[0] || dk[2] != dv[2] {
                            return Err(usage!(
                                "weights {}: tensors '{g}' {stored:?} and '{v_b}' {dv:?} are not one kv_b split per head ([H, r, d_nope] and [H, d_v, r])",
                                self.what
                            ));
                        }
                        Tensor::cat(&[k, v], 1)?.reshape((dk[0] * (dk[1] + dv[1]), dk[2]))?
                    }
                    GgufValues::Expert(_) => unreachable!("read above"),
                };
                Ok(t.to_device(&self.device)?)
            }
        }
    }

    /// The tensor `name` widened to f32, checked to have `shape` and finite values.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self.raw(name)?;
        if t.dims() != shape {
            return Err(usage!(
                "weights {}: tensor '{name}' has shape {:?} but the config implies {shape:?}; the weights do not fit the config",
                self.what,
                t.dims()
            ));
        }
        let t = t.to_dtype(DType::F32)?;
        crate::tensor_util::check_finite(&t, || format!("weights {}: tensor '{name}'", self.what))?;
        Ok(t)
    }

    /// What errors name the checkpoint by.
    pub fn what(&self) -> &str {
        &self.what
    }
}

#[cfg(test)]
#[path = "family_tests.rs"]
pub(crate) mod tests;
