//! The project's own CUDA kernels (issue 34), for what candle's kernels do slowly or not at all:
//! exact attention fused ([`attention`]) and Informer's sampled sparsity measure
//! ([`sampled_logits`]). Their source (`common.cuh` and the `.cu` files, one program) is compiled
//! by NVRTC, which candle's CUDA backend already loads, the first time a process needs it, for the
//! device's own architecture, and loaded once per device.
//!
//! `scripts/cuda-emulate/run.sh` runs the same source on the host, one thread per CUDA thread,
//! against float64: a check of the kernels' arithmetic on a machine without a GPU.

pub mod attention;
pub mod sampled_logits;

use std::sync::{Arc, Mutex, OnceLock};

use candle_core::cuda_backend::cudarc::driver::{
    sys::CUfunction_attribute, CudaFunction, CudaModule, CudaView,
};
use candle_core::cuda_backend::cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use candle_core::cuda_backend::CudaDType;
use candle_core::cuda_backend::WrapErr;
use candle_core::{CudaDevice, CudaStorage, Layout};

/// Set to 0, every path takes candle's kernels instead of these (the "before" of BENCHMARKS.md,
/// on the same card in the same run).
pub const KERNELS_VAR: &str = "APPROX_BENCH_CUDA_KERNELS";

const SOURCE: &str = concat!(
    include_str!("common.cuh"),
    include_str!("attention.cu"),
    include_str!("sampled_logits.cu")
);

/// A kernel operand: `storage` read from its layout's start, which must be contiguous (the
/// callers make it so; `op` names the kernel in the error).
pub(crate) fn operand<'a, T: CudaDType>(
    storage: &'a CudaStorage,
    layout: &Layout,
    op: &str,
) -> candle_core::Result<CudaView<'a, T>> {
    if !layout.is_contiguous() {
        candle_core::bail!("{op}: operands must be contiguous");
    }
    Ok(storage.as_cuda_slice::<T>()?.slice(layout.start_offset()..))
}

/// Whether [`KERNELS_VAR`] turned the kernels off.
pub(crate) fn disabled() -> bool {
    std::env::var(KERNELS_VAR).is_ok_and(|v| v.trim() == "0")
}

/// The kernels as PTX for the first device's architecture, compiled once per process.
fn ptx(dev: &CudaDevice) -> candle_core::Result<Ptx> {
    static PTX: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    let src = PTX.get_or_init(|| {
        let arch = match dev.cuda_stream().context().compute_capability() {
            Ok((9, 0)) => Some("compute_90"),
            Ok((8, 0)) => Some("compute_80"),
            Ok((8, 6)) => Some("compute_86"),
            Ok((8, 9)) => Some("compute_89"),
            Ok((10, 0)) => Some("compute_100"),
            Ok((12, 0)) => Some("compute_120"),
            _ => None,
        };
        let opts = CompileOptions {
            arch,
            // Accurate expf/logf and IEEE division: the float64 check and the accuracy contract
            // are written against them.
            use_fast_math: Some(false),
            name: Some("approx-bench-kernels.cu".into()),
            ..Default::default()
        };
        compile_ptx_with_opts(SOURCE, opts)
            .map(|p| p.to_src())
            .map_err(|e| format!("{e:?}"))
    });
    match src {
        Ok(s) => Ok(Ptx::from_src(s.clone())),
        Err(e) => candle_core::bail!("NVRTC could not compile approx-bench's CUDA kernels: {e}"),
    }
}

/// The kernel `name` on `dev`, its module loaded once per device and its dynamic shared memory
/// raised to `shared` bytes (over the 48 kB default).
pub(crate) fn function(
    dev: &CudaDevice,
    name: &str,
    shared: u32,
) -> candle_core::Result<CudaFunction> {
    type Modules = Mutex<Vec<(candle_core::cuda_backend::DeviceId, Arc<CudaModule>)>>;
    static MODULES: OnceLock<Modules> = OnceLock::new();
    let modules = MODULES.get_or_init(|| Mutex::new(Vec::new()));
    let module = {
        let mut list = modules.lock().unwrap_or_else(|e| e.into_inner());
        match list.iter().find(|(id, _)| *id == dev.id()) {
            Some((_, m)) => m.clone(),
            None => {
                let m = dev.cuda_stream().context().load_module(ptx(dev)?).w()?;
                list.push((dev.id(), m.clone()));
                m
            }
        }
    };
    let func = module.load_function(name).w()?;
    func.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        shared as i32,
    )
    .w()?;
    Ok(func)
}
