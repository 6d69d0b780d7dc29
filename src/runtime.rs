//! Process-wide settings made once at start-up, before any thread exists: the thread budget and
//! the allocator's treatment of large buffers.
//!
//! approx-bench parallelises at coarse grain itself (heads of a window; row blocks of exact
//! attention) on rayon's global pool. Two defaults of candle 0.11's CPU backend fight that:
//! - its element-wise pool ("barrier pool") spins on a barrier and serialises callers behind one
//!   lock, so two heads in flight wait on each other: on the issue-6 workload the whole process
//!   took 3.5 s with it and 1.7 s without (BENCHMARKS.md). We keep it to the calling thread
//!   (`CANDLE_NUM_THREADS=1`) unless the user set that variable;
//! - its matmul asks `RAYON_NUM_THREADS` for its thread count on every call and, when unset,
//!   parses /proc/cpuinfo each time (≈ 5 % of the run in system time). Setting the variable to
//!   the pool's size makes that a lookup and keeps gemm and rayon agreeing on one number.
//!
//! Allocator (glibc): candle allocates a fresh buffer for every op's result. Past glibc's default
//! thresholds those buffers of a few MB are mapped and unmapped (or trimmed) each time, so every
//! op pays page faults on memory it had a moment ago; at n = 16384 that was a third to half of the
//! per-trial time of the O(nd) methods (BENCHMARKS.md). Buffers up to 32 MB are kept in the heap
//! and freed memory is not trimmed: the process keeps its high-water mark (which the peak RSS
//! reports anyway) instead of faulting it in again.

use anyhow::Result;

/// Environment variable read by rayon and by candle's matmul.
const RAYON_VAR: &str = "RAYON_NUM_THREADS";
/// Environment variable read by candle's element-wise pool.
const CANDLE_VAR: &str = "CANDLE_NUM_THREADS";

/// Resolves the thread count (`--threads`, else `RAYON_NUM_THREADS`, else the available cores),
/// exports it for candle and builds rayon's global pool. Call it first thing in `main`, while
/// the process is single-threaded (it writes environment variables).
pub fn configure(requested: Option<usize>) -> Result<usize> {
    let from_env = std::env::var(RAYON_VAR)
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|&n| n > 0);
    let threads = match requested {
        Some(0) => {
            return Err(crate::usage!(
                "--threads 0: give at least 1 (or leave it out to use every available core)"
            ))
        }
        Some(n) => n,
        None => from_env.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        }),
    };
    std::env::set_var(RAYON_VAR, threads.to_string());
    if std::env::var_os(CANDLE_VAR).is_none() {
        std::env::set_var(CANDLE_VAR, "1");
    }
    keep_freed_memory();
    // Fails only if the pool was already built (a second call): the first size stands.
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global();
    Ok(rayon::current_num_threads())
}

/// Largest buffer glibc serves from its heap instead of a fresh mapping (its own ceiling).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 32 << 20;

/// See the module comment. A no-op outside glibc.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX);
    }
}

/// Runs `f` so that all of a device's work is issued from one host thread: directly on the CPU
/// (whose tensors are host memory, parallel on rayon's pool as usual), otherwise on a dedicated
/// one-thread rayon pool, where every nested parallel iterator of a method runs on that same
/// thread. With one stream per device (`inputs::qkv::device`) the stream then sees the work in
/// the order the program issues it, and no cuBLAS handle is shared between concurrent callers
/// (issue 21). Kernels run one after another on a stream anyway, so a GPU loses nothing.
pub fn on_device_thread<T: Send>(device: &candle_core::Device, f: impl FnOnce() -> T + Send) -> T {
    if device.is_cpu() {
        return f();
    }
    DEVICE_POOL
        .get_or_init(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .thread_name(|_| "approx-bench-device".into())
                .build()
                .expect("a one-thread pool")
        })
        .install(f)
}

static DEVICE_POOL: std::sync::OnceLock<rayon::ThreadPool> = std::sync::OnceLock::new();

/// `f` over `items` in parallel on the host's threads, in order: pure host work (no tensor op)
/// that a device's issuing thread hands out, such as the B small eigenproblems or random draws of
/// a batch of heads, while the device waits. Called from the device thread it runs on a pool of
/// the run's thread count beside it (a nested parallel loop there would stay on that one thread);
/// anywhere else on rayon's global pool.
pub fn host_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync + Send) -> Vec<R> {
    use rayon::prelude::*;
    host_install(|| items.par_iter().map(f).collect())
}

/// Runs `f`, whose parallel iterators then use the host's threads as in [`host_map`]: on the host
/// pool when called from a device's issuing thread, else on rayon's global pool.
pub fn host_install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let on_device = DEVICE_POOL
        .get()
        .is_some_and(|p| p.current_thread_index().is_some());
    if !on_device {
        return f();
    }
    static HOST_POOL: std::sync::OnceLock<rayon::ThreadPool> = std::sync::OnceLock::new();
    HOST_POOL
        .get_or_init(|| {
            // The run's thread count, as `configure` exported it (rayon's count here is the device
            // pool's one thread).
            let threads = std::env::var(RAYON_VAR)
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .filter(|&n| n > 0)
                .unwrap_or(1);
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("approx-bench-host-{i}"))
                .build()
                .expect("a host pool")
        })
        .install(f)
}

/// The memory a run may take, in bytes: `APPROX_BENCH_MEMORY_GB` where set (a container's
/// limit, or a share of a machine), else what is available to a new allocation now (Linux's
/// `MemAvailable`, which counts reclaimable page cache); None where neither can be read.
pub fn memory_available() -> Result<Option<u64>> {
    if let Ok(v) = std::env::var("APPROX_BENCH_MEMORY_GB") {
        return match v.trim().parse::<f64>() {
            Ok(gb) if gb.is_finite() && gb > 0.0 => Ok(Some((gb * 1e9) as u64)),
            _ => Err(crate::usage!(
                "APPROX_BENCH_MEMORY_GB={v}: give the memory a run may take in GB, a positive number (e.g. 20), or unset it"
            )),
        };
    }
    let meminfo = || -> Option<u64> {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    };
    Ok(meminfo())
}

/// This process's peak resident memory so far, in bytes (Linux's `VmHWM`), or None.
pub fn peak_resident_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
