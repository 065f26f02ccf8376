//! Value ranges as one more interpreter of the op formulas: [`Interval`] implements [`Prims`],
//! so the range of any elementwise op's result follows from its one definition (a clamp's
//! `max`/`min`, `Round`'s `nearest`, a comparison's `select` of 1 and 0) rather than from a
//! second table of rules that could drift from it.
//!
//! An interval claims: every element of the value is NaN or a number in `[lo, hi]`, and with
//! `int` an integer. That is what the integer GEMM needs to know of its operands (see
//! `ir/ranges.rs`). Bounds are exact below 2^24 in magnitude (f32 rounding is monotonic
//! and every integer there is representable); an integer stays an integer under f32 rounding at
//! any magnitude (every f32 from 2^24 up is one).

use super::Prims;

/// See the module docs. `lo`/`hi` may be infinite (no bound).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    pub lo: f64,
    pub hi: f64,
    pub int: bool,
}

impl Interval {
    /// Nothing known.
    pub const ANY: Interval = Interval { lo: f64::NEG_INFINITY, hi: f64::INFINITY, int: false };

    /// The integers `lo..=hi`.
    pub fn ints(lo: f64, hi: f64) -> Interval {
        Interval { lo, hi, int: true }
    }

    /// Either one's elements.
    pub fn union(self, o: Interval) -> Interval {
        Interval { lo: self.lo.min(o.lo), hi: self.hi.max(o.hi), int: self.int && o.int }
    }

    /// Both claims at once.
    pub fn intersect(self, o: Interval) -> Interval {
        Interval { lo: self.lo.max(o.lo), hi: self.hi.min(o.hi), int: self.int || o.int }
    }

    /// The largest magnitude an element can have.
    pub fn magnitude(&self) -> f64 {
        self.lo.abs().max(self.hi.abs())
    }

    fn bounds(lo: f64, hi: f64, int: bool) -> Interval {
        // inf - inf and 0·inf have no bound.
        Interval { lo: if lo.is_nan() { f64::NEG_INFINITY } else { lo }, hi: if hi.is_nan() { f64::INFINITY } else { hi }, int }
    }

    fn map(self, f: fn(f64) -> f64, int: bool) -> Interval {
        Interval::bounds(f(self.lo), f(self.hi), int)
    }
}

/// The interval interpreter. Comparisons carry no information (`M = ()`): a `select` is the
/// union of its two sides.
pub struct Ranges;

impl Prims for Ranges {
    type V = Interval;
    type M = ();
    fn c(&mut self, v: f64) -> Interval {
        if v.is_nan() {
            return Interval { lo: f64::INFINITY, hi: f64::NEG_INFINITY, int: true };
        }
        Interval { lo: v, hi: v, int: v == v.trunc() }
    }
    fn add(&mut self, a: Interval, b: Interval) -> Interval {
        Interval::bounds(a.lo + b.lo, a.hi + b.hi, a.int && b.int)
    }
    fn sub(&mut self, a: Interval, b: Interval) -> Interval {
        Interval::bounds(a.lo - b.hi, a.hi - b.lo, a.int && b.int)
    }
    fn mul(&mut self, a: Interval, b: Interval) -> Interval {
        let c = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi];
        if c.iter().any(|x| x.is_nan()) {
            return Interval { int: a.int && b.int, ..Interval::ANY };
        }
        Interval::bounds(c.iter().copied().fold(f64::INFINITY, f64::min), c.iter().copied().fold(f64::NEG_INFINITY, f64::max), a.int && b.int)
    }
    fn div(&mut self, _: Interval, _: Interval) -> Interval {
        Interval::ANY
    }
    fn fma(&mut self, a: Interval, b: Interval, c: Interval) -> Interval {
        let p = self.mul(a, b);
        self.add(p, c)
    }
    fn neg(&mut self, a: Interval) -> Interval {
        Interval::bounds(-a.hi, -a.lo, a.int)
    }
    fn sqrt(&mut self, _: Interval) -> Interval {
        Interval::ANY
    }
    fn max(&mut self, a: Interval, b: Interval) -> Interval {
        Interval::bounds(a.lo.max(b.lo), a.hi.max(b.hi), a.int && b.int)
    }
    fn min(&mut self, a: Interval, b: Interval) -> Interval {
        Interval::bounds(a.lo.min(b.lo), a.hi.min(b.hi), a.int && b.int)
    }
    fn trunc(&mut self, a: Interval) -> Interval {
        a.map(f64::trunc, true)
    }
    fn exp(&mut self, _: Interval) -> Interval {
        Interval::ANY
    }
    fn log(&mut self, _: Interval) -> Interval {
        Interval::ANY
    }
    fn erf(&mut self, _: Interval) -> Interval {
        Interval::ANY
    }
    fn tanh(&mut self, _: Interval) -> Interval {
        Interval::ANY
    }
    fn lt(&mut self, _: Interval, _: Interval) {}
    fn ne(&mut self, _: Interval, _: Interval) {}
    fn select(&mut self, _: (), a: Interval, b: Interval) -> Interval {
        a.union(b)
    }
    fn nearest(&mut self, a: Interval) -> Interval {
        a.map(f64::round_ties_even, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_runtime::graph::{BinaryOp, UnaryOp};

    #[test]
    fn ranges_follow_the_op_formulas() {
        let p = &mut Ranges;
        let any = Interval::ANY;
        let (c0, c255) = (p.c(0.0), p.c(255.0));
        // A dynamic quantization: clamp(round(x / s) + zp, 0, 255) with zp in 0..=255.
        let r = super::super::unary::apply(p, UnaryOp::Round, any);
        assert_eq!(r, Interval::ints(f64::NEG_INFINITY, f64::INFINITY));
        let zp = Interval::ints(0.0, 255.0);
        let y = super::super::binary::apply(p, BinaryOp::Add, false, r, zp);
        let y = super::super::binary::apply(p, BinaryOp::Max, false, y, c0);
        let y = super::super::binary::apply(p, BinaryOp::Min, false, y, c255);
        assert_eq!(y, Interval::ints(0.0, 255.0));
        let centered = super::super::binary::apply(p, BinaryOp::Sub, false, y, zp);
        assert_eq!(centered, Interval::ints(-255.0, 255.0));
        // Comparisons are 0 or 1; Relu keeps integers (its `select` is the union of both sides:
        // sound, not tight, as comparisons carry no bounds); a division knows nothing.
        assert_eq!(super::super::binary::apply(p, BinaryOp::Lt, false, any, any), Interval::ints(0.0, 1.0));
        assert_eq!(super::super::unary::apply(p, UnaryOp::Relu, centered), Interval::ints(-255.0, 255.0));
        assert_eq!(super::super::binary::apply(p, BinaryOp::Div, false, centered, zp), Interval::ANY);
        // Not integers: a clamp bounds them all the same.
        let half = p.c(0.5);
        let h = super::super::binary::apply(p, BinaryOp::Max, false, any, half);
        assert_eq!((h.lo, h.int), (0.5, false));
        // 0·inf has no bound, but integer times integer is one.
        let m = p.mul(Interval::ints(0.0, f64::INFINITY), Interval::ints(-1.0, 1.0));
        assert_eq!(m, Interval::ints(f64::NEG_INFINITY, f64::INFINITY));
    }
}
