//! A window on a device (or on the CPU under `APPROX_BENCH_DEVICE_PATH=1`): one host thread issues
//! the work (`runtime::on_device_thread`), and the window's heads form the batch dimension of the
//! exact targets, of each method's trials at one d ([`attention::Method::approximate_heads`]) and of the
//! metric, so a GPU runs a few [B, n, ·] kernels where it ran B rounds of small ones (issue 21).
//! The host-only parts (random draws, small eigenproblems, power iterations) run on the host's
//! threads meanwhile. Rows come out in the CPU path's order (head, method, d).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::{DType, Tensor};

use super::TrialContext;
use crate::attention::exact::verify::TargetCheck;
use crate::attention::spec::AttentionSpec;
use crate::attention::{self, batch::each_head, HeadBatch, HeadInputs, HeadTrials};
use crate::numerics::{sampling::TrialKey, spectral};
use crate::protocol::pipeline::{HeadTarget, Protocol};
use crate::report::trials::TrialRow;

/// Set to 0, the device path runs each method head by head (its batched targets and metric
/// stay): the "before" of BENCHMARKS.md's batching table, on the same card in the same run.
pub const HEAD_BATCH_VAR: &str = "APPROX_BENCH_HEAD_BATCH";

/// Set to 1, a sweep on the device path prints where its time went (stderr, at the end).
pub const PROFILE_VAR: &str = "APPROX_BENCH_PROFILE";

/// Seconds spent per phase of the device path, summed over windows (nanoseconds).
static PHASES: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];
const PHASE_NAMES: [&str; 5] = [
    "Q/K/V",
    "exact targets (batched over heads)",
    "targets to f64, row check, ‖O‖₂",
    "methods (synchronised)",
    "metric (‖O − Ô‖, flags, mass)",
];

fn add_phase(i: usize, t0: Instant) {
    PHASES[i].fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

/// The phase report, if [`PROFILE_VAR`] asked for one.
pub(super) fn profile_report() -> Option<String> {
    if !std::env::var(PROFILE_VAR).is_ok_and(|v| v.trim() == "1") {
        return None;
    }
    let lines: Vec<String> = PHASE_NAMES
        .iter()
        .zip(&PHASES)
        .map(|(name, ns)| {
            format!(
                "  {:>9.3} s  {name}",
                ns.load(Ordering::Relaxed) as f64 / 1e9
            )
        })
        .collect();
    Some(format!(
        "device path, time per phase:\n{}",
        lines.join("\n")
    ))
}

fn env_is(var: &str, value: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v.trim() == value)
}

impl TrialContext<'_> {
    /// Every missing trial of the window's heads `jobs`, from the window's q [H, n, p] and
    /// k, v [H_kv, n, p].
    pub(super) fn window_on_device(
        &self,
        jobs: &[usize],
        missing: &(dyn Fn(usize, &str, usize) -> bool + Sync),
    ) -> Result<Vec<TrialRow>> {
        let (cfg, n, w) = (self.cfg, self.n, self.window);
        let t0 = Instant::now();
        let (q, k, v) = self.prepared.window_qkv(&cfg.inputs, n, w)?;
        self.prepared.device.synchronize()?;
        add_phase(0, t0);

        let t0 = Instant::now();
        let exacts = match cfg.target {
            attention::Target::Softmax => Some(
                attention::exact::ExactAttention::compute_heads_masked(&q, &k, &v, cfg.mask)?,
            ),
            attention::Target::Kernelized => None,
        };
        self.prepared.device.synchronize()?;
        add_phase(1, t0);

        // Each head's target in f64, a sample of its rows checked against float64 on the host
        // (all heads at once) before any of its rows can be written, and its norm.
        let t0 = Instant::now();
        let (h_all, hkv) = (q.dim(0)?, k.dim(0)?);
        let mut heads = Vec::with_capacity(jobs.len());
        for &h in jobs {
            let kv = crate::numerics::gqa::kv_head(h, h_all, hkv);
            let (qh, kh, vh) = (q.get(h)?, k.get(kv)?, v.get(kv)?);
            heads.push(match &exacts {
                Some(e) => HeadInputs::with_exact(qh, kh, vh, e[h].clone())?,
                None => HeadInputs::masked(qh, kh, vh, cfg.mask)?,
            });
        }
        let batch = HeadBatch::new(heads, jobs, &q, &k, &v)?;
        let targets: Vec<Tensor> = batch
            .heads
            .iter()
            .map(|h| h.unchecked_target_output(cfg.target))
            .collect::<Result<_>>()?;
        let target = Tensor::stack(&targets, 0)?; // [B, n, p], f64
        let check = TargetCheck::gather(&batch.q, &batch.k, &batch.v, &target)?;
        // The window's heads are built under the run's mask (HeadInputs::masked): its plain spec.
        let spec = AttentionSpec::of_mask(cfg.mask, batch.q.dim(2)?);
        let exact_norms = spectral::batch_matrix_norms(&target)?;
        add_phase(2, t0);
        // The check runs on the host's threads while the device runs the methods; the window's
        // rows are returned only if it passes.
        std::thread::scope(|scope| {
            let checked = scope.spawn(|| check.verify(cfg.target, &spec, Some(jobs)));
            let rows = self.methods_on_device(&batch, &target, &exact_norms, jobs, missing);
            checked
                .join()
                .map_err(|_| anyhow::anyhow!("the target check panicked"))?
                .with_context(|| format!("layer {}, n = {n}, window {w}", cfg.inputs.layer))?;
            rows
        })
    }

    /// Every missing trial of the batch's heads, method after method and d after d, in the CPU
    /// path's row order.
    fn methods_on_device(
        &self,
        batch: &HeadBatch,
        target: &Tensor,
        exact_norms: &[spectral::ErrorNorms],
        jobs: &[usize],
        missing: &(dyn Fn(usize, &str, usize) -> bool + Sync),
    ) -> Result<Vec<TrialRow>> {
        let (cfg, n, w) = (self.cfg, self.n, self.window);
        let (h_all, hkv) = (self.prepared.heads(), self.prepared.kv_heads());

        let batched = !env_is(HEAD_BATCH_VAR, "0");
        // Each head's slice of the batch's checked target: the pipeline measures against it.
        let heads: Vec<HeadTarget> = batch
            .heads
            .iter()
            .zip(exact_norms)
            .enumerate()
            .map(|(b, (head, norm))| {
                Ok(HeadTarget::from_parts(
                    head,
                    cfg.target,
                    Protocol::Prefill,
                    target.get(b)?,
                    norm.spectral,
                ))
            })
            .collect::<Result<_>>()?;
        let mut rows = Vec::new();
        for (mi, m) in self.methods.iter().enumerate() {
            for (di, d) in attention::layer_budgets(m.id(), &cfg.features, self.spec.window)
                .into_iter()
                .enumerate()
            {
                let need: Vec<bool> = jobs.iter().map(|&h| missing(h, m.id(), d)).collect();
                if !need.contains(&true) {
                    continue;
                }
                // Every head of the batch runs (a resumed window may recompute a trial it has;
                // only the missing rows are kept): each trial's seed is its own, so a head's
                // result does not depend on which others run beside it.
                let seeds: Vec<u64> = jobs
                    .iter()
                    .map(|&h| {
                        TrialKey {
                            seed: cfg.seed,
                            n,
                            window: w,
                            head: h,
                            method: m.id(),
                            d,
                        }
                        .derive_seed()
                    })
                    .collect();
                self.bar
                    .set_message(format!("n={n} w={w} {} d={d}", m.id()));
                let t0 = Instant::now();
                for head in &batch.heads {
                    attention::refuse_unimplemented_spec(m.as_ref(), head)?;
                }
                let trials = HeadTrials::new(batch, d, &seeds)?;
                let approx = if batched {
                    m.approximate_heads(&trials)
                } else {
                    each_head(m.as_ref(), &trials)
                }
                .with_context(|| {
                    format!(
                        "method {} at n = {n}, window {w}, heads {jobs:?}, d = {d}",
                        m.id()
                    )
                })?;
                self.prepared.device.synchronize()?;
                // The batch's time, shared equally by its heads (trials.csv `seconds`).
                let seconds = t0.elapsed().as_secs_f64() / jobs.len() as f64;
                add_phase(3, t0);

                let t0 = Instant::now();
                let (norms, flagged, agreements) = score_heads(target, &approx)?;
                for (b, a) in approx.iter().enumerate() {
                    if !need[b] {
                        continue;
                    }
                    let measured = heads[b].measured(
                        Some(m.as_ref()),
                        d,
                        a,
                        seeds[b],
                        seconds,
                        norms[b],
                        agreements[b],
                        flagged[b],
                    )?;
                    let h = jobs[b];
                    let at =
                        self.row_at(h, crate::numerics::gqa::kv_head(h, h_all, hkv), m.id(), d);
                    rows.push(((b, mi, di), at.row(&measured)));
                    self.bar.inc(1);
                }
                add_phase(4, t0);
            }
        }
        rows.sort_by_key(|(key, _)| *key);
        Ok(rows.into_iter().map(|(_, row)| row).collect())
    }
}

/// Each head's ‖O − Ô‖, [`super::flagged_rows`] and agreement measures: Ô of all heads stacked
/// once in f64, one batched Gram product, one copy to the host for the flags and normalisers of
/// all heads and one for their agreement sums (per head, these were 20 small kernels and a copy
/// each: 41 of the Skyformer preset's 77 s on an H200).
#[allow(clippy::type_complexity)]
fn score_heads(
    target: &Tensor,
    approx: &[attention::Approximation],
) -> Result<(
    Vec<spectral::ErrorNorms>,
    Vec<usize>,
    Vec<crate::numerics::agreement::Agreement>,
)> {
    let outputs: Vec<&Tensor> = approx.iter().map(|a| &a.output).collect();
    let out = Tensor::stack(&outputs, 0)?.to_dtype(DType::F64)?; // [B, n, p]
    let (b, n) = (out.dim(0)?, out.dim(1)?);
    let norms = spectral::batch_matrix_norms(&(target - &out)?)?;
    let agreements = crate::numerics::agreement::agreement_heads(target, &out)?;
    // 0·x summed per row: NaN exactly where the row of Ô has a non-finite entry.
    let mut checks = vec![(&out * 0.0)?.sum(2)?];
    let normalised = approx.iter().all(|a| a.normalizer.is_some());
    if normalised {
        let ds: Vec<Tensor> = approx
            .iter()
            .filter_map(|a| a.normalizer.as_ref())
            .map(|t| t.to_dtype(DType::F64)?.flatten_all())
            .collect::<candle_core::Result<_>>()?;
        checks.push(Tensor::stack(&ds, 0)?);
    }
    let host: Vec<f64> = Tensor::stack(&checks, 0)?.flatten_all()?.to_vec1()?;
    let flagged = (0..b)
        .map(|i| {
            let rows = &host[i * n..(i + 1) * n];
            if normalised {
                Ok(crate::protocol::trial::count_flagged(
                    rows,
                    Some(&host[(b + i) * n..(b + i + 1) * n]),
                ))
            } else if approx[i].normalizer.is_some() {
                // Some heads with a normaliser and some without (a user's method): one by one.
                super::flagged_rows(&approx[i])
            } else {
                Ok(crate::protocol::trial::count_flagged(rows, None))
            }
        })
        .collect::<Result<_>>()?;
    Ok((norms, flagged, agreements))
}
