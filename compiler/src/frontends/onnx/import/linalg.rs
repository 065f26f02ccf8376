//! Products: MatMul (a vector as a 1-row or 1-column matrix), Gemm, and the quantized forms
//! (DynamicQuantizeLinear, MatMulInteger, DequantizeLinear).

use kiln_runtime::graph::{BinaryOp, Op, ReduceOp, UnaryOp, ValueId};
use kiln_runtime::DType;

use super::super::shape;
use super::super::tensor::{Elem, Lit};
use super::{one, unsup, Fail, Importer, NodeCx, Val, R};

/// The ops this file imports.
pub(super) const OPS: &[&str] = &[
    "MatMul", "Gemm", "DynamicQuantizeLinear", "MatMulInteger", "DequantizeLinear",
];

impl Importer<'_> {
    /// A node of one of [`OPS`] with a graph-computed input, as kiln ops. Returns its outputs.
    pub(super) fn import_linalg(&mut self, cx: &NodeCx) -> R<Vec<ValueId>> {
        let NodeCx { op, name, n, ins, at, .. } = *cx;
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
            // Dynamic (per-batch) uint8 quantization, as onnxruntime's quantize_dynamic writes it:
            // the quantized values are kept as integers held in f32 (kiln has no 8-bit type), and
            // MatMulInteger below consumes them. Rounding is half up (`trunc(v + 0.5)` after
            // clamping to [0, 255]), where ONNX says half to even: they differ only on exact ties.
            "DynamicQuantizeLinear" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                if self.dtype(&Val::Node(x)) != DType::F32 {
                    return unsup("DynamicQuantizeLinear of a non-f32 input");
                }
                let all: Vec<usize> = (0..self.shape(&Val::Node(x)).len()).collect();
                let bin = |s: &mut Self, op: BinaryOp, a: ValueId, b: ValueId| s.tmp(name, Op::Binary(op), vec![a, b]);
                let zero = self.scalar(&self.fresh(name), 0.0, DType::F32)?;
                let hi = self.tmp(name, Op::Reduce { op: ReduceOp::Max, axes: all.clone(), keep_dims: false }, vec![x])?;
                let nx = self.tmp(name, Op::Unary(UnaryOp::Neg), vec![x])?;
                let nlo = self.tmp(name, Op::Reduce { op: ReduceOp::Max, axes: all, keep_dims: false }, vec![nx])?;
                let hi = bin(self, BinaryOp::Max, hi, zero)?;
                let nlo = bin(self, BinaryOp::Max, nlo, zero)?; // -min(min x, 0)
                let range = bin(self, BinaryOp::Add, hi, nlo)?;
                let q = self.scalar(&self.fresh(name), 255.0, DType::F32)?;
                let scale = self.push(n.output.get(1).map(String::as_str).filter(|o| !o.is_empty()).unwrap_or(&self.fresh(name)), Op::Binary(BinaryOp::Div), vec![range, q])?;
                let zf = bin(self, BinaryOp::Div, nlo, scale)?;
                let zp = self.round_u8(name, zf)?;
                let v = bin(self, BinaryOp::Div, x, scale)?;
                let v = bin(self, BinaryOp::Add, v, zp)?;
                let y = self.round_u8(name, v)?;
                Ok(vec![y, scale, zp])
            }
            // Σ (a - a_zero)(b - b_zero) with the integers held in f32 (one GEMM); a known b
            // (the weights) becomes an f32 weight at import.
            "MatMulInteger" => {
                let a = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let mut af = self.cast_to(name, a, DType::F32)?;
                if let Some(z) = ins.get(2).cloned().flatten() {
                    let z = self.node(&cx.iname(2), &z)?;
                    let z = self.cast_to(name, z, DType::F32)?;
                    af = self.tmp(name, Op::Binary(BinaryOp::Sub), vec![af, z])?;
                }
                let bf = match (cx.inp(1)?, ins.get(3).cloned().flatten()) {
                    (Val::Lit(b), zero) => {
                        let zl = match zero {
                            Some(Val::Lit(z)) => Some(z),
                            Some(Val::Node(_)) => return unsup("a MatMulInteger zero point computed at run time for known weights"),
                            None => None,
                        };
                        let mut w = Lit::of(Elem::F32, b.shape.clone(), b.floats());
                        if let Some(z) = zl {
                            let zv = z.floats();
                            let n_out = *b.shape.last().unwrap_or(&1);
                            if zv.len() != 1 && zv.len() != n_out {
                                return unsup(format!("MatMulInteger weight zero point of {} values for {n_out} columns", zv.len()));
                            }
                            if let super::super::tensor::LitData::F(v) = &mut w.data {
                                for (i, x) in v.iter_mut().enumerate() {
                                    *x -= if zv.len() == 1 { zv[0] } else { zv[i % n_out] };
                                }
                            }
                        }
                        w.weight = b.weight || w.numel() > 64;
                        self.node(&format!("{}.int", cx.iname(1)), &Val::Lit(w))?
                    }
                    (b, zero) => {
                        let b = self.node(&cx.iname(1), &b)?;
                        let mut bf = self.cast_to(name, b, DType::F32)?;
                        if let Some(z) = zero {
                            let z = self.node(&cx.iname(3), &z)?;
                            let z = self.cast_to(name, z, DType::F32)?;
                            bf = self.tmp(name, Op::Binary(BinaryOp::Sub), vec![bf, z])?;
                        }
                        bf
                    }
                };
                if self.shape(&Val::Node(af)).len() < 2 || self.shape(&Val::Node(bf)).len() < 2 {
                    return unsup("MatMulInteger of vectors");
                }
                one(self.push(name, Op::MatMul { transpose_a: false, transpose_b: false }, vec![af, bf])?)
            }
            "DequantizeLinear" => {
                // (x - zero_point) · scale in f32, the scale and zero point per tensor or per
                // slice along `axis` (shaped to broadcast there).
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let xs = self.shape(&Val::Node(x));
                if at.int("block_size", 0) != 0 {
                    return unsup("blocked DequantizeLinear of a run-time value");
                }
                let axis_attr = at.int("axis", 1);
                let param = |s: &mut Self, k: usize| -> R<Option<ValueId>> {
                    let Some(v) = ins.get(k).cloned().flatten() else { return Ok(None) };
                    let mut id = s.node(&cx.iname(k), &v)?;
                    let ps = s.shape(&Val::Node(id));
                    let n: usize = ps.iter().product();
                    if n != 1 {
                        let axis = shape::axis(axis_attr, xs.len())?;
                        if ps.len() != 1 || xs.get(axis) != Some(&n) {
                            return unsup(format!("DequantizeLinear parameter of shape {ps:?} for an input of shape {xs:?}"));
                        }
                        let to: Vec<usize> = std::iter::once(n).chain(std::iter::repeat_n(1, xs.len() - axis - 1)).collect();
                        id = s.reshape(&s.fresh(name), id, &to)?;
                    }
                    Ok(Some(s.cast_to(name, id, DType::F32)?))
                };
                let scale = param(self, 1)?.ok_or_else(|| Fail::Invalid("DequantizeLinear without a scale".into()))?;
                let zero = param(self, 2)?;
                let xf = self.tmp(name, Op::Cast { to: DType::F32 }, vec![x])?;
                let xf = match zero {
                    Some(z) => self.tmp(name, Op::Binary(BinaryOp::Sub), vec![xf, z])?,
                    None => xf,
                };
                one(self.push(name, Op::Binary(BinaryOp::Mul), vec![xf, scale])?)
            }
            _ => unsup(format!("op `{op}` is not supported")),
        }
    }

    /// `v` rounded half up to an integer in [0, 255] (a uint8 held in f32).
    fn round_u8(&mut self, name: &str, v: ValueId) -> R<ValueId> {
        let lo = self.scalar(&self.fresh(name), 0.0, DType::F32)?;
        let hi = self.scalar(&self.fresh(name), 255.0, DType::F32)?;
        let half = self.scalar(&self.fresh(name), 0.5, DType::F32)?;
        let c = self.tmp(name, Op::Binary(BinaryOp::Min), vec![v, hi])?;
        let c = self.tmp(name, Op::Binary(BinaryOp::Max), vec![c, lo])?;
        let h = self.tmp(name, Op::Binary(BinaryOp::Add), vec![c, half])?;
        let i = self.tmp(name, Op::Cast { to: DType::I64 }, vec![h])?;
        self.tmp(name, Op::Cast { to: DType::F32 }, vec![i])
    }
}
