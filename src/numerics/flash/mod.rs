//! Exact softmax attention in one fused pass per query block (issue 33), on the host: the
//! online-softmax ("flash") form. For a block of query rows and each tile of keys in order:
//!
//!   S = Q̃_b K_cᵀ (Q̃ = Q/√p),  m' = max(m, max_j S_ij),  E = exp(S − m'),
//!   ℓ ← ℓ·exp(m − m') + Σ_j E_ij (in f64),  acc ← acc·exp(m − m') + E·V_c,
//!
//! and at the end O = acc/ℓ and log D = m + ln ℓ. The score tile lives in the block's own scratch
//! (a few hundred kB, in cache) and is never written to memory as an n×n matrix; tiles wholly past
//! the causal diagonal (or before a sliding window) are skipped, not masked.
//!
//! Determinism: a block's arithmetic is fixed (tile sizes are constants, the products run on one
//! thread through `gemm` with no parallelism of their own, the reductions have a fixed number of
//! lanes), and blocks are independent, so the bits do not depend on the thread count. The products
//! are `gemm`'s microkernels (the crate candle's CPU matmul uses).
//!
//! Rows that meet a NaN or +∞ logit come out NaN (as the two-pass kernel made them), so they are
//! counted as non-finite downstream rather than hidden.

mod float;
pub mod tiles;

use anyhow::Result;
use candle_core::{DType, Tensor};
use float::max_and_poison;
pub use float::FlashFloat;
use rayon::prelude::*;
use tiles as flash_tiles;

/// Query rows per block: the unit of parallel work.
/// (Tuned at n = 8192, p = 64 on the 2-core build machine: 128 × 256 took 0.77 of the two-pass
/// kernel's time, 64 × 256 0.86, 128 × 128 0.78, 256 × 256 1.1; BENCHMARKS.md.)
pub const QUERY_BLOCK: usize = 128;
/// Keys per tile: S is QUERY_BLOCK × KEY_TILE (128 kB in f32, in L2).
pub const KEY_TILE: usize = 256;

/// Which keys a query row sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visible {
    /// Every key.
    All,
    /// Keys j ≤ i, and with a sliding window W also j > i − W.
    Causal { window: Option<usize> },
}

impl Visible {
    /// The keys [lo, hi) any row of [r0, r1) sees.
    fn span(self, r0: usize, r1: usize, nk: usize) -> (usize, usize) {
        match self {
            Visible::All => (0, nk),
            Visible::Causal { window } => {
                let lo = window.map_or(0, |w| (r0 + 1).saturating_sub(w));
                (lo, r1.min(nk))
            }
        }
    }

    /// Whether row i sees key j.
    #[inline(always)]
    fn sees(self, i: usize, j: usize) -> bool {
        match self {
            Visible::All => true,
            Visible::Causal { window } => j <= i && window.is_none_or(|w| j + w > i),
        }
    }
}

/// One query block's scratch.
struct Scratch<T> {
    s: Vec<T>,
    /// The f32 microkernels' row statistics of the current tile.
    lanes: flash_tiles::LaneStats,
    acc: Vec<T>,
    m: Vec<T>,
    l: Vec<f64>,
    bad: Vec<bool>,
}

impl<T: FlashFloat> Scratch<T> {
    fn new(pv: usize) -> Self {
        Self {
            s: vec![T::ZERO; QUERY_BLOCK * KEY_TILE],
            lanes: flash_tiles::LaneStats::new(QUERY_BLOCK),
            acc: vec![T::ZERO; QUERY_BLOCK * pv],
            m: vec![T::NEG_INFINITY; QUERY_BLOCK],
            l: vec![0.0; QUERY_BLOCK],
            bad: vec![false; QUERY_BLOCK],
        }
    }
}

/// One K/V head's operands: keys [nk, p], values [nk, pv], and their packed forms
/// ([`FlashFloat::pack`]; empty where there are none).
struct HeadKv<'a, T> {
    k: &'a [T],
    v: &'a [T],
    kp: &'a [T],
    vp: &'a [T],
    nk: usize,
    p: usize,
    pv: usize,
}

/// Rows r0..r0+rows of one head: `q` the head's scaled queries [n, p], `kv` its K/V head;
/// writes O's rows into `out` ([rows, pv]) and log D into `log_d` ([rows]).
fn query_block<T: FlashFloat>(
    q: &[T],
    kv: &HeadKv<T>,
    r0: usize,
    visible: Visible,
    out: &mut [T],
    log_d: &mut [T],
    sc: &mut Scratch<T>,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { query_block_avx2(q, kv, r0, visible, out, log_d, sc) };
    }
    query_block_body(q, kv, r0, visible, out, log_d, sc)
}

/// The block's row passes compiled for 8-wide vectors (plain multiplies and adds, never FMA:
/// the bits equal the portable build's).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn query_block_avx2<T: FlashFloat>(
    q: &[T],
    kv: &HeadKv<T>,
    r0: usize,
    visible: Visible,
    out: &mut [T],
    log_d: &mut [T],
    sc: &mut Scratch<T>,
) {
    query_block_body(q, kv, r0, visible, out, log_d, sc)
}

#[inline(always)]
fn query_block_body<T: FlashFloat>(
    q: &[T],
    kv: &HeadKv<T>,
    r0: usize,
    visible: Visible,
    out: &mut [T],
    log_d: &mut [T],
    sc: &mut Scratch<T>,
) {
    let HeadKv {
        k,
        v,
        kp,
        vp,
        nk,
        p,
        pv,
    } = *kv;
    let rows = out.len() / pv;
    let r1 = r0 + rows;
    sc.acc[..rows * pv].fill(T::ZERO);
    sc.m[..rows].fill(T::NEG_INFINITY);
    sc.l[..rows].fill(0.0);
    sc.bad[..rows].fill(false);
    let qb = &q[r0 * p..r1 * p];
    let (lo, hi) = visible.span(r0, r1, nk);
    // Tiles start on whole 16-key panels (the packed keys' unit); the keys a sliding window
    // adds below its span are masked like any other invisible key.
    let mut c0 = lo - lo % flash_tiles::NR;
    while c0 < hi {
        let kt = KEY_TILE.min(hi - c0);
        // The score rows' stride: kt rounded up to whole 16-key panels (KEY_TILE is a multiple).
        let ld = kt.div_ceil(flash_tiles::NR) * flash_tiles::NR;
        let s = &mut sc.s[..rows * ld];
        // S = Q̃_b · K_cᵀ.
        // The tile needs a mask where some row does not see some key of it.
        let masked = !(visible.sees(r0, c0 + kt - 1) && visible.sees(r1 - 1, c0));
        let ask = !masked && kt.is_multiple_of(flash_tiles::NR);
        let fused = T::scores(
            qb,
            rows,
            p,
            k,
            kp,
            c0,
            kt,
            s,
            ld,
            ask.then_some(&mut sc.lanes),
        );
        for r in 0..rows {
            let row = &mut s[r * ld..r * ld + kt];
            if masked {
                for (j, x) in row.iter_mut().enumerate() {
                    if !visible.sees(r0 + r, c0 + j) {
                        *x = T::NEG_INFINITY;
                    }
                }
            }
            let (bmax, poisoned) = if fused {
                let (m, bad) = sc.lanes.row(r);
                (T::from_f64(m as f64), bad)
            } else {
                max_and_poison(row)
            };
            sc.bad[r] |= poisoned;
            let m_old = sc.m[r];
            let m_new = if bmax > m_old { bmax } else { m_old };
            if m_new == T::NEG_INFINITY || sc.bad[r] {
                // Nothing visible yet (a window's leading tile), or a poisoned row: no mass.
                row.fill(T::ZERO);
                continue;
            }
            let sum = T::exp_shifted(row, m_new);
            if m_new != m_old {
                // exp(−∞ − m') = 0 on the row's first visible tile.
                let alpha = (m_old - m_new).exp();
                sc.l[r] = sc.l[r] * alpha.to_f64() + sum;
                for x in &mut sc.acc[r * pv..(r + 1) * pv] {
                    *x = *x * alpha;
                }
                sc.m[r] = m_new;
            } else {
                sc.l[r] += sum;
            }
        }
        // acc += E · V_c.
        T::accumulate_values(s, ld, rows, v, vp, c0, kt, pv, &mut sc.acc[..rows * pv]);
        c0 += kt;
    }
    for r in 0..rows {
        let o = &mut out[r * pv..(r + 1) * pv];
        let l = sc.l[r];
        if sc.bad[r] || !(l > 0.0) {
            o.fill(T::NAN);
            log_d[r] = T::NAN;
            continue;
        }
        let inv = 1.0 / l;
        for (x, &a) in o.iter_mut().zip(&sc.acc[r * pv..(r + 1) * pv]) {
            *x = T::from_f64(a.to_f64() * inv);
        }
        log_d[r] = T::from_f64(sc.m[r].to_f64() + l.ln());
    }
}

/// Exact attention of `heads` query heads at once: `q` [H, n, p] already scaled by 1/√p, `k`
/// [H_kv, nk, p] and `v` [H_kv, nk, p_v] (query head h reads K/V head ⌊h·H_kv/H⌋; p_v is
/// usually p). Returns O [H, n, p_v] and log D [H, n]. Blocks of [`QUERY_BLOCK`] rows of every head run in parallel on rayon's pool; the
/// result does not depend on the thread count.
pub fn attention<T: FlashFloat>(
    q: &[T],
    k: &[T],
    v: &[T],
    heads: usize,
    kv_heads: usize,
    p: usize,
    visible: Visible,
) -> (Vec<T>, Vec<T>) {
    assert!(heads > 0 && kv_heads > 0 && heads.is_multiple_of(kv_heads) && p > 0);
    let n = q.len() / (heads * p);
    let nk = k.len() / (kv_heads * p);
    assert_eq!(q.len(), heads * n * p);
    assert_eq!(k.len(), kv_heads * nk * p);
    let pv = v.len() / (kv_heads * nk).max(1);
    assert_eq!(v.len(), kv_heads * nk * pv);
    if n == 0 || pv == 0 {
        return (vec![T::ZERO; heads * n * pv], vec![T::ZERO; heads * n]);
    }
    let mut out = vec![T::ZERO; heads * n * pv];
    let mut log_d = vec![T::ZERO; heads * n];
    let blocks_per_head = n.div_ceil(QUERY_BLOCK);
    // (head, block) jobs over disjoint output rows.
    let mut jobs: Vec<(usize, usize, &mut [T], &mut [T])> =
        Vec::with_capacity(heads * blocks_per_head);
    for (h, (o_head, d_head)) in out
        .chunks_mut((n * pv).max(1))
        .zip(log_d.chunks_mut(n.max(1)))
        .enumerate()
    {
        for (b, (o, d)) in o_head
            .chunks_mut(QUERY_BLOCK * pv)
            .zip(d_head.chunks_mut(QUERY_BLOCK))
            .enumerate()
        {
            jobs.push((h, b * QUERY_BLOCK, o, d));
        }
    }
    // Causal blocks near the end cost the most: hand them out first.
    if matches!(visible, Visible::Causal { .. }) {
        jobs.reverse();
    }
    // Each K/V head packed once for all its query blocks.
    let packed: Vec<(Vec<T>, Vec<T>)> = (0..kv_heads)
        .into_par_iter()
        .map(|g| {
            T::pack(
                &k[g * nk * p..(g + 1) * nk * p],
                &v[g * nk * pv..(g + 1) * nk * pv],
                nk,
                p,
                pv,
            )
        })
        .collect();
    jobs.into_par_iter().for_each_init(
        || Scratch::new(pv),
        |sc, (h, r0, o, d)| {
            let g = h * kv_heads / heads;
            let kv = HeadKv {
                k: &k[g * nk * p..(g + 1) * nk * p],
                v: &v[g * nk * pv..(g + 1) * nk * pv],
                kp: &packed[g].0,
                vp: &packed[g].1,
                nk,
                p,
                pv,
            };
            query_block(&q[h * n * p..(h + 1) * n * p], &kv, r0, visible, o, d, sc);
        },
    );
    (out, log_d)
}

/// [`attention`] on host tensors in f32 or f64: `qs` scaled queries ([n, p] or [H, n, p]), `k`
/// and `v` ([nk, p] or [H_kv, nk, p], converted to `qs`'s dtype); returns O [H, n, p] and log D
/// [H, n] (H = 1 for 2-D inputs), or None on a non-CPU device or in another dtype (the caller
/// then takes its device-generic path).
pub fn on_host(
    qs: &Tensor,
    k: &Tensor,
    v: &Tensor,
    visible: Visible,
) -> Result<Option<(Tensor, Tensor)>> {
    let dtype = qs.dtype();
    if !qs.device().is_cpu() || !matches!(dtype, DType::F32 | DType::F64) {
        return Ok(None);
    }
    let three = |t: &Tensor| -> Result<Tensor> {
        let t = t.to_dtype(dtype)?;
        Ok(if t.rank() == 2 { t.unsqueeze(0)? } else { t })
    };
    let (qs, k, v) = (three(qs)?, three(k)?, three(v)?);
    let (h, n, p) = qs.dims3()?;
    let hkv = k.dim(0)?;
    if k.dim(0)? != v.dim(0)?
        || k.dim(1)? != v.dim(1)?
        || k.dim(2)? != p
        || hkv == 0
        || !h.is_multiple_of(hkv)
    {
        anyhow::bail!(
            "exact attention: q {:?}, k {:?}, v {:?} do not fit (K/V heads must divide the query heads)",
            qs.dims(),
            k.dims(),
            v.dims()
        );
    }
    let dev = qs.device();
    fn run<T: FlashFloat + candle_core::WithDType>(
        qs: &Tensor,
        k: &Tensor,
        v: &Tensor,
        (h, hkv, n, p, pv): (usize, usize, usize, usize, usize),
        visible: Visible,
        dev: &candle_core::Device,
    ) -> Result<(Tensor, Tensor)> {
        use crate::tensor_util::with_host_slice;
        let (o, d) = with_host_slice::<T, _>(qs, |q| {
            with_host_slice::<T, _>(k, |k| {
                with_host_slice::<T, _>(v, |v| Ok(attention::<T>(q, k, v, h, hkv, p, visible)))
            })
        })?;
        Ok((
            Tensor::from_vec(o, (h, n, pv), dev)?,
            Tensor::from_vec(d, (h, n), dev)?,
        ))
    }
    let dims = (h, hkv, n, p, v.dim(2)?);
    Ok(Some(match dtype {
        DType::F32 => run::<f32>(&qs, &k, &v, dims, visible, dev)?,
        _ => run::<f64>(&qs, &k, &v, dims, visible, dev)?,
    }))
}

/// O [H, n, p] of the fused kernel on a CUDA device ([`crate::numerics::cuda::attention`]) for
/// `qs` scaled queries [H, n, p] and `k`, `v` [H_kv, n, p] in the same dtype, or None where it
/// does not apply (the host, a build without `cuda`, a dtype or head size it has no kernel for,
/// or `APPROX_BENCH_CUDA_KERNELS=0`): the caller then takes its device-generic path.
pub fn on_device(qs: &Tensor, k: &Tensor, v: &Tensor, visible: Visible) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    return crate::numerics::cuda::attention::on_device(qs, k, v, visible);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (qs, k, v, visible);
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::sampling::{normal_values, TrialRng};
    use rand::SeedableRng;

    /// Float64 reference: softmax rows of the visible keys, two passes.
    fn reference(
        q: &[f64],
        k: &[f64],
        v: &[f64],
        n: usize,
        nk: usize,
        p: usize,
        vis: Visible,
    ) -> (Vec<f64>, Vec<f64>) {
        let mut o = vec![0.0; n * p];
        let mut ld = vec![0.0; n];
        for i in 0..n {
            let s: Vec<f64> = (0..nk)
                .map(|j| {
                    if vis.sees(i, j) {
                        (0..p).map(|c| q[i * p + c] * k[j * p + c]).sum()
                    } else {
                        f64::NEG_INFINITY
                    }
                })
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for c in 0..p {
                o[i * p + c] = (0..nk).map(|j| e[j] * v[j * p + c]).sum::<f64>() / z;
            }
            ld[i] = m + z.ln();
        }
        (o, ld)
    }

    #[test]
    fn agrees_with_float64_for_every_mask_and_ragged_sizes() {
        let mut rng = TrialRng::seed_from_u64(3);
        let p = 16;
        for (n, vis) in [
            (1, Visible::All),
            (300, Visible::All),
            (300, Visible::Causal { window: None }),
            (577, Visible::Causal { window: None }),
            (577, Visible::Causal { window: Some(100) }),
            (64, Visible::Causal { window: Some(1) }),
        ] {
            let q = normal_values(&mut rng, n, p, 0.7);
            let k = normal_values(&mut rng, n, p, 0.7);
            let v = normal_values(&mut rng, n, p, 1.0);
            let (want, want_ld) = reference(&q, &k, &v, n, n, p, vis);
            let (got, got_ld) = attention(&q, &k, &v, 1, 1, p, vis);
            for (a, b) in got.iter().zip(&want).chain(got_ld.iter().zip(&want_ld)) {
                assert!(
                    (a - b).abs() <= 1e-12 * (1.0 + b.abs()),
                    "{vis:?} n={n}: {a} vs {b}"
                );
            }
            let f = |x: &[f64]| x.iter().map(|&y| y as f32).collect::<Vec<f32>>();
            let (got32, _) = attention(&f(&q), &f(&k), &f(&v), 1, 1, p, vis);
            let scale = want.iter().fold(0f64, |a, b| a.max(b.abs()));
            for (a, b) in got32.iter().zip(&want) {
                assert!(
                    (*a as f64 - b).abs() <= 2e-6 * scale,
                    "f32 {vis:?} n={n}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn grouped_heads_read_their_kv_head_and_a_nan_logit_poisons_only_its_row() {
        let mut rng = TrialRng::seed_from_u64(9);
        let (n, p, h, hkv) = (130, 8, 4, 2);
        let q = normal_values(&mut rng, h * n, p, 1.0);
        let k = normal_values(&mut rng, hkv * n, p, 1.0);
        let v = normal_values(&mut rng, hkv * n, p, 1.0);
        let vis = Visible::Causal { window: None };
        let (all, _) = attention(&q, &k, &v, h, hkv, p, vis);
        for head in 0..h {
            let kv = head * hkv / h;
            let (one, _) = attention(
                &q[head * n * p..(head + 1) * n * p],
                &k[kv * n * p..(kv + 1) * n * p],
                &v[kv * n * p..(kv + 1) * n * p],
                1,
                1,
                p,
                vis,
            );
            assert!(one == all[head * n * p..(head + 1) * n * p], "head {head}");
        }
        let mut k2 = k.clone();
        k2[5 * p] = f64::NAN; // key 5 of K/V head 0: rows ≥ 5 of heads 0, 1 see it
        let (bad, _) = attention(&q, &k2, &v, h, hkv, p, vis);
        assert!(bad[..5 * p].iter().all(|x| x.is_finite()));
        assert!(bad[5 * p..6 * p].iter().all(|x| x.is_nan()));
        assert!(
            bad[2 * n * p..].iter().all(|x| x.is_finite()),
            "heads 2, 3 read K/V head 1"
        );
    }

    #[test]
    fn the_bits_do_not_depend_on_the_thread_count() {
        let mut rng = TrialRng::seed_from_u64(11);
        let (n, p) = (1000, 32);
        let q: Vec<f32> = normal_values(&mut rng, n, p, 0.5)
            .iter()
            .map(|&x| x as f32)
            .collect();
        let k: Vec<f32> = normal_values(&mut rng, n, p, 0.5)
            .iter()
            .map(|&x| x as f32)
            .collect();
        let v: Vec<f32> = normal_values(&mut rng, n, p, 1.0)
            .iter()
            .map(|&x| x as f32)
            .collect();
        let run = |threads: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| attention(&q, &k, &v, 1, 1, p, Visible::Causal { window: None }))
        };
        let one = run(1);
        for t in [2, 8] {
            let other = run(t);
            assert!(
                one.0
                    .iter()
                    .zip(&other.0)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{t} threads"
            );
            assert!(one
                .1
                .iter()
                .zip(&other.1)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }
}
