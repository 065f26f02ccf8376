//! Vectorized transcendental approximations (exp, erf, tanh, sigmoid, SiLU, GELU) and the
//! activation functions of GEMM epilogues.
//!
//! Methods (coefficients fitted for this crate by weighted least squares + Lawson iterations toward
//! minimax relative error, in 40-digit arithmetic, then rounded to f32):
//! - `exp`: Cody–Waite range reduction `x = n·ln2 + r`, |r| ≤ ln2/2, with a two-constant ln2 split,
//!   `exp(r) ≈ 1 + r + r²·P(r)` (P of degree 4, fit error 3e-9), then scaling by 2ⁿ in two halves so
//!   results down to the subnormal range come out right. x > 88.7228 gives +inf, x < -104 gives 0.
//! - `erf`: for |x| < 0.9, `x + x·Q(x²)` (Q of degree 5, relative error 1.4e-8; writing the leading
//!   term as `x + x·(2/√π - 1)` avoids the rounding of 2/√π); for 0.9 ≤ |x| ≤ 4,
//!   `±(1 - erfc(|x|))` with `erfc(a) = exp(-a²)·R(1/(1 + a/2))` (R of degree 8, relative error
//!   8.7e-9 on [0.9, 10]); ±1 beyond 4 (erf(4) rounds to 1 in f32). Relative accuracy near 0,
//!   absolute accuracy near ±1.
//! - `tanh`: for |x| < 0.8, `x + x³·S(x²)` (S of degree 5, relative error 4e-9); above,
//!   `±(1 - 2/(exp(2|x|) + 1))`, with |x| clamped to 9 (tanh(9) rounds to 1).
//! - `sigmoid(x) = 1/(1+exp(-x))`, `silu(x) = x·sigmoid(x)`, `gelu_erf(x) = x/2·(1+erf(x/√2))`,
//!   `gelu_tanh(x) = x/2·(1+tanh(√(2/π)(x+0.044715x³)))`. The GELUs avoid the cancellation of
//!   `1 + erf` / `1 + tanh` for negative x and need one branch only: `gelu_erf(x) = x·q(|x|)`
//!   (x ≤ 0) or `x - x·q(|x|)` (x > 0) with `q(t) = Φ(-t)` a piecewise polynomial (8 intervals
//!   of [0, 6], degree 9, each coefficient looked up by one 8-lane permute: no division and no
//!   exp, about 30 vector operations at either width; fitted by `scripts/fit_gelu.py`), and
//!   q = 0 past 6, where Φ(-6) = 1e-9; `gelu_tanh(x) = x/(1 + exp(-2u))`.
//!
//! Maximum errors against f64, measured by `tests/math.rs` (every 257th f32 bit pattern of the range,
//! both signs; the test asserts slightly looser bounds). Relative error is taken where the f64 value is
//! a normal f32 (exp, sigmoid, silu) or above 1e-30 (the others). Both ISA paths agree to 1e-7.
//!
//! | function | range swept | max relative | max absolute |
//! |---|---|---|---|
//! | exp | [-103, 88.7] | 8.0e-8 | – |
//! | erf | [-6, 6] | 9.8e-8 | 8.4e-8 |
//! | tanh | [-12, 12] | 8.8e-8 | 6.1e-8 |
//! | sigmoid | [-87, 87] | 1.4e-7 | 8.9e-8 |
//! | silu | [-87, 87] | 1.6e-7 | 1.3e-6 (at x≈14) |
//! | gelu_erf | [-6, 10] / below -6 | 4.3e-7 / – (-0) | 2.4e-7 (at x≈4.1) / 5.9e-9 |
//! | gelu_tanh | [-3, 10] / [-10, 10] | 8.4e-7 / 1.2e-5 (tail cond. ≈ 2u) | 5.2e-7 (at x≈4.7) |
//!
//! NaN inputs give NaN outputs. SiLU and both GELUs follow their defining f32 formulas in the
//! tails, where the clamped exponentials here would not (kiln's special-value contract,
//! `kiln_compiler::ops`; PyTorch's eager kernels agree): beyond |x| > 88 the result is x for
//! x > 0 and -0 for x < 0 (SiLU: x/(1 + e^-x); the GELUs: x/2·(1 + (-1)), the sign of the true
//! tiny negative value), and NaN at -inf (`-inf·0`).

/// Activation applied by a GEMM epilogue. The `u32` values are the C ABI encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Activation {
    None = 0,
    Relu = 1,
    GeluErf = 2,
    GeluTanh = 3,
    Tanh = 4,
    Sigmoid = 5,
    Silu = 6,
}

impl Activation {
    /// All activations, in code order.
    pub const ALL: [Activation; 7] = [
        Activation::None,
        Activation::Relu,
        Activation::GeluErf,
        Activation::GeluTanh,
        Activation::Tanh,
        Activation::Sigmoid,
        Activation::Silu,
    ];

    /// Decodes the C ABI value.
    pub fn from_u32(code: u32) -> Option<Activation> {
        Activation::ALL.get(code as usize).copied()
    }

    /// The activation of one value, scalar code path.
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::None => x,
            Activation::Relu => relu(x),
            Activation::GeluErf => gelu_erf(x),
            Activation::GeluTanh => gelu_tanh(x),
            Activation::Tanh => tanh(x),
            Activation::Sigmoid => sigmoid(x),
            Activation::Silu => silu(x),
        }
    }
}

/// An elementwise function that the slice helpers (and the kernel table) provide.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unary {
    Exp,
    Erf,
    Act(Activation),
}

impl Unary {
    /// The scalar-path value of one element.
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Unary::Exp => exp(x),
            Unary::Erf => erf(x),
            Unary::Act(a) => a.apply(x),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Constants shared by the scalar and SIMD paths.

/// The constants of every approximation here, public so that a code generator emitting the same
/// algorithms inline (e.g. Cranelift IR for elementwise kernels) uses bit-identical coefficients.
pub mod coeffs {

    pub const LOG2E: f32 = std::f32::consts::LOG2_E;
    /// ln2 = LN2_HI + LN2_LO; LN2_HI has 9 significant bits so n·LN2_HI is exact for |n| ≤ 2^15.
    pub const LN2_HI: f32 = 0.693_359_4;
    pub const LN2_LO: f32 = -2.121_944_4e-4;
    /// Above this exp overflows f32.
    pub const EXP_MAX: f32 = 88.722_83;
    /// Below this exp is below half the smallest subnormal.
    pub const EXP_MIN: f32 = -104.0;
    /// exp(r) ≈ 1 + r + r²·(E0 + E1 r + E2 r² + E3 r³ + E4 r⁴) on |r| ≤ ln2/2.
    pub const EXP_P: [f32; 5] = [
        0.499_999_94,
        0.166_665_21,
        0.041_668_39,
        0.008_368_71,
        0.001_381_460_8,
    ];

    pub const ERF_CLAMP: f32 = 4.0;
    /// Below this |x|, erf(x) = x + x·Q(x²); above, erf(|x|) = 1 - erfc(|x|).
    pub const ERF_SPLIT: f32 = 0.9;
    /// Q: erf(x) = x + x·Σ `ERF_SMALL[i]`·x^(2i) on |x| < 0.9 (relative error 1.4e-8 with these f32 values).
    pub const ERF_SMALL: [f32; 6] = [
        1.2837915e-01,
        -3.761251e-01,
        1.12820275e-01,
        -2.6775425e-02,
        5.0074505e-03,
        -6.069479e-04,
    ];
    /// erfc(a) = exp(-a²)·Σ `ERFC_T[i]`·tⁱ with t = 1/(1 + a/2), on 0.9 ≤ a ≤ 10 (relative error
    /// 8.7e-9 with these f32 values).
    pub const ERFC_T: [f32; 9] = [
        -5.6448744e-06,
        2.822388e-01,
        2.8056458e-01,
        2.5551403e-01,
        1.4884415e-01,
        1.2591574e-01,
        -2.8082714e-03,
        -1.6410781e-01,
        7.4204974e-02,
    ];
    /// GELU (erf form) as `x·q(|x|)` / `x - x·q(|x|)` with `q(t) = Φ(-t)` tabulated on [0, 6) in
    /// 8 intervals (one 8-lane permute per coefficient on AVX2): `u = t·GELU_K + GELU_C` rounds to
    /// the interval j in 1..=8 (`u < GELU_U_END`; past it, |x| ≥ 6 where Φ(-6) = 9.9e-10, q = 0),
    /// `s = t·GELU_K - j` in [-1, 0] and `q ≈ Σ GELU_Q[k][j mod 8]·s^k`, expanded at each
    /// interval's right end so the leading terms share a sign and do not cancel (evaluated as
    /// `E(s²) + s·O(s²)`, even and odd coefficients in two Horner chains: `simd::gelu_erf_n`).
    /// Fitted and checked by `scripts/fit_gelu.py` (relative error of the f32 evaluation:
    /// 1.3e-7 for x > 0, 2.2e-7 on (-4, 0], 4.2e-7 on (-6, -4]).
    pub const GELU_K: f32 = 1.3333334e00;
    pub const GELU_C: f32 = 5.0000095e-01;
    pub const GELU_Q: [[f32; 8]; 10] = [
        [9.865886e-10, 2.2662736e-01, 6.68072e-02, 1.2224475e-02, 1.3498984e-03, 8.841733e-05, 3.3976753e-06, 7.6049666e-08],
        [-4.5569695e-09, -2.2585307e-01, -9.71382e-02, -2.3804741e-02, -3.323887e-03, -2.6444686e-04, -1.19878105e-05, -3.0963588e-07],
        [1.0250694e-08, 6.3521154e-02, 5.4640237e-02, 2.0085253e-02, 3.739371e-03, 3.7187865e-04, 2.0229518e-05, 6.0958104e-07],
        [-1.4991887e-08, 9.263289e-03, -1.1383322e-02, -9.06622e-03, -2.492944e-03, -3.2383986e-04, -2.1632937e-05, -7.712935e-07],
        [1.5539669e-08, -7.259266e-03, -1.9205159e-03, 1.9420898e-03, 1.0514866e-03, 1.928718e-04, 1.6367343e-05, 7.000337e-07],
        [-1.4450015e-08, 2.9132523e-05, 1.3944933e-03, 1.10558e-04, -2.6379002e-04, -8.100576e-05, -9.174106e-06, -4.958594e-07],
        [4.7880064e-09, 5.274605e-04, -1.1241864e-04, -1.7433625e-04, 1.761331e-05, 2.3946508e-05, 4.0599416e-06, 2.45685e-07],
        [-1.055225e-08, -6.556066e-05, -6.700626e-05, 3.7912487e-05, 8.1765875e-06, -3.4428765e-06, -1.1409031e-06, -1.5237893e-07],
        [-3.1949732e-09, -4.6508743e-05, 2.4887664e-05, 4.9846135e-06, -6.991527e-06, 5.7081644e-07, 4.2845286e-07, 9.48963e-09],
        [-3.12855e-09, -3.588066e-06, 6.075116e-06, -2.250255e-06, -6.5248844e-07, 5.220374e-07, 1.3618041e-09, -2.7668442e-08],
    ];
    /// `u` at t = 6, the end of the last interval (Φ(-6) = 9.9e-10; past it q = 0).
    pub const GELU_U_END: f32 = 8.5e00;

    pub const TANH_CLAMP: f32 = 9.0;
    /// Below this |x|, tanh(x) = x + x³·S(x²); above, tanh(|x|) = 1 - 2/(exp(2|x|) + 1).
    pub const TANH_SPLIT: f32 = 0.8;
    /// S on |x| < 0.8 (relative error 3.7e-9 with these f32 values).
    pub const TANH_SMALL: [f32; 6] = [
        -3.33333e-01,
        1.3332242e-01,
        -5.3853594e-02,
        2.1306504e-02,
        -7.4141263e-03,
        1.5870107e-03,
    ];

    pub const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
    /// √(2/π)
    pub const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    pub const GELU_TANH_C: f32 = 0.044_715;
    /// 1.5·2²³: adding it rounds a float in ±2²² to an integer held in the low mantissa bits.
    pub const ROUND_MAGIC: f32 = 12_582_912.0;
    /// Input clamp of the internal exp (`exp8_lean`).
    pub const EXP_LEAN_MIN: f32 = -87.3;
    pub const EXP_LEAN_MAX: f32 = 88.3;
}

use coeffs::*;

// ---------------------------------------------------------------------------------------------
// Scalar path: the same algorithms in plain f32 arithmetic (used without AVX2, and for tails
// nowhere: SIMD tails use masked loads so one element always gets the same answer).

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

/// x·Φ(x) (scalar path), with `q(t) = Φ(-t)` from the piecewise polynomial `GELU_Q` (see
/// `coeffs`): `x·q(|x|)` for x ≤ 0 and `x - x·q(|x|)` for x > 0, so negative x keeps its relative
/// accuracy (no `1 + erf` cancellation). It is `simd::gelu_erf` at one lane (`Lanes for f32`):
/// the scalar and vector paths agree bit for bit.
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

/// Beyond ±[`TAIL`], SiLU and the GELUs are `x` (x > 0) or -0 (x < 0; NaN at -inf).
const TAIL: f32 = 88.0;

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

// ---------------------------------------------------------------------------------------------
// SIMD algorithms, written once over `Lanes` and instantiated at 8 lanes (AVX2) and 16 (AVX-512).

pub(crate) mod simd {
    //! The vector algorithms the GEMM epilogue and the softmax use, generic over the vector width.
    //! Each is the same sequence of IEEE-exact lane operations at every width, so an AVX-512
    //! caller gets the AVX2 answer bit for bit (`kernels/tests/gemm.rs` checks every activation
    //! through both epilogues on a dense sweep, `kernels/tests/attention.rs` the softmax).
    //! All functions are `unsafe`: the caller is a `#[target_feature]` function of `V`'s ISA
    //! (none for `f32`, the scalar path).
    use super::*;
    use crate::lanes::Lanes;

    #[inline(always)]
    pub unsafe fn horner<V: Lanes>(t: V, c: &[f32]) -> V {
        unsafe {
            let mut acc = V::splat(c[c.len() - 1]);
            let mut i = c.len() - 1;
            while i > 0 {
                i -= 1;
                acc = acc.fmadd(t, V::splat(c[i]));
            }
            acc
        }
    }

    /// e^x for the internal uses (softmax, erf, tanh, GELU, sigmoid): one scaling step, so
    /// inputs are clamped to [-87.3, 88.3] and the results stay normal; below -87.3 the result
    /// is flushed to zero (not e^-87.3: a softmax weight of an -inf score must be an exact 0, or
    /// `weight·inf` in the value product turns 0·inf = NaN into ±inf). NaN propagates. Same
    /// accuracy as the full-range `exp8` inside that range.
    #[inline(always)]
    pub unsafe fn exp_lean<V: Lanes>(x: V) -> V {
        unsafe {
            let lo = V::splat(EXP_LEAN_MIN);
            // Set where x >= -87.3 or x is NaN (not-less-than, unordered is true).
            let keep = x.nlt(lo);
            let xc = lo.max(V::splat(EXP_LEAN_MAX).min(x));
            // The bias 127 rides along in the magic constant: t's low bits hold n + 127.
            let magic = V::splat(ROUND_MAGIC + 127.0);
            let t = xc.fmadd(V::splat(LOG2E), magic);
            let n = t.sub(magic);
            let r = n.fnmadd(V::splat(LN2_HI), xc);
            let r = n.fnmadd(V::splat(LN2_LO), r);
            let p = horner(r, &EXP_P);
            let y = p.fmadd(r.mul(r), r).add(V::splat(1.0));
            y.mul(t.shl23()).zero_unless(keep)
        }
    }

    /// erf(x): `x + x·Q(x²)` below the split, `±(1 - erfc(|x|))` above (see the module doc).
    #[inline(always)]
    pub unsafe fn erf<V: Lanes>(x: V) -> V {
        unsafe {
            let one = V::splat(1.0);
            let a = x.abs().min(V::splat(ERF_CLAMP));
            let t = a.mul(a);
            let small = a.lt(V::splat(ERF_SPLIT));
            let ys = x.fmadd(horner(t, &ERF_SMALL), x);
            if V::all(small) {
                return ys;
            }
            // erfc(a) for 0.9 <= a <= 10: exp(-a²)·R(1/(1 + a/2)).
            let v = one.div(a.fmadd(V::splat(0.5), one));
            let erfc = exp_lean(V::splat(0.0).sub(t)).mul(horner(v, &ERFC_T));
            let yb = one.sub(erfc).copysign(x);
            let y = V::select(small, ys, yb);
            // NaN: |NaN| compares false with the split, so it took the large branch; restore it.
            V::select(x.unord(x), x, y)
        }
    }

    #[inline(always)]
    pub unsafe fn tanh<V: Lanes>(x: V) -> V {
        unsafe {
            let a = x.abs().min(V::splat(TANH_CLAMP));
            let t = a.mul(a);
            let small = a.lt(V::splat(TANH_SPLIT));
            let ys = x.mul(t).fmadd(horner(t, &TANH_SMALL), x);
            if V::all(small) {
                return ys;
            }
            let one = V::splat(1.0);
            let e = exp_lean(a.add(a));
            let yb = one.sub(V::splat(2.0).div(e.add(one))).copysign(x);
            let y = V::select(small, ys, yb);
            V::select(x.unord(x), x, y)
        }
    }

    #[inline(always)]
    pub unsafe fn relu<V: Lanes>(x: V) -> V {
        // max returns its second operand when either is NaN: NaN stays NaN.
        unsafe { V::splat(0.0).max(x) }
    }

    #[inline(always)]
    pub unsafe fn sigmoid<V: Lanes>(x: V) -> V {
        unsafe {
            let one = V::splat(1.0);
            let e = exp_lean(V::splat(0.0).sub(x));
            one.div(one.add(e))
        }
    }

    /// `y`, with the tails of the module doc in the lanes where |x| > [`TAIL`]: `x` for x > 0,
    /// -0 for x < 0, NaN at -inf. The fix-up runs only when some lane is that large (never in
    /// a real model's activations), so the common path pays one compare and one branch.
    #[inline(always)]
    unsafe fn tails<V: Lanes>(x: V, y: V) -> V {
        unsafe {
            let big = x.abs().gt(V::splat(TAIL));
            if !V::any(big) {
                return y;
            }
            let pos = x.gt(V::splat(0.0));
            let t = V::select(pos, x, V::splat(-0.0));
            let t = V::select(x.eq(V::splat(f32::NEG_INFINITY)), V::splat(f32::NAN), t);
            V::select(big, t, y)
        }
    }

    #[inline(always)]
    pub unsafe fn silu<V: Lanes>(x: V) -> V {
        unsafe {
            let one = V::splat(1.0);
            let e = exp_lean(V::splat(0.0).sub(x));
            tails(x, x.div(one.add(e)))
        }
    }

    /// GELU (erf): `x - x·Φ(-|x|)` for x > 0, `x·Φ(-|x|)` otherwise, Φ(-|x|) a tabulated
    /// piecewise polynomial (see the scalar `gelu_erf` and `coeffs`). The scalar path runs this
    /// same definition at one lane.
    #[inline(always)]
    pub unsafe fn gelu_erf<V: Lanes>(x: V) -> V {
        unsafe { gelu_erf_n([x])[0] }
    }

    /// [`gelu_erf`] of K vectors at once, each step done for all K before the next: the table
    /// polynomial is a chain of dependent permute+FMA steps, and with one vector at a time the
    /// out-of-order window fills with ops waiting on that chain (in a GEMM tile's store, where
    /// it runs, nothing else is left to overlap). K chains side by side keep K times as many
    /// ops ready. Every element gets exactly the operations of the one-vector form.
    /// The degree-9 polynomial is two chains of 4 FMAs in s² (even and odd coefficients) joined
    /// by one, not one chain of 9: one multiply more, about half the latency. Measured on a Zen
    /// 4 (gemm_bench, three alternations): the AVX2 tile's 1024×384·384×1536 + bias + GELU went
    /// from 77–83% to 84–87% of the FMA peak on 1 thread (79–83% to 84–89% on 2); AVX-512 lost
    /// 1–2 points. (Full Estrin spilled on AVX2's 16 registers: 65–78%.)
    /// (Plain index loops: closures would not inherit the caller's target features.)
    #[inline(always)]
    pub unsafe fn gelu_erf_n<V: Lanes, const K: usize>(x: [V; K]) -> [V; K] {
        unsafe {
            let k = V::splat(GELU_K);
            let magic = V::splat(ROUND_MAGIC);
            let (mut u, mut r, mut s) = (x, x, x);
            for i in 0..K {
                let t = x[i].abs();
                u[i] = t.fmadd(k, V::splat(GELU_C));
                // The low mantissa bits of r hold j = round(u): the interval, and the table index.
                r[i] = u[i].add(magic);
                s[i] = t.fmsub(k, r[i].sub(magic));
            }
            // q = E(s²) + s·O(s²): the even and the odd coefficients as two Horner chains in
            // s², side by side, joined by one FMA (4 + 1 dependent FMAs after s² instead of 9).
            const { assert!(GELU_Q.len().is_multiple_of(2) && GELU_Q.len() >= 4) };
            let n = GELU_Q.len();
            let (mut qe, mut qo, mut s2) = (x, x, x);
            for i in 0..K {
                s2[i] = s[i].mul(s[i]);
                qe[i] = V::lookup8(r[i], &GELU_Q[n - 2]);
                qo[i] = V::lookup8(r[i], &GELU_Q[n - 1]);
            }
            for j in (0..n - 2).step_by(2).rev() {
                for i in 0..K {
                    qe[i] = qe[i].fmadd(s2[i], V::lookup8(r[i], &GELU_Q[j]));
                    qo[i] = qo[i].fmadd(s2[i], V::lookup8(r[i], &GELU_Q[j + 1]));
                }
            }
            let mut q = x;
            for i in 0..K {
                q[i] = qo[i].fmadd(s[i], qe[i]);
            }
            let mut y = x;
            for i in 0..K {
                // Past the table (and for NaN or inf): q = 0.
                let qi = q[i].zero_unless(u[i].lt(V::splat(GELU_U_END)));
                // x - x·q for x > 0 (min: +inf·0 would be NaN), x·q otherwise (NaN stays NaN,
                // -inf·0 is NaN, a large negative x gives -0).
                let pos = x[i].gt(V::splat(0.0));
                y[i] = V::select(pos, x[i].min(V::splat(f32::MAX)).fnmadd(qi, x[i]), x[i].mul(qi));
            }
            y
        }
    }

    /// See the scalar `gelu_tanh`: `x / (1 + exp(-2u))`.
    #[inline(always)]
    pub unsafe fn gelu_tanh<V: Lanes>(x: V) -> V {
        unsafe {
            let x3 = x.mul(x).mul(x);
            let u2 = x3.fmadd(V::splat(GELU_TANH_C), x).mul(V::splat(-2.0 * SQRT_2_OVER_PI));
            tails(x, x.div(V::splat(1.0).add(exp_lean(u2))))
        }
    }

    /// The activation of one vector.
    #[inline(always)]
    pub unsafe fn act<V: Lanes>(act: Activation, x: V) -> V {
        unsafe {
            match act {
                Activation::None => x,
                Activation::Relu => relu(x),
                Activation::GeluErf => gelu_erf(x),
                Activation::GeluTanh => gelu_tanh(x),
                Activation::Tanh => tanh(x),
                Activation::Sigmoid => sigmoid(x),
                Activation::Silu => silu(x),
            }
        }
    }

    /// The activation of K vectors: the GELU (erf) side by side ([`gelu_erf_n`]), the others
    /// one vector after another.
    #[inline(always)]
    pub unsafe fn act_n<V: Lanes, const K: usize>(a: Activation, x: [V; K]) -> [V; K] {
        unsafe {
            if a == Activation::GeluErf {
                return gelu_erf_n(x);
            }
            let mut y = x;
            for i in 0..K {
                y[i] = act(a, x[i]);
            }
            y
        }
    }
}

// ---------------------------------------------------------------------------------------------
// AVX2 + FMA path.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    //! Eight-lane versions. Every function here requires AVX2 and FMA: callers must have checked
    //! `is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")`.
    use super::*;
    use std::arch::x86_64::*;

    use super::coeffs::ROUND_MAGIC;

    /// e^x, full range: x > 88.72 gives +inf (the clamp at 100 keeps the two-step scale exact and
    /// lets 2⁶⁴·2⁶⁴ overflow), results down to the subnormals are produced, NaN propagates (the
    /// min/max operand order returns the NaN operand).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn exp8(x: __m256) -> __m256 {
        let xc = _mm256_max_ps(
            _mm256_set1_ps(EXP_MIN),
            _mm256_min_ps(_mm256_set1_ps(100.0), x),
        );
        let magic = _mm256_set1_ps(ROUND_MAGIC);
        let t = _mm256_fmadd_ps(xc, _mm256_set1_ps(LOG2E), magic);
        let n = _mm256_sub_ps(t, magic);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), xc);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
        // SAFETY: AVX2+FMA enabled on this function.
        let p = unsafe { simd::horner(r, &EXP_P) };
        let y = _mm256_add_ps(
            _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
            _mm256_set1_ps(1.0),
        );
        let ni = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(magic));
        let n1 = _mm256_srai_epi32::<1>(ni);
        let n2 = _mm256_sub_epi32(ni, n1);
        let bias = _mm256_set1_epi32(127);
        let s1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n1, bias)));
        let s2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias)));
        _mm256_mul_ps(_mm256_mul_ps(y, s1), s2)
    }

    /// e^x for the internal uses (softmax, erf, tanh, GELU, sigmoid): one scaling step, so
    /// inputs are clamped to [-87.3, 88.3] and the results stay normal; below -87.3 the result
    /// is flushed to zero (not e^-87.3: a softmax weight of an -inf score must be an exact 0, or
    /// `weight·inf` in the value product turns 0·inf = NaN into ±inf). NaN propagates. Same
    /// accuracy as `exp8` inside that range.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn exp8_lean(x: __m256) -> __m256 {
        // SAFETY: AVX2+FMA enabled on this function.
        unsafe { simd::exp_lean(x) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn erf8(x: __m256) -> __m256 {
        // SAFETY: AVX2+FMA enabled on this function.
        unsafe { simd::erf(x) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn tanh8(x: __m256) -> __m256 {
        // SAFETY: as above.
        unsafe { simd::tanh(x) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn relu8(x: __m256) -> __m256 {
        // SAFETY: as above.
        unsafe { simd::relu(x) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn sigmoid8(x: __m256) -> __m256 {
        // SAFETY: as above.
        unsafe { simd::sigmoid(x) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn silu8(x: __m256) -> __m256 {
        // SAFETY: as above.
        unsafe { simd::silu(x) }
    }

    /// See the scalar `gelu_erf` (the tabulated `x·Φ(x)`).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn gelu_erf8(x: __m256) -> __m256 {
        // SAFETY: as above.
        unsafe { simd::gelu_erf(x) }
    }

    /// See the scalar `gelu_tanh`: `x / (1 + exp(-2u))`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn gelu_tanh8(x: __m256) -> __m256 {
        // SAFETY: as above.
        unsafe { simd::gelu_tanh(x) }
    }

    /// Lane mask with the first `n` (0..=8) lanes set, for masked loads and stores.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn tail_mask(n: usize) -> __m256i {
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), idx)
    }

    macro_rules! map_fn {
        ($name:ident, $f:ident) => {
            /// Applies the function to `n` elements from `x` into `y` (`x == y` allowed).
            ///
            /// # Safety
            /// AVX2+FMA present; `x` readable and `y` writable for `n` f32; the ranges are identical
            /// or disjoint.
            #[target_feature(enable = "avx2,fma")]
            pub unsafe fn $name(x: *const f32, y: *mut f32, n: usize) {
                let mut i = 0;
                while i + 32 <= n {
                    // SAFETY: i + 32 <= n, within the caller's ranges. Four independent vectors per
                    // step give the out-of-order core more independent work.
                    unsafe {
                        let a = $f(_mm256_loadu_ps(x.add(i)));
                        let b = $f(_mm256_loadu_ps(x.add(i + 8)));
                        let c = $f(_mm256_loadu_ps(x.add(i + 16)));
                        let d = $f(_mm256_loadu_ps(x.add(i + 24)));
                        _mm256_storeu_ps(y.add(i), a);
                        _mm256_storeu_ps(y.add(i + 8), b);
                        _mm256_storeu_ps(y.add(i + 16), c);
                        _mm256_storeu_ps(y.add(i + 24), d);
                    }
                    i += 32;
                }
                while i + 8 <= n {
                    // SAFETY: i + 8 <= n, within the caller's ranges.
                    unsafe { _mm256_storeu_ps(y.add(i), $f(_mm256_loadu_ps(x.add(i)))) };
                    i += 8;
                }
                if i < n {
                    let m = tail_mask(n - i);
                    // SAFETY: masked lanes beyond n are neither read nor written.
                    unsafe {
                        _mm256_maskstore_ps(y.add(i), m, $f(_mm256_maskload_ps(x.add(i), m)))
                    };
                }
            }
        };
    }

    map_fn!(map_exp, exp8);
    map_fn!(map_erf, erf8);
    map_fn!(map_tanh, tanh8);
    map_fn!(map_relu, relu8);
    map_fn!(map_sigmoid, sigmoid8);
    map_fn!(map_silu, silu8);
    map_fn!(map_gelu_erf, gelu_erf8);
    map_fn!(map_gelu_tanh, gelu_tanh8);
}

/// Applies `f` elementwise from `x` into `y` (the two ranges identical or disjoint).
///
/// # Safety
/// `x` readable and `y` writable for `n` f32; the ranges identical or disjoint.
pub(crate) unsafe fn map_raw(f: Unary, x: *const f32, y: *mut f32, n: usize, isa: crate::Isa) {
    #[cfg(target_arch = "x86_64")]
    if crate::effective_isa(isa).has_avx2() {
        // SAFETY: AVX2+FMA detected by effective_isa; pointer contract forwarded from the caller.
        unsafe {
            match f {
                Unary::Exp => avx2::map_exp(x, y, n),
                Unary::Erf => avx2::map_erf(x, y, n),
                Unary::Act(Activation::None) => {
                    if !std::ptr::eq(x, y) {
                        std::ptr::copy_nonoverlapping(x, y, n)
                    }
                }
                Unary::Act(Activation::Relu) => avx2::map_relu(x, y, n),
                Unary::Act(Activation::Tanh) => avx2::map_tanh(x, y, n),
                Unary::Act(Activation::Sigmoid) => avx2::map_sigmoid(x, y, n),
                Unary::Act(Activation::Silu) => avx2::map_silu(x, y, n),
                Unary::Act(Activation::GeluErf) => avx2::map_gelu_erf(x, y, n),
                Unary::Act(Activation::GeluTanh) => avx2::map_gelu_tanh(x, y, n),
            }
        }
        return;
    }
    let _ = isa;
    for i in 0..n {
        // SAFETY: i < n, within the caller's ranges; each element is read before it is written.
        unsafe { *y.add(i) = f.apply(*x.add(i)) };
    }
}

/// `dst[i] = f(src[i])` with the best ISA of this machine.
pub fn map(f: Unary, src: &[f32], dst: &mut [f32]) -> Result<(), crate::KernelError> {
    map_with_isa(f, src, dst, crate::detect_isa())
}

/// `dst[i] = f(src[i])` with a chosen ISA (Scalar forces the portable path; used by tests).
pub fn map_with_isa(
    f: Unary,
    src: &[f32],
    dst: &mut [f32],
    isa: crate::Isa,
) -> Result<(), crate::KernelError> {
    crate::error::check_len("map dst", dst.len(), src.len())?;
    // SAFETY: src and dst are distinct borrows (disjoint) of at least src.len() elements.
    unsafe { map_raw(f, src.as_ptr(), dst.as_mut_ptr(), src.len(), isa) };
    Ok(())
}

/// `x[i] = f(x[i])` in place with the best ISA of this machine.
pub fn map_inplace(f: Unary, x: &mut [f32]) {
    let p = x.as_mut_ptr();
    // SAFETY: identical ranges are allowed by map_raw.
    unsafe { map_raw(f, p, p, x.len(), crate::detect_isa()) };
}

// ---------------------------------------------------------------------------------------------
// Softmax rows

/// Adds `mask[0..n]` (if not null) to `x[0..n]`, replaces it by `exp(x - max)` and returns
/// `(max, sum)`. A row whose max is -inf (fully masked) is set to zeros and returns sum 0.
///
/// # Safety
/// `x` readable and writable for `n` floats; `mask` null or readable for `n` floats.
pub(crate) unsafe fn exp_shift_sum_raw(
    x: *mut f32,
    mask: *const f32,
    n: usize,
    isa: crate::Isa,
) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if crate::effective_isa(isa).has_avx2() {
        if crate::effective_isa(isa) == crate::Isa::Avx512 {
            // SAFETY: AVX-512F (and AVX2+FMA) detected; pointer contract forwarded.
            return unsafe { avx2_softmax::exp_shift_sum_512(x, mask, n) };
        }
        // SAFETY: AVX2+FMA detected; pointer contract forwarded.
        return unsafe { avx2_softmax::exp_shift_sum(x, mask, n) };
    }
    let _ = isa;
    // SAFETY: n floats at x (caller contract).
    let row = unsafe { std::slice::from_raw_parts_mut(x, n) };
    if !mask.is_null() {
        for (j, v) in row.iter_mut().enumerate() {
            // SAFETY: j < n floats at mask (caller contract).
            *v += unsafe { *mask.add(j) };
        }
    }
    let mx = row
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    if mx == f32::NEG_INFINITY {
        return masked_row(row);
    }
    let mut sum = 0.0f32;
    for v in row.iter_mut() {
        *v = exp(*v - mx);
        sum += *v;
    }
    (mx, sum)
}

/// A row whose max is -inf: fully masked (zeros, sum 0), unless it holds a NaN, which the max
/// (`maxps` keeps its second operand) may have skipped: then the row is NaN.
#[cold]
fn masked_row(row: &mut [f32]) -> (f32, f32) {
    if row.iter().any(|v| v.is_nan()) {
        row.fill(f32::NAN);
        return (f32::NAN, f32::NAN);
    }
    row.fill(0.0);
    (f32::NEG_INFINITY, 0.0)
}

/// In-place row softmax of `rows` rows of `cols` floats at row stride `ld`.
/// Fully masked rows (all -inf) become zeros.
///
/// # Safety
/// `x` readable and writable over the rows×cols view at stride ld.
pub(crate) unsafe fn softmax_rows_raw(
    x: *mut f32,
    rows: usize,
    cols: usize,
    ld: usize,
    isa: crate::Isa,
) {
    for r in 0..rows {
        // SAFETY: row r of the view.
        unsafe {
            let p = x.add(r * ld);
            let (_, sum) = exp_shift_sum_raw(p, std::ptr::null(), cols, isa);
            let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
            scale_raw(p, cols, inv, isa);
        }
    }
}

/// `x[0..n] *= s`.
///
/// # Safety
/// `x` readable and writable for `n` floats.
pub(crate) unsafe fn scale_raw(x: *mut f32, n: usize, s: f32, isa: crate::Isa) {
    #[cfg(target_arch = "x86_64")]
    if crate::effective_isa(isa).has_avx2() {
        // SAFETY: AVX2 detected; pointer contract forwarded.
        unsafe { avx2_softmax::scale(x, n, s) };
        return;
    }
    let _ = isa;
    for i in 0..n {
        // SAFETY: i < n.
        unsafe { *x.add(i) *= s };
    }
}

/// Row softmax in place over a rows×cols view with row stride `ld` (best ISA).
pub fn softmax_rows(
    x: &mut [f32],
    rows: usize,
    cols: usize,
    ld: usize,
) -> Result<(), crate::KernelError> {
    crate::error::check_len(
        "softmax x",
        x.len(),
        crate::error::span("softmax x", rows, cols, ld)?,
    )?;
    // SAFETY: extent checked above.
    unsafe { softmax_rows_raw(x.as_mut_ptr(), rows, cols, ld, crate::detect_isa()) };
    Ok(())
}

#[cfg(target_arch = "x86_64")]
mod avx2_softmax {
    use super::avx2::{exp8_lean, tail_mask};
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hmax(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
        _mm_cvtss_f32(m)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
        _mm_cvtss_f32(s)
    }

    /// # Safety
    /// AVX2+FMA present; `x` readable and writable for `n` floats; `mask` null or readable for `n`.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn exp_shift_sum(x: *mut f32, mask: *const f32, n: usize) -> (f32, f32) {
        // Full vectors use plain loads/stores; only the tail is masked (AMD's masked stores are
        // slow). Two accumulators per pass hide the max/add latency.
        let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
        let (mut m0, mut m1) = (ninf, ninf);
        let mut i = 0;
        // SAFETY (both passes): full vectors at i + 8 <= n, tail lanes masked to < n.
        unsafe {
            if !mask.is_null() {
                // Masked: x += mask first, taking the max on the way.
                while i + 8 <= n {
                    let v = _mm256_add_ps(_mm256_loadu_ps(x.add(i)), _mm256_loadu_ps(mask.add(i)));
                    _mm256_storeu_ps(x.add(i), v);
                    m0 = _mm256_max_ps(m0, v);
                    i += 8;
                }
                if i < n {
                    let m = tail_mask(n - i);
                    let v = _mm256_add_ps(
                        _mm256_maskload_ps(x.add(i), m),
                        _mm256_maskload_ps(mask.add(i), m),
                    );
                    _mm256_maskstore_ps(x.add(i), m, v);
                    i = n;
                    m1 = _mm256_max_ps(m1, _mm256_blendv_ps(ninf, v, _mm256_castsi256_ps(m)));
                }
            }
            while i + 16 <= n {
                m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x.add(i)));
                m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x.add(i + 8)));
                i += 16;
            }
            while i + 8 <= n {
                m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x.add(i)));
                i += 8;
            }
            if i < n {
                let m = tail_mask(n - i);
                let v = _mm256_maskload_ps(x.add(i), m);
                m1 = _mm256_max_ps(m1, _mm256_blendv_ps(ninf, v, _mm256_castsi256_ps(m)));
            }
        }
        let mx = hmax(_mm256_max_ps(m0, m1));
        if mx == f32::NEG_INFINITY {
            // SAFETY: n floats at x.
            return super::masked_row(unsafe { std::slice::from_raw_parts_mut(x, n) });
        }
        let mxv = _mm256_set1_ps(mx);
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        i = 0;
        // SAFETY: as above.
        let (s0, s1) = unsafe {
            while i + 16 <= n {
                let e0 = exp8_lean(_mm256_sub_ps(_mm256_loadu_ps(x.add(i)), mxv));
                let e1 = exp8_lean(_mm256_sub_ps(_mm256_loadu_ps(x.add(i + 8)), mxv));
                _mm256_storeu_ps(x.add(i), e0);
                _mm256_storeu_ps(x.add(i + 8), e1);
                s0 = _mm256_add_ps(s0, e0);
                s1 = _mm256_add_ps(s1, e1);
                i += 16;
            }
            rest(x, i, n, mxv, s0, s1)
        };
        (mx, hsum(_mm256_add_ps(s0, s1)))
    }

    /// The last < 16 floats of the exp pass (one full vector into `s0`, the masked tail into
    /// `s1`), shared by both widths so their sums see the same additions.
    ///
    /// # Safety
    /// AVX2+FMA present; `x` readable and writable for `n` floats, `n - i < 16`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rest(x: *mut f32, mut i: usize, n: usize, mxv: __m256, mut s0: __m256, mut s1: __m256) -> (__m256, __m256) {
        // SAFETY: a full vector at i + 8 <= n, tail lanes masked to < n.
        unsafe {
            if i + 8 <= n {
                let e = exp8_lean(_mm256_sub_ps(_mm256_loadu_ps(x.add(i)), mxv));
                _mm256_storeu_ps(x.add(i), e);
                s0 = _mm256_add_ps(s0, e);
                i += 8;
            }
            if i < n {
                let m = tail_mask(n - i);
                let e = exp8_lean(_mm256_sub_ps(_mm256_maskload_ps(x.add(i), m), mxv));
                let e = _mm256_and_ps(e, _mm256_castsi256_ps(m));
                _mm256_maskstore_ps(x.add(i), m, e);
                s1 = _mm256_add_ps(s1, e);
            }
        }
        (s0, s1)
    }

    /// [`exp_shift_sum`] with 16-lane exponentials. The AVX2 version sums each 16-float chunk
    /// into two 8-lane accumulators (low and high half); here one 16-lane accumulator holds both
    /// halves, and the last < 16 floats go through the AVX2 code with the halves split back out,
    /// so every partial sum sees the same additions in the same order: bitwise the same result.
    ///
    /// # Safety
    /// AVX-512F and AVX2+FMA present; as [`exp_shift_sum`].
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(crate) unsafe fn exp_shift_sum_512(x: *mut f32, mask: *const f32, n: usize) -> (f32, f32) {
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut mv = ninf;
        let mut i = 0;
        // SAFETY (both passes): full vectors at i + 16 <= n, masked lanes < n.
        unsafe {
            while i < n {
                let w = (n - i).min(16);
                let k: __mmask16 = if w == 16 { 0xFFFF } else { (1u16 << w) - 1 };
                let mut v = _mm512_mask_loadu_ps(ninf, k, x.add(i));
                if !mask.is_null() {
                    v = _mm512_add_ps(v, _mm512_mask_loadu_ps(ninf, k, mask.add(i)));
                    _mm512_mask_storeu_ps(x.add(i), k, v);
                }
                // The max does not depend on the order (a NaN anywhere makes the row NaN below,
                // whichever max it leaves).
                mv = _mm512_max_ps(mv, v);
                i += 16;
            }
        }
        let mx = _mm512_reduce_max_ps(mv);
        if mx == f32::NEG_INFINITY {
            // SAFETY: n floats at x.
            return super::masked_row(unsafe { std::slice::from_raw_parts_mut(x, n) });
        }
        let mxv = _mm512_set1_ps(mx);
        let mut s = _mm512_setzero_ps();
        i = 0;
        // SAFETY: as above.
        unsafe {
            while i + 16 <= n {
                let e = super::simd::exp_lean(_mm512_sub_ps(_mm512_loadu_ps(x.add(i)), mxv));
                _mm512_storeu_ps(x.add(i), e);
                s = _mm512_add_ps(s, e);
                i += 16;
            }
        }
        let s0 = _mm512_castps512_ps256(s);
        let s1 = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(s)));
        // SAFETY: as above; the rest (< 16 floats) exactly as in `exp_shift_sum`.
        let (s0, s1) = unsafe { rest(x, i, n, _mm256_set1_ps(mx), s0, s1) };
        (mx, hsum(_mm256_add_ps(s0, s1)))
    }

    /// # Safety
    /// AVX2 present; `x` readable and writable for `n` floats.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn scale(x: *mut f32, n: usize, s: f32) {
        let sv = _mm256_set1_ps(s);
        let mut i = 0;
        // SAFETY: full vectors at i + 8 <= n, tail lanes masked to < n.
        unsafe {
            while i + 8 <= n {
                _mm256_storeu_ps(x.add(i), _mm256_mul_ps(_mm256_loadu_ps(x.add(i)), sv));
                i += 8;
            }
            if i < n {
                let m = tail_mask(n - i);
                _mm256_maskstore_ps(
                    x.add(i),
                    m,
                    _mm256_mul_ps(_mm256_maskload_ps(x.add(i), m), sv),
                );
            }
        }
    }
}
