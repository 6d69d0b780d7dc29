//! DeepSeek-V2/V3's config.json, parsed and checked (docs/reference.md §7.7.5), and the MoE
//! routers it defines. Defaults are transformers' `DeepseekV2Config` / `DeepseekV3Config` ones.

use super::*;

/// A MoE layer's router.
#[derive(Debug, Clone, PartialEq)]
pub enum Router {
    /// V2: softmax scores; top-k over all experts (`greedy`), or within the `topk_group` groups
    /// of highest maximum score (`group_limited_greedy`). Weights: the scores, never normalised:
    /// transformers 5's V2 router ignores `norm_topk_prob` (DeepSeek's own V2 code normalises
    /// when it is true; the published V2 configs have it false).
    Softmax { group_limited: bool },
    /// V3: sigmoid scores; selection on score + `e_score_correction_bias` within the `topk_group`
    /// groups of highest top-2 sum; weights: the chosen scores, normalised if `norm_topk_prob`.
    Sigmoid { norm_topk_prob: bool },
}

/// What a DeepSeek-V2/V3 config.json says.
#[derive(Debug, Clone, PartialEq)]
pub struct DeepseekConfig {
    pub hidden: usize,
    pub layers: usize,
    pub vocab: usize,
    pub max_position_embeddings: usize,
    pub eps: f64,
    pub mla: MlaDims,
    /// RoPE over the d_R rope dims.
    pub rope: FamilyRope,
    pub attention_bias: bool,
    /// transformers' default (V2 and V3): false.
    pub tie_word_embeddings: bool,
    pub intermediate: usize,
    pub moe_intermediate: usize,
    pub experts: usize,
    pub experts_per_token: usize,
    pub shared_experts: usize,
    pub first_k_dense_replace: usize,
    pub routed_scaling_factor: f64,
    pub n_group: usize,
    pub topk_group: usize,
    pub router: Router,
}

impl DeepseekConfig {
    /// Parses and checks config.json (`model_type` deepseek_v2 or deepseek_v3); `what` names it.
    pub fn parse(v: &Value, what: &str) -> Result<Self> {
        let f = ConfigFields::new(v, format!("config {what}"));
        let v3 = match f.str_opt("model_type")? {
            Some("deepseek_v2") => false,
            Some("deepseek_v3") => true,
            other => {
                return Err(usage!(
                    "config {what}: model_type {other:?} is not deepseek_v2 or deepseek_v3"
                ))
            }
        };
        let mla = mla_dims(&f, v3)?;
        if let Some(act) = f.str_opt("hidden_act")?.filter(|a| *a != "silu") {
            return Err(usage!(
                "config {what}: field \"hidden_act\" is \"{act}\"; DeepSeek's MLPs are SwiGLU (silu)"
            ));
        }
        let router = if v3 {
            Router::Sigmoid {
                norm_topk_prob: f.bool_opt("norm_topk_prob")?.unwrap_or(true),
            }
        } else {
            match f.str_opt("topk_method")?.unwrap_or("greedy") {
                "greedy" => Router::Softmax { group_limited: false },
                "group_limited_greedy" => Router::Softmax { group_limited: true },
                other => {
                    return Err(usage!(
                        "config {what}: field \"topk_method\" is \"{other}\"; deepseek_v2 routes by greedy or group_limited_greedy"
                    ))
                }
            }
        };
        let cfg = Self {
            hidden: f.positive("hidden_size")?,
            layers: f.layers(None)?,
            vocab: f.positive("vocab_size")?,
            max_position_embeddings: f.usize_opt("max_position_embeddings")?.unwrap_or(4096),
            eps: f.f64_opt("rms_norm_eps")?.unwrap_or(1e-6),
            rope: FamilyRope::from_config(v, mla.d_rope, what)?,
            mla,
            attention_bias: f.bool_opt("attention_bias")?.unwrap_or(false),
            tie_word_embeddings: f.bool_opt("tie_word_embeddings")?.unwrap_or(false),
            intermediate: f.positive("intermediate_size")?,
            moe_intermediate: f.positive("moe_intermediate_size")?,
            experts: f.positive("n_routed_experts")?,
            experts_per_token: f.positive("num_experts_per_tok")?,
            shared_experts: f
                .usize_opt("n_shared_experts")?
                .unwrap_or(if v3 { 1 } else { 2 }),
            first_k_dense_replace: f.usize_opt("first_k_dense_replace")?.unwrap_or(if v3 {
                3
            } else {
                0
            }),
            routed_scaling_factor: f.f64_opt("routed_scaling_factor")?.unwrap_or(if v3 {
                2.5
            } else {
                1.0
            }),
            n_group: f.usize_opt("n_group")?.unwrap_or(if v3 { 8 } else { 1 }),
            topk_group: f.usize_opt("topk_group")?.unwrap_or(if v3 { 4 } else { 1 }),
            router,
        };
        cfg.check_groups(what)?;
        check_fp8_blocks(&f)?;
        Ok(cfg)
    }

    /// Experts split evenly into n_group groups, topk_group ≤ n_group, and enough experts in the
    /// chosen groups for top-k.
    fn check_groups(&self, what: &str) -> Result<()> {
        let (e, g, tg, k) = (
            self.experts,
            self.n_group,
            self.topk_group,
            self.experts_per_token,
        );
        if g == 0 || e % g != 0 || tg == 0 || tg > g || tg * (e / g) < k {
            return Err(usage!(
                "config {what}: n_routed_experts {e}, n_group {g}, topk_group {tg} and num_experts_per_tok {k} do not fit: the experts must split into n_group equal groups and the topk_group chosen groups must hold num_experts_per_tok experts"
            ));
        }
        Ok(())
    }

    /// τ = m(f, mscale_all_dim)²/√p_qk with yarn and a non-zero mscale_all_dim (transformers'
    /// `yarn_apply_mscale`), else 1/√p_qk.
    pub fn scale(&self) -> f64 {
        let base = 1.0 / (self.mla.qk_head_dim() as f64).sqrt();
        match &self.rope {
            FamilyRope::Yarn(y) if y.mscale_all_dim != 0.0 => {
                let m = yarn_mscale(y.factor, y.mscale_all_dim);
                base * m * m
            }
            _ => base,
        }
    }

    /// One token's chosen experts and weights from its router logits.
    pub fn route(&self, logits: &[f64], correction: Option<&[f64]>) -> Vec<(usize, f64)> {
        let group = self.experts / self.n_group;
        let chosen_groups = |group_scores: Vec<f64>| top_k(&group_scores, self.topk_group);
        let in_groups = |groups: &[usize], e: usize| groups.contains(&(e / group));
        let rsf = self.routed_scaling_factor;
        match self.router {
            Router::Softmax { group_limited } => {
                let top = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = logits.iter().map(|x| (x - top).exp()).collect();
                let sum: f64 = e.iter().sum();
                let mut scores: Vec<f64> = e.iter().map(|x| x / sum).collect();
                if group_limited {
                    let maxes = scores
                        .chunks(group)
                        .map(|g| g.iter().cloned().fold(f64::NEG_INFINITY, f64::max));
                    let groups = chosen_groups(maxes.collect());
                    // transformers masks the other groups' scores with 0.
                    (0..scores.len())
                        .filter(|&e| !in_groups(&groups, e))
                        .for_each(|e| scores[e] = 0.0);
                }
                top_k(&scores, self.experts_per_token)
                    .into_iter()
                    .map(|e| (e, scores[e] * rsf))
                    .collect()
            }
            Router::Sigmoid { norm_topk_prob } => {
                let scores: Vec<f64> = logits.iter().map(|x| 1.0 / (1.0 + (-x).exp())).collect();
                let bias = correction.expect("a sigmoid router has its correction bias");
                let mut choice: Vec<f64> = scores.iter().zip(bias).map(|(s, b)| s + b).collect();
                // A group's score: the sum of its two best (transformers' topk(2); a group of
                // one expert, which transformers refuses, scores that one).
                let sums = choice
                    .chunks(group)
                    .map(|g| top_k(g, 2).iter().map(|&i| g[i]).sum::<f64>());
                let groups = chosen_groups(sums.collect());
                (0..choice.len())
                    .filter(|&e| !in_groups(&groups, e))
                    .for_each(|e| choice[e] = f64::NEG_INFINITY);
                let idx = top_k(&choice, self.experts_per_token);
                let denom = if norm_topk_prob {
                    idx.iter().map(|&e| scores[e]).sum::<f64>() + 1e-20
                } else {
                    1.0
                };
                idx.into_iter()
                    .map(|e| (e, scores[e] / denom * rsf))
                    .collect()
            }
        }
    }
}

/// MLA's dimensions, checked: qk_head_dim (when given) = qk_nope_head_dim + qk_rope_head_dim,
/// an even d_R, non-zero ranks.
fn mla_dims(f: &ConfigFields, v3: bool) -> Result<MlaDims> {
    let what = &f.what;
    let (d_nope, d_rope) = (
        f.positive("qk_nope_head_dim")?,
        f.positive("qk_rope_head_dim")?,
    );
    if d_rope % 2 != 0 {
        return Err(usage!("{what}: field \"qk_rope_head_dim\" is {d_rope}; RoPE rotates pairs, so it must be even"));
    }
    if let Some(p) = f
        .usize_opt("qk_head_dim")?
        .filter(|&p| p != d_nope + d_rope)
    {
        return Err(usage!(
            "{what}: field \"qk_head_dim\" is {p}, but qk_nope_head_dim + qk_rope_head_dim is {}",
            d_nope + d_rope
        ));
    }
    let q_lora_rank = f.usize_opt("q_lora_rank")?;
    if q_lora_rank == Some(0) {
        return Err(usage!(
            "{what}: field \"q_lora_rank\" is 0; give a rank, or null for a direct q_proj"
        ));
    }
    let layout = match (v3, f.bool_opt("rope_interleave")?.unwrap_or(true)) {
        (false, _) => RopeLayout::Pairs,
        (true, true) => RopeLayout::Deinterleaved,
        (true, false) => RopeLayout::RotateHalf,
    };
    Ok(MlaDims {
        heads: f.positive("num_attention_heads")?,
        q_lora_rank,
        kv_lora_rank: f.positive("kv_lora_rank")?,
        d_nope,
        d_rope,
        d_v: f.positive("v_head_dim")?,
        layout,
    })
}

/// The FP8 checkpoints' `quantization_config`, when present, must use the 128×128 blocks the
/// loader dequantizes (`quantized_weights::FP8_BLOCK`).
fn check_fp8_blocks(f: &ConfigFields) -> Result<()> {
    let Some(q) = f.get("quantization_config") else {
        return Ok(());
    };
    let block = super::super::quantized_weights::FP8_BLOCK as u64;
    match q.get("weight_block_size") {
        None => Ok(()),
        Some(b) if b.as_array().is_some_and(|a| a.len() == 2 && a.iter().all(|x| x.as_u64() == Some(block))) => Ok(()),
        Some(b) => Err(usage!(
            "{}: field \"quantization_config.weight_block_size\" is {b}; the FP8 weights are read in [{block}, {block}] blocks",
            f.what
        )),
    }
}
