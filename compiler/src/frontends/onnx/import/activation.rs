//! The parametric and piecewise activations (LeakyRelu, PRelu, Elu, Selu, Celu, HardSigmoid,
//! HardSwish, Softsign, ThresholdedRelu, Shrink, Mish, Swish), IsInf, Mean, Tan and the
//! hyperbolic functions (Sinh, Cosh, Asinh, Acosh, Atanh, from exp, log and sqrt), SwiGLU, each written
//! over kiln's elementwise ops as ONNX defines it (comparisons pick the branch with `Where`),
//! so the elementwise fusion takes them like any other chain. The plain activations kiln has
//! ops for (Relu, Sigmoid, Tanh, Gelu, Softplus, ...) are in `elementwise.rs`.

use kiln_runtime::graph::{BinaryOp, Op, UnaryOp, ValueId};
use kiln_runtime::DType;

use super::{one, unsup, Fail, Importer, NodeCx, Val, R};

/// The ops this file imports.
pub(super) const OPS: &[&str] = &[
    "Celu", "Elu", "HardSigmoid", "HardSwish", "IsInf", "LeakyRelu", "Mean", "Mish", "PRelu", "Selu", "Shrink", "Softsign", "Swish",
    "ThresholdedRelu", "Tan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Asin", "Acos", "SwiGLU",
];

impl Importer<'_> {
    /// A node of one of [`OPS`] with a graph-computed input, as kiln ops. Returns its outputs.
    pub(super) fn import_activation(&mut self, cx: &NodeCx) -> R<Vec<ValueId>> {
        let NodeCx { op, name, ins, at, .. } = *cx;
        let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
        let dt = self.dtype(&Val::Node(x));
        if op != "Mean" && !dt.is_float() {
            return unsup(format!("{op} of integers"));
        }
        use BinaryOp::{Add, Div, Eq, Lt, Max, Min, Mul, Sub};
        let y = match op {
            // x < 0 ? alpha·x : x (PRelu: a broadcast slope tensor).
            "LeakyRelu" | "PRelu" => {
                let slope = if op == "PRelu" { self.node(&cx.iname(1), &cx.inp(1)?)? } else { self.k(name, at.float("alpha", 0.01), dt)? };
                let ax = self.bin(name, Mul, x, slope)?;
                self.pick_below(name, x, 0.0, ax, x)?
            }
            // x < 0 ? alpha·(e^x - 1) : x; Selu: gamma·(x ≤ 0 ? alpha·e^x - alpha : x).
            "Elu" | "Selu" => {
                let (alpha, gamma) = if op == "Selu" {
                    (at.float("alpha", 1.673_263_2), Some(at.float("gamma", 1.050_701)))
                } else {
                    (at.float("alpha", 1.0), None)
                };
                let e = self.un(name, UnaryOp::Exp, x)?;
                let one = self.k(name, 1.0, dt)?;
                let em1 = self.bin(name, Sub, e, one)?;
                let a = self.k(name, alpha, dt)?;
                let neg = self.bin(name, Mul, em1, a)?;
                let y = self.pick_below(name, x, 0.0, neg, x)?;
                match gamma {
                    Some(g) => {
                        let g = self.k(name, g, dt)?;
                        self.bin(name, Mul, y, g)?
                    }
                    None => y,
                }
            }
            // max(0, x) + min(0, alpha·(e^(x/alpha) - 1)).
            "Celu" => {
                let a = self.k(name, at.float("alpha", 1.0), dt)?;
                let (zero, one) = (self.k(name, 0.0, dt)?, self.k(name, 1.0, dt)?);
                let xa = self.bin(name, Div, x, a)?;
                let e = self.un(name, UnaryOp::Exp, xa)?;
                let em1 = self.bin(name, Sub, e, one)?;
                let neg = self.bin(name, Mul, em1, a)?;
                let neg = self.bin(name, Min, neg, zero)?;
                let pos = self.bin(name, Max, x, zero)?;
                self.bin(name, Add, pos, neg)?
            }
            // clamp(alpha·x + beta, 0, 1); HardSwish: x · that with alpha 1/6, beta 1/2.
            "HardSigmoid" | "HardSwish" => {
                let (alpha, beta) = if op == "HardSwish" { (1.0 / 6.0, 0.5) } else { (at.float("alpha", 0.2), at.float("beta", 0.5)) };
                let (a, b) = (self.k(name, alpha, dt)?, self.k(name, beta, dt)?);
                let (zero, one) = (self.k(name, 0.0, dt)?, self.k(name, 1.0, dt)?);
                let v = self.bin(name, Mul, x, a)?;
                let v = self.bin(name, Add, v, b)?;
                let v = self.bin(name, Min, v, one)?;
                let h = self.bin(name, Max, v, zero)?;
                if op == "HardSwish" {
                    self.bin(name, Mul, x, h)?
                } else {
                    h
                }
            }
            "Tan" => {
                let s = self.un(name, UnaryOp::Sin, x)?;
                let c = self.un(name, UnaryOp::Cos, x)?;
                self.bin(name, Div, s, c)?
            }
            // (e^x ∓ e^-x) / 2.
            "Sinh" | "Cosh" => {
                let e = self.un(name, UnaryOp::Exp, x)?;
                let nx = self.un(name, UnaryOp::Neg, x)?;
                let en = self.un(name, UnaryOp::Exp, nx)?;
                let d = self.bin(name, if op == "Sinh" { Sub } else { Add }, e, en)?;
                let half = self.k(name, 0.5, dt)?;
                self.bin(name, Mul, d, half)?
            }
            // asinh: sign(x)·log(|x| + √(x² + 1)) (odd, so no cancellation for x < 0);
            // acosh: log(x + √(x² - 1)).
            "Asinh" | "Acosh" => {
                let a = if op == "Asinh" { self.un(name, UnaryOp::Abs, x)? } else { x };
                let x2 = self.bin(name, Mul, a, a)?;
                let one = self.k(name, if op == "Asinh" { 1.0 } else { -1.0 }, dt)?;
                let r = self.bin(name, Add, x2, one)?;
                let r = self.un(name, UnaryOp::Sqrt, r)?;
                let s = self.bin(name, Add, a, r)?;
                let l = self.un(name, UnaryOp::Log, s)?;
                if op == "Asinh" {
                    let nl = self.un(name, UnaryOp::Neg, l)?;
                    self.pick_below(name, x, 0.0, nl, l)?
                } else {
                    l
                }
            }
            // asin: atan(x / √((1 - x)(1 + x))), the product exact near |x| = 1 where 1 - x² is
            // not (±π/2 at ±1: x / 0); acos: 2·atan(√((1 - x) / (1 + x))), accurate near 1
            // where π/2 - asin(x) cancels (π at -1: √(2 / 0)). NaN past |x| = 1 (a negative root).
            "Asin" | "Acos" => {
                let one = self.k(name, 1.0, dt)?;
                let m = self.bin(name, Sub, one, x)?;
                let p = self.bin(name, Add, one, x)?;
                if op == "Asin" {
                    let d = self.bin(name, Mul, m, p)?;
                    let r = self.un(name, UnaryOp::Sqrt, d)?;
                    let q = self.bin(name, Div, x, r)?;
                    self.un(name, UnaryOp::Atan, q)?
                } else {
                    let q = self.bin(name, Div, m, p)?;
                    let r = self.un(name, UnaryOp::Sqrt, q)?;
                    let a = self.un(name, UnaryOp::Atan, r)?;
                    let two = self.k(name, 2.0, dt)?;
                    self.bin(name, Mul, a, two)?
                }
            }
            // ½·log((1 + x) / (1 - x)).
            "Atanh" => {
                let one = self.k(name, 1.0, dt)?;
                let p = self.bin(name, Add, one, x)?;
                let m = self.bin(name, Sub, one, x)?;
                let q = self.bin(name, Div, p, m)?;
                let l = self.un(name, UnaryOp::Log, q)?;
                let half = self.k(name, 0.5, dt)?;
                self.bin(name, Mul, l, half)?
            }
            // x / (1 + |x|).
            "Softsign" => {
                let one = self.k(name, 1.0, dt)?;
                let a = self.un(name, UnaryOp::Abs, x)?;
                let d = self.bin(name, Add, a, one)?;
                self.bin(name, Div, x, d)?
            }
            // x > alpha ? x : 0.
            "ThresholdedRelu" => {
                let (a, zero) = (self.k(name, at.float("alpha", 1.0), dt)?, self.k(name, 0.0, dt)?);
                let gt = self.bin(name, Lt, a, x)?;
                let gt = self.as_bool(&self.fresh(name), gt)?;
                self.tmp(name, Op::Where, vec![gt, x, zero])?
            }
            // x < -lambd ? x + bias : (x > lambd ? x - bias : 0).
            "Shrink" => {
                let (l, b) = (at.float("lambd", 0.5), at.float("bias", 0.0));
                let (bias, zero) = (self.k(name, b, dt)?, self.k(name, 0.0, dt)?);
                let lo = self.bin(name, Add, x, bias)?;
                let hi = self.bin(name, Sub, x, bias)?;
                let lam = self.k(name, l, dt)?;
                let above = self.bin(name, Lt, lam, x)?;
                let above = self.as_bool(&self.fresh(name), above)?;
                let upper = self.tmp(name, Op::Where, vec![above, hi, zero])?;
                self.pick_below(name, x, -l, lo, upper)?
            }
            // x · tanh(softplus(x)); Swish: x · sigmoid(alpha·x).
            "Mish" => {
                let sp = self.un(name, UnaryOp::Softplus, x)?;
                let t = self.un(name, UnaryOp::Tanh, sp)?;
                self.bin(name, Mul, x, t)?
            }
            // x·σ(alpha·x); SwiGLU (opset 28): that of A, times B (same shape, no broadcast).
            "Swish" | "SwiGLU" => {
                let a = self.k(name, at.float("alpha", 1.0), dt)?;
                let ax = self.bin(name, Mul, x, a)?;
                let s = self.un(name, UnaryOp::Sigmoid, ax)?;
                let sw = self.bin(name, Mul, x, s)?;
                if op == "Swish" {
                    sw
                } else {
                    let b = self.node(&cx.iname(1), &cx.inp(1)?)?;
                    if self.shape(&Val::Node(b)) != self.shape(&Val::Node(x)) {
                        return Err(Fail::Invalid(format!("SwiGLU of shapes {:?} and {:?} (equal, no broadcast)", self.shape(&Val::Node(x)), self.shape(&Val::Node(b)))));
                    }
                    self.bin(name, Mul, sw, b)?
                }
            }
            // |x| = inf, for the signs asked for (a bool).
            "IsInf" => {
                let (neg, pos) = (at.int("detect_negative", 1) != 0, at.int("detect_positive", 1) != 0);
                let inf = |me: &mut Self, v: f32| -> R<ValueId> {
                    let c = me.k(name, v, dt)?;
                    me.bin(name, Eq, x, c)
                };
                let hit = match (neg, pos) {
                    (true, true) => {
                        let a = self.un(name, UnaryOp::Abs, x)?;
                        let c = self.k(name, f32::INFINITY, dt)?;
                        self.bin(name, Eq, a, c)?
                    }
                    (true, false) => inf(self, f32::NEG_INFINITY)?,
                    (false, true) => inf(self, f32::INFINITY)?,
                    // Never true (x < x is false, NaN included).
                    (false, false) => self.bin(name, Lt, x, x)?,
                };
                self.tmp(name, Op::Cast { to: DType::I64 }, vec![hit])?
            }
            // The elementwise mean of its (broadcast) inputs.
            "Mean" => {
                let mut acc = x;
                let mut count = 1;
                for (k, v) in ins.iter().enumerate().skip(1) {
                    let Some(v) = v else { continue };
                    let y = self.node(&cx.iname(k), v)?;
                    acc = self.bin(name, Add, acc, y)?;
                    count += 1;
                }
                if !self.dtype(&Val::Node(acc)).is_float() {
                    return unsup("Mean of integers");
                }
                let c = self.k(name, count as f32, self.dtype(&Val::Node(acc)))?;
                self.bin(name, Div, acc, c)?
            }
            _ => return Err(Fail::Invalid(format!("{op} is not an activation"))),
        };
        // The last op carries the node's name.
        one(self.push(name, Op::Cast { to: self.dtype(&Val::Node(y)) }, vec![y])?)
    }

    /// `x < t ? below : otherwise`, elementwise.
    fn pick_below(&mut self, name: &str, x: ValueId, t: f32, below: ValueId, otherwise: ValueId) -> R<ValueId> {
        let dt = self.dtype(&Val::Node(x));
        let t = self.k(name, t, dt)?;
        let c = self.bin(name, BinaryOp::Lt, x, t)?;
        let c = self.as_bool(&self.fresh(name), c)?;
        self.tmp(name, Op::Where, vec![c, below, otherwise])
    }
}
