//! One ONNX graph → one kiln graph with every dim concrete (a bucket, or the shapes of the
//! inputs at hand): literals fold at import ([`super::lit`]), everything else becomes kiln ops.

use std::collections::HashMap;

use kiln_runtime::graph::{BinaryOp, Dim, Graph, InputSpec, Op, ReduceOp, UnaryOp, ValueId, WeightSpec};
use kiln_runtime::{DType, HostTensor};

use super::attrs::Attrs;
use super::lit::fold;
use super::proto::NodeProto;
use super::shape;
use super::tensor::{host_from_tensor, lit_from_tensor, Elem, Lit};
use super::OnnxModel;
use crate::ir::GraphExt as _;

mod contrib;
pub use contrib::CONTRIB;

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
    uniq: std::cell::Cell<usize>,
}

impl<'m> Importer<'m> {
    pub fn new(m: &'m OnnxModel) -> Self {
        Importer { m, g: Graph::default(), vals: HashMap::new(), weights: HashMap::new(), derived: Vec::new(), uniq: std::cell::Cell::new(0) }
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
        if elem.is_some_and(|e| e.is_float()) && big {
            // Read lazily: only if a node uses it (as a weight, or folds it).
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
            let index = self.g.weights.len();
            self.g.weights.push(WeightSpec { name: name.to_string(), dtype: data.dtype(), shape: data.shape.clone() });
            self.weights.insert(name.to_string(), index);
            if self.m.initializer(name).is_none() || !is_lazy(l) {
                self.derived.push((name.to_string(), data));
            }
            return self.push(name, Op::Weight { index }, vec![]);
        }
        let vals: Vec<f32> = l.floats().iter().map(|&x| x as f32).collect();
        let c = self.fresh(name);
        let k = self.push_shaped(&c, Op::Constant { values: vals }, vec![], &l.shape)?;
        match l.elem.dtype() {
            DType::F32 => Ok(k),
            to => self.push(&format!("{c}.cast"), Op::Cast { to }, vec![k]),
        }
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

    /// Imports one node.
    pub fn node_proto(&mut self, n: &NodeProto) -> R<()> {
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
        let at = Attrs::of(n);
        let opset = self.m.opset;
        let contrib = match n.domain() {
            "" | "ai.onnx" => false,
            "com.microsoft" => true,
            d => return unsup(format!("op `{op}` of domain `{d}`")),
        };
        if contrib {
            let outs = self.contrib(op, &name, n, &ins, &at)?;
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
            if let Some(outs) = fold(op, &lits, &at, opset, &self.m.dir).map_err(Fail::Invalid)? {
                for (o, l) in n.output.iter().zip(outs) {
                    self.vals.insert(o.clone(), Val::Lit(l));
                }
                return Ok(());
            }
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
        let outs = self.dynamic(op, &name, n, &ins, &at)?;
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

    /// `v` rounded half up to an integer in [0, 255] (a uint8 held in f32).
    fn round_u8(&mut self, name: &str, v: ValueId) -> R<ValueId> {
        let lo = self.scalar(&self.fresh(name), 0.0, DType::F32)?;
        let hi = self.scalar(&self.fresh(name), 255.0, DType::F32)?;
        let half = self.scalar(&self.fresh(name), 0.5, DType::F32)?;
        let c = self.tmp(name, Op::Binary(BinaryOp::Min), vec![v, hi])?;
        let c = self.tmp(name, Op::Binary(BinaryOp::Max), vec![c, lo])?;
        let h = self.tmp(name, Op::Binary(BinaryOp::Add), vec![c, half])?;
        let i = self.tmp(name, Op::Cast { to: DType::I64 }, vec![h])?;
        self.tmp(name, Op::Cast { to: DType::F32 }, vec![i])
    }

    /// A norm over axes `ax..` of `x` (shape `s`) as a norm over the last axis: x as
    /// `[Π s[..ax], Π s[ax..]]` when ax is not already the last axis. (x, row length, reshaped).
    fn norm_rows(&mut self, name: &str, x: ValueId, s: &[usize], ax: usize) -> R<(ValueId, usize, bool)> {
        let last: usize = s[ax..].iter().product();
        if ax + 1 == s.len() {
            return Ok((x, last, false));
        }
        Ok((self.reshape(&self.fresh(name), x, &[s[..ax].iter().product(), last])?, last, true))
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

    /// `x^y` for an exponent known only at run time, in f32: `exp(y·log|x|)`, negated where
    /// x < 0 and y is an odd integer, NaN where x < 0 and y is not an integer, 1 where y = 0
    /// (as C's `pow`). Integer and fractional parts come from casts to i64 (truncation).
    fn pow_general(&mut self, name: &str, x: ValueId, y: ValueId) -> R<ValueId> {
        let dx = self.dtype(&Val::Node(x));
        let (xf, yf) = (self.cast_to(name, x, DType::F32)?, self.cast_to(name, y, DType::F32)?);
        let bin = |s: &mut Self, op: BinaryOp, a: ValueId, b: ValueId| s.tmp(name, Op::Binary(op), vec![a, b]);
        let un = |s: &mut Self, op: UnaryOp, a: ValueId| s.tmp(name, Op::Unary(op), vec![a]);
        let cast = |s: &mut Self, to: DType, a: ValueId| s.tmp(name, Op::Cast { to }, vec![a]);
        let a = un(self, UnaryOp::Abs, xf)?;
        let l = un(self, UnaryOp::Log, a)?;
        let pl = bin(self, BinaryOp::Mul, yf, l)?;
        let r = un(self, UnaryOp::Exp, pl)?;
        let zero = self.scalar(&self.fresh(name), 0.0, DType::F32)?;
        let two = self.scalar(&self.fresh(name), 2.0, DType::F32)?;
        let yi = cast(self, DType::I64, yf)?;
        let yt = cast(self, DType::F32, yi)?;
        let frac = bin(self, BinaryOp::Ne, yt, yf)?;
        let h = bin(self, BinaryOp::Div, yt, two)?;
        let hi = cast(self, DType::I64, h)?;
        let hf = cast(self, DType::F32, hi)?;
        let h2 = bin(self, BinaryOp::Mul, hf, two)?;
        let rem = bin(self, BinaryOp::Sub, yt, h2)?;
        let odd = bin(self, BinaryOp::Ne, rem, zero)?;
        let neg = bin(self, BinaryOp::Lt, xf, zero)?;
        let neg_odd = bin(self, BinaryOp::Mul, neg, odd)?;
        let neg_odd = self.as_bool(&self.fresh(name), neg_odd)?;
        let nr = un(self, UnaryOp::Neg, r)?;
        let r = self.tmp(name, Op::Where, vec![neg_odd, nr, r])?;
        let neg_frac = bin(self, BinaryOp::Mul, neg, frac)?;
        let neg_frac = self.as_bool(&self.fresh(name), neg_frac)?;
        let nan = self.scalar(&self.fresh(name), f32::NAN, DType::F32)?;
        let r = self.tmp(name, Op::Where, vec![neg_frac, nan, r])?;
        let y0 = bin(self, BinaryOp::Eq, yf, zero)?;
        let y0 = self.as_bool(&self.fresh(name), y0)?;
        let one = self.scalar(&self.fresh(name), 1.0, DType::F32)?;
        if dx == DType::F32 {
            return self.push(name, Op::Where, vec![y0, one, r]);
        }
        let r = self.tmp(name, Op::Where, vec![y0, one, r])?;
        self.push(name, Op::Cast { to: dx }, vec![r])
    }

    /// GatherND (batch_dims 0) by run-time indices `[.., k]`: the flat row index
    /// `Σ_d wrap(i_d)·stride_d` over data's first k dims, computed in f32 (exact below 2^24
    /// rows), then one kiln Gather of the data seen as `[rows, rest]`.
    fn gather_nd(&mut self, name: &str, data: ValueId, ds: &[usize], idx: ValueId) -> R<ValueId> {
        let is = self.shape(&Val::Node(idx));
        let k = *is.last().ok_or_else(|| Fail::Invalid("GatherND indices of rank 0".into()))?;
        if k == 0 || k > ds.len() {
            return unsup(format!("GatherND indices of depth {k} into rank {}", ds.len()));
        }
        let st = shape::strides(&ds[..k]);
        let f = self.tmp(name, Op::Cast { to: DType::F32 }, vec![idx])?;
        let dims = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![k], ds[..k].iter().map(|&d| d as f64).collect())))?;
        let strides = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![k], st.iter().map(|&d| d as f64).collect())))?;
        let zero = self.scalar(&self.fresh(name), 0.0, DType::F32)?;
        let neg = self.tmp(name, Op::Binary(BinaryOp::Lt), vec![f, zero])?;
        let neg = self.as_bool(&self.fresh(name), neg)?;
        let up = self.tmp(name, Op::Binary(BinaryOp::Add), vec![f, dims])?;
        let w = self.tmp(name, Op::Where, vec![neg, up, f])?;
        let p = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![w, strides])?;
        let rows = self.tmp(name, Op::Reduce { op: ReduceOp::Sum, axes: vec![is.len() - 1], keep_dims: false }, vec![p])?;
        let rows = self.tmp(name, Op::Cast { to: DType::I64 }, vec![rows])?;
        let rest: Vec<usize> = ds[k..].to_vec();
        let table = self.reshape(&self.fresh(name), data, &[ds[..k].iter().product(), rest.iter().product()])?;
        let g = self.tmp(name, Op::Gather, vec![table, rows])?;
        let out: Vec<usize> = is[..is.len() - 1].iter().chain(&rest).copied().collect();
        self.reshape(name, g, &out)
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
            let dt = self.dtype(&Val::Node(ids));
            let z = self.scalar(&self.fresh(name), 0.0, dt)?;
            let n = self.scalar(&self.fresh(name), ds[ax] as f32, dt)?;
            let neg = self.tmp(name, Op::Binary(BinaryOp::Lt), vec![ids, z])?;
            let neg = self.as_bool(&self.fresh(name), neg)?;
            let up = self.tmp(name, Op::Binary(BinaryOp::Add), vec![ids, n])?;
            ids = self.tmp(name, Op::Where, vec![neg, up, ids])?;
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

    /// Rows of `data` (shape `ds`) picked by known flat row indices over its first `k` dims:
    /// the data seen as a `[rows, row_len]` table and one kiln `Gather` with constant ids, shaped
    /// `lead`, then reshaped to `out`.
    #[allow(clippy::too_many_arguments)]
    fn gather_rows(&mut self, name: &str, data: ValueId, ds: &[usize], k: usize, rows: Vec<i64>, lead: &[usize], out: &[usize]) -> R<ValueId> {
        let nrows: usize = ds[..k].iter().product();
        let row_len: usize = ds[k..].iter().product();
        if nrows >= 1 << 24 {
            return unsup(format!("a gather from {nrows} rows"));
        }
        let table = self.reshape(&self.fresh(name), data, &[nrows, row_len])?;
        let lead = if lead.is_empty() { vec![1] } else { lead.to_vec() };
        let ids = self.node(&self.fresh(name), &Val::Lit(Lit::int(lead.clone(), rows)))?;
        let g = self.tmp(name, Op::Gather, vec![table, ids])?;
        self.reshape(name, g, out)
    }

    /// The graph value of ONNX value `name` (a graph output).
    pub fn output_value(&mut self, name: &str) -> R<ValueId> {
        let v = self.vals.get(name).cloned().ok_or_else(|| Fail::Invalid(format!("`{name}` is never computed")))?;
        if self.shape(&v).contains(&0) {
            return unsup(format!("output `{name}` is empty (kiln has no empty tensors)"));
        }
        self.node(name, &v)
    }

    #[allow(dead_code)]
    fn binary(&mut self, name: &str, op: BinaryOp, a: &Val, b: &Val, an: &str, bn: &str) -> R<ValueId> {
        let (x, y) = (self.node(an, a)?, self.node(bn, b)?);
        self.push(name, Op::Binary(op), vec![x, y])
    }

    /// A node with at least one graph-computed input, as kiln ops. Returns its outputs.
    fn dynamic(&mut self, op: &str, name: &str, n: &NodeProto, ins: &[Option<Val>], at: &Attrs) -> R<Vec<ValueId>> {
        let inp = |k: usize| ins.get(k).cloned().flatten().ok_or_else(|| Fail::Invalid(format!("input {k} is missing")));
        let iname = |k: usize| n.input.get(k).cloned().unwrap_or_default();
        let lit_of = |k: usize, what: &str| -> R<Lit> {
            match ins.get(k).cloned().flatten() {
                Some(Val::Lit(l)) => Ok(l),
                Some(Val::Node(_)) => unsup(format!("{what} computed at run time")),
                None => Err(Fail::Invalid(format!("{what} is missing"))),
            }
        };
        let opset = self.m.opset;
        let one = |v: ValueId| Ok(vec![v]);
        match op {
            "Identity" | "Dropout" => {
                if op == "Dropout" && ins.get(2).cloned().flatten().is_some() {
                    let training = lit_of(2, "Dropout's training_mode")?;
                    if training.ints().first().is_some_and(|&t| t != 0) {
                        return unsup("Dropout in training mode (kiln runs inference)");
                    }
                }
                let x = self.node(&iname(0), &inp(0)?)?;
                if op == "Dropout" && n.output.get(1).is_some_and(|o| !o.is_empty() && self.m.is_used(o)) {
                    // The mask of inference-mode dropout: every element kept.
                    let s = self.shape(&Val::Node(x));
                    let ones = Val::Lit(Lit::of(Elem::Bool, s.clone(), vec![1.0; s.iter().product()]));
                    let mask = self.node(&n.output[1], &ones)?;
                    return Ok(vec![x, mask]);
                }
                one(x)
            }
            "Add" | "Sub" | "Mul" | "Div" | "Max" | "Min" | "Sum" => {
                let b = match op {
                    "Add" | "Sum" => BinaryOp::Add,
                    "Sub" => BinaryOp::Sub,
                    "Mul" => BinaryOp::Mul,
                    "Div" => BinaryOp::Div,
                    "Max" => BinaryOp::Max,
                    _ => BinaryOp::Min,
                };
                let vals: Vec<(Val, String)> = ins.iter().enumerate().filter_map(|(k, v)| v.clone().map(|v| (v, iname(k)))).collect();
                if vals.is_empty() {
                    return Err(Fail::Invalid("no inputs".into()));
                }
                let mut acc = self.node(&vals[0].1, &vals[0].0)?;
                for (k, (v, vn)) in vals.iter().enumerate().skip(1) {
                    let y = self.node(vn, v)?;
                    let nm = if k + 1 == vals.len() { name.to_string() } else { self.fresh(name) };
                    acc = self.push(&nm, Op::Binary(b), vec![acc, y])?;
                }
                one(acc)
            }
            "Pow" => {
                let x = self.node(&iname(0), &inp(0)?)?;
                let e = match ins.get(1).cloned().flatten() {
                    Some(Val::Lit(l)) if l.numel() == 1 => l,
                    Some(v) => {
                        let y = self.node(&iname(1), &v)?;
                        return one(self.pow_general(name, x, y)?);
                    }
                    None => return Err(Fail::Invalid("a Pow exponent is missing".into())),
                };
                let p = e.floats()[0];
                let dt = self.dtype(&Val::Node(x));
                match p {
                    1.0 => one(x),
                    2.0 => one(self.push(name, Op::Binary(BinaryOp::Mul), vec![x, x])?),
                    3.0 => {
                        let t = self.fresh(name);
                        let sq = self.push(&t, Op::Binary(BinaryOp::Mul), vec![x, x])?;
                        one(self.push(name, Op::Binary(BinaryOp::Mul), vec![sq, x])?)
                    }
                    0.5 => one(self.push(name, Op::Unary(UnaryOp::Sqrt), vec![x])?),
                    -0.5 => one(self.push(name, Op::Unary(UnaryOp::Rsqrt), vec![x])?),
                    -1.0 => one(self.push(name, Op::Unary(UnaryOp::Recip), vec![x])?),
                    0.0 => {
                        // x^0 = 1, NaN included.
                        let shape = self.shape(&Val::Node(x));
                        let n1 = shape.iter().product();
                        let ones = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, shape, vec![1.0; n1])))?;
                        one(if dt == DType::F32 { ones } else { self.push(name, Op::Cast { to: dt }, vec![ones])? })
                    }
                    _ if !dt.is_float() => unsup(format!("Pow of integers with exponent {p}")),
                    // exp(p·log|x|), negated where x < 0 and p is an odd integer; a fractional
                    // power of x < 0 is NaN (log of a negative number).
                    _ => {
                        let int = p.fract() == 0.0;
                        let base = if int { self.tmp(name, Op::Unary(UnaryOp::Abs), vec![x])? } else { x };
                        let l = self.tmp(name, Op::Unary(UnaryOp::Log), vec![base])?;
                        let c = self.scalar(&self.fresh(name), p as f32, dt)?;
                        let pl = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![l, c])?;
                        let odd = int && (p % 2.0).abs() == 1.0;
                        if !odd {
                            return one(self.push(name, Op::Unary(UnaryOp::Exp), vec![pl])?);
                        }
                        let y = self.tmp(name, Op::Unary(UnaryOp::Exp), vec![pl])?;
                        let ny = self.tmp(name, Op::Unary(UnaryOp::Neg), vec![y])?;
                        let z = self.scalar(&self.fresh(name), 0.0, dt)?;
                        let neg = self.tmp(name, Op::Binary(BinaryOp::Lt), vec![x, z])?;
                        let neg = self.as_bool(&self.fresh(name), neg)?;
                        one(self.push(name, Op::Where, vec![neg, ny, y])?)
                    }
                }
            }
            "Sqrt" | "Reciprocal" | "Neg" | "Abs" | "Exp" | "Erf" | "Tanh" | "Sigmoid" | "Relu" | "Gelu" | "Log" | "Softplus" => {
                let u = match op {
                    "Log" => UnaryOp::Log,
                    "Softplus" => UnaryOp::Softplus,
                    "Sqrt" => UnaryOp::Sqrt,
                    "Reciprocal" => UnaryOp::Recip,
                    "Neg" => UnaryOp::Neg,
                    "Abs" => UnaryOp::Abs,
                    "Exp" => UnaryOp::Exp,
                    "Erf" => UnaryOp::Erf,
                    "Tanh" => UnaryOp::Tanh,
                    "Sigmoid" => UnaryOp::Sigmoid,
                    "Relu" => UnaryOp::Relu,
                    _ => match at.string("approximate").as_deref() {
                        None | Some("none") => UnaryOp::Gelu,
                        Some("tanh") => UnaryOp::GeluTanh,
                        Some(a) => return unsup(format!("Gelu approximate=`{a}`")),
                    },
                };
                let x = self.node(&iname(0), &inp(0)?)?;
                if !self.dtype(&Val::Node(x)).is_float() {
                    return match u {
                        UnaryOp::Neg => {
                            let z = self.scalar(name, 0.0, self.dtype(&Val::Node(x)))?;
                            one(self.push(name, Op::Binary(BinaryOp::Sub), vec![z, x])?)
                        }
                        _ => unsup(format!("{op} of integers")),
                    };
                }
                one(self.push(name, Op::Unary(u), vec![x])?)
            }
            "Clip" => {
                let mut x = self.node(&iname(0), &inp(0)?)?;
                let dt = self.dtype(&Val::Node(x));
                let (lo, hi) = if opset >= 11 {
                    (ins.get(1).cloned().flatten(), ins.get(2).cloned().flatten())
                } else {
                    let lo = at.has("min").then(|| Val::Lit(Lit::of(Elem::F32, vec![], vec![at.float("min", 0.0) as f64])));
                    let hi = at.has("max").then(|| Val::Lit(Lit::of(Elem::F32, vec![], vec![at.float("max", 0.0) as f64])));
                    (lo, hi)
                };
                for (b, v) in [(BinaryOp::Max, lo), (BinaryOp::Min, hi)] {
                    if let Some(v) = v {
                        let c = self.node(&self.fresh(name), &v)?;
                        let c = self.cast_to(name, c, dt)?;
                        x = self.tmp(name, Op::Binary(b), vec![x, c])?;
                    }
                }
                one(x)
            }
            "MatMul" => {
                let (a, b) = (self.node(&iname(0), &inp(0)?)?, self.node(&iname(1), &inp(1)?)?);
                let (sa, sb) = (self.shape(&Val::Node(a)), self.shape(&Val::Node(b)));
                let a2 = if sa.len() == 1 { self.reshape(&self.fresh(name), a, &[1, sa[0]])? } else { a };
                let b2 = if sb.len() == 1 { self.reshape(&self.fresh(name), b, &[sb[0], 1])? } else { b };
                let mut y = self.push(name, Op::MatMul { transpose_a: false, transpose_b: false }, vec![a2, b2])?;
                if sa.len() == 1 || sb.len() == 1 {
                    let mut s = self.shape(&Val::Node(y));
                    if sb.len() == 1 {
                        s.pop();
                    }
                    if sa.len() == 1 {
                        s.remove(s.len() - 1 - usize::from(sb.len() != 1));
                    }
                    y = self.reshape(&self.fresh(name), y, &s)?;
                }
                one(y)
            }
            "Gemm" => {
                let (a, b) = (self.node(&iname(0), &inp(0)?)?, self.node(&iname(1), &inp(1)?)?);
                let (ta, tb) = (at.int("transA", 0) != 0, at.int("transB", 0) != 0);
                let (alpha, beta) = (at.float("alpha", 1.0), at.float("beta", 1.0));
                let mm = if alpha == 1.0 && ins.get(2).cloned().flatten().is_none() { name.to_string() } else { self.fresh(name) };
                let mut y = self.push(&mm, Op::MatMul { transpose_a: ta, transpose_b: tb }, vec![a, b])?;
                if alpha != 1.0 {
                    let k = self.scalar(name, alpha, self.dtype(&Val::Node(y)))?;
                    y = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![y, k])?;
                }
                if let Some(c) = ins.get(2).cloned().flatten() {
                    let mut c = self.node(&iname(2), &c)?;
                    if beta != 1.0 {
                        let k = self.scalar(name, beta, self.dtype(&Val::Node(c)))?;
                        c = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![c, k])?;
                    }
                    y = self.push(name, Op::Binary(BinaryOp::Add), vec![y, c])?;
                }
                one(y)
            }
            "Softmax" => {
                let x = self.node(&iname(0), &inp(0)?)?;
                let s = self.shape(&Val::Node(x));
                let r = s.len();
                let ax = shape::axis(at.int("axis", if opset >= 13 { -1 } else { 1 }), r)?;
                if opset >= 13 || ax == r - 1 {
                    return one(self.push(name, Op::Softmax { axis: ax }, vec![x])?);
                }
                // Before opset 13: softmax of the input flattened to [prod(..axis), prod(axis..)].
                let flat = [s[..ax].iter().product(), s[ax..].iter().product()];
                let f = self.reshape(&self.fresh(name), x, &flat)?;
                let y = self.tmp(name, Op::Softmax { axis: 1 }, vec![f])?;
                one(self.reshape(name, y, &s)?)
            }
            // A running sum along the axis as a product with a 0/1 triangular matrix (one GEMM;
            // kiln has no scan op): y[.., j] = Σ_i x[.., i]·T[i, j]. Integers go through f32,
            // exact while partial sums stay below 2^24 (position ids from a mask, as RoBERTa's
            // export computes them). A literal input folds instead (lit.rs).
            "CumSum" => {
                let x0 = self.node(&iname(0), &inp(0)?)?;
                let s0 = self.shape(&Val::Node(x0));
                let ax0 = shape::axis(lit_of(1, "CumSum axis")?.ints().first().copied().ok_or(Fail::Invalid("CumSum without an axis".into()))?, s0.len())?;
                // A vector scans as one row.
                let final_name = name.to_string();
                let (x, ax, out_name) = if s0.len() == 1 {
                    (self.reshape(&self.fresh(name), x0, &[1, s0[0]])?, 1, self.fresh(name))
                } else {
                    (x0, ax0, name.to_string())
                };
                let name = out_name.as_str();
                let s = self.shape(&Val::Node(x));
                let r = s.len();
                let (exclusive, reverse) = (at.int("exclusive", 0) != 0, at.int("reverse", 0) != 0);
                let n = s[ax];
                let dt = self.dtype(&Val::Node(x));
                let mut t = vec![0.0; n * n];
                for i in 0..n {
                    for j in 0..n {
                        let before = if reverse { i > j } else { i < j };
                        t[i * n + j] = if before || (i == j && !exclusive) { 1.0 } else { 0.0 };
                    }
                }
                let tri = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![n, n], t)))?;
                let mut perm: Vec<usize> = (0..r).collect();
                perm.swap(ax, r - 1);
                let mut v = x;
                if ax != r - 1 {
                    v = self.tmp(name, Op::Transpose { perm: perm.clone() }, vec![v])?;
                }
                v = self.cast_to(name, v, DType::F32)?;
                let last = ax == r - 1 && dt == DType::F32;
                let mm = if last { name.to_string() } else { self.fresh(name) };
                let mut y = self.push(&mm, Op::MatMul { transpose_a: false, transpose_b: false }, vec![v, tri])?;
                if dt != DType::F32 {
                    let nm = if ax == r - 1 { name.to_string() } else { self.fresh(name) };
                    y = self.push(&nm, Op::Cast { to: dt }, vec![y])?;
                }
                if ax != r - 1 {
                    y = self.push(name, Op::Transpose { perm }, vec![y])?;
                }
                if s0.len() == 1 {
                    y = self.reshape(&final_name, y, &s0)?;
                }
                one(y)
            }
            // x - max - log Σ exp(x - max), over the axis (before opset 13: over the input
            // flattened to 2-D at the axis, as Softmax).
            "LogSoftmax" => {
                let x = self.node(&iname(0), &inp(0)?)?;
                let s = self.shape(&Val::Node(x));
                let r = s.len();
                if !self.dtype(&Val::Node(x)).is_float() {
                    return unsup("LogSoftmax of integers");
                }
                let ax = shape::axis(at.int("axis", if opset >= 13 { -1 } else { 1 }), r)?;
                let (src, axes) = if opset >= 13 || ax == r - 1 {
                    (x, vec![ax])
                } else {
                    let flat = [s[..ax].iter().product(), s[ax..].iter().product()];
                    (self.reshape(&self.fresh(name), x, &flat)?, vec![1])
                };
                let keep = |op| Op::Reduce { op, axes: axes.clone(), keep_dims: true };
                let m = self.tmp(name, keep(ReduceOp::Max), vec![src])?;
                let d = self.tmp(name, Op::Binary(BinaryOp::Sub), vec![src, m])?;
                let e = self.tmp(name, Op::Unary(UnaryOp::Exp), vec![d])?;
                let sum = self.tmp(name, keep(ReduceOp::Sum), vec![e])?;
                let l = self.tmp(name, Op::Unary(UnaryOp::Log), vec![sum])?;
                if src == x {
                    return one(self.push(name, Op::Binary(BinaryOp::Sub), vec![d, l])?);
                }
                let y = self.tmp(name, Op::Binary(BinaryOp::Sub), vec![d, l])?;
                one(self.reshape(name, y, &s)?)
            }
            // Dynamic (per-batch) uint8 quantization, as onnxruntime's quantize_dynamic writes it:
            // the quantized values are kept as integers held in f32 (kiln has no 8-bit type), and
            // MatMulInteger below consumes them. Rounding is half up (`trunc(v + 0.5)` after
            // clamping to [0, 255]), where ONNX says half to even: they differ only on exact ties.
            "DynamicQuantizeLinear" => {
                let x = self.node(&iname(0), &inp(0)?)?;
                if self.dtype(&Val::Node(x)) != DType::F32 {
                    return unsup("DynamicQuantizeLinear of a non-f32 input");
                }
                let all: Vec<usize> = (0..self.shape(&Val::Node(x)).len()).collect();
                let bin = |s: &mut Self, op: BinaryOp, a: ValueId, b: ValueId| s.tmp(name, Op::Binary(op), vec![a, b]);
                let zero = self.scalar(&self.fresh(name), 0.0, DType::F32)?;
                let hi = self.tmp(name, Op::Reduce { op: ReduceOp::Max, axes: all.clone(), keep_dims: false }, vec![x])?;
                let nx = self.tmp(name, Op::Unary(UnaryOp::Neg), vec![x])?;
                let nlo = self.tmp(name, Op::Reduce { op: ReduceOp::Max, axes: all, keep_dims: false }, vec![nx])?;
                let hi = bin(self, BinaryOp::Max, hi, zero)?;
                let nlo = bin(self, BinaryOp::Max, nlo, zero)?; // -min(min x, 0)
                let range = bin(self, BinaryOp::Add, hi, nlo)?;
                let q = self.scalar(&self.fresh(name), 255.0, DType::F32)?;
                let scale = self.push(n.output.get(1).map(String::as_str).filter(|o| !o.is_empty()).unwrap_or(&self.fresh(name)), Op::Binary(BinaryOp::Div), vec![range, q])?;
                let zf = bin(self, BinaryOp::Div, nlo, scale)?;
                let zp = self.round_u8(name, zf)?;
                let v = bin(self, BinaryOp::Div, x, scale)?;
                let v = bin(self, BinaryOp::Add, v, zp)?;
                let y = self.round_u8(name, v)?;
                Ok(vec![y, scale, zp])
            }
            // Σ (a - a_zero)(b - b_zero) with the integers held in f32 (one GEMM); a known b
            // (the weights) becomes an f32 weight at import.
            "MatMulInteger" => {
                let a = self.node(&iname(0), &inp(0)?)?;
                let mut af = self.cast_to(name, a, DType::F32)?;
                if let Some(z) = ins.get(2).cloned().flatten() {
                    let z = self.node(&iname(2), &z)?;
                    let z = self.cast_to(name, z, DType::F32)?;
                    af = self.tmp(name, Op::Binary(BinaryOp::Sub), vec![af, z])?;
                }
                let bf = match (inp(1)?, ins.get(3).cloned().flatten()) {
                    (Val::Lit(b), zero) => {
                        let zl = match zero {
                            Some(Val::Lit(z)) => Some(z),
                            Some(Val::Node(_)) => return unsup("a MatMulInteger zero point computed at run time for known weights"),
                            None => None,
                        };
                        let mut w = Lit::of(Elem::F32, b.shape.clone(), b.floats());
                        if let Some(z) = zl {
                            let zv = z.floats();
                            let n_out = *b.shape.last().unwrap_or(&1);
                            if zv.len() != 1 && zv.len() != n_out {
                                return unsup(format!("MatMulInteger weight zero point of {} values for {n_out} columns", zv.len()));
                            }
                            if let super::tensor::LitData::F(v) = &mut w.data {
                                for (i, x) in v.iter_mut().enumerate() {
                                    *x -= if zv.len() == 1 { zv[0] } else { zv[i % n_out] };
                                }
                            }
                        }
                        w.weight = b.weight || w.numel() > 64;
                        self.node(&format!("{}.int", iname(1)), &Val::Lit(w))?
                    }
                    (b, zero) => {
                        let b = self.node(&iname(1), &b)?;
                        let mut bf = self.cast_to(name, b, DType::F32)?;
                        if let Some(z) = zero {
                            let z = self.node(&iname(3), &z)?;
                            let z = self.cast_to(name, z, DType::F32)?;
                            bf = self.tmp(name, Op::Binary(BinaryOp::Sub), vec![bf, z])?;
                        }
                        bf
                    }
                };
                if self.shape(&Val::Node(af)).len() < 2 || self.shape(&Val::Node(bf)).len() < 2 {
                    return unsup("MatMulInteger of vectors");
                }
                one(self.push(name, Op::MatMul { transpose_a: false, transpose_b: false }, vec![af, bf])?)
            }
            // (0 < x) - (x < 0), NaN kept (DeBERTa's relative positions use it; those fold).
            "Sign" => {
                let x = self.node(&iname(0), &inp(0)?)?;
                let dt = self.dtype(&Val::Node(x));
                let z = self.scalar(&self.fresh(name), 0.0, dt)?;
                let pos = self.tmp(name, Op::Binary(BinaryOp::Lt), vec![z, x])?;
                let neg = self.tmp(name, Op::Binary(BinaryOp::Lt), vec![x, z])?;
                let s = self.tmp(name, Op::Binary(BinaryOp::Sub), vec![pos, neg])?;
                if !dt.is_float() {
                    return one(s);
                }
                let nan = self.tmp(name, Op::Binary(BinaryOp::Ne), vec![x, x])?;
                let nan = self.as_bool(&self.fresh(name), nan)?;
                one(self.push(name, Op::Where, vec![nan, x, s])?)
            }
            // The upper (or lower) triangle from diagonal k, as Where with a known mask.
            "Trilu" => {
                let x = self.node(&iname(0), &inp(0)?)?;
                let s = self.shape(&Val::Node(x));
                let r = s.len();
                if r < 2 {
                    return Err(Fail::Invalid(format!("Trilu of a rank-{r} tensor")));
                }
                let k = match ins.get(1).cloned().flatten() {
                    Some(_) => lit_of(1, "Trilu's k")?.ints().first().copied().unwrap_or(0),
                    None => 0,
                };
                let upper = at.int("upper", 1) != 0;
                let (rows, cols) = (s[r - 2], s[r - 1]);
                let keep: Vec<f64> = (0..rows * cols)
                    .map(|e| {
                        let d = (e % cols) as i64 - (e / cols) as i64;
                        f64::from(u8::from(if upper { d >= k } else { d <= k }))
                    })
                    .collect();
                let mask = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::Bool, vec![rows, cols], keep)))?;
                let z = self.scalar(&self.fresh(name), 0.0, self.dtype(&Val::Node(x)))?;
                one(self.push(name, Op::Where, vec![mask, x, z])?)
            }
            // x / √(mean(x²) + eps) · scale over axes ax.. (opset 23), as LayerNormalization.
            // SimplifiedLayerNormalization: onnxruntime's name for the same norm (its Llama-style
            // exports put it in the standard domain).
            "RMSNormalization" | "SimplifiedLayerNormalization" => {
                let x0 = self.node(&iname(0), &inp(0)?)?;
                let s = self.shape(&Val::Node(x0));
                let ax = shape::axis(at.int("axis", -1), s.len())?;
                let (x, last, flat) = self.norm_rows(name, x0, &s, ax)?;
                let dt = self.dtype(&Val::Node(x));
                let g = self.node(&iname(1), &inp(1)?)?;
                let g = self.norm_channel(name, g, last, dt, "RMSNormalization scale")?;
                let op = Op::RmsNorm { eps: at.float("epsilon", 1e-5) };
                if !flat {
                    return one(self.push(name, op, vec![x, g])?);
                }
                let y = self.tmp(name, op, vec![x, g])?;
                one(self.reshape(name, y, &s)?)
            }
            // Over axes ax..: x seen as [Π s[..ax], Π s[ax..]] (one reshape each way). The
            // optional Mean and InvStdDev outputs are computed apart when something reads them.
            "LayerNormalization" => {
                let x0 = self.node(&iname(0), &inp(0)?)?;
                let s = self.shape(&Val::Node(x0));
                let ax = shape::axis(at.int("axis", -1), s.len())?;
                let (x, last, flat) = self.norm_rows(name, x0, &s, ax)?;
                let eps = at.float("epsilon", 1e-5);
                let dt = self.dtype(&Val::Node(x));
                let mut gb = Vec::new();
                for (k, fill) in [(1usize, 1.0f64), (2, 0.0)] {
                    let v = match ins.get(k).cloned().flatten() {
                        Some(v) => v,
                        None => Val::Lit(Lit::of(Elem::F32, vec![last], vec![fill; last])),
                    };
                    let id = self.node(&iname(k), &v)?;
                    gb.push(self.norm_channel(name, id, last, dt, "LayerNormalization scale/bias")?);
                }
                let y = if flat {
                    let y = self.tmp(name, Op::LayerNorm { eps }, vec![x, gb[0], gb[1]])?;
                    self.reshape(name, y, &s)?
                } else {
                    self.push(name, Op::LayerNorm { eps }, vec![x, gb[0], gb[1]])?
                };
                if !n.output.iter().skip(1).any(|o| !o.is_empty() && self.m.is_used(o)) {
                    return one(y);
                }
                // Mean = E[x], InvStdDev = 1/sqrt(E[(x - Mean)²] + eps), shaped s[..ax] ++ [1, ..].
                let stat: Vec<usize> = s[..ax].iter().copied().chain(std::iter::repeat_n(1, s.len() - ax)).collect();
                let r2 = self.shape(&Val::Node(x)).len();
                let mean_op = Op::Reduce { op: ReduceOp::Mean, axes: vec![r2 - 1], keep_dims: true };
                let mean = self.tmp(name, mean_op.clone(), vec![x])?;
                let d = self.tmp(name, Op::Binary(BinaryOp::Sub), vec![x, mean])?;
                let d2 = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![d, d])?;
                let var = self.tmp(name, mean_op, vec![d2])?;
                let e = self.scalar(&self.fresh(name), eps, dt)?;
                let ve = self.tmp(name, Op::Binary(BinaryOp::Add), vec![var, e])?;
                let inv = self.tmp(name, Op::Unary(UnaryOp::Rsqrt), vec![ve])?;
                let names: Vec<String> = (1..3).map(|k| n.output.get(k).filter(|o| !o.is_empty()).cloned().unwrap_or_else(|| self.fresh(name))).collect();
                let mean = self.reshape(&names[0], mean, &stat)?;
                let inv = self.reshape(&names[1], inv, &stat)?;
                Ok(vec![y, mean, inv])
            }
            // Sum, Mean and Max are kiln reductions; the others are written over them:
            // Min = -Max(-x), SumSquare = Sum(x²), L1 = Sum(|x|), L2 = √Sum(x²),
            // LogSum = log Sum(x), LogSumExp = log Sum(e^(x - m)) + m with m = Max(x).
            "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceSumSquare" | "ReduceL1" | "ReduceL2" | "ReduceLogSum"
            | "ReduceLogSumExp" => {
                let x = self.node(&iname(0), &inp(0)?)?;
                let dt = self.dtype(&Val::Node(x));
                if !dt.is_float() && !matches!(op, "ReduceSum" | "ReduceMax" | "ReduceMean") {
                    return unsup(format!("{op} of integers"));
                }
                let r = self.shape(&Val::Node(x)).len();
                let as_input = if op == "ReduceSum" { opset >= 13 } else { opset >= 18 };
                let axes = if as_input {
                    match ins.get(1).cloned().flatten() {
                        Some(_) => Some(lit_of(1, "reduction axes")?.ints()),
                        None => None,
                    }
                } else {
                    at.ints("axes")
                };
                let mut axes: Vec<usize> = match axes {
                    Some(v) if !v.is_empty() => v.iter().map(|&a| shape::axis(a, r)).collect::<Result<_, _>>()?,
                    _ if at.int("noop_with_empty_axes", 0) != 0 => return one(x),
                    _ => (0..r).collect(),
                };
                axes.sort();
                axes.dedup();
                let keep_dims = at.int("keepdims", 1) != 0;
                let un = |s: &mut Self, u: UnaryOp, v: ValueId| s.tmp(name, Op::Unary(u), vec![v]);
                let red = |s: &mut Self, nm: &str, op: ReduceOp, v: ValueId, keep: bool| {
                    s.push(nm, Op::Reduce { op, axes: axes.clone(), keep_dims: keep }, vec![v])
                };
                match op {
                    "ReduceSum" => one(red(self, name, ReduceOp::Sum, x, keep_dims)?),
                    "ReduceMean" => one(red(self, name, ReduceOp::Mean, x, keep_dims)?),
                    "ReduceMax" => one(red(self, name, ReduceOp::Max, x, keep_dims)?),
                    "ReduceMin" => {
                        let nx = un(self, UnaryOp::Neg, x)?;
                        let m = red(self, &self.fresh(name), ReduceOp::Max, nx, keep_dims)?;
                        one(self.push(name, Op::Unary(UnaryOp::Neg), vec![m])?)
                    }
                    "ReduceSumSquare" | "ReduceL2" => {
                        let sq = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![x, x])?;
                        if op == "ReduceSumSquare" {
                            return one(red(self, name, ReduceOp::Sum, sq, keep_dims)?);
                        }
                        let s = red(self, &self.fresh(name), ReduceOp::Sum, sq, keep_dims)?;
                        one(self.push(name, Op::Unary(UnaryOp::Sqrt), vec![s])?)
                    }
                    "ReduceL1" => {
                        let a = un(self, UnaryOp::Abs, x)?;
                        one(red(self, name, ReduceOp::Sum, a, keep_dims)?)
                    }
                    "ReduceLogSum" => {
                        let s = red(self, &self.fresh(name), ReduceOp::Sum, x, keep_dims)?;
                        one(self.push(name, Op::Unary(UnaryOp::Log), vec![s])?)
                    }
                    _ => {
                        let m = red(self, &self.fresh(name), ReduceOp::Max, x, true)?;
                        let d = self.tmp(name, Op::Binary(BinaryOp::Sub), vec![x, m])?;
                        let e = un(self, UnaryOp::Exp, d)?;
                        let s = red(self, &self.fresh(name), ReduceOp::Sum, e, true)?;
                        let l = un(self, UnaryOp::Log, s)?;
                        if keep_dims {
                            return one(self.push(name, Op::Binary(BinaryOp::Add), vec![l, m])?);
                        }
                        let y = self.tmp(name, Op::Binary(BinaryOp::Add), vec![l, m])?;
                        let sh = self.shape(&Val::Node(x));
                        let out: Vec<usize> = (0..sh.len()).filter(|d| !axes.contains(d)).map(|d| sh[d]).collect();
                        one(self.reshape(name, y, &out)?)
                    }
                }
            }
            "CastLike" | "Cast" => {
                let code = if op == "CastLike" { like_code(&inp(1)?, self) } else { at.int("to", 1) as i32 };
                let to = Elem::from_code(code).ok_or_else(|| Fail::Unsupported(format!("Cast to {}", Elem::name_of(code))))?;
                let x = self.node(&iname(0), &inp(0)?)?;
                if to == Elem::Bool {
                    let z = self.scalar(name, 0.0, self.dtype(&Val::Node(x)))?;
                    let r = self.tmp(name, Op::Binary(BinaryOp::Ne), vec![x, z])?;
                    return one(self.as_bool(name, r)?);
                }
                if self.dtype(&Val::Node(x)) == to.dtype() {
                    return one(x);
                }
                one(self.push(name, Op::Cast { to: to.dtype() }, vec![x])?)
            }
            "Where" => {
                let (c, a, b) = (self.node(&iname(0), &inp(0)?)?, self.node(&iname(1), &inp(1)?)?, self.node(&iname(2), &inp(2)?)?);
                one(self.push(name, Op::Where, vec![c, a, b])?)
            }
            "Unsqueeze" | "Squeeze" | "Flatten" | "Reshape" => {
                let x = self.node(&iname(0), &inp(0)?)?;
                let s = self.shape(&Val::Node(x));
                let axes = if opset >= 13 {
                    match ins.get(1).cloned().flatten() {
                        Some(_) => Some(lit_of(1, "axes")?.ints()),
                        None => None,
                    }
                } else {
                    at.ints("axes")
                };
                let to = match op {
                    "Unsqueeze" => shape::unsqueeze(&s, &axes.ok_or_else(|| Fail::Invalid("Unsqueeze needs axes".into()))?)?,
                    "Squeeze" => shape::squeeze(&s, axes.as_deref())?,
                    "Flatten" => {
                        let k = shape::flatten_axis(at.int("axis", 1), s.len())?;
                        vec![s[..k].iter().product(), s[k..].iter().product()]
                    }
                    _ => {
                        let t = if opset >= 5 { lit_of(1, "a Reshape target")?.ints() } else { at.ints("shape").unwrap_or_default() };
                        shape::reshape(&s, &t, at.int("allowzero", 0) != 0)?
                    }
                };
                one(self.push_shaped(name, Op::Reshape, vec![x], &to)?)
            }
            "Transpose" => {
                let x = self.node(&iname(0), &inp(0)?)?;
                let r = self.shape(&Val::Node(x)).len();
                let perm: Vec<usize> = match at.ints("perm") {
                    Some(p) => p.iter().map(|&d| shape::axis(d, r)).collect::<Result<_, _>>()?,
                    None => (0..r).rev().collect(),
                };
                one(self.push(name, Op::Transpose { perm }, vec![x])?)
            }
            "Concat" => {
                let mut xs = Vec::new();
                for (k, v) in ins.iter().enumerate() {
                    if let Some(v) = v {
                        if self.shape(v).contains(&0) {
                            continue;
                        }
                        xs.push(self.node(&iname(k), v)?);
                    }
                }
                let r = self.shape(&Val::Node(xs[0])).len();
                let ax = shape::axis(at.int("axis", 0), r)?;
                let dt = self.dtype(&Val::Node(xs[0]));
                for x in xs.iter_mut() {
                    *x = self.cast_to(name, *x, dt)?;
                }
                if xs.len() == 1 {
                    return one(xs[0]);
                }
                one(self.push(name, Op::Concat { axis: ax }, xs)?)
            }
            "Slice" => {
                let x = self.node(&iname(0), &inp(0)?)?;
                let s = self.shape(&Val::Node(x));
                let r = s.len();
                let (starts, ends, axes, steps) = if opset >= 10 {
                    let opt = |k: usize, w: &str| -> R<Option<Vec<i64>>> {
                        match ins.get(k).cloned().flatten() {
                            Some(_) => Ok(Some(lit_of(k, w)?.ints())),
                            None => Ok(None),
                        }
                    };
                    (lit_of(1, "slice starts")?.ints(), lit_of(2, "slice ends")?.ints(), opt(3, "slice axes")?, opt(4, "slice steps")?)
                } else {
                    (at.ints("starts").unwrap_or_default(), at.ints("ends").unwrap_or_default(), at.ints("axes"), None)
                };
                let axes: Vec<usize> = match axes {
                    Some(v) => v.iter().map(|&d| shape::axis(d, r)).collect::<Result<_, _>>()?,
                    None => (0..starts.len()).collect(),
                };
                let mut y = x;
                for (k, &ax) in axes.iter().enumerate() {
                    let step = steps.as_ref().map_or(1, |v| v[k]);
                    let (b, _, _, len) = shape::slice_range(s[ax], starts[k], ends[k], step)?;
                    if len == 0 {
                        return unsup("an empty Slice (kiln has no empty tensors)");
                    }
                    if step != 1 {
                        // Strided or reversed: a gather of the known positions along the axis.
                        let idx: Vec<f64> = (0..len as i64).map(|i| (b + i * step) as f64).collect();
                        let ids = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::I64, vec![len], idx)))?;
                        let cur = self.shape(&Val::Node(y));
                        let nm = self.fresh(name);
                        y = self.gather_axis(&nm, y, &cur, ax, ids, false)?;
                        continue;
                    }
                    if b == 0 && len == s[ax] {
                        continue;
                    }
                    let nm = self.fresh(name);
                    y = self.push(&nm, Op::Slice { axis: ax, start: b as usize, end: Dim::Fixed(b as usize + len) }, vec![y])?;
                }
                one(y)
            }
            "Split" => {
                let x = self.node(&iname(0), &inp(0)?)?;
                let s = self.shape(&Val::Node(x));
                let ax = shape::axis(at.int("axis", 0), s.len())?;
                let nout = n.output.len();
                let sizes: Vec<usize> = match (opset >= 13, ins.get(1).cloned().flatten(), at.ints("split")) {
                    (true, Some(_), _) => lit_of(1, "split sizes")?.ints().iter().map(|&v| v as usize).collect(),
                    (false, _, Some(v)) => v.iter().map(|&v| v as usize).collect(),
                    _ => {
                        let k = at.int("num_outputs", nout as i64) as usize;
                        let each = s[ax].div_ceil(k);
                        (0..k).map(|i| each.min(s[ax] - (i * each).min(s[ax]))).collect()
                    }
                };
                let mut outs = Vec::new();
                let mut start = 0;
                for (i, &len) in sizes.iter().enumerate() {
                    if len == 0 {
                        return unsup("an empty Split output");
                    }
                    let nm = n.output.get(i).cloned().unwrap_or_else(|| self.fresh(name));
                    outs.push(self.push(&nm, Op::Slice { axis: ax, start, end: Dim::Fixed(start + len) }, vec![x])?);
                    start += len;
                }
                Ok(outs)
            }
            "Gather" => {
                let data = inp(0)?;
                let ids = inp(1)?;
                let ds = self.shape(&data);
                let ax = shape::axis(at.int("axis", 0), ds.len())?;
                match &ids {
                    // Rows of a matrix (an embedding table): one kiln Gather. Ids are not
                    // wrapped here: a negative token id is a run-time error, not row n - 1.
                    Val::Node(_) if ax == 0 && ds.len() == 2 => {
                        let t = self.node(&iname(0), &data)?;
                        let i = self.node(&iname(1), &ids)?;
                        one(self.push(name, Op::Gather, vec![t, i])?)
                    }
                    Val::Node(_) => {
                        let x = self.node(&iname(0), &data)?;
                        let i = self.node(&iname(1), &ids)?;
                        one(self.gather_axis(name, x, &ds, ax, i, true)?)
                    }
                    Val::Lit(l) if l.numel() > 64 => {
                        let x = self.node(&iname(0), &data)?;
                        let i = self.node(&iname(1), &ids)?;
                        one(self.gather_axis(name, x, &ds, ax, i, l.ints().iter().any(|&v| v < 0))?)
                    }
                    Val::Lit(l) => {
                        // Known indices: slices (and a concat) of the data.
                        let x = self.node(&iname(0), &data)?;
                        let d = ds[ax] as i64;
                        let idx: Vec<usize> = l
                            .ints()
                            .iter()
                            .map(|&i| {
                                let j = if i < 0 { i + d } else { i };
                                if (0..d).contains(&j) { Ok(j as usize) } else { Err(Fail::Invalid(format!("Gather index {i} out of range for dim {d}"))) }
                            })
                            .collect::<R<_>>()?;
                        let mut parts = Vec::new();
                        for &i in &idx {
                            let nm = self.fresh(name);
                            parts.push(self.push(&nm, Op::Slice { axis: ax, start: i, end: Dim::Fixed(i + 1) }, vec![x])?);
                        }
                        let cat = if parts.len() == 1 { parts[0] } else { self.tmp(name, Op::Concat { axis: ax }, parts)? };
                        let mut out = ds[..ax].to_vec();
                        out.extend(&l.shape);
                        out.extend(&ds[ax + 1..]);
                        one(self.reshape(name, cat, &out)?)
                    }
                }
            }
            "Expand" => {
                let x = self.node(&iname(0), &inp(0)?)?;
                let to: Vec<usize> = lit_of(1, "an Expand shape")?.ints().iter().map(|&d| d.max(0) as usize).collect();
                let s = self.shape(&Val::Node(x));
                let out = shape::broadcast(&s, &to)?;
                if out == s {
                    return one(x);
                }
                let dt = self.dtype(&Val::Node(x));
                let n1 = out.iter().product();
                let ones = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, out.clone(), vec![1.0; n1])))?;
                let ones = if dt != DType::F32 { self.tmp(name, Op::Cast { to: dt }, vec![ones])? } else { ones };
                one(self.push(name, Op::Binary(BinaryOp::Mul), vec![x, ones])?)
            }
            "Tile" => {
                let x = self.node(&iname(0), &inp(0)?)?;
                let reps = lit_of(1, "Tile repeats")?.ints();
                let mut y = x;
                for (ax, &k) in reps.iter().enumerate() {
                    if k > 1 {
                        if k > 64 {
                            return unsup(format!("Tile by {k}"));
                        }
                        y = self.tmp(name, Op::Concat { axis: ax }, vec![y; k as usize])?;
                    }
                }
                one(y)
            }
            "DequantizeLinear" => {
                // (x - zero_point) · scale in f32, the scale and zero point per tensor or per
                // slice along `axis` (shaped to broadcast there).
                let x = self.node(&iname(0), &inp(0)?)?;
                let xs = self.shape(&Val::Node(x));
                if at.int("block_size", 0) != 0 {
                    return unsup("blocked DequantizeLinear of a run-time value");
                }
                let axis_attr = at.int("axis", 1);
                let param = |s: &mut Self, k: usize| -> R<Option<ValueId>> {
                    let Some(v) = ins.get(k).cloned().flatten() else { return Ok(None) };
                    let mut id = s.node(&iname(k), &v)?;
                    let ps = s.shape(&Val::Node(id));
                    let n: usize = ps.iter().product();
                    if n != 1 {
                        let axis = shape::axis(axis_attr, xs.len())?;
                        if ps.len() != 1 || xs.get(axis) != Some(&n) {
                            return unsup(format!("DequantizeLinear parameter of shape {ps:?} for an input of shape {xs:?}"));
                        }
                        let to: Vec<usize> = std::iter::once(n).chain(std::iter::repeat_n(1, xs.len() - axis - 1)).collect();
                        id = s.reshape(&s.fresh(name), id, &to)?;
                    }
                    Ok(Some(s.cast_to(name, id, DType::F32)?))
                };
                let scale = param(self, 1)?.ok_or_else(|| Fail::Invalid("DequantizeLinear without a scale".into()))?;
                let zero = param(self, 2)?;
                let xf = self.tmp(name, Op::Cast { to: DType::F32 }, vec![x])?;
                let xf = match zero {
                    Some(z) => self.tmp(name, Op::Binary(BinaryOp::Sub), vec![xf, z])?,
                    None => xf,
                };
                one(self.push(name, Op::Binary(BinaryOp::Mul), vec![xf, scale])?)
            }
            "Equal" | "Greater" | "GreaterOrEqual" | "Less" | "LessOrEqual" | "And" | "Or" | "Xor" => {
                let (mut a, mut b) = (self.node(&iname(0), &inp(0)?)?, self.node(&iname(1), &inp(1)?)?);
                let (da, db) = (self.dtype(&Val::Node(a)), self.dtype(&Val::Node(b)));
                if da != db {
                    // Literals come in as f32 constants: meet the run-time operand's type.
                    if matches!(inp(0)?, Val::Lit(_)) {
                        a = self.tmp(name, Op::Cast { to: db }, vec![a])?;
                    } else {
                        b = self.tmp(name, Op::Cast { to: da }, vec![b])?;
                    }
                }
                let (k, x, y) = match op {
                    "Equal" => (BinaryOp::Eq, a, b),
                    "Less" => (BinaryOp::Lt, a, b),
                    "LessOrEqual" => (BinaryOp::Le, a, b),
                    "Greater" => (BinaryOp::Lt, b, a),
                    "GreaterOrEqual" => (BinaryOp::Le, b, a),
                    // bools are 0/1: and = a·b, or = max, xor = a ≠ b.
                    "And" => (BinaryOp::Mul, a, b),
                    "Or" => (BinaryOp::Max, a, b),
                    _ => (BinaryOp::Ne, a, b),
                };
                let r = self.tmp(name, Op::Binary(k), vec![x, y])?;
                one(self.as_bool(name, r)?)
            }
            "Not" | "IsNaN" => {
                let x = self.node(&iname(0), &inp(0)?)?;
                let r = if op == "Not" {
                    let z = self.scalar(name, 0.0, self.dtype(&Val::Node(x)))?;
                    self.tmp(name, Op::Binary(BinaryOp::Eq), vec![x, z])?
                } else {
                    self.tmp(name, Op::Binary(BinaryOp::Ne), vec![x, x])?
                };
                one(self.as_bool(name, r)?)
            }
            "GatherND" => {
                let data = self.node(&iname(0), &inp(0)?)?;
                if at.int("batch_dims", 0) != 0 {
                    return unsup("GatherND with batch_dims");
                }
                let ds = self.shape(&Val::Node(data));
                if let Val::Node(_) = inp(1)? {
                    let i = self.node(&iname(1), &inp(1)?)?;
                    return one(self.gather_nd(name, data, &ds, i)?);
                }
                let idx = lit_of(1, "GatherND indices")?;
                let k = *idx.shape.last().ok_or_else(|| Fail::Invalid("GatherND indices of rank 0".into()))?;
                if k > ds.len() {
                    return Err(Fail::Invalid(format!("GatherND indices of depth {k} into rank {}", ds.len())));
                }
                let st = shape::strides(&ds[..k]);
                let (iv, lead) = (idx.ints(), idx.shape[..idx.shape.len() - 1].to_vec());
                let mut rows = Vec::with_capacity(iv.len() / k.max(1));
                for c in iv.chunks(k.max(1)) {
                    let mut r = 0i64;
                    for (d, &i) in c.iter().enumerate() {
                        let n = ds[d] as i64;
                        let j = if i < 0 { i + n } else { i };
                        if !(0..n).contains(&j) {
                            return Err(Fail::Invalid(format!("GatherND index {i} out of range for dim {n}")));
                        }
                        r += j * st[d] as i64;
                    }
                    rows.push(r);
                }
                let mut out = lead.clone();
                out.extend(&ds[k..]);
                one(self.gather_rows(name, data, &ds, k, rows, &lead, &out)?)
            }
            "Shape" | "Size" | "Constant" | "ConstantOfShape" | "Range" => unsup(format!("{op} of a run-time value")),
            _ => unsup(format!("op `{op}` is not supported")),
        }
    }
}

/// The ONNX type code of `v`'s type (CastLike's target).
fn like_code(v: &Val, im: &Importer) -> i32 {
    match v {
        Val::Lit(l) => elem_code(l.elem),
        Val::Node(id) => match im.g.node(*id).dtype {
            DType::F32 => 1,
            DType::F16 => 10,
            DType::BF16 => 16,
            DType::I32 => 6,
            DType::I64 => 7,
        },
    }
}

pub fn elem_code(e: Elem) -> i32 {
    match e {
        Elem::F32 => 1,
        Elem::U8 => 2,
        Elem::I8 => 3,
        Elem::U16 => 4,
        Elem::I16 => 5,
        Elem::I32 => 6,
        Elem::I64 => 7,
        Elem::Bool => 9,
        Elem::F16 => 10,
        Elem::F64 => 11,
        Elem::U32 => 12,
        Elem::U64 => 13,
        Elem::BF16 => 16,
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
    matches!(op, "DequantizeLinear" | "Cast" | "Mul" | "Sub" | "Identity" | "Shape" | "Size" | "MatMulInteger")
}

/// Every op the importer knows (folded or as kiln ops), for `kiln onnx-ops`.
pub const SUPPORTED: &[&str] = &[
    "Abs", "Add", "And", "Cast", "CastLike", "Clip", "Concat", "Constant", "ConstantOfShape", "DequantizeLinear", "Div", "Dropout", "DynamicQuantizeLinear",
    "CumSum", "Equal", "Erf", "Exp", "Expand", "Flatten", "Gather", "Gelu", "Gemm", "Greater", "GreaterOrEqual", "Identity",
    "GatherND", "IsNaN", "LayerNormalization", "Less", "LessOrEqual", "Log", "LogSoftmax", "MatMul", "MatMulInteger", "Max", "Min", "Mul", "Neg",
    "Not", "Or", "Pow", "Range", "Reciprocal", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
    "ReduceSum", "ReduceSumSquare", "Relu", "RMSNormalization", "Reshape", "Shape", "Sigmoid", "Sign", "SimplifiedLayerNormalization",
    "Size", "Slice", "Softmax", "Softplus", "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Tanh", "Tile", "Transpose", "Trilu", "Unsqueeze",
    "Where", "Xor",
];
