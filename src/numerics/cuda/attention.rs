//! Exact attention fused on a CUDA device (issue 34): [`on_device`] runs `attention.cu`, the
//! online-softmax form of [`crate::numerics::flash::on_host`], for every query head of a window
//! in one launch. On a card the device tests (`APPROX_BENCH_TEST_DEVICE=cuda`) and every sweep's
//! float64 row check of the target check it; `scripts/cuda-emulate/run.sh` runs the same source on
//! the host against float64.

use anyhow::Result;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{CpuStorage, CudaStorage, CustomOp3, DType, Layout, Shape, Tensor};

use super::{disabled, function, operand};
use crate::numerics::visible::Visible;

/// The kernel for an element type and head size: (name, rows per block, threads, shared bytes).
/// The tile shapes are attention.cu's instantiations: f32 64 rows × 64 keys, f64 32 × 32.
fn kernel(dtype: DType, p: usize) -> Option<(&'static str, u32, u32, u32)> {
    let (name, br, size) = match (dtype, p) {
        (DType::F32, 64) => ("flash_f32_p64", 64, 4),
        (DType::F32, 128) => ("flash_f32_p128", 64, 4),
        (DType::F64, 64) => ("flash_f64_p64", 32, 8),
        (DType::F64, 128) => ("flash_f64_p128", 32, 8),
        _ => return None,
    };
    let (bc, lq, lp) = (br, p + 4, br + 4);
    let shared = (br * lq + (bc * lq).max(br * lp) + bc * p) * size;
    Some((name, br as u32, (br / 4 * 8) as u32, shared as u32))
}

/// O [H, n, p] of exact attention for q [H, n, p] (already scaled by 1/√p) and k, v [H_kv, n, p]
/// (query head h reads K/V head h·H_kv/H) on a CUDA device, or None where the fused kernel does
/// not apply (another device, a dtype other than f32 and f64, p not 64 or 128, or
/// `APPROX_BENCH_CUDA_KERNELS=0`), for the caller's own path.
pub fn on_device(qs: &Tensor, k: &Tensor, v: &Tensor, visible: Visible) -> Result<Option<Tensor>> {
    if !qs.device().is_cuda() || disabled() {
        return Ok(None);
    }
    let (h, n, p) = qs.dims3()?;
    let (hkv, nk, pk) = k.dims3()?;
    if v.dims3()? != (hkv, nk, pk) || (nk, pk) != (n, p) || hkv == 0 || h % hkv != 0 {
        return Ok(None);
    }
    if kernel(qs.dtype(), p).is_none() || k.dtype() != qs.dtype() || v.dtype() != qs.dtype() {
        return Ok(None);
    }
    if n == 0 || h == 0 {
        return Ok(None);
    }
    let (causal, window) = match visible {
        Visible::All => (false, 0),
        Visible::Causal { window: None } => (true, 0),
        Visible::Causal { window: Some(w) } => (true, w.max(1)),
    };
    if n > i32::MAX as usize || window > i32::MAX as usize || h > 65535 {
        return Ok(None);
    }
    let op = FusedAttention { causal, window };
    Ok(Some(qs.contiguous()?.apply_op3_no_bwd(
        &k.contiguous()?,
        &v.contiguous()?,
        &op,
    )?))
}

struct FusedAttention {
    causal: bool,
    window: usize,
}

impl CustomOp3 for FusedAttention {
    fn name(&self) -> &'static str {
        "approx-bench-fused-attention"
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
        candle_core::bail!(
            "the fused device kernel runs on CUDA tensors; the host has flash::on_host"
        )
    }

    fn cuda_fwd(
        &self,
        q: &CudaStorage,
        lq: &Layout,
        k: &CudaStorage,
        lk: &Layout,
        v: &CudaStorage,
        lv: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        match q.dtype() {
            DType::F32 => self.launch::<f32>(q, lq, k, lk, v, lv),
            DType::F64 => self.launch::<f64>(q, lq, k, lk, v, lv),
            other => candle_core::bail!("fused attention: no kernel for {other:?}"),
        }
    }
}

impl FusedAttention {
    fn launch<T: CudaDType + DeviceRepr>(
        &self,
        q: &CudaStorage,
        lq: &Layout,
        k: &CudaStorage,
        lk: &Layout,
        v: &CudaStorage,
        lv: &Layout,
    ) -> candle_core::Result<(CudaStorage, Shape)> {
        let (h, n, p) = lq.shape().dims3()?;
        let hkv = lk.shape().dims3()?.0;
        let dev = q.device().clone();
        let Some((name, br, threads, shared)) = kernel(q.dtype(), p) else {
            candle_core::bail!(
                "fused attention: no kernel for {:?} with p = {p}",
                q.dtype()
            );
        };
        let func = function(&dev, name, shared)?;
        let op = "fused attention";
        let (qv, kv, vv) = (
            operand::<T>(q, lq, op)?,
            operand::<T>(k, lk, op)?,
            operand::<T>(v, lv, op)?,
        );
        // SAFETY: every element is written by the kernel (rows < n of every head).
        let out = unsafe { dev.alloc::<T>(h * n * p)? };
        // log D per row: written by the kernel for the row statistics; not returned yet.
        let lse = unsafe { dev.alloc::<T>(h * n)? };
        let (n_i, g_i) = (n as i32, (h / hkv) as i32);
        let (causal_i, window_i) = (self.causal as i32, self.window as i32);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(br as usize) as u32, h as u32, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: shared,
        };
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&func);
        b.arg(&qv)
            .arg(&kv)
            .arg(&vv)
            .arg(&out)
            .arg(&lse)
            .arg(&n_i)
            .arg(&g_i)
            .arg(&causal_i)
            .arg(&window_i);
        // SAFETY: the arguments match attention.cu's signature; the grid covers every row block
        // and head, and the shared memory is what the kernel's tiles take (`kernel`).
        unsafe { b.launch(cfg) }.w()?;
        Ok((CudaStorage::wrap_cuda_slice(out, dev), lq.shape().clone()))
    }
}
