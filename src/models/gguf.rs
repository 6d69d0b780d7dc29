//! Decoder weights from a GGUF file (llama.cpp's format; docs/reference.md §7.1 "Formats"): the config from
//! its `{arch}.*` metadata, and the embeddings and layers 0..=L dequantized to f32 with
//! candle-core's `quantized::gguf_file` (MXFP4, which candle lacks, by `gguf_table`), named back to
//! Hugging Face's names so that the forward of `llama.rs` runs unchanged.
//!
//! **The RoPE order.** llama.cpp's converter (`convert_hf_to_gguf.py`, `LlamaModel.permute`)
//! reorders the rows of `attn_q` and `attn_k` within each head, from Hugging Face's halves
//! [x_0..x_{p/2}, x_{p/2}..x_p] to interleaved pairs (x_0, x_{p/2}, x_1, x_{p/2+1}, …), because
//! llama.cpp's `llama` architecture rotates adjacent pairs: HF row c·p/2 + j is GGUF row 2j + c.
//! Rotate-half RoPE on the GGUF order rotates the wrong pairs (`../shared/data/README.md`, SmolLM2),
//! so the permutation is undone here and RoPE stays rotate-half. qwen2/qwen3 GGUFs are not
//! permuted: llama.cpp runs those architectures with NEOX (rotate-half) RoPE already.
//!
//! A `config.json` beside the GGUF (transformers' export) is not read: the metadata is what
//! llama.cpp runs, and the two agree on SmolLM2 (tests/shared_data.rs checks it).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use anyhow::Result;
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::{DType, Device, Tensor};

use super::blocks::{ggml_rows, Weight, WeightForm};
use super::decoder_config::{
    DecoderConfig, DecoderFamily, RopeConfig, RopeScaling, SUPPORTED_ROPE_TYPES,
};
use super::gguf_table::{read_header, Header, Mxfp4Tensor};
use super::llama::DecoderWeights;
use super::weights::{build, Init, TensorSource};
use crate::numerics::formats::mxfp4_decode_ggml;
use crate::usage;

/// An open GGUF file: its header (metadata and tensor table) and a reader for tensor data.
pub struct GgufFile {
    content: Content,
    /// The MXFP4 tensors (ggml type 39), which candle's `Content` cannot hold.
    mxfp4: HashMap<String, Mxfp4Tensor>,
    reader: BufReader<File>,
    path: String,
}

/// The GGUF architectures of the Llama-style path (`general.architecture`); the §7.7 families'
/// are `registry`'s.
pub const LLAMA_ARCHS: &[&str] = &["llama", "qwen2", "qwen3"];

impl GgufFile {
    /// Reads the header; a truncated or corrupt file is a usage error naming it.
    pub fn open(path: &Path) -> Result<Self> {
        let shown = path.display().to_string();
        let file = File::open(path).map_err(|e| usage!("GGUF {shown}: cannot open it ({e})"))?;
        let mut reader = BufReader::new(file);
        let Header { content, mxfp4 } = read_header(&mut reader).map_err(|e| {
            usage!("GGUF {shown}: not a readable GGUF file ({e}); it may be truncated or corrupt: download it again")
        })?;
        // A file cut short still parses (the header and tensor table come first), and the
        // tensors of the first layers may lie before the cut: every tensor's extent is checked
        // against the file's length, so a truncated download is an error whatever layer is read.
        let len = std::fs::metadata(path)
            .map_err(|e| usage!("GGUF {shown}: cannot read its size ({e})"))?
            .len();
        // In file order (the table is a hash map): the message names the first tensor cut off,
        // the same on every run. The sizes are checked arithmetic: a corrupt dimension (2^63)
        // must not wrap to a small size and pass.
        let mut extents: Vec<(u64, &str, Option<u64>, String)> = content
            .tensor_infos
            .iter()
            .map(|(name, info)| {
                let dt = info.ggml_dtype;
                let elems = info
                    .shape
                    .dims()
                    .iter()
                    .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
                let bytes = elems
                    .filter(|e| e % dt.block_size() as u64 == 0)
                    .and_then(|e| (e / dt.block_size() as u64).checked_mul(dt.type_size() as u64));
                let what = format!("{:?} of {dt:?}", info.shape.dims());
                (info.offset, name.as_str(), bytes, what)
            })
            .chain(mxfp4.iter().map(|(name, t)| {
                let what = format!("{:?} of MXFP4", t.dims);
                (t.offset, name.as_str(), t.bytes(), what)
            }))
            .collect();
        extents.sort_by_key(|(offset, name, ..)| (*offset, *name));
        for (offset, name, bytes, what) in extents {
            let end = bytes.and_then(|b| {
                (content.tensor_data_offset)
                    .checked_add(offset)
                    .and_then(|o| o.checked_add(b))
            });
            let Some(end) = end else {
                return Err(usage!(
                    "GGUF {shown}: tensor {name} declares dimensions {what}, which no file can hold; the file is corrupt: download it again"
                ));
            };
            if end > len {
                return Err(usage!(
                    "GGUF {shown}: truncated: tensor {name} ends at byte {end} but the file has {len} bytes; download it again"
                ));
            }
        }
        Ok(Self {
            content,
            mxfp4,
            reader,
            path: shown,
        })
    }

    /// What errors name the file by.
    pub(crate) fn path(&self) -> &str {
        &self.path
    }

    pub(crate) fn meta(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    pub(crate) fn meta_usize(&self, key: &str) -> Result<Option<usize>> {
        self.meta(key)
            .map(|v| {
                let signed = || match v {
                    Value::I32(x) if *x >= 0 => Some(*x as u64),
                    Value::I64(x) if *x >= 0 => Some(*x as u64),
                    _ => None,
                };
                v.to_u64().ok().or_else(signed).ok_or_else(|| {
                    usage!(
                        "GGUF {}: metadata {key} is not an unsigned integer",
                        self.path
                    )
                })
            })
            .transpose()
            .map(|o| o.map(|x| x as usize))
    }

    pub(crate) fn meta_f64(&self, key: &str) -> Result<Option<f64>> {
        self.meta(key)
            .map(|v| {
                let x = v
                    .to_f32()
                    .map(f64::from)
                    .or_else(|_| v.to_f64())
                    .map_err(|_| usage!("GGUF {}: metadata {key} is not a float", self.path))?;
                // A NaN or ∞ would reach the forward as one (issue 57): named here instead.
                if !x.is_finite() {
                    return Err(usage!(
                        "GGUF {}: metadata {key} is {x}; it must be a finite number: the file is corrupt or was written wrongly",
                        self.path
                    ));
                }
                Ok(x)
            })
            .transpose()
    }

    /// A float of the metadata as the config's decimal: an f32 value (what the converter stores)
    /// becomes the shortest decimal that rounds to it, which is the config.json number it was
    /// written from whenever that number has at most ~7 significant digits (1e-5, 1.05, 10000).
    /// Both routes of a checkpoint then compute with the same f64 values.
    pub(crate) fn meta_decimal(&self, key: &str) -> Result<Option<f64>> {
        match self.meta(key) {
            Some(Value::F32(x)) => Ok(Some(f32_decimal(*x))),
            _ => self.meta_f64(key),
        }
    }

    pub(crate) fn req(&self, key: &str) -> Result<usize> {
        self.meta_usize(key)?.ok_or_else(|| {
            usage!(
                "GGUF {}: metadata {key} is missing; the file does not describe a decoder",
                self.path
            )
        })
    }

    /// A tensor's dimensions (Hugging Face order), without reading it.
    pub(crate) fn tensor_dims(&self, name: &str) -> Option<Vec<usize>> {
        let candle = self.content.tensor_infos.get(name);
        candle
            .map(|i| i.shape.dims().to_vec())
            .or_else(|| self.mxfp4.get(name).map(|t| t.dims.clone()))
    }

    /// What its tensors take in memory (issue 56): as stored, widened to f32, and the values of
    /// its largest matrix and of its largest block (a layer's tensors), which a forward of
    /// stored weights widens at a time.
    pub fn footprint(&self) -> Footprint {
        let mut f = Footprint::default();
        let mut blocks: HashMap<&str, u64> = HashMap::new();
        for (name, t) in &self.content.tensor_infos {
            let elems = t.shape.elem_count() as u64;
            f.stored += elems / t.ggml_dtype.block_size() as u64 * t.ggml_dtype.type_size() as u64;
            f.widened += 4 * elems;
            f.largest = f.largest.max(elems);
            if let Some(rest) = name.strip_prefix("blk.") {
                let layer = rest.split('.').next().unwrap_or("");
                *blocks.entry(layer).or_default() += elems;
            }
        }
        for (name, t) in &self.mxfp4 {
            let elems = t.dims.iter().product::<usize>() as u64;
            f.stored += t.bytes().unwrap_or(0);
            f.widened += 4 * elems;
            if let Some(rest) = name.strip_prefix("blk.") {
                *blocks
                    .entry(rest.split('.').next().unwrap_or(""))
                    .or_default() += elems;
            }
        }
        f.layer = blocks.values().copied().max().unwrap_or(0);
        f
    }

    /// The bytes its tensors take widened to f32 (what loading it widened holds).
    pub fn widened_bytes(&self) -> u64 {
        let dense: u64 = self
            .content
            .tensor_infos
            .values()
            .map(|t| 4 * t.shape.elem_count() as u64)
            .sum();
        let mxfp4: u64 = self
            .mxfp4
            .values()
            .map(|t| 4 * t.dims.iter().product::<usize>() as u64)
            .sum();
        dense + mxfp4
    }

    pub(crate) fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name) || self.mxfp4.contains_key(name)
    }

    /// A tensor dequantized to f32 on the CPU.
    pub(crate) fn dequantized(&mut self, name: &str) -> Result<Tensor> {
        let t = match self.mxfp4.get(name) {
            Some(m) => self.mxfp4_tensor(name, &m.clone())?,
            None => {
                let q = self
                    .content
                    .tensor(&mut self.reader, name, &Device::Cpu)
                    .map_err(|e| {
                        let em = crate::tensor_util::candle_message(&e);
                        usage!(
                            "GGUF {}: cannot read tensor '{name}' ({em}); the file may be truncated",
                            self.path
                        )
                    })?;
                q.dequantize(&Device::Cpu)?.to_dtype(DType::F32)?
            }
        };
        // A NaN or ∞ scale (or value) would reach the exact target and be blamed on the device.
        crate::tensor_util::check_finite(&t, || {
            format!("GGUF {}: tensor '{name}' (dequantized)", self.path)
        })?;
        Ok(t)
    }

    /// A tensor's ggml blocks as stored (issue 56), checked finite through a transient
    /// dequantization (as [`Self::dequantized`] checks them); None for the MXFP4 tensors, which
    /// candle's block types do not hold.
    pub(crate) fn quantized(
        &mut self,
        name: &str,
    ) -> Result<Option<candle_core::quantized::QTensor>> {
        if self.mxfp4.contains_key(name) {
            return Ok(None);
        }
        let q = self
            .content
            .tensor(&mut self.reader, name, &Device::Cpu)
            .map_err(|e| {
                let em = crate::tensor_util::candle_message(&e);
                usage!(
                    "GGUF {}: cannot read tensor '{name}' ({em}); the file may be truncated",
                    self.path
                )
            })?;
        crate::tensor_util::check_finite(&super::blocks::dequantize_parallel(&q)?, || {
            format!("GGUF {}: tensor '{name}' (dequantized)", self.path)
        })?;
        Ok(Some(q))
    }

    /// An MXFP4 tensor decoded to f32 (its extent was checked at open).
    fn mxfp4_tensor(&mut self, name: &str, t: &Mxfp4Tensor) -> Result<Tensor> {
        let bytes = t.bytes().expect("checked at open") as usize;
        let mut raw = vec![0u8; bytes];
        let start = self.content.tensor_data_offset + t.offset;
        self.reader
            .seek(SeekFrom::Start(start))
            .and_then(|_| self.reader.read_exact(&mut raw))
            .map_err(|e| {
                usage!(
                    "GGUF {}: cannot read tensor '{name}' ({e}); the file may be truncated",
                    self.path
                )
            })?;
        let values = mxfp4_decode_ggml(&raw).map_err(|e| {
            usage!(
                "GGUF {}: tensor '{name}' (MXFP4): {e}; the file is corrupt: download it again",
                self.path
            )
        })?;
        Ok(Tensor::from_vec(values, t.dims.as_slice(), &Device::Cpu)?)
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<String> {
        self.meta("general.architecture")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .ok_or_else(|| usage!("GGUF {}: no general.architecture", self.path))
    }

    /// The decoder config from the `{arch}.*` metadata.
    pub fn config(&mut self) -> Result<DecoderConfig> {
        let arch = self.architecture()?;
        let family = match arch.as_str() {
            "llama" => DecoderFamily::Llama,
            "qwen2" => DecoderFamily::Qwen2,
            "qwen3" => DecoderFamily::Qwen3,
            // The families' architectures are read by their own files (the registry); a caller
            // that knows them all names them (inputs::decoder).
            other => {
                return Err(usage!(
                    "GGUF {}: architecture \"{other}\" is not a Llama-style one ({})",
                    self.path,
                    LLAMA_ARCHS.join(", ")
                ));
            }
        };
        let k = |s: &str| format!("{arch}.{s}");
        let hidden = self.req(&k("embedding_length"))?;
        let heads = self.req(&k("attention.head_count"))?;
        let kv_heads = self
            .meta_usize(&k("attention.head_count_kv"))?
            .unwrap_or(heads);
        let head_dim = match self.meta_usize(&k("attention.key_length"))? {
            Some(p) => p,
            None => hidden / heads.max(1),
        };
        // Partial rotary (RoPE on the first rope.dimension_count dims only) is not implemented:
        // refused, rather than rotating the whole head.
        if let Some(rot) = self.meta_usize(&k("rope.dimension_count"))? {
            if rot != head_dim {
                return Err(usage!(
                    "GGUF {}: {arch}.rope.dimension_count is {rot} but the heads have {head_dim} dimensions: partial rotary embeddings are not supported (RoPE on the whole head only)",
                    self.path
                ));
            }
        }
        let layers = super::decoder_config::declared_layers(
            self.req(&k("block_count"))?,
            &format!("GGUF {}: {arch}.block_count", self.path),
        )?;
        let embd = self
            .content
            .tensor_infos
            .get("token_embd.weight")
            .ok_or_else(|| usage!("GGUF {}: tensor 'token_embd.weight' is missing", self.path))?;
        let vocab = embd.shape.dims().first().copied().unwrap_or(0);
        let theta = self.meta_f64(&k("rope.freq_base"))?.unwrap_or(10000.0);
        let scaling = self.rope_scaling(&arch, head_dim)?;
        let qkv_bias = self.has_tensor("blk.0.attn_q.bias");
        let cfg = DecoderConfig {
            family,
            hidden_size: hidden,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            num_hidden_layers: layers,
            intermediate_size: self.req(&k("feed_forward_length"))?,
            rms_norm_eps: self
                .meta_f64(&k("attention.layer_norm_rms_epsilon"))?
                .unwrap_or(1e-6),
            vocab_size: vocab,
            max_position_embeddings: self.meta_usize(&k("context_length"))?.unwrap_or(2048),
            initializer_range: 0.02,
            qkv_bias,
            o_bias: family != DecoderFamily::Qwen2 && self.has_tensor("blk.0.attn_output.bias"),
            mlp_bias: self.has_tensor("blk.0.ffn_gate.bias"),
            qk_norm: family == DecoderFamily::Qwen3,
            tie_word_embeddings: !self.has_tensor("output.weight"),
            pad_token_id: self.meta_usize("tokenizer.ggml.padding_token_id")?,
            rope: RopeConfig { theta, scaling },
            sliding_window: vec![None; layers],
        };
        cfg.validate(&self.path)?;
        Ok(cfg)
    }

    fn rope_scaling(&mut self, arch: &str, head_dim: usize) -> Result<RopeScaling> {
        // llama.cpp stores a llama3 scaling as per-frequency divisors in `rope_freqs.weight`.
        if self.has_tensor("rope_freqs.weight") {
            let d: Vec<f64> = self
                .dequantized("rope_freqs.weight")?
                .flatten_all()?
                .to_dtype(DType::F64)?
                .to_vec1()?;
            if d.len() != head_dim / 2 || d.iter().any(|&x| x <= 0.0) {
                return Err(usage!(
                    "GGUF {}: rope_freqs.weight has {} entries (head_dim/2 = {} positive divisors expected)",
                    self.path,
                    d.len(),
                    head_dim / 2
                ));
            }
            return Ok(RopeScaling::Divisors(d));
        }
        let ty = self
            .meta(&format!("{arch}.rope.scaling.type"))
            .and_then(|v| v.to_string().ok())
            .cloned();
        match ty.as_deref() {
            None | Some("none") => Ok(RopeScaling::Default),
            Some("linear") => {
                let factor = self
                    .meta_f64(&format!("{arch}.rope.scaling.factor"))?
                    .filter(|f| *f > 0.0)
                    .ok_or_else(|| {
                        usage!(
                            "GGUF {}: linear rope scaling without a positive {arch}.rope.scaling.factor",
                            self.path
                        )
                    })?;
                Ok(RopeScaling::Linear { factor })
            }
            Some(other) => Err(usage!(
                "GGUF {}: rope scaling type \"{other}\" is not supported; supported: {SUPPORTED_ROPE_TYPES}",
                self.path
            )),
        }
    }
}

/// Where a checkpoint tensor sits in llama.cpp's layout (every architecture's tensor map): one of
/// the three outside the blocks, by its GGUF name, or block `layer`'s tensor `rest`.
pub(crate) enum HfTensor<'a> {
    Outside(&'static str),
    Block { layer: &'a str, rest: &'a str },
}

/// [`HfTensor`] of a Hugging Face tensor name; None for a name in neither place.
pub(crate) fn hf_tensor(hf: &str) -> Option<HfTensor<'_>> {
    Some(match hf {
        "model.embed_tokens.weight" => HfTensor::Outside("token_embd.weight"),
        "model.norm.weight" => HfTensor::Outside("output_norm.weight"),
        "lm_head.weight" => HfTensor::Outside("output.weight"),
        _ => {
            let (layer, rest) = hf.strip_prefix("model.layers.")?.split_once('.')?;
            HfTensor::Block { layer, rest }
        }
    })
}

/// The GGUF name of a Hugging Face tensor name, and the number of heads whose rows llama.cpp
/// permuted (Some for q/k of the llama architecture).
fn gguf_name(hf: &str, cfg: &DecoderConfig) -> Option<(String, Option<usize>)> {
    let (l, part) = match hf_tensor(hf)? {
        HfTensor::Outside(g) => return Some((g.into(), None)),
        HfTensor::Block { layer, rest } => (layer, rest),
    };
    let permuted = cfg.family == DecoderFamily::Llama;
    let (stem, suffix) = part.rsplit_once('.')?;
    let (g, heads) = match stem {
        "input_layernorm" => ("attn_norm", None),
        "post_attention_layernorm" => ("ffn_norm", None),
        "self_attn.q_proj" => ("attn_q", permuted.then_some(cfg.num_attention_heads)),
        "self_attn.k_proj" => ("attn_k", permuted.then_some(cfg.num_key_value_heads)),
        "self_attn.v_proj" => ("attn_v", None),
        "self_attn.o_proj" => ("attn_output", None),
        "self_attn.q_norm" => ("attn_q_norm", None),
        "self_attn.k_norm" => ("attn_k_norm", None),
        "mlp.gate_proj" => ("ffn_gate", None),
        "mlp.up_proj" => ("ffn_up", None),
        "mlp.down_proj" => ("ffn_down", None),
        _ => return None,
    };
    Some((format!("blk.{l}.{g}.{suffix}"), heads))
}

/// Undoes `LlamaModel.permute`: the converter viewed each head's p rows as (2, p/2) and stored
/// them as (p/2, 2); viewing the GGUF rows as (heads, p/2, 2, …) and swapping the middle axes
/// restores Hugging Face's order. Works for weights [heads·p, in] and biases [heads·p].
fn unpermute(t: &Tensor, heads: usize) -> Result<Tensor> {
    let dims = t.dims().to_vec();
    let p = dims[0] / heads;
    let mut shape = vec![heads, p / 2, 2];
    shape.extend_from_slice(&dims[1..]);
    Ok(t.reshape(shape)?
        .transpose(1, 2)?
        .contiguous()?
        .reshape(dims)?)
}

/// What a checkpoint's tensors take in memory ([`GgufFile::footprint`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Bytes as stored.
    pub stored: u64,
    /// Bytes widened to f32.
    pub widened: u64,
    /// Values of the largest tensor (the embeddings or the LM head).
    pub largest: u64,
    /// Values of the largest block of a layer's tensors.
    pub layer: u64,
}

impl Footprint {
    /// The peak the weights take in a forward in `dtype_bytes` (4 or 8) when kept in `form`:
    /// what is kept, plus what is widened at a time (a layer's matrices, and the LM head when
    /// the logits are taken; an f32 model in an f32 run widens nothing).
    pub fn peak(&self, form: WeightForm, dtype_bytes: u64) -> u64 {
        match (form, dtype_bytes) {
            (WeightForm::Widened, 4) => self.widened,
            (WeightForm::Widened, _) => self.widened + dtype_bytes * self.layer.max(self.largest),
            (WeightForm::Stored, _) => self.stored + dtype_bytes * (self.layer + self.largest),
        }
    }
}

/// The shortest decimal that rounds to `x` as an f64 (see [`GgufFile::meta_decimal`]).
pub(crate) fn f32_decimal(x: f32) -> f64 {
    // Rust's f32 Display prints the shortest round-trip digits.
    x.to_string().parse().unwrap_or(x as f64)
}

struct GgufSource<'a> {
    file: &'a mut GgufFile,
    cfg: DecoderConfig,
    device: Device,
    /// Whether weight matrices keep their ggml blocks ([`TensorSource::weight`]).
    keep_stored: bool,
}

impl TensorSource for GgufSource<'_> {
    fn get(&mut self, name: &str, shape: &[usize], _init: Init) -> Result<Tensor> {
        let (g, heads) = gguf_name(name, &self.cfg)
            .ok_or_else(|| usage!("GGUF {}: no GGUF name for tensor '{name}'", self.file.path))?;
        if !self.file.has_tensor(&g) {
            return Err(usage!(
                "GGUF {}: tensor '{g}' (Hugging Face '{name}') is missing; the file does not hold a {} model matching its metadata",
                self.file.path,
                self.cfg.family.model_type()
            ));
        }
        let mut t = self.file.dequantized(&g)?;
        if t.dims() != shape {
            return Err(usage!(
                "GGUF {}: tensor '{g}' has shape {:?} but the metadata implies {:?}",
                self.file.path,
                t.dims(),
                shape
            ));
        }
        if let Some(h) = heads {
            t = unpermute(&t, h)?;
        }
        Ok(t.to_device(&self.device)?)
    }

    /// The ggml blocks as stored where asked (issue 56), llama.cpp's q/k row order undone on the
    /// blocks' rows (each row is whole blocks, so its values are those of the dequantized row).
    fn weight(&mut self, name: &str, shape: &[usize], init: Init) -> Result<Weight> {
        let (g, heads) = gguf_name(name, &self.cfg)
            .ok_or_else(|| usage!("GGUF {}: no GGUF name for tensor '{name}'", self.file.path))?;
        let q = match self.keep_stored && self.file.has_tensor(&g) {
            true => self.file.quantized(&g)?,
            false => None,
        };
        let Some(mut q) = q else {
            return Ok(Weight::Float(self.get(name, shape, init)?));
        };
        if q.shape().dims() != shape {
            return Err(usage!(
                "GGUF {}: tensor '{g}' has shape {:?} but the metadata implies {:?}",
                self.file.path,
                q.shape().dims(),
                shape
            ));
        }
        if let Some(h) = heads {
            q = ggml_rows(&q, &unpermuted_rows(shape[0], h))?;
        }
        Ok(Weight::Ggml {
            q: std::sync::Arc::new(q),
            device: self.device.clone(),
        })
    }
}

/// The GGUF row each Hugging Face row of a q/k projection of `rows` rows over `heads` heads is
/// ([`unpermute`] as a row order): row h·p + c·p/2 + j is GGUF row h·p + 2j + c.
fn unpermuted_rows(rows: usize, heads: usize) -> Vec<usize> {
    let p = rows / heads;
    (0..heads)
        .flat_map(|h| (0..2).flat_map(move |c| (0..p / 2).map(move |j| h * p + 2 * j + c)))
        .collect()
}

/// The config and the embeddings and layers 0..=`layer` of a GGUF file (only those tensors are
/// read and dequantized).
pub fn load_gguf(
    path: &Path,
    depth: impl Into<super::weights::Depth>,
    device: &Device,
) -> Result<(DecoderConfig, DecoderWeights)> {
    load_gguf_as(path, depth, device, WeightForm::Widened)
}

/// [`load_gguf`] with the weight matrices kept in `form`.
pub fn load_gguf_as(
    path: &Path,
    depth: impl Into<super::weights::Depth>,
    device: &Device,
    form: WeightForm,
) -> Result<(DecoderConfig, DecoderWeights)> {
    let mut file = GgufFile::open(path)?;
    let cfg = file.config()?;
    let mut src = GgufSource {
        file: &mut file,
        cfg: cfg.clone(),
        device: device.clone(),
        keep_stored: form == WeightForm::Stored,
    };
    let w = build(&mut src, &cfg, depth.into())?;
    Ok((cfg, w))
}

#[cfg(test)]
#[path = "gguf_tests.rs"]
pub(crate) mod tests;
