//! Elementwise expression DAGs ([`Expr`]) as Cranelift IR on `f32` or `f32x4` values.
//!
//! Semantics follow the kernel IR (and `kernel_eval`): f32 arithmetic; `Max`/`Min` propagate
//! NaN; `Relu` keeps NaN and maps negatives to 0; `Select` takes `a` when `cond != 0` (NaN
//! counts as non-zero); `Cast` rounds to the value set of its type.

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{InstBuilder, Value};
use kiln_runtime::graph::{BinaryOp, UnaryOp};

use super::emit::Fx;
use super::math;
use crate::kernel_ir::{Expr, ExprNode};

/// Emits `e` at width `w` (1 or 4). `load(k)` gives kernel input `k` at the current index
/// (already loaded, so every read happens before the store); `acc` is the GEMM accumulator.
pub(crate) fn emit_expr(fx: &mut Fx, e: &Expr, w: usize, loads: &[Option<Value>], acc: Option<Value>) -> Value {
    let mut vals: Vec<Value> = Vec::with_capacity(e.nodes.len());
    for n in &e.nodes {
        let v = match n {
            ExprNode::Load(k) => loads[*k].expect("every loaded input is pre-loaded"),
            ExprNode::Acc => acc.expect("acc only appears in GEMM epilogues"),
            ExprNode::Const(c) => fx.fconst(*c, w),
            ExprNode::Unary(op, a) => unary(fx, *op, vals[*a as usize], w),
            ExprNode::Binary(op, a, b) => binary(fx, *op, vals[*a as usize], vals[*b as usize]),
            ExprNode::Select(c, a, b) => {
                let zero = fx.fconst(0.0, w);
                let m = fx.fcmp(FloatCC::NotEqual, vals[*c as usize], zero);
                fx.sel(m, vals[*a as usize], vals[*b as usize])
            }
            ExprNode::Cast(t, a) => fx.round_to(*t, vals[*a as usize]),
        };
        vals.push(v);
    }
    *vals.last().expect("non-empty expression")
}

pub(crate) fn unary(fx: &mut Fx, op: UnaryOp, x: Value, w: usize) -> Value {
    match op {
        UnaryOp::Gelu => math::gelu(fx, x),
        UnaryOp::Tanh => math::tanh(fx, x),
        UnaryOp::Relu => {
            let zero = fx.fconst(0.0, w);
            let neg = fx.fcmp(FloatCC::LessThan, x, zero);
            fx.sel(neg, zero, x)
        }
        UnaryOp::Silu => math::silu(fx, x),
        UnaryOp::Exp => math::exp(fx, x),
        UnaryOp::Sqrt => fx.b.ins().sqrt(x),
        UnaryOp::Rsqrt => {
            let s = fx.b.ins().sqrt(x);
            let one = fx.fconst(1.0, w);
            fx.b.ins().fdiv(one, s)
        }
        UnaryOp::Neg => fx.b.ins().fneg(x),
        UnaryOp::Recip => {
            let one = fx.fconst(1.0, w);
            fx.b.ins().fdiv(one, x)
        }
    }
}

pub(crate) fn binary(fx: &mut Fx, op: BinaryOp, a: Value, b: Value) -> Value {
    match op {
        BinaryOp::Add => fx.b.ins().fadd(a, b),
        BinaryOp::Sub => fx.b.ins().fsub(a, b),
        BinaryOp::Mul => fx.b.ins().fmul(a, b),
        BinaryOp::Div => fx.b.ins().fdiv(a, b),
        BinaryOp::Max => fx.b.ins().fmax(a, b),
        BinaryOp::Min => fx.b.ins().fmin(a, b),
    }
}
