//! `simplify`: local algebraic rewrites, applied in one forward sweep that looks at the
//! already-simplified producers (so chains collapse completely):
//! - `reshape(x)` to x's own shape → `x`; `reshape(reshape(x))` → `reshape(x)`;
//! - `reshape(transpose(reshape(x)))` where the inner reshape only regroups x's leading dims,
//!   the transpose keeps those and the outer reshape restores them → one transpose of x
//!   (exporters write a per-head transpose `[B,H,S,D]` → `[B·H,S,D]` → `[B·H,D,S]` → `[B,H,D,S]`);
//! - identity transposes → `x`; `transpose(transpose(x))` → one transpose; a transpose that
//!   only moves size-1 dims → a reshape (a free view);
//! - `cast(x)` to x's own dtype → `x`; `neg(neg(x))` → `x`;
//! - `x*1`, `1*x`, `x+0`, `0+x`, `x-0`, `x/1` → `x` (only where broadcasting does not change
//!   x's shape);
//! - an operand `x*ones` (an all-ones constant: how ONNX `Expand` imports) of an elementwise
//!   binary op or of a softmax's additive mask → `x`, where the op broadcasts `x` to the same
//!   result (exporters expand BERT's `[B,1,1,S]` mask to `[B,1,S,S]`; the attention kernel
//!   then reads one broadcast mask row instead, and can skip padded keys);
//! - `matmul(transpose(x))` where the transpose swaps just the last two dims → the MatMul's
//!   `transpose_a`/`transpose_b` flag (other transposes feeding a MatMul become strides at
//!   fusion);
//! - `max(reshape(x), c)` / `min(reshape(x), c)` with `c` one constant value and the reshape
//!   used only there → `reshape(max(x, c))`: the clamp moves above the reshape, into the
//!   elementwise group that computes `x` (a depthwise convolution's sum and its ReLU6, which
//!   the importer's reshape back to rows kept apart: one more pass over the activation each).
//!
//! Nodes left without users are removed by `dce`.

use kiln_runtime::graph::{BinaryOp, Dim, Graph, Op, UnaryOp, ValueId};
use kiln_runtime::Result;

use super::{fixed_shape, splat_const, Pass, PassCtx, Rewriter};

pub struct Simplify;

fn is_identity(perm: &[usize]) -> bool {
    perm.iter().enumerate().all(|(i, &p)| i == p)
}

/// Swaps exactly the last two dims and keeps the others.
fn is_last_two_swap(perm: &[usize]) -> bool {
    let r = perm.len();
    r >= 2 && perm[r - 2] == r - 1 && perm[r - 1] == r - 2 && is_identity(&perm[..r - 2])
}

impl Pass for Simplify {
    fn name(&self) -> &'static str {
        "simplify"
    }

    fn run(&self, graph: &Graph, _ctx: &mut PassCtx) -> Result<Graph> {
        let mut rw = Rewriter::new(graph);
        // Original nodes read once and not graph outputs.
        let uses = super::use_counts(graph);
        for (i, n) in graph.nodes.iter().enumerate() {
            let ins: Vec<ValueId> = n.inputs.iter().map(|&v| rw.get(v)).collect();
            if let Some(v) = sink_reshape(&mut rw, n, &ins, &|v: ValueId| uses[v.index()] == 1)? {
                rw.set(i, v);
                continue;
            }
            if let Some(v) = simplify_node(&mut rw, n, &ins)? {
                rw.set(i, v);
            } else {
                let v = rw.push(&n.name, n.op.clone(), ins, &n.shape)?;
                rw.set(i, v);
            }
        }
        Ok(rw.finish())
    }
}

/// `x = transpose(y, perm)`, `y = reshape(src)`, and a reshape of x to `out`: when y regroups
/// src's leading dims (`src = A ++ T`, `y = B ++ T`, `∏A = ∏B`), perm keeps B in place and
/// `out = A ++ perm(T)`, the whole chain is `transpose(src, id(A) ++ perm(T))`.
fn regrouped_transpose(g: &Graph, x: ValueId, out: &[Dim]) -> Option<(ValueId, Vec<usize>)> {
    let Op::Transpose { perm } = &g.node(x).op else { return None };
    let y = g.node(x).inputs[0];
    if !matches!(g.node(y).op, Op::Reshape) {
        return None;
    }
    let src = g.node(y).inputs[0];
    let (ss, ys, xs, os) = (fixed_shape(&g.node(src).shape)?, fixed_shape(&g.node(y).shape)?, fixed_shape(&g.node(x).shape)?, fixed_shape(out)?);
    for b in 0..ys.len() {
        if !is_identity(&perm[..b]) {
            break;
        }
        let t = ys.len() - b;
        if t > ss.len() || ss[ss.len() - t..] != ys[b..] {
            continue;
        }
        let a = ss.len() - t;
        if ss[..a].iter().product::<usize>() != ys[..b].iter().product::<usize>() {
            continue;
        }
        if os[..] != [&ss[..a], &xs[b..]].concat()[..] {
            continue;
        }
        let p: Vec<usize> = (0..a).chain(perm[b..].iter().map(|&j| j - b + a)).collect();
        return Some((src, p));
    }
    None
}

/// The replacement of one node, or `None` to keep it (with mapped inputs).
fn simplify_node(rw: &mut Rewriter, n: &kiln_runtime::Node, ins: &[ValueId]) -> Result<Option<ValueId>> {
    let g = &rw.new;
    match &n.op {
        Op::Reshape => {
            let x = ins[0];
            if g.node(x).shape == n.shape {
                return Ok(Some(x));
            }
            if matches!(g.node(x).op, Op::Reshape) {
                let src = g.node(x).inputs[0];
                if g.node(src).shape == n.shape {
                    return Ok(Some(src));
                }
                return rw.push(&n.name, Op::Reshape, vec![src], &n.shape).map(Some);
            }
            if let Some((src, perm)) = regrouped_transpose(g, x, &n.shape) {
                return rw.push(&n.name, Op::Transpose { perm }, vec![src], &n.shape).map(Some);
            }
            Ok(None)
        }
        Op::Transpose { perm } => {
            let x = ins[0];
            if is_identity(perm) {
                return Ok(Some(x));
            }
            if let Op::Transpose { perm: p1 } = &g.node(x).op {
                let src = g.node(x).inputs[0];
                let composed: Vec<usize> = perm.iter().map(|&j| p1[j]).collect();
                if is_identity(&composed) {
                    return Ok(Some(src));
                }
                return rw.push(&n.name, Op::Transpose { perm: composed }, vec![src], &n.shape).map(Some);
            }
            // Only size-1 dims move: the element order is unchanged, so it is a reshape.
            let xs = &g.node(x).shape;
            let order: Vec<usize> = perm.iter().copied().filter(|&p| xs[p] != kiln_runtime::Dim::Fixed(1)).collect();
            if order.windows(2).all(|w| w[0] < w[1]) {
                if matches!(g.node(x).op, Op::Reshape) {
                    let src = g.node(x).inputs[0];
                    if g.node(src).shape == n.shape {
                        return Ok(Some(src));
                    }
                    return rw.push(&n.name, Op::Reshape, vec![src], &n.shape).map(Some);
                }
                return rw.push(&n.name, Op::Reshape, vec![x], &n.shape).map(Some);
            }
            Ok(None)
        }
        Op::Cast { to } => Ok((g.node(ins[0]).dtype == *to).then_some(ins[0])),
        Op::Unary(UnaryOp::Neg) => {
            let x = ins[0];
            match g.node(x).op {
                Op::Unary(UnaryOp::Neg) => Ok(Some(g.node(x).inputs[0])),
                _ => Ok(None),
            }
        }
        Op::Binary(_) | Op::Softmax { .. } if ins.len() == 2 => {
            if let Some(args) = unexpanded(g, n, ins) {
                return rw.push(&n.name, n.op.clone(), args, &n.shape).map(Some);
            }
            simplify_binary(g, n, ins)
        }
        Op::MatMul { transpose_a, transpose_b } => {
            let mut flags = [*transpose_a, *transpose_b];
            let mut args = [ins[0], ins[1]];
            let mut changed = false;
            for k in 0..2 {
                if let Op::Transpose { perm } = &g.node(args[k]).op {
                    if is_last_two_swap(perm) {
                        args[k] = g.node(args[k]).inputs[0];
                        flags[k] = !flags[k];
                        changed = true;
                    }
                }
            }
            if !changed {
                return Ok(None);
            }
            let op = Op::MatMul { transpose_a: flags[0], transpose_b: flags[1] };
            rw.push(&n.name, op, args.to_vec(), &n.shape).map(Some)
        }
        _ => Ok(None),
    }
}

/// `max`/`min` of a single-use reshape and one constant value → the reshape of the `max`/`min`
/// of its source (operands in their order; the same value at every element).
fn sink_reshape(rw: &mut Rewriter, n: &kiln_runtime::Node, ins: &[ValueId], single: &dyn Fn(ValueId) -> bool) -> Result<Option<ValueId>> {
    let (Op::Binary(BinaryOp::Max | BinaryOp::Min), [a, b]) = (&n.op, ins) else { return Ok(None) };
    let g = &rw.new;
    let one = |v: ValueId| splat_const(g, v).is_some() && fixed_shape(&g.node(v).shape).is_some_and(|s| s.iter().product::<usize>() == 1);
    let k = match (matches!(g.node(*a).op, Op::Reshape) && single(n.inputs[0]) && one(*b), matches!(g.node(*b).op, Op::Reshape) && single(n.inputs[1]) && one(*a)) {
        (true, _) => 0,
        (_, true) => 1,
        _ => return Ok(None),
    };
    let mut args = [*a, *b];
    let src = g.node(args[k]).inputs[0];
    let src_shape = g.node(src).shape.clone();
    let keeps = crate::ir::infer::broadcast_shapes(&n.name, &src_shape, &g.node(args[1 - k]).shape).is_ok_and(|s| s == src_shape);
    if !keeps || g.node(src).dtype != n.dtype {
        return Ok(None);
    }
    args[k] = src;
    let y = rw.push(&n.name, n.op.clone(), args.to_vec(), &src_shape)?;
    rw.push(&format!("{}.reshape", n.name), Op::Reshape, vec![y], &n.shape).map(Some)
}

/// `x` where `v` is `x*ones` or `ones*x` (`ones` an all-ones constant): an `Expand` as ONNX
/// imports it.
fn expanded_from(g: &Graph, v: ValueId) -> Option<ValueId> {
    let n = g.node(v);
    if n.op != Op::Binary(BinaryOp::Mul) {
        return None;
    }
    let (a, b) = (n.inputs[0], n.inputs[1]);
    let x = if splat_const(g, b) == Some(1.0) {
        a
    } else if splat_const(g, a) == Some(1.0) {
        b
    } else {
        return None;
    };
    (g.node(x).dtype == n.dtype).then_some(x)
}

/// The operands of a binary op or a masked softmax with each expanded operand (see
/// [`expanded_from`]) replaced by what was expanded, where the op's result keeps its shape;
/// `None` when nothing changes. `x·1` is `x` bit for bit (NaN, ±inf and -0 included), so only
/// the broadcast moves into the op.
fn unexpanded(g: &Graph, n: &kiln_runtime::graph::Node, ins: &[ValueId]) -> Option<Vec<ValueId>> {
    let mut args = ins.to_vec();
    let mut changed = false;
    for k in 0..2 {
        // A softmax broadcasts only its mask (input 1).
        if matches!(n.op, Op::Softmax { .. }) && k == 0 {
            continue;
        }
        let Some(x) = expanded_from(g, args[k]) else { continue };
        let other = &g.node(args[1 - k]).shape;
        let keeps = crate::ir::infer::broadcast_shapes(&n.name, other, &g.node(x).shape).is_ok_and(|s| s == n.shape);
        if keeps {
            args[k] = x;
            changed = true;
        }
    }
    changed.then_some(args)
}

/// The identities of a binary op (`x*1`, `x+(-0)`, ...), where broadcasting keeps x's shape.
fn simplify_binary(g: &Graph, n: &kiln_runtime::graph::Node, ins: &[ValueId]) -> Result<Option<ValueId>> {
    let Op::Binary(op) = n.op else { return Ok(None) };
    let (a, b) = (ins[0], ins[1]);
    // `keep` is returned when it already has the result's shape.
    let same = |v: ValueId| g.node(v).shape == n.shape && g.node(v).dtype == n.dtype;
    let cb = splat_const(g, b);
    let ca = splat_const(g, a);
    let float = n.dtype.is_float();
    let is_zero = |c: Option<f32>, negative: bool| {
        c.is_some_and(|c| c == 0.0 && (!float || c.is_sign_negative() == negative))
    };
    let r = match op {
        BinaryOp::Mul if cb == Some(1.0) && same(a) => Some(a),
        BinaryOp::Mul if ca == Some(1.0) && same(b) => Some(b),
        // Only `-0` is the identity of float addition (`-0 + +0 = +0`), and only `+0`
        // of subtraction; integer zeros have one sign.
        BinaryOp::Add if is_zero(cb, true) && same(a) => Some(a),
        BinaryOp::Add if is_zero(ca, true) && same(b) => Some(b),
        BinaryOp::Sub if is_zero(cb, false) && same(a) => Some(a),
        BinaryOp::Div if cb == Some(1.0) && same(a) => Some(a),
        _ => None,
    };
    Ok(r)
}
