//! Reductions (sum, mean, max) of the last `reduced_dims` dims of `x = prologue(loads)`.
//!
//! Outer dims (coalesced over the loads and the output) are split across tasks; for each
//! output element the reduced dims (coalesced over the loads) are walked with an `f32x4`
//! accumulator on the innermost dim when the loads are dense there, then a scalar remainder;
//! where they are strided and the innermost kept dim is dense, four outputs at a time, a lane
//! each.

use cranelift_codegen::ir::types::{F32, F32X4};
use cranelift_codegen::ir::{InstBuilder, Value};
use kiln_runtime::graph::ReduceOp;
use kiln_runtime::DType;

use super::elementwise::{coalesce, tasks_for};
use super::emit::Fx;
use super::expr::emit_expr;
use crate::kernel_ir::{Expr, Kernel};

/// Independent accumulators of a dense max (see `one` below).
const MAX_CHAINS: usize = 4;

pub(crate) fn emit_reduce(fx: &mut Fx, k: &Kernel, op: ReduceOp, shape: &[usize], reduced: usize, prologue: &Expr) -> u32 {
    if op == ReduceOp::Max {
        if let Some(tasks) = super::rowmax::emit_max_rows(fx, k, shape, reduced, prologue) {
            return tasks;
        }
    }
    let outer = shape.len() - reduced;
    let loads = prologue.loads();
    let nl = loads.len();
    let load_dt: Vec<DType> = loads.iter().map(|&l| fx.dtype(k.inputs[l].buffer)).collect();
    let out_dt = fx.dtype(k.output.buffer);
    let count: usize = shape[outer..].iter().product();
    let n_out: usize = shape[..outer].iter().product();
    if n_out == 0 {
        return 1;
    }
    // Outer walk: loads' outer strides and the output's strides.
    let mut ptrs: Vec<Value> = loads.iter().map(|&l| fx.view_base(&k.inputs[l])).collect();
    ptrs.push(fx.view_base(&k.output));
    let mut ost: Vec<Vec<i64>> = loads.iter().map(|&l| k.inputs[l].strides[..outer].iter().map(|&s| s as i64).collect()).collect();
    ost.push(k.output.strides.iter().map(|&s| s as i64).collect());
    let (mut odims, mut ost) = coalesce(&shape[..outer], &ost);
    let sizes: Vec<i64> = load_dt.iter().chain([&out_dt]).map(|d| d.size() as i64).collect();
    // Inner walk: loads' inner strides.
    let ist: Vec<Vec<i64>> = loads.iter().map(|&l| k.inputs[l].strides[outer..].iter().map(|&s| s as i64).collect()).collect();
    let (mut idims, mut ist) = coalesce(&shape[outer..], &ist);
    if idims.is_empty() {
        idims.push(if count == 0 { 0 } else { 1 });
        for s in ist.iter_mut() {
            s.push(0);
        }
    }
    let ri = idims.len();
    let last_n = idims[ri - 1];
    let vec = last_n >= 4 && (0..nl).all(|j| ist[j][ri - 1] == 0 || (ist[j][ri - 1] == 1 && load_dt[j] == DType::F32));
    // Where the reduced dims are strided (a window op's taps over rows of channels: [.., C, K]
    // with K at stride C) but the innermost kept dim is dense in every load and the output,
    // four neighbouring outputs are reduced side by side, one lane each: the same operations
    // in the same order per element as `one` below (no horizontal step), so the same bits.
    let lanes = !vec
        && odims.last().is_some_and(|&n| n >= 4)
        && out_dt == DType::F32
        && ost[nl].last() == Some(&1)
        && (0..nl).all(|j| ost[j].last() == Some(&0) || (ost[j].last() == Some(&1) && load_dt[j] == DType::F32));
    if lanes && odims.len() == 1 {
        // A dim in front to split tasks over: groups of four lanes where they divide it,
        // else one unit (one task).
        let n = odims[0];
        let (g, w) = if n % 4 == 0 { (n / 4, 4) } else { (1, n) };
        odims = vec![g, w];
        for s in ost.iter_mut() {
            s.insert(0, s[0] * w as i64);
        }
    }
    let obytes: Vec<Vec<i64>> = ost.iter().zip(&sizes).map(|(s, &z)| s.iter().map(|&x| x * z).collect()).collect();
    let ibytes: Vec<Vec<i64>> = ist.iter().zip(&sizes).map(|(s, &z)| s.iter().map(|&x| x * z).collect()).collect();
    let ilast: Vec<i64> = ibytes.iter().map(|b| b[ri - 1]).collect();
    let iouter: Vec<Vec<i64>> = ibytes.iter().map(|b| b[..ri - 1].to_vec()).collect();
    let iouter_dims = idims[..ri - 1].to_vec();
    let tasks = if odims.is_empty() { 1 } else { tasks_for(fx.env.threads, n_out * count, 1 << 15).min(odims[0] as u32) };
    let range = if tasks > 1 { Some(fx.task_range(odims[0], 1)) } else { None };
    let init = if op == ReduceOp::Max { f32::NEG_INFINITY } else { 0.0 };
    let ninputs = k.inputs.len();
    let step = |fx: &mut Fx, acc: Value, x: Value| -> Value {
        if op == ReduceOp::Max {
            fx.b.ins().fmax(acc, x)
        } else {
            fx.b.ins().fadd(acc, x)
        }
    };
    // One output element: its reduced dims walked with the f32x4 accumulator where they are
    // dense innermost, else one element at a time.
    let one = |fx: &mut Fx, p: &[Value]| {
        let iv = fx.fconst(init, 4);
        let is = fx.fconst(init, 1);
        let va = fx.var(F32X4, iv);
        let sa = fx.var(F32, is);
        fx.nest(&iouter_dims, &p[..nl], &iouter, None, &mut |fx, q| {
            let eval = |fx: &mut Fx, i: Value, w: usize| -> Value {
                let mut by_input: Vec<Option<Value>> = vec![None; ninputs];
                for (j, &l) in loads.iter().enumerate() {
                    let v = if ilast[j] == 0 && w == 4 {
                        let s = fx.load_f(load_dt[j], q[j], 1);
                        fx.splat(s)
                    } else {
                        let a = fx.offset(q[j], i, ilast[j]);
                        fx.load_f(load_dt[j], a, w)
                    };
                    by_input[l] = Some(v);
                }
                emit_expr(fx, prologue, w, &by_input, None)
            };
            let c4 = if vec { last_n / 4 * 4 } else { 0 };
            // A max runs MAX_CHAINS accumulators side by side over blocks of 4·MAX_CHAINS: an
            // `fmax` (NaN and signed-zero exact) is a chain of several instructions, and one
            // accumulator left the loop waiting on it (a whole-tensor max of 196 608 floats,
            // a dynamic quantization's range: 175 µs). The max of a set is the same in any order,
            // so the result is the same bits.
            let c16 = if op == ReduceOp::Max { c4 / (4 * MAX_CHAINS) * (4 * MAX_CHAINS) } else { 0 };
            if c16 > 0 {
                let lo = fx.iconst(0);
                let hi = fx.iconst(c16 as i64);
                let chains: Vec<_> = (1..MAX_CHAINS).map(|_| fx.var(F32X4, iv)).collect();
                fx.for_range(lo, hi, 4 * MAX_CHAINS as i64, &mut |fx, i| {
                    for c in 0..MAX_CHAINS {
                        let at = if c == 0 { i } else { fx.b.ins().iadd_imm_s(i, 4 * c as i64) };
                        let x = eval(fx, at, 4);
                        let var = if c == 0 { va } else { chains[c - 1] };
                        let a = fx.b.use_var(var);
                        let a = step(fx, a, x);
                        fx.b.def_var(var, a);
                    }
                });
                for &c in &chains {
                    let (a, b) = (fx.b.use_var(va), fx.b.use_var(c));
                    let m = step(fx, a, b);
                    fx.b.def_var(va, m);
                }
            }
            if c4 > c16 {
                let lo = fx.iconst(c16 as i64);
                let hi = fx.iconst(c4 as i64);
                fx.for_range(lo, hi, 4, &mut |fx, i| {
                    let x = eval(fx, i, 4);
                    let a = fx.b.use_var(va);
                    let a = step(fx, a, x);
                    fx.b.def_var(va, a);
                });
            }
            if c4 < last_n {
                let lo = fx.iconst(c4 as i64);
                let hi = fx.iconst(last_n as i64);
                fx.for_range(lo, hi, 1, &mut |fx, i| {
                    let x = eval(fx, i, 1);
                    let a = fx.b.use_var(sa);
                    let a = step(fx, a, x);
                    fx.b.def_var(sa, a);
                });
            }
        });
        let mut total = fx.b.use_var(sa);
        if vec {
            let v = fx.b.use_var(va);
            let h = if op == ReduceOp::Max { fx.hmax(v) } else { fx.hsum(v) };
            total = step(fx, h, total);
        }
        if op == ReduceOp::Mean {
            let c = fx.b.ins().f32const(count as f32);
            total = fx.b.ins().fdiv(total, c);
        }
        fx.store_f(out_dt, total, p[nl]);
    };
    if !lanes {
        fx.nest(&odims, &ptrs, &obytes, range, &mut |fx, p| one(fx, p));
        return tasks;
    }
    let d = odims.len() - 1;
    let head: Vec<Vec<i64>> = obytes.iter().map(|b| b[..d].to_vec()).collect();
    let step_bytes: Vec<i64> = obytes.iter().map(|b| b[d]).collect();
    let n = odims[d];
    let n4 = n / 4 * 4;
    fx.nest(&odims[..d], &ptrs, &head, range, &mut |fx, p| {
        let lo = fx.iconst(0);
        let hi = fx.iconst(n4 as i64);
        fx.for_range(lo, hi, 4, &mut |fx, c| {
            let pc: Vec<Value> = p.iter().zip(&step_bytes).map(|(&q, &b)| fx.offset(q, c, b)).collect();
            let iv = fx.fconst(init, 4);
            let va = fx.var(F32X4, iv);
            fx.nest(&idims, &pc[..nl], &ibytes, None, &mut |fx, q| {
                let mut by_input: Vec<Option<Value>> = vec![None; ninputs];
                for (j, &l) in loads.iter().enumerate() {
                    by_input[l] = Some(if step_bytes[j] == 0 {
                        let s = fx.load_f(load_dt[j], q[j], 1);
                        fx.splat(s)
                    } else {
                        fx.load_f(load_dt[j], q[j], 4)
                    });
                }
                let x = emit_expr(fx, prologue, 4, &by_input, None);
                let a = fx.b.use_var(va);
                let a = step(fx, a, x);
                fx.b.def_var(va, a);
            });
            let mut total = fx.b.use_var(va);
            if op == ReduceOp::Mean {
                let c = fx.fconst(count as f32, 4);
                total = fx.b.ins().fdiv(total, c);
            }
            fx.store_f(out_dt, total, pc[nl]);
        });
        if n4 < n {
            let lo = fx.iconst(n4 as i64);
            let hi = fx.iconst(n as i64);
            fx.for_range(lo, hi, 1, &mut |fx, c| {
                let pc: Vec<Value> = p.iter().zip(&step_bytes).map(|(&q, &b)| fx.offset(q, c, b)).collect();
                one(fx, &pc);
            });
        }
    });
    tasks
}
