//! The standard `Attention` op (opset 23 on; PyTorch's exporter writes it for
//! `scaled_dot_product_attention` from opset 23): written over kiln ops as the matmul–softmax–
//! matmul the attention fusion takes, as the contrib `Attention` is. Semantics from the onnx
//! package's reference implementation (`onnx/reference/ops/op_attention.py`).
//!
//! Supported: Q, K, V as [B, S, hidden] (with `q_num_heads` / `kv_num_heads`) or [B, heads, S, D];
//! `scale` (default 1/√D); `softcap`; a bool or additive `attn_mask` of rank 2 to 4, broadcast
//! right-aligned and padded with masked keys where it is shorter than the keys; `is_causal`
//! (bottom-right aligned past the cache); grouped-query attention (each KV head repeated for its
//! group); `past_key` / `past_value` with the `present_*` outputs. A row with every key masked
//! gives zeros, as the spec says (the guard is `Where(IsNaN(p), 0, p)`, which the fusion takes as
//! its zero-NaN-rows flag; unlike the spec, which decides on the mask alone, it also zeroes a row
//! a NaN or +inf score made NaN). `nonpad_kv_seqlen` (a static cache's valid lengths, a run-time
//! input) masks the keys past each row's length and moves its causal and window frontiers;
//! `left_window_size` / `right_window_size` bound the keys a query sees; the `qk_matmul_output`
//! output is the scores at the stage `qk_matmul_output_mode` names as the reference computes
//! them (0 and 1: scaled, and softcapped where there is a softcap; 2: plus the mask and the
//! frontiers; 3: the softmax).

use kiln_runtime::graph::{BinaryOp, Op, UnaryOp, ValueId};
use kiln_runtime::DType;

use super::super::tensor::{Elem, Lit};
use super::{Fail, Importer, NodeCx, Val, R};

/// The ops this file imports.
pub(super) const OPS: &[&str] = &["Attention"];

impl Importer<'_> {
    /// A node of one of [`OPS`] with a graph-computed input, as kiln ops. Returns its outputs.
    pub(super) fn import_attention(&mut self, cx: &NodeCx) -> R<Vec<ValueId>> {
        let NodeCx { name, n, ins, at, .. } = *cx;
        let given = |k: usize| ins.get(k).is_some_and(|v| v.is_some());
        let window = (at.int("left_window_size", -1), at.int("right_window_size", -1));
        if window.0 < -1 || window.1 < -1 {
            return Err(Fail::Invalid(format!("Attention window sizes {window:?} (each -1 or at least 0)")));
        }
        let want_qk = n.output.get(3).is_some_and(|o| !o.is_empty() && self.m.is_used(o));
        if given(4) != given(5) {
            return Err(Fail::Invalid("Attention needs past_key and past_value together".into()));
        }
        if given(6) && given(4) {
            return Err(Fail::Invalid("Attention with nonpad_kv_seqlen and a past cache".into()));
        }
        let dt = self.dtype(&cx.inp(0)?);
        let f32_of = |me: &mut Self, k: usize| -> R<ValueId> {
            let v = me.node(&cx.iname(k), &cx.inp(k)?)?;
            me.cast_to(name, v, DType::F32)
        };
        let (q, k, v) = (f32_of(self, 0)?, f32_of(self, 1)?, f32_of(self, 2)?);
        let ranks = [q, k, v].map(|x| self.shape(&Val::Node(x)).len());
        let three_d = match ranks {
            [3, 3, 3] => true,
            [4, 4, 4] => false,
            _ => return Err(Fail::Invalid(format!("Attention Q, K, V of ranks {ranks:?} (all 3 or all 4)"))),
        };
        // Each as [B, heads, rows, head size].
        let (q, k, v) = if three_d {
            let heads = |a: &str| match at.int(a, 0) {
                h if h > 0 => Ok(h as usize),
                h => Err(Fail::Invalid(format!("3-D Attention needs {a} > 0 (got {h})"))),
            };
            let (hq, hkv) = (heads("q_num_heads")?, heads("kv_num_heads")?);
            (self.split_heads(name, q, hq)?, self.split_heads(name, k, hkv)?, self.split_heads(name, v, hkv)?)
        } else {
            (q, k, v)
        };
        let (mut k, mut v) = (k, v);
        let mut past_len = 0;
        if given(4) {
            let (pk, pv) = (f32_of(self, 4)?, f32_of(self, 5)?);
            // The cache extends K and V along their rows: every other dim must agree.
            for (what, past, now) in [("past_key", pk, k), ("past_value", pv, v)] {
                let (ps, ns) = (self.shape(&Val::Node(past)), self.shape(&Val::Node(now)));
                if ps.len() != 4 || [ps[0], ps[1], ps[3]] != [ns[0], ns[1], ns[3]] {
                    return Err(Fail::Invalid(format!("Attention {what} of shape {ps:?} for rows of shape {ns:?}")));
                }
            }
            past_len = self.shape(&Val::Node(pk))[2];
            k = self.tmp(name, Op::Concat { axis: 2 }, vec![pk, k])?;
            v = self.tmp(name, Op::Concat { axis: 2 }, vec![pv, v])?;
        }
        let (qs, ks, vs) = (self.shape(&Val::Node(q)), self.shape(&Val::Node(k)), self.shape(&Val::Node(v)));
        let (b, hq, s, d) = (qs[0], qs[1], qs[2], qs[3]);
        let (hkv, l) = (ks[1], ks[2]);
        if ks[0] != b || vs[0] != b || ks[3] != d || vs[1] != hkv || vs[2] != l || hkv == 0 || !hq.is_multiple_of(hkv) {
            return Err(Fail::Invalid(format!("Attention Q {qs:?}, K {ks:?}, V {vs:?} (past included)")));
        }
        let present = [k, v];
        // Grouped-query attention: each KV head repeated for its hq/hkv query heads, in order.
        let (k, v) = (self.repeat_heads(name, k, hq / hkv)?, self.repeat_heads(name, v, hq / hkv)?);
        let mut scores = self.tmp(name, Op::MatMul { transpose_a: false, transpose_b: true }, vec![q, k])?;
        let scale = if at.has("scale") { at.float("scale", 1.0) } else { 1.0 / (d as f32).sqrt() };
        let sc = self.scalar(&self.fresh(name), scale, DType::F32)?;
        scores = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![scores, sc])?;
        let softcap = at.float("softcap", 0.0);
        if softcap > 0.0 {
            let c = self.scalar(&self.fresh(name), softcap, DType::F32)?;
            let t = self.tmp(name, Op::Binary(BinaryOp::Div), vec![scores, c])?;
            let t = self.tmp(name, Op::Unary(UnaryOp::Tanh), vec![t])?;
            scores = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![t, c])?;
        }
        // A static cache's valid lengths, [B, 1, 1] in f32.
        let lens = if given(6) {
            let v = self.node(&cx.iname(6), &cx.inp(6)?)?;
            if self.shape(&Val::Node(v)).iter().product::<usize>() != b {
                return Err(Fail::Invalid(format!("Attention nonpad_kv_seqlen of shape {:?} for batch {b}", self.shape(&Val::Node(v)))));
            }
            let v = self.cast_to(name, v, DType::F32)?;
            Some(self.reshape(&self.fresh(name), v, &[b, 1, 1])?)
        } else {
            None
        };
        let frontier = Frontier { past_len, lens, causal: at.int("is_causal", 0) != 0, window };
        let bias = self.attention_bias(cx, [b, hq, s, l], &frontier)?;
        let mut sm = vec![scores];
        sm.extend(bias);
        let p = self.tmp(name, Op::Softmax { axis: 3 }, sm)?;
        // Rows with every key masked: softmax gives NaN, the spec 0.
        let nan = self.tmp(name, Op::Binary(BinaryOp::Ne), vec![p, p])?;
        let nan = self.as_bool(&self.fresh(name), nan)?;
        let zero = self.scalar(&self.fresh(name), 0.0, DType::F32)?;
        let p = self.tmp(name, Op::Where, vec![nan, zero, p])?;
        let qk = if want_qk {
            let v = match at.int("qk_matmul_output_mode", 0) {
                0 | 1 => scores,
                2 => match bias {
                    Some(bv) => self.tmp(name, Op::Binary(BinaryOp::Add), vec![scores, bv])?,
                    None => scores,
                },
                3 => p,
                m => return Err(Fail::Invalid(format!("qk_matmul_output_mode {m}"))),
            };
            Some(self.cast_to(name, v, dt)?)
        } else {
            None
        };
        let mut y = self.tmp(name, Op::MatMul { transpose_a: false, transpose_b: false }, vec![p, v])?;
        if three_d {
            let t = self.tmp(name, Op::Transpose { perm: vec![0, 2, 1, 3] }, vec![y])?;
            y = self.reshape(&self.fresh(name), t, &[b, s, hq * vs[3]])?;
        }
        let mut outs = vec![self.cast_to(name, y, dt)?];
        let want_present = (1..3).any(|i| n.output.get(i).is_some_and(|o| !o.is_empty() && self.m.is_used(o)));
        if want_present || want_qk {
            for pres in present {
                outs.push(self.cast_to(name, pres, dt)?);
            }
        }
        outs.extend(qk);
        Ok(outs)
    }

    /// [B, S, heads·D] as [B, heads, S, D].
    fn split_heads(&mut self, name: &str, x: ValueId, heads: usize) -> R<ValueId> {
        let s = self.shape(&Val::Node(x));
        if !s[2].is_multiple_of(heads) {
            return Err(Fail::Invalid(format!("Attention input of width {} for {heads} heads", s[2])));
        }
        let r = self.reshape(&self.fresh(name), x, &[s[0], s[1], heads, s[2] / heads])?;
        self.tmp(name, Op::Transpose { perm: vec![0, 2, 1, 3] }, vec![r])
    }

    /// [B, H, L, D] with each head repeated `r` times in place: [h0, h0, h1, h1, ...].
    fn repeat_heads(&mut self, name: &str, x: ValueId, r: usize) -> R<ValueId> {
        if r == 1 {
            return Ok(x);
        }
        let s = self.shape(&Val::Node(x));
        let x5 = self.reshape(&self.fresh(name), x, &[s[0], s[1], 1, s[2], s[3]])?;
        let cat = self.tmp(name, Op::Concat { axis: 2 }, vec![x5; r])?;
        self.reshape(&self.fresh(name), cat, &[s[0], s[1] * r, s[2], s[3]])
    }

    /// The additive bias over the scores (of shape `scores`, [B, heads, S, L]): the mask (bool: 0
    /// where true, -inf where false; float as it is; keys past its last column masked) plus -inf
    /// where `f` masks a key (see [`Frontier`]). None when nothing is masked.
    fn attention_bias(&mut self, cx: &NodeCx, scores: [usize; 4], f: &Frontier) -> R<Option<ValueId>> {
        let name = cx.name;
        let [b, _, s, l] = scores;
        let mut bias = None;
        if cx.ins.get(3).is_some_and(|v| v.is_some()) {
            let m = self.node(&cx.iname(3), &cx.inp(3)?)?;
            let ms = self.shape(&Val::Node(m));
            if ms.is_empty() || ms.len() > 4 || *ms.last().unwrap_or(&0) > l {
                return Err(Fail::Invalid(format!("Attention attn_mask of shape {ms:?} for {l} keys")));
            }
            // Broadcast to the scores [B, heads, S, L], right-aligned (the keys padded below).
            let lead = &scores[4 - ms.len()..3];
            if ms.iter().zip(lead).any(|(&m, &t)| m != 1 && m != t) {
                return Err(Fail::Invalid(format!("Attention attn_mask of shape {ms:?} for scores of shape {scores:?}")));
            }
            // kiln holds ONNX bools as i64 0/1.
            let is_bool = !self.dtype(&Val::Node(m)).is_float();
            let mut add = if is_bool {
                let zero = self.scalar(&self.fresh(name), 0.0, DType::F32)?;
                let ninf = self.scalar(&self.fresh(name), f32::NEG_INFINITY, DType::F32)?;
                let t = self.as_bool(&self.fresh(name), m)?;
                self.tmp(name, Op::Where, vec![t, zero, ninf])?
            } else {
                self.cast_to(name, m, DType::F32)?
            };
            let short = l - ms[ms.len() - 1];
            if short > 0 {
                let mut ps = ms.clone();
                *ps.last_mut().unwrap_or(&mut 0) = short;
                let n: usize = ps.iter().product();
                let pad = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, ps, vec![f64::NEG_INFINITY; n])))?;
                add = self.tmp(name, Op::Concat { axis: ms.len() - 1 }, vec![add, pad])?;
            }
            bias = Some(add);
        }
        // Query i (at absolute position i + offset) sees key j where j ≤ i + offset (causal),
        // i + offset - j ≤ left and j - (i + offset) ≤ right (the window). With known offset
        // (the past's length) each is a constant [S, L]; with per-row lengths (offset = len - S)
        // it is computed from d = len - (j - i + S) = i + offset - j.
        let mut terms = Vec::new();
        let (left, right) = f.window;
        match f.lens {
            None => {
                let off = f.past_len as i64;
                let keep = |i: i64, j: i64| (!f.causal || j <= i + off) && (left < 0 || i + off - j <= left) && (right < 0 || j - i - off <= right);
                if f.causal || left >= 0 || right >= 0 {
                    let v: Vec<f64> = (0..s * l).map(|e| if keep((e / l) as i64, (e % l) as i64) { 0.0 } else { f64::NEG_INFINITY }).collect();
                    terms.push(self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![s, l], v)))?);
                }
            }
            Some(lens) => {
                let dist: Vec<f64> = (0..s * l).map(|e| ((e % l) as f64) - ((e / l) as f64) + s as f64).collect();
                let dist = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![s, l], dist)))?;
                let dd = self.tmp(name, Op::Binary(BinaryOp::Sub), vec![lens, dist])?;
                // Each condition `bound ≥ value` as 0 / -inf, [B, S, L].
                let mut at_most = |me: &mut Self, v: ValueId, bound: f32| -> R<()> {
                    let k = me.scalar(&me.fresh(name), bound, DType::F32)?;
                    let ok = me.tmp(name, Op::Binary(BinaryOp::Le), vec![v, k])?;
                    let ok = me.as_bool(&me.fresh(name), ok)?;
                    let (zero, ninf) = (me.scalar(&me.fresh(name), 0.0, DType::F32)?, me.scalar(&me.fresh(name), f32::NEG_INFINITY, DType::F32)?);
                    let t = me.tmp(name, Op::Where, vec![ok, zero, ninf])?;
                    terms.push(me.reshape(&me.fresh(name), t, &[b, 1, s, l])?);
                    Ok(())
                };
                let neg = self.tmp(name, Op::Unary(UnaryOp::Neg), vec![dd])?;
                if f.causal {
                    at_most(self, neg, 0.0)?;
                }
                if left >= 0 {
                    at_most(self, dd, left as f32)?;
                }
                if right >= 0 {
                    at_most(self, neg, right as f32)?;
                }
                // Keys past each row's length: j - len ≤ -1.
                let pos: Vec<f64> = (0..l).map(|j| j as f64).collect();
                let pos = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![1, 1, l], pos)))?;
                let past_end = self.tmp(name, Op::Binary(BinaryOp::Sub), vec![pos, lens])?;
                let ok = self.scalar(&self.fresh(name), -1.0, DType::F32)?;
                let ok = self.tmp(name, Op::Binary(BinaryOp::Le), vec![past_end, ok])?;
                let ok = self.as_bool(&self.fresh(name), ok)?;
                let (zero, ninf) = (self.scalar(&self.fresh(name), 0.0, DType::F32)?, self.scalar(&self.fresh(name), f32::NEG_INFINITY, DType::F32)?);
                let t = self.tmp(name, Op::Where, vec![ok, zero, ninf])?;
                terms.push(self.reshape(&self.fresh(name), t, &[b, 1, 1, l])?);
            }
        }
        for t in terms {
            bias = Some(match bias {
                Some(m) => self.tmp(name, Op::Binary(BinaryOp::Add), vec![m, t])?,
                None => t,
            });
        }
        Ok(bias)
    }
}

/// Where a query's visible keys end: after `past_len` cached keys, or (a static cache) at
/// each row's `lens` ([B, 1, 1], f32); `causal`; and the sliding `window` (left, right; -1:
/// unbounded).
struct Frontier {
    past_len: usize,
    lens: Option<ValueId>,
    causal: bool,
    window: (i64, i64),
}
