//! Mixture-of-experts pieces the §7.7 families share (gpt-oss, DeepSeek): top-k, and the
//! token-to-expert dispatch of a mixture-of-experts layer, as
//! transformers' eager expert loop runs it (each expert on its tokens, outputs weighted and
//! added per token in expert order).

use anyhow::Result;
use candle_core::{DType, Tensor};

/// The indices of the k largest values, largest first (ties: the lower index first). NaN
/// values rank last.
pub fn top_k(values: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..values.len()).collect();
    idx.sort_by(|&a, &b| {
        let (x, y) = (values[a], values[b]);
        y.partial_cmp(&x)
            .unwrap_or_else(|| x.is_nan().cmp(&y.is_nan()))
    });
    idx.truncate(k);
    idx
}

/// Per token, the chosen experts and their weights.
pub type Routing = Vec<Vec<(usize, f64)>>;

/// Σ over each token's chosen experts of weight·expert(x_token): `expert(e, rows)` maps the rows
/// routed to expert e ([m, hidden]) to its outputs ([m, hidden]); experts run in index order.
pub fn dispatch(
    x: &Tensor,
    routing: &Routing,
    experts: usize,
    expert: impl Fn(usize, &Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let mut out = x.zeros_like()?;
    for e in 0..experts {
        let (rows, weights): (Vec<u32>, Vec<f64>) = routing
            .iter()
            .enumerate()
            .flat_map(|(t, chosen)| {
                chosen
                    .iter()
                    .filter(move |(c, _)| *c == e)
                    .map(move |&(_, w)| (t as u32, w))
            })
            .unzip();
        if rows.is_empty() {
            continue;
        }
        let m = rows.len();
        let idx = Tensor::from_vec(rows, m, x.device())?;
        let y = expert(e, &x.index_select(&idx, 0)?)?;
        let w = Tensor::from_vec(weights, (m, 1), x.device())?.to_dtype(x.dtype())?;
        out = out.index_add(&idx, &y.broadcast_mul(&w)?, 0)?;
    }
    Ok(out)
}

/// σ(x) = 1/(1 + e^(−x)), element-wise in x's dtype.
pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    Ok((x.neg()?.exp()? + 1.0)?.recip()?)
}

/// The rows of a 2-D tensor as f64 vectors on the host.
pub fn host_rows(t: &Tensor) -> Result<Vec<Vec<f64>>> {
    Ok(t.to_dtype(DType::F64)?.to_vec2()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn top_k_orders_by_value_then_index() {
        assert_eq!(top_k(&[0.1, 0.5, f64::NAN, 0.5, -1.0], 3), vec![1, 3, 0]);
        assert_eq!(top_k(&[2.0, 1.0], 5), vec![0, 1]);
    }

    #[test]
    fn dispatch_weights_and_adds_each_tokens_experts() {
        let x = Tensor::new(&[[1f64, 2.0], [3.0, 4.0], [5.0, 6.0]], &Device::Cpu).unwrap();
        // expert 0 doubles, expert 1 negates; token 2 routed to none.
        let routing: Routing = vec![vec![(0, 0.5), (1, 2.0)], vec![(1, 1.0)], vec![]];
        let y = dispatch(&x, &routing, 2, |e, rows| {
            Ok(if e == 0 { (rows * 2.0)? } else { rows.neg()? })
        })
        .unwrap();
        let want = [[1.0 - 2.0, 2.0 - 4.0], [-3.0, -4.0], [0.0, 0.0]];
        assert_eq!(
            y.to_vec2::<f64>().unwrap(),
            want.map(|r| r.to_vec()).to_vec()
        );
    }
}
