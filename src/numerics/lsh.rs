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
use std::ops::Neg;

use candle_core::{DType, Tensor};

use crate::numerics::key_sets::KeyGroup;
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

    /// h(x_i) for every row of x ([n, p]). The projection runs on x's device; the argmax comes
    /// back to the host as one pass over the rows in the working precision (f32 or f64): at
    /// d = 8, n = 4096 Reformer's n·nb/2 projections are a quarter of exact attention's n² scores.
    pub fn hash(&self, x: &Tensor) -> Result<Vec<usize>> {
        use rayon::prelude::*;
        let n = x.dims2()?.0;
        let half = self.buckets / 2;
        let r = self.rotations.to_dtype(x.dtype())?;
        // Row blocks of about 256 K projections (1 MB in f32), in parallel: each block's
        // product is scanned while it is still in cache, and the products use every thread
        // (candle's own matmul runs on the calling thread only, see runtime.rs).
        let step = ((1 << 18) / half).clamp(1, n.max(1));
        let starts: Vec<usize> = (0..n).step_by(step).collect();
        let blocks = starts
            .par_iter()
            .map(|&start| -> Result<Vec<usize>> {
                let proj = x.narrow(0, start, step.min(n - start))?.matmul(&r)?;
                Ok(match proj.dtype() {
                    DType::F64 => rows_argmax(&proj.flatten_all()?.to_vec1::<f64>()?, half),
                    _ => rows_argmax(
                        &proj.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?,
                        half,
                    ),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(blocks.concat())
    }
}

fn rows_argmax<T: Copy + PartialOrd + Neg<Output = T> + Send + Sync>(
    flat: &[T],
    half: usize,
) -> Vec<usize> {
    use rayon::prelude::*;
    flat.par_chunks(half)
        .with_min_len(64)
        .map(angular_argmax)
        .collect()
}

/// argmax over [r, −r] (length 2·len), the first index on ties; NaN entries never win (a row
/// of NaN lands in bucket 0). One pass: the largest entry (first on ties) against the most
/// negative one (first on ties), the positive half winning a tie as it comes first.
pub fn angular_argmax<T: Copy + PartialOrd + Neg<Output = T>>(r: &[T]) -> usize {
    let mut hi: Option<(T, usize)> = None;
    let mut lo: Option<(T, usize)> = None;
    for (t, &x) in r.iter().enumerate() {
        // NaN compares false with everything, itself included: it never wins.
        if x.partial_cmp(&x).is_none() {
            continue;
        }
        if hi.is_none_or(|(b, _)| x > b) {
            hi = Some((x, t));
        }
        if lo.is_none_or(|(b, _)| x < b) {
            lo = Some((x, t));
        }
    }
    match (hi, lo) {
        (Some((h, _)), Some((l, tl))) if -l > h => r.len() + tl,
        (Some((_, th)), _) => th,
        _ => 0,
    }
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

/// Hash bits r of sortLSH (docs/reference.md §6.3.0 [REC]: r = 7, both repos' default, independent of n
/// and the block size).
pub const SORT_LSH_BITS: usize = 7;

/// The order in which sortLSH lays out the 2^r sign-bit buckets (§6.3.0 [P≠C] Gray order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketOrder {
    /// The authors' code: sort key g(h) = h ⊕ (h ≫ 1) (`perm[h]`, the Gray *sequence*). Default.
    Code,
    /// The paper: sort key g⁻¹(h) = h ⊕ h≫1 ⊕ h≫2 ⊕ … (the Gray *rank*), so that neighbouring
    /// buckets differ in one bit.
    Paper,
}

/// g(h) = h ⊕ (h ≫ 1).
pub fn gray_code(h: usize) -> usize {
    h ^ (h >> 1)
}

/// g⁻¹(h) = h ⊕ h≫1 ⊕ h≫2 ⊕ … (the position of h in the Gray sequence).
pub fn gray_rank(mut h: usize) -> usize {
    let mut r = h;
    while h > 0 {
        h >>= 1;
        r ^= h;
    }
    r
}

/// sortLSH blocks (HyperAttention Alg. 1; docs/reference.md §6.3.0), computed once per draw of Ω:
/// query i and key j are in blocks β_Q(i) = ⌊pos of i in π_Q / b⌋ and β_K(j) likewise, with
/// π_Q, π_K the stable sorts of the bucket keys κ = g(h) (or g⁻¹(h)) of the sign-bit hashes.
/// The last block is ragged when b ∤ n (no padding, §6.3.0 [REC]); as many keys as queries.
pub struct SortLshBlocks {
    /// β_Q(i) for every query.
    pub q_block: Vec<usize>,
    /// β_K(j) for every key.
    pub k_block: Vec<usize>,
    /// Block t as a key group: query rows π_Q[tb..(t+1)b] with keys π_K[tb..(t+1)b].
    pub groups: Vec<KeyGroup>,
}

/// The sortLSH blocks of size b for Q and K ([n, p] each) under Ω ([p, r], r ≤ 20 bits here:
/// the counting sort has 2^r buckets). Raw q and k are hashed (the hash is scale-free).
pub fn sort_lsh_blocks(
    q: &Tensor,
    k: &Tensor,
    omega: &Tensor,
    b: usize,
    order: BucketOrder,
) -> Result<SortLshBlocks> {
    let n = q.dims2()?.0;
    let bits = omega.dims2()?.1;
    ensure!(
        k.dims2()?.0 == n,
        "sortLSH pairs query and key blocks by rank: it needs as many keys as queries"
    );
    ensure!(b >= 1 && n >= 1, "sortLSH needs b ≥ 1 and n ≥ 1");
    ensure!(bits <= 20, "sortLSH: {bits} hash bits is more than 20");
    let key = |h: usize| match order {
        BucketOrder::Code => gray_code(h),
        BucketOrder::Paper => gray_rank(h),
    };
    let sorted = |x: &Tensor| -> Result<Vec<usize>> {
        let kappa: Vec<usize> = sign_bit_hash(x, omega)?.into_iter().map(key).collect();
        sort_by_bucket(&kappa, 1 << bits)
    };
    let (q_order, k_order) = (sorted(q)?, sorted(k)?);
    let block_of = |order: &[usize]| -> Vec<usize> {
        let mut blk = vec![0; n];
        for (pos, &i) in order.iter().enumerate() {
            blk[i] = pos / b;
        }
        blk
    };
    let groups = (0..n.div_ceil(b))
        .map(|t| {
            let range = t * b..((t + 1) * b).min(n);
            KeyGroup {
                rows: q_order[range.clone()].to_vec(),
                keys: k_order[range].to_vec(),
            }
        })
        .collect();
    Ok(SortLshBlocks {
        q_block: block_of(&q_order),
        k_block: block_of(&k_order),
        groups,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// An [n, p] f64 CPU tensor of seeded standard normals.
    fn gaussian(n: usize, p: usize, seed: u64) -> Tensor {
        let vals = normal_values(&mut TrialRng::seed_from_u64(seed), n, p, 1.0);
        Tensor::from_vec(vals, (n, p), &crate::tensor_util::test_device()).unwrap()
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
        let dev = crate::tensor_util::test_device();
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
        let dev = crate::tensor_util::test_device();
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
        let dev = crate::tensor_util::test_device();
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

    /// The one-pass argmax against the two-pass definition (max over r, then −r strictly).
    #[test]
    fn one_pass_argmax_equals_the_two_pass_definition() {
        let two_pass = |r: &[f64]| {
            let (mut best, mut at) = (f64::NEG_INFINITY, 0);
            for (t, &x) in r.iter().enumerate() {
                if x > best {
                    (best, at) = (x, t);
                }
            }
            for (t, &x) in r.iter().enumerate() {
                if -x > best {
                    (best, at) = (-x, r.len() + t);
                }
            }
            at
        };
        let vals = normal_values(&mut TrialRng::seed_from_u64(5), 2000, 6, 1.0);
        // Rounded to a coarse grid so that ties within and across the halves are common.
        let vals: Vec<f64> = vals.iter().map(|x| (x * 2.0).round() / 2.0).collect();
        for r in vals.chunks(6) {
            assert_eq!(angular_argmax(r), two_pass(r), "{r:?}");
            let r32: Vec<f32> = r.iter().map(|&x| x as f32).collect();
            assert_eq!(angular_argmax(&r32), two_pass(r), "{r:?}");
        }
    }

    #[test]
    fn sign_bits() {
        let dev = crate::tensor_util::test_device();
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

    #[test]
    fn gray_code_and_rank_invert_each_other_and_the_code_order_jumps() {
        for h in 0..128 {
            assert_eq!(gray_rank(gray_code(h)), h);
            assert_eq!(gray_code(gray_rank(h)), h);
        }
        // Paper order: buckets sorted by g⁻¹(h) are the Gray sequence, one bit apart.
        let mut paper: Vec<usize> = (0..128).collect();
        paper.sort_by_key(|&h| gray_rank(h));
        assert!(paper.windows(2).all(|w| (w[0] ^ w[1]).count_ones() == 1));
        // Code order (§6.3.0 [P≠C]): sorted by g(h), neighbours differ by up to 4 bits at r = 7.
        let mut code: Vec<usize> = (0..128).collect();
        code.sort_by_key(|&h| gray_code(h));
        let worst = code.windows(2).map(|w| (w[0] ^ w[1]).count_ones()).max();
        assert_eq!(worst, Some(4));
        // The two orders agree on the top two bits.
        for (a, b) in code.iter().zip(&paper) {
            assert_eq!(a >> 5, b >> 5);
        }
    }

    #[test]
    fn sort_lsh_blocks_pair_sorted_queries_and_keys_by_rank() {
        let (n, p, b) = (50, 6, 8);
        let (q, k) = (gaussian(n, p, 1), gaussian(n, p, 2));
        let omega = gaussian(p, SORT_LSH_BITS, 3);
        let blocks = sort_lsh_blocks(&q, &k, &omega, b, BucketOrder::Code).unwrap();
        // Against a direct stable sort on κ = g(h).
        let kappa = |x: &Tensor| -> Vec<usize> {
            sign_bit_hash(x, &omega)
                .unwrap()
                .into_iter()
                .map(gray_code)
                .collect()
        };
        for (x, blk) in [(&q, &blocks.q_block), (&k, &blocks.k_block)] {
            let kap = kappa(x);
            let mut want: Vec<usize> = (0..n).collect();
            want.sort_by_key(|&i| (kap[i], i));
            for (pos, &i) in want.iter().enumerate() {
                assert_eq!(blk[i], pos / b);
            }
        }
        assert_eq!(blocks.groups.len(), 7); // ⌈50/8⌉, the last ragged with 2 rows and 2 keys
        assert_eq!(blocks.groups[6].rows.len(), 2);
        assert_eq!(blocks.groups[6].keys.len(), 2);
        for (t, g) in blocks.groups.iter().enumerate() {
            assert!(g.rows.iter().all(|&i| blocks.q_block[i] == t));
            assert!(g.keys.iter().all(|&j| blocks.k_block[j] == t));
        }
        // b ≥ n: one block of everything.
        let one = sort_lsh_blocks(&q, &k, &omega, n, BucketOrder::Paper).unwrap();
        assert_eq!(one.groups.len(), 1);
        assert!(sort_lsh_blocks(&q, &gaussian(n + 1, p, 4), &omega, b, BucketOrder::Code).is_err());
    }
}
