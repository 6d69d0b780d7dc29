//! Quantized attention (docs/reference.md §8): the same key sets as exact attention, fewer bits. Two
//! kinds, one file each, over the number formats of [`crate::numerics::formats`]:
//!
//! - [`kv_cache`]: what a decode step reads from a quantized KV cache — `kv_f16`, `kv_bf16`,
//!   `kv_fp8` (vLLM/SGLang), llama.cpp's `kv_q8_0` … `kv_q4_0` (§8.3; on an MLA layer the latent
//!   row, read absorbed: `kv_latent.rs`), and [`kivi`]'s 4- and 2-bit caches with their
//!   full-precision residual;
//! - [`sage`]: SageAttention's kernels (`sage1`, `sage2_8b`, `sage2_4b`, §8.4), whose P is
//!   quantized against the running row maximum of [`online_softmax`] (written once).
//!
//! Common form (§8.1): Ô = softmax(Q̂K̂ᵀ/√p)V̂ under the run's mask, the softmax and products in the
//! run's dtype. No budget: a sweep runs each method once per (window, head) with d = 0
//! ([`crate::attention::Method::has_budget`]); deterministic; `keys` is the dense count and
//! `mass` 1. Q is quantized per query head, K and V per K/V head: the sweep hands every query
//! head of a group the same K/V tensors and quantizing them is deterministic, so the heads of a
//! group read identical K̂, V̂ (a test checks).
//!
//! The quantizers run on the host (O(np) per head, beside the O(n²p) products, which stay on the
//! head's device): their roundings are specified bit for bit (§8.2) and candle has no kernels for
//! them.

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};

use crate::attention::{Family, HeadInputs, Mask, MethodInfo, Target};
use crate::numerics::formats::RunFloat;

pub mod kivi;
pub mod kv_cache;
mod kv_latent;
pub mod online_softmax;
pub mod sage;

#[cfg(test)]
mod latent_tests;
#[cfg(test)]
mod spec_tests;
#[cfg(test)]
mod spec_tests_sage;
#[cfg(test)]
mod tests;

/// What the §8 methods share in their [`MethodInfo`]: the family, both masks, the softmax
/// target only (`--target kernelized` is refused: §8.1), deterministic.
pub const QUANTIZED: MethodInfo = MethodInfo {
    family: Family::Quantized,
    masks: MethodInfo::BOTH_MASKS,
    targets: &[Target::Softmax],
    meaning: "no budget: every key at fewer bits (run once per head, d = 0)",
    // §7.7.6: every §8 method reads the layer's spec itself (never rescaled inputs, which would
    // quantize s·K, not the deployed cache): a cache quantizes the Q, K, V it stores, unscaled,
    // and reads them under the spec (kv_cache.rs, kivi.rs); SageAttention folds τ into Q′, caps
    // S and adds the sink after its last key block (sage.rs, online_softmax.rs). On an MLA layer
    // the KV caches quantize the latent row and read it absorbed (kv_latent.rs); the sweep
    // refuses KIVI and SageAttention there (`sweep::spec_refusals::refuse_quantized_mla`).
    spec: crate::attention::SpecFeatures::ALL,
    ..MethodInfo::BASE
};

/// A §8 method's descriptor: [`QUANTIZED`] with its id.
pub const fn quantized(id: &'static str) -> MethodInfo {
    MethodInfo { id, ..QUANTIZED }
}

/// The float arithmetic the §8 methods run in: the run's dtype (f32 or f64), with the formats'
/// roundings ([`RunFloat`]) and what the softmax and the host copies need.
pub trait Real: RunFloat {
    const NEG_INFINITY: Self;
    fn exp(self) -> Self;
    fn sqrt(self) -> Self;
    fn tanh(self) -> Self;
    fn max(self, other: Self) -> Self;
    /// A tensor's values in this type, row-major (the tensor must have this dtype).
    fn host(t: &Tensor) -> Result<Vec<Self>>;
    /// A tensor of this dtype on `device`.
    fn tensor(v: Vec<Self>, shape: (usize, usize), device: &Device) -> Result<Tensor>;
}

macro_rules! real {
    ($t:ty, $exp:path) => {
        impl Real for $t {
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            #[inline(always)]
            fn exp(self) -> Self {
                $exp(self)
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            fn max(self, other: Self) -> Self {
                <$t>::max(self, other)
            }
            fn host(t: &Tensor) -> Result<Vec<Self>> {
                Ok(t.flatten_all()?.to_vec1::<$t>()?)
            }
            fn tensor(v: Vec<Self>, shape: (usize, usize), device: &Device) -> Result<Tensor> {
                Ok(Tensor::from_vec(v, shape, device)?)
            }
        }
    };
}
// f32: exact attention's branch-free exponential (≤ 2 ulp, vectorises: the kernels' n² weights
// are most of their host work); f64: libm's.
real!(f32, crate::numerics::shifted_exp::exp_f32);
real!(f64, f64::exp);

/// A row-major host copy of an [n, p] tensor in its own dtype.
pub struct HostMat<T> {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<T>,
}

impl<T: Real> HostMat<T> {
    pub fn of(t: &Tensor) -> Result<Self> {
        let (rows, cols) = t.dims2()?;
        Ok(Self {
            rows,
            cols,
            data: T::host(t)?,
        })
    }
    pub fn row(&self, i: usize) -> &[T] {
        &self.data[i * self.cols..(i + 1) * self.cols]
    }
    /// A tensor of these values on `like`'s device (a copy: the host values stay usable).
    pub fn tensor(&self, like: &Tensor) -> Result<Tensor> {
        T::tensor(self.data.clone(), (self.rows, self.cols), like.device())
    }
    /// The values as a tensor on `like`'s device, without a copy on the host.
    pub fn into_tensor(self, like: &Tensor) -> Result<Tensor> {
        T::tensor(self.data, (self.rows, self.cols), like.device())
    }
    /// Applies `f` to the value at (row, col) in place.
    pub fn map(&mut self, f: impl Fn(T) -> T) {
        self.data.iter_mut().for_each(|x| *x = f(*x));
    }
    /// max |x| (0 for an empty matrix).
    pub fn abs_max(&self) -> T {
        self.data
            .iter()
            .fold(T::ZERO, |m, &x| if x.abs() > m { x.abs() } else { m })
    }
}

/// Runs `f` in the head's dtype (f32 or f64: the run's dtypes).
macro_rules! in_run_dtype {
    ($dtype:expr, $f:ident ( $($arg:expr),* )) => {
        match $dtype {
            candle_core::DType::F32 => $f::<f32>($($arg),*),
            candle_core::DType::F64 => $f::<f64>($($arg),*),
            other => anyhow::bail!("quantized attention runs in f32 or f64, not {other:?}"),
        }
    };
}
pub(crate) use in_run_dtype;

/// A usage error unless every value of `x` (a method's `tensor` rounded to f16 for storage) is
/// finite: §8.2 refuses a value that overflows f16 (|x| ≥ 65520), naming the tensor and the largest
/// value before rounding.
pub fn check_f16_range<T: Real>(method: &str, tensor: &str, before: &HostMat<T>) -> Result<()> {
    let largest = before.abs_max().to_f64();
    if largest >= crate::numerics::formats::F16_OVERFLOW {
        return Err(crate::usage!(
            "method {method}: {tensor} holds |x| = {largest:.6e}, which overflows f16 (largest finite 65504, docs/reference.md §8.2); this head cannot be stored in an f16 cache or kernel — leave {method} out for this model"
        ));
    }
    Ok(())
}

/// Why a §8 method that groups the head dimension in blocks of 32 (ggml, KIVI) cannot run p.
pub fn check_blocks_of_32(p: usize) -> std::result::Result<(), String> {
    if !p.is_multiple_of(32) {
        return Err(format!(
            "the head dimension p = {p} is not a multiple of 32: its formats store blocks of 32 values along p (docs/reference.md §8.1)"
        ));
    }
    Ok(())
}

/// The dense key count per query, mean_i |D_i|: n, or (n + 1)/2 under the causal mask (§8.5).
pub fn dense_keys(n: usize, mask: Mask) -> f64 {
    match mask {
        Mask::None => n as f64,
        Mask::Causal => (n as f64 + 1.0) / 2.0,
    }
}

/// The multiply-adds of exact attention under `mask` (a §8 method costs one exact attention plus
/// O(np) quantization, left out by the §2.11 leading-term convention): 2p per visited pair.
pub fn dense_macs(n: usize, p: usize, mask: Mask) -> f64 {
    2.0 * p as f64 * dense_keys(n, mask) * n as f64
}

/// `kv_read` (§8.5): Σ_i |S_i|·kv_bits / (16·Σ_i |D_i|), from the mean keys per query; exactly
/// kv_bits/16 for a method that visits every key.
pub fn kv_read(kv_bits: f64, keys: f64, n: usize, mask: Mask) -> f64 {
    kv_read_of(kv_bits, keys, dense_keys(n, mask))
}

/// [`kv_read`] against any dense count per scored row (the decode protocol's, §9.1, is the mean
/// of t + 1 over the continuation).
pub fn kv_read_of(kv_bits: f64, keys: f64, dense: f64) -> f64 {
    let visited = if keys == dense { 1.0 } else { keys / dense };
    kv_bits / 16.0 * visited
}

/// The head's Q, K, V on the host in its dtype.
pub fn host_qkv<T: Real>(head: &HeadInputs) -> Result<(HostMat<T>, HostMat<T>, HostMat<T>)> {
    Ok((
        HostMat::of(&head.q)?,
        HostMat::of(&head.k)?,
        HostMat::of(&head.v)?,
    ))
}

/// Refuses a dtype other than the run's (f32, f64).
pub fn run_dtype(head: &HeadInputs) -> Result<DType> {
    match head.dtype() {
        d @ (DType::F32 | DType::F64) => Ok(d),
        other => bail!("quantized attention runs in f32 or f64, not {other:?}"),
    }
}

/// A usage error when `m` cannot run this head (its head dimension, its dtype): the sweep checks
/// p before its first window; this guards a direct call (the Python face, `bench`).
pub fn check_head<M: crate::attention::Method + ?Sized>(m: &M, head: &HeadInputs) -> Result<()> {
    m.check_head_dim(head.p())
        .map_err(|why| crate::usage!("method {}: {why}", m.id()))?;
    run_dtype(head)?;
    Ok(())
}
