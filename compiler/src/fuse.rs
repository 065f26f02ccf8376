//! Fusion: a specialized, simplified graph → a [`KernelProgram`] of kernels that each run as
//! one loop nest.
//!
//! # How nodes become kernels
//! 1. **Attention** is matched first: `matmul(softmax(scale·matmul(Q, Kᵀ) + mask), V)` (scale
//!    by any chain of scalar `mul`/`div`, also peeled off Q or K; the mask by an `add` before
//!    the softmax or the softmax's own mask input; every intermediate single-use) becomes one
//!    [`KernelOp::Attention`].
//! 2. Every other node is grouped in reverse topological order: a node joins the group of its
//!    users when ALL its users are in one group, it is not a graph output, and the group takes
//!    it:
//!    - elementwise nodes (`binary`, `unary`, `where`, `cast`) of the group's iteration size
//!      join elementwise groups (chains and DAGs of any length, broadcasting through views), GEMM
//!      epilogues (bias, activation, residual, scale…), and the prologues of norm, softmax and
//!      reduce kernels (the residual add before a LayerNorm; scale and mask before a softmax);
//!    - a `matmul` becomes the core of an elementwise group of its output size (GEMM +
//!      epilogue); a scalar `mul`/`div` right after it becomes the GEMM's `alpha`;
//!    - norms, softmax, reduce, gather and concat start their own group (their output is
//!      always written by them).
//! 3. Layout ops never run as kernels when they can be views: `reshape` of a contiguous (or
//!    mergeable) view, `transpose` (permuted strides) and `slice` (offset) are folded into the
//!    strides of their consumers, including the A/B operands of GEMMs and the Q/K/V operands
//!    of attention. A producer whose only user is a transpose writes the transposed layout
//!    directly (e.g. attention writing `[batch, seq, heads, dim]`). Only a reshape of a view
//!    that strides cannot express is materialized, by a copy kernel.
//! 4. A GEMM whose B operand is shared over the batch dims has those dims merged into `m`
//!    when the strides allow (one `[batch·seq, k] × [k, n]` GEMM for a linear layer).
//! 5. Graph outputs are written by their producing kernel straight into the output buffer, or
//!    copied there when they are inputs, weights, strided views or repeated.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use kiln_runtime::graph::{BinaryOp, Bucket, Graph, Op};
use kiln_runtime::{DType, Error, Result};
use serde::{Deserialize, Serialize};

use crate::kernel_ir::*;
use crate::passes::fixed_shape;

/// How a group's kernel is built.
#[derive(Debug, Clone)]
enum GroupKind {
    Elementwise,
    Gemm { core: usize },
    Norm { core: usize },
    Softmax { core: usize },
    Reduce { core: usize },
    Gather { core: usize },
    Concat { core: usize },
    Attention(Box<AttnMatch>),
}

#[derive(Debug, Clone)]
struct Group {
    root: usize,
    kind: GroupKind,
    /// Element count of the iteration space elementwise members must match.
    iter_numel: usize,
    members: Vec<usize>,
}

#[derive(Debug, Clone)]
struct AttnMatch {
    qk: usize,
    pv: usize,
    q: usize,
    k: usize,
    v: usize,
    scale: f32,
    mask: Option<usize>,
    members: Vec<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Leaf,
    View,
    Elem,
    MatMul,
    Norm,
    Softmax,
    Reduce,
    Gather,
    Concat,
}

fn class(op: &Op) -> Class {
    match op {
        // A precompiled output never gets here: validation refuses it before any pass.
        Op::Input { .. } | Op::Weight { .. } | Op::Constant { .. } | Op::Precompiled { .. } => Class::Leaf,
        Op::Reshape | Op::Transpose { .. } | Op::Slice { .. } => Class::View,
        Op::Binary(_) | Op::Unary(_) | Op::Where | Op::Cast { .. } => Class::Elem,
        Op::MatMul { .. } => Class::MatMul,
        Op::LayerNorm { .. } | Op::RmsNorm { .. } => Class::Norm,
        Op::Softmax { .. } => Class::Softmax,
        Op::Reduce { .. } => Class::Reduce,
        Op::Gather => Class::Gather,
        Op::Concat { .. } => Class::Concat,
    }
}

fn internal(msg: impl Into<String>) -> Error {
    Error::internal("fuse", msg)
}

fn swap_last_two(t: &BufferView) -> BufferView {
    let r = t.rank();
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(r - 2, r - 1);
    t.permute(&perm)
}

/// Fits a view to `shape`: drops leading size-1 dims beyond `shape`'s rank, then broadcasts.
fn fit_to(t: &BufferView, shape: &[usize]) -> Option<BufferView> {
    let mut t = t.clone();
    while t.rank() > shape.len() && t.shape[0] == 1 {
        t.shape.remove(0);
        t.strides.remove(0);
    }
    t.broadcast_to(shape)
}

struct Fuser<'a> {
    g: &'a Graph,
    bucket: Bucket,
    layouts: &'a [WeightLayout],
    shapes: Vec<Vec<usize>>,
    /// Distinct user nodes of every node.
    users: Vec<Vec<usize>>,
    use_count: Vec<usize>,
    is_output: Vec<bool>,
    group_of: Vec<Option<usize>>,
    groups: Vec<Group>,
    buffers: Vec<Buffer>,
    kernels: Vec<Kernel>,
    views: Vec<Option<BufferView>>,
    input_bufs: Vec<Option<BufferId>>,
    weight_bufs: Vec<Option<BufferId>>,
    output_bufs: Vec<Option<BufferId>>,
}

/// Builds one kernel's expression DAG from graph nodes.
struct ExprBuilder<'m> {
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
    fn new(members: &'m HashSet<usize>, acc: Option<usize>, iter: &[usize]) -> Self {
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

    fn push(&mut self, n: ExprNode) -> ExprId {
        self.nodes.push(n);
        (self.nodes.len() - 1) as ExprId
    }

    fn constant(&mut self, c: f32) -> ExprId {
        if let Some(&e) = self.consts.get(&c.to_bits()) {
            return e;
        }
        let e = self.push(ExprNode::Const(c));
        self.consts.insert(c.to_bits(), e);
        e
    }

    /// The expression of graph value `v`; values outside the group become loads of `inputs`.
    fn value(&mut self, f: &mut Fuser, v: usize, inputs: &mut Vec<BufferView>) -> Result<ExprId> {
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

    fn finish(self, root: ExprId) -> Expr {
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

fn scalar_constant(g: &Graph, v: usize) -> Option<f32> {
    match &g.nodes[v].op {
        Op::Constant { values } if values.len() == 1 => Some(values[0]),
        _ => None,
    }
}

impl<'a> Fuser<'a> {
    fn new(g: &'a Graph, bucket: Bucket, layouts: &'a [WeightLayout]) -> Result<Self> {
        let n = g.nodes.len();
        let mut shapes = Vec::with_capacity(n);
        for node in &g.nodes {
            shapes.push(fixed_shape(&node.shape).ok_or_else(|| {
                Error::graph(&node.name, "fusion needs concrete shapes: run the `specialize` pass first")
            })?);
        }
        let mut users = vec![Vec::new(); n];
        let mut use_count = vec![0; n];
        for (i, node) in g.nodes.iter().enumerate() {
            for v in &node.inputs {
                use_count[v.index()] += 1;
                if users[v.index()].last() != Some(&i) {
                    users[v.index()].push(i);
                }
            }
        }
        let mut is_output = vec![false; n];
        for o in &g.outputs {
            is_output[o.index()] = true;
            use_count[o.index()] += 1;
        }
        if layouts.len() != g.weights.len() {
            return Err(internal("one layout decision per weight is needed"));
        }
        Ok(Fuser {
            g,
            bucket,
            layouts,
            shapes,
            users,
            use_count,
            is_output,
            group_of: vec![None; n],
            groups: Vec::new(),
            buffers: Vec::new(),
            kernels: Vec::new(),
            views: vec![None; n],
            input_bufs: vec![None; g.inputs.len()],
            weight_bufs: vec![None; g.weights.len()],
            output_bufs: vec![None; g.outputs.len()],
        })
    }

    fn numel(&self, v: usize) -> usize {
        self.shapes[v].iter().product()
    }

    fn single_use(&self, v: usize) -> bool {
        self.use_count[v] == 1 && !self.is_output[v]
    }

    /// `x * c`, `c * x` or `x / c` with a scalar constant `c` that keeps x's shape: (x, factor).
    fn scalar_scale(&self, v: usize) -> Option<(usize, f32)> {
        let n = &self.g.nodes[v];
        let (a, b) = match n.op {
            Op::Binary(BinaryOp::Mul) | Op::Binary(BinaryOp::Div) => (n.inputs[0].index(), n.inputs[1].index()),
            _ => return None,
        };
        if n.dtype != DType::F32 {
            return None;
        }
        let r = match n.op {
            Op::Binary(BinaryOp::Mul) => match (scalar_constant(self.g, a), scalar_constant(self.g, b)) {
                (_, Some(c)) => Some((a, c)),
                (Some(c), None) => Some((b, c)),
                _ => None,
            },
            _ => scalar_constant(self.g, b).map(|c| (a, 1.0 / c)),
        }?;
        (self.shapes[r.0] == self.shapes[v]).then_some(r)
    }

    // ---------------------------------------------------------------- grouping

    fn match_attention(&self, pv: usize) -> Option<AttnMatch> {
        let n = &self.g.nodes[pv];
        let Op::MatMul { transpose_a: false, .. } = n.op else { return None };
        if n.dtype != DType::F32 {
            return None;
        }
        let (p, v) = (n.inputs[0].index(), n.inputs[1].index());
        let sm = &self.g.nodes[p];
        let Op::Softmax { axis } = sm.op else { return None };
        if axis + 1 != self.shapes[p].len() || !self.single_use(p) {
            return None;
        }
        let mut members = vec![pv, p];
        let mut mask = sm.inputs.get(1).map(|m| m.index());
        let mut scale = 1.0f32;
        let mut saw_scale = false;
        let mut cur = sm.inputs[0].index();
        let qk = loop {
            if !self.single_use(cur) || self.group_of[cur].is_some() {
                return None;
            }
            members.push(cur);
            let c = &self.g.nodes[cur];
            match c.op {
                Op::MatMul { .. } => break cur,
                Op::Binary(BinaryOp::Mul) | Op::Binary(BinaryOp::Div) => {
                    let (x, f) = self.scalar_scale(cur)?;
                    scale *= f;
                    saw_scale = true;
                    cur = x;
                }
                Op::Binary(BinaryOp::Add) => {
                    if saw_scale || mask.is_some() {
                        return None;
                    }
                    let (a, b) = (c.inputs[0].index(), c.inputs[1].index());
                    let chainy = |x: usize| {
                        matches!(self.g.nodes[x].op, Op::MatMul { .. } | Op::Binary(_)) && self.single_use(x)
                    };
                    let (chain, m) = if chainy(a) && self.shapes[a] == self.shapes[cur] {
                        (a, b)
                    } else if chainy(b) && self.shapes[b] == self.shapes[cur] {
                        (b, a)
                    } else {
                        return None;
                    };
                    mask = Some(m);
                    cur = chain;
                }
                _ => return None,
            }
        };
        let Op::MatMul { transpose_a: qt, .. } = self.g.nodes[qk].op else { return None };
        if qt {
            return None;
        }
        let (mut q, mut k) = (self.g.nodes[qk].inputs[0].index(), self.g.nodes[qk].inputs[1].index());
        // Scalar scales on Q or K fold into the attention scale.
        for side in [&mut q, &mut k] {
            while self.single_use(*side) && self.group_of[*side].is_none() {
                match self.scalar_scale(*side) {
                    Some((x, f)) => {
                        members.push(*side);
                        scale *= f;
                        *side = x;
                    }
                    None => break,
                }
            }
        }
        let scores = &self.shapes[qk];
        let out = &self.shapes[pv];
        let r = scores.len();
        if out.len() != r || out[..r - 2] != scores[..r - 2] {
            return None;
        }
        if let Some(m) = mask {
            if self.g.nodes[m].dtype != DType::F32 {
                return None;
            }
        }
        members.sort_unstable();
        members.dedup();
        Some(AttnMatch { qk, pv, q, k, v, scale, mask, members })
    }

    /// Whether elementwise node `v` ends a chain of single-use, same-size elementwise nodes
    /// that starts at a single-use, ungrouped MatMul (a GEMM epilogue candidate).
    fn gemm_fed(&self, v: usize) -> bool {
        let numel = self.numel(v);
        self.g.nodes[v].inputs.iter().any(|a| {
            let a = a.index();
            if !self.single_use(a) || self.group_of[a].is_some() || self.numel(a) != numel {
                return false;
            }
            match class(&self.g.nodes[a].op) {
                Class::MatMul => true,
                Class::Elem => self.gemm_fed(a),
                _ => false,
            }
        })
    }

    fn add_group(&mut self, root: usize, kind: GroupKind, iter_numel: usize, members: Vec<usize>) {
        let gid = self.groups.len();
        for &m in &members {
            self.group_of[m] = Some(gid);
        }
        self.groups.push(Group { root, kind, iter_numel, members });
    }

    fn join(&mut self, gid: usize, v: usize) {
        self.group_of[v] = Some(gid);
        self.groups[gid].members.push(v);
    }

    fn group_nodes(&mut self) {
        let n = self.g.nodes.len();
        // Attention first (its intermediates would otherwise be claimed by other groups).
        for i in (0..n).rev() {
            if self.group_of[i].is_none() && matches!(self.g.nodes[i].op, Op::MatMul { .. }) {
                if let Some(m) = self.match_attention(i) {
                    let members = m.members.clone();
                    let numel = self.numel(i);
                    self.add_group(i, GroupKind::Attention(Box::new(m)), numel, members);
                }
            }
        }
        for i in (0..n).rev() {
            if self.group_of[i].is_some() {
                continue;
            }
            let c = class(&self.g.nodes[i].op);
            if matches!(c, Class::Leaf | Class::View) {
                continue;
            }
            // The one group holding every user, if any.
            let users_group = if self.is_output[i] || self.users[i].is_empty() {
                None
            } else {
                let gs: HashSet<Option<usize>> = self.users[i].iter().map(|&u| self.group_of[u]).collect();
                if gs.len() == 1 {
                    *gs.iter().next().unwrap()
                } else {
                    None
                }
            };
            let numel = self.numel(i);
            if let Some(gid) = users_group {
                let gr = &self.groups[gid];
                let fits = gr.iter_numel == numel;
                let joins = match (&gr.kind, c) {
                    (GroupKind::Elementwise, Class::Elem) => fits,
                    (GroupKind::Gemm { core }, Class::Elem) => {
                        fits && !self.g.nodes[*core].inputs.iter().any(|v| v.index() == i)
                    }
                    // A prologue takes elementwise producers, except a chain that a GEMM's
                    // epilogue can take (bias + residual go into the GEMM's output write).
                    (GroupKind::Norm { core }, Class::Elem) => {
                        fits && !self.g.nodes[*core].inputs[1..].iter().any(|v| v.index() == i) && !self.gemm_fed(i)
                    }
                    (GroupKind::Softmax { .. } | GroupKind::Reduce { .. }, Class::Elem) => fits && !self.gemm_fed(i),
                    (GroupKind::Elementwise, Class::MatMul) => fits,
                    _ => false,
                };
                if joins {
                    if c == Class::MatMul {
                        self.groups[gid].kind = GroupKind::Gemm { core: i };
                    }
                    self.join(gid, i);
                    continue;
                }
            }
            let (kind, iter_numel) = match c {
                Class::Elem => (GroupKind::Elementwise, numel),
                Class::MatMul => (GroupKind::Gemm { core: i }, numel),
                Class::Norm => (GroupKind::Norm { core: i }, numel),
                Class::Softmax => (GroupKind::Softmax { core: i }, numel),
                Class::Reduce => (GroupKind::Reduce { core: i }, self.numel(self.g.nodes[i].inputs[0].index())),
                Class::Gather => (GroupKind::Gather { core: i }, numel),
                Class::Concat => (GroupKind::Concat { core: i }, numel),
                Class::Leaf | Class::View => unreachable!(),
            };
            self.add_group(i, kind, iter_numel, vec![i]);
        }
    }

    // ---------------------------------------------------------------- buffers and views

    fn new_buffer(&mut self, name: &str, dtype: DType, shape: &[usize], kind: BufferKind) -> BufferId {
        self.buffers.push(Buffer { name: name.to_string(), dtype, shape: shape.to_vec(), kind });
        BufferId((self.buffers.len() - 1) as u32)
    }

    /// The view of a materialized value (leaf, group root, or a view op over those).
    fn view_of(&mut self, v: usize) -> Result<BufferView> {
        if let Some(t) = &self.views[v] {
            return Ok(t.clone());
        }
        let g = self.g;
        let n = &g.nodes[v];
        let shape = self.shapes[v].clone();
        let t = match &n.op {
            Op::Input { index } => {
                let b = match self.input_bufs[*index] {
                    Some(b) => b,
                    None => {
                        let b = self.new_buffer(&n.name, n.dtype, &shape, BufferKind::Input { index: *index });
                        self.input_bufs[*index] = Some(b);
                        b
                    }
                };
                BufferView::dense(b, &shape)
            }
            Op::Weight { index } => {
                let layout = self.layouts[*index];
                let stored: Vec<usize> = match layout {
                    WeightLayout::Transposed => vec![shape[1], shape[0]],
                    WeightLayout::AsIs => shape.clone(),
                };
                let b = match self.weight_bufs[*index] {
                    Some(b) => b,
                    None => {
                        let name = g.weights[*index].name.clone();
                        let b = self.new_buffer(&name, n.dtype, &stored, BufferKind::Weight { index: *index, layout });
                        self.weight_bufs[*index] = Some(b);
                        b
                    }
                };
                match layout {
                    WeightLayout::Transposed => BufferView::dense(b, &stored).permute(&[1, 0]),
                    WeightLayout::AsIs => BufferView::dense(b, &shape),
                }
            }
            Op::Constant { values } => {
                let b = self.new_buffer(&n.name, DType::F32, &shape, BufferKind::Constant { values: values.clone() });
                BufferView::dense(b, &shape)
            }
            Op::Reshape => {
                let x = self.view_of(n.inputs[0].index())?;
                match x.reshape(&shape) {
                    Some(t) => t,
                    None => {
                        let name = format!("{}.copy", n.name);
                        let c = self.emit_copy(&name, n.dtype, &x, std::slice::from_ref(&n.name))?;
                        c.reshape(&shape).ok_or_else(|| internal("reshape of a dense copy failed"))?
                    }
                }
            }
            Op::Transpose { perm } => self.view_of(n.inputs[0].index())?.permute(perm),
            Op::Slice { axis, start, end } => {
                let x = self.view_of(n.inputs[0].index())?;
                let end = end.resolve(self.bucket);
                x.slice(*axis, *start, end - start)
            }
            _ => return Err(internal(format!("value {} used before its kernel was emitted", n.name))),
        };
        self.views[v] = Some(t.clone());
        Ok(t)
    }

    /// A copy kernel materializing `x` densely in a new arena buffer.
    fn emit_copy(&mut self, name: &str, dtype: DType, x: &BufferView, fused: &[String]) -> Result<BufferView> {
        let b = self.new_buffer(name, dtype, &x.shape, BufferKind::Arena);
        let out = BufferView::dense(b, &x.shape);
        self.kernels.push(Kernel {
            name: name.to_string(),
            op: KernelOp::Elementwise { expr: Expr { nodes: vec![ExprNode::Load(0)] } },
            inputs: vec![x.clone()],
            output: out.clone(),
            fused: fused.to_vec(),
        });
        Ok(out)
    }

    /// The output buffer of group root `r`, and the view the kernel writes. `sink` allows
    /// writing the layout of a transpose that is `r`'s only user.
    fn alloc_output(&mut self, r: usize, sink: bool) -> BufferView {
        let g = self.g;
        let n = &g.nodes[r];
        let shape = self.shapes[r].clone();
        if let Some(oi) = (0..self.g.outputs.len()).find(|&oi| self.g.outputs[oi].index() == r && self.output_bufs[oi].is_none()) {
            let b = self.new_buffer(&self.g.output_names[oi].clone(), n.dtype, &shape, BufferKind::Output { index: oi });
            self.output_bufs[oi] = Some(b);
            let t = BufferView::dense(b, &shape);
            self.views[r] = Some(t.clone());
            return t;
        }
        if sink && !self.is_output[r] && self.use_count[r] == 1 {
            let u = self.users[r][0];
            if let Op::Transpose { perm } = &g.nodes[u].op {
                let tshape = self.shapes[u].clone();
                let b = self.new_buffer(&n.name, n.dtype, &tshape, BufferKind::Arena);
                let mut inv = vec![0; perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    inv[p] = i;
                }
                let t = BufferView::dense(b, &tshape).permute(&inv);
                self.views[r] = Some(t.clone());
                return t;
            }
        }
        let b = self.new_buffer(&n.name, n.dtype, &shape, BufferKind::Arena);
        let t = BufferView::dense(b, &shape);
        self.views[r] = Some(t.clone());
        t
    }

    // ---------------------------------------------------------------- kernels

    fn emit_group(&mut self, gid: usize) -> Result<()> {
        let g = self.g;
        let group = self.groups[gid].clone();
        let mut members_sorted = group.members.clone();
        members_sorted.sort_unstable();
        let fused: Vec<String> = members_sorted.iter().map(|&m| g.nodes[m].name.clone()).collect();
        let members: HashSet<usize> = group.members.iter().copied().collect();
        let r = group.root;
        let name = g.nodes[r].name.clone();
        let mut inputs = Vec::new();
        let (op, output) = match &group.kind {
            GroupKind::Elementwise => {
                let iter = self.shapes[r].clone();
                let mut eb = ExprBuilder::new(&members, None, &iter);
                let root = eb.value(self, r, &mut inputs)?;
                let expr = eb.finish(root);
                let out = self.alloc_output(r, true);
                (KernelOp::Elementwise { expr }, out)
            }
            GroupKind::Gemm { core } => self.build_gemm(*core, r, &members, &mut inputs)?,
            GroupKind::Norm { core } => {
                let c = &g.nodes[*core];
                let iter = self.shapes[*core].clone();
                let (x, gamma_v, beta_v) = (c.inputs[0].index(), c.inputs[1].index(), c.inputs.get(2).map(|v| v.index()));
                let (kind, eps) = match c.op {
                    Op::LayerNorm { eps } => (NormKind::LayerNorm, eps),
                    Op::RmsNorm { eps } => (NormKind::RmsNorm, eps),
                    _ => unreachable!(),
                };
                let mut eb = ExprBuilder::new(&members, None, &iter);
                let root = eb.value(self, x, &mut inputs)?;
                let prologue = eb.finish(root);
                inputs.push(self.view_of(gamma_v)?);
                let gamma = inputs.len() - 1;
                let beta = match beta_v {
                    Some(b) => {
                        inputs.push(self.view_of(b)?);
                        Some(inputs.len() - 1)
                    }
                    None => None,
                };
                let out = self.alloc_output(r, false);
                (KernelOp::Norm { kind, eps, prologue, gamma, beta }, out)
            }
            GroupKind::Softmax { core } => {
                let c = &g.nodes[*core];
                let Op::Softmax { axis } = c.op else { unreachable!() };
                let iter = self.shapes[*core].clone();
                let mut eb = ExprBuilder::new(&members, None, &iter);
                let mut root = eb.value(self, c.inputs[0].index(), &mut inputs)?;
                if let Some(m) = c.inputs.get(1) {
                    let me = eb.value(self, m.index(), &mut inputs)?;
                    root = eb.push(ExprNode::Binary(BinaryOp::Add, root, me));
                }
                let prologue = eb.finish(root);
                let mut out = self.alloc_output(r, false);
                let rank = iter.len();
                if axis + 1 != rank {
                    // Move the softmax axis last in every view.
                    let perm: Vec<usize> = (0..rank).filter(|&d| d != axis).chain([axis]).collect();
                    for t in inputs.iter_mut() {
                        *t = t.permute(&perm);
                    }
                    out = out.permute(&perm);
                }
                (KernelOp::Softmax { prologue }, out)
            }
            GroupKind::Reduce { core } => {
                let c = &g.nodes[*core];
                let Op::Reduce { op, axes, .. } = c.op.clone() else { unreachable!() };
                let x = c.inputs[0].index();
                let iter = self.shapes[x].clone();
                let mut eb = ExprBuilder::new(&members, None, &iter);
                let root = eb.value(self, x, &mut inputs)?;
                let prologue = eb.finish(root);
                let kept: Vec<usize> = (0..iter.len()).filter(|d| !axes.contains(d)).collect();
                let perm: Vec<usize> = kept.iter().copied().chain(axes.iter().copied()).collect();
                for t in inputs.iter_mut() {
                    *t = t.permute(&perm);
                }
                let kept_shape: Vec<usize> = kept.iter().map(|&d| iter[d]).collect();
                let out = self.alloc_output(r, false);
                let out = out.reshape(&kept_shape).ok_or_else(|| internal("reduce output view"))?;
                let shape: Vec<usize> = perm.iter().map(|&d| iter[d]).collect();
                (KernelOp::Reduce { op, shape, reduced_dims: axes.len(), prologue }, out)
            }
            GroupKind::Gather { core } => {
                let c = &g.nodes[*core];
                let (t, ids) = (c.inputs[0].index(), c.inputs[1].index());
                inputs.push(self.view_of(t)?);
                inputs.push(self.view_of(ids)?);
                let out = self.alloc_output(r, false);
                (KernelOp::Gather, out)
            }
            GroupKind::Concat { core } => {
                let c = &g.nodes[*core];
                let Op::Concat { axis } = c.op else { unreachable!() };
                for v in c.inputs.clone() {
                    inputs.push(self.view_of(v.index())?);
                }
                let out = self.alloc_output(r, false);
                (KernelOp::Concat { axis }, out)
            }
            GroupKind::Attention(m) => self.build_attention(m, &mut inputs)?,
        };
        self.kernels.push(Kernel { name, op, inputs, output, fused });
        Ok(())
    }

    fn build_gemm(
        &mut self,
        core: usize,
        root: usize,
        members: &HashSet<usize>,
        inputs: &mut Vec<BufferView>,
    ) -> Result<(KernelOp, BufferView)> {
        let g = self.g;
        let c = &g.nodes[core];
        let Op::MatMul { transpose_a, transpose_b } = c.op else { unreachable!() };
        let (av, bv) = (c.inputs[0].index(), c.inputs[1].index());
        let os = self.shapes[core].clone();
        let r = os.len();
        let batch = os[..r - 2].to_vec();
        let (m, n) = (os[r - 2], os[r - 1]);
        // A scalar scale right after the matmul becomes alpha.
        let mut alpha = 1.0f32;
        let mut acc_node = core;
        if self.single_use(core) {
            let u = self.users[core][0];
            if members.contains(&u) {
                if let Some((x, f)) = self.scalar_scale(u) {
                    if x == core {
                        alpha = f;
                        acc_node = u;
                    }
                }
            }
        }
        let mut a = self.view_of(av)?;
        if transpose_a {
            a = swap_last_two(&a);
        }
        let mut b = self.view_of(bv)?;
        if transpose_b {
            b = swap_last_two(&b);
        }
        let k = a.shape[a.rank() - 1];
        let shape_with = |last: [usize; 2]| -> Vec<usize> { batch.iter().copied().chain(last).collect() };
        let a = fit_to(&a, &shape_with([m, k])).ok_or_else(|| internal("gemm A view"))?;
        let b = fit_to(&b, &shape_with([k, n])).ok_or_else(|| internal("gemm B view"))?;
        inputs.push(a);
        inputs.push(b);
        let epilogue = if root == acc_node {
            None
        } else {
            let mut eb = ExprBuilder::new(members, Some(acc_node), &os);
            let e = eb.value(self, root, inputs)?;
            Some(eb.finish(e))
        };
        let out = self.alloc_output(root, true);
        let mut out = out.reshape(&os).ok_or_else(|| internal("gemm output view"))?;
        let mut batch = batch;
        let mut m = m;
        // A B shared over the batch: fold the batch dims into m when every view allows it.
        if !batch.is_empty() && inputs[1].strides[..batch.len()].iter().all(|&s| s == 0) {
            let big_m = batch.iter().product::<usize>() * m;
            let merged: Option<Vec<BufferView>> = std::iter::once(inputs[0].reshape(&[big_m, k]))
                .chain(std::iter::once(Some(BufferView {
                    buffer: inputs[1].buffer,
                    offset: inputs[1].offset,
                    shape: vec![k, n],
                    strides: inputs[1].strides[batch.len()..].to_vec(),
                })))
                .chain(inputs[2..].iter().map(|t| t.reshape(&[big_m, n])))
                .chain(std::iter::once(out.reshape(&[big_m, n])))
                .collect();
            if let Some(mut v) = merged {
                out = v.pop().unwrap();
                *inputs = v;
                batch = Vec::new();
                m = big_m;
            }
        }
        Ok((KernelOp::Gemm { batch, m, n, k, alpha, epilogue }, out))
    }

    fn build_attention(&mut self, am: &AttnMatch, inputs: &mut Vec<BufferView>) -> Result<(KernelOp, BufferView)> {
        let g = self.g;
        let scores = self.shapes[am.qk].clone();
        let r = scores.len();
        let batch = scores[..r - 2].to_vec();
        let (seq_q, seq_kv) = (scores[r - 2], scores[r - 1]);
        let Op::MatMul { transpose_b: k_t, .. } = g.nodes[am.qk].op else { unreachable!() };
        let Op::MatMul { transpose_b: v_t, .. } = g.nodes[am.pv].op else { unreachable!() };
        let q = self.view_of(am.q)?;
        let head_dim = q.shape[q.rank() - 1];
        let mut k = self.view_of(am.k)?;
        if !k_t {
            k = swap_last_two(&k);
        }
        let mut v = self.view_of(am.v)?;
        if v_t {
            v = swap_last_two(&v);
        }
        let v_dim = v.shape[v.rank() - 1];
        let with = |last: [usize; 2]| -> Vec<usize> { batch.iter().copied().chain(last).collect() };
        inputs.push(fit_to(&q, &with([seq_q, head_dim])).ok_or_else(|| internal("attention Q view"))?);
        inputs.push(fit_to(&k, &with([seq_kv, head_dim])).ok_or_else(|| internal("attention K view"))?);
        inputs.push(fit_to(&v, &with([seq_kv, v_dim])).ok_or_else(|| internal("attention V view"))?);
        let mask = match am.mask {
            Some(mv) => {
                let t = self.view_of(mv)?;
                inputs.push(fit_to(&t, &scores).ok_or_else(|| internal("attention mask view"))?);
                Some(inputs.len() - 1)
            }
            None => None,
        };
        let out = self.alloc_output(am.pv, true);
        let out = out.reshape(&with([seq_q, v_dim])).ok_or_else(|| internal("attention output view"))?;
        Ok((KernelOp::Attention { batch, seq_q, seq_kv, head_dim, v_dim, scale: am.scale, mask }, out))
    }

    fn run(mut self) -> Result<KernelProgram> {
        self.group_nodes();
        let mut roots: Vec<usize> = (0..self.groups.len()).collect();
        roots.sort_by_key(|&gid| self.groups[gid].root);
        for gid in roots {
            self.emit_group(gid)?;
        }
        // Outputs not written in place by their kernel.
        for oi in 0..self.g.outputs.len() {
            if self.output_bufs[oi].is_some() {
                continue;
            }
            let o = self.g.outputs[oi].index();
            let view = self.view_of(o)?;
            let shape = self.shapes[o].clone();
            let buf = view.buffer;
            let whole = view.offset == 0
                && view.is_contiguous()
                && view.numel() == self.buffers[buf.index()].numel()
                && self.buffers[buf.index()].is_arena()
                && self.kernels.iter().any(|k| k.output.buffer == buf);
            if whole {
                let b = &mut self.buffers[buf.index()];
                b.kind = BufferKind::Output { index: oi };
                b.shape = shape;
                b.name = self.g.output_names[oi].clone();
                self.output_bufs[oi] = Some(buf);
            } else {
                let name = self.g.output_names[oi].clone();
                let dtype = self.g.nodes[o].dtype;
                let b = self.new_buffer(&name, dtype, &shape, BufferKind::Output { index: oi });
                let x = fit_to(&view, &shape).ok_or_else(|| internal("output view"))?;
                self.kernels.push(Kernel {
                    name: format!("{name}.copy"),
                    op: KernelOp::Elementwise { expr: Expr { nodes: vec![ExprNode::Load(0)] } },
                    inputs: vec![x],
                    output: BufferView::dense(b, &shape),
                    fused: vec![],
                });
                self.output_bufs[oi] = Some(b);
            }
        }
        let program = KernelProgram {
            bucket: self.bucket,
            buffers: self.buffers,
            kernels: self.kernels,
            inputs: self.input_bufs,
            weights: self.weight_bufs,
            outputs: self.output_bufs.into_iter().map(|b| b.expect("every output has a buffer")).collect(),
            output_names: self.g.output_names.clone(),
        };
        program.validate()?;
        Ok(program)
    }
}

/// Fuses a specialized graph (every dim `Fixed`) into kernels. `layouts` holds one layout
/// decision per weight-table entry (from the `layout` pass).
pub fn fuse(graph: &Graph, bucket: Bucket, layouts: &[WeightLayout]) -> Result<KernelProgram> {
    Fuser::new(graph, bucket, layouts)?.run()
}

/// Ops before fusion and kernels after, by kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FusionReport {
    /// Compute and layout nodes of the graph (inputs, weights and constants not counted).
    pub ops: usize,
    pub ops_by_kind: BTreeMap<String, usize>,
    pub kernels: usize,
    pub kernels_by_kind: BTreeMap<String, usize>,
}

/// A short, stable name of an op kind for reports.
pub fn op_kind(op: &Op) -> &'static str {
    match op {
        Op::Input { .. } => "input",
        Op::Weight { .. } => "weight",
        Op::Constant { .. } => "constant",
        Op::MatMul { .. } => "matmul",
        Op::Binary(_) => "binary",
        Op::Unary(_) => "unary",
        Op::Softmax { .. } => "softmax",
        Op::LayerNorm { .. } => "layer_norm",
        Op::RmsNorm { .. } => "rms_norm",
        Op::Reshape => "reshape",
        Op::Transpose { .. } => "transpose",
        Op::Gather => "gather",
        Op::Concat { .. } => "concat",
        Op::Slice { .. } => "slice",
        Op::Reduce { .. } => "reduce",
        Op::Where => "where",
        Op::Cast { .. } => "cast",
        Op::Precompiled { .. } => "precompiled",
    }
}

/// Counts the compute/layout ops of a graph by kind.
pub fn count_ops(graph: &Graph) -> (usize, BTreeMap<String, usize>) {
    let mut m = BTreeMap::new();
    let mut n = 0;
    for node in &graph.nodes {
        if class(&node.op) == Class::Leaf {
            continue;
        }
        n += 1;
        *m.entry(op_kind(&node.op).to_string()).or_insert(0) += 1;
    }
    (n, m)
}

impl FusionReport {
    pub fn new(graph: &Graph, program: &KernelProgram) -> Self {
        let (ops, ops_by_kind) = count_ops(graph);
        FusionReport {
            ops,
            ops_by_kind,
            kernels: program.kernels.len(),
            kernels_by_kind: program.kernels_by_kind().into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        }
    }
}

fn fmt_counts(m: &BTreeMap<String, usize>) -> String {
    m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
}

impl fmt::Display for FusionReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "ops before: {} ({})", self.ops, fmt_counts(&self.ops_by_kind))?;
        write!(f, "kernels after: {} ({})", self.kernels, fmt_counts(&self.kernels_by_kind))
    }
}
