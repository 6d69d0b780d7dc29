//! What the §7.7 family files share in loading: typed config.json fields with errors that name
//! the family and the field, `layer_types`, a positive sliding window, the layers a depth loads,
//! and the Linear layers and output head read from the checkpoint.

use anyhow::Result;
use serde_json::Value;

use super::blocks::{Linear, OutputHead, Weight};
use super::named_tensors::NamedTensors;
use super::weights::Depth;
use crate::attention::spec::LayerType;
use crate::usage;

/// Typed access to one family's config.json (or a wrapper's `text_config`); `what` names it in
/// errors, e.g. `config.json (gemma2)`.
pub(super) struct ConfigFields<'a> {
    pub v: &'a Value,
    pub what: String,
}

impl<'a> ConfigFields<'a> {
    pub fn new(v: &'a Value, what: impl Into<String>) -> Self {
        Self {
            v,
            what: what.into(),
        }
    }

    /// The field, None when absent or null.
    pub fn get(&self, name: &str) -> Option<&'a Value> {
        self.v.get(name).filter(|x| !x.is_null())
    }

    pub fn usize_opt(&self, name: &str) -> Result<Option<usize>> {
        self.get(name)
            .map(|x| {
                x.as_u64().map(|u| u as usize).ok_or_else(|| {
                    usage!(
                        "{}: field \"{name}\" must be a non-negative integer, found {x}",
                        self.what
                    )
                })
            })
            .transpose()
    }

    /// A required positive integer.
    pub fn usize_req(&self, name: &str) -> Result<usize> {
        let x = self.usize_opt(name)?.ok_or_else(|| self.missing(name))?;
        if x == 0 {
            return Err(usage!("{}: field \"{name}\" must be positive", self.what));
        }
        Ok(x)
    }

    /// `num_hidden_layers` (`default` when absent and given), within the layers a model can have.
    pub fn layers(&self, default: Option<usize>) -> Result<usize> {
        let n = match default {
            Some(d) => self.usize_or("num_hidden_layers", d)?,
            None => self.usize_req("num_hidden_layers")?,
        };
        super::decoder_config::declared_layers(n, &format!("{}: num_hidden_layers", self.what))
    }

    /// A positive integer, `default` when absent (transformers' config-class default).
    pub fn usize_or(&self, name: &str, default: usize) -> Result<usize> {
        match self.usize_opt(name)? {
            Some(0) => Err(usage!("{}: field \"{name}\" must be positive", self.what)),
            Some(x) => Ok(x),
            None => Ok(default),
        }
    }

    pub fn f64_opt(&self, name: &str) -> Result<Option<f64>> {
        self.get(name)
            .map(|x| {
                let v = x.as_f64().ok_or_else(|| {
                    usage!(
                        "{}: field \"{name}\" must be a number, found {x}",
                        self.what
                    )
                })?;
                super::decoder_config::within_f32(v, &format!("{}: field \"{name}\"", self.what))
            })
            .transpose()
    }

    /// A required count that must be at least 1.
    pub fn positive(&self, name: &str) -> Result<usize> {
        match self.usize_req(name)? {
            0 => Err(usage!(
                "{}: field \"{name}\" is 0; it must be at least 1",
                self.what
            )),
            k => Ok(k),
        }
    }

    pub fn bool_opt(&self, name: &str) -> Result<Option<bool>> {
        self.get(name)
            .map(|x| {
                x.as_bool().ok_or_else(|| {
                    usage!(
                        "{}: field \"{name}\" must be true or false, found {x}",
                        self.what
                    )
                })
            })
            .transpose()
    }

    /// A positive finite number, `default` when absent or null.
    pub fn positive_or(&self, name: &str, default: Option<f64>) -> Result<f64> {
        let x = self
            .f64_opt(name)?
            .or(default)
            .ok_or_else(|| self.missing(name))?;
        if !(x.is_finite() && x > 0.0) {
            return Err(usage!(
                "{}: field \"{name}\" is {x}; it must be a positive number",
                self.what
            ));
        }
        Ok(x)
    }

    pub fn str_opt(&self, name: &str) -> Result<Option<&'a str>> {
        self.get(name)
            .map(|x| {
                x.as_str().ok_or_else(|| {
                    usage!(
                        "{}: field \"{name}\" must be a string, found {x}",
                        self.what
                    )
                })
            })
            .transpose()
    }

    pub fn missing(&self, name: &str) -> anyhow::Error {
        usage!(
            "{}: field \"{name}\" is missing; this family's config.json needs it",
            self.what
        )
    }

    /// `sliding_window`: None when absent or null; 0 is refused (a window of 0 sees no key).
    pub fn sliding_window(&self) -> Result<Option<usize>> {
        match self.usize_opt("sliding_window")? {
            Some(0) => Err(usage!(
                "{}: field \"sliding_window\" is 0; a window of 0 keys sees nothing (give W ≥ 1, or null for none)",
                self.what
            )),
            w => Ok(w),
        }
    }

    /// `layer_types` (one known entry per layer) when present, else `default(l)` per layer.
    pub fn layer_types(
        &self,
        layers: usize,
        default: impl Fn(usize) -> LayerType,
    ) -> Result<Vec<LayerType>> {
        let Some(types) = self.get("layer_types") else {
            return Ok((0..layers).map(default).collect());
        };
        let types = types.as_array().ok_or_else(|| {
            usage!(
                "{}: field \"layer_types\" must be a list of layer types",
                self.what
            )
        })?;
        if types.len() != layers {
            return Err(usage!(
                "{}: field \"layer_types\" has {} entries but num_hidden_layers is {layers}",
                self.what,
                types.len()
            ));
        }
        types
            .iter()
            .enumerate()
            .map(|(l, t)| {
                let field = format!("{}: field \"layer_types\"[{l}]", self.what);
                LayerType::parse(t.as_str().unwrap_or(&t.to_string()), &field)
            })
            .collect()
    }
}

/// The layers a family loader reads for a [`Depth`]: 0..=L (the layers before L whole, L's
/// attention projections only) for a dump, or every layer whole and the output head for the
/// end-to-end forward (docs/reference.md §10.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LoadedLayers {
    /// How many layers are loaded.
    pub count: usize,
    /// Whether the whole model is loaded (every layer whole, the final norm and the LM head).
    pub whole: bool,
}

impl LoadedLayers {
    /// Checks `depth` against the model's `layers`.
    pub fn of(depth: Depth, layers: usize) -> Result<Self> {
        match depth {
            Depth::Through(l) => {
                check_layer(l, layers)?;
                Ok(Self {
                    count: l + 1,
                    whole: false,
                })
            }
            Depth::Whole => Ok(Self {
                count: layers,
                whole: true,
            }),
        }
    }

    /// Whether layer `l` is loaded whole (o_proj and the MLP beside its attention projections).
    pub fn full(&self, l: usize) -> bool {
        self.whole || l + 1 < self.count
    }
}

/// Refuses a layer index the model does not have.
pub(super) fn check_layer(layer: usize, layers: usize) -> Result<()> {
    if layer >= layers {
        return Err(usage!(
            "--layer {layer}: the model has {layers} layers (0..={})",
            layers - 1
        ));
    }
    Ok(())
}

/// A weight-only Linear (no bias) from the checkpoint, [out, inp].
pub(super) fn linear_weight(
    w: &NamedTensors,
    name: &str,
    out: usize,
    inp: usize,
) -> Result<Linear> {
    Ok(Linear {
        weight: w.weight(name, &[out, inp])?,
        bias: None,
    })
}

/// Rows `start..start + len` of a fused projection as a Linear of its own.
pub(super) fn linear_rows(fused: &Weight, start: usize, len: usize) -> Result<Linear> {
    Ok(Linear {
        weight: fused.rows(start, len)?,
        bias: None,
    })
}

/// The final RMSNorm (`model.norm.weight`) and the LM head (`lm_head.weight` [vocab, hidden]) of a
/// model loaded whole, the head as [`lm_head_weight`] chooses it (`tie`: config.json's
/// `tie_word_embeddings`; the GGUF readers set it where the file has no `output.weight`).
pub(super) fn load_output_head(
    w: &NamedTensors,
    tie: bool,
    vocab: usize,
    hidden: usize,
) -> Result<OutputHead> {
    Ok(OutputHead {
        norm: w.get("model.norm.weight", &[hidden])?,
        lm_head: lm_head_weight(w, "lm_head.weight", tie, vocab, hidden)?,
    })
}

/// The LM head [vocab, hidden] of a whole model, None when tied to the token embeddings. As
/// transformers 5 loads it: `name` when the checkpoint has it (also under
/// `tie_word_embeddings`, whose tie transformers drops when both tensors are stored and differ,
/// and which is the same product when they are equal), else the embeddings when `tied`; a
/// missing untied head is refused (transformers would draw it at random).
pub(super) fn lm_head_weight(
    w: &NamedTensors,
    name: &str,
    tied: bool,
    vocab: usize,
    hidden: usize,
) -> Result<Option<Weight>> {
    if w.has(name) {
        return Ok(Some(w.weight(name, &[vocab, hidden])?));
    }
    if !tied {
        return Err(usage!(
            "weights {}: tensor '{name}' is missing and tie_word_embeddings is false; the whole model needs its LM head",
            w.what()
        ));
    }
    Ok(None)
}
