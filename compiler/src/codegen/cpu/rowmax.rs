//! Max reductions of dense f32 rows — `max(x)` or `max(-x)` over the innermost dims, as a
//! dynamic quantization's range is — run through the kernel table's `max_rows_f32` (16 or 8
//! lanes, an integer order key per value, see `kiln_kernels::rowmax`) instead of 4-lane
//! generated code whose every step is a NaN- and signed-zero-exact `fmax` sequence. The same
//! maximum (a maximum does not depend on the order it is taken in); a NaN's payload may differ,
//! which kiln's NaN contract leaves open. Anything else stays `reduce.rs`'s code.
//!
//! (Matched at code generation, as `taps.rs`: the reduce kernel stays the one definition the
//! other backends and the reference evaluate.)

use kiln_kernels::rowmax::MaxRowsArgs;
use kiln_kernels::table::KernelTable;
use kiln_runtime::graph::UnaryOp;
use kiln_runtime::DType;
use std::mem::offset_of;

use super::elementwise::{coalesce, tasks_for};
use super::emit::Fx;
use super::table_rows::{Args, RowRuns};
use crate::kernel_ir::{Expr, ExprNode, Kernel};

/// The loaded input and whether it is negated, for a prologue `load` or `neg(load)`.
fn match_prologue(e: &Expr) -> Option<(usize, bool)> {
    match e.nodes.as_slice() {
        [ExprNode::Load(i)] => Some((*i, false)),
        [ExprNode::Load(i), ExprNode::Unary(UnaryOp::Neg, 0)] => Some((*i, true)),
        _ => None,
    }
}

/// Emits a max reduction of `reduced` innermost dims of `shape` as row-max calls when its
/// prologue and layout match; returns its task count, or None (nothing emitted).
pub(crate) fn emit_max_rows(fx: &mut Fx, k: &Kernel, shape: &[usize], reduced: usize, prologue: &Expr) -> Option<u32> {
    let (l, negate) = match_prologue(prologue)?;
    let (x, out) = (&k.inputs[l], &k.output);
    if fx.dtype(x.buffer) != DType::F32 || fx.dtype(out.buffer) != DType::F32 {
        return None;
    }
    let outer = shape.len() - reduced;
    let cols: usize = shape[outer..].iter().product();
    // The reduced dims one dense run in the input.
    let (idims, ist) = coalesce(&shape[outer..], &[x.strides[outer..].iter().map(|&s| s as i64).collect()]);
    if cols == 0 || idims.len() != 1 || ist[0] != [1] {
        return None;
    }
    let st: Vec<Vec<i64>> = [&x.strides[..outer], &out.strides[..]].iter().map(|s| s.iter().map(|&v| v as i64).collect()).collect();
    let runs = RowRuns::new(&shape[..outer], &st);
    let n_out: usize = shape[..outer].iter().product();
    let tasks = tasks_for(fx.env.threads, n_out * cols, 1 << 15);

    let args = Args::new(fx, std::mem::size_of::<MaxRowsArgs>());
    let (xs, os) = (runs.row_strides[0], runs.row_strides[1]);
    for (v, off) in [(cols, offset_of!(MaxRowsArgs, cols)), (xs as usize, offset_of!(MaxRowsArgs, x_stride)), (os as usize, offset_of!(MaxRowsArgs, out_stride)), (negate as usize, offset_of!(MaxRowsArgs, negate))] {
        args.store_int(fx, v as i64, off);
    }
    let bases = [fx.view_base(x), fx.view_base(out)];
    let offs = [offset_of!(MaxRowsArgs, x), offset_of!(MaxRowsArgs, out)];
    runs.emit_calls(fx, tasks, &args, &bases, &offs, offset_of!(MaxRowsArgs, rows), KernelTable::OFF_MAX_ROWS_F32);
    Some(tasks)
}
