//! `activations`: GELU written out as elementwise ops (what exporters emit for `nn.GELU` /
//! `F.gelu`, e.g. PyTorch's dynamo export and the HF models' own `x * 0.5 * (1 + erf(x / √2))`)
//! becomes the one `gelu` op, and its tanh approximation (HF `gelu_new`, `gelu_fast`,
//! `approximate='tanh'`) the `gelutanh` op, so that a GEMM epilogue runs its tabulated kernel instead of a
//! generic erf, a division and three more ops per element (the int8 MiniLM export's FFN-up GEMM,
//! 1×128, 2 threads: 0.92 → 0.59 ms, as kiln's own graph).
//!
//! Matched: a product (a tree of `mul`, and `div` by a scalar constant) whose non-constant
//! factors are exactly `x` and `1 + erf(u)` (either order of the add), with the constants
//! multiplying to ½, and `u` a product of `x` alone with constants multiplying to 1/√2 (`x / √2`
//! or `x · 0.70710677`); or the same with `1 + tanh(√(2/π) · (x + 0.044715·x³))` (x³ as
//! products of x, `Pow(x, 3)` imports so) or `1 + tanh(x · √(2/π) · (1 + 0.044715·x·x))`.
//! Constants within 1e-6 (relative) of ½ and 1/√2: an export rounds them
//! to f32 (and √2 to 1.4142135). The replacement differs from the written-out form by rounding
//! only. Intermediate nodes go in `dce` when nothing else uses them.
//!
//! Like `norms`, a pattern across ops none of which owns it (tract's per-op `declutter` would
//! have to start from the last `mul`), so one small pass.

use kiln_runtime::graph::{BinaryOp, Graph, Op, UnaryOp, ValueId};
use kiln_runtime::Result;

use super::{splat_const, Pass, PassCtx, Rewriter};

pub struct Activations;

/// Relative tolerance on the pattern's constants (f32 rounding of ½, √2, 1/√2 and 1).
const TOL: f64 = 1e-6;

fn near(a: f64, b: f64) -> bool {
    (a - b).abs() <= TOL * b.abs()
}

/// A scalar (or splat) constant usable as a factor: shapes broadcast to the product's, so only
/// the value matters for the match (the root's shape is checked against x's).
fn constant(g: &Graph, v: ValueId) -> Option<f64> {
    splat_const(g, v).map(f64::from)
}

/// The factors of a product tree rooted at `v`: (non-constant factors, product of the constant
/// ones). Walks `mul` in any order and `div` by a constant, but not into `atoms`; stops
/// descending after 8 factors.
fn factors(g: &Graph, v: ValueId, atoms: &[ValueId]) -> (Vec<ValueId>, f64) {
    let mut vars = Vec::new();
    let mut scale = 1.0f64;
    let mut stack = vec![v];
    while let Some(x) = stack.pop() {
        let n = g.node(x);
        if let Some(c) = constant(g, x) {
            scale *= c;
            continue;
        }
        let open = !atoms.contains(&x) && vars.len() + stack.len() < 8;
        match n.op {
            Op::Binary(BinaryOp::Mul) if open => {
                stack.push(n.inputs[0]);
                stack.push(n.inputs[1]);
            }
            Op::Binary(BinaryOp::Div) if open && constant(g, n.inputs[1]).is_some_and(|c| c != 0.0) => {
                scale /= constant(g, n.inputs[1]).unwrap_or(1.0);
                stack.push(n.inputs[0]);
            }
            _ => vars.push(x),
        }
    }
    (vars, scale)
}

fn is_one(g: &Graph, v: ValueId) -> bool {
    constant(g, v).is_some_and(|c| near(c, 1.0))
}

/// `1 + op(w)` (either order of the add): w.
fn one_plus(g: &Graph, v: ValueId, op: UnaryOp) -> Option<ValueId> {
    let n = g.node(v);
    if n.op != Op::Binary(BinaryOp::Add) {
        return None;
    }
    let (a, b) = (n.inputs[0], n.inputs[1]);
    let f = if is_one(g, a) { b } else if is_one(g, b) { a } else { return None };
    let fnode = g.node(f);
    (fnode.op == Op::Unary(op)).then(|| fnode.inputs[0])
}

/// `1 + erf(x / √2)` (either order of the add; `x · c` or `c · x` with c = 1/√2, or `x / √2`): x.
fn one_plus_erf(g: &Graph, v: ValueId) -> Option<ValueId> {
    let u = g.node(one_plus(g, v, UnaryOp::Erf)?);
    let (x, c) = match u.op {
        Op::Binary(BinaryOp::Mul) => match (constant(g, u.inputs[0]), constant(g, u.inputs[1])) {
            (None, Some(c)) => (u.inputs[0], c),
            (Some(c), None) => (u.inputs[1], c),
            _ => return None,
        },
        Op::Binary(BinaryOp::Div) => (u.inputs[0], 1.0 / constant(g, u.inputs[1])?),
        _ => return None,
    };
    near(c, std::f64::consts::FRAC_1_SQRT_2).then_some(x)
}

/// Every node of the product tree rooted at `v` (the products themselves and their factors), at
/// most 16.
fn product_nodes(g: &Graph, v: ValueId) -> Vec<ValueId> {
    let mut out = vec![v];
    let mut i = 0;
    while i < out.len() && out.len() < 16 {
        let n = g.node(out[i]);
        match n.op {
            Op::Binary(BinaryOp::Mul) => out.extend_from_slice(&n.inputs),
            Op::Binary(BinaryOp::Div) if constant(g, n.inputs[1]).is_some() => out.push(n.inputs[0]),
            _ => {}
        }
        i += 1;
    }
    out
}

/// `c · xᵖ` for p = `powers` (a product of x, `powers` times, and constants): c.
fn monomial(g: &Graph, v: ValueId, x: ValueId, powers: usize) -> Option<f64> {
    let (vars, c) = factors(g, v, &[x]);
    (vars.len() == powers && vars.iter().all(|&f| f == x)).then_some(c)
}

/// `a + b` with `a` matching `left` and `b` matching `right`, in either order.
fn sum_of(g: &Graph, v: ValueId, left: impl Fn(ValueId) -> bool, right: impl Fn(ValueId) -> bool) -> bool {
    let n = g.node(v);
    n.op == Op::Binary(BinaryOp::Add) && {
        let (a, b) = (n.inputs[0], n.inputs[1]);
        (left(a) && right(b)) || (left(b) && right(a))
    }
}

/// `1 + tanh(√(2/π) · (x + 0.044715·x³))`, also spelled `x · √(2/π) · (1 + 0.044715·x·x)`: x.
fn one_plus_tanh(g: &Graph, v: ValueId) -> Option<ValueId> {
    const C: f64 = 0.044715;
    let c1 = (2.0 / std::f64::consts::PI).sqrt();
    let w = one_plus(g, v, UnaryOp::Tanh)?;
    // The candidates for x: every node of w's product tree, and the terms of a sum in it.
    let mut cand = product_nodes(g, w).into_iter().flat_map(|f| {
        let fn_ = g.node(f);
        let extra = if fn_.op == Op::Binary(BinaryOp::Add) { fn_.inputs.clone() } else { vec![] };
        std::iter::once(f).chain(extra)
    });
    let cubic = |x: ValueId, s: ValueId| sum_of(g, s, |a| a == x, |b| monomial(g, b, x, 3).is_some_and(|c| near(c, C)));
    let quadratic = |x: ValueId, s: ValueId| sum_of(g, s, |a| is_one(g, a), |b| monomial(g, b, x, 2).is_some_and(|c| near(c, C)));
    cand.find(|&x| {
        // w = c1 · (x + C·x³), or w = c1 · x · (1 + C·x²).
        let (vars, scale) = factors(g, w, &[x]);
        near(scale, c1)
            && match vars.as_slice() {
                [s] => cubic(x, *s),
                [a, b] => (*a == x && quadratic(x, *b)) || (*b == x && quadratic(x, *a)),
                _ => false,
            }
    })
}

/// `x · ½ · (1 + erf(x / √2))` (`Gelu`) or `x · ½ · (1 + tanh(√(2/π)·(x + 0.044715·x³)))`
/// (`GeluTanh`) in any arrangement: (x, op).
fn gelu(g: &Graph, v: ValueId) -> Option<(ValueId, UnaryOp)> {
    let n = g.node(v);
    if !matches!(n.op, Op::Binary(BinaryOp::Mul) | Op::Binary(BinaryOp::Div)) || !n.dtype.is_float() {
        return None;
    }
    // Every `1 + erf(…)` / `1 + tanh(…)` among the product's factors names its x; with x and
    // that factor held whole (x may itself be a product), the rest must be constants making ½.
    product_nodes(g, v).into_iter().find_map(|p| {
        let (x, op) = match one_plus_erf(g, p) {
            Some(x) => (x, UnaryOp::Gelu),
            None => (one_plus_tanh(g, p)?, UnaryOp::GeluTanh),
        };
        let (vars, scale) = factors(g, v, &[x, p]);
        let exact = vars.len() == 2 && vars.contains(&x) && vars.contains(&p) && x != p;
        (exact && near(scale, 0.5) && g.node(x).shape == n.shape && g.node(x).dtype == n.dtype).then_some((x, op))
    })
}

impl Pass for Activations {
    fn name(&self) -> &'static str {
        "activations"
    }

    fn run(&self, graph: &Graph, _ctx: &mut PassCtx) -> Result<Graph> {
        let mut rw = Rewriter::new(graph);
        for (i, n) in graph.nodes.iter().enumerate() {
            match gelu(graph, ValueId(i as u32)) {
                Some((x, op)) => {
                    let x = rw.get(x);
                    let v = rw.push(&n.name, Op::Unary(op), vec![x], &n.shape)?;
                    rw.set(i, v);
                }
                None => {
                    rw.copy(i)?;
                }
            }
        }
        Ok(rw.finish())
    }
}
