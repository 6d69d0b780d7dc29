//! `kivi4`, `kivi2` — KIVI (Liu, Yuan, Jin, Zhong, Xu, Braverman, Chen & Hu, ICML 2024, "KIVI: A
//! Tuning-Free Asymmetric 2bit Quantization for KV Cache"; code `jy-yuan/KIVI`,
//! `models/llama_kivi.py`, `quant/new_pack.py`), the cache's state after a prefill of n tokens
//! (docs/reference.md §8.3):
//!
//! - **K per channel**: each channel's tokens in groups of G = 32 consecutive tokens from token 0,
//!   asymmetric b-bit groups (§8.2); the last n mod R tokens (R = 128, the residual) stay in full
//!   precision.
//! - **V per token**: each token's p channels in groups of 32; the last R tokens (all of V when
//!   n ≤ R) stay in full precision.
//! - Q unquantized; the softmax and products in the run's dtype.
//!
//! [P≠C] KIVI computes in the model's fp16 and stores s and mn in fp16; here they are the run's
//! dtype (§8.2: far below the 2–4-bit error). KIVI prefills in full precision and quantizes
//! afterwards: the error is what each position would see as a decode query.

use anyhow::Result;

use super::{check_blocks_of_32, dense_macs, in_run_dtype, quantized, HostMat, Real};
use crate::attention::decode::{DecodeHead, Decoding};
use crate::attention::exact::ExactAttention;
use crate::attention::{Approximation, HeadInputs, Mask, Method, MethodInfo};
use crate::numerics::formats::asym_group_roundtrip;
use crate::numerics::sampling::TrialRng;

/// Tokens per K group and channels per V group.
pub const GROUP: usize = 32;
/// The full-precision residual R.
pub const RESIDUAL: usize = 128;

pub struct Kivi {
    /// Bits per quantized value: 4 or 2.
    pub bits: u32,
}

pub const KIVI4: MethodInfo = quantized("kivi4");
pub const KIVI2: MethodInfo = quantized("kivi2");

/// The tokens of K that are quantized: all but the last n mod R (a multiple of R, so of G).
pub fn k_quantized_tokens(n: usize) -> usize {
    n - n % RESIDUAL
}

/// The tokens of V that are quantized: all but the last R (none when n ≤ R).
pub fn v_quantized_tokens(n: usize) -> usize {
    n.saturating_sub(RESIDUAL)
}

impl Kivi {
    /// K̂ and V̂ as the cache holds them after a prefill of n tokens, on the host.
    pub fn quantize_kv<T: Real>(&self, k: &mut HostMat<T>, v: &mut HostMat<T>) {
        // bits = 0 is the test seam of docs/reference.md §10.4's exactness limit: every group
        // stored as it is.
        #[cfg(test)]
        if self.bits == 0 {
            return;
        }
        let (n, p) = (k.rows, k.cols);
        let mut group = vec![T::ZERO; GROUP];
        for t0 in (0..k_quantized_tokens(n)).step_by(GROUP) {
            for c in 0..p {
                for (r, g) in group.iter_mut().enumerate() {
                    *g = k.data[(t0 + r) * p + c];
                }
                asym_group_roundtrip(&mut group, self.bits);
                for (r, g) in group.iter().enumerate() {
                    k.data[(t0 + r) * p + c] = *g;
                }
            }
        }
        for g in v.data[..v_quantized_tokens(n) * p].chunks_exact_mut(GROUP) {
            asym_group_roundtrip(g, self.bits);
        }
    }
}

fn kivi_kv<T: Real>(
    m: &Kivi,
    head: &HeadInputs,
) -> Result<(candle_core::Tensor, candle_core::Tensor)> {
    let (mut k, mut v) = (HostMat::<T>::of(&head.k)?, HostMat::<T>::of(&head.v)?);
    m.quantize_kv(&mut k, &mut v);
    Ok((k.into_tensor(&head.k)?, v.into_tensor(&head.v)?))
}

/// The continuation rows t = n_p..n−1 under the decode protocol, each reading the cache as it
/// stands after t + 1 tokens. KIVI's groups run from token 0 and never change once formed (K's
/// groups of 32 tokens complete with each residual flush of R = 128, V's tokens one by one), so
/// the cache after t + 1 tokens is the window's quantized K̂, V̂ on the positions quantized by
/// then and K, V elsewhere. Host loops in the run's dtype, rows in parallel: n_f·n·p.
fn decode_rows<T: Real>(m: &Kivi, head: &HeadInputs, n_p: usize) -> Result<candle_core::Tensor> {
    use rayon::prelude::*;
    let (q, k, v) = super::host_qkv::<T>(head)?;
    let (mut kq, mut vq) = (HostMat::<T>::of(&head.k)?, HostMat::<T>::of(&head.v)?);
    m.quantize_kv(&mut kq, &mut vq);
    let (n, p) = (q.rows, q.cols);
    let scale = T::from_f64(1.0 / (p as f64).sqrt());
    let rows: Vec<Vec<T>> = (n_p..n)
        .into_par_iter()
        .map(|t| {
            let len = t + 1;
            let (k_to, v_to) = (k_quantized_tokens(len), v_quantized_tokens(len));
            let qt = q.row(t);
            let s: Vec<T> = (0..len)
                .map(|j| {
                    let kj = if j < k_to { kq.row(j) } else { k.row(j) };
                    qt.iter().zip(kj).fold(T::ZERO, |a, (&x, &y)| a + x * y) * scale
                })
                .collect();
            let mx = s.iter().fold(T::NEG_INFINITY, |a, &x| a.max(x));
            let mut out = vec![T::ZERO; p];
            let mut sum = T::ZERO;
            for (j, &x) in s.iter().enumerate() {
                let e = (x - mx).exp();
                sum += e;
                let vj = if j < v_to { vq.row(j) } else { v.row(j) };
                for (o, &y) in out.iter_mut().zip(vj) {
                    *o += e * y;
                }
            }
            out.iter_mut().for_each(|o| *o /= sum);
            out
        })
        .collect();
    let data: Vec<T> = rows.into_iter().flatten().collect();
    T::tensor(data, (n - n_p, p), head.q.device())
}

impl Method for Kivi {
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(if self.bits == 4 { &KIVI4 } else { &KIVI2 })
    }
    fn macs(&self, n: usize, p: usize, _d: usize) -> f64 {
        dense_macs(n, p, Mask::None)
    }
    fn macs_masked(&self, n: usize, p: usize, _d: usize, mask: Mask) -> f64 {
        dense_macs(n, p, mask)
    }
    fn check_head_dim(&self, p: usize) -> std::result::Result<(), String> {
        check_blocks_of_32(p)
    }
    /// Quantized tokens count b + 1 bits (b-bit codes, an f16 scale and zero per 32 values),
    /// residual tokens 16; averaged over K's and V's tokens (§8.3: `kivi2` at n = 2048 is 3.41).
    fn kv_bits(&self, n: usize) -> Option<f64> {
        let b = self.bits as f64 + 32.0 / GROUP as f64;
        let width =
            |quantized: usize| (quantized as f64 * b + (n - quantized) as f64 * 16.0) / n as f64;
        Some((width(k_quantized_tokens(n)) + width(v_quantized_tokens(n))) / 2.0)
    }
    fn decoding(&self) -> Option<&dyn Decoding> {
        Some(self)
    }
    fn approximate(&self, head: &HeadInputs, _d: usize, _: &mut TrialRng) -> Result<Approximation> {
        super::check_head(self, head)?;
        let (k, v) = in_run_dtype!(head.dtype(), kivi_kv(self, head))?;
        // As the other caches (kv_cache.rs): the layer's exact attention on Q, K̂, V̂ — a plain
        // spec the mask's path, any other the spec kernels (τ, cap, window, sink, §7.7.6).
        let out = ExactAttention::compute_spec(&head.q, &k, &v, &head.spec)?.output;
        Ok(Approximation::plain(out))
    }
}

impl Decoding for Kivi {
    fn approximate_decode(
        &self,
        head: &HeadInputs,
        dec: &DecodeHead,
        _d: usize,
        _: &mut TrialRng,
    ) -> Result<Approximation> {
        super::check_head(self, head)?;
        let out = in_run_dtype!(head.dtype(), decode_rows(self, head, dec.n_p()))?;
        Ok(Approximation::plain(out))
    }
    /// Under `--decode` (§9.1): row t reads the cache after t + 1 tokens, K quantized for
    /// j < (t+1) − (t+1) mod R and V for j < t + 1 − R; per value read, the read-weighted mean
    /// over the continuation rows of (K's width + V's width)/2, so kv_read = kv_bits/16 still.
    fn kv_bits_decode(&self, n: usize, n_f: usize) -> Option<f64> {
        let b = self.bits as f64 + 32.0 / GROUP as f64;
        let (mut bits, mut reads) = (0.0, 0.0);
        for t in n - n_f..n {
            let len = t + 1;
            let width = |quantized: usize| quantized as f64 * b + (len - quantized) as f64 * 16.0;
            bits += (width(k_quantized_tokens(len)) + width(v_quantized_tokens(len))) / 2.0;
            reads += len as f64;
        }
        Some(bits / reads)
    }
}
