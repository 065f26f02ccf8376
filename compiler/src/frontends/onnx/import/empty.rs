//! Values with no elements. kiln's graph has no empty tensors, and an empty value needs none:
//! its shape is all there is to it, so the importer holds it as a literal of that shape. Exports
//! make them where a split has nothing left on one side: a rotary embedding over the whole head
//! slices the "pass-through" part `x[..., rotary_dim:]` as `[B, H, S, 0]` and concatenates it back
//! (PyTorch's TorchScript export of Phi-3 and other decoders). Concat already leaves empty inputs
//! out; what is computed from an empty value without making it non-empty is empty too.
//! (onnxruntime allocates zero-size tensors and runs its kernels over them; tract carries
//! symbolic zero dims through its graph. kiln fixes every dim per bucket at import, so the
//! emptiness is known there and nothing needs to reach the graph.)

use super::layout::{slice_cuts, split_sizes};
use super::*;

/// At most this many elements stand in for an op's run-time inputs when it folds over an empty
/// one (a broadcast partner of an empty value is no larger on the empty axis, so these are small).
const MAX_STAND_IN: usize = 1 << 20;

impl Importer<'_> {
    /// `cx`'s outputs as empty literals where the node computes nothing: a Slice that keeps no
    /// element along some axis of a run-time value (a Split with such a piece: that piece, the
    /// others as slices), or an op with an empty input whose outputs are all empty. The second
    /// is found by folding the op with each run-time input stood in for by ones of its shape
    /// and type: an empty result has no values that could depend on them. `None`: the node
    /// computes something (its family imports it, or says why not).
    pub(super) fn empty_outputs(&mut self, cx: &NodeCx) -> R<Option<Vec<Val>>> {
        if cx.op == "Split" {
            if let Some(x @ Val::Node(_)) = cx.ins.first().cloned().flatten() {
                // A piece with no elements is a literal, the others slices.
                let empty_piece = split_sizes(cx, &self.shape(&x)).is_ok_and(|(_, sizes)| sizes.contains(&0));
                return if empty_piece { Ok(Some(self.split(cx)?)) } else { Ok(None) };
            }
        }
        if cx.op == "Slice" {
            if let Some(Val::Node(x)) = cx.ins.first().cloned().flatten() {
                let mut s = self.shape(&Val::Node(x));
                let Ok(cuts) = slice_cuts(cx, &s) else { return Ok(None) };
                if !cuts.iter().any(|c| c.3 == 0) {
                    return Ok(None);
                }
                for (ax, _, _, len) in cuts {
                    s[ax] = len;
                }
                return Ok(Some(vec![Val::Lit(Lit::of(self.elem(&Val::Node(x)), s, vec![]))]));
            }
        }
        let empty_in = cx.ins.iter().flatten().any(|v| matches!(v, Val::Lit(l) if l.shape.contains(&0)));
        if !empty_in {
            return Ok(None);
        }
        let mut stand_ins = Vec::with_capacity(cx.ins.len());
        let mut total = 0;
        for v in cx.ins {
            stand_ins.push(match v {
                None => None,
                // A large initializer not read yet: nothing to fold with here.
                Some(Val::Lit(l)) if is_lazy(l) => return Ok(None),
                Some(Val::Lit(l)) => Some(l.clone()),
                Some(v @ Val::Node(_)) => {
                    let s = self.shape(v);
                    let n = s.iter().product::<usize>();
                    total += n;
                    if total > MAX_STAND_IN {
                        return Ok(None);
                    }
                    Some(Lit::of(self.elem(v), s, vec![1.0; n]))
                }
            });
        }
        let refs: Vec<Option<&Lit>> = stand_ins.iter().map(Option::as_ref).collect();
        match fold(cx.op, &refs, cx.at, cx.opset, &self.m.dir) {
            Ok(Some(outs)) if !outs.is_empty() && outs.iter().all(|l| l.shape.contains(&0)) => {
                Ok(Some(outs.into_iter().map(Val::Lit).collect()))
            }
            _ => Ok(None),
        }
    }

    /// The ONNX element type of `v` (a graph value's dtype; bools are held as i64).
    pub(super) fn elem(&self, v: &Val) -> Elem {
        match v {
            Val::Lit(l) => l.elem,
            Val::Node(_) => Elem::from_code(like_code(v, self)).unwrap_or(Elem::F32),
        }
    }
}
