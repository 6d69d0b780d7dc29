//! Locality-sensitive hashing and bucket sorting, shared by the hashing methods (Reformer §6.1.4,
//! and the sortLSH of Scatterbrain / HyperAttention / KDEformer §6.2.2, §6.3.0).
//!
//! - Angular LSH (Andoni et al. 2015, as Reformer uses it, Kitaev et al. ICLR 2020 §2 "Hashing
//!   attention"): with R ∈ ℝ^{p×nb/2} iid N(0, 1), h(x) = argmax over the nb entries of
//!   [xR, −xR] (first index on ties). Normalising x first does not move the argmax, so it is
//!   skipped; a zero vector lands in bucket 0 (every entry ties at 0).
//! - Sign bits (SimHash, the hash of HyperAttention Alg. 1): h(x) = Σ_t 2^t·[x·ω_t > 0].
//! - A stable bucket sort: positions ordered by (bucket, index), the order every method then
//!   cuts into chunks or blocks.
//!
//! The projections xR run on the tensor's device; the per-row argmax comes back to the host
//! (n small integers), where the tie rule is explicit.

use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};

use crate::numerics::sampling::{normal_values, TrialRng};

/// Random rotations R ∈ ℝ^{p × nb/2} of an angular hash with `buckets` = nb buckets.
pub struct AngularLsh {
    rotations: Tensor,
    buckets: usize,
}

impl AngularLsh {
    /// Draws R (p·nb/2 standard normals, row-major) from `rng`; nb must be even and ≥ 2.
    pub fn draw(
        rng: &mut TrialRng,
        p: usize,
        buckets: usize,
        dtype: DType,
        device: &candle_core::Device,
    ) -> Result<Self> {
        ensure!(
            buckets >= 2 && buckets.is_multiple_of(2),
            "angular LSH needs an even number of buckets ≥ 2, got {buckets}"
        );
        let half = buckets / 2;
        let r = Tensor::from_vec(normal_values(rng, p, half, 1.0), (p, half), device)?;
        Ok(Self {
            rotations: r.to_dtype(dtype)?,
            buckets,
        })
    }

    /// Uses the given rotations ([p, nb/2]).
    pub fn from_rotations(rotations: Tensor) -> Result<Self> {
        let (_, half) = rotations.dims2()?;
        ensure!(half >= 1, "angular LSH needs at least one rotation column");
        Ok(Self {
            rotations,
            buckets: 2 * half,
        })
    }

    pub fn buckets(&self) -> usize {
        self.buckets
    }

    /// h(x_i) for every row of x ([n, p]).
    pub fn hash(&self, x: &Tensor) -> Result<Vec<usize>> {
        let proj = x.matmul(&self.rotations.to_dtype(x.dtype())?)?; // [n, nb/2]
        let rows: Vec<Vec<f64>> = proj.to_dtype(DType::F64)?.to_vec2()?;
        Ok(rows.iter().map(|r| angular_argmax(r)).collect())
    }
}

/// argmax over [r, −r] (length 2·len), the first index on ties; NaN entries never win.
pub fn angular_argmax(r: &[f64]) -> usize {
    let (mut best, mut at) = (f64::NEG_INFINITY, 0);
    for (t, &x) in r.iter().enumerate() {
        if x > best {
            (best, at) = (x, t);
        }
    }
    // The negated half comes second: it wins only strictly.
    for (t, &x) in r.iter().enumerate() {
        if -x > best {
            (best, at) = (-x, r.len() + t);
        }
    }
    at
}

/// Sign-bit hash h(x_i) = Σ_t 2^t·[x_i·ω_t > 0] for ω_t the columns of `omega` ([p, r], r ≤ 32);
/// x·ω_t = 0 gives bit 0.
pub fn sign_bit_hash(x: &Tensor, omega: &Tensor) -> Result<Vec<usize>> {
    let bits = omega.dims2()?.1;
    ensure!(bits <= 32, "sign-bit hash: {bits} bits is more than 32");
    let proj: Vec<Vec<f64>> = x
        .matmul(&omega.to_dtype(x.dtype())?)?
        .to_dtype(DType::F64)?
        .to_vec2()?;
    Ok(proj
        .iter()
        .map(|r| {
            r.iter()
                .enumerate()
                .map(|(t, &y)| usize::from(y > 0.0) << t)
                .sum()
        })
        .collect())
}

/// The positions 0..n ordered by (bucket, position): a stable counting sort, O(n + buckets).
/// Errors if a bucket id is ≥ `buckets`.
pub fn sort_by_bucket(bucket: &[usize], buckets: usize) -> Result<Vec<usize>> {
    let mut start = vec![0usize; buckets + 1];
    for &b in bucket {
        ensure!(b < buckets, "bucket {b} out of range (nb = {buckets})");
        start[b + 1] += 1;
    }
    for t in 0..buckets {
        start[t + 1] += start[t];
    }
    let mut order = vec![0; bucket.len()];
    for (i, &b) in bucket.iter().enumerate() {
        order[start[b]] = i;
        start[b] += 1;
    }
    Ok(order)
}

/// The inverse of a permutation: rank[order[r]] = r.
pub fn ranks(order: &[usize]) -> Vec<usize> {
    let mut rank = vec![0; order.len()];
    for (r, &i) in order.iter().enumerate() {
        rank[i] = r;
    }
    rank
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use rand::SeedableRng;

    /// An [n, p] f64 CPU tensor of seeded standard normals.
    fn gaussian(n: usize, p: usize, seed: u64) -> Tensor {
        let vals = normal_values(&mut TrialRng::seed_from_u64(seed), n, p, 1.0);
        Tensor::from_vec(vals, (n, p), &Device::Cpu).unwrap()
    }

    #[test]
    fn angular_argmax_picks_the_signed_maximum_and_breaks_ties_to_the_first_index() {
        assert_eq!(angular_argmax(&[0.1, 0.5, -0.2]), 1);
        assert_eq!(angular_argmax(&[0.1, 0.5, -0.7]), 3 + 2); // −(−0.7) wins, in the negated half
        assert_eq!(angular_argmax(&[0.5, 0.5]), 0);
        assert_eq!(angular_argmax(&[-0.5, 0.5]), 1); // +0.5 at 1 ties −(−0.5) at 2: first wins
        assert_eq!(angular_argmax(&[0.0, 0.0, 0.0]), 0); // the zero vector: bucket 0
        assert_eq!(angular_argmax(&[f64::NAN, -1.0]), 3);
    }

    #[test]
    fn hash_is_the_argmax_of_the_projection_and_ignores_the_norm() {
        let dev = Device::Cpu;
        let r = Tensor::new(&[[1.0f64, 0.0], [0.0, 1.0], [1.0, -1.0]], &dev).unwrap(); // p = 3, nb = 4
        let lsh = AngularLsh::from_rotations(r).unwrap();
        assert_eq!(lsh.buckets(), 4);
        let x = Tensor::new(
            &[
                [2.0f64, 0.0, 0.0], // xR = [2, 0]          → 0
                [0.0, 3.0, 1.0],    // xR = [1, 2]          → 1
                [-1.0, 0.0, 0.0],   // xR = [−1, 0], −xR = [1, 0] → 2
                [-20.0, 0.0, 0.0],  // the same direction scaled: same bucket
                [0.0, -1.0, 0.5],   // xR = [0.5, −1.5]     → 3
                [0.0, 0.0, 0.0],    // zero → 0
            ],
            &dev,
        )
        .unwrap();
        assert_eq!(lsh.hash(&x).unwrap(), vec![0, 1, 2, 2, 3, 0]);
        // f32 inputs hash through the same rotations.
        let x32 = x.to_dtype(DType::F32).unwrap();
        assert_eq!(lsh.hash(&x32).unwrap(), vec![0, 1, 2, 2, 3, 0]);
    }

    #[test]
    fn drawn_rotations_are_seeded_and_need_an_even_bucket_count() {
        let dev = Device::Cpu;
        let draw = |seed| {
            let lsh = AngularLsh::draw(&mut TrialRng::seed_from_u64(seed), 8, 16, DType::F64, &dev)
                .unwrap();
            let x = gaussian(50, 8, 100);
            (lsh, x)
        };
        let (a, x) = draw(3);
        let (b, _) = draw(3);
        let (c, _) = draw(4);
        assert_eq!(a.hash(&x).unwrap(), b.hash(&x).unwrap());
        assert_ne!(a.hash(&x).unwrap(), c.hash(&x).unwrap());
        assert!(a.hash(&x).unwrap().iter().all(|&h| h < 16));
        let mut rng = TrialRng::seed_from_u64(1);
        assert!(AngularLsh::draw(&mut rng, 8, 7, DType::F64, &dev).is_err());
        assert!(AngularLsh::draw(&mut rng, 8, 0, DType::F64, &dev).is_err());
    }

    #[test]
    fn angular_buckets_are_used_evenly_by_isotropic_data() {
        // Each of the nb buckets is the argmax for a 1/nb share of isotropic directions.
        let dev = Device::Cpu;
        let (n, p, nb) = (20_000, 16, 8);
        let lsh =
            AngularLsh::draw(&mut TrialRng::seed_from_u64(9), p, nb, DType::F64, &dev).unwrap();
        let x = gaussian(n, p, 10);
        let mut counts = vec![0usize; nb];
        for h in lsh.hash(&x).unwrap() {
            counts[h] += 1;
        }
        // Not exactly uniform for a fixed R (its columns have unequal lengths and angles), but
        // every bucket is used and the two halves mirror each other (h and h + nb/2 are ±).
        assert!(counts.iter().all(|&c| c > n / (4 * nb)), "{counts:?}");
        for t in 0..nb / 2 {
            let (a, b) = (counts[t] as f64, counts[t + nb / 2] as f64);
            assert!((a - b).abs() < 5.0 * (a + b).sqrt(), "{counts:?}");
        }
    }

    #[test]
    fn sign_bits() {
        let dev = Device::Cpu;
        let om = Tensor::new(&[[1.0f64, 0.0, 1.0], [0.0, 1.0, 1.0]], &dev).unwrap(); // p = 2, r = 3
        let x = Tensor::new(&[[1.0f64, 1.0], [-1.0, 2.0], [0.0, 0.0], [1.0, -1.0]], &dev).unwrap();
        // x·ω = [1, 1, 2] → 7; [−1, 2, 1] → 2 + 4; zero → 0; [1, −1, 0] → 1 (0 is bit 0).
        assert_eq!(sign_bit_hash(&x, &om).unwrap(), vec![7, 6, 0, 1]);
    }

    #[test]
    fn bucket_sort_is_stable_and_ranks_invert_it() {
        let b = [2, 0, 2, 1, 0, 2];
        let order = sort_by_bucket(&b, 3).unwrap();
        assert_eq!(order, vec![1, 4, 3, 0, 2, 5]);
        let rank = ranks(&order);
        for (r, &i) in order.iter().enumerate() {
            assert_eq!(rank[i], r);
        }
        // Against a stable comparison sort on random buckets.
        let mut rng = TrialRng::seed_from_u64(2);
        let b = crate::numerics::sampling::uniform_with_replacement(&mut rng, 7, 500);
        let mut want: Vec<usize> = (0..500).collect();
        want.sort_by_key(|&i| (b[i], i));
        assert_eq!(sort_by_bucket(&b, 7).unwrap(), want);
        assert!(sort_by_bucket(&[0, 3], 3).is_err());
    }
}
