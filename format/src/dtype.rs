//! Element types and host tensors.

use half::{bf16, f16};
use serde::{Deserialize, Serialize};
use std::fmt;

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    I64,
    I32,
}

impl DType {
    pub const ALL: [DType; 5] = [DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32];

    /// The dtype named `name` (`f32`, `i64`, ...: [`DType::name`]).
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
        }
    }
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }
    pub fn is_int(self) -> bool {
        !self.is_float()
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Owned element storage of a host tensor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum TensorData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I64(Vec<i64>),
    I32(Vec<i32>),
}

impl TensorData {
    pub fn dtype(&self) -> DType {
        match self {
            TensorData::F32(_) => DType::F32,
            TensorData::F16(_) => DType::F16,
            TensorData::BF16(_) => DType::BF16,
            TensorData::I64(_) => DType::I64,
            TensorData::I32(_) => DType::I32,
        }
    }
    pub fn len(&self) -> usize {
        match self {
            TensorData::F32(v) => v.len(),
            TensorData::F16(v) => v.len(),
            TensorData::BF16(v) => v.len(),
            TensorData::I64(v) => v.len(),
            TensorData::I32(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Zeros of `dtype`.
    pub fn zeros(dtype: DType, n: usize) -> Self {
        match dtype {
            DType::F32 => TensorData::F32(vec![0.0; n]),
            DType::F16 => TensorData::F16(vec![f16::ZERO; n]),
            DType::BF16 => TensorData::BF16(vec![bf16::ZERO; n]),
            DType::I64 => TensorData::I64(vec![0; n]),
            DType::I32 => TensorData::I32(vec![0; n]),
        }
    }
    /// Decode little-endian bytes of `dtype`.
    pub fn from_le_bytes(dtype: DType, bytes: &[u8]) -> Self {
        fn chunks<const N: usize>(b: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
            b.chunks_exact(N).map(|c| c.try_into().unwrap())
        }
        match dtype {
            DType::F32 => TensorData::F32(chunks::<4>(bytes).map(f32::from_le_bytes).collect()),
            DType::F16 => TensorData::F16(chunks::<2>(bytes).map(f16::from_le_bytes).collect()),
            DType::BF16 => TensorData::BF16(chunks::<2>(bytes).map(bf16::from_le_bytes).collect()),
            DType::I64 => TensorData::I64(chunks::<8>(bytes).map(i64::from_le_bytes).collect()),
            DType::I32 => TensorData::I32(chunks::<4>(bytes).map(i32::from_le_bytes).collect()),
        }
    }
    /// Little-endian bytes of every element (the safetensors and arena layout).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match self {
            TensorData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
    /// Every element as f64 (exact for all supported types).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match self {
            TensorData::F32(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::F16(v) => v.iter().map(|&x| x.to_f64()).collect(),
            TensorData::BF16(v) => v.iter().map(|&x| x.to_f64()).collect(),
            TensorData::I64(v) => v.iter().map(|&x| x as f64).collect(),
            TensorData::I32(v) => v.iter().map(|&x| x as f64).collect(),
        }
    }
    /// Build storage of `dtype` from f64 values (rounding to nearest for floats, truncation for ints).
    pub fn from_f64(dtype: DType, v: &[f64]) -> Self {
        match dtype {
            DType::F32 => TensorData::F32(v.iter().map(|&x| x as f32).collect()),
            DType::F16 => TensorData::F16(v.iter().map(|&x| f16::from_f64(x)).collect()),
            DType::BF16 => TensorData::BF16(v.iter().map(|&x| bf16::from_f64(x)).collect()),
            DType::I64 => TensorData::I64(v.iter().map(|&x| x as i64).collect()),
            DType::I32 => TensorData::I32(v.iter().map(|&x| x as i32).collect()),
        }
    }
    /// Convert to another dtype (float<->float conversions round to nearest).
    pub fn convert(&self, to: DType) -> Self {
        if self.dtype() == to {
            return self.clone();
        }
        match (self, to) {
            (TensorData::F16(v), DType::F32) => TensorData::F32(v.iter().map(|x| x.to_f32()).collect()),
            (TensorData::BF16(v), DType::F32) => TensorData::F32(v.iter().map(|x| x.to_f32()).collect()),
            (TensorData::F32(v), DType::F16) => TensorData::F16(v.iter().map(|&x| f16::from_f32(x)).collect()),
            (TensorData::F32(v), DType::BF16) => TensorData::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
            (TensorData::I64(v), DType::I32) => TensorData::I32(v.iter().map(|&x| x as i32).collect()),
            (TensorData::I32(v), DType::I64) => TensorData::I64(v.iter().map(|&x| x as i64).collect()),
            _ => TensorData::from_f64(to, &self.to_f64_vec()),
        }
    }
}

/// Copies the region `src` (shape `ss`) and `dst` (shape `ds`) share, from dim `d` on at
/// offsets `so`/`doff`; innermost rows as slices.
fn copy_region<T: Copy>(src: &[T], ss: &[usize], dst: &mut [T], ds: &[usize], d: usize, so: usize, doff: usize) {
    if d + 1 >= ss.len() {
        let n = if ss.is_empty() { 1 } else { ss[d].min(ds[d]) };
        dst[doff..doff + n].copy_from_slice(&src[so..so + n]);
        return;
    }
    let sstride: usize = ss[d + 1..].iter().product();
    let dstride: usize = ds[d + 1..].iter().product();
    for i in 0..ss[d].min(ds[d]) {
        copy_region(src, ss, dst, ds, d + 1, so + i * sstride, doff + i * dstride);
    }
}

/// A tensor in host memory: checkpoint weights, batch inputs, outputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: TensorData,
}

impl HostTensor {
    pub fn new(shape: Vec<usize>, data: TensorData) -> Result<Self> {
        let n: usize = shape.iter().product();
        if n != data.len() {
            return Err(Error::bad_batch(format!(
                "tensor of shape {shape:?} needs {n} elements, got {}",
                data.len()
            )));
        }
        Ok(HostTensor { shape, data })
    }
    pub fn f32(shape: Vec<usize>, v: Vec<f32>) -> Result<Self> {
        Self::new(shape, TensorData::F32(v))
    }
    pub fn i64(shape: Vec<usize>, v: Vec<i64>) -> Result<Self> {
        Self::new(shape, TensorData::I64(v))
    }
    pub fn zeros(dtype: DType, shape: Vec<usize>) -> Self {
        let n = shape.iter().product();
        HostTensor { shape, data: TensorData::zeros(dtype, n) }
    }
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }
    /// `parts` joined along `axis` as one f32 tensor (a merged weight, see the graph's
    /// `WeightConcat`); an error names the part whose dims do not fit.
    pub fn concat_f32(parts: &[&HostTensor], axis: usize) -> Result<HostTensor> {
        let mismatch = |i: usize, expected: String, found: &[usize]| Error::TensorMismatch {
            path: "<weight concatenation>".into(),
            tensor: format!("part {i}"),
            expected,
            found: format!("{found:?}"),
        };
        let first = parts.first().ok_or_else(|| mismatch(0, "a tensor".into(), &[]))?;
        let rank = first.shape.len();
        if axis >= rank {
            return Err(mismatch(0, format!("a rank above the axis {axis}"), &first.shape));
        }
        let outer: usize = first.shape[..axis].iter().product();
        let inner: usize = first.shape[axis + 1..].iter().product();
        let mut shape = first.shape.clone();
        shape[axis] = 0;
        let mut data: Vec<Vec<f32>> = Vec::with_capacity(parts.len());
        for (i, p) in parts.iter().enumerate() {
            let fits = p.shape.len() == rank && (0..rank).all(|d| d == axis || p.shape[d] == first.shape[d]);
            if !fits {
                return Err(mismatch(i, format!("{:?} but along axis {axis}", first.shape), &p.shape));
            }
            shape[axis] += p.shape[axis];
            data.push(p.to_f32_vec());
        }
        let mut out = Vec::with_capacity(shape.iter().product());
        for o in 0..outer {
            for (p, v) in parts.iter().zip(&data) {
                let run = p.shape[axis] * inner;
                out.extend_from_slice(&v[o * run..(o + 1) * run]);
            }
        }
        HostTensor::f32(shape, out)
    }
    /// This tensor in shape `to` (same rank): the region both shapes share is copied, bit for
    /// bit in its own dtype; the rest is zero. Pads (every dim of `to` larger) and trims (every
    /// dim smaller) alike: the engine's padding of inputs and trimming of outputs.
    pub fn resized(&self, to: &[usize]) -> HostTensor {
        assert_eq!(to.len(), self.shape.len(), "resized keeps the rank");
        if to == self.shape {
            return self.clone();
        }
        fn go<T: Copy>(src: &[T], ss: &[usize], ds: &[usize], zero: T) -> Vec<T> {
            let mut dst = vec![zero; ds.iter().product()];
            if !dst.is_empty() && !src.is_empty() {
                copy_region(src, ss, &mut dst, ds, 0, 0, 0);
            }
            dst
        }
        let (ss, ds) = (&self.shape[..], to);
        let data = match &self.data {
            TensorData::F32(v) => TensorData::F32(go(v, ss, ds, 0.0)),
            TensorData::F16(v) => TensorData::F16(go(v, ss, ds, f16::ZERO)),
            TensorData::BF16(v) => TensorData::BF16(go(v, ss, ds, bf16::ZERO)),
            TensorData::I64(v) => TensorData::I64(go(v, ss, ds, 0)),
            TensorData::I32(v) => TensorData::I32(go(v, ss, ds, 0)),
        };
        HostTensor { shape: to.to_vec(), data }
    }
    pub fn numel(&self) -> usize {
        self.data.len()
    }
    pub fn byte_len(&self) -> usize {
        self.numel() * self.dtype().size()
    }
    /// The data as f32 slice, if the tensor is f32.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            TensorData::F32(v) => Some(v),
            _ => None,
        }
    }
    pub fn as_i64(&self) -> Option<&[i64]> {
        match &self.data {
            TensorData::I64(v) => Some(v),
            _ => None,
        }
    }
    /// Values converted to f32 (a copy).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self.data.convert(DType::F32) {
            TensorData::F32(v) => v,
            _ => unreachable!("convert(F32) yields F32"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concat_joins_along_either_axis_and_names_a_part_that_does_not_fit() {
        let a = HostTensor::f32(vec![2, 2], vec![1., 2., 3., 4.]).unwrap();
        let b = HostTensor::f32(vec![2, 1], vec![5., 6.]).unwrap();
        let c = HostTensor::f32(vec![1, 2], vec![7., 8.]).unwrap();
        let cols = HostTensor::concat_f32(&[&a, &b], 1).unwrap();
        assert_eq!((cols.shape.clone(), cols.to_f32_vec()), (vec![2, 3], vec![1., 2., 5., 3., 4., 6.]));
        let rows = HostTensor::concat_f32(&[&a, &c], 0).unwrap();
        assert_eq!((rows.shape.clone(), rows.to_f32_vec()), (vec![3, 2], vec![1., 2., 3., 4., 7., 8.]));
        let e = HostTensor::concat_f32(&[&a, &b], 0).unwrap_err().to_string();
        assert!(e.contains("part 1") && e.contains("[2, 1]"), "{e}");
        assert!(HostTensor::concat_f32(&[&a], 2).is_err());
    }
}
