//! Exact softmax attention in one fused pass per query block (issue 33), on the host: the
//! online-softmax ("flash") form. For a block of query rows and each tile of keys in order:
//!
//!   S = Q̃_b K_cᵀ (Q̃ = Q/√p),  m' = max(m, max_j S_ij),  E = exp(S − m'),
//!   ℓ ← ℓ·exp(m − m') + Σ_j E_ij (in f64),  acc ← acc·exp(m − m') + E·V_c,
//!
//! and at the end O = acc/ℓ and log D = m + ln ℓ. Two refinements of the logits ([`Logits`], the
//! layer's spec, docs/reference.md §7.7.0): a soft-cap c turns each S_ij into c·tanh(S_ij/c)
//! before the row maximum, and a sink σ_h starts every row of head h with m = σ_h, ℓ = 1 and
//! acc = 0 (the term e^{σ_h − m} of a key whose value is zero), so that its log D includes the
//! sink's term: log D = log(e^{σ_h} + Σ_j e^{S_ij}). The score tile lives in the block's own scratch
//! (a few hundred kB, in cache) and is never written to memory as an n×n matrix; tiles wholly past
//! the causal diagonal (or before a sliding window) are skipped, not masked.
//!
//! Determinism: a block's arithmetic is fixed (tile sizes are constants, the products run on one
//! thread, the reductions have a fixed number of lanes), and blocks are independent, so the bits
//! do not depend on the thread count. The f32 products, exponential and row statistics run on the
//! instruction-set path chosen once per process ([`tiles::Simd::chosen`]: AVX-512, AVX2 or the
//! portable path with `gemm`'s products; `AB_SIMD` forces a lower one); each path is
//! deterministic on its own.
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
pub use tiles::Simd;

use crate::numerics::visible::Visible;

/// Query rows per block: the unit of parallel work.
/// (Tuned at n = 8192, p = 64 on the 2-core build machine: 128 × 256 took 0.77 of the two-pass
/// kernel's time, 64 × 256 0.86, 128 × 128 0.78, 256 × 256 1.1; BENCHMARKS.md.)
pub const QUERY_BLOCK: usize = 128;
/// Keys per tile: S is QUERY_BLOCK × KEY_TILE (128 kB in f32, in L2).
pub const KEY_TILE: usize = 256;

/// The logits beyond the scaled product Q̃Kᵀ: the numerics-level form of a layer's spec (the
/// attention module converts its `AttentionSpec`; numerics never reads it).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Logits<'a> {
    /// c: each logit s becomes c·tanh(s/c) (c > 0).
    pub softcap: Option<f64>,
    /// σ_h, one per query head: a logit in every row's softmax whose value is zero.
    pub sinks: Option<&'a [f64]>,
}

impl Logits<'_> {
    /// Plain scaled products: no cap, no sinks.
    pub const PLAIN: Logits<'static> = Logits {
        softcap: None,
        sinks: None,
    };
}

/// One query head's [`Logits`]: the cap and that head's sink.
#[derive(Debug, Clone, Copy)]
struct HeadLogits {
    softcap: Option<f64>,
    sink: Option<f64>,
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
/// writes O's rows into `out` ([rows, pv]) and log D into `log_d` ([rows]), on path `simd`.
#[allow(clippy::too_many_arguments)]
fn query_block<T: FlashFloat>(
    q: &[T],
    kv: &HeadKv<T>,
    r0: usize,
    visible: Visible,
    logits: HeadLogits,
    out: &mut [T],
    log_d: &mut [T],
    sc: &mut Scratch<T>,
    simd: Simd,
) {
    #[cfg(target_arch = "x86_64")]
    if simd == Simd::Avx512 {
        // SAFETY: the CPU runs the AVX-512 path (attention_with checks it).
        return unsafe { query_block_avx512(q, kv, r0, visible, logits, out, log_d, sc) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        return unsafe { query_block_avx2(q, kv, r0, visible, logits, out, log_d, sc, simd) };
    }
    query_block_body::<T, 8>(q, kv, r0, visible, logits, out, log_d, sc, simd)
}

/// The block's row passes compiled for 16-wide vectors (plain multiplies and adds, never FMA:
/// the bits equal the other paths'), the row maximum in 16 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn query_block_avx512<T: FlashFloat>(
    q: &[T],
    kv: &HeadKv<T>,
    r0: usize,
    visible: Visible,
    logits: HeadLogits,
    out: &mut [T],
    log_d: &mut [T],
    sc: &mut Scratch<T>,
) {
    query_block_body::<T, 16>(q, kv, r0, visible, logits, out, log_d, sc, Simd::Avx512)
}

/// The block's row passes compiled for 8-wide vectors (plain multiplies and adds, never FMA:
/// the bits equal the portable build's).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn query_block_avx2<T: FlashFloat>(
    q: &[T],
    kv: &HeadKv<T>,
    r0: usize,
    visible: Visible,
    logits: HeadLogits,
    out: &mut [T],
    log_d: &mut [T],
    sc: &mut Scratch<T>,
    simd: Simd,
) {
    query_block_body::<T, 8>(q, kv, r0, visible, logits, out, log_d, sc, simd)
}

/// One block on path `simd`, the unfused row maxima in `L` lanes.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn query_block_body<T: FlashFloat, const L: usize>(
    q: &[T],
    kv: &HeadKv<T>,
    r0: usize,
    visible: Visible,
    logits: HeadLogits,
    out: &mut [T],
    log_d: &mut [T],
    sc: &mut Scratch<T>,
    simd: Simd,
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
    // A sink is the row's first term: m = σ, ℓ = e^{σ − σ} = 1, and nothing in acc.
    let (m0, l0) = logits
        .sink
        .map_or((T::NEG_INFINITY, 0.0), |s| (T::from_f64(s), 1.0));
    sc.m[..rows].fill(m0);
    sc.l[..rows].fill(l0);
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
        // The microkernels' row maxima are of the uncapped products: not asked for under a cap.
        let ask = !masked && kt.is_multiple_of(flash_tiles::NR) && logits.softcap.is_none();
        let fused = T::scores(
            simd,
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
            if let Some(c) = logits.softcap {
                // In f64 and one element at a time, so every path gives the same bits; the cap
                // comes before the mask (capping −∞ would give −c). A +∞ product caps to c: only
                // NaN poisons a capped row.
                for x in row.iter_mut() {
                    *x = T::from_f64(c * (x.to_f64() / c).tanh());
                }
            }
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
                max_and_poison::<T, L>(row)
            };
            sc.bad[r] |= poisoned;
            let m_old = sc.m[r];
            let m_new = if bmax > m_old { bmax } else { m_old };
            if m_new == T::NEG_INFINITY || sc.bad[r] {
                // Nothing visible yet (a window's leading tile), or a poisoned row: no mass.
                row.fill(T::ZERO);
                continue;
            }
            let sum = T::exp_shifted(row, m_new, simd);
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
        let acc = &mut sc.acc[..rows * pv];
        T::accumulate_values(simd, s, ld, rows, v, vp, c0, kt, pv, acc);
        c0 += kt;
    }
    for r in 0..rows {
        let o = &mut out[r * pv..(r + 1) * pv];
        let l = sc.l[r];
        // `!(l > 0)` is meant: a NaN ℓ, like 0, leaves the row without mass.
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        let empty = !(l > 0.0);
        if sc.bad[r] || empty {
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

/// Exact attention of `heads` query heads at once: `q` [H, n, p] already scaled by τ (1/√p by
/// default), `k` [H_kv, nk, p] and `v` [H_kv, nk, p_v] (query head h reads K/V head ⌊h·H_kv/H⌋;
/// p_v is usually p), with the rows' `logits` (cap, sinks: one per query head). Returns O
/// [H, n, p_v] and log D [H, n] (with sinks, log D includes the sink's term). Blocks of [`QUERY_BLOCK`] rows of every
/// head run in parallel on rayon's pool; the result does not depend on the thread count. Runs on
/// this process's path ([`Simd::chosen`]).
#[allow(clippy::too_many_arguments)]
pub fn attention<T: FlashFloat>(
    q: &[T],
    k: &[T],
    v: &[T],
    heads: usize,
    kv_heads: usize,
    p: usize,
    visible: Visible,
    logits: Logits,
) -> (Vec<T>, Vec<T>) {
    attention_with(Simd::chosen(), q, k, v, heads, kv_heads, p, visible, logits)
}

/// [`attention`] on the path `simd` (one this CPU runs: a higher one panics rather than run an
/// instruction the CPU lacks). The tests name each path here.
#[allow(clippy::too_many_arguments)]
pub fn attention_with<T: FlashFloat>(
    simd: Simd,
    q: &[T],
    k: &[T],
    v: &[T],
    heads: usize,
    kv_heads: usize,
    p: usize,
    visible: Visible,
    logits: Logits,
) -> (Vec<T>, Vec<T>) {
    assert!(
        simd <= Simd::best(),
        "{simd:?}: this CPU runs at most {:?}",
        Simd::best()
    );
    assert!(heads > 0 && kv_heads > 0 && heads.is_multiple_of(kv_heads) && p > 0);
    assert!(
        logits.sinks.is_none_or(|s| s.len() == heads),
        "one sink per query head"
    );
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
                simd,
            )
        })
        .collect();
    jobs.into_par_iter().for_each_init(
        || Scratch::new(pv),
        |sc, (h, r0, o, d)| {
            let g = super::gqa::kv_head(h, heads, kv_heads);
            let kv = HeadKv {
                k: &k[g * nk * p..(g + 1) * nk * p],
                v: &v[g * nk * pv..(g + 1) * nk * pv],
                kp: &packed[g].0,
                vp: &packed[g].1,
                nk,
                p,
                pv,
            };
            let head_logits = HeadLogits {
                softcap: logits.softcap,
                sink: logits.sinks.map(|s| s[h]),
            };
            query_block(
                &q[h * n * p..(h + 1) * n * p],
                &kv,
                r0,
                visible,
                head_logits,
                o,
                d,
                sc,
                simd,
            );
        },
    );
    (out, log_d)
}

/// [`attention`] on host tensors in f32 or f64: `qs` scaled queries ([n, p] or [H, n, p]), `k`
/// and `v` ([nk, p] or [H_kv, nk, p], converted to `qs`'s dtype), `logits` as there; returns O
/// [H, n, p] and log D [H, n] (H = 1 for 2-D inputs), or None on a non-CPU device or in another dtype (the caller
/// then takes its device-generic path).
pub fn on_host(
    qs: &Tensor,
    k: &Tensor,
    v: &Tensor,
    visible: Visible,
    logits: Logits,
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
        || !super::gqa::groups_fit(h, hkv)
    {
        anyhow::bail!(
            "exact attention: q {:?}, k {:?}, v {:?} do not fit (K/V heads must divide the query heads)",
            qs.dims(),
            k.dims(),
            v.dims()
        );
    }
    if let Some(sinks) = logits.sinks.filter(|s| s.len() != h) {
        anyhow::bail!(
            "exact attention: {} sink logits for {h} query heads (one per query head)",
            sinks.len()
        );
    }
    let dev = qs.device();
    fn run<T: FlashFloat + candle_core::WithDType>(
        qs: &Tensor,
        k: &Tensor,
        v: &Tensor,
        (h, hkv, n, p, pv): (usize, usize, usize, usize, usize),
        visible: Visible,
        logits: Logits,
        dev: &candle_core::Device,
    ) -> Result<(Tensor, Tensor)> {
        use crate::tensor_util::with_host_slice;
        let (o, d) = with_host_slice::<T, _>(qs, |q| {
            with_host_slice::<T, _>(k, |k| {
                with_host_slice::<T, _>(v, |v| {
                    Ok(attention::<T>(q, k, v, h, hkv, p, visible, logits))
                })
            })
        })?;
        Ok((
            Tensor::from_vec(o, (h, n, pv), dev)?,
            Tensor::from_vec(d, (h, n), dev)?,
        ))
    }
    let dims = (h, hkv, n, p, v.dim(2)?);
    Ok(Some(match dtype {
        DType::F32 => run::<f32>(&qs, &k, &v, dims, visible, logits, dev)?,
        _ => run::<f64>(&qs, &k, &v, dims, visible, logits, dev)?,
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
mod tests;
