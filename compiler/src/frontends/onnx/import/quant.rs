//! Quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger,
//! QLinearMatMul, and the `com.microsoft` ops onnxruntime's quantizers and its session
//! optimizer write (MatMulIntegerToFloat, DynamicQuantizeMatMul, QGemm, QLinearAdd, QLinearMul,
//! QLinearSoftmax, QLinearGlobalAveragePool, and the weight-only MatMulNBits, MatMulBnb4 and
//! GatherBlockQuantized). ConvInteger and QLinearConv are in `conv.rs`.
//!
//! kiln has no 8- or 16-bit integer type: a quantized value is an integer held in f32 (exact
//! up to 2^24), so a QDQ pair on an activation is the elementwise chain
//! `(clamp(round(x / s) + z) - z) · s` and an integer matmul is an f32 GEMM of integers (exact
//! while its sums stay below 2^24, as MiniLM's do; past that the f32 rounding is far below the
//! quantization step). Like onnxruntime, the requantization multiplier of a QLinear op is
//! `a_scale · b_scale / y_scale` rounded to f32 first, and QLinearAdd/QLinearMul follow its x86
//! kernels' order of f32 operations. Known operands (weights) fold at import (`lit.rs`).
//! QLinearSoftmax, which onnxruntime computes with an exp table, is computed with kiln's exp:
//! it may differ by one quantization step where a value lands on a rounding tie.
//!
//! The f64 reference backend rounds what ONNX defines as f32 values (a QuantizeLinear's input
//! and scale, a DequantizeLinear's output, each step of a requantization) to f32 through
//! explicit casts, which `simplify` removes for the f32 backends: a discontinuous op (round)
//! must see the f32 value, or an f64 quotient landing on a tie rounds the other way.

use kiln_runtime::graph::{BinaryOp, Op, ReduceOp, UnaryOp, ValueId};
use kiln_runtime::DType;

use super::super::shape;
use super::super::tensor::{Elem, Lit, LitData};
use super::{given, one, unsup, Attrs, Fail, Importer, NodeCx, NodeProto, Val, R};

/// The default-domain ops this file imports.
pub(super) const OPS: &[&str] = &["DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "QLinearMatMul", "QuantizeLinear"];

/// The `com.microsoft` ops this file imports.
pub(super) const CONTRIB_OPS: &[&str] = &[
    "DynamicQuantizeMatMul", "GatherBlockQuantized", "MatMulBnb4", "MatMulIntegerToFloat", "MatMulNBits", "QGemm", "QLinearAdd", "QLinearGlobalAveragePool",
    "QLinearMul", "QLinearSoftmax",
];

/// The saturation bounds of a node's quantized output type: its zero point's type `zero`
/// where there is one, else `output_dtype` (QuantizeLinear, opset 21 on), else uint8 (ONNX's
/// default).
pub(super) fn out_range(zero: Option<Elem>, at: &Attrs) -> R<(f32, f32)> {
    let by_attr = match at.int("output_dtype", 0) {
        0 => None,
        c => Some(Elem::from_code(c as i32).ok_or_else(|| Fail::Unsupported(format!("quantized type {}", Elem::name_of(c as i32))))?),
    };
    let e = match (zero, by_attr) {
        (Some(z), Some(a)) if z != a => return Err(Fail::Invalid(format!("output_dtype {a:?} but a zero point of type {z:?}"))),
        (Some(z), _) => z,
        (None, Some(a)) => a,
        (None, None) => Elem::U8,
    };
    e.q_range().ok_or_else(|| Fail::Unsupported(format!("quantization to {e:?}")))
}

/// MatMulNBits' B dequantized: the f32 [K, N] weight (see the op's arm).
#[allow(clippy::too_many_arguments)]
fn nbits_weight(b: &Lit, scales: &Lit, zeros: Option<&Lit>, g_idx: Option<&Lit>, k: i64, n: i64, bits: i64, block: i64) -> Result<Lit, String> {
    if !(1..=8).contains(&bits) || block < 2 || k < 1 || n < 1 {
        return Err(format!("MatMulNBits with K = {k}, N = {n}, bits = {bits}, block_size = {block}"));
    }
    let (k, n, bits, block) = (k as usize, n as usize, bits as usize, block as usize);
    // Every size is checked against the data before anything is allocated: products that
    // overflow match nothing.
    let blocks = k.div_ceil(block);
    let blob = block.checked_mul(bits).ok_or("MatMulNBits block_size")?.div_ceil(8);
    let (n_blocks, packed_zero_row) = (n.checked_mul(blocks), blocks.checked_mul(bits).map(|v| v.div_ceil(8)));
    if n_blocks.and_then(|v| v.checked_mul(blob)) != Some(b.numel()) || !matches!(b.elem, Elem::U8 | Elem::I8) {
        return Err(format!("MatMulNBits B of {:?} {:?} for N = {n}, {blocks} blocks of {blob} bytes", b.elem, b.shape));
    }
    if n_blocks != Some(scales.numel()) {
        return Err(format!("MatMulNBits scales of shape {:?} for N = {n} and {blocks} blocks", scales.shape));
    }
    let packed_zero_row = packed_zero_row.unwrap_or(0);
    let zero_floats = zeros.is_some_and(|z| z.elem.is_float());
    if let Some(z) = zeros {
        let want = if zero_floats { n * blocks } else { n * packed_zero_row };
        if z.numel() != want {
            return Err(format!("MatMulNBits zero points of shape {:?} (want {want} values)", z.shape));
        }
    }
    let group: Vec<usize> = match g_idx {
        None => (0..k).map(|i| i / block).collect(),
        Some(g) => {
            let v = g.ints();
            if v.len() != k || v.iter().any(|&x| x < 0 || x as usize >= blocks) {
                return Err(format!("MatMulNBits g_idx of shape {:?} for K = {k} and {blocks} blocks", g.shape));
            }
            v.iter().map(|&x| x as usize).collect()
        }
    };
    // The `i`-th `bits`-wide value of a byte string, LSB first.
    let field = |bytes: &[i64], i: usize| -> f64 {
        let (bit, mask) = (i * bits, (1u32 << bits) - 1);
        let lo = bytes[bit / 8] as u32 & 0xff;
        let hi = bytes.get(bit / 8 + 1).map_or(0, |&x| x as u32 & 0xff);
        (((lo | hi << 8) >> (bit % 8)) & mask) as f64
    };
    let (bq, sc) = (b.ints(), scales.floats());
    let (zi, zf) = (zeros.map(|z| z.ints()).unwrap_or_default(), zeros.map(|z| z.floats()).unwrap_or_default());
    let default_zero = (1usize << (bits - 1)) as f64;
    let mut w = vec![0f64; k * n];
    for col in 0..n {
        let row = &bq[col * blocks * blob..(col + 1) * blocks * blob];
        for (kk, &g) in group.iter().enumerate() {
            // The value sits in its position's block; `g_idx` only picks its scale and zero.
            let at = kk / block;
            let q = field(&row[at * blob..(at + 1) * blob], kk % block);
            let s = sc[col * blocks + g];
            let z = match zeros {
                None => default_zero,
                Some(_) if zero_floats => zf[col * blocks + g],
                Some(_) => field(&zi[col * packed_zero_row..(col + 1) * packed_zero_row], g),
            };
            w[kk * n + col] = ((q - z) as f32 * s as f32) as f64;
        }
    }
    let mut l = Lit::of(Elem::F32, vec![k, n], w);
    l.weight = true;
    Ok(l)
}

/// bitsandbytes' 4-bit codes (onnxruntime's `blockwise_quant_block_bnb4.h`): FP4 (quant_type
/// 0) and NF4 (1), each a value in [-1, 1] scaled by its block's absmax. Written as there: the
/// f32 each literal rounds to is the code's value.
#[allow(clippy::excessive_precision)]
const BNB4_FP4: [f32; 16] = [
    0.0, 5.208333333e-03, 0.66666667, 1.0, 0.33333333, 0.5, 0.16666667, 0.25, -0.0, -5.208333333e-03, -0.66666667, -1.0, -0.33333333, -0.5, -0.16666667,
    -0.25,
];
#[allow(clippy::excessive_precision)]
const BNB4_NF4: [f32; 16] = [
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023,
    1.0,
];

/// MatMulBnb4's B dequantized into the f32 [K, N] weight: B is Wᵀ ([N, K] row-major, flat)
/// in 4-bit codes, two to a byte with the first in the high nibble, one absmax per
/// `block_size` consecutive codes of that flat array.
fn bnb4_weight(b: &Lit, absmax: &Lit, k: i64, n: i64, block: i64, quant_type: i64) -> Result<Lit, String> {
    let table = match quant_type {
        0 => &BNB4_FP4,
        1 => &BNB4_NF4,
        q => return Err(format!("MatMulBnb4 quant_type {q} (0: FP4, 1: NF4)")),
    };
    if k < 1 || n < 1 || block < 1 {
        return Err(format!("MatMulBnb4 with K = {k}, N = {n}, block_size = {block}"));
    }
    let (k, n, block) = (k as usize, n as usize, block as usize);
    let numel = k.checked_mul(n).ok_or("MatMulBnb4 K·N")?;
    if b.numel() != numel.div_ceil(2) || !matches!(b.elem, Elem::U8 | Elem::I8) {
        return Err(format!("MatMulBnb4 B of {:?} {:?} for K = {k}, N = {n} (want {} bytes)", b.elem, b.shape, numel.div_ceil(2)));
    }
    if absmax.numel() != numel.div_ceil(block) {
        return Err(format!("MatMulBnb4 absmax of shape {:?} for {numel} values in blocks of {block}", absmax.shape));
    }
    let (bq, am) = (b.ints(), absmax.floats());
    let mut w = vec![0f64; numel];
    for i in 0..numel {
        let byte = bq[i / 2] as u8;
        let code = if i % 2 == 0 { byte >> 4 } else { byte & 0xf };
        // flat i is (column, k) of Wᵀ.
        w[(i % k) * n + i / k] = (table[code as usize] * am[i / block] as f32) as f64;
    }
    let mut l = Lit::of(Elem::F32, vec![k, n], w);
    l.weight = true;
    Ok(l)
}

/// GatherBlockQuantized's data dequantized into f32 at its logical shape (uint8 data holds
/// 8/bits values per byte along the last axis, the first in the low bits): `(q - zero)·scale`
/// with one scale (and zero point) per `block` values along `axis` (onnxruntime's
/// `gather_block_quantized.cc`; zero points default to 2^(bits-1) for uint8, 0 for int4/uint4).
fn block_dequantized(data: &Lit, scales: &Lit, zeros: Option<&Lit>, axis: usize, block: i64, bits: i64) -> Result<Lit, String> {
    let packed = data.elem == Elem::U8;
    let per_byte = if packed {
        match bits {
            2 | 4 | 8 => 8 / bits as usize,
            b => return Err(format!("GatherBlockQuantized with bits = {b} (uint8 data: 2, 4 or 8)")),
        }
    } else if matches!(data.elem, Elem::I4 | Elem::U4) && bits == 4 {
        1
    } else {
        return Err(format!("GatherBlockQuantized of {:?} data with bits = {bits}", data.elem));
    };
    let r = data.shape.len();
    if block < 1 || axis >= r || (packed && axis != r - 1) {
        return Err(format!("GatherBlockQuantized with block_size {block}, quantize_axis {axis} of a rank-{r} data"));
    }
    let block = block as usize;
    let mut shape = data.shape.clone();
    shape[r - 1] *= per_byte;
    let q_dim = shape[axis];
    let q_n: usize = shape[axis + 1..].iter().product();
    let blocks = q_dim.div_ceil(block);
    let mut want = shape.clone();
    want[axis] = blocks;
    if scales.shape != want {
        return Err(format!("GatherBlockQuantized scales of shape {:?} for data of logical shape {shape:?} (want {want:?})", scales.shape));
    }
    let row = blocks * q_n;
    if let Some(z) = zeros {
        let zn = if packed { scales.numel() / row * row.div_ceil(per_byte) } else { scales.numel() };
        if z.numel() != zn {
            return Err(format!("GatherBlockQuantized zero points of shape {:?} (want {zn} values)", z.shape));
        }
    }
    let (dq, sc) = (data.ints(), scales.floats());
    let zq = zeros.map(|z| z.ints()).unwrap_or_default();
    let mask = (1i64 << (8 / per_byte)) - 1;
    let sub = |bytes: &[i64], i: usize| if per_byte == 1 { bytes[i] } else { (bytes[i / per_byte] >> ((i % per_byte) * (8 / per_byte))) & mask };
    let numel: usize = shape.iter().product();
    let mut w = vec![0f64; numel];
    for (i, wi) in w.iter_mut().enumerate() {
        let (x, y, z) = (i / (q_dim * q_n), i % (q_dim * q_n) / q_n, i % q_n);
        let si = x * row + y / block * q_n + z;
        let zero = match zeros {
            None if packed => 1i64 << (8 / per_byte - 1),
            None => 0,
            Some(_) if packed => sub(&zq[si / row * row.div_ceil(per_byte)..], si % row),
            Some(_) => zq[si],
        };
        *wi = ((sub(&dq, i) - zero) as f32 * sc[si] as f32) as f64;
    }
    let mut l = Lit::of(Elem::F32, shape, w);
    l.weight = true;
    Ok(l)
}

impl Importer<'_> {
    /// The ONNX element type of the node's input `k`, where it is known: a literal's, or a
    /// graph input's declared type (kiln's own dtype of a computed value holds integers as
    /// i64 or f32, so it cannot tell int8 from uint8).
    pub(super) fn elem_at(&self, n: &NodeProto, ins: &[Option<Val>], k: usize) -> Option<Elem> {
        match ins.get(k)?.as_ref()? {
            Val::Lit(l) => Some(l.elem),
            Val::Node(_) => self.m.inputs.iter().find(|i| Some(&i.name) == n.input.get(k)).map(|i| i.elem),
        }
    }

    /// A node of one of [`OPS`] with a graph-computed input, as kiln ops. Returns its outputs.
    pub(super) fn import_quant(&mut self, cx: &NodeCx) -> R<Vec<ValueId>> {
        let NodeCx { op, name, n, ins, at, .. } = *cx;
        match op {
            // Dynamic (per-tensor) uint8 quantization, as onnxruntime's quantize_dynamic writes it.
            "DynamicQuantizeLinear" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let scale_name = n.output.get(1).map(String::as_str).filter(|o| !o.is_empty()).map(str::to_string);
                let (y, scale, zp) = self.dynamic_quantize(name, x, scale_name)?;
                Ok(vec![y, scale, zp])
            }
            "MatMulInteger" => {
                let a = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let a = self.centered(name, a, ins.get(2).cloned().flatten(), &cx.iname(2))?;
                let b = self.integer_rhs(cx.iname(1), cx.inp(1)?, ins.get(3).cloned().flatten(), cx.iname(3), name)?;
                one(self.integer_matmul(name, a, b)?)
            }
            "DequantizeLinear" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let xs = self.shape(&Val::Node(x));
                let axis = at.int("axis", 1);
                let block = at.int("block_size", 0);
                let scale = self.q_param(cx, 1, &xs, axis, block)?.ok_or_else(|| Fail::Invalid("DequantizeLinear without a scale".into()))?;
                let zero = self.q_param(cx, 2, &xs, axis, block)?;
                let xf = self.tmp(name, Op::Cast { to: DType::F32 }, vec![x])?;
                let y = self.dequantize(&self.fresh(name), xf, scale, zero)?;
                // An f32 tensor, rounded as such on the f64 reference too (see `requantize`).
                one(self.push(name, Op::Cast { to: DType::F32 }, vec![y])?)
            }
            "QuantizeLinear" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let xs = self.shape(&Val::Node(x));
                let range = out_range(self.elem_at(n, ins, 2), at)?;
                let axis = at.int("axis", 1);
                let block = at.int("block_size", 0);
                let scale = self.q_param(cx, 1, &xs, axis, block)?.ok_or_else(|| Fail::Invalid("QuantizeLinear without a scale".into()))?;
                let zero = self.q_param(cx, 2, &xs, axis, block)?;
                // The input and the scale as f32 holds them (see `requantize`).
                let xf = self.tmp(name, Op::Cast { to: DType::F32 }, vec![x])?;
                let scale = self.tmp(name, Op::Cast { to: DType::F32 }, vec![scale])?;
                let v = self.tmp(name, Op::Binary(BinaryOp::Div), vec![xf, scale])?;
                one(self.requantize(name, v, zero, range)?)
            }
            // (a - a_zero)·(b - b_zero) requantized by a_scale·b_scale / y_scale.
            "QLinearMatMul" => {
                let range = out_range(self.elem_at(n, ins, 7), at)?;
                let b = self.integer_rhs(cx.iname(3), cx.inp(3)?, ins.get(5).cloned().flatten(), cx.iname(5), name)?;
                let a = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let a = self.centered(name, a, ins.get(2).cloned().flatten(), &cx.iname(2))?;
                let acc = self.integer_matmul(&self.fresh(name), a, b)?;
                let (sa, sb) = (self.shape(&Val::Node(a)), self.shape(&Val::Node(b)));
                let a_scale = self.operand_scale(name, &cx.iname(1), cx.inp(1)?, &sa, true)?;
                let b_scale = self.operand_scale(name, &cx.iname(4), cx.inp(4)?, &sb, false)?;
                let ab = self.f32_op(name, BinaryOp::Mul, a_scale, b_scale)?;
                let ys = self.node(&cx.iname(6), &cx.inp(6)?)?;
                let ys = self.cast_to(name, ys, DType::F32)?;
                let mult = self.f32_op(name, BinaryOp::Div, ab, ys)?;
                let v = self.f32_op(name, BinaryOp::Mul, acc, mult)?;
                let zero = self.opt_f32(name, ins.get(7).cloned().flatten(), &cx.iname(7))?;
                one(self.requantize(name, v, zero, range)?)
            }
            _ => unsup(format!("op `{op}` is not supported")),
        }
    }

    /// A `com.microsoft` node of one of [`CONTRIB_OPS`]. Returns its outputs.
    pub(super) fn import_quant_contrib(&mut self, op: &str, name: &str, n: &NodeProto, ins: &[Option<Val>], at: &Attrs) -> R<Vec<ValueId>> {
        let inp = |k: usize| ins.get(k).cloned().flatten().ok_or_else(|| Fail::Invalid(format!("input {k} is missing")));
        let iname = |k: usize| n.input.get(k).cloned().unwrap_or_default();
        match op {
            // (A - a_zero)·(B - b_zero)·(a_scale·b_scale) + bias, in f32; DynamicQuantizeMatMul
            // quantizes its float A first, as DynamicQuantizeLinear does.
            "MatMulIntegerToFloat" | "DynamicQuantizeMatMul" => {
                let dynamic = op == "DynamicQuantizeMatMul";
                // Input positions: A, B, a_scale, b_scale, a_zero, b_zero, bias (MatMulIntegerToFloat);
                // A, B, b_scale, b_zero, bias (DynamicQuantizeMatMul).
                let (bz, bs, bias) = if dynamic { (3, 2, 4) } else { (5, 3, 6) };
                let b = self.integer_rhs(iname(1), inp(1)?, ins.get(bz).cloned().flatten(), iname(bz), name)?;
                let a = self.node(&iname(0), &inp(0)?)?;
                let (a, a_scale) = if dynamic {
                    let (q, s, z) = self.dynamic_quantize(name, a, None)?;
                    (self.tmp(name, Op::Binary(BinaryOp::Sub), vec![q, z])?, s)
                } else {
                    let a = self.centered(name, a, ins.get(4).cloned().flatten(), &iname(4))?;
                    let s = self.node(&iname(2), &inp(2)?)?;
                    if self.shape(&Val::Node(s)).iter().product::<usize>() != 1 {
                        return unsup("MatMulIntegerToFloat with a_scale of more than one value");
                    }
                    let s = self.cast_to(name, s, DType::F32)?;
                    let s = self.reshape(&self.fresh(name), s, &[])?;
                    (a, s)
                };
                let acc = self.integer_matmul(&self.fresh(name), a, b)?;
                let sb = self.shape(&Val::Node(b));
                let b_scale = self.operand_scale(name, &iname(bs), inp(bs)?, &sb, false)?;
                let mult = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![a_scale, b_scale])?;
                if !given(ins, bias) {
                    return one(self.push(name, Op::Binary(BinaryOp::Mul), vec![acc, mult])?);
                }
                let y = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![acc, mult])?;
                let bias = self.node(&iname(bias), &inp(bias)?)?;
                let bias = self.cast_to(name, bias, DType::F32)?;
                one(self.push(name, Op::Binary(BinaryOp::Add), vec![y, bias])?)
            }
            // Weight-only quantization (onnxruntime's MatMulNBits quantizer, Olive, the GenAI
            // builders): B's `bits`-wide integers packed LSB first, [N, blocks, blob], one scale
            // (and zero point, default 2^(bits-1)) per block of `block_size` along K, blocks
            // picked by `g_idx` where given. Dequantized into an f32 [K, N] weight at import;
            // the product is then kiln's f32 GEMM (onnxruntime's `accuracy_level` 4 quantizes
            // A to int8 as well, which kiln does not: its results are the more exact ones).
            // bitsandbytes' FP4/NF4 (onnxruntime's MatMulBnb4 quantizer; transformers.js
            // `*_bnb4.onnx` exports) likewise, through its 16-entry code table.
            "MatMulNBits" | "MatMulBnb4" => {
                let lit = |k: usize, what: &str| -> R<Option<Lit>> {
                    match ins.get(k).cloned().flatten() {
                        None => Ok(None),
                        Some(Val::Lit(l)) => Ok(Some(self.lit(&iname(k), &l)?)),
                        Some(Val::Node(_)) => unsup(format!("{op} {what} computed at run time")),
                    }
                };
                let b = lit(1, "weights")?.ok_or_else(|| Fail::Invalid(format!("{op} without B")))?;
                let scales = lit(2, "scales")?.ok_or_else(|| Fail::Invalid(format!("{op} without scales")))?;
                let (k, nn) = (at.int("K", 0), at.int("N", 0));
                let block = at.int("block_size", 0);
                let w = if op == "MatMulBnb4" {
                    bnb4_weight(&b, &scales, k, nn, block, at.int("quant_type", -1))
                } else {
                    let (zeros, g_idx) = (lit(3, "zero points")?, lit(4, "g_idx")?);
                    nbits_weight(&b, &scales, zeros.as_ref(), g_idx.as_ref(), k, nn, at.int("bits", 4), block)
                }
                .map_err(Fail::Invalid)?;
                let w = self.node(&format!("{}.dequant", iname(1)), &Val::Lit(w))?;
                let a = self.node(&iname(0), &inp(0)?)?;
                let dt = self.dtype(&Val::Node(a));
                let w = self.cast_to(name, w, dt)?;
                if self.shape(&Val::Node(a)).last() != Some(&(k as usize)) {
                    return Err(Fail::Invalid(format!("A of shape {:?} for K = {k}", self.shape(&Val::Node(a)))));
                }
                let bias = op == "MatMulNBits" && given(ins, 5);
                let mm = if bias { self.fresh(name) } else { name.to_string() };
                let y = self.push(&mm, Op::MatMul { transpose_a: false, transpose_b: false }, vec![a, w])?;
                if !bias {
                    return one(y);
                }
                let bv = self.node(&iname(5), &inp(5)?)?;
                let bv = self.cast_to(name, bv, dt)?;
                one(self.push(name, Op::Binary(BinaryOp::Add), vec![y, bv])?)
            }
            // onnxruntime's x86 kernels define these contrib ops (mlas qladd.cpp, qlmul.cpp),
            // and they are not Q(DQ(A) ∘ DQ(B)) to the bit: Add takes the ratios
            // rA = a_scale / c_scale, rB = b_scale / c_scale and rounds
            // (F + first·r) + second·r with F = c_zero - (rA·a_zero + rB·b_zero), a
            // one-element operand first; Mul rounds (a - a_zero)(b - b_zero)·(a_scale·b_scale /
            // c_scale) and adds c_zero. Every step is an f32 op, as there (`f32_op`): where a
            // value lands on a tie (a scale ratio of 127.5/127 is common) the f32 result is
            // the one that counts.
            "QLinearAdd" | "QLinearMul" => {
                let range = out_range(self.elem_at(n, ins, 7).or(self.elem_at(n, ins, 2)), &Attrs::new(&[]))?;
                let operand = |me: &mut Self, k: usize| -> R<(ValueId, ValueId, ValueId, usize)> {
                    let x = me.node(&iname(k), &inp(k)?)?;
                    let numel = me.shape(&Val::Node(x)).iter().product();
                    let x = me.cast_to(name, x, DType::F32)?;
                    let s = me.per_tensor(name, &iname(k + 1), inp(k + 1)?, op)?;
                    let z = me.zero_scalar(name, ins.get(k + 2).cloned().flatten(), &iname(k + 2), op)?;
                    Ok((x, s, z, numel))
                };
                let (a, a_s, a_z, a_n) = operand(self, 0)?;
                let (b, b_s, b_z, b_n) = operand(self, 3)?;
                let c_s = self.per_tensor(name, &iname(6), inp(6)?, op)?;
                let c_z = self.zero_scalar(name, ins.get(7).cloned().flatten(), &iname(7), op)?;
                use BinaryOp::{Add, Div, Mul, Sub};
                let v = if op == "QLinearAdd" {
                    let ra = self.f32_op(name, Div, a_s, c_s)?;
                    let rb = self.f32_op(name, Div, b_s, c_s)?;
                    let za = self.f32_op(name, Mul, ra, a_z)?;
                    let zb = self.f32_op(name, Mul, rb, b_z)?;
                    let zab = self.f32_op(name, Add, za, zb)?;
                    let fixed = self.f32_op(name, Sub, c_z, zab)?;
                    let ta = self.f32_op(name, Mul, a, ra)?;
                    let tb = self.f32_op(name, Mul, b, rb)?;
                    let (first, second) = if b_n == 1 && a_n != 1 { (tb, ta) } else { (ta, tb) };
                    let v = self.f32_op(name, Add, fixed, first)?;
                    self.f32_op(name, Add, v, second)?
                } else {
                    let ab = self.f32_op(name, Mul, a_s, b_s)?;
                    let ratio = self.f32_op(name, Div, ab, c_s)?;
                    let da = self.f32_op(name, Sub, a, a_z)?;
                    let db = self.f32_op(name, Sub, b, b_z)?;
                    let p = self.f32_op(name, Mul, da, db)?;
                    let v = self.f32_op(name, Mul, p, ratio)?;
                    let v = self.tmp(name, Op::Unary(UnaryOp::Round), vec![v])?;
                    self.f32_op(name, Add, v, c_z)?
                };
                // Round (again, a no-op after Mul's) and saturate.
                one(self.requantize(name, v, None, range)?)
            }
            // Q(Softmax(DQ(X))) along `axis`, with `opset`'s Softmax rule (before 13: the
            // input flattened to 2-D at the axis).
            // A table of block-quantized rows (the token embeddings of transformers.js q4 /
            // q4f16 exports; onnxruntime's MatMulNBits quantizer given Gather): dequantized at
            // import into an f32 weight, then an ordinary Gather along `gather_axis` (negative
            // ids wrap; an id out of range is a run-time error, where onnxruntime writes zeros).
            "GatherBlockQuantized" => {
                let known = |me: &Self, k: usize, what: &str| -> R<Option<Lit>> {
                    match ins.get(k).cloned().flatten() {
                        None => Ok(None),
                        Some(Val::Lit(l)) => Ok(Some(me.lit(&iname(k), &l)?)),
                        Some(Val::Node(_)) => unsup(format!("GatherBlockQuantized {what} computed at run time")),
                    }
                };
                let data = known(self, 0, "data")?.ok_or_else(|| Fail::Invalid("no data".into()))?;
                let scales = known(self, 2, "scales")?.ok_or_else(|| Fail::Invalid("no scales".into()))?;
                let zeros = known(self, 3, "zero points")?;
                let r = data.shape.len();
                let (qa, ga) = (shape::axis(at.int("quantize_axis", 1), r)?, shape::axis(at.int("gather_axis", 0), r)?);
                let w = block_dequantized(&data, &scales, zeros.as_ref(), qa, at.int("block_size", 128), at.int("bits", 4)).map_err(Fail::Invalid)?;
                let ws = w.shape.clone();
                let w = self.node(&format!("{}.dequant", iname(0)), &Val::Lit(w))?;
                let ids = self.node(&iname(1), &inp(1)?)?;
                let g = self.gather_axis(&self.fresh(name), w, &ws, ga, ids, true)?;
                one(self.cast_to(name, g, scales.elem.dtype())?)
            }
            // alpha·(A - a_zero)(B - b_zero) + C, C an int32 bias of scale a_scale·b_scale, times
            // a_scale·b_scale (b_scale per column where given so): requantized by y_scale where
            // there is one (onnxruntime's quantizer writes it for Gemm), f32 out otherwise.
            "QGemm" => {
                let (ta, tb) = (at.int("transA", 0) != 0, at.int("transB", 0) != 0);
                let a = self.node(&iname(0), &inp(0)?)?;
                let mut a = self.centered(name, a, ins.get(2).cloned().flatten(), &iname(2))?;
                let bs = self.shape(&inp(3)?);
                if bs.len() != 2 || self.shape(&Val::Node(a)).len() != 2 {
                    return Err(Fail::Invalid(format!("QGemm of A {:?} and B {bs:?} (matrices)", self.shape(&Val::Node(a)))));
                }
                if ta {
                    a = self.tmp(name, Op::Transpose { perm: vec![1, 0] }, vec![a])?;
                }
                let (bname, b) = match (tb, inp(3)?) {
                    (true, Val::Lit(l)) => {
                        let l = self.lit(&iname(3), &l)?;
                        (format!("{}.T", iname(3)), Val::Lit(super::super::lit::transpose(&l, &[1, 0]).map_err(Fail::Invalid)?))
                    }
                    (true, Val::Node(id)) => (iname(3), Val::Node(self.tmp(name, Op::Transpose { perm: vec![1, 0] }, vec![id])?)),
                    (false, v) => (iname(3), v),
                };
                let b = self.integer_rhs(bname, b, ins.get(5).cloned().flatten(), iname(5), name)?;
                let mut acc = self.integer_matmul(&self.fresh(name), a, b)?;
                if given(ins, 6) {
                    let c = self.node(&iname(6), &inp(6)?)?;
                    let c = self.cast_to(name, c, DType::F32)?;
                    acc = self.tmp(name, Op::Binary(BinaryOp::Add), vec![acc, c])?;
                }
                let (sa, sb) = (self.shape(&Val::Node(a)), self.shape(&Val::Node(b)));
                let a_scale = self.operand_scale(name, &iname(1), inp(1)?, &sa, true)?;
                let b_scale = self.operand_scale(name, &iname(4), inp(4)?, &sb, false)?;
                let mut ab = self.f32_op(name, BinaryOp::Mul, a_scale, b_scale)?;
                let alpha = at.float("alpha", 1.0);
                if alpha != 1.0 {
                    let k = self.scalar(&self.fresh(name), alpha, DType::F32)?;
                    ab = self.f32_op(name, BinaryOp::Mul, ab, k)?;
                }
                if !given(ins, 7) {
                    return one(self.push(name, Op::Binary(BinaryOp::Mul), vec![acc, ab])?);
                }
                let range = out_range(self.elem_at(n, ins, 8), &Attrs::new(&[]))?;
                let ys = self.per_tensor(name, &iname(7), inp(7)?, op)?;
                let mult = self.f32_op(name, BinaryOp::Div, ab, ys)?;
                let v = self.f32_op(name, BinaryOp::Mul, acc, mult)?;
                let zero = self.opt_f32(name, ins.get(8).cloned().flatten(), &iname(8))?;
                one(self.requantize(name, v, zero, range)?)
            }
            // Σ (x - x_zero) over the spatial dims, times (x_scale / y_scale) / N, requantized.
            "QLinearGlobalAveragePool" => {
                if at.int("channels_last", 0) != 0 {
                    return unsup("QLinearGlobalAveragePool with channels_last");
                }
                let range = out_range(self.elem_at(n, ins, 4).or(self.elem_at(n, ins, 0)), &Attrs::new(&[]))?;
                let x = self.node(&iname(0), &inp(0)?)?;
                let xsh = self.shape(&Val::Node(x));
                if xsh.len() < 3 {
                    return Err(Fail::Invalid(format!("QLinearGlobalAveragePool of shape {xsh:?}")));
                }
                let x = self.centered(name, x, ins.get(2).cloned().flatten(), &iname(2))?;
                let sum = self.tmp(name, Op::Reduce { op: ReduceOp::Sum, axes: (2..xsh.len()).collect(), keep_dims: true }, vec![x])?;
                let xs = self.per_tensor(name, &iname(1), inp(1)?, op)?;
                let ys = self.per_tensor(name, &iname(3), inp(3)?, op)?;
                let ratio = self.f32_op(name, BinaryOp::Div, xs, ys)?;
                let count = self.scalar(&self.fresh(name), xsh[2..].iter().product::<usize>() as f32, DType::F32)?;
                let mult = self.f32_op(name, BinaryOp::Div, ratio, count)?;
                let v = self.f32_op(name, BinaryOp::Mul, sum, mult)?;
                let zero = self.opt_f32(name, ins.get(4).cloned().flatten(), &iname(4))?;
                one(self.requantize(name, v, zero, range)?)
            }
            "QLinearSoftmax" => {
                let range = out_range(self.elem_at(n, ins, 4).or(self.elem_at(n, ins, 2)), &Attrs::new(&[]))?;
                let x = self.node(&iname(0), &inp(0)?)?;
                let x = self.cast_to(name, x, DType::F32)?;
                let xs = self.per_tensor(name, &iname(1), inp(1)?, op)?;
                let xz = self.opt_f32(name, ins.get(2).cloned().flatten(), &iname(2))?;
                let x = self.dequantize(&self.fresh(name), x, xs, xz)?;
                let opset = at.int("opset", 13);
                let p = self.softmax_at(&self.fresh(name), x, at.int("axis", if opset >= 13 { -1 } else { 1 }), opset)?;
                let ys = self.per_tensor(name, &iname(3), inp(3)?, op)?;
                let v = self.tmp(name, Op::Binary(BinaryOp::Div), vec![p, ys])?;
                let zero = self.opt_f32(name, ins.get(4).cloned().flatten(), &iname(4))?;
                one(self.requantize(name, v, zero, range)?)
            }
            _ => unsup(format!("op `{op}` of domain com.microsoft is not supported")),
        }
    }

    /// Dynamic (per-tensor) uint8 quantization of `x`: (y, scale, zero point), the integers
    /// held in f32, as ONNX defines it and onnxruntime computes it (`GetQuantizationParameter`,
    /// `MlasQuantizeLinear`): with lo = min(min x, 0) and hi = max(max x, 0),
    /// scale = (hi - lo) / 255 (1 where hi = lo: an all-zero input), zero = round(clamp(-lo /
    /// scale, 0, 255)) and y = clamp(round(x / scale) + zero, 0, 255), each round to nearest
    /// even. The zero point is added after rounding, to the integer: added to the f32
    /// quotient first it would round that sum, and a quotient within half an ulp of the sum
    /// below a tie (about three in 200 000 normal values) would land one step off.
    fn dynamic_quantize(&mut self, name: &str, x: ValueId, scale_name: Option<String>) -> R<(ValueId, ValueId, ValueId)> {
        if self.dtype(&Val::Node(x)) != DType::F32 {
            return unsup("dynamic quantization of a non-f32 input");
        }
        let zero = self.scalar(&self.fresh(name), 0.0, DType::F32)?;
        let hi = self.tensor_max(name, x)?;
        let nx = self.tmp(name, Op::Unary(UnaryOp::Neg), vec![x])?;
        let nlo = self.tensor_max(name, nx)?;
        let hi = self.bin(name, BinaryOp::Max, hi, zero)?;
        let nlo = self.bin(name, BinaryOp::Max, nlo, zero)?; // -min(min x, 0)
        // Every step an f32 op as onnxruntime's (`f32_op`): the reference backend then meets
        // the same ties (x = 2 with scale 4/255 is 127.49999 in f32, 127.5 in f64).
        let range = self.f32_op(name, BinaryOp::Add, hi, nlo)?;
        let q = self.scalar(&self.fresh(name), 255.0, DType::F32)?;
        let unit = self.scalar(&self.fresh(name), 1.0, DType::F32)?;
        let step = self.f32_op(name, BinaryOp::Div, range, q)?;
        let flat = self.bin(name, BinaryOp::Eq, range, zero)?;
        let fresh = self.fresh(name);
        let scale_name = scale_name.unwrap_or(fresh);
        let scale = self.tmp(name, Op::Where, vec![flat, unit, step])?;
        let scale = self.push(&scale_name, Op::Cast { to: DType::F32 }, vec![scale])?;
        let zf = self.f32_op(name, BinaryOp::Div, nlo, scale)?;
        let zc = self.bin(name, BinaryOp::Min, zf, q)?;
        let zc = self.bin(name, BinaryOp::Max, zc, zero)?;
        let zp = self.un(name, UnaryOp::Round, zc)?;
        // onnxruntime clamps the quotient to [-zero, 255 - zero] before rounding; for the
        // integer zero point that is ONNX's saturate(round(v) + zero) to [0, 255], whose bounds
        // are constants: a compare and a blend each on the CPU, where bounds computed at run
        // time take Cranelift's seven-instruction `fmax` / `fmin`.
        let v = self.f32_op(name, BinaryOp::Div, x, scale)?;
        let r = self.un(name, UnaryOp::Round, v)?;
        let y = self.bin(name, BinaryOp::Add, r, zp)?;
        let y = self.bin(name, BinaryOp::Max, y, zero)?;
        let y = self.bin(name, BinaryOp::Min, y, q)?;
        Ok((y, scale, zp))
    }

    /// The largest element of `x` (a scalar), in two steps where `x` has rows: the max of each
    /// row, then of those. A max is the same in any order (NaN and the sign of zero included),
    /// so this is the one-step result; the rows split over the CPU backend's threads, where one
    /// reduction to a single value runs on one (a dynamic quantization's range, twice per
    /// quantized activation).
    fn tensor_max(&mut self, name: &str, x: ValueId) -> R<ValueId> {
        let shape = self.shape(&Val::Node(x));
        let r = shape.len();
        let max = |axes: Vec<usize>| Op::Reduce { op: ReduceOp::Max, axes, keep_dims: false };
        if r >= 2 && shape[..r - 1].iter().product::<usize>() >= 2 {
            let rows = self.tmp(name, max(vec![r - 1]), vec![x])?;
            return self.tmp(name, max((0..r - 1).collect()), vec![rows]);
        }
        self.tmp(name, max((0..r).collect()), vec![x])
    }

    /// `a op b` in f32, the result cast to f32 explicitly so the f64 reference backend rounds
    /// it as an f32 backend does (see `requantize`).
    pub(super) fn f32_op(&mut self, name: &str, op: BinaryOp, a: ValueId, b: ValueId) -> R<ValueId> {
        let v = self.tmp(name, Op::Binary(op), vec![a, b])?;
        self.tmp(name, Op::Cast { to: DType::F32 }, vec![v])
    }

    /// `v` (already divided by the scale) as ONNX quantizes it: rounded half to even, plus the
    /// zero point, saturated to `range`. The last op carries the node's name.
    /// `v` is first cast to f32 explicitly: a no-op where f32 is computed in f32, it makes the
    /// f64 reference backend round what it rounds from the f32 value too (ONNX defines these
    /// ops on f32 tensors; an f64 quotient can land on a tie, -127.5, that the f32 one,
    /// -127.49999, misses, and one step of the result would differ).
    pub(super) fn requantize(&mut self, name: &str, v: ValueId, zero: Option<ValueId>, range: (f32, f32)) -> R<ValueId> {
        let v = self.tmp(name, Op::Cast { to: DType::F32 }, vec![v])?;
        let mut v = self.tmp(name, Op::Unary(UnaryOp::Round), vec![v])?;
        if let Some(z) = zero {
            v = self.tmp(name, Op::Binary(BinaryOp::Add), vec![v, z])?;
        }
        let hi = self.scalar(&self.fresh(name), range.1, DType::F32)?;
        let lo = self.scalar(&self.fresh(name), range.0, DType::F32)?;
        let v = self.tmp(name, Op::Binary(BinaryOp::Min), vec![v, hi])?;
        self.push(name, Op::Binary(BinaryOp::Max), vec![v, lo])
    }

    /// (x - zero)·scale, x and its parameters in f32. The last op carries `name`.
    fn dequantize(&mut self, name: &str, xf: ValueId, scale: ValueId, zero: Option<ValueId>) -> R<ValueId> {
        let xf = match zero {
            Some(z) => self.tmp(name, Op::Binary(BinaryOp::Sub), vec![xf, z])?,
            None => xf,
        };
        self.push(name, Op::Binary(BinaryOp::Mul), vec![xf, scale])
    }

    /// A scale or zero point (input `k`) of (De)QuantizeLinear for an input of shape `xs`:
    /// one value, one per slice along `axis` (shaped to broadcast there), or, with `block`, one
    /// per `block` elements along it (repeated to the input's shape by a gather), in f32.
    fn q_param(&mut self, cx: &NodeCx, k: usize, xs: &[usize], axis: i64, block: i64) -> R<Option<ValueId>> {
        let Some(v) = cx.ins.get(k).cloned().flatten() else { return Ok(None) };
        let mut id = self.node(&cx.iname(k), &v)?;
        let ps = self.shape(&Val::Node(id));
        let n: usize = ps.iter().product();
        if block != 0 {
            let ax = shape::axis(axis, xs.len())?;
            let b = usize::try_from(block).ok().filter(|&b| b > 0).ok_or_else(|| Fail::Invalid(format!("block_size {block}")))?;
            let fits = ps.len() == xs.len() && (0..xs.len()).all(|d| ps[d] == if d == ax { xs[d].div_ceil(b) } else { xs[d] });
            if !fits {
                return Err(Fail::Invalid(format!("{} parameter of shape {ps:?} for an input of shape {xs:?} in blocks of {b} along axis {ax}", cx.op)));
            }
            let ids: Vec<f64> = (0..xs[ax]).map(|i| (i / b) as f64).collect();
            let ids = self.node(&self.fresh(cx.name), &Val::Lit(Lit::of(Elem::I64, vec![ids.len()], ids)))?;
            id = self.gather_axis(&self.fresh(cx.name), id, &ps, ax, ids, false)?;
        } else if n != 1 {
            let axis = shape::axis(axis, xs.len())?;
            if ps.len() != 1 || xs.get(axis) != Some(&n) {
                return unsup(format!("{} parameter of shape {ps:?} for an input of shape {xs:?}", cx.op));
            }
            let to: Vec<usize> = std::iter::once(n).chain(std::iter::repeat_n(1, xs.len() - axis - 1)).collect();
            id = self.reshape(&self.fresh(cx.name), id, &to)?;
        }
        Ok(Some(self.cast_to(cx.name, id, DType::F32)?))
    }

    /// An optional zero point as an f32 graph value.
    pub(super) fn opt_f32(&mut self, name: &str, v: Option<Val>, vname: &str) -> R<Option<ValueId>> {
        let Some(v) = v else { return Ok(None) };
        let id = self.node(vname, &v)?;
        Ok(Some(self.cast_to(name, id, DType::F32)?))
    }

    /// An optional per-tensor zero point as an f32 scalar (0 where it is not given).
    fn zero_scalar(&mut self, name: &str, v: Option<Val>, vname: &str, op: &str) -> R<ValueId> {
        match v {
            Some(v) => self.per_tensor(name, vname, v, op),
            None => self.scalar(&self.fresh(name), 0.0, DType::F32),
        }
    }

    /// A per-tensor scale (one value) as an f32 scalar.
    fn per_tensor(&mut self, name: &str, vname: &str, v: Val, op: &str) -> R<ValueId> {
        let id = self.node(vname, &v)?;
        let s = self.shape(&Val::Node(id));
        if s.iter().product::<usize>() != 1 {
            return unsup(format!("{op} with a scale of shape {s:?} (only per-tensor)"));
        }
        let id = self.cast_to(name, id, DType::F32)?;
        if s.is_empty() {
            return Ok(id);
        }
        self.reshape(&self.fresh(name), id, &[])
    }

    /// `a` (integers) minus its optional zero point, in f32.
    fn centered(&mut self, name: &str, a: ValueId, zero: Option<Val>, zname: &str) -> R<ValueId> {
        let af = self.cast_to(name, a, DType::F32)?;
        let Some(z) = self.opt_f32(name, zero, zname)? else { return Ok(af) };
        if self.shape(&Val::Node(z)).iter().product::<usize>() != 1 {
            return unsup("a zero point per row of the left operand");
        }
        self.tmp(name, Op::Binary(BinaryOp::Sub), vec![af, z])
    }

    /// The right operand of an integer matmul minus its zero point (one value or one per
    /// column), in f32; known (weights), it becomes an f32 weight at import.
    fn integer_rhs(&mut self, bname: String, b: Val, zero: Option<Val>, zname: String, name: &str) -> R<ValueId> {
        match (b, zero) {
            (Val::Lit(b), zero) => {
                let b = self.lit(&bname, &b)?;
                let zl = match zero {
                    Some(Val::Lit(z)) => Some(z),
                    Some(Val::Node(_)) => return unsup("an integer matmul zero point computed at run time for known weights"),
                    None => None,
                };
                let mut w = Lit::of(Elem::F32, b.shape.clone(), b.floats());
                if let Some(z) = zl {
                    let zv = z.floats();
                    let n_out = *b.shape.last().unwrap_or(&1);
                    if zv.len() != 1 && zv.len() != n_out {
                        return unsup(format!("a weight zero point of {} values for {n_out} columns", zv.len()));
                    }
                    if let LitData::F(v) = &mut w.data {
                        for (i, x) in v.iter_mut().enumerate() {
                            *x -= if zv.len() == 1 { zv[0] } else { zv[i % n_out] };
                        }
                    }
                }
                w.weight = b.weight || w.numel() > 64;
                self.node(&format!("{bname}.int"), &Val::Lit(w))
            }
            (b, zero) => {
                let b = self.node(&bname, &b)?;
                let bf = self.cast_to(name, b, DType::F32)?;
                let Some(z) = self.opt_f32(name, zero, &zname)? else { return Ok(bf) };
                let (zs, bs) = (self.shape(&Val::Node(z)), self.shape(&Val::Node(bf)));
                if zs.iter().product::<usize>() != 1 && zs != bs.last().copied().into_iter().collect::<Vec<_>>() {
                    return unsup(format!("a zero point of shape {zs:?} for a right operand of shape {bs:?}"));
                }
                self.tmp(name, Op::Binary(BinaryOp::Sub), vec![bf, z])
            }
        }
    }

    /// The GEMM (named `out`) of two integer operands held in f32 (matrices or stacks of them).
    fn integer_matmul(&mut self, out: &str, a: ValueId, b: ValueId) -> R<ValueId> {
        if self.shape(&Val::Node(a)).len() < 2 || self.shape(&Val::Node(b)).len() < 2 {
            return unsup("an integer matmul of vectors");
        }
        self.push(out, Op::MatMul { transpose_a: false, transpose_b: false }, vec![a, b])
    }

    /// A matmul operand's scale in f32: one value (a scalar), or one per row of the left
    /// operand, a matrix (`rows`: shaped [M, 1]), or one per column of the right one ([N]).
    fn operand_scale(&mut self, name: &str, vname: &str, v: Val, operand: &[usize], rows: bool) -> R<ValueId> {
        let id = self.node(vname, &v)?;
        let s = self.shape(&Val::Node(id));
        let n: usize = s.iter().product();
        let id = self.cast_to(name, id, DType::F32)?;
        if n == 1 {
            return self.reshape(&self.fresh(name), id, &[]);
        }
        let fits = s.len() == 1 && if rows { operand.len() == 2 && operand[0] == n } else { operand.last() == Some(&n) };
        if !fits {
            let side = if rows { "left" } else { "right" };
            return unsup(format!("a {side} scale of shape {s:?} for an operand of shape {operand:?}"));
        }
        if rows {
            return self.reshape(&self.fresh(name), id, &[n, 1]);
        }
        Ok(id)
    }
}
