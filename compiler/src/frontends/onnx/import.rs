//! One ONNX graph → one kiln graph with every dim concrete (a bucket, or the shapes of the
//! inputs at hand): literals fold at import ([`super::lit`]), everything else becomes kiln ops.

use std::collections::HashMap;

use kiln_runtime::graph::{BinaryOp, Dim, Graph, InputSpec, Op, ValueId, WeightSpec};
use kiln_runtime::{DType, HostTensor};

use super::attrs::Attrs;
use super::lit::fold;
use super::proto::NodeProto;
use super::tensor::{host_from_tensor, lit_from_tensor, Elem, Lit};
use super::OnnxModel;
use crate::ir::GraphExt as _;

mod activation;
mod attention;
mod channel_norm;
mod contrib;
mod channel_rows;
mod control;
mod conv;
mod elementwise;
mod empty;
mod gather;
mod grid;
mod layout;
mod linalg;
mod loss;
mod norm;
mod quant;
mod recurrent;
mod resize;
mod rotary;
mod scatter;
mod spectral;

/// Whether the importer knows `op` of domain `com.microsoft` (for `kiln onnx-ops`).
pub fn supported_contrib(op: &str) -> bool {
    contrib::CONTRIB.contains(&op) || quant::CONTRIB_OPS.contains(&op)
}

/// Every `com.microsoft` op the importer knows, sorted (the fuzzer's op list).
pub fn supported_contrib_ops() -> Vec<&'static str> {
    let mut ops: Vec<&'static str> = contrib::CONTRIB.iter().chain(quant::CONTRIB_OPS).copied().collect();
    ops.sort_unstable();
    ops
}

/// Why a node could not be imported.
#[derive(Debug)]
pub enum Fail {
    /// kiln cannot run it (the op, an attribute value, a dtype).
    Unsupported(String),
    /// The model is malformed.
    Invalid(String),
}

impl From<String> for Fail {
    fn from(s: String) -> Self {
        Fail::Invalid(s)
    }
}

type R<T> = Result<T, Fail>;

fn unsup<T>(m: impl Into<String>) -> R<T> {
    Err(Fail::Unsupported(m.into()))
}

/// One node while it is imported: what the op files (`elementwise`, `linalg`, `norm`, `layout`,
/// `gather`, `attention`, `rotary`) read. Like tract's ops that own their rules, each file holds
/// its ops' import, listed in its `OPS`; unlike tract, the rules are functions of the importer,
/// not trait objects: an op here is only a name in the ONNX file.
#[derive(Clone, Copy)]
struct NodeCx<'a> {
    op: &'a str,
    name: &'a str,
    n: &'a NodeProto,
    ins: &'a [Option<Val>],
    at: &'a Attrs<'a>,
    opset: i64,
}

impl NodeCx<'_> {
    /// Input `k` (an error where it is missing).
    fn inp(&self, k: usize) -> R<Val> {
        self.ins.get(k).cloned().flatten().ok_or_else(|| Fail::Invalid(format!("input {k} is missing")))
    }

    /// The name of input `k` (empty where there is none).
    fn iname(&self, k: usize) -> String {
        self.n.input.get(k).cloned().unwrap_or_default()
    }

    /// Input `k` as a literal; `what` computed at run time is unsupported.
    fn lit_of(&self, k: usize, what: &str) -> R<Lit> {
        match self.ins.get(k).cloned().flatten() {
            Some(Val::Lit(l)) => Ok(l),
            Some(Val::Node(_)) => unsup(format!("{what} computed at run time")),
            None => Err(Fail::Invalid(format!("{what} is missing"))),
        }
    }
}

/// A node's one output.
fn one(v: ValueId) -> R<Vec<ValueId>> {
    Ok(vec![v])
}

/// Whether the node's optional input `k` is given.
fn given(ins: &[Option<Val>], k: usize) -> bool {
    ins.get(k).is_some_and(|v| v.is_some())
}

/// The import function of a node whose op is in its file's `OPS`.
type ImportFn = for<'a, 'b, 'c, 'd> fn(&'a mut Importer<'b>, &'c NodeCx<'d>) -> R<Vec<ValueId>>;

/// Each op file's ops and its import function.
const FAMILIES: [(&[&str], ImportFn); 17] = [
    (elementwise::OPS, |im, cx| im.import_elementwise(cx)),
    (linalg::OPS, |im, cx| im.import_linalg(cx)),
    (norm::OPS, |im, cx| im.import_norm(cx)),
    (layout::OPS, |im, cx| im.import_layout(cx)),
    (gather::OPS, |im, cx| im.import_gather(cx)),
    (attention::OPS, |im, cx| im.import_attention(cx)),
    (rotary::OPS, |im, cx| im.import_rotary(cx)),
    (quant::OPS, |im, cx| im.import_quant(cx)),
    (activation::OPS, |im, cx| im.import_activation(cx)),
    (conv::OPS, |im, cx| im.import_conv(cx)),
    (channel_norm::OPS, |im, cx| im.import_channel_norm(cx)),
    (resize::OPS, |im, cx| im.import_resize(cx)),
    (recurrent::OPS, |im, cx| im.import_recurrent(cx)),
    (loss::OPS, |im, cx| im.import_loss(cx)),
    (scatter::OPS, |im, cx| im.import_scatter(cx)),
    (spectral::OPS, |im, cx| im.import_spectral(cx)),
    (grid::OPS, |im, cx| im.import_grid(cx)),
];

/// Ops that only fold at import, so they are not kiln ops: Shape and Size read a value's concrete
/// type; Constant, ConstantOfShape and Range build literals; If takes its known branch inline,
/// Scan and counted Loops unroll (`control.rs`); EyeLike reads only its input's type; the window functions build literals of
/// their known size. (Known inputs of any op fold in `lit.rs` first: Sin and Cos there with f64's
/// libm, for rotary and relative-position tables of the positions a bucket fixes.)
const FOLDED: &[&str] = &[
    "BlackmanWindow", "Constant", "ConstantOfShape", "EyeLike", "HammingWindow", "HannWindow", "If", "Loop", "Range", "Scan", "Shape", "Size",
];

/// Whether the importer knows `op` of the default domain (folded or as kiln ops), for
/// `kiln onnx-ops`.
pub fn supported(op: &str) -> bool {
    FOLDED.contains(&op) || FAMILIES.iter().any(|(ops, _)| ops.contains(&op))
}

/// Every op of the default domain the importer knows, sorted (the fuzzer's op list).
pub fn supported_ops() -> Vec<&'static str> {
    let mut ops: Vec<&'static str> = FAMILIES.iter().flat_map(|(ops, _)| ops.iter().copied()).chain(FOLDED.iter().copied()).collect();
    ops.sort_unstable();
    ops.dedup();
    ops
}

/// A value while importing: known (a literal) or computed by the graph.
#[derive(Debug, Clone)]
pub enum Val {
    Lit(Lit),
    Node(ValueId),
}

/// Float initializers larger than this become weights (the rest are constants).
const WEIGHT_MIN_NUMEL: usize = 64;

pub struct Importer<'m> {
    m: &'m OnnxModel,
    pub g: Graph,
    vals: HashMap<String, Val>,
    weights: HashMap<String, usize>,
    /// Weight data made at import (dequantized initializers), by weight-table name.
    pub derived: Vec<(String, HostTensor)>,
    /// The rows-of-channels form (`[N·ΠS, C]`) of `[N, C, S..]` values made from one
    /// (`channel_rows.rs`).
    rows: HashMap<ValueId, ValueId>,
    /// BatchNormalization outputs a convolution applied already (`bn_after_conv`).
    folded: std::collections::HashSet<String>,
    uniq: std::cell::Cell<usize>,
}

impl<'m> Importer<'m> {
    pub fn new(m: &'m OnnxModel) -> Self {
        Importer { m, g: Graph::default(), vals: HashMap::new(), weights: HashMap::new(), derived: Vec::new(), rows: HashMap::new(), folded: Default::default(), uniq: std::cell::Cell::new(0) }
    }

    fn fresh(&self, base: &str) -> String {
        self.uniq.set(self.uniq.get() + 1);
        format!("{base}#{}", self.uniq.get())
    }

    fn push(&mut self, name: &str, op: Op, inputs: Vec<ValueId>) -> R<ValueId> {
        self.g.push(name.to_string(), op, inputs).map_err(|e| Fail::Unsupported(e.to_string()))
    }

    /// An intermediate node, named after `base` with a fresh suffix.
    fn tmp(&mut self, base: &str, op: Op, inputs: Vec<ValueId>) -> R<ValueId> {
        let n = self.fresh(base);
        self.push(&n, op, inputs)
    }

    /// `v` in dtype `to`: itself, or a Cast of it.
    fn cast_to(&mut self, base: &str, v: ValueId, to: DType) -> R<ValueId> {
        if self.dtype(&Val::Node(v)) == to {
            return Ok(v);
        }
        self.tmp(base, Op::Cast { to }, vec![v])
    }

    fn push_shaped(&mut self, name: &str, op: Op, inputs: Vec<ValueId>, shape: &[usize]) -> R<ValueId> {
        let s = shape.iter().map(|&d| Dim::Fixed(d)).collect();
        self.g.push_shaped(name.to_string(), op, inputs, Some(s)).map_err(|e| Fail::Unsupported(e.to_string()))
    }

    pub fn shape(&self, v: &Val) -> Vec<usize> {
        match v {
            Val::Lit(l) => l.shape.clone(),
            Val::Node(id) => self.g.node(*id).shape.iter().map(|d| d.fixed().unwrap_or(0)).collect(),
        }
    }

    fn dtype(&self, v: &Val) -> DType {
        match v {
            Val::Lit(l) => l.elem.dtype(),
            Val::Node(id) => self.g.node(*id).dtype,
        }
    }

    /// A graph input of concrete `shape`.
    pub fn input(&mut self, name: &str, elem: Elem, shape: &[usize], role: kiln_runtime::InputRole) -> R<()> {
        let index = self.g.inputs.len();
        let dims: Vec<Dim> = shape.iter().map(|&d| Dim::Fixed(d)).collect();
        self.g.inputs.push(InputSpec { name: name.to_string(), dtype: elem.dtype(), shape: dims, role });
        let v = self.push(name, Op::Input { index }, vec![])?;
        self.vals.insert(name.to_string(), Val::Node(v));
        Ok(())
    }

    /// A graph input whose value is known (a shape tensor): a literal.
    pub fn known_input(&mut self, name: &str, elem: Elem, t: &HostTensor) {
        self.vals.insert(name.to_string(), Val::Lit(Lit::of(elem, t.shape.clone(), t.data.to_f64_vec())));
    }

    /// An initializer: a literal if small or integer, else a weight read at upload.
    pub fn initializer(&mut self, name: &str, t: &super::proto::TensorProto) -> R<()> {
        let elem = Elem::from_code(t.data_type.unwrap_or(0));
        let numel: usize = t.dims.iter().map(|&d| d.max(0) as usize).product();
        let big = numel > WEIGHT_MIN_NUMEL;
        if elem.is_some_and(|e| e.is_float()) && big && self.m.initializer(name).is_some() {
            // Read lazily: only if a node uses it (as a weight, or folds it). (An `If` branch's
            // initializers, which the model does not index, are read now.)
            let shape = t.dims.iter().map(|&d| d.max(0) as usize).collect();
            self.vals.insert(name.to_string(), Val::Lit(Lit { elem: elem.unwrap(), shape, data: super::tensor::LitData::F(vec![]), weight: true }));
            return Ok(());
        }
        // The caller names the initializer.
        let mut l = lit_from_tensor(t, &self.m.dir).map_err(Fail::Invalid)?;
        l.weight = big;
        self.vals.insert(name.to_string(), Val::Lit(l));
        Ok(())
    }

    /// The literal of `name`, reading a lazily kept float initializer now.
    fn lit(&self, name: &str, l: &Lit) -> R<Lit> {
        if is_lazy(l) {
            let t = self.m.initializer(name).ok_or_else(|| Fail::Invalid(format!("no initializer `{name}`")))?;
            let mut l = lit_from_tensor(t, &self.m.dir).map_err(|e| Fail::Invalid(format!("initializer `{name}`: {e}")))?;
            l.weight = true;
            return Ok(l);
        }
        Ok(l.clone())
    }

    /// `v` as a graph value: a literal becomes a constant, or a weight when it is (derived
    /// from) a large initializer.
    fn node(&mut self, name: &str, v: &Val) -> R<ValueId> {
        let l = match v {
            Val::Node(id) => return Ok(*id),
            Val::Lit(l) => l,
        };
        if l.shape.contains(&0) {
            return unsup(format!("`{name}` of shape {:?} is empty (kiln has no empty tensors; an op that folds takes it)", l.shape));
        }
        // A large integer (or f16/bool) literal — a window op's gather ids, a table built at import —
        // is a weight of its own dtype: as a constant (kiln's constants are f32) it would be cast
        // on every run, const_fold leaving results over MAX_FOLD_ELEMENTS alone (ResNet-18's
        // first convolution: 0.42 ms of 24.6 per run casting its im2col ids).
        if !l.weight && l.elem.dtype() != DType::F32 && l.shape.iter().product::<usize>() > crate::passes::const_fold::MAX_FOLD_ELEMENTS {
            let w = Lit { weight: true, ..l.clone() };
            return self.node(&self.fresh(name), &Val::Lit(w));
        }
        if l.weight {
            if let Some(&index) = self.weights.get(name) {
                return self.push(name, Op::Weight { index }, vec![]);
            }
            let data = if is_lazy(l) {
                let t = self.m.initializer(name).ok_or_else(|| Fail::Invalid(format!("no initializer `{name}`")))?;
                host_from_tensor(t, &self.m.dir).map_err(|e| Fail::Invalid(format!("initializer `{name}`: {e}")))?
            } else {
                l.to_host()
            };
            let keep = self.m.initializer(name).is_none() || !is_lazy(l);
            return self.weight_node(name, data, keep);
        }
        let vals: Vec<f32> = l.floats().iter().map(|&x| x as f32).collect();
        let c = self.fresh(name);
        let k = self.push_shaped(&c, Op::Constant { values: vals }, vec![], &l.shape)?;
        match l.elem.dtype() {
            DType::F32 => Ok(k),
            to => self.push(&format!("{c}.cast"), Op::Cast { to }, vec![k]),
        }
    }

    /// A weight-table entry `name` holding `data` (kept among the derived weights unless it is
    /// an initializer the weight source reads itself).
    fn weight_node(&mut self, name: &str, data: HostTensor, derived: bool) -> R<ValueId> {
        let index = self.g.weights.len();
        let int_bound = data.as_f32().and_then(crate::ir::ranges::int_bound);
        self.g.weights.push(WeightSpec { name: name.to_string(), dtype: data.dtype(), shape: data.shape.clone(), int_bound });
        self.weights.insert(name.to_string(), index);
        if derived {
            self.derived.push((name.to_string(), data));
        }
        self.push(name, Op::Weight { index }, vec![])
    }

    fn scalar(&mut self, name: &str, v: f32, dtype: DType) -> R<ValueId> {
        let c = self.fresh(name);
        let k = self.push_shaped(&c, Op::Constant { values: vec![v] }, vec![], &[])?;
        if dtype == DType::F32 {
            Ok(k)
        } else {
            self.push(&format!("{c}.cast"), Op::Cast { to: dtype }, vec![k])
        }
    }

    fn reshape(&mut self, name: &str, x: ValueId, to: &[usize]) -> R<ValueId> {
        if self.shape(&Val::Node(x)) == to {
            return Ok(x);
        }
        self.push_shaped(name, Op::Reshape, vec![x], to)
    }

    /// Imports one node. An attribute it read as a type the file does not declare is the error,
    /// whatever else happened (see `attrs`).
    pub fn node_proto(&mut self, n: &NodeProto) -> R<()> {
        let at = Attrs::of(n);
        let r = self.node_with(n, &at);
        match at.mismatch() {
            Some(m) => Err(Fail::Invalid(m)),
            None => r,
        }
    }

    fn node_with(&mut self, n: &NodeProto, at: &Attrs) -> R<()> {
        let op = n.op_type();
        let name = if n.name().is_empty() { n.output.first().cloned().unwrap_or_default() } else { n.name().to_string() };
        let mut ins: Vec<Option<Val>> = Vec::new();
        for i in &n.input {
            if i.is_empty() {
                ins.push(None);
                continue;
            }
            let v = self.vals.get(i).cloned().ok_or_else(|| Fail::Invalid(format!("input `{i}` is not defined before this node")))?;
            ins.push(Some(match v {
                Val::Lit(l) if is_lazy(&l) && folds_weights(op) => Val::Lit(self.lit(i, &l)?),
                v => v,
            }));
        }
        let opset = self.m.opset;
        if n.output.first().is_some_and(|o| self.folded.contains(o)) {
            // A BatchNormalization its convolution applied: its output is its input.
            let v = ins.first().cloned().flatten().ok_or_else(|| Fail::Invalid("no input".into()))?;
            self.vals.insert(n.output[0].clone(), v);
            return Ok(());
        }
        if matches!(n.domain(), "" | "ai.onnx") {
            match op {
                "If" => return self.inline_if(n, &ins, at),
                "Scan" => return self.unroll_scan(n, &ins, at, opset),
                "Loop" => return self.unroll_loop(n, &ins, at),
                _ => {}
            }
        }
        let contrib = match n.domain() {
            "" | "ai.onnx" => false,
            "com.microsoft" => true,
            d => return unsup(format!("op `{op}` of domain `{d}`")),
        };
        if contrib {
            let outs = self.contrib(op, &name, n, &ins, at)?;
            return self.bind(n, outs);
        }
        // All-literal inputs fold (a lazily kept weight only through dequantization).
        let all_lit = ins.iter().flatten().all(|v| matches!(v, Val::Lit(l) if !is_lazy(l)));
        let any_weight = ins.iter().flatten().any(|v| matches!(v, Val::Lit(l) if l.weight));
        if all_lit && (!any_weight || folds_weights(op)) {
            let lits: Vec<Option<&Lit>> = ins.iter().map(|v| v.as_ref().map(|v| match v {
                Val::Lit(l) => l,
                Val::Node(_) => unreachable!("all inputs are literals"),
            })).collect();
            if let Some(outs) = fold(op, &lits, at, opset, &self.m.dir).map_err(Fail::Invalid)? {
                for (o, l) in n.output.iter().zip(outs) {
                    self.vals.insert(o.clone(), Val::Lit(l));
                }
                return Ok(());
            }
        }
        // EyeLike: ones on the k-th diagonal of a matrix of its input's (concrete) shape.
        if op == "EyeLike" {
            let v = ins.first().cloned().flatten().ok_or_else(|| Fail::Invalid("no input".into()))?;
            let s = self.shape(&v);
            let &[rows, cols] = s.as_slice() else {
                return Err(Fail::Invalid(format!("EyeLike of shape {s:?} (a matrix)")));
            };
            let k = at.int("k", 0);
            let code = at.int("dtype", like_code(&v, self) as i64) as i32;
            let elem = Elem::from_code(code).ok_or_else(|| Fail::Unsupported(format!("EyeLike to type {}", Elem::name_of(code))))?;
            let vals = (0..rows * cols).map(|e| if (e % cols) as i64 - (e / cols) as i64 == k { 1.0 } else { 0.0 }).collect();
            self.vals.insert(n.output[0].clone(), Val::Lit(Lit::of(elem, s, vals)));
            return Ok(());
        }
        // Shape and Size come from the value's (concrete) type.
        if op == "Shape" || op == "Size" {
            let v = ins.first().cloned().flatten().ok_or_else(|| Fail::Invalid("no input".into()))?;
            let s = self.shape(&v);
            let lit = if op == "Size" {
                Lit::int(vec![], vec![s.iter().product::<usize>() as i64])
            } else {
                let r = s.len() as i64;
                let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
                let (a, b) = (clampi(at.int("start", 0)), clampi(at.int("end", r)));
                let dims: Vec<i64> = s[a..b.max(a)].iter().map(|&d| d as i64).collect();
                Lit::int(vec![dims.len()], dims)
            };
            self.vals.insert(n.output[0].clone(), Val::Lit(lit));
            return Ok(());
        }
        let cx = NodeCx { op, name: &name, n, ins: &ins, at, opset };
        if let Some(vals) = self.empty_outputs(&cx)? {
            for (o, v) in n.output.iter().zip(vals) {
                if !o.is_empty() {
                    self.vals.insert(o.clone(), v);
                }
            }
            return Ok(());
        }
        let outs = self.dynamic(op, &name, n, &ins, at)?;
        self.bind(n, outs)
    }

    /// Names `n`'s outputs by the values computed for them.
    fn bind(&mut self, n: &NodeProto, outs: Vec<ValueId>) -> R<()> {
        if outs.len() < n.output.iter().filter(|o| !o.is_empty()).count() {
            // Extra outputs kiln does not compute (Dropout's mask, ...) must be unused.
            for o in &n.output[outs.len()..] {
                if !o.is_empty() && self.m.is_used(o) {
                    return unsup(format!("output `{o}` (only the first {} are computed)", outs.len()));
                }
            }
        }
        for (o, v) in n.output.iter().zip(outs) {
            if !o.is_empty() {
                self.vals.insert(o.clone(), Val::Node(v));
            }
        }
        Ok(())
    }

    /// A comparison's 1/0 (in its operands' type) as ONNX's bool: kiln holds bools as i64.
    fn as_bool(&mut self, name: &str, r: ValueId) -> R<ValueId> {
        if self.dtype(&Val::Node(r)) == DType::I64 {
            return Ok(r);
        }
        self.push(name, Op::Cast { to: DType::I64 }, vec![r])
    }

    /// A norm's scale or bias as the `[last]` vector of dtype `dt` the norm op takes.
    fn norm_channel(&mut self, name: &str, v: ValueId, last: usize, dt: DType, what: &str) -> R<ValueId> {
        let mut v = v;
        let s = self.shape(&Val::Node(v));
        if s != [last] {
            if s.iter().product::<usize>() != last {
                return unsup(format!("{what} of shape {s:?}"));
            }
            v = self.reshape(&self.fresh(name), v, &[last])?;
        }
        self.cast_to(name, v, dt)
    }

    /// Indices counted from the end where negative (ONNX's rule for an axis of `n`):
    /// `where(i < 0, i + n, i)`, in the indices' own dtype.
    fn wrap_negative(&mut self, name: &str, ids: ValueId, n: usize) -> R<ValueId> {
        let dt = self.dtype(&Val::Node(ids));
        let z = self.scalar(&self.fresh(name), 0.0, dt)?;
        let n = self.scalar(&self.fresh(name), n as f32, dt)?;
        let neg = self.tmp(name, Op::Binary(BinaryOp::Lt), vec![ids, z])?;
        let neg = self.as_bool(&self.fresh(name), neg)?;
        let up = self.tmp(name, Op::Binary(BinaryOp::Add), vec![ids, n])?;
        self.tmp(name, Op::Where, vec![neg, up, ids])
    }

    /// A scalar constant of dtype `dt`.
    fn k(&mut self, name: &str, v: f32, dt: DType) -> R<ValueId> {
        self.scalar(&self.fresh(name), v, dt)
    }

    /// `a op b`, an intermediate node named after `name`.
    fn bin(&mut self, name: &str, op: BinaryOp, a: ValueId, b: ValueId) -> R<ValueId> {
        self.tmp(name, Op::Binary(op), vec![a, b])
    }

    /// `op a`, an intermediate node named after `name`.
    fn un(&mut self, name: &str, op: kiln_runtime::graph::UnaryOp, a: ValueId) -> R<ValueId> {
        self.tmp(name, Op::Unary(op), vec![a])
    }

    /// ONNX Gather along `ax` of `x` (shape `ds`) by integer ids (any shape): the axis moved to
    /// the front, the rest flattened into a `[ds[ax], rest]` table, one kiln Gather, then the
    /// ids' dims put back at `ax`. `wrap`: negative ids count from the end (ONNX), as
    /// `where(i < 0, i + n, i)`.
    fn gather_axis(&mut self, name: &str, x: ValueId, ds: &[usize], ax: usize, ids: ValueId, wrap: bool) -> R<ValueId> {
        let r = ds.len();
        let is = self.shape(&Val::Node(ids));
        let mut ids = ids;
        if wrap {
            ids = self.wrap_negative(name, ids, ds[ax])?;
        }
        let rest: Vec<usize> = ds[..ax].iter().chain(&ds[ax + 1..]).copied().collect();
        let mut t = x;
        if ax != 0 {
            let perm: Vec<usize> = std::iter::once(ax).chain((0..r).filter(|&d| d != ax)).collect();
            t = self.tmp(name, Op::Transpose { perm }, vec![t])?;
        }
        let cols: usize = rest.iter().product();
        let table = self.reshape(&self.fresh(name), t, &[ds[ax], cols])?;
        let g = self.tmp(name, Op::Gather, vec![table, ids])?;
        let gathered: Vec<usize> = is.iter().chain(&rest).copied().collect();
        if ax == 0 {
            return self.reshape(name, g, &gathered);
        }
        let g = self.reshape(&self.fresh(name), g, &gathered)?;
        // [ids.., pre.., post..] -> [pre.., ids.., post..]
        let q = is.len();
        let perm: Vec<usize> = (q..q + ax).chain(0..q).chain(q + ax..gathered.len()).collect();
        self.push(name, Op::Transpose { perm }, vec![g])
    }

    /// The graph value of ONNX value `name` (a graph output).
    pub fn output_value(&mut self, name: &str) -> R<ValueId> {
        let v = self.vals.get(name).cloned().ok_or_else(|| Fail::Invalid(format!("`{name}` is never computed")))?;
        if self.shape(&v).contains(&0) {
            return unsup(format!("output `{name}` is empty (kiln has no empty tensors)"));
        }
        self.node(name, &v)
    }

    /// A node with at least one graph-computed input, as kiln ops: handed to the file that
    /// imports its op. Returns its outputs.
    fn dynamic(&mut self, op: &str, name: &str, n: &NodeProto, ins: &[Option<Val>], at: &Attrs) -> R<Vec<ValueId>> {
        let cx = NodeCx { op, name, n, ins, at, opset: self.m.opset };
        if let Some(outs) = self.on_channel_rows(&cx, Self::by_family)? {
            return Ok(outs);
        }
        self.by_family(&cx)
    }

    /// `cx` imported by its op family.
    fn by_family(&mut self, cx: &NodeCx) -> R<Vec<ValueId>> {
        let op = cx.op;
        for (ops, import) in FAMILIES {
            if ops.contains(&op) {
                return import(self, cx);
            }
        }
        match op {
            _ if FOLDED.contains(&op) => unsup(format!("{op} of a run-time value")),
            _ => unsup(format!("op `{op}` is not supported")),
        }
    }
}

/// The ONNX type code of `v`'s type (CastLike's target).
fn like_code(v: &Val, im: &Importer) -> i32 {
    match v {
        Val::Lit(l) => l.elem.code(),
        Val::Node(id) => match im.g.node(*id).dtype {
            DType::F32 => 1,
            DType::F16 => 10,
            DType::BF16 => 16,
            DType::I32 => 6,
            DType::I64 => 7,
        },
    }
}

/// A large float initializer not read yet (its shape is known, its data is read when a node
/// needs it).
fn is_lazy(l: &Lit) -> bool {
    l.weight && matches!(&l.data, super::tensor::LitData::F(v) if v.is_empty()) && l.numel() > 0
}

/// Ops that fold a large initializer at import (dequantization patterns) rather than reading it
/// as a weight.
fn folds_weights(op: &str) -> bool {
    matches!(op, "DequantizeLinear" | "QuantizeLinear" | "Cast" | "Mul" | "Sub" | "Identity" | "Shape" | "Size" | "MatMulInteger")
}
