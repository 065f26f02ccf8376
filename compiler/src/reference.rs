//! The reference backend: a plain f64 interpreter of the graph IR, the numeric oracle every other
//! backend is checked against.
//!
//! Semantics, in one place:
//! - Every value is stored and computed in f64 (accumulations too). Inputs and weights enter
//!   exactly (every supported dtype is exact in f64); outputs are converted to their node's dtype
//!   at the boundary (floats round to nearest, integers truncate). Intermediate values are not
//!   rounded to their node's dtype, except by an explicit `Cast`.
//! - Integer tensors hold integral f64 values (exact up to 2^53, far beyond any token id):
//!   integer `Div` and `Reduce Mean` truncate toward zero; `Cast` to an integer truncates toward
//!   zero, saturating at the type's range; `Cast` to a float rounds to that float's precision.
//! - `Max`/`Min` (binary and reduce) propagate NaN.
//! - A gather id outside `[0, vocab)` is an `Error::Graph` naming the gather node and the id.
//!
//! `lower` validates the graph for the bucket, resolves every shape, precomputes every stride
//! and allocates every buffer; `run` only checks its arguments and loops over the steps.
//! Weights are read in place and a `Reshape` reads its input's buffer. The other values get
//! f64 buffers that are reused once every reader of a value has run (best fit by size), so a
//! plan holds about a layer's worth of activations, not the whole graph's;
//! [`ReferenceBackend::lower_keeping_all`] keeps every value for inspection instead.

mod kernels;

use crate::ir::GraphExt as _;
use std::sync::Arc;

use kiln_runtime::backend::{check_weights, Backend, Batch, Caps, Outputs};
use kiln_runtime::graph::{BinaryOp, Bucket, Graph, Op, ReduceOp, UnaryOp, ValueId};
use kiln_runtime::{DType, Error, HostTensor, Result, TensorData};

use kernels::{broadcast_strides, strides, Walk};

/// The f64 interpreter backend (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct ReferenceBackend;

/// One weight tensor in f64.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightArray {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

/// The reference backend's weights: f64 arrays indexed like `graph.weights`, shared by every
/// plan built from them.
#[derive(Debug, Clone)]
pub struct ReferenceWeights {
    arrays: Arc<Vec<WeightArray>>,
}

impl ReferenceWeights {
    pub fn arrays(&self) -> &[WeightArray] {
        &self.arrays
    }
    /// Bytes the arrays hold.
    pub fn bytes(&self) -> usize {
        self.arrays.iter().map(|a| a.data.len() * std::mem::size_of::<f64>()).sum()
    }
}

/// Where a value's data lives.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Src {
    /// The first `len` elements of buffer `buf` (`ReferencePlan::buffers`).
    Buf { buf: usize, len: usize },
    /// Weight-table entry `i`.
    Weight(usize),
}

fn read<'a>(buffers: &'a [Vec<f64>], weights: &'a [WeightArray], s: Src) -> &'a [f64] {
    match s {
        Src::Buf { buf, len } => &buffers[buf][..len],
        Src::Weight(i) => &weights[i].data,
    }
}

#[derive(Debug)]
struct MatMulStep {
    a: Src,
    b: Src,
    transpose_a: bool,
    transpose_b: bool,
    m: usize,
    k: usize,
    n: usize,
    /// For each output matrix, the index of the `a` and `b` matrix it reads (leading dims
    /// broadcast).
    a_index: Vec<usize>,
    b_index: Vec<usize>,
}

/// What one node does at run time. The output is always the node's own buffer.
#[derive(Debug)]
enum Kernel {
    Input { index: usize },
    MatMul(Box<MatMulStep>),
    Binary { op: BinaryOp, int: bool, a: Src, b: Src, walk: Walk<3> },
    Unary { op: UnaryOp, x: Src },
    /// Copies `x` (adding the mask through `walk` = [out, x, mask] when there is one), then
    /// normalizes in place over the middle dim of `[outer, n, inner]`.
    Softmax { x: Src, mask: Option<(Src, Walk<3>)>, outer: usize, n: usize, inner: usize },
    LayerNorm { x: Src, gamma: Src, beta: Src, h: usize, eps: f64 },
    RmsNorm { x: Src, gamma: Src, h: usize, eps: f64 },
    /// Transpose and Slice: a strided read, `walk` = [out, x].
    Copy { x: Src, walk: Walk<2> },
    Gather { table: Src, ids: Src, vocab: usize, h: usize },
    Concat { parts: Vec<(Src, usize)>, outer: usize },
    Reduce { op: ReduceOp, int: bool, x: Src, walk: Walk<2>, count: usize },
    Where { cond: Src, a: Src, b: Src, walk: Walk<4> },
    Cast { to: DType, x: Src },
}

/// One node's work: `kernel` writes the first `len` elements of buffer `out`.
#[derive(Debug)]
struct Step {
    node: usize,
    out: usize,
    len: usize,
    kernel: Kernel,
}

/// A graph lowered for one bucket: every shape resolved, every buffer allocated.
#[derive(Debug)]
pub struct ReferencePlan {
    graph: Graph,
    bucket: Bucket,
    weights: ReferenceWeights,
    /// Concrete shape of every value.
    shapes: Vec<Vec<usize>>,
    /// Where every value's data lives.
    srcs: Vec<Src>,
    /// Whether a value's data is still in its buffer after a run (graph outputs, constants,
    /// weights; every value in a plan from `lower_keeping_all`).
    kept: Vec<bool>,
    /// Activation buffers, shared by values whose lifetimes do not overlap.
    buffers: Vec<Vec<f64>>,
    /// Room for a transposed matmul operand (made row-major before the i-k-j loop), one for
    /// `a` and one for `b`, shared by every matmul of the plan and sized for the largest.
    scratch: [Vec<f64>; 2],
    steps: Vec<Step>,
}

impl ReferencePlan {
    pub fn bucket(&self) -> Bucket {
        self.bucket
    }

    /// Concrete shape of `v` in this plan's bucket.
    pub fn shape(&self, v: ValueId) -> &[usize] {
        &self.shapes[v.index()]
    }

    /// The f64 data of `v` as of the last run (zeros before the first run, except constants
    /// and weights), or `None` when its buffer has been reused by a later value (see
    /// [`ReferenceBackend::lower_keeping_all`]).
    pub fn value(&self, v: ValueId) -> Option<&[f64]> {
        let i = v.index();
        (i < self.srcs.len() && self.kept[i]).then(|| read(&self.buffers, self.weights.arrays(), self.srcs[i]))
    }

    /// Bytes the plan owns: activation buffers and matmul scratch.
    pub fn bytes(&self) -> usize {
        let elems: usize = self.buffers.iter().chain(&self.scratch).map(|v| v.len()).sum();
        elems * std::mem::size_of::<f64>()
    }

    /// Checks that `inputs` match the bucket exactly: count, dtype and shape.
    fn check_inputs(&self, inputs: &[HostTensor]) -> Result<()> {
        if inputs.len() != self.graph.inputs.len() {
            return Err(Error::bad_batch(format!(
                "the graph takes {} inputs, the batch has {}",
                self.graph.inputs.len(),
                inputs.len()
            )));
        }
        for (t, spec) in inputs.iter().zip(&self.graph.inputs) {
            let want: Vec<usize> = spec.shape.iter().map(|d| d.resolve(self.bucket)).collect();
            if t.dtype() != spec.dtype || t.shape != want || t.numel() != want.iter().product::<usize>() {
                return Err(Error::bad_batch(format!(
                    "input `{}` is {} {:?} ({} elements), the plan for bucket {} needs {} {want:?}",
                    spec.name,
                    t.dtype(),
                    t.shape,
                    t.numel(),
                    self.bucket,
                    spec.dtype
                )));
            }
        }
        Ok(())
    }

    /// Runs every step on `inputs` (already checked).
    fn execute(&mut self, inputs: &[HostTensor]) -> Result<()> {
        let ReferencePlan { graph, steps, buffers, weights, scratch, .. } = self;
        for step in steps.iter_mut() {
            // Move the output buffer out while the step reads the others (it is never one of
            // its own inputs: a buffer is reused only after its value's last reader has run).
            let mut out = std::mem::take(&mut buffers[step.out]);
            let r = run_step(graph, step, &mut out, buffers, weights.arrays(), scratch, inputs);
            // An integer value holds integers of its type's range, whatever op made it (an
            // integer division by zero gives ±inf or NaN in f64): rounded as storing it would,
            // as the CPU backend's kernels do (tests/fuzz.rs checks the two agree).
            let dt = graph.nodes[step.node].dtype;
            if r.is_ok() && !dt.is_float() {
                for v in &mut out[..step.len] {
                    *v = kernels::cast_value(dt, *v);
                }
            }
            buffers[step.out] = out;
            r?;
        }
        Ok(())
    }

    /// Checks, runs, and writes the graph outputs into `outputs`.
    fn run_into(&mut self, inputs: &[HostTensor], outputs: &mut Outputs) -> Result<()> {
        self.check_inputs(inputs)?;
        outputs.check(&self.graph, self.bucket)?;
        for (t, name) in outputs.tensors.iter().zip(&self.graph.output_names) {
            if t.numel() != t.shape.iter().product::<usize>() {
                return Err(Error::bad_batch(format!(
                    "output `{name}` buffer holds {} elements for shape {:?}",
                    t.numel(),
                    t.shape
                )));
            }
        }
        self.execute(inputs)?;
        for (t, &o) in outputs.tensors.iter_mut().zip(&self.graph.outputs) {
            store(&mut t.data, read(&self.buffers, self.weights.arrays(), self.srcs[o.index()]));
        }
        Ok(())
    }

    /// Every kept node's value as of the last run, converted to the node's dtype (`None` for
    /// values whose buffer was reused).
    pub fn node_values(&self) -> Vec<Option<HostTensor>> {
        (0..self.graph.nodes.len())
            .map(|i| {
                let v = self.value(ValueId(i as u32))?;
                Some(HostTensor {
                    shape: self.shapes[i].clone(),
                    data: TensorData::from_f64(self.graph.nodes[i].dtype, v),
                })
            })
            .collect()
    }
}

/// Runs one step, writing `out_buf[..step.len]`.
fn run_step(
    graph: &Graph,
    step: &Step,
    out_buf: &mut [f64],
    buffers: &[Vec<f64>],
    weights: &[WeightArray],
    scratch: &mut [Vec<f64>; 2],
    inputs: &[HostTensor],
) -> Result<()> {
    let out = &mut out_buf[..step.len];
    let get = |s: Src| read(buffers, weights, s);
    match &step.kernel {
        Kernel::Input { index } => load(out, &inputs[*index].data),
        Kernel::MatMul(mm) => matmul(mm, out, get(mm.a), get(mm.b), scratch),
        Kernel::Binary { op, int, a, b, walk } => kernels::binary(*op, *int, walk, out, get(*a), get(*b)),
        Kernel::Unary { op, x } => kernels::unary(*op, out, get(*x)),
        Kernel::Softmax { x, mask, outer, n, inner } => {
            match mask {
                Some((m, walk)) => kernels::binary(BinaryOp::Add, false, walk, out, get(*x), get(*m)),
                None => out.copy_from_slice(get(*x)),
            }
            kernels::softmax_in_place(out, *outer, *n, *inner);
        }
        Kernel::LayerNorm { x, gamma, beta, h, eps } => {
            kernels::layer_norm(out, get(*x), get(*gamma), get(*beta), *h, *eps)
        }
        Kernel::RmsNorm { x, gamma, h, eps } => kernels::rms_norm(out, get(*x), get(*gamma), *h, *eps),
        Kernel::Copy { x, walk } => kernels::copy(walk, out, get(*x)),
        Kernel::Gather { table, ids, vocab, h } => {
            kernels::gather(out, get(*table), get(*ids), *vocab, *h).map_err(|(pos, id)| {
                Error::graph(
                    &graph.nodes[step.node].name,
                    format!("gather id {id} (at flat position {pos} of the ids) is out of range [0, {vocab})"),
                )
            })?
        }
        Kernel::Concat { parts, outer } => {
            // At most 64 parts (the IR's limit): a fixed array keeps `run` allocation-free.
            let mut views: [(&[f64], usize); 64] = [(&[], 0); 64];
            for (v, &(s, chunk)) in views.iter_mut().zip(parts.iter()) {
                *v = (get(s), chunk);
            }
            kernels::concat(out, &views[..parts.len()], *outer)
        }
        Kernel::Reduce { op, int, x, walk, count } => kernels::reduce(*op, *int, walk, out, get(*x), *count),
        Kernel::Where { cond, a, b, walk } => kernels::where_(walk, out, get(*cond), get(*a), get(*b)),
        Kernel::Cast { to, x } => kernels::cast(*to, out, get(*x)),
    }
    Ok(())
}

/// Picks a free buffer for a value of `len` elements: the smallest free one that is large
/// enough, else the largest free one grown to `len`, else a new one.
fn take_buffer(buffers: &mut Vec<Vec<f64>>, free: &mut Vec<usize>, len: usize, node: &str) -> Result<usize> {
    let fit = free
        .iter()
        .enumerate()
        .filter(|&(_, &b)| buffers[b].len() >= len)
        .min_by_key(|&(_, &b)| buffers[b].len())
        .or_else(|| free.iter().enumerate().max_by_key(|&(_, &b)| buffers[b].len()))
        .map(|(k, _)| k);
    match fit {
        Some(k) => {
            let b = free.swap_remove(k);
            if buffers[b].len() < len {
                grow(&mut buffers[b], len, node)?;
            }
            Ok(b)
        }
        None => {
            buffers.push(zeroed(len, node)?);
            Ok(buffers.len() - 1)
        }
    }
}

/// `v` zero-extended to `len` values, or an error naming `node` where the memory is not there
/// (a value of 10^10 elements is a typed error, not an abort).
fn grow(v: &mut Vec<f64>, len: usize, node: &str) -> Result<()> {
    v.try_reserve_exact(len.saturating_sub(v.len())).map_err(|_| {
        let gib = (len as f64 * 8.0 / (1u64 << 30) as f64).ceil();
        Error::graph(node, format!("its {len} values ({gib} GiB as the reference's f64) cannot be allocated"))
    })?;
    v.resize(len, 0.0);
    Ok(())
}

/// `len` zeros, or an error naming `node` ([`grow`]).
fn zeroed(len: usize, node: &str) -> Result<Vec<f64>> {
    let mut v = Vec::new();
    grow(&mut v, len, node)?;
    Ok(v)
}

/// Copies a tensor's elements into an f64 buffer of the same length, without allocating.
fn load(out: &mut [f64], data: &TensorData) {
    match data {
        TensorData::F32(v) => out.iter_mut().zip(v).for_each(|(o, x)| *o = *x as f64),
        TensorData::F16(v) => out.iter_mut().zip(v).for_each(|(o, x)| *o = x.to_f64()),
        TensorData::BF16(v) => out.iter_mut().zip(v).for_each(|(o, x)| *o = x.to_f64()),
        TensorData::I64(v) => out.iter_mut().zip(v).for_each(|(o, x)| *o = *x as f64),
        TensorData::I32(v) => out.iter_mut().zip(v).for_each(|(o, x)| *o = *x as f64),
    }
}

/// Writes f64 values into existing storage, converting to its dtype (floats round to nearest,
/// integers truncate toward zero).
fn store(data: &mut TensorData, v: &[f64]) {
    match data {
        TensorData::F32(d) => d.iter_mut().zip(v).for_each(|(o, x)| *o = *x as f32),
        TensorData::F16(d) => d.iter_mut().zip(v).for_each(|(o, x)| *o = half::f16::from_f64(*x)),
        TensorData::BF16(d) => d.iter_mut().zip(v).for_each(|(o, x)| *o = half::bf16::from_f64(*x)),
        TensorData::I64(d) => d.iter_mut().zip(v).for_each(|(o, x)| *o = *x as i64),
        TensorData::I32(d) => d.iter_mut().zip(v).for_each(|(o, x)| *o = *x as i32),
    }
}

fn matmul(mm: &MatMulStep, out: &mut [f64], a: &[f64], b: &[f64], scratch: &mut [Vec<f64>; 2]) {
    let (m, k, n) = (mm.m, mm.k, mm.n);
    let [a_t, b_t] = scratch;
    // A transposed operand is stored [.., k, m] (a) or [.., n, k] (b): make it row-major first.
    let a = if mm.transpose_a {
        kernels::transpose_matrices(a, k, m, &mut a_t[..a.len()]);
        &a_t[..a.len()]
    } else {
        a
    };
    let b = if mm.transpose_b {
        kernels::transpose_matrices(b, n, k, &mut b_t[..b.len()]);
        &b_t[..b.len()]
    } else {
        b
    };
    for ((c, &ia), &ib) in out.chunks_exact_mut(m * n).zip(&mm.a_index).zip(&mm.b_index) {
        kernels::gemm(c, &a[ia * m * k..(ia + 1) * m * k], &b[ib * k * n..(ib + 1) * k * n], m, k, n);
    }
}

/// Product of `shape`, or an error naming `node` if it overflows.
fn numel(node: &str, shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |p, &d| p.checked_mul(d))
        .ok_or_else(|| Error::graph(node, format!("shape {shape:?} has too many elements")))
}

/// For each matrix of a batch shape `out`, the index of the matrix it reads in an operand whose
/// batch shape `from` broadcasts to `out`.
fn matrix_indices(from: &[usize], out: &[usize]) -> Vec<usize> {
    let st = broadcast_strides(from, out);
    let total: usize = out.iter().product();
    (0..total)
        .map(|mut r| {
            let mut idx = 0;
            for d in (0..out.len()).rev() {
                idx += (r % out[d]) * st[d];
                r /= out[d];
            }
            idx
        })
        .collect()
}

/// Builds a node's run-time step. `None` for nodes with nothing to do at run time (weights,
/// constants filled at lower, reshapes aliasing their input).
fn build_kernel(g: &Graph, i: usize, shapes: &[Vec<usize>], srcs: &[Src]) -> Result<Option<Kernel>> {
    let node = &g.nodes[i];
    let out = &shapes[i];
    let src = |k: usize| srcs[node.inputs[k].index()];
    let ishape = |k: usize| &shapes[node.inputs[k].index()];
    let int = node.dtype.is_int();
    let kernel = match &node.op {
        Op::Weight { .. } | Op::Constant { .. } | Op::Reshape => return Ok(None),
        Op::Input { index } => Kernel::Input { index: *index },
        Op::MatMul { transpose_a, transpose_b } => {
            let (a, b) = (ishape(0), ishape(1));
            let r = out.len();
            let (m, n) = (out[r - 2], out[r - 1]);
            let k = if *transpose_a { a[a.len() - 2] } else { a[a.len() - 1] };
            let ob = &out[..r - 2];
            Kernel::MatMul(Box::new(MatMulStep {
                a: src(0),
                b: src(1),
                transpose_a: *transpose_a,
                transpose_b: *transpose_b,
                m,
                k,
                n,
                a_index: matrix_indices(&a[..a.len() - 2], ob),
                b_index: matrix_indices(&b[..b.len() - 2], ob),
            }))
        }
        Op::Binary(op) => Kernel::Binary {
            op: *op,
            int,
            a: src(0),
            b: src(1),
            walk: Walk::new(out, [strides(out), broadcast_strides(ishape(0), out), broadcast_strides(ishape(1), out)]),
        },
        Op::Unary(op) => Kernel::Unary { op: *op, x: src(0) },
        Op::Softmax { axis } => {
            let mask = (node.inputs.len() == 2).then(|| {
                let walk = Walk::new(out, [strides(out), strides(out), broadcast_strides(ishape(1), out)]);
                (src(1), walk)
            });
            Kernel::Softmax {
                x: src(0),
                mask,
                outer: out[..*axis].iter().product(),
                n: out[*axis],
                inner: out[axis + 1..].iter().product(),
            }
        }
        Op::LayerNorm { eps } => Kernel::LayerNorm {
            x: src(0),
            gamma: src(1),
            beta: src(2),
            h: *out.last().expect("validated: rank >= 1"),
            eps: *eps as f64,
        },
        Op::RmsNorm { eps } => Kernel::RmsNorm {
            x: src(0),
            gamma: src(1),
            h: *out.last().expect("validated: rank >= 1"),
            eps: *eps as f64,
        },
        Op::Transpose { perm } => {
            let st = strides(ishape(0));
            let permuted = perm.iter().map(|&p| st[p]).collect();
            Kernel::Copy { x: src(0), walk: Walk::new(out, [strides(out), permuted]) }
        }
        Op::Slice { axis, start, .. } => {
            let st = strides(ishape(0));
            let base = start * st[*axis];
            Kernel::Copy { x: src(0), walk: Walk::new(out, [strides(out), st]).with_base([0, base]) }
        }
        Op::Gather => {
            let t = ishape(0);
            Kernel::Gather { table: src(0), ids: src(1), vocab: t[0], h: t[1] }
        }
        Op::Concat { axis } => {
            let inner: usize = out[axis + 1..].iter().product();
            let parts = (0..node.inputs.len()).map(|k| (src(k), ishape(k)[*axis] * inner)).collect();
            Kernel::Concat { parts, outer: out[..*axis].iter().product() }
        }
        Op::Reduce { op, axes, .. } => {
            let x = ishape(0);
            let kept: Vec<usize> =
                x.iter().enumerate().map(|(d, &n)| if axes.contains(&d) { 1 } else { n }).collect();
            let count = axes.iter().map(|&a| x[a]).product();
            Kernel::Reduce {
                op: *op,
                int,
                x: src(0),
                walk: Walk::new(x, [strides(x), broadcast_strides(&kept, x)]),
                count,
            }
        }
        Op::Where => Kernel::Where {
            cond: src(0),
            a: src(1),
            b: src(2),
            walk: Walk::new(
                out,
                [
                    strides(out),
                    broadcast_strides(ishape(0), out),
                    broadcast_strides(ishape(1), out),
                    broadcast_strides(ishape(2), out),
                ],
            ),
        },
        Op::Cast { to } => Kernel::Cast { to: *to, x: src(0) },
        Op::Precompiled { .. } => {
            return Err(Error::graph(&node.name, "is an output of a precompiled plan, which the reference cannot run"))
        }
    };
    Ok(Some(kernel))
}

impl ReferenceBackend {
    /// Like `lower`, but no buffer is reused: after a run every node's value can be read with
    /// [`ReferencePlan::value`] (for debugging a pass or another backend node by node).
    pub fn lower_keeping_all(&self, weights: &ReferenceWeights, graph: &Graph, bucket: Bucket) -> Result<ReferencePlan> {
        self.lower_plan(weights, graph, bucket, true)
    }

    fn lower_plan(&self, weights: &ReferenceWeights, graph: &Graph, bucket: Bucket, keep_all: bool) -> Result<ReferencePlan> {
        graph.validate(Some(bucket))?;
        let arrays = weights.arrays();
        if arrays.len() != graph.weights.len() {
            return Err(Error::graph(
                "<weights>",
                format!("the graph has {} weights, the uploaded weights hold {}", graph.weights.len(), arrays.len()),
            ));
        }
        for (a, spec) in arrays.iter().zip(&graph.weights) {
            if a.shape != spec.shape {
                return Err(Error::TensorMismatch {
                    path: "<lower>".into(),
                    tensor: spec.name.clone(),
                    expected: format!("{:?}", spec.shape),
                    found: format!("{:?}", a.shape),
                });
            }
        }
        let n = graph.nodes.len();
        // owner[i]: the node whose buffer holds value i (a reshape reads its input's buffer);
        // None for weights.
        let mut owner: Vec<Option<usize>> = Vec::with_capacity(n);
        for (i, node) in graph.nodes.iter().enumerate() {
            owner.push(match node.op {
                Op::Weight { .. } => None,
                Op::Reshape => owner[node.inputs[0].index()],
                _ => Some(i),
            });
        }
        // last[o]: the last step that reads owner o's buffer; usize::MAX keeps it to the end.
        let mut last: Vec<usize> = (0..n).collect();
        for (i, node) in graph.nodes.iter().enumerate() {
            for o in node.inputs.iter().filter_map(|v| owner[v.index()]) {
                last[o] = last[o].max(i);
            }
            if keep_all || matches!(node.op, Op::Constant { .. }) {
                last[i] = usize::MAX;
            }
        }
        for o in graph.outputs.iter().filter_map(|v| owner[v.index()]) {
            last[o] = usize::MAX;
        }
        let kept = owner.iter().map(|o| o.is_none_or(|o| last[o] == usize::MAX)).collect();

        let mut shapes = Vec::with_capacity(n);
        let mut srcs: Vec<Src> = Vec::with_capacity(n);
        let mut buffers: Vec<Vec<f64>> = Vec::new();
        let mut free: Vec<usize> = Vec::new();
        let mut steps = Vec::new();
        let mut scratch_len = [0usize; 2];
        for (i, node) in graph.nodes.iter().enumerate() {
            let shape = graph.shape_in(ValueId(i as u32), bucket);
            let len = numel(&node.name, &shape)?;
            shapes.push(shape);
            let src = match &node.op {
                Op::Weight { index } => Src::Weight(*index),
                Op::Reshape => srcs[node.inputs[0].index()],
                Op::Constant { values } => {
                    buffers.push(values.iter().map(|&v| v as f64).collect());
                    Src::Buf { buf: buffers.len() - 1, len }
                }
                _ => Src::Buf { buf: take_buffer(&mut buffers, &mut free, len, &node.name)?, len },
            };
            srcs.push(src);
            if let Op::MatMul { transpose_a, transpose_b } = node.op {
                for (k, on) in [transpose_a, transpose_b].into_iter().enumerate() {
                    if on {
                        let len = shapes[node.inputs[k].index()].iter().product();
                        scratch_len[k] = scratch_len[k].max(len);
                    }
                }
            }
            if let Some(kernel) = build_kernel(graph, i, &shapes, &srcs)? {
                let Src::Buf { buf, len } = src else { unreachable!("only weights and reshapes have no buffer") };
                steps.push(Step { node: i, out: buf, len, kernel });
            }
            // Buffers whose last reader is this step (or that nobody reads) are free from now.
            for o in node.inputs.iter().filter_map(|v| owner[v.index()]).chain(owner[i]) {
                if last[o] == i {
                    if let Src::Buf { buf, .. } = srcs[o] {
                        if !free.contains(&buf) {
                            free.push(buf);
                        }
                    }
                }
            }
        }
        Ok(ReferencePlan {
            graph: graph.clone(),
            bucket,
            weights: weights.clone(),
            shapes,
            srcs,
            kept,
            buffers,
            scratch: [zeroed(scratch_len[0], "<transposed matmul operand>")?, zeroed(scratch_len[1], "<transposed matmul operand>")?],
            steps,
        })
    }
}

impl Backend for ReferenceBackend {
    type Weights = ReferenceWeights;
    type Plan = ReferencePlan;

    fn caps(&self) -> Caps {
        Caps {
            name: "reference".into(),
            device: "host CPU, f64 interpreter".into(),
            dtypes: vec![DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32],
            can_lower: true,
            memory_bytes: None,
        }
    }

    fn upload(&self, tensors: &[HostTensor], graph: &Graph) -> Result<ReferenceWeights> {
        check_weights(tensors, graph)?;
        let mut arrays = Vec::with_capacity(tensors.len());
        for (t, spec) in tensors.iter().zip(&graph.weights) {
            if t.numel() != t.shape.iter().product::<usize>() {
                return Err(Error::TensorMismatch {
                    path: "<upload>".into(),
                    tensor: spec.name.clone(),
                    expected: format!("{} elements", t.shape.iter().product::<usize>()),
                    found: format!("{} elements", t.numel()),
                });
            }
            arrays.push(WeightArray { shape: t.shape.clone(), data: t.data.to_f64_vec() });
        }
        Ok(ReferenceWeights { arrays: Arc::new(arrays) })
    }

    fn lower(&self, weights: &ReferenceWeights, graph: &Graph, bucket: Bucket) -> Result<ReferencePlan> {
        self.lower_plan(weights, graph, bucket, false)
    }

    fn run(&self, plan: &mut ReferencePlan, batch: &Batch, outputs: &mut Outputs) -> Result<()> {
        plan.run_into(&batch.tensors, outputs)
    }

    fn weight_bytes(&self, weights: &ReferenceWeights) -> usize {
        weights.bytes()
    }

    fn plan_bytes(&self, plan: &ReferencePlan) -> usize {
        plan.bytes()
    }
}

/// Lowers and runs `graph` once for `bucket` (inputs exactly the bucket's shapes), through the
/// same code path as the backend: upload, lower, run. Returns the graph outputs.
pub fn interpret(graph: &Graph, weights: &[HostTensor], inputs: &[HostTensor], bucket: Bucket) -> Result<Vec<HostTensor>> {
    let backend = ReferenceBackend;
    let w = backend.upload(weights, graph)?;
    let mut plan = backend.lower(&w, graph, bucket)?;
    let mut out = Outputs::for_bucket(graph, bucket);
    plan.run_into(inputs, &mut out)?;
    Ok(out.tensors)
}

/// Like [`interpret`], but returns every node's value (indexed by node, in the node's dtype):
/// handy to find the first node where another backend or a rewritten graph diverges.
pub fn interpret_all(
    graph: &Graph,
    weights: &[HostTensor],
    inputs: &[HostTensor],
    bucket: Bucket,
) -> Result<Vec<HostTensor>> {
    let backend = ReferenceBackend;
    let w = backend.upload(weights, graph)?;
    let mut plan = backend.lower_keeping_all(&w, graph, bucket)?;
    let mut out = Outputs::for_bucket(graph, bucket);
    plan.run_into(inputs, &mut out)?;
    Ok(plan.node_values().into_iter().map(|v| v.expect("a keep-all plan keeps every value")).collect())
}
