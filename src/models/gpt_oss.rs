//! gpt-oss (docs/reference.md §7.7.4): q/k/v/o with biases, GQA, learned sinks per layer,
//! alternating sliding/full layers, yarn RoPE (attention factor on cos and sin, rotate-half),
//! plain RMSNorms, and a top-k MoE of clamped SwiGLU experts with biases (gate/up interleaved).
//! Experts stored in MXFP4 on the hub are decoded on load (`quantized_weights`).

use anyhow::Result;
use candle_core::{DType, Tensor};
use serde_json::Value;

use super::blocks::{
    embed_ids, head_logits, linear, loaded_head, merge_heads, rms_norm, split_heads, Linear,
    OutputHead, Weight,
};
use super::decoder::{Decoder, DecoderShape, LayerInputs, Positions};
use super::family_common::{load_output_head, ConfigFields, LoadedLayers};
use super::moe::{dispatch, host_rows, sigmoid, top_k, Routing};
use super::named_tensors::NamedTensors;
use super::quantized_weights::mxfp4_or_plain;
use super::rope::{self, FamilyRope};
use super::weights::Depth;
use crate::attention::spec::{AttentionSpec, LayerType};
use crate::usage;

/// What gpt-oss's config.json says.
#[derive(Debug, Clone, PartialEq)]
pub struct GptOssConfig {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub layers: usize,
    pub vocab: usize,
    pub max_position_embeddings: usize,
    pub eps: f64,
    pub layer_types: Vec<LayerType>,
    /// W of the sliding layers.
    pub sliding_window: Option<usize>,
    pub experts: usize,
    pub experts_per_token: usize,
    pub intermediate: usize,
    pub swiglu_limit: f64,
    pub swiglu_alpha: f64,
    pub attention_bias: bool,
    /// transformers' GptOssConfig default: false.
    pub tie_word_embeddings: bool,
    pub rope: FamilyRope,
}

impl GptOssConfig {
    /// Parses and checks config.json; `what` names it in errors.
    pub fn parse(v: &Value, what: &str) -> Result<Self> {
        let f = ConfigFields::new(v, format!("config {what}"));
        let (hidden, heads) = (
            f.positive("hidden_size")?,
            f.positive("num_attention_heads")?,
        );
        let kv_heads = f.positive("num_key_value_heads")?;
        if heads % kv_heads != 0 {
            return Err(usage!(
                "config {what}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            ));
        }
        let head_dim = f.usize_opt("head_dim")?.unwrap_or(hidden / heads);
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(usage!(
                "config {what}: head_dim {head_dim} must be even and positive (RoPE rotates pairs)"
            ));
        }
        let layers = f.layers(None)?;
        let experts = f.positive("num_local_experts")?;
        let experts_per_token = f.positive("num_experts_per_tok")?;
        if experts_per_token > experts {
            return Err(usage!(
                "config {what}: num_experts_per_tok {experts_per_token} exceeds num_local_experts {experts}"
            ));
        }
        Ok(Self {
            hidden,
            heads,
            kv_heads,
            head_dim,
            layers,
            vocab: f.positive("vocab_size")?,
            max_position_embeddings: f.usize_opt("max_position_embeddings")?.unwrap_or(131072),
            eps: f.f64_opt("rms_norm_eps")?.unwrap_or(1e-5),
            layer_types: layer_types(&f, layers)?,
            // transformers' GptOssConfig default is 128; an explicit null means no window.
            sliding_window: match v.get("sliding_window") {
                None => Some(128),
                Some(_) => f.usize_opt("sliding_window")?,
            },
            experts,
            experts_per_token,
            intermediate: f.positive("intermediate_size")?,
            swiglu_limit: f.f64_opt("swiglu_limit")?.unwrap_or(7.0),
            swiglu_alpha: f.f64_opt("swiglu_alpha")?.unwrap_or(1.702),
            attention_bias: f.bool_opt("attention_bias")?.unwrap_or(true),
            tie_word_embeddings: f.bool_opt("tie_word_embeddings")?.unwrap_or(false),
            rope: FamilyRope::from_config(v, head_dim, what)?,
        })
    }

    /// Layer l's exact attention without its sinks (weights): τ = 1/√p, W on sliding layers.
    fn spec_without_sinks(&self, l: usize) -> AttentionSpec {
        let window = match self.layer_types[l] {
            LayerType::Sliding => self.sliding_window,
            LayerType::Full => None,
        };
        AttentionSpec::causal(self.head_dim, window)
    }
}

/// `layer_types` when given (one per layer), else transformers' default: layer l slides iff
/// (l + 1) mod 2 ≠ 0, i.e. the even layers.
fn layer_types(f: &ConfigFields, layers: usize) -> Result<Vec<LayerType>> {
    let Some(list) = f.get("layer_types") else {
        return Ok((0..layers)
            .map(|l| {
                if l % 2 == 0 {
                    LayerType::Sliding
                } else {
                    LayerType::Full
                }
            })
            .collect());
    };
    let list = list.as_array().filter(|a| a.len() == layers).ok_or_else(|| {
        usage!(
            "{}: field \"layer_types\" must be a list of {layers} layer types (one per layer), found {list}",
            f.what
        )
    })?;
    list.iter()
        .enumerate()
        .map(|(l, t)| {
            let field = format!("{}: layer_types[{l}]", f.what);
            LayerType::parse(t.as_str().unwrap_or_default(), &field)
        })
        .collect()
}

/// gpt-oss's stacked experts: gate_up [E, hidden, 2I] (gate even columns, up odd), down
/// [E, I, hidden], each with a bias.
struct StackedExperts {
    gate_up: Tensor,
    gate_up_bias: Tensor,
    down: Tensor,
    down_bias: Tensor,
}

/// What layers before L add to the attention: o_proj, the post-attention norm and the MoE.
struct LayerRest {
    o: Linear,
    post_norm: Tensor,
    router: Linear,
    experts: StackedExperts,
}

struct GptOssLayer {
    input_norm: Tensor,
    q: Linear,
    k: Linear,
    v: Linear,
    /// σ_h, f32 as stored (widened).
    sinks: Tensor,
    rest: Option<LayerRest>,
}

/// gpt-oss loaded through layer L, or whole.
pub struct GptOss {
    cfg: GptOssConfig,
    embed: Weight,
    layers: Vec<GptOssLayer>,
    /// The final norm and the LM head: only when loaded whole.
    head: Option<OutputHead>,
}

/// The [`super::registry::Loader`] of gpt-oss.
pub fn load(config: &Value, weights: &mut NamedTensors, depth: Depth) -> Result<Box<dyn Decoder>> {
    let what = weights.what().to_string();
    let cfg = GptOssConfig::parse(config, &what)?;
    let loaded = LoadedLayers::of(depth, cfg.layers)?;
    let embed = weights.weight("model.embed_tokens.weight", &[cfg.vocab, cfg.hidden])?;
    let layers = (0..loaded.count)
        .map(|l| load_layer(weights, &cfg, l, loaded.full(l)))
        .collect::<Result<_>>()?;
    let head = if loaded.whole {
        Some(load_output_head(
            weights,
            cfg.tie_word_embeddings,
            cfg.vocab,
            cfg.hidden,
        )?)
    } else {
        None
    };
    Ok(Box::new(GptOss {
        cfg,
        embed,
        layers,
        head,
    }))
}

fn load_linear(w: &NamedTensors, name: &str, out: usize, inp: usize, bias: bool) -> Result<Linear> {
    Ok(Linear {
        weight: w.weight(&format!("{name}.weight"), &[out, inp])?,
        bias: if bias {
            Some(w.get(&format!("{name}.bias"), &[out])?)
        } else {
            None
        },
    })
}

fn load_layer(
    w: &NamedTensors,
    cfg: &GptOssConfig,
    l: usize,
    with_rest: bool,
) -> Result<GptOssLayer> {
    let p = format!("model.layers.{l}");
    let (hd, pq, pkv) = (
        cfg.hidden,
        cfg.heads * cfg.head_dim,
        cfg.kv_heads * cfg.head_dim,
    );
    let bias = cfg.attention_bias;
    let rest = if with_rest {
        let (e, i) = (cfg.experts, cfg.intermediate);
        let x = format!("{p}.mlp.experts");
        Some(LayerRest {
            o: load_linear(w, &format!("{p}.self_attn.o_proj"), hd, pq, bias)?,
            post_norm: w.get(&format!("{p}.post_attention_layernorm.weight"), &[hd])?,
            router: load_linear(w, &format!("{p}.mlp.router"), e, hd, true)?,
            experts: StackedExperts {
                gate_up: mxfp4_or_plain(w, &format!("{x}.gate_up_proj"), [e, hd, 2 * i])?,
                gate_up_bias: w.get(&format!("{x}.gate_up_proj_bias"), &[e, 2 * i])?,
                down: mxfp4_or_plain(w, &format!("{x}.down_proj"), [e, i, hd])?,
                down_bias: w.get(&format!("{x}.down_proj_bias"), &[e, hd])?,
            },
        })
    } else {
        None
    };
    Ok(GptOssLayer {
        input_norm: w.get(&format!("{p}.input_layernorm.weight"), &[hd])?,
        q: load_linear(w, &format!("{p}.self_attn.q_proj"), pq, hd, bias)?,
        k: load_linear(w, &format!("{p}.self_attn.k_proj"), pkv, hd, bias)?,
        v: load_linear(w, &format!("{p}.self_attn.v_proj"), pkv, hd, bias)?,
        sinks: w.get(&format!("{p}.self_attn.sinks"), &[cfg.heads])?,
        rest,
    })
}

impl GptOss {
    /// The MoE: router logits (linear + bias), top-k, softmax over the k chosen; each chosen
    /// expert's clamped SwiGLU, weighted and summed.
    fn moe(&self, h: &Tensor, rest: &LayerRest) -> Result<Tensor> {
        let c = &self.cfg;
        let routing: Routing = host_rows(&linear(h, &rest.router)?)?
            .iter()
            .map(|logits| {
                let chosen = top_k(logits, c.experts_per_token);
                let top = logits[chosen[0]];
                let e: Vec<f64> = chosen.iter().map(|&i| (logits[i] - top).exp()).collect();
                let sum: f64 = e.iter().sum();
                chosen.into_iter().zip(e.iter().map(|x| x / sum)).collect()
            })
            .collect();
        let ex = &rest.experts;
        let dt = h.dtype();
        dispatch(h, &routing, c.experts, |e, rows| {
            let gu = rows
                .matmul(&ex.gate_up.get(e)?.to_dtype(dt)?)?
                .broadcast_add(&ex.gate_up_bias.get(e)?.to_dtype(dt)?)?;
            let pairs = gu.reshape((rows.dim(0)?, c.intermediate, 2))?;
            let gate = pairs
                .narrow(2, 0, 1)?
                .squeeze(2)?
                .clamp(f64::NEG_INFINITY, c.swiglu_limit)?;
            let up = pairs
                .narrow(2, 1, 1)?
                .squeeze(2)?
                .clamp(-c.swiglu_limit, c.swiglu_limit)?;
            let glu = (&gate * sigmoid(&(&gate * c.swiglu_alpha)?)?)?;
            let act = ((up + 1.0)? * glu)?;
            Ok(act
                .matmul(&ex.down.get(e)?.to_dtype(dt)?)?
                .broadcast_add(&ex.down_bias.get(e)?.to_dtype(dt)?)?)
        })
    }
}

impl Decoder for GptOss {
    fn model_type(&self) -> &'static str {
        "gpt_oss"
    }

    fn shape(&self) -> DecoderShape {
        let c = &self.cfg;
        DecoderShape {
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            head_dim_v: c.head_dim,
            layers: c.layers,
            max_position_embeddings: c.max_position_embeddings,
            vocab_size: c.vocab,
            hidden: c.hidden,
            intermediate: c.experts_per_token * c.intermediate,
        }
    }

    /// The config's alone: a layer past L has no loaded sinks, and needs none for its window.
    fn window(&self, layer: usize) -> Option<usize> {
        self.cfg.spec_without_sinks(layer).window
    }

    /// The sinks are weights: only the loaded layers 0..=L have them.
    fn attention_spec(&self, layer: usize) -> AttentionSpec {
        let sinks = self.layers.get(layer).unwrap_or_else(|| {
            panic!(
                "gpt-oss layer {layer} is not loaded (layers 0..={})",
                self.layers.len() - 1
            )
        });
        let sinks: Vec<f64> = sinks
            .sinks
            .to_dtype(DType::F64)
            .and_then(|s| s.to_vec1())
            .expect("the sinks are an [H] tensor");
        self.cfg.spec_without_sinks(layer).with_sinks(Some(sinks))
    }

    fn loaded_layers(&self) -> usize {
        self.layers.len()
    }

    fn has_head(&self) -> bool {
        self.head.is_some()
    }

    fn embed(&self, ids: &[u32], dtype: DType) -> Result<(Tensor, Positions)> {
        let x = embed_ids(&self.embed, ids, dtype)?;
        let rope = self
            .cfg
            .rope
            .cos_sin(ids.len(), dtype, self.embed.device())?;
        Ok((x, Positions(vec![rope])))
    }

    /// Post-RoPE Q [H, n, p], K and V [H_kv, n, p] of layer `l` (the sinks travel in its spec).
    fn attention_inputs(&self, x: &Tensor, l: usize, pos: &Positions) -> Result<LayerInputs> {
        let (lw, c) = (&self.layers[l], &self.cfg);
        let (cos, sin) = pos.single();
        let h = rms_norm(x, &lw.input_norm, c.eps)?;
        let q = split_heads(&linear(&h, &lw.q)?, c.heads, c.head_dim)?;
        let k = split_heads(&linear(&h, &lw.k)?, c.kv_heads, c.head_dim)?;
        let v = split_heads(&linear(&h, &lw.v)?, c.kv_heads, c.head_dim)?;
        Ok(LayerInputs::qkv((
            rope::apply(&q, cos, sin)?,
            rope::apply(&k, cos, sin)?,
            v,
        )))
    }

    /// o_proj, the residual and the MoE (transformers' `GptOssDecoderLayer.forward`, eval).
    fn finish(&self, x: &Tensor, o: &Tensor, l: usize) -> Result<Tensor> {
        let rest = self.layers[l]
            .rest
            .as_ref()
            .expect("layers before L carry o_proj and the MoE");
        let x = (x + linear(&merge_heads(o)?, &rest.o)?)?;
        let h = rms_norm(&x, &rest.post_norm, self.cfg.eps)?;
        Ok((&x + self.moe(&h, rest)?)?)
    }

    /// transformers' `GptOssForCausalLM`: `lm_head(norm(x))`.
    fn head_logits(&self, x: &Tensor) -> Result<Tensor> {
        let head = loaded_head(&self.head)?;
        head_logits(x, head, &self.embed, self.cfg.eps)
    }
}

#[cfg(test)]
#[path = "gpt_oss_tests.rs"]
mod tests;
