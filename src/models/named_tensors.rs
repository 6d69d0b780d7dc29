//! The tensor store every family reads (issue 54): a checkpoint's tensors by their Hugging Face
//! names, memory-mapped from safetensors or read one at a time from a GGUF and renamed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::Result;
use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

use super::blocks::Weight;
use super::gguf::GgufFile;
use crate::usage;

/// Named tensors of a checkpoint by their Hugging Face names, with errors that name the file and
/// the tensor: memory-mapped safetensors (one file, or the shards of a sharded one), or a GGUF
/// file whose tensors a family renames from llama.cpp's names ([`NamedTensors::from_gguf`]).
pub struct NamedTensors {
    store: Store,
    what: String,
    device: Device,
    /// Whether [`Self::weight`] keeps matrices as stored (issue 56).
    keep_stored: bool,
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
            keep_stored: false,
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
            keep_stored: false,
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
        super::blocks::check_float(&t, name, &self.what)?;
        let t = t.to_dtype(DType::F32)?;
        crate::tensor_util::check_finite(&t, || format!("weights {}: tensor '{name}'", self.what))?;
        Ok(t)
    }

    /// The weight matrix `name` ([`Weight`]), checked to have `shape` and finite values: as
    /// stored when the checkpoint's weights are kept so ([`Self::keep_stored`]) and the stored
    /// form is one a product widens (bf16/f16/f32 values, or a GGUF's ggml blocks whose values
    /// are the checkpoint's), else widened to f32 now.
    pub fn weight(&self, name: &str, shape: &[usize]) -> Result<Weight> {
        if !self.keep_stored {
            return Ok(Weight::Float(self.get(name, shape)?));
        }
        let stored = match &self.store {
            Store::Safetensors { .. } => {
                let t = self.raw(name)?;
                matches!(t.dtype(), DType::F32 | DType::BF16 | DType::F16)
                    .then_some(Weight::Float(t))
            }
            Store::Gguf { file, rename, .. } => match rename(name) {
                Some((g, GgufValues::Same)) if self.has(name) => {
                    let mut file = file.lock().expect("GGUF file lock");
                    file.quantized(&g)?.map(|q| Weight::Ggml {
                        q: std::sync::Arc::new(q),
                        device: self.device.clone(),
                    })
                }
                _ => None,
            },
        };
        let Some(w) = stored else {
            return Ok(Weight::Float(self.get(name, shape)?));
        };
        if w.dims() != shape {
            return Err(usage!(
                "weights {}: tensor '{name}' has shape {:?} but the config implies {shape:?}; the weights do not fit the config",
                self.what,
                w.dims()
            ));
        }
        if let Weight::Float(t) = &w {
            let wide = t.to_dtype(DType::F32)?;
            crate::tensor_util::check_finite(&wide, || {
                format!("weights {}: tensor '{name}'", self.what)
            })?;
        }
        Ok(w)
    }

    /// Keeps the weight matrices as stored ([`Self::weight`]) rather than widened at load.
    pub fn keep_stored(mut self, keep: bool) -> Self {
        self.keep_stored = keep;
        self
    }

    /// What errors name the checkpoint by.
    pub fn what(&self) -> &str {
        &self.what
    }
}
