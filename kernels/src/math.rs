//! Vectorized transcendental approximations (exp, erf, tanh, sigmoid, SiLU, GELU) and the
//! activation functions of GEMM epilogues.
//!
//! Methods (coefficients fitted for this crate by weighted least squares + Lawson iterations toward
//! minimax relative error, in 40-digit arithmetic, then rounded to f32):
//! - `exp`: Cody–Waite range reduction `x = n·ln2 + r`, |r| ≤ ln2/2, with a two-constant ln2 split,
//!   `exp(r) ≈ 1 + r + r²·P(r)` (P of degree 4, fit error 3e-9), then scaling by 2ⁿ in two halves so
//!   results down to the subnormal range come out right. x > 88.7228 gives +inf, x < -104 gives 0.
//! - `erf`: `x·P(x²)/Q(x²)` rational of degree 13/10 on [-4, 4] (fit error 2e-9; 5e-8 once the
//!   coefficients are f32), clamped to ±1 outside (erf(4) rounds to 1 in f32). No cancellation near 0.
//! - `tanh`: `x·P(x²)/Q(x²)` rational of degree 11/10 on [-9, 9] (fit error 4e-11; 3e-8 in f32),
//!   ±1 outside.
//! - `sigmoid(x) = 1/(1+exp(-x))`, `silu(x) = x·sigmoid(x)`, `gelu_erf(x) = x/2·(1+erf(x/√2))`,
//!   `gelu_tanh(x) = x/2·(1+tanh(√(2/π)(x+0.044715x³)))`.
//!
//! Measured maximum errors against f64 (dense sweep, see `tests/math.rs`), AVX2 path:
//! see the table in `tests/math.rs` and the crate report; the test asserts the bounds stated there.
//! NaN inputs give NaN outputs.

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

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln2 = LN2_HI + LN2_LO; LN2_HI has 9 significant bits so n·LN2_HI is exact for |n| ≤ 2^15.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Above this exp overflows f32.
const EXP_MAX: f32 = 88.722_83;
/// Below this exp is below half the smallest subnormal.
const EXP_MIN: f32 = -104.0;
/// exp(r) ≈ 1 + r + r²·(E0 + E1 r + E2 r² + E3 r³ + E4 r⁴) on |r| ≤ ln2/2.
const EXP_P: [f32; 5] = [0.499_999_94, 0.166_665_21, 0.041_668_39, 0.008_368_71, 0.001_381_460_8];

const ERF_CLAMP: f32 = 4.0;
/// erf(x) ≈ x·N(x²)/D(x²), N = Σ ERF_N[i] t^i, D = 1 + Σ ERF_D[i] t^(i+1).
const ERF_N: [f32; 7] = [
    1.128_379_2,
    0.185_204_6,
    0.054_316_9,
    0.003_849_642_1,
    0.000_379_601_23,
    4.684_539_8e-6,
    -1.320_109_2e-8,
];
const ERF_D: [f32; 5] = [0.497_466_7, 0.113_958_81, 0.015_462_125, 0.001_307_565_8, 6.310_834e-5];

const TANH_CLAMP: f32 = 9.0;
/// tanh(x) ≈ x·N(x²)/D(x²).
const TANH_N: [f32; 6] = [1.0, 0.140_999_47, 0.004_426_931_5, 4.229_911_8e-5, 1.113_224_6e-7, 3.683_634_6e-11];
const TANH_D: [f32; 5] = [0.474_332_8, 0.029_204_53, 0.000_501_023_4, 2.606_217_5e-6, 2.956_620_5e-9];

const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// √(2/π)
const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_TANH_C: f32 = 0.044_715;

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
    let x = x.max(EXP_MIN);
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

/// erf(x) (scalar path).
#[inline]
pub fn erf(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let x = x.clamp(-ERF_CLAMP, ERF_CLAMP);
    let t = x * x;
    let num = x * horner(t, &ERF_N);
    let den = horner(t, &ERF_D) * t + 1.0;
    (num / den).clamp(-1.0, 1.0)
}

/// tanh(x) (scalar path).
#[inline]
pub fn tanh(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let x = x.clamp(-TANH_CLAMP, TANH_CLAMP);
    let t = x * x;
    let num = x * horner(t, &TANH_N);
    let den = horner(t, &TANH_D) * t + 1.0;
    (num / den).clamp(-1.0, 1.0)
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
    x / (1.0 + exp(-x))
}

/// x/2·(1 + erf(x/√2)) (scalar path).
#[inline]
pub fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * FRAC_1_SQRT_2))
}

/// x/2·(1 + tanh(√(2/π)(x + 0.044715x³))) (scalar path).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    let u = SQRT_2_OVER_PI * (x + GELU_TANH_C * x * x * x);
    0.5 * x * (1.0 + tanh(u))
}

// ---------------------------------------------------------------------------------------------
// AVX2 + FMA path.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    //! Eight-lane versions. Every function here requires AVX2 and FMA: callers must have checked
    //! `is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")`.
    use super::*;
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn horner8(t: __m256, c: &[f32]) -> __m256 {
        let mut acc = _mm256_set1_ps(c[c.len() - 1]);
        let mut i = c.len() - 1;
        while i > 0 {
            i -= 1;
            acc = _mm256_fmadd_ps(acc, t, _mm256_set1_ps(c[i]));
        }
        acc
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn is_nan(x: __m256) -> __m256 {
        _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn exp8(x: __m256) -> __m256 {
        let nan = is_nan(x);
        let over = _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(EXP_MAX));
        let xc = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(EXP_MAX)), _mm256_set1_ps(EXP_MIN));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
            xc,
            _mm256_set1_ps(LOG2E),
        ));
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), xc);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
        let p = horner8(r, &EXP_P);
        let y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0));
        let ni = _mm256_cvtps_epi32(n);
        let n1 = _mm256_srai_epi32::<1>(ni);
        let n2 = _mm256_sub_epi32(ni, n1);
        let bias = _mm256_set1_epi32(127);
        let s1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n1, bias)));
        let s2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias)));
        let y = _mm256_mul_ps(_mm256_mul_ps(y, s1), s2);
        let y = _mm256_blendv_ps(y, _mm256_set1_ps(f32::INFINITY), over);
        _mm256_blendv_ps(y, x, nan)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn odd_rational(x: __m256, clamp: f32, num: &[f32], den: &[f32]) -> __m256 {
        let nan = is_nan(x);
        let xc = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(clamp)), _mm256_set1_ps(-clamp));
        let t = _mm256_mul_ps(xc, xc);
        let n = _mm256_mul_ps(xc, horner8(t, num));
        let d = _mm256_fmadd_ps(horner8(t, den), t, _mm256_set1_ps(1.0));
        let y = _mm256_div_ps(n, d);
        let y = _mm256_max_ps(_mm256_min_ps(y, _mm256_set1_ps(1.0)), _mm256_set1_ps(-1.0));
        _mm256_blendv_ps(y, x, nan)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn erf8(x: __m256) -> __m256 {
        odd_rational(x, ERF_CLAMP, &ERF_N, &ERF_D)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn tanh8(x: __m256) -> __m256 {
        odd_rational(x, TANH_CLAMP, &TANH_N, &TANH_D)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn relu8(x: __m256) -> __m256 {
        // max_ps returns its second operand when either is NaN: NaN stays NaN.
        _mm256_max_ps(_mm256_setzero_ps(), x)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn sigmoid8(x: __m256) -> __m256 {
        let one = _mm256_set1_ps(1.0);
        let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_div_ps(one, _mm256_add_ps(one, e))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn silu8(x: __m256) -> __m256 {
        let one = _mm256_set1_ps(1.0);
        let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        _mm256_div_ps(x, _mm256_add_ps(one, e))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn gelu_erf8(x: __m256) -> __m256 {
        let e = erf8(_mm256_mul_ps(x, _mm256_set1_ps(FRAC_1_SQRT_2)));
        let hx = _mm256_mul_ps(x, _mm256_set1_ps(0.5));
        _mm256_fmadd_ps(hx, e, hx)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn gelu_tanh8(x: __m256) -> __m256 {
        let x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
        let u = _mm256_mul_ps(_mm256_fmadd_ps(x3, _mm256_set1_ps(GELU_TANH_C), x), _mm256_set1_ps(SQRT_2_OVER_PI));
        let th = tanh8(u);
        let hx = _mm256_mul_ps(x, _mm256_set1_ps(0.5));
        _mm256_fmadd_ps(hx, th, hx)
    }

    /// The activation of eight lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub fn act8(act: Activation, x: __m256) -> __m256 {
        match act {
            Activation::None => x,
            Activation::Relu => relu8(x),
            Activation::GeluErf => gelu_erf8(x),
            Activation::GeluTanh => gelu_tanh8(x),
            Activation::Tanh => tanh8(x),
            Activation::Sigmoid => sigmoid8(x),
            Activation::Silu => silu8(x),
        }
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
                while i + 8 <= n {
                    // SAFETY: i + 8 <= n, within the caller's ranges.
                    unsafe { _mm256_storeu_ps(y.add(i), $f(_mm256_loadu_ps(x.add(i)))) };
                    i += 8;
                }
                if i < n {
                    let m = tail_mask(n - i);
                    // SAFETY: masked lanes beyond n are neither read nor written.
                    unsafe { _mm256_maskstore_ps(y.add(i), m, $f(_mm256_maskload_ps(x.add(i), m))) };
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
    if crate::effective_isa(isa) == crate::Isa::Avx2Fma {
        // SAFETY: AVX2+FMA detected by effective_isa; pointer contract forwarded from the caller.
        unsafe {
            match f {
                Unary::Exp => avx2::map_exp(x, y, n),
                Unary::Erf => avx2::map_erf(x, y, n),
                Unary::Act(Activation::None) => {
                    if x != y as *const f32 {
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
pub fn map_with_isa(f: Unary, src: &[f32], dst: &mut [f32], isa: crate::Isa) -> Result<(), crate::KernelError> {
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
