//! What the §7.7 families' GGUF readers share (each family's reader is its own file): the
//! attention sizes of `{arch}.*`, and yarn's `rope.scaling.*` keys as config.json's
//! `rope_parameters`.

use anyhow::Result;
use serde_json::{json, Value};

use candle_core::quantized::gguf_file::Value as GgufValue;

use super::gguf::GgufFile;
use crate::usage;

/// The attention sizes of `{arch}.*`: (hidden, heads, layers, head size), the head size being
/// `attention.key_length` (hidden/heads when absent); a `value_length` unlike it is a usage error
/// (`family` names the model whose K and V heads have one size).
pub(crate) fn attention_sizes(
    file: &GgufFile,
    arch: &str,
    family: &str,
) -> Result<(usize, usize, usize, usize)> {
    let key = |k: &str| format!("{arch}.{k}");
    let hidden = file.req(&key("embedding_length"))?;
    let heads = file.req(&key("attention.head_count"))?;
    let layers = super::decoder_config::declared_layers(
        file.req(&key("block_count"))?,
        &format!("GGUF {}: {}", file.path(), key("block_count")),
    )?;
    let head_dim = file
        .meta_usize(&key("attention.key_length"))?
        .unwrap_or(hidden / heads.max(1));
    if let Some(v) = file.meta_usize(&key("attention.value_length"))? {
        if v != head_dim {
            return Err(usage!(
                "GGUF {}: metadata {} is {v} but {} is {head_dim}; {family}'s K and V heads have one size",
                file.path(),
                key("attention.value_length"),
                key("attention.key_length")
            ));
        }
    }
    Ok((hidden, heads, layers, head_dim))
}

/// `rope_parameters` from `{arch}.rope.*` (`key` prefixes the architecture): the base θ
/// (llama.cpp's 10 000 when absent), and for `rope.scaling.type` "yarn" its factor, N₀ and β
/// (llama.cpp's defaults 32 and 1 when absent); absent or "none" is the default RoPE, another type
/// a usage error naming `family`. What GGUF keeps of a family's yarn beyond these (gpt-oss's
/// attention factor, DeepSeek's mscale) its reader adds.
pub(crate) fn yarn_rope_parameters(
    file: &GgufFile,
    key: &dyn Fn(&str) -> String,
    family: &str,
) -> Result<Value> {
    let theta = file
        .meta_decimal(&key("rope.freq_base"))?
        .unwrap_or(10_000.0);
    let type_key = key("rope.scaling.type");
    match file.meta(&type_key) {
        None => return Ok(json!({ "rope_theta": theta, "rope_type": "default" })),
        Some(GgufValue::String(s)) if s == "none" => {
            return Ok(json!({ "rope_theta": theta, "rope_type": "default" }))
        }
        Some(GgufValue::String(s)) if s == "yarn" => {}
        Some(other) => {
            return Err(usage!(
                "GGUF {}: metadata {type_key} is {other:?}; {family} reads yarn or none",
                file.path()
            ))
        }
    }
    let missing = |k: &str| {
        usage!(
            "GGUF {}: metadata {} is missing for yarn scaling",
            file.path(),
            key(k)
        )
    };
    Ok(json!({
        "rope_theta": theta,
        "rope_type": "yarn",
        "factor": file.meta_decimal(&key("rope.scaling.factor"))?.ok_or_else(|| missing("rope.scaling.factor"))?,
        "original_max_position_embeddings": file
            .meta_usize(&key("rope.scaling.original_context_length"))?
            .ok_or_else(|| missing("rope.scaling.original_context_length"))?,
        "beta_fast": file.meta_decimal(&key("rope.scaling.yarn_beta_fast"))?.unwrap_or(32.0),
        "beta_slow": file.meta_decimal(&key("rope.scaling.yarn_beta_slow"))?.unwrap_or(1.0),
    }))
}
