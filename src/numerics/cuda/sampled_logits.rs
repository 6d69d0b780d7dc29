//! Informer's sparsity measure on a CUDA device from its sampled key indices, without gathering
//! the sampled keys (`sampled_logits.cu`): [`sparsity_measure`] is what
//! `attention::sampling::informer::sparsity_measure_heads` computes with candle's gather and
//! batched products, to rounding.

use anyhow::Result;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CpuStorage, CudaStorage, CustomOp3, DType, Layout, Shape, Tensor};

use super::{disabled, function, operand};

/// M̄ [B, n] for q, k [B, n, p] on a CUDA device and `idx` [B, n, U] (u32, rows of the flattened
/// keys [B·n, p]), or None where the kernel does not apply (another device, a dtype other than
/// f32/f64, p not a multiple of 4, or `APPROX_BENCH_CUDA_KERNELS=0`).
pub fn sparsity_measure(q: &Tensor, k: &Tensor, idx: &Tensor) -> Result<Option<Tensor>> {
    if !q.device().is_cuda() || disabled() {
        return Ok(None);
    }
    let (b, n, p) = q.dims3()?;
    let (bi, ni, u) = idx.dims3()?;
    if k.dims3()? != (b, n, p)
        || (bi, ni) != (b, n)
        || idx.dtype() != DType::U32
        || k.dtype() != q.dtype()
        || !matches!(q.dtype(), DType::F32 | DType::F64)
        || p % 4 != 0
        || p == 0
        || u == 0
        || n == 0
        || b * n > (u32::MAX as usize)
    {
        return Ok(None);
    }
    let op = SampledSparsity { n, p, u };
    let m = q
        .contiguous()?
        .apply_op3_no_bwd(&k.contiguous()?, &idx.contiguous()?, &op)?;
    Ok(Some(m.reshape((b, n))?))
}

struct SampledSparsity {
    n: usize,
    p: usize,
    u: usize,
}

impl CustomOp3 for SampledSparsity {
    fn name(&self) -> &'static str {
        "approx-bench-sampled-sparsity"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        candle_core::bail!("the sampled sparsity kernel runs on CUDA tensors only")
    }

    fn cuda_fwd(
        &self,
        q: &CudaStorage,
        lq: &Layout,
        k: &CudaStorage,
        lk: &Layout,
        idx: &CudaStorage,
        li: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        match q.dtype() {
            DType::F32 => self.launch::<f32>("sampled_sparsity_f32", q, lq, k, lk, idx, li),
            DType::F64 => self.launch::<f64>("sampled_sparsity_f64", q, lq, k, lk, idx, li),
            other => candle_core::bail!("sampled sparsity: no kernel for {other:?}"),
        }
    }
}

impl SampledSparsity {
    #[allow(clippy::too_many_arguments)]
    fn launch<T: CudaDType + DeviceRepr>(
        &self,
        name: &str,
        q: &CudaStorage,
        lq: &Layout,
        k: &CudaStorage,
        lk: &Layout,
        idx: &CudaStorage,
        li: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let rows = lq.shape().elem_count() / self.p;
        let dev = q.device().clone();
        let shared = (4 * self.p * std::mem::size_of::<T>()) as u32;
        let func = function(&dev, name, shared.max(1))?;
        let op = "sampled sparsity";
        let (qv, kv, iv) = (
            operand::<T>(q, lq, op)?,
            operand::<T>(k, lk, op)?,
            operand::<u32>(idx, li, op)?,
        );
        // SAFETY: the kernel writes every row's value.
        let out = unsafe { dev.alloc::<T>(rows)? };
        let (rows_i, n_i, p_i, u_i) = (rows as i64, self.n as i32, self.p as i32, self.u as i32);
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(4) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: shared,
        };
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&func);
        b.arg(&qv)
            .arg(&kv)
            .arg(&iv)
            .arg(&out)
            .arg(&rows_i)
            .arg(&n_i)
            .arg(&p_i)
            .arg(&u_i);
        // SAFETY: the arguments match sampled_logits.cu's signature; one warp per row.
        unsafe { b.launch(cfg) }.w()?;
        Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from(rows)))
    }
}
