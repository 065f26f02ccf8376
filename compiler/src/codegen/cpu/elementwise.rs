//! Elementwise loop nests: elementwise kernels, copies, concatenation, and the strided
//! copy/convert used to materialize operands for the kernel table.
//!
//! [`emit_map`] is the workhorse: dims are coalesced over every view (dense runs merge, unit
//! dims vanish), the innermost dim runs as an `f32x4` loop with a scalar remainder when every
//! view allows it (unit stride, or stride 0 for a broadcast input, which is loaded once per
//! row), and the outermost dim is split across tasks.

use cranelift_codegen::ir::{InstBuilder, Value};
use kiln_runtime::DType;

use super::emit::Fx;
use super::expr::emit_expr;
use crate::kernel_ir::{Expr, Kernel, BufferView};

/// One operand of a map: a base address, strides in ELEMENTS per iteration dim, a dtype.
#[derive(Debug, Clone)]
pub(crate) struct MapView {
    pub ptr: Value,
    pub strides: Vec<i64>,
    pub dtype: DType,
}

/// Drops unit dims and merges dims that are dense with respect to each other in every view.
pub(crate) fn coalesce(shape: &[usize], strides: &[Vec<i64>]) -> (Vec<usize>, Vec<Vec<i64>>) {
    let keep: Vec<usize> = (0..shape.len()).filter(|&d| shape[d] != 1).collect();
    let mut dims: Vec<usize> = Vec::new();
    let mut st: Vec<Vec<i64>> = vec![Vec::new(); strides.len()];
    for &d in &keep {
        if let Some(&last) = dims.last() {
            let _ = last;
            let mergeable = strides.iter().enumerate().all(|(v, s)| *st[v].last().unwrap() == s[d] * shape[d] as i64);
            if mergeable {
                *dims.last_mut().unwrap() *= shape[d];
                for (v, s) in strides.iter().enumerate() {
                    *st[v].last_mut().unwrap() = s[d];
                }
                continue;
            }
        }
        dims.push(shape[d]);
        for (v, s) in strides.iter().enumerate() {
            st[v].push(s[d]);
        }
    }
    (dims, st)
}

/// Tasks worth splitting `work` elements of simple work into: one per `min_per_task` elements,
/// up to [`TASKS_PER_THREAD`] per thread, a multiple of the threads once there are more tasks
/// than threads (3 tasks on 2 threads would leave one thread a third of the time idle).
pub(crate) fn tasks_for(threads: usize, work: usize, min_per_task: usize) -> u32 {
    let t = threads.max(1);
    if t == 1 {
        return 1;
    }
    let n = (work / min_per_task.max(1)).clamp(1, t * TASKS_PER_THREAD);
    (if n > t { n / t * t } else { n }) as u32
}

/// Most tasks per thread of a split kernel. The pool hands tasks out one at a time, so with
/// several per thread a thread that starts late or loses its core to another process for a while
/// does less of the kernel instead of holding the other at the join: with one task per thread,
/// MiniLM's 8×128 layer norms (1024 rows) on 2 threads of the Zen 3 of 2026-12-07 left a thread
/// idle for 20–40% of each norm (the join's wait, measured per kernel).
const TASKS_PER_THREAD: usize = 4;

/// What a map computes per element.
pub(crate) enum MapBody<'b> {
    /// `out = f(inputs)`, at width 1 or 4.
    Float(&'b mut dyn FnMut(&mut Fx, &[Value], usize) -> Value),
    /// `out = in0`, integers copied exactly (no trip through f32).
    IntCopy,
}

/// Which part of a map's iteration space the running task covers.
#[derive(Clone, Copy)]
pub(crate) enum Part {
    /// All of it (a one-task kernel, or one that splits elsewhere).
    All,
    /// An equal share of the outermost coalesced dim per task.
    Split,
    /// Rows `lo..hi` of a 2-D shape (its dims are then not coalesced).
    Rows(Value, Value),
    /// Columns `lo..hi` of a 2-D shape (likewise).
    Cols(Value, Value),
}

impl Part {
    pub(crate) fn split_if(split: bool) -> Part {
        if split {
            Part::Split
        } else {
            Part::All
        }
    }
}

/// Emits `out[i] = body(in_0[i], .., in_{n-1}[i])` over `shape` (the `part` of it this task runs);
/// `views` = inputs then the output. Each input element is read before the output element at the
/// same index is written.
pub(crate) fn emit_map(fx: &mut Fx, shape: &[usize], views: &[MapView], part: Part, mut body: MapBody) {
    if shape.contains(&0) {
        return;
    }
    let strides: Vec<Vec<i64>> = views.iter().map(|v| v.strides.clone()).collect();
    let (mut dims, mut st) = match part {
        Part::All | Part::Split => coalesce(shape, &strides),
        Part::Rows(..) | Part::Cols(..) => {
            assert_eq!(shape.len(), 2, "a row or column part of a 2-D map");
            (shape.to_vec(), strides)
        }
    };
    if dims.is_empty() {
        dims.push(1);
        for s in st.iter_mut() {
            s.push(0);
        }
    }
    let nv = views.len();
    let out = nv - 1;
    let r = dims.len();
    let inner_n = dims[r - 1];
    let int_copy = matches!(body, MapBody::IntCopy);
    let vec = !int_copy
        && inner_n >= 4
        && views[out].dtype == DType::F32
        && st[out][r - 1] == 1
        && (0..out).all(|v| st[v][r - 1] == 0 || (st[v][r - 1] == 1 && views[v].dtype == DType::F32));
    let bytes: Vec<Vec<i64>> =
        (0..nv).map(|v| st[v].iter().map(|&s| s * views[v].dtype.size() as i64).collect()).collect();
    let ptrs: Vec<Value> = views.iter().map(|v| v.ptr).collect();
    let inner_bytes: Vec<i64> = bytes.iter().map(|b| b[r - 1]).collect();
    let outer_bytes: Vec<Vec<i64>> = bytes.iter().map(|b| b[..r - 1].to_vec()).collect();
    let dtypes: Vec<DType> = views.iter().map(|v| v.dtype).collect();

    let (outer_range, inner_range) = match part {
        Part::All => (None, None),
        Part::Split if r == 1 => (None, Some(fx.task_range(inner_n, if vec { 4 } else { 1 }))),
        Part::Split => (Some(fx.task_range(dims[0], 1)), None),
        Part::Rows(lo, hi) => (Some((lo, hi)), None),
        Part::Cols(lo, hi) => (None, Some((lo, hi))),
    };
    let outer_dims = dims[..r - 1].to_vec();
    fx.nest(&outer_dims, &ptrs, &outer_bytes, outer_range, &mut |fx, p| {
        let (lo, hi) = match inner_range {
            Some(rg) => rg,
            None => (fx.iconst(0), fx.iconst(inner_n as i64)),
        };
        emit_row(fx, p, &inner_bytes, &dtypes, lo, hi, vec, &mut body);
    });
}

#[allow(clippy::too_many_arguments)]
fn emit_row(
    fx: &mut Fx,
    p: &[Value],
    inner_bytes: &[i64],
    dtypes: &[DType],
    lo: Value,
    hi: Value,
    vec: bool,
    body: &mut MapBody,
) {
    let nv = p.len();
    let out = nv - 1;
    if let MapBody::IntCopy = body {
        fx.for_range(lo, hi, 1, &mut |fx, i| {
            let src = fx.offset(p[0], i, inner_bytes[0]);
            let v = fx.load_i64(dtypes[0], src);
            let dst = fx.offset(p[out], i, inner_bytes[out]);
            fx.store_i64(dtypes[out], v, dst);
        });
        return;
    }
    let MapBody::Float(f) = body else { unreachable!() };
    // Broadcast inputs: one load per row.
    let hoisted: Vec<Option<Value>> =
        (0..out).map(|v| if inner_bytes[v] == 0 { Some(fx.load_f(dtypes[v], p[v], 1)) } else { None }).collect();
    let mut tail_lo = lo;
    if vec {
        let splats: Vec<Option<Value>> = hoisted.iter().map(|h| h.map(|x| fx.splat(x))).collect();
        let len = fx.b.ins().isub(hi, lo);
        let len4 = fx.b.ins().band_imm_s(len, !3i64);
        let end4 = fx.b.ins().iadd(lo, len4);
        fx.for_range(lo, end4, 4, &mut |fx, i| {
            let vals: Vec<Value> = (0..out)
                .map(|v| match splats[v] {
                    Some(s) => s,
                    None => {
                        let a = fx.offset(p[v], i, 4);
                        fx.load_f(DType::F32, a, 4)
                    }
                })
                .collect();
            let y = f(fx, &vals, 4);
            let a = fx.offset(p[out], i, 4);
            fx.store_f(DType::F32, y, a);
        });
        tail_lo = end4;
    }
    fx.for_range(tail_lo, hi, 1, &mut |fx, i| {
        let vals: Vec<Value> = (0..out)
            .map(|v| match hoisted[v] {
                Some(s) => s,
                None => {
                    let a = fx.offset(p[v], i, inner_bytes[v]);
                    fx.load_f(dtypes[v], a, 1)
                }
            })
            .collect();
        let y = f(fx, &vals, 1);
        let a = fx.offset(p[out], i, inner_bytes[out]);
        fx.store_f(dtypes[out], y, a);
    });
}

/// The [`MapView`] of a kernel-IR view (whole iteration = the view's own shape).
pub(crate) fn map_view(fx: &mut Fx, t: &BufferView) -> MapView {
    let ptr = fx.view_base(t);
    MapView { ptr, strides: t.strides.iter().map(|&s| s as i64).collect(), dtype: fx.dtype(t.buffer) }
}

/// An elementwise kernel (`out = expr(inputs)`; a bare load is a copy). Returns its task count.
pub(crate) fn emit_elementwise(fx: &mut Fx, k: &Kernel, expr: &Expr) -> u32 {
    if let Some(tasks) = super::taps::emit_tap_sum(fx, k, expr) {
        return tasks;
    }
    let loads = expr.loads();
    let mut views: Vec<MapView> = loads.iter().map(|&l| map_view(fx, &k.inputs[l])).collect();
    views.push(map_view(fx, &k.output));
    let n = k.output.numel();
    let tasks = tasks_for(fx.env.threads, n, 1 << 15);
    let int_copy = expr.as_copy().is_some() && views[0].dtype.is_int() && views[1].dtype.is_int();
    if int_copy {
        emit_map(fx, &k.output.shape, &views, Part::split_if(tasks > 1), MapBody::IntCopy);
        return tasks;
    }
    let ninputs = k.inputs.len();
    let mut f = |fx: &mut Fx, vals: &[Value], w: usize| -> Value {
        let mut by_input: Vec<Option<Value>> = vec![None; ninputs];
        for (j, &l) in loads.iter().enumerate() {
            by_input[l] = Some(vals[j]);
        }
        emit_expr(fx, expr, w, &by_input, None)
    };
    emit_map(fx, &k.output.shape, &views, Part::split_if(tasks > 1), MapBody::Float(&mut f));
    tasks
}

/// Concatenation: one copy per input into its slice of the output.
pub(crate) fn emit_concat(fx: &mut Fx, k: &Kernel, axis: usize) -> u32 {
    let tasks = tasks_for(fx.env.threads, k.output.numel(), 1 << 15);
    let mut start = 0;
    for t in &k.inputs {
        let len = t.shape[axis];
        let dst = k.output.slice(axis, start, len);
        start += len;
        let views = [map_view(fx, t), map_view(fx, &dst)];
        let body = if views[0].dtype.is_int() && views[1].dtype.is_int() {
            MapBody::IntCopy
        } else {
            MapBody::Float(&mut |_fx: &mut Fx, v: &[Value], _w| v[0])
        };
        emit_map(fx, &t.shape, &views, Part::split_if(tasks > 1), body);
    }
    tasks
}

/// Copies view `t` (any dtype, any strides) into dense row-major f32 at `dst` (single task).
pub(crate) fn materialize(fx: &mut Fx, t: &BufferView, dst: Value) {
    let src = map_view(fx, t);
    let dense = crate::kernel_ir::dense_strides(&t.shape);
    let out = MapView { ptr: dst, strides: dense.iter().map(|&s| s as i64).collect(), dtype: DType::F32 };
    emit_map(fx, &t.shape, &[src, out], Part::All, MapBody::Float(&mut |_fx: &mut Fx, v: &[Value], _w| v[0]));
}

/// Copies dense f32 at `src` (shape of `t`) into view `t` (converting to its dtype).
pub(crate) fn store_dense(fx: &mut Fx, src: Value, t: &BufferView) {
    let dense = crate::kernel_ir::dense_strides(&t.shape);
    let s = MapView { ptr: src, strides: dense.iter().map(|&s| s as i64).collect(), dtype: DType::F32 };
    let d = map_view(fx, t);
    emit_map(fx, &t.shape, &[s, d], Part::All, MapBody::Float(&mut |_fx: &mut Fx, v: &[Value], _w| v[0]));
}
