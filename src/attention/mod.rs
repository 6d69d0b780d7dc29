//! Attention: the exact softmax target and every approximation, one file per method.
//!
//! A method sees one head's Q, K, V ([n, p] tensors on a candle `Device`, in the run's dtype)
//! plus shared per-head products ([`HeadInputs`]), and a seeded generator for its randomness.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use candle_core::{DType, Device, Tensor};

use crate::numerics::sampling::TrialRng;

pub mod column_uniform;
pub mod exact;
pub mod informer;
pub mod linformer;
pub mod nystromformer;
pub mod performer;
pub mod skeinformer;
pub mod skyformer;
pub mod svd_optimal;
pub mod vmean;

/// One head's inputs and the products every method and d may share (computed once per head).
pub struct HeadInputs {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    /// The exact target O = softmax(QKᵀ/√p)V and log D (log row sums of exp(QKᵀ/√p)).
    pub exact: exact::ExactAttention,
    /// Per-head memo for products a method reuses across d (e.g. the SVD of P).
    memo: Mutex<HashMap<&'static str, Arc<dyn Any + Send + Sync>>>,
}

impl HeadInputs {
    /// Builds the head's inputs and computes the exact target once.
    pub fn new(q: Tensor, k: Tensor, v: Tensor) -> Result<Self> {
        let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
        let exact = exact::ExactAttention::compute(&q, &k, &v)?;
        Ok(Self {
            q,
            k,
            v,
            exact,
            memo: Mutex::new(HashMap::new()),
        })
    }

    pub fn n(&self) -> usize {
        self.q.dims()[0]
    }
    pub fn p(&self) -> usize {
        self.q.dims()[1]
    }
    pub fn dtype(&self) -> DType {
        self.q.dtype()
    }
    pub fn device(&self) -> &Device {
        self.q.device()
    }

    /// Returns the memoized value under `key`, computing it with `f` on first use.
    pub fn memo<T: Any + Send + Sync>(
        &self,
        key: &'static str,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<Arc<T>> {
        if let Some(v) = self.memo.lock().expect("memo lock").get(key) {
            return v
                .clone()
                .downcast::<T>()
                .map_err(|_| anyhow::anyhow!("memo type mismatch for {key}"));
        }
        let value: Arc<T> = Arc::new(f()?);
        self.memo
            .lock()
            .expect("memo lock")
            .insert(key, value.clone());
        Ok(value)
    }
}

/// What a method returns: Ô ([n, p]) and, for methods that divide by an estimated row
/// normalizer D̂, that normalizer ([n]) so that rows with D̂ ≤ 0 can be counted (never clamped).
pub struct Approximation {
    pub output: Tensor,
    pub normalizer: Option<Tensor>,
}

impl Approximation {
    pub fn plain(output: Tensor) -> Self {
        Self {
            output,
            normalizer: None,
        }
    }
}

/// An attention approximation scored by the benchmark.
pub trait Method: Send + Sync {
    /// The CLI and CSV id.
    fn id(&self) -> &'static str;
    /// One line: what the feature count d means for this method.
    fn feature_meaning(&self) -> &'static str;
    /// Whether Ô depends on the random generator (deterministic methods give one value per head).
    fn is_random(&self) -> bool;
    /// Leading multiply-add count (METHODS.md §2.11).
    fn macs(&self, n: usize, p: usize, d: usize) -> f64;
    /// Why (n, d) cannot be run, if it cannot.
    fn check(&self, n: usize, d: usize) -> std::result::Result<(), String> {
        if d == 0 {
            return Err("d must be at least 1".into());
        }
        let _ = n;
        Ok(())
    }
    /// Computes Ô for one head with d features.
    fn approximate(&self, head: &HeadInputs, d: usize, rng: &mut TrialRng)
        -> Result<Approximation>;
}

/// Every method, in the order figures and tables list them.
pub fn registry() -> Vec<Box<dyn Method>> {
    use skeinformer::{SkeinVariant, Skeinformer};
    vec![
        Box::new(skyformer::Skyformer::pseudo_inverse()),
        Box::new(nystromformer::Nystromformer),
        Box::new(performer::Performer::reference()),
        Box::new(informer::Informer::log_factor()),
        Box::new(Skeinformer::new(SkeinVariant::Full)),
        Box::new(vmean::VMean),
        Box::new(linformer::Linformer::reference()),
        Box::new(skyformer::Skyformer::iterative()),
        Box::new(performer::Performer::favor()),
        Box::new(informer::Informer::direct()),
        Box::new(linformer::Linformer::unreduced_jlt()),
        Box::new(Skeinformer::new(SkeinVariant::Uniform)),
        Box::new(Skeinformer::new(SkeinVariant::NoNorm)),
        Box::new(Skeinformer::new(SkeinVariant::SimpleNorm)),
        Box::new(Skeinformer::new(SkeinVariant::NoPilot)),
        Box::new(svd_optimal::SvdOptimal),
        Box::new(column_uniform::ColumnUniform),
    ]
}

/// The ids of every registered method.
pub fn method_ids() -> Vec<&'static str> {
    registry().iter().map(|m| m.id()).collect()
}

/// Looks a method up by id; the error lists the known ids.
pub fn by_id(id: &str) -> std::result::Result<Box<dyn Method>, String> {
    registry()
        .into_iter()
        .find(|m| m.id() == id)
        .ok_or_else(|| {
            format!(
                "unknown method '{id}'; known methods: {}",
                method_ids().join(", ")
            )
        })
}

/// Row-wise max-shifted softmax over the last dimension (re-exported so methods share one).
pub fn row_softmax(x: &Tensor) -> Result<Tensor> {
    Ok(candle_nn::ops::softmax_last_dim(x)?)
}

/// x · p^{-1/4}: the input scaling under which q̃·k̃ = q·k/√p (METHODS.md §1.1).
pub fn quarter_scale(x: &Tensor, p: usize) -> Result<Tensor> {
    Ok((x * (p as f64).powf(-0.25))?)
}

/// Ones column of length n, [n, 1].
pub fn ones_col(n: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    Ok(Tensor::ones((n, 1), dtype, device)?)
}

/// Helpers shared by the methods' tests.
#[cfg(test)]
pub(crate) mod test_util {
    use crate::tensor_util::test_device;
    use candle_core::DType;
    use nalgebra::DMatrix;
    use rand::SeedableRng;
    use rand_distr::{Distribution, StandardNormal};

    use super::{Approximation, HeadInputs, Method};
    use crate::numerics::sampling::{normal_values, TrialRng};
    use crate::tensor_util::from_f64;

    /// An r×c matrix of iid N(0, std²) values.
    pub fn gauss(rng: &mut TrialRng, r: usize, c: usize, std: f64) -> DMatrix<f64> {
        DMatrix::from_fn(r, c, |_, _| {
            let z: f64 = StandardNormal.sample(rng);
            z * std
        })
    }

    /// The same head with Q, K, V in f32 (its exact target recomputed in f32).
    pub fn in_f32(h: &HeadInputs) -> HeadInputs {
        let f = |t: &candle_core::Tensor| t.to_dtype(DType::F32).unwrap();
        HeadInputs::new(f(&h.q), f(&h.k), f(&h.v)).unwrap()
    }

    /// `m` at d with the trial generator seeded by `seed`.
    pub fn run_seeded(m: &dyn Method, h: &HeadInputs, d: usize, seed: u64) -> Approximation {
        m.approximate(h, d, &mut TrialRng::seed_from_u64(seed))
            .unwrap()
    }

    /// A randomized method is a function of its seed: `seed` twice gives the same Ô, `seed + 1`
    /// another. Returns the run for `seed`.
    pub fn assert_seed_determines_output(
        m: &dyn Method,
        h: &HeadInputs,
        d: usize,
        seed: u64,
    ) -> Approximation {
        let rows = |a: &Approximation| {
            a.output
                .to_dtype(DType::F64)
                .unwrap()
                .to_vec2::<f64>()
                .unwrap()
        };
        let a = run_seeded(m, h, d, seed);
        assert_eq!(
            rows(&a),
            rows(&run_seeded(m, h, d, seed)),
            "{} not reproducible",
            m.id()
        );
        assert_ne!(
            rows(&a),
            rows(&run_seeded(m, h, d, seed + 1)),
            "{} ignores the seed",
            m.id()
        );
        a
    }

    /// Every entry of `t` is finite.
    pub fn assert_all_finite(t: &candle_core::Tensor) {
        let v = t.flatten_all().unwrap().to_dtype(DType::F64).unwrap();
        assert!(v.to_vec1::<f64>().unwrap().iter().all(|x| x.is_finite()));
    }

    /// ‖O − Ô_V-Mean‖₂ of a head (every row of Ô the mean of V).
    pub fn vmean_error(h: &HeadInputs) -> f64 {
        let mean =
            h.v.mean_keepdim(0)
                .unwrap()
                .broadcast_as(h.v.shape())
                .unwrap();
        crate::numerics::spectral::error_norms(&h.exact.output, &mean)
            .unwrap()
            .spectral
    }

    /// A head with iid N(0, 1) Q, K, V of shape [n, p] from `seed`.
    pub fn random_head(n: usize, p: usize, seed: u64, dtype: DType) -> HeadInputs {
        let mut rng = TrialRng::seed_from_u64(seed);
        let mut mk = || {
            from_f64(
                normal_values(&mut rng, n, p, 1.0),
                (n, p),
                &test_device(),
                dtype,
            )
            .unwrap()
        };
        let (q, k, v) = (mk(), mk(), mk());
        HeadInputs::new(q, k, v).unwrap()
    }
}
