//! The Python face of approx-bench: arrays in, arrays out. Every computation is the library's
//! own (the same code path as the CLI's trials); this file only converts numpy arrays to candle
//! tensors and errors to Python exceptions. Argument checking and conversion of torch/JAX
//! arrays happen in `approx_bench/__init__.py`.

use candle_core::{DType, Device, Tensor};
use numpy::ndarray::{Array2, Array3};
use std::path::PathBuf;

use numpy::{IntoPyArray, PyReadonlyArray2};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use approx_bench::attention::{self, AttentionSpec, HeadInputs, Mask, Target};
use approx_bench::config::{InputConfig, RunConfig, UserMethod};
use approx_bench::numerics::{sampling, spectral};

mod run;
mod user_method;

/// A library error as a Python exception: usage errors (the caller's to fix) are ValueError.
fn err(e: anyhow::Error) -> PyErr {
    if e.downcast_ref::<approx_bench::UsageError>().is_some() {
        PyValueError::new_err(format!("{e:#}"))
    } else {
        PyRuntimeError::new_err(format!("{e:#}"))
    }
}

/// The KeyboardInterrupt (or other exception) a signal handler raised while a run polled Python's
/// signals ([`python_signals`]), to be raised again once the run has stopped and kept its rows.
static PENDING_SIGNAL: std::sync::Mutex<Option<PyErr>> = std::sync::Mutex::new(None);

/// Python's pending signals, asked at every poll of a run (issue 57): Python runs its SIGINT
/// handler only when the main thread asks, and a run released the GIL. A raised exception stops
/// the run as SIGINT does the CLI's (every finished row kept, the manifest `interrupted`).
fn python_signals() -> Option<i32> {
    Python::attach(|py| match py.check_signals() {
        Ok(()) => None,
        Err(e) => {
            *PENDING_SIGNAL.lock().expect("signal lock") = Some(e);
            Some(2) // SIGINT
        }
    })
}

/// Runs `f` with the GIL released and Python's signals polled; a signal's exception is raised
/// once `f` has stopped, any other error mapped as [`err`].
fn interruptible<T: Send>(
    py: Python<'_>,
    f: impl FnOnce() -> anyhow::Result<T> + Send,
) -> PyResult<T> {
    approx_bench::interrupt::reset();
    approx_bench::interrupt::set_host_check(Some(python_signals));
    let out = py.detach(f);
    approx_bench::interrupt::set_host_check(None);
    approx_bench::interrupt::reset();
    let pending = PENDING_SIGNAL.lock().expect("signal lock").take();
    match (out, pending) {
        (Ok(v), None) => Ok(v),
        (_, Some(e)) => Err(e),
        (Err(e), None) => Err(err(e)),
    }
}

fn cerr(e: candle_core::Error) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

/// A 2-D float32 or float64 array as a CPU tensor of the same dtype.
fn tensor(name: &str, a: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    fn from<T: numpy::Element + candle_core::WithDType + Copy>(
        a: PyReadonlyArray2<'_, T>,
    ) -> PyResult<Tensor> {
        let view = a.as_array();
        let shape = (view.nrows(), view.ncols());
        let data: Vec<T> = view.iter().copied().collect();
        Tensor::from_vec(data, shape, &Device::Cpu).map_err(cerr)
    }
    if let Ok(x) = a.extract::<PyReadonlyArray2<'_, f32>>() {
        from(x)
    } else if let Ok(x) = a.extract::<PyReadonlyArray2<'_, f64>>() {
        from(x)
    } else {
        Err(PyValueError::new_err(format!(
            "{name}: expected a 2-D float32 or float64 array [n, p]"
        )))
    }
}

/// A 2-D tensor as a numpy array of its dtype (f32 or f64).
fn array<'py>(py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyAny>> {
    let (n, p) = t.dims2().map_err(cerr)?;
    let flat = t.flatten_all().map_err(cerr)?;
    Ok(match t.dtype() {
        DType::F64 => {
            let v = flat.to_vec1::<f64>().map_err(cerr)?;
            Array2::from_shape_vec((n, p), v)
                .expect("shape matches")
                .into_pyarray(py)
                .into_any()
        }
        _ => {
            let v = flat
                .to_dtype(DType::F32)
                .and_then(|f| f.to_vec1::<f32>())
                .map_err(cerr)?;
            Array2::from_shape_vec((n, p), v)
                .expect("shape matches")
                .into_pyarray(py)
                .into_any()
        }
    })
}

/// One head under `spec`. V may have its own head size (p_v ≠ p, DeepSeek's MLA heads).
fn head(
    q: &Bound<'_, PyAny>,
    k: &Bound<'_, PyAny>,
    v: &Bound<'_, PyAny>,
    spec: AttentionSpec,
) -> PyResult<HeadInputs> {
    let (q, k, v) = (tensor("q", q)?, tensor("k", k)?, tensor("v", v)?);
    if q.dims() != k.dims()
        || k.dims()[0] != v.dims()[0]
        || q.dtype() != k.dtype()
        || k.dtype() != v.dtype()
    {
        return Err(PyValueError::new_err(format!(
            "q and k must have one shape, v their rows, and all one dtype; got {:?} {:?}, {:?} {:?}, {:?} {:?}",
            q.dims(),
            q.dtype(),
            k.dims(),
            k.dtype(),
            v.dims(),
            v.dtype()
        )));
    }
    HeadInputs::with_spec(q, k, v, spec).map_err(err)
}

/// A layer's attention as the Python face's keywords give it (docs/reference.md §7.7.0): the
/// mask's plain target, with τ (`scale`, default 1/√p), a soft-cap c, a sliding window of W keys
/// (causal only) and the head's sink logit σ where given; a spec no attention has is a
/// ValueError naming the keyword.
struct SpecKeywords {
    mask: Mask,
    scale: Option<f64>,
    softcap: Option<f64>,
    window: Option<usize>,
    sink: Option<f64>,
}

impl SpecKeywords {
    fn spec(&self, p: usize) -> PyResult<AttentionSpec> {
        let mut spec = AttentionSpec::of_mask(self.mask, p)
            .with_softcap(self.softcap)
            .with_sinks(self.sink.map(|s| vec![s]));
        if let Some(tau) = self.scale {
            spec = spec.with_scale(tau);
        }
        spec.window = self.window;
        spec.validate(1, "the attention keywords (scale, softcap, window, sink)")
            .map_err(err)?;
        Ok(spec)
    }

    /// One head's inputs under these keywords (p from Q's second axis).
    fn head(
        &self,
        q: &Bound<'_, PyAny>,
        k: &Bound<'_, PyAny>,
        v: &Bound<'_, PyAny>,
    ) -> PyResult<HeadInputs> {
        head(q, k, v, self.spec(head_dim(q)?)?)
    }
}

/// p, the head size of Q (and K), from the array's second axis.
fn head_dim(q: &Bound<'_, PyAny>) -> PyResult<usize> {
    let shape: Vec<usize> = q.getattr("shape")?.extract()?;
    Ok(shape.get(1).copied().unwrap_or(0))
}

/// `mask` ("none" or "causal") as the library's Mask.
fn parse_mask(mask: &str) -> PyResult<Mask> {
    mask.parse()
        .map_err(|e: approx_bench::UsageError| PyValueError::new_err(format!("mask {e}")))
}

/// The target of one head as the benchmark computes it: exact softmax attention
/// O = softmax(QKᵀ/√p)V in the inputs' dtype (over keys j ≤ i with `mask = "causal"`; under a
/// layer's scale, soft-cap, window and sink where given), or (`target = "kernelized"`) C·V in
/// float64.
// One argument per keyword of the Python signature.
#[allow(clippy::too_many_arguments)]
#[pyfunction]
#[pyo3(signature = (q, k, v, target = "softmax", mask = "none", scale = None, softcap = None, window = None, sink = None))]
fn exact<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    target: &str,
    mask: &str,
    scale: Option<f64>,
    softcap: Option<f64>,
    window: Option<usize>,
    sink: Option<f64>,
) -> PyResult<Bound<'py, PyAny>> {
    let target: Target = target
        .parse()
        .map_err(|e: approx_bench::UsageError| PyValueError::new_err(format!("target {e}")))?;
    let mask = parse_mask(mask)?;
    if mask == Mask::Causal && target == Target::Kernelized {
        return Err(PyValueError::new_err(
            "the kernelized target has no causal form (docs/reference.md §7.2)",
        ));
    }
    let h = SpecKeywords {
        mask,
        scale,
        softcap,
        window,
        sink,
    }
    .head(q, k, v)?;
    if target == Target::Kernelized && !h.spec.features(h.p(), h.n()).is_plain() {
        return Err(PyValueError::new_err(
            "the kernelized target has no form under a scale, soft-cap, window or sink (docs/reference.md §7.7)",
        ));
    }
    match target {
        Target::Softmax => array(py, &h.exact().map_err(err)?.output),
        Target::Kernelized => array(py, h.kernelized().map_err(err)?),
    }
}

/// (‖O − Ô‖₂, ‖O − Ô‖₂/‖O‖₂, ‖O − Ô‖_F): the benchmark's metric, in float64.
/// O and Ô as tensors of one shape (the metric's inputs), or a ValueError naming both shapes.
fn output_pair(o: &Bound<'_, PyAny>, o_hat: &Bound<'_, PyAny>) -> PyResult<(Tensor, Tensor)> {
    let (o, oh) = (tensor("o", o)?, tensor("o_hat", o_hat)?);
    if o.dims() != oh.dims() {
        return Err(PyValueError::new_err(format!(
            "o and o_hat must have one shape; got {:?} and {:?}",
            o.dims(),
            oh.dims()
        )));
    }
    Ok((o, oh))
}

#[pyfunction]
fn spectral_error(o: &Bound<'_, PyAny>, o_hat: &Bound<'_, PyAny>) -> PyResult<(f64, f64, f64)> {
    let (o, oh) = output_pair(o, o_hat)?;
    let e = spectral::error_norms(&o, &oh).map_err(err)?;
    let o64 = o.to_dtype(DType::F64).map_err(cerr)?;
    let norm = spectral::matrix_norms(&o64).map_err(err)?.spectral;
    let rel = approx_bench::numerics::agreement::relative(e.spectral, norm);
    Ok((e.spectral, rel, e.frobenius))
}

/// cos_sim, rel_l1 and rmse of Ô against O on the flattened output (docs/reference.md §8.5), as trials.csv
/// records them.
#[pyfunction]
fn agreement(o: &Bound<'_, PyAny>, o_hat: &Bound<'_, PyAny>) -> PyResult<(f64, f64, f64)> {
    let (o, oh) = output_pair(o, o_hat)?;
    let a = approx_bench::numerics::agreement::agreement(&o, &oh).map_err(err)?;
    Ok((a.cos_sim, a.rel_l1, a.rmse))
}

/// Ô of a built-in method for one head, with the trial generator of derived seed `seed`
/// (trials.csv's `seed` column, or `trial_seed(...)`): bit-identical to the CLI's trial. With
/// `mask = "causal"` the method's causal form (docs/reference.md §7.4).
// One argument per keyword of the Python signature.
#[allow(clippy::too_many_arguments)]
#[pyfunction]
#[pyo3(signature = (method, q, k, v, d, seed, mask = "none", scale = None, softcap = None, window = None, sink = None))]
fn approximate<'py>(
    py: Python<'py>,
    method: &str,
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    d: usize,
    seed: u64,
    mask: &str,
    scale: Option<f64>,
    softcap: Option<f64>,
    window: Option<usize>,
    sink: Option<f64>,
) -> PyResult<Bound<'py, PyAny>> {
    let m = attention::by_id(method).map_err(PyValueError::new_err)?;
    let mask = parse_mask(mask)?;
    if !m.masks().contains(&mask) {
        return Err(PyValueError::new_err(format!(
            "{method} has no {mask} form; methods for mask {mask}: {}",
            attention::mask_method_ids(Target::Softmax, mask).join(", ")
        )));
    }
    if d == 0 && m.has_budget() {
        return Err(PyValueError::new_err(format!(
            "{method}: d = 0, but its budget d must be at least 1 (only the quantized family, docs/reference.md §8, runs at d = 0)"
        )));
    }
    let h = SpecKeywords {
        mask,
        scale,
        softcap,
        window,
        sink,
    }
    .head(q, k, v)?;
    m.check(h.n(), d)
        .map_err(|e| PyValueError::new_err(format!("{method} at n = {}, d = {d}: {e}", h.n())))?;
    // The sweep's own choice of inputs: the head, or its rescaled form for a method that reads
    // the scale through Q and K (§7.7.6); a feature the method lacks is refused by name.
    let inputs = h.inputs_for(m.as_ref()).map_err(err)?;
    let mut rng = sampling::rng_from_seed(seed);
    let a = m.approximate(inputs, d, &mut rng).map_err(err)?;
    array(py, &a.output)
}

/// The derived seed of the trial (run seed, n, window, head, method, d), as trials.csv records it.
#[pyfunction]
fn trial_seed(seed: u64, n: usize, window: usize, head: usize, method: &str, d: usize) -> u64 {
    sampling::TrialKey {
        seed,
        n,
        window,
        head,
        method,
        d,
    }
    .derive_seed()
}

/// The built-in methods: (id, what d means, randomized?).
#[pyfunction]
fn methods() -> Vec<(String, String, bool)> {
    attention::registry()
        .iter()
        .map(|m| {
            (
                m.id().to_string(),
                m.feature_meaning().to_string(),
                m.is_random(),
            )
        })
        .collect()
}

/// A [heads, n, p] tensor as a numpy array of its dtype.
fn array3<'py>(py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyAny>> {
    let (h, n, p) = t.dims3().map_err(cerr)?;
    let flat = t.flatten_all().map_err(cerr)?;
    Ok(match t.dtype() {
        DType::F64 => Array3::from_shape_vec((h, n, p), flat.to_vec1::<f64>().map_err(cerr)?)
            .expect("shape matches")
            .into_pyarray(py)
            .into_any(),
        _ => Array3::from_shape_vec(
            (h, n, p),
            flat.to_dtype(DType::F32)
                .and_then(|f| f.to_vec1::<f32>())
                .map_err(cerr)?,
        )
        .expect("shape matches")
        .into_pyarray(py)
        .into_any(),
    })
}

/// Q, K, V ([heads, n, p]) of window `window` of length `n`, through the CLI's pipeline and
/// options (keywords: the CLI's long flags with underscores).
#[pyfunction]
#[pyo3(signature = (n, window = 0, **kwargs))]
fn inputs<'py>(
    py: Python<'py>,
    n: usize,
    window: usize,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let kw = kwargs.cloned().unwrap_or_else(|| PyDict::new(py));
    let cache = run::qkv_cache(&kw)?;
    let opts = run::input_options(&kw)?;
    run::reject_leftovers(&kw)?;
    let cfg = InputConfig::new(&opts).map_err(err)?;
    let (q, k, v) = py
        .detach(|| -> anyhow::Result<_> {
            let mut prepared = approx_bench::inputs::prepare(&cfg)?;
            prepared.use_qkv_cache(&cache, &cfg)?;
            prepared.corpus.check_fits(&[n], window + 1)?;
            prepared.window_qkv(&cfg, n, window)
        })
        .map_err(err)?;
    Ok((array3(py, &q)?, array3(py, &k)?, array3(py, &v)?))
}

/// Runs (or resumes) a sweep into `out`: the CLI's grid, seeds, metric and files. `methods`
/// lists built-in ids, presets and the names of `user` methods, in order; `user` holds
/// (name, callable, origin, sha256 of its source, whether it takes a `spec` keyword).
#[pyfunction]
#[pyo3(signature = (methods, user, out, force, quiet, command, **kwargs))]
#[allow(clippy::too_many_arguments)]
fn sweep(
    py: Python<'_>,
    methods: Vec<String>,
    user: Vec<(String, Py<PyAny>, String, String, bool)>,
    out: PathBuf,
    force: bool,
    quiet: bool,
    command: Vec<String>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<String> {
    let kw = kwargs.cloned().unwrap_or_else(|| PyDict::new(py));
    let cache = run::qkv_cache(&kw)?;
    let layer_given = kw.get_item("layer")?.is_some_and(|l| !l.is_none());
    let mut opts = run::run_options(&kw, methods)?;
    if !layer_given {
        // A family with sliding layers is measured at its first global layer, as the CLI does.
        let inputs = InputConfig::new(&opts.inputs).map_err(err)?;
        opts.inputs.layer =
            approx_bench::inputs::decoder::default_layer(&inputs, "approx_bench.sweep")
                .map_err(err)?;
    }
    let mut extra: Vec<Box<dyn attention::Method>> = Vec::new();
    for (name, func, origin, sha256, reads_spec) in user {
        opts.user_methods.insert(
            name.clone(),
            UserMethod {
                kind: "python function".into(),
                origin,
                sha256,
            },
        );
        extra.push(Box::new(user_method::PyMethod::new(
            &name, func, reads_spec,
        )));
    }
    if opts.mask.is_none() && opts.decode.is_none() {
        // The model's own mask (causal for a decoder), as the CLI chooses it.
        let inputs = InputConfig::new(&opts.inputs).map_err(err)?;
        opts.mask = Some(approx_bench::inputs::decoder::native_mask(&inputs).map_err(err)?);
    }
    let cfg = RunConfig::new(&opts).map_err(err)?;
    let sweep_opts = approx_bench::sweep::SweepOptions {
        out: out.clone(),
        force,
        quiet,
        command,
        qkv_cache: cache,
        shard: None,
    };
    approx_bench::inputs::hub::allow_progress(!quiet);
    // The GIL is released while the sweep runs; each user trial takes it back for its call.
    let outcome = interruptible(py, || {
        approx_bench::sweep::run_with(&cfg, &sweep_opts, extra)
    })?;
    if !quiet {
        approx_bench::report::console::print_summary(
            &outcome.out,
            &outcome.summary,
            outcome.new_trials,
            outcome.total_trials,
        );
    }
    Ok(outcome.out.display().to_string())
}

/// Runs (or resumes) `approx-bench e2e` into `out` (docs/reference.md §10): `methods` lists built-in
/// ids, presets and the names of `user` methods, in order; `user` holds (name, callable, decode,
/// whether the callable takes the layer's `spec`).
/// A user's callable is every layer's attention, per query head, as in `sweep`. Returns `out`.
#[pyfunction]
#[pyo3(signature = (methods, user, out, quiet, command, lengths, windows, n_f, features, ids=None, seed=0, **kwargs))]
#[allow(clippy::too_many_arguments)]
fn e2e(
    py: Python<'_>,
    methods: Vec<String>,
    user: Vec<(String, Py<PyAny>, bool, bool, String, String)>,
    out: PathBuf,
    quiet: bool,
    command: Vec<String>,
    lengths: Vec<usize>,
    windows: usize,
    n_f: usize,
    features: Vec<usize>,
    ids: Option<PathBuf>,
    seed: u64,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<String> {
    let kw = kwargs.cloned().unwrap_or_else(|| PyDict::new(py));
    let inputs = InputConfig::new(&run::input_options(&kw)?).map_err(err)?;
    if let Some(k) = kw.keys().iter().next() {
        return Err(PyValueError::new_err(format!("e2e: unknown option {k}")));
    }
    let user_methods = user
        .iter()
        .map(|(name, _, _, _, origin, sha256)| {
            let m = UserMethod {
                kind: "python function".into(),
                origin: origin.clone(),
                sha256: sha256.clone(),
            };
            (name.clone(), m)
        })
        .collect();
    let extra = user
        .into_iter()
        .map(|(name, func, decode, reads_spec, _, _)| {
            approx_bench::protocol::end_to_end::E2eMethod {
                method: Box::new(user_method::PyMethod::new(&name, func, reads_spec)),
                name,
                decode,
            }
        })
        .collect();
    let req = approx_bench::e2e::E2eRequest {
        inputs,
        lengths,
        windows,
        n_f,
        methods: approx_bench::e2e::expand_methods(&methods),
        user_methods,
        features,
        ids_file: ids,
        out: out.clone(),
        seed,
        one_layer: None,
        positions: false,
        per_head: false,
        quiet,
        command,
        shard: None,
    };
    approx_bench::inputs::hub::allow_progress(!quiet);
    // The GIL is released while the forward runs; each user call takes it back.
    let outcome = interruptible(py, || approx_bench::e2e::run_with(&req, extra))?;
    if !quiet {
        for (name, r) in &outcome.reports {
            eprintln!("{}", approx_bench::e2e::format_report(name, r));
        }
    }
    Ok(outcome.out.display().to_string())
}

/// Draws the CLI's figures from run directories (or summary.csv files) into `out`; returns the
/// files written. `statistic`: "mean" or "median".
#[pyfunction]
#[pyo3(signature = (runs, out, statistic = "mean"))]
fn plot(
    py: Python<'_>,
    runs: Vec<PathBuf>,
    out: PathBuf,
    statistic: &str,
) -> PyResult<Vec<String>> {
    use approx_bench::report::figures;
    let stat: figures::Statistic = statistic
        .parse()
        .map_err(|e| PyValueError::new_err(format!("statistic: {e}")))?;
    let written = py
        .detach(|| -> anyhow::Result<_> {
            let data = runs
                .iter()
                .map(|d| figures::load_run(d))
                .collect::<anyhow::Result<Vec<_>>>()?;
            figures::draw_all(&data, &out, stat)
        })
        .map_err(err)?;
    Ok(written.iter().map(|p| p.display().to_string()).collect())
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(exact, m)?)?;
    m.add_function(wrap_pyfunction!(spectral_error, m)?)?;
    m.add_function(wrap_pyfunction!(agreement, m)?)?;
    m.add_function(wrap_pyfunction!(approximate, m)?)?;
    m.add_function(wrap_pyfunction!(trial_seed, m)?)?;
    m.add_function(wrap_pyfunction!(methods, m)?)?;
    m.add_function(wrap_pyfunction!(inputs, m)?)?;
    m.add_function(wrap_pyfunction!(sweep, m)?)?;
    m.add_function(wrap_pyfunction!(e2e, m)?)?;
    m.add_function(wrap_pyfunction!(plot, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
