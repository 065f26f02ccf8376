//! Transcendental functions emitted inline as Cranelift IR, on `f32` or `f32x4` values.
//!
//! The algorithms (and exp's coefficients) follow `kiln_kernels::math`, whose GEMM epilogues
//! apply the same activations; the kernels' GELU has since moved to an erfc form without
//! cancellation for negative x, so the two GELUs agree to about 1e-7 absolute, not bit for bit:
//! - `exp`: Cody–Waite reduction `x = n·ln2 + r` (n rounded with the 1.5·2²³ trick, two-part
//!   ln2), `exp(r) ≈ 1 + r + r²·P(r)` with P of degree 4, scaling by 2ⁿ in two halves so
//!   results down to the subnormal range are right. `x > 88.72` → +inf, `x < -104` → 0.
//! - `erf`: `x·N(x²)/D(x²)` (degree 13/10) on [-4, 4], clamped to ±1.
//! - `tanh`: `x·N(x²)/D(x²)` (degree 11/10) on [-9, 9], clamped to ±1.
//! - `log`: Cephes' `logf`: subnormals scaled by 2²³, `x = m·2ᵉ` with m in [√½, √2),
//!   `log(m) = f - f²/2 + f³·P(f)` (f = m - 1, P of degree 8), plus `e·ln2` in two parts.
//!   `log(±0) = -inf`, `log(+inf) = +inf`, `log(x < 0) = NaN`.
//! - GELU, SiLU and the other ops built on these are formulas in `crate::ops`.
//!
//! NaN in gives NaN out; beyond the clamps results are exactly inf/0/±1. Maximum errors
//! against f64 on dense sweeps (asserted in `compiler/tests/cpu_math.rs`): exp 8.0e-8 relative
//! on [-87.3, 88.7], tanh 3.1e-7 relative, erf 3.6e-7 absolute, GELU 1.9e-7 (absolute, scaled by
//! max(1, |x|)), SiLU 1.2e-7.

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::InstBuilder;
use cranelift_codegen::ir::Value;

use super::emit::Fx;

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
const EXP_MAX: f32 = 88.722_83;
const EXP_MIN: f32 = -104.0;
const EXP_P: [f32; 5] = [0.499_999_94, 0.166_665_21, 0.041_668_39, 0.008_368_71, 0.001_381_460_8];
/// 1.5·2²³: adding it rounds a float of magnitude < 2²² to an integer (nearest even).
const ROUND_MAGIC: f32 = 12_582_912.0;

const ERF_CLAMP: f32 = 4.0;
const ERF_N: [f32; 7] =
    [std::f32::consts::FRAC_2_SQRT_PI, 0.185_204_6, 0.054_316_9, 0.003_849_642_1, 0.000_379_601_23, 4.684_54e-6, -1.320_109_2e-8];
const ERF_D: [f32; 5] = [0.497_466_7, 0.113_958_81, 0.015_462_125, 0.001_307_565_8, 6.310_834e-5];

const TANH_CLAMP: f32 = 9.0;
const TANH_N: [f32; 6] = [1.0, 0.140_999_47, 0.004_426_931_5, 4.229_911_8e-5, 1.113_224_6e-7, 3.683_634_6e-11];
const TANH_D: [f32; 5] = [0.474_332_8, 0.029_204_53, 0.000_501_023_4, 2.606_217_5e-6, 2.956_620_5e-9];

const LOG_P: [f32; 9] = [
    3.333_333e-1,
    -2.499_999_4e-1,
    2.000_071_4e-1,
    -1.666_805_8e-1,
    1.424_932_3e-1,
    -1.242_014_1e-1,
    1.167_699_9e-1,
    -1.151_461e-1,
    7.037_683_6e-2,
];
/// 2²³ as a float; its bit pattern ORed with a small integer k reads as 2²³ + k.
const TWO23: f32 = 8_388_608.0;

fn width(fx: &Fx, x: Value) -> usize {
    if fx.b.func.dfg.value_type(x).is_vector() {
        4
    } else {
        1
    }
}

/// Horner evaluation of `c[0] + c[1]·t + …`.
fn horner(fx: &mut Fx, t: Value, c: &[f32], w: usize) -> Value {
    let mut acc = fx.fconst(c[c.len() - 1], w);
    for &ci in c[..c.len() - 1].iter().rev() {
        let k = fx.fconst(ci, w);
        acc = fx.fma(acc, t, k);
    }
    acc
}

/// `mask_of_nan(x) ? x : y`.
fn keep_nan(fx: &mut Fx, x: Value, y: Value) -> Value {
    let nan = fx.fcmp(FloatCC::Unordered, x, x);
    fx.sel(nan, x, y)
}

/// e^x.
pub(crate) fn exp(fx: &mut Fx, x: Value) -> Value {
    let w = width(fx, x);
    let hi = fx.fconst(EXP_MAX, w);
    let lo = fx.fconst(EXP_MIN, w);
    let xc = fx.pmin(x, hi);
    let xc = fx.pmax(xc, lo);
    let log2e = fx.fconst(LOG2E, w);
    let magic = fx.fconst(ROUND_MAGIC, w);
    let t = fx.fma(xc, log2e, magic);
    let n = fx.b.ins().fsub(t, magic);
    let nln2hi = fx.fconst(-LN2_HI, w);
    let nln2lo = fx.fconst(-LN2_LO, w);
    let r = fx.fma(n, nln2hi, xc);
    let r = fx.fma(n, nln2lo, r);
    let p = horner(fx, r, &EXP_P, w);
    let r2 = fx.b.ins().fmul(r, r);
    let y = fx.fma(p, r2, r);
    let one = fx.fconst(1.0, w);
    let y = fx.b.ins().fadd(y, one);
    // n as an integer: the low mantissa bits of t, offset by those of the magic constant.
    let tb = fx.bits_to_int(t);
    let mb = fx.iconst_w(ROUND_MAGIC.to_bits() as i32, w);
    let ni = fx.b.ins().isub(tb, mb);
    let n1 = fx.b.ins().sshr_imm_s(ni, 1);
    let n2 = fx.b.ins().isub(ni, n1);
    let bias = fx.iconst_w(127, w);
    let e1 = fx.b.ins().iadd(n1, bias);
    let e1 = fx.b.ins().ishl_imm_s(e1, 23);
    let e2 = fx.b.ins().iadd(n2, bias);
    let e2 = fx.b.ins().ishl_imm_s(e2, 23);
    let s1 = fx.bits_to_float(e1);
    let s2 = fx.bits_to_float(e2);
    let y = fx.b.ins().fmul(y, s1);
    let y = fx.b.ins().fmul(y, s2);
    let over = fx.fcmp(FloatCC::GreaterThan, x, hi);
    let inf = fx.fconst(f32::INFINITY, w);
    let y = fx.sel(over, inf, y);
    keep_nan(fx, x, y)
}

fn odd_rational(fx: &mut Fx, x: Value, clamp: f32, num: &[f32], den: &[f32]) -> Value {
    let w = width(fx, x);
    let hi = fx.fconst(clamp, w);
    let lo = fx.fconst(-clamp, w);
    let xc = fx.pmin(x, hi);
    let xc = fx.pmax(xc, lo);
    let t = fx.b.ins().fmul(xc, xc);
    let pn = horner(fx, t, num, w);
    let n = fx.b.ins().fmul(xc, pn);
    let pd = horner(fx, t, den, w);
    let one = fx.fconst(1.0, w);
    let d = fx.fma(pd, t, one);
    let y = fx.b.ins().fdiv(n, d);
    let m1 = fx.fconst(-1.0, w);
    let y = fx.pmin(y, one);
    let y = fx.pmax(y, m1);
    // At and beyond the clamp the f32 result is ±1 exactly.
    let ax = fx.b.ins().fabs(x);
    let sat = fx.fcmp(FloatCC::GreaterThanOrEqual, ax, hi);
    // ±1 with the sign of x (bitwise: x64 has no vector fcopysign).
    let xb = fx.bits_to_int(x);
    let signmask = fx.iconst_w(i32::MIN, w);
    let sign = fx.b.ins().band(xb, signmask);
    let onebits = fx.iconst_w(1.0f32.to_bits() as i32, w);
    let s1 = fx.b.ins().bor(sign, onebits);
    let s1 = fx.bits_to_float(s1);
    let y = fx.sel(sat, s1, y);
    keep_nan(fx, x, y)
}

/// erf(x).
pub(crate) fn erf(fx: &mut Fx, x: Value) -> Value {
    odd_rational(fx, x, ERF_CLAMP, &ERF_N, &ERF_D)
}

/// tanh(x).
pub(crate) fn tanh(fx: &mut Fx, x: Value) -> Value {
    odd_rational(fx, x, TANH_CLAMP, &TANH_N, &TANH_D)
}

/// ln(x).
pub(crate) fn log(fx: &mut Fx, x: Value) -> Value {
    let w = width(fx, x);
    // Subnormals: scale into the normal range first, and take 23 off the exponent.
    let minpos = fx.fconst(f32::MIN_POSITIVE, w);
    let sub = fx.fcmp(FloatCC::LessThan, x, minpos);
    let scale = fx.fconst(TWO23, w);
    let xs = fx.b.ins().fmul(x, scale);
    let xs = fx.sel(sub, xs, x);
    let m23 = fx.fconst(-23.0, w);
    let zero = fx.fconst(0.0, w);
    let eadj = fx.sel(sub, m23, zero);
    // The biased exponent field (0..=255) as a float: OR it into 2²³'s mantissa and subtract 2²³.
    let xb = fx.bits_to_int(xs);
    let ef = fx.b.ins().ushr_imm_s(xb, 23);
    let two23 = fx.iconst_w(TWO23.to_bits() as i32, w);
    let ef = fx.b.ins().bor(ef, two23);
    let ef = fx.bits_to_float(ef);
    let bias = fx.fconst(TWO23 + 127.0, w);
    let e = fx.b.ins().fsub(ef, bias);
    let e = fx.b.ins().fadd(e, eadj);
    // The mantissa in [1, 2), then in [√½, √2).
    let mmask = fx.iconst_w(0x007f_ffff, w);
    let mb = fx.b.ins().band(xb, mmask);
    let onebits = fx.iconst_w(1.0f32.to_bits() as i32, w);
    let mb = fx.b.ins().bor(mb, onebits);
    let m = fx.bits_to_float(mb);
    let sqrt2 = fx.fconst(std::f32::consts::SQRT_2, w);
    let big = fx.fcmp(FloatCC::GreaterThan, m, sqrt2);
    let half = fx.fconst(0.5, w);
    let mh = fx.b.ins().fmul(m, half);
    let m = fx.sel(big, mh, m);
    let one = fx.fconst(1.0, w);
    let e1 = fx.b.ins().fadd(e, one);
    let e = fx.sel(big, e1, e);
    let f = fx.b.ins().fsub(m, one);
    let z = fx.b.ins().fmul(f, f);
    let p = horner(fx, f, &LOG_P, w);
    let fz = fx.b.ins().fmul(f, z);
    let y = fx.b.ins().fmul(fz, p);
    let ln2lo = fx.fconst(LN2_LO, w);
    let y = fx.fma(e, ln2lo, y);
    let mhalf = fx.fconst(-0.5, w);
    let y = fx.fma(z, mhalf, y);
    let r = fx.b.ins().fadd(f, y);
    let ln2hi = fx.fconst(LN2_HI, w);
    let r = fx.fma(e, ln2hi, r);
    // Special values: +inf stays, ±0 → -inf, x < 0 (and NaN) → NaN.
    let inf = fx.fconst(f32::INFINITY, w);
    let is_inf = fx.fcmp(FloatCC::Equal, x, inf);
    let r = fx.sel(is_inf, inf, r);
    let is_zero = fx.fcmp(FloatCC::Equal, x, zero);
    let ninf = fx.fconst(f32::NEG_INFINITY, w);
    let r = fx.sel(is_zero, ninf, r);
    let neg = fx.fcmp(FloatCC::LessThan, x, zero);
    let nan = fx.fconst(f32::NAN, w);
    let r = fx.sel(neg, nan, r);
    keep_nan(fx, x, r)
}
