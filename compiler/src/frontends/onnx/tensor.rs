//! ONNX tensors: element types, `TensorProto` decoding (typed fields, `raw_data`, external data
//! files next to the model) into literals ([`Lit`]) or kiln tensors ([`HostTensor`]).

use std::path::Path;

use kiln_runtime::{DType, HostTensor, TensorData};

use super::proto::TensorProto;

/// An ONNX element type kiln can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    F32,
    F16,
    BF16,
    F64,
    I64,
    I32,
    I16,
    I8,
    U8,
    U16,
    U32,
    U64,
    Bool,
    /// 4-bit integers, two to a byte (the first in the low nibble).
    I4,
    U4,
}

/// `TensorProto.DataType` codes of the element types kiln reads: the one table both ways.
const CODES: [(i32, Elem); 15] = [
    (1, Elem::F32),
    (2, Elem::U8),
    (3, Elem::I8),
    (4, Elem::U16),
    (5, Elem::I16),
    (6, Elem::I32),
    (7, Elem::I64),
    (9, Elem::Bool),
    (10, Elem::F16),
    (11, Elem::F64),
    (12, Elem::U32),
    (13, Elem::U64),
    (16, Elem::BF16),
    (21, Elem::U4),
    (22, Elem::I4),
];

impl Elem {
    /// `TensorProto.DataType` code → element type (`None`: strings, complex, float8/4, ...).
    pub fn from_code(code: i32) -> Option<Elem> {
        CODES.iter().find(|(c, _)| *c == code).map(|&(_, e)| e)
    }
    /// The `TensorProto.DataType` code of this type.
    pub fn code(self) -> i32 {
        CODES.iter().find(|(_, e)| *e == self).map_or(0, |&(c, _)| c)
    }
    pub fn name_of(code: i32) -> String {
        let n = match code {
            8 => "string",
            14 => "complex64",
            15 => "complex128",
            17..=20 => "float8",
            23 => "float4",
            _ => return Elem::from_code(code).map_or(format!("type code {code}"), |e| format!("{e:?}").to_lowercase()),
        };
        n.to_string()
    }
    pub fn is_float(self) -> bool {
        matches!(self, Elem::F32 | Elem::F16 | Elem::BF16 | Elem::F64)
    }
    /// Bytes per element in `raw_data`.
    pub fn size(self) -> usize {
        match self {
            Elem::F64 | Elem::I64 | Elem::U64 => 8,
            Elem::F32 | Elem::I32 | Elem::U32 => 4,
            Elem::F16 | Elem::BF16 | Elem::I16 | Elem::U16 => 2,
            Elem::I8 | Elem::U8 | Elem::Bool | Elem::I4 | Elem::U4 => 1,
        }
    }
    /// Bytes that `n` values take in `raw_data` (4-bit types: two to a byte).
    pub fn bytes(self, n: usize) -> usize {
        match self {
            Elem::I4 | Elem::U4 => n.div_ceil(2),
            e => n * e.size(),
        }
    }
    /// The values of a quantized type (QuantizeLinear's saturation bounds); `None` for the
    /// types kiln does not quantize to (floats, 32-bit and wider integers, bool).
    pub fn q_range(self) -> Option<(f32, f32)> {
        Some(match self {
            Elem::U8 => (0.0, 255.0),
            Elem::I8 => (-128.0, 127.0),
            Elem::U16 => (0.0, 65535.0),
            Elem::I16 => (-32768.0, 32767.0),
            Elem::I4 => (-8.0, 7.0),
            Elem::U4 => (0.0, 15.0),
            _ => return None,
        })
    }
    /// The kiln dtype a value of this type computes in: floats keep f32/f16/bf16 (f64 becomes
    /// f32), every integer and bool type becomes i64.
    pub fn dtype(self) -> DType {
        match self {
            Elem::F32 | Elem::F64 => DType::F32,
            Elem::F16 => DType::F16,
            Elem::BF16 => DType::BF16,
            _ => DType::I64,
        }
    }
}

/// A tensor whose values the importer knows: initializers, `Constant`s and everything computed
/// from them alone (shape arithmetic).
#[derive(Debug, Clone, PartialEq)]
pub struct Lit {
    pub elem: Elem,
    pub shape: Vec<usize>,
    pub data: LitData,
    /// Derived from a large float (or quantized) initializer: becomes a weight, not a constant.
    pub weight: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum LitData {
    F(Vec<f64>),
    I(Vec<i64>),
}

impl Lit {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn ints(&self) -> Vec<i64> {
        match &self.data {
            LitData::I(v) => v.clone(),
            LitData::F(v) => v.iter().map(|&x| x as i64).collect(),
        }
    }
    pub fn floats(&self) -> Vec<f64> {
        match &self.data {
            LitData::F(v) => v.clone(),
            LitData::I(v) => v.iter().map(|&x| x as f64).collect(),
        }
    }
    pub fn int(shape: Vec<usize>, v: Vec<i64>) -> Lit {
        Lit { elem: Elem::I64, shape, data: LitData::I(v), weight: false }
    }
    pub fn of(elem: Elem, shape: Vec<usize>, v: Vec<f64>) -> Lit {
        let data = if elem.is_float() { LitData::F(v) } else { LitData::I(v.into_iter().map(|x| x as i64).collect()) };
        Lit { elem, shape, data, weight: false }
    }
    /// As a kiln tensor of its computing dtype ([`Elem::dtype`]).
    pub fn to_host(&self) -> HostTensor {
        let data = match &self.data {
            LitData::F(v) => TensorData::from_f64(self.elem.dtype(), v),
            LitData::I(v) => TensorData::I64(v.clone()),
        };
        HostTensor { shape: self.shape.clone(), data }
    }
}

fn dims(t: &TensorProto) -> Result<Vec<usize>, String> {
    t.dims.iter().map(|&d| usize::try_from(d).map_err(|_| format!("negative dim {d}"))).collect()
}

/// The element count of `shape`, refusing overflow and absurd sizes (2^40 elements).
pub fn checked_numel(shape: &[usize]) -> Result<usize, String> {
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= 1 << 40)
        .ok_or_else(|| format!("shape {shape:?} is too large"))
}

/// The raw little-endian bytes of `t`: `raw_data`, or the external file's range (a path
/// relative to the model's folder, never outside it).
fn raw_bytes(t: &TensorProto, dir: &Path, want: usize) -> Result<Option<Vec<u8>>, String> {
    if t.data_location == Some(1) {
        let get = |k: &str| t.external_data.iter().find(|e| e.key() == k).map(|e| e.value().to_string());
        let loc = get("location").ok_or("external data without a location")?;
        let rel = Path::new(&loc);
        if rel.is_absolute() || rel.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
            return Err(format!("external data location `{loc}` is outside the model's folder"));
        }
        let offset: u64 = get("offset").map_or(Ok(0), |o| o.parse().map_err(|_| format!("bad offset `{o}`")))?;
        let length: usize = match get("length") {
            Some(l) => l.parse().map_err(|_| format!("bad length `{l}`"))?,
            None => want,
        };
        if length != want {
            return Err(format!("external data holds {length} bytes, the tensor needs {want}"));
        }
        let path = dir.join(rel);
        use std::io::{Read, Seek};
        let mut f = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let size = f.metadata().map_err(|e| format!("{}: {e}", path.display()))?.len();
        if offset.checked_add(length as u64).is_none_or(|end| end > size) {
            return Err(format!("{}: bytes {offset}..+{length} run past its {size} bytes", path.display()));
        }
        f.seek(std::io::SeekFrom::Start(offset)).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut buf = vec![0u8; length];
        f.read_exact(&mut buf).map_err(|e| format!("{}: {e}", path.display()))?;
        return Ok(Some(buf));
    }
    match &t.raw_data {
        Some(r) if r.len() != want => Err(format!("raw_data holds {} bytes, the tensor needs {want}", r.len())),
        Some(r) => Ok(Some(r.clone())),
        None => Ok(None),
    }
}

fn elem_of(t: &TensorProto) -> Result<Elem, String> {
    let code = t.data_type.unwrap_or(0);
    Elem::from_code(code).ok_or_else(|| format!("element type {} is not supported", Elem::name_of(code)))
}

/// Value `k` of a 4-bit type from the byte holding it (`k` even: the low nibble).
fn nibble(elem: Elem, byte: i64, k: usize) -> i64 {
    let v = (byte >> (4 * (k % 2))) & 0xf;
    if elem == Elem::I4 { (v ^ 8) - 8 } else { v }
}

/// Decodes `t` into a literal.
pub fn lit_from_tensor(t: &TensorProto, dir: &Path) -> Result<Lit, String> {
    let elem = elem_of(t)?;
    let shape = dims(t)?;
    let n = checked_numel(&shape)?;
    let raw = raw_bytes(t, dir, elem.bytes(n))?;
    let short = |have: usize| format!("holds {have} values, its shape {shape:?} needs {n}");
    let data = match raw {
        Some(b) if matches!(elem, Elem::I4 | Elem::U4) => LitData::I((0..n).map(|k| nibble(elem, b[k / 2] as i64, k)).collect()),
        Some(b) => {
            let f = |i: usize| -> f64 {
                let c = &b[i * elem.size()..(i + 1) * elem.size()];
                match elem {
                    Elem::F32 => f32::from_le_bytes(c.try_into().unwrap()) as f64,
                    Elem::F16 => half::f16::from_le_bytes(c.try_into().unwrap()).to_f64(),
                    Elem::BF16 => half::bf16::from_le_bytes(c.try_into().unwrap()).to_f64(),
                    Elem::F64 => f64::from_le_bytes(c.try_into().unwrap()),
                    _ => 0.0,
                }
            };
            let i = |k: usize| -> i64 {
                let c = &b[k * elem.size()..(k + 1) * elem.size()];
                match elem {
                    Elem::I64 => i64::from_le_bytes(c.try_into().unwrap()),
                    Elem::U64 => u64::from_le_bytes(c.try_into().unwrap()) as i64,
                    Elem::I32 => i32::from_le_bytes(c.try_into().unwrap()) as i64,
                    Elem::U32 => u32::from_le_bytes(c.try_into().unwrap()) as i64,
                    Elem::I16 => i16::from_le_bytes(c.try_into().unwrap()) as i64,
                    Elem::U16 => u16::from_le_bytes(c.try_into().unwrap()) as i64,
                    Elem::I8 => c[0] as i8 as i64,
                    Elem::U8 | Elem::Bool => c[0] as i64,
                    _ => 0,
                }
            };
            if elem.is_float() {
                LitData::F((0..n).map(f).collect())
            } else {
                LitData::I((0..n).map(i).collect())
            }
        }
        None => match elem {
            Elem::F32 if t.float_data.len() == n => LitData::F(t.float_data.iter().map(|&x| x as f64).collect()),
            Elem::F32 => return Err(short(t.float_data.len())),
            Elem::F64 if t.double_data.len() == n => LitData::F(t.double_data.clone()),
            Elem::F64 => return Err(short(t.double_data.len())),
            Elem::F16 | Elem::BF16 if t.int32_data.len() == n => LitData::F(
                t.int32_data
                    .iter()
                    .map(|&b| if elem == Elem::F16 { half::f16::from_bits(b as u16).to_f64() } else { half::bf16::from_bits(b as u16).to_f64() })
                    .collect(),
            ),
            Elem::I64 if t.int64_data.len() == n => LitData::I(t.int64_data.clone()),
            Elem::I64 => return Err(short(t.int64_data.len())),
            Elem::U32 | Elem::U64 if t.uint64_data.len() == n => LitData::I(t.uint64_data.iter().map(|&x| x as i64).collect()),
            // Two 4-bit values to each int32_data entry.
            Elem::I4 | Elem::U4 if t.int32_data.len() == n.div_ceil(2) => {
                LitData::I((0..n).map(|k| nibble(elem, t.int32_data[k / 2] as i64, k)).collect())
            }
            Elem::I32 | Elem::I16 | Elem::I8 | Elem::U8 | Elem::U16 | Elem::Bool if t.int32_data.len() == n => {
                LitData::I(t.int32_data.iter().map(|&x| x as i64).collect())
            }
            _ => return Err(short(t.int32_data.len().max(t.int64_data.len()).max(t.float_data.len()))),
        },
    };
    Ok(Lit { elem, shape, data, weight: false })
}

/// Decodes a float initializer straight into a kiln tensor of its dtype (f64 → f32), without
/// the f64 detour of a literal: how large weights are read.
pub fn host_from_tensor(t: &TensorProto, dir: &Path) -> Result<HostTensor, String> {
    let elem = elem_of(t)?;
    let shape = dims(t)?;
    let n = checked_numel(&shape)?;
    if elem == Elem::F32 {
        if let Some(b) = raw_bytes(t, dir, n * 4)? {
            let v = b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            return Ok(HostTensor { shape, data: TensorData::F32(v) });
        }
    }
    let lit = lit_from_tensor(t, dir)?;
    Ok(lit.to_host())
}
