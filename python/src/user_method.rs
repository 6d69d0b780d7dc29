//! A Python callable as a method of the sweep: `f(q, k, v, d, rng) -> o_hat`, called with one
//! head's arrays and a numpy Generator seeded with the trial's derived seed (the `seed` column
//! of trials.csv), so each trial is reproducible on its own and independent of order and threads.

use anyhow::{anyhow, bail, Result};
use candle_core::{DType, Tensor};
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;

use approx_bench::attention::decode::{DecodeHead, Decoding};
use approx_bench::attention::{Approximation, HeadInputs, Mask, Method};
use approx_bench::numerics::sampling::TrialRng;

/// What a user's function returned: Ô's scored rows (row-major), or under the decode protocol the
/// prompt keys the continuation reads (one set, or one per continuation row).
enum Returned {
    Rows(Vec<f64>),
    Static(Vec<i64>),
    PerRow(Vec<Vec<i64>>),
}

/// A returned key set as sorted, distinct prompt positions, or an error naming `what`.
fn prompt_keys(keys: Vec<i64>, n_p: usize, what: &str) -> Result<Vec<usize>> {
    if let Some(&bad) = keys.iter().find(|&&j| j < 0 || j as usize >= n_p) {
        bail!("{what} holds key {bad}, outside the prompt 0..{n_p} (the continuation's own keys are read anyway)");
    }
    let mut keys: Vec<usize> = keys.into_iter().map(|j| j as usize).collect();
    keys.sort_unstable();
    keys.dedup();
    Ok(keys)
}

pub struct PyMethod {
    /// Leaked once per method and process: the registry's ids are `&'static str`.
    id: &'static str,
    func: Py<PyAny>,
    /// The function takes a `spec` keyword: it is told the layer's attention (τ, soft-cap,
    /// window, sink) and given the head's own Q, K (docs/reference.md §7.7.6).
    reads_spec: bool,
}

impl PyMethod {
    pub fn new(name: &str, func: Py<PyAny>, reads_spec: bool) -> Self {
        Self {
            id: Box::leak(name.to_string().into_boxed_str()),
            func,
            reads_spec,
        }
    }
}

/// The `spec` keyword a spec-reading function is called with: the layer's attention as a dict
/// (`causal`, `scale` τ, `softcap` c, `window` W, `sink` σ of this head; None where absent).
fn spec_dict<'py>(py: Python<'py>, head: &HeadInputs) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
    let d = pyo3::types::PyDict::new(py);
    let s = &head.spec;
    d.set_item("causal", s.causal)?;
    d.set_item("scale", s.scale)?;
    d.set_item("softcap", s.softcap)?;
    d.set_item("window", s.window)?;
    d.set_item("sink", s.sink(0))?;
    Ok(d)
}

fn head_array<'py>(py: Python<'py>, t: &Tensor) -> Result<Bound<'py, PyAny>> {
    let (n, p) = t.dims2()?;
    let flat = t.flatten_all()?;
    Ok(match t.dtype() {
        DType::F64 => Array2::from_shape_vec((n, p), flat.to_vec1::<f64>()?)?
            .into_pyarray(py)
            .into_any(),
        _ => Array2::from_shape_vec((n, p), flat.to_dtype(DType::F32)?.to_vec1::<f32>()?)?
            .into_pyarray(py)
            .into_any(),
    })
}

/// "ValueError: message" with the Python traceback's last line, for the sweep's error context.
fn py_error(py: Python<'_>, e: PyErr) -> anyhow::Error {
    // Ctrl-C while the user's code ran (issue 57): the run stops as interrupted, its rows kept,
    // and the KeyboardInterrupt is raised again when it has.
    if e.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py) {
        *crate::PENDING_SIGNAL.lock().expect("signal lock") = Some(e);
        approx_bench::interrupt::request(2);
        return approx_bench::interrupt::Interrupted {
            signal: 2,
            progress: None,
        }
        .into();
    }
    let tb = e
        .traceback(py)
        .and_then(|t| t.format().ok())
        .map(|t| format!("\n{t}"))
        .unwrap_or_default();
    anyhow!("{}{tb}", e)
}

impl Method for PyMethod {
    fn id(&self) -> &'static str {
        self.id
    }
    fn feature_meaning(&self) -> &'static str {
        "defined by the user's function"
    }
    fn is_random(&self) -> bool {
        true
    }
    fn masks(&self) -> &'static [Mask] {
        &[Mask::None, Mask::Causal]
    }
    /// Every feature for a function told the spec; otherwise the scale alone, which it reaches as
    /// rescaled Q and K (whose products over √p are τ·q·k), as the built-in methods do.
    fn spec_support(&self) -> approx_bench::attention::SpecFeatures {
        use approx_bench::attention::SpecFeatures;
        if self.reads_spec {
            SpecFeatures::ALL
        } else {
            SpecFeatures::SCALE
        }
    }
    fn macs(&self, _n: usize, _p: usize, _d: usize) -> f64 {
        f64::NAN
    }
    fn approximate(
        &self,
        head: &HeadInputs,
        d: usize,
        rng: &mut TrialRng,
    ) -> Result<Approximation> {
        use rand::RngCore;
        self.approximate_trial(head, d, rng.next_u64())
    }
    fn approximate_trial(&self, head: &HeadInputs, d: usize, seed: u64) -> Result<Approximation> {
        self.call(head, None, d, seed)
    }
    fn decoding(&self) -> Option<&dyn Decoding> {
        Some(self)
    }
}

/// Under the decode protocol the function is told n_f and may return key sets (see `call`).
impl Decoding for PyMethod {
    fn approximate_decode(
        &self,
        head: &HeadInputs,
        dec: &DecodeHead,
        d: usize,
        rng: &mut TrialRng,
    ) -> Result<Approximation> {
        use rand::RngCore;
        self.call(head, Some(dec), d, rng.next_u64())
    }
    fn approximate_decode_trial(
        &self,
        head: &HeadInputs,
        dec: &DecodeHead,
        d: usize,
        seed: u64,
    ) -> Result<Approximation> {
        self.call(head, Some(dec), d, seed)
    }
    /// A user's function has no cost formula.
    fn macs_decode(&self, _n: usize, _p: usize, _d: usize, _n_f: usize) -> f64 {
        f64::NAN
    }
    /// A function told the spec implements it; one that is not gets the head as it is (the decode
    /// protocol has no rescaled inputs), so it runs on plain layers only.
    fn decode_spec_support(&self) -> approx_bench::attention::SpecFeatures {
        use approx_bench::attention::SpecFeatures;
        if self.reads_spec {
            SpecFeatures::ALL
        } else {
            SpecFeatures::NONE
        }
    }
}

impl PyMethod {
    /// One call of the function on `head` (under the decode protocol with `dec`), with a numpy
    /// Generator seeded by `seed`.
    fn call(
        &self,
        head: &HeadInputs,
        dec: Option<&DecodeHead>,
        d: usize,
        seed: u64,
    ) -> Result<Approximation> {
        let (n, p) = (head.n(), head.p());
        let returned = Python::attach(|py| -> Result<Returned> {
            let np = py.import("numpy").map_err(|e| py_error(py, e))?;
            let result = self.invoke(py, &np, head, dec, d, seed)?;
            if dec.is_some() {
                if let Some(sets) = returned_key_sets(py, &np, &result)? {
                    return Ok(sets);
                }
            }
            returned_rows(py, &np, &result, (n, p), dec)
        })?;
        approximation(returned, head, dec, p)
    }

    /// The function called on the head's arrays, with the keywords its run needs.
    fn invoke(
        &self,
        py: Python<'_>,
        np: &Bound<'_, PyModule>,
        head: &HeadInputs,
        dec: Option<&DecodeHead>,
        d: usize,
        seed: u64,
    ) -> Result<Py<PyAny>> {
        let rng = np
            .getattr("random")
            .and_then(|r| r.call_method1("default_rng", (seed,)))
            .map_err(|e| py_error(py, e))?;
        let args = (
            head_array(py, &head.q)?,
            head_array(py, &head.k)?,
            head_array(py, &head.v)?,
            d,
            rng,
        );
        // Under the causal mask the function is told so (`mask="causal"`), and must take
        // that keyword: an estimate of bidirectional attention would be scored against the
        // causal target without anyone noticing. Unmasked runs call f(q, k, v, d, rng) as before.
        // Under the decode protocol (docs/reference.md §9.1, `decode=n_f`) it is also told n_f: the
        // last n_f rows of q are the continuation, the rows scored, and it may return them
        // alone ([n_f, p]) or the whole window ([n, p], of which they are taken).
        // A function with a `spec` parameter is told the layer's attention on every call.
        if !(head.mask == Mask::Causal || self.reads_spec) {
            return self.func.call1(py, args).map_err(|e| py_error(py, e));
        }
        let kw = pyo3::types::PyDict::new(py);
        if head.mask == Mask::Causal {
            kw.set_item("mask", "causal").map_err(|e| py_error(py, e))?;
        }
        if let Some(dec) = dec {
            kw.set_item("n_f", dec.n_f()).map_err(|e| py_error(py, e))?;
        }
        if self.reads_spec {
            let spec = spec_dict(py, head).map_err(|e| py_error(py, e))?;
            kw.set_item("spec", spec).map_err(|e| py_error(py, e))?;
        }
        self.func.call(py, args, Some(&kw)).map_err(|e| {
            let hint = if e.is_instance_of::<pyo3::exceptions::PyTypeError>(py) {
                " (under mask=\"causal\" the function is called as f(q, k, v, d, rng, mask=\"causal\"), and under \
                 decode= also with n_f=…; add `mask=None` (and `n_f=None`) parameters and compute attention over keys j ≤ i when it is \"causal\")"
            } else {
                ""
            };
            anyhow!("{}{hint}", py_error(py, e))
        })
    }
}

/// Under the decode protocol the function may say which prompt keys the continuation reads
/// instead of computing Ô: one integer array (a static set, every continuation row) or a list
/// of n_f of them (one per continuation row); the tool then computes the restricted rows,
/// `keys`, `mass` and `kv_read` as for a built-in §9 method. None: it returned rows.
fn returned_key_sets(
    py: Python<'_>,
    np: &Bound<'_, PyModule>,
    result: &Py<PyAny>,
) -> Result<Option<Returned>> {
    let r = result.bind(py);
    let is_seq =
        r.is_instance_of::<pyo3::types::PyList>() || r.is_instance_of::<pyo3::types::PyTuple>();
    if is_seq {
        let sets: Vec<Vec<i64>> = r.extract().map_err(|_| {
            anyhow!(
                "returned a list that is not one integer array of prompt keys per continuation row"
            )
        })?;
        return Ok(Some(Returned::PerRow(sets)));
    }
    let arr = np
        .call_method1("asarray", (r,))
        .map_err(|e| py_error(py, e))?;
    let kind: String = arr
        .getattr("dtype")
        .and_then(|d| d.getattr("kind"))
        .and_then(|k| k.extract())
        .map_err(|e| py_error(py, e))?;
    let ndim: usize = arr
        .getattr("ndim")
        .and_then(|d| d.extract())
        .map_err(|e| py_error(py, e))?;
    if ndim == 1 && (kind == "i" || kind == "u") {
        let keys: Vec<i64> = arr
            .call_method0("tolist")
            .and_then(|l| l.extract())
            .map_err(|e| py_error(py, e))?;
        return Ok(Some(Returned::Static(keys)));
    }
    Ok(None)
}

/// The rows the function returned, as f64: the window's [n, p] or, under the decode protocol, the
/// continuation's [n_f, p] (of a window's, the continuation rows are taken).
fn returned_rows(
    py: Python<'_>,
    np: &Bound<'_, PyModule>,
    result: &Py<PyAny>,
    (n, p): (usize, usize),
    dec: Option<&DecodeHead>,
) -> Result<Returned> {
    // A complex result would lose its imaginary part to float64 with only a warning
    // (issue 57): refused, as a wrong shape is.
    let complex: bool = np
        .call_method1("iscomplexobj", (result.bind(py),))
        .and_then(|c| c.extract())
        .map_err(|e| py_error(py, e))?;
    if complex {
        bail!("returned complex values; attention's output is real: return its real array");
    }
    // numpy.asarray accepts torch (CPU) and JAX arrays as well as numpy's own.
    let arr = np
        .call_method1("asarray", (result.bind(py), "float64"))
        .map_err(|e| py_error(py, e))?;
    let arr: PyReadonlyArray2<'_, f64> = arr.extract().map_err(|_| {
        anyhow!(
            "returned an array of shape {:?}; expected one head's output [n, p] = [{n}, {p}]",
            arr.getattr("shape")
                .map(|s| s.to_string())
                .unwrap_or_default()
        )
    })?;
    let rows = match dec {
        Some(dec) if arr.shape() == [dec.n_f(), p] => 0..dec.n_f(),
        Some(dec) if arr.shape() == [n, p] => dec.n_p()..n,
        Some(dec) => bail!(
            "returned shape {:?}; expected the continuation's rows [n_f, p] = [{}, {p}] or the window's [n, p] = [{n}, {p}]",
            arr.shape(),
            dec.n_f()
        ),
        None if arr.shape() == [n, p] => 0..n,
        None => bail!(
            "returned shape {:?}; expected [n, p] = [{n}, {p}]",
            arr.shape()
        ),
    };
    Ok(Returned::Rows(
        arr.as_array()
            .rows()
            .into_iter()
            .skip(rows.start)
            .take(rows.len())
            .flatten()
            .copied()
            .collect(),
    ))
}

/// What the function returned, as the head's approximation: its rows (finite), or the rows of the
/// key sets it chose.
fn approximation(
    returned: Returned,
    head: &HeadInputs,
    dec: Option<&DecodeHead>,
    p: usize,
) -> Result<Approximation> {
    let out = match returned {
        Returned::Rows(out) => out,
        Returned::Static(keys) => {
            let dec = dec.expect("key sets only under decode");
            let kept = prompt_keys(keys, dec.n_p(), "the kept set")?;
            return approx_bench::attention::decode::static_rows(head, dec, &kept);
        }
        Returned::PerRow(sets) => {
            let dec = dec.expect("key sets only under decode");
            if sets.len() != dec.n_f() {
                bail!(
                    "returned {} key sets; expected one per continuation row, n_f = {}",
                    sets.len(),
                    dec.n_f()
                );
            }
            let sets = sets
                .into_iter()
                .enumerate()
                .map(|(i, s)| prompt_keys(s, dec.n_p(), &format!("continuation row {i}'s set")))
                .collect::<Result<Vec<_>>>()?;
            return approx_bench::attention::decode::per_query_rows(head, dec, sets);
        }
    };
    let n = out.len() / p;
    if let Some(i) = out.iter().position(|x| !x.is_finite()) {
        bail!(
            "returned a non-finite value ({}) at row {}, column {}",
            out[i],
            i / p,
            i % p
        );
    }
    Ok(Approximation::plain(Tensor::from_vec(
        out,
        (n, p),
        head.device(),
    )?))
}
