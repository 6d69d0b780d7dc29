//! Gemma 2 (`gemma2`) and Gemma 3 text (`gemma3_text`, and the multimodal `gemma3` wrapper's
//! language model) as §7.7 families (docs/reference.md §7.7.1–7.7.2), step for step as
//! transformers' eager `modeling_gemma2.py` / `modeling_gemma3.py`: embeddings × √hidden, (1 + w)
//! RMSNorms (four per layer, and gemma3's per-head q/k norms), a gelu_tanh MLP, τ =
//! `query_pre_attn_scalar`^(−1/2), gemma2's soft-cap, sliding and global layers, and gemma3's two
//! RoPEs (local θ on sliding layers, global θ with its scaling on full ones).

use anyhow::Result;
use candle_core::{DType, Tensor};
use serde_json::{json, Value};

use super::blocks::{
    attention_out, embed_ids, linear, lm_logits, loaded_head, rms_norm, row_chunks, split_heads,
    Linear, Weight,
};
use super::decoder::{Decoder, DecoderShape, LayerInputs, Positions};
use super::decoder_config::{rope_config, RopeConfig, RopeScaling};
use super::family_common::{linear_weight, lm_head_weight, ConfigFields, LoadedLayers};
use super::named_tensors::NamedTensors;
use super::rope;
use super::weights::Depth;
use crate::attention::spec::{AttentionSpec, LayerType};
use crate::usage;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Variant {
    Gemma2,
    Gemma3,
}

/// A gemma config.json, validated.
#[derive(Debug, Clone)]
struct GemmaConfig {
    variant: Variant,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    layers: usize,
    intermediate: usize,
    eps: f64,
    vocab: usize,
    max_positions: usize,
    /// τ = query_pre_attn_scalar^(−1/2).
    scale: f64,
    softcap: Option<f64>,
    /// W of the sliding layers.
    window: Option<usize>,
    layer_types: Vec<LayerType>,
    /// Full-attention layers' RoPE (gemma2: every layer's).
    rope_global: RopeConfig,
    /// Sliding layers' RoPE (gemma3's local θ, no scaling).
    rope_local: RopeConfig,
}

impl GemmaConfig {
    fn from_json(v: &Value, variant: Variant, what: &str) -> Result<Self> {
        let f = ConfigFields::new(v, format!("config.json ({what})"));
        if let Some(act) = f.str_opt("hidden_activation")?.or(f.str_opt("hidden_act")?) {
            if !matches!(act, "gelu_pytorch_tanh" | "gelu_tanh") {
                return Err(usage!(
                    "{}: field \"hidden_activation\" is \"{act}\"; gemma's MLP is gelu_pytorch_tanh",
                    f.what
                ));
            }
        }
        // gemma2: every size and the attention's parameters must be stated (released configs
        // state them all). gemma3: transformers' Gemma3TextConfig defaults fill what is absent,
        // because the multimodal checkpoints' text_config leaves them out (gemma-3-4b-it states
        // neither its heads nor head_dim nor query_pre_attn_scalar).
        let (layers, heads, p, sizes) = match variant {
            Variant::Gemma2 => (
                f.layers(None)?,
                f.usize_req("num_attention_heads")?,
                f.usize_req("head_dim")?,
                [
                    f.usize_req("hidden_size")?,
                    f.usize_req("intermediate_size")?,
                    f.usize_req("vocab_size")?,
                ],
            ),
            Variant::Gemma3 => (
                f.layers(Some(26))?,
                f.usize_or("num_attention_heads", 8)?,
                f.usize_or("head_dim", 256)?,
                [
                    f.usize_or("hidden_size", 2304)?,
                    f.usize_or("intermediate_size", 9216)?,
                    f.usize_or("vocab_size", 262_208)?,
                ],
            ),
        };
        let kv_heads = f.usize_or("num_key_value_heads", heads)?;
        if !heads.is_multiple_of(kv_heads) || !p.is_multiple_of(2) {
            return Err(usage!(
                "{}: num_attention_heads {heads} must be a multiple of num_key_value_heads {kv_heads}, and head_dim {p} even",
                f.what
            ));
        }
        let scalar = match variant {
            Variant::Gemma2 => f.positive_or("query_pre_attn_scalar", None)?,
            Variant::Gemma3 => f.positive_or("query_pre_attn_scalar", Some(256.0))?,
        };
        let softcap = match (variant, f.v.get("attn_logit_softcapping")) {
            // gemma2's cap is a field of every released config; absent, it is refused rather
            // than taken from the class default (50), which a foreign config may not mean.
            (Variant::Gemma2, None) => return Err(f.missing("attn_logit_softcapping")),
            _ => f.f64_opt("attn_logit_softcapping")?,
        };
        let layer_types = f.layer_types(layers, |l| default_layer_type(&f, variant, l))?;
        let window = match variant {
            Variant::Gemma2 => f.sliding_window()?,
            Variant::Gemma3 => f.sliding_window()?.or(Some(4096)),
        };
        if window.is_none() && layer_types.contains(&LayerType::Sliding) {
            return Err(f.missing("sliding_window"));
        }
        let (rope_global, rope_local) = ropes(&f, variant)?;
        let cfg = Self {
            variant,
            hidden: sizes[0],
            heads,
            kv_heads,
            head_dim: p,
            layers,
            intermediate: sizes[1],
            eps: f.f64_opt("rms_norm_eps")?.unwrap_or(1e-6),
            vocab: sizes[2],
            max_positions: f.usize_or("max_position_embeddings", 8192)?,
            scale: scalar.powf(-0.5),
            softcap,
            window,
            layer_types,
            rope_global,
            rope_local,
        };
        // A cap of 0 or a negative one ("attn_logit_softcapping") is no attention.
        for l in 0..layers {
            cfg.spec(l).validate(
                heads,
                &format!(
                    "{} (attn_logit_softcapping, sliding_window) layer {l}",
                    f.what
                ),
            )?;
        }
        Ok(cfg)
    }

    fn spec(&self, l: usize) -> AttentionSpec {
        let window = match self.layer_types[l] {
            LayerType::Sliding => self.window,
            LayerType::Full => None,
        };
        AttentionSpec::causal(self.head_dim, window)
            .with_scale(self.scale)
            .with_softcap(self.softcap)
    }
}

/// Without `layer_types`: gemma2's alternation (layer l slides iff (l + 1) mod 2 ≠ 0), gemma3's
/// pattern P (`sliding_window_pattern`, transformers 5's `_sliding_window_pattern`, default 6).
fn default_layer_type(f: &ConfigFields, variant: Variant, l: usize) -> LayerType {
    let pattern = match variant {
        Variant::Gemma2 => 2,
        Variant::Gemma3 => ["sliding_window_pattern", "_sliding_window_pattern"]
            .iter()
            .find_map(|k| f.get(k).and_then(Value::as_u64))
            .filter(|&p| p > 0)
            .unwrap_or(6) as usize,
    };
    if !(l + 1).is_multiple_of(pattern) {
        LayerType::Sliding
    } else {
        LayerType::Full
    }
}

/// (global, local) RoPE. transformers 5 writes gemma3's as `rope_parameters: {"full_attention":
/// {...}, "sliding_attention": {...}}`, read first; else the legacy keys: `rope_theta` +
/// `rope_scaling` for global layers, `rope_local_base_freq` (10000) unscaled for local ones.
/// gemma2 has one RoPE for every layer.
fn ropes(f: &ConfigFields, variant: Variant) -> Result<(RopeConfig, RopeConfig)> {
    let params = f
        .get("rope_parameters")
        .filter(|p| p.get("full_attention").is_some());
    let one = |v: &Value| rope_config(v, &f.what);
    match (variant, params) {
        (Variant::Gemma2, _) => {
            let r = one(f.v)?;
            Ok((r.clone(), r))
        }
        (Variant::Gemma3, Some(p)) => {
            let sub = |k: &str| -> Result<RopeConfig> {
                let s = p.get(k).ok_or_else(|| {
                    usage!("{}: field \"rope_parameters\" has no \"{k}\"", f.what)
                })?;
                one(
                    &json!({ "rope_parameters": s, "max_position_embeddings": f.get("max_position_embeddings") }),
                )
            };
            Ok((sub("full_attention")?, sub("sliding_attention")?))
        }
        (Variant::Gemma3, None) => {
            let mut global = one(f.v)?;
            if f.get("rope_theta").is_none() && f.get("rope_parameters").is_none() {
                global.theta = 1_000_000.0; // Gemma3TextConfig's rope_theta
            }
            let local = RopeConfig {
                theta: f.positive_or("rope_local_base_freq", Some(10_000.0))?,
                scaling: RopeScaling::Default,
            };
            Ok((global, local))
        }
    }
}

/// (1 + w)·x̂: gemma's RMSNorm, with 1 + w formed in x's dtype (f32 as transformers, or f64).
fn gemma_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    rms_norm(x, &(w.to_dtype(x.dtype())? + 1.0)?, eps)
}

/// Layer weights: what layer L needs, and for layers before L the rest.
struct GemmaLayer {
    input_norm: Tensor,
    q: Linear,
    k: Linear,
    v: Linear,
    /// gemma3's per-head norms ([p]).
    qk_norm: Option<(Tensor, Tensor)>,
    rest: Option<GemmaRest>,
}

struct GemmaRest {
    o: Linear,
    post_attn_norm: Tensor,
    pre_ffw_norm: Tensor,
    post_ffw_norm: Tensor,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// The output head of a whole model: the final (1 + w) norm, the LM head (None: tied to the
/// embeddings) and the final logit soft-cap.
struct GemmaHead {
    norm: Tensor,
    lm_head: Option<Weight>,
    final_softcap: Option<f64>,
}

/// A gemma model loaded through layer L, or whole (with its head).
pub struct Gemma {
    cfg: GemmaConfig,
    embed: Weight,
    layers: Vec<GemmaLayer>,
    head: Option<GemmaHead>,
}

/// The family loader for `gemma2`, `gemma3_text` and the `gemma3` wrapper.
pub fn load(config: &Value, weights: &mut NamedTensors, depth: Depth) -> Result<Box<dyn Decoder>> {
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or("");
    let (text, variant, prefix) = match model_type {
        "gemma2" => (config, Variant::Gemma2, "model."),
        "gemma3_text" => (config, Variant::Gemma3, "model."),
        "gemma3" => {
            let text = config.get("text_config").filter(|t| t.is_object()).ok_or_else(|| {
                usage!("config.json (gemma3): a multimodal gemma3 config needs its \"text_config\"; give it, or a gemma3_text checkpoint")
            })?;
            (text, Variant::Gemma3, wrapper_prefix(weights)?)
        }
        other => return Err(usage!("config.json: model_type \"{other}\" is not a gemma")),
    };
    let cfg = GemmaConfig::from_json(text, variant, model_type)?;
    let loaded = LoadedLayers::of(depth, cfg.layers)?;
    let embed = weights.weight(
        &format!("{prefix}embed_tokens.weight"),
        &[cfg.vocab, cfg.hidden],
    )?;
    let layers = (0..loaded.count)
        .map(|l| {
            load_layer(
                weights,
                &cfg,
                &format!("{prefix}layers.{l}"),
                loaded.full(l),
            )
        })
        .collect::<Result<_>>()?;
    let head = loaded
        .whole
        .then(|| load_head(config, text, weights, &cfg, prefix))
        .transpose()?;
    Ok(Box::new(Gemma {
        cfg,
        embed,
        layers,
        head,
    }))
}

/// The final norm, the LM head and the final cap. The head is `lm_head.weight` beside the
/// language model (the wrapper's hub layout: `language_model.lm_head.weight`), tied to the
/// embeddings unless `tie_word_embeddings` (the wrapper's own field for the wrapper; gemma's
/// config classes default it to true) says otherwise.
fn load_head(
    config: &Value,
    text: &Value,
    w: &NamedTensors,
    cfg: &GemmaConfig,
    prefix: &str,
) -> Result<GemmaHead> {
    let lm_name = match prefix {
        "language_model.model." => "language_model.lm_head.weight",
        _ => "lm_head.weight",
    };
    let what = format!(
        "config.json ({})",
        config["model_type"].as_str().unwrap_or("")
    );
    let tied = ConfigFields::new(config, what.clone())
        .bool_opt("tie_word_embeddings")?
        .unwrap_or(true);
    Ok(GemmaHead {
        norm: w.get(&format!("{prefix}norm.weight"), &[cfg.hidden])?,
        lm_head: lm_head_weight(w, lm_name, tied, cfg.vocab, cfg.hidden)?,
        final_softcap: final_softcap(&ConfigFields::new(text, what), cfg.variant)?,
    })
}

/// `final_logit_softcapping`: null for none (gemma3's default). gemma2 must state it, as it must
/// its attention cap (released configs do; the class default, 30, is not taken for a config
/// that leaves it out). A cap must be positive: c·tanh(s/c) at c ≤ 0 is no cap.
fn final_softcap(f: &ConfigFields, variant: Variant) -> Result<Option<f64>> {
    const FIELD: &str = "final_logit_softcapping";
    if variant == Variant::Gemma2 && f.v.get(FIELD).is_none() {
        return Err(f.missing(FIELD));
    }
    match f.f64_opt(FIELD)? {
        Some(c) if !(c.is_finite() && c > 0.0) => Err(usage!(
            "{}: field \"{FIELD}\" is {c}; a soft-cap must be a positive number (or null for none)",
            f.what
        )),
        c => Ok(c),
    }
}

/// Where the multimodal wrapper keeps its language model: `language_model.model.` in the hub's
/// files, `model.language_model.` as transformers ≥ 4.52 saves it. The vision tower is not read.
fn wrapper_prefix(weights: &NamedTensors) -> Result<&'static str> {
    ["language_model.model.", "model.language_model."]
        .into_iter()
        .find(|p| weights.has(&format!("{p}embed_tokens.weight")))
        .ok_or_else(|| {
            usage!(
                "weights {}: a gemma3 multimodal checkpoint, but no language_model.model.embed_tokens.weight (nor model.language_model.embed_tokens.weight); the weights do not fit config.json",
                weights.what()
            )
        })
}

fn load_layer(w: &NamedTensors, cfg: &GemmaConfig, pre: &str, full: bool) -> Result<GemmaLayer> {
    let (hid, p, inter) = (cfg.hidden, cfg.head_dim, cfg.intermediate);
    let (qd, kvd) = (cfg.heads * p, cfg.kv_heads * p);
    let a = format!("{pre}.self_attn");
    let norm = |name: &str, dim: usize| w.get(&format!("{name}.weight"), &[dim]);
    let rest = full
        .then(|| -> Result<GemmaRest> {
            let m = format!("{pre}.mlp");
            Ok(GemmaRest {
                o: linear_weight(w, &format!("{a}.o_proj.weight"), hid, qd)?,
                post_attn_norm: norm(&format!("{pre}.post_attention_layernorm"), hid)?,
                pre_ffw_norm: norm(&format!("{pre}.pre_feedforward_layernorm"), hid)?,
                post_ffw_norm: norm(&format!("{pre}.post_feedforward_layernorm"), hid)?,
                gate: linear_weight(w, &format!("{m}.gate_proj.weight"), inter, hid)?,
                up: linear_weight(w, &format!("{m}.up_proj.weight"), inter, hid)?,
                down: linear_weight(w, &format!("{m}.down_proj.weight"), hid, inter)?,
            })
        })
        .transpose()?;
    let qk_norm = (cfg.variant == Variant::Gemma3)
        .then(|| -> Result<_> {
            Ok((
                norm(&format!("{a}.q_norm"), p)?,
                norm(&format!("{a}.k_norm"), p)?,
            ))
        })
        .transpose()?;
    Ok(GemmaLayer {
        input_norm: norm(&format!("{pre}.input_layernorm"), hid)?,
        q: linear_weight(w, &format!("{a}.q_proj.weight"), qd, hid)?,
        k: linear_weight(w, &format!("{a}.k_proj.weight"), kvd, hid)?,
        v: linear_weight(w, &format!("{a}.v_proj.weight"), kvd, hid)?,
        qk_norm,
        rest,
    })
}

impl Gemma {
    /// Post-RoPE Q [H, n, p], K, V [H_kv, n, p] of layer `l` from its input X [n, hidden]; the
    /// tables are (global, local).
    fn qkv(&self, x: &Tensor, l: usize, tables: &Positions) -> Result<(Tensor, Tensor, Tensor)> {
        let (cfg, lw) = (&self.cfg, &self.layers[l]);
        let h = gemma_norm(x, &lw.input_norm, cfg.eps)?;
        let mut q = split_heads(&linear(&h, &lw.q)?, cfg.heads, cfg.head_dim)?;
        let mut k = split_heads(&linear(&h, &lw.k)?, cfg.kv_heads, cfg.head_dim)?;
        let v = split_heads(&linear(&h, &lw.v)?, cfg.kv_heads, cfg.head_dim)?;
        if let Some((qn, kn)) = &lw.qk_norm {
            q = gemma_norm(&q, qn, cfg.eps)?;
            k = gemma_norm(&k, kn, cfg.eps)?;
        }
        let (cos, sin) = match cfg.layer_types[l] {
            LayerType::Full => &tables.0[0],
            LayerType::Sliding => &tables.0[1],
        };
        Ok((rope::apply(&q, cos, sin)?, rope::apply(&k, cos, sin)?, v))
    }
}

impl Decoder for Gemma {
    fn model_type(&self) -> &'static str {
        match self.cfg.variant {
            Variant::Gemma2 => "gemma2",
            Variant::Gemma3 => "gemma3_text",
        }
    }

    fn shape(&self) -> DecoderShape {
        let c = &self.cfg;
        DecoderShape {
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            head_dim_v: c.head_dim,
            layers: c.layers,
            max_position_embeddings: c.max_positions,
            vocab_size: c.vocab,
            hidden: c.hidden,
            intermediate: c.intermediate,
        }
    }

    fn attention_spec(&self, layer: usize) -> AttentionSpec {
        self.cfg.spec(layer)
    }

    /// The layer type's RoPE (global or local), as `embed`'s tables.
    fn layer_rope(&self, layer: usize) -> Option<rope::LayerRope> {
        let cfg = &self.cfg;
        let config = match cfg.layer_types[layer] {
            LayerType::Full => &cfg.rope_global,
            LayerType::Sliding => &cfg.rope_local,
        };
        Some(rope::LayerRope {
            inv_freq: rope::inv_freq(config, cfg.head_dim),
            attention_factor: 1.0,
        })
    }

    fn loaded_layers(&self) -> usize {
        self.layers.len()
    }

    fn has_head(&self) -> bool {
        self.head.is_some()
    }

    /// X⁰ = embed[ids]·√hidden, and both RoPE tables: (global, local).
    fn embed(&self, ids: &[u32], dtype: DType) -> Result<(Tensor, Positions)> {
        let cfg = &self.cfg;
        let n = ids.len();
        // The factor rounded to the model's dtype: gemma2's `normalizer =
        // torch.tensor(hidden**0.5, dtype=hidden.dtype)`. gemma3 keeps it in a buffer made by
        // `torch.tensor(hidden**0.5)`, float32 (torch's default dtype) before any cast, so
        // transformers multiplies by f32(√hidden) even in float64: followed here (METHODS §7.7.1
        // says "a tensor of the model's dtype"; the two differ by ≤ 3e-8 relative in f64, and
        // only where √hidden is not an f32 number).
        let normalizer = match (dtype, cfg.variant) {
            (DType::F64, Variant::Gemma2) => (cfg.hidden as f64).sqrt(),
            _ => (cfg.hidden as f64).sqrt() as f32 as f64,
        };
        let x = (embed_ids(&self.embed, ids, dtype)? * normalizer)?;
        let dev = self.embed.device();
        let tables = vec![
            rope::cos_sin(&cfg.rope_global, cfg.head_dim, n, dtype, dev)?,
            rope::cos_sin(&cfg.rope_local, cfg.head_dim, n, dtype, dev)?,
        ];
        Ok((x, Positions(tables)))
    }

    fn attention_inputs(&self, x: &Tensor, l: usize, pos: &Positions) -> Result<LayerInputs> {
        Ok(LayerInputs::qkv(self.qkv(x, l, pos)?))
    }

    /// o_proj and the four-norm residuals with the MLP.
    fn finish(&self, x: &Tensor, o: &Tensor, l: usize) -> Result<Tensor> {
        let cfg = &self.cfg;
        let rest = self.layers[l]
            .rest
            .as_ref()
            .expect("layers before L carry o_proj and the MLP");
        // The MLP widened once for the row chunks (issue 56), dropped after the layer.
        let dt = x.dtype();
        let (gate, up, down) = (
            rest.gate.widened(dt)?,
            rest.up.widened(dt)?,
            rest.down.widened(dt)?,
        );
        let attn = attention_out(o, &rest.o)?;
        let x = (x + gemma_norm(&attn, &rest.post_attn_norm, cfg.eps)?)?;
        let outs = row_chunks(x.dim(0)?, x.device(), |s, rows| {
            let xs = x.narrow(0, s, rows)?;
            let h = gemma_norm(&xs, &rest.pre_ffw_norm, cfg.eps)?;
            let act = (linear(&h, &gate)?.gelu()? * linear(&h, &up)?)?;
            let mlp = gemma_norm(&linear(&act, &down)?, &rest.post_ffw_norm, cfg.eps)?;
            Ok((xs + mlp)?)
        })?;
        Ok(Tensor::cat(&outs, 0)?)
    }

    /// transformers' `Gemma2ForCausalLM` / `Gemma3ForCausalLM` head: the final (1 + w) norm,
    /// the LM head, then c·tanh(logits/c) when `final_logit_softcapping` is set, in X's dtype.
    fn head_logits(&self, x: &Tensor) -> Result<Tensor> {
        let head = loaded_head(&self.head)?;
        let x = gemma_norm(x, &head.norm, self.cfg.eps)?;
        let logits = lm_logits(&x, head.lm_head.as_ref(), &self.embed)?;
        match head.final_softcap {
            Some(c) => Ok(((logits / c)?.tanh()? * c)?),
            None => Ok(logits),
        }
    }
}

#[cfg(test)]
#[path = "gemma_tests.rs"]
mod tests;
