//! The graph IR as plain data: values, ops, symbolic dims, the weight table.
//!
//! The data lives here because `Backend::upload/lower` take a `&Graph`; what an op computes
//! (`kiln_compiler::ops`), its shape inference (`kiln_compiler::ir::infer`), the builder, the
//! printer and parser, and every pass live in `kiln-compiler`. This crate checks only structure
//! ([`Graph::check_structure`]): what a runtime must know before it indexes anything.
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
    /// Comparisons: 1 where true, 0 where false, in the operands' type (false on NaN, but `Ne`).
    Eq,
    Ne,
    Lt,
    Le,
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
    /// The error function.
    Erf,
    /// |x| (|-0| = +0).
    Abs,
    /// The natural logarithm (NaN below 0, -inf at ±0).
    Log,
    /// ln(1 + e^x), computed without overflow.
    Softplus,
    /// The largest integer not above x (floor(-0.5) = -1, floor(-0) = -0).
    Floor,
    /// The smallest integer not below x (ceil(-0.5) = -0).
    Ceil,
    /// The nearest integer, ties to even (ONNX `Round`: round(2.5) = 2, round(-0.4) = -0).
    Round,
    /// Sine and cosine (radians): a quadrant reduction and minimax polynomials, accurate to
    /// about 1e-6 absolute for |x| below 2^16 (rotary embeddings of run-time positions); NaN
    /// past 2^22, where an f32 reduction has no meaning left.
    Sin,
    Cos,
    /// The arc tangent (radians): Cephes' single-precision reduction and polynomial, about
    /// 2e-7 relative; atan(±inf) = ±π/2, -0 stays -0. ONNX's Asin and Acos import through it.
    Atan,
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
    /// Each token's position: 0, 1, 2, ... along the row.
    PositionIds,
    /// Anything else: never filled from token ids (`Batch::from_token_ids` refuses it).
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
    /// Every element is an integer of at most this magnitude (a quantized weight minus its zero
    /// point): a compiler may multiply it in integers. A backend that relies on it checks it
    /// when it prepares the tensor.
    pub int_bound: Option<u32>,
}

impl WeightSpec {
    /// A weight with nothing known of its values.
    pub fn new(name: impl Into<String>, dtype: DType, shape: Vec<usize>) -> WeightSpec {
        WeightSpec { name: name.into(), dtype, shape, int_bound: None }
    }
}

/// Further weight-table entries joined to one entry along `axis` into a single tensor that a
/// backend prepares once: the merged weight of sibling linear layers (attention's Q, K and V
/// projections as one GEMM). Every part has the first one's dims except along `axis`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WeightConcat {
    pub axis: usize,
    /// The entries after the first, in order.
    pub rest: Vec<usize>,
}

impl WeightConcat {
    /// Every entry joined, in order, `first` (the entry the concatenation is attached to) first.
    pub fn entries(&self, first: usize) -> impl Iterator<Item = usize> + '_ {
        std::iter::once(first).chain(self.rest.iter().copied())
    }
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
    /// Output `output` of a precompiled plan. Only in the interface graph of an artifact
    /// (`Signature::graph`), which carries a signature and
    /// no ops: a runtime can run it through the artifact's plans, no compiler can lower it.
    Precompiled { output: usize },
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
            Op::Precompiled { output } => format!("precompiled#{output}"),
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

    /// The checks a runtime needs before it indexes anything, without shape inference: output
    /// names parallel to outputs, every node's inputs defined before it, every input and weight
    /// node naming an entry of its table with that entry's dtype and shape, every output a node.
    /// Errors name the node at fault.
    pub fn check_structure(&self) -> Result<()> {
        if self.outputs.len() != self.output_names.len() {
            return Err(Error::graph("<graph>", "outputs and output_names differ in length"));
        }
        for (i, n) in self.nodes.iter().enumerate() {
            if let Some(inp) = n.inputs.iter().find(|v| v.index() >= i) {
                return Err(Error::graph(&n.name, format!("input {inp} is not defined before this node")));
            }
            let (what, spec) = match n.op {
                Op::Input { index } => {
                    ("input", self.inputs.get(index).map(|s| (s.dtype, s.shape.clone())))
                }
                Op::Weight { index } => (
                    "weight",
                    self.weights.get(index).map(|s| (s.dtype, s.shape.iter().map(|&d| Dim::Fixed(d)).collect())),
                ),
                _ => continue,
            };
            match spec {
                None => return Err(Error::graph(&n.name, format!("{} names no {what} of the graph", n.op.name()))),
                Some((dt, shape)) if dt != n.dtype || shape != n.shape => {
                    return Err(Error::graph(
                        &n.name,
                        format!("{} is {dt} {} in the table, {} {} on the node", n.op.name(), fmt_shape(&shape), n.dtype, fmt_shape(&n.shape)),
                    ))
                }
                Some(_) => {}
            }
        }
        if let Some(o) = self.outputs.iter().find(|o| o.index() >= self.nodes.len()) {
            return Err(Error::graph("<graph>", format!("output {o} is not a node")));
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
}
