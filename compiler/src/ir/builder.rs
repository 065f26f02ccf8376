//! A builder that reads like the model: `g.matmul(x, w)`, `g.layer_norm(x, gamma, beta, eps)`.
//!
//! Every call infers and checks the new node's type (see `kiln_runtime::graph`), so a shape
//! mistake fails at the line that made it, naming the node.

use crate::ir::GraphExt as _;
use kiln_runtime::graph::{BinaryOp, Dim, Graph, InputRole, InputSpec, Op, ReduceOp, UnaryOp, ValueId, WeightSpec};
use kiln_runtime::{DType, Error, Result};

#[derive(Default)]
pub struct GraphBuilder {
    g: Graph,
    scope: Vec<String>,
    counter: usize,
    /// Weight name → its weight-table index and node: `weight` is O(1), so a graph with N
    /// weights builds in O(N) (a linear search made a 10,000-layer config hang).
    weights: std::collections::HashMap<String, (usize, ValueId)>,
}

impl GraphBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Names nodes made inside `f` with a `prefix.` (e.g. `layer3.attn`).
    pub fn scoped<T>(&mut self, prefix: &str, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.scope.push(prefix.to_string());
        let r = f(self);
        self.scope.pop();
        r
    }

    fn name(&mut self, base: &str) -> String {
        self.counter += 1;
        let mut s = self.scope.join(".");
        if !s.is_empty() {
            s.push('.');
        }
        s.push_str(base);
        s.push('_');
        s.push_str(&self.counter.to_string());
        s
    }

    fn push(&mut self, base: &str, op: Op, inputs: Vec<ValueId>) -> Result<ValueId> {
        let name = self.name(base);
        self.g.push(name, op, inputs)
    }

    pub fn shape(&self, v: ValueId) -> &[Dim] {
        &self.g.node(v).shape
    }
    pub fn dtype(&self, v: ValueId) -> DType {
        self.g.node(v).dtype
    }

    pub fn input(&mut self, name: &str, dtype: DType, shape: Vec<Dim>, role: InputRole) -> Result<ValueId> {
        self.g.inputs.push(InputSpec { name: name.into(), dtype, shape, role });
        let index = self.g.inputs.len() - 1;
        self.g.push(name.to_string(), Op::Input { index }, vec![])
    }

    /// A checkpoint tensor; the same name twice gives the same weight-table entry.
    pub fn weight(&mut self, name: &str, dtype: DType, shape: &[usize]) -> Result<ValueId> {
        let spec = WeightSpec::new(name, dtype, shape.to_vec());
        if let Some(&(i, v)) = self.weights.get(name) {
            if self.g.weights[i] != spec {
                return Err(Error::graph(
                    name,
                    format!("weight declared twice with different types: {:?} vs {:?}", self.g.weights[i], spec),
                ));
            }
            return Ok(v);
        }
        self.g.weights.push(spec);
        let index = self.g.weights.len() - 1;
        let v = self.g.push(name.to_string(), Op::Weight { index }, vec![])?;
        self.weights.insert(name.to_string(), (index, v));
        Ok(v)
    }

    /// An f32 scalar constant (broadcasts against anything).
    pub fn scalar(&mut self, v: f32) -> Result<ValueId> {
        self.push("const", Op::Constant { values: vec![v] }, vec![])
    }

    /// An f32 constant tensor of a fixed shape.
    pub fn constant(&mut self, values: Vec<f32>, shape: &[usize]) -> Result<ValueId> {
        let name = self.name("const");
        let dims: Vec<Dim> = shape.iter().map(|&d| Dim::Fixed(d)).collect();
        self.push_shaped(name, Op::Constant { values }, vec![], dims)
    }

    fn push_shaped(&mut self, name: String, op: Op, inputs: Vec<ValueId>, shape: Vec<Dim>) -> Result<ValueId> {
        self.g.push_shaped(name, op, inputs, Some(shape))
    }

    pub fn matmul(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.push("matmul", Op::MatMul { transpose_a: false, transpose_b: false }, vec![a, b])
    }
    pub fn matmul_t(&mut self, a: ValueId, b: ValueId, transpose_a: bool, transpose_b: bool) -> Result<ValueId> {
        self.push("matmul", Op::MatMul { transpose_a, transpose_b }, vec![a, b])
    }
    /// `x @ wᵀ + bias`: a PyTorch `nn.Linear` with weight `[out, in]`.
    pub fn linear(&mut self, x: ValueId, w: ValueId, bias: Option<ValueId>) -> Result<ValueId> {
        let y = self.matmul_t(x, w, false, true)?;
        match bias {
            Some(b) => self.add(y, b),
            None => Ok(y),
        }
    }
    pub fn binary(&mut self, op: BinaryOp, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.push(&format!("{op:?}").to_lowercase(), Op::Binary(op), vec![a, b])
    }
    pub fn add(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Add, a, b)
    }
    pub fn sub(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Sub, a, b)
    }
    pub fn mul(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Mul, a, b)
    }
    pub fn div(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Div, a, b)
    }
    pub fn max(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.binary(BinaryOp::Max, a, b)
    }
    pub fn unary(&mut self, op: UnaryOp, x: ValueId) -> Result<ValueId> {
        self.push(&format!("{op:?}").to_lowercase(), Op::Unary(op), vec![x])
    }
    pub fn gelu(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary(UnaryOp::Gelu, x)
    }
    pub fn tanh(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary(UnaryOp::Tanh, x)
    }
    pub fn relu(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary(UnaryOp::Relu, x)
    }
    pub fn silu(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary(UnaryOp::Silu, x)
    }
    pub fn exp(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary(UnaryOp::Exp, x)
    }
    pub fn sqrt(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary(UnaryOp::Sqrt, x)
    }
    pub fn rsqrt(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary(UnaryOp::Rsqrt, x)
    }
    pub fn softmax(&mut self, x: ValueId, axis: usize, mask: Option<ValueId>) -> Result<ValueId> {
        let mut inputs = vec![x];
        inputs.extend(mask);
        self.push("softmax", Op::Softmax { axis }, inputs)
    }
    pub fn layer_norm(&mut self, x: ValueId, gamma: ValueId, beta: ValueId, eps: f32) -> Result<ValueId> {
        self.push("layer_norm", Op::LayerNorm { eps }, vec![x, gamma, beta])
    }
    pub fn rms_norm(&mut self, x: ValueId, gamma: ValueId, eps: f32) -> Result<ValueId> {
        self.push("rms_norm", Op::RmsNorm { eps }, vec![x, gamma])
    }
    pub fn reshape(&mut self, x: ValueId, shape: Vec<Dim>) -> Result<ValueId> {
        let name = self.name("reshape");
        self.push_shaped(name, Op::Reshape, vec![x], shape)
    }
    pub fn transpose(&mut self, x: ValueId, perm: &[usize]) -> Result<ValueId> {
        self.push("transpose", Op::Transpose { perm: perm.to_vec() }, vec![x])
    }
    pub fn gather(&mut self, table: ValueId, ids: ValueId) -> Result<ValueId> {
        self.push("gather", Op::Gather, vec![table, ids])
    }
    pub fn concat(&mut self, xs: &[ValueId], axis: usize) -> Result<ValueId> {
        self.push("concat", Op::Concat { axis }, xs.to_vec())
    }
    pub fn slice(&mut self, x: ValueId, axis: usize, start: usize, end: Dim) -> Result<ValueId> {
        self.push("slice", Op::Slice { axis, start, end }, vec![x])
    }
    pub fn reduce(&mut self, op: ReduceOp, x: ValueId, axes: &[usize], keep_dims: bool) -> Result<ValueId> {
        self.push(
            &format!("reduce_{op:?}").to_lowercase(),
            Op::Reduce { op, axes: axes.to_vec(), keep_dims },
            vec![x],
        )
    }
    pub fn reduce_sum(&mut self, x: ValueId, axes: &[usize], keep_dims: bool) -> Result<ValueId> {
        self.reduce(ReduceOp::Sum, x, axes, keep_dims)
    }
    pub fn reduce_mean(&mut self, x: ValueId, axes: &[usize], keep_dims: bool) -> Result<ValueId> {
        self.reduce(ReduceOp::Mean, x, axes, keep_dims)
    }
    pub fn where_(&mut self, cond: ValueId, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.push("where", Op::Where, vec![cond, a, b])
    }
    pub fn cast(&mut self, x: ValueId, to: DType) -> Result<ValueId> {
        self.push("cast", Op::Cast { to }, vec![x])
    }

    pub fn output(&mut self, name: &str, v: ValueId) {
        self.g.outputs.push(v);
        self.g.output_names.push(name.into());
    }

    /// Finishes the graph, validating it once more as a whole.
    pub fn finish(self) -> Result<Graph> {
        self.g.validate(None)?;
        Ok(self.g)
    }
}
