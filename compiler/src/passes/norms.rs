//! `norms`: LayerNorm and RMSNorm written out as elementwise ops and mean reductions (what
//! exporters emit below ONNX opset 17, or for models that spell the norm by hand) become the one
//! norm op, so that fusion sees a norm, not seven kernels:
//! - LayerNorm: `d = x - mean(x)`, `v = mean(d·d)`, `n = d / sqrt(v + eps)` (or `d · rsqrt(v +
//!   eps)`, or `d · 1/sqrt(v + eps)`), then `n·γ + β` or `n·γ`;
//! - RMSNorm: `n = x / sqrt(mean(x·x) + eps)` (same spellings), then `n·γ`.
//!
//! Means are over the last axis with kept dims; γ and β are f32 values of `[n]` (or
//! `[1, .., 1, n]`) for a last dim of n, in either operand order; eps is a scalar constant. The
//! match is on the pass's input graph (its node structure), the replacement reads the mapped
//! values, and the left-over elementwise nodes go in `dce` when nothing else uses them.
//! Results differ from the written-out form by rounding only (the same formula, computed in
//! one kernel).
//!
//! tract lets each op own its rewrites (a `declutter` per op); here the norm is a pattern across
//! seven ops, none of which owns it, so it is one small pass like the others.

use kiln_runtime::graph::{BinaryOp, Dim, Graph, Op, ReduceOp, UnaryOp, ValueId};
use kiln_runtime::{DType, Result};

use super::{scalar_const, Pass, PassCtx, Rewriter};

pub struct Norms;

/// What a root node computes, in the input graph's values.
enum Found {
    Layer { x: ValueId, gamma: ValueId, beta: Option<ValueId>, eps: f32 },
    Rms { x: ValueId, gamma: ValueId, eps: f32 },
}

struct Matcher<'g> {
    g: &'g Graph,
    uses: Vec<usize>,
}

impl Matcher<'_> {
    fn bin(&self, v: ValueId, op: BinaryOp) -> Option<(ValueId, ValueId)> {
        let n = self.g.node(v);
        (n.op == Op::Binary(op)).then(|| (n.inputs[0], n.inputs[1]))
    }

    fn un(&self, v: ValueId, op: UnaryOp) -> Option<ValueId> {
        let n = self.g.node(v);
        (n.op == Op::Unary(op)).then(|| n.inputs[0])
    }

    /// `mean(x)` over the last axis, dims kept: x.
    fn mean_last(&self, v: ValueId) -> Option<ValueId> {
        let n = self.g.node(v);
        let Op::Reduce { op: ReduceOp::Mean, axes, keep_dims: true } = &n.op else { return None };
        let x = n.inputs[0];
        (axes.len() == 1 && axes[0] + 1 == self.g.node(x).shape.len()).then_some(x)
    }

    /// `a + eps` with a scalar constant eps (either order): (a, eps).
    fn plus_eps(&self, v: ValueId) -> Option<(ValueId, f32)> {
        let (a, b) = self.bin(v, BinaryOp::Add)?;
        match (scalar_const(self.g, a), scalar_const(self.g, b)) {
            (_, Some(e)) => Some((a, e)),
            (Some(e), None) => Some((b, e)),
            _ => None,
        }
    }

    /// `d / sqrt(s)`, `d · rsqrt(s)` or `d · (1 / sqrt(s))` (a reciprocal, or a division of
    /// the constant 1 as PyTorch's TorchScript export writes `torch.rsqrt`): (d, s).
    fn over_root(&self, v: ValueId) -> Option<(ValueId, ValueId)> {
        if let Some((d, r)) = self.bin(v, BinaryOp::Div) {
            return Some((d, self.un(r, UnaryOp::Sqrt)?));
        }
        let (a, b) = self.bin(v, BinaryOp::Mul)?;
        let one_over = |r: ValueId| {
            let (one, q) = self.bin(r, BinaryOp::Div)?;
            (scalar_const(self.g, one) == Some(1.0)).then_some(q)
        };
        let inv_root = |r: ValueId| {
            self.un(r, UnaryOp::Rsqrt)
                .or_else(|| self.un(self.un(r, UnaryOp::Recip)?, UnaryOp::Sqrt))
                .or_else(|| self.un(one_over(r)?, UnaryOp::Sqrt))
        };
        match (inv_root(b), inv_root(a)) {
            (Some(s), _) => Some((a, s)),
            (None, Some(s)) => Some((b, s)),
            _ => None,
        }
    }

    /// `(x - mean(x)) / sqrt(mean((x - mean(x))²) + eps)`: (x, eps).
    fn layer_normalized(&self, v: ValueId) -> Option<(ValueId, f32)> {
        let (d, s) = self.over_root(v)?;
        let (var, eps) = self.plus_eps(s)?;
        let (x, m) = self.bin(d, BinaryOp::Sub)?;
        if self.mean_last(m)? != x {
            return None;
        }
        let (d1, d2) = self.bin(self.mean_last(var)?, BinaryOp::Mul)?;
        (d1 == d && d2 == d).then_some((x, eps))
    }

    /// `x / sqrt(mean(x²) + eps)`: (x, eps).
    fn rms_normalized(&self, v: ValueId) -> Option<(ValueId, f32)> {
        let (x, s) = self.over_root(v)?;
        let (ms, eps) = self.plus_eps(s)?;
        let (a, b) = self.bin(self.mean_last(ms)?, BinaryOp::Mul)?;
        (a == x && b == x).then_some((x, eps))
    }

    /// An f32 per-channel vector for x's last dim: `[n]` or `[1, .., 1, n]`.
    fn channel(&self, v: ValueId, x: ValueId) -> bool {
        let (s, xs) = (&self.g.node(v).shape, &self.g.node(x).shape);
        let Some(&last @ Dim::Fixed(_)) = xs.last() else { return false };
        self.g.node(v).dtype == DType::F32
            && s.last() == Some(&last)
            && s.len() <= xs.len()
            && s[..s.len() - 1].iter().all(|d| *d == Dim::Fixed(1))
    }

    /// `p · q` with one side normalized by `norm` and the other a channel vector.
    fn scaled(&self, v: ValueId, norm: impl Fn(ValueId) -> Option<(ValueId, f32)>) -> Option<(ValueId, ValueId, f32)> {
        let (a, b) = self.bin(v, BinaryOp::Mul)?;
        for (n, gamma) in [(a, b), (b, a)] {
            if let Some((x, eps)) = norm(n) {
                if self.channel(gamma, x) && self.g.node(v).shape == self.g.node(x).shape {
                    return Some((x, gamma, eps));
                }
            }
        }
        None
    }

    fn root(&self, v: ValueId) -> Option<Found> {
        let n = self.g.node(v);
        if n.dtype != DType::F32 {
            return None;
        }
        if let Some((a, b)) = self.bin(v, BinaryOp::Add) {
            for (p, beta) in [(a, b), (b, a)] {
                if let Some((x, gamma, eps)) = self.scaled(p, |u| self.layer_normalized(u)) {
                    if self.channel(beta, x) && n.shape == self.g.node(x).shape {
                        return Some(Found::Layer { x, gamma, beta: Some(beta), eps });
                    }
                }
            }
            return None;
        }
        if let Some((x, gamma, eps)) = self.scaled(v, |u| self.layer_normalized(u)) {
            // `n·γ` whose one user adds a channel vector: that Add is the root.
            let beta_follows = self.uses[v.index()] == 1
                && self.g.nodes.iter().any(|u| {
                    u.op == Op::Binary(BinaryOp::Add)
                        && u.inputs.contains(&v)
                        && u.inputs.iter().any(|&w| w != v && self.channel(w, x))
                });
            return (!beta_follows).then_some(Found::Layer { x, gamma, beta: None, eps });
        }
        let (x, gamma, eps) = self.scaled(v, |u| self.rms_normalized(u))?;
        Some(Found::Rms { x, gamma, eps })
    }
}

/// γ or β as the `[n]` vector the norm op takes.
fn as_vector(rw: &mut Rewriter, name: &str, v: ValueId) -> Result<ValueId> {
    let s = rw.new.node(v).shape.clone();
    if s.len() == 1 {
        return Ok(v);
    }
    let last = s[s.len() - 1];
    rw.push(&format!("{name}.vec"), Op::Reshape, vec![v], &[last])
}

impl Pass for Norms {
    fn name(&self) -> &'static str {
        "norms"
    }

    fn run(&self, graph: &Graph, _ctx: &mut PassCtx) -> Result<Graph> {
        let m = Matcher { g: graph, uses: super::use_counts(graph) };
        let mut rw = Rewriter::new(graph);
        for (i, n) in graph.nodes.iter().enumerate() {
            let found = m.root(ValueId(i as u32));
            let v = match found {
                Some(Found::Layer { x, gamma, beta, eps }) => {
                    let (x, g) = (rw.get(x), rw.get(gamma));
                    let g = as_vector(&mut rw, &n.name, g)?;
                    let b = match beta {
                        Some(b) => {
                            let b = rw.get(b);
                            as_vector(&mut rw, &n.name, b)?
                        }
                        None => {
                            let c = rw.new.node(x).shape.last().and_then(|d| d.fixed()).unwrap_or(0);
                            rw.push(&format!("{}.beta", n.name), Op::Constant { values: vec![0.0; c] }, vec![], &[Dim::Fixed(c)])?
                        }
                    };
                    rw.push(&n.name, Op::LayerNorm { eps }, vec![x, g, b], &n.shape)?
                }
                Some(Found::Rms { x, gamma, eps }) => {
                    let (x, g) = (rw.get(x), rw.get(gamma));
                    let g = as_vector(&mut rw, &n.name, g)?;
                    rw.push(&n.name, Op::RmsNorm { eps }, vec![x, g], &n.shape)?
                }
                None => {
                    rw.copy(i)?;
                    continue;
                }
            };
            rw.set(i, v);
        }
        Ok(rw.finish())
    }
}
