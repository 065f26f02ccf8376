//! Value ranges of a graph's nodes ([`Interval`]: NaN or in `[lo, hi]`, integers where `int`),
//! forward over the graph: elementwise ops through their formulas ([`Ranges`], the op's one
//! definition), data movement keeping its input's range, anything else unknown.
//!
//! The use: a GEMM whose left operand holds only small integers — a quantized activation
//! minus its zero point, as `DynamicQuantizeLinear` + `MatMulInteger` import to — may run as
//! the exact integer GEMM (`KernelOp::Gemm::int_a`). Weights are not known here (their values
//! are the backend's, checked where it packs them).

use kiln_runtime::graph::{Graph, Op, ReduceOp};
use kiln_runtime::DType;

use crate::ops::range::{Interval, Ranges};
use crate::ops::{binary, unary, Prims};

/// The range of every node's value, indexed like `g.nodes`.
pub fn value_ranges(g: &Graph) -> Vec<Interval> {
    let mut r: Vec<Interval> = Vec::with_capacity(g.nodes.len());
    for n in &g.nodes {
        let at = |i: usize| n.inputs.get(i).map_or(Interval::ANY, |v| r[v.index()]);
        let v = match &n.op {
            Op::Constant { values } => values.iter().map(|&x| Ranges.c(x as f64)).reduce(Interval::union).unwrap_or(Interval::ANY),
            Op::Weight { index } => match g.weights.get(*index).and_then(|w| w.int_bound) {
                Some(b) => Interval::ints(-(b as f64), b as f64),
                None => by_dtype(n.dtype),
            },
            Op::Input { .. } => by_dtype(n.dtype),
            Op::Unary(u) => unary::apply(&mut Ranges, *u, at(0)),
            Op::Binary(b) => binary::apply(&mut Ranges, *b, n.dtype.is_int(), at(0), at(1)),
            Op::Reshape | Op::Transpose { .. } | Op::Slice { .. } | Op::Gather => at(0),
            Op::Reduce { op: ReduceOp::Max, .. } => at(0),
            Op::Concat { .. } => (0..n.inputs.len()).map(at).reduce(Interval::union).unwrap_or(Interval::ANY),
            Op::Where => at(1).union(at(2)),
            Op::Cast { to } => cast(at(0), *to),
            _ => Interval::ANY,
        };
        r.push(v.intersect(by_dtype(n.dtype)));
    }
    r
}

/// The largest magnitude among `v` when every value is an integer (a weight's
/// `WeightSpec::int_bound`), or `None`; stops at the first value that is not.
pub fn int_bound(v: &[f32]) -> Option<u32> {
    let mut m = 0f32;
    for &x in v {
        if x != x.trunc() || x.abs() > u32::MAX as f32 {
            return None;
        }
        m = m.max(x.abs());
    }
    Some(m as u32)
}

/// What a value of type `d` can hold.
fn by_dtype(d: DType) -> Interval {
    match d {
        DType::I32 => Interval::ints(i32::MIN as f64, i32::MAX as f64),
        DType::I64 => Interval::ints(i64::MIN as f64, i64::MAX as f64),
        _ => Interval::ANY,
    }
}

/// `x` converted to `to`: f32 keeps integers integers (and bounds below 2^24 exact); the
/// half-precision types overflow to ±inf past their range, so they keep nothing; an integer
/// type truncates.
fn cast(x: Interval, to: DType) -> Interval {
    match to {
        DType::F32 => x,
        DType::F16 | DType::BF16 => Interval::ANY,
        DType::I32 | DType::I64 => Interval { lo: x.lo.trunc(), hi: x.hi.trunc(), int: true },
    }
}
