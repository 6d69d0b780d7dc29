//! Phi-3, Phi-3.5 and Phi-4-mini (`phi3`) as a §7.7 family (docs/reference.md §7.7.3), step for
//! step as transformers' eager `modeling_phi3.py`: fused `qkv_proj` and `gate_up_proj`, plain
//! RMSNorms, a SwiGLU MLP, τ = 1/√p, `sliding_window` on every layer, partial rotary, and
//! longrope (short or long factors by the window's length n against N₀, the attention factor on
//! cos and sin).

use anyhow::Result;
use candle_core::{DType, Tensor};
use serde_json::{Map, Value};

use super::blocks::{
    attention_out, embed_ids, head_logits, linear, loaded_head, rms_norm, row_chunks, split_heads,
    Linear, OutputHead, Weight,
};
use super::decoder::{Decoder, DecoderShape, LayerInputs, Positions};
use super::family_common::{
    linear_rows, linear_weight, lm_head_weight, ConfigFields, LoadedLayers,
};
use super::gguf::{f32_decimal, GgufFile};
use super::named_tensors::{GgufValues, NamedTensors};
use super::rope;
use super::weights::Depth;
use crate::attention::spec::AttentionSpec;
use crate::usage;

/// Longrope's two factor sets and where they switch.
#[derive(Debug, Clone)]
struct LongRope {
    short: Vec<f64>,
    long: Vec<f64>,
    /// N₀ = original_max_position_embeddings: n > N₀ reads the long factors.
    n0: usize,
    /// a, on cos and sin.
    attention_factor: f64,
}

/// Phi-3's RoPE: θ, the rotary dim d ≤ p, and longrope if configured.
#[derive(Debug, Clone)]
struct Phi3Rope {
    theta: f64,
    rotary_dim: usize,
    longrope: Option<LongRope>,
}

impl Phi3Rope {
    /// The inverse frequencies, the attention factor and, for longrope, which factors (`short` or
    /// `long`) a window of n tokens reads (transformers chooses by the forward's own length).
    fn at(&self, n: usize) -> (Vec<f64>, f64, Option<&'static str>) {
        match &self.longrope {
            None => (
                rope::default_inv_freq(self.theta, self.rotary_dim),
                1.0,
                None,
            ),
            Some(lr) => {
                let (factors, which) = if n > lr.n0 {
                    (&lr.long, "long")
                } else {
                    (&lr.short, "short")
                };
                let inv = rope::longrope_inv_freq(self.theta, self.rotary_dim, factors);
                (inv, lr.attention_factor, Some(which))
            }
        }
    }
}

/// A phi3 config.json, validated.
#[derive(Debug, Clone)]
struct Phi3Config {
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    layers: usize,
    intermediate: usize,
    eps: f64,
    vocab: usize,
    max_positions: usize,
    /// W on every layer.
    window: Option<usize>,
    rope: Phi3Rope,
    /// `tie_word_embeddings` (Phi3Config's default: false).
    tied: bool,
}

impl Phi3Config {
    fn from_json(v: &Value) -> Result<Self> {
        let f = ConfigFields::new(v, "config.json (phi3)");
        if let Some(act) = f.str_opt("hidden_act")? {
            if act != "silu" {
                return Err(usage!(
                    "{}: field \"hidden_act\" is \"{act}\"; phi3's MLP is silu (SwiGLU)",
                    f.what
                ));
            }
        }
        let hidden = f.usize_req("hidden_size")?;
        let heads = f.usize_req("num_attention_heads")?;
        let kv_heads = f.usize_or("num_key_value_heads", heads)?;
        let head_dim = f.usize_or("head_dim", hidden / heads)?;
        if !heads.is_multiple_of(kv_heads) {
            return Err(usage!(
                "{}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}",
                f.what
            ));
        }
        let max_positions = f.usize_or("max_position_embeddings", 4096)?;
        Ok(Self {
            hidden,
            heads,
            kv_heads,
            head_dim,
            layers: f.layers(None)?,
            intermediate: f.usize_req("intermediate_size")?,
            eps: f.f64_opt("rms_norm_eps")?.unwrap_or(1e-5),
            vocab: f.usize_req("vocab_size")?,
            max_positions,
            window: f.sliding_window()?,
            rope: phi3_rope(&f, head_dim, max_positions)?,
            tied: f.bool_opt("tie_word_embeddings")?.unwrap_or(false),
        })
    }

    fn spec(&self) -> AttentionSpec {
        AttentionSpec::causal(self.head_dim, self.window)
    }
}

/// θ, the partial rotary factor and the scaling, from transformers 5's `rope_parameters` first,
/// then the legacy top-level keys and `rope_scaling` (whose `su` and `yarn` transformers renames
/// to `longrope` for phi3).
fn phi3_rope(f: &ConfigFields, p: usize, max_positions: usize) -> Result<Phi3Rope> {
    let params = f.get("rope_parameters").filter(|x| x.is_object());
    let scaling = f.get("rope_scaling").filter(|x| x.is_object()).or(params);
    let field = |k: &str| -> Result<Option<f64>> {
        match params.and_then(|s| s.get(k)).filter(|x| !x.is_null()) {
            Some(x) => x.as_f64().map(Some).ok_or_else(|| {
                usage!(
                    "{}: field \"rope_parameters\".\"{k}\" must be a number, found {x}",
                    f.what
                )
            }),
            None => f.f64_opt(k),
        }
    };
    let theta = field("rope_theta")?.unwrap_or(10_000.0);
    let prf = field("partial_rotary_factor")?.unwrap_or(1.0);
    let rotary_dim = (p as f64 * prf).floor() as usize;
    if !(theta > 0.0 && prf > 0.0 && prf <= 1.0) || rotary_dim == 0 || !rotary_dim.is_multiple_of(2)
    {
        return Err(usage!(
            "{}: rope_theta {theta} must be positive and partial_rotary_factor {prf} in (0, 1] with an even rotary dim ⌊head_dim·factor⌋ = {rotary_dim}",
            f.what
        ));
    }
    let rope_type = scaling
        .and_then(|s| s.get("rope_type").or(s.get("type")))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let longrope = match rope_type {
        "default" => None,
        "longrope" | "su" | "yarn" => Some(longrope(
            f,
            scaling.expect("a typed scaling"),
            field,
            rotary_dim,
            max_positions,
        )?),
        other => {
            return Err(usage!(
                "{}: rope type \"{other}\" is not supported for phi3; supported: default, longrope",
                f.what
            ))
        }
    };
    Ok(Phi3Rope {
        theta,
        rotary_dim,
        longrope,
    })
}

/// transformers' `_compute_longrope_parameters`: with N₀ = original_max_position_embeddings,
/// f = max_position_embeddings/N₀ and a = attention_factor, else √(1 + ln f/ln N₀) (1 when
/// f ≤ 1); without N₀, N₀ = max_position_embeddings and f the scaling's `factor`.
fn longrope(
    f: &ConfigFields,
    s: &Value,
    field: impl Fn(&str) -> Result<Option<f64>>,
    rotary_dim: usize,
    max_positions: usize,
) -> Result<LongRope> {
    let factors = |k: &str| -> Result<Vec<f64>> {
        let v: Option<Vec<f64>> = s
            .get(k)
            .and_then(Value::as_array)
            .and_then(|a| a.iter().map(Value::as_f64).collect());
        match v {
            Some(v) if v.len() == rotary_dim / 2 && v.iter().all(|e| e.is_finite() && *e > 0.0) => Ok(v),
            _ => Err(usage!(
                "{}: longrope needs \"{k}\": {} positive numbers (half the rotary dim {rotary_dim})",
                f.what,
                rotary_dim / 2
            )),
        }
    };
    let (short, long) = (factors("short_factor")?, factors("long_factor")?);
    let n0 = s
        .get("original_max_position_embeddings")
        .and_then(Value::as_f64)
        .or(field("original_max_position_embeddings")?);
    let (n0, factor) = match n0 {
        Some(n0) if n0 >= 1.0 => (n0, max_positions as f64 / n0),
        Some(n0) => {
            return Err(usage!(
                "{}: original_max_position_embeddings {n0} must be at least 1",
                f.what
            ))
        }
        None => {
            let factor = s
                .get("factor")
                .and_then(Value::as_f64)
                .ok_or_else(|| f.missing("original_max_position_embeddings"))?;
            (max_positions as f64, factor)
        }
    };
    let attention_factor = match s.get("attention_factor").and_then(Value::as_f64) {
        Some(a) => a,
        None if factor <= 1.0 => 1.0,
        None => (1.0 + factor.ln() / n0.ln()).sqrt(),
    };
    Ok(LongRope {
        short,
        long,
        n0: n0 as usize,
        attention_factor,
    })
}

struct Phi3Layer {
    input_norm: Tensor,
    q: Linear,
    k: Linear,
    v: Linear,
    rest: Option<Phi3Rest>,
}

struct Phi3Rest {
    o: Linear,
    post_norm: Tensor,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// A phi3 model loaded through layer L, or whole (with its final norm and LM head).
pub struct Phi3 {
    cfg: Phi3Config,
    embed: Weight,
    layers: Vec<Phi3Layer>,
    head: Option<OutputHead>,
}

/// The family loader for `phi3`.
pub fn load(config: &Value, weights: &mut NamedTensors, depth: Depth) -> Result<Box<dyn Decoder>> {
    let cfg = Phi3Config::from_json(config)?;
    let loaded = LoadedLayers::of(depth, cfg.layers)?;
    let embed = weights.weight("model.embed_tokens.weight", &[cfg.vocab, cfg.hidden])?;
    let layers = (0..loaded.count)
        .map(|l| load_layer(weights, &cfg, &format!("model.layers.{l}"), loaded.full(l)))
        .collect::<Result<_>>()?;
    let head = loaded
        .whole
        .then(|| -> Result<OutputHead> {
            Ok(OutputHead {
                norm: weights.get("model.norm.weight", &[cfg.hidden])?,
                lm_head: lm_head_weight(
                    weights,
                    "lm_head.weight",
                    cfg.tied,
                    cfg.vocab,
                    cfg.hidden,
                )?,
            })
        })
        .transpose()?;
    Ok(Box::new(Phi3 {
        cfg,
        embed,
        layers,
        head,
    }))
}

/// The fused projections split by rows: qkv_proj = [q (H·p); k (H_kv·p); v (H_kv·p)],
/// gate_up_proj = [gate (I); up (I)].
fn load_layer(w: &NamedTensors, cfg: &Phi3Config, pre: &str, full: bool) -> Result<Phi3Layer> {
    let (hid, inter) = (cfg.hidden, cfg.intermediate);
    let (qd, kvd) = (cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim);
    let a = format!("{pre}.self_attn");
    let qkv = w.weight(&format!("{a}.qkv_proj.weight"), &[qd + 2 * kvd, hid])?;
    let rest = full
        .then(|| -> Result<Phi3Rest> {
            let m = format!("{pre}.mlp");
            let gate_up = w.weight(&format!("{m}.gate_up_proj.weight"), &[2 * inter, hid])?;
            Ok(Phi3Rest {
                o: linear_weight(w, &format!("{a}.o_proj.weight"), hid, qd)?,
                post_norm: w.get(&format!("{pre}.post_attention_layernorm.weight"), &[hid])?,
                gate: linear_rows(&gate_up, 0, inter)?,
                up: linear_rows(&gate_up, inter, inter)?,
                down: linear_weight(w, &format!("{m}.down_proj.weight"), hid, inter)?,
            })
        })
        .transpose()?;
    Ok(Phi3Layer {
        input_norm: w.get(&format!("{pre}.input_layernorm.weight"), &[hid])?,
        q: linear_rows(&qkv, 0, qd)?,
        k: linear_rows(&qkv, qd, kvd)?,
        v: linear_rows(&qkv, qd + kvd, kvd)?,
        rest,
    })
}

impl Decoder for Phi3 {
    fn model_type(&self) -> &'static str {
        "phi3"
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

    fn attention_spec(&self, _layer: usize) -> AttentionSpec {
        self.cfg.spec()
    }

    fn loaded_layers(&self) -> usize {
        self.layers.len()
    }

    fn has_head(&self) -> bool {
        self.head.is_some()
    }

    /// Longrope's factors are chosen by the whole window's n (also in a continuation-only
    /// forward, whose rows are the window's last).
    fn embed(&self, ids: &[u32], dtype: DType) -> Result<(Tensor, Positions)> {
        let x = embed_ids(&self.embed, ids, dtype)?;
        let (inv, a, _) = self.cfg.rope.at(ids.len());
        let rope = rope::cos_sin_of(&inv, ids.len(), a, dtype, self.embed.device())?;
        Ok((x, Positions(vec![rope])))
    }

    /// Post-RoPE Q [H, n, p], K, V [H_kv, n, p] of layer `l` (partial rotary).
    fn attention_inputs(&self, x: &Tensor, l: usize, pos: &Positions) -> Result<LayerInputs> {
        let (cfg, lw) = (&self.cfg, &self.layers[l]);
        let (cos, sin) = pos.single();
        let h = rms_norm(x, &lw.input_norm, cfg.eps)?;
        let q = split_heads(&linear(&h, &lw.q)?, cfg.heads, cfg.head_dim)?;
        let k = split_heads(&linear(&h, &lw.k)?, cfg.kv_heads, cfg.head_dim)?;
        let v = split_heads(&linear(&h, &lw.v)?, cfg.kv_heads, cfg.head_dim)?;
        Ok(LayerInputs::qkv((
            rope::apply_partial(&q, cos, sin)?,
            rope::apply_partial(&k, cos, sin)?,
            v,
        )))
    }

    /// o_proj, the residual and the MLP.
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
        let x = (x + attention_out(o, &rest.o)?)?;
        let outs = row_chunks(x.dim(0)?, x.device(), |s, rows| {
            let xs = x.narrow(0, s, rows)?;
            let h = rms_norm(&xs, &rest.post_norm, cfg.eps)?;
            let act = (linear(&h, &gate)?.silu()? * linear(&h, &up)?)?;
            Ok((xs + linear(&act, &down)?)?)
        })?;
        Ok(Tensor::cat(&outs, 0)?)
    }

    /// transformers' `Phi3ForCausalLM` head: the final RMSNorm, then the LM head (no cap).
    fn head_logits(&self, x: &Tensor) -> Result<Tensor> {
        let head = loaded_head(&self.head)?;
        head_logits(x, head, &self.embed, self.cfg.eps)
    }

    /// Which longrope factors the window's n chose.
    fn dump_sidecar(&self, n: usize) -> Map<String, Value> {
        let mut sidecar = Map::new();
        if let (_, _, Some(which)) = self.cfg.rope.at(n) {
            sidecar.insert("rope_factors".into(), Value::String(which.into()));
        }
        sidecar
    }
}

/// A Phi-3 GGUF as llama.cpp's converter writes it (docs/reference.md §7.7.3 "GGUF"): the
/// config.json it describes, from the `phi3.*` metadata and the rope factor tensors, and its
/// tensors under Hugging Face names. The loader then runs as on safetensors.
pub fn from_gguf(
    mut file: GgufFile,
    device: &candle_core::Device,
) -> Result<(Value, NamedTensors)> {
    let key = |k: &str| format!("phi3.{k}");
    let hidden = file.req(&key("embedding_length"))?;
    let heads = file.req(&key("attention.head_count"))?;
    let head_dim = hidden / heads.max(1);
    let rope_dims = file
        .meta_usize(&key("rope.dimension_count"))?
        .unwrap_or(head_dim);
    let vocab = file
        .tensor_dims("token_embd.weight")
        .map(|d| d[0])
        .ok_or_else(|| usage!("GGUF {}: tensor token_embd.weight is missing", file.path()))?;
    let mut rope = serde_json::json!({
        "rope_theta": file.meta_decimal(&key("rope.freq_base"))?.unwrap_or(10_000.0),
        "partial_rotary_factor": rope_dims as f64 / head_dim as f64,
        "rope_type": "default",
    });
    if file.has_tensor("rope_factors_long.weight") {
        let factors = |file: &mut GgufFile, name: &str| -> Result<Vec<f64>> {
            // Stored as f32: the config's decimals recovered (`f32_decimal`).
            let t = file.dequantized(name)?.flatten_all()?;
            Ok(t.to_vec1::<f32>()?.into_iter().map(f32_decimal).collect())
        };
        rope["rope_type"] = "longrope".into();
        rope["long_factor"] = factors(&mut file, "rope_factors_long.weight")?.into();
        rope["short_factor"] = factors(&mut file, "rope_factors_short.weight")?.into();
        rope["original_max_position_embeddings"] = file
            .req(&key("rope.scaling.original_context_length"))?
            .into();
        // The converter stores the longrope attention factor √(1 + ln f/ln N₀) in f32; the
        // formula's f64 value is used when the stored one is that value rounded (so the GGUF and
        // safetensors routes give the same bits), the stored one otherwise (a custom factor).
        if let Some(a) = file.meta_f64(&key("rope.scaling.attn_factor"))? {
            let n0 = rope["original_max_position_embeddings"]
                .as_f64()
                .unwrap_or(1.0);
            let f = file.req(&key("context_length"))? as f64 / n0;
            let formula = if f > 1.0 {
                (1.0 + f.ln() / n0.ln()).sqrt()
            } else {
                1.0
            };
            if (a - formula).abs() > 1e-6 * formula {
                rope["attention_factor"] = a.into();
            }
        }
    }
    let config = serde_json::json!({
        "model_type": "phi3",
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": file.meta_usize(&key("attention.head_count_kv"))?.unwrap_or(heads),
        "num_hidden_layers": file.req(&key("block_count"))?,
        "intermediate_size": file.req(&key("feed_forward_length"))?,
        "rms_norm_eps": file.meta_decimal(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5),
        "vocab_size": vocab,
        "max_position_embeddings": file.req(&key("context_length"))?,
        // The converter writes 0 for "no window" (its mark of Phi-4).
        "sliding_window": file.meta_usize(&key("attention.sliding_window"))?.filter(|&w| w > 0),
        "tie_word_embeddings": !file.has_tensor("output.weight"),
        "rope_parameters": rope,
    });
    Ok((
        config,
        NamedTensors::from_gguf(file, Box::new(gguf_name), device),
    ))
}

/// llama.cpp's name of a phi3 tensor (its tensor map for `MODEL_ARCH.PHI3`).
fn gguf_name(hf: &str) -> Option<(String, GgufValues)> {
    let same = |g: String| Some((g, GgufValues::Same));
    let (layer, rest) = match super::gguf::hf_tensor(hf)? {
        super::gguf::HfTensor::Outside(g) => return Some((g.into(), GgufValues::Same)),
        super::gguf::HfTensor::Block { layer, rest } => (layer, rest),
    };
    let (stem, suffix) = rest.rsplit_once('.')?;
    let g = match stem {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.qkv_proj" => "attn_qkv",
        "self_attn.o_proj" => "attn_output",
        "mlp.gate_up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    same(format!("blk.{layer}.{g}.{suffix}"))
}

#[cfg(test)]
#[path = "phi3_tests.rs"]
mod tests;
