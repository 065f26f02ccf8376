//! The unary elementwise ops: each one's formula over [`Prims`], the one place that says what it
//! computes.

use kiln_runtime::graph::UnaryOp;

use super::Prims;

/// Every unary op, for tests and random graphs.
pub const ALL: [UnaryOp; 21] = [
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
    UnaryOp::Sin,
    UnaryOp::Cos,
    UnaryOp::Atan,
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
fn floor<P: Prims + ?Sized>(p: &mut P, x: P::V) -> P::V {
    let t = p.trunc(x);
    let below = p.lt(x, t);
    let one = p.c(1.0);
    let t1 = p.sub(t, one);
    p.select(below, t1, t)
}

/// The nearest integer, ties to even (IEEE roundToIntegralTiesToEven), from the primitives:
/// f = floor(x) and d = x - f (exact: f is x's integer part); f where d < 1/2, f + 1 where
/// d > 1/2, the even one of the two where d = 1/2 (f is odd when f/2 is not an integer). Where
/// x < 0, f + 1 = +0 becomes -0 (min with -0): round(-0.4) = -0. NaN and ±inf: d is NaN, so
/// the tie branch runs and keeps f (NaN, ±inf). Past 2^23 (f32) every x is an integer and
/// d = 0. [`Prims::nearest`]'s default; a target with the instruction uses it instead.
pub fn round_even<P: Prims + ?Sized>(p: &mut P, x: P::V) -> P::V {
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

/// sin(x) (`cos`: false) or cos(x): x = k·π/2 + r with |r| ≤ π/4 (k = floor(x·2/π + ½), r
/// by Cody–Waite's three-part π/2, each step one FMA), then the sine or cosine polynomial of
/// r (Cephes' `sinf`/`cosf` coefficients) chosen and signed by the quadrant k mod 4 (cos is
/// sin one quadrant on). NaN, ±inf and |x| > 2^22 give NaN, sin(-0) = -0.
fn sin_cos<P: Prims>(p: &mut P, x: P::V, cos: bool) -> P::V {
    let two_over_pi = p.c(std::f64::consts::FRAC_2_PI);
    let half = p.c(0.5);
    let t = p.fma(x, two_over_pi, half);
    let k = floor(p, t);
    let mut r = x;
    for part in [-1.5703125, -4.837_512_969_970_703e-4, -7.549789954891882e-8] {
        let c = p.c(part);
        r = p.fma(k, c, r);
    }
    let r2 = p.mul(r, r);
    // sin r = r·(1 + r²·(s1 + r²·(s2 + r²·s3))); cos r = 1 - r²/2 + r⁴·(c1 + r²·(c2 + r²·c3)).
    let poly = |p: &mut P, cs: [f64; 3]| {
        let mut acc = p.c(cs[2]);
        for &c in cs[..2].iter().rev() {
            let c = p.c(c);
            acc = p.fma(acc, r2, c);
        }
        acc
    };
    let ps = poly(p, [-1.6666654611e-1, 8.3321608736e-3, -1.9515295891e-4]);
    // r·(1 + r²·ps) rather than r + r³·ps: the product keeps the sign of r = -0.
    let one = p.c(1.0);
    let sf = p.fma(ps, r2, one);
    let s = p.mul(r, sf);
    let pc = poly(p, [4.166664568298827e-2, -1.388731625493765e-3, 2.443315711809948e-5]);
    let r4 = p.mul(r2, r2);
    let mhalf = p.c(-0.5);
    let one = p.c(1.0);
    let c0 = p.fma(r2, mhalf, one);
    let c = p.fma(pc, r4, c0);
    // The quadrant q = (k + [cos]) mod 4, exact while |k| < 2^24.
    let kq = if cos {
        let one = p.c(1.0);
        p.add(k, one)
    } else {
        k
    };
    let quarter = p.c(0.25);
    let kq4 = p.mul(kq, quarter);
    let f = floor(p, kq4);
    let m4 = p.c(-4.0);
    let q = p.fma(f, m4, kq);
    // q in {0, 1, 2, 3}: sin r, cos r, -sin r, -cos r.
    let (ns, nc) = (p.neg(s), p.neg(c));
    let [q0, q1, q2] = [0.5, 1.5, 2.5].map(|b| {
        let b = p.c(b);
        p.lt(q, b)
    });
    let hi = p.select(q2, ns, nc);
    let mid = p.select(q1, c, hi);
    let v = p.select(q0, s, mid);
    // Past 2^22 the reduction is no longer exact in f32 and f32 and f64 would disagree: NaN,
    // the same on every backend, rather than a value of no meaning.
    let nx = p.neg(x);
    let ax = p.max(x, nx);
    let limit = p.c(4194304.0);
    let big = p.lt(limit, ax);
    let nan = p.c(f64::NAN);
    p.select(big, nan, v)
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
        UnaryOp::Round => p.nearest(x),
        UnaryOp::Recip => {
            let one = p.c(1.0);
            p.div(one, x)
        }
        UnaryOp::Sin => sin_cos(p, x, false),
        UnaryOp::Cos => sin_cos(p, x, true),
        UnaryOp::Atan => atan(p, x),
    }
}

/// atan(x) as Cephes' `atanf` computes it: t = |x| reduced to |u| ≤ tan(π/8) — u = t where
/// t ≤ tan(π/8), (t - 1)/(t + 1) + π/4 up to tan(3π/8), -1/t + π/2 past it — then
/// u + u·z·P(z) with z = u² (a degree-4 minimax P), and x's sign. |x| < 1e-4 gives x itself
/// (atan(x) = x there to f32 precision, and -0 stays -0); NaN stays NaN (every comparison false:
/// u = t = NaN); ±inf gives ±π/2 (-1/inf = -0).
fn atan<P: Prims>(p: &mut P, x: P::V) -> P::V {
    let nx = p.neg(x);
    let t = p.max(x, nx);
    let (tp8, t3p8) = (p.c(0.414_213_562_373_095_1), p.c(2.414_213_562_373_095));
    let big = p.lt(t3p8, t);
    let mid = p.lt(tp8, t);
    let one = p.c(1.0);
    let mone = p.c(-1.0);
    let inv = p.div(mone, t);
    let tm = p.sub(t, one);
    let tp = p.add(t, one);
    let q = p.div(tm, tp);
    let u = p.select(mid, q, t);
    let u = p.select(big, inv, u);
    let (zero, q4, h2) = (p.c(0.0), p.c(std::f64::consts::FRAC_PI_4), p.c(std::f64::consts::FRAC_PI_2));
    let y0 = p.select(mid, q4, zero);
    let y0 = p.select(big, h2, y0);
    let z = p.mul(u, u);
    let mut acc = p.c(8.053_744_495_38e-2);
    for c in [-1.387_768_560_32e-1, 1.997_771_064_78e-1, -3.333_294_915_39e-1] {
        let c = p.c(c);
        acc = p.fma(acc, z, c);
    }
    let zu = p.mul(z, u);
    let r = p.fma(acc, zu, u);
    let r = p.add(y0, r);
    let neg = p.lt(x, zero);
    let nr = p.neg(r);
    let signed = p.select(neg, nr, r);
    let tiny = p.c(1e-4);
    let small = p.lt(t, tiny);
    p.select(small, x, signed)
}
