//! The binary elementwise ops over [`Prims`].

use kiln_runtime::graph::BinaryOp;

use super::Prims;

/// Every binary op, for tests and random graphs.
pub const ALL: [BinaryOp; 6] = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max, BinaryOp::Min];

/// `a op b`. `int`: the operands are integers (held as floats): division truncates toward zero.
pub fn apply<P: Prims>(p: &mut P, op: BinaryOp, int: bool, a: P::V, b: P::V) -> P::V {
    match op {
        BinaryOp::Add => p.add(a, b),
        BinaryOp::Sub => p.sub(a, b),
        BinaryOp::Mul => p.mul(a, b),
        BinaryOp::Div if int => {
            let q = p.div(a, b);
            p.trunc(q)
        }
        BinaryOp::Div => p.div(a, b),
        BinaryOp::Max => p.max(a, b),
        BinaryOp::Min => p.min(a, b),
    }
}
