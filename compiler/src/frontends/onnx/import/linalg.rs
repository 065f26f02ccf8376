//! Products: MatMul (a vector as a 1-row or 1-column matrix) and Gemm (the quantized forms are
//! in `quant.rs`).

use kiln_runtime::graph::{BinaryOp, Op, ValueId};

use super::{one, unsup, Importer, NodeCx, Val, R};

/// The ops this file imports.
pub(super) const OPS: &[&str] = &[
    "MatMul", "Gemm",
];

impl Importer<'_> {
    /// A node of one of [`OPS`] with a graph-computed input, as kiln ops. Returns its outputs.
    pub(super) fn import_linalg(&mut self, cx: &NodeCx) -> R<Vec<ValueId>> {
        let NodeCx { op, name, ins, at, .. } = *cx;
        match op {
            "MatMul" => {
                let (a, b) = (self.node(&cx.iname(0), &cx.inp(0)?)?, self.node(&cx.iname(1), &cx.inp(1)?)?);
                let (sa, sb) = (self.shape(&Val::Node(a)), self.shape(&Val::Node(b)));
                let a2 = if sa.len() == 1 { self.reshape(&self.fresh(name), a, &[1, sa[0]])? } else { a };
                let b2 = if sb.len() == 1 { self.reshape(&self.fresh(name), b, &[sb[0], 1])? } else { b };
                let mut y = self.push(name, Op::MatMul { transpose_a: false, transpose_b: false }, vec![a2, b2])?;
                if sa.len() == 1 || sb.len() == 1 {
                    let mut s = self.shape(&Val::Node(y));
                    if sb.len() == 1 {
                        s.pop();
                    }
                    if sa.len() == 1 {
                        s.remove(s.len() - 1 - usize::from(sb.len() != 1));
                    }
                    y = self.reshape(&self.fresh(name), y, &s)?;
                }
                one(y)
            }
            "Gemm" => {
                let (a, b) = (self.node(&cx.iname(0), &cx.inp(0)?)?, self.node(&cx.iname(1), &cx.inp(1)?)?);
                let (ta, tb) = (at.int("transA", 0) != 0, at.int("transB", 0) != 0);
                let (alpha, beta) = (at.float("alpha", 1.0), at.float("beta", 1.0));
                let mm = if alpha == 1.0 && ins.get(2).cloned().flatten().is_none() { name.to_string() } else { self.fresh(name) };
                let mut y = self.push(&mm, Op::MatMul { transpose_a: ta, transpose_b: tb }, vec![a, b])?;
                if alpha != 1.0 {
                    let k = self.scalar(name, alpha, self.dtype(&Val::Node(y)))?;
                    y = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![y, k])?;
                }
                if let Some(c) = ins.get(2).cloned().flatten() {
                    let mut c = self.node(&cx.iname(2), &c)?;
                    if beta != 1.0 {
                        let k = self.scalar(name, beta, self.dtype(&Val::Node(c)))?;
                        c = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![c, k])?;
                    }
                    y = self.push(name, Op::Binary(BinaryOp::Add), vec![y, c])?;
                }
                one(y)
            }
            _ => unsup(format!("op `{op}` is not supported")),
        }
    }

}
