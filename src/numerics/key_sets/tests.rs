use super::*;
use rand::SeedableRng;

use crate::numerics::sampling::{normal_values, uniform_without_replacement, TrialRng};

/// The test oracle of docs/reference.md §6.1: the dense masked softmax in float64, built entry by entry
/// from the definition (no shared code with the product). Returns Ô and log Σ_{j∈V_i} e^{s_ij}.
pub(crate) fn dense_masked_softmax(
    q: &[Vec<f64>],
    k: &[Vec<f64>],
    v: &[Vec<f64>],
    visits: impl Fn(usize, usize) -> bool,
) -> (Vec<Vec<f64>>, Vec<f64>) {
    let p = q[0].len() as f64;
    let mut out = Vec::new();
    let mut logs = Vec::new();
    for (i, qi) in q.iter().enumerate() {
        let s: Vec<f64> = k
            .iter()
            .enumerate()
            .map(|(j, kj)| {
                if visits(i, j) {
                    qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() / p.sqrt()
                } else {
                    f64::NEG_INFINITY
                }
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        out.push(
            (0..v[0].len())
                .map(|c| e.iter().zip(v).map(|(w, vj)| w * vj[c]).sum::<f64>() / z)
                .collect(),
        );
        logs.push(m + z.ln());
    }
    (out, logs)
}

/// Largest |a − b| relative to the largest |b|.
pub(crate) fn max_rel(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    let scale = b.iter().flatten().fold(0f64, |m, x| m.max(x.abs()));
    let diff = a
        .iter()
        .flatten()
        .zip(b.iter().flatten())
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()));
    diff / scale
}

fn rows(n: usize, p: usize, std: f64, seed: u64) -> Vec<Vec<f64>> {
    let vals = normal_values(&mut TrialRng::seed_from_u64(seed), n, p, std);
    vals.chunks(p).map(|r| r.to_vec()).collect()
}

fn tensor(m: &[Vec<f64>], dtype: DType) -> Tensor {
    Tensor::new(m.to_vec(), &crate::tensor_util::test_device())
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn to_rows(t: &Tensor) -> Vec<Vec<f64>> {
    t.to_dtype(DType::F64).unwrap().to_vec2().unwrap()
}

/// Random groups of rows (blocks of varied sizes) with random key lists of varied lengths, so
/// that chunks pad both rows and keys; and a per-row filter on top.
fn random_groups(n: usize, seed: u64) -> Vec<KeyGroup> {
    let mut rng = TrialRng::seed_from_u64(seed);
    let perm = uniform_without_replacement(&mut rng, n, n);
    let mut groups = Vec::new();
    let mut at = 0;
    let mut size = 1;
    while at < n {
        let len = size.min(n - at);
        let l = 1 + (7 * size + 3) % n;
        groups.push(KeyGroup {
            rows: perm[at..at + len].to_vec(),
            keys: uniform_without_replacement(&mut rng, n, l),
        });
        at += len;
        size = size % 9 + 1;
    }
    groups
}

#[test]
fn matches_the_dense_masked_softmax_with_padding_and_filters() {
    let n = 90;
    let (q, k, v) = (rows(n, 8, 1.5, 1), rows(n, 8, 1.5, 2), rows(n, 5, 1.0, 3));
    let groups = random_groups(n, 4);
    let group_of: Vec<usize> = {
        let mut g = vec![0; n];
        for (gi, grp) in groups.iter().enumerate() {
            for &i in &grp.rows {
                g[i] = gi;
            }
        }
        g
    };
    // Keep key j for row i unless (i + j) % 3 == 0, but always the group's first key.
    let filter =
        |i: usize, j: usize| !(i + j).is_multiple_of(3) || j == groups[group_of[i]].keys[0];
    let in_group = |i: usize, j: usize| groups[group_of[i]].keys.contains(&j);
    for (with_filter, host) in [(false, true), (true, true), (false, false), (true, false)] {
        let f: Option<RowFilter> = if with_filter { Some(&filter) } else { None };
        let (want, want_log) = dense_masked_softmax(&q, &k, &v, |i, j| {
            in_group(i, j) && (!with_filter || filter(i, j))
        });
        let got = key_set_softmax_paths(
            &tensor(&q, DType::F64),
            &tensor(&k, DType::F64),
            &tensor(&v, DType::F64),
            &groups,
            f,
            true,
            KeyLogits::plain(q[0].len()),
            host,
        )
        .unwrap();
        assert!(max_rel(&to_rows(&got.output), &want) < 1e-12);
        let log: Vec<f64> = got.log_normalizer.unwrap().to_vec1().unwrap();
        for i in 0..n {
            assert!((log[i] - want_log[i]).abs() < 1e-12, "row {i}");
        }
        // The f32 path (in-place exponentials, f64 row sums) agrees to f32 rounding.
        let got32 = key_set_softmax_paths(
            &tensor(&q, DType::F32),
            &tensor(&k, DType::F32),
            &tensor(&v, DType::F32),
            &groups,
            f,
            true,
            KeyLogits::plain(q[0].len()),
            host,
        )
        .unwrap();
        assert_eq!(got32.output.dtype(), DType::F32);
        assert!(max_rel(&to_rows(&got32.output), &want) < 1e-5);
        let log32: Vec<f64> = got32.log_normalizer.unwrap().to_vec1().unwrap();
        for i in 0..n {
            assert!((log32[i] - want_log[i]).abs() < 1e-5, "row {i}");
        }
    }
}

#[test]
fn every_key_for_every_row_is_exact_attention() {
    let n = 70;
    let (q, k, v) = (
        rows(n, 16, 2.0, 5),
        rows(n, 16, 2.0, 6),
        rows(n, 16, 1.0, 7),
    );
    let all: Vec<usize> = (0..n).collect();
    let (want, _) = dense_masked_softmax(&q, &k, &v, |_, _| true);
    let blocks: Vec<KeyGroup> = (0..n)
        .step_by(16)
        .map(|a| KeyGroup {
            rows: (a..(a + 16).min(n)).collect(),
            keys: all.clone(),
        })
        .collect();
    let per_row = per_row_groups(vec![all.clone(); n]);
    for groups in [blocks, per_row] {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-6)] {
            let got = key_set_softmax(
                &tensor(&q, dtype),
                &tensor(&k, dtype),
                &tensor(&v, dtype),
                &groups,
                None,
                false,
            )
            .unwrap();
            assert!(got.log_normalizer.is_none());
            let e = max_rel(&to_rows(&got.output), &want);
            assert!(e < tol, "{dtype:?}: {e:e}");
        }
    }
}

#[test]
fn weights_are_a_distribution_on_exactly_the_visited_keys() {
    // V = I_n turns Ô into the weight matrix itself.
    let n = 40;
    let (q, k) = (rows(n, 6, 3.0, 8), rows(n, 6, 3.0, 9));
    let eye: Vec<Vec<f64>> = (0..n)
        .map(|i| (0..n).map(|j| f64::from(u8::from(i == j))).collect())
        .collect();
    let groups = random_groups(n, 10);
    let visited = |i: usize| {
        groups
            .iter()
            .find(|g| g.rows.contains(&i))
            .unwrap()
            .keys
            .clone()
    };
    for dtype in [DType::F64, DType::F32] {
        let w = to_rows(
            &key_set_softmax(
                &tensor(&q, dtype),
                &tensor(&k, dtype),
                &tensor(&eye, dtype),
                &groups,
                None,
                false,
            )
            .unwrap()
            .output,
        );
        for (i, row) in w.iter().enumerate() {
            let keys = visited(i);
            let sum: f64 = row.iter().sum();
            assert!((sum - 1.0).abs() < 1e-6, "row {i} sums to {sum}");
            for (j, &x) in row.iter().enumerate() {
                if keys.contains(&j) {
                    assert!(x > 0.0, "row {i}, visited key {j} has weight {x}");
                } else {
                    assert_eq!(x, 0.0, "row {i}, unvisited key {j}");
                }
            }
        }
    }
}

#[test]
fn large_logits_do_not_overflow() {
    let q = vec![vec![300.0, 0.0], vec![-300.0, 10.0]];
    let v = vec![vec![1.0, 2.0], vec![3.0, 4.0]];
    for dtype in [DType::F64, DType::F32] {
        let groups = per_row_groups(vec![vec![0, 1], vec![1, 0]]);
        let t = |m: &Vec<Vec<f64>>| tensor(m, dtype);
        let out = to_rows(
            &key_set_softmax(&t(&q), &t(&q), &t(&v), &groups, None, false)
                .unwrap()
                .output,
        );
        assert!(
            (out[0][0] - 1.0).abs() < 1e-6 && (out[1][1] - 4.0).abs() < 1e-6,
            "{out:?}"
        );
    }
}

#[test]
fn malformed_key_sets_are_errors_not_panics() {
    let n = 6;
    let (q, v) = (rows(n, 4, 1.0, 11), rows(n, 4, 1.0, 12));
    let (q, v) = (tensor(&q, DType::F64), tensor(&v, DType::F64));
    let run = |groups: Vec<KeyGroup>, filter: Option<RowFilter>| {
        key_set_softmax(&q, &q, &v, &groups, filter, false).map(|_| ())
    };
    let g = |rows: Vec<usize>, keys: Vec<usize>| KeyGroup { rows, keys };
    let msg = |r: Result<()>| r.unwrap_err().to_string();
    assert!(msg(run(vec![g((0..5).collect(), vec![0])], None)).contains("row 5 is in no group"));
    assert!(msg(run(
        vec![g((0..6).collect(), vec![0]), g(vec![2], vec![1])],
        None
    ))
    .contains("row 2 is in two groups"));
    assert!(msg(run(vec![g((0..6).collect(), vec![0, 6])], None)).contains("key 6 out of range"));
    assert!(msg(run(vec![g((0..6).collect(), vec![1, 3, 1])], None)).contains("listed twice"));
    assert!(msg(run(vec![g((0..6).collect(), vec![])], None)).contains("has no keys"));
    assert!(msg(run(vec![g((0..7).collect(), vec![0])], None)).contains("out of range"));
    let none_for_row_4 = |i: usize, _: usize| i != 4;
    assert!(msg(run(
        vec![g((0..6).collect(), vec![0, 1])],
        Some(&none_for_row_4)
    ))
    .contains("row 4 visits no key"));
    let k_short = tensor(&rows(3, 4, 1.0, 13), DType::F64);
    assert!(key_set_softmax(
        &q,
        &k_short,
        &v,
        &[g((0..6).collect(), vec![0])],
        None,
        false
    )
    .is_err());
    // A group may have no rows; the others still cover every row.
    assert!(run(vec![g((0..6).collect(), vec![0]), g(vec![], vec![1])], None).is_ok());
}

/// Per-row sets: the CPU's host loops and the batched products give the dense oracle's values,
/// with a filter and the log-normalisers, in f64 and f32.
#[test]
fn per_row_sets_on_both_paths_match_the_dense_oracle() {
    let n = 120;
    let (q, k, v) = (
        rows(n, 12, 1.5, 14),
        rows(n, 12, 1.5, 15),
        rows(n, 7, 1.0, 16),
    );
    let mut rng = TrialRng::seed_from_u64(17);
    let sets: Vec<Vec<usize>> = (0..n)
        .map(|i| uniform_without_replacement(&mut rng, n, 1 + (i * 13) % 50))
        .collect();
    let filter = |i: usize, j: usize| !(i * j).is_multiple_of(4) || j == sets[i][0];
    let (want, want_log) =
        dense_masked_softmax(&q, &k, &v, |i, j| sets[i].contains(&j) && filter(i, j));
    for host in [true, false] {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            let got = key_set_softmax_paths(
                &tensor(&q, dtype),
                &tensor(&k, dtype),
                &tensor(&v, dtype),
                &per_row_groups(sets.clone()),
                Some(&filter),
                true,
                KeyLogits::plain(q[0].len()),
                host,
            )
            .unwrap();
            assert_eq!(got.output.dtype(), dtype);
            let e = max_rel(&to_rows(&got.output), &want);
            assert!(e < tol, "host {host}, {dtype:?}: {e:e}");
            let log: Vec<f64> = got.log_normalizer.unwrap().to_vec1().unwrap();
            for i in 0..n {
                assert!(
                    (log[i] - want_log[i]).abs() < tol,
                    "host {host}, {dtype:?}, row {i}"
                );
            }
        }
    }
    // A row whose filter leaves nothing is an error on the host path too.
    let none = |i: usize, _: usize| i != 3;
    let t = |m: &Vec<Vec<f64>>| tensor(m, DType::F64);
    let err = key_set_softmax(
        &t(&q),
        &t(&k),
        &t(&v),
        &per_row_groups(sets.clone()),
        Some(&none),
        false,
    )
    .map(|_| ());
    assert!(err.unwrap_err().to_string().contains("row 3 visits no key"));
}

/// A layer's logits (τ, a soft-cap, a sink) against their float64 definition (§7.7.0 restricted to
/// the set): on both paths, f64 and f32, with padding and filters. The log-normaliser stays over
/// the set's real keys; the sink only divides.
#[test]
fn a_layers_logits_match_their_definition() {
    let n = 70;
    let (q, k, v) = (
        rows(n, 8, 2.0, 11),
        rows(n, 8, 2.0, 12),
        rows(n, 5, 1.0, 13),
    );
    let groups = random_groups(n, 5);
    let mut group_of = vec![0; n];
    for (gi, grp) in groups.iter().enumerate() {
        for &i in &grp.rows {
            group_of[i] = gi;
        }
    }
    let filter =
        |i: usize, j: usize| !(i + 2 * j).is_multiple_of(5) || j == groups[group_of[i]].keys[0];
    let visits = |i: usize, j: usize| groups[group_of[i]].keys.contains(&j) && filter(i, j);
    for logits in [
        KeyLogits {
            scale: 0.6,
            softcap: None,
            sink: None,
        },
        KeyLogits {
            scale: 0.6,
            softcap: Some(1.5),
            sink: None,
        },
        KeyLogits {
            scale: 0.3,
            softcap: None,
            sink: Some(1.0),
        },
        KeyLogits {
            scale: 0.5,
            softcap: Some(2.0),
            sink: Some(-0.5),
        },
    ] {
        let (mut want, mut want_log) = (Vec::new(), Vec::new());
        for (i, qi) in q.iter().enumerate() {
            let s: Vec<(usize, f64)> = (0..n)
                .filter(|&j| visits(i, j))
                .map(|j| {
                    let x = logits.scale * qi.iter().zip(&k[j]).map(|(a, b)| a * b).sum::<f64>();
                    (j, logits.softcap.map_or(x, |c| c * (x / c).tanh()))
                })
                .collect();
            let m = s
                .iter()
                .fold(logits.sink.unwrap_or(f64::NEG_INFINITY), |m, &(_, x)| {
                    m.max(x)
                });
            let real: f64 = s.iter().map(|&(_, x)| (x - m).exp()).sum();
            let z = real + logits.sink.map_or(0.0, |sink| (sink - m).exp());
            want.push(
                (0..5)
                    .map(|c| s.iter().map(|&(j, x)| (x - m).exp() * v[j][c]).sum::<f64>() / z)
                    .collect::<Vec<f64>>(),
            );
            want_log.push(m + real.ln());
        }
        for host in [true, false] {
            for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-5)] {
                let got = key_set_softmax_paths(
                    &tensor(&q, dtype),
                    &tensor(&k, dtype),
                    &tensor(&v, dtype),
                    &groups,
                    Some(&filter),
                    true,
                    logits,
                    host,
                )
                .unwrap();
                let e = max_rel(&to_rows(&got.output), &want);
                assert!(e < tol, "{logits:?} host {host} {dtype:?}: {e}");
                let log: Vec<f64> = got
                    .log_normalizer
                    .unwrap()
                    .to_dtype(DType::F64)
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                for i in 0..n {
                    assert!((log[i] - want_log[i]).abs() < 1e3 * tol, "row {i}");
                }
            }
        }
    }
}
