//! LayerNorm and RMSNorm over the last dim, with the prologue (e.g. a residual add) fused in.
//!
//! Per row: pass 1 evaluates the prologue, parks it in the output row (f32 outputs; otherwise
//! it is recomputed) and sums it (RMSNorm: sums squares); pass 2 (LayerNorm) sums squared
//! deviations from the mean (two-pass variance, as the reference); pass 3 writes
//! `(x - mean)·rstd·gamma + beta`.

use cranelift_codegen::ir::types::{F32, F32X4};
use cranelift_codegen::ir::InstBuilder;
use kiln_runtime::DType;

use super::elementwise::tasks_for;
use super::emit::Fx;
use super::rows::Rows;
use crate::kernel_ir::{Expr, Kernel, NormKind};

pub(crate) fn emit_norm(fx: &mut Fx, k: &Kernel, kind: NormKind, eps: f32, prologue: &Expr, gamma: usize, beta: Option<usize>) -> u32 {
    let g = &k.inputs[gamma];
    let bt = beta.map(|b| &k.inputs[b]);
    let mut extra = vec![g];
    if let Some(b) = bt {
        extra.push(b);
    }
    let rows = Rows::new(fx, k, prologue, &extra);
    let tasks = if rows.rows >= 2 { tasks_for(fx.env.threads, k.output.numel(), 1 << 14).min(rows.rows as u32) } else { 1 };
    let g_ptr = fx.view_base(g);
    let g_cs = g.strides[0] as i64;
    let g_dt = fx.dtype(g.buffer);
    let b_info = bt.map(|b| (fx.view_base(b), b.strides[0] as i64, fx.dtype(b.buffer)));
    let cols = rows.cols as f32;
    rows.emit(fx, tasks > 1, &mut |fx, rows, rp| {
        let zv = fx.fconst(0.0, 4);
        let zs = fx.fconst(0.0, 1);
        let va = [fx.var(F32X4, zv), fx.var(F32X4, zv)];
        let sa = fx.var(F32, zs);
        // Pass 1: x, its sum (or sum of squares).
        rows.cols_loop(fx, &mut |fx, i, w, slot| {
            let x = rows.prologue_at(fx, rp, i, w);
            if rows.store_x() {
                let a = rows.out_addr(fx, rp, i);
                fx.store_f(DType::F32, x, a);
            }
            let var = if w == 4 { va[slot] } else { sa };
            let acc = fx.b.use_var(var);
            let acc = match kind {
                NormKind::LayerNorm => fx.b.ins().fadd(acc, x),
                NormKind::RmsNorm => fx.fma(x, x, acc),
            };
            fx.b.def_var(var, acc);
        });
        let v = [fx.b.use_var(va[0]), fx.b.use_var(va[1])];
        let s = fx.b.use_var(sa);
        let total = rows.combine(fx, v, s, false);
        let n = fx.b.ins().f32const(cols);
        let (mean, ms) = match kind {
            NormKind::LayerNorm => {
                let mean = fx.b.ins().fdiv(total, n);
                // Pass 2: squared deviations.
                let zv = fx.fconst(0.0, 4);
                let zs = fx.fconst(0.0, 1);
                let va2 = [fx.var(F32X4, zv), fx.var(F32X4, zv)];
                let sa2 = fx.var(F32, zs);
                let mean4 = fx.splat(mean);
                rows.cols_loop(fx, &mut |fx, i, w, slot| {
                    let x = rows.x_at(fx, rp, i, w);
                    let m = if w == 4 { mean4 } else { mean };
                    let d = fx.b.ins().fsub(x, m);
                    let var = if w == 4 { va2[slot] } else { sa2 };
                    let acc = fx.b.use_var(var);
                    let acc = fx.fma(d, d, acc);
                    fx.b.def_var(var, acc);
                });
                let v = [fx.b.use_var(va2[0]), fx.b.use_var(va2[1])];
                let s = fx.b.use_var(sa2);
                let ss = rows.combine(fx, v, s, false);
                (Some(mean), fx.b.ins().fdiv(ss, n))
            }
            NormKind::RmsNorm => (None, fx.b.ins().fdiv(total, n)),
        };
        let e = fx.b.ins().f32const(eps);
        let d = fx.b.ins().fadd(ms, e);
        let d = fx.b.ins().sqrt(d);
        let one = fx.b.ins().f32const(1.0);
        let rstd = fx.b.ins().fdiv(one, d);
        let rstd4 = fx.splat(rstd);
        let mean4 = mean.map(|m| fx.splat(m));
        // Pass 3: normalize, scale, shift.
        rows.cols_loop(fx, &mut |fx, i, w, _| {
            let x = rows.x_at(fx, rp, i, w);
            let x = match (mean, w) {
                (Some(_), 4) => fx.b.ins().fsub(x, mean4.unwrap()),
                (Some(m), _) => fx.b.ins().fsub(x, m),
                (None, _) => x,
            };
            let y = fx.b.ins().fmul(x, if w == 4 { rstd4 } else { rstd });
            let ga = fx.offset(g_ptr, i, g_cs * g_dt.size() as i64);
            let gv = if g_cs == 0 && w == 4 {
                let s = fx.load_f(g_dt, ga, 1);
                fx.splat(s)
            } else {
                fx.load_f(g_dt, ga, w)
            };
            let y = match b_info {
                Some((bp, bcs, bdt)) => {
                    let ba = fx.offset(bp, i, bcs * bdt.size() as i64);
                    let bv = if bcs == 0 && w == 4 {
                        let s = fx.load_f(bdt, ba, 1);
                        fx.splat(s)
                    } else {
                        fx.load_f(bdt, ba, w)
                    };
                    fx.fma(y, gv, bv)
                }
                None => fx.b.ins().fmul(y, gv),
            };
            let a = rows.out_addr(fx, rp, i);
            fx.store_f(rows.out_dt, y, a);
        });
    });
    tasks
}
