//! Row kernels (normalizations, softmax): an outer loop over the rows of the iteration shape
//! (all dims but the last, coalesced, split across tasks) and column passes inside each row,
//! `f32x4` with a scalar remainder when the row's views allow it.

use cranelift_codegen::ir::{InstBuilder, Value};
use kiln_runtime::DType;

use super::elementwise::coalesce;
use super::emit::Fx;
use super::expr::emit_expr;
use crate::kernel_ir::{Expr, Kernel, BufferView};

/// One row kernel's shape and views.
pub(crate) struct Rows<'k> {
    pub k: &'k Kernel,
    pub prologue: &'k Expr,
    /// Kernel inputs the prologue loads.
    pub loads: Vec<usize>,
    pub load_dt: Vec<DType>,
    /// Column stride (elements) of each loaded view.
    pub load_cs: Vec<i64>,
    pub out_dt: DType,
    pub out_cs: i64,
    pub cols: usize,
    pub rows: usize,
    /// Column passes run 4 lanes at a time.
    pub vec: bool,
}

/// Pointers of one row.
pub(crate) struct RowPtrs {
    pub loads: Vec<Value>,
    pub out: Value,
    /// Loads with column stride 0, read once per row.
    pub hoisted: Vec<Option<Value>>,
}

fn last_stride(t: &BufferView) -> i64 {
    *t.strides.last().unwrap_or(&0) as i64
}

impl<'k> Rows<'k> {
    /// `extra` are other per-column views (gamma, beta) that must allow vector access too.
    pub fn new(fx: &Fx, k: &'k Kernel, prologue: &'k Expr, extra: &[&BufferView]) -> Self {
        let loads = prologue.loads();
        let load_dt: Vec<DType> = loads.iter().map(|&l| fx.dtype(k.inputs[l].buffer)).collect();
        let load_cs: Vec<i64> = loads.iter().map(|&l| last_stride(&k.inputs[l])).collect();
        let out_dt = fx.dtype(k.output.buffer);
        let out_cs = last_stride(&k.output);
        let cols = *k.output.shape.last().unwrap_or(&1);
        let rows = k.output.numel() / cols.max(1);
        let vec_ok = |dt: DType, cs: i64| cs == 0 || (cs == 1 && dt == DType::F32);
        let vec = cols >= 4
            && out_dt == DType::F32
            && out_cs == 1
            && load_dt.iter().zip(&load_cs).all(|(&d, &c)| vec_ok(d, c))
            && extra.iter().all(|t| vec_ok(fx.dtype(t.buffer), last_stride(t)));
        Rows { k, prologue, loads, load_dt, load_cs, out_dt, out_cs, cols, rows, vec }
    }

    /// Whether the prologue value can be parked in the output row between passes.
    pub fn store_x(&self) -> bool {
        self.out_dt == DType::F32
    }

    /// Emits the row loop; `per_row` emits the passes of one row.
    pub fn emit(&self, fx: &mut Fx, split: bool, per_row: &mut dyn FnMut(&mut Fx, &Rows, &RowPtrs)) {
        if self.k.output.numel() == 0 {
            return;
        }
        let r = self.k.output.rank();
        let mut views: Vec<&BufferView> = self.loads.iter().map(|&l| &self.k.inputs[l]).collect();
        views.push(&self.k.output);
        let ptrs: Vec<Value> = views.iter().map(|t| fx.view_base(t)).collect();
        let sizes: Vec<i64> = views.iter().map(|t| fx.dtype(t.buffer).size() as i64).collect();
        let strides: Vec<Vec<i64>> = views.iter().map(|t| t.strides[..r - 1].iter().map(|&s| s as i64).collect()).collect();
        let (dims, st) = coalesce(&self.k.output.shape[..r - 1], &strides);
        let bytes: Vec<Vec<i64>> = st.iter().zip(&sizes).map(|(s, &z)| s.iter().map(|&x| x * z).collect()).collect();
        let range = if split && !dims.is_empty() { Some(fx.task_range(dims[0], 1)) } else { None };
        let nl = self.loads.len();
        fx.nest(&dims, &ptrs, &bytes, range, &mut |fx, p| {
            let hoisted: Vec<Option<Value>> = (0..nl)
                .map(|j| if self.load_cs[j] == 0 { Some(fx.load_f(self.load_dt[j], p[j], 1)) } else { None })
                .collect();
            let rp = RowPtrs { loads: p[..nl].to_vec(), out: p[nl], hoisted };
            per_row(fx, self, &rp);
        });
    }

    /// Column pass `body(i, w, slot)` over `0..cols`: 8 columns per trip as two 4-lane halves
    /// (`slot` 0 and 1, so reductions can keep two independent accumulators), then one 4-lane
    /// step if 4 columns remain, then single lanes (`slot` 0).
    pub fn cols_loop(&self, fx: &mut Fx, body: &mut dyn FnMut(&mut Fx, Value, usize, usize)) {
        let c8 = if self.vec { self.cols / 8 * 8 } else { 0 };
        let c4 = if self.vec { self.cols / 4 * 4 } else { 0 };
        if c8 > 0 {
            let lo = fx.iconst(0);
            let hi = fx.iconst(c8 as i64);
            fx.for_range(lo, hi, 8, &mut |fx, i| {
                body(fx, i, 4, 0);
                let i4 = fx.add_imm(i, 4);
                body(fx, i4, 4, 1);
            });
        }
        if c4 > c8 {
            let i = fx.iconst(c8 as i64);
            body(fx, i, 4, 0);
        }
        if c4 < self.cols {
            let lo = fx.iconst(c4 as i64);
            let hi = fx.iconst(self.cols as i64);
            fx.for_range(lo, hi, 1, &mut |fx, i| body(fx, i, 1, 0));
        }
    }

    /// The prologue value at column `i`.
    pub fn prologue_at(&self, fx: &mut Fx, rp: &RowPtrs, i: Value, w: usize) -> Value {
        let mut by_input: Vec<Option<Value>> = vec![None; self.k.inputs.len()];
        for (j, &l) in self.loads.iter().enumerate() {
            let v = match rp.hoisted[j] {
                Some(h) if w == 4 => fx.splat(h),
                Some(h) => h,
                None => {
                    let size = self.load_dt[j].size() as i64;
                    let a = fx.offset(rp.loads[j], i, self.load_cs[j] * size);
                    fx.load_f(self.load_dt[j], a, w)
                }
            };
            by_input[l] = Some(v);
        }
        emit_expr(fx, self.prologue, w, &by_input, None)
    }

    pub fn out_addr(&self, fx: &mut Fx, rp: &RowPtrs, i: Value) -> Value {
        fx.offset(rp.out, i, self.out_cs * self.out_dt.size() as i64)
    }

    /// The row's value at `i`: parked in the output (f32) or recomputed.
    pub fn x_at(&self, fx: &mut Fx, rp: &RowPtrs, i: Value, w: usize) -> Value {
        if self.store_x() {
            let a = self.out_addr(fx, rp, i);
            fx.load_f(DType::F32, a, w)
        } else {
            self.prologue_at(fx, rp, i, w)
        }
    }

    /// Reduces two vector accumulators and a scalar one (the parts of a column pass).
    pub fn combine(&self, fx: &mut Fx, v: [Value; 2], s: Value, max: bool) -> Value {
        if !self.vec || self.cols < 4 {
            return s;
        }
        if max {
            let v = fx.b.ins().fmax(v[0], v[1]);
            let h = fx.hmax(v);
            fx.b.ins().fmax(h, s)
        } else {
            let v = fx.b.ins().fadd(v[0], v[1]);
            let h = fx.hsum(v);
            fx.b.ins().fadd(h, s)
        }
    }
}
