//! Conversions between candle tensors (device-resident) and nalgebra matrices (host, f64),
//! used where a small dense core (d×d, p×p) is solved on the host.

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use nalgebra::DMatrix;

/// Copies a 2-D tensor of any float dtype to a host f64 matrix.
pub fn to_dmatrix(t: &Tensor) -> Result<DMatrix<f64>> {
    let (r, c) = t.dims2()?;
    let data: Vec<f64> = t.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?;
    Ok(DMatrix::from_row_slice(r, c, &data))
}

/// Copies a host f64 matrix to a tensor of `dtype` on `device`.
pub fn from_dmatrix(m: &DMatrix<f64>, device: &Device, dtype: DType) -> Result<Tensor> {
    let (r, c) = m.shape();
    let data: Vec<f64> = m.transpose().as_slice().to_vec(); // column-major transpose = row-major
    Ok(Tensor::from_vec(data, (r, c), device)?.to_dtype(dtype)?)
}

/// A 1-D u32 index tensor on `device`.
pub fn index_tensor(idx: &[usize], device: &Device) -> Result<Tensor> {
    let v: Vec<u32> = idx.iter().map(|&i| i as u32).collect();
    Ok(Tensor::from_vec(v, idx.len(), device)?)
}

/// A tensor from host f64 values in the given shape, converted to `dtype`.
pub fn from_f64(
    data: Vec<f64>,
    shape: (usize, usize),
    device: &Device,
    dtype: DType,
) -> Result<Tensor> {
    Ok(Tensor::from_vec(data, shape, device)?.to_dtype(dtype)?)
}

/// Reads a scalar (0-d or one-element) tensor as f64.
/// [b, b] with `lower` on and below the diagonal and `upper` above it: the causal mask of a
/// diagonal square (0 / −∞, added to logits) or the lower-triangular ones of prefix sums (1 / 0).
pub fn triangle(b: usize, lower: f64, upper: f64, device: &Device, dtype: DType) -> Result<Tensor> {
    let cells: Vec<f64> = (0..b * b)
        .map(|x| if x % b > x / b { upper } else { lower })
        .collect();
    Ok(Tensor::from_vec(cells, (b, b), device)?.to_dtype(dtype)?)
}

pub fn scalar(t: &Tensor) -> Result<f64> {
    Ok(t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?[0])
}

/// Reads a 1-D tensor (or any shape, flattened) as f64 values.
pub fn to_vec_f64(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?)
}

/// Environment variable naming the device the tests build their tensors on and pass to the CLI's
/// `--device`: `cpu` (the default), `cuda` or `cuda:N` (a build with `--features cuda`).
pub const TEST_DEVICE_VAR: &str = "APPROX_BENCH_TEST_DEVICE";

/// The tests' device spec: [`TEST_DEVICE_VAR`], or `cpu` when it is unset or empty.
#[doc(hidden)]
pub fn test_device_spec() -> String {
    std::env::var(TEST_DEVICE_VAR)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "cpu".to_string())
}

/// The tests' device ([`test_device_spec`]), opened once per process: tensors on two CUDA devices
/// opened separately cannot be combined, even with the same ordinal. Panics with the reason when the
/// device cannot be opened (a test has nothing to fall back to).
#[doc(hidden)]
pub fn test_device() -> Device {
    static DEVICE: std::sync::OnceLock<Device> = std::sync::OnceLock::new();
    DEVICE
        .get_or_init(|| {
            let spec = test_device_spec();
            crate::device::device(&spec)
                .unwrap_or_else(|e| panic!("{TEST_DEVICE_VAR}={spec}: {e:#}"))
        })
        .clone()
}

/// The first non-finite entry of a float tensor, as (its multi-index, its value); None when every
/// entry is finite (or the tensor holds integers). One reduction on the tensor's device
/// (0·x sums to 0 exactly when every x is finite), and a host copy only when one is there.
pub fn first_non_finite(t: &Tensor) -> Result<Option<(Vec<usize>, f64)>> {
    if !t.dtype().is_float() || t.elem_count() == 0 {
        return Ok(None);
    }
    if host_all_finite(t) == Some(true) {
        return Ok(None);
    }
    let probe = (t * 0.0)?
        .sum_all()?
        .to_dtype(DType::F64)?
        .to_scalar::<f64>()?;
    if probe.is_finite() {
        return Ok(None);
    }
    let flat = t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
    Ok(flat.iter().position(|x| !x.is_finite()).map(|mut i| {
        let value = flat[i];
        let mut index = vec![0; t.rank()];
        for (slot, &d) in index.iter_mut().zip(t.dims()).rev() {
            *slot = i % d;
            i /= d;
        }
        (index, value)
    }))
}

/// `f` of a host tensor's values in row-major order: borrowed in place when the tensor is
/// contiguous on the CPU, else copied out. (`to_vec1` copies even then: 19 MB per operand of a
/// decoder layer's attention at n = 8192, on one thread.)
pub fn with_host_slice<T: candle_core::WithDType, R>(
    t: &Tensor,
    f: impl FnOnce(&[T]) -> Result<R>,
) -> Result<R> {
    {
        let (storage, layout) = t.storage_and_layout();
        if let (candle_core::Storage::Cpu(cpu), Some((a, b))) =
            (&*storage, layout.contiguous_offsets())
        {
            if t.dtype() == T::DTYPE {
                return f(&cpu.as_slice::<T>()?[a..b]);
            }
        }
    }
    f(&t.flatten_all()?.to_vec1::<T>()?)
}

/// Whether every entry of a contiguous f32/f64 host tensor is finite, read in place on the host's
/// threads (a model's embedding table is 10⁷–10⁸ entries: the device reduction's 0·x copy of it
/// cost a serial fifth of a second and its page faults); None for anything else.
fn host_all_finite(t: &Tensor) -> Option<bool> {
    use candle_core::Storage;
    use rayon::prelude::*;
    let (storage, layout) = t.storage_and_layout();
    let (a, b) = layout.contiguous_offsets()?;
    const CHUNK: usize = 1 << 16;
    match &*storage {
        Storage::Cpu(candle_core::CpuStorage::F32(v)) => Some(
            v[a..b]
                .par_chunks(CHUNK)
                .all(|c| c.iter().fold(true, |ok, x| ok & x.is_finite())),
        ),
        Storage::Cpu(candle_core::CpuStorage::F64(v)) => Some(
            v[a..b]
                .par_chunks(CHUNK)
                .all(|c| c.iter().fold(true, |ok, x| ok & x.is_finite())),
        ),
        _ => None,
    }
}

/// A usage error if `t` holds a non-finite value: `what` names the tensor and where it comes
/// from, the message adds the first bad position and says the input is corrupt.
pub fn check_finite(t: &Tensor, what: impl FnOnce() -> String) -> Result<()> {
    match first_non_finite(t)? {
        None => Ok(()),
        Some((index, value)) => Err(crate::usage!(
            "{} holds {value} at index {index:?}: the input is corrupt (a weight or input value that is not a finite number); restore or re-download it",
            what()
        )),
    }
}

/// A candle error's message without the backtrace candle attaches under `RUST_BACKTRACE=1`: it
/// goes into messages about the user's files, where a stack of candle frames says nothing.
pub fn candle_message(e: &candle_core::Error) -> String {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => candle_message(inner),
        candle_core::Error::Context { inner, context } => {
            format!("{context}: {}", candle_message(inner))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod finite_tests {
    use super::*;

    #[test]
    fn the_first_non_finite_entry_is_located() {
        let dev = Device::Cpu;
        let ok = Tensor::new(&[[1f32, -2.0], [3.0, 4.0]], &dev).unwrap();
        assert_eq!(first_non_finite(&ok).unwrap(), None);
        let bad = Tensor::new(&[[1f32, 2.0, 3.0], [4.0, f32::NAN, f32::INFINITY]], &dev).unwrap();
        let (i, v) = first_non_finite(&bad).unwrap().unwrap();
        assert_eq!(i, vec![1, 1]);
        assert!(v.is_nan());
        let inf = Tensor::new(&[0f64, f64::NEG_INFINITY], &dev).unwrap();
        assert_eq!(
            first_non_finite(&inf).unwrap(),
            Some((vec![1], f64::NEG_INFINITY))
        );
        // f16 (a GGUF scale) and integers.
        let h = Tensor::new(&[1f32, f32::NAN], &dev)
            .unwrap()
            .to_dtype(DType::F16)
            .unwrap();
        assert_eq!(first_non_finite(&h).unwrap().unwrap().0, vec![1]);
        let ints = Tensor::new(&[1u32, 2], &dev).unwrap();
        assert_eq!(first_non_finite(&ints).unwrap(), None);
        let e = check_finite(&bad, || "weights m.safetensors: tensor 'x'".into()).unwrap_err();
        assert!(e.downcast_ref::<crate::UsageError>().is_some());
        let msg = e.to_string();
        assert!(
            msg.contains("tensor 'x' holds NaN at index [1, 1]") && msg.contains("corrupt"),
            "{msg}"
        );
    }
}
