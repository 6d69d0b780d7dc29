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
