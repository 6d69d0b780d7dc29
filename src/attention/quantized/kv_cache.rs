//! The KV-cache methods of docs/reference.md §8.3: every query row reads the window's K and V from a
//! cache stored in a low-precision format, Ô = softmax(Q̂K̂ᵀ/√p)V̂ under the run's mask.
//!
//! - `kv_f16` — f16 Q, K, V: llama.cpp's default cache (`-ctk f16`), whose CPU kernel converts Q
//!   to f16 for the dot product. [P≠C] llama.cpp's CPU kernel also accumulates V·P in f16; its
//!   GPU kernels and this method accumulate in the run's dtype.
//! - `kv_bf16` — bf16 Q, K, V: vLLM and SGLang serving a bf16 model.
//! - `kv_fp8` — K̂ = s_K·E4M3(K/s_K), s_K = max|K|/448 over the K/V head's window (vLLM's
//!   `calculate_kv_scales` granularity), V likewise, Q unquantized.
//! - `kv_q8_0` … `kv_q4_0` — llama.cpp's `-ctk T -ctv T`: K and V in the ggml type, blocks of 32
//!   along p, always in f32 (§8.2); Q in the K type's dot type (`ggml-cpu`'s `k_vec_dot_type`):
//!   Q8_0, or Q8_1 for Q5_1/Q4_1, whose values are Q8_0's ([P≠C] Q8_1's f16 d·Σq offset term is
//!   left out, §8.3).
//!
//! For llama.cpp this is also what prefill computes (its ubatch writes K/V to the cache, then
//! attention reads the cache); vLLM prefills in full precision and quantizes afterwards, so there
//! the error is what each position would see as a decode query (§8.3).
//!
//! Where the scale goes (§8.1): llama.cpp applies 1/√p (a layer's τ, §7.7.6) after the dot
//! product; exact attention's kernels scale Q̂ by it before. For p = 64 (1/8, a power of two) the
//! two are the same numbers; for other p or τ they differ by one rounding in the run's dtype,
//! never by a code: Q is quantized as it stands, unscaled. On a family layer (§7.7.6) the cache
//! is quantized as on any other, then read under the layer's spec: its window's keys only, the
//! cap on the quantized product's logits, the sink unquantized in every denominator.
//!
//! On an MLA layer (a head with [`HeadInputs::latent`]) the cache holds the layer's latent rows
//! instead of this head's K/V, quantized in the same formats and read absorbed (kv_latent.rs).

use anyhow::Result;
use candle_core::Tensor;

use super::{check_blocks_of_32, check_f16_range, dense_macs, in_run_dtype, quantized};
use super::{HostMat, Real};
use crate::attention::decode::{DecodeHead, Decoding};
use crate::attention::exact::ExactAttention;
use crate::attention::{Approximation, HeadInputs, Mask, Method, MethodInfo};
use crate::numerics::formats::{ggml_roundtrip, GgmlType, E4M3_MAX};
use crate::numerics::sampling::TrialRng;

/// What the cache stores K and V (and the kernel Q) in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheFormat {
    F16,
    Bf16,
    Fp8,
    Ggml(GgmlType),
    /// Stores K, V and Q as they are: the test seam of docs/reference.md §10.4's exactness limit
    /// ("§8 methods with every format replaced by the identity").
    #[cfg(test)]
    Identity,
}

/// A KV-cache method: exact attention over a cache in `format`.
pub struct KvCache {
    pub format: CacheFormat,
}

pub const KV_F16: MethodInfo = quantized("kv_f16");
pub const KV_BF16: MethodInfo = quantized("kv_bf16");
pub const KV_FP8: MethodInfo = quantized("kv_fp8");
pub const KV_Q8_0: MethodInfo = quantized("kv_q8_0");
pub const KV_Q5_1: MethodInfo = quantized("kv_q5_1");
pub const KV_Q5_0: MethodInfo = quantized("kv_q5_0");
pub const KV_Q4_1: MethodInfo = quantized("kv_q4_1");
pub const KV_Q4_0: MethodInfo = quantized("kv_q4_0");
#[cfg(test)]
pub const KV_IDENTITY: MethodInfo = quantized("kv_identity");

impl KvCache {
    /// The eight cache methods, in the order of §8.3 (widest first).
    pub fn all() -> Vec<KvCache> {
        let mut v = vec![CacheFormat::F16, CacheFormat::Bf16, CacheFormat::Fp8];
        v.extend(GgmlType::ALL.iter().map(|&t| CacheFormat::Ggml(t)));
        v.into_iter().map(|format| KvCache { format }).collect()
    }

    /// The cache method of one ggml type.
    pub fn ggml(ty: GgmlType) -> KvCache {
        KvCache {
            format: CacheFormat::Ggml(ty),
        }
    }

    /// Q̂, K̂, V̂ as the cache and the kernel hold them, in the head's dtype and on its device.
    pub fn quantized_qkv(&self, head: &HeadInputs) -> Result<(Tensor, Tensor, Tensor)> {
        in_run_dtype!(head.dtype(), quantize_qkv(self, head))
    }
}

fn quantize_qkv<T: Real>(m: &KvCache, head: &HeadInputs) -> Result<(Tensor, Tensor, Tensor)> {
    let (mut q, mut k, mut v) = super::host_qkv::<T>(head)?;
    m.quantize_query("Q", &mut q)?;
    m.quantize_cached("K", &mut k)?;
    m.quantize_cached("V", &mut v)?;
    Ok((
        q.into_tensor(&head.q)?,
        k.into_tensor(&head.k)?,
        v.into_tensor(&head.v)?,
    ))
}

impl KvCache {
    /// Q as the kernel dots it (`tensor` names it in a usage error): f16 or bf16 with an f16 or
    /// bf16 cache, the K type's dot type (Q8_0's values) with a ggml one, unquantized with FP8.
    pub(super) fn quantize_query<T: Real>(&self, tensor: &str, q: &mut HostMat<T>) -> Result<()> {
        match self.format {
            CacheFormat::F16 => {
                check_f16_range(self.id(), tensor, q)?;
                q.map(T::round_f16);
            }
            CacheFormat::Bf16 => q.map(T::round_bf16),
            CacheFormat::Ggml(_) => ggml(self.id(), tensor, q, GgmlType::Q8_0)?,
            CacheFormat::Fp8 => {}
            #[cfg(test)]
            CacheFormat::Identity => {}
        }
        Ok(())
    }

    /// A cached tensor (K, V, or an MLA layer's latent rows) as the cache stores it.
    pub(super) fn quantize_cached<T: Real>(&self, tensor: &str, x: &mut HostMat<T>) -> Result<()> {
        match self.format {
            CacheFormat::F16 => {
                check_f16_range(self.id(), tensor, x)?;
                x.map(T::round_f16);
            }
            CacheFormat::Bf16 => x.map(T::round_bf16),
            CacheFormat::Fp8 => per_tensor_e4m3(x),
            CacheFormat::Ggml(ty) => ggml(self.id(), tensor, x, ty)?,
            #[cfg(test)]
            CacheFormat::Identity => {}
        }
        Ok(())
    }
}

/// x̂ = s·E4M3(x/s), s = max|x|/448 over the whole tensor (one dynamic scale per K/V head, §8.3);
/// an all-zero tensor stays zero.
pub fn per_tensor_e4m3<T: Real>(x: &mut HostMat<T>) {
    let s = x.abs_max() / T::from_f64(E4M3_MAX);
    if s == T::ZERO {
        x.map(|_| T::ZERO);
        return;
    }
    x.map(|v| s * (v / s).round_e4m3());
}

/// Rounds x to f32 (the cache write), then quantizes and dequantizes each block of 32 along p
/// in `ty`, always in f32 (§8.2), and widens back; a scale or offset that overflows f16 is a
/// usage error naming the tensor.
fn ggml<T: Real>(method: &str, tensor: &str, x: &mut HostMat<T>, ty: GgmlType) -> Result<()> {
    let mut f: Vec<f32> = x.data.iter().map(|v| v.to_f64() as f32).collect();
    ggml_roundtrip(ty, &mut f).map_err(|e| {
        crate::usage!(
            "method {method}: {tensor} cannot be stored as {} ({e}; f16 holds at most 65504, docs/reference.md §8.2) — leave {method} out for this model",
            ty.name().to_uppercase()
        )
    })?;
    x.data = f.into_iter().map(|v| T::from_f64(v as f64)).collect();
    Ok(())
}

impl Method for KvCache {
    fn info(&self) -> Option<&'static MethodInfo> {
        Some(match self.format {
            CacheFormat::F16 => &KV_F16,
            CacheFormat::Bf16 => &KV_BF16,
            CacheFormat::Fp8 => &KV_FP8,
            CacheFormat::Ggml(GgmlType::Q8_0) => &KV_Q8_0,
            CacheFormat::Ggml(GgmlType::Q5_1) => &KV_Q5_1,
            CacheFormat::Ggml(GgmlType::Q5_0) => &KV_Q5_0,
            CacheFormat::Ggml(GgmlType::Q4_1) => &KV_Q4_1,
            CacheFormat::Ggml(GgmlType::Q4_0) => &KV_Q4_0,
            #[cfg(test)]
            CacheFormat::Identity => &KV_IDENTITY,
        })
    }
    fn macs(&self, n: usize, p: usize, _d: usize) -> f64 {
        dense_macs(n, p, Mask::None)
    }
    fn macs_masked(&self, n: usize, p: usize, _d: usize, mask: Mask) -> f64 {
        dense_macs(n, p, mask)
    }
    fn check_head_dim(&self, p: usize) -> std::result::Result<(), String> {
        match self.format {
            CacheFormat::Ggml(_) => check_blocks_of_32(p),
            _ => Ok(()),
        }
    }
    fn kv_bits(&self, _n: usize) -> Option<f64> {
        Some(match self.format {
            CacheFormat::F16 | CacheFormat::Bf16 => 16.0,
            CacheFormat::Fp8 => 8.0,
            CacheFormat::Ggml(t) => t.bits_per_value(),
            #[cfg(test)]
            CacheFormat::Identity => 16.0,
        })
    }
    fn decoding(&self) -> Option<&dyn Decoding> {
        Some(self)
    }
    fn reads_mla_latent(&self) -> bool {
        true
    }
    fn approximate(&self, head: &HeadInputs, _d: usize, _: &mut TrialRng) -> Result<Approximation> {
        // An MLA head: the cache holds the layer's latent rows, not this head's K/V (kv_latent.rs).
        if let Some(latent) = &head.latent {
            return Ok(Approximation::plain(self.approximate_latent(head, latent)?));
        }
        super::check_head(self, head)?;
        let (q, k, v) = self.quantized_qkv(head)?;
        // The layer's exact attention on Q̂, K̂, V̂ (§7.7.6): a plain spec takes the mask's path
        // (the same bits as before specs existed); any other the spec kernels, which scale Q̂ by
        // τ before the product — τ after llama.cpp's dot product in real arithmetic, a rounding
        // apart and never a code, since Q̂ is the unscaled Q's — cap the quantized product's
        // logits (FlashAttention's `softcap`, llama.cpp's `attn_soft_cap`), see the window's
        // keys only and keep the sink, unquantized, in every denominator.
        let out = ExactAttention::compute_spec(&q, &k, &v, &head.spec)?.output;
        Ok(Approximation::plain(out))
    }
}

/// Under `--decode` (§9.1) a continuation row reads the per-token cache as it stands after t + 1
/// tokens, which is this computation's row t: §8.3 restricted to F. (`kv_fp8`'s one scale per K/V
/// head stays the window's, as §9.1 says.)
impl Decoding for KvCache {
    fn approximate_decode(
        &self,
        head: &HeadInputs,
        dec: &DecodeHead,
        _d: usize,
        _: &mut TrialRng,
    ) -> Result<Approximation> {
        if head.latent.is_some() {
            return Err(crate::usage!(
                "method {}: the decode protocol on an MLA layer's latent cache is not implemented (docs/reference.md §7.7.6) — drop --decode",
                self.id()
            ));
        }
        super::check_head(self, head)?;
        let (q, k, v) = self.quantized_qkv(head)?;
        let out = crate::attention::decode::dense_continuation(&q, &k, &v, dec.n_p(), &head.spec)?;
        Ok(Approximation::plain(out))
    }
    fn kv_bits_decode(&self, n: usize, _n_f: usize) -> Option<f64> {
        self.kv_bits(n)
    }
    /// The continuation rows of the spec's exact attention on the quantized cache (§7.7.6).
    fn decode_spec_support(&self) -> crate::attention::SpecFeatures {
        crate::attention::SpecFeatures::ALL
    }
}
