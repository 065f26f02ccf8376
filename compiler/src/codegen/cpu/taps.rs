//! Elementwise kernels that are per-channel weighted sums of shifted views — a depthwise
//! convolution as the ONNX importer writes it, `((x₀·w₀ + x₁·w₁) + …) (+ bias)` with every
//! `xₜ` one strided view at different offsets and every `wₜ` (and the bias) one value per
//! channel, then up to two `max`/`min` against constants (ReLU, ReLU6) — run through the kernel
//! table's `tap_sum_f32` (16 or 8 lanes, the expression's operations in its order, see
//! `kiln_kernels::taps`) instead of 4-lane generated code.
//! Anything else, or a sum past `MAX_TAPS` taps, stays an ordinary elementwise kernel.
//!
//! (A pattern at code generation rather than a kernel-IR op: the expression stays the one
//! definition every other backend and the reference evaluate; this is only how the CPU runs it.)

use cranelift_codegen::ir::types::I32;
use cranelift_codegen::ir::{InstBuilder, Value};
use kiln_kernels::table::KernelTable;
use kiln_kernels::taps::{TapSumArgs, MAX_POST, MAX_TAPS, TAP_MAX, TAP_MIN};
use kiln_runtime::graph::BinaryOp;
use kiln_runtime::DType;
use std::mem::offset_of;

use super::elementwise::tasks_for;
use super::emit::Fx;
use super::table_rows::{Args, RowRuns};
use crate::kernel_ir::{BufferView, Expr, ExprId, ExprNode, Kernel};

/// The taps `(x input, w input)`, the bias input and the clamps (in order) of a matching
/// expression.
struct Taps {
    taps: Vec<(usize, usize)>,
    bias: Option<usize>,
    post: Vec<(u32, f32)>,
}

/// One value per channel: every stride 0 but the last, which is 1.
fn per_channel(v: &BufferView) -> bool {
    let r = v.rank();
    r >= 1 && v.strides[r - 1] == 1 && v.strides[..r - 1].iter().all(|&s| s == 0)
}

/// `((p₀ + p₁) + …) (+ bias)` with each `pₜ = load · load`, one factor a per-channel view.
fn match_taps(k: &Kernel, e: &Expr) -> Option<Taps> {
    let n = &e.nodes;
    let node = |id: ExprId| &n[id as usize];
    let load = |id: ExprId| match node(id) {
        ExprNode::Load(i) => Some(*i),
        _ => None,
    };
    let product = |id: ExprId| -> Option<(usize, usize)> {
        let ExprNode::Binary(BinaryOp::Mul, a, b) = node(id) else { return None };
        let (a, b) = (load(*a)?, load(*b)?);
        match (per_channel(&k.inputs[a]), per_channel(&k.inputs[b])) {
            (false, true) => Some((a, b)),
            (true, false) => Some((b, a)),
            _ => None,
        }
    };
    let mut cur = e.root();
    // Clamps against constants, outermost first (`max`/`min` with a constant operand on either
    // side, as generated code compiles them: a compare and a blend).
    let mut post = Vec::new();
    while post.len() < MAX_POST {
        let ExprNode::Binary(op @ (BinaryOp::Max | BinaryOp::Min), a, b) = node(cur) else { break };
        let (v, c) = match (node(*a), node(*b)) {
            (_, ExprNode::Const(c)) => (*a, *c),
            (ExprNode::Const(c), _) => (*b, *c),
            _ => break,
        };
        if c.is_nan() {
            break;
        }
        post.push((if *op == BinaryOp::Max { TAP_MAX } else { TAP_MIN }, c));
        cur = v;
    }
    post.reverse();
    let mut bias = None;
    if let ExprNode::Binary(BinaryOp::Add, a, b) = node(cur) {
        if let Some(l) = load(*b).filter(|&l| per_channel(&k.inputs[l])) {
            bias = Some(l);
            cur = *a;
        }
    }
    let mut taps = Vec::new();
    loop {
        match node(cur) {
            ExprNode::Binary(BinaryOp::Mul, ..) => {
                taps.push(product(cur)?);
                break;
            }
            ExprNode::Binary(BinaryOp::Add, a, b) => {
                taps.push(product(*b)?);
                cur = *a;
            }
            _ => return None,
        }
    }
    taps.reverse();
    (2..=MAX_TAPS).contains(&taps.len()).then_some(Taps { taps, bias, post })
}

/// Emits `k` as tap-sum calls when its expression matches; returns its task count, or None
/// (nothing emitted) when it does not.
pub(crate) fn emit_tap_sum(fx: &mut Fx, k: &Kernel, e: &Expr) -> Option<u32> {
    let t = match_taps(k, e)?;
    let out = &k.output;
    let shape = &out.shape;
    let r = shape.len();
    let x0 = &k.inputs[t.taps[0].0];
    let f32s = t.taps.iter().flat_map(|&(x, w)| [x, w]).chain(t.bias).all(|i| fx.dtype(k.inputs[i].buffer) == DType::F32);
    let same_x = t.taps.iter().all(|&(x, _)| k.inputs[x].shape == *shape && k.inputs[x].strides == x0.strides);
    if r == 0 || !f32s || !same_x || fx.dtype(out.buffer) != DType::F32 || out.strides[r - 1] != 1 || x0.strides[r - 1] != 1 {
        return None;
    }
    let c = shape[r - 1];
    let ntaps = t.taps.len();
    // Per pointer (each tap's x, then the output), its strides over the outer dims.
    let st: Vec<Vec<i64>> = (0..=ntaps)
        .map(|i| if i < ntaps { &x0.strides[..r - 1] } else { &out.strides[..r - 1] }.iter().map(|&v| v as i64).collect())
        .collect();
    // Pixels per call: the innermost outer dim.
    let runs = RowRuns::new(&shape[..r - 1], &st);
    let tasks = tasks_for(fx.env.threads, out.numel(), 1 << 15);

    let args = Args::new(fx, std::mem::size_of::<TapSumArgs>());
    let (xs, os) = (runs.row_strides[0], runs.row_strides[ntaps]);
    for (v, off) in [(c, offset_of!(TapSumArgs, c)), (xs as usize, offset_of!(TapSumArgs, x_stride)), (os as usize, offset_of!(TapSumArgs, out_stride)), (ntaps, offset_of!(TapSumArgs, taps))] {
        args.store_int(fx, v as i64, off);
    }
    let bias = match t.bias {
        Some(b) => fx.view_base(&k.inputs[b]),
        None => fx.iconst(0),
    };
    args.store(fx, bias, offset_of!(TapSumArgs, bias));
    args.store_int(fx, t.post.len() as i64, offset_of!(TapSumArgs, post));
    for (i, &(op, c)) in t.post.iter().enumerate() {
        let o = fx.b.ins().iconst(I32, op as i64);
        args.store(fx, o, offset_of!(TapSumArgs, post_op) + 4 * i);
        let c = fx.b.ins().f32const(c);
        args.store(fx, c, offset_of!(TapSumArgs, post_c) + 4 * i);
    }
    for (i, &(_, w)) in t.taps.iter().enumerate() {
        let wp = fx.view_base(&k.inputs[w]);
        args.store(fx, wp, offset_of!(TapSumArgs, w) + 8 * i);
    }
    // Per call: the taps' and the output's pointers, the pixel count.
    let mut bases: Vec<Value> = t.taps.iter().map(|&(x, _)| fx.view_base(&k.inputs[x])).collect();
    bases.push(fx.view_base(out));
    let offs: Vec<usize> = (0..=ntaps).map(|i| if i < ntaps { offset_of!(TapSumArgs, x) + 8 * i } else { offset_of!(TapSumArgs, out) }).collect();
    runs.emit_calls(fx, tasks, &args, &bases, &offs, offset_of!(TapSumArgs, n), KernelTable::OFF_TAP_SUM_F32);
    Some(tasks)
}
