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
/// Input clamp of the internal exp (`simd::exp_lean`).
pub const EXP_LEAN_MIN: f32 = -87.3;
pub const EXP_LEAN_MAX: f32 = 88.3;
