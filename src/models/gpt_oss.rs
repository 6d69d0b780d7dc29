//! gpt-oss (docs/reference.md §7.7.4): q/k/v/o with biases, GQA, learned sinks per layer,
//! alternating sliding/full layers, yarn RoPE (attention factor on cos and sin, rotate-half),
//! plain RMSNorms, and a top-k MoE of clamped SwiGLU experts with biases (gate/up interleaved).
//! Experts stored in MXFP4 on the hub are decoded on load (`quantized_weights`).

use std::ops::Range;

use anyhow::Result;
use candle_core::{DType, Tensor};
use serde_json::{Map, Value};

use super::continuation::PromptCache;
use super::family::{FamilyModel, FamilyShape, LayerDump};
use super::family_common::{
    attend_checked, continuation_layers, embed_ids, head_logits, load_output_head, merge_heads,
    whole_head, ConfigFields, ContinuationCall, LoadedLayers,
};
use super::llama::{
    linear, rms_norm, split_heads, AttentionHook, ExactAttention, Linear, OutputHead,
};
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
    embed: Tensor,
    layers: Vec<GptOssLayer>,
    /// The final norm and the LM head: only when loaded whole.
    head: Option<OutputHead>,
}

/// The [`super::registry::Loader`] of gpt-oss.
pub fn load(
    config: &Value,
    weights: &mut NamedTensors,
    depth: Depth,
) -> Result<Box<dyn FamilyModel>> {
    let what = weights.what().to_string();
    let cfg = GptOssConfig::parse(config, &what)?;
    let loaded = LoadedLayers::of(depth, cfg.layers)?;
    let embed = weights.get("model.embed_tokens.weight", &[cfg.vocab, cfg.hidden])?;
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
        weight: w.get(&format!("{name}.weight"), &[out, inp])?,
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
    /// Post-RoPE Q [H, n, p], K and V [H_kv, n, p] of layer `l` from its input X [n, hidden].
    fn qkv(
        &self,
        x: &Tensor,
        l: usize,
        rope_t: &(Tensor, Tensor),
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let (lw, c) = (&self.layers[l], &self.cfg);
        let h = rms_norm(x, &lw.input_norm, c.eps)?;
        let q = split_heads(&linear(&h, &lw.q)?, c.heads, c.head_dim)?;
        let k = split_heads(&linear(&h, &lw.k)?, c.kv_heads, c.head_dim)?;
        let v = split_heads(&linear(&h, &lw.v)?, c.kv_heads, c.head_dim)?;
        Ok((
            rope::apply(&q, &rope_t.0, &rope_t.1)?,
            rope::apply(&k, &rope_t.0, &rope_t.1)?,
            v,
        ))
    }

    /// One whole layer (transformers' `GptOssDecoderLayer.forward`, eval), its attention through
    /// `hook` with the layer's spec (sinks included).
    fn decoder_layer(
        &self,
        x: &Tensor,
        l: usize,
        rope_t: &(Tensor, Tensor),
        hook: &dyn AttentionHook,
    ) -> Result<Tensor> {
        let (q, k, v) = self.qkv(x, l, rope_t)?;
        let o = attend_checked(hook, l, &q, &k, &v, &self.attention_spec(l))?;
        self.finish(x, &o, l)
    }

    /// Layer `l`'s output rows from their input X [m, hidden] and attention O [H, m, p]: o_proj,
    /// the residual and the MoE.
    fn finish(&self, x: &Tensor, o: &Tensor, l: usize) -> Result<Tensor> {
        let rest = self.layers[l]
            .rest
            .as_ref()
            .expect("layers before L carry o_proj and the MoE");
        let x = (x + linear(&merge_heads(o)?, &rest.o)?)?;
        let h = rms_norm(&x, &rest.post_norm, self.cfg.eps)?;
        Ok((&x + self.moe(&h, rest)?)?)
    }

    /// The embedded window `ids` (in `dtype`) after layers 0..`upto`, with the RoPE tables.
    fn run_layers(
        &self,
        ids: &[u32],
        dtype: DType,
        upto: usize,
        hook: &dyn AttentionHook,
    ) -> Result<(Tensor, (Tensor, Tensor))> {
        let mut x = embed_ids(&self.embed, ids, dtype)?;
        let rope_t = self
            .cfg
            .rope
            .cos_sin(ids.len(), dtype, self.embed.device())?;
        for l in 0..upto {
            // A layer of a long window takes seconds: a signal stops the forward here.
            crate::interrupt::check()?;
            x = self.decoder_layer(&x, l, &rope_t, hook)?;
        }
        Ok((x, rope_t))
    }

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

impl FamilyModel for GptOss {
    fn model_type(&self) -> &'static str {
        "gpt_oss"
    }

    fn shape(&self) -> FamilyShape {
        let c = &self.cfg;
        FamilyShape {
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            head_dim_v: c.head_dim,
            layers: c.layers,
            max_position_embeddings: c.max_position_embeddings,
            vocab_size: c.vocab,
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

    fn layer_dump(&self, ids: &[u32], dtype: DType) -> Result<LayerDump> {
        let last = self.layers.len() - 1;
        let (x, rope_t) = self.run_layers(ids, dtype, last, &ExactAttention)?;
        let (q, k, v) = self.qkv(&x, last, &rope_t)?;
        Ok(LayerDump {
            q,
            k,
            v,
            // The sinks travel in the spec (the dump writes them as an f32 tensor).
            spec: self.attention_spec(last),
            extra: Vec::new(),
            sidecar: Map::new(),
        })
    }

    /// transformers' `GptOssForCausalLM.forward`: the layers, then `lm_head(norm(x))` on `rows`.
    fn forward_logits(
        &self,
        ids: &[u32],
        dtype: DType,
        hook: &dyn AttentionHook,
        rows: Range<usize>,
    ) -> Result<Tensor> {
        let loaded = self.layers.len();
        let head = whole_head(self.head.as_ref(), "gpt_oss", loaded, &rows, ids.len())?;
        let (x, _) = self.run_layers(ids, dtype, loaded, hook)?;
        head_logits(
            &x.narrow(0, rows.start, rows.len())?,
            head,
            &self.embed,
            self.cfg.eps,
        )
    }

    fn has_continuation(&self) -> bool {
        true
    }

    fn continuation_logits(
        &self,
        ids: &[u32],
        dtype: DType,
        hook: &dyn AttentionHook,
        prompt: &PromptCache,
        rows: Range<usize>,
    ) -> Option<Result<Tensor>> {
        Some((|| {
            let (n, layers) = (ids.len(), self.layers.len());
            let head = self.head.as_ref();
            let call = ContinuationCall::new(head, "gpt_oss", layers, prompt, n, &rows)?;
            let x = call.rows_of(&embed_ids(&self.embed, ids, dtype)?)?;
            let (cos, sin) = self.cfg.rope.cos_sin(n, dtype, self.embed.device())?;
            let rope_t = (call.rows_of(&cos)?, call.rows_of(&sin)?);
            let x = continuation_layers(
                prompt,
                hook,
                x,
                layers,
                |l| self.attention_spec(l),
                |x, l| {
                    let (q, k, v) = self.qkv(x, l, &rope_t)?;
                    Ok((q, k, v, None))
                },
                |x, o, l| self.finish(x, o, l),
            )?;
            head_logits(&call.scored(&x)?, call.head, &self.embed, self.cfg.eps)
        })())
    }
}

#[cfg(test)]
#[path = "gpt_oss_tests.rs"]
mod tests;
