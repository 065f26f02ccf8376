//! The constants of every approximation here, public so that a code generator emitting the same
//! algorithms inline (e.g. Cranelift IR for elementwise kernels) uses bit-identical coefficients.

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
/// GELU (erf form) as `x·Φ(x)`, `Φ(x) ≈ 1/2 + xc·P(xc²)/Q(xc²)` with xc = x clamped to
/// ±`GELU_CLAMP` (4√2, where erf(x/√2) is ±1 in f32): P of degree 6, Q of degree 4, fitted for
/// the absolute error of Φ (2.7e-8 on [0, 4√2] in f64) by `scripts/fit_gelu.py`, which also
/// checks the f32 evaluation of `simd::gelu_erf_n`: absolute error at most 9.5e-7 (at x ≈ 4.6,
/// relative 2.2e-7), relative 2.1e-7 on [0, 3), 2.2e-7 on [3, 6), 8.0e-5 on [-3, 0) and up to
/// 11× the (tiny) value on [-6, -3), where |GELU| < 4e-3 and the absolute error is below 7.4e-7;
/// -0 below -4√2 (an absolute error below |GELU(-4√2)| = 4.4e-8).
pub const GELU_CLAMP: f32 = 5.656854e+00;
pub const GELU_P: [f32; 7] = [3.989421e-01, 3.78204e-02, 4.634505e-03, 1.897275e-04, 3.436905e-06, -2.1990134e-08, 1.0616101e-10];
pub const GELU_Q: [f32; 5] = [1.0e+00, 2.6146552e-01, 3.0199884e-02, 1.9438841e-03, 6.862723e-05];

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
/// Input clamp of the internal exp (`simd::exp_lean`).
pub const EXP_LEAN_MIN: f32 = -87.3;
pub const EXP_LEAN_MAX: f32 = 88.3;
