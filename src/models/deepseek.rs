//! DeepSeek-V2 and DeepSeek-V3 (docs/reference.md §7.7.5): MLA attention (`mla`), yarn RoPE with
//! mscale (τ = m(f, mscale_all_dim)²/√p_qk), plain RMSNorms, `first_k_dense_replace` dense
//! SwiGLU layers, then MoE layers with shared experts: V2 a softmax router with greedy or
//! group-limited top-k, V3 a sigmoid router whose selection adds `e_score_correction_bias`, with
//! group top-k and normalised weights; both × `routed_scaling_factor`. FP8 weights with block
//! scales (V3's hub checkpoints) are dequantized on load.

use anyhow::Result;
use candle_core::{DType, Tensor};
use serde_json::{Map, Value};

use super::blocks::{
    embed_ids, head_logits, linear, loaded_head, merge_heads, rms_norm, Linear, OutputHead, Weight,
};
use super::decoder::{Decoder, DecoderShape, LayerInputs, Positions};
use super::family_common::{load_output_head, ConfigFields, LoadedLayers};
use super::mla::{load_linear, MlaDims, MlaWeights, RopeLayout};
use super::moe::{dispatch, host_rows, top_k, Routing};
use super::named_tensors::NamedTensors;
use super::rope::{yarn_mscale, FamilyRope};
use super::weights::Depth;
use crate::attention::spec::AttentionSpec;
use crate::usage;

#[path = "deepseek_config.rs"]
mod config;
pub use config::{DeepseekConfig, Router};

/// A SwiGLU MLP: down(silu(gate(x))·up(x)).
struct SwiGlu {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl SwiGlu {
    fn load(w: &NamedTensors, prefix: &str, hidden: usize, inter: usize) -> Result<Self> {
        Ok(Self {
            gate: load_linear(w, &format!("{prefix}.gate_proj"), inter, hidden, false)?,
            up: load_linear(w, &format!("{prefix}.up_proj"), inter, hidden, false)?,
            down: load_linear(w, &format!("{prefix}.down_proj"), hidden, inter, false)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        linear(
            &(linear(x, &self.gate)?.silu()? * linear(x, &self.up)?)?,
            &self.down,
        )
    }
}

/// A MoE layer's router and experts.
struct Moe {
    /// [E, hidden].
    gate: Tensor,
    /// V3's e_score_correction_bias, as f64.
    correction: Option<Vec<f64>>,
    experts: Vec<SwiGlu>,
    shared: Option<SwiGlu>,
}

enum Mlp {
    Dense(SwiGlu),
    Moe(Moe),
}

/// What layers before L add to the attention.
struct LayerRest {
    o: Linear,
    post_norm: Tensor,
    mlp: Mlp,
}

struct DeepseekLayer {
    input_norm: Tensor,
    attn: MlaWeights,
    rest: Option<LayerRest>,
}

/// A DeepSeek-V2/V3 model loaded through layer L, or whole.
pub struct Deepseek {
    cfg: DeepseekConfig,
    embed: Weight,
    layers: Vec<DeepseekLayer>,
    /// The final norm and the LM head: only when loaded whole.
    head: Option<OutputHead>,
}

/// The [`super::registry::Loader`] of deepseek_v2 and deepseek_v3.
pub fn load(config: &Value, weights: &mut NamedTensors, depth: Depth) -> Result<Box<dyn Decoder>> {
    let what = weights.what().to_string();
    let cfg = DeepseekConfig::parse(config, &what)?;
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
    Ok(Box::new(Deepseek {
        cfg,
        embed,
        layers,
        head,
    }))
}

fn load_layer(
    w: &NamedTensors,
    cfg: &DeepseekConfig,
    l: usize,
    with_rest: bool,
) -> Result<DeepseekLayer> {
    let p = format!("model.layers.{l}");
    let hd = cfg.hidden;
    // The attention first: its kv_b_proj check names the MLA ranks, which o_proj's shape also
    // depends on.
    let attn = MlaWeights::load(
        w,
        &format!("{p}.self_attn"),
        &cfg.mla,
        hd,
        cfg.attention_bias,
    )?;
    let rest = if with_rest {
        let mlp = if l < cfg.first_k_dense_replace {
            Mlp::Dense(SwiGlu::load(w, &format!("{p}.mlp"), hd, cfg.intermediate)?)
        } else {
            Mlp::Moe(load_moe(w, cfg, &format!("{p}.mlp"))?)
        };
        let o_in = cfg.mla.heads * cfg.mla.d_v;
        Some(LayerRest {
            o: load_linear(
                w,
                &format!("{p}.self_attn.o_proj"),
                hd,
                o_in,
                cfg.attention_bias,
            )?,
            post_norm: w.get(&format!("{p}.post_attention_layernorm.weight"), &[hd])?,
            mlp,
        })
    } else {
        None
    };
    Ok(DeepseekLayer {
        input_norm: w.get(&format!("{p}.input_layernorm.weight"), &[hd])?,
        attn,
        rest,
    })
}

fn load_moe(w: &NamedTensors, cfg: &DeepseekConfig, p: &str) -> Result<Moe> {
    let (hd, mi) = (cfg.hidden, cfg.moe_intermediate);
    let correction = match cfg.router {
        Router::Sigmoid { .. } => {
            let b = w.get(&format!("{p}.gate.e_score_correction_bias"), &[cfg.experts])?;
            Some(b.to_dtype(DType::F64)?.to_vec1()?)
        }
        Router::Softmax { .. } => None,
    };
    Ok(Moe {
        gate: w.get(&format!("{p}.gate.weight"), &[cfg.experts, hd])?,
        correction,
        experts: (0..cfg.experts)
            .map(|e| SwiGlu::load(w, &format!("{p}.experts.{e}"), hd, mi))
            .collect::<Result<_>>()?,
        shared: match cfg.shared_experts {
            0 => None,
            s => Some(SwiGlu::load(w, &format!("{p}.shared_experts"), hd, mi * s)?),
        },
    })
}

impl Deepseek {
    /// The routed experts (weighted by the router) plus the shared experts.
    fn moe(&self, h: &Tensor, moe: &Moe) -> Result<Tensor> {
        let logits = host_rows(&h.matmul(&moe.gate.to_dtype(h.dtype())?.t()?)?)?;
        let routing: Routing = logits
            .iter()
            .map(|row| self.cfg.route(row, moe.correction.as_deref()))
            .collect();
        let routed = dispatch(h, &routing, moe.experts.len(), |e, rows| {
            moe.experts[e].forward(rows)
        })?;
        match &moe.shared {
            Some(s) => Ok((routed + s.forward(h)?)?),
            None => Ok(routed),
        }
    }
}

impl Decoder for Deepseek {
    fn is_mla(&self) -> bool {
        true
    }
    fn mla_latent_width(&self) -> Option<usize> {
        Some(self.cfg.mla.kv_lora_rank + self.cfg.mla.d_rope)
    }
    fn model_type(&self) -> &'static str {
        match self.cfg.router {
            Router::Softmax { .. } => "deepseek_v2",
            Router::Sigmoid { .. } => "deepseek_v3",
        }
    }

    fn shape(&self) -> DecoderShape {
        let c = &self.cfg;
        DecoderShape {
            heads: c.mla.heads,
            kv_heads: c.mla.heads,
            head_dim: c.mla.qk_head_dim(),
            head_dim_v: c.mla.d_v,
            layers: c.layers,
            max_position_embeddings: c.max_position_embeddings,
            vocab_size: c.vocab,
            hidden: c.hidden,
            intermediate: c
                .intermediate
                .max((c.experts_per_token + c.shared_experts) * c.moe_intermediate),
        }
    }

    fn attention_spec(&self, _layer: usize) -> AttentionSpec {
        let p = self.cfg.mla.qk_head_dim();
        AttentionSpec::causal(p, None).with_scale(self.cfg.scale())
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

    /// Layer `l`'s materialised Q, K, V of the rows X [m, hidden] (the MLA module's eager call),
    /// and their latent rows with W_kvb: what a §8 cache on this layer quantizes (the
    /// materialised K/V being what nobody caches), and what a dump writes as `kv_latent` and
    /// `w_kv_b`.
    fn attention_inputs(&self, x: &Tensor, l: usize, pos: &Positions) -> Result<LayerInputs> {
        let lw = &self.layers[l];
        let (cos, sin) = pos.single();
        let h = rms_norm(x, &lw.input_norm, self.cfg.eps)?;
        let m = lw.attn.forward(&h, &self.cfg.mla, cos, sin)?;
        let w_kv_b = lw.attn.w_kv_b(&self.cfg.mla, h.dtype())?;
        Ok(LayerInputs {
            q: m.q,
            k: m.k,
            v: m.v,
            latent: Some((m.latent, w_kv_b)),
        })
    }

    /// o_proj, the residual and the dense or MoE MLP (transformers'
    /// `DeepseekV{2,3}DecoderLayer.forward`, eval).
    fn finish(&self, x: &Tensor, o: &Tensor, l: usize) -> Result<Tensor> {
        let rest = self.layers[l]
            .rest
            .as_ref()
            .expect("layers before L carry o_proj and the MLP");
        let x = (x + linear(&merge_heads(o)?, &rest.o)?)?;
        let h = rms_norm(&x, &rest.post_norm, self.cfg.eps)?;
        let y = match &rest.mlp {
            Mlp::Dense(mlp) => mlp.forward(&h)?,
            Mlp::Moe(moe) => self.moe(&h, moe)?,
        };
        Ok((x + y)?)
    }

    /// transformers' `DeepseekV{2,3}ForCausalLM`: `lm_head(norm(x))`.
    fn head_logits(&self, x: &Tensor) -> Result<Tensor> {
        let head = loaded_head(&self.head)?;
        head_logits(x, head, &self.embed, self.cfg.eps)
    }

    /// The MLA dimensions and the RoPE's attention factor.
    fn dump_sidecar(&self, _n: usize) -> Map<String, Value> {
        self.cfg.mla.sidecar(self.cfg.rope.attention_factor())
    }
}

#[cfg(test)]
#[path = "deepseek_tests.rs"]
mod tests;
