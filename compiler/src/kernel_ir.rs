//! The kernel IR: what fusion produces and what code generators consume.
//!
//! A [`KernelProgram`] is a list of [`Buffer`]s and a schedule of [`Kernel`]s for ONE bucket:
//! every shape is concrete. Each kernel is meant to be emitted as one loop nest (or one GPU
//! launch) and is self-describing: it names its input and output tensors as strided views
//! ([`BufferView`]) of buffers, and carries a kind-specific description ([`KernelOp`]).
//!
//! # Conventions every backend must follow
//! - **Views.** A [`BufferView`] names a buffer, an element `offset`, a `shape` and element
//!   `strides`: element `(i0, .., in)` lives at element `offset + Σ i_d·strides[d]` of the
//!   buffer. A stride of 0 is a broadcast. Views are how reshapes (free), transposes (permuted
//!   strides), slices (offset) and numpy broadcasting reach kernels without copies.
//!   [`BufferView::is_contiguous`] tells the dense row-major fast path. Outputs are views
//!   too: an Elementwise, Gemm or Attention kernel whose value only fed a transpose writes the
//!   transposed layout directly (permuted strides), and a Softmax over a non-last graph axis
//!   has its input and output views permuted so that the softmax axis is last. Every other
//!   output view is contiguous.
//! - **Scalar arithmetic.** Expressions ([`Expr`]) compute in f32. A load converts its element
//!   to f32 (integers with `as f32`, exact below 2^24); a store converts f32 to the output's dtype
//!   like Rust's `as` (integers: truncation toward zero, saturating). A kernel whose whole
//!   expression is a single `Load` (a copy, see [`KernelOp::is_copy`]) must copy integer
//!   elements exactly (convert int→int without going through f32).
//! - **In-place.** The memory planner may give a kernel's output the same arena bytes as one of
//!   its inputs, but only for an [`KernelOp::Elementwise`] kernel or an epilogue operand of a
//!   [`KernelOp::Gemm`], and only when that input's view is identical to the output view
//!   (same offset/shape/strides, contiguous). The backend must therefore read that input
//!   element at an index before it writes the output element at the same index, and never
//!   read an input element after writing the output element at a different index. Every
//!   other pair of buffers live at the same time is disjoint (the planner checks it).
//! - **Weights with a layout decision** ([`WeightLayout::Transposed`]) are transformed once
//!   when the backend lowers/uploads them, never per run; the buffer's `shape` is the storage
//!   shape after the transform.
//! - **Numerics** of the ops follow `kiln_runtime::graph` (GELU = erf form; softmax subtracts
//!   the row maximum; LayerNorm uses the biased variance; `eps` is added to the variance/mean
//!   square before the square root).
//!
//! The printer ([`KernelProgram::print`]) is deterministic; golden tests rely on it.

use std::collections::BTreeMap;
use std::fmt::{self, Write};

use kiln_runtime::graph::{BinaryOp, Bucket, ReduceOp, UnaryOp};
pub use kiln_runtime::graph::WeightConcat;
use kiln_runtime::DType;
use serde::{Deserialize, Serialize};

/// Index of a buffer in [`KernelProgram::buffers`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BufferId(pub u32);

impl BufferId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for BufferId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b{}", self.0)
    }
}

/// How a weight is stored for the kernels, decided at compile time by the `layout` pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WeightLayout {
    /// Row-major in the checkpoint's shape.
    AsIs,
    /// A rank-2 checkpoint tensor `[r, c]` stored transposed, row-major `[c, r]`. Chosen for
    /// weights whose every use is the B operand of a GEMM with `transpose_b` (PyTorch
    /// `nn.Linear` weights): the GEMM then reads B as a plain row-major `[k, n]` matrix. The
    /// backend transposes (and may further pack) it once at lowering/upload time.
    Transposed,
}

/// Where a buffer's bytes come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum BufferKind {
    /// Graph input `index` (bound per run; read-only for kernels).
    Input { index: usize },
    /// Weight-table entry `index` of the graph (read-only), stored per `layout`. `concat` names
    /// further entries joined to it (in the checkpoint layout, before `layout` applies):
    /// the merged weight of sibling linear layers (fusion's `siblings` step); usually `None`.
    Weight { index: usize, layout: WeightLayout, concat: Option<WeightConcat> },
    /// A constant tensor known at compile time (f32, row-major in `shape`).
    Constant { values: Vec<f32> },
    /// An intermediate living in the per-plan arena; its offset comes from the memory plan.
    Arena,
    /// Graph output `index` (bound per run); written by exactly one kernel.
    Output { index: usize },
}

/// A dense row-major buffer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    /// The graph value (or weight/input/output name) it holds, for humans.
    pub name: String,
    pub dtype: DType,
    /// Storage shape (row-major, dense).
    pub shape: Vec<usize>,
    pub kind: BufferKind,
}

impl Buffer {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn bytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
    pub fn is_arena(&self) -> bool {
        matches!(self.kind, BufferKind::Arena)
    }
}

/// A strided view of a buffer (see the module docs). Offsets and strides count elements.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BufferView {
    pub buffer: BufferId,
    pub offset: usize,
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
}

/// Row-major strides of a dense `shape`.
pub fn dense_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![0; shape.len()];
    let mut acc = 1;
    for d in (0..shape.len()).rev() {
        s[d] = acc;
        acc *= shape[d];
    }
    s
}

/// Layout of the last two dims of a view, as BLAS-style code wants it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatrixLayout {
    /// Element (i, j) at `i*ld + j`.
    RowMajor { ld: usize },
    /// Element (i, j) at `i + j*ld`.
    ColMajor { ld: usize },
}

impl BufferView {
    /// The whole of a dense buffer of `shape`.
    pub fn dense(buffer: BufferId, shape: &[usize]) -> Self {
        BufferView { buffer, offset: 0, shape: shape.to_vec(), strides: dense_strides(shape) }
    }
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Dense row-major (dims of size 1 may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let mut acc = 1;
        for d in (0..self.shape.len()).rev() {
            if self.shape[d] != 1 && self.strides[d] != acc {
                return false;
            }
            acc *= self.shape[d];
        }
        true
    }
    /// Element offset (in the buffer) of a multi-index.
    pub fn element_offset(&self, idx: &[usize]) -> usize {
        self.offset + idx.iter().zip(&self.strides).map(|(i, s)| i * s).sum::<usize>()
    }
    /// One past the largest element offset the view touches (0 for an empty view).
    pub fn extent(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        self.offset + self.shape.iter().zip(&self.strides).map(|(n, s)| (n - 1) * s).sum::<usize>() + 1
    }
    /// Whether the view has a stride-0 dim of size > 1 (some element is read more than once).
    pub fn has_broadcast(&self) -> bool {
        self.shape.iter().zip(&self.strides).any(|(&n, &s)| n > 1 && s == 0)
    }
    /// Layout of the last two dims, when one of them has unit stride.
    pub fn matrix_layout(&self) -> Option<MatrixLayout> {
        let r = self.rank();
        if r < 2 {
            return None;
        }
        let (rows, cols) = (self.shape[r - 2], self.shape[r - 1]);
        let (sr, sc) = (self.strides[r - 2], self.strides[r - 1]);
        if sc == 1 || cols == 1 {
            Some(MatrixLayout::RowMajor { ld: if rows == 1 { cols } else { sr } })
        } else if sr == 1 || rows == 1 {
            Some(MatrixLayout::ColMajor { ld: sc })
        } else {
            None
        }
    }
    /// The view with its dims permuted: new dim `i` is old dim `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> BufferView {
        BufferView {
            buffer: self.buffer,
            offset: self.offset,
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
        }
    }
    /// `x[start..start+len]` along `axis`.
    pub fn slice(&self, axis: usize, start: usize, len: usize) -> BufferView {
        let mut t = self.clone();
        t.offset += start * t.strides[axis];
        t.shape[axis] = len;
        t
    }
    /// Numpy broadcasting of the view to `shape` (right-aligned; size-1 or missing dims get
    /// stride 0). `None` if it does not broadcast.
    pub fn broadcast_to(&self, shape: &[usize]) -> Option<BufferView> {
        if shape.len() < self.rank() {
            return None;
        }
        let lead = shape.len() - self.rank();
        let mut strides = vec![0; shape.len()];
        for (d, &n) in shape.iter().enumerate() {
            if d < lead {
                continue;
            }
            let (m, s) = (self.shape[d - lead], self.strides[d - lead]);
            if m == n {
                strides[d] = if n == 1 { 0 } else { s };
            } else if m == 1 {
                strides[d] = 0;
            } else {
                return None;
            }
        }
        Some(BufferView { buffer: self.buffer, offset: self.offset, shape: shape.to_vec(), strides })
    }
    /// The view reshaped to `shape` without copying, when its strides allow it (as numpy's
    /// `reshape` attempts); `None` when a copy would be needed.
    pub fn reshape(&self, shape: &[usize]) -> Option<BufferView> {
        if shape.iter().product::<usize>() != self.numel() {
            return None;
        }
        if self.is_contiguous() {
            return Some(BufferView { buffer: self.buffer, offset: self.offset, shape: shape.to_vec(), strides: dense_strides(shape) });
        }
        // Drop size-1 dims, then group old dims into runs that are contiguous among themselves
        // and match them against runs of new dims with the same element count.
        let old: Vec<(usize, usize)> =
            self.shape.iter().zip(&self.strides).filter(|(n, _)| **n != 1).map(|(&n, &s)| (n, s)).collect();
        let mut strides = vec![0usize; shape.len()];
        let (mut oi, mut ni) = (0usize, 0usize);
        while ni < shape.len() || oi < old.len() {
            // Size-1 new dims take any stride.
            if ni < shape.len() && shape[ni] == 1 {
                strides[ni] = 0;
                ni += 1;
                continue;
            }
            if oi >= old.len() || ni >= shape.len() {
                return None;
            }
            // Grow a group of old dims and of new dims until their products agree.
            let (o_start, n_start) = (oi, ni);
            let mut op = old[oi].0;
            let mut np = shape[ni];
            oi += 1;
            ni += 1;
            while op != np {
                if op < np {
                    if oi >= old.len() {
                        return None;
                    }
                    op *= old[oi].0;
                    oi += 1;
                } else {
                    if ni >= shape.len() {
                        return None;
                    }
                    np *= shape[ni];
                    ni += 1;
                }
            }
            // The old group must be mergeable: stride[i] == stride[i+1] * size[i+1].
            for k in o_start..oi - 1 {
                if old[k].1 != old[k + 1].1 * old[k + 1].0 {
                    return None;
                }
            }
            // Assign new strides within the group from the innermost old stride.
            let mut acc = old[oi - 1].1;
            for k in (n_start..ni).rev() {
                strides[k] = acc;
                acc *= shape[k];
            }
        }
        Some(BufferView { buffer: self.buffer, offset: self.offset, shape: shape.to_vec(), strides })
    }
}

impl fmt::Display for BufferView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims = |v: &[usize]| v.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",");
        write!(f, "{}+{}[{}]/[{}]", self.buffer, self.offset, dims(&self.shape), dims(&self.strides))
    }
}

/// Index of a node inside one [`Expr`].
pub type ExprId = u32;

/// One scalar operation of an elementwise expression DAG. Operands are earlier nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ExprNode {
    /// Kernel input `k` (an index into [`Kernel::inputs`]) at the current iteration index.
    /// That input's view has exactly the kernel's iteration shape (broadcasts are stride 0).
    Load(usize),
    /// GEMM epilogue only: the dot product at the current (i, j), already times `alpha`.
    Acc,
    Const(f32),
    Unary(UnaryOp, ExprId),
    Binary(BinaryOp, ExprId, ExprId),
    /// `cond != 0 ? a : b`.
    Select(ExprId, ExprId, ExprId),
    /// Rounds to the value set of the dtype (ints: truncation toward zero, saturating;
    /// f16/bf16: nearest), the result still an f32.
    Cast(DType, ExprId),
}

/// A scalar expression DAG in topological order; the value of the expression is its LAST node.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Expr {
    pub nodes: Vec<ExprNode>,
}

impl Expr {
    /// The root (last node).
    pub fn root(&self) -> ExprId {
        (self.nodes.len() - 1) as ExprId
    }
    /// Kernel inputs this expression loads, ascending, without duplicates.
    pub fn loads(&self) -> Vec<usize> {
        let mut v: Vec<usize> =
            self.nodes.iter().filter_map(|n| if let ExprNode::Load(k) = n { Some(*k) } else { None }).collect();
        v.sort_unstable();
        v.dedup();
        v
    }
    /// `Load(k)` alone: a copy of input `k`.
    pub fn as_copy(&self) -> Option<usize> {
        match self.nodes.as_slice() {
            [ExprNode::Load(k)] => Some(*k),
            _ => None,
        }
    }
    pub fn uses_acc(&self) -> bool {
        self.nodes.iter().any(|n| matches!(n, ExprNode::Acc))
    }
    /// `v0=load(0) v1=acc v2=add(v0,v1)` on one line.
    pub fn print(&self) -> String {
        let mut s = String::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if i > 0 {
                s.push(' ');
            }
            let _ = write!(s, "v{i}=");
            let _ = match n {
                ExprNode::Load(k) => write!(s, "load({k})"),
                ExprNode::Acc => write!(s, "acc"),
                ExprNode::Const(c) => write!(s, "const({c:?})"),
                ExprNode::Unary(op, a) => write!(s, "{}(v{a})", format!("{op:?}").to_lowercase()),
                ExprNode::Binary(op, a, b) => write!(s, "{}(v{a},v{b})", format!("{op:?}").to_lowercase()),
                ExprNode::Select(c, a, b) => write!(s, "select(v{c},v{a},v{b})"),
                ExprNode::Cast(t, a) => write!(s, "cast_{t}(v{a})"),
            };
        }
        s
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NormKind {
    /// `(x - mean) / sqrt(var + eps) * gamma + beta`, biased variance.
    LayerNorm,
    /// `x / sqrt(mean(x²) + eps) * gamma`.
    RmsNorm,
}

/// What a kernel computes. "Iteration shape" is defined per kind; the views of expression
/// loads always have exactly the iteration shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum KernelOp {
    /// `out[i] = expr(i)` for every index `i` of the iteration shape = `output.shape`.
    /// A bare `Load(k)` is a copy (a materialized transpose/reshape/cast).
    Elementwise { expr: Expr },
    /// Batched GEMM with a fused epilogue. For every batch index `b` of `batch`, `i < m`, `j < n`:
    /// `acc = alpha · Σ_{p<k} A[b,i,p]·B[b,p,j]`; `out[b,i,j] = epilogue(acc, loads)` (just `acc`
    /// when `epilogue` is `None`). `inputs[0]` = A with view shape `batch ++ [m, k]`,
    /// `inputs[1]` = B with view shape `batch ++ [k, n]` (transposes are in the strides: see
    /// [`BufferView::matrix_layout`]; a stride-0 batch dim is a shared operand), `inputs[2..]` =
    /// epilogue operands with view shape `batch ++ [m, n]` (the iteration shape). A and B never
    /// alias the output. `int_bounds`: every element of A (of B) is NaN or an integer of at most
    /// the first (second) magnitude (`crate::ir::ranges`; B's from a weight's declared bound),
    /// each at most 32767 and k times their product below 2^31, so a backend may multiply
    /// exactly in integers (the CPU's i16 GEMM).
    Gemm { batch: Vec<usize>, m: usize, n: usize, k: usize, alpha: f32, epilogue: Option<Expr>, int_bounds: Option<(u32, u32)> },
    /// Normalization over the last dim. Iteration shape = `output.shape` = `[.., cols]`; the
    /// normalized value is `x = prologue(loads)` (e.g. a residual add fused in). `inputs[gamma]`
    /// (and `inputs[beta]` for LayerNorm) are views of shape `[cols]`.
    Norm { kind: NormKind, eps: f32, prologue: Expr, gamma: usize, beta: Option<usize> },
    /// Softmax over the last dim of the iteration shape = `output.shape`, of
    /// `x = prologue(loads)` (scale and additive mask fused in): `exp(x - max) / Σ exp(x - max)`.
    Softmax { prologue: Expr },
    /// Scaled-dot-product attention, one independent problem per index of `batch` (batch ×
    /// heads): `out = softmax(scale · Q·Kᵀ + mask) · V` with the softmax over the key axis.
    /// `inputs[0]` = Q view `batch ++ [seq_q, head_dim]`, `inputs[1]` = K view
    /// `batch ++ [seq_kv, head_dim]`, `inputs[2]` = V view `batch ++ [seq_kv, v_dim]`,
    /// `inputs[mask]` (if any) a view `batch ++ [seq_q, seq_kv]` (usually broadcast, stride 0).
    /// Output view `batch ++ [seq_q, v_dim]`. A backend need not materialize the scores.
    /// `zero_nan_rows`: a row whose probabilities are NaN (a NaN or +inf score) uses probabilities
    /// 0 instead, giving `0·V` (the fused `Where(IsNaN(p), 0, p)` guard of PyTorch's SDPA export).
    Attention {
        batch: Vec<usize>,
        seq_q: usize,
        seq_kv: usize,
        head_dim: usize,
        v_dim: usize,
        scale: f32,
        mask: Option<usize>,
        zero_nan_rows: bool,
    },
    /// Embedding lookup: `inputs[0]` = table view `[rows, cols]`, `inputs[1]` = integer ids view
    /// (shape `ids`); output view `ids ++ [cols]`. An id outside `0..rows` is a run-time error
    /// (or clamped: backends document which). Further inputs (`inputs[2..]`, each `[rows_i,
    /// cols]`, table 0's column stride) continue the table: ids `rows..rows + rows_2` read
    /// `inputs[2]`, and so on (an axis-0 concat folded into its gathers on targets that read
    /// several tables, the CPU).
    Gather,
    /// Reduction of the last `reduced_dims` dims of the iteration shape `shape`, of
    /// `x = prologue(loads)`; output view shape = `shape` without those dims. Mean divides the
    /// sum by the number of reduced elements.
    Reduce { op: ReduceOp, shape: Vec<usize>, reduced_dims: usize, prologue: Expr },
    /// Concatenation of all inputs along `axis` into the output view.
    Concat { axis: usize },
}

impl KernelOp {
    /// A short kind name for reports: `elementwise`, `copy`, `gemm`, `layer_norm`, `rms_norm`,
    /// `softmax`, `attention`, `gather`, `reduce`, `concat`.
    pub fn kind_name(&self) -> &'static str {
        match self {
            KernelOp::Elementwise { expr } if expr.as_copy().is_some() => "copy",
            KernelOp::Elementwise { .. } => "elementwise",
            KernelOp::Gemm { .. } => "gemm",
            KernelOp::Norm { kind: NormKind::LayerNorm, .. } => "layer_norm",
            KernelOp::Norm { kind: NormKind::RmsNorm, .. } => "rms_norm",
            KernelOp::Softmax { .. } => "softmax",
            KernelOp::Attention { .. } => "attention",
            KernelOp::Gather => "gather",
            KernelOp::Reduce { .. } => "reduce",
            KernelOp::Concat { .. } => "concat",
        }
    }
    pub fn is_copy(&self) -> bool {
        matches!(self, KernelOp::Elementwise { expr } if expr.as_copy().is_some())
    }
    /// This kernel's part of [`KernelProgram::matmul_flops`].
    pub fn matmul_flops(&self) -> u128 {
        // u128: a bucket's shapes are bounded (pipeline::MAX_TENSOR_BYTES), their products of
        // four dims are not bounded by u64.
        let prod = |dims: &[usize]| dims.iter().map(|&d| d as u128).product::<u128>();
        match self {
            KernelOp::Gemm { batch, m, n, k, .. } => 2 * prod(batch) * prod(&[*m, *n, *k]),
            KernelOp::Attention { batch, seq_q, seq_kv, head_dim, v_dim, .. } => {
                2 * prod(batch) * prod(&[*seq_q, *seq_kv]) * (*head_dim as u128 + *v_dim as u128)
            }
            _ => 0,
        }
    }
    /// The elementwise expression of the kernel, if it has one (body, epilogue or prologue).
    pub fn expr(&self) -> Option<&Expr> {
        match self {
            KernelOp::Elementwise { expr } => Some(expr),
            KernelOp::Gemm { epilogue, .. } => epilogue.as_ref(),
            KernelOp::Norm { prologue, .. } | KernelOp::Softmax { prologue } | KernelOp::Reduce { prologue, .. } => {
                Some(prologue)
            }
            _ => None,
        }
    }
}

/// One kernel: one loop nest / one launch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Kernel {
    /// Name of the graph node whose value the kernel writes.
    pub name: String,
    pub op: KernelOp,
    pub inputs: Vec<BufferView>,
    pub output: BufferView,
    /// Names of the graph nodes fused into this kernel, in graph order.
    pub fused: Vec<String>,
}

/// A fused, scheduled program for one bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelProgram {
    pub bucket: Bucket,
    pub buffers: Vec<Buffer>,
    /// In execution order.
    pub kernels: Vec<Kernel>,
    /// Buffer of each graph input (indexed like `Graph::inputs`); `None` if no kernel reads it.
    pub inputs: Vec<Option<BufferId>>,
    /// Buffer of each weight-table entry (indexed like `Graph::weights`); `None` if unused.
    pub weights: Vec<Option<BufferId>>,
    /// Buffer of each graph output (kind [`BufferKind::Output`]), indexed like `Graph::outputs`.
    pub outputs: Vec<BufferId>,
    pub output_names: Vec<String>,
}

impl KernelProgram {
    pub fn buffer(&self, id: BufferId) -> &Buffer {
        &self.buffers[id.index()]
    }

    /// The part of [`matmul_flops`](Self::matmul_flops) in GEMMs with integer operands
    /// (`KernelOp::Gemm::int_bounds`), which a backend may run in integers.
    pub fn integer_matmul_flops(&self) -> u128 {
        self.kernels.iter().filter(|k| matches!(k.op, KernelOp::Gemm { int_bounds: Some(_), .. })).map(|k| k.op.matmul_flops()).sum()
    }

    /// Floating-point operations of the program's matrix products (2 per multiply-add: GEMMs and
    /// both products of every attention kernel), the figure GFLOP/s are quoted against.
    /// Elementwise work, norms and softmax exponentials are not counted.
    pub fn matmul_flops(&self) -> u128 {
        self.kernels.iter().map(|k| k.op.matmul_flops()).sum()
    }

    /// Number of kernels of each kind (see [`KernelOp::kind_name`]).
    pub fn kernels_by_kind(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for k in &self.kernels {
            *m.entry(k.op.kind_name()).or_insert(0) += 1;
        }
        m
    }

    /// A deterministic listing: buffers, then kernels with their views and descriptions.
    pub fn print(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "program bucket={} buffers={} kernels={}", self.bucket, self.buffers.len(), self.kernels.len());
        for (i, b) in self.buffers.iter().enumerate() {
            let dims = b.shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",");
            let kind = match &b.kind {
                BufferKind::Input { index } => format!("input#{index}"),
                BufferKind::Weight { index, layout, concat } => {
                    let more: String = match concat {
                        Some(c) => c.rest.iter().map(|i| format!("+#{i}")).chain([format!(" axis {}", c.axis)]).collect(),
                        None => String::new(),
                    };
                    let t = if *layout == WeightLayout::Transposed { " transposed" } else { "" };
                    format!("weight#{index}{more}{t}")
                }
                BufferKind::Constant { values } => {
                    let shown: Vec<String> = values.iter().take(8).map(|v| format!("{v:?}")).collect();
                    let more = if values.len() > 8 { ",.." } else { "" };
                    format!("const[{}{more}]", shown.join(","))
                }
                BufferKind::Arena => "arena".into(),
                BufferKind::Output { index } => format!("output#{index}"),
            };
            let _ = writeln!(s, "b{i} {kind} {} [{dims}] \"{}\"", b.dtype, b.name);
        }
        for (i, k) in self.kernels.iter().enumerate() {
            let _ = writeln!(s, "k{i} {} \"{}\"", k.op.kind_name(), k.name);
            match &k.op {
                KernelOp::Elementwise { expr } => {
                    let _ = writeln!(s, "  expr: {}", expr.print());
                }
                KernelOp::Gemm { batch, m, n, k: kk, alpha, epilogue, int_bounds } => {
                    let int = int_bounds.map(|(a, b)| format!(" ints ≤ {a}·{b}")).unwrap_or_default();
                    let _ = writeln!(s, "  batch={batch:?} m={m} n={n} k={kk} alpha={alpha:?}{int}");
                    if let Some(e) = epilogue {
                        let _ = writeln!(s, "  epilogue: {}", e.print());
                    }
                }
                KernelOp::Norm { kind, eps, prologue, gamma, beta } => {
                    let _ = writeln!(s, "  {kind:?} eps={eps:?} gamma=in{gamma} beta={}", beta.map(|b| format!("in{b}")).unwrap_or("-".into()));
                    let _ = writeln!(s, "  prologue: {}", prologue.print());
                }
                KernelOp::Softmax { prologue } => {
                    let _ = writeln!(s, "  prologue: {}", prologue.print());
                }
                KernelOp::Attention { batch, seq_q, seq_kv, head_dim, v_dim, scale, mask, zero_nan_rows } => {
                    let _ = writeln!(
                        s,
                        "  batch={batch:?} seq_q={seq_q} seq_kv={seq_kv} head_dim={head_dim} v_dim={v_dim} scale={scale:?} mask={}{}",
                        mask.map(|m| format!("in{m}")).unwrap_or("-".into()),
                        if *zero_nan_rows { " zero_nan_rows" } else { "" }
                    );
                }
                KernelOp::Gather => {}
                KernelOp::Reduce { op, shape, reduced_dims, prologue } => {
                    let _ = writeln!(s, "  {} shape={shape:?} reduced_dims={reduced_dims}", format!("{op:?}").to_lowercase());
                    let _ = writeln!(s, "  prologue: {}", prologue.print());
                }
                KernelOp::Concat { axis } => {
                    let _ = writeln!(s, "  axis={axis}");
                }
            }
            for (j, t) in k.inputs.iter().enumerate() {
                let _ = writeln!(s, "  in{j} = {t}");
            }
            let _ = writeln!(s, "  out = {}", k.output);
            let fused = if k.fused.is_empty() { "-".to_string() } else { k.fused.join(" ") };
            let _ = writeln!(s, "  fused: {fused}");
        }
        for (o, name) in self.outputs.iter().zip(&self.output_names) {
            let _ = writeln!(s, "output {name} = {o}");
        }
        s
    }
}

impl KernelProgram {
    /// Checks the program's internal consistency: every view inside its buffer, the shapes each
    /// kernel kind promises, expression operands, and that every arena/output buffer is written
    /// by exactly one kernel before any kernel reads it. Backends may rely on all of it.
    pub fn validate(&self) -> kiln_runtime::Result<()> {
        let err = |k: usize, m: String| kiln_runtime::Error::graph(format!("<kernel k{k}>"), m);
        let mut written = vec![false; self.buffers.len()];
        for (ki, k) in self.kernels.iter().enumerate() {
            for t in k.inputs.iter().chain([&k.output]) {
                let b = self.buffers.get(t.buffer.index()).ok_or_else(|| err(ki, format!("no buffer {}", t.buffer)))?;
                if t.shape.len() != t.strides.len() || t.extent() > b.numel() {
                    return Err(err(ki, format!("view {t} outside {} of {} elements", t.buffer, b.numel())));
                }
            }
            for t in &k.inputs {
                let b = &self.buffers[t.buffer.index()];
                if matches!(b.kind, BufferKind::Arena | BufferKind::Output { .. }) && !written[t.buffer.index()] {
                    return Err(err(ki, format!("reads {} before any kernel wrote it", t.buffer)));
                }
            }
            let ob = t_buf(self, &k.output);
            if !matches!(ob.kind, BufferKind::Arena | BufferKind::Output { .. }) {
                return Err(err(ki, format!("writes read-only buffer {}", k.output.buffer)));
            }
            if std::mem::replace(&mut written[k.output.buffer.index()], true) {
                return Err(err(ki, format!("{} is written by a second kernel", k.output.buffer)));
            }
            let out = &k.output.shape;
            let shape_is = |i: usize, want: &[usize]| -> kiln_runtime::Result<()> {
                match k.inputs.get(i) {
                    Some(t) if t.shape == want => Ok(()),
                    Some(t) => Err(err(ki, format!("in{i} has shape {:?}, expected {want:?}", t.shape))),
                    None => Err(err(ki, format!("missing in{i}"))),
                }
            };
            let check_expr = |e: &Expr, shape: &[usize], acc: bool, first_load: usize| -> kiln_runtime::Result<()> {
                if e.nodes.is_empty() {
                    return Err(err(ki, "empty expression".into()));
                }
                for (i, n) in e.nodes.iter().enumerate() {
                    let ok = |x: &ExprId| (*x as usize) < i;
                    let good = match n {
                        ExprNode::Load(l) => *l >= first_load && *l < k.inputs.len(),
                        ExprNode::Acc => acc,
                        ExprNode::Const(_) => true,
                        ExprNode::Unary(_, a) | ExprNode::Cast(_, a) => ok(a),
                        ExprNode::Binary(_, a, b) => ok(a) && ok(b),
                        ExprNode::Select(c, a, b) => ok(c) && ok(a) && ok(b),
                    };
                    if !good {
                        return Err(err(ki, format!("bad expression node v{i} = {n:?}")));
                    }
                    if let ExprNode::Load(l) = n {
                        shape_is(*l, shape)?;
                    }
                }
                Ok(())
            };
            match &k.op {
                KernelOp::Elementwise { expr } => check_expr(expr, out, false, 0)?,
                KernelOp::Gemm { batch, m, n, k: kk, epilogue, .. } => {
                    let with = |a: usize, b: usize| -> Vec<usize> { batch.iter().copied().chain([a, b]).collect() };
                    shape_is(0, &with(*m, *kk))?;
                    shape_is(1, &with(*kk, *n))?;
                    if *out != with(*m, *n) {
                        return Err(err(ki, format!("gemm output {out:?}")));
                    }
                    if let Some(e) = epilogue {
                        check_expr(e, out, true, 2)?;
                    }
                }
                KernelOp::Norm { prologue, gamma, beta, .. } => {
                    let cols = *out.last().ok_or_else(|| err(ki, "norm of a scalar".into()))?;
                    check_expr(prologue, out, false, 0)?;
                    shape_is(*gamma, &[cols])?;
                    if let Some(b) = beta {
                        shape_is(*b, &[cols])?;
                    }
                }
                KernelOp::Softmax { prologue } => {
                    if out.is_empty() {
                        return Err(err(ki, "softmax of a scalar".into()));
                    }
                    check_expr(prologue, out, false, 0)?;
                }
                KernelOp::Attention { batch, seq_q, seq_kv, head_dim, v_dim, mask, .. } => {
                    let with = |a: usize, b: usize| -> Vec<usize> { batch.iter().copied().chain([a, b]).collect() };
                    shape_is(0, &with(*seq_q, *head_dim))?;
                    shape_is(1, &with(*seq_kv, *head_dim))?;
                    shape_is(2, &with(*seq_kv, *v_dim))?;
                    if let Some(mk) = mask {
                        shape_is(*mk, &with(*seq_q, *seq_kv))?;
                    }
                    if *out != with(*seq_q, *v_dim) {
                        return Err(err(ki, format!("attention output {out:?}")));
                    }
                }
                KernelOp::Gather => {
                    let (t, ids) = (&k.inputs[0], &k.inputs[1]);
                    let want: Vec<usize> = ids.shape.iter().copied().chain([*t.shape.last().unwrap_or(&0)]).collect();
                    if t.rank() != 2 || *out != want || !t_buf(self, ids).dtype.is_int() {
                        return Err(err(ki, format!("gather of {:?} by {:?} into {out:?}", t.shape, ids.shape)));
                    }
                    // Further tables continue table 0's rows: same columns, column stride and
                    // element type.
                    for x in &k.inputs[2..] {
                        let stride_ok = t.shape[1] <= 1 || x.strides.get(1) == t.strides.get(1);
                        if x.rank() != 2 || x.shape[1] != t.shape[1] || !stride_ok || t_buf(self, x).dtype != t_buf(self, t).dtype {
                            return Err(err(ki, format!("gather table {:?} after {:?}", x.shape, t.shape)));
                        }
                    }
                }
                KernelOp::Reduce { shape, reduced_dims, prologue, .. } => {
                    if *reduced_dims > shape.len() || out[..] != shape[..shape.len() - reduced_dims] {
                        return Err(err(ki, format!("reduce of {shape:?} into {out:?}")));
                    }
                    check_expr(prologue, shape, false, 0)?;
                }
                KernelOp::Concat { axis } => {
                    let total: usize = k.inputs.iter().map(|t| t.shape.get(*axis).copied().unwrap_or(0)).sum();
                    let ok = *axis < out.len()
                        && total == out[*axis]
                        && k.inputs.iter().all(|t| {
                            t.rank() == out.len() && (0..out.len()).all(|d| d == *axis || t.shape[d] == out[d])
                        });
                    if !ok {
                        return Err(err(ki, format!("concat into {out:?}")));
                    }
                }
            }
        }
        for (i, b) in self.outputs.iter().enumerate() {
            let buf = self.buffers.get(b.index()).ok_or_else(|| err(0, format!("output {i} has no buffer")))?;
            if buf.kind != (BufferKind::Output { index: i }) || !written[b.index()] {
                return Err(err(0, format!("output {i} ({b}) is not an output buffer written by a kernel")));
            }
        }
        Ok(())
    }
}

fn t_buf<'p>(p: &'p KernelProgram, t: &BufferView) -> &'p Buffer {
    &p.buffers[t.buffer.index()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(shape: &[usize], strides: &[usize]) -> BufferView {
        BufferView { buffer: BufferId(0), offset: 0, shape: shape.to_vec(), strides: strides.to_vec() }
    }

    #[test]
    fn reshape_of_contiguous_and_transposed_views() {
        let d = BufferView::dense(BufferId(0), &[2, 3, 4]);
        assert!(d.is_contiguous());
        let r = d.reshape(&[6, 4]).unwrap();
        assert_eq!(r.strides, vec![4, 1]);
        // [b,s,h,d] -> transpose(0,2,1,3) is not mergeable over (h, d)...
        let x = BufferView::dense(BufferId(0), &[2, 5, 3, 4]).permute(&[0, 2, 1, 3]);
        assert!(x.reshape(&[2, 15, 4]).is_none());
        // ...but splitting a dim of a strided view is fine.
        let y = x.reshape(&[2, 3, 5, 2, 2]).unwrap();
        assert_eq!(y.strides, vec![60, 4, 12, 2, 1]);
        // Inserting and removing unit dims keeps strides.
        let z = t(&[3, 4], &[1, 3]).reshape(&[3, 1, 4]).unwrap();
        assert_eq!((z.strides[0], z.strides[2]), (1, 3));
        assert!(t(&[3, 4], &[1, 3]).reshape(&[12]).is_none());
    }

    #[test]
    fn broadcast_and_layouts() {
        let b = BufferView::dense(BufferId(1), &[4]).broadcast_to(&[2, 3, 4]).unwrap();
        assert_eq!(b.strides, vec![0, 0, 1]);
        assert!(b.has_broadcast());
        assert!(BufferView::dense(BufferId(1), &[3]).broadcast_to(&[4]).is_none());
        assert_eq!(t(&[3, 4], &[4, 1]).matrix_layout(), Some(MatrixLayout::RowMajor { ld: 4 }));
        assert_eq!(t(&[3, 4], &[1, 3]).matrix_layout(), Some(MatrixLayout::ColMajor { ld: 3 }));
        assert_eq!(t(&[2, 3], &[6, 2]).extent(), 1 + 6 + 4);
    }
}
