//! The §9 methods against a float64 reference written from docs/reference.md §9 with plain loops and
//! sorts (not from the code above): the kept sets exactly, Ô_F, keys, mass and kv_union. The data
//! are seeded Gaussian heads with a planted sink (key 0 aligned with the queries, so the
//! score-based methods have something to find) and a GQA layout of 6 query heads on 2 K/V heads.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};

use super::kept::{Pool, Static};
use super::methods::{QuestDec, StaticDecode, TopkDec};
use super::{DecodeHead, LayerContext};
use crate::attention::{HeadInputs, Mask, Method};
use crate::numerics::sampling::rng_from_seed;

pub(super) const H: usize = 6;
pub(super) const HKV: usize = 2;
pub(super) const P: usize = 8;
const W: usize = 32;

/// [heads][n][p] host values.
pub(super) type Heads = Vec<Vec<Vec<f64>>>;

pub(super) fn layer(n: usize, seed: u64) -> (Heads, Heads, Heads) {
    let mut rng = rng_from_seed(seed);
    let mut g = |heads: usize, sink: f64| -> Heads {
        (0..heads)
            .map(|_| {
                (0..n)
                    .map(|j| {
                        (0..P)
                            .map(|c| {
                                let x: f64 = StandardNormal.sample(&mut rng);
                                // Channel 0 carries a shared direction: a sink at key 0.
                                if c == 0 && j == 0 {
                                    x + sink
                                } else {
                                    x
                                }
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect()
    };
    let mut q = g(H, 0.0);
    let k = g(HKV, 6.0);
    let v = g(HKV, 0.0);
    // Queries lean on channel 0 (by a head-dependent amount), so key 0 is a sink for some heads.
    for (h, qh) in q.iter_mut().enumerate() {
        for row in qh.iter_mut() {
            row[0] += 0.4 * h as f64;
        }
    }
    // Some exact ties: a run of duplicated keys, which max pooling and equal logits must break
    // toward the lower index.
    let _ = rng.random::<u32>();
    (q, k, v)
}

pub(super) fn tensor(x: &Heads) -> Tensor {
    let (a, b) = (x.len(), x[0].len());
    let flat: Vec<f64> = x.iter().flatten().flatten().copied().collect();
    Tensor::from_vec(flat, (a, b, P), &Device::Cpu).unwrap()
}

pub(super) fn kv(g: usize) -> usize {
    g * HKV / H
}

pub(super) fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Softmax of query row `i` of head g over keys 0..=upto (its causal row when upto = i).
pub(super) fn probs(q: &Heads, k: &Heads, g: usize, i: usize, upto: usize) -> Vec<f64> {
    let s: Vec<f64> = (0..=upto)
        .map(|j| dot(&q[g][i], &k[kv(g)][j]) / (P as f64).sqrt())
        .collect();
    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
    let z: f64 = e.iter().sum();
    e.into_iter().map(|x| x / z).collect()
}

/// The top m indices by a stable sort on −score (ties to the lower index), ascending.
pub(super) fn top(scores: &[f64], m: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].partial_cmp(&scores[a]).unwrap().then(a.cmp(&b)));
    let mut t: Vec<usize> = idx.into_iter().take(m).collect();
    t.sort_unstable();
    t
}

fn max_pool(x: &[f64], k: usize) -> Vec<f64> {
    let r = k / 2;
    (0..x.len())
        .map(|j| {
            let lo = j.saturating_sub(r);
            let hi = (j + r).min(x.len() - 1);
            x[lo..=hi].iter().cloned().fold(f64::NEG_INFINITY, f64::max)
        })
        .collect()
}

pub(super) fn avg_pool(x: &[f64], k: usize) -> Vec<f64> {
    let r = k / 2;
    (0..x.len())
        .map(|j| {
            let lo = j.saturating_sub(r);
            let hi = (j + r).min(x.len() - 1);
            x[lo..=hi].iter().sum::<f64>() / k as f64
        })
        .collect()
}

struct Ref<'a> {
    q: &'a Heads,
    k: &'a Heads,
    n: usize,
    n_p: usize,
    layer: usize,
    layers: usize,
}

impl Ref<'_> {
    fn snap(&self, g: usize) -> Vec<f64> {
        let mut s = vec![0.0; self.n_p - W];
        for i in self.n_p - W..self.n_p {
            let pr = probs(self.q, self.k, g, i, i);
            for (j, x) in s.iter_mut().enumerate() {
                *x += pr[j];
            }
        }
        s
    }
    fn window(&self, d: usize) -> Vec<usize> {
        (self.n_p - d..self.n_p).collect()
    }
    fn with_window(&self, mut t: Vec<usize>) -> Vec<usize> {
        t.extend(self.n_p - W..self.n_p);
        t
    }
    /// The static set of query head g under §9.2.
    fn kept(&self, method: &str, g: usize, d: usize) -> Vec<usize> {
        let n_p = self.n_p;
        if d >= n_p {
            return (0..n_p).collect();
        }
        let snap_scored = ["snapkv", "snapkv_avg5", "pyramidkv", "adakv"].contains(&method);
        if snap_scored && d <= W {
            return self.window(d);
        }
        match method {
            "dec_window" => self.window(d),
            "dec_streaming" => {
                let mut t: Vec<usize> = (0..4).collect();
                t.extend(n_p - (d - 4)..n_p);
                t
            }
            "snapkv" => self.with_window(top(&max_pool(&self.snap(g), 7), d - W)),
            "snapkv_avg5" => self.with_window(top(&avg_pool(&self.snap(g), 5), d - W)),
            "pyramidkv" => {
                let b = d - W;
                if n_p < 2 * b {
                    return self.with_window(top(&max_pool(&self.snap(g), 7), b));
                }
                let (mut min, mut max) = (b / 20, 2 * b - b / 20);
                if max >= n_p - W {
                    max = n_p - W;
                    min = 2 * b - max;
                }
                let steps = (max - min) / (self.layers - 1);
                let keep = max - self.layer * steps;
                self.with_window(top(&max_pool(&self.snap(g), 7), keep))
            }
            "adakv" => {
                let b = d - W;
                let pooled: Vec<Vec<f64>> = (0..H)
                    .map(|h| {
                        max_pool(&self.snap(h), 7)
                            .iter()
                            .map(|x| x / W as f64)
                            .collect()
                    })
                    .collect();
                let mut all: Vec<(f64, usize, usize)> = Vec::new();
                for (h, s) in pooled.iter().enumerate() {
                    for (j, &x) in s.iter().enumerate() {
                        all.push((x, h, j));
                    }
                }
                all.sort_by(|a, c| {
                    c.0.partial_cmp(&a.0)
                        .unwrap()
                        .then((a.1, a.2).cmp(&(c.1, c.2)))
                });
                let mut counts = [0usize; H];
                for e in all.iter().take(H * b) {
                    counts[e.1] += 1;
                }
                let cap = (counts[g] as f64 * 0.8 + (0.2 * b as f64).floor()).round_ties_even();
                self.with_window(top(&pooled[g], cap as usize))
            }
            "h2o_dec" => {
                let (h, r) = (d / 2, d - d / 2);
                let mut a = vec![0.0; n_p];
                for i in 0..n_p {
                    for (j, x) in probs(self.q, self.k, g, i, i).into_iter().enumerate() {
                        a[j] += x;
                    }
                }
                let mut t = top(&a[..n_p - r], h);
                t.extend(n_p - r..n_p);
                t
            }
            "tova" => {
                let mut s = vec![0.0; n_p];
                for h in 0..H {
                    for (j, x) in probs(self.q, self.k, h, n_p - 1, n_p - 1)
                        .into_iter()
                        .enumerate()
                    {
                        s[j] += x / H as f64;
                    }
                }
                top(&s, d)
            }
            "evict_oracle" => {
                let mut s = vec![0.0; n_p];
                for t in n_p..self.n {
                    for (j, x) in probs(self.q, self.k, g, t, t)
                        .into_iter()
                        .take(n_p)
                        .enumerate()
                    {
                        s[j] += x;
                    }
                }
                top(&s, d)
            }
            _ => unreachable!("{method}"),
        }
    }
    /// The prompt set of continuation query t of head g, for the per-query methods.
    fn per_query(&self, method: &str, g: usize, t: usize, d: usize) -> Vec<usize> {
        let n_p = self.n_p;
        if d >= n_p {
            return (0..n_p).collect();
        }
        let qt = &self.q[g][t];
        let kk = &self.k[kv(g)];
        match method {
            "topk_dec" => top(&(0..n_p).map(|j| dot(qt, &kk[j])).collect::<Vec<_>>(), d),
            "quest_dec" => {
                let pages = n_p.div_ceil(16);
                let m = d.div_ceil(16);
                if m >= pages {
                    return (0..n_p).collect();
                }
                let u: Vec<f64> = (0..pages)
                    .map(|pg| {
                        let span = pg * 16..((pg + 1) * 16).min(n_p);
                        (0..P)
                            .map(|c| {
                                let lo =
                                    span.clone().map(|j| kk[j][c]).fold(f64::INFINITY, f64::min);
                                let hi = span
                                    .clone()
                                    .map(|j| kk[j][c])
                                    .fold(f64::NEG_INFINITY, f64::max);
                                (qt[c] * lo).max(qt[c] * hi)
                            })
                            .sum()
                    })
                    .collect();
                top(&u, m)
                    .into_iter()
                    .flat_map(|pg| pg * 16..((pg + 1) * 16).min(n_p))
                    .collect()
            }
            _ => unreachable!(),
        }
    }
}

/// Ô_t over S_t = C ∪ {n_p..t}, with the mass of exact P_t on S_t.
fn restricted_row(
    q: &Heads,
    k: &Heads,
    v: &Heads,
    g: usize,
    t: usize,
    n_p: usize,
    c: &[usize],
) -> (Vec<f64>, f64) {
    let mut s: Vec<usize> = c.to_vec();
    s.extend(n_p..=t);
    let full = probs(q, k, g, t, t);
    let z: f64 = s.iter().map(|&j| full[j]).sum();
    let mut out = vec![0.0; P];
    for &j in &s {
        for (o, x) in out.iter_mut().zip(&v[kv(g)][j]) {
            *o += full[j] / z * x;
        }
    }
    (out, z)
}

fn exact_row(q: &Heads, k: &Heads, v: &Heads, g: usize, t: usize) -> Vec<f64> {
    let pr = probs(q, k, g, t, t);
    let mut out = vec![0.0; P];
    for (j, w) in pr.iter().enumerate() {
        for (o, x) in out.iter_mut().zip(&v[kv(g)][j]) {
            *o += w * x;
        }
    }
    out
}

const STATIC: [(&str, Static); 9] = [
    ("dec_window", Static::Window),
    ("dec_streaming", Static::Streaming),
    ("snapkv", Static::SnapKv(Pool::Max7)),
    ("snapkv_avg5", Static::SnapKv(Pool::Avg5)),
    ("pyramidkv", Static::PyramidKv),
    ("adakv", Static::AdaKv),
    ("h2o_dec", Static::H2o),
    ("tova", Static::Tova),
    ("evict_oracle", Static::EvictOracle),
];

/// Query head g of the layer and its place in it, as the decode protocol gives them.
struct Decoded {
    head: HeadInputs,
    dec: DecodeHead,
}

impl Decoded {
    /// The method's Ô under the protocol.
    fn run(
        &self,
        m: &dyn Method,
        d: usize,
        rng: &mut crate::numerics::sampling::TrialRng,
    ) -> anyhow::Result<crate::attention::Approximation> {
        m.decoding()
            .expect("a decode method")
            .approximate_decode(&self.head, &self.dec, d, rng)
    }
}

fn head_of(ctx: &Arc<LayerContext>, g: usize) -> Decoded {
    let (q, k, v) = ctx.head_qkv(g).unwrap();
    Decoded {
        head: HeadInputs::masked(q, k, v, Mask::Causal).unwrap(),
        dec: DecodeHead {
            head: g,
            layer: ctx.clone(),
        },
    }
}

fn rows(t: &Tensor) -> Vec<Vec<f64>> {
    t.to_dtype(DType::F64).unwrap().to_vec2().unwrap()
}

#[test]
fn every_method_agrees_with_a_float64_reference_written_from_section_9() {
    let (n, n_f, layer, layers) = (232, 40, 3, 8);
    let n_p = n - n_f;
    let (q, k, v) = layer_data(n, 11);
    let ctx = Arc::new(
        LayerContext::new(tensor(&q), tensor(&k), tensor(&v), n_f, layer, layers).unwrap(),
    );
    let r = Ref {
        q: &q,
        k: &k,
        n,
        n_p,
        layer,
        layers,
    };
    let budgets = [8, 16, 32, 33, 40, 64, 100, 150, 191, 192, 232];
    let mut rng = rng_from_seed(0);
    for g in 0..H {
        let head = head_of(&ctx, g);
        for &d in &budgets {
            let mut check = |id: &str, m: &dyn Method, sets: Vec<Vec<usize>>, union: f64| {
                let a = head.run(m, d, &mut rng).unwrap();
                let got = rows(&a.output);
                assert_eq!(got.len(), n_f, "{id}");
                let (mut keys, mut mass) = (0.0, 0.0);
                for (i, t) in (n_p..n).enumerate() {
                    let (want, z) = restricted_row(&q, &k, &v, g, t, n_p, &sets[i]);
                    for (a, b) in got[i].iter().zip(&want) {
                        assert!(
                            (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                            "{id} d={d} head {g} row {t}: {a} vs {b}"
                        );
                    }
                    keys += (sets[i].len() + t - n_p + 1) as f64;
                    mass += z;
                }
                let s = a.support.as_ref().expect("a restricted support");
                assert!(
                    (s.keys - keys / n_f as f64).abs() < 1e-9,
                    "{id} d={d}: keys {} vs {}",
                    s.keys,
                    keys / n_f as f64
                );
                assert_eq!(s.kv_union, Some(union), "{id} d={d} head {g}");
                let log_rowsum = head
                    .head
                    .exact()
                    .unwrap()
                    .log_rowsum()
                    .unwrap()
                    .narrow(0, n_p, n_f)
                    .unwrap();
                let got_mass = a.mass(&log_rowsum).unwrap().unwrap();
                assert!(
                    (got_mass - mass / n_f as f64).abs() < 1e-9,
                    "{id} d={d}: mass"
                );
            };
            for (id, kind) in STATIC {
                if id == "dec_streaming" && d < 8 {
                    continue;
                }
                let want = r.kept(id, g, d);
                assert_eq!(kind.kept(&ctx, g, d).unwrap(), want, "{id} d={d} head {g}");
                let group: Vec<usize> = (0..H).filter(|&x| kv(x) == kv(g)).collect();
                let mut union: Vec<usize> = group.iter().flat_map(|&x| r.kept(id, x, d)).collect();
                union.sort_unstable();
                union.dedup();
                check(id, &StaticDecode(kind), vec![want; n_f], union.len() as f64);
            }
            for (id, m) in [
                ("topk_dec", &TopkDec as &dyn Method),
                ("quest_dec", &QuestDec),
            ] {
                let sets: Vec<Vec<usize>> = (n_p..n).map(|t| r.per_query(id, g, t, d)).collect();
                let group: Vec<usize> = (0..H).filter(|&x| kv(x) == kv(g)).collect();
                let union: f64 = (n_p..n)
                    .map(|t| {
                        let mut u: Vec<usize> = group
                            .iter()
                            .flat_map(|&x| r.per_query(id, x, t, d))
                            .collect();
                        u.sort_unstable();
                        u.dedup();
                        u.len() as f64
                    })
                    .sum::<f64>()
                    / n_f as f64;
                let got = head.run(m, d, &mut rng_from_seed(0)).unwrap();
                let got = got.support.as_ref().unwrap().kv_union.unwrap();
                assert!(
                    (got - union).abs() < 1e-9,
                    "{id} d={d}: kv_union {got} vs {union}"
                );
                check(id, m, sets, got);
            }
        }
    }
}

/// The test layer: [`layer`] plus a run of exactly repeated keys in K/V head 0 (positions 60..66
/// equal to 59), so logits, pooled scores and column sums tie and the lower index must win.
fn layer_data(n: usize, seed: u64) -> (Heads, Heads, Heads) {
    let (q, mut k, v) = layer(n, seed);
    for j in 60..66 {
        k[0][j] = k[0][59].clone();
    }
    (q, k, v)
}

#[test]
fn d_at_least_the_prompt_keeps_everything_and_is_exact_for_every_method() {
    let (n, n_f) = (150, 50);
    let (q, k, v) = layer_data(n, 5);
    let ctx = Arc::new(LayerContext::new(tensor(&q), tensor(&k), tensor(&v), n_f, 0, 4).unwrap());
    let mut rng = rng_from_seed(0);
    for g in [0, 4] {
        let head = head_of(&ctx, g);
        let want: Vec<Vec<f64>> = (100..150).map(|t| exact_row(&q, &k, &v, g, t)).collect();
        let target = rows(
            &head
                .head
                .target_output(crate::attention::Target::Softmax)
                .unwrap()
                .narrow(0, n - n_f, n_f)
                .unwrap(),
        );
        for id in crate::attention::family_method_ids(crate::attention::Family::Decode) {
            let m = crate::attention::by_id(id).unwrap();
            for d in [100, 101, 150] {
                let got = rows(&head.run(m.as_ref(), d, &mut rng).unwrap().output);
                for ((a, b), c) in got.iter().zip(&want).zip(&target) {
                    for ((x, y), z) in a.iter().zip(b).zip(c) {
                        assert!(
                            (x - y).abs() < 1e-12 && (z - y).abs() < 1e-12,
                            "{id} d={d}: {x} vs {y}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn ties_after_max_pooling_go_to_the_lower_index() {
    // One spike: max pooling (7) spreads it over positions 2..=8, a plateau of seven exact ties;
    // the top 3 are the three lowest, then the untied larger value elsewhere wins first.
    let mut s = vec![0.0; 20];
    s[5] = 1.0;
    s[15] = 2.0;
    let pooled = Pool::Max7.apply(&s);
    assert_eq!(&pooled[2..=8], &[1.0; 7]);
    let t = crate::attention::prefill::select::top_indices(&pooled, 10);
    // 2.0 covers 12..=18 (seven), then the 1.0 plateau from its lowest: 2, 3, 4.
    assert_eq!(t, vec![2, 3, 4, 12, 13, 14, 15, 16, 17, 18]);
    // Average pooling (5, zeros counted): a lone 1.0 at 5 gives 0.2 on 3..=7, ties to 3.
    let mut a = vec![0.0; 12];
    a[5] = 1.0;
    let pooled = Pool::Avg5.apply(&a);
    assert_eq!(
        crate::attention::prefill::select::top_indices(&pooled, 2),
        vec![3, 4]
    );
}

#[test]
fn a_method_outside_the_protocol_or_without_it_is_refused() {
    let (q, k, v) = layer_data(100, 1);
    let ctx = Arc::new(LayerContext::new(tensor(&q), tensor(&k), tensor(&v), 20, 0, 4).unwrap());
    let (q0, k0, v0) = ctx.head_qkv(0).unwrap();
    let plain = HeadInputs::masked(q0, k0, v0, Mask::Causal).unwrap();
    let mut rng = rng_from_seed(0);
    let e = StaticDecode(Static::Tova)
        .approximate(&plain, 16, &mut rng)
        .err()
        .unwrap();
    assert!(e.to_string().contains("--decode"), "{e}");
    assert!(StaticDecode(Static::Streaming).check(100, 4).is_err());
    // n_f must leave a prompt.
    assert!(LayerContext::new(tensor(&q), tensor(&k), tensor(&v), 100, 0, 4).is_err());
}
