//! The expression DAG of one fused kernel, built from graph nodes.

use kiln_runtime::graph::{BinaryOp, Graph, Op};
use kiln_runtime::{DType, Result};

use super::*;

/// Builds one kernel's expression DAG from graph nodes.
pub(super) struct ExprBuilder<'m> {
    nodes: Vec<ExprNode>,
    memo: HashMap<usize, ExprId>,
    consts: HashMap<u32, ExprId>,
    loads: HashMap<usize, usize>,
    members: &'m HashSet<usize>,
    /// The graph node whose value is the GEMM accumulator.
    acc: Option<usize>,
    iter: Vec<usize>,
}

impl<'m> ExprBuilder<'m> {
    pub(super) fn new(members: &'m HashSet<usize>, acc: Option<usize>, iter: &[usize]) -> Self {
        ExprBuilder {
            nodes: Vec::new(),
            memo: HashMap::new(),
            consts: HashMap::new(),
            loads: HashMap::new(),
            members,
            acc,
            iter: iter.to_vec(),
        }
    }

    pub(super) fn push(&mut self, n: ExprNode) -> ExprId {
        self.nodes.push(n);
        (self.nodes.len() - 1) as ExprId
    }

    pub(super) fn constant(&mut self, c: f32) -> ExprId {
        if let Some(&e) = self.consts.get(&c.to_bits()) {
            return e;
        }
        let e = self.push(ExprNode::Const(c));
        self.consts.insert(c.to_bits(), e);
        e
    }

    /// The expression of graph value `v`; values outside the group become loads of `inputs`.
    pub(super) fn value(&mut self, f: &mut Fuser, v: usize, inputs: &mut Vec<BufferView>) -> Result<ExprId> {
        if let Some(&e) = self.memo.get(&v) {
            return Ok(e);
        }
        let g = f.g;
        let e = if Some(v) == self.acc {
            self.push(ExprNode::Acc)
        } else if self.members.contains(&v) {
            let n = &g.nodes[v];
            let mut args = Vec::new();
            for a in &n.inputs {
                args.push(self.value(f, a.index(), inputs)?);
            }
            match &n.op {
                Op::Binary(op) => {
                    let e = self.push(ExprNode::Binary(*op, args[0], args[1]));
                    if *op == BinaryOp::Div && n.dtype.is_int() {
                        self.push(ExprNode::Cast(n.dtype, e))
                    } else {
                        e
                    }
                }
                Op::Unary(op) => self.push(ExprNode::Unary(*op, args[0])),
                Op::Where => self.push(ExprNode::Select(args[0], args[1], args[2])),
                Op::Cast { to } => {
                    if *to == DType::F32 {
                        args[0]
                    } else {
                        self.push(ExprNode::Cast(*to, args[0]))
                    }
                }
                other => return Err(internal(format!("{} cannot be part of an expression", other.name()))),
            }
        } else if let Some(c) = scalar_constant(g, v) {
            self.constant(c)
        } else {
            let k = match self.loads.get(&v) {
                Some(&k) => k,
                None => {
                    let view = f.view_of(v)?;
                    let t = fit_to(&view, &self.iter).ok_or_else(|| {
                        internal(format!("{} {:?} does not broadcast to {:?}", g.nodes[v].name, view.shape, self.iter))
                    })?;
                    inputs.push(t);
                    self.loads.insert(v, inputs.len() - 1);
                    inputs.len() - 1
                }
            };
            self.push(ExprNode::Load(k))
        };
        self.memo.insert(v, e);
        Ok(e)
    }

    pub(super) fn finish(self, root: ExprId) -> Expr {
        // Keep only what the root needs, renumbered (it is already topological).
        let mut needed = vec![false; self.nodes.len()];
        needed[root as usize] = true;
        for i in (0..self.nodes.len()).rev() {
            if !needed[i] {
                continue;
            }
            match &self.nodes[i] {
                ExprNode::Unary(_, a) | ExprNode::Cast(_, a) => needed[*a as usize] = true,
                ExprNode::Binary(_, a, b) => {
                    needed[*a as usize] = true;
                    needed[*b as usize] = true;
                }
                ExprNode::Select(c, a, b) => {
                    needed[*c as usize] = true;
                    needed[*a as usize] = true;
                    needed[*b as usize] = true;
                }
                _ => {}
            }
        }
        let mut remap = vec![0 as ExprId; self.nodes.len()];
        let mut out = Vec::new();
        for (i, n) in self.nodes.into_iter().enumerate() {
            if !needed[i] || i > root as usize {
                continue;
            }
            let m = |x: &ExprId| remap[*x as usize];
            let n = match n {
                ExprNode::Unary(op, a) => ExprNode::Unary(op, m(&a)),
                ExprNode::Cast(t, a) => ExprNode::Cast(t, m(&a)),
                ExprNode::Binary(op, a, b) => ExprNode::Binary(op, m(&a), m(&b)),
                ExprNode::Select(c, a, b) => ExprNode::Select(m(&c), m(&a), m(&b)),
                other => other,
            };
            remap[i] = out.len() as ExprId;
            out.push(n);
        }
        Expr { nodes: out }
    }
}

pub(super) fn scalar_constant(g: &Graph, v: usize) -> Option<f32> {
    match &g.nodes[v].op {
        Op::Constant { values } if values.len() == 1 => Some(values[0]),
        _ => None,
    }
}
