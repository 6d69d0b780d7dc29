//! DeepSeek V2/V3 GGUF files (`general.architecture` `deepseek2`, also V2-Lite, R1 and Kimi-K2) as
//! llama.cpp's converter writes them (`convert_hf_to_gguf.py`, `DeepseekV2Model`;
//! docs/reference.md §7.7.5 "GGUF"): the config.json they describe and their tensors under Hugging
//! Face names, so that [`super::deepseek::load`] runs on them as on safetensors.
//!
//! The converter stacks each layer's routed experts (`ffn_*_exps` [E, out, in]) and splits
//! `kv_b_proj` per head into `attn_k_b` (transposed, [H, r, d_nope]) and `attn_v_b` [H, d_v, r];
//! the names below take them apart and put them back ([`GgufValues::Expert`],
//! [`GgufValues::KvB`]; an older file's whole `attn_kv_b` is read as it is). What the GGUF does not
//! carry is taken as llama.cpp's loader and graph take it, each decision at its line below.

use anyhow::Result;
use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::Device;
use serde_json::{json, Value};

use super::gguf::{f32_decimal, GgufFile};
use super::named_tensors::{GgufValues, NamedTensors};
use crate::usage;

const ARCH: &str = "deepseek2";

/// The config.json of a `deepseek2` GGUF, and its tensors under Hugging Face names.
pub fn from_gguf(file: GgufFile, device: &Device) -> Result<(Value, NamedTensors)> {
    let key = |k: &str| format!("{ARCH}.{k}");
    let path = file.path().to_string();
    let bad = |k: &str, why: String| usage!("GGUF {path}: metadata {} {why}", key(k));
    let heads = file.req(&key("attention.head_count"))?;
    let layers = super::decoder_config::declared_layers(
        file.req(&key("block_count"))?,
        &format!("GGUF {path}: {}", key("block_count")),
    )?;
    let r = file.req(&key("attention.kv_lora_rank"))?;
    let d_rope = file.req(&key("rope.dimension_count"))?;
    // MLA-mode files (the converter's since the absorbed kernel): key/value_length are the
    // latent's r + d_R and r, the `_mla` keys the per-head sizes. Older files have no `_mla` keys
    // and give the per-head sizes in key/value_length.
    let (qk_head, d_v) = match file.meta_usize(&key("attention.key_length_mla"))? {
        Some(k) => {
            for (name, want) in [
                ("attention.key_length", r + d_rope),
                ("attention.value_length", r),
            ] {
                if let Some(got) = file.meta_usize(&key(name))?.filter(|&g| g != want) {
                    return Err(bad(
                        name,
                        format!("is {got}; with attention.key_length_mla it is the latent's size {want} (kv_lora_rank + rope.dimension_count)"),
                    ));
                }
            }
            (k, file.req(&key("attention.value_length_mla"))?)
        }
        None => (
            file.req(&key("attention.key_length"))?,
            file.req(&key("attention.value_length"))?,
        ),
    };
    if qk_head <= d_rope {
        return Err(bad(
            "attention.key_length_mla",
            format!("is {qk_head}; a head's Q/K size must exceed rope.dimension_count {d_rope}"),
        ));
    }
    // llama.cpp reads q_lora_rank except for V2-Lite (27 layers, a direct attn_q); a file with
    // attn_q_a needs the rank.
    let q_lora_rank = file.meta_usize(&key("attention.q_lora_rank"))?;
    if q_lora_rank.is_none() && file.has_tensor("blk.0.attn_q_a.weight") {
        return Err(usage!(
            "GGUF {path}: metadata {} is missing, but the file has attn_q_a tensors",
            key("attention.q_lora_rank")
        ));
    }
    // The router: llama.cpp's expert_gating_func, softmax (V2) when absent (its compatibility
    // rule for V2 files), sigmoid with exp_probs_b (V3).
    let v3 = match file.meta_usize(&key("expert_gating_func"))? {
        None | Some(1) => false,
        Some(2) => true,
        Some(g) => {
            return Err(bad(
                "expert_gating_func",
                format!("is {g}; DeepSeek routes by softmax (1) or sigmoid (2)"),
            ))
        }
    };
    let n_group = file.meta_usize(&key("expert_group_count"))?.unwrap_or(1);
    let vocab = file
        .tensor_dims("token_embd.weight")
        .map(|d| d[0])
        .ok_or_else(|| usage!("GGUF {path}: tensor token_embd.weight is missing"))?;
    let config = json!({
        "model_type": if v3 { "deepseek_v3" } else { "deepseek_v2" },
        "hidden_size": file.req(&key("embedding_length"))?,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "vocab_size": vocab,
        "max_position_embeddings": file.req(&key("context_length"))?,
        "rms_norm_eps": file.meta_decimal(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-6),
        "q_lora_rank": q_lora_rank,
        "kv_lora_rank": r,
        "qk_nope_head_dim": qk_head - d_rope,
        "qk_rope_head_dim": d_rope,
        "qk_head_dim": qk_head,
        "v_head_dim": d_v,
        // llama.cpp runs deepseek2 with NORM RoPE (adjacent pairs), which V3's interleaved
        // layout is too; V2's pairs stay in place.
        "rope_interleave": true,
        "intermediate_size": file.req(&key("feed_forward_length"))?,
        "moe_intermediate_size": file.req(&key("expert_feed_forward_length"))?,
        "n_routed_experts": file.req(&key("expert_count"))?,
        "num_experts_per_tok": file.req(&key("expert_used_count"))?,
        "n_shared_experts": file.meta_usize(&key("expert_shared_count"))?.unwrap_or(0),
        "first_k_dense_replace": file.meta_usize(&key("leading_dense_block_count"))?.unwrap_or(0),
        // llama.cpp scales the routed weights only when the key is there (scale 1 otherwise),
        // and normalises them only when expert_weights_norm says so.
        "routed_scaling_factor": file.meta_decimal(&key("expert_weights_scale"))?.unwrap_or(1.0),
        "norm_topk_prob": matches!(file.meta(&key("expert_weights_norm")), Some(GgufValue::Bool(true))),
        "n_group": n_group,
        "topk_group": file.meta_usize(&key("expert_group_used_count"))?.unwrap_or(1),
        // GGUF has no topk_method: groups limit V2's choice when there are several.
        "topk_method": if n_group > 1 { "group_limited_greedy" } else { "greedy" },
        "hidden_act": "silu",
        "tie_word_embeddings": !file.has_tensor("output.weight"),
        "rope_parameters": rope(&file, &key)?,
    });
    let kv_b_whole = file.has_tensor("blk.0.attn_kv_b.weight");
    Ok((
        config,
        NamedTensors::from_gguf(file, Box::new(move |hf| gguf_name(hf, kv_b_whole)), device),
    ))
}

/// `rope_parameters`: yarn from `rope.scaling.*` (β 32/1 when absent, llama.cpp's defaults), or
/// none. GGUF keeps only 0.1·mscale_all_dim (`rope.scaling.yarn_log_multiplier`), which gives τ's
/// m(f, mscale_all_dim)²; llama.cpp's graph puts no factor on cos and sin (its attn_factor undoes
/// ggml's yarn factor), which is transformers' m(f, mscale)/m(f, mscale_all_dim) when mscale =
/// mscale_all_dim: taken so here (V2, V2-Lite and V3 all have mscale = mscale_all_dim). Without
/// the multiplier, τ = 1/√p and the factor 1, as llama.cpp.
fn rope(file: &GgufFile, key: &dyn Fn(&str) -> String) -> Result<Value> {
    let mut p = super::family_gguf::yarn_rope_parameters(file, key, "DeepSeek")?;
    if p["rope_type"] != "yarn" {
        return Ok(p);
    }
    match file.meta_f64(&key("rope.scaling.yarn_log_multiplier"))? {
        // 0.1·μ stored in f32: its decimal (0.0707) over 0.1, rounded to f32 and read back as
        // the config's decimal (0.707), not the f32 quotient's 0.70699996.
        Some(y) if y > 0.0 => {
            let mu = f32_decimal((f32_decimal(y as f32) / 0.1) as f32);
            p["mscale"] = mu.into();
            p["mscale_all_dim"] = mu.into();
        }
        Some(y) if y < 0.0 || y.is_nan() => {
            return Err(usage!(
                "GGUF {}: metadata {} is {y}; it must be ≥ 0",
                file.path(),
                key("rope.scaling.yarn_log_multiplier")
            ))
        }
        _ => p["attention_factor"] = 1.0.into(),
    }
    Ok(p)
}

/// llama.cpp's name of a DeepSeek tensor (its tensor map for `MODEL_ARCH.DEEPSEEK2`) and how its
/// values relate to the checkpoint's; `kv_b_whole` for a file with the unsplit `attn_kv_b`.
fn gguf_name(hf: &str, kv_b_whole: bool) -> Option<(String, GgufValues)> {
    let same = |g: String| Some((g, GgufValues::Same));
    let (layer, rest) = match super::gguf::hf_tensor(hf)? {
        super::gguf::HfTensor::Outside(g) => return Some((g.into(), GgufValues::Same)),
        super::gguf::HfTensor::Block { layer, rest } => (layer, rest),
    };
    let blk = |g: &str| format!("blk.{layer}.{g}");
    if let Some(e) = rest.strip_prefix("mlp.experts.") {
        // mlp.experts.{e}.{gate,up,down}_proj.weight
        let (e, w) = e.split_once('.')?;
        let w = w.strip_suffix("_proj.weight")?;
        if !matches!(w, "gate" | "up" | "down") {
            return None;
        }
        return Some((
            blk(&format!("ffn_{w}_exps.weight")),
            GgufValues::Expert(e.parse().ok()?),
        ));
    }
    match rest {
        "self_attn.kv_b_proj.weight" if !kv_b_whole => {
            return Some((
                blk("attn_k_b.weight"),
                GgufValues::KvB {
                    v_b: blk("attn_v_b.weight"),
                },
            ))
        }
        "mlp.gate.e_score_correction_bias" => return same(blk("exp_probs_b.bias")),
        _ => {}
    }
    let (stem, suffix) = rest.rsplit_once('.')?;
    let g = match stem {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.q_a_proj" => "attn_q_a",
        "self_attn.q_a_layernorm" => "attn_q_a_norm",
        "self_attn.q_b_proj" => "attn_q_b",
        "self_attn.kv_a_proj_with_mqa" => "attn_kv_a_mqa",
        "self_attn.kv_a_layernorm" => "attn_kv_a_norm",
        "self_attn.kv_b_proj" => "attn_kv_b",
        "self_attn.o_proj" => "attn_output",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        "mlp.gate" => "ffn_gate_inp",
        "mlp.shared_experts.gate_proj" => "ffn_gate_shexp",
        "mlp.shared_experts.up_proj" => "ffn_up_shexp",
        "mlp.shared_experts.down_proj" => "ffn_down_shexp",
        _ => return None,
    };
    same(blk(&format!("{g}.{suffix}")))
}

#[cfg(test)]
#[path = "deepseek_gguf_tests.rs"]
mod tests;
