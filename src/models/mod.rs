//! The model room: decoder LLMs as Q/K/V sources (docs/reference.md §7.1) and as whole models (§10.1): Llama, Mistral, Qwen2 and Qwen3, from Hugging
//! Face safetensors or a GGUF file, one file per concern:
//! - `decoder_config`: config.json → [`DecoderConfig`] (families, head layout, RoPE parameters);
//! - `rope`: rotate-half RoPE with default, linear and llama3 inverse frequencies;
//! - `weights`: safetensors (single or only the needed shards) and transformers-style init;
//! - `gguf`: GGUF metadata and dequantized tensors, llama.cpp's q/k row order undone;
//! - `llama`: the forward, every layer's attention through one hook: the post-RoPE Q, K, V of
//!   layer L (the dump), or the whole model's logits;
//! - `continuation`: decode mode's forward of the continuation rows only, on the exact run's
//!   prompt rows of every layer;
//! - `family`: the §7.7 families' interface (layer L's dump with its attention spec, the forward);
//!   `registry` the one list of families (their `model_type`s, GGUF architectures and loaders);
//!   `named_tensors` the tensor reader every family reads (safetensors or a family's GGUF); `gemma`
//!   (gemma2, gemma3), `phi3`, `gpt_oss` and `deepseek` (with `deepseek_config` and `mla`)
//!   implement it, and `gemma_gguf`, `gpt_oss_gguf`, `deepseek_gguf` (phi3's in `phi3`) read
//!   each family's GGUF as llama.cpp's converter writes it; `family_common` holds what they
//!   share (`family_gguf` what their GGUF readers share), `moe` the experts' routing and dispatch, `quantized_weights` the MXFP4 and FP8
//!   block-scaled weights dequantized on load;
//! - `whole`: a decoder run whole for §10 ([`WholeDecoder`]), a Llama-style one or a family's;
//! - `tokens`: the BOS policy and the token windows.

pub mod continuation;
pub mod decoder_config;
pub mod deepseek;
pub mod deepseek_gguf;
pub mod family;
mod family_common;
mod family_gguf;
pub mod gemma;
pub mod gemma_gguf;
pub mod gguf;
pub(crate) mod gguf_table;
pub mod gpt_oss;
pub mod gpt_oss_gguf;
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
pub mod whole;

pub use continuation::{continuation_logits, PromptCache, PromptRecorder};
pub use decoder_config::{
    decoder_family, DecoderConfig, DecoderFamily, RopeConfig, RopeScaling, SUPPORTED_FAMILIES,
};
pub use gguf::{load_gguf, GgufFile};
pub use llama::{
    causal_attention, forward_logits, window_qkv, AttentionHook, DecoderWeights, ExactAttention,
};
pub use tokens::{bos_token, decoder_window, windows_available};
pub use weights::{initialize, load_safetensors, shards_needed, Depth};
pub use whole::{FamilyDecoder, LlamaDecoder, WholeDecoder};
