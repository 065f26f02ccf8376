//! Max reductions of dense f32 rows — `max(x)` or `max(-x)` over the innermost dims, as a
//! dynamic quantization's range is — run through the kernel table's `max_rows_f32` (16 or 8
//! lanes, an integer order key per value, see `kiln_kernels::rowmax`) instead of 4-lane
//! generated code whose every step is a NaN- and signed-zero-exact `fmax` sequence. The same
//! maximum (a maximum does not depend on the order it is taken in); a NaN's payload may differ,
//! which kiln's NaN contract leaves open. Anything else stays `reduce.rs`'s code.
//!
//! (Matched at code generation, as `taps.rs`: the reduce kernel stays the one definition the
//! other backends and the reference evaluate.)

use cranelift_codegen::ir::{InstBuilder, Value};
use kiln_kernels::rowmax::MaxRowsArgs;
use kiln_kernels::table::KernelTable;
use kiln_runtime::graph::UnaryOp;
use kiln_runtime::DType;
use std::mem::offset_of;

use super::elementwise::{coalesce, tasks_for};
use super::emit::{mf, Fx};
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
    let (mut dims, mut st) = coalesce(&shape[..outer], &st);
    // Rows per call: the innermost outer dim (one row when there is none).
    let (rows, xs, os) = match dims.pop() {
        Some(d) => (d, st[0].pop().unwrap(), st[1].pop().unwrap()),
        None => (1, 0, 0),
    };
    let n_out: usize = shape[..outer].iter().product();
    let tasks = tasks_for(fx.env.threads, n_out * cols, 1 << 15);

    let args = fx.stack(std::mem::size_of::<MaxRowsArgs>() as u32);
    let a = fx.stack_addr(args);
    let store = |fx: &mut Fx, v: Value, off: usize| {
        fx.b.ins().store(mf(), v, a, off as i32);
    };
    for (v, off) in [(cols, offset_of!(MaxRowsArgs, cols)), (xs as usize, offset_of!(MaxRowsArgs, x_stride)), (os as usize, offset_of!(MaxRowsArgs, out_stride)), (negate as usize, offset_of!(MaxRowsArgs, negate))] {
        let v = fx.iconst(v as i64);
        store(fx, v, off);
    }
    let ptrs = vec![fx.view_base(x), fx.view_base(out)];
    let bytes: Vec<Vec<i64>> = st.iter().map(|s| s.iter().map(|&v| v * 4).collect()).collect();
    // Tasks split the outermost remaining dim, or the rows of the one call.
    let (outer_range, split_rows) = match (tasks > 1, dims.is_empty()) {
        (false, _) => (None, None),
        (true, false) => (Some(fx.task_range(dims[0], 1)), None),
        (true, true) => (None, Some(fx.task_range(rows, 1))),
    };
    fx.nest(&dims, &ptrs, &bytes, outer_range, &mut |fx, p| {
        let (lo, count) = match split_rows {
            Some((lo, hi)) => (Some(lo), fx.b.ins().isub(hi, lo)),
            None => (None, fx.iconst(rows as i64)),
        };
        store(fx, count, offset_of!(MaxRowsArgs, rows));
        let at = |fx: &mut Fx, ptr: Value, stride: i64| match lo {
            Some(lo) => fx.offset(ptr, lo, stride * 4),
            None => ptr,
        };
        let xp = at(fx, p[0], xs);
        store(fx, xp, offset_of!(MaxRowsArgs, x));
        let op = at(fx, p[1], os);
        store(fx, op, offset_of!(MaxRowsArgs, out));
        let call = [fx.table, a];
        let st = fx.call_table(KernelTable::OFF_MAX_ROWS_F32, &call, true).expect("max_rows returns a status");
        fx.check_status(st);
    });
    Some(tasks)
}
