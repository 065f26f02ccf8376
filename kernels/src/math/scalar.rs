//! The scalar path: the same algorithms in plain f32 arithmetic (used without AVX2, and for tails
//! nowhere: SIMD tails use masked loads so one element always gets the same answer).

use super::*;

#[inline]
fn horner(t: f32, c: &[f32]) -> f32 {
    let mut acc = c[c.len() - 1];
    for &ci in c[..c.len() - 1].iter().rev() {
        acc = acc * t + ci;
    }
    acc
}

/// e^x (scalar path).
#[inline]
pub fn exp(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x > EXP_MAX {
        return f32::INFINITY;
    }
    if x < EXP_MIN {
        return 0.0;
    }
    let n = (x * LOG2E).round_ties_even();
    let r = x - n * LN2_HI;
    let r = r - n * LN2_LO;
    let p = horner(r, &EXP_P);
    let y = (p * (r * r) + r) + 1.0;
    let n = n as i32;
    let n1 = n >> 1;
    let n2 = n - n1;
    y * f32::from_bits(((n1 + 127) as u32) << 23) * f32::from_bits(((n2 + 127) as u32) << 23)
}

/// erfc(a) for 0.9 <= a <= 10, given t = a².
#[inline]
fn erfc_big(a: f32, t: f32) -> f32 {
    exp(-t) * horner(1.0 / (1.0 + 0.5 * a), &ERFC_T)
}

/// erf(x) (scalar path).
#[inline]
pub fn erf(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs().min(ERF_CLAMP);
    let t = a * a;
    if a < ERF_SPLIT {
        return x + x * horner(t, &ERF_SMALL);
    }
    (1.0 - erfc_big(a, t)).copysign(x)
}

/// tanh(x) (scalar path).
#[inline]
pub fn tanh(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs().min(TANH_CLAMP);
    if a < TANH_SPLIT {
        let t = a * a;
        return x + x * t * horner(t, &TANH_SMALL);
    }
    (1.0 - 2.0 / (exp(2.0 * a) + 1.0)).copysign(x)
}

/// max(x, 0); NaN stays NaN.
#[inline]
/// See `simd::relu6` (this is it at one lane).
pub fn relu6(x: f32) -> f32 {
    // SAFETY: the one-lane `Lanes` has no target-feature requirement.
    unsafe { simd::relu6(x) }
}

pub fn relu(x: f32) -> f32 {
    if x < 0.0 {
        0.0
    } else {
        x
    }
}

/// 1 / (1 + e^-x) (scalar path).
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// x·sigmoid(x) (scalar path).
#[inline]
pub fn silu(x: f32) -> f32 {
    if x.abs() > TAIL {
        return tail(x);
    }
    x / (1.0 + exp(-x))
}

/// x·Φ(x) (scalar path), with Φ(x) = 1/2 + xc·P(xc²)/Q(xc²) the rational approximation of
/// `coeffs::GELU_P` (x clamped to ±4√2). It is `simd::gelu_erf` at one lane (`Lanes for f32`):
/// the scalar and vector paths agree bit for bit (the division is IEEE on every path).
#[inline]
pub fn gelu_erf(x: f32) -> f32 {
    // SAFETY: `Lanes for f32` is plain arithmetic with no ISA requirement.
    unsafe { simd::gelu_erf(x) }
}

/// x/2·(1 + tanh(√(2/π)(x + 0.044715x³))) (scalar path), computed as `x / (1 + exp(-2u))`
/// (1 + tanh(u) = 2·sigmoid(2u)): no branch and no cancellation.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    if x.abs() > TAIL {
        return tail(x);
    }
    let u = SQRT_2_OVER_PI * (x + GELU_TANH_C * x * x * x);
    x / (1.0 + exp((-2.0 * u).clamp(EXP_LEAN_MIN, EXP_LEAN_MAX)))
}

#[inline]
fn tail(x: f32) -> f32 {
    if x > 0.0 {
        x
    } else if x == f32::NEG_INFINITY {
        f32::NAN
    } else {
        -0.0
    }
}
