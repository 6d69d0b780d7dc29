//! The §9.2 methods as [`Method`]s: eight static-set methods ([`StaticDecode`] over
//! [`Static`]) and two per-query ones ([`QuestDec`], [`TopkDec`]). Each returns Ô_F (the n_f
//! continuation rows) with its support: the mean |S_t| over F, the log-normalisers (for `mass`)
//! and `kv_union`, the prompt keys its K/V head holds for the group's query heads (§9.1: the
//! union of the group's sets; per query for the per-query methods, averaged over F).
//!
//! Cost (leading multiply-adds, §2.11): 2p per visited (continuation row, key) pair plus what the
//! selection reads — SnapKV-scored methods w·n_p·p, `h2o_dec` the prompt's exact rows
//! n_p(n_p+1)/2·p, `tova` one row n_p·p per head, `topk_dec` n_f·n_p·p, `quest_dec` 2p per
//! (query, page), `evict_oracle` the continuation's exact rows.

use anyhow::Result;
use candle_core::{DType, Tensor};

use super::budgets::WINDOW;
use super::kept::{Pool, Static};
use super::press::Press;
use super::{outside_the_protocol, require_causal, DecodeHead, Decoding};
use super::{per_query_rows, scores, static_rows, union_size, with_union};
use crate::attention::prefill::select::{top_indices, B};
use crate::attention::sparse::topk::{rank_index, rank_key};
use crate::attention::{Approximation, BudgetRule, Family, HeadInputs, Method, MethodInfo};
use crate::numerics::sampling::TrialRng;

/// What the §9 methods share in their [`MethodInfo`]: the family, causal only, deterministic.
pub const fn decode(id: &'static str, meaning: &'static str) -> MethodInfo {
    MethodInfo {
        id,
        meaning,
        family: Family::Decode,
        masks: MethodInfo::CAUSAL_ONLY,
        // No prefill form: what they implement of a layer's spec is their decode form's
        // (`Decoding::decode_spec_support`).
        spec: crate::attention::SpecFeatures::NONE,
        ..MethodInfo::BASE
    }
}

/// A method that keeps one set for the whole layer.
const fn per_layer(info: MethodInfo) -> MethodInfo {
    MethodInfo {
        budget: BudgetRule::PerLayer,
        ..info
    }
}

/// A kvpress press (issue 58): one set per K/V head.
const fn press(id: &'static str, meaning: &'static str) -> MethodInfo {
    MethodInfo {
        budget: BudgetRule::PerKvHead,
        ..decode(id, meaning)
    }
}

pub const DEC_WINDOW: MethodInfo = per_layer(decode(
    "dec_window",
    "prompt keys kept per query head: the last d prompt tokens (decode, §9)",
));
pub const DEC_STREAMING: MethodInfo = per_layer(decode(
    "dec_streaming",
    "prompt keys kept per query head: the first 4 + the last d − 4 prompt tokens (StreamingLLM; d ≥ 8)",
));
pub const SNAPKV: MethodInfo = decode(
    "snapkv",
    "prompt keys kept per query head: top d − 32 by the last 32 prompt queries' attention, max-pooled (7), + those 32 (SnapKV)",
);
pub const SNAPKV_AVG5: MethodInfo = decode(
    "snapkv_avg5",
    "prompt keys kept per query head: SnapKV with avg pooling (5), the code's default",
);
pub const PYRAMIDKV: MethodInfo = decode(
    "pyramidkv",
    "average prompt keys kept per query head over the layers: SnapKV's scores with a budget decreasing with the layer (PyramidKV, β = 20)",
);
pub const ADAKV: MethodInfo = decode(
    "adakv",
    "average prompt keys kept per query head of the layer: SnapKV's scores with per-head caps (Ada-KV, α = 0.2)",
);
pub const H2O_DEC: MethodInfo = decode(
    "h2o_dec",
    "prompt keys kept per query head: ⌊d/2⌋ heavy hitters by the prompt's accumulated attention + the last ⌈d/2⌉ prompt tokens (H2O)",
);
pub const TOVA: MethodInfo = per_layer(decode(
    "tova",
    "prompt keys kept for the whole layer: top d of the last prompt query's head-averaged attention (TOVA)",
));

pub const SNAPKV_PRESS: MethodInfo = press(
    "snapkv_press",
    "prompt keys kept per K/V head: kvpress's SnapKVPress (window 64 kept, group-mean attention, avg pooling 5)",
);
pub const PYRAMIDKV_PRESS: MethodInfo = press(
    "pyramidkv_press",
    "average prompt keys kept per K/V head over the layers: kvpress's PyramidKVPress (SnapKVPress's scores, β = 20; uniform below d = 1280)",
);
pub const ADAKV_PRESS: MethodInfo = press(
    "adakv_press",
    "average prompt keys kept per K/V head of the layer: kvpress's AdaKVPress(SnapKVPress()) (layer-wide top, each head ≥ ⌊0.2·d⌋)",
);
pub const OBSERVED_ATTENTION_PRESS: MethodInfo = press(
    "observed_attention_press",
    "prompt keys kept per K/V head: kvpress's ObservedAttentionPress (the prompt's attention per seeing query, group mean; H2O's score)",
);
pub const TOVA_PRESS: MethodInfo = MethodInfo {
    budget: BudgetRule::PerLayer,
    ..press(
        "tova_press",
        "prompt keys kept for the whole layer: kvpress's TOVAPress (the last prompt token + top d − 1 of its head-averaged attention)",
    )
};
pub const KNORM_PRESS: MethodInfo = press(
    "knorm_press",
    "prompt keys kept per K/V head: kvpress's KnormPress (the d keys of smallest norm)",
);
pub const KEYDIFF_PRESS: MethodInfo = press(
    "keydiff_press",
    "prompt keys kept per K/V head: kvpress's KeyDiffPress (the d keys least similar to the mean key direction)",
);
pub const EXPECTED_ATTENTION_PRESS: MethodInfo = press(
    "expected_attention_press",
    "prompt keys kept per K/V head: kvpress's ExpectedAttentionPress (the attention future queries can expect, from the prompt's query mean and covariance under RoPE averaged over 512 positions, × ‖v‖; 4 sinks kept)",
);
pub const LAGKV_PRESS: MethodInfo = press(
    "lagkv_press",
    "prompt keys kept per K/V head: kvpress's LagKVPress (per partition of 128, the rank of each token's K and V spread relative to the next partition; 4 sinks and the last partition kept)",
);
pub const CUR_PRESS: MethodInfo = press(
    "cur_press",
    "prompt keys kept per K/V head: kvpress's CURPress (4 sinks + top k²·v² leverage, local windows of 16)",
);
pub const QUEST_DEC: MethodInfo = decode(
    "quest_dec",
    "prompt keys per continuation query in pages of 16: the ⌈d/16⌉ pages with the largest Quest bound",
);
pub const TOPK_DEC: MethodInfo = MethodInfo {
    oracle: true,
    ..decode(
        "topk_dec",
        "prompt keys per continuation query: its top d by logit (an oracle)",
    )
};
pub const EVICT_ORACLE: MethodInfo = MethodInfo {
    oracle: true,
    ..decode(
        "evict_oracle",
        "prompt keys kept per query head: top d by the continuation's exact attention mass (an oracle: it reads the future)",
    )
};

/// What every §9 method's [`Method`] shares: its cost at the recommended n_f, its decode form,
/// and the refusal outside the protocol.
macro_rules! decode_only {
    () => {
        fn macs(&self, n: usize, p: usize, d: usize) -> f64 {
            self.macs_decode(
                n,
                p,
                d,
                super::RECOMMENDED_N_F.min(n.saturating_sub(1)).max(1),
            )
        }
        fn decoding(&self) -> Option<&dyn Decoding> {
            Some(self)
        }
        fn approximate(&self, _: &HeadInputs, _: usize, _: &mut TrialRng) -> Result<Approximation> {
            Err(outside_the_protocol(self.id()))
        }
    };
}

/// 2p per visited pair of a static set of min(d, n_p) keys: n_f·kept + n_f(n_f+1)/2 pairs.
fn static_pair_macs(n: usize, p: usize, d: usize, n_f: usize) -> f64 {
    let kept = d.min(n - n_f) as f64;
    let nf = n_f as f64;
    2.0 * p as f64 * (nf * kept + nf * (nf + 1.0) / 2.0)
}

/// A method that keeps one static prompt set per query head (or per layer).
pub struct StaticDecode(pub Static);

impl Method for StaticDecode {
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(match self.0 {
            Static::Window => &DEC_WINDOW,
            Static::Streaming => &DEC_STREAMING,
            Static::SnapKv(Pool::Max7) => &SNAPKV,
            Static::SnapKv(Pool::Avg5) => &SNAPKV_AVG5,
            Static::PyramidKv => &PYRAMIDKV,
            Static::AdaKv => &ADAKV,
            Static::H2o => &H2O_DEC,
            Static::Tova => &TOVA,
            Static::EvictOracle => &EVICT_ORACLE,
            Static::Press(p) => match p {
                Press::SnapKv => &SNAPKV_PRESS,
                Press::PyramidKv => &PYRAMIDKV_PRESS,
                Press::AdaKv => &ADAKV_PRESS,
                Press::ObservedAttention => &OBSERVED_ATTENTION_PRESS,
                Press::Tova => &TOVA_PRESS,
                Press::Knorm => &KNORM_PRESS,
                Press::KeyDiff => &KEYDIFF_PRESS,
                Press::Cur => &CUR_PRESS,
                Press::ExpectedAttention => &EXPECTED_ATTENTION_PRESS,
                Press::LagKv => &LAGKV_PRESS,
            },
        })
    }
    fn check(&self, _n: usize, d: usize) -> std::result::Result<(), String> {
        match self.0 {
            Static::Streaming if d < 8 => {
                Err("dec_streaming keeps 4 sink tokens and needs d ≥ 8".into())
            }
            _ if d == 0 => Err("d must be at least 1: the prompt keys kept".into()),
            _ => Ok(()),
        }
    }
    decode_only!();
}

impl Decoding for StaticDecode {
    /// §7.7.6: the scores read the layer's probabilities, the rows its logits, window and sink.
    fn decode_spec_support(&self) -> crate::attention::SpecFeatures {
        crate::attention::SpecFeatures::ALL
    }
    fn macs_decode(&self, n: usize, p: usize, d: usize, n_f: usize) -> f64 {
        let (n_p, pf) = ((n - n_f) as f64, p as f64);
        let select = match self.0 {
            Static::Window | Static::Streaming => 0.0,
            Static::SnapKv(_) | Static::PyramidKv | Static::AdaKv => WINDOW as f64 * n_p * pf,
            Static::H2o => n_p * (n_p + 1.0) / 2.0 * pf,
            Static::Tova => n_p * pf,
            Static::EvictOracle => n_f as f64 * n as f64 * pf,
            Static::Press(press) => press.select_macs(n_p, pf),
        };
        select + static_pair_macs(n, p, d, n_f)
    }
    fn approximate_decode(
        &self,
        head: &HeadInputs,
        dec: &DecodeHead,
        d: usize,
        _: &mut TrialRng,
    ) -> Result<Approximation> {
        require_causal(head, self.id())?;
        self.check(head.n(), d).map_err(anyhow::Error::msg)?;
        let ctx = &dec.layer;
        let kept = self.0.kept(ctx, dec.head, d)?;
        let union = if self.0.one_set_per_kv_head() {
            kept.len()
        } else {
            let sets = ctx
                .group(dec.head)
                .into_iter()
                .map(|g| {
                    if g == dec.head {
                        Ok(kept.clone())
                    } else {
                        self.0.kept(ctx, g, d)
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            union_size(&sets.iter().map(Vec::as_slice).collect::<Vec<_>>())
        };
        Ok(with_union(static_rows(head, dec, &kept)?, union as f64))
    }
}

/// `quest_dec`: per continuation query, the ⌈d/16⌉ prompt pages (of 16 tokens from token 0; a
/// partial last page bounded over its real tokens) with the largest U(q_t, page) =
/// Σ_c max(q_c·m_c, q_c·M_c) (§7.5.3), ties to the lower page. Selection only: the full cache
/// stays.
pub struct QuestDec;

/// Channel minima and maxima of each prompt page, the partial last page over its own tokens.
fn page_bounds(k_prompt: &Tensor) -> Result<(Tensor, Tensor)> {
    let (n_p, p) = k_prompt.dims2()?;
    let (full, rest) = (n_p / B, n_p % B);
    let (mut lo, mut hi) = (Vec::new(), Vec::new());
    if full > 0 {
        let blocks = k_prompt.narrow(0, 0, full * B)?.reshape((full, B, p))?;
        lo.push(blocks.min(1)?);
        hi.push(blocks.max(1)?);
    }
    if rest > 0 {
        let last = k_prompt.narrow(0, full * B, rest)?;
        lo.push(last.min_keepdim(0)?);
        hi.push(last.max_keepdim(0)?);
    }
    Ok((Tensor::cat(&lo, 0)?, Tensor::cat(&hi, 0)?))
}

/// The prompt positions each continuation query of head `g` reads under `quest_dec` at `d`.
fn quest_sets(ctx: &super::LayerContext, g: usize, d: usize) -> Result<Vec<Vec<usize>>> {
    let (n_p, n_f) = (ctx.n_p(), ctx.n_f);
    let pages = n_p.div_ceil(B);
    let m = d.div_ceil(B);
    if d >= n_p || m >= pages {
        return Ok(vec![(0..n_p).collect(); n_f]);
    }
    // The page scores do not depend on d: once per window and head.
    let u = ctx.memo("quest_dec", g, || {
        let (q, k, _) = ctx.head_qkv(g)?;
        let (lo, hi) = page_bounds(&k.narrow(0, 0, n_p)?)?;
        let qf = q.narrow(0, n_p, n_f)?;
        let (qp, qn) = (qf.relu()?, qf.minimum(0.0)?);
        // Σ_c max(q_c·m_c, q_c·M_c) = q⁺·M + q⁻·m (per channel the larger product).
        let u: Vec<Vec<f64>> = (qp.matmul(&hi.t()?)? + qn.matmul(&lo.t()?)?)?
            .to_dtype(DType::F64)?
            .to_vec2()?;
        Ok(u)
    })?;
    Ok(u.iter()
        .map(|row| {
            top_indices(row, m)
                .into_iter()
                .flat_map(|t| t * B..((t + 1) * B).min(n_p))
                .collect()
        })
        .collect())
}

/// `topk_dec` (oracle): per continuation query, its top d prompt keys by logit.
pub struct TopkDec;

fn topk_sets(ctx: &super::LayerContext, g: usize, d: usize) -> Result<Vec<Vec<usize>>> {
    let (n_p, n_f) = (ctx.n_p(), ctx.n_f);
    if d >= n_p {
        return Ok(vec![(0..n_p).collect(); n_f]);
    }
    // Each continuation query's prompt keys in rank order (−logit, j), once per window and head:
    // every budget's set is a prefix (u32: 4 bytes per (query, prompt key)).
    let ranked = ctx.memo("topk_dec", g, || {
        Ok(scores::continuation_logits(ctx, g)?
            .iter()
            .map(|row| {
                let mut keys: Vec<u128> = row
                    .iter()
                    .enumerate()
                    .map(|(j, &x)| rank_key(x, j))
                    .collect();
                keys.sort_unstable();
                keys.into_iter()
                    .map(|k| rank_index(k) as u32)
                    .collect::<Vec<u32>>()
            })
            .collect::<Vec<_>>())
    })?;
    Ok(ranked
        .iter()
        .map(|row| {
            let mut set: Vec<usize> = row[..d].iter().map(|&j| j as usize).collect();
            set.sort_unstable();
            set
        })
        .collect())
}

/// Ô_F from per-query sets, with the group's mean union per query.
fn per_query(
    head: &HeadInputs,
    dec: &DecodeHead,
    d: usize,
    sets: impl Fn(&super::LayerContext, usize, usize) -> Result<Vec<Vec<usize>>>,
    id: &str,
) -> Result<Approximation> {
    require_causal(head, id)?;
    let ctx = &dec.layer;
    let own = sets(ctx, dec.head, d)?;
    let others: Vec<Vec<Vec<usize>>> = ctx
        .group(dec.head)
        .into_iter()
        .filter(|&g| g != dec.head)
        .map(|g| sets(ctx, g, d))
        .collect::<Result<_>>()?;
    let union: usize = (0..own.len())
        .map(|i| {
            let mut row: Vec<&[usize]> = vec![&own[i]];
            row.extend(others.iter().map(|s| s[i].as_slice()));
            union_size(&row)
        })
        .sum();
    let union = union as f64 / own.len() as f64;
    Ok(with_union(per_query_rows(head, dec, own)?, union))
}

impl Method for QuestDec {
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(&QUEST_DEC)
    }
    decode_only!();
}

impl Decoding for QuestDec {
    /// §7.7.6: the scores read the layer's probabilities, the rows its logits, window and sink.
    fn decode_spec_support(&self) -> crate::attention::SpecFeatures {
        crate::attention::SpecFeatures::ALL
    }
    fn macs_decode(&self, n: usize, p: usize, d: usize, n_f: usize) -> f64 {
        let n_p = n - n_f;
        let pages = n_p.div_ceil(B) as f64;
        2.0 * p as f64 * n_f as f64 * pages
            + static_pair_macs(n, p, (d.div_ceil(B) * B).min(n_p), n_f)
    }
    fn approximate_decode(
        &self,
        head: &HeadInputs,
        dec: &DecodeHead,
        d: usize,
        _: &mut TrialRng,
    ) -> Result<Approximation> {
        per_query(head, dec, d, quest_sets, self.id())
    }
}

impl Method for TopkDec {
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(&TOPK_DEC)
    }
    decode_only!();
}

impl Decoding for TopkDec {
    /// §7.7.6: the scores read the layer's probabilities, the rows its logits, window and sink.
    fn decode_spec_support(&self) -> crate::attention::SpecFeatures {
        crate::attention::SpecFeatures::ALL
    }
    fn macs_decode(&self, n: usize, p: usize, d: usize, n_f: usize) -> f64 {
        (n_f * (n - n_f) * p) as f64 + static_pair_macs(n, p, d, n_f)
    }
    fn approximate_decode(
        &self,
        head: &HeadInputs,
        dec: &DecodeHead,
        d: usize,
        _: &mut TrialRng,
    ) -> Result<Approximation> {
        per_query(head, dec, d, topk_sets, self.id())
    }
}
