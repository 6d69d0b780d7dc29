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

use super::flash_tiles;
use anyhow::Result;
use candle_core::{DType, Tensor};
use rayon::prelude::*;

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

/// The element types the kernel runs in.
pub trait FlashFloat:
    Copy
    + Send
    + Sync
    + PartialOrd
    + 'static
    + std::ops::Mul<Output = Self>
    + std::ops::Sub<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    const INFINITY: Self;
    const NAN: Self;
    fn to_f64(self) -> f64;
    fn from_f64(x: f64) -> Self;
    fn is_finite(self) -> bool;
    fn exp(self) -> Self;
    /// row ← exp(row − m) in place (m finite), returning Σ row in f64.
    fn exp_shifted(row: &mut [Self], m: Self) -> f64;

    /// One K/V head's keys [nk, p] and values [nk, pv] packed for [`Self::scores`] and
    /// [`Self::accumulate_values`]; empty where the type has no packed kernel.
    fn pack(_k: &[Self], _v: &[Self], _nk: usize, _p: usize, _pv: usize) -> (Vec<Self>, Vec<Self>) {
        (Vec::new(), Vec::new())
    }

    /// s (row stride ld ≥ 16·⌈kt/16⌉) ← Q̃_b K_cᵀ for `rows` query rows `qb` [rows, p] and keys
    /// c0..c0 + kt of the head's `k` [nk, p] (`kp` its packed form, or empty). Returns whether
    /// it also filled `stats` (each row's maximum and poison, asked for only where they are
    /// the tile's: kt a multiple of 16 and no key masked).
    #[allow(clippy::too_many_arguments)]
    fn scores(
        qb: &[Self],
        rows: usize,
        p: usize,
        k: &[Self],
        _kp: &[Self],
        c0: usize,
        kt: usize,
        s: &mut [Self],
        ld: usize,
        _stats: Option<&mut flash_tiles::LaneStats>,
    ) -> bool {
        // K_c is [kt, p] row-major, so K_cᵀ has row stride 1, column stride p.
        gemm_into(rows, kt, p, s, ld, false, qb, p, 1, &k[c0 * p..], 1, p);
        false
    }

    /// acc [rows, pv] += E V_c for E [rows, kt] (row stride ld) and rows c0..c0 + kt of the
    /// head's `v` [nk, pv] (`vp` its packed form, or empty).
    #[allow(clippy::too_many_arguments)]
    fn accumulate_values(
        e: &[Self],
        ld: usize,
        rows: usize,
        v: &[Self],
        _vp: &[Self],
        c0: usize,
        kt: usize,
        pv: usize,
        acc: &mut [Self],
    ) {
        gemm_into(rows, pv, kt, acc, pv, true, e, ld, 1, &v[c0 * pv..], pv, 1);
    }
}

/// Lanes of the partial sums (fixed, so that ℓ's bits do not depend on the CPU).
const LANES: usize = 8;

#[inline(always)]
fn lane_sum<T: FlashFloat>(row: &[T]) -> f64 {
    let mut acc = [0f64; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            acc[i] += c[i].to_f64();
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|x| x.to_f64()).sum();
    acc.iter().sum::<f64>() + tail
}

impl FlashFloat for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f32::NEG_INFINITY;
    const INFINITY: Self = f32::INFINITY;
    const NAN: Self = f32::NAN;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn is_finite(self) -> bool {
        f32::is_finite(self)
    }
    fn exp(self) -> Self {
        super::shifted_exp::exp_f32(self)
    }
    fn exp_shifted(row: &mut [Self], m: Self) -> f64 {
        #[cfg(target_arch = "x86_64")]
        if flash_tiles::available() {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            return unsafe { flash_tiles::exp_shifted(row, m) };
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { exp_shifted_f32_avx2(row, m) };
        }
        exp_shifted_f32(row, m)
    }
    fn pack(k: &[Self], v: &[Self], nk: usize, p: usize, pv: usize) -> (Vec<Self>, Vec<Self>) {
        if !flash_tiles::available() {
            return (Vec::new(), Vec::new());
        }
        let vp = if pv.is_multiple_of(flash_tiles::NR) {
            flash_tiles::pack_values(v, nk, pv)
        } else {
            Vec::new()
        };
        (flash_tiles::pack_keys(k, nk, p), vp)
    }
    fn scores(
        qb: &[Self],
        rows: usize,
        p: usize,
        k: &[Self],
        kp: &[Self],
        c0: usize,
        kt: usize,
        s: &mut [Self],
        ld: usize,
        stats: Option<&mut flash_tiles::LaneStats>,
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        if !kp.is_empty() {
            let filled = stats.is_some();
            // SAFETY: `kp` is non-empty only where the CPU has AVX2 and FMA (`pack`); it holds
            // every panel of the head, c0 is a multiple of 16 (query_block_body aligns the
            // spans), s holds rows · ld with ld ≥ the panels' width, and the stats QUERY_BLOCK
            // rows.
            unsafe { flash_tiles::scores(qb, rows, p, kp, c0, kt, s, ld, stats) };
            return filled;
        }
        let _ = stats;
        gemm_into(rows, kt, p, s, ld, false, qb, p, 1, &k[c0 * p..], 1, p);
        false
    }
    fn accumulate_values(
        e: &[Self],
        ld: usize,
        rows: usize,
        v: &[Self],
        vp: &[Self],
        c0: usize,
        kt: usize,
        pv: usize,
        acc: &mut [Self],
    ) {
        #[cfg(target_arch = "x86_64")]
        if !vp.is_empty() {
            // SAFETY: as above; `vp` is the head's nk · pv values packed (pv a multiple of 16).
            let nk = v.len() / pv;
            return unsafe { flash_tiles::accumulate_values(e, ld, rows, vp, nk, c0, kt, pv, acc) };
        }
        gemm_into(rows, pv, kt, acc, pv, true, e, ld, 1, &v[c0 * pv..], pv, 1);
    }
}

#[inline(always)]
fn exp_shifted_f32(row: &mut [f32], m: f32) -> f64 {
    for x in row.iter_mut() {
        *x = super::shifted_exp::exp_f32(*x - m);
    }
    lane_sum(row)
}

/// The same arithmetic compiled for 8-wide vectors (plain multiplies and adds: Rust never
/// contracts them into FMA, so the bits equal the portable build's).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn exp_shifted_f32_avx2(row: &mut [f32], m: f32) -> f64 {
    exp_shifted_f32(row, m)
}

impl FlashFloat for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f64::NEG_INFINITY;
    const INFINITY: Self = f64::INFINITY;
    const NAN: Self = f64::NAN;
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(x: f64) -> Self {
        x
    }
    fn is_finite(self) -> bool {
        f64::is_finite(self)
    }
    fn exp(self) -> Self {
        f64::exp(self)
    }
    fn exp_shifted(row: &mut [Self], m: Self) -> f64 {
        for x in row.iter_mut() {
            *x = (*x - m).exp();
        }
        lane_sum(row)
    }
}

/// The row's maximum and whether it holds NaN or +∞ (which poison the row), in [`LANES`]
/// independent lanes so that it vectorises.
#[inline(always)]
fn max_and_poison<T: FlashFloat>(row: &[T]) -> (T, bool) {
    let mut lane_max = [T::NEG_INFINITY; LANES];
    let mut lane_bad = [false; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            let x = c[i];
            // NaN or +∞: not below +∞.
            lane_bad[i] |= !(x < T::INFINITY);
            lane_max[i] = if x > lane_max[i] { x } else { lane_max[i] };
        }
    }
    let mut max = T::NEG_INFINITY;
    let mut bad = lane_bad.iter().any(|&b| b);
    for &x in chunks.remainder().iter().chain(lane_max.iter()) {
        bad |= !(x < T::INFINITY);
        max = if x > max { x } else { max };
    }
    (max, bad)
}

/// dst (m×n, row stride `dst_rs`) ← [dst +] lhs (m×k) · rhs (k×n), strides in elements, on the
/// calling thread.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn gemm_into<T: FlashFloat>(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [T],
    dst_rs: usize,
    accumulate: bool,
    lhs: &[T],
    lhs_rs: usize,
    lhs_cs: usize,
    rhs: &[T],
    rhs_rs: usize,
    rhs_cs: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    debug_assert!(dst.len() >= (m - 1) * dst_rs + n);
    debug_assert!(lhs.len() >= (m - 1) * lhs_rs + (k.max(1) - 1) * lhs_cs + 1 || k == 0);
    debug_assert!(rhs.len() >= (k.max(1) - 1) * rhs_rs + (n - 1) * rhs_cs + 1 || k == 0);
    // SAFETY: the extents are checked above (in debug builds) and by the callers' slicing; the
    // three slices do not overlap (dst is the block's own scratch).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            accumulate,
            lhs.as_ptr(),
            lhs_cs as isize,
            lhs_rs as isize,
            rhs.as_ptr(),
            rhs_cs as isize,
            rhs_rs as isize,
            T::ONE,
            T::ONE,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
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
#[allow(clippy::too_many_arguments)]
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

#[allow(clippy::too_many_arguments)]
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
