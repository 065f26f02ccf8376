//! The unary elementwise ops: each one's formula over [`Prims`], the one place that says what it
//! computes.

use kiln_runtime::graph::UnaryOp;

use super::Prims;

/// Every unary op, for tests and random graphs.
pub const ALL: [UnaryOp; 18] = [
    UnaryOp::Gelu,
    UnaryOp::Tanh,
    UnaryOp::Relu,
    UnaryOp::Silu,
    UnaryOp::Exp,
    UnaryOp::Sqrt,
    UnaryOp::Rsqrt,
    UnaryOp::Neg,
    UnaryOp::Recip,
    UnaryOp::GeluTanh,
    UnaryOp::Sigmoid,
    UnaryOp::Erf,
    UnaryOp::Abs,
    UnaryOp::Log,
    UnaryOp::Softplus,
    UnaryOp::Floor,
    UnaryOp::Ceil,
    UnaryOp::Round,
];

/// The inputs on which random tests exercise an op with finite, well-conditioned results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Domain {
    /// Any finite input.
    Any,
    /// Inputs bounded to [-1, 1] (the result grows fast).
    Bounded,
    /// Inputs bounded away from zero, positive.
    Positive,
}

pub fn domain(op: UnaryOp) -> Domain {
    match op {
        UnaryOp::Exp => Domain::Bounded,
        UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Recip | UnaryOp::Log => Domain::Positive,
        _ => Domain::Any,
    }
}

/// `x/2 · (1 + t)`: both GELUs' outer form, in PyTorch's order (see `Gelu`).
fn half_x_one_plus<P: Prims>(p: &mut P, x: P::V, t: P::V) -> P::V {
    let half = p.c(0.5);
    let hx = p.mul(x, half);
    let one = p.c(1.0);
    let s = p.add(one, t);
    p.mul(hx, s)
}

/// floor(x) = t - 1 where x < t = trunc(x), else t: trunc keeps the sign (floor(-0) = -0,
/// floor(+0.5) = +0), NaN and ±inf pass through (NaN < t is false).
fn floor<P: Prims>(p: &mut P, x: P::V) -> P::V {
    let t = p.trunc(x);
    let below = p.lt(x, t);
    let one = p.c(1.0);
    let t1 = p.sub(t, one);
    p.select(below, t1, t)
}

/// `op(x)`.
pub fn apply<P: Prims>(p: &mut P, op: UnaryOp, x: P::V) -> P::V {
    match op {
        // x/2 · (1 + erf(x/√2)), in that order (as PyTorch writes it): where erf rounds to -1
        // the result is x/2 · +0 = -0, the sign of the true (tiny, negative) value, where
        // `x/2 + x/2·erf` would give +0.
        UnaryOp::Gelu => {
            let k = p.c(std::f64::consts::FRAC_1_SQRT_2);
            let u = p.mul(x, k);
            let e = p.erf(u);
            half_x_one_plus(p, x, e)
        }
        // x/2 · (1 + tanh(√(2/π)·(x + 0.044715·x³))): HF `gelu_new`, `gelu_pytorch_tanh`.
        UnaryOp::GeluTanh => {
            let x2 = p.mul(x, x);
            let x3 = p.mul(x2, x);
            let a = p.c(0.044715);
            let t = p.fma(a, x3, x);
            let k = p.c((2.0 / std::f64::consts::PI).sqrt());
            let u = p.mul(k, t);
            let th = p.tanh(u);
            half_x_one_plus(p, x, th)
        }
        UnaryOp::Tanh => p.tanh(x),
        // NaN < 0 is false: NaN stays NaN.
        UnaryOp::Relu => {
            let zero = p.c(0.0);
            let neg = p.lt(x, zero);
            p.select(neg, zero, x)
        }
        // x / (1 + e^-x).
        UnaryOp::Silu => {
            let nx = p.neg(x);
            let e = p.exp(nx);
            let one = p.c(1.0);
            let d = p.add(one, e);
            p.div(x, d)
        }
        // 1 / (1 + e^-x): 0 at -inf (1/inf), 1 at +inf.
        UnaryOp::Sigmoid => {
            let nx = p.neg(x);
            let e = p.exp(nx);
            let one = p.c(1.0);
            let d = p.add(one, e);
            p.div(one, d)
        }
        UnaryOp::Erf => p.erf(x),
        // max(x, -x): NaN stays NaN, |-0| = max(-0, +0) = +0.
        UnaryOp::Abs => {
            let nx = p.neg(x);
            p.max(x, nx)
        }
        UnaryOp::Exp => p.exp(x),
        UnaryOp::Log => p.log(x),
        // max(x, 0) + log1p(e^-|x|): no overflow for large x, and log1p(u) as
        // `log(1+u)·u / ((1+u) - 1)` (exact where 1+u rounds, u itself where 1+u == 1), so
        // softplus(-20) is e^-20, not 0. NaN stays NaN; softplus(+inf) = inf, softplus(-inf) = 0.
        UnaryOp::Softplus => {
            let zero = p.c(0.0);
            let pos = p.max(x, zero);
            let nx = p.neg(x);
            let ax = p.max(x, nx);
            let nax = p.neg(ax);
            let u = p.exp(nax);
            let one = p.c(1.0);
            let t = p.add(one, u);
            let d = p.sub(t, one);
            let l = p.log(t);
            let lu = p.mul(l, u);
            let q = p.div(lu, d);
            let rounds = p.ne(d, zero);
            let l1p = p.select(rounds, q, u);
            p.add(pos, l1p)
        }
        UnaryOp::Sqrt => p.sqrt(x),
        UnaryOp::Rsqrt => {
            let s = p.sqrt(x);
            let one = p.c(1.0);
            p.div(one, s)
        }
        UnaryOp::Neg => p.neg(x),
        UnaryOp::Floor => floor(p, x),
        // t + 1 where t = trunc(x) < x, else t: ceil(-0.5) = trunc(-0.5) = -0.
        UnaryOp::Ceil => {
            let t = p.trunc(x);
            let above = p.lt(t, x);
            let one = p.c(1.0);
            let t1 = p.add(t, one);
            p.select(above, t1, t)
        }
        // Ties to even: f = floor(x) and d = x - f (exact: f is x's integer part); f where
        // d < 1/2, f + 1 where d > 1/2, the even one of the two where d = 1/2 (f is odd when f/2
        // is not an integer). Where x < 0, f + 1 = +0 becomes -0 (min with -0): round(-0.4) =
        // -0. NaN and ±inf: d is NaN, so the tie branch runs and keeps f (NaN, ±inf). Past 2^23
        // (f32) every x is an integer and d = 0.
        UnaryOp::Round => {
            let f = floor(p, x);
            let d = p.sub(x, f);
            let half = p.c(0.5);
            let down = p.lt(d, half);
            let up = p.lt(half, d);
            let one = p.c(1.0);
            let f1 = p.add(f, one);
            let zero = p.c(0.0);
            let neg = p.lt(x, zero);
            let nzero = p.c(-0.0);
            let f1n = p.min(f1, nzero);
            let f1 = p.select(neg, f1n, f1);
            let h = p.mul(f, half);
            let th = p.trunc(h);
            let odd = p.ne(th, h);
            let tie = p.select(odd, f1, f);
            let above = p.select(up, f1, tie);
            p.select(down, f, above)
        }
        UnaryOp::Recip => {
            let one = p.c(1.0);
            p.div(one, x)
        }
    }
}
