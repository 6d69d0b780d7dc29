//! A decoder LLM's `config.json` (Llama, Mistral, Qwen2, Qwen3 families; docs/reference.md §7.1
//! "Families", "Config fields", "RoPE"), parsed into one plain struct and validated, so that the
//! weights, the RoPE and the forward read checked numbers only.

use std::path::Path;

use anyhow::Result;
use serde_json::Value;

use crate::usage;

/// The decoder families of docs/reference.md §7.1, by `config.json` `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecoderFamily {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
}

/// The `model_type` values accepted, for error messages.
pub const SUPPORTED_FAMILIES: &str = "llama, mistral, qwen2, qwen3";

impl DecoderFamily {
    pub fn from_model_type(model_type: &str) -> Option<Self> {
        match model_type {
            "llama" => Some(Self::Llama),
            "mistral" => Some(Self::Mistral),
            "qwen2" => Some(Self::Qwen2),
            "qwen3" => Some(Self::Qwen3),
            _ => None,
        }
    }

    pub fn model_type(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Mistral => "mistral",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
        }
    }
}

/// The decoder family of a `config.json` text, or None when it is not one of ours (a BERT config,
/// another decoder, or not JSON): the caller routes `None` to the encoder path or to
/// [`DecoderConfig::from_json`]'s error, which names the type.
pub fn decoder_family(config_json_text: &str) -> Option<DecoderFamily> {
    let v: Value = serde_json::from_str(config_json_text).ok()?;
    DecoderFamily::from_model_type(v.get("model_type")?.as_str()?)
}

/// How the RoPE inverse frequencies are scaled (docs/reference.md §7.1 "RoPE"). Only the types whose
/// effect is a fixed change of inv_freq are supported; yarn's attention factor, dynamic NTK's
/// length dependence and longrope's per-dimension factors are refused rather than half-done.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    Default,
    /// inv_freq / factor.
    Linear {
        factor: f64,
    },
    /// Llama 3.1's frequency-dependent scaling (transformers' `_compute_llama3_parameters`).
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    /// inv_freq_t / divisor_t: llama.cpp's `rope_freqs.weight` tensor, in which its converter
    /// stores a llama3 scaling (GGUF metadata has no llama3 keys).
    Divisors(Vec<f64>),
}

/// The RoPE types accepted, for error messages.
pub const SUPPORTED_ROPE_TYPES: &str = "default, linear, llama3";

/// RoPE parameters: base θ and the scaling.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    pub theta: f64,
    pub scaling: RopeScaling,
}

/// Everything the decoder path needs from `config.json` (or from GGUF metadata), validated.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderConfig {
    pub family: DecoderFamily,
    pub hidden_size: usize,
    /// H: query heads.
    pub num_attention_heads: usize,
    /// H_kv: key/value heads (GQA when < H).
    pub num_key_value_heads: usize,
    /// p.
    pub head_dim: usize,
    pub num_hidden_layers: usize,
    pub intermediate_size: usize,
    pub rms_norm_eps: f64,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    pub initializer_range: f64,
    /// Biases on q/k/v (qwen2 always; llama/qwen3 with `attention_bias`).
    pub qkv_bias: bool,
    /// A bias on o_proj (llama/qwen3 `attention_bias`; never qwen2).
    pub o_bias: bool,
    /// Biases on the MLP projections (llama `mlp_bias`).
    pub mlp_bias: bool,
    /// qwen3's per-head RMSNorm of q and k before RoPE.
    pub qk_norm: bool,
    pub tie_word_embeddings: bool,
    pub pad_token_id: Option<usize>,
    pub rope: RopeConfig,
    /// Per layer: the sliding-window width W (key j is seen by query i iff i − W < j ≤ i), or
    /// None for plain causal attention. Mistral's `sliding_window` applies to every layer;
    /// qwen2/qwen3's only with `use_sliding_window` (layers ≥ `max_window_layers`) or as
    /// `layer_types` says. Transformers' `sliding_window_overlay`: kv_idx > q_idx − W.
    pub sliding_window: Vec<Option<usize>>,
}

/// The most layers a config may declare. The deepest published decoders have ~128; a count far
/// beyond is a corrupt file, refused before anything is sized by it (issue 57: a GGUF's
/// `block_count` of 2^32 − 1 aborted the allocator).
pub const MAX_LAYERS: usize = 4096;

/// `v`, the value of `what`, if an f32 run can hold it (issue 57): a finite value beyond f32's
/// range would overflow the forward and be found later as a non-finite result blamed on the device.
pub fn within_f32(v: f64, what: &str) -> Result<f64> {
    if v.abs() > f64::from(f32::MAX) {
        return Err(usage!(
            "{what} is {v}, beyond the range of f32 (±3.4e38); the config is corrupt"
        ));
    }
    Ok(v)
}

/// `n`, the layer count that `what` declares, if it is one a model can have (1 ..= [`MAX_LAYERS`]).
pub fn declared_layers(n: usize, what: &str) -> Result<usize> {
    if n == 0 || n > MAX_LAYERS {
        return Err(usage!(
            "{what} declares {n} layers; a model has 1 to {MAX_LAYERS}: the file is corrupt (download it again, or fix the field)"
        ));
    }
    Ok(n)
}

impl DecoderConfig {
    /// Layer `l`'s exact attention: causal, τ = 1/√p, and the layer's sliding window if any.
    pub fn attention_spec(&self, l: usize) -> crate::attention::spec::AttentionSpec {
        crate::attention::spec::AttentionSpec::causal(self.head_dim, self.sliding_window[l])
    }

    /// H / H_kv: query heads per K/V head.
    pub fn group_size(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// The K/V head that query head `h` reads: ⌊h·H_kv/H⌋ (docs/reference.md §7.1 "GQA"; HF `repeat_kv`
    /// repeats each K/V head over a contiguous group of H/H_kv query heads).
    pub fn kv_head(&self, h: usize) -> usize {
        crate::numerics::gqa::kv_head(h, self.num_attention_heads, self.num_key_value_heads)
    }

    /// Reads and validates a `config.json` file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| usage!("config {}: cannot read it ({e})", path.display()))?;
        Self::from_json(&text, &path.display().to_string())
    }

    /// Parses a `config.json` text; `file` names it in errors.
    pub fn from_json(text: &str, file: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| usage!("config {file}: not valid JSON ({e})"))?;
        let model_type = v.get("model_type").and_then(Value::as_str).ok_or_else(|| {
            usage!("config {file}: no \"model_type\"; a decoder config.json names its family ({SUPPORTED_FAMILIES})")
        })?;
        let family = DecoderFamily::from_model_type(model_type).ok_or_else(|| {
            usage!(
                "config {file}: model_type \"{model_type}\" is not a supported decoder family; supported: {SUPPORTED_FAMILIES}{}",
                if model_type == "bert" { " (BERT is an encoder: use the encoder path)" } else { "" }
            )
        })?;
        let f = Fields { v: &v, file };
        let hidden_size = f.usize_req("hidden_size")?;
        let heads = f.usize_req("num_attention_heads")?;
        let kv_heads = f.usize_opt("num_key_value_heads")?.unwrap_or(heads);
        // A JSON null head_dim means "derive it", as transformers' `getattr(...) or hidden // H`.
        let head_dim = match f.usize_opt("head_dim")? {
            Some(p) => p,
            None if heads > 0 => hidden_size / heads,
            None => 0,
        };
        let layers = declared_layers(
            f.usize_req("num_hidden_layers")?,
            &format!("config {file}: num_hidden_layers"),
        )?;
        if let Some(act) = v.get("hidden_act").and_then(Value::as_str) {
            if act != "silu" {
                return Err(usage!("config {file}: hidden_act \"{act}\" is not supported; these families use silu (SwiGLU MLP)"));
            }
        }
        let attention_bias = f.bool_opt("attention_bias")?.unwrap_or(false);
        let (qkv_bias, o_bias) = match family {
            // Qwen2 hard-codes bias=True on q/k/v and False on o_proj.
            DecoderFamily::Qwen2 => (true, false),
            DecoderFamily::Mistral => (false, false),
            DecoderFamily::Llama | DecoderFamily::Qwen3 => (attention_bias, attention_bias),
        };
        let mlp_bias = f.bool_opt("mlp_bias")?.unwrap_or(false) && family == DecoderFamily::Llama;
        let rope = rope_config(&v, file)?;
        let sliding_window = sliding_windows(&v, family, layers, file)?;
        let cfg = DecoderConfig {
            family,
            hidden_size,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            num_hidden_layers: layers,
            intermediate_size: f.usize_req("intermediate_size")?,
            rms_norm_eps: f.f64_opt("rms_norm_eps")?.unwrap_or(1e-6),
            vocab_size: f.usize_req("vocab_size")?,
            max_position_embeddings: f.usize_opt("max_position_embeddings")?.unwrap_or(2048),
            initializer_range: f.f64_opt("initializer_range")?.unwrap_or(0.02),
            qkv_bias,
            o_bias,
            mlp_bias,
            qk_norm: family == DecoderFamily::Qwen3,
            tie_word_embeddings: f.bool_opt("tie_word_embeddings")?.unwrap_or(false),
            pad_token_id: f.usize_opt("pad_token_id")?,
            rope,
            sliding_window,
        };
        cfg.validate(file)?;
        Ok(cfg)
    }

    /// Shape checks, each naming the field; shared by the config.json and GGUF routes.
    pub fn validate(&self, file: &str) -> Result<()> {
        let positive = [
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("num_hidden_layers", self.num_hidden_layers),
            ("intermediate_size", self.intermediate_size),
            ("vocab_size", self.vocab_size),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, x)| *x == 0) {
            return Err(usage!("config {file}: {name} must be positive"));
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(usage!(
                "config {file}: num_attention_heads {} is not divisible by num_key_value_heads {} (GQA groups must be equal)",
                self.num_attention_heads,
                self.num_key_value_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(usage!(
                "config {file}: head_dim {} is odd; rotate-half RoPE needs an even head dimension",
                self.head_dim
            ));
        }
        if !(self.rms_norm_eps >= 0.0 && self.rope.theta > 0.0) {
            return Err(usage!(
                "config {file}: rms_norm_eps must be ≥ 0 and rope_theta > 0"
            ));
        }
        Ok(())
    }
}

/// Typed access to config.json fields with errors that name the file and field.
struct Fields<'a> {
    v: &'a Value,
    file: &'a str,
}

impl Fields<'_> {
    fn get(&self, name: &str) -> Option<&Value> {
        self.v.get(name).filter(|x| !x.is_null())
    }
    fn usize_opt(&self, name: &str) -> Result<Option<usize>> {
        self.get(name)
            .map(|x| {
                x.as_u64().map(|u| u as usize).ok_or_else(|| {
                    usage!(
                        "config {}: field \"{name}\" must be a non-negative integer, found {x}",
                        self.file
                    )
                })
            })
            .transpose()
    }
    fn usize_req(&self, name: &str) -> Result<usize> {
        self.usize_opt(name)?.ok_or_else(|| {
            usage!(
                "config {}: field \"{name}\" is missing; a decoder config.json needs it",
                self.file
            )
        })
    }
    fn f64_opt(&self, name: &str) -> Result<Option<f64>> {
        self.get(name)
            .map(|x| {
                let v = x.as_f64().ok_or_else(|| {
                    usage!(
                        "config {}: field \"{name}\" must be a number, found {x}",
                        self.file
                    )
                })?;
                within_f32(v, &format!("config {}: field \"{name}\"", self.file))
            })
            .transpose()
    }
    fn bool_opt(&self, name: &str) -> Result<Option<bool>> {
        self.get(name)
            .map(|x| {
                x.as_bool().ok_or_else(|| {
                    usage!(
                        "config {}: field \"{name}\" must be true or false, found {x}",
                        self.file
                    )
                })
            })
            .transpose()
    }
}

/// θ and the scaling, from `rope_theta` + `rope_scaling` (transformers 4) or `rope_parameters`
/// (transformers 5, which holds θ and the scaling in one object).
pub(super) fn rope_config(v: &Value, file: &str) -> Result<RopeConfig> {
    let params = v.get("rope_parameters").filter(|x| x.is_object());
    let theta = v
        .get("rope_theta")
        .and_then(Value::as_f64)
        .or_else(|| {
            params
                .and_then(|p| p.get("rope_theta"))
                .and_then(Value::as_f64)
        })
        .unwrap_or(10000.0);
    // null means none; any other value that is not an object (e.g. "yes") is a malformed
    // config, not "no scaling".
    match v.get("rope_scaling") {
        None | Some(Value::Null) | Some(Value::Object(_)) => {}
        Some(other) => {
            return Err(usage!(
                "config {file}: rope_scaling is {other}, but it must be an object such as {{\"rope_type\": \"linear\", \"factor\": 2.0}}, or null for none"
            ))
        }
    }
    let scaling = v.get("rope_scaling").filter(|x| x.is_object()).or(params);
    let Some(s) = scaling else {
        return Ok(RopeConfig {
            theta,
            scaling: RopeScaling::Default,
        });
    };
    if let Some(prf) = s.get("partial_rotary_factor").and_then(Value::as_f64) {
        if prf != 1.0 {
            return Err(usage!("config {file}: partial_rotary_factor {prf} is not supported (RoPE on the whole head only)"));
        }
    }
    // "type" is the legacy spelling of "rope_type", as transformers still accepts.
    let rope_type = s
        .get("rope_type")
        .or_else(|| s.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let num = |name: &str| -> Result<f64> {
        s.get(name).and_then(Value::as_f64).ok_or_else(|| {
            usage!("config {file}: rope scaling \"{rope_type}\" needs the number \"{name}\"")
        })
    };
    let scaling = match rope_type {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear {
            factor: num("factor")?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            // transformers' standardize_rope_params falls back to max_position_embeddings.
            original_max_position_embeddings: num("original_max_position_embeddings").or_else(
                |_| {
                    v.get("max_position_embeddings")
                        .and_then(Value::as_f64)
                        .ok_or_else(|| usage!("config {file}: rope scaling \"llama3\" needs \"original_max_position_embeddings\""))
                },
            )?,
        },
        other => {
            return Err(usage!(
                "config {file}: rope scaling type \"{other}\" is not supported; supported: {SUPPORTED_ROPE_TYPES} (docs/reference.md §7.1)"
            ))
        }
    };
    if let RopeScaling::Linear { factor } | RopeScaling::Llama3 { factor, .. } = scaling {
        if factor <= 0.0 {
            return Err(usage!(
                "config {file}: rope scaling factor must be positive, found {factor}"
            ));
        }
    }
    if let RopeScaling::Llama3 {
        low_freq_factor,
        high_freq_factor,
        ..
    } = scaling
    {
        if high_freq_factor <= low_freq_factor {
            return Err(usage!("config {file}: llama3 rope scaling needs high_freq_factor > low_freq_factor, found {high_freq_factor} ≤ {low_freq_factor}"));
        }
    }
    Ok(RopeConfig { theta, scaling })
}

/// The per-layer sliding window (see [`DecoderConfig::sliding_window`]).
fn sliding_windows(
    v: &Value,
    family: DecoderFamily,
    layers: usize,
    file: &str,
) -> Result<Vec<Option<usize>>> {
    let window = v
        .get("sliding_window")
        .and_then(Value::as_u64)
        .map(|w| w as usize);
    let out = match family {
        DecoderFamily::Llama => vec![None; layers],
        DecoderFamily::Mistral => vec![window; layers],
        DecoderFamily::Qwen2 | DecoderFamily::Qwen3 => {
            let use_sw = v.get("use_sliding_window").and_then(Value::as_bool) == Some(true);
            let window = if use_sw { window } else { None };
            if let Some(types) = v.get("layer_types").and_then(Value::as_array) {
                if types.len() != layers {
                    return Err(usage!("config {file}: layer_types has {} entries but num_hidden_layers is {layers}", types.len()));
                }
                types
                    .iter()
                    .map(|t| match t.as_str() {
                        Some("full_attention") => Ok(None),
                        Some("sliding_attention") => Ok(window),
                        _ => Err(usage!("config {file}: layer_types entry {t} is not full_attention or sliding_attention")),
                    })
                    .collect::<Result<_>>()?
            } else {
                let first = v
                    .get("max_window_layers")
                    .and_then(Value::as_u64)
                    .unwrap_or(28) as usize;
                (0..layers)
                    .map(|l| if l >= first { window } else { None })
                    .collect()
            }
        }
    };
    if out.contains(&Some(0)) {
        return Err(usage!("config {file}: sliding_window must be positive"));
    }
    Ok(out)
}

#[cfg(test)]
#[path = "decoder_config_tests.rs"]
mod tests;
