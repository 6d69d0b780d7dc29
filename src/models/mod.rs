//! The model room: decoder LLMs as Q/K/V sources (docs/reference.md §7.1) and as whole models
//! (§10.1), one file per concern:
//! - `decoder`: the one [`Decoder`] interface every family implements (its shape, each layer's
//!   spec, and its layer split at the attention), with the forward written once as its provided
//!   methods (stopped at layer L, whole, continuation-only); `hook` the [`AttentionHook`] each
//!   layer's attention goes through; `continuation` the prompt rows a continuation-only forward
//!   reads; `blocks` the numerics every layer is built of (Linear, RMSNorm, heads, row chunks,
//!   the LM head);
//! - the families: `llama` (llama, mistral, qwen2, qwen3), `gemma` (gemma2, gemma3), `phi3`,
//!   `gpt_oss` and `deepseek` (with `deepseek_config` and `mla`), `moe` the experts' routing
//!   and dispatch; `registry` the one list of the §7.7 families (their `model_type`s, GGUF
//!   architectures and loaders);
//! - reading them: `decoder_config` (config.json → [`DecoderConfig`]), `weights`
//!   (safetensors and transformers-style init of the Llama-style path), `gguf` (GGUF metadata and
//!   tensors, llama.cpp's q/k row order undone), `named_tensors` (the tensor reader of the §7.7
//!   families, safetensors or a family's GGUF as `gemma_gguf`, `gpt_oss_gguf`, `deepseek_gguf`
//!   and `phi3` read it; `family_gguf` what they share), `family_common` (typed config fields),
//!   `quantized_weights` (MXFP4 and FP8 block-scaled weights dequantized on load);
//! - `rope`: RoPE tables (default, linear, llama3, yarn, longrope) and their application;
//! - `tokens`: the BOS policy and the token windows.

pub mod bert;
pub mod bert_qkv;
pub mod blocks;
pub mod continuation;
pub mod decoder;
pub mod decoder_config;
pub mod deepseek;
pub mod deepseek_gguf;
mod family_common;
mod family_gguf;
pub mod gemma;
pub mod gemma_gguf;
pub mod gguf;
pub(crate) mod gguf_table;
pub mod gpt_oss;
pub mod gpt_oss_gguf;
pub mod hook;
pub mod llama;
pub mod mla;
pub mod moe;
pub mod named_tensors;
pub mod phi3;
pub mod quantized_weights;
pub mod registry;
pub mod rope;
pub mod tokens;
pub mod weights;

pub use continuation::{PromptCache, PromptRecorder};
pub use decoder::{AttentionHook, Decoder, DecoderShape, ExactAttention, LayerDump};
pub use decoder_config::{
    decoder_family, DecoderConfig, DecoderFamily, RopeConfig, RopeScaling, SUPPORTED_FAMILIES,
};
pub use gguf::{load_gguf, GgufFile};
pub use llama::{causal_attention, DecoderWeights, Llama};
pub use tokens::{bos_token, decoder_window, windows_available};
pub use weights::{initialize, load_safetensors, shards_needed, Depth};
