//! One head's inputs ([`HeadInputs`]): Q, K, V, the layer's exact attention, and the products
//! every method and d may share, each computed once per head ([`Memo`]).

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::Result;
use candle_core::{DType, Device, Tensor};

use super::{exact, latent, refuse_unimplemented_spec, spec, Mask, Method, SpecFeatures, Target};

/// One head's inputs and the products every method and d may share (computed once per head).
pub struct HeadInputs {
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    /// Which keys each query attends to: part of the target (docs/reference.md §7.2); the
    /// user's choice, which `spec` refines.
    pub mask: Mask,
    /// The layer's exact attention (docs/reference.md §7.7.0): the target is computed and checked
    /// under it, and a method that does not yet implement what it has beyond `mask` is refused
    /// ([`refuse_unimplemented_spec`]). One head's: its sinks, if any, hold its own σ_h alone
    /// ([`spec::AttentionSpec::for_head`]).
    pub spec: spec::AttentionSpec,
    /// Exact softmax attention, computed on first use (a kernelized run never needs it).
    exact: OnceLock<exact::ExactAttention>,
    /// The kernelized target C·V in f64, computed on first use.
    kernelized: OnceLock<Tensor>,
    /// Per-head memo for products a method reuses across d (e.g. the SVD of P).
    memo: Memo,
    /// [`HeadInputs::method_inputs`]'s rescaled head, built on first use.
    rescaled: OnceLock<Box<HeadInputs>>,
    /// On an MLA layer, the window's latent rows and this head's W_kvb (docs/reference.md
    /// §7.7.5): what the §8 caches quantize there ([`Method::reads_mla_latent`]); None elsewhere.
    pub latent: Option<latent::HeadLatent>,
}

impl HeadInputs {
    /// The head's inputs; each target is computed once, when first asked for.
    pub fn new(q: Tensor, k: Tensor, v: Tensor) -> Result<Self> {
        Self::masked(q, k, v, Mask::None)
    }

    /// A head whose target is under `mask`.
    pub fn masked(q: Tensor, k: Tensor, v: Tensor, mask: Mask) -> Result<Self> {
        let spec = spec::AttentionSpec::of_mask(mask, q.dim(1)?);
        Self::with_spec(q, k, v, spec)
    }

    /// A head whose target is under the layer's `spec`.
    pub fn with_spec(q: Tensor, k: Tensor, v: Tensor, spec: spec::AttentionSpec) -> Result<Self> {
        let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
        Ok(Self {
            q,
            k,
            v,
            mask: spec.mask(),
            spec,
            exact: OnceLock::new(),
            kernelized: OnceLock::new(),
            memo: Memo::default(),
            rescaled: OnceLock::new(),
            latent: None,
        })
    }

    /// The head with its MLA layer's latent view, checked against its Q and V.
    pub fn with_latent(mut self, latent: latent::HeadLatent) -> Result<Self> {
        latent.check(&self.q, &self.v)?;
        self.latent = Some(latent);
        Ok(self)
    }

    /// The head with its exact attention already computed (e.g. batched over a window's heads,
    /// [`exact::ExactAttention::compute_heads`]).
    pub fn with_exact(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        exact: exact::ExactAttention,
    ) -> Result<Self> {
        let head = Self::masked(q, k, v, exact.mask())?;
        let _ = head.exact.set(exact);
        Ok(head)
    }

    /// The same head with an empty memo, keeping the targets already computed: a method then
    /// pays for its per-head products again, as one trial on its own does (`bench` times each
    /// repeat so; a sweep pays them once per head, at the first d).
    pub fn with_empty_memo(&self) -> Self {
        Self {
            q: self.q.clone(),
            k: self.k.clone(),
            v: self.v.clone(),
            mask: self.mask,
            spec: self.spec.clone(),
            exact: self.exact.clone(),
            kernelized: self.kernelized.clone(),
            memo: Memo::default(),
            rescaled: OnceLock::new(),
            latent: self.latent.clone(),
        }
    }

    /// Rows start..start + len of the target's probabilities under the head's spec, computed in
    /// `dtype` (docs/reference.md §7.7.6: the methods that read P read this one): τ, capped, zero
    /// outside the window, over the real keys (with a sink a row sums to 1 − its probability).
    /// Causal: [len, start + len], keys 0..start + len; bidirectional: [len, n].
    pub fn spec_probability_rows(&self, start: usize, len: usize, dtype: DType) -> Result<Tensor> {
        let q4 = self.q.to_dtype(dtype)?.unsqueeze(0)?.unsqueeze(0)?;
        let k3 = self.k.to_dtype(dtype)?.unsqueeze(0)?;
        let sinks = match self.spec.sink(0) {
            Some(s) => Some(Tensor::new(&[[[[s]]]], self.device())?.to_dtype(dtype)?),
            None => None,
        };
        let (p, j0) = spec::probability_block(&q4, &k3, &self.spec, sinks.as_ref(), (start, len))?;
        let p = p.squeeze(0)?.squeeze(0)?;
        Ok(if j0 == 0 {
            p
        } else {
            let before = Tensor::zeros((len, j0), dtype, self.device())?;
            Tensor::cat(&[&before, &p], 1)?
        })
    }

    /// The head's logits as the key-set softmax takes them: its τ, cap and own sink
    /// (docs/reference.md §7.7.6).
    pub fn key_logits(&self) -> crate::numerics::key_sets::KeyLogits {
        crate::numerics::key_sets::KeyLogits {
            scale: self.spec.scale,
            softcap: self.spec.softcap,
            sink: self.spec.sink(0),
        }
    }

    /// The inputs a method runs on (docs/reference.md §7.7.6, Scale): this head when τ = 1/√p;
    /// otherwise Q·s and K·s with s = (τ·√p)^½ under the mask's plain spec, whose logits
    /// (s·q)·(s·k)/√p are this head's τ·q·k. The symmetric split is §7.7.6's own for Performer
    /// (its factor p^(−1/4) on Q and K becomes √τ); every method that reads Q and K only through
    /// scaled products, their ranks, row means and sign-of-projection hashes (the scale-supporting
    /// ones, [`Method::spec_support`]) is then itself on this layer. Errors on a spec with a
    /// feature other than the scale (a method implementing those runs on the head itself).
    pub fn method_inputs(&self) -> Result<&HeadInputs> {
        let (p, n) = (self.p(), self.n());
        let features = self.spec.features(p, n);
        if !features.scale {
            return Ok(self);
        }
        anyhow::ensure!(
            features == SpecFeatures::SCALE,
            "rescaled inputs stand for a spec whose only feature is its scale, not {features:?}"
        );
        if let Some(h) = self.rescaled.get() {
            return Ok(h);
        }
        let s = (self.spec.scale / spec::default_scale(p)).sqrt();
        let head = HeadInputs::with_spec(
            (&self.q * s)?,
            (&self.k * s)?,
            self.v.clone(),
            spec::AttentionSpec::of_mask(self.mask, p),
        )?;
        Ok(self.rescaled.get_or_init(|| Box::new(head)))
    }

    /// What `m` runs on for a prefill trial of this head: the head itself when `m` reads the spec
    /// (or the spec is plain), else [`Self::method_inputs`]; a usage error when the layer has a
    /// feature `m` does not implement ([`refuse_unimplemented_spec`]). The sweep's pipeline and
    /// the Python face's `approximate` both pass here, so their trials are the same.
    pub fn inputs_for(&self, m: &dyn Method) -> Result<&HeadInputs> {
        refuse_unimplemented_spec(m, self)?;
        if m.reads_spec() {
            Ok(self)
        } else {
            self.method_inputs()
        }
    }

    /// Exact softmax attention O = softmax(QKᵀ/√p)V in the inputs' dtype, with log D on demand.
    pub fn exact(&self) -> Result<&exact::ExactAttention> {
        if let Some(e) = self.exact.get() {
            return Ok(e);
        }
        let e = exact::ExactAttention::compute_spec(&self.q, &self.k, &self.v, &self.spec)?;
        Ok(self.exact.get_or_init(|| e))
    }

    /// The kernelized target O_C = C·V ([n, p], f64; docs/reference.md §6.4.1 computes it in float64).
    pub fn kernelized(&self) -> Result<&Tensor> {
        if let Some(t) = self.kernelized.get() {
            return Ok(t);
        }
        let t = exact::kernelized_output(&self.q, &self.k, &self.v, DType::F64)?;
        Ok(self.kernelized.get_or_init(|| t))
    }

    /// What methods are scored against under `target`, in f64, after a sample of its rows was
    /// checked against a float64 recomputation on the host ([`exact::verify`]): a wrong target is
    /// an error, never a row. Every row: a protocol that scores fewer narrows it
    /// (`protocol::Protocol::scored`).
    pub fn target_output(&self, target: Target) -> Result<Tensor> {
        let out = self.unchecked_target_output(target)?;
        exact::verify::check_target_rows(target, &self.spec, &self.q, &self.k, &self.v, &out)?;
        Ok(out)
    }

    /// [`HeadInputs::target_output`] before its check: for a caller that checks a batch of heads
    /// at once ([`exact::verify::check_target_rows_heads`]) before it scores any of them.
    pub fn unchecked_target_output(&self, target: Target) -> Result<Tensor> {
        Ok(match target {
            Target::Softmax => self.exact()?.output.to_dtype(DType::F64)?,
            Target::Kernelized => self.kernelized()?.clone(),
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
        self.memo.get_or_compute(key, f)
    }
}

/// Products a method computes once and reuses across d, by key (a head's or a batch's).
#[derive(Default)]
pub struct Memo(Mutex<HashMap<&'static str, Arc<dyn Any + Send + Sync>>>);

impl Memo {
    /// The value under `key`, computed with `f` on first use.
    pub fn get_or_compute<T: Any + Send + Sync>(
        &self,
        key: &'static str,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<Arc<T>> {
        if let Some(v) = self.0.lock().expect("memo lock").get(key) {
            return v
                .clone()
                .downcast::<T>()
                .map_err(|_| anyhow::anyhow!("memo type mismatch for {key}"));
        }
        let value: Arc<T> = Arc::new(f()?);
        self.0.lock().expect("memo lock").insert(key, value.clone());
        Ok(value)
    }
}
