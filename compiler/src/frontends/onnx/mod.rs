//! The ONNX frontend: reads a `ModelProto` (opsets 7 to 28) and imports its graph into kiln's
//! IR once every dim is known — for a bucket (batch × seq), or for the shapes of the inputs at
//! hand. Shape subgraphs and weight dequantization fold to literals at import ([`lit`]); every
//! other node becomes kiln ops ([`import`]); what kiln cannot run is `Error::Unsupported`
//! naming the node, its op type, domain and opset.
//!
//! Why per-bucket import rather than one symbolic graph: kiln's dims are `batch`, `seq` or a
//! number, while exported graphs compute shapes (`batch·seq`, `seq/heads`, `Shape → Gather →
//! Concat → Reshape`). Fixing both dims first turns every such computation into constants, as
//! TensorRT's optimization profiles and IREE's per-shape dispatch do. The engine sees the
//! model's signature (symbolic batch and seq, [`OnnxModel::signature`]); [`OnnxBackend`]
//! lowers each bucket from its own import.
//!
//! Protobuf: prost, with the code generated from onnx.proto committed (`proto.rs`, made by
//! `scripts/gen_onnx_proto.sh`, as tract does), so building kiln needs no protoc.

pub mod attrs;
pub mod backend;
pub mod import;
pub mod lit;
pub mod loader;
mod order;
#[allow(clippy::all, missing_docs)]
pub mod proto;
pub mod shape;
pub mod tensor;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use kiln_runtime::graph::{Dim, Graph, InputRole, InputSpec};
use kiln_runtime::signature::{OutputSpec, Signature};
use kiln_runtime::{Bucket, Error, HostTensor, Result};
use prost::Message;

pub use backend::OnnxBackend;
pub use loader::OnnxLoader;
use import::{Fail, Importer};
use proto::{GraphProto, ModelProto, NodeProto, TensorProto};
use tensor::Elem;

/// What a named (symbolic) input dim is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DimRole {
    Batch,
    Seq,
}

/// One graph input.
#[derive(Debug, Clone)]
pub struct OnnxInput {
    pub name: String,
    pub elem: Elem,
    /// A number, or a symbolic name (`None` for a dim with neither).
    pub dims: Vec<Result<usize, Option<String>>>,
}

/// A loaded ONNX model.
pub struct OnnxModel {
    pub path: PathBuf,
    pub dir: PathBuf,
    pub model: ModelProto,
    /// The default domain's opset.
    pub opset: i64,
    pub inputs: Vec<OnnxInput>,
    /// Symbolic dim name → batch or seq.
    pub roles: HashMap<String, DimRole>,
    inits: HashMap<String, usize>,
    used: HashSet<String>,
    /// The nodes some graph output depends on, in topological order (`order.rs`).
    live: Vec<usize>,
    /// Weight data made at import (dequantized initializers), shared by every bucket's import.
    derived: Mutex<HashMap<String, HostTensor>>,
}

impl std::fmt::Debug for OnnxModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnnxModel").field("path", &self.path).field("opset", &self.opset).finish()
    }
}

/// The opsets of the default domain kiln reads. From 7 on, elementwise ops broadcast the numpy
/// way (opset 6 and older had a `broadcast` attribute); the older forms of the ops kiln imports
/// (Slice's and Clip's attributes, Reshape's input, Squeeze/Unsqueeze/Reduce axes as attributes,
/// Softmax over the flattened input) are read as such.
pub const OPSETS: std::ops::RangeInclusive<i64> = 7..=28;

impl OnnxModel {
    /// Reads `path`. `roles` overrides which symbolic dims are batch and seq; by default the
    /// first dim of a rank-2 integer input is batch and the second is seq.
    pub fn open(path: &Path, roles: &[(String, DimRole)]) -> Result<Self> {
        let bad = |m: String| Error::Model { path: path.to_path_buf(), message: m };
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, &e))?;
        if !meta.is_file() {
            return Err(bad("not a regular file".into()));
        }
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, &e))?;
        let model = ModelProto::decode(bytes.as_slice()).map_err(|e| bad(format!("not an ONNX model: {e}")))?;
        let graph = model.graph.as_ref().ok_or_else(|| bad("the model has no graph".into()))?;
        let opset = model
            .opset_import
            .iter()
            .find(|o| o.domain().is_empty() || o.domain() == "ai.onnx")
            .map(|o| o.version())
            .ok_or_else(|| {
                let doms: Vec<&str> = model.opset_import.iter().map(|o| o.domain()).collect();
                Error::Unsupported(format!("{}: only the ops of domains {doms:?} (kiln reads the default domain ai.onnx)", path.display()))
            })?;
        if !OPSETS.contains(&opset) {
            return Err(Error::Unsupported(format!("{}: opset {opset} (kiln reads opsets {}..={})", path.display(), OPSETS.start(), OPSETS.end())));
        }
        let inits: HashMap<String, usize> = graph.initializer.iter().enumerate().map(|(i, t)| (t.name().to_string(), i)).collect();
        let mut inputs = Vec::new();
        for vi in &graph.input {
            if inits.contains_key(vi.name()) {
                continue;
            }
            let t = match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
                Some(proto::type_proto::Value::TensorType(t)) => t,
                _ => return Err(Error::Unsupported(format!("{}: input `{}` is not a tensor", path.display(), vi.name()))),
            };
            let code = t.elem_type.unwrap_or(0);
            let elem = Elem::from_code(code)
                .ok_or_else(|| Error::Unsupported(format!("{}: input `{}` of type {}", path.display(), vi.name(), Elem::name_of(code))))?;
            let dims = t
                .shape
                .as_ref()
                .map(|s| {
                    s.dim
                        .iter()
                        .map(|d| match &d.value {
                            Some(proto::tensor_shape_proto::dimension::Value::DimValue(v)) if *v >= 0 => Ok(*v as usize),
                            Some(proto::tensor_shape_proto::dimension::Value::DimParam(p)) if !p.is_empty() => Err(Some(p.clone())),
                            _ => Err(None),
                        })
                        .collect()
                })
                .unwrap_or_default();
            inputs.push(OnnxInput { name: vi.name().to_string(), elem, dims });
        }
        // Dims named as exporters name them, then the rank-2 integer input's two dims; the
        // caller's `roles` (`--dim NAME=batch|seq`) override both.
        let mut role_map: HashMap<String, DimRole> = HashMap::new();
        for i in &inputs {
            for d in i.dims.iter().filter_map(|d| d.as_ref().err().cloned().flatten()) {
                match d.to_lowercase().as_str() {
                    "batch" | "batch_size" | "n" => role_map.insert(d.clone(), DimRole::Batch),
                    "seq" | "sequence" | "seq_len" | "sequence_length" => role_map.insert(d.clone(), DimRole::Seq),
                    _ => None,
                };
            }
        }
        if let Some(i) = inputs.iter().find(|i| i.dims.len() == 2 && !i.elem.is_float()) {
            if let Err(Some(b)) = &i.dims[0] {
                role_map.insert(b.clone(), DimRole::Batch);
            }
            if let Err(Some(s)) = &i.dims[1] {
                role_map.insert(s.clone(), DimRole::Seq);
            }
        }
        let named: HashSet<String> = inputs.iter().flat_map(|i| i.dims.iter().filter_map(|d| d.as_ref().err().cloned().flatten())).collect();
        for (name, role) in roles {
            if !named.contains(name) {
                let mut known: Vec<&String> = named.iter().collect();
                known.sort();
                return Err(Error::Unsupported(format!(
                    "{}: no input has a dim named `{name}` (symbolic dims: {})",
                    path.display(),
                    known.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                )));
            }
            // The name takes the given role; guessed dims of that role the caller did not name lose it.
            role_map.retain(|n, r| n != name && (*r != *role || roles.iter().any(|(m, _)| m == n)));
            role_map.insert(name.clone(), *role);
        }
        // Live nodes: those some graph output depends on (exports carry dead ones), in
        // topological order.
        let available: HashSet<String> = graph.input.iter().map(|i| i.name().to_string()).chain(graph.initializer.iter().map(|t| t.name().to_string())).collect();
        let order = order::topological(&graph.node, &available);
        let mut used: HashSet<String> = graph.output.iter().map(|o| o.name().to_string()).collect();
        let mut live = Vec::new();
        for &i in order.iter().rev() {
            let n = &graph.node[i];
            if n.output.iter().any(|o| used.contains(o)) {
                live.push(i);
                used.extend(n.input.iter().cloned());
                used.extend(order::subgraph_names(n));
            }
        }
        live.reverse();
        Ok(OnnxModel {
            path: path.to_path_buf(),
            dir: path.parent().map(Path::to_path_buf).unwrap_or_default(),
            model,
            opset,
            inputs,
            roles: role_map,
            inits,
            used,
            live,
            derived: Mutex::new(HashMap::new()),
        })
    }

    pub fn graph_proto(&self) -> &GraphProto {
        self.model.graph.as_ref().expect("checked at open")
    }

    pub fn initializer(&self, name: &str) -> Option<&TensorProto> {
        self.inits.get(name).map(|&i| &self.graph_proto().initializer[i])
    }

    pub fn is_used(&self, value: &str) -> bool {
        self.used.contains(value)
    }

    /// The one node of the main graph that reads `value`, where nothing else does (no graph
    /// output, no second input slot, no subgraph).
    pub fn sole_reader(&self, value: &str) -> Option<&NodeProto> {
        let g = self.graph_proto();
        if g.output.iter().any(|o| o.name() == value) {
            return None;
        }
        let mut reader = None;
        for n in &g.node {
            let reads = n.input.iter().filter(|i| *i == value).count() + order::subgraph_names(n).iter().filter(|i| *i == value).count();
            match (reads, reader) {
                (0, _) => {}
                (1, None) => reader = Some(n),
                _ => return None,
            }
        }
        reader
    }

    /// Each input's concrete shape for `bucket` (its batch and seq dims resolved).
    pub fn shapes_for(&self, bucket: Bucket) -> Result<Vec<Vec<usize>>> {
        self.inputs
            .iter()
            .map(|i| {
                i.dims
                    .iter()
                    .map(|d| match d {
                        Ok(n) => Ok(*n),
                        Err(Some(p)) => match self.roles.get(p) {
                            Some(DimRole::Batch) => Ok(bucket.batch),
                            Some(DimRole::Seq) => Ok(bucket.seq),
                            None => Err(Error::Unsupported(format!(
                                "{}: input `{}` has dim `{p}`, which is neither batch nor seq (kiln takes the dims of a rank-2 integer input, or dims named batch / sequence)",
                                self.path.display(),
                                i.name
                            ))),
                        },
                        Err(None) => Err(Error::Unsupported(format!("{}: input `{}` has an unnamed dynamic dim", self.path.display(), i.name))),
                    })
                    .collect()
            })
            .collect()
    }

    fn role_of(&self, i: &OnnxInput) -> InputRole {
        let n = i.name.to_lowercase();
        if i.dims.len() != 2 {
            InputRole::Other
        } else if n.contains("mask") {
            // Integer or float: 1 for a real token, 0 for padding either way.
            InputRole::AttentionMask
        } else if i.elem.is_float() {
            InputRole::Other
        } else if n.contains("type") || n.contains("segment") {
            InputRole::TokenTypes
        } else if n.contains("position") {
            InputRole::PositionIds
        } else if n.contains("id") || n.contains("input") {
            InputRole::TokenIds
        } else {
            InputRole::Other
        }
    }

    /// Imports the graph with every input at `shapes`. Errors name the node at fault.
    pub fn import(&self, shapes: &[Vec<usize>]) -> Result<Graph> {
        self.import_with(shapes, &vec![None; shapes.len()])
    }

    /// Which inputs are shape tensors: small integer vectors that nodes read only as parameters
    /// (Reshape's shape, Slice's starts, a reduction's axes, ...). Like TensorRT's shape-tensor
    /// inputs, their values must be known when a graph is compiled for them
    /// ([`OnnxModel::import_with`]).
    pub fn shape_inputs(&self) -> Vec<bool> {
        let params = |op: &str| -> &'static [usize] {
            match op {
                "Reshape" | "Unsqueeze" | "Squeeze" | "Expand" | "Tile" | "Split" | "TopK" | "OneHot" | "Pow" | "CumSum" | "CumProd" | "Trilu" => &[1],
                "If" => &[0],
                "Loop" => &[0, 1],
                "DFT" => &[1, 2],
                "CenterCropPad" | "AffineGrid" => &[1],
                "STFT" => &[1, 3],
                "Slice" => &[1, 2, 3, 4],
                "ConstantOfShape" | "HannWindow" | "HammingWindow" | "BlackmanWindow" => &[0],
                "Range" => &[0, 1, 2],
                "Clip" => &[1, 2],
                "Pad" | "Resize" => &[1, 2, 3],
                "Upsample" => &[1],
                o if o.starts_with("Reduce") => &[1],
                _ => &[],
            }
        };
        // Float vectors that are parameters: Resize's roi and scales, Upsample's scales.
        let float_params = |op: &str| -> &'static [usize] {
            match op {
                "Resize" => &[1, 2],
                "Upsample" => &[1],
                _ => &[],
            }
        };
        self.inputs
            .iter()
            .map(|i| {
                // Small integer vectors, scalars of any type (Range's bounds, Clip's limits), and
                // small float vectors read as Resize's scales or roi.
                let vector = i.dims.len() <= 1 && i.dims.iter().all(|d| matches!(d, Ok(n) if *n <= 16));
                let small = vector || i.dims.is_empty();
                let ok = |op: &str, k: usize| if i.elem.is_float() && !i.dims.is_empty() { float_params(op).contains(&k) } else { params(op).contains(&k) };
                let uses: Vec<bool> = self
                    .graph_proto()
                    .node
                    .iter()
                    .flat_map(|n| n.input.iter().enumerate().filter(|(_, x)| **x == i.name).map(|(k, _)| ok(n.op_type(), k)))
                    .collect();
                small && !uses.is_empty() && uses.iter().all(|&p| p)
            })
            .collect()
    }

    /// [`OnnxModel::import`] with the values of some inputs known (shape tensors): those fold
    /// as literals and are not inputs of the graph.
    pub fn import_with(&self, shapes: &[Vec<usize>], known: &[Option<HostTensor>]) -> Result<Graph> {
        let g = self.graph_proto();
        let mut im = Importer::new(self);
        // `where_` names the part of the model at fault; the file comes first in both errors
        // (`Error::Model` prints its path itself).
        let ctx = |n: &str, op: &str, dom: &str| format!("node `{n}` ({op}, domain `{}`, opset {})", if dom.is_empty() { "ai.onnx" } else { dom }, self.opset);
        let fail = |where_: String, f: Fail| match f {
            Fail::Unsupported(m) => Error::Unsupported(format!("{}: {where_}: {m}", self.path.display())),
            Fail::Invalid(m) => Error::Model { path: self.path.clone(), message: format!("{where_}: {m}") },
        };
        if shapes.len() != self.inputs.len() {
            return Err(Error::bad_batch(format!("the model takes {} inputs, {} shapes given", self.inputs.len(), shapes.len())));
        }
        for (i, s) in self.inputs.iter().zip(shapes) {
            let k = known.get(self.inputs.iter().position(|x| x.name == i.name).unwrap_or(0)).cloned().flatten();
            // An empty shape tensor (a reduction's empty `axes`) is a literal like any other.
            if k.is_none() && s.contains(&0) {
                return Err(Error::Unsupported(format!("{}: input `{}` of shape {s:?} is empty", self.path.display(), i.name)));
            }
            match k {
                Some(t) => im.known_input(&i.name, i.elem, &t),
                None => im.input(&i.name, i.elem, s, self.role_of(i)).map_err(|f| fail(format!("input `{}`", i.name), f))?,
            }
        }
        for t in &g.initializer {
            if self.inputs.iter().any(|i| i.name == t.name()) {
                continue;
            }
            im.initializer(t.name(), t).map_err(|f| fail(format!("initializer `{}`", t.name()), f))?;
        }
        for n in self.live.iter().map(|&i| &g.node[i]) {
            let label = if n.name().is_empty() { n.output.first().map(String::as_str).unwrap_or("") } else { n.name() };
            im.node_proto(n).map_err(|f| fail(ctx(label, n.op_type(), n.domain()), f))?;
        }
        for o in &g.output {
            let v = im_value(&mut im, o.name()).map_err(|f| fail(format!("output `{}`", o.name()), f))?;
            im.g.outputs.push(v);
            im.g.output_names.push(o.name().to_string());
        }
        let mut derived = self.derived.lock().unwrap_or_else(|e| e.into_inner());
        for (name, t) in im.derived.drain(..) {
            derived.entry(name).or_insert(t);
        }
        Ok(im.g)
    }

    /// Imports the graph for `bucket`.
    pub fn graph_for(&self, bucket: Bucket) -> Result<Graph> {
        self.import(&self.shapes_for(bucket)?)
    }

    /// The model's signature with symbolic batch and seq: the inputs' dims by role, the outputs'
    /// dims found by importing at two buckets (a dim that follows batch or seq is that dim).
    pub fn signature(&self) -> Result<Signature> {
        let (b1, b2) = (Bucket::new(3, 5), Bucket::new(7, 11));
        let (g1, g2) = (self.graph_for(b1)?, self.graph_for(b2)?);
        if g1.weights != g2.weights {
            return Err(Error::Unsupported(format!("{}: the weight table depends on the batch or seq size", self.path.display())));
        }
        let sym = |a: usize, b: usize, what: &str| -> Result<Dim> {
            Ok(match (a, b) {
                (x, y) if x == y => Dim::Fixed(x),
                (3, 7) => Dim::Batch,
                (5, 11) => Dim::Seq,
                _ => return Err(Error::Unsupported(format!("{}: {what} has a dim that is neither fixed, batch nor seq", self.path.display()))),
            })
        };
        let mut inputs = Vec::new();
        for (a, b) in g1.inputs.iter().zip(&g2.inputs) {
            let shape = a.shape.iter().zip(&b.shape).map(|(x, y)| sym(x.fixed().unwrap_or(0), y.fixed().unwrap_or(0), &a.name)).collect::<Result<_>>()?;
            inputs.push(InputSpec { shape, ..a.clone() });
        }
        let mut outputs = Vec::new();
        for ((&o1, &o2), name) in g1.outputs.iter().zip(&g2.outputs).zip(&g1.output_names) {
            let (n1, n2) = (g1.node(o1), g2.node(o2));
            let shape = n1.shape.iter().zip(&n2.shape).map(|(x, y)| sym(x.fixed().unwrap_or(0), y.fixed().unwrap_or(0), name)).collect::<Result<_>>()?;
            outputs.push(OutputSpec { name: name.clone(), dtype: n1.dtype, shape });
        }
        Ok(Signature { inputs, outputs, weights: g1.weights })
    }

    /// A weight made at import (a dequantized initializer), importing the model once if no
    /// import has made it yet.
    pub fn derived(&self, name: &str) -> Result<Option<HostTensor>> {
        if let Some(t) = self.derived.lock().unwrap_or_else(|e| e.into_inner()).get(name) {
            return Ok(Some(t.clone()));
        }
        // Any import makes every derived weight (they do not depend on the bucket).
        self.graph_for(Bucket::new(1, 1))?;
        Ok(self.derived.lock().unwrap_or_else(|e| e.into_inner()).get(name).cloned())
    }

    /// The weight tensors of `graph`'s weight table (an import of this model): initializers
    /// read from the file, dequantized ones from the import.
    pub fn weights(&self, graph: &Graph) -> Result<Vec<HostTensor>> {
        let derived = self.derived.lock().unwrap_or_else(|e| e.into_inner());
        graph
            .weights
            .iter()
            .map(|w| {
                if let Some(t) = derived.get(&w.name) {
                    return Ok(t.clone());
                }
                let t = self.initializer(&w.name).ok_or_else(|| Error::MissingTensor { path: self.path.clone(), tensor: w.name.clone() })?;
                tensor::host_from_tensor(t, &self.dir).map_err(|m| Error::Model { path: self.path.clone(), message: format!("initializer `{}`: {m}", w.name) })
            })
            .collect()
    }

    /// The op types the model uses (with their count) and those kiln does not know.
    pub fn ops(&self) -> (Vec<(String, usize)>, Vec<String>) {
        let mut count: std::collections::BTreeMap<String, usize> = Default::default();
        for n in &self.graph_proto().node {
            let k = if n.domain().is_empty() || n.domain() == "ai.onnx" { n.op_type().to_string() } else { format!("{}::{}", n.domain(), n.op_type()) };
            *count.entry(k).or_default() += 1;
        }
        let known = |k: &str| match k.strip_prefix("com.microsoft::") {
            Some(c) => import::supported_contrib(c),
            None => import::supported(k),
        };
        let missing = count.keys().filter(|k| !known(k)).cloned().collect();
        (count.into_iter().collect(), missing)
    }
}

fn im_value(im: &mut Importer, name: &str) -> std::result::Result<kiln_runtime::ValueId, Fail> {
    im.output_value(name)
}
