//! The target: exact softmax attention O = softmax(QKᵀ/√p)V (docs/reference.md §1.1), max-shifted per
//! row, computed in row blocks so that no n×n matrix is held (n = 16384 fits in memory). Under the
//! causal mask (§7.2) row i attends to keys j ≤ i: a row block [a, a+b) multiplies only the keys
//! 0..a+b (the key blocks above the diagonal are skipped: n²p MACs instead of 2n²p) and the
//! b×b diagonal square gets −∞ above its diagonal.

use anyhow::Result;
use candle_core::{DType, Tensor, D};

use super::target::Mask;
use crate::numerics::flash;
use crate::numerics::shifted_exp::shifted_exp_rows_in_place;

mod batched;
#[cfg(test)]
mod generic_tests;
mod kernelized;
mod under_spec;
pub mod verify;

pub use batched::batched_block_rows;
pub use kernelized::kernelized_output;

/// Rows per block: about 1 M score entries (4 MB in f32, a few blocks in flight at once), but
/// at least 256 rows, below which the block products run well under the matmul's speed (n = 16384:
/// 64-row blocks reached 157 GFLOP/s, 256-row blocks 200). Never more than n.
pub fn block_rows(n: usize) -> usize {
    (1024 * 1024 / n.max(1)).max(256).min(n.max(1))
}

/// O and, on demand, the log row normalizers log D_i = log Σ_j exp(q_i·k_j/√p).
#[derive(Clone)]
pub struct ExactAttention {
    /// O, [n, p], in the inputs' dtype.
    pub output: Tensor,
    q: Tensor,
    /// K as given ([n, p]): transposed only by the paths that need Kᵀ (the fused kernels take K).
    k: Tensor,
    mask: Mask,
    log_rowsum: std::sync::OnceLock<Tensor>,
    /// What the spec had beyond `mask` ([`crate::attention::spec::AttentionSpec::beyond_mask`]),
    /// if anything: log D is then the fused kernel's or unavailable, never the mask's blocks'.
    beyond_mask: Option<&'static str>,
}

/// Applies `f` to each row block of the scores S_b = Q̃_b·Kᵀ (Q̃ = Q/√p already scaled, Kᵀ
/// contiguous) and stacks the results: the one place that walks QKᵀ without holding it whole.
/// On the CPU the blocks run in parallel on rayon's pool (each block's arithmetic is the same
/// whichever thread runs it, so the result does not depend on the thread count). On any other
/// device they are issued in order from the calling thread: a device's work comes from one host
/// thread (issue 21), and its kernels run one after another on the stream anyway.
pub fn map_score_blocks(
    qs: &Tensor,
    kt: &Tensor,
    f: impl Fn(usize, usize, Tensor) -> Result<Tensor> + Sync,
) -> Result<Tensor> {
    map_masked_score_blocks(qs, kt, Mask::None, f)
}

/// [`map_score_blocks`] under `mask`: with the causal mask, the block of rows [a, a+b) gets the
/// scores of keys 0..a+b only (its columns), −∞ where j > i; `f` sees that narrower block and
/// multiplies it with the first a+b rows of V.
pub fn map_masked_score_blocks(
    qs: &Tensor,
    kt: &Tensor,
    mask: Mask,
    f: impl Fn(usize, usize, Tensor) -> Result<Tensor> + Sync,
) -> Result<Tensor> {
    use rayon::prelude::*;
    let n = qs.dims()[0];
    let step = block_rows(n);
    let starts: Vec<usize> = (0..n).step_by(step).collect();
    let block = |&start: &usize| {
        let len = step.min(n - start);
        let qb = qs.narrow(0, start, len)?;
        let s = match mask {
            Mask::None => qb.matmul(kt)?,
            Mask::Causal => causal_scores(&qb, kt, start)?,
        };
        f(start, len, s)
    };
    let outs = if qs.device().is_cpu() {
        starts.par_iter().map(block).collect::<Result<Vec<_>>>()?
    } else {
        starts.iter().map(block).collect::<Result<Vec<_>>>()?
    };
    Ok(Tensor::cat(&outs, 0)?)
}

/// Scores of query rows start..start+b (already scaled, [b, p]) against keys 0..start+b, with −∞
/// where the key comes after the query.
pub fn causal_scores(qb: &Tensor, kt: &Tensor, start: usize) -> Result<Tensor> {
    let len = qb.dim(0)?;
    mask_after_diagonal(
        &qb.matmul(&kt.narrow(1, 0, start + len)?.contiguous()?)?,
        start,
    )
}

/// Scores [.., b, start + b] of query rows start..start+b against keys 0..start+b (any leading
/// dimensions, e.g. heads) with −∞ where the key comes after the query: the last b columns, the
/// diagonal square, get the causal mask; the columns before it are all in the past.
pub fn mask_after_diagonal(s: &Tensor, start: usize) -> Result<Tensor> {
    let last = s.rank() - 1;
    let b = s.dim(last)? - start;
    let mask = crate::tensor_util::triangle(b, 0.0, f64::NEG_INFINITY, s.device(), s.dtype())?;
    let diag = s.narrow(last, start, b)?.broadcast_add(&mask)?;
    Ok(if start == 0 {
        diag
    } else {
        Tensor::cat(&[s.narrow(last, 0, start)?, diag], last)?
    })
}

/// Q/√p (scaled once, n×p, instead of every n×n score block) and Kᵀ made contiguous.
pub fn scaled_operands(q: &Tensor, k: &Tensor) -> Result<(Tensor, Tensor)> {
    Ok((scaled_queries(q)?, k.t()?.contiguous()?))
}

/// Q̃ = Q/√p for q [n, p].
pub fn scaled_queries(q: &Tensor) -> Result<Tensor> {
    Ok((q * (1.0 / (q.dims2()?.1 as f64).sqrt()))?)
}

/// The arithmetic of exact attention's row blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExactKernel {
    /// The fused online-softmax kernel ([`crate::numerics::flash`]) on the CPU in f32 and f64, and
    /// on a CUDA device where its kernel applies ([`flash::on_device`]), else
    /// [`ExactKernel::Generic`].
    Auto,
    /// The two-pass kernel it replaced: each row block's scores written out, exponentiated in
    /// place (f32, f64 row sums), then multiplied by V. Kept for comparison (`bench`) and tests.
    TwoPass,
    /// candle's max-shifted softmax and products in the working dtype: what a non-CPU device runs
    /// where the fused device kernel does not apply. Selectable on the CPU so that tests exercise
    /// it there.
    Generic,
}

impl ExactAttention {
    pub fn compute(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Self> {
        Self::compute_with(q, k, v, Mask::None, ExactKernel::Auto)
    }

    /// Exact attention under `mask` (the causal target of docs/reference.md §7.2 with [`Mask::Causal`]).
    pub fn compute_masked(q: &Tensor, k: &Tensor, v: &Tensor, mask: Mask) -> Result<Self> {
        Self::compute_with(q, k, v, mask, ExactKernel::Auto)
    }

    pub fn compute_with(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Mask,
        kernel: ExactKernel,
    ) -> Result<Self> {
        let p = v.dim(1)?;
        let qs = scaled_queries(q)?;
        let visible = mask.visible();
        if kernel == ExactKernel::Auto && !q.device().is_cpu() {
            // The fused kernel on a CUDA device (one head as a batch of one).
            let three = |t: &Tensor| t.unsqueeze(0);
            if let Some(output) = flash::on_device(&three(&qs)?, &three(k)?, &three(v)?, visible)? {
                return Ok(Self {
                    output: output.squeeze(0)?,
                    q: qs,
                    k: k.clone(),
                    mask,
                    log_rowsum: std::sync::OnceLock::new(),
                    beyond_mask: None,
                });
            }
        }
        if kernel == ExactKernel::Auto && q.device().is_cpu() {
            if let Some((output, log_d)) = flash::on_host(&qs, k, v, visible, flash::Logits::PLAIN)?
            {
                let log_rowsum = std::sync::OnceLock::new();
                let _ = log_rowsum.set(log_d.squeeze(0)?);
                return Ok(Self {
                    output: output.squeeze(0)?,
                    q: qs,
                    k: k.clone(),
                    mask,
                    log_rowsum,
                    beyond_mask: None,
                });
            }
        }
        let kt = k.t()?.contiguous()?;
        let blocks = map_masked_score_blocks(&qs, &kt, mask, |_, _, s| {
            // The keys this block sees: all of them, or 0..a+b under the causal mask.
            let v = &v.narrow(0, 0, s.dim(1)?)?;
            let in_place = match kernel {
                ExactKernel::Auto | ExactKernel::TwoPass => shifted_exp_rows_in_place(&s)?,
                ExactKernel::Generic => None,
            };
            Ok(match in_place {
                // O_b = (E_b·V) / rowsum: the normalisation on n×p entries instead of n×n; the row
                // statistics give log D_i = m_i + log Σ_j exp(s_ij − m_i) (in f64) for free, as a
                // last column, so no method pays a second pass over QKᵀ for it.
                Some(stats) => {
                    let dev = s.device();
                    let sums = Tensor::from_iter(stats.iter().map(|&(_, z)| z as f32), dev)?
                        .unsqueeze(1)?;
                    let log_d = Tensor::from_iter(
                        stats.iter().map(|&(m, z)| (m as f64 + z.ln()) as f32),
                        dev,
                    )?
                    .unsqueeze(1)?;
                    Tensor::cat(&[s.matmul(v)?.broadcast_div(&sums)?, log_d], 1)?
                }
                // Max-shifted softmax, one allocation per block.
                None => candle_nn::ops::softmax_last_dim(&s)?.matmul(v)?,
            })
        })?;
        let log_rowsum = std::sync::OnceLock::new();
        let output = if blocks.dim(1)? == p + 1 {
            let _ = log_rowsum.set(blocks.narrow(1, p, 1)?.squeeze(1)?.contiguous()?);
            blocks.narrow(1, 0, p)?.contiguous()?
        } else {
            blocks
        };
        Ok(Self {
            output,
            q: qs,
            k: k.clone(),
            mask,
            log_rowsum,
            beyond_mask: None,
        })
    }

    /// log D ([n]): from exact attention's own pass on the CPU in f32, otherwise computed on
    /// first use (only methods that divide by the exact D need it).
    pub fn log_rowsum(&self) -> Result<&Tensor> {
        if let Some(t) = self.log_rowsum.get() {
            return Ok(t);
        }
        if let Some(feature) = self.beyond_mask {
            anyhow::bail!("log D under {feature} is computed on the host only");
        }
        let kt = self.k.t()?.contiguous()?;
        let t = map_masked_score_blocks(&self.q, &kt, self.mask, |_, _, s| {
            let m = s.max_keepdim(D::Minus1)?;
            let z = s.broadcast_sub(&m)?.exp()?.sum_keepdim(D::Minus1)?;
            Ok((m + z.log()?)?)
        })?
        .squeeze(1)?;
        Ok(self.log_rowsum.get_or_init(|| t))
    }

    /// The attention matrix P = D⁻¹A (n×n); only for methods that need it (reference curves).
    pub fn probabilities(q: &Tensor, k: &Tensor) -> Result<Tensor> {
        Self::masked_probabilities(q, k, Mask::None)
    }

    /// P under `mask` (lower triangular under the causal mask).
    pub fn masked_probabilities(q: &Tensor, k: &Tensor, mask: Mask) -> Result<Tensor> {
        let p = q.dims2()?.1;
        let s = (q.matmul(&k.t()?)? / (p as f64).sqrt())?;
        let s = match mask {
            Mask::None => s,
            Mask::Causal => mask_after_diagonal(&s, 0)?,
        };
        Ok(candle_nn::ops::softmax_last_dim(&s)?)
    }

    /// The mask this attention was computed under.
    pub fn mask(&self) -> Mask {
        self.mask
    }

    /// ‖O‖₂ (for the relative error).
    pub fn norm(&self) -> Result<f64> {
        Ok(crate::numerics::spectral::matrix_norms(&self.output.to_dtype(DType::F64)?)?.spectral)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor_util::test_device;

    fn naive(q: &[Vec<f64>], k: &[Vec<f64>], v: &[Vec<f64>]) -> Vec<Vec<f64>> {
        crate::attention::test_util::logit_rows(q, k)
            .into_iter()
            .map(|s| {
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                (0..v[0].len())
                    .map(|c| e.iter().zip(v).map(|(w, vj)| w * vj[c]).sum::<f64>() / z)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn matches_naive_softmax_and_rows_sum_to_one() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let (n, p) = (37, 8);
        let mut mk = || {
            (0..n)
                .map(|_| {
                    (0..p)
                        .map(|_| rng.random::<f64>() * 6.0 - 3.0)
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>()
        };
        let (q, k, v) = (mk(), mk(), mk());
        let t = |m: &Vec<Vec<f64>>| Tensor::new(m.clone(), &test_device()).unwrap();
        let ex = ExactAttention::compute(&t(&q), &t(&k), &t(&v)).unwrap();
        let want = naive(&q, &k, &v);
        let got: Vec<Vec<f64>> = ex.output.to_vec2().unwrap();
        for i in 0..n {
            for c in 0..p {
                assert!((got[i][c] - want[i][c]).abs() < 1e-12);
            }
        }
        let pm = ExactAttention::probabilities(&t(&q), &t(&k)).unwrap();
        for row in pm.sum(1).unwrap().to_vec1::<f64>().unwrap() {
            assert!((row - 1.0).abs() < 1e-12);
        }
        // log D from the blocks equals the direct log-sum-exp.
        let ld: Vec<f64> = ex.log_rowsum().unwrap().to_vec1().unwrap();
        let s0: f64 = k
            .iter()
            .map(|kj| {
                (q[0].iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() / (p as f64).sqrt()).exp()
            })
            .sum();
        assert!((ld[0] - s0.ln()).abs() < 1e-12);
    }

    /// The fused kernel's accuracy contract (issue 33) at long n, both masks: in f32 within 2e-6
    /// of max |O| of the float64 result, and in f64 equal to the two-pass float64 computation
    /// (candle's softmax and products) to rounding; log D likewise.
    #[test]
    fn the_fused_kernel_meets_the_accuracy_contract_at_long_n() {
        use crate::numerics::sampling::{normal_values, TrialRng};
        use rand::SeedableRng;
        let p = 64;
        for n in [4096, 16384] {
            let mut rng = TrialRng::seed_from_u64(n as u64);
            let mut mk = |std: f64| {
                crate::tensor_util::from_f64(
                    normal_values(&mut rng, n, p, std),
                    (n, p),
                    &candle_core::Device::Cpu,
                    DType::F64,
                )
                .unwrap()
            };
            let (q, k, v) = (mk(0.9), mk(0.9), mk(1.0));
            for mask in [Mask::None, Mask::Causal] {
                let want =
                    ExactAttention::compute_with(&q, &k, &v, mask, ExactKernel::Generic).unwrap();
                let want_ld = want.log_rowsum().unwrap().to_vec1::<f64>().unwrap();
                let want_o = want.output.flatten_all().unwrap().to_vec1::<f64>().unwrap();
                let scale = want_o.iter().fold(0f64, |a, b| a.max(b.abs()));
                let f64_fused = ExactAttention::compute_masked(&q, &k, &v, mask).unwrap();
                let got = f64_fused
                    .output
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f64>()
                    .unwrap();
                let worst = got
                    .iter()
                    .zip(&want_o)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max);
                assert!(worst <= 1e-13 * scale, "f64 n={n} {mask:?}: {worst:e}");
                let ld = f64_fused.log_rowsum().unwrap().to_vec1::<f64>().unwrap();
                let worst = ld
                    .iter()
                    .zip(&want_ld)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max);
                assert!(worst <= 1e-12, "f64 log D n={n} {mask:?}: {worst:e}");
                let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
                let fused32 = ExactAttention::compute_masked(&f(&q), &f(&k), &f(&v), mask).unwrap();
                let got = fused32
                    .output
                    .to_dtype(DType::F64)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f64>()
                    .unwrap();
                let worst = got
                    .iter()
                    .zip(&want_o)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max);
                assert!(
                    worst <= 2e-6 * scale,
                    "f32 n={n} {mask:?}: {:e} of max |O|",
                    worst / scale
                );
                let ld = fused32
                    .log_rowsum()
                    .unwrap()
                    .to_dtype(DType::F64)
                    .unwrap()
                    .to_vec1::<f64>()
                    .unwrap();
                let worst = ld
                    .iter()
                    .zip(&want_ld)
                    .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
                    .fold(0.0, f64::max);
                assert!(worst <= 2e-6, "f32 log D n={n} {mask:?}: {worst:e}");
            }
        }
    }

    /// The f32 CPU path (vectorised exponentials, normalisation after E·V) against the same
    /// computation in f64, over several row blocks; and against candle's f32 softmax path, whose
    /// error it must not exceed by more than rounding noise.
    #[test]
    fn f32_path_matches_f64_and_is_as_accurate_as_candles_softmax() {
        use crate::numerics::sampling::{normal_values, TrialRng};
        use rand::SeedableRng;
        let (n, p) = (1500, 64); // block_rows(1500) = 699: three blocks, the last one short
        let dev = test_device();
        let mut rng = TrialRng::seed_from_u64(7);
        let mut mk = |std: f64| {
            crate::tensor_util::from_f64(
                normal_values(&mut rng, n, p, std),
                (n, p),
                &dev,
                DType::F64,
            )
            .unwrap()
        };
        // Logits up to ≈ ±15, like BERT's first layer.
        let (q, k, v) = (mk(0.9), mk(0.9), mk(1.0));
        let f32t = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
        let reference = ExactAttention::compute(&q, &k, &v).unwrap();
        let fast = ExactAttention::compute(&f32t(&q), &f32t(&k), &f32t(&v)).unwrap();
        let candle32 = {
            let s = (f32t(&q).matmul(&f32t(&k).t().unwrap()).unwrap() / 8.0).unwrap();
            candle_nn::ops::softmax_last_dim(&s)
                .unwrap()
                .matmul(&f32t(&v))
                .unwrap()
        };
        let max_abs = |t: &Tensor| -> f64 {
            let t = t.to_dtype(DType::F64).unwrap().abs().unwrap();
            t.max_all().unwrap().to_scalar::<f64>().unwrap()
        };
        let max_err =
            |a: &Tensor| max_abs(&(a.to_dtype(DType::F64).unwrap() - &reference.output).unwrap());
        let scale = max_abs(&reference.output);
        let (e_fast, e_candle) = (max_err(&fast.output) / scale, max_err(&candle32) / scale);
        assert!(e_fast < 2e-6, "f32 path max error {e_fast:e} of max |O|");
        assert!(
            e_fast <= 1.2 * e_candle,
            "f32 path {e_fast:e} vs candle's softmax {e_candle:e}"
        );
        // log D from the row statistics against f64.
        let ld = (fast.log_rowsum().unwrap().to_dtype(DType::F64).unwrap()
            - reference.log_rowsum().unwrap())
        .unwrap();
        let worst = max_abs(&ld);
        assert!(worst < 1e-6, "log D error {worst:e}");
    }

    /// Blocks run in parallel: the output and log D must not depend on the pool's size.
    #[test]
    fn blocks_in_parallel_give_the_same_bits_on_any_thread_count() {
        use crate::numerics::sampling::{normal_values, TrialRng};
        use rand::SeedableRng;
        let (n, p) = (3000, 16); // block_rows(3000) = 349: nine blocks
        let mut rng = TrialRng::seed_from_u64(11);
        let mut mk = || {
            crate::tensor_util::from_f64(
                normal_values(&mut rng, n, p, 1.0),
                (n, p),
                &test_device(),
                DType::F32,
            )
            .unwrap()
        };
        let (q, k, v) = (mk(), mk(), mk());
        let run = |threads: usize| -> (Vec<f32>, Vec<f32>) {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let ex = ExactAttention::compute(&q, &k, &v).unwrap();
                (
                    ex.output.flatten_all().unwrap().to_vec1().unwrap(),
                    ex.log_rowsum().unwrap().to_vec1().unwrap(),
                )
            })
        };
        let one = run(1);
        for threads in [2, 3] {
            let other = run(threads);
            assert!(one
                .0
                .iter()
                .zip(&other.0)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
            assert!(one
                .1
                .iter()
                .zip(&other.1)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }

    #[test]
    fn large_logits_do_not_overflow() {
        let q = (Tensor::ones((4, 2), DType::F32, &test_device()).unwrap() * 300.0).unwrap();
        let v = Tensor::arange(0f32, 8.0, &test_device())
            .unwrap()
            .reshape((4, 2))
            .unwrap();
        let ex = ExactAttention::compute(&q, &q, &v).unwrap();
        let o: Vec<Vec<f32>> = ex.output.to_vec2().unwrap();
        assert!((o[0][0] - 3.0).abs() < 1e-5 && (o[0][1] - 4.0).abs() < 1e-5);
    }
}
