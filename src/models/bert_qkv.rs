//! One window's per-head Q, K, V: embeddings (by a named policy, docs/reference.md §1.4 items 1–2) →
//! encoder layers before the measured one, run exactly over the whole window → Q, K, V =
//! X·Wᵀ + b of the measured layer, split into heads [heads, n, p].

use anyhow::Result;
use candle_core::{DType, Tensor, D};
use candle_transformers::models::bert::Config;

use super::bert::{BertWeights, LayerNormWeights, Linear};
use crate::config::EmbeddingPolicy;

fn layer_norm(x: &Tensor, w: &LayerNormWeights, eps: f64) -> Result<Tensor> {
    let dtype = x.dtype();
    let w_ = w.weight.to_dtype(dtype)?;
    let b_ = w.bias.to_dtype(dtype)?;
    // Written out with tensor ops because candle's fused layer_norm has no f64 kernel.
    let mean = x.mean_keepdim(D::Minus1)?;
    let centered = x.broadcast_sub(&mean)?;
    let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = centered.broadcast_div(&(var + eps)?.sqrt()?)?;
    Ok(normed.broadcast_mul(&w_)?.broadcast_add(&b_)?)
}

fn apply(x: &Tensor, l: &Linear) -> Result<Tensor> {
    let w = l.weight.to_dtype(x.dtype())?;
    let b = l.bias.to_dtype(x.dtype())?;
    Ok(x.matmul(&w.t()?)?.broadcast_add(&b)?)
}

/// X = the layer-0 input for `ids` under `policy`, [n, hidden], in `dtype`.
pub fn embed(
    w: &BertWeights,
    cfg: &Config,
    ids: &[u32],
    policy: EmbeddingPolicy,
    dtype: DType,
) -> Result<Tensor> {
    let dev = w.embeddings.word.device();
    let n = ids.len();
    let ids_t = Tensor::from_vec(ids.to_vec(), n, dev)?;
    let mut x = w.embeddings.word.index_select(&ids_t, 0)?.to_dtype(dtype)?;
    let max_pos = cfg.max_position_embeddings;
    let positions: Option<Vec<u32>> = match policy {
        EmbeddingPolicy::WordPos | EmbeddingPolicy::WordPosType => {
            Some((0..n).map(|i| (i % max_pos) as u32).collect())
        }
        EmbeddingPolicy::WordPosFirst => None,
        EmbeddingPolicy::Word => None,
    };
    if let Some(pos) = positions {
        let pos_t = Tensor::from_vec(pos, n, dev)?;
        x = (x + w
            .embeddings
            .position
            .index_select(&pos_t, 0)?
            .to_dtype(dtype)?)?;
    }
    if policy == EmbeddingPolicy::WordPosFirst {
        let m = n.min(max_pos);
        let head =
            (x.narrow(0, 0, m)? + w.embeddings.position.narrow(0, 0, m)?.to_dtype(dtype)?)?;
        x = if m < n {
            Tensor::cat(&[head, x.narrow(0, m, n - m)?], 0)?
        } else {
            head
        };
    }
    if policy == EmbeddingPolicy::WordPosType {
        let t0 = w.embeddings.token_type.narrow(0, 0, 1)?.to_dtype(dtype)?;
        x = x.broadcast_add(&t0)?;
    }
    layer_norm(&x, &w.embeddings.layer_norm, cfg.layer_norm_eps)
}

/// Splits [n, hidden] into [heads, n, p].
fn split_heads(x: &Tensor, heads: usize) -> Result<Tensor> {
    let (n, h) = x.dims2()?;
    Ok(x.reshape((n, heads, h / heads))?
        .transpose(0, 1)?
        .contiguous()?)
}

/// One full BERT encoder layer (eval mode, no mask: windows are full), exact attention over n.
fn encoder_layer(x: &Tensor, lw: &super::bert::LayerWeights, cfg: &Config) -> Result<Tensor> {
    let rest = lw.rest.as_ref().expect("earlier layers carry all weights");
    let heads = cfg.num_attention_heads;
    let p = cfg.hidden_size / heads;
    let q = split_heads(&apply(x, &lw.query)?, heads)?;
    let k = split_heads(&apply(x, &lw.key)?, heads)?;
    let v = split_heads(&apply(x, &lw.value)?, heads)?;
    let mut ctx = Vec::with_capacity(heads);
    for h in 0..heads {
        let o =
            crate::attention::exact::ExactAttention::compute(&q.get(h)?, &k.get(h)?, &v.get(h)?)?;
        ctx.push(o.output);
    }
    let n = x.dims()[0];
    let ctx = Tensor::stack(&ctx, 1)?.reshape((n, heads * p))?;
    let a = layer_norm(
        &(apply(&ctx, &rest.attention_output)? + x)?,
        &rest.attention_norm,
        cfg.layer_norm_eps,
    )?;
    let i = apply(&a, &rest.intermediate)?.gelu_erf()?;
    layer_norm(
        &(apply(&i, &rest.output)? + &a)?,
        &rest.output_norm,
        cfg.layer_norm_eps,
    )
}

/// Q, K, V of the last loaded layer for one window, each [heads, n, p] in `dtype`.
pub fn window_qkv(
    w: &BertWeights,
    cfg: &Config,
    ids: &[u32],
    policy: EmbeddingPolicy,
    dtype: DType,
) -> Result<(Tensor, Tensor, Tensor)> {
    window_qkv_dropout(w, cfg, ids, policy, dtype, None)
}

/// Inverted dropout on X (a model left in training mode): each entry is zeroed with probability
/// `p` and the survivors scaled by 1/(1 − p); the mask comes from `seed`.
fn dropout(x: &Tensor, p: f64, seed: u64) -> Result<Tensor> {
    use rand::{Rng, SeedableRng};
    let numel = x.elem_count();
    let mut rng = crate::numerics::sampling::TrialRng::seed_from_u64(seed);
    let mask: Vec<f64> = (0..numel)
        .map(|_| {
            if rng.random::<f64>() < p {
                0.0
            } else {
                1.0 / (1.0 - p)
            }
        })
        .collect();
    let mask = Tensor::from_vec(mask, x.shape(), x.device())?.to_dtype(x.dtype())?;
    Ok((x * mask)?)
}

/// [`window_qkv`] with optional embedding dropout `(p, seed)`.
pub fn window_qkv_dropout(
    w: &BertWeights,
    cfg: &Config,
    ids: &[u32],
    policy: EmbeddingPolicy,
    dtype: DType,
    embedding_dropout: Option<(f64, u64)>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let mut x = embed(w, cfg, ids, policy, dtype)?;
    if let Some((p, seed)) = embedding_dropout.filter(|(p, _)| *p > 0.0) {
        x = dropout(&x, p, seed)?;
    }
    let (last, earlier) = w.layers.split_last().expect("at least one layer");
    for lw in earlier {
        x = encoder_layer(&x, lw, cfg)?;
    }
    let heads = cfg.num_attention_heads;
    Ok((
        split_heads(&apply(&x, &last.query)?, heads)?,
        split_heads(&apply(&x, &last.key)?, heads)?,
        split_heads(&apply(&x, &last.value)?, heads)?,
    ))
}

/// The run's compute device (parsed and opened on the ground floor, [`crate::device`]).
pub use crate::device::device;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::bert::{load, WeightSource};
    use crate::tensor_util::test_device;

    fn tiny() -> (Config, BertWeights) {
        let cfg: Config = serde_json::from_str(
            r#"{"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
                "intermediate_size": 32, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
                "max_position_embeddings": 8, "type_vocab_size": 2, "initializer_range": 0.02,
                "layer_norm_eps": 1e-12, "pad_token_id": 0}"#,
        )
        .unwrap();
        let w = load(
            &cfg,
            1,
            &WeightSource::Initialized {
                seed: 1,
                scheme: crate::config::InitScheme::Hf,
            },
            &WeightSource::Initialized {
                seed: 1,
                scheme: crate::config::InitScheme::Hf,
            },
            &test_device(),
        )
        .unwrap();
        (cfg, w)
    }

    #[test]
    fn positions_wrap_modulo_the_table() {
        let (cfg, w) = tiny();
        let ids: Vec<u32> = (1..=16).collect();
        let x = embed(&w, &cfg, &ids, EmbeddingPolicy::WordPos, DType::F64).unwrap();
        // Token 9 (index 8) gets position 0: equals embedding ids [9] alone at position 0.
        let alone = embed(&w, &cfg, &[9], EmbeddingPolicy::WordPos, DType::F64).unwrap();
        let a: Vec<f64> = x.get(8).unwrap().to_vec1().unwrap();
        let b: Vec<f64> = alone.get(0).unwrap().to_vec1().unwrap();
        assert_eq!(a, b);
        // LayerNorm with γ = 1, β = 0: every row has mean 0 and variance 1.
        let r: Vec<f64> = x.get(3).unwrap().to_vec1().unwrap();
        let m = r.iter().sum::<f64>() / 16.0;
        let var = r.iter().map(|v| (v - m).powi(2)).sum::<f64>() / 16.0;
        // var = v/(v + eps) with eps = 1e-12 and v ≈ 1e-3: 1 − var ≈ 1e-9.
        assert!(m.abs() < 1e-12 && (var - 1.0).abs() < 1e-8, "{m} {var}");
    }

    #[test]
    fn qkv_shapes_and_zero_bias_at_init() {
        let (cfg, w) = tiny();
        let ids: Vec<u32> = (1..=12).collect();
        let (q, k, v) = window_qkv(&w, &cfg, &ids, EmbeddingPolicy::WordPos, DType::F32).unwrap();
        assert_eq!(q.dims(), &[4, 12, 4]);
        assert_eq!(k.dims(), v.dims());
        // Zero ids row → X row is LN(pos) only; all finite.
        assert!(q
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .all(|x| x.is_finite()));
    }
}
