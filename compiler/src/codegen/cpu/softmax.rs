//! Softmax over the last dim of `x = prologue(loads)` (scale and additive mask fused in):
//! `exp(x - max) / Σ exp(x - max)`, three column passes per row (max, exp and sum, scale).

use cranelift_codegen::ir::types::{F32, F32X4};
use cranelift_codegen::ir::InstBuilder;
use kiln_runtime::DType;

use super::elementwise::tasks_for;
use super::emit::Fx;
use super::math;
use super::rows::Rows;
use crate::kernel_ir::{Expr, Kernel};

pub(crate) fn emit_softmax(fx: &mut Fx, k: &Kernel, prologue: &Expr) -> u32 {
    let rows = Rows::new(fx, k, prologue, &[]);
    let tasks = if rows.rows >= 2 { tasks_for(fx.env.threads, k.output.numel(), 1 << 13).min(rows.rows as u32) } else { 1 };
    rows.emit(fx, tasks > 1, &mut |fx, rows, rp| {
        let ninf_v = fx.fconst(f32::NEG_INFINITY, 4);
        let ninf_s = fx.fconst(f32::NEG_INFINITY, 1);
        let vm = [fx.var(F32X4, ninf_v), fx.var(F32X4, ninf_v)];
        let sm = fx.var(F32, ninf_s);
        rows.cols_loop(fx, &mut |fx, i, w, slot| {
            let x = rows.prologue_at(fx, rp, i, w);
            if rows.store_x() {
                let a = rows.out_addr(fx, rp, i);
                fx.store_f(DType::F32, x, a);
            }
            let var = if w == 4 { vm[slot] } else { sm };
            let m = fx.b.use_var(var);
            let m = fx.b.ins().fmax(m, x);
            fx.b.def_var(var, m);
        });
        let v = [fx.b.use_var(vm[0]), fx.b.use_var(vm[1])];
        let s = fx.b.use_var(sm);
        let mx = rows.combine(fx, v, s, true);
        let mx4 = fx.splat(mx);
        let zv = fx.fconst(0.0, 4);
        let zs = fx.fconst(0.0, 1);
        let vs = [fx.var(F32X4, zv), fx.var(F32X4, zv)];
        let ss = fx.var(F32, zs);
        rows.cols_loop(fx, &mut |fx, i, w, slot| {
            let x = rows.x_at(fx, rp, i, w);
            let d = fx.b.ins().fsub(x, if w == 4 { mx4 } else { mx });
            let e = math::exp(fx, d);
            if rows.store_x() {
                let a = rows.out_addr(fx, rp, i);
                fx.store_f(DType::F32, e, a);
            }
            let var = if w == 4 { vs[slot] } else { ss };
            let acc = fx.b.use_var(var);
            let acc = fx.b.ins().fadd(acc, e);
            fx.b.def_var(var, acc);
        });
        let v = [fx.b.use_var(vs[0]), fx.b.use_var(vs[1])];
        let s = fx.b.use_var(ss);
        let sum = rows.combine(fx, v, s, false);
        let one = fx.b.ins().f32const(1.0);
        let inv = fx.b.ins().fdiv(one, sum);
        let inv4 = fx.splat(inv);
        rows.cols_loop(fx, &mut |fx, i, w, _| {
            let e = if rows.store_x() {
                let a = rows.out_addr(fx, rp, i);
                fx.load_f(DType::F32, a, w)
            } else {
                let x = rows.prologue_at(fx, rp, i, w);
                let d = fx.b.ins().fsub(x, if w == 4 { mx4 } else { mx });
                math::exp(fx, d)
            };
            let y = fx.b.ins().fmul(e, if w == 4 { inv4 } else { inv });
            let a = rows.out_addr(fx, rp, i);
            fx.store_f(rows.out_dt, y, a);
        });
    });
    tasks
}
