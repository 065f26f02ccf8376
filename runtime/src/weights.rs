//! Weight loading: the async, dyn-compatible [`WeightLoader`] trait, its data types, a tiny
//! blocking executor so callers need no async runtime, and [`SafetensorsLoader`] (mmap).

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use crate::dtype::{DType, HostTensor, TensorData};
use crate::error::{Error, Result};

/// A boxed, `Send` future: what makes [`WeightLoader`] usable as `dyn WeightLoader`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where weights come from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WeightSource {
    /// One `.safetensors` file.
    Safetensors(PathBuf),
    /// The initializers of an ONNX model (and its external data files), read by
    /// `kiln_compiler::frontends::onnx::OnnxLoader`.
    Onnx(PathBuf),
}

impl WeightSource {
    pub fn path(&self) -> &Path {
        match self {
            WeightSource::Safetensors(p) | WeightSource::Onnx(p) => p,
        }
    }
}

/// A request for one tensor: its name in `source`, the dtype wanted (converted on request when
/// the stored dtype differs and the loader can convert), and the shape expected, if any.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorSpec {
    pub source: WeightSource,
    pub name: String,
    pub dtype: DType,
    pub shape: Option<Vec<usize>>,
}

/// A loaded tensor: either a view into the mapped file (no copy, when the stored dtype is the
/// one asked for) or owned, converted data.
#[derive(Clone)]
pub struct TensorRef {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    storage: Storage,
}

#[derive(Clone)]
enum Storage {
    Mapped { map: Arc<Mmap>, start: usize, end: usize },
    Owned(TensorData),
}

impl std::fmt::Debug for TensorRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.storage {
            Storage::Mapped { .. } => "mapped",
            Storage::Owned(_) => "owned",
        };
        write!(f, "TensorRef({} {} {:?} {kind})", self.name, self.dtype, self.shape)
    }
}

impl TensorRef {
    /// A tensor held in memory.
    pub fn owned(name: impl Into<String>, t: HostTensor) -> Self {
        TensorRef { name: name.into(), dtype: t.dtype(), shape: t.shape, storage: Storage::Owned(t.data) }
    }

    /// A tensor read in place from bytes `start..end` of a mapped file (little-endian `dtype`
    /// elements of `shape`); the range must hold exactly those bytes.
    pub fn mapped(name: impl Into<String>, dtype: DType, shape: Vec<usize>, map: Arc<Mmap>, start: usize, end: usize) -> Result<Self> {
        let name = name.into();
        let want = shape.iter().try_fold(dtype.size(), |a, &d| a.checked_mul(d));
        if end > map.len() || start > end || want != Some(end - start) {
            return Err(Error::Internal {
                stage: "weights".into(),
                message: format!("tensor `{name}`: bytes {start}..{end} of a {}-byte map for {dtype} {shape:?}", map.len()),
            });
        }
        Ok(TensorRef { name, dtype, shape, storage: Storage::Mapped { map, start, end } })
    }

    /// Whether the data is read straight from the mapped file (zero copy).
    pub fn is_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mapped { .. })
    }
    /// Raw little-endian bytes, for mapped tensors.
    pub fn bytes(&self) -> Option<&[u8]> {
        match &self.storage {
            Storage::Mapped { map, start, end } => Some(&map[*start..*end]),
            Storage::Owned(_) => None,
        }
    }
    /// The tensor as an owned host tensor.
    pub fn to_host(&self) -> HostTensor {
        let data = match &self.storage {
            Storage::Mapped { map, start, end } => TensorData::from_le_bytes(self.dtype, &map[*start..*end]),
            Storage::Owned(d) => d.clone(),
        };
        HostTensor { shape: self.shape.clone(), data }
    }
}

/// One tensor listed by [`WeightLoader::get_metadata`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: usize,
}

/// What a source holds, read from its header only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightMetadata {
    pub source: WeightSource,
    /// Sorted by name.
    pub tensors: Vec<TensorInfo>,
    pub total_bytes: usize,
    pub file_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightLoaderCapabilities {
    /// Tensors are served from a memory map without copying.
    pub zero_copy: bool,
    /// Stored dtypes the loader reads.
    pub dtypes: Vec<DType>,
    /// Float dtypes can be converted to one another on request.
    pub converts_dtypes: bool,
}

/// Loads checkpoint tensors. Async and dyn compatible (boxed `Send` futures); use
/// [`block_on`] to call it from synchronous code.
pub trait WeightLoader: Send + Sync {
    fn load_tensor<'a>(&'a self, spec: &'a TensorSpec) -> BoxFuture<'a, Result<TensorRef>>;
    fn load_tensors<'a>(&'a self, specs: &'a [TensorSpec]) -> BoxFuture<'a, Result<Vec<TensorRef>>>;
    fn is_available<'a>(&'a self, source: &'a WeightSource) -> BoxFuture<'a, bool>;
    fn get_metadata<'a>(&'a self, source: &'a WeightSource) -> BoxFuture<'a, Result<WeightMetadata>>;
    /// Touches every page of the source so later loads do not fault.
    fn preload<'a>(&'a self, source: &'a WeightSource) -> BoxFuture<'a, Result<()>>;
    fn capabilities(&self) -> WeightLoaderCapabilities;
}

struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs a future to completion on the current thread (parks between polls). Enough for the
/// loader's futures; no async runtime needed.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(v) => return v,
            Poll::Pending => std::thread::park(),
        }
    }
}

/// Reads `.safetensors` files through a memory map (memmap2) and the `safetensors` crate's
/// header parser and validation. Maps are cached per file.
#[derive(Default)]
pub struct SafetensorsLoader {
    maps: Mutex<HashMap<PathBuf, Arc<Mapped>>>,
}

/// A mapped file with its parsed header: name → (dtype, shape, byte range in the map).
struct Mapped {
    map: Arc<Mmap>,
    tensors: HashMap<String, (DType, Vec<usize>, usize, usize)>,
}

fn convert_dtype(path: &Path, name: &str, d: safetensors::Dtype) -> Result<DType> {
    use safetensors::Dtype as S;
    Ok(match d {
        S::F32 => DType::F32,
        S::F16 => DType::F16,
        S::BF16 => DType::BF16,
        S::I64 => DType::I64,
        S::I32 => DType::I32,
        other => {
            return Err(Error::TensorMismatch {
                path: path.into(),
                tensor: name.into(),
                expected: "one of f32, f16, bf16, i64, i32".into(),
                found: format!("{other:?}"),
            })
        }
    })
}

impl SafetensorsLoader {
    pub fn new() -> Self {
        Self::default()
    }

    fn open(&self, path: &Path) -> Result<Arc<Mapped>> {
        if let Some(m) = self.maps.lock().unwrap_or_else(|e| e.into_inner()).get(path) {
            return Ok(m.clone());
        }
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, &e))?;
        // SAFETY: the map is read-only; kiln never writes the file. A file truncated by another
        // process while mapped is outside what any mmap-based loader can guard against.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, &e))?;
        let parsed = safetensors::SafeTensors::deserialize(&map)
            .map_err(|e| Error::MalformedWeights { path: path.into(), message: e.to_string() })?;
        let base = map.as_ptr() as usize;
        let mut tensors = HashMap::new();
        for (name, view) in parsed.tensors() {
            let dtype = convert_dtype(path, &name, view.dtype())?;
            let start = view.data().as_ptr() as usize - base;
            let end = start + view.data().len();
            tensors.insert(name, (dtype, view.shape().to_vec(), start, end));
        }
        drop(parsed);
        let mapped = Arc::new(Mapped { map: Arc::new(map), tensors });
        self.maps.lock().unwrap_or_else(|e| e.into_inner()).insert(path.to_path_buf(), mapped.clone());
        Ok(mapped)
    }

    fn load_sync(&self, spec: &TensorSpec) -> Result<TensorRef> {
        let path = not_safetensors(&spec.source)?;
        let m = self.open(path)?;
        let (dtype, shape, start, end) = m
            .tensors
            .get(&spec.name)
            .cloned()
            .ok_or_else(|| Error::MissingTensor { path: path.into(), tensor: spec.name.clone() })?;
        if let Some(want) = &spec.shape {
            if *want != shape {
                return Err(Error::TensorMismatch {
                    path: path.into(),
                    tensor: spec.name.clone(),
                    expected: format!("shape {want:?}"),
                    found: format!("shape {shape:?}"),
                });
            }
        }
        if dtype == spec.dtype {
            return Ok(TensorRef {
                name: spec.name.clone(),
                dtype,
                shape,
                storage: Storage::Mapped { map: m.map.clone(), start, end },
            });
        }
        if !(dtype.is_float() && spec.dtype.is_float()) {
            return Err(Error::TensorMismatch {
                path: path.into(),
                tensor: spec.name.clone(),
                expected: format!("dtype {}", spec.dtype),
                found: format!("dtype {dtype} (only float dtypes convert)"),
            });
        }
        let data = TensorData::from_le_bytes(dtype, &m.map[start..end]).convert(spec.dtype);
        Ok(TensorRef { name: spec.name.clone(), dtype: spec.dtype, shape, storage: Storage::Owned(data) })
    }

    fn metadata_sync(&self, source: &WeightSource) -> Result<WeightMetadata> {
        let m = self.open(not_safetensors(source)?)?;
        let mut tensors: Vec<TensorInfo> = m
            .tensors
            .iter()
            .map(|(name, (dtype, shape, s, e))| TensorInfo {
                name: name.clone(),
                dtype: *dtype,
                shape: shape.clone(),
                bytes: e - s,
            })
            .collect();
        tensors.sort_by(|a, b| a.name.cmp(&b.name));
        let total_bytes = tensors.iter().map(|t| t.bytes).sum();
        Ok(WeightMetadata { source: source.clone(), tensors, total_bytes, file_bytes: m.map.len() as u64 })
    }
}

impl WeightLoader for SafetensorsLoader {
    fn load_tensor<'a>(&'a self, spec: &'a TensorSpec) -> BoxFuture<'a, Result<TensorRef>> {
        Box::pin(async move { self.load_sync(spec) })
    }
    fn load_tensors<'a>(&'a self, specs: &'a [TensorSpec]) -> BoxFuture<'a, Result<Vec<TensorRef>>> {
        Box::pin(async move { specs.iter().map(|s| self.load_sync(s)).collect() })
    }
    fn is_available<'a>(&'a self, source: &'a WeightSource) -> BoxFuture<'a, bool> {
        Box::pin(async move { not_safetensors(source).and_then(|p| self.open(p)).is_ok() })
    }
    fn get_metadata<'a>(&'a self, source: &'a WeightSource) -> BoxFuture<'a, Result<WeightMetadata>> {
        Box::pin(async move { self.metadata_sync(source) })
    }
    fn preload<'a>(&'a self, source: &'a WeightSource) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let m = self.open(not_safetensors(source)?)?;
            // Read one byte per page so the kernel faults every page in now.
            let mut acc = 0u8;
            for b in m.map.iter().step_by(4096) {
                acc = acc.wrapping_add(*b);
            }
            std::hint::black_box(acc);
            Ok(())
        })
    }
    fn capabilities(&self) -> WeightLoaderCapabilities {
        WeightLoaderCapabilities {
            zero_copy: true,
            dtypes: vec![DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32],
            converts_dtypes: true,
        }
    }
}

/// Loads every weight of a graph's weight table from one safetensors file, in table order,
/// checking names, dtypes (converting floats) and shapes.
/// The path of a safetensors source; another kind of source is `Unsupported` here.
fn not_safetensors(source: &WeightSource) -> Result<&Path> {
    match source {
        WeightSource::Safetensors(p) => Ok(p),
        other => Err(Error::Unsupported(format!("{}: the safetensors loader reads .safetensors files, not {other:?}", other.path().display()))),
    }
}

/// Loads the weight table `table` (names, dtypes, shapes) from `source` through `loader`.
pub fn load_table(loader: &dyn WeightLoader, source: &WeightSource, table: &[crate::graph::WeightSpec]) -> Result<Vec<HostTensor>> {
    let specs: Vec<TensorSpec> = table
        .iter()
        .map(|w| TensorSpec { source: source.clone(), name: w.name.clone(), dtype: w.dtype, shape: Some(w.shape.clone()) })
        .collect();
    let refs = block_on(loader.load_tensors(&specs))?;
    Ok(refs.iter().map(|r| r.to_host()).collect())
}

pub fn load_graph_weights(
    loader: &dyn WeightLoader,
    path: &Path,
    table: &[crate::graph::WeightSpec],
) -> Result<Vec<HostTensor>> {
    load_table(loader, &WeightSource::Safetensors(path.to_path_buf()), table)
}
