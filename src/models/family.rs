//! The families of docs/reference.md §7.7 (gemma2, gemma3, phi3, gpt_oss, deepseek_v2/v3): each is
//! one file that turns config.json and its weights into a [`FamilyModel`], plus one line in
//! [`FAMILIES`]. A family's forward runs the layers before L as transformers' eager forward of that
//! family does, each layer's attention through its own [`AttentionSpec`], and stops at layer L
//! with the post-RoPE Q, K, V (not multiplied by τ) and the layer's spec: the dump.
//!
//! The Llama-style families (llama, mistral, qwen2, qwen3) keep their own path (`llama.rs`), which
//! also serves the whole-model view of §10.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::Result;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use serde_json::{Map, Value};

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
    /// Layer `layer`'s exact attention, from the config alone.
    fn attention_spec(&self, layer: usize) -> AttentionSpec;
    /// Layer L's dump for the token window `ids` at positions 0..n−1, in `dtype` (f32 or f64).
    fn layer_dump(&self, ids: &[u32], dtype: DType) -> Result<LayerDump>;
}

/// Loads a family model through layer `layer` from its parsed config.json and its weights.
pub type Loader =
    fn(config: &Value, weights: &mut NamedTensors, layer: usize) -> Result<Box<dyn FamilyModel>>;

/// One family: the `model_type` values it answers to, and its loader.
pub struct FamilyEntry {
    pub model_types: &'static [&'static str],
    pub load: Loader,
}

/// The §7.7 families, one line each.
pub const FAMILIES: &[FamilyEntry] = &[
    FamilyEntry {
        model_types: &["gpt_oss"],
        load: super::gpt_oss::load,
    },
    FamilyEntry {
        model_types: &["deepseek_v2", "deepseek_v3"],
        load: super::deepseek::load,
    },
];

/// The family entry of a `model_type`, if it is a §7.7 family.
pub fn family_entry(model_type: &str) -> Option<&'static FamilyEntry> {
    FAMILIES
        .iter()
        .find(|f| f.model_types.contains(&model_type))
}

/// Named tensors of a checkpoint (memory-mapped safetensors: one file, or the shards of a
/// sharded one), with errors that name the file and the tensor.
pub struct NamedTensors {
    st: MmapedSafetensors,
    names: HashSet<String>,
    what: String,
    device: Device,
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
            st,
            names,
            what: what.to_string(),
            device: device.clone(),
        })
    }

    /// One safetensors file.
    pub fn open_file(path: &Path, device: &Device) -> Result<Self> {
        Self::open(&[path.to_path_buf()], &path.display().to_string(), device)
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Whether the checkpoint holds `name`.
    pub fn has(&self, name: &str) -> bool {
        self.names.contains(name)
    }

    /// The tensor `name` as stored (its own dtype: bf16, f32, or U8 blocks of MXFP4/FP8).
    pub fn raw(&self, name: &str) -> Result<Tensor> {
        if !self.has(name) {
            return Err(usage!(
                "weights {}: tensor '{name}' is missing; the checkpoint does not match config.json",
                self.what
            ));
        }
        self.st.load(name, &self.device).map_err(|e| {
            let em = crate::tensor_util::candle_message(&e);
            usage!("weights {}: cannot read tensor '{name}' ({em})", self.what)
        })
    }

    /// The tensor `name` widened to f32, checked to have `shape` and finite values.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self.raw(name)?;
        if t.dims() != shape {
            return Err(usage!(
                "weights {}: tensor '{name}' has shape {:?} but config.json implies {shape:?}; the weights do not fit the config",
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
