//! The KV-cache methods on an MLA layer (docs/reference.md §7.7.6, MLA): the cache holds one
//! latent row [c_j; k_pe,j] per token, shared by the layer's heads, and that row is what is
//! quantized — in the cache's format, one row of r + d_R values (576 for DeepSeek-V3), the ggml
//! types in blocks of 32 along it, `kv_fp8` with one scale over the window's latent rows. The
//! target then runs absorbed, as llama.cpp's and vLLM's MLA kernels do (docs/reference.md §7.7.5,
//! [`crate::attention::latent`]): logits τ·q̃·[ĉ_j; k̂_pe,j] with q̃ = [W_UK,hᵀ q_nope; q_pe] in the
//! kernel's query format (f16/bf16 with those caches, Q8_0's values for the ggml types, as it
//! stands for FP8), the layer's spec on them (τ includes mscale²), then O_h = W_UV,h Σ_j P_ij ĉ_j.
//! [P≠C] FlashMLA's FP8 cache keeps the rope part k_pe in bf16 (and c in FP8 with per-tile
//! scales); `kv_fp8` here stores the whole row in E4M3 under one scale, as vLLM's `fp8` MLA cache.

use anyhow::Result;
use candle_core::Tensor;

use super::kv_cache::{CacheFormat, KvCache};
use super::{check_blocks_of_32, in_run_dtype, HostMat, Real};
use crate::attention::exact::ExactAttention;
use crate::attention::latent::HeadLatent;
use crate::attention::{HeadInputs, Method};

impl KvCache {
    /// Ô [n, d_v] of an MLA head read from its layer's latent cache in this format.
    pub fn approximate_latent(&self, head: &HeadInputs, latent: &HeadLatent) -> Result<Tensor> {
        super::run_dtype(head)?;
        if let CacheFormat::Ggml(_) = self.format {
            check_blocks_of_32(latent.layer.width()).map_err(|why| {
                crate::usage!("method {} on the MLA latent row: {why}", self.id())
            })?;
        }
        let (q, l) = self.quantized_latent(head, latent)?;
        let c = l.narrow(1, 0, latent.layer.rank())?.contiguous()?;
        let y = ExactAttention::compute_spec(&q, &l, &c, &head.spec)?.output;
        latent.output(&y, head.v.dims()[1])
    }

    /// (q̃ as the kernel dots it, the latent rows as the cache holds them), in the head's dtype
    /// and on its device.
    pub fn quantized_latent(
        &self,
        head: &HeadInputs,
        latent: &HeadLatent,
    ) -> Result<(Tensor, Tensor)> {
        let q = latent.absorbed_query(&head.q)?;
        in_run_dtype!(
            head.dtype(),
            quantize_latent(self, &q, &latent.layer.latent)
        )
    }
}

fn quantize_latent<T: Real>(m: &KvCache, q: &Tensor, latent: &Tensor) -> Result<(Tensor, Tensor)> {
    let (mut qh, mut lh) = (HostMat::<T>::of(q)?, HostMat::<T>::of(latent)?);
    m.quantize_query("the absorbed query [W_UKᵀ q_nope; q_pe]", &mut qh)?;
    m.quantize_cached("the latent row [c; k_pe]", &mut lh)?;
    Ok((qh.into_tensor(q)?, lh.into_tensor(latent)?))
}
