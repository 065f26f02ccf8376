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
            // A weight's declared bound is not trusted here: another checkpoint may break it,
            // and only a backend that checks it as it prepares the tensor may rely on it (see
            // `weight_bound`).
            Op::Input { .. } | Op::Weight { .. } => by_dtype(n.dtype),
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

/// The declared integer bound of the weight `v` reads (through reshapes and transposes):
/// for a GEMM's B, which a backend checks as it packs it (`WeightPrep::PackedBI16`).
pub fn weight_bound(g: &Graph, mut v: usize) -> Option<u32> {
    loop {
        let n = &g.nodes[v];
        match &n.op {
            Op::Weight { index } => return g.weights.get(*index)?.int_bound,
            Op::Reshape | Op::Transpose { .. } | Op::Cast { to: DType::F32 } => v = n.inputs.first()?.index(),
            _ => return None,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::GraphBuilder;
    use kiln_runtime::graph::{BinaryOp, Dim, InputRole, UnaryOp};

    #[test]
    fn quantized_activations_are_integers_and_weights_bounds_only_reach_a_gemm_b() {
        let mut b = GraphBuilder::new();
        let x = b.input("x", DType::F32, vec![Dim::Fixed(4), Dim::Fixed(8)], InputRole::Other).unwrap();
        let w = b.weight("w", DType::F32, &[8, 8]).unwrap();
        // clamp(round(x) + 3, 0, 255) - 3: integers in [-3, 252].
        let r = b.unary(UnaryOp::Round, x).unwrap();
        let three = b.scalar(3.0).unwrap();
        let y = b.add(r, three).unwrap();
        let zero = b.scalar(0.0).unwrap();
        let y = b.max(y, zero).unwrap();
        let top = b.scalar(255.0).unwrap();
        let y = b.binary(BinaryOp::Min, y, top).unwrap();
        let c = b.sub(y, three).unwrap();
        let wt = b.transpose(w, &[1, 0]).unwrap();
        let ww = b.add(w, zero).unwrap();
        let m = b.matmul_t(c, wt, false, false).unwrap();
        b.output("m", m);
        b.output("ww", ww);
        let mut g = b.finish().unwrap();
        g.weights[0].int_bound = Some(127);
        let r = value_ranges(&g);
        assert_eq!(r[c.index()], Interval::ints(-3.0, 252.0));
        assert!(!r[x.index()].int && !r[ww.index()].int, "an input, an op of a weight: nothing known");
        // The declared bound reaches a GEMM's B through data movement, not through arithmetic.
        assert_eq!(weight_bound(&g, wt.index()), Some(127));
        assert_eq!(weight_bound(&g, ww.index()), None);
        assert_eq!(int_bound(&[1.0, -7.0, 0.0]), Some(7));
        assert_eq!(int_bound(&[1.0, 0.5]), None);
    }
}
