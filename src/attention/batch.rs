//! A window's heads as one batch: what a sweep on a device hands a method at once, so that its
//! products run as [B, n, ·] batched kernels instead of B rounds of small ones (issue 21).
//!
//! A method that batches overrides [`super::Method::approximate_heads`]; the default runs the
//! heads one by one. Either way a head's Ô is its own trial's (same seed, same draws), within
//! rounding: batched products may round differently from per-head ones, never more.

use anyhow::{ensure, Result};
use candle_core::{DType, Device, Tensor};

use super::{Approximation, HeadInputs, Mask, Memo, Method};
use crate::tensor_util::index_tensor;

/// B heads of one window: each head's [`HeadInputs`] and their Q, K, V stacked as [B, n, p].
pub struct HeadBatch {
    /// The heads, in batch order (their targets already set where the sweep batched them).
    pub heads: Vec<HeadInputs>,
    /// [B, n, p] each. K and V hold each query head's K/V head: with grouped-query heads the
    /// shared rows are gathered once per query head here (the methods' operands differ per query
    /// head anyway; exact attention, the only quadratic product, broadcasts instead).
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    /// Per-batch memo for products a method reuses across d (its scaled operands).
    pub memo: Memo,
}

impl HeadBatch {
    /// The batch of `heads`; q [H, n, p] and k, v [H_kv, n, p] are the window's tensors from
    /// which the heads were taken, `index[b]` the query head of `heads[b]`.
    pub fn new(
        heads: Vec<HeadInputs>,
        index: &[usize],
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<Self> {
        ensure!(
            !heads.is_empty() && heads.len() == index.len(),
            "a head batch needs one index per head"
        );
        let (h, hkv) = (q.dim(0)?, k.dim(0)?);
        let dev = q.device();
        let kv_index: Vec<usize> = index
            .iter()
            .map(|&i| crate::numerics::gqa::kv_head(i, h, hkv))
            .collect();
        let all_q = index.iter().copied().eq(0..h);
        let pick = |t: &Tensor, idx: &[usize], whole: bool| -> Result<Tensor> {
            if whole {
                Ok(t.contiguous()?)
            } else {
                Ok(t.index_select(&index_tensor(idx, dev)?, 0)?.contiguous()?)
            }
        };
        let kv_whole = kv_index.iter().copied().eq(0..hkv);
        Ok(Self {
            q: pick(q, index, all_q)?,
            k: pick(k, &kv_index, kv_whole)?,
            v: pick(v, &kv_index, kv_whole)?,
            heads,
            memo: Memo::default(),
        })
    }

    /// A batch of one head (tests, and the Python face's single heads).
    pub fn single(head: HeadInputs) -> Result<Self> {
        let (q, k, v) = (
            head.q.unsqueeze(0)?,
            head.k.unsqueeze(0)?,
            head.v.unsqueeze(0)?,
        );
        Self::new(vec![head], &[0], &q, &k, &v)
    }

    pub fn len(&self) -> usize {
        self.heads.len()
    }
    pub fn is_empty(&self) -> bool {
        self.heads.is_empty()
    }
    pub fn n(&self) -> usize {
        self.heads[0].n()
    }
    pub fn p(&self) -> usize {
        self.heads[0].p()
    }
    pub fn mask(&self) -> Mask {
        self.heads[0].mask
    }
    pub fn dtype(&self) -> DType {
        self.q.dtype()
    }
    pub fn device(&self) -> &Device {
        self.q.device()
    }

    /// Rows of the flattened [B·rows, ·] tensor for per-head row indices `idx[b]` (each of the
    /// same length), offset by b·rows: one gather serves every head.
    pub fn flat_index(idx: &[Vec<usize>], rows: usize, dev: &Device) -> Result<Tensor> {
        let flat: Vec<usize> = idx
            .iter()
            .enumerate()
            .flat_map(|(b, r)| r.iter().map(move |&i| b * rows + i))
            .collect();
        index_tensor(&flat, dev)
    }
}

/// One method's trials at one d on a batch of heads: head b with its own trial's seed `seeds[b]`.
pub struct HeadTrials<'a> {
    pub batch: &'a HeadBatch,
    pub d: usize,
    pub seeds: &'a [u64],
}

impl<'a> HeadTrials<'a> {
    pub fn new(batch: &'a HeadBatch, d: usize, seeds: &'a [u64]) -> Result<Self> {
        ensure!(seeds.len() == batch.len(), "one seed per head of the batch");
        Ok(Self { batch, d, seeds })
    }

    /// Each head's approximation from a batched result: Ô [B, n, p] and, for a method with an
    /// estimated normaliser, that normaliser [B, n] (f64).
    pub fn per_head(
        &self,
        out: &Tensor,
        normalizer: Option<&Tensor>,
    ) -> Result<Vec<Approximation>> {
        (0..self.batch.len())
            .map(|b| {
                Ok(Approximation {
                    output: out.get(b)?,
                    normalizer: normalizer.map(|t| t.get(b)).transpose()?,
                    support: None,
                })
            })
            .collect()
    }
}

/// Each head's own trial, one after another: [`Method::approximate_heads`]'s default, and a
/// batching method's fallback for the forms it does not batch.
pub fn each_head<M: Method + ?Sized>(m: &M, t: &HeadTrials) -> Result<Vec<Approximation>> {
    t.batch
        .heads
        .iter()
        .zip(t.seeds)
        .map(|(h, &s)| m.approximate_trial(h, t.d, s))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{by_id, test_util::gauss};
    use crate::numerics::sampling::TrialRng;
    use crate::tensor_util::{from_dmatrix, test_device};
    use rand::SeedableRng;

    /// `heads` matrices n×p of N(0, 1) values, stacked as [heads, n, p] in `dtype`.
    fn stacked(rng: &mut TrialRng, heads: usize, n: usize, p: usize, dtype: DType) -> Tensor {
        let dev = test_device();
        let ts: Vec<Tensor> = (0..heads)
            .map(|_| from_dmatrix(&gauss(rng, n, p, 1.0), &dev, dtype).unwrap())
            .collect();
        Tensor::stack(&ts, 0).unwrap()
    }

    fn max_rel(got: &Tensor, want: &Tensor) -> f64 {
        let f = |t: &Tensor| t.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
        let diff = (f(got) - f(want)).unwrap().abs().unwrap().max(0).unwrap();
        let scale = f(want).abs().unwrap().max(0).unwrap();
        diff.to_scalar::<f64>().unwrap() / scale.to_scalar::<f64>().unwrap()
    }

    /// Each batching method, on three of four query heads over two K/V heads (grouped-query), in
    /// both dtypes and at d below, at and above n's divisors: head b of the batch is head b's own
    /// trial with its own seed, within rounding (the batched products are the same products).
    /// In f32 on the CPU the two are within 1e-6 of max |Ô| (bit-identical in most cases); a GPU's
    /// batched GEMMs sum in another order than its single ones, which the iterative inverse of
    /// nystromformer amplifies: 1.4e-6 measured on an H200, hence 1e-5 (≈ 84 ε of f32) there.
    #[test]
    fn every_batched_method_gives_each_head_its_own_trial() {
        let (n, p) = (120, 16);
        let jobs = [0usize, 2, 3];
        let mut beyond = Vec::new();
        for dtype in [DType::F64, DType::F32] {
            let mut rng = TrialRng::seed_from_u64(3);
            let q = stacked(&mut rng, 4, n, p, dtype);
            let k = stacked(&mut rng, 2, n, p, dtype);
            let v = stacked(&mut rng, 2, n, p, dtype);
            let heads: Vec<HeadInputs> = jobs
                .iter()
                .map(|&h| {
                    let kv = h / 2;
                    HeadInputs::new(q.get(h).unwrap(), k.get(kv).unwrap(), v.get(kv).unwrap())
                        .unwrap()
                })
                .collect();
            let batch = HeadBatch::new(heads, &jobs, &q, &k, &v).unwrap();
            let tol = match (dtype, test_device().is_cpu()) {
                (DType::F64, _) => 1e-12,
                (_, true) => 1e-6,
                _ => 1e-5,
            };
            for id in [
                "skyformer",
                "skyformer_iter",
                "nystromformer",
                "performer",
                "informer",
                "informer_mask",
                "linformer",
                "linformer_jlt",
                "vmean",
            ] {
                let m = by_id(id).unwrap();
                let mut worst = 0.0f64;
                for d in [7, 24, 40, 200] {
                    let seeds: Vec<u64> = jobs
                        .iter()
                        .map(|&h| 100 + 7 * h as u64 + d as u64)
                        .collect();
                    let trials = HeadTrials::new(&batch, d, &seeds).unwrap();
                    let got = m.approximate_heads(&trials).unwrap();
                    assert_eq!(got.len(), jobs.len());
                    for (b, g) in got.iter().enumerate() {
                        let want = m.approximate_trial(&batch.heads[b], d, seeds[b]).unwrap();
                        let mut e = max_rel(&g.output, &want.output);
                        match (&g.normalizer, &want.normalizer) {
                            (Some(a), Some(w)) => e = e.max(max_rel(a, w)),
                            (None, None) => {}
                            _ => panic!("{id}: a normaliser on one side only"),
                        }
                        worst = worst.max(e);
                        if e.is_nan() || e > tol {
                            beyond.push(format!("{id} {dtype:?} d = {d} head {}: {e:e}", jobs[b]));
                        }
                    }
                }
                // Shown with --nocapture: the measured differences, for the bounds above.
                eprintln!("{id} {dtype:?}: worst {worst:e} of max |Ô| (bound {tol:e})");
            }
        }
        assert!(beyond.is_empty(), "beyond rounding: {beyond:#?}");
    }

    #[test]
    fn a_batch_keeps_each_query_head_s_kv_head() {
        let mut rng = TrialRng::seed_from_u64(4);
        let (q, k, v) = (
            stacked(&mut rng, 4, 8, 2, DType::F64),
            stacked(&mut rng, 2, 8, 2, DType::F64),
            stacked(&mut rng, 2, 8, 2, DType::F64),
        );
        let jobs = [1usize, 2];
        let heads = jobs
            .iter()
            .map(|&h| {
                HeadInputs::new(
                    q.get(h).unwrap(),
                    k.get(h / 2).unwrap(),
                    v.get(h / 2).unwrap(),
                )
                .unwrap()
            })
            .collect();
        let batch = HeadBatch::new(heads, &jobs, &q, &k, &v).unwrap();
        for (b, &h) in jobs.iter().enumerate() {
            assert_eq!(max_rel(&batch.q.get(b).unwrap(), &q.get(h).unwrap()), 0.0);
            assert_eq!(
                max_rel(&batch.k.get(b).unwrap(), &k.get(h / 2).unwrap()),
                0.0
            );
            assert_eq!(
                max_rel(&batch.v.get(b).unwrap(), &v.get(h / 2).unwrap()),
                0.0
            );
        }
        assert!(HeadBatch::new(vec![], &[], &q, &k, &v).is_err());
    }
}
