//! Small key sets on the CPU: each query against its group's gathered keys, in plain loops.
//!
//! Why a second path: a batched product over thousands of tiny groups (per-row sets; BigBird's
//! and Reformer's blocks at d ≤ 16) is a loop of thousands of small gemm calls whose fixed cost
//! per call dominated (reformer and topk at n = 4096 spent about 200 ms per head there). A dot
//! product per visited pair, with lanes that vectorise, does the same 2p MACs per pair without
//! the per-call overhead. Computed in f64 (logits, shifted exps,
//! row sums and the weighted sum of V), whatever the working dtype; the result is cast back.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};

use super::{ChunkOut, KeyGroup, RowFilter};

/// τ·Q, K, V as host f64 rows, and the soft-cap.
pub(super) struct HostHead {
    qs: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    p: usize,
    pv: usize,
    softcap: Option<f64>,
}

impl HostHead {
    pub(super) fn new(qs: &Tensor, k: &Tensor, v: &Tensor, softcap: Option<f64>) -> Result<Self> {
        let flat = |t: &Tensor| -> Result<Vec<f64>> {
            Ok(t.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?)
        };
        Ok(Self {
            qs: flat(qs)?,
            k: flat(k)?,
            v: flat(v)?,
            p: qs.dim(1)?,
            pv: v.dim(1)?,
            softcap,
        })
    }

    /// The chunk's groups, one output slot per row, in `dtype`.
    pub(super) fn run_groups(
        &self,
        groups: &[KeyGroup],
        chunk: &[usize],
        filter: Option<RowFilter>,
        want_log: bool,
        dtype: DType,
    ) -> Result<ChunkOut> {
        let (p, pv) = (self.p, self.pv);
        let slot_rows: Vec<Option<usize>> = chunk
            .iter()
            .flat_map(|&g| groups[g].rows.iter().map(|&i| Some(i)))
            .collect();
        let mut out = vec![0f64; slot_rows.len() * pv];
        let mut logs = Vec::with_capacity(slot_rows.len());
        let mut s: Vec<(usize, f64)> = Vec::new();
        let mut slot = 0;
        for &g in chunk {
            let KeyGroup { rows, keys } = &groups[g];
            for &i in rows {
                let qi = &self.qs[i * p..][..p];
                s.clear();
                s.extend(
                    keys.iter()
                        .filter(|&&j| filter.is_none_or(|f| f(i, j)))
                        .map(|&j| (j, self.logit(dot(qi, &self.k[j * p..][..p])))),
                );
                anyhow::ensure!(!s.is_empty(), "key sets: query row {i} visits no key");
                let m = s.iter().fold(f64::NEG_INFINITY, |m, &(_, x)| m.max(x));
                let o = &mut out[slot * pv..][..pv];
                let mut z = 0.0;
                for &(j, x) in &s {
                    let e = (x - m).exp();
                    z += e;
                    for (oc, vc) in o.iter_mut().zip(&self.v[j * pv..][..pv]) {
                        *oc += e * vc;
                    }
                }
                o.iter_mut().for_each(|x| *x /= z);
                logs.push(m + z.ln());
                slot += 1;
            }
        }
        let dev = Device::Cpu;
        Ok(ChunkOut {
            output: Tensor::from_vec(out, (slot, pv), &dev)?.to_dtype(dtype)?,
            log_normalizer: want_log
                .then(|| Tensor::from_vec(logs, slot, &dev))
                .transpose()?,
            slot_rows,
        })
    }
}

impl HostHead {
    /// τ·q·k to the logit: capped with a soft-cap.
    fn logit(&self, s: f64) -> f64 {
        match self.softcap {
            Some(c) => c * (s / c).tanh(),
            None => s,
        }
    }
}

/// Σ a_c·b_c with 8 independent partial sums (a fixed order, so the result does not depend on
/// the CPU, and wide enough to vectorise).
fn dot(a: &[f64], b: &[f64]) -> f64 {
    const LANES: usize = 8;
    let mut acc = [0f64; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        // Fixed-size views: no bounds checks in the lane loop, so it compiles to vector code.
        let (x, y): (&[f64; LANES], &[f64; LANES]) = (x.try_into().unwrap(), y.try_into().unwrap());
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f64>() + tail
}
