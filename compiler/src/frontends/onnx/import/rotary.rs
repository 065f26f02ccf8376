//! `RotaryEmbedding` (opset 23 on): rotary position embeddings over kiln ops. The input as
//! [B, S, heads·D] (`num_heads`) or [B, heads, S, D]; the first `rotary_embedding_dim` (default D)
//! of each head rotated by pairs, split in halves or interleaved; the cos/sin caches given per
//! position ([max positions, dim/2], rows picked by `position_ids`) or per token ([B, S, dim/2]).
//! Semantics from the onnx package's reference (`onnx/reference/ops/op_rotary_embedding.py`).

use kiln_runtime::graph::{BinaryOp, Dim, Op, ValueId};
use kiln_runtime::DType;

use super::{unsup, Fail, Importer, NodeCx, Val, R};

/// The ops this file imports.
pub(super) const OPS: &[&str] = &["RotaryEmbedding"];

impl Importer<'_> {
    /// A node of one of [`OPS`] with a graph-computed input, as kiln ops. Returns its outputs.
    pub(super) fn import_rotary(&mut self, cx: &NodeCx) -> R<Vec<ValueId>> {
        let NodeCx { name, ins, at, .. } = *cx;
        let x0 = self.node(&cx.iname(0), &cx.inp(0)?)?;
        let dt = self.dtype(&Val::Node(x0));
        if !dt.is_float() {
            return unsup("RotaryEmbedding of integers");
        }
        let xs = self.shape(&Val::Node(x0));
        let x0 = self.cast_to(name, x0, DType::F32)?;
        // As [B, S, heads, D].
        let x = match xs[..] {
            [b, s, hidden] => {
                let heads = at.int("num_heads", 0);
                if heads <= 0 || hidden % heads as usize != 0 {
                    return Err(Fail::Invalid(format!("3-D RotaryEmbedding of width {hidden} needs num_heads dividing it (got {heads})")));
                }
                self.reshape(&self.fresh(name), x0, &[b, s, heads as usize, hidden / heads as usize])?
            }
            [_, _, _, _] => self.tmp(name, Op::Transpose { perm: vec![0, 2, 1, 3] }, vec![x0])?,
            _ => return Err(Fail::Invalid(format!("RotaryEmbedding input of shape {xs:?} (rank 3 or 4)"))),
        };
        let s4 = self.shape(&Val::Node(x));
        let (b, s, h, d) = (s4[0], s4[1], s4[2], s4[3]);
        // Rotated by pairs: an even number of each head's dims.
        let rd = match at.int("rotary_embedding_dim", 0) {
            0 if d % 2 == 0 && d > 0 => d,
            0 => return Err(Fail::Invalid(format!("RotaryEmbedding over heads of size {d} (rotates pairs: an even size)"))),
            r if r > 0 && (r as usize) <= d && r % 2 == 0 => r as usize,
            r => return Err(Fail::Invalid(format!("rotary_embedding_dim {r} for heads of {d}"))),
        };
        let half = rd / 2;
        // cos and sin as [B, S, 1, dim/2].
        let mut cs = Vec::new();
        for k in [1, 2] {
            let c = self.node(&cx.iname(k), &cx.inp(k)?)?;
            let c = self.cast_to(name, c, DType::F32)?;
            let c = if ins.get(3).is_some_and(|v| v.is_some()) {
                let ids = self.node(&cx.iname(3), &cx.inp(3)?)?;
                self.tmp(name, Op::Gather, vec![c, ids])?
            } else {
                c
            };
            // Per-token caches of batch 1 apply to every row: PyTorch's exporter (torch 2.15,
            // opset 23) writes them so for a model whose positions do not depend on the row
            // (onnxruntime 1.32 refuses what its spec text asks to be [B, S, dim/2]).
            let shape = self.shape(&Val::Node(c));
            let rows = shape.first().copied().unwrap_or(0);
            if shape.len() != 3 || (rows != b && rows != 1) || shape[1..] != [s, half] {
                return Err(Fail::Invalid(format!("RotaryEmbedding cache rows of shape {shape:?}, not [{b}, {s}, {half}]")));
            }
            cs.push(self.reshape(&self.fresh(name), c, &[rows, s, 1, half])?);
        }
        let slice = |me: &mut Self, v: ValueId, axis: usize, start: usize, end: usize| {
            me.tmp(name, Op::Slice { axis, start, end: Dim::Fixed(end) }, vec![v])
        };
        let xr = if rd < d { slice(self, x, 3, 0, rd)? } else { x };
        let interleaved = at.int("interleaved", 0) != 0;
        // The pairs (x1, x2): halves, or even and odd positions.
        let (x1, x2, pairs) = if interleaved {
            let p = self.reshape(&self.fresh(name), xr, &[b, s, h, half, 2])?;
            let (e, o) = (slice(self, p, 4, 0, 1)?, slice(self, p, 4, 1, 2)?);
            (self.reshape(&self.fresh(name), e, &[b, s, h, half])?, self.reshape(&self.fresh(name), o, &[b, s, h, half])?, true)
        } else {
            (slice(self, xr, 3, 0, half)?, slice(self, xr, 3, half, rd)?, false)
        };
        let mul = |me: &mut Self, a: ValueId, c: ValueId| me.tmp(name, Op::Binary(BinaryOp::Mul), vec![a, c]);
        let (c1, s2) = (mul(self, cs[0], x1)?, mul(self, cs[1], x2)?);
        let real = self.tmp(name, Op::Binary(BinaryOp::Sub), vec![c1, s2])?;
        let (s1, c2) = (mul(self, cs[1], x1)?, mul(self, cs[0], x2)?);
        let imag = self.tmp(name, Op::Binary(BinaryOp::Add), vec![s1, c2])?;
        let mut y = if pairs {
            let r5 = self.reshape(&self.fresh(name), real, &[b, s, h, half, 1])?;
            let i5 = self.reshape(&self.fresh(name), imag, &[b, s, h, half, 1])?;
            let c = self.tmp(name, Op::Concat { axis: 4 }, vec![r5, i5])?;
            self.reshape(&self.fresh(name), c, &[b, s, h, rd])?
        } else {
            self.tmp(name, Op::Concat { axis: 3 }, vec![real, imag])?
        };
        if rd < d {
            let pass = slice(self, x, 3, rd, d)?;
            y = self.tmp(name, Op::Concat { axis: 3 }, vec![y, pass])?;
        }
        let y = if xs.len() == 3 {
            self.reshape(&self.fresh(name), y, &xs)?
        } else {
            self.tmp(name, Op::Transpose { perm: vec![0, 2, 1, 3] }, vec![y])?
        };
        Ok(vec![self.cast_to(name, y, dt)?])
    }
}
