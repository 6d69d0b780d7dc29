//! DeepSeek-V2 and DeepSeek-V3 (docs/reference.md §7.7.5): MLA attention (`mla`), yarn RoPE with
//! mscale (τ = m(f, mscale_all_dim)²/√p_qk), plain RMSNorms, `first_k_dense_replace` dense
//! SwiGLU layers, then MoE layers with shared experts: V2 a softmax router with greedy or
//! group-limited top-k, V3 a sigmoid router whose selection adds `e_score_correction_bias`, with
//! group top-k and normalised weights; both × `routed_scaling_factor`. FP8 weights with block
//! scales (V3's hub checkpoints) are dequantized on load.

use std::ops::Range;
use std::sync::Arc;

use anyhow::Result;
use candle_core::{DType, Tensor};
use serde_json::Value;

use super::continuation::PromptCache;
use super::family::{FamilyModel, FamilyShape, LayerDump};
use super::family_common::{
    attend_checked_with, continuation_layers, embed_ids, head_logits, load_output_head,
    merge_heads, whole_head, ConfigFields, ContinuationCall, LoadedLayers, RowsAttentionInputs,
};
use super::llama::{linear, rms_norm, AttentionHook, ExactAttention, Linear, OutputHead};
use super::mla::{load_linear, MlaDims, MlaWeights, RopeLayout};
use super::moe::{dispatch, host_rows, top_k, Routing};
use super::named_tensors::NamedTensors;
use super::rope::{yarn_mscale, FamilyRope};
use super::weights::Depth;
use crate::attention::latent::LayerLatent;
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
    embed: Tensor,
    layers: Vec<DeepseekLayer>,
    /// The final norm and the LM head: only when loaded whole.
    head: Option<OutputHead>,
}

/// The [`super::registry::Loader`] of deepseek_v2 and deepseek_v3.
pub fn load(
    config: &Value,
    weights: &mut NamedTensors,
    depth: Depth,
) -> Result<Box<dyn FamilyModel>> {
    let what = weights.what().to_string();
    let cfg = DeepseekConfig::parse(config, &what)?;
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
    /// One whole layer (transformers' `DeepseekV{2,3}DecoderLayer.forward`, eval), its attention
    /// through `hook` on the materialised Q, K, V (the MLA module's eager call).
    fn decoder_layer(
        &self,
        x: &Tensor,
        l: usize,
        rope_t: &(Tensor, Tensor),
        hook: &dyn AttentionHook,
    ) -> Result<Tensor> {
        let (q, k, v, latent) = self.attention_inputs(x, l, rope_t)?;
        // The latent view (what layer_dump writes as kv_latent and w_kv_b): a §8 cache on this
        // layer quantizes the latent row, the materialised K/V being what nobody caches.
        let (rows, w_kv_b) = latent.expect("MLA has a latent");
        let latent = Arc::new(LayerLatent::new(rows, w_kv_b)?);
        let o = attend_checked_with(
            hook,
            l,
            (&q, &k, &v),
            &self.attention_spec(l),
            Some(&latent),
        )?;
        self.finish(x, &o, l)
    }

    /// Layer `l`'s materialised Q, K, V of the rows X [m, hidden] at the positions of the RoPE
    /// tables, and their latent rows with W_kvb.
    fn attention_inputs(
        &self,
        x: &Tensor,
        l: usize,
        rope_t: &(Tensor, Tensor),
    ) -> Result<RowsAttentionInputs> {
        let lw = &self.layers[l];
        let h = rms_norm(x, &lw.input_norm, self.cfg.eps)?;
        let m = lw.attn.forward(&h, &self.cfg.mla, &rope_t.0, &rope_t.1)?;
        let w_kv_b = lw.attn.w_kv_b(&self.cfg.mla, h.dtype())?;
        Ok((m.q, m.k, m.v, Some((m.latent, w_kv_b))))
    }

    /// Layer `l`'s output rows from their input X [m, hidden] and attention O [H, m, p_v]:
    /// o_proj, the residual and the dense or MoE MLP.
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

impl FamilyModel for Deepseek {
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

    fn shape(&self) -> FamilyShape {
        let c = &self.cfg;
        FamilyShape {
            heads: c.mla.heads,
            kv_heads: c.mla.heads,
            head_dim: c.mla.qk_head_dim(),
            head_dim_v: c.mla.d_v,
            layers: c.layers,
            max_position_embeddings: c.max_position_embeddings,
            vocab_size: c.vocab,
        }
    }

    fn attention_spec(&self, _layer: usize) -> AttentionSpec {
        let p = self.cfg.mla.qk_head_dim();
        AttentionSpec::causal(p, None).with_scale(self.cfg.scale())
    }

    fn layer_dump(&self, ids: &[u32], dtype: DType) -> Result<LayerDump> {
        let last = self.layers.len() - 1;
        let (x, rope_t) = self.run_layers(ids, dtype, last, &ExactAttention)?;
        let lw = &self.layers[last];
        let h = rms_norm(&x, &lw.input_norm, self.cfg.eps)?;
        let m = lw.attn.forward(&h, &self.cfg.mla, &rope_t.0, &rope_t.1)?;
        Ok(LayerDump {
            q: m.q,
            k: m.k,
            v: m.v,
            spec: self.attention_spec(last),
            extra: vec![
                ("kv_latent".into(), m.latent),
                ("w_kv_b".into(), lw.attn.w_kv_b(&self.cfg.mla, dtype)?),
            ],
            sidecar: self.cfg.mla.sidecar(self.cfg.rope.attention_factor()),
        })
    }

    /// transformers' `DeepseekV{2,3}ForCausalLM.forward`: the layers, then `lm_head(norm(x))` on
    /// `rows`.
    fn forward_logits(
        &self,
        ids: &[u32],
        dtype: DType,
        hook: &dyn AttentionHook,
        rows: Range<usize>,
    ) -> Result<Tensor> {
        let loaded = self.layers.len();
        let head = whole_head(
            self.head.as_ref(),
            self.model_type(),
            loaded,
            &rows,
            ids.len(),
        )?;
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

    /// Each layer's hook is handed the whole window's latent: the exact run's prompt rows, then
    /// the continuation's.
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
            let (head, name) = (self.head.as_ref(), self.model_type());
            let call = ContinuationCall::new(head, name, layers, prompt, n, &rows)?;
            let x = call.rows_of(&embed_ids(&self.embed, ids, dtype)?)?;
            let (cos, sin) = self.cfg.rope.cos_sin(n, dtype, self.embed.device())?;
            let rope_t = (call.rows_of(&cos)?, call.rows_of(&sin)?);
            let x = continuation_layers(
                prompt,
                hook,
                x,
                layers,
                |l| self.attention_spec(l),
                |x, l| self.attention_inputs(x, l, &rope_t),
                |x, o, l| self.finish(x, o, l),
            )?;
            head_logits(&call.scored(&x)?, call.head, &self.embed, self.cfg.eps)
        })())
    }
}

#[cfg(test)]
#[path = "deepseek_tests.rs"]
mod tests;
