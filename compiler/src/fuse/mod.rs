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
//! 6. On targets that prepare their weights per plan (the CPU), sibling GEMMs (same A) merge
//!    into one GEMM over their concatenated weights ([`merge_siblings`]): attention's Q, K
//!    and V projections.

use std::collections::{HashMap, HashSet};

use kiln_runtime::graph::{Bucket, Graph, Op};
use kiln_runtime::{Error, Result};


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
    /// The softmax was guarded by `Where(IsNaN(p), 0, p)`.
    zero_nan_rows: bool,
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
    /// Every node's value range (`crate::ir::ranges`): a GEMM's integer left operand.
    ranges: Vec<crate::ops::range::Interval>,
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

mod attention;
mod expr;
mod gather_tables;
mod group;
mod lower;
mod report;
mod siblings;

pub use report::{count_ops, op_kind, FusionReport};
use expr::{scalar_constant, ExprBuilder};

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
            ranges: crate::ir::ranges::value_ranges(g),
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

/// Folds axis-0 concats that only gathers read into those gathers (see [`gather_tables`]), for a
/// target whose gather kernel reads several tables (the CPU); returns how many it removed.
pub fn fold_gather_tables(program: &mut KernelProgram) -> Result<usize> {
    let removed = gather_tables::fold_concats_into_gathers(program);
    if removed > 0 {
        program.validate()?;
    }
    Ok(removed)
}

/// Merges sibling GEMMs into one over their concatenated weights (see [`siblings`]), for a
/// target whose weights are prepared per plan (the CPU); returns how many kernels it removed.
pub fn merge_siblings(program: &mut KernelProgram) -> Result<usize> {
    let removed = siblings::merge_sibling_gemms(program);
    if removed > 0 {
        program.validate()?;
    }
    Ok(removed)
}
