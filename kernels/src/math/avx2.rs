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
pub fn relu6_8(x: __m256) -> __m256 {
    // SAFETY: as above.
    unsafe { simd::relu6(x) }
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
map_fn!(map_relu6, relu6_8);
map_fn!(map_sigmoid, sigmoid8);
map_fn!(map_silu, silu8);
map_fn!(map_gelu_erf, gelu_erf8);
map_fn!(map_gelu_tanh, gelu_tanh8);
