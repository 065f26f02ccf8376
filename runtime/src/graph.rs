//! The graph IR's plain data: values, ops, symbolic dims, the weight table, and shape inference.
//!
//! The data lives in the runtime because `Backend::upload/lower` take a `&Graph`; the builder and
//! every pass that transforms a graph live in `kiln-compiler`.
//!
//! A graph is a list of nodes in topological order; node `i` defines value `ValueId(i)`.
//! Shapes are symbolic in two dims, `batch` and `seq`, that a [`Bucket`] resolves.

use serde::{Deserialize, Serialize};
use std::fmt;

pub use crate::bucket::Bucket;
use crate::dtype::DType;
use crate::error::{Error, Result};

impl Bucket {
    /// Parses `8x128` (batch x seq).
    pub fn parse(s: &str) -> Result<Self> {
        let bad = || {
            Error::bad_batch(format!("bucket `{s}` is not of the form BATCHxSEQ (e.g. 8x128)"))
        };
        let (b, q) = s.trim().split_once(['x', 'X']).ok_or_else(bad)?;
        let batch: usize = b.trim().parse().map_err(|_| bad())?;
        let seq: usize = q.trim().parse().map_err(|_| bad())?;
        if batch == 0 || seq == 0 {
            return Err(bad());
        }
        Ok(Bucket { batch, seq })
    }
}

/// One dimension of a symbolic shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dim {
    Fixed(usize),
    Batch,
    Seq,
}

impl Dim {
    pub fn resolve(self, b: Bucket) -> usize {
        match self {
            Dim::Fixed(n) => n,
            Dim::Batch => b.batch,
            Dim::Seq => b.seq,
        }
    }
    pub fn fixed(self) -> Option<usize> {
        match self {
            Dim::Fixed(n) => Some(n),
            _ => None,
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Batch => f.write_str("batch"),
            Dim::Seq => f.write_str("seq"),
        }
    }
}

pub fn fmt_shape(s: &[Dim]) -> String {
    format!("[{}]", s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(","))
}

/// Index of a value (= the node that defines it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ValueId(pub u32);

impl ValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
}

/// What each op computes is defined once, in `kiln_compiler::ops`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UnaryOp {
    /// GELU with the exact erf form: x * 0.5 * (1 + erf(x / sqrt 2)).
    Gelu,
    Tanh,
    Relu,
    Silu,
    Exp,
    Sqrt,
    Rsqrt,
    Neg,
    Recip,
    /// GELU with the tanh approximation (HF `gelu_new`, `gelu_pytorch_tanh`, `gelu_fast`).
    GeluTanh,
    /// The logistic function 1 / (1 + e^-x).
    Sigmoid,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
}

/// What an input of the graph means, so the engine knows how to pad it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum InputRole {
    /// Token ids, padded with 0.
    TokenIds,
    /// 1 for a real token, 0 for padding.
    AttentionMask,
    /// Token type (segment) ids, padded with 0.
    TokenTypes,
    /// Anything else, padded with zeros.
    Other,
}

/// A graph input supplied per run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputSpec {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<Dim>,
    pub role: InputRole,
}

/// One entry of the weight table: a checkpoint tensor the graph reads.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WeightSpec {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Op {
    /// Graph input `index` (see [`Graph::inputs`]).
    Input { index: usize },
    /// Weight-table entry `index` (see [`Graph::weights`]).
    Weight { index: usize },
    /// A constant tensor (row-major); shape given by the node. A scalar has shape `[]`.
    Constant { values: Vec<f32> },
    /// `a @ b` over the last two dims, with optional transposes; leading dims broadcast.
    MatMul { transpose_a: bool, transpose_b: bool },
    /// Elementwise binary op with numpy broadcasting.
    Binary(BinaryOp),
    Unary(UnaryOp),
    /// Softmax over `axis`; an optional second input is an additive mask (broadcast to x).
    Softmax { axis: usize },
    /// LayerNorm over the last dim: inputs x, gamma, beta.
    LayerNorm { eps: f32 },
    /// RmsNorm over the last dim: inputs x, gamma.
    RmsNorm { eps: f32 },
    Reshape,
    Transpose { perm: Vec<usize> },
    /// Rows of `table` (input 0, rank 2) picked by integer `ids` (input 1): shape ids ++ [cols].
    Gather,
    Concat { axis: usize },
    /// `x[start..end]` along `axis`. `end` may be symbolic (e.g. `seq` for position embeddings),
    /// in which case `start` must be 0.
    Slice { axis: usize, start: usize, end: Dim },
    Reduce { op: ReduceOp, axes: Vec<usize>, keep_dims: bool },
    /// `cond != 0 ? a : b` with broadcasting: inputs cond, a, b.
    Where,
    Cast { to: DType },
}

impl Op {
    pub fn name(&self) -> String {
        match self {
            Op::Input { index } => format!("input#{index}"),
            Op::Weight { index } => format!("weight#{index}"),
            Op::Constant { values } if values.len() == 1 => format!("const({})", values[0]),
            Op::Constant { .. } => "const".into(),
            Op::MatMul { transpose_a, transpose_b } => format!(
                "matmul{}{}",
                if *transpose_a { ".ta" } else { "" },
                if *transpose_b { ".tb" } else { "" }
            ),
            Op::Binary(b) => format!("{b:?}").to_lowercase(),
            Op::Unary(u) => format!("{u:?}").to_lowercase(),
            Op::Softmax { axis } => format!("softmax(axis={axis})"),
            Op::LayerNorm { eps } => format!("layer_norm(eps={eps:e})"),
            Op::RmsNorm { eps } => format!("rms_norm(eps={eps:e})"),
            Op::Reshape => "reshape".into(),
            Op::Transpose { perm } => format!("transpose({perm:?})"),
            Op::Gather => "gather".into(),
            Op::Concat { axis } => format!("concat(axis={axis})"),
            Op::Slice { axis, start, end } => format!("slice(axis={axis},{start}..{end})"),
            Op::Reduce { op, axes, keep_dims } => {
                format!("reduce_{}(axes={axes:?},keep={keep_dims})", format!("{op:?}").to_lowercase())
            }
            Op::Where => "where".into(),
            Op::Cast { to } => format!("cast({to})"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    pub op: Op,
    pub inputs: Vec<ValueId>,
    pub dtype: DType,
    pub shape: Vec<Dim>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Graph {
    pub nodes: Vec<Node>,
    pub inputs: Vec<InputSpec>,
    pub weights: Vec<WeightSpec>,
    pub outputs: Vec<ValueId>,
    /// Output names, parallel to `outputs`.
    pub output_names: Vec<String>,
}

impl Graph {
    pub fn node(&self, v: ValueId) -> &Node {
        &self.nodes[v.index()]
    }

    /// Concrete shape of `v` for bucket `b`.
    pub fn shape_in(&self, v: ValueId, b: Bucket) -> Vec<usize> {
        self.node(v).shape.iter().map(|d| d.resolve(b)).collect()
    }

    /// Appends a node after inferring and checking its dtype and shape.
    pub fn push(&mut self, name: impl Into<String>, op: Op, inputs: Vec<ValueId>) -> Result<ValueId> {
        self.push_shaped(name, op, inputs, None)
    }

    /// Like [`Graph::push`], with the output shape given for ops whose shape is an attribute
    /// (Reshape, Constant); it is checked against the input.
    pub fn push_shaped(
        &mut self,
        name: impl Into<String>,
        op: Op,
        inputs: Vec<ValueId>,
        shape: Option<Vec<Dim>>,
    ) -> Result<ValueId> {
        let name = name.into();
        for i in &inputs {
            if i.index() >= self.nodes.len() {
                return Err(Error::graph(&name, format!("input {i} is not defined before this node")));
            }
        }
        let (dtype, shape) = infer(self, &name, &op, &inputs, shape.as_deref())?;
        self.nodes.push(Node { name, op, inputs, dtype, shape });
        Ok(ValueId((self.nodes.len() - 1) as u32))
    }

    /// Checks every node of the graph structurally and, when `bucket` is given, with that
    /// bucket's concrete sizes (symbolic dims resolved). Errors name the node at fault.
    pub fn validate(&self, bucket: Option<Bucket>) -> Result<()> {
        if self.outputs.len() != self.output_names.len() {
            return Err(Error::graph("<graph>", "outputs and output_names differ in length"));
        }
        for (i, n) in self.nodes.iter().enumerate() {
            for inp in &n.inputs {
                if inp.index() >= i {
                    return Err(Error::graph(&n.name, format!("input {inp} is not defined before this node")));
                }
            }
            let (dt, shape) = infer(self, &n.name, &n.op, &n.inputs, Some(&n.shape))?;
            if dt != n.dtype || shape != n.shape {
                return Err(Error::graph(
                    &n.name,
                    format!(
                        "recorded type {} {} differs from inferred {} {}",
                        n.dtype,
                        fmt_shape(&n.shape),
                        dt,
                        fmt_shape(&shape)
                    ),
                ));
            }
            if let Some(b) = bucket {
                check_concrete(self, n, b)?;
            }
        }
        for o in &self.outputs {
            if o.index() >= self.nodes.len() {
                return Err(Error::graph("<graph>", format!("output {o} is not a node")));
            }
        }
        Ok(())
    }

    /// Number of uses of every value (outputs count as a use).
    pub fn use_counts(&self) -> Vec<usize> {
        let mut c = vec![0; self.nodes.len()];
        for n in &self.nodes {
            for i in &n.inputs {
                c[i.index()] += 1;
            }
        }
        for o in &self.outputs {
            c[o.index()] += 1;
        }
        c
    }

    /// A deterministic, human-readable listing of the graph, one node per line.
    pub fn print(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        for (i, inp) in self.inputs.iter().enumerate() {
            let _ = writeln!(s, "input {i} {}: {} {} ({:?})", inp.name, inp.dtype, fmt_shape(&inp.shape), inp.role);
        }
        for (i, n) in self.nodes.iter().enumerate() {
            let args: Vec<String> = n.inputs.iter().map(|v| v.to_string()).collect();
            let extra = match &n.op {
                Op::Weight { index } => format!(" \"{}\"", self.weights[*index].name),
                _ => String::new(),
            };
            let _ = writeln!(
                s,
                "%{i} = {}({}){extra} : {} {}",
                n.op.name(),
                args.join(", "),
                n.dtype,
                fmt_shape(&n.shape)
            );
        }
        for (o, name) in self.outputs.iter().zip(&self.output_names) {
            let _ = writeln!(s, "output {name} = {o}");
        }
        s
    }
}

/// Numpy broadcasting of symbolic shapes.
pub fn broadcast_shapes(node: &str, a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>> {
    let r = a.len().max(b.len());
    let mut out = Vec::with_capacity(r);
    for i in 0..r {
        let da = if i + a.len() >= r { a[i + a.len() - r] } else { Dim::Fixed(1) };
        let db = if i + b.len() >= r { b[i + b.len() - r] } else { Dim::Fixed(1) };
        let d = if da == db {
            da
        } else if da == Dim::Fixed(1) {
            db
        } else if db == Dim::Fixed(1) {
            da
        } else {
            return Err(Error::graph(
                node,
                format!("shapes {} and {} do not broadcast (dim {i}: {da} vs {db})", fmt_shape(a), fmt_shape(b)),
            ));
        };
        out.push(d);
    }
    Ok(out)
}

fn want_inputs(node: &str, op: &Op, inputs: &[ValueId], n: std::ops::RangeInclusive<usize>) -> Result<()> {
    if !n.contains(&inputs.len()) {
        return Err(Error::graph(
            node,
            format!("{} takes {}..={} inputs, got {}", op.name(), n.start(), n.end(), inputs.len()),
        ));
    }
    Ok(())
}

fn want_float(node: &str, g: &Graph, v: ValueId) -> Result<()> {
    let dt = g.node(v).dtype;
    if !dt.is_float() {
        return Err(Error::graph(node, format!("input {v} must be a float tensor, got {dt}")));
    }
    Ok(())
}

/// Symbolic product of dims: (fixed product, batch power, seq power).
fn dim_product(s: &[Dim]) -> (usize, u32, u32) {
    let mut p = (1usize, 0u32, 0u32);
    for d in s {
        match d {
            Dim::Fixed(n) => p.0 *= n,
            Dim::Batch => p.1 += 1,
            Dim::Seq => p.2 += 1,
        }
    }
    p
}

/// Infers dtype and shape of a node. `recorded` is the node's own shape, needed by ops whose
/// output shape is an attribute (Reshape, Constant, Input, Weight).
fn infer(g: &Graph, node: &str, op: &Op, inputs: &[ValueId], recorded: Option<&[Dim]>) -> Result<(DType, Vec<Dim>)> {
    let ishape = |k: usize| g.node(inputs[k]).shape.clone();
    let idtype = |k: usize| g.node(inputs[k]).dtype;
    match op {
        Op::Input { index } => {
            want_inputs(node, op, inputs, 0..=0)?;
            let spec = g
                .inputs
                .get(*index)
                .ok_or_else(|| Error::graph(node, format!("graph has no input #{index}")))?;
            Ok((spec.dtype, spec.shape.clone()))
        }
        Op::Weight { index } => {
            want_inputs(node, op, inputs, 0..=0)?;
            let spec = g
                .weights
                .get(*index)
                .ok_or_else(|| Error::graph(node, format!("graph has no weight #{index}")))?;
            Ok((spec.dtype, spec.shape.iter().map(|&d| Dim::Fixed(d)).collect()))
        }
        Op::Constant { values } => {
            want_inputs(node, op, inputs, 0..=0)?;
            let shape = recorded.map(|s| s.to_vec()).unwrap_or_else(|| {
                if values.len() == 1 { vec![] } else { vec![Dim::Fixed(values.len())] }
            });
            let (n, bp, sp) = dim_product(&shape);
            if bp + sp != 0 || n != values.len() {
                return Err(Error::graph(
                    node,
                    format!("constant of {} values cannot have shape {}", values.len(), fmt_shape(&shape)),
                ));
            }
            Ok((DType::F32, shape))
        }
        Op::MatMul { transpose_a, transpose_b } => {
            want_inputs(node, op, inputs, 2..=2)?;
            want_float(node, g, inputs[0])?;
            if idtype(0) != idtype(1) {
                return Err(Error::graph(node, format!("matmul of {} and {}", idtype(0), idtype(1))));
            }
            let (a, b) = (ishape(0), ishape(1));
            if a.len() < 2 || b.len() < 2 {
                return Err(Error::graph(
                    node,
                    format!("matmul needs rank >= 2, got {} and {}", fmt_shape(&a), fmt_shape(&b)),
                ));
            }
            let (m, ka) = if *transpose_a { (a[a.len() - 1], a[a.len() - 2]) } else { (a[a.len() - 2], a[a.len() - 1]) };
            let (kb, n) = if *transpose_b { (b[b.len() - 1], b[b.len() - 2]) } else { (b[b.len() - 2], b[b.len() - 1]) };
            if ka != kb {
                return Err(Error::graph(
                    node,
                    format!(
                        "matmul inner dims differ: {} · {} (k = {ka} vs {kb})",
                        fmt_shape(&a),
                        fmt_shape(&b)
                    ),
                ));
            }
            let mut out = broadcast_shapes(node, &a[..a.len() - 2], &b[..b.len() - 2])?;
            out.push(m);
            out.push(n);
            Ok((idtype(0), out))
        }
        Op::Binary(_) => {
            want_inputs(node, op, inputs, 2..=2)?;
            if idtype(0) != idtype(1) {
                return Err(Error::graph(node, format!("operands have dtypes {} and {}", idtype(0), idtype(1))));
            }
            Ok((idtype(0), broadcast_shapes(node, &ishape(0), &ishape(1))?))
        }
        Op::Unary(_) => {
            want_inputs(node, op, inputs, 1..=1)?;
            want_float(node, g, inputs[0])?;
            Ok((idtype(0), ishape(0)))
        }
        Op::Softmax { axis } => {
            want_inputs(node, op, inputs, 1..=2)?;
            want_float(node, g, inputs[0])?;
            let s = ishape(0);
            if *axis >= s.len() {
                return Err(Error::graph(node, format!("softmax axis {axis} out of range for {}", fmt_shape(&s))));
            }
            if inputs.len() == 2 {
                let b = broadcast_shapes(node, &s, &ishape(1))?;
                if b != s {
                    return Err(Error::graph(
                        node,
                        format!("mask {} does not broadcast to scores {}", fmt_shape(&ishape(1)), fmt_shape(&s)),
                    ));
                }
                if idtype(1) != idtype(0) {
                    return Err(Error::graph(node, format!("mask dtype {} differs from scores {}", idtype(1), idtype(0))));
                }
            }
            Ok((idtype(0), s))
        }
        Op::LayerNorm { .. } | Op::RmsNorm { .. } => {
            let n_in = if matches!(op, Op::LayerNorm { .. }) { 3 } else { 2 };
            want_inputs(node, op, inputs, n_in..=n_in)?;
            want_float(node, g, inputs[0])?;
            let s = ishape(0);
            let last = *s.last().ok_or_else(|| Error::graph(node, "normalization of a scalar"))?;
            for k in 1..n_in {
                if ishape(k) != vec![last] {
                    return Err(Error::graph(
                        node,
                        format!("scale/shift must have shape [{last}], got {}", fmt_shape(&ishape(k))),
                    ));
                }
            }
            Ok((idtype(0), s))
        }
        Op::Reshape => {
            want_inputs(node, op, inputs, 1..=1)?;
            let to = recorded.ok_or_else(|| Error::graph(node, "reshape needs a target shape"))?;
            let from = ishape(0);
            if dim_product(&from) != dim_product(to) {
                return Err(Error::graph(
                    node,
                    format!("cannot reshape {} into {}", fmt_shape(&from), fmt_shape(to)),
                ));
            }
            Ok((idtype(0), to.to_vec()))
        }
        Op::Transpose { perm } => {
            want_inputs(node, op, inputs, 1..=1)?;
            let s = ishape(0);
            let mut seen = vec![false; s.len()];
            if perm.len() != s.len() || perm.iter().any(|&p| p >= s.len() || std::mem::replace(&mut seen[p], true)) {
                return Err(Error::graph(node, format!("{perm:?} is not a permutation of rank {}", s.len())));
            }
            Ok((idtype(0), perm.iter().map(|&p| s[p]).collect()))
        }
        Op::Gather => {
            want_inputs(node, op, inputs, 2..=2)?;
            let t = ishape(0);
            if t.len() != 2 {
                return Err(Error::graph(node, format!("gather table must be rank 2, got {}", fmt_shape(&t))));
            }
            if !idtype(1).is_int() {
                return Err(Error::graph(node, format!("gather ids must be integers, got {}", idtype(1))));
            }
            let mut s = ishape(1);
            s.push(t[1]);
            Ok((idtype(0), s))
        }
        Op::Concat { axis } => {
            want_inputs(node, op, inputs, 1..=64)?;
            let s0 = ishape(0);
            if *axis >= s0.len() {
                return Err(Error::graph(node, format!("concat axis {axis} out of range for {}", fmt_shape(&s0))));
            }
            let mut total = 0usize;
            for k in 0..inputs.len() {
                let s = ishape(k);
                if idtype(k) != idtype(0) || s.len() != s0.len() {
                    return Err(Error::graph(node, format!("concat input {k} has type {} {}", idtype(k), fmt_shape(&s))));
                }
                for (d, (x, y)) in s.iter().zip(&s0).enumerate() {
                    if d != *axis && x != y {
                        return Err(Error::graph(
                            node,
                            format!("concat inputs differ off-axis: {} vs {}", fmt_shape(&s), fmt_shape(&s0)),
                        ));
                    }
                }
                total += s[*axis]
                    .fixed()
                    .ok_or_else(|| Error::graph(node, "concat along a symbolic dim is not supported"))?;
            }
            let mut out = s0;
            out[*axis] = Dim::Fixed(total);
            Ok((idtype(0), out))
        }
        Op::Slice { axis, start, end } => {
            want_inputs(node, op, inputs, 1..=1)?;
            let mut s = ishape(0);
            let bad = match end {
                Dim::Fixed(e) => start >= e,
                _ => *start != 0,
            };
            if *axis >= s.len() || bad {
                return Err(Error::graph(node, format!("bad slice axis {axis} {start}..{end} of {}", fmt_shape(&s))));
            }
            if let (Dim::Fixed(n), Dim::Fixed(e)) = (s[*axis], end) {
                if *e > n {
                    return Err(Error::graph(node, format!("slice {start}..{e} past dim of size {n}")));
                }
            }
            s[*axis] = match end {
                Dim::Fixed(e) => Dim::Fixed(e - start),
                d => *d,
            };
            Ok((idtype(0), s))
        }
        Op::Reduce { axes, keep_dims, .. } => {
            want_inputs(node, op, inputs, 1..=1)?;
            let s = ishape(0);
            if axes.is_empty() || axes.iter().any(|&a| a >= s.len()) || axes.windows(2).any(|w| w[0] >= w[1]) {
                return Err(Error::graph(node, format!("bad reduce axes {axes:?} for {}", fmt_shape(&s))));
            }
            let out = s
                .iter()
                .enumerate()
                .filter_map(|(i, &d)| {
                    if axes.contains(&i) {
                        keep_dims.then_some(Dim::Fixed(1))
                    } else {
                        Some(d)
                    }
                })
                .collect();
            Ok((idtype(0), out))
        }
        Op::Where => {
            want_inputs(node, op, inputs, 3..=3)?;
            if idtype(1) != idtype(2) {
                return Err(Error::graph(node, format!("where branches have dtypes {} and {}", idtype(1), idtype(2))));
            }
            let s = broadcast_shapes(node, &ishape(0), &ishape(1))?;
            Ok((idtype(1), broadcast_shapes(node, &s, &ishape(2))?))
        }
        Op::Cast { to } => {
            want_inputs(node, op, inputs, 1..=1)?;
            Ok((*to, ishape(0)))
        }
    }
}

/// Checks concrete sizes a symbolic check cannot (e.g. a slice past a symbolic dim, gather
/// tables of a resolved size, positive dims).
fn check_concrete(g: &Graph, n: &Node, b: Bucket) -> Result<()> {
    if n.shape.iter().any(|d| d.resolve(b) == 0) {
        return Err(Error::graph(&n.name, format!("has an empty dim in bucket {b}")));
    }
    if let Op::Slice { axis, end, .. } = &n.op {
        let size = g.node(n.inputs[0]).shape[*axis].resolve(b);
        let end = end.resolve(b);
        if end > size {
            return Err(Error::graph(&n.name, format!("slice end {end} past dim of size {size} in bucket {b}")));
        }
    }
    Ok(())
}
