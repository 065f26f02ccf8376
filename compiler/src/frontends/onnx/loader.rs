//! [`OnnxLoader`]: the seed `WeightLoader` over ONNX files, so that `Backend::upload` takes an
//! ONNX model's initializers the same way as a safetensors checkpoint. Initializers in external
//! data files are served from a memory map without copying (when the dtype asked for is the one
//! stored); those inside the protobuf are decoded; dequantized weights (an int8 initializer
//! times its scale) are the import's (computed once per model, [`OnnxModel::derived`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kiln_runtime::weights::{
    BoxFuture, TensorInfo, TensorRef, TensorSpec, WeightLoader, WeightLoaderCapabilities, WeightMetadata, WeightSource,
};
use kiln_runtime::{DType, Error, HostTensor, Result};
use memmap2::Mmap;

use super::tensor::{host_from_tensor, Elem};
use super::OnnxModel;

#[derive(Default)]
pub struct OnnxLoader {
    models: Mutex<HashMap<PathBuf, Arc<OnnxModel>>>,
    maps: Mutex<HashMap<PathBuf, Arc<Mmap>>>,
}

impl OnnxLoader {
    pub fn new() -> Self {
        Self::default()
    }

    /// A loader that serves `model` (already open) for its path.
    pub fn with_model(model: Arc<OnnxModel>) -> Self {
        let l = Self::default();
        l.models.lock().unwrap_or_else(|e| e.into_inner()).insert(model.path.clone(), model);
        l
    }

    fn model(&self, source: &WeightSource) -> Result<Arc<OnnxModel>> {
        let path = match source {
            WeightSource::Onnx(p) => p,
            other => return Err(Error::Unsupported(format!("{}: the ONNX loader reads .onnx models, not {other:?}", other.path().display()))),
        };
        let mut models = self.models.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = models.get(path) {
            return Ok(m.clone());
        }
        let m = Arc::new(OnnxModel::open(path, &[])?);
        models.insert(path.clone(), m.clone());
        Ok(m)
    }

    fn map(&self, path: &Path) -> Result<Arc<Mmap>> {
        let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = maps.get(path) {
            return Ok(m.clone());
        }
        let f = std::fs::File::open(path).map_err(|e| Error::io(path, &e))?;
        // SAFETY: the map is read-only; like safetensors checkpoints, model files are not
        // modified while a model is served from them.
        let m = Arc::new(unsafe { Mmap::map(&f) }.map_err(|e| Error::io(path, &e))?);
        maps.insert(path.to_path_buf(), m.clone());
        Ok(m)
    }

    fn load_sync(&self, spec: &TensorSpec) -> Result<TensorRef> {
        let m = self.model(&spec.source)?;
        let path = m.path.clone();
        let check = |dtype: DType, shape: &[usize]| -> Result<()> {
            if spec.shape.as_deref().is_some_and(|s| s != shape) {
                return Err(Error::TensorMismatch {
                    path: path.clone(),
                    tensor: spec.name.clone(),
                    expected: format!("shape {:?}", spec.shape.as_ref().unwrap()),
                    found: format!("shape {shape:?}"),
                });
            }
            if dtype != spec.dtype && !(dtype.is_float() && spec.dtype.is_float()) {
                return Err(Error::TensorMismatch {
                    path: path.clone(),
                    tensor: spec.name.clone(),
                    expected: format!("dtype {}", spec.dtype),
                    found: format!("dtype {dtype} (only float dtypes convert)"),
                });
            }
            Ok(())
        };
        let owned = |t: HostTensor| -> Result<TensorRef> {
            check(t.dtype(), &t.shape)?;
            let t = if t.dtype() == spec.dtype { t } else { HostTensor { shape: t.shape.clone(), data: t.data.convert(spec.dtype) } };
            Ok(TensorRef::owned(spec.name.clone(), t))
        };
        if let Some(t) = m.initializer(&spec.name) {
            // External f32 data: straight from the map.
            if t.data_location == Some(1) && Elem::from_code(t.data_type.unwrap_or(0)) == Some(Elem::F32) && spec.dtype == DType::F32 {
                let get = |k: &str| t.external_data.iter().find(|e| e.key() == k).map(|e| e.value().to_string());
                if let (Some(loc), offset) = (get("location"), get("offset").and_then(|o| o.parse::<usize>().ok()).unwrap_or(0)) {
                    let rel = Path::new(&loc);
                    if rel.is_relative() && !rel.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
                        let shape: Vec<usize> = t.dims.iter().map(|&d| d.max(0) as usize).collect();
                        check(DType::F32, &shape)?;
                        let bytes = shape.iter().product::<usize>() * 4;
                        let map = self.map(&m.dir.join(rel))?;
                        if offset.checked_add(bytes).is_some_and(|e| e <= map.len()) {
                            return TensorRef::mapped(spec.name.clone(), DType::F32, shape, map, offset, offset + bytes);
                        }
                    }
                }
            }
            let t = host_from_tensor(t, &m.dir).map_err(|msg| Error::Model { path: path.clone(), message: format!("initializer `{}`: {msg}", spec.name) })?;
            return owned(t);
        }
        match m.derived(&spec.name)? {
            Some(t) => owned(t),
            None => Err(Error::MissingTensor { path, tensor: spec.name.clone() }),
        }
    }

    fn metadata_sync(&self, source: &WeightSource) -> Result<WeightMetadata> {
        let m = self.model(source)?;
        let mut tensors: Vec<TensorInfo> = m
            .graph_proto()
            .initializer
            .iter()
            .filter_map(|t| {
                let e = Elem::from_code(t.data_type.unwrap_or(0))?;
                let shape: Vec<usize> = t.dims.iter().map(|&d| d.max(0) as usize).collect();
                let bytes = e.bytes(shape.iter().product::<usize>());
                Some(TensorInfo { name: t.name().to_string(), dtype: e.dtype(), shape, bytes })
            })
            .collect();
        tensors.sort_by(|a, b| a.name.cmp(&b.name));
        let total_bytes = tensors.iter().map(|t| t.bytes).sum();
        let file_bytes = std::fs::metadata(&m.path).map(|x| x.len()).unwrap_or(0);
        Ok(WeightMetadata { source: source.clone(), tensors, total_bytes, file_bytes })
    }
}

impl WeightLoader for OnnxLoader {
    fn load_tensor<'a>(&'a self, spec: &'a TensorSpec) -> BoxFuture<'a, Result<TensorRef>> {
        Box::pin(async move { self.load_sync(spec) })
    }
    fn load_tensors<'a>(&'a self, specs: &'a [TensorSpec]) -> BoxFuture<'a, Result<Vec<TensorRef>>> {
        Box::pin(async move { specs.iter().map(|s| self.load_sync(s)).collect() })
    }
    fn is_available<'a>(&'a self, source: &'a WeightSource) -> BoxFuture<'a, bool> {
        Box::pin(async move { self.model(source).is_ok() })
    }
    fn get_metadata<'a>(&'a self, source: &'a WeightSource) -> BoxFuture<'a, Result<WeightMetadata>> {
        Box::pin(async move { self.metadata_sync(source) })
    }
    /// Opens the model and computes its dequantized weights now, not at the first upload.
    fn preload<'a>(&'a self, source: &'a WeightSource) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let m = self.model(source)?;
            m.signature().map(|_| ())
        })
    }
    fn capabilities(&self) -> WeightLoaderCapabilities {
        WeightLoaderCapabilities { zero_copy: true, dtypes: vec![DType::F32, DType::F16, DType::BF16, DType::I64], converts_dtypes: true }
    }
}
