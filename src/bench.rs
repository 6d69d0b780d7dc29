//! `approx-bench bench`: per-stage times of the sweep's work on real inputs — Q/K/V, exact
//! attention (with achieved GFLOP/s against a measured matmul peak), each method at each d, the
//! metric — and peak memory. Speed is measured here, never in tests.

use std::time::Instant;

use anyhow::Result;
use candle_core::{Device, Tensor};

use crate::attention::{self, HeadInputs};
use crate::config::RunConfig;
use crate::inputs;
use crate::numerics::{sampling::TrialKey, spectral};

/// Peak resident set size of this process in MiB (Linux /proc; None elsewhere).
pub fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Median wall time of `reps` runs of `f`, in seconds (after one warm-up run).
fn time<T>(device: &Device, reps: usize, mut f: impl FnMut() -> Result<T>) -> Result<f64> {
    f()?;
    device.synchronize()?;
    let mut ts = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t0 = Instant::now();
        f()?;
        device.synchronize()?;
        ts.push(t0.elapsed().as_secs_f64());
    }
    ts.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    Ok(ts[ts.len() / 2])
}

/// The machine's matmul speed for this device and dtype, GFLOP/s: one square 2048×2048 product
/// (large enough for every thread's share to run at the kernel's full rate).
fn square_matmul_peak(device: &Device, dtype: candle_core::DType) -> Result<f64> {
    let m = 2048;
    let a = Tensor::randn(0f32, 1.0, (m, m), device)?.to_dtype(dtype)?;
    let b = Tensor::randn(0f32, 1.0, (m, m), device)?.to_dtype(dtype)?;
    let t = time(device, 5, || Ok(a.matmul(&b)?))?;
    Ok(2.0 * (m * m * m) as f64 / t / 1e9)
}

/// The matmul ceiling of exact attention's own schedule, GFLOP/s: the same parallel walk over
/// row blocks doing only the two products of each block (S_b = Q̃_b·Kᵀ, then S_b·V), 4n²p flops,
/// with no exponentials. Exact attention's share of it is what its softmax costs.
fn matmul_peak(device: &Device, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<f64> {
    let (n, p) = q.dims2()?;
    let (qs, kt) = attention::exact::scaled_operands(q, k)?;
    let t = time(device, 7, || {
        attention::exact::map_score_blocks(&qs, &kt, |_, _, s| Ok(s.matmul(v)?))
    })?;
    Ok(4.0 * (n * n * p) as f64 / t / 1e9)
}

pub fn run(cfg: &RunConfig, reps: usize) -> Result<()> {
    // A median of no timing is no measurement.
    if reps == 0 {
        return Err(crate::usage!(
            "--repeats 0: give at least 1 timed repetition per stage (default 5)"
        ));
    }
    let t0 = Instant::now();
    // Window 0 of the longest length is every token the bench reads.
    let need = cfg.lengths.iter().max().copied().unwrap_or(0);
    let prepared = inputs::prepare_for(&cfg.inputs, need)?;
    crate::sweep::refuse_decode_of_encoder(cfg, &prepared)?;
    // What the sweep refuses on this layer, so that no timing is of a path a sweep would not run.
    let methods = cfg
        .methods
        .iter()
        .map(|m| attention::by_id(m).map_err(|e| crate::usage!("{e}")))
        .collect::<Result<Vec<_>>>()?;
    crate::sweep::spec_refusals::refuse_for_layer(cfg, &prepared, &methods)?;
    println!(
        "inputs: {:.3} s (resolve, tokenize {} tokens, load weights)",
        t0.elapsed().as_secs_f64(),
        prepared.corpus.ids.len()
    );
    // A device's work from one host thread, as in a sweep (runtime::on_device_thread).
    crate::runtime::on_device_thread(&prepared.device.clone(), || timed(cfg, reps, &prepared))
}

/// The time to read window 0's Q/K/V back from a Q/K/V cache (stored once in a temporary
/// directory first): what a rerun pays instead of the forward. Decoders only (BERT's are not
/// cached by default).
fn cached_qkv_seconds(
    cfg: &RunConfig,
    prepared: &inputs::Prepared,
    n: usize,
    reps: usize,
) -> Result<Option<f64>> {
    // The Q/K/V cache keeps the Llama-style decoders' dumps only.
    if prepared.model.decoder().is_none() || prepared.model.family().is_some() {
        return Ok(None);
    }
    let dir = tempfile_dir()?;
    let cache = inputs::qkv_cache::QkvCache::open(&dir, &cfg.inputs, &prepared.files)?;
    let compute = || prepared.window_qkv(&cfg.inputs, n, 0);
    cache.get_or_compute(n, 0, &prepared.device, compute)?;
    let t = time(&prepared.device, reps, || {
        cache.get_or_compute(n, 0, &prepared.device, compute)
    });
    let _ = std::fs::remove_dir_all(&dir);
    anyhow::ensure!(
        cache.usage().hits == reps + 1,
        "the cache did not serve the reads"
    );
    t.map(Some)
}

/// A fresh directory under the system's temporary directory.
fn tempfile_dir() -> Result<std::path::PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("approx-bench-qkv-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn timed(cfg: &RunConfig, reps: usize, prepared: &inputs::Prepared) -> Result<()> {
    let dtype = cfg.inputs.candle_dtype();
    let dev = &prepared.device;
    let p = prepared.head_dim();
    println!(
        "device {:?}, dtype {dtype:?}, threads {}; matmul peak (square 2048³ product) {:.1} GFLOP/s ({}); kernel path {} ({}=avx512|avx2|portable)",
        dev,
        rayon::current_num_threads(),
        square_matmul_peak(dev, dtype)?,
        crate::numerics::flash::tiles::gemm_isa(),
        crate::numerics::flash::Simd::chosen().name(),
        crate::numerics::flash::tiles::SIMD_VAR,
    );
    // The layer's exact attention: a §7.7 family's own (scale, cap, window, sinks), else the mask's.
    let spec = prepared
        .layer_spec(cfg.inputs.layer, cfg.mask, p)
        .for_head(0);
    for &n in &cfg.lengths {
        let (window, head) = time_exact(cfg, reps, prepared, &spec, n)?;
        time_methods(cfg, reps, prepared, &spec, n, window, head)?;
    }
    if let Some(rss) = peak_rss_mib() {
        println!("\npeak RSS {rss:.0} MiB");
    }
    Ok(())
}

/// The exact attention of one window of length n (head 0, and batched over heads where a device
/// runs that path), its Q/K/V and the kernels' throughput, printed; returns the window's Q/K/V
/// (with an MLA layer's latent view) and head 0's.
fn time_exact(
    cfg: &RunConfig,
    reps: usize,
    prepared: &inputs::Prepared,
    spec: &attention::AttentionSpec,
    n: usize,
) -> Result<(WindowQkv, (Tensor, Tensor, Tensor))> {
    let dev = &prepared.device;
    let p = prepared.head_dim();
    let t_qkv = time(dev, reps, || prepared.window_qkv(&cfg.inputs, n, 0))?;
    let window = prepared.window_qkv_latent(&cfg.inputs, n, 0)?;
    let (q, k, v) = (&window.0, &window.1, &window.2);
    let (qh, kh, vh) = (
        q.get(0)?.contiguous()?,
        k.get(0)?.contiguous()?,
        v.get(0)?.contiguous()?,
    );
    let mask = cfg.mask;
    let plain = spec.features(p, n).is_plain();
    // compute_spec is compute_masked on a plain spec: the same kernel as a sweep's target.
    let t_exact = time(dev, reps, || {
        attention::exact::ExactAttention::compute_spec(&qh, &kh, &vh, &spec)
    })?;
    // The window's heads in one computation batched over heads (what a sweep on a non-CPU
    // device runs, K/V shared by grouped query heads); timed on the CPU only when that path is
    // asked for there (candle's generic ops make it 5× slower than the per-head path on the CPU:
    // 757 against 159 ms per head at n = 8192, BENCHMARKS.md).
    let batched = plain && (!dev.is_cpu() || crate::sweep::device_path(dev));
    let t_batched = if batched {
        Some(time(dev, reps, || {
            attention::exact::ExactAttention::compute_heads_masked(&q, &k, &v, mask)
        })?)
    } else {
        None
    };
    // 4p flops per (query, key) pair the target reads: causal skips the key blocks above the
    // diagonal, a sliding window those before it.
    let flops = 4.0 * (p * visible_pairs(&spec, n)) as f64;
    let peak = matmul_peak(dev, &qh, &kh, &vh)?;
    println!(
        "\nn = {n}: Q/K/V of one window (all heads) {:.2} ms",
        t_qkv * 1e3
    );
    if let Some(t) = cached_qkv_seconds(cfg, prepared, n, reps)? {
        println!(
            "  the same Q/K/V read back from the Q/K/V cache (a rerun's cost, verified) {:.2} ms",
            t * 1e3
        );
    }
    println!(
        "  exact attention per head {:.2} ms = {:.1} GFLOP/s (4p flops and an exp per query–key pair read); the two-pass kernel's block matmuls alone: {:.1} GFLOP/s ({:.0} %)",
        t_exact * 1e3,
        flops / t_exact / 1e9,
        peak,
        100.0 * flops / t_exact / 1e9 / peak
    );
    if dev.is_cpu() && plain {
        let t_two = time(dev, reps, || {
            attention::exact::ExactAttention::compute_with(
                &qh,
                &kh,
                &vh,
                mask,
                attention::exact::ExactKernel::TwoPass,
            )
        })?;
        println!(
            "  the two-pass kernel the fused one replaced (score blocks written out, exponentiated, then ·V) {:.2} ms = {:.1} GFLOP/s: fused/two-pass time {:.2}",
            t_two * 1e3,
            flops / t_two / 1e9,
            t_exact / t_two
        );
    }
    let heads = q.dim(0)?;
    if let Some(t_batched) = t_batched {
        println!(
            "  exact attention of all {heads} heads batched over heads {:.2} ms = {:.2} ms per head = {:.1} GFLOP/s",
            t_batched * 1e3,
            t_batched * 1e3 / heads as f64,
            heads as f64 * flops / t_batched / 1e9
        );
    }
    if !plain {
        println!("  (the layer's own target: {spec}; exact attention reads its window's keys)");
    } else if mask == attention::Mask::Causal {
        println!("  (mask causal: exact attention is n(n+1)p MACs per head)");
    }
    if cfg.target == attention::Target::Kernelized {
        let t_target = time(dev, reps, || {
            attention::exact::kernelized_output(&qh, &kh, &vh, candle_core::DType::F64)
        })?;
        println!(
            "  the kernelized target C·V per head (f64, the reference of every error) {:.2} ms",
            t_target * 1e3
        );
    }
    Ok((window, (qh, kh, vh)))
}

/// A window's Q, K, V and an MLA layer's latent view.
type WindowQkv = (
    Tensor,
    Tensor,
    Tensor,
    Option<std::sync::Arc<attention::latent::LayerLatent>>,
);

/// Each method of the run at each budget on head 0 of the window (one trial per repeat, on an
/// empty memo), and the metric, printed.
fn time_methods(
    cfg: &RunConfig,
    reps: usize,
    prepared: &inputs::Prepared,
    spec: &attention::AttentionSpec,
    n: usize,
    (q, k, v, latent): WindowQkv,
    (qh, kh, vh): (Tensor, Tensor, Tensor),
) -> Result<()> {
    let dev = &prepared.device;
    let (p, mask) = (prepared.head_dim(), cfg.mask);
    // Under --decode (docs/reference.md §9.1) head 0 of a fresh layer context per repeat, so that a
    // §9 method pays its per-window scores each time, as the first budget of a sweep does.
    let fresh_decode = || -> Result<Option<attention::decode::DecodeHead>> {
        Ok(crate::sweep::layer_context(cfg, prepared, &q, &k, &v)?
            .map(|layer| attention::decode::DecodeHead { head: 0, layer }))
    };
    let protocol = crate::protocol::Protocol::of(cfg.decode);
    let mut head = HeadInputs::with_spec(qh, kh, vh, spec.clone())?;
    if let Some(layer) = latent {
        // An MLA layer's §8 caches read its latent row, as in the sweep.
        head = head.with_latent(attention::latent::HeadLatent { layer, head: 0 })?;
    }
    // The target is the sweep's per-head reference, computed before any method's clock.
    head.target_output(cfg.target)?;
    let mut shown = None;
    println!(
        "  (each repeat on an empty per-head memo: svd_optimal's SVD and topk's ranking, which a sweep \
         computes once per head for the whole d grid, are counted in full)"
    );
    println!(
        "  {:<18} {:>5} {:>10} {:>12}",
        "method", "d", "ms/head", "GMAC/s"
    );
    for m in &cfg.methods {
        let method = attention::by_id(m).map_err(|e| crate::usage!("{e}"))?;
        for d in attention::layer_budgets(m, &cfg.features, spec.window_within(n)) {
            let key = TrialKey {
                seed: cfg.seed,
                n,
                window: 0,
                head: 0,
                method: m,
                d,
            };
            let t = time(dev, reps, || {
                let dec = fresh_decode()?;
                one_trial(
                    method.as_ref(),
                    &head.with_empty_memo(),
                    dec.as_ref(),
                    d,
                    &key,
                )
            })?;
            let macs =
                crate::protocol::Protocol::of(cfg.decode).macs(method.as_ref(), n, p, d, mask);
            println!(
                "  {:<18} {:>5} {:>10.3} {:>12.2}",
                m,
                d,
                t * 1e3,
                macs / t / 1e9
            );
            if shown.is_none() {
                let dec = fresh_decode()?;
                shown = Some(one_trial(method.as_ref(), &head, dec.as_ref(), d, &key)?.output);
            }
        }
    }
    if let Some(out) = shown {
        let target = protocol.scored(&head.target_output(cfg.target)?)?;
        let t_metric = time(dev, reps, || spectral::error_norms(&target, &out))?;
        println!(
            "  metric ‖O − Ô‖₂ (Gram + power iteration) {:.3} ms",
            t_metric * 1e3
        );
    }
    Ok(())
}

/// One trial of `m` on `head` at `d`: under the decode protocol with `dec`, the head's place in
/// its layer.
fn one_trial(
    m: &dyn attention::Method,
    head: &HeadInputs,
    dec: Option<&attention::decode::DecodeHead>,
    d: usize,
    key: &TrialKey,
) -> Result<attention::Approximation> {
    match dec {
        Some(dec) => m
            .decoding()
            .ok_or_else(|| {
                crate::usage!(
                    "--methods {}: it does not run under --decode (docs/reference.md §9.1)",
                    m.id()
                )
            })?
            .approximate_decode(head, dec, d, &mut key.rng()),
        // A scaled head's rescaled form where the method reads the scale through Q and K, as a
        // sweep's trial does.
        None => m.approximate(head.inputs_for(m)?, d, &mut key.rng()),
    }
}

/// The (query, key) pairs `spec`'s target reads in a window of n: n² unmasked, n(n+1)/2 causal,
/// Σ_i min(i + 1, W) with a sliding window of W.
fn visible_pairs(spec: &attention::AttentionSpec, n: usize) -> usize {
    match (spec.causal, spec.window_within(n)) {
        (false, _) => n * n,
        (true, None) => n * (n + 1) / 2,
        (true, Some(w)) => (0..n).map(|i| (i + 1).min(w)).sum(),
    }
}
