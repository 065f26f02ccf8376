//! Normalizations of `[N, C, spatial..]` values, per channel: BatchNormalization (inference),
//! InstanceNormalization, GroupNormalization and LRN.
//!
//! Instance and group norms are kiln's LayerNorm over rows of the input's own spatial (and
//! group) elements, with the per-channel scale and bias applied after; a BatchNormalization
//! whose statistics are known is one multiply-add with the scale and shift folded at import.

use kiln_runtime::graph::{BinaryOp, Op, UnaryOp, ValueId};

use super::super::tensor::{Elem, Lit};
use super::{given, one, unsup, Fail, Importer, NodeCx, Val, R};

/// The ops this file imports.
pub(super) const OPS: &[&str] = &["BatchNormalization", "InstanceNormalization", "GroupNormalization", "LRN"];

/// A BatchNormalization's known scale, B, mean and var (`p`, one value per channel) as
/// `y = x·a + b`: a = scale / sqrt(var + eps), b = B - mean·a, in f32 (onnxruntime's order).
pub(super) fn bn_scale_shift(p: &[Lit], eps: f32) -> (Vec<f64>, Vec<f64>) {
    let [sc, bi, mean, var] = [0, 1, 2, 3].map(|k| p[k].floats());
    let a: Vec<f64> = (0..sc.len()).map(|i| (sc[i] as f32 / (var[i] as f32 + eps).sqrt()) as f64).collect();
    let b: Vec<f64> = (0..sc.len()).map(|i| (bi[i] as f32 - mean[i] as f32 * a[i] as f32) as f64).collect();
    (a, b)
}

/// A BatchNormalization a convolution applies: `y = x·a + b` per channel, and the norm's output.
pub(super) struct FoldedBn {
    pub a: Vec<f64>,
    pub b: Vec<f64>,
    pub out: String,
}

impl Importer<'_> {
    /// Where `conv`'s output (`m` channels) is read only by an inference BatchNormalization
    /// whose parameters are known: that norm's `(a, b)` and output name, the norm recorded as folded (the
    /// convolution applies it: weight·a, bias·a + b; the norm's output is then its input, as
    /// onnxruntime's and tract's Conv+BN fusions do). The GEMM's epilogue is then a bias and
    /// an activation, which its microkernel applies, instead of a per-column scale that sends
    /// it through scratch and an elementwise pass.
    pub(super) fn bn_after_conv(&mut self, conv: &super::NodeProto, m: usize) -> R<Option<FoldedBn>> {
        let Some(out) = conv.output.first() else { return Ok(None) };
        let Some(bn) = self.m.sole_reader(out) else { return Ok(None) };
        if bn.op_type() != "BatchNormalization" || !matches!(bn.domain(), "" | "ai.onnx") || bn.input.first() != Some(out) || bn.output.len() != 1 || bn.input.len() != 5 {
            return Ok(None);
        }
        let at = super::Attrs::of(bn);
        if at.int("training_mode", 0) != 0 || (self.m.opset < 9 && at.int("spatial", 1) == 0) {
            return Ok(None);
        }
        let mut p = Vec::new();
        for name in &bn.input[1..] {
            let Some(Val::Lit(l)) = self.vals.get(name).cloned() else { return Ok(None) };
            let l = self.lit(name, &l)?;
            if l.shape.iter().product::<usize>() != m || !l.elem.dtype().is_float() {
                return Ok(None);
            }
            p.push(l);
        }
        let out = bn.output[0].clone();
        self.folded.insert(out.clone());
        let (a, b) = bn_scale_shift(&p, at.float("epsilon", 1e-5));
        Ok(Some(FoldedBn { a, b, out }))
    }

    /// A node of one of [`OPS`] with a graph-computed input, as kiln ops. Returns its outputs.
    pub(super) fn import_channel_norm(&mut self, cx: &NodeCx) -> R<Vec<ValueId>> {
        let NodeCx { op, name, n, ins, at, opset } = *cx;
        let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
        let xs = self.shape(&Val::Node(x));
        let dt = self.dtype(&Val::Node(x));
        if xs.len() < 2 || !dt.is_float() {
            return unsup(format!("{op} of a {dt} input of rank {}", xs.len()));
        }
        let c = xs[1];
        let ps: usize = xs[2..].iter().product();
        // A per-channel vector broadcast over the spatial dims: [C, 1, ..].
        let per_channel: Vec<usize> = std::iter::once(c).chain(std::iter::repeat_n(1, xs.len() - 2)).collect();
        let eps = at.float("epsilon", 1e-5);
        match op {
            // y = x·a + b, a = scale / sqrt(var + eps), b = B - mean·a (onnxruntime's order).
            "BatchNormalization" => {
                if at.int("training_mode", 0) != 0 {
                    return unsup("BatchNormalization in training mode");
                }
                if opset < 9 && at.int("spatial", 1) == 0 {
                    return unsup("BatchNormalization with spatial = 0");
                }
                let params: Vec<Val> = (1..5).map(|k| cx.inp(k)).collect::<R<_>>()?;
                for (k, p) in params.iter().enumerate() {
                    if self.shape(p).iter().product::<usize>() != c {
                        return Err(Fail::Invalid(format!("input {} of shape {:?} for {c} channels", k + 1, self.shape(p))));
                    }
                }
                let (a, b) = if params.iter().all(|p| matches!(p, Val::Lit(_))) {
                    let mut v = Vec::new();
                    for (k, p) in params.iter().enumerate() {
                        let Val::Lit(l) = p else { unreachable!("all literals") };
                        v.push(self.lit(&cx.iname(k + 1), l)?);
                    }
                    let weight = v.iter().any(|l| l.weight);
                    let (a, b) = bn_scale_shift(&v, eps);
                    let out = n.output.first().cloned().unwrap_or_default();
                    let mut lits = [a, b].map(|v| Lit::of(Elem::F32, per_channel.clone(), v));
                    lits.iter_mut().for_each(|l| l.weight = weight);
                    let [la, lb] = lits;
                    let a = self.node(&format!("{out}.bn_scale"), &Val::Lit(la))?;
                    let b = self.node(&format!("{out}.bn_shift"), &Val::Lit(lb))?;
                    (self.cast_to(name, a, dt)?, self.cast_to(name, b, dt)?)
                } else {
                    let mut v = Vec::new();
                    for k in 1..5 {
                        let id = self.node(&cx.iname(k), &params[k - 1])?;
                        let id = self.cast_to(name, id, dt)?;
                        v.push(self.reshape(&self.fresh(name), id, &per_channel)?);
                    }
                    let e = self.k(name, eps, dt)?;
                    let ve = self.bin(name, BinaryOp::Add, v[3], e)?;
                    let inv = self.un(name, UnaryOp::Rsqrt, ve)?;
                    let a = self.bin(name, BinaryOp::Mul, v[0], inv)?;
                    let ma = self.bin(name, BinaryOp::Mul, v[2], a)?;
                    (a, self.bin(name, BinaryOp::Sub, v[1], ma)?)
                };
                let y = self.bin(name, BinaryOp::Mul, x, a)?;
                one(self.push(name, Op::Binary(BinaryOp::Add), vec![y, b])?)
            }
            "InstanceNormalization" | "GroupNormalization" => {
                let groups = if op == "GroupNormalization" {
                    let g = at.int("num_groups", 0);
                    usize::try_from(g).ok().filter(|&g| g >= 1 && c.is_multiple_of(g)).ok_or_else(|| Fail::Invalid(format!("num_groups {g} for {c} channels")))?
                } else {
                    c
                };
                let row = c / groups * ps;
                let rows = self.reshape(&self.fresh(name), x, &[xs[0], groups, row])?;
                let mut gb = Vec::new();
                for fill in [1.0, 0.0] {
                    let v = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![row], vec![fill; row])))?;
                    gb.push(self.cast_to(name, v, dt)?);
                }
                let y = self.tmp(name, Op::LayerNorm { eps }, vec![rows, gb[0], gb[1]])?;
                // GroupNormalization before opset 21 scales per group, after it per channel.
                let (lanes, y) = if op == "GroupNormalization" && opset < 21 {
                    (groups, y)
                } else {
                    (c, self.reshape(&self.fresh(name), y, &[xs[0], c, ps])?)
                };
                let mut sb = Vec::new();
                for k in 1..3 {
                    if !given(ins, k) {
                        return Err(Fail::Invalid(format!("input {k} (scale, bias) is missing")));
                    }
                    let v = self.node(&cx.iname(k), &cx.inp(k)?)?;
                    let v = self.norm_channel(name, v, lanes, dt, "scale/bias")?;
                    sb.push(self.reshape(&self.fresh(name), v, &[lanes, 1])?);
                }
                let y = self.bin(name, BinaryOp::Mul, y, sb[0])?;
                let y = self.bin(name, BinaryOp::Add, y, sb[1])?;
                one(self.reshape(name, y, &xs)?)
            }
            // y = x / (bias + alpha/size · Σ x²)^beta, the sum over `size` neighbouring channels
            // (a banded [C, C] matrix times x² as rows of channels).
            _ => {
                let size = usize::try_from(at.int("size", 0)).ok().filter(|&s| s >= 1).ok_or_else(|| Fail::Invalid("LRN without a positive size".into()))?;
                let (alpha, beta, bias) = (at.float("alpha", 1e-4), at.float("beta", 0.75), at.float("bias", 1.0));
                if c > 1 << 13 {
                    return unsup(format!("LRN over {c} channels (its [C, C] band matrix; kiln takes at most 8192)"));
                }
                let (lo, hi) = ((size - 1) / 2, (size - 1).div_ceil(2));
                let band: Vec<f64> = (0..c * c).map(|i| {
                    let (r, k) = (i / c, i % c);
                    if k + lo >= r && k <= r + hi { 1.0 } else { 0.0 }
                }).collect();
                let band = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![c, c], band)))?;
                let band = self.cast_to(name, band, dt)?;
                let rows = self.reshape(&self.fresh(name), x, &[xs[0], c, ps])?;
                let sq = self.bin(name, BinaryOp::Mul, rows, rows)?;
                let sum = self.tmp(name, Op::MatMul { transpose_a: false, transpose_b: false }, vec![band, sq])?;
                let ka = self.k(name, alpha / size as f32, dt)?;
                let kb = self.k(name, bias, dt)?;
                let base = self.bin(name, BinaryOp::Mul, sum, ka)?;
                let base = self.bin(name, BinaryOp::Add, base, kb)?;
                let l = self.un(name, UnaryOp::Log, base)?;
                let kneg = self.k(name, -beta, dt)?;
                let l = self.bin(name, BinaryOp::Mul, l, kneg)?;
                let f = self.un(name, UnaryOp::Exp, l)?;
                let y = self.bin(name, BinaryOp::Mul, rows, f)?;
                one(self.reshape(name, y, &xs)?)
            }
        }
    }
}
