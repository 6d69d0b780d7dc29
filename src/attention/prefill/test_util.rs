//! What the prefill methods' tests check alike.

use candle_core::{DType, Tensor};

use crate::attention::test_util::{causal, random_head, run_seeded};
use crate::attention::{HeadInputs, Mask, Method};
use crate::numerics::key_sets::tests::max_rel;

/// A causal head whose queries are all zero: every logit ties (s_ij = 0), so exact attention is
/// the prefix mean, a restricted row is uniform on S_i, and every score-based choice falls to
/// the tie rule. K and V are iid N(0, 1).
pub fn tied_head(n: usize, p: usize) -> HeadInputs {
    let h = random_head(n, p, 7, DType::F64);
    let q = h.q.zeros_like().unwrap();
    HeadInputs::masked(q, h.k.clone(), h.v.clone(), Mask::Causal).unwrap()
}

/// The method on `h` (causal) with V = I_n: its weight rows W (Ô = W·I), their supports, the
/// mass it reports (from the head's exact log D) and its realised keys. Every row of W must be a
/// distribution on its support; with a tied head (q = 0) the weights are also uniform there.
pub fn support_and_weights(
    m: &dyn Method,
    h: &HeadInputs,
    d: usize,
) -> (Vec<Vec<usize>>, f64, f64) {
    let n = h.n();
    let eye = Tensor::eye(n, h.dtype(), h.device()).unwrap();
    let hw = HeadInputs::masked(h.q.clone(), h.k.clone(), eye, Mask::Causal).unwrap();
    let got = run_seeded(m, &hw, d, 0);
    let w: Vec<Vec<f64>> = got.output.to_dtype(DType::F64).unwrap().to_vec2().unwrap();
    let tied =
        h.q.abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
            == 0.0;
    let sets: Vec<Vec<usize>> = w
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let s: Vec<usize> = (0..n).filter(|&j| row[j] > 0.0).collect();
            assert!(s.contains(&i), "{}: row {i} misses its own key", m.id());
            assert!(
                s.iter().all(|&j| j <= i),
                "{}: row {i} sees the future",
                m.id()
            );
            let sum: f64 = row.iter().sum();
            assert!(
                (sum - 1.0).abs() < 1e-12,
                "{}: row {i} sums to {sum}",
                m.id()
            );
            if tied {
                for &j in &s {
                    assert!((row[j] * s.len() as f64 - 1.0).abs() < 1e-12);
                }
            }
            s
        })
        .collect();
    let mass = got
        .mass(hw.exact().unwrap().log_rowsum().unwrap())
        .unwrap()
        .unwrap();
    let keys = got.support.as_ref().unwrap().keys;
    (sets, mass, keys)
}

/// At every d of `ds` the method is exact causal attention on a random f64 head of length n
/// (1e-12 relative), with every key visited (keys = (n+1)/2) and mass 1; on the f32 copy it is
/// f32 exact attention to 1e-6.
pub fn assert_covering_is_exact(m: &dyn Method, n: usize, ds: &[usize]) {
    let h = causal(&random_head(n, 16, 11, DType::F64));
    let rows = |t: &Tensor| -> Vec<Vec<f64>> { t.to_dtype(DType::F64).unwrap().to_vec2().unwrap() };
    let exact = rows(&h.exact().unwrap().output);
    for &d in ds {
        let got = run_seeded(m, &h, d, 0);
        let err = max_rel(&rows(&got.output), &exact);
        assert!(err < 1e-12, "{} d = {d}: {err}", m.id());
        let s = got.support.as_ref().unwrap();
        assert_eq!(s.keys, (n + 1) as f64 / 2.0, "{} d = {d}", m.id());
        let mass = got
            .mass(h.exact().unwrap().log_rowsum().unwrap())
            .unwrap()
            .unwrap();
        assert!(
            (mass - 1.0).abs() < 1e-12,
            "{} d = {d}: mass {mass}",
            m.id()
        );
    }
    let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let h32 = HeadInputs::masked(f(&h.q), f(&h.k), f(&h.v), Mask::Causal).unwrap();
    let got = rows(&run_seeded(m, &h32, ds[0], 0).output);
    let err = max_rel(&got, &rows(&h32.exact().unwrap().output));
    assert!(err < 1e-6, "{} f32: {err}", m.id());
}

/// Host f64 rows of q, k of a head, and its logits s_ij = q_i·k_j/√p entry by entry (for the
/// tests' own selections, written from the definitions).
pub fn logits(h: &HeadInputs) -> Vec<Vec<f64>> {
    let [q, k, _] = crate::attention::test_util::host_rows(h);
    crate::attention::test_util::logit_rows(&q, &k)
}

/// Exact causal attention rows P_i (j ≤ i) in f64, from the definition.
pub fn causal_p(h: &HeadInputs) -> Vec<Vec<f64>> {
    logits(h)
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let m = s[..=i].iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s[..=i].iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            let mut row = vec![0.0; s.len()];
            for (j, x) in e.iter().enumerate() {
                row[j] = x / z;
            }
            row
        })
        .collect()
}

/// The indices of the m largest values by a stable sort (ties keep index order), in index order.
pub fn stable_top(values: &[f64], m: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..values.len()).collect();
    idx.sort_by(|&a, &b| values[b].partial_cmp(&values[a]).unwrap());
    idx.truncate(m);
    idx.sort_unstable();
    idx
}

/// n = 48, p = 2, q_i = (1, 0) for every row; page 0's keys are 0 but key 5 = (10, 0), page 1's
/// keys are all (1, 0), page 2's (0, 0); V iid N(0, 1). Quest's bound prefers page 0 (10 > 1),
/// MoBA's mean page 1 (1 > 10/16).
pub fn page_head() -> HeadInputs {
    let n = 48;
    let q: Vec<f64> = (0..n).flat_map(|_| [1.0, 0.0]).collect();
    let k: Vec<f64> = (0..n)
        .flat_map(|j| match j {
            5 => [10.0, 0.0],
            16..=31 => [1.0, 0.0],
            _ => [0.0, 0.0],
        })
        .collect();
    let dev = crate::tensor_util::test_device();
    let t = |x: Vec<f64>| Tensor::from_vec(x, (n, 2), &dev).unwrap();
    let v = random_head(n, 2, 3, DType::F64).v;
    HeadInputs::masked(t(q), t(k), v, Mask::Causal).unwrap()
}

/// `visits(i, j)` of a block pattern: key block ⌊j/16⌋ kept for query block ⌊i/16⌋, and j ≤ i.
pub fn blocks_to_visits(kept: &[Vec<usize>]) -> impl Fn(usize, usize) -> bool + '_ {
    move |i, j| j <= i && kept[i / 16].contains(&(j / 16))
}

/// The `visits(i, j, d)` of [`crate::attention::test_util::assert_causal_restricted`] from sets
/// written out per d: `by_d[k][i][j]` for d = `ds[k]`.
pub fn sets_at<'a>(
    ds: &'a [usize],
    by_d: &'a [Vec<Vec<bool>>],
) -> impl Fn(usize, usize, usize) -> bool + 'a {
    move |i, j, d| by_d[ds.iter().position(|&x| x == d).unwrap()][i][j]
}

/// The page methods' sets (docs/reference.md §7.5.3–7.5.4) from a score of (row i, complete past page t):
/// the own page (keys ≤ i) and the ⌈d/16⌉ − 1 best-scored complete past pages, ties to the lower.
pub fn page_sets_from_scores(
    n: usize,
    d: usize,
    score: impl Fn(usize, usize) -> f64,
) -> Vec<Vec<bool>> {
    let m = d.div_ceil(16) - 1;
    (0..n)
        .map(|i| {
            let own = i / 16;
            let s: Vec<f64> = (0..own).map(|t| score(i, t)).collect();
            let kept = stable_top(&s, m);
            (0..n)
                .map(|j| (j / 16 == own && j <= i) || kept.contains(&(j / 16)))
                .collect()
        })
        .collect()
}

/// A method against its sets written out per d (`sets(d)`), at each d of `ds`.
pub fn assert_equals_its_sets(
    m: &dyn crate::attention::Method,
    h: &crate::attention::HeadInputs,
    ds: &[usize],
    sets: impl Fn(usize) -> Vec<Vec<bool>>,
) {
    let by_d: Vec<Vec<Vec<bool>>> = ds.iter().map(|&d| sets(d)).collect();
    crate::attention::test_util::assert_causal_restricted(m, h, ds, sets_at(ds, &by_d));
}

/// A causal f64 head of `n` rows (p = 16) under a layer's spec with a window of `w`, τ = 0.35, a
/// cap of 2 and a sink of 0.7, from `seed`: what the §7.7.6 tests of the prefill methods run on.
pub fn spec_head(n: usize, w: usize, seed: u64) -> HeadInputs {
    let plain = random_head(n, 16, seed, DType::F64);
    let spec = crate::attention::AttentionSpec::causal(16, Some(w))
        .with_scale(0.35)
        .with_softcap(Some(2.0))
        .with_sinks(Some(vec![0.7]));
    HeadInputs::with_spec(plain.q.clone(), plain.k.clone(), plain.v.clone(), spec).unwrap()
}

/// The head's logit s_ij under its spec, in f64 (τ, the cap).
fn spec_logit(h: &HeadInputs, q: &[Vec<f64>], k: &[Vec<f64>], i: usize, j: usize) -> f64 {
    h.spec
        .logit(q[i].iter().zip(&k[j]).map(|(a, b)| a * b).sum())
}

/// The target's probabilities under the head's spec in f64 by definition: over the keys row i
/// sees, the sink in the denominator, 0 elsewhere.
pub fn spec_p(h: &HeadInputs) -> Vec<Vec<f64>> {
    spec_restricted_weights(h, |i, j| h.spec.sees(i, j))
}

/// Ô of the restricted softmax over `visits(i, j)` ∩ V_i under the head's spec (its logits, the
/// sink in every denominator), in f64 by definition.
pub fn spec_restricted(h: &HeadInputs, visits: impl Fn(usize, usize) -> bool) -> Vec<Vec<f64>> {
    let w = spec_restricted_weights(h, |i, j| visits(i, j) && h.spec.sees(i, j));
    let v: Vec<Vec<f64>> = h.v.to_vec2().unwrap();
    w.iter()
        .map(|row| {
            (0..v[0].len())
                .map(|c| row.iter().zip(&v).map(|(a, vj)| a * vj[c]).sum())
                .collect()
        })
        .collect()
}

fn spec_restricted_weights(h: &HeadInputs, on: impl Fn(usize, usize) -> bool) -> Vec<Vec<f64>> {
    let (q, k): (Vec<Vec<f64>>, Vec<Vec<f64>>) = (h.q.to_vec2().unwrap(), h.k.to_vec2().unwrap());
    let n = q.len();
    let sink = h.spec.sink(0).unwrap_or(f64::NEG_INFINITY);
    (0..n)
        .map(|i| {
            let s: Vec<f64> = (0..n)
                .map(|j| {
                    if on(i, j) {
                        spec_logit(h, &q, &k, i, j)
                    } else {
                        f64::NEG_INFINITY
                    }
                })
                .collect();
            let m = s.iter().fold(sink, |m, &x| m.max(x));
            let z = (sink - m).exp() + s.iter().map(|x| (x - m).exp()).sum::<f64>();
            s.iter().map(|x| (x - m).exp() / z).collect()
        })
        .collect()
}

/// `m`'s Ô on the spec head at d, against [`spec_restricted`] of `visits`, to 1e-10.
pub fn assert_spec_restricted(
    m: &dyn Method,
    h: &HeadInputs,
    d: usize,
    visits: impl Fn(usize, usize) -> bool,
) {
    let want = spec_restricted(h, visits);
    let got: Vec<Vec<f64>> = m
        .approximate(h, d, &mut crate::numerics::sampling::rng_from_seed(1))
        .unwrap()
        .output
        .to_vec2()
        .unwrap();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        for (a, b) in g.iter().zip(w) {
            assert!(
                (a - b).abs() < 1e-10,
                "{} d {d} row {i}: {a} vs {b}",
                m.id()
            );
        }
    }
}
