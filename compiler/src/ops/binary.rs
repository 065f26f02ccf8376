//! The binary elementwise ops over [`Prims`].

use kiln_runtime::graph::BinaryOp;

use super::Prims;

/// Every binary op, for tests and random graphs.
pub const ALL: [BinaryOp; 10] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Max,
    BinaryOp::Min,
    BinaryOp::Eq,
    BinaryOp::Ne,
    BinaryOp::Lt,
    BinaryOp::Le,
];

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
        // 1 / 0 through `select`: a NaN operand makes every comparison false but `Ne`.
        BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le => {
            let (one, zero) = (p.c(1.0), p.c(0.0));
            match op {
                BinaryOp::Ne => {
                    let m = p.ne(a, b);
                    p.select(m, one, zero)
                }
                BinaryOp::Eq => {
                    let m = p.ne(a, b);
                    p.select(m, zero, one)
                }
                BinaryOp::Lt => {
                    let m = p.lt(a, b);
                    p.select(m, one, zero)
                }
                _ => {
                    let (lt, ne) = (p.lt(a, b), p.ne(a, b));
                    let eq = p.select(ne, zero, one);
                    p.select(lt, one, eq)
                }
            }
        }
    }
}
