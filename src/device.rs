//! The compute device a spec names (`cpu`, `cuda`, `cuda:N`), parsed and opened on the ground floor:
//! the inputs (a run's Q/K/V, `--device`) and the tests ([`crate::tensor_util::test_device`]) open
//! devices the same way.

use anyhow::Result;
use candle_core::Device;

/// The run's compute device: CPU, or CUDA device `ordinal` when built with `--features cuda`.
pub fn device(spec: &str) -> Result<Device> {
    match spec {
        "cpu" => Ok(Device::Cpu),
        s if s == "cuda" || s.starts_with("cuda:") => {
            let ordinal: usize = s
                .strip_prefix("cuda:")
                .map(|o| o.parse())
                .transpose()
                .map_err(|_| crate::usage!("--device {s}: expected cuda or cuda:N"))?
                .unwrap_or(0);
            if !candle_core::utils::cuda_is_available() {
                return Err(crate::usage!(
                    "--device {s}: this build has no CUDA support; rebuild with `cargo build --release --features cuda` on a machine with the CUDA toolkit, or use --device cpu"
                ));
            }
            #[cfg(feature = "cuda")]
            {
                let missing = missing_cuda_libraries();
                if !missing.is_empty() {
                    return Err(crate::usage!(
                        "--device {s}: cannot load {}: install the NVIDIA driver and the CUDA 13 libraries, or put the directory that holds them on LD_LIBRARY_PATH (README.md, \"GPU\")",
                        missing.join(", ")
                    ));
                }
            }
            // One explicit stream for every host thread. candle's `Device::new_cuda` binds the
            // device to CUDA's *per-thread* default stream, so work issued from two host threads
            // (the main thread's Q/K/V, a rayon worker's exact attention) lands on two streams
            // with no order between them, and the stream-ordered allocator hands a buffer freed on
            // one to the other while a kernel still reads it: the wrong exact targets of issue 21
            // (right under CUDA_LAUNCH_BLOCKING=1, different from run to run). On one stream every
            // launch, copy, free and cuBLAS call is ordered as the host issued it; a rayon join
            // orders the issuing threads, so program order is stream order.
            Ok(Device::new_cuda_with_stream(ordinal)
                .map_err(|e| crate::usage!("--device {s}: cannot open the GPU ({e})"))?)
        }
        other => Err(crate::usage!(
            "--device {other}: unknown device; use cpu, cuda or cuda:N"
        )),
    }
}

/// The CUDA libraries that candle's CUDA device opens, as "libX.so.N (what)" for each one the dynamic
/// loader cannot find. A binary from scripts/build-cuda.sh links none of them: cudarc loads them on
/// first use and panics when one is missing, so they are looked up here first to say what is missing
/// (the names cudarc tries, CUDA 13's sonames included). In a binary linked against them (a plain
/// `cargo build --features cuda`), they are already loaded and this finds them all.
#[cfg(feature = "cuda")]
fn missing_cuda_libraries() -> Vec<String> {
    const LIBS: [(&str, &str, &str); 5] = [
        ("cuda", "1", "the NVIDIA driver"),
        ("cublas", "13", "cuBLAS"),
        ("cublasLt", "13", "cuBLASLt"),
        ("curand", "10", "cuRAND"),
        ("nvrtc", "13", "NVRTC"),
    ];
    let loads = |name: &str| {
        let c = std::ffi::CString::new(name).expect("no NUL in a library name");
        // SAFETY: dlopen with a valid C string; the handle is closed again at once.
        unsafe {
            let h = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
            if !h.is_null() {
                libc::dlclose(h);
            }
            !h.is_null()
        }
    };
    LIBS.iter()
        .filter(|(lib, _, _)| {
            !["", ".13", ".12", ".11", ".10", ".9", ".1"]
                .iter()
                .any(|v| loads(&format!("lib{lib}.so{v}")))
        })
        .map(|(lib, v, what)| format!("lib{lib}.so.{v} ({what})"))
        .collect()
}
