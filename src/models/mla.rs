//! Multi-head Latent Attention (docs/reference.md §7.7.5), DeepSeek-V2/V3's attention: a query
//! (direct or through a low-rank q_a/q_b), the latent [c; k_pe] of `kv_a_proj_with_mqa` with c
//! normed, RoPE on q_pe and the one shared k_pe, and per-head k_nope and V from c through
//! `kv_b_proj`. The dump holds the materialised view (Q_h = [q_nope; q_pe], K_h = [k_nope; k_pe],
//! V_h; H_kv = H), the latent and W_kvb for the absorbed view.

use anyhow::Result;
use candle_core::{DType, Tensor};
use serde_json::{json, Map, Value};

use super::blocks::{linear, rms_norm, split_heads, Linear};
use super::named_tensors::NamedTensors;
use super::quantized_weights::fp8_or_plain;
use super::rope::{self, deinterleave, interleave};
use crate::usage;

/// transformers builds `q_a_layernorm` and `kv_a_layernorm` with the RMSNorm's default ε, not the
/// config's `rms_norm_eps` (so does DeepSeek's own modeling code); §7.7.5 is silent.
const LATENT_NORM_EPS: f64 = 1e-6;

/// How the rope dims of q and k are laid out after RoPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// Adjacent pairs (2t, 2t+1) rotated in place (V2's complex RoPE, llama.cpp).
    Pairs,
    /// The pairs written out as [rotated evens; rotated odds] (V3's `rope_interleave`, default).
    Deinterleaved,
    /// Rotate-half on the dims as stored (V3 with `rope_interleave` false): pairs (t, t + d/2),
    /// the same pairing as `Deinterleaved`'s output, so the sidecar calls it `deinterleaved`
    /// (§7.7.5 names only the two layouts).
    RotateHalf,
}

impl RopeLayout {
    /// The sidecar's `rope_layout`: which dims pair up in the dumped q and k.
    pub fn label(self) -> &'static str {
        match self {
            RopeLayout::Pairs => "pairs",
            RopeLayout::Deinterleaved | RopeLayout::RotateHalf => "deinterleaved",
        }
    }

    /// RoPE on x [.., d_R] with rotate-half tables [n, d_R].
    fn rotate(self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        match self {
            RopeLayout::Pairs => interleave(&rope::apply(&deinterleave(x)?, cos, sin)?),
            RopeLayout::Deinterleaved => rope::apply(&deinterleave(x)?, cos, sin),
            RopeLayout::RotateHalf => rope::apply(x, cos, sin),
        }
    }
}

/// MLA's dimensions.
#[derive(Debug, Clone, PartialEq)]
pub struct MlaDims {
    pub heads: usize,
    /// None: q = W_q·x (V2-Lite); Some: q = W_qb·RMSNorm(W_qa·x).
    pub q_lora_rank: Option<usize>,
    /// r.
    pub kv_lora_rank: usize,
    pub d_nope: usize,
    /// d_R.
    pub d_rope: usize,
    pub d_v: usize,
    pub layout: RopeLayout,
}

impl MlaDims {
    /// p_qk = d_nope + d_R.
    pub fn qk_head_dim(&self) -> usize {
        self.d_nope + self.d_rope
    }

    /// The sidecar's `mla` object.
    pub fn sidecar(&self, rope_attention_factor: f64) -> Map<String, Value> {
        let mut m = Map::new();
        let mla = json!({
            "d_nope": self.d_nope,
            "d_rope": self.d_rope,
            "d_v": self.d_v,
            "kv_lora_rank": self.kv_lora_rank,
            "q_lora_rank": self.q_lora_rank,
            "latent_values_per_token": self.kv_lora_rank + self.d_rope,
            "materialised_values_per_token": self.heads * (self.qk_head_dim() + self.d_v),
            "rope_attention_factor": rope_attention_factor,
            "rope_layout": self.layout.label(),
        });
        m.insert("mla".into(), mla);
        m
    }
}

/// The query projection.
enum QueryProj {
    Direct(Linear),
    LowRank { a: Linear, norm: Tensor, b: Linear },
}

/// One layer's MLA weights (f32, FP8 dequantized).
pub struct MlaWeights {
    q: QueryProj,
    kv_a: Linear,
    kv_a_norm: Tensor,
    /// [H·(d_nope + d_v), r].
    kv_b: Linear,
}

/// Layer L's materialised Q [H, n, p_qk], K [H, n, p_qk], V [H, n, d_v] and latent
/// [n, r + d_R] (c, then the post-RoPE k_pe in the layout of K).
pub struct MlaOutputs {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub latent: Tensor,
}

/// A linear layer of the checkpoint (FP8 dequantized when stored so), its bias if `bias`.
pub fn load_linear(
    w: &NamedTensors,
    name: &str,
    out: usize,
    inp: usize,
    bias: bool,
) -> Result<Linear> {
    Ok(Linear {
        weight: fp8_or_plain(w, name, [out, inp])?.into(),
        bias: if bias {
            Some(w.get(&format!("{name}.bias"), &[out])?)
        } else {
            None
        },
    })
}

impl MlaWeights {
    /// Layer `l`'s MLA weights (`prefix` its `self_attn`), checking kv_b_proj against the ranks.
    pub fn load(
        w: &NamedTensors,
        prefix: &str,
        d: &MlaDims,
        hidden: usize,
        bias: bool,
    ) -> Result<Self> {
        let q_out = d.heads * d.qk_head_dim();
        let q = match d.q_lora_rank {
            None => QueryProj::Direct(load_linear(
                w,
                &format!("{prefix}.q_proj"),
                q_out,
                hidden,
                false,
            )?),
            Some(rq) => QueryProj::LowRank {
                a: load_linear(w, &format!("{prefix}.q_a_proj"), rq, hidden, bias)?,
                norm: w.get(&format!("{prefix}.q_a_layernorm.weight"), &[rq])?,
                b: load_linear(w, &format!("{prefix}.q_b_proj"), q_out, rq, false)?,
            },
        };
        let kv_b_name = format!("{prefix}.kv_b_proj");
        let want = [d.heads * (d.d_nope + d.d_v), d.kv_lora_rank];
        let got = w.raw(&format!("{kv_b_name}.weight"))?.dims().to_vec();
        if got != want {
            return Err(usage!(
                "weights {}: '{kv_b_name}.weight' is {got:?}, but num_attention_heads·(qk_nope_head_dim + v_head_dim) × kv_lora_rank is {want:?}; the MLA ranks of config.json do not fit the weights",
                w.what()
            ));
        }
        Ok(Self {
            q,
            kv_a: load_linear(
                w,
                &format!("{prefix}.kv_a_proj_with_mqa"),
                d.kv_lora_rank + d.d_rope,
                hidden,
                bias,
            )?,
            kv_a_norm: w.get(
                &format!("{prefix}.kv_a_layernorm.weight"),
                &[d.kv_lora_rank],
            )?,
            kv_b: load_linear(w, &kv_b_name, want[0], want[1], false)?,
        })
    }

    /// W_kvb per head, [H, d_nope + d_v, r], in `dtype`.
    pub fn w_kv_b(&self, d: &MlaDims, dtype: DType) -> Result<Tensor> {
        Ok(self
            .kv_b
            .weight
            .widen(dtype)?
            .reshape((d.heads, d.d_nope + d.d_v, d.kv_lora_rank))?)
    }

    /// The materialised Q, K, V and the latent from the normed rows X [n, hidden] and the RoPE
    /// tables [n, d_R] (attention factor included).
    pub fn forward(
        &self,
        x: &Tensor,
        d: &MlaDims,
        cos: &Tensor,
        sin: &Tensor,
    ) -> Result<MlaOutputs> {
        let n = x.dim(0)?;
        let q = match &self.q {
            QueryProj::Direct(l) => linear(x, l)?,
            QueryProj::LowRank { a, norm, b } => {
                linear(&rms_norm(&linear(x, a)?, norm, LATENT_NORM_EPS)?, b)?
            }
        };
        let q = split_heads(&q, d.heads, d.qk_head_dim())?;
        let q_pe = d
            .layout
            .rotate(&q.narrow(2, d.d_nope, d.d_rope)?, cos, sin)?;
        let q = Tensor::cat(&[&q.narrow(2, 0, d.d_nope)?, &q_pe], 2)?;
        let ckv = linear(x, &self.kv_a)?;
        let c = rms_norm(
            &ckv.narrow(1, 0, d.kv_lora_rank)?,
            &self.kv_a_norm,
            LATENT_NORM_EPS,
        )?;
        let k_pe = d.layout.rotate(
            &ckv.narrow(1, d.kv_lora_rank, d.d_rope)?.contiguous()?,
            cos,
            sin,
        )?;
        let kv = split_heads(&linear(&c, &self.kv_b)?, d.heads, d.d_nope + d.d_v)?;
        let k_pe_heads = k_pe.unsqueeze(0)?.broadcast_as((d.heads, n, d.d_rope))?;
        let k = Tensor::cat(&[&kv.narrow(2, 0, d.d_nope)?, &k_pe_heads.contiguous()?], 2)?;
        Ok(MlaOutputs {
            q,
            k,
            v: kv.narrow(2, d.d_nope, d.d_v)?.contiguous()?,
            latent: Tensor::cat(&[&c, &k_pe], 1)?,
        })
    }
}
