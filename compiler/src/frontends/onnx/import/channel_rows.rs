//! Keeping convolution activations as rows of channels between window ops.
//!
//! A window op (conv.rs) reads its input as rows of channels, `[N·ΠS, C]`, and computes its
//! output in that layout; ONNX's layout is `[N, C, S..]`. Imported one node at a time, a
//! ResNet block transposes each convolution's output to `[N, C, S..]`, applies its batch norm,
//! ReLU and residual add there, and the next convolution transposes it back (ResNet-18, 1×224,
//! 2 threads, Zen 4: about a tenth of the run in those transposes).
//!
//! The importer therefore remembers, for a value it produced from rows, the rows form itself
//! (`Importer::rows`), and imports a per-element op with an input that has one on the rows
//! (other full-size inputs transposed to rows, per-channel and scalar operands reshaped to
//! `[1, C]` or kept): the op's one definition (its family's import)
//! runs on `[N·ΠS, C]` values instead of `[N, C, S..]` ones. Its `[N, C, S..]` result is a
//! transpose of the rows result that dead-code elimination drops where only window ops and
//! other per-element ops read it. The middle end's transpose rewrites (`passes/simplify.rs`) do
//! not see this: between the two transposes sit reshapes, broadcast constants and ops of
//! several users, and the layout is a frontend fact (tract's and onnxruntime's NHWC
//! transformers likewise decide it where the convolution's layout is known).

use kiln_runtime::graph::{Op, ValueId};

use super::{Importer, NodeCx, Val, R};

/// Per-element ops (every input broadcast to the output, one output), imported on rows of
/// channels when their inputs allow it.
const PER_ELEMENT: &[&str] = &[
    "Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean", "Relu", "LeakyRelu", "PRelu", "Sigmoid", "HardSigmoid",
    "HardSwish", "Tanh", "Clip", "Elu", "Selu", "Celu", "Softplus", "Softsign", "Mish", "Gelu", "Erf", "Neg", "Abs",
    "Exp", "Sqrt", "Reciprocal", "ThresholdedRelu",
];

/// Ops over `[N, C, ..]` whose input 0 is the activation and whose other inputs are
/// per-channel vectors: on rows `[N·ΠS, C]` the channel is still axis 1.
const PER_CHANNEL: &[&str] = &["BatchNormalization"];

impl Importer<'_> {
    /// Records `rows` (`[N·ΠS, C]`) as the rows form of `x` (`[N, C, S..]`).
    pub(super) fn set_rows(&mut self, x: ValueId, rows: ValueId) {
        self.rows.insert(x, rows);
    }

    /// The rows form of `x`, where the importer made `x` from one.
    pub(super) fn rows_of(&self, x: ValueId) -> Option<ValueId> {
        self.rows.get(&x).copied()
    }

    /// `cx`'s outputs computed on rows of channels, or None where its op or inputs do not
    /// allow it (then it is imported as usual).
    pub(super) fn on_channel_rows(&mut self, cx: &NodeCx, import: impl FnOnce(&mut Self, &NodeCx) -> R<Vec<ValueId>>) -> R<Option<Vec<ValueId>>> {
        if PER_CHANNEL.contains(&cx.op) {
            return self.channel_op_on_rows(cx, import);
        }
        if !PER_ELEMENT.contains(&cx.op) {
            return Ok(None);
        }
        // The common shape [N, C, S..] of the inputs with a rows form.
        let mut shape: Option<Vec<usize>> = None;
        for v in cx.ins.iter().flatten() {
            if let Val::Node(id) = v {
                if self.rows_of(*id).is_some() {
                    let s = self.shape(v);
                    if shape.as_ref().is_some_and(|t| *t != s) {
                        return Ok(None);
                    }
                    shape = Some(s);
                }
            }
        }
        let Some(shape) = shape else { return Ok(None) };
        if shape.len() < 3 {
            return Ok(None);
        }
        let c = shape[1];
        let mut ins = Vec::with_capacity(cx.ins.len());
        for v in cx.ins {
            let Some(v) = v else {
                ins.push(None);
                continue;
            };
            if let Val::Node(id) = v {
                if let Some(r) = self.rows_of(*id) {
                    ins.push(Some(Val::Node(r)));
                    continue;
                }
            }
            let s = self.shape(v);
            if let Val::Node(id) = v {
                if s == shape {
                    // A full-size operand made in `[N, C, S..]` (a residual from a graph input):
                    // transposed once here instead of the result back and forth.
                    ins.push(Some(Val::Node(self.channel_rows(cx.name, *id)?)));
                    continue;
                }
            }
            if s.iter().product::<usize>() == 1 {
                // A scalar broadcasts to either layout (Clip's bounds stay scalars).
                ins.push(Some(v.clone()));
                continue;
            }
            // Per channel: size 1 everywhere but the channel axis, right-aligned to the output.
            if s.len() > shape.len() {
                return Ok(None);
            }
            let at = shape.len() - s.len();
            let per_channel = s.iter().enumerate().all(|(i, &d)| d == 1 || (i + at == 1 && d == c));
            if !per_channel {
                return Ok(None);
            }
            ins.push(Some(match v {
                Val::Lit(l) => Val::Lit(super::Lit { shape: vec![1, c], ..l.clone() }),
                Val::Node(id) => Val::Node(self.reshape(&self.fresh(cx.name), *id, &[1, c])?),
            }));
        }
        self.import_on_rows(cx, &ins, &shape, import)
    }

    /// A [`PER_CHANNEL`] op on the rows form of its input 0, its other inputs as they are.
    fn channel_op_on_rows(&mut self, cx: &NodeCx, import: impl FnOnce(&mut Self, &NodeCx) -> R<Vec<ValueId>>) -> R<Option<Vec<ValueId>>> {
        let Some(Some(Val::Node(x))) = cx.ins.first() else { return Ok(None) };
        let Some(r) = self.rows_of(*x) else { return Ok(None) };
        let shape = self.shape(&Val::Node(*x));
        if shape.len() < 3 || cx.n.output.iter().skip(1).any(|o| !o.is_empty()) {
            return Ok(None);
        }
        let mut ins = cx.ins.to_vec();
        ins[0] = Some(Val::Node(r));
        self.import_on_rows(cx, &ins, &shape, import)
    }

    /// `cx` imported with inputs `ins` (rows forms in place of `[N, C, S..]` values of `shape`),
    /// its one output back in `[N, C, S..]` with its rows form recorded.
    fn import_on_rows(&mut self, cx: &NodeCx, ins: &[Option<Val>], shape: &[usize], import: impl FnOnce(&mut Self, &NodeCx) -> R<Vec<ValueId>>) -> R<Option<Vec<ValueId>>> {
        let on_rows = NodeCx { ins, ..*cx };
        let outs = import(self, &on_rows)?;
        let &[r] = outs.as_slice() else { return Ok(None) };
        let (n, c) = (shape[0], shape[1]);
        let y = self.reshape(&self.fresh(cx.name), r, &[n, shape[2..].iter().product(), c])?;
        Ok(Some(vec![self.channels_first(cx.name, y, n, c, &shape[2..])?]))
    }

    /// `[N, ΠO, C]` back to ONNX's `[N, C, O..]`, the last node named `name`; its rows form is
    /// recorded.
    pub(super) fn channels_first(&mut self, name: &str, y: ValueId, n: usize, c: usize, o: &[usize]) -> R<ValueId> {
        let out: Vec<usize> = [n, c].iter().chain(o).copied().collect();
        let po: usize = o.iter().product();
        let x = if po == 1 || c == 1 {
            self.reshape(name, y, &out)?
        } else {
            let t = self.tmp(name, Op::Transpose { perm: vec![0, 2, 1] }, vec![y])?;
            self.reshape(name, t, &out)?
        };
        let rows = self.reshape(&self.fresh(name), y, &[n * po, c])?;
        self.set_rows(x, rows);
        Ok(x)
    }
}
