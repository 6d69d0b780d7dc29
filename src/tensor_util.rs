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
pub fn scalar(t: &Tensor) -> Result<f64> {
    Ok(t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?[0])
}

/// Reads a 1-D tensor (or any shape, flattened) as f64 values.
pub fn to_vec_f64(t: &Tensor) -> Result<Vec<f64>> {
    Ok(t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?)
}
