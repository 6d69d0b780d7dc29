//! The §9 methods on a §7.7 family's layer (docs/reference.md §7.7.6): the scores read the layer's
//! probabilities, the continuation rows its τ, cap, window and sink; against float64
//! definitions written here.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use rand_distr::{Distribution, StandardNormal};

use super::kept::Static;
use super::{DecodeHead, LayerContext};
use crate::attention::spec::AttentionSpec;
use crate::attention::HeadInputs;
use crate::numerics::sampling::rng_from_seed;

const H: usize = 4;
const HKV: usize = 2;
const P: usize = 8;

fn gauss(heads: usize, n: usize, seed: u64) -> Vec<f64> {
    let mut rng = rng_from_seed(seed);
    (0..heads * n * P)
        .map(|_| StandardNormal.sample(&mut rng))
        .collect()
}

/// A layer of H = 4 query heads on 2 K/V heads, with its spec.
struct Layer {
    n: usize,
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    spec: AttentionSpec,
}

impl Layer {
    fn new(n: usize, spec: AttentionSpec) -> Self {
        Self {
            n,
            q: gauss(H, n, 1).iter().map(|x| 1.5 * x).collect(),
            k: gauss(HKV, n, 2),
            v: gauss(HKV, n, 3),
            spec,
        }
    }
    fn row<'a>(&self, x: &'a [f64], h: usize, i: usize) -> &'a [f64] {
        &x[(h * self.n + i) * P..(h * self.n + i + 1) * P]
    }
    fn tensor(&self, x: &[f64], heads: usize) -> Tensor {
        Tensor::from_vec(x.to_vec(), (heads, self.n, P), &Device::Cpu).unwrap()
    }
    fn context(&self, n_f: usize) -> Arc<LayerContext> {
        let ctx = LayerContext::new(
            self.tensor(&self.q, H),
            self.tensor(&self.k, HKV),
            self.tensor(&self.v, HKV),
            n_f,
            1,
            4,
        )
        .unwrap();
        // A rotary map for the presses that read one (ExpectedAttention; its scores ignore the
        // spec, as kvpress's do: the rows below are what this test checks).
        let p = P;
        let rope = crate::numerics::rope::LayerRope {
            inv_freq: (0..p / 2)
                .map(|t| 10_000f64.powf(-((2 * t) as f64) / p as f64))
                .collect(),
            attention_factor: 1.0,
        };
        Arc::new(
            ctx.with_spec(self.spec.clone())
                .unwrap()
                .with_rope(Some(rope)),
        )
    }
    /// §7.7.0's logit of query head g's row i at key j, None where the row does not see it.
    fn logit(&self, g: usize, i: usize, j: usize) -> Option<f64> {
        if !self.spec.sees(i, j) {
            return None;
        }
        let kv = g * HKV / H;
        let dot: f64 = self
            .row(&self.q, g, i)
            .iter()
            .zip(self.row(&self.k, kv, j))
            .map(|(a, b)| a * b)
            .sum();
        Some(self.spec.logit(dot))
    }
    /// Row i of head g restricted to `keys` (those it sees), with the head's sink in the
    /// denominator: (Ô_i, Σ_{j∈S} P_ij with P the full row's).
    fn restricted(&self, g: usize, i: usize, keys: &[usize]) -> (Vec<f64>, f64) {
        let kv = g * HKV / H;
        let sink = self.spec.sink(g);
        let all: Vec<(usize, f64)> = (0..self.n)
            .filter_map(|j| self.logit(g, i, j).map(|s| (j, s)))
            .collect();
        let m = all
            .iter()
            .map(|x| x.1)
            .fold(sink.unwrap_or(f64::MIN), f64::max);
        let z_all =
            all.iter().map(|x| (x.1 - m).exp()).sum::<f64>() + sink.map_or(0.0, |s| (s - m).exp());
        let kept: Vec<&(usize, f64)> = all.iter().filter(|(j, _)| keys.contains(j)).collect();
        let z =
            kept.iter().map(|x| (x.1 - m).exp()).sum::<f64>() + sink.map_or(0.0, |s| (s - m).exp());
        let mut o = vec![0.0; P];
        for &&(j, s) in &kept {
            let w = (s - m).exp() / z;
            for (c, x) in o.iter_mut().enumerate() {
                *x += w * self.row(&self.v, kv, j)[c];
            }
        }
        let mass = kept.iter().map(|x| (x.1 - m).exp()).sum::<f64>() / z_all;
        (o, mass)
    }
}

fn spec_layer() -> AttentionSpec {
    AttentionSpec::causal(P, Some(20))
        .with_scale(0.3)
        .with_softcap(Some(2.5))
        .with_sinks(Some(vec![0.5, -1.0, 1.5, 0.0]))
}

fn head(ctx: &Arc<LayerContext>, spec: &AttentionSpec, g: usize) -> (HeadInputs, DecodeHead) {
    let (q, k, v) = ctx.head_qkv(g).unwrap();
    (
        HeadInputs::with_spec(q, k, v, spec.for_head(g)).unwrap(),
        DecodeHead {
            head: g,
            layer: ctx.clone(),
        },
    )
}

/// Every §9 method's rows are the restricted softmax over its kept set ∩ the window, with the
/// sink in the denominator, and `mass` is the target's probability of the kept keys; at d ≥ n_p
/// every method is the target (the window's and the sink's).
#[test]
fn every_decode_method_on_a_windowed_capped_sink_layer_against_float64() {
    let (n, n_f) = (60, 12);
    let n_p = n - n_f;
    let layer = Layer::new(n, spec_layer());
    let ctx = layer.context(n_f);
    for id in crate::attention::family_method_ids(crate::attention::Family::Decode) {
        let m = crate::attention::by_id(id).unwrap();
        let dec = m.decoding().unwrap();
        for g in 0..H {
            let (h, dh) = head(&ctx, &layer.spec, g);
            let per_query = ["quest_dec", "topk_dec"].contains(&id);
            for d in [8, 16, 33, n_p] {
                if per_query && d < n_p {
                    continue; // their per-row sets: below
                }
                let a = dec
                    .approximate_decode(&h, &dh, d, &mut rng_from_seed(0))
                    .unwrap();
                let got: Vec<Vec<f64>> = a.output.to_dtype(DType::F64).unwrap().to_vec2().unwrap();
                for (r, t) in (n_p..n).enumerate() {
                    let keys: Vec<usize> = if d >= n_p {
                        (0..n).collect()
                    } else {
                        kept_keys(id, &ctx, g, d, r, n_p)
                    };
                    let (want, _) = layer.restricted(g, t, &keys);
                    let err = got[r]
                        .iter()
                        .zip(&want)
                        .map(|(x, y)| (x - y).abs())
                        .fold(0.0, f64::max);
                    assert!(err < 1e-12, "{id} head {g} d = {d} row {t}: {err:e}");
                }
            }
        }
    }
}

/// The prompt keys a method keeps for continuation row r (its own selection; the rows above are
/// what this test checks), plus the continuation so far.
fn kept_keys(
    id: &str,
    ctx: &Arc<LayerContext>,
    g: usize,
    d: usize,
    r: usize,
    n_p: usize,
) -> Vec<usize> {
    let mut keys = static_of(id).kept(ctx, g, d).unwrap();
    keys.extend(n_p..=n_p + r);
    keys
}

fn static_of(id: &str) -> Static {
    use super::kept::Pool;
    match id {
        "dec_window" => Static::Window,
        "dec_streaming" => Static::Streaming,
        "snapkv" => Static::SnapKv(Pool::Max7),
        "snapkv_avg5" => Static::SnapKv(Pool::Avg5),
        "pyramidkv" => Static::PyramidKv,
        "adakv" => Static::AdaKv,
        "h2o_dec" => Static::H2o,
        "tova" => Static::Tova,
        "evict_oracle" => Static::EvictOracle,
        other => Static::Press(
            super::press::Press::ALL
                .into_iter()
                .find(|p| p.id() == other)
                .unwrap_or_else(|| panic!("{other}")),
        ),
    }
}

impl Layer {
    /// P_ij of query head g over the real keys (τ, capped, windowed, the sink in the denominator).
    fn probability(&self, g: usize, i: usize, j: usize) -> f64 {
        let (_, p) = self.restricted(g, i, &[j]);
        p
    }
}

/// The §9 scores read the layer's own probabilities (§7.7.6: capped, windowed, over real keys),
/// and `topk_dec` ranks the raw τ·q·k of the keys each row sees.
#[test]
fn the_decode_scores_read_the_layers_probabilities() {
    use super::budgets::WINDOW;
    use super::scores;
    let (n, n_f) = (60, 12);
    let n_p = n - n_f;
    let layer = Layer::new(n, spec_layer());
    let ctx = layer.context(n_f);
    let close = |a: &[f64], b: &[f64], what: &str| {
        assert_eq!(a.len(), b.len(), "{what}");
        for (j, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() < 1e-12, "{what} key {j}: {x} vs {y}");
        }
    };
    let mut tova = vec![0.0; n_p];
    for g in 0..H {
        let col = |rows: std::ops::Range<usize>, keys: usize| -> Vec<f64> {
            (0..keys)
                .map(|j| rows.clone().map(|i| layer.probability(g, i, j)).sum())
                .collect()
        };
        close(
            &scores::snap(&ctx, g).unwrap(),
            &col(n_p - WINDOW..n_p, n_p - WINDOW),
            "snapkv",
        );
        close(&scores::h2o(&ctx, g).unwrap(), &col(0..n_p, n_p), "h2o_dec");
        close(
            &scores::evict(&ctx, g).unwrap(),
            &col(n_p..n, n_p),
            "evict_oracle",
        );
        for (m, x) in tova.iter_mut().zip(col(n_p - 1..n_p, n_p)) {
            *m += x / H as f64;
        }
        let logits = scores::continuation_logits(&ctx, g).unwrap();
        for (r, row) in logits.iter().enumerate() {
            let t = n_p + r;
            for (j, &x) in row.iter().enumerate() {
                let kv = g * HKV / H;
                let dot: f64 = layer
                    .row(&layer.q, g, t)
                    .iter()
                    .zip(layer.row(&layer.k, kv, j))
                    .map(|(a, b)| a * b)
                    .sum();
                let want = if layer.spec.sees(t, j) {
                    0.3 * dot
                } else {
                    f64::NEG_INFINITY
                };
                assert!(
                    x == want || (x - want).abs() < 1e-12,
                    "topk_dec logit ({t}, {j})"
                );
            }
        }
    }
    close(&scores::tova(&ctx).unwrap(), &tova, "tova");
}

/// Under the decode protocol a method's support is its decode form's: the §9 methods and the
/// caches read the spec; KIVI's per-row cache has no spec form yet and is refused by name.
#[test]
fn kivi_under_decode_is_refused_on_a_spec_layer_and_the_section_9_methods_are_not() {
    let layer = Layer::new(40, spec_layer());
    let ctx = layer.context(8);
    let (h, _) = head(&ctx, &layer.spec, 0);
    let refuse = |id: &str| {
        let m = crate::attention::by_id(id).unwrap();
        crate::attention::refuse_unimplemented_decode_spec(m.as_ref(), &h)
    };
    let e = refuse("kivi4").unwrap_err().to_string();
    assert!(
        e.contains("kivi4 does not yet implement a sliding window"),
        "{e}"
    );
    for id in ["snapkv", "quest_dec", "topk_dec", "kv_f16"] {
        refuse(id).unwrap();
    }
    // In prefill the same layer runs KIVI (its prefill form reads the spec).
    let m = crate::attention::by_id("kivi4").unwrap();
    crate::attention::refuse_unimplemented_spec(m.as_ref(), &h).unwrap();
}
