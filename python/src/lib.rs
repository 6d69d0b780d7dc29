//! The Python face of approx-bench: arrays in, arrays out. Every computation is the library's
//! own (the same code path as the CLI's trials); this file only converts numpy arrays to candle
//! tensors and errors to Python exceptions. Argument checking and conversion of torch/JAX
//! arrays happen in `approx_bench/__init__.py`.

use candle_core::{DType, Device, Tensor};
use numpy::ndarray::{Array2, Array3};
use numpy::{IntoPyArray, PyArrayDyn, PyReadonlyArray2};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use approx_bench::attention::{self, HeadInputs};
use approx_bench::numerics::{sampling, spectral};

/// A library error as a Python exception: usage errors (the caller's to fix) are ValueError.
fn err(e: anyhow::Error) -> PyErr {
    if e.downcast_ref::<approx_bench::UsageError>().is_some() {
        PyValueError::new_err(format!("{e:#}"))
    } else {
        PyRuntimeError::new_err(format!("{e:#}"))
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
            let v = flat.to_dtype(DType::F32).and_then(|f| f.to_vec1::<f32>()).map_err(cerr)?;
            Array2::from_shape_vec((n, p), v)
                .expect("shape matches")
                .into_pyarray(py)
                .into_any()
        }
    })
}

fn head(q: &Bound<'_, PyAny>, k: &Bound<'_, PyAny>, v: &Bound<'_, PyAny>) -> PyResult<HeadInputs> {
    let (q, k, v) = (tensor("q", q)?, tensor("k", k)?, tensor("v", v)?);
    if q.dims() != k.dims() || k.dims() != v.dims() || q.dtype() != k.dtype() || k.dtype() != v.dtype() {
        return Err(PyValueError::new_err(format!(
            "q, k, v must have one shape and dtype; got {:?} {:?}, {:?} {:?}, {:?} {:?}",
            q.dims(), q.dtype(), k.dims(), k.dtype(), v.dims(), v.dtype()
        )));
    }
    HeadInputs::new(q, k, v).map_err(err)
}

/// Exact softmax attention O = softmax(QKᵀ/√p)V of one head, as the benchmark computes its target.
#[pyfunction]
fn exact<'py>(
    py: Python<'py>,
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let h = head(q, k, v)?;
    array(py, &h.exact.output)
}

/// (‖O − Ô‖₂, ‖O − Ô‖₂/‖O‖₂, ‖O − Ô‖_F): the benchmark's metric, in float64.
#[pyfunction]
fn spectral_error(o: &Bound<'_, PyAny>, o_hat: &Bound<'_, PyAny>) -> PyResult<(f64, f64, f64)> {
    let (o, oh) = (tensor("o", o)?, tensor("o_hat", o_hat)?);
    if o.dims() != oh.dims() {
        return Err(PyValueError::new_err(format!(
            "o and o_hat must have one shape; got {:?} and {:?}",
            o.dims(),
            oh.dims()
        )));
    }
    let e = spectral::error_norms(&o, &oh).map_err(err)?;
    let o64 = o.to_dtype(DType::F64).map_err(cerr)?;
    let norm = spectral::matrix_norms(&o64).map_err(err)?.spectral;
    Ok((e.spectral, e.spectral / norm, e.frobenius))
}

/// Ô of a built-in method for one head, with the trial generator of derived seed `seed`
/// (trials.csv's `seed` column, or `trial_seed(...)`): bit-identical to the CLI's trial.
#[pyfunction]
fn approximate<'py>(
    py: Python<'py>,
    method: &str,
    q: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    v: &Bound<'py, PyAny>,
    d: usize,
    seed: u64,
) -> PyResult<Bound<'py, PyAny>> {
    let m = attention::by_id(method).map_err(PyValueError::new_err)?;
    let h = head(q, k, v)?;
    m.check(h.n(), d)
        .map_err(|e| PyValueError::new_err(format!("{method} at n = {}, d = {d}: {e}", h.n())))?;
    let mut rng = sampling::rng_from_seed(seed);
    let a = m.approximate(&h, d, &mut rng).map_err(err)?;
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
        .map(|m| (m.id().to_string(), m.feature_meaning().to_string(), m.is_random()))
        .collect()
}

/// Keeps the unused-import lint quiet until the 3-D helpers below are used by `inputs`.
#[allow(dead_code)]
fn array3<'py>(py: Python<'py>, v: Vec<f32>, shape: (usize, usize, usize)) -> Bound<'py, PyArrayDyn<f32>> {
    Array3::from_shape_vec(shape, v)
        .expect("shape matches")
        .into_dyn()
        .into_pyarray(py)
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(exact, m)?)?;
    m.add_function(wrap_pyfunction!(spectral_error, m)?)?;
    m.add_function(wrap_pyfunction!(approximate, m)?)?;
    m.add_function(wrap_pyfunction!(trial_seed, m)?)?;
    m.add_function(wrap_pyfunction!(methods, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
