//! Normalizations and reductions: Softmax, LogSoftmax, LayerNormalization (with its optional
//! statistics), RMSNormalization, the Reduce family, ArgMax/ArgMin, TopK, and CumSum (as a
//! triangular GEMM).

use kiln_runtime::graph::{BinaryOp, Op, ReduceOp, UnaryOp, ValueId};
use kiln_runtime::DType;

use super::super::shape;
use super::super::tensor::{Elem, Lit};
use super::{one, unsup, Fail, Importer, NodeCx, Val, R};

/// The ops this file imports.
pub(super) const OPS: &[&str] = &[
    "Softmax", "LogSoftmax", "CumSum", "RMSNormalization", "SimplifiedLayerNormalization",
    "ArgMax", "ArgMin", "Hardmax", "TopK", "CumProd", "ReduceProd", "LpNormalization", "MeanVarianceNormalization", "LayerNormalization", "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceSumSquare",
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
];

impl Importer<'_> {
    /// A node of one of [`OPS`] with a graph-computed input, as kiln ops. Returns its outputs.
    pub(super) fn import_norm(&mut self, cx: &NodeCx) -> R<Vec<ValueId>> {
        let NodeCx { op, name, n, ins, at, opset, .. } = *cx;
        match op {
            "Softmax" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                one(self.softmax_at(name, x, at.int("axis", if opset >= 13 { -1 } else { 1 }), opset)?)
            }
            // A running sum along the axis as a product with a 0/1 triangular matrix (one GEMM;
            // kiln has no scan op): y[.., j] = Σ_i x[.., i]·T[i, j]. Integers go through f32,
            // exact while partial sums stay below 2^24 (position ids from a mask, as RoBERTa's
            // export computes them). CumProd is the same scan over logarithms (see
            // `product_of`). A literal input folds instead (lit.rs).
            "CumSum" | "CumProd" => {
                let x0 = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let s0 = self.shape(&Val::Node(x0));
                let ax = shape::axis(cx.lit_of(1, &format!("{op} axis"))?.ints().first().copied().ok_or(Fail::Invalid(format!("{op} without an axis")))?, s0.len())?;
                let (exclusive, reverse) = (at.int("exclusive", 0) != 0, at.int("reverse", 0) != 0);
                let dt = self.dtype(&Val::Node(x0));
                let x = self.cast_to(name, x0, DType::F32)?;
                let y = if op == "CumSum" {
                    self.scan_sum(name, x, ax, exclusive, reverse)?
                } else {
                    self.product_of(name, x, &mut |me: &mut Self, v| me.scan_sum(name, v, ax, exclusive, reverse), !dt.is_float())?
                };
                one(self.cast_to(name, y, dt)?)
            }
            // x - max - log Σ exp(x - max), over the axis (before opset 13: over the input
            // flattened to 2-D at the axis, as Softmax).
            "LogSoftmax" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let s = self.shape(&Val::Node(x));
                let r = s.len();
                if !self.dtype(&Val::Node(x)).is_float() {
                    return unsup("LogSoftmax of integers");
                }
                let ax = shape::axis(at.int("axis", if opset >= 13 { -1 } else { 1 }), r)?;
                let (src, axes) = if opset >= 13 || ax == r - 1 {
                    (x, vec![ax])
                } else {
                    let flat = [s[..ax].iter().product(), s[ax..].iter().product()];
                    (self.reshape(&self.fresh(name), x, &flat)?, vec![1])
                };
                let y = self.log_softmax(name, src, axes)?;
                one(if src == x { y } else { self.reshape(name, y, &s)? })
            }
            // x / √(mean(x²) + eps) · scale over axes ax.. (opset 23), as LayerNormalization.
            // SimplifiedLayerNormalization: onnxruntime's name for the same norm (its Llama-style
            // exports put it in the standard domain).
            "RMSNormalization" | "SimplifiedLayerNormalization" => {
                let x0 = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let s = self.shape(&Val::Node(x0));
                let ax = shape::axis(at.int("axis", -1), s.len())?;
                let (x, last, flat) = self.norm_rows(name, x0, &s, ax)?;
                let dt = self.dtype(&Val::Node(x));
                let g = self.node(&cx.iname(1), &cx.inp(1)?)?;
                let g = self.norm_channel(name, g, last, dt, "RMSNormalization scale")?;
                let op = Op::RmsNorm { eps: at.float("epsilon", 1e-5) };
                if !flat {
                    return one(self.push(name, op, vec![x, g])?);
                }
                let y = self.tmp(name, op, vec![x, g])?;
                one(self.reshape(name, y, &s)?)
            }
            // Over axes ax..: x seen as [Π s[..ax], Π s[ax..]] (one reshape each way). The
            // optional Mean and InvStdDev outputs are computed apart when something reads them.
            "LayerNormalization" => {
                let x0 = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let s = self.shape(&Val::Node(x0));
                let ax = shape::axis(at.int("axis", -1), s.len())?;
                let (x, last, flat) = self.norm_rows(name, x0, &s, ax)?;
                let eps = at.float("epsilon", 1e-5);
                let dt = self.dtype(&Val::Node(x));
                let mut gb = Vec::new();
                for (k, fill) in [(1usize, 1.0f64), (2, 0.0)] {
                    let v = match ins.get(k).cloned().flatten() {
                        Some(v) => v,
                        None => Val::Lit(Lit::of(Elem::F32, vec![last], vec![fill; last])),
                    };
                    let id = self.node(&cx.iname(k), &v)?;
                    gb.push(self.norm_channel(name, id, last, dt, "LayerNormalization scale/bias")?);
                }
                let y = if flat {
                    let y = self.tmp(name, Op::LayerNorm { eps }, vec![x, gb[0], gb[1]])?;
                    self.reshape(name, y, &s)?
                } else {
                    self.push(name, Op::LayerNorm { eps }, vec![x, gb[0], gb[1]])?
                };
                if !n.output.iter().skip(1).any(|o| !o.is_empty() && self.m.is_used(o)) {
                    return one(y);
                }
                // Mean = E[x], InvStdDev = 1/sqrt(E[(x - Mean)²] + eps), shaped s[..ax] ++ [1, ..].
                let stat: Vec<usize> = s[..ax].iter().copied().chain(std::iter::repeat_n(1, s.len() - ax)).collect();
                let r2 = self.shape(&Val::Node(x)).len();
                let mean_op = Op::Reduce { op: ReduceOp::Mean, axes: vec![r2 - 1], keep_dims: true };
                let mean = self.tmp(name, mean_op.clone(), vec![x])?;
                let d = self.tmp(name, Op::Binary(BinaryOp::Sub), vec![x, mean])?;
                let d2 = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![d, d])?;
                let var = self.tmp(name, mean_op, vec![d2])?;
                let e = self.scalar(&self.fresh(name), eps, dt)?;
                let ve = self.tmp(name, Op::Binary(BinaryOp::Add), vec![var, e])?;
                let inv = self.tmp(name, Op::Unary(UnaryOp::Rsqrt), vec![ve])?;
                let names: Vec<String> = (1..3).map(|k| n.output.get(k).filter(|o| !o.is_empty()).cloned().unwrap_or_else(|| self.fresh(name))).collect();
                let mean = self.reshape(&names[0], mean, &stat)?;
                let inv = self.reshape(&names[1], inv, &stat)?;
                Ok(vec![y, mean, inv])
            }
            // Sum, Mean and Max are kiln reductions; the others are written over them:
            // Min = -Max(-x), SumSquare = Sum(x²), L1 = Sum(|x|), L2 = √Sum(x²),
            // LogSum = log Sum(x), LogSumExp = log Sum(e^(x - m)) + m with m = Max(x).
            "ReduceSum" | "ReduceMean" | "ReduceMax" | "ReduceMin" | "ReduceSumSquare" | "ReduceL1" | "ReduceL2" | "ReduceLogSum"
            | "ReduceLogSumExp" | "ReduceProd" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let dt = self.dtype(&Val::Node(x));
                if !dt.is_float() && !matches!(op, "ReduceSum" | "ReduceMax" | "ReduceMean" | "ReduceMin" | "ReduceProd") {
                    return unsup(format!("{op} of integers"));
                }
                let r = self.shape(&Val::Node(x)).len();
                let as_input = if op == "ReduceSum" { opset >= 13 } else { opset >= 18 };
                let axes = if as_input {
                    match ins.get(1).cloned().flatten() {
                        Some(_) => Some(cx.lit_of(1, "reduction axes")?.ints()),
                        None => None,
                    }
                } else {
                    at.ints("axes")
                };
                let mut axes: Vec<usize> = match axes {
                    Some(v) if !v.is_empty() => v.iter().map(|&a| shape::axis(a, r)).collect::<Result<_, _>>()?,
                    _ if at.int("noop_with_empty_axes", 0) != 0 => return one(x),
                    _ => (0..r).collect(),
                };
                axes.sort();
                axes.dedup();
                let keep_dims = at.int("keepdims", 1) != 0;
                let un = |s: &mut Self, u: UnaryOp, v: ValueId| s.tmp(name, Op::Unary(u), vec![v]);
                let red = |s: &mut Self, nm: &str, op: ReduceOp, v: ValueId, keep: bool| {
                    s.push(nm, Op::Reduce { op, axes: axes.clone(), keep_dims: keep }, vec![v])
                };
                match op {
                    "ReduceSum" => one(red(self, name, ReduceOp::Sum, x, keep_dims)?),
                    "ReduceProd" => {
                        let xf = self.cast_to(name, x, DType::F32)?;
                        let mut sum = |me: &mut Self, v: ValueId| red(me, &me.fresh(name), ReduceOp::Sum, v, keep_dims);
                        let y = self.product_of(name, xf, &mut sum, !dt.is_float())?;
                        one(self.cast_to(name, y, dt)?)
                    }
                    "ReduceMean" => one(red(self, name, ReduceOp::Mean, x, keep_dims)?),
                    "ReduceMax" => one(red(self, name, ReduceOp::Max, x, keep_dims)?),
                    "ReduceMin" if !dt.is_float() => {
                        // Integers: 0 - x (kiln's Neg is a float op).
                        let z = self.scalar(&self.fresh(name), 0.0, dt)?;
                        let nx = self.tmp(name, Op::Binary(BinaryOp::Sub), vec![z, x])?;
                        let m = red(self, &self.fresh(name), ReduceOp::Max, nx, keep_dims)?;
                        one(self.push(name, Op::Binary(BinaryOp::Sub), vec![z, m])?)
                    }
                    "ReduceMin" => {
                        let nx = un(self, UnaryOp::Neg, x)?;
                        let m = red(self, &self.fresh(name), ReduceOp::Max, nx, keep_dims)?;
                        one(self.push(name, Op::Unary(UnaryOp::Neg), vec![m])?)
                    }
                    "ReduceSumSquare" | "ReduceL2" => {
                        let sq = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![x, x])?;
                        if op == "ReduceSumSquare" {
                            return one(red(self, name, ReduceOp::Sum, sq, keep_dims)?);
                        }
                        let s = red(self, &self.fresh(name), ReduceOp::Sum, sq, keep_dims)?;
                        one(self.push(name, Op::Unary(UnaryOp::Sqrt), vec![s])?)
                    }
                    "ReduceL1" => {
                        let a = un(self, UnaryOp::Abs, x)?;
                        one(red(self, name, ReduceOp::Sum, a, keep_dims)?)
                    }
                    "ReduceLogSum" => {
                        let s = red(self, &self.fresh(name), ReduceOp::Sum, x, keep_dims)?;
                        one(self.push(name, Op::Unary(UnaryOp::Log), vec![s])?)
                    }
                    _ => {
                        let m = red(self, &self.fresh(name), ReduceOp::Max, x, true)?;
                        let d = self.tmp(name, Op::Binary(BinaryOp::Sub), vec![x, m])?;
                        let e = un(self, UnaryOp::Exp, d)?;
                        let s = red(self, &self.fresh(name), ReduceOp::Sum, e, true)?;
                        let l = un(self, UnaryOp::Log, s)?;
                        if keep_dims {
                            return one(self.push(name, Op::Binary(BinaryOp::Add), vec![l, m])?);
                        }
                        let y = self.tmp(name, Op::Binary(BinaryOp::Add), vec![l, m])?;
                        let sh = self.shape(&Val::Node(x));
                        let out: Vec<usize> = (0..sh.len()).filter(|d| !axes.contains(d)).map(|d| sh[d]).collect();
                        one(self.reshape(name, y, &out)?)
                    }
                }
            }
            "ArgMax" | "ArgMin" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let s = self.shape(&Val::Node(x));
                let ax = shape::axis(at.int("axis", 0), s.len())?;
                let (keep, last) = (at.int("keepdims", 1) != 0, at.int("select_last_index", 0) != 0);
                let v = match op {
                    "ArgMin" if self.dtype(&Val::Node(x)).is_float() => self.tmp(name, Op::Unary(UnaryOp::Neg), vec![x])?,
                    "ArgMin" => {
                        let z = self.scalar(&self.fresh(name), 0.0, self.dtype(&Val::Node(x)))?;
                        self.tmp(name, Op::Binary(BinaryOp::Sub), vec![z, x])?
                    }
                    _ => x,
                };
                let best = self.arg_max(name, v, ax, last, keep)?;
                one(self.push(name, Op::Cast { to: DType::I64 }, vec![best])?)
            }
            // The k largest (or smallest) along the axis, in order, ties to the lower index: k
            // rounds of a max and its first position (`arg_max`), that position then masked
            // out. Integers go through f32 (exact below 2^24). k is known (a shape input).
            "TopK" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let s = self.shape(&Val::Node(x));
                let r = s.len();
                let ax = shape::axis(at.int("axis", -1), r)?;
                let k = if opset < 10 { at.int("k", 0) } else { cx.lit_of(1, "TopK's K")?.ints().first().copied().unwrap_or(0) };
                if k < 1 || k as usize > s[ax] {
                    return Err(Fail::Invalid(format!("TopK k = {k} along an axis of {}", s[ax])));
                }
                let k = k as usize;
                if k > 256 {
                    return unsup(format!("TopK with k = {k} (kiln unrolls at most 256 rounds)"));
                }
                let dt = self.dtype(&Val::Node(x));
                let mut v = self.cast_to(name, x, DType::F32)?;
                let largest = at.int("largest", 1) != 0;
                if !largest {
                    v = self.tmp(name, Op::Unary(UnaryOp::Neg), vec![v])?;
                }
                let pos = self.positions(name, s[ax], r - ax - 1)?;
                let ninf = self.scalar(&self.fresh(name), f32::NEG_INFINITY, DType::F32)?;
                let (mut vals, mut idxs) = (Vec::new(), Vec::new());
                for round in 0..k {
                    vals.push(self.tmp(name, Op::Reduce { op: ReduceOp::Max, axes: vec![ax], keep_dims: true }, vec![v])?);
                    let at_best = self.arg_max(name, v, ax, false, true)?;
                    idxs.push(at_best);
                    if round + 1 < k {
                        let hit = self.tmp(name, Op::Binary(BinaryOp::Eq), vec![pos, at_best])?;
                        let hit = self.as_bool(&self.fresh(name), hit)?;
                        v = self.tmp(name, Op::Where, vec![hit, ninf, v])?;
                    }
                }
                let cat = |me: &mut Self, parts: Vec<ValueId>| if parts.len() == 1 { Ok(parts[0]) } else { me.tmp(name, Op::Concat { axis: ax }, parts) };
                let mut values = cat(self, vals)?;
                if !largest {
                    values = self.tmp(name, Op::Unary(UnaryOp::Neg), vec![values])?;
                }
                let values = self.cast_to(name, values, dt)?;
                let indices = cat(self, idxs)?;
                Ok(vec![values, self.tmp(name, Op::Cast { to: DType::I64 }, vec![indices])?])
            }
            // 1 at the first largest value along the axis, 0 elsewhere (before opset 13: of the
            // input flattened to 2-D at the axis, as Softmax).
            "Hardmax" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let s = self.shape(&Val::Node(x));
                let ax = shape::axis(at.int("axis", if opset >= 13 { -1 } else { 1 }), s.len())?;
                let (v, vax) = if opset >= 13 || ax + 1 == s.len() {
                    (x, ax)
                } else {
                    let flat = [s[..ax].iter().product(), s[ax..].iter().product()];
                    (self.reshape(&self.fresh(name), x, &flat)?, 1)
                };
                let vs = self.shape(&Val::Node(v));
                let best = self.arg_max(name, v, vax, false, true)?;
                let iota = self.positions(name, vs[vax], vs.len() - vax - 1)?;
                let hit = self.tmp(name, Op::Binary(BinaryOp::Eq), vec![iota, best])?;
                let hit = self.cast_to(name, hit, self.dtype(&Val::Node(x)))?;
                let hit = if vs == s { hit } else { self.reshape(&self.fresh(name), hit, &s)? };
                one(self.push(name, Op::Cast { to: self.dtype(&Val::Node(x)) }, vec![hit])?)
            }
            // x / ‖x‖_p along the axis (p 1 or 2), 0 where the norm is 0.
            "LpNormalization" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let s = self.shape(&Val::Node(x));
                let ax = shape::axis(at.int("axis", -1), s.len())?;
                let dt = self.dtype(&Val::Node(x));
                let sum = |me: &mut Self, v: ValueId| me.tmp(name, Op::Reduce { op: ReduceOp::Sum, axes: vec![ax], keep_dims: true }, vec![v]);
                let norm = match at.int("p", 2) {
                    1 => {
                        let a = self.tmp(name, Op::Unary(UnaryOp::Abs), vec![x])?;
                        sum(self, a)?
                    }
                    2 => {
                        let sq = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![x, x])?;
                        let s2 = sum(self, sq)?;
                        self.tmp(name, Op::Unary(UnaryOp::Sqrt), vec![s2])?
                    }
                    p => return unsup(format!("LpNormalization with p = {p}")),
                };
                let y = self.tmp(name, Op::Binary(BinaryOp::Div), vec![x, norm])?;
                let z = self.scalar(&self.fresh(name), 0.0, dt)?;
                let zero = self.tmp(name, Op::Binary(BinaryOp::Eq), vec![norm, z])?;
                let zero = self.as_bool(&self.fresh(name), zero)?;
                one(self.push(name, Op::Where, vec![zero, z, y])?)
            }
            // ONNX's function: (x - E[x]) / (√(E[x²] - E[x]²) + 1e-9) over `axes`.
            "MeanVarianceNormalization" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let r = self.shape(&Val::Node(x)).len();
                let axes: Vec<usize> = at.ints("axes").unwrap_or_else(|| vec![0, 2, 3]).iter().map(|&a| shape::axis(a, r)).collect::<Result<_, _>>()?;
                let mean = |me: &mut Self, v: ValueId| me.tmp(name, Op::Reduce { op: ReduceOp::Mean, axes: axes.clone(), keep_dims: true }, vec![v]);
                let m = mean(self, x)?;
                let m2 = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![m, m])?;
                let x2 = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![x, x])?;
                let ex2 = mean(self, x2)?;
                let var = self.tmp(name, Op::Binary(BinaryOp::Sub), vec![ex2, m2])?;
                let sd = self.tmp(name, Op::Unary(UnaryOp::Sqrt), vec![var])?;
                let eps = self.scalar(&self.fresh(name), 1e-9, self.dtype(&Val::Node(x)))?;
                let sd = self.tmp(name, Op::Binary(BinaryOp::Add), vec![sd, eps])?;
                let d = self.tmp(name, Op::Binary(BinaryOp::Sub), vec![x, m])?;
                one(self.push(name, Op::Binary(BinaryOp::Div), vec![d, sd])?)
            }
            _ => unsup(format!("op `{op}` is not supported")),
        }
    }

    /// The index (in f32) of the first (or, with `last`, the last) largest value of `v` along
    /// `ax`, NaN counting as largest as numpy's argmax has it: m = max(v), then the smallest
    /// (largest) position where v == m or v is NaN, found as a Max over positions counted so
    /// that a Max finds it (i for the last, n - 1 - i for the first) and -1 elsewhere.
    pub(super) fn arg_max(&mut self, name: &str, v: ValueId, ax: usize, last: bool, keep: bool) -> R<ValueId> {
        let s = self.shape(&Val::Node(v));
        let n = s[ax];
        if n == 0 {
            return unsup("an arg-max over an empty axis");
        }
        let m = self.tmp(name, Op::Reduce { op: ReduceOp::Max, axes: vec![ax], keep_dims: true }, vec![v])?;
        let mut hit = self.tmp(name, Op::Binary(BinaryOp::Eq), vec![v, m])?;
        if self.dtype(&Val::Node(v)).is_float() {
            let nan = self.tmp(name, Op::Binary(BinaryOp::Ne), vec![v, v])?;
            hit = self.tmp(name, Op::Binary(BinaryOp::Max), vec![hit, nan])?;
        }
        let hit = self.as_bool(&self.fresh(name), hit)?;
        let pos: Vec<f64> = (0..n).map(|i| if last { i as f64 } else { (n - 1 - i) as f64 }).collect();
        let iota = self.along_axis(name, pos, s.len() - ax - 1)?;
        let miss = self.scalar(&self.fresh(name), -1.0, DType::F32)?;
        let cand = self.tmp(name, Op::Where, vec![hit, iota, miss])?;
        let best = self.tmp(name, Op::Reduce { op: ReduceOp::Max, axes: vec![ax], keep_dims: keep }, vec![cand])?;
        if last {
            return Ok(best);
        }
        let top = self.scalar(&self.fresh(name), (n - 1) as f32, DType::F32)?;
        self.tmp(name, Op::Binary(BinaryOp::Sub), vec![top, best])
    }

    /// 0, 1, .., n - 1 (f32) along a dim followed by `trailing` dims of 1.
    pub(super) fn positions(&mut self, name: &str, n: usize, trailing: usize) -> R<ValueId> {
        self.along_axis(name, (0..n).map(|i| i as f64).collect(), trailing)
    }

    /// An f32 vector as a constant along a dim followed by `trailing` dims of 1 (to broadcast
    /// against a value at that axis).
    fn along_axis(&mut self, name: &str, values: Vec<f64>, trailing: usize) -> R<ValueId> {
        let n = values.len();
        let v = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![n], values)))?;
        let to: Vec<usize> = std::iter::once(n).chain(std::iter::repeat_n(1, trailing)).collect();
        self.reshape(&self.fresh(name), v, &to)
    }

    /// ONNX Softmax of `x` along `axis` under `opset`'s rule (the last op named `name`):
    /// before opset 13, of the input flattened to [prod(..axis), prod(axis..)].
    pub(super) fn softmax_at(&mut self, name: &str, x: ValueId, axis: i64, opset: i64) -> R<ValueId> {
        let s = self.shape(&Val::Node(x));
        let r = s.len();
        let ax = shape::axis(axis, r)?;
        if opset >= 13 || ax == r - 1 {
            return self.push(name, Op::Softmax { axis: ax }, vec![x]);
        }
        let flat = [s[..ax].iter().product(), s[ax..].iter().product()];
        let f = self.reshape(&self.fresh(name), x, &flat)?;
        let y = self.tmp(name, Op::Softmax { axis: 1 }, vec![f])?;
        self.reshape(name, y, &s)
    }

    /// The running sum of f32 `x` along `ax` (ONNX CumSum's `exclusive` and `reverse`): `x`
    /// times a 0/1 triangular matrix, the axis moved last and back (a vector as one row).
    fn scan_sum(&mut self, name: &str, x: ValueId, ax: usize, exclusive: bool, reverse: bool) -> R<ValueId> {
        let s = self.shape(&Val::Node(x));
        if s.len() == 1 {
            let row = self.reshape(&self.fresh(name), x, &[1, s[0]])?;
            let y = self.scan_sum(name, row, 1, exclusive, reverse)?;
            return self.reshape(&self.fresh(name), y, &s);
        }
        let r = s.len();
        let n = s[ax];
        let mut t = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                let before = if reverse { i > j } else { i < j };
                t[i * n + j] = if before || (i == j && !exclusive) { 1.0 } else { 0.0 };
            }
        }
        let tri = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![n, n], t)))?;
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(ax, r - 1);
        let v = if ax != r - 1 { self.tmp(name, Op::Transpose { perm: perm.clone() }, vec![x])? } else { x };
        let y = self.tmp(name, Op::MatMul { transpose_a: false, transpose_b: false }, vec![v, tri])?;
        if ax != r - 1 {
            return self.tmp(name, Op::Transpose { perm }, vec![y]);
        }
        Ok(y)
    }

    /// A product of f32 values as `sum` (a reduction or a scan) of logarithms: the magnitude
    /// exp(Σ log|x|) (zeros counted apart, as log 1), the sign from the parity of the negatives,
    /// 0 wherever a zero was taken. Relative error about 1e-7 per factor; `round` (integer
    /// products) rounds to the nearest integer, exact while products stay near 2^16 or below.
    pub(super) fn product_of(&mut self, name: &str, x: ValueId, sum: &mut dyn FnMut(&mut Self, ValueId) -> R<ValueId>, round: bool) -> R<ValueId> {
        let (zero, half, one, two) = (self.k(name, 0.0, DType::F32)?, self.k(name, 0.5, DType::F32)?, self.k(name, 1.0, DType::F32)?, self.k(name, 2.0, DType::F32)?);
        let is0 = self.bin(name, BinaryOp::Eq, x, zero)?;
        let neg = self.bin(name, BinaryOp::Lt, x, zero)?;
        let a = self.un(name, UnaryOp::Abs, x)?;
        let a = self.bin(name, BinaryOp::Add, a, is0)?;
        let l = self.un(name, UnaryOp::Log, a)?;
        let (sl, sz, sn) = (sum(self, l)?, sum(self, is0)?, sum(self, neg)?);
        let mag = self.un(name, UnaryOp::Exp, sl)?;
        // sign = 1 - 2·(negatives mod 2)
        let h = self.bin(name, BinaryOp::Mul, sn, half)?;
        let fl = self.un(name, UnaryOp::Floor, h)?;
        let f2 = self.bin(name, BinaryOp::Mul, fl, two)?;
        let parity = self.bin(name, BinaryOp::Sub, sn, f2)?;
        let p2 = self.bin(name, BinaryOp::Mul, parity, two)?;
        let sign = self.bin(name, BinaryOp::Sub, one, p2)?;
        let mut y = self.bin(name, BinaryOp::Mul, mag, sign)?;
        if round {
            y = self.un(name, UnaryOp::Round, y)?;
        }
        let any0 = self.bin(name, BinaryOp::Lt, half, sz)?;
        let any0 = self.as_bool(&self.fresh(name), any0)?;
        self.tmp(name, Op::Where, vec![any0, zero, y])
    }

    /// `x - max - log Σ exp(x - max)` over `axes` (LogSoftmax; SoftmaxCrossEntropyLoss's
    /// log-probabilities).
    pub(super) fn log_softmax(&mut self, name: &str, x: ValueId, axes: Vec<usize>) -> R<ValueId> {
        let keep = |op| Op::Reduce { op, axes: axes.clone(), keep_dims: true };
        let m = self.tmp(name, keep(ReduceOp::Max), vec![x])?;
        let d = self.tmp(name, Op::Binary(BinaryOp::Sub), vec![x, m])?;
        let e = self.tmp(name, Op::Unary(UnaryOp::Exp), vec![d])?;
        let sum = self.tmp(name, keep(ReduceOp::Sum), vec![e])?;
        let l = self.tmp(name, Op::Unary(UnaryOp::Log), vec![sum])?;
        self.tmp(name, Op::Binary(BinaryOp::Sub), vec![d, l])
    }

    /// A norm over axes `ax..` of `x` (shape `s`) as a norm over the last axis: x as
    /// `[Π s[..ax], Π s[ax..]]` when ax is not already the last axis. (x, row length, reshaped).
    fn norm_rows(&mut self, name: &str, x: ValueId, s: &[usize], ax: usize) -> R<(ValueId, usize, bool)> {
        let last: usize = s[ax..].iter().product();
        if ax + 1 == s.len() {
            return Ok((x, last, false));
        }
        Ok((self.reshape(&self.fresh(name), x, &[s[..ax].iter().product(), last])?, last, true))
    }
}
