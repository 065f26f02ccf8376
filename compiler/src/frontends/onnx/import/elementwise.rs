//! Elementwise ops: arithmetic (the broadcasting binaries, Pow, Mod), the unary functions, Clip, Sign,
//! casts, Where, and the comparisons and logic ops (ONNX bools held as i64 0/1).

use kiln_runtime::graph::{BinaryOp, Op, UnaryOp, ValueId};
use kiln_runtime::DType;

use super::super::tensor::{Elem, Lit};
use super::{like_code, one, unsup, Fail, Importer, NodeCx, Val, R};

/// The ops this file imports.
pub(super) const OPS: &[&str] = &[
    "Identity", "Dropout", "Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Pow", "Sqrt",
    "Reciprocal", "Neg", "Abs", "Exp", "Erf", "Tanh", "Sigmoid", "Relu", "Gelu", "Log", "Softplus",
    "Floor", "Ceil", "Round", "Sin", "Cos", "Atan", "Mod", "BitShift", "Clip", "Sign", "CastLike", "Cast", "Where", "Equal", "Greater",
    "GreaterOrEqual", "Less", "LessOrEqual", "And", "Or", "Xor", "Not", "IsNaN",
];

impl Importer<'_> {
    /// A node of one of [`OPS`] with a graph-computed input, as kiln ops. Returns its outputs.
    pub(super) fn import_elementwise(&mut self, cx: &NodeCx) -> R<Vec<ValueId>> {
        let NodeCx { op, name, n, ins, at, opset, .. } = *cx;
        match op {
            "Identity" | "Dropout" => {
                if op == "Dropout" && ins.get(2).cloned().flatten().is_some() {
                    let training = cx.lit_of(2, "Dropout's training_mode")?;
                    if training.ints().first().is_some_and(|&t| t != 0) {
                        return unsup("Dropout in training mode (kiln runs inference)");
                    }
                }
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                if op == "Dropout" && n.output.get(1).is_some_and(|o| !o.is_empty() && self.m.is_used(o)) {
                    // The mask of inference-mode dropout: every element kept.
                    let s = self.shape(&Val::Node(x));
                    let ones = Val::Lit(Lit::of(Elem::Bool, s.clone(), vec![1.0; s.iter().product()]));
                    let mask = self.node(&n.output[1], &ones)?;
                    return Ok(vec![x, mask]);
                }
                one(x)
            }
            "Add" | "Sub" | "Mul" | "Div" | "Max" | "Min" | "Sum" => {
                let b = match op {
                    "Add" | "Sum" => BinaryOp::Add,
                    "Sub" => BinaryOp::Sub,
                    "Mul" => BinaryOp::Mul,
                    "Div" => BinaryOp::Div,
                    "Max" => BinaryOp::Max,
                    _ => BinaryOp::Min,
                };
                let vals: Vec<(Val, String)> = ins.iter().enumerate().filter_map(|(k, v)| v.clone().map(|v| (v, cx.iname(k)))).collect();
                if vals.is_empty() {
                    return Err(Fail::Invalid("no inputs".into()));
                }
                // Max, Min and Sum take any number of inputs; the arithmetic ops two.
                if matches!(op, "Add" | "Sub" | "Mul" | "Div") && (ins.len() != 2 || vals.len() != 2) {
                    return Err(Fail::Invalid(format!("{op} of {} inputs (takes 2)", ins.len())));
                }
                let mut acc = self.node(&vals[0].1, &vals[0].0)?;
                for (k, (v, vn)) in vals.iter().enumerate().skip(1) {
                    let y = self.node(vn, v)?;
                    let nm = if k + 1 == vals.len() { name.to_string() } else { self.fresh(name) };
                    acc = self.push(&nm, Op::Binary(b), vec![acc, y])?;
                }
                one(acc)
            }
            "Pow" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let e = match ins.get(1).cloned().flatten() {
                    Some(Val::Lit(l)) if l.numel() == 1 => l,
                    Some(v) => {
                        let y = self.node(&cx.iname(1), &v)?;
                        return one(self.pow_general(name, x, y)?);
                    }
                    None => return Err(Fail::Invalid("a Pow exponent is missing".into())),
                };
                let p = e.floats()[0];
                let dt = self.dtype(&Val::Node(x));
                match p {
                    1.0 => one(x),
                    2.0 => one(self.push(name, Op::Binary(BinaryOp::Mul), vec![x, x])?),
                    3.0 => {
                        let t = self.fresh(name);
                        let sq = self.push(&t, Op::Binary(BinaryOp::Mul), vec![x, x])?;
                        one(self.push(name, Op::Binary(BinaryOp::Mul), vec![sq, x])?)
                    }
                    0.5 => one(self.push(name, Op::Unary(UnaryOp::Sqrt), vec![x])?),
                    -0.5 => one(self.push(name, Op::Unary(UnaryOp::Rsqrt), vec![x])?),
                    -1.0 => one(self.push(name, Op::Unary(UnaryOp::Recip), vec![x])?),
                    0.0 => {
                        // x^0 = 1, NaN included.
                        let shape = self.shape(&Val::Node(x));
                        let n1 = shape.iter().product();
                        let ones = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, shape, vec![1.0; n1])))?;
                        one(if dt == DType::F32 { ones } else { self.push(name, Op::Cast { to: dt }, vec![ones])? })
                    }
                    // Integers: the general form, rounded to the exact integer power.
                    _ if !dt.is_float() => {
                        let y = self.node(&cx.iname(1), &Val::Lit(e.clone()))?;
                        one(self.pow_general(name, x, y)?)
                    }
                    // exp(p·log|x|), negated where x < 0 and p is an odd integer; a fractional
                    // power of x < 0 is NaN (log of a negative number).
                    _ => {
                        let int = p.fract() == 0.0;
                        let base = if int { self.tmp(name, Op::Unary(UnaryOp::Abs), vec![x])? } else { x };
                        let l = self.tmp(name, Op::Unary(UnaryOp::Log), vec![base])?;
                        let c = self.scalar(&self.fresh(name), p as f32, dt)?;
                        let pl = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![l, c])?;
                        let odd = int && (p % 2.0).abs() == 1.0;
                        if !odd {
                            return one(self.push(name, Op::Unary(UnaryOp::Exp), vec![pl])?);
                        }
                        let y = self.tmp(name, Op::Unary(UnaryOp::Exp), vec![pl])?;
                        let ny = self.tmp(name, Op::Unary(UnaryOp::Neg), vec![y])?;
                        let z = self.scalar(&self.fresh(name), 0.0, dt)?;
                        let neg = self.tmp(name, Op::Binary(BinaryOp::Lt), vec![x, z])?;
                        let neg = self.as_bool(&self.fresh(name), neg)?;
                        one(self.push(name, Op::Where, vec![neg, ny, y])?)
                    }
                }
            }
            "Sqrt" | "Reciprocal" | "Neg" | "Abs" | "Exp" | "Erf" | "Tanh" | "Sigmoid" | "Relu" | "Gelu" | "Log" | "Softplus" | "Floor" | "Ceil"
            | "Round" | "Sin" | "Cos" | "Atan" => {
                let u = match op {
                    "Sin" => UnaryOp::Sin,
                    "Atan" => UnaryOp::Atan,
                    "Cos" => UnaryOp::Cos,
                    "Log" => UnaryOp::Log,
                    "Softplus" => UnaryOp::Softplus,
                    "Floor" => UnaryOp::Floor,
                    "Ceil" => UnaryOp::Ceil,
                    "Round" => UnaryOp::Round,
                    "Sqrt" => UnaryOp::Sqrt,
                    "Reciprocal" => UnaryOp::Recip,
                    "Neg" => UnaryOp::Neg,
                    "Abs" => UnaryOp::Abs,
                    "Exp" => UnaryOp::Exp,
                    "Erf" => UnaryOp::Erf,
                    "Tanh" => UnaryOp::Tanh,
                    "Sigmoid" => UnaryOp::Sigmoid,
                    "Relu" => UnaryOp::Relu,
                    _ => match at.string("approximate").as_deref() {
                        None | Some("none") => UnaryOp::Gelu,
                        Some("tanh") => UnaryOp::GeluTanh,
                        Some(a) => return unsup(format!("Gelu approximate=`{a}`")),
                    },
                };
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                if !self.dtype(&Val::Node(x)).is_float() {
                    return match u {
                        UnaryOp::Neg => {
                            let z = self.scalar(name, 0.0, self.dtype(&Val::Node(x)))?;
                            one(self.push(name, Op::Binary(BinaryOp::Sub), vec![z, x])?)
                        }
                        _ => unsup(format!("{op} of integers")),
                    };
                }
                one(self.push(name, Op::Unary(u), vec![x])?)
            }
            "Clip" => {
                let mut x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let dt = self.dtype(&Val::Node(x));
                let (lo, hi) = if opset >= 11 {
                    (ins.get(1).cloned().flatten(), ins.get(2).cloned().flatten())
                } else {
                    let lo = at.has("min").then(|| Val::Lit(Lit::of(Elem::F32, vec![], vec![at.float("min", 0.0) as f64])));
                    let hi = at.has("max").then(|| Val::Lit(Lit::of(Elem::F32, vec![], vec![at.float("max", 0.0) as f64])));
                    (lo, hi)
                };
                for (b, v) in [(BinaryOp::Max, lo), (BinaryOp::Min, hi)] {
                    if let Some(v) = v {
                        let c = self.node(&self.fresh(name), &v)?;
                        let c = self.cast_to(name, c, dt)?;
                        x = self.tmp(name, Op::Binary(b), vec![x, c])?;
                    }
                }
                one(x)
            }
            // (0 < x) - (x < 0), NaN kept (DeBERTa's relative positions use it; those fold).
            // a - trunc(a / b)·b: C's fmod (fmod = 1, the dividend's sign; a itself where b is
            // infinite); with fmod = 0 moved to the divisor's sign, as Python's `%` (integers;
            // floats too from opset 28). Integer division truncates toward zero; the float
            // quotient is rounded to f32 before trunc, so a quotient past 2^24 is not exact
            // (the folded form, lit.rs, is).
            "Mod" => {
                let (a, b) = (self.node(&cx.iname(0), &cx.inp(0)?)?, self.node(&cx.iname(1), &cx.inp(1)?)?);
                let dt = self.dtype(&Val::Node(a));
                let fmod = at.int("fmod", 0) != 0;
                if dt.is_float() && !fmod && opset < 28 {
                    return Err(Fail::Invalid("Mod of floats needs fmod = 1 (before opset 28)".into()));
                }
                let mut q = self.bin(name, BinaryOp::Div, a, b)?;
                if dt.is_float() {
                    let z = self.scalar(&self.fresh(name), 0.0, dt)?;
                    let neg = self.bin(name, BinaryOp::Lt, q, z)?;
                    let neg = self.as_bool(&self.fresh(name), neg)?;
                    let (up, down) = (self.tmp(name, Op::Unary(UnaryOp::Ceil), vec![q])?, self.tmp(name, Op::Unary(UnaryOp::Floor), vec![q])?);
                    q = self.tmp(name, Op::Where, vec![neg, up, down])?;
                }
                let qb = self.bin(name, BinaryOp::Mul, q, b)?;
                let mut m = self.bin(name, BinaryOp::Sub, a, qb)?;
                if dt.is_float() {
                    let ab = self.tmp(name, Op::Unary(UnaryOp::Abs), vec![b])?;
                    let inf = self.scalar(&self.fresh(name), f32::INFINITY, dt)?;
                    let binf = self.bin(name, BinaryOp::Eq, ab, inf)?;
                    let binf = self.as_bool(&self.fresh(name), binf)?;
                    m = self.tmp(name, Op::Where, vec![binf, a, m])?;
                }
                if fmod {
                    return one(self.push(name, Op::Cast { to: dt }, vec![m])?);
                }
                let z = self.scalar(&self.fresh(name), 0.0, dt)?;
                let (mneg, bneg) = (self.bin(name, BinaryOp::Lt, m, z)?, self.bin(name, BinaryOp::Lt, b, z)?);
                let differ = self.bin(name, BinaryOp::Ne, mneg, bneg)?;
                let nonzero = self.bin(name, BinaryOp::Ne, m, z)?;
                let fix = self.bin(name, BinaryOp::Mul, differ, nonzero)?;
                let fix = self.as_bool(&self.fresh(name), fix)?;
                let up = self.bin(name, BinaryOp::Add, m, b)?;
                one(self.push(name, Op::Where, vec![fix, up, m])?)
            }
            // Integer shifts as arithmetic on the values (kiln holds integers as i64): left,
            // x·2^y wrapped to the type's width; right, floor(x / 2^y) (arithmetic for signed
            // types). A shift that is negative or not below the width gives -1 for a right
            // shift of a negative x, else 0 (ONNX, opset 28). 2^y is built from y's six low
            // bits (no float pow). 64-bit results that overflow are not wrapped, and results
            // past 2^24 are exact only where a backend computes integers in i64 (the reference;
            // the CPU backend computes them in f32).
            "BitShift" => {
                let elem = self.elem_at(n, ins, 0).ok_or_else(|| Fail::Unsupported("BitShift of a value whose integer type is not known at import".into()))?;
                let (bits, signed) = match elem {
                    Elem::U8 => (8, false),
                    Elem::U16 => (16, false),
                    Elem::U32 => (32, false),
                    Elem::U64 => (64, false),
                    Elem::I8 => (8, true),
                    Elem::I16 => (16, true),
                    Elem::I32 => (32, true),
                    Elem::I64 => (64, true),
                    e => return unsup(format!("BitShift of {e:?}")),
                };
                let left = match at.string("direction").as_deref() {
                    Some("LEFT") => true,
                    Some("RIGHT") => false,
                    d => return Err(Fail::Invalid(format!("BitShift direction {d:?}"))),
                };
                let (x, y) = (self.node(&cx.iname(0), &cx.inp(0)?)?, self.node(&cx.iname(1), &cx.inp(1)?)?);
                let (x, y) = (self.cast_to(name, x, DType::I64)?, self.cast_to(name, y, DType::I64)?);
                let k = |me: &mut Self, v: f64| me.k(name, v as f32, DType::I64);
                let (zero, one, two, width) = (k(self, 0.0)?, k(self, 1.0)?, k(self, 2.0)?, k(self, bits as f64)?);
                // Valid shifts: 0 <= y < bits; the others use y = 0 and are replaced at the end.
                let neg = self.bin(name, BinaryOp::Lt, y, zero)?;
                let wide = self.bin(name, BinaryOp::Le, width, y)?;
                let bad = self.bin(name, BinaryOp::Max, neg, wide)?;
                let bad = self.as_bool(&self.fresh(name), bad)?;
                let ys = self.tmp(name, Op::Where, vec![bad, zero, y])?;
                // p = 2^ys = Π over bit j of ys of (bit ? 2^(2^j) : 1).
                let mut p = one;
                let mut rest = ys;
                for j in 0..6 {
                    let half = self.bin(name, BinaryOp::Div, rest, two)?;
                    let twice = self.bin(name, BinaryOp::Mul, half, two)?;
                    let bit = self.bin(name, BinaryOp::Sub, rest, twice)?;
                    let bit = self.as_bool(&self.fresh(name), bit)?;
                    let f = k(self, 2f64.powi(1 << j))?;
                    let factor = self.tmp(name, Op::Where, vec![bit, f, one])?;
                    p = self.bin(name, BinaryOp::Mul, p, factor)?;
                    rest = half;
                }
                let r = if left {
                    let r = self.bin(name, BinaryOp::Mul, x, p)?;
                    if bits == 64 {
                        r
                    } else {
                        // Wrap to the width: ((r + off) mod 2^bits) - off, off = 2^(bits-1) for
                        // signed types (two's complement), 0 for unsigned; the mod is floored
                        // (a negative remainder moves up by 2^bits).
                        let (m, off) = (k(self, 2f64.powi(bits))?, k(self, if signed { 2f64.powi(bits - 1) } else { 0.0 })?);
                        let t = self.bin(name, BinaryOp::Add, r, off)?;
                        let q = self.bin(name, BinaryOp::Div, t, m)?;
                        let qm = self.bin(name, BinaryOp::Mul, q, m)?;
                        let rem = self.bin(name, BinaryOp::Sub, t, qm)?;
                        let below = self.bin(name, BinaryOp::Lt, rem, zero)?;
                        let below = self.as_bool(&self.fresh(name), below)?;
                        let up = self.bin(name, BinaryOp::Add, rem, m)?;
                        let rem = self.tmp(name, Op::Where, vec![below, up, rem])?;
                        let wrapped = self.bin(name, BinaryOp::Sub, rem, off)?;
                        // Values in range are kept as they are: the wrap's large intermediates
                        // are exact in i64 but not where a backend computes integers in f32.
                        let lo = k(self, if signed { -(2f64.powi(bits - 1)) } else { 0.0 })?;
                        let hi = k(self, if signed { 2f64.powi(bits - 1) } else { 2f64.powi(bits) })?;
                        let under = self.bin(name, BinaryOp::Lt, r, lo)?;
                        let over = self.bin(name, BinaryOp::Le, hi, r)?;
                        let out = self.bin(name, BinaryOp::Max, under, over)?;
                        let out = self.as_bool(&self.fresh(name), out)?;
                        self.tmp(name, Op::Where, vec![out, wrapped, r])?
                    }
                } else {
                    // floor(x / p): the truncated quotient, one less where the remainder is
                    // negative.
                    let q = self.bin(name, BinaryOp::Div, x, p)?;
                    let qp = self.bin(name, BinaryOp::Mul, q, p)?;
                    let rem = self.bin(name, BinaryOp::Sub, x, qp)?;
                    let down = self.bin(name, BinaryOp::Lt, rem, zero)?;
                    self.bin(name, BinaryOp::Sub, q, down)?
                };
                let fill = if left {
                    zero
                } else {
                    // -1 for a negative x, else 0.
                    let xneg = self.bin(name, BinaryOp::Lt, x, zero)?;
                    self.bin(name, BinaryOp::Sub, zero, xneg)?
                };
                let out = self.tmp(name, Op::Where, vec![bad, fill, r])?;
                super::one(self.push(name, Op::Cast { to: DType::I64 }, vec![out])?)
            }
            "Sign" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let dt = self.dtype(&Val::Node(x));
                let z = self.scalar(&self.fresh(name), 0.0, dt)?;
                let pos = self.tmp(name, Op::Binary(BinaryOp::Lt), vec![z, x])?;
                let neg = self.tmp(name, Op::Binary(BinaryOp::Lt), vec![x, z])?;
                let s = self.tmp(name, Op::Binary(BinaryOp::Sub), vec![pos, neg])?;
                if !dt.is_float() {
                    return one(s);
                }
                let nan = self.tmp(name, Op::Binary(BinaryOp::Ne), vec![x, x])?;
                let nan = self.as_bool(&self.fresh(name), nan)?;
                one(self.push(name, Op::Where, vec![nan, x, s])?)
            }
            "CastLike" | "Cast" => {
                let code = if op == "CastLike" { like_code(&cx.inp(1)?, self) } else { at.int("to", 1) as i32 };
                let to = Elem::from_code(code).ok_or_else(|| Fail::Unsupported(format!("Cast to {}", Elem::name_of(code))))?;
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                if to == Elem::Bool {
                    let z = self.scalar(name, 0.0, self.dtype(&Val::Node(x)))?;
                    let r = self.tmp(name, Op::Binary(BinaryOp::Ne), vec![x, z])?;
                    return one(self.as_bool(name, r)?);
                }
                if self.dtype(&Val::Node(x)) == to.dtype() {
                    return one(x);
                }
                one(self.push(name, Op::Cast { to: to.dtype() }, vec![x])?)
            }
            "Where" => {
                let (c, a, b) = (self.node(&cx.iname(0), &cx.inp(0)?)?, self.node(&cx.iname(1), &cx.inp(1)?)?, self.node(&cx.iname(2), &cx.inp(2)?)?);
                one(self.push(name, Op::Where, vec![c, a, b])?)
            }
            "Equal" | "Greater" | "GreaterOrEqual" | "Less" | "LessOrEqual" | "And" | "Or" | "Xor" => {
                let (mut a, mut b) = (self.node(&cx.iname(0), &cx.inp(0)?)?, self.node(&cx.iname(1), &cx.inp(1)?)?);
                let (da, db) = (self.dtype(&Val::Node(a)), self.dtype(&Val::Node(b)));
                if da != db {
                    // Literals come in as f32 constants: meet the run-time operand's type.
                    if matches!(cx.inp(0)?, Val::Lit(_)) {
                        a = self.tmp(name, Op::Cast { to: db }, vec![a])?;
                    } else {
                        b = self.tmp(name, Op::Cast { to: da }, vec![b])?;
                    }
                }
                let (k, x, y) = match op {
                    "Equal" => (BinaryOp::Eq, a, b),
                    "Less" => (BinaryOp::Lt, a, b),
                    "LessOrEqual" => (BinaryOp::Le, a, b),
                    "Greater" => (BinaryOp::Lt, b, a),
                    "GreaterOrEqual" => (BinaryOp::Le, b, a),
                    // bools are 0/1: and = a·b, or = max, xor = a ≠ b.
                    "And" => (BinaryOp::Mul, a, b),
                    "Or" => (BinaryOp::Max, a, b),
                    _ => (BinaryOp::Ne, a, b),
                };
                let r = self.tmp(name, Op::Binary(k), vec![x, y])?;
                one(self.as_bool(name, r)?)
            }
            "Not" | "IsNaN" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let r = if op == "Not" {
                    let z = self.scalar(name, 0.0, self.dtype(&Val::Node(x)))?;
                    self.tmp(name, Op::Binary(BinaryOp::Eq), vec![x, z])?
                } else {
                    self.tmp(name, Op::Binary(BinaryOp::Ne), vec![x, x])?
                };
                one(self.as_bool(name, r)?)
            }
            _ => unsup(format!("op `{op}` is not supported")),
        }
    }

    /// `x^y` for an exponent known only at run time, in f32: `exp(y·log|x|)`, negated where
    /// x < 0 and y is an odd integer, NaN where x < 0 and y is not an integer, 1 where y = 0
    /// (as C's `pow`). Integer and fractional parts come from casts to i64 (truncation).
    fn pow_general(&mut self, name: &str, x: ValueId, y: ValueId) -> R<ValueId> {
        let dx = self.dtype(&Val::Node(x));
        let (xf, yf) = (self.cast_to(name, x, DType::F32)?, self.cast_to(name, y, DType::F32)?);
        let bin = |s: &mut Self, op: BinaryOp, a: ValueId, b: ValueId| s.tmp(name, Op::Binary(op), vec![a, b]);
        let un = |s: &mut Self, op: UnaryOp, a: ValueId| s.tmp(name, Op::Unary(op), vec![a]);
        let cast = |s: &mut Self, to: DType, a: ValueId| s.tmp(name, Op::Cast { to }, vec![a]);
        let a = un(self, UnaryOp::Abs, xf)?;
        let l = un(self, UnaryOp::Log, a)?;
        let pl = bin(self, BinaryOp::Mul, yf, l)?;
        let r = un(self, UnaryOp::Exp, pl)?;
        let zero = self.scalar(&self.fresh(name), 0.0, DType::F32)?;
        let two = self.scalar(&self.fresh(name), 2.0, DType::F32)?;
        let yi = cast(self, DType::I64, yf)?;
        let yt = cast(self, DType::F32, yi)?;
        let frac = bin(self, BinaryOp::Ne, yt, yf)?;
        let h = bin(self, BinaryOp::Div, yt, two)?;
        let hi = cast(self, DType::I64, h)?;
        let hf = cast(self, DType::F32, hi)?;
        let h2 = bin(self, BinaryOp::Mul, hf, two)?;
        let rem = bin(self, BinaryOp::Sub, yt, h2)?;
        let odd = bin(self, BinaryOp::Ne, rem, zero)?;
        let neg = bin(self, BinaryOp::Lt, xf, zero)?;
        let neg_odd = bin(self, BinaryOp::Mul, neg, odd)?;
        let neg_odd = self.as_bool(&self.fresh(name), neg_odd)?;
        let nr = un(self, UnaryOp::Neg, r)?;
        let r = self.tmp(name, Op::Where, vec![neg_odd, nr, r])?;
        let neg_frac = bin(self, BinaryOp::Mul, neg, frac)?;
        let neg_frac = self.as_bool(&self.fresh(name), neg_frac)?;
        let nan = self.scalar(&self.fresh(name), f32::NAN, DType::F32)?;
        let r = self.tmp(name, Op::Where, vec![neg_frac, nan, r])?;
        let y0 = bin(self, BinaryOp::Eq, yf, zero)?;
        let y0 = self.as_bool(&self.fresh(name), y0)?;
        let one = self.scalar(&self.fresh(name), 1.0, DType::F32)?;
        if dx == DType::F32 {
            return self.push(name, Op::Where, vec![y0, one, r]);
        }
        let r = self.tmp(name, Op::Where, vec![y0, one, r])?;
        // An integer power: exp(y·ln|x|) is a few ulps off the integer (4² = 15.999998), which
        // the cast would truncate; rounded first, it is exact.
        let r = un(self, UnaryOp::Round, r)?;
        self.push(name, Op::Cast { to: dx }, vec![r])
    }
}
