//! onnxruntime's `com.microsoft` contrib ops, as optimized transformer exports carry them
//! (`onnxruntime.transformers.optimizer`, optimum's O2/O3 models; their fp16 forms are not
//! checked): each written over kiln ops, as the standard ops are in the files beside this one,
//! so the fusion passes see the same patterns (an `Attention` node becomes the
//! matmul–softmax–matmul that the attention fusion takes).
//! Semantics from onnxruntime's docs/ContribOperators.md and its CPU kernels; checked against
//! onnxruntime by `scripts/ort_contrib_cases.py` (tests/onnx.rs).

use kiln_runtime::graph::{BinaryOp, Dim, Op, ReduceOp, UnaryOp, ValueId};
use kiln_runtime::DType;

use super::{given, unsup, Attrs, Elem, Fail, Importer, Lit, NodeProto, Val, R};

/// The contrib ops kiln imports (for `kiln onnx-ops`).
pub const CONTRIB: &[&str] = &[
    "Attention", "BiasGelu", "EmbedLayerNormalization", "FastGelu", "FusedMatMul", "Gelu", "MultiHeadAttention", "QuickGelu", "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
];

impl Importer<'_> {
    /// The node's input `k` as a graph value (an error where it is missing).
    fn input_at(&mut self, n: &NodeProto, ins: &[Option<Val>], k: usize) -> R<ValueId> {
        let v = ins.get(k).cloned().flatten().ok_or_else(|| Fail::Invalid(format!("input {k} is missing")))?;
        self.node(&n.input[k], &v)
    }

    /// A `com.microsoft` node. Returns its outputs.
    pub(super) fn contrib(&mut self, op: &str, name: &str, n: &NodeProto, ins: &[Option<Val>], at: &Attrs) -> R<Vec<ValueId>> {
        let has = |k: usize| given(ins, k);
        let used = |me: &Self, k: usize| n.output.get(k).is_some_and(|o| !o.is_empty() && me.m.is_used(o));
        let input = |me: &mut Self, k: usize| me.input_at(n, ins, k);
        match op {
            // Gelu(x + bias): erf form (Gelu, BiasGelu), tanh form (FastGelu), or
            // x·sigmoid(alpha·x) (QuickGelu, alpha 1.702 by default).
            "Gelu" | "BiasGelu" | "FastGelu" | "QuickGelu" => {
                let mut x = input(self, 0)?;
                if has(1) {
                    let b = input(self, 1)?;
                    x = self.tmp(name, Op::Binary(BinaryOp::Add), vec![x, b])?;
                } else if op == "BiasGelu" {
                    return Err(Fail::Invalid("BiasGelu without its bias".into()));
                }
                let y = match op {
                    "FastGelu" => self.push(name, Op::Unary(UnaryOp::GeluTanh), vec![x])?,
                    "QuickGelu" => {
                        let a = self.scalar(&self.fresh(name), at.float("alpha", 1.702), self.dtype(&Val::Node(x)))?;
                        let ax = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![x, a])?;
                        let s = self.tmp(name, Op::Unary(UnaryOp::Sigmoid), vec![ax])?;
                        self.push(name, Op::Binary(BinaryOp::Mul), vec![x, s])?
                    }
                    _ => self.push(name, Op::Unary(UnaryOp::Gelu), vec![x])?,
                };
                Ok(vec![y])
            }
            // LayerNorm (RMS norm for the Simplified one) of input + skip (+ bias); outputs the
            // norm, mean and inverse std dev (not computed), and the sum (the next residual).
            "SkipLayerNormalization" | "SkipSimplifiedLayerNormalization" => {
                let simplified = op == "SkipSimplifiedLayerNormalization";
                if used(self, 1) || used(self, 2) {
                    return unsup(format!("{op}'s mean and inverse std dev outputs"));
                }
                let (x, skip) = (input(self, 0)?, input(self, 1)?);
                let mut sum = self.tmp(name, Op::Binary(BinaryOp::Add), vec![x, skip])?;
                let bias_at = if simplified { 3 } else { 4 };
                if has(bias_at) {
                    let b = input(self, bias_at)?;
                    sum = self.tmp(name, Op::Binary(BinaryOp::Add), vec![sum, b])?;
                }
                let s = self.shape(&Val::Node(sum));
                let last = *s.last().ok_or_else(|| Fail::Invalid(format!("{op} of a scalar")))?;
                let dt = self.dtype(&Val::Node(sum));
                let eps = at.float("epsilon", 1e-12);
                let g = input(self, 2)?;
                let g = self.norm_channel(name, g, last, dt, "gamma")?;
                let y = if simplified {
                    self.push(name, Op::RmsNorm { eps }, vec![sum, g])?
                } else {
                    let b = if has(3) {
                        input(self, 3)?
                    } else {
                        self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![last], vec![0.0; last])))?
                    };
                    let b = self.norm_channel(name, b, last, dt, "beta")?;
                    self.push(name, Op::LayerNorm { eps }, vec![sum, g, b])?
                };
                Ok(vec![y, y, y, sum])
            }
            // LayerNorm(word[ids] + position[position_ids or 0..S] + segment[segment_ids]);
            // outputs the norm, each row's count of mask values that are not 0 (the `mask_index`
            // that Attention takes) and the sum before the norm.
            "EmbedLayerNormalization" => {
                let ids = input(self, 0)?;
                let s = self.shape(&Val::Node(ids));
                let [_, seq] = s[..] else { return Err(Fail::Invalid(format!("input_ids of shape {s:?}"))) };
                let word = input(self, 2)?;
                let mut sum = self.tmp(name, Op::Gather, vec![word, ids])?;
                let pos_table = input(self, 3)?;
                let pos = if has(8) {
                    let p = input(self, 8)?;
                    self.tmp(name, Op::Gather, vec![pos_table, p])?
                } else {
                    self.tmp(name, Op::Slice { axis: 0, start: 0, end: Dim::Fixed(seq) }, vec![pos_table])?
                };
                sum = self.tmp(name, Op::Binary(BinaryOp::Add), vec![sum, pos])?;
                if has(1) && has(4) {
                    let (seg_ids, seg_table) = (input(self, 1)?, input(self, 4)?);
                    let seg = self.tmp(name, Op::Gather, vec![seg_table, seg_ids])?;
                    sum = self.tmp(name, Op::Binary(BinaryOp::Add), vec![sum, seg])?;
                }
                let h = *self.shape(&Val::Node(sum)).last().unwrap_or(&0);
                let dt = self.dtype(&Val::Node(sum));
                let (g, b) = (input(self, 5)?, input(self, 6)?);
                let g = self.norm_channel(name, g, h, dt, "gamma")?;
                let b = self.norm_channel(name, b, h, dt, "beta")?;
                let y = self.push(name, Op::LayerNorm { eps: at.float("epsilon", 1e-12) }, vec![sum, g, b])?;
                let mask_index = if used(self, 1) {
                    if !has(7) {
                        return unsup("EmbedLayerNormalization's mask_index without a mask");
                    }
                    let m = input(self, 7)?;
                    let m = self.cast_to(name, m, DType::F32)?;
                    let z = self.scalar(&self.fresh(name), 0.0, DType::F32)?;
                    let nz = self.tmp(name, Op::Binary(BinaryOp::Ne), vec![m, z])?;
                    let c = self.tmp(name, Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keep_dims: false }, vec![nz])?;
                    let nm = n.output[1].clone();
                    self.push(&nm, Op::Cast { to: DType::I32 }, vec![c])?
                } else {
                    y
                };
                Ok(vec![y, mask_index, sum])
            }
            // alpha · op(A) · op(B), op a transpose of the last two dims where transA / transB
            // (onnxruntime folds K's transpose and the attention scale into it).
            "FusedMatMul" => {
                if at.int("transBatchA", 0) != 0 || at.int("transBatchB", 0) != 0 {
                    return unsup("FusedMatMul with transBatchA / transBatchB");
                }
                let (a, b) = (input(self, 0)?, input(self, 1)?);
                let (ra, rb) = (self.shape(&Val::Node(a)).len(), self.shape(&Val::Node(b)).len());
                if ra < 2 || rb < 2 {
                    return unsup(format!("FusedMatMul of rank {ra} by rank {rb}"));
                }
                let mm = Op::MatMul { transpose_a: at.int("transA", 0) != 0, transpose_b: at.int("transB", 0) != 0 };
                let alpha = at.float("alpha", 1.0);
                if alpha == 1.0 {
                    return Ok(vec![self.push(name, mm, vec![a, b])?]);
                }
                let y = self.tmp(name, mm, vec![a, b])?;
                let k = self.scalar(&self.fresh(name), alpha, self.dtype(&Val::Node(y)))?;
                Ok(vec![self.push(name, Op::Binary(BinaryOp::Mul), vec![y, k])?])
            }
            "Attention" => self.contrib_attention(name, n, ins, at),
            "MultiHeadAttention" => self.contrib_multi_head_attention(name, n, ins, at),
            _ if super::quant::CONTRIB_OPS.contains(&op) => self.import_quant_contrib(op, name, n, ins, at),
            _ => unsup(format!("op `{op}` of domain com.microsoft is not supported")),
        }
    }

    /// `Attention`: one projection to Q, K and V (`input · weights + bias`, split by
    /// `qkv_hidden_sizes` or in thirds), `num_heads` heads, softmax(scale·Q·Kᵀ + mask)·V. The
    /// mask: none; `mask_index` of shape [B] (keys at or past each row's length masked), [B, S]
    /// or [B, S_q, S] (keys where the mask is 0 or less masked), each masked score getting
    /// `mask_filter_value` (-10000) added; `unidirectional` adds it to the scores of the keys
    /// after each query too (causal, as a decoder's). Past state, attention bias and rotary
    /// embeddings are not supported.
    fn contrib_attention(&mut self, name: &str, n: &NodeProto, ins: &[Option<Val>], at: &Attrs) -> R<Vec<ValueId>> {
        let has = |k: usize| given(ins, k);
        self.refuse_attention_state("Attention", n, ins, at, &[(4, "past state"), (5, "an attention bias"), (6, "past_sequence_length")])?;
        let heads = at.int("num_heads", 0);
        if heads <= 0 {
            return Err(Fail::Invalid(format!("Attention num_heads = {heads}")));
        }
        let heads = heads as usize;
        let node = |me: &mut Self, k: usize| me.input_at(n, ins, k);
        let x = node(self, 0)?;
        let xs = self.shape(&Val::Node(x));
        if xs.len() != 3 {
            return Err(Fail::Invalid(format!("Attention input of shape {xs:?}")));
        }
        let w = node(self, 1)?;
        let total = *self.shape(&Val::Node(w)).last().unwrap_or(&0);
        let sizes: Vec<usize> = match at.ints("qkv_hidden_sizes") {
            Some(v) if v.len() == 3 && v.iter().all(|&d| d > 0) => v.iter().map(|&d| d as usize).collect(),
            Some(v) => return Err(Fail::Invalid(format!("Attention qkv_hidden_sizes {v:?}"))),
            None => vec![total / 3; 3],
        };
        if sizes.iter().sum::<usize>() != total || sizes[0] != sizes[1] || sizes.iter().any(|&d| d % heads != 0) {
            return Err(Fail::Invalid(format!("Attention qkv_hidden_sizes {sizes:?} for {total} projected columns and {heads} heads")));
        }
        let mut qkv = self.tmp(name, Op::MatMul { transpose_a: false, transpose_b: false }, vec![x, w])?;
        if has(2) {
            let bias = node(self, 2)?;
            qkv = self.tmp(name, Op::Binary(BinaryOp::Add), vec![qkv, bias])?;
        }
        let mut qkv_parts = Vec::new();
        let mut start = 0;
        for &d in &sizes {
            qkv_parts.push(self.tmp(name, Op::Slice { axis: 2, start, end: Dim::Fixed(start + d) }, vec![qkv])?);
            start += d;
        }
        let mask = if has(3) { Some(node(self, 3)?) } else { None };
        let y = self.heads_attention(name, [qkv_parts[0], qkv_parts[1], qkv_parts[2]], heads, at, mask)?;
        Ok(vec![y])
    }

    /// `MultiHeadAttention`: Q, K and V given apart ([B, S, D], [B, L, D], [B, L, Dv]), each with
    /// its part of `bias` added; `key_padding_mask` as lengths [B], or [B, L] / [B, S, L] values
    /// (0 or less masks the key). Packed QKV, attention bias and past state are not supported.
    fn contrib_multi_head_attention(&mut self, name: &str, n: &NodeProto, ins: &[Option<Val>], at: &Attrs) -> R<Vec<ValueId>> {
        let has = |k: usize| given(ins, k);
        self.refuse_attention_state("MultiHeadAttention", n, ins, at, &[(5, "an attention bias"), (6, "past key"), (7, "past value")])?;
        if !has(1) || !has(2) {
            return unsup("MultiHeadAttention with packed Q/K/V");
        }
        let heads = at.int("num_heads", 0);
        if heads <= 0 {
            return Err(Fail::Invalid(format!("MultiHeadAttention num_heads = {heads}")));
        }
        let node = |me: &mut Self, k: usize| me.input_at(n, ins, k);
        let mut qkv = [node(self, 0)?, node(self, 1)?, node(self, 2)?];
        for v in &qkv {
            let sh = self.shape(&Val::Node(*v));
            if sh.len() != 3 {
                return unsup(format!("MultiHeadAttention input of shape {sh:?} (packed or with past)"));
            }
        }
        if has(3) {
            let bias = node(self, 3)?;
            let mut start = 0;
            for v in qkv.iter_mut() {
                let d = *self.shape(&Val::Node(*v)).last().unwrap_or(&0);
                let part = self.tmp(name, Op::Slice { axis: 0, start, end: Dim::Fixed(start + d) }, vec![bias])?;
                *v = self.tmp(name, Op::Binary(BinaryOp::Add), vec![*v, part])?;
                start += d;
            }
        }
        let mask = if has(4) { Some(node(self, 4)?) } else { None };
        Ok(vec![self.heads_attention(name, qkv, heads as usize, at, mask)?])
    }

    /// What kiln's attention ops refuse: the inputs `refused` (past state, an attention bias),
    /// a used present-state output, rotary embeddings.
    fn refuse_attention_state(&self, op: &str, n: &NodeProto, ins: &[Option<Val>], at: &Attrs, refused: &[(usize, &str)]) -> R<()> {
        for &(k, what) in refused {
            if given(ins, k) {
                return unsup(format!("{op} with {what}"));
            }
        }
        if n.output.iter().skip(1).any(|o| !o.is_empty() && self.m.is_used(o)) {
            return unsup(format!("{op}'s present state outputs"));
        }
        if at.int("do_rotary", 0) != 0 {
            return unsup(format!("{op} with rotary embeddings"));
        }
        Ok(())
    }

    /// softmax(scale·Q·Kᵀ + mask)·V over `heads` heads of Q [B, S, D], K [B, L, D] and
    /// V [B, L, Dv], back as [B, S, Dv]: the matmul–softmax–matmul that kiln fuses into one
    /// attention kernel. `scale` (attribute) 0 means 1/√(D/heads); masked scores get
    /// `mask_filter_value` (-10000) added, and with `unidirectional` set so do the scores of
    /// key j > i + (L - S) for query i (its own position and before, keys aligned at the end).
    fn heads_attention(&mut self, name: &str, qkv: [ValueId; 3], heads: usize, at: &Attrs, mask: Option<ValueId>) -> R<ValueId> {
        let shapes: Vec<Vec<usize>> = qkv.iter().map(|v| self.shape(&Val::Node(*v))).collect();
        let (&[b, s, d], &[bk, l, dk], &[bv, lv, dv]) = (&shapes[0][..], &shapes[1][..], &shapes[2][..]) else {
            return Err(Fail::Invalid(format!("attention Q, K, V of shapes {shapes:?}")));
        };
        if bk != b || bv != b || lv != l || dk != d || d % heads != 0 || dv % heads != 0 {
            return Err(Fail::Invalid(format!("attention Q, K, V of shapes {shapes:?} for {heads} heads")));
        }
        // Each as [B, heads, rows, head size].
        let mut parts = Vec::new();
        for (v, rows, w) in [(qkv[0], s, d), (qkv[1], l, d), (qkv[2], l, dv)] {
            let r = self.reshape(&self.fresh(name), v, &[b, rows, heads, w / heads])?;
            parts.push(self.tmp(name, Op::Transpose { perm: vec![0, 2, 1, 3] }, vec![r])?);
        }
        let scale = match at.float("scale", 0.0) {
            0.0 => 1.0 / ((d / heads) as f32).sqrt(),
            v => v,
        };
        let scores = self.tmp(name, Op::MatMul { transpose_a: false, transpose_b: true }, vec![parts[0], parts[1]])?;
        let dt = self.dtype(&Val::Node(scores));
        let sc = self.scalar(&self.fresh(name), scale, dt)?;
        let scores = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![scores, sc])?;
        let filter = at.float("mask_filter_value", -10000.0);
        let mut add = match mask {
            Some(m) => Some(self.attention_mask(name, m, b, s, l, filter)?),
            None => None,
        };
        if at.int("unidirectional", 0) != 0 {
            let off = l as i64 - s as i64;
            let v = (0..s * l).map(|e| if (e % l) as i64 > (e / l) as i64 + off { filter as f64 } else { 0.0 }).collect();
            let causal = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![1, 1, s, l], v)))?;
            add = Some(match add {
                Some(a) => self.tmp(name, Op::Binary(BinaryOp::Add), vec![a, causal])?,
                None => causal,
            });
        }
        let mut sm = vec![scores];
        if let Some(a) = add {
            sm.push(self.cast_to(name, a, dt)?);
        }
        let probs = self.tmp(name, Op::Softmax { axis: 3 }, sm)?;
        let ctx = self.tmp(name, Op::MatMul { transpose_a: false, transpose_b: false }, vec![probs, parts[2]])?;
        let ctx = self.tmp(name, Op::Transpose { perm: vec![0, 2, 1, 3] }, vec![ctx])?;
        self.reshape(name, ctx, &[b, s, dv])
    }

    /// An attention mask as an additive one that broadcasts over [B, heads, S, L] (S queries,
    /// L keys).
    fn attention_mask(&mut self, name: &str, m: ValueId, b: usize, s: usize, l: usize, filter: f32) -> R<ValueId> {
        let ms = self.shape(&Val::Node(m));
        let m = self.cast_to(name, m, DType::F32)?;
        // 1 where a key is attended, 0 where it is masked.
        let (open, shape) = match ms[..] {
            [n] if n == b => {
                let pos = Val::Lit(Lit::of(Elem::F32, vec![1, l], (0..l).map(|j| j as f64).collect()));
                let pos = self.node(&self.fresh(name), &pos)?;
                let len = self.reshape(&self.fresh(name), m, &[b, 1])?;
                (self.tmp(name, Op::Binary(BinaryOp::Lt), vec![pos, len])?, vec![b, 1, 1, l])
            }
            [n] => return unsup(format!("Attention mask_index of {n} values for a batch of {b} (start positions)")),
            [mb, mk] if mb == b && mk == l => {
                let z = self.scalar(&self.fresh(name), 0.0, DType::F32)?;
                (self.tmp(name, Op::Binary(BinaryOp::Lt), vec![z, m])?, vec![b, 1, 1, l])
            }
            [mb, mq, mk] if mb == b && mq == s && mk == l => {
                let z = self.scalar(&self.fresh(name), 0.0, DType::F32)?;
                (self.tmp(name, Op::Binary(BinaryOp::Lt), vec![z, m])?, vec![b, 1, s, l])
            }
            _ => return unsup(format!("an attention mask of shape {ms:?} for {b} x {s} queries and {l} keys")),
        };
        let one = self.scalar(&self.fresh(name), 1.0, DType::F32)?;
        let shut = self.tmp(name, Op::Binary(BinaryOp::Sub), vec![one, open])?;
        let f = self.scalar(&self.fresh(name), filter, DType::F32)?;
        let add = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![shut, f])?;
        self.reshape(&self.fresh(name), add, &shape)
    }
}
