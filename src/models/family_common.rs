//! What the §7.7 family files share: typed config.json fields with errors that name the family
//! and the field, `layer_types`, a positive sliding window, the embedding lookup, and the
//! attention block's head layout, and for the whole model (docs/reference.md §10.1) the output
//! head and the checked call of a layer's attention hook.

use std::ops::Range;
use std::sync::Arc;

use anyhow::Result;
use candle_core::{DType, Tensor};
use serde_json::Value;

use super::continuation::PromptCache;
use super::llama::{linear, rms_norm, AttentionHook, Linear, OutputHead};
use super::named_tensors::NamedTensors;
use super::weights::Depth;
use crate::attention::latent::LayerLatent;
use crate::attention::spec::{AttentionSpec, LayerType};
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

/// The embeddings of `ids` ([n, hidden], in `dtype`, f32 or f64) from `embed` [vocab, hidden].
pub(super) fn embed_ids(embed: &Tensor, ids: &[u32], dtype: DType) -> Result<Tensor> {
    if !matches!(dtype, DType::F32 | DType::F64) {
        return Err(usage!(
            "a decoder forward runs in f32 or f64, not {dtype:?}"
        ));
    }
    if ids.is_empty() {
        return Err(usage!("an empty token window has no forward"));
    }
    let vocab = embed.dim(0)?;
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= vocab) {
        return Err(usage!(
            "token id {bad} is outside the model's vocabulary of {vocab} (the tokenizer or the ids do not fit the model)"
        ));
    }
    let ids_t = Tensor::from_vec(ids.to_vec(), ids.len(), embed.device())?;
    Ok(embed.index_select(&ids_t, 0)?.to_dtype(dtype)?)
}

/// [H, n, p] → [n, H·p] (the attention output as o_proj reads it).
pub(super) fn merge_heads(o: &Tensor) -> Result<Tensor> {
    let (h, n, p) = o.dims3()?;
    Ok(o.transpose(0, 1)?.contiguous()?.reshape((n, h * p))?)
}

/// The attention block's output: O [H, n, p_v] back to rows [n, H·p_v], through o_proj.
pub(super) fn attention_out(o: &Tensor, o_proj: &Linear) -> Result<Tensor> {
    linear(&merge_heads(o)?, o_proj)
}

/// A weight-only Linear (no bias) from the checkpoint, [out, inp].
pub(super) fn linear_weight(
    w: &NamedTensors,
    name: &str,
    out: usize,
    inp: usize,
) -> Result<Linear> {
    Ok(Linear {
        weight: w.get(name, &[out, inp])?,
        bias: None,
    })
}

/// Rows `start..start + len` of a fused projection as a Linear of its own.
pub(super) fn linear_rows(fused: &Tensor, start: usize, len: usize) -> Result<Linear> {
    Ok(Linear {
        weight: fused.narrow(0, start, len)?.contiguous()?,
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

/// The output head of a model asked for logits, refused unless it was loaded whole; and `rows`
/// checked to be a non-empty range of the window's `n` rows. `loaded`: the layers loaded.
pub(super) fn whole_head<'a>(
    head: Option<&'a OutputHead>,
    model_type: &str,
    loaded: usize,
    rows: &Range<usize>,
    n: usize,
) -> Result<&'a OutputHead> {
    check_logits_call(model_type, head.is_some(), loaded, rows, n)?;
    Ok(head.expect("checked: loaded whole"))
}

/// The rows X [m, hidden] through the final norm and the LM head (no bias, as transformers'
/// `lm_head`): logits [m, vocab] in X's dtype. `embed` is the head where it is tied.
pub(super) fn head_logits(
    x: &Tensor,
    head: &OutputHead,
    embed: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    lm_logits(&rms_norm(x, &head.norm, eps)?, head.lm_head.as_ref(), embed)
}

/// One call of a family's continuation-only forward (docs/reference.md §10.1 [REC]), checked: a
/// whole model, a prompt cache of its layers, and `rows` inside the continuation n_p..n.
pub(super) struct ContinuationCall<'a, H> {
    /// The model's final norm and LM head.
    pub head: &'a H,
    n_p: usize,
    n_f: usize,
    rows: Range<usize>,
}

impl<'a, H> ContinuationCall<'a, H> {
    pub fn new(
        head: Option<&'a H>,
        model_type: &str,
        layers: usize,
        prompt: &PromptCache,
        n: usize,
        rows: &Range<usize>,
    ) -> Result<Self> {
        check_logits_call(model_type, head.is_some(), layers, rows, n)?;
        prompt.check_call(layers, n, rows)?;
        let head = head.expect("checked: loaded whole");
        Ok(Self {
            head,
            n_p: prompt.n_p(),
            n_f: n - prompt.n_p(),
            rows: rows.clone(),
        })
    }

    /// The continuation's rows n_p..n of a whole-window tensor's first axis (X⁰, a RoPE table).
    pub fn rows_of(&self, t: &Tensor) -> Result<Tensor> {
        Ok(t.narrow(0, self.n_p, self.n_f)?)
    }

    /// The scored rows among the continuation's output rows X [n_f, hidden].
    pub fn scored(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.narrow(0, self.rows.start - self.n_p, self.rows.len())?)
    }
}

/// A layer's post-RoPE Q, K, V of some rows, and on MLA those rows' latent [m, r + d_R] with the
/// layer's W_kvb (what its hook is handed, [`attend_checked_with`]).
pub(super) type RowsAttentionInputs = (Tensor, Tensor, Tensor, Option<(Tensor, Tensor)>);

/// The continuation-only forward's layers (docs/reference.md §10.1 [REC]) for a family whose
/// layer splits at its attention: `x` holds the continuation rows' X⁰ [n_f, hidden] (rows
/// n_p..n), `inputs(x, l)` gives layer l's attention inputs of those rows at their positions,
/// and `finish(x, o, l)` the layer's output rows from their attention rows O [H, n_f, p_v]. Each
/// layer's attention goes through `hook` on the whole window, the prompt's rows (and latent
/// rows) from `prompt` (the exact run's), under the layer's own spec. Returns the last layer's
/// output rows.
pub(super) fn continuation_layers(
    prompt: &PromptCache,
    hook: &dyn AttentionHook,
    mut x: Tensor,
    layers: usize,
    spec: impl Fn(usize) -> AttentionSpec,
    inputs: impl Fn(&Tensor, usize) -> Result<RowsAttentionInputs>,
    finish: impl Fn(&Tensor, &Tensor, usize) -> Result<Tensor>,
) -> Result<Tensor> {
    let (n_p, n_f) = (prompt.n_p(), x.dim(0)?);
    for l in 0..layers {
        crate::interrupt::check()?;
        let (qc, kc, vc, latent) = inputs(&x, l)?;
        let qkv = prompt.whole_window(l, (&qc, &kc, &vc))?;
        let latent = latent
            .map(|(rows, w_kv_b)| prompt.whole_latent(l, &rows, w_kv_b))
            .transpose()?;
        let qkv = (&qkv.0, &qkv.1, &qkv.2);
        let o = attend_checked_with(hook, l, qkv, &spec(l), latent.as_ref())?;
        x = finish(&x, &o.narrow(1, n_p, n_f)?, l)?;
    }
    Ok(x)
}

/// Layer `l`'s attention through `hook`: O [H, n, p_v] (Q's heads and rows, V's width; p_v ≠
/// p_qk for MLA), refused with a usage error when the hook returns another shape (a user's
/// callable can), and in Q's dtype.
pub(super) fn attend_checked(
    hook: &dyn AttentionHook,
    l: usize,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    spec: &AttentionSpec,
) -> Result<Tensor> {
    attend_checked_with(hook, l, (q, k, v), spec, None)
}

/// [`attend_checked`] on an MLA layer, whose hook is also handed the layer's latent view
/// ([`AttentionHook::attend_latent`]).
pub(super) fn attend_checked_with(
    hook: &dyn AttentionHook,
    l: usize,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    spec: &AttentionSpec,
    latent: Option<&Arc<LayerLatent>>,
) -> Result<Tensor> {
    let o = match latent {
        Some(latent) => hook.attend_latent(l, q, k, v, spec, latent)?,
        None => hook.attend(l, q, k, v, spec)?,
    };
    let (h, n, _) = q.dims3()?;
    let want = [h, n, v.dim(2)?];
    if o.dims() != want {
        return Err(usage!(
            "the attention of layer {l} returned shape {:?}; it must return O [H, n, p_v] = {want:?}",
            o.dims()
        ));
    }
    Ok(o.to_dtype(q.dtype())?)
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
) -> Result<Option<Tensor>> {
    if w.has(name) {
        return Ok(Some(w.get(name, &[vocab, hidden])?));
    }
    if !tied {
        return Err(usage!(
            "weights {}: tensor '{name}' is missing and tie_word_embeddings is false; the whole model needs its LM head",
            w.what()
        ));
    }
    Ok(None)
}

/// The logits X·Wᵀ [m, vocab] of the normed rows X [m, hidden], W the LM head or, tied, the
/// token embeddings.
pub(super) fn lm_logits(x: &Tensor, lm_head: Option<&Tensor>, embed: &Tensor) -> Result<Tensor> {
    let w = lm_head.unwrap_or(embed);
    Ok(x.matmul(&w.to_dtype(x.dtype())?.t()?)?)
}

/// Refuses a `forward_logits` call before any layer runs: a model loaded through layer L (it
/// has no output head), or rows that are empty or past the window's n.
pub(super) fn check_logits_call(
    model_type: &str,
    whole: bool,
    loaded: usize,
    rows: &Range<usize>,
    n: usize,
) -> Result<()> {
    if !whole {
        return Err(usage!(
            "the logits of a {model_type} model need the whole model loaded (models::Depth::Whole); only layers 0..={} are loaded",
            loaded.saturating_sub(1)
        ));
    }
    if rows.is_empty() || rows.end > n {
        return Err(usage!(
            "forward_logits: rows {rows:?} must be a non-empty range within the window's {n} tokens"
        ));
    }
    Ok(())
}
