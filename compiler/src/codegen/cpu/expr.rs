//! Elementwise expression DAGs ([`Expr`]) as Cranelift IR on `f32` or `f32x4` values.
//!
//! Unary and binary ops come from their one definition in [`crate::ops`]: this file only says
//! how each primitive is emitted ([`ClifPrims`]). `Select` takes `a` when `cond != 0` (NaN
//! counts as non-zero); `Cast` rounds to the value set of its type.

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{InstBuilder, Value};

use super::emit::Fx;
use super::math;
use crate::kernel_ir::{Expr, ExprNode};
use crate::ops::{self, Prims};

/// Emits `e` at width `w` (1 or 4). `load(k)` gives kernel input `k` at the current index
/// (already loaded, so every read happens before the store); `acc` is the GEMM accumulator.
pub(crate) fn emit_expr(fx: &mut Fx, e: &Expr, w: usize, loads: &[Option<Value>], acc: Option<Value>) -> Value {
    let mut vals: Vec<Value> = Vec::with_capacity(e.nodes.len());
    let mut p = ClifPrims { fx, w };
    for n in &e.nodes {
        let v = match n {
            ExprNode::Load(k) => loads[*k].expect("every loaded input is pre-loaded"),
            ExprNode::Acc => acc.expect("acc only appears in GEMM epilogues"),
            ExprNode::Const(c) => p.fx.fconst(*c, w),
            ExprNode::Unary(op, a) => ops::unary::apply(&mut p, *op, vals[*a as usize]),
            ExprNode::Binary(op, a, b) => ops::binary::apply(&mut p, *op, false, vals[*a as usize], vals[*b as usize]),
            ExprNode::Select(c, a, b) => {
                let zero = p.fx.fconst(0.0, w);
                let m = p.fx.fcmp(FloatCC::NotEqual, vals[*c as usize], zero);
                p.fx.sel(m, vals[*a as usize], vals[*b as usize])
            }
            ExprNode::Cast(t, a) => p.fx.round_to(*t, vals[*a as usize]),
        };
        vals.push(v);
    }
    *vals.last().expect("non-empty expression")
}

impl ClifPrims<'_, '_, '_> {
    /// max(x, k) (`max`) or min(x, k) for `k` a constant `c` in every lane, not NaN (see
    /// `Prims::max` below).
    fn clamp(&mut self, x: Value, k: Value, c: f32, max: bool) -> Value {
        use cranelift_codegen::ir::condcodes::FloatCC::{LessThan, LessThanOrEqual};
        let m = match (max, c == 0.0 && c.is_sign_positive(), c == 0.0 && c.is_sign_negative()) {
            (true, true, _) => self.fx.fcmp(LessThanOrEqual, x, k),
            (true, false, _) => self.fx.fcmp(LessThan, x, k),
            (false, _, true) => self.fx.fcmp(LessThanOrEqual, k, x),
            (false, _, false) => self.fx.fcmp(LessThan, k, x),
        };
        self.fx.sel(m, k, x)
    }
}

/// The primitives as Cranelift IR at width `w` (1: `f32`, 4: `f32x4`); masks are `fcmp` results.
pub(crate) struct ClifPrims<'f, 'a, 'p> {
    pub fx: &'f mut Fx<'a, 'p>,
    pub w: usize,
}

impl Prims for ClifPrims<'_, '_, '_> {
    type V = Value;
    type M = Value;
    fn c(&mut self, v: f64) -> Value {
        self.fx.fconst(v as f32, self.w)
    }
    fn add(&mut self, a: Value, b: Value) -> Value {
        self.fx.b.ins().fadd(a, b)
    }
    fn sub(&mut self, a: Value, b: Value) -> Value {
        self.fx.b.ins().fsub(a, b)
    }
    fn mul(&mut self, a: Value, b: Value) -> Value {
        self.fx.b.ins().fmul(a, b)
    }
    fn div(&mut self, a: Value, b: Value) -> Value {
        self.fx.b.ins().fdiv(a, b)
    }
    fn fma(&mut self, a: Value, b: Value, c: Value) -> Value {
        self.fx.fma(a, b, c)
    }
    fn neg(&mut self, a: Value) -> Value {
        self.fx.b.ins().fneg(a)
    }
    fn sqrt(&mut self, a: Value) -> Value {
        self.fx.b.ins().sqrt(a)
    }
    // Cranelift's fmax/fmin propagate NaN and order -0 < +0: the contract as it is, in about
    // seven instructions each on x86. Against a constant c that is not NaN, one compare and
    // one blend give the same result: max(x, c) = x < c ? c : x and min(x, c) = c < x ? c : x
    // keep x where it is NaN, and where the two zeros meet the compare takes `<=` on the side
    // that must win (max(-0, +0) = +0, min(+0, -0) = -0). A quantized model's clamps (two per
    // requantization) and the ReLUs and Clips of elementwise kernels.
    fn max(&mut self, a: Value, b: Value) -> Value {
        match (self.fx.const_lanes(a), self.fx.const_lanes(b)) {
            (_, Some(c)) if !c.is_nan() => self.clamp(a, b, c, true),
            (Some(c), _) if !c.is_nan() => self.clamp(b, a, c, true),
            _ => self.fx.b.ins().fmax(a, b),
        }
    }
    fn min(&mut self, a: Value, b: Value) -> Value {
        match (self.fx.const_lanes(a), self.fx.const_lanes(b)) {
            (_, Some(c)) if !c.is_nan() => self.clamp(a, b, c, false),
            (Some(c), _) if !c.is_nan() => self.clamp(b, a, c, false),
            _ => self.fx.b.ins().fmin(a, b),
        }
    }
    fn trunc(&mut self, a: Value) -> Value {
        self.fx.b.ins().trunc(a)
    }
    fn exp(&mut self, a: Value) -> Value {
        math::exp(self.fx, a)
    }
    fn log(&mut self, a: Value) -> Value {
        math::log(self.fx, a)
    }
    fn erf(&mut self, a: Value) -> Value {
        math::erf(self.fx, a)
    }
    fn tanh(&mut self, a: Value) -> Value {
        math::tanh(self.fx, a)
    }
    fn lt(&mut self, a: Value, b: Value) -> Value {
        self.fx.fcmp(FloatCC::LessThan, a, b)
    }
    fn ne(&mut self, a: Value, b: Value) -> Value {
        self.fx.fcmp(FloatCC::NotEqual, a, b)
    }
    fn select(&mut self, m: Value, a: Value, b: Value) -> Value {
        self.fx.sel(m, a, b)
    }
    // `roundps`/`roundss` with round-to-nearest-even (SSE4.1, which `trunc` needs too):
    // IEEE's roundToIntegralTiesToEven, so the bits of the default sequence.
    fn nearest(&mut self, a: Value) -> Value {
        self.fx.b.ins().nearest(a)
    }
}
