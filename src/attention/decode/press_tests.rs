//! kvpress's presses (issue 58) against float64 transcriptions of kvpress 0.5.5's formulas,
//! written here from its source on the host values of a random layer (6 query heads on 2 K/V
//! heads), and kvpress's own budget examples. `scripts/kvpress-check.py` checks the presses
//! against kvpress itself, end to end.

use std::sync::Arc;

use super::kept::Static;
use super::press::{pyramid_n_kept, Press, PRESS_WINDOW};
use super::tests::{avg_pool, dot, kv, layer, probs, tensor, top, Heads, H, HKV};
use super::LayerContext;

const N: usize = 220;
const N_F: usize = 40;
const N_P: usize = N - N_F;

fn context(seed: u64) -> (Heads, Heads, Heads, Arc<LayerContext>) {
    let (q, k, v) = layer(N, seed);
    let ctx = LayerContext::new(tensor(&q), tensor(&k), tensor(&v), N_F, 3, 8).unwrap();
    (q, k, v, Arc::new(ctx))
}

fn group(kvh: usize) -> Vec<usize> {
    (0..H).filter(|&g| kv(g) == kvh).collect()
}

/// The mean over K/V head `kvh`'s query heads of `f(g)`.
fn group_mean(kvh: usize, f: impl Fn(usize) -> Vec<f64>) -> Vec<f64> {
    let g = group(kvh);
    let rows: Vec<Vec<f64>> = g.iter().map(|&h| f(h)).collect();
    (0..rows[0].len())
        .map(|j| rows.iter().map(|r| r[j]).sum::<f64>() / g.len() as f64)
        .collect()
}

/// SnapKVPress's score of K/V head `kvh`: the window's mean attention, pooled, group mean.
fn snap_reference(q: &Heads, k: &Heads, kvh: usize) -> Vec<f64> {
    let w = PRESS_WINDOW;
    group_mean(kvh, |g| {
        let s: Vec<f64> = (0..N_P - w)
            .map(|j| (N_P - w..N_P).map(|i| probs(q, k, g, i, i)[j]).sum::<f64>() / w as f64)
            .collect();
        avg_pool(&s, 5)
    })
}

fn window_plus(top_part: Vec<usize>) -> Vec<usize> {
    let mut kept = top_part;
    kept.extend(N_P - PRESS_WINDOW..N_P);
    kept
}

#[test]
fn pyramidkv_press_budget_is_kvpress_s() {
    // kvpress's PyramidKVPress at L = 32 (cr = 0.5 and 0.75, window 64 in the budget).
    let l32: Vec<usize> = (0..32).map(|l| pyramid_n_kept(4096, 8192, 32, l)).collect();
    assert_eq!((l32[0], l32[1], l32[31]), (7987, 7736, 205));
    assert_eq!(pyramid_n_kept(500, 1000, 32, 0), 936);
    assert_eq!(pyramid_n_kept(500, 1000, 32, 31), 64);
    // Below 20·64: uniform, n_kept = d.
    assert_eq!(pyramid_n_kept(1024, 4096, 32, 5), 1024);
    assert_eq!(pyramid_n_kept(256, 768, 30, 29), 256);
    // A short prompt caps max at n_p − 64 (= 116 at n_p = 180, then min = 64): not uniform,
    // round(116 − 3·52/7) = 94 in layer 3 of 8.
    assert_eq!(pyramid_n_kept(90, 180, 8, 3), 94);
    assert_eq!(pyramid_n_kept(90, 180, 8, 0), 116);
}

#[test]
fn snapkv_press_keeps_the_window_and_the_top_group_mean_pooled_attention() {
    let (q, k, _, ctx) = context(1);
    for kvh in 0..HKV {
        let s = snap_reference(&q, &k, kvh);
        for d in [65, 90, 150] {
            let want = window_plus(top(&s, d - PRESS_WINDOW));
            assert_eq!(Press::SnapKv.kept(&ctx, kvh, d).unwrap(), want, "d={d}");
            // PyramidKVPress: SnapKVPress's scores at its layer budget (layer 3 of 8).
            let keep = pyramid_n_kept(d, N_P, 8, 3);
            assert_eq!(
                Press::PyramidKv.kept(&ctx, kvh, d).unwrap(),
                window_plus(top(&s, keep - PRESS_WINDOW))
            );
        }
        // d ≤ 64: the most recent d (kvpress keeps d of the window's equal scores).
        assert_eq!(
            Press::SnapKv.kept(&ctx, kvh, 20).unwrap(),
            (N_P - 20..N_P).collect::<Vec<_>>()
        );
    }
}

#[test]
fn every_query_head_of_a_group_reads_its_k_v_head_s_set() {
    let (_, _, _, ctx) = context(2);
    for press in [Press::SnapKv, Press::AdaKv, Press::Knorm, Press::Cur] {
        for g in 0..H {
            let own = Static::Press(press).kept(&ctx, g, 100).unwrap();
            let first = Static::Press(press)
                .kept(&ctx, group(kv(g))[0], 100)
                .unwrap();
            assert_eq!(own, first, "{press:?} head {g}");
            assert!(own.windows(2).all(|w| w[0] < w[1]) && *own.last().unwrap() < N_P);
        }
    }
}

#[test]
fn adakv_press_spends_the_layer_s_budget_on_the_top_scores_over_k_v_heads() {
    let (q, k, _, ctx) = context(3);
    let scores: Vec<Vec<f64>> = (0..HKV).map(|h| snap_reference(&q, &k, h)).collect();
    for d in [70, 100, 150] {
        // The window (max + 1) first, then the layer's top non-window scores; safe = ⌊0.2·d⌋ ≤ 64
        // lies within the window here.
        let mut rest: Vec<(f64, usize, usize)> = scores
            .iter()
            .enumerate()
            .flat_map(|(h, s)| s.iter().enumerate().map(move |(j, &x)| (x, h, j)))
            .collect();
        rest.sort_by(|a, b| {
            b.0.partial_cmp(&a.0)
                .unwrap()
                .then((a.1, a.2).cmp(&(b.1, b.2)))
        });
        let mut want = vec![Vec::new(); HKV];
        for &(_, h, j) in rest.iter().take(HKV * (d - PRESS_WINDOW)) {
            want[h].push(j);
        }
        let mut total = 0;
        for (h, w) in want.into_iter().enumerate() {
            let mut w = w;
            w.sort_unstable();
            let got = Press::AdaKv.kept(&ctx, h, d).unwrap();
            assert_eq!(got, window_plus(w), "d={d} head {h}");
            total += got.len();
        }
        assert_eq!(total, HKV * d);
    }
}

#[test]
fn observed_attention_press_divides_the_prompt_s_attention_by_the_queries_that_see_a_key() {
    let (q, k, _, ctx) = context(4);
    for kvh in 0..HKV {
        let s = group_mean(kvh, |g| {
            (0..N_P)
                .map(|j| {
                    (j..N_P).map(|i| probs(&q, &k, g, i, i)[j]).sum::<f64>() / (N_P - j) as f64
                })
                .collect()
        });
        for d in [10, 64, 150] {
            assert_eq!(
                Press::ObservedAttention.kept(&ctx, kvh, d).unwrap(),
                top(&s, d)
            );
        }
    }
}

#[test]
fn tova_press_keeps_the_last_token_and_the_top_head_mean_of_the_last_row() {
    let (q, k, _, ctx) = context(5);
    let s: Vec<f64> = (0..N_P - 1)
        .map(|j| {
            (0..H)
                .map(|g| probs(&q, &k, g, N_P - 1, N_P - 1)[j])
                .sum::<f64>()
                / H as f64
        })
        .collect();
    for d in [1, 20, 100] {
        let mut want = top(&s, d - 1);
        want.push(N_P - 1);
        for kvh in 0..HKV {
            assert_eq!(Press::Tova.kept(&ctx, kvh, d).unwrap(), want);
        }
    }
}

#[test]
fn key_only_presses_follow_their_closed_forms() {
    let (_, k, v, ctx) = context(6);
    let norm = |x: &[f64]| dot(x, x).sqrt();
    for kvh in 0..HKV {
        let keys = &k[kvh][..N_P];
        // KnormPress: the smallest norms.
        let knorm: Vec<f64> = keys.iter().map(|x| -norm(x)).collect();
        // KeyDiffPress: least similar to the mean unit key.
        let p = keys[0].len();
        let anchor: Vec<f64> = (0..p)
            .map(|c| keys.iter().map(|x| x[c] / norm(x)).sum::<f64>() / N_P as f64)
            .collect();
        let keydiff: Vec<f64> = keys
            .iter()
            .map(|x| -dot(x, &anchor) / (norm(x) * norm(&anchor)))
            .collect();
        // CURPress: local (16) leverage of k² and v², the first 4 forced.
        let local = |x: Vec<f64>| -> Vec<f64> {
            (0..x.len())
                .map(|j| {
                    x[j] / x[j / 16 * 16..((j / 16 + 1) * 16).min(x.len())]
                        .iter()
                        .sum::<f64>()
                })
                .collect()
        };
        let k2 = local(keys.iter().map(|x| dot(x, x)).collect());
        let v2 = local(v[kvh][..N_P].iter().map(|x| dot(x, x)).collect());
        let cur: Vec<f64> = k2.iter().zip(&v2).map(|(a, b)| a * b).collect();
        for d in [5, 40, 120] {
            assert_eq!(Press::Knorm.kept(&ctx, kvh, d).unwrap(), top(&knorm, d));
            assert_eq!(Press::KeyDiff.kept(&ctx, kvh, d).unwrap(), top(&keydiff, d));
            let mut want: Vec<usize> = (0..4).collect();
            want.extend(top(&cur[4..], d - 4).into_iter().map(|j| j + 4));
            assert_eq!(Press::Cur.kept(&ctx, kvh, d).unwrap(), want, "cur d={d}");
        }
    }
}

#[test]
fn keys_that_tie_by_construction_go_to_the_lower_position() {
    // Every key a rotation of one vector by its position (RoPE's pairs): equal norms in exact
    // arithmetic, apart by rounding here. KnormPress then keeps the first d, as §9.1's ties do.
    let (q, _, v) = layer(N, 7);
    let base = [0.3, -1.2, 0.7, 2.0, -0.4, 0.9, 1.1, -0.8];
    let k: Heads = (0..HKV)
        .map(|_| {
            (0..N)
                .map(|t| {
                    let mut x = base.to_vec();
                    for c in 0..4 {
                        let a = t as f64 * 0.37 / (c + 1) as f64;
                        let (s, co) = a.sin_cos();
                        (x[c], x[c + 4]) = (
                            base[c] * co - base[c + 4] * s,
                            base[c] * s + base[c + 4] * co,
                        );
                    }
                    x
                })
                .collect()
        })
        .collect();
    let ctx = LayerContext::new(tensor(&q), tensor(&k), tensor(&v), N_F, 0, 8).unwrap();
    for d in [3, 50] {
        assert_eq!(
            Press::Knorm.kept(&ctx, 0, d).unwrap(),
            (0..d).collect::<Vec<_>>()
        );
    }
}

/// R_t x = x∘cos + rotate_half(x)∘sin at angle t·f per pair (c, c + p/2), in f64.
fn rotate(x: &[f64], t: f64, inv: &[f64], sign: f64) -> Vec<f64> {
    let h = inv.len();
    let mut out = x.to_vec();
    for (c, f) in inv.iter().enumerate() {
        let (s, co) = (sign * t * f).sin_cos();
        out[c] = x[c] * co - x[c + h] * s;
        out[c + h] = x[c + h] * co + x[c] * s;
    }
    out
}

#[test]
fn expected_attention_press_follows_kvpress_s_formula() {
    let (q, k, v) = layer(N, 8);
    let inv: Vec<f64> = (0..4)
        .map(|t| 10_000f64.powf(-((2 * t) as f64) / 8.0))
        .collect();
    let rope = crate::numerics::rope::LayerRope {
        inv_freq: inv.clone(),
        attention_factor: 1.0,
    };
    let ctx = LayerContext::new(tensor(&q), tensor(&k), tensor(&v), N_F, 0, 8)
        .unwrap()
        .with_rope(Some(rope));
    let p = 8;
    // R̄ = mean over the next 512 positions of R_p, as a matrix (column j = R̄ e_j).
    let rbar: Vec<Vec<f64>> = (0..p)
        .map(|j| {
            let mut e = vec![0.0; p];
            e[j] = 1.0;
            let mut col = vec![0.0; p];
            for t in N_P..N_P + 512 {
                for (c, x) in rotate(&e, t as f64, &inv, 1.0).iter().enumerate() {
                    col[c] += x / 512.0;
                }
            }
            col
        })
        .collect();
    let apply = |x: &[f64]| -> Vec<f64> {
        (0..p)
            .map(|i| (0..p).map(|j| rbar[j][i] * x[j]).sum())
            .collect()
    };
    for kvh in 0..HKV {
        let s = group_mean(kvh, |g| {
            // The pre-RoPE queries past the 4 sinks, their mean and biased covariance.
            let pre: Vec<Vec<f64>> = (4..N_P)
                .map(|t| rotate(&q[g][t], t as f64, &inv, -1.0))
                .collect();
            let m = pre.len() as f64;
            let mu: Vec<f64> = (0..p)
                .map(|c| pre.iter().map(|x| x[c]).sum::<f64>() / m)
                .collect();
            let cov: Vec<Vec<f64>> = (0..p)
                .map(|a| {
                    (0..p)
                        .map(|b| {
                            pre.iter()
                                .map(|x| (x[a] - mu[a]) * (x[b] - mu[b]))
                                .sum::<f64>()
                                / m
                        })
                        .collect()
                })
                .collect();
            let mu_r = apply(&mu);
            // R̄ Σ R̄ᵀ, column by column.
            let rc: Vec<Vec<f64>> = (0..p)
                .map(|b| apply(&(0..p).map(|a| cov[a][b]).collect::<Vec<_>>()))
                .collect();
            let cov_r: Vec<Vec<f64>> = (0..p)
                .map(|a| apply(&(0..p).map(|b| rc[b][a]).collect::<Vec<_>>()))
                .collect();
            let z: Vec<f64> = (4..N_P)
                .map(|t| {
                    let kt = &k[kvh][t];
                    let quad: f64 = (0..p)
                        .map(|a| (0..p).map(|b| kt[a] * cov_r[a][b] * kt[b]).sum::<f64>())
                        .sum();
                    dot(&mu_r, kt) / (p as f64).sqrt() + quad / (2.0 * p as f64)
                })
                .collect();
            let mx = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = z.iter().map(|x| (x - mx).exp()).collect();
            let total: f64 = e.iter().sum();
            e.into_iter().map(|x| x / total).collect()
        });
        let s: Vec<f64> = s
            .iter()
            .enumerate()
            .map(|(i, x)| x * dot(&v[kvh][i + 4], &v[kvh][i + 4]).sqrt())
            .collect();
        for d in [3, 30, 120] {
            let mut want: Vec<usize> = (0..4.min(d)).collect();
            if d > 4 {
                want.extend(top(&s, d - 4).into_iter().map(|j| j + 4));
            }
            assert_eq!(
                Press::ExpectedAttention.kept(&ctx, kvh, d).unwrap(),
                want,
                "d={d}"
            );
        }
    }
    // Without the layer's rotary map it is refused, naming the press.
    let bare = LayerContext::new(tensor(&q), tensor(&k), tensor(&v), N_F, 0, 8).unwrap();
    let e = Press::ExpectedAttention.kept(&bare, 0, 30).unwrap_err();
    assert!(e.to_string().contains("expected_attention_press"), "{e}");
}

#[test]
fn lagkv_press_ranks_each_partition_against_the_next_one_s_range() {
    let (q, k, v) = layer(600, 9);
    lagkv_against_its_formula(&q, &k, &v);
    // A channel constant over a partition (hi = lo) counts 0 instead of kvpress's 0/0.
    let mut flat = k.clone();
    flat.iter_mut().flatten().for_each(|row| row[3] = 0.5);
    lagkv_against_its_formula(&q, &flat, &v);
}

fn lagkv_against_its_formula(q: &Heads, k: &Heads, v: &Heads) {
    // n_p = 560: partitions of 128 from 4 to 516, the last one (388..516) and the remainder kept.
    let (n, n_f) = (600, 40);
    let ctx = LayerContext::new(tensor(q), tensor(k), tensor(v), n_f, 0, 8).unwrap();
    let n_p = n - n_f;
    for kvh in 0..HKV {
        let mut score = vec![1.0; n_p];
        for i in 0..3 {
            let (start, next) = (4 + 128 * i, 4 + 128 * (i + 1));
            let spread = |x: &Heads| -> Vec<f64> {
                let rows = &x[kvh];
                // Each channel's range over the next partition.
                let range = |start: f64, pick: fn(f64, f64) -> f64| -> Vec<f64> {
                    (0..8)
                        .map(|c| {
                            rows[next..next + 128]
                                .iter()
                                .map(|r| r[c])
                                .fold(start, pick)
                        })
                        .collect()
                };
                let (lo, hi) = (
                    range(f64::INFINITY, f64::min),
                    range(f64::NEG_INFINITY, f64::max),
                );
                let sd: Vec<f64> = (start..start + 128)
                    .map(|t| {
                        let z: Vec<f64> = (0..8)
                            .map(|c| {
                                if hi[c] > lo[c] {
                                    (rows[t][c] - lo[c]) / (hi[c] - lo[c])
                                } else {
                                    0.0
                                }
                            })
                            .collect();
                        let m = z.iter().sum::<f64>() / 8.0;
                        (z.iter().map(|y| (y - m) * (y - m)).sum::<f64>() / 7.0).sqrt()
                    })
                    .collect();
                let e: Vec<f64> = sd.iter().map(|s| s.exp()).collect();
                let total: f64 = e.iter().sum();
                e.into_iter().map(|x| x / total).collect()
            };
            let (sk, sv) = (spread(k), spread(v));
            for j in 0..128 {
                let mine = (sk[j] + sv[j]) / 2.0;
                let below = (0..128).filter(|&o| (sk[o] + sv[o]) / 2.0 < mine).count();
                score[start + j] = below as f64 / 128.0;
            }
        }
        // d = 176 + 3·r takes whole rank levels: the 176 ones, then the top r ranks of each partition.
        for d in [176, 179, 200] {
            assert_eq!(
                Press::LagKv.kept(&ctx, kvh, d).unwrap(),
                top(&score, d),
                "d={d}"
            );
        }
    }
    // A prompt under 4 + 2·128: the sinks and the most recent.
    let (_, _, _, short) = context(10);
    let mut want: Vec<usize> = (0..4).collect();
    want.extend(N_P - 26..N_P);
    assert_eq!(Press::LagKv.kept(&short, 0, 30).unwrap(), want);
}
