//! Calling a kernel-table entry that works on a run of rows (`tap_sum_f32`, `max_rows_f32`):
//! its arguments struct on the stack, the constant fields stored once, and one call per point of
//! the outer dims with that point's pointers and the row count; tasks split the outermost outer
//! dim, or the rows of the one call when there is no outer dim left.
//! (The matchers stay in `taps.rs` and `rowmax.rs`; this is only how either calls its entry.)

use cranelift_codegen::ir::{InstBuilder, Value};

use super::elementwise::coalesce;
use super::emit::{mf, Fx};

/// An entry's arguments struct in a stack slot.
pub(crate) struct Args(Value);

impl Args {
    /// A slot of `bytes` (the struct's `size_of`).
    pub(crate) fn new(fx: &mut Fx, bytes: usize) -> Self {
        let s = fx.stack(bytes as u32);
        Args(fx.stack_addr(s))
    }
    /// Stores `v` at byte offset `off` (an `offset_of!` of the struct).
    pub(crate) fn store(&self, fx: &mut Fx, v: Value, off: usize) {
        fx.b.ins().store(mf(), v, self.0, off as i32);
    }
    /// Stores the 64-bit integer `v` at `off`.
    pub(crate) fn store_int(&self, fx: &mut Fx, v: i64, off: usize) {
        let v = fx.iconst(v);
        self.store(fx, v, off);
    }
}

/// The loops around an entry's calls: the iteration space's dims coalesced, the innermost
/// left the rows of one call.
pub(crate) struct RowRuns {
    /// The outer dims generated code loops over.
    dims: Vec<usize>,
    /// Per pointer, its step per outer dim (f32 elements).
    steps: Vec<Vec<i64>>,
    /// Rows per call (1 when no dim is left for them).
    pub rows: usize,
    /// Per pointer, elements from one row of a call to the next (0 for a single row).
    pub row_strides: Vec<i64>,
}

impl RowRuns {
    /// Dims `shape`, pointer `i` stepping `strides[i][d]` f32 elements per step of dim `d`.
    pub(crate) fn new(shape: &[usize], strides: &[Vec<i64>]) -> Self {
        let (mut dims, mut steps) = coalesce(shape, strides);
        let (rows, row_strides) = match dims.pop() {
            Some(d) => (d, steps.iter_mut().map(|s| s.pop().unwrap()).collect()),
            None => (1, vec![0; strides.len()]),
        };
        RowRuns { dims, steps, rows, row_strides }
    }

    /// The calls of this task: `bases[i]` (pointer `i` at the first point) stored at
    /// `ptr_offs[i]` of `args`, advanced to each point and, when tasks split the rows, to the
    /// task's first row; the row count at `count_off`; then table entry `entry` with
    /// `(table, args)`, its status checked.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn emit_calls(
        &self,
        fx: &mut Fx,
        tasks: u32,
        args: &Args,
        bases: &[Value],
        ptr_offs: &[usize],
        count_off: usize,
        entry: usize,
    ) {
        let bytes: Vec<Vec<i64>> = self.steps.iter().map(|s| s.iter().map(|&v| v * 4).collect()).collect();
        let (outer_range, split_rows) = match (tasks > 1, self.dims.is_empty()) {
            (false, _) => (None, None),
            (true, false) => (Some(fx.task_range(self.dims[0], 1)), None),
            (true, true) => (None, Some(fx.task_range(self.rows, 1))),
        };
        fx.nest(&self.dims, bases, &bytes, outer_range, &mut |fx, p| {
            let (lo, count) = match split_rows {
                Some((lo, hi)) => (Some(lo), fx.b.ins().isub(hi, lo)),
                None => (None, fx.iconst(self.rows as i64)),
            };
            args.store(fx, count, count_off);
            for ((&ptr, &off), &rs) in p.iter().zip(ptr_offs).zip(&self.row_strides) {
                let ptr = match lo {
                    Some(lo) => fx.offset(ptr, lo, rs * 4),
                    None => ptr,
                };
                args.store(fx, ptr, off);
            }
            let call = [fx.table, args.0];
            let st = fx.call_table(entry, &call, true).expect("a row entry returns a status");
            fx.check_status(st);
        });
    }
}
