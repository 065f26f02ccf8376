//! The classification losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (an
//! evaluation graph's loss head), over kiln ops.
//!
//! The target class of each position picks its input value through a 0/1 one-hot of the labels
//! against the class axis (a product and a sum over C, which the fusion makes one reduction),
//! as it picks its class weight; a label equal to `ignore_index` (or outside [0, C), which
//! picks nothing) weighs 0. `mean` divides by the sum of the weights picked, as ONNX defines it.

use kiln_runtime::graph::{BinaryOp, Op, ReduceOp, UnaryOp, ValueId};
use kiln_runtime::DType;

use super::super::tensor::{Elem, Lit};
use super::{given, Fail, Importer, NodeCx, Val, R};

/// The ops this file imports.
pub(super) const OPS: &[&str] = &["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"];

impl Importer<'_> {
    /// A node of one of [`OPS`] with a graph-computed input, as kiln ops. Returns its outputs.
    pub(super) fn import_loss(&mut self, cx: &NodeCx) -> R<Vec<ValueId>> {
        let NodeCx { op, name, ins, at, .. } = *cx;
        let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
        let xs = self.shape(&Val::Node(x));
        let dt = self.dtype(&Val::Node(x));
        if xs.len() < 2 || !dt.is_float() {
            return Err(Fail::Invalid(format!("{op} of a {dt} input of shape {xs:?} (it takes [N, C, ..] scores)")));
        }
        let c = xs[1];
        let x = self.cast_to(name, x, DType::F32)?;
        // SoftmaxCrossEntropyLoss is the NLL of the log-probabilities over the class axis.
        let logp = if op == "SoftmaxCrossEntropyLoss" { Some(self.log_softmax(name, x, vec![1])?) } else { None };
        let input = logp.unwrap_or(x);
        let labels = self.node(&cx.iname(1), &cx.inp(1)?)?;
        let ls = self.shape(&Val::Node(labels));
        let want: Vec<usize> = [xs[0]].iter().chain(&xs[2..]).copied().collect();
        if ls != want {
            return Err(Fail::Invalid(format!("{op} labels of shape {ls:?} for scores of shape {xs:?} (want {want:?})")));
        }
        // Labels as [N, 1, d..] against classes [1, C, 1..]: a 0/1 one-hot [N, C, d..].
        let lf = self.cast_to(name, labels, DType::F32)?;
        let mut l1 = want.clone();
        l1.insert(1, 1);
        let lf1 = self.reshape(&self.fresh(name), lf, &l1)?;
        let class_shape: Vec<usize> = std::iter::once(1).chain(std::iter::once(c)).chain(std::iter::repeat_n(1, xs.len() - 2)).collect();
        let classes = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, class_shape.clone(), (0..c).map(|k| k as f64).collect())))?;
        let onehot = self.bin(name, BinaryOp::Eq, lf1, classes)?;
        let pick = |me: &mut Self, v: ValueId| -> R<ValueId> {
            let p = me.bin(name, BinaryOp::Mul, v, onehot)?;
            me.tmp(name, Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keep_dims: false }, vec![p])
        };
        let picked = pick(self, input)?;
        // Each position's weight: its class's (1 without weights), 0 where ignored.
        let mut w = if given(ins, 2) {
            let wv = self.node(&cx.iname(2), &cx.inp(2)?)?;
            if self.shape(&Val::Node(wv)) != [c] {
                return Err(Fail::Invalid(format!("{op} weight of shape {:?} for {c} classes", self.shape(&Val::Node(wv)))));
            }
            let wv = self.cast_to(name, wv, DType::F32)?;
            let wv = self.reshape(&self.fresh(name), wv, &class_shape)?;
            pick(self, wv)?
        } else {
            self.tmp(name, Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keep_dims: false }, vec![onehot])?
        };
        if at.has("ignore_index") {
            let ii = self.k(name, at.int("ignore_index", 0) as f32, DType::F32)?;
            let keep = self.bin(name, BinaryOp::Ne, lf, ii)?;
            w = self.bin(name, BinaryOp::Mul, w, keep)?;
        }
        let pw = self.bin(name, BinaryOp::Mul, picked, w)?;
        let loss = self.un(name, UnaryOp::Neg, pw)?;
        let all: Vec<usize> = (0..want.len()).collect();
        let total = |me: &mut Self, v: ValueId| me.tmp(name, Op::Reduce { op: ReduceOp::Sum, axes: all.clone(), keep_dims: false }, vec![v]);
        let out = match at.string("reduction").as_deref().unwrap_or("mean") {
            "none" => loss,
            "sum" => total(self, loss)?,
            "mean" => {
                let s = total(self, loss)?;
                let d = total(self, w)?;
                self.bin(name, BinaryOp::Div, s, d)?
            }
            r => return Err(Fail::Invalid(format!("reduction `{r}`"))),
        };
        let mut outs = vec![self.cast_to(name, out, dt)?];
        if let Some(lp) = logp {
            outs.push(self.cast_to(name, lp, dt)?);
        }
        Ok(outs)
    }
}
