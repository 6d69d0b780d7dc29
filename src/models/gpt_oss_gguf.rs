//! gpt-oss GGUF files (`general.architecture` `gpt-oss`, llama.cpp's `LLM_ARCH_OPENAI_MOE`) as
//! llama.cpp's converter writes them (`convert_hf_to_gguf.py`, `GptOssModel`; docs/reference.md
//! §7.7.4 "GGUF"): the config.json they describe and their tensors under Hugging Face names, so
//! that [`super::gpt_oss::load`] runs on them as on safetensors.
//!
//! The converter splits the checkpoint's interleaved `gate_up_proj` [E, hidden, 2I] into
//! `ffn_gate_exps` and `ffn_up_exps` [E, I, hidden] (and the bias into two [E, I]) and stores
//! `down_proj` [E, I, hidden] as `ffn_down_exps` [E, hidden, I]; the names below put them back
//! ([`GgufValues::Interleaved`], [`GgufValues::Transposed`]). Its MXFP4 experts (ggml type 39,
//! what the hub's GGUFs hold) are decoded by [`GgufFile`] to the same f32 values, so the names
//! below serve both. What the GGUF does not carry is taken as llama.cpp's loader takes it, each decision
//! at its line below.

use anyhow::Result;
use candle_core::Device;
use serde_json::{json, Value};

use super::gemma_gguf::layer_types;
use super::gguf::GgufFile;
use super::named_tensors::{GgufValues, NamedTensors};
use crate::usage;

const ARCH: &str = "gpt-oss";

/// The config.json of a `gpt-oss` GGUF, and its tensors under Hugging Face names.
pub fn from_gguf(file: GgufFile, device: &Device) -> Result<(Value, NamedTensors)> {
    let key = |k: &str| format!("{ARCH}.{k}");
    let path = file.path().to_string();
    let (hidden, heads, layers, head_dim) =
        super::family_gguf::attention_sizes(&file, ARCH, "gpt-oss")?;
    let experts = file.req(&key("expert_count"))?;
    let used = file.req(&key("expert_used_count"))?;
    if used == 0 || used > experts {
        return Err(usage!(
            "GGUF {path}: metadata {} is {used}; it must be 1..={experts} ({})",
            key("expert_used_count"),
            key("expert_count")
        ));
    }
    // llama.cpp reads the experts' width from expert_feed_forward_length; the converter also
    // writes it as feed_forward_length (intermediate_size), the fallback.
    let intermediate = match file.meta_usize(&key("expert_feed_forward_length"))? {
        Some(i) => i,
        None => file.req(&key("feed_forward_length"))?,
    };
    // llama.cpp requires the window; 0 would be a sliding layer that sees nothing.
    let window = file.req(&key("attention.sliding_window"))?;
    if window == 0 {
        return Err(usage!(
            "GGUF {path}: metadata {} is 0; gpt-oss's sliding layers need a window",
            key("attention.sliding_window")
        ));
    }
    let vocab = file
        .tensor_dims("token_embd.weight")
        .map(|d| d[0])
        .ok_or_else(|| usage!("GGUF {path}: tensor token_embd.weight is missing"))?;
    let config = json!({
        "model_type": "gpt_oss",
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": file.meta_usize(&key("attention.head_count_kv"))?.unwrap_or(heads),
        "head_dim": head_dim,
        "num_hidden_layers": layers,
        "num_local_experts": experts,
        "num_experts_per_tok": used,
        "intermediate_size": intermediate,
        "rms_norm_eps": file.meta_decimal(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5),
        "vocab_size": vocab,
        "max_position_embeddings": file.req(&key("context_length"))?,
        "sliding_window": window,
        // llama.cpp: period 2 (the even layers slide) unless the pattern key says otherwise.
        "layer_types": layer_types(&file, ARCH, layers, 2)?,
        "attention_bias": file.has_tensor("blk.0.attn_q.bias"),
        // llama.cpp's gpt-oss graph fixes the clamp (7) and α (1.702) of its SwiGLU, as
        // transformers' defaults: GGUF carries neither.
        "swiglu_limit": 7.0,
        "swiglu_alpha": 1.702,
        "tie_word_embeddings": !file.has_tensor("output.weight"),
        "rope_parameters": rope(&file, &key)?,
    });
    Ok((
        config,
        NamedTensors::from_gguf(file, Box::new(gguf_name), device),
    ))
}

/// `rope_parameters` from the `rope.*` keys: yarn with its factor, N₀ and β (llama.cpp's defaults
/// 32 and 1 when absent), or none. GGUF has no `truncate`: every released gpt-oss config says
/// false (the correction dims are not rounded), which is taken here ([P≠C] ggml's yarn rounds
/// them, as transformers' default truncate true).
fn rope(file: &GgufFile, key: &dyn Fn(&str) -> String) -> Result<Value> {
    let mut p = super::family_gguf::yarn_rope_parameters(file, key, "gpt-oss")?;
    if p["rope_type"] == "yarn" {
        p["truncate"] = false.into();
        if let Some(a) = file.meta_decimal(&key("rope.scaling.yarn_attn_factor"))? {
            p["attention_factor"] = a.into();
        }
    }
    Ok(p)
}

/// llama.cpp's name of a gpt-oss tensor (its tensor map for `MODEL_ARCH.GPT_OSS`) and how its
/// values relate to the checkpoint's.
fn gguf_name(hf: &str) -> Option<(String, GgufValues)> {
    let same = |g: String| Some((g, GgufValues::Same));
    let (layer, rest) = match super::gguf::hf_tensor(hf)? {
        super::gguf::HfTensor::Outside(g) => return Some((g.into(), GgufValues::Same)),
        super::gguf::HfTensor::Block { layer, rest } => (layer, rest),
    };
    let blk = |g: &str| format!("blk.{layer}.{g}");
    let experts = |transpose: bool, suffix: &str| {
        Some((
            blk(&format!("ffn_gate_exps.{suffix}")),
            GgufValues::Interleaved {
                odd: blk(&format!("ffn_up_exps.{suffix}")),
                transpose,
            },
        ))
    };
    match rest {
        "self_attn.sinks" => return same(blk("attn_sinks.weight")),
        "mlp.experts.gate_up_proj" => return experts(true, "weight"),
        "mlp.experts.gate_up_proj_bias" => return experts(false, "bias"),
        "mlp.experts.down_proj" => {
            return Some((blk("ffn_down_exps.weight"), GgufValues::Transposed))
        }
        "mlp.experts.down_proj_bias" => return same(blk("ffn_down_exps.bias")),
        _ => {}
    }
    let (stem, suffix) = rest.rsplit_once('.')?;
    let g = match stem {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "post_attention_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "mlp.router" => "ffn_gate_inp",
        _ => return None,
    };
    same(blk(&format!("{g}.{suffix}")))
}

#[cfg(test)]
#[path = "gpt_oss_gguf_tests.rs"]
mod tests;
