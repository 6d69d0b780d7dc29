//! Gemma 2 and Gemma 3 GGUF files (`general.architecture` `gemma2` / `gemma3`) as llama.cpp's
//! converter writes them (`convert_hf_to_gguf.py`, `Gemma2Model` / `Gemma3Model`;
//! docs/reference.md §7.7.1–7.7.2 "GGUF"): the config.json they describe and their tensors under
//! Hugging Face names, so that [`super::gemma::load`] runs on them as on safetensors.
//!
//! What the GGUF does not carry is taken as llama.cpp's loader (`src/llama-model.cpp`,
//! `LLM_ARCH_GEMMA2` / `LLM_ARCH_GEMMA3`) takes it, each decision at its line below.

use anyhow::Result;
use candle_core::quantized::gguf_file::Value as GgufValue;
use candle_core::Device;
use serde_json::{json, Value};

use super::gguf::{f32_decimal, GgufFile};
use super::named_tensors::{GgufValues, NamedTensors};
use crate::usage;

/// The config.json of a `gemma2` or `gemma3` GGUF, and its tensors under Hugging Face names.
pub fn from_gguf(file: GgufFile, device: &Device) -> Result<(Value, NamedTensors)> {
    let arch = file.architecture()?;
    let gemma3 = match arch.as_str() {
        "gemma2" => false,
        "gemma3" => true,
        other => return Err(usage!("GGUF {}: \"{other}\" is not a gemma", file.path())),
    };
    let key = |k: &str| format!("{arch}.{k}");
    let (hidden, heads, layers, head_dim) =
        super::family_gguf::attention_sizes(&file, &arch, "a gemma")?;
    // gemma rotates every dimension: a partial count is not a gemma this reads.
    if let Some(d) = file.meta_usize(&key("rope.dimension_count"))? {
        if d != head_dim {
            return Err(usage!(
                "GGUF {}: metadata {} is {d}, not the head size {head_dim}; gemma's RoPE is not partial",
                file.path(),
                key("rope.dimension_count")
            ));
        }
    }
    let vocab = file
        .tensor_dims("token_embd.weight")
        .map(|d| d[0])
        .ok_or_else(|| usage!("GGUF {}: tensor token_embd.weight is missing", file.path()))?;
    let scalar = query_pre_attn_scalar(&file, &arch, layers, hidden, heads, head_dim)?;
    // llama.cpp: gemma2's window defaults to 4096 when absent; gemma3's is required.
    let window = match (gemma3, file.meta_usize(&key("attention.sliding_window"))?) {
        (_, Some(0)) => {
            return Err(usage!(
                "GGUF {}: metadata {} is 0; a gemma's sliding layers need a window",
                file.path(),
                key("attention.sliding_window")
            ))
        }
        (_, Some(w)) => w,
        (false, None) => 4096,
        (true, None) => {
            return Err(usage!(
                "GGUF {}: metadata {} is missing; llama.cpp requires it of a gemma3",
                file.path(),
                key("attention.sliding_window")
            ))
        }
    };
    let layer_types = layer_types(&file, &arch, layers, if gemma3 { 6 } else { 2 })?;
    // llama.cpp's default base is 10000 when the key is absent (the converter always writes it).
    let theta = file
        .meta_decimal(&key("rope.freq_base"))?
        .unwrap_or(10_000.0);
    let softcap = |k: &str| -> Result<Option<f64>> {
        match file.meta_decimal(&key(k))? {
            Some(c) if !(c > 0.0 && c.is_finite()) => Err(usage!(
                "GGUF {}: metadata {} is {c}; a soft-cap must be positive",
                file.path(),
                key(k)
            )),
            c => Ok(c),
        }
    };
    let mut config = json!({
        "model_type": if gemma3 { "gemma3_text" } else { "gemma2" },
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": file.meta_usize(&key("attention.head_count_kv"))?.unwrap_or(heads),
        "head_dim": head_dim,
        "num_hidden_layers": layers,
        "intermediate_size": file.req(&key("feed_forward_length"))?,
        "rms_norm_eps": file.meta_decimal(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-6),
        "vocab_size": vocab,
        "max_position_embeddings": file.req(&key("context_length"))?,
        "query_pre_attn_scalar": scalar,
        "sliding_window": window,
        "layer_types": layer_types,
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": !file.has_tensor("output.weight"),
    });
    if gemma3 {
        // llama.cpp: the scaling keys apply to global layers only; local layers run θ_swa
        // (`rope.freq_base_swa`, 10000 when absent, as llama.cpp's loader fixes it) unscaled.
        let mut full = json!({ "rope_theta": theta, "rope_type": "default" });
        match file.meta(&key("rope.scaling.type")) {
            None => {}
            Some(GgufValue::String(s)) if s == "none" => {}
            Some(GgufValue::String(s)) if s == "linear" => {
                let factor_key = key("rope.scaling.factor");
                let f = file.meta_decimal(&factor_key)?.ok_or_else(|| {
                    usage!(
                        "GGUF {}: metadata {factor_key} is missing for linear scaling",
                        file.path()
                    )
                })?;
                full = json!({ "rope_theta": theta, "rope_type": "linear", "factor": f });
            }
            Some(other) => {
                return Err(usage!(
                    "GGUF {}: metadata {} is {other:?}; a gemma3 reads none or linear",
                    file.path(),
                    key("rope.scaling.type")
                ))
            }
        }
        let local = file
            .meta_decimal(&key("rope.freq_base_swa"))?
            .unwrap_or(10_000.0);
        config["rope_parameters"] = json!({
            "full_attention": full,
            "sliding_attention": { "rope_theta": local, "rope_type": "default" },
        });
        config["attn_logit_softcapping"] = Value::Null;
        // The final cap when the file states one, else none (Gemma3TextConfig's default).
        config["final_logit_softcapping"] = softcap("final_logit_softcapping")?.into();
    } else {
        config["rope_parameters"] = json!({ "rope_theta": theta, "rope_type": "default" });
        // llama.cpp's gemma2 caps its logits, at 50 when the key is absent.
        config["attn_logit_softcapping"] =
            softcap("attn_logit_softcapping")?.unwrap_or(50.0).into();
        // And its final logits, at 30 when absent (`f_final_logit_softcapping`'s default).
        config["final_logit_softcapping"] =
            softcap("final_logit_softcapping")?.unwrap_or(30.0).into();
    }
    Ok((
        config,
        NamedTensors::from_gguf(file, Box::new(gguf_name), device),
    ))
}

/// τ's `query_pre_attn_scalar`: GGUF has no such key. `{arch}.attention.scale` (gguf-py's
/// `add_attention_scale`) is read when present, as τ = 1/√s with s recovered as the integer whose
/// f32 τ it is (so both routes compute the same f64 τ). Otherwise llama.cpp's rule by model size
/// (its block count): 1/√(hidden/H) for the 27B models, 1/√head_dim for every other size it
/// knows. A block count llama.cpp does not know is refused: its fallback (1/√head_dim) is a guess.
fn query_pre_attn_scalar(
    file: &GgufFile,
    arch: &str,
    layers: usize,
    hidden: usize,
    heads: usize,
    head_dim: usize,
) -> Result<f64> {
    let scale_key = format!("{arch}.attention.scale");
    if let Some(tau) = file.meta_f64(&scale_key)? {
        if !(tau > 0.0 && tau.is_finite()) {
            return Err(usage!(
                "GGUF {}: metadata {scale_key} is {tau}; the attention scale must be positive",
                file.path()
            ));
        }
        let s = (1.0 / (tau * tau)).round();
        return Ok(if s >= 1.0 && (s.powf(-0.5) as f32) == tau as f32 {
            s
        } else {
            f32_decimal(tau as f32).powi(-2)
        });
    }
    query_pre_attn_rule(arch, layers, hidden, heads, head_dim).ok_or_else(|| {
        let (known, big) = sizes(arch);
        usage!(
            "GGUF {}: no metadata {scale_key}, and {layers} layers is none of the sizes llama.cpp knows ({} layers: τ = 1/√head_dim; {big}: τ = 1/√(hidden/heads)); the attention scale is unknown: add {scale_key}",
            file.path(),
            known
                .iter()
                .map(|l| l.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

/// The block counts llama.cpp's loader names a size, and the 27B one.
fn sizes(arch: &str) -> (&'static [usize], usize) {
    match arch {
        // gemma-2 2B, 9B; 27B.
        "gemma2" => (&[26, 42], 46),
        // gemma-3 270M, 1B, 4B, 12B; 27B.
        _ => (&[18, 26, 34, 48], 62),
    }
}

/// llama.cpp's `query_pre_attn_scalar` by size (`f_attention_scale`), None for a size it does not
/// know.
fn query_pre_attn_rule(
    arch: &str,
    layers: usize,
    hidden: usize,
    heads: usize,
    head_dim: usize,
) -> Option<f64> {
    let (known, big) = sizes(arch);
    if layers == big {
        Some((hidden / heads.max(1)) as f64)
    } else {
        known.contains(&layers).then_some(head_dim as f64)
    }
}

/// Each layer's type: `{arch}.attention.sliding_window_pattern` when present (an array of one
/// bool per layer, true for sliding, or a period P), else llama.cpp's fixed period (gemma2 2,
/// gemma3 6). With period P layer l slides iff l mod P < P − 1, as llama.cpp's `set_swa_pattern`
/// (transformers' (l + 1) mod P ≠ 0).
pub(super) fn layer_types(
    file: &GgufFile,
    arch: &str,
    layers: usize,
    period: usize,
) -> Result<Vec<Value>> {
    let k = format!("{arch}.attention.sliding_window_pattern");
    let name = |slides: bool| {
        Value::from(if slides {
            "sliding_attention"
        } else {
            "full_attention"
        })
    };
    if let Some(GgufValue::Array(a)) = file.meta(&k) {
        let flags: Option<Vec<bool>> = a
            .iter()
            .map(|v| match v {
                GgufValue::Bool(b) => Some(*b),
                _ => None,
            })
            .collect();
        return match flags {
            Some(f) if f.len() == layers => Ok(f.into_iter().map(name).collect()),
            _ => Err(usage!(
                "GGUF {}: metadata {k} must be {layers} bools (one per layer) or a period",
                file.path()
            )),
        };
    }
    let p = file.meta_usize(&k)?.unwrap_or(period);
    if p == 0 {
        return Err(usage!("GGUF {}: metadata {k} is 0", file.path()));
    }
    Ok((0..layers).map(|l| name(l % p < p - 1)).collect())
}

/// llama.cpp's name of a gemma tensor (its tensor map for `MODEL_ARCH.GEMMA2` / `GEMMA3`); every
/// norm is stored as 1 + w (the converter's `norm.weight` shift), undone here.
fn gguf_name(hf: &str) -> Option<(String, GgufValues)> {
    use super::gguf::HfTensor;
    let (g, shifted) = match super::gguf::hf_tensor(hf)? {
        HfTensor::Outside(g) => (g.to_string(), g == "output_norm.weight"),
        HfTensor::Block { layer, rest } => {
            let (stem, suffix) = rest.rsplit_once('.')?;
            let g = match stem {
                "input_layernorm" => "attn_norm",
                "self_attn.q_proj" => "attn_q",
                "self_attn.k_proj" => "attn_k",
                "self_attn.v_proj" => "attn_v",
                "self_attn.o_proj" => "attn_output",
                "self_attn.q_norm" => "attn_q_norm",
                "self_attn.k_norm" => "attn_k_norm",
                "post_attention_layernorm" => "post_attention_norm",
                "pre_feedforward_layernorm" => "ffn_norm",
                "post_feedforward_layernorm" => "post_ffw_norm",
                "mlp.gate_proj" => "ffn_gate",
                "mlp.up_proj" => "ffn_up",
                "mlp.down_proj" => "ffn_down",
                _ => return None,
            };
            (format!("blk.{layer}.{g}.{suffix}"), g.ends_with("norm"))
        }
    };
    let values = if shifted {
        GgufValues::Shifted(1.0)
    } else {
        GgufValues::Same
    };
    Some((g, values))
}

#[cfg(test)]
#[path = "gemma_gguf_tests.rs"]
mod tests;
