//! One vector of f32 lanes, as the operations the vector math needs: [`Lanes`] for `__m256`
//! (AVX2+FMA, 8 lanes), `__m512` (AVX-512F, 16 lanes) and `f32` (one lane, plain Rust: the
//! scalar path runs the same definitions and gets the same bits).
//!
//! The activations are written once, generic over `Lanes` (`math::simd`), and instantiated at both
//! widths, so the AVX-512 GEMM epilogue does per element exactly the operations of the AVX2 one:
//! every operation here is an IEEE-exact lane-wise instruction (add, mul, div, fma, min, max,
//! compares, bit operations, table lookups by permutes), so the two widths give bit-identical results by construction.
//! Estimates such as `rcp14` that differ between the ISAs (and between vendors) are left out on
//! purpose. (A portable-SIMD crate would give the same abstraction; std::simd is unstable and the
//! stable ones do not expose `vfmadd`/masked-compare semantics at both widths without dispatch of
//! their own, so this is the dozen methods the math uses and no more.)
//!
//! Every method is `#[inline(always)]` and `unsafe`: the caller is a `#[target_feature]` function
//! of the matching ISA (AVX2+FMA for `__m256`, AVX-512F for `__m512`), into which the method and
//! its intrinsic inline.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

// SAFETY: plain f32 arithmetic, no ISA requirement. Each method is the one-lane form of the x86
// instruction the vector impls use (`mul_add` rounds once like `vfmadd`; min/max return `b` on
// NaN like `vminps`/`vmaxps`), so the scalar path gives the vector paths' bits.
unsafe impl Lanes for f32 {
    type Mask = bool;
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        x
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        self + b
    }
    #[inline(always)]
    unsafe fn sub(self, b: Self) -> Self {
        self - b
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        self * b
    }
    #[inline(always)]
    unsafe fn div(self, b: Self) -> Self {
        self / b
    }
    #[inline(always)]
    unsafe fn fmadd(self, b: Self, c: Self) -> Self {
        self.mul_add(b, c)
    }
    #[inline(always)]
    unsafe fn fnmadd(self, b: Self, c: Self) -> Self {
        (-self).mul_add(b, c)
    }
    #[inline(always)]
    unsafe fn min(self, b: Self) -> Self {
        if self < b { self } else { b }
    }
    #[inline(always)]
    unsafe fn max(self, b: Self) -> Self {
        if self > b { self } else { b }
    }
    #[inline(always)]
    unsafe fn abs(self) -> Self {
        f32::from_bits(self.to_bits() & 0x7fff_ffff)
    }
    #[inline(always)]
    unsafe fn copysign(self, sign: Self) -> Self {
        f32::copysign(self, sign)
    }
    #[inline(always)]
    unsafe fn unord(self, b: Self) -> bool {
        self.is_nan() || b.is_nan()
    }
    #[inline(always)]
    unsafe fn lt(self, b: Self) -> bool {
        self < b
    }
    #[inline(always)]
    unsafe fn gt(self, b: Self) -> bool {
        self > b
    }
    #[inline(always)]
    unsafe fn eq(self, b: Self) -> bool {
        self == b
    }
    #[inline(always)]
    unsafe fn nlt(self, b: Self) -> bool {
        // Not less: true when unordered (NaN), as `_CMP_NLT_UQ`.
        self.partial_cmp(&b) != Some(std::cmp::Ordering::Less)
    }
    #[inline(always)]
    unsafe fn select(m: bool, t: Self, f: Self) -> Self {
        if m { t } else { f }
    }
    #[inline(always)]
    unsafe fn zero_unless(self, m: bool) -> Self {
        if m { self } else { 0.0 }
    }
    #[inline(always)]
    unsafe fn any(m: bool) -> bool {
        m
    }
    #[inline(always)]
    unsafe fn all(m: bool) -> bool {
        m
    }
    #[inline(always)]
    unsafe fn shl23(self) -> Self {
        f32::from_bits(self.to_bits() << 23)
    }
}

/// A vector of f32 lanes. `Mask` is the result of a lane-wise compare.
///
/// # Safety
/// Implementations call ISA intrinsics: every method may be called only where that ISA is present.
pub(crate) unsafe trait Lanes: Copy {
    type Mask: Copy;
    unsafe fn splat(x: f32) -> Self;
    unsafe fn add(self, b: Self) -> Self;
    unsafe fn sub(self, b: Self) -> Self;
    unsafe fn mul(self, b: Self) -> Self;
    unsafe fn div(self, b: Self) -> Self;
    /// `self·b + c`, one rounding.
    unsafe fn fmadd(self, b: Self, c: Self) -> Self;
    /// `c - self·b`, one rounding.
    unsafe fn fnmadd(self, b: Self, c: Self) -> Self;
    /// `vminps` semantics: `b` when either lane is NaN.
    unsafe fn min(self, b: Self) -> Self;
    /// `vmaxps` semantics: `b` when either lane is NaN.
    unsafe fn max(self, b: Self) -> Self;
    /// The sign bit cleared.
    unsafe fn abs(self) -> Self;
    /// The magnitude of `self` with the sign bit of `sign`.
    unsafe fn copysign(self, sign: Self) -> Self;
    /// Either lane NaN.
    unsafe fn unord(self, b: Self) -> Self::Mask;
    /// `self < b`, false for NaN.
    unsafe fn lt(self, b: Self) -> Self::Mask;
    /// `self > b`, false for NaN.
    unsafe fn gt(self, b: Self) -> Self::Mask;
    /// `self == b`, false for NaN.
    unsafe fn eq(self, b: Self) -> Self::Mask;
    /// `!(self < b)`: true for NaN.
    unsafe fn nlt(self, b: Self) -> Self::Mask;
    /// Lanes of `t` where `m` is set, of `f` elsewhere.
    unsafe fn select(m: Self::Mask, t: Self, f: Self) -> Self;
    /// Lanes of `self` where `m` is set, +0 elsewhere.
    unsafe fn zero_unless(self, m: Self::Mask) -> Self;
    /// Whether any lane of `m` is set.
    unsafe fn any(m: Self::Mask) -> bool;
    /// Whether every lane of `m` is set.
    unsafe fn all(m: Self::Mask) -> bool;
    /// The bits of each lane shifted left by 23 (an integer `n + 127` in the low bits becomes 2ⁿ).
    unsafe fn shl23(self) -> Self;
}

#[cfg(target_arch = "x86_64")]
// SAFETY: each method calls AVX/AVX2/FMA intrinsics only; the trait's contract puts the ISA check
// on the caller.
unsafe impl Lanes for __m256 {
    type Mask = __m256;
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        unsafe { _mm256_add_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn sub(self, b: Self) -> Self {
        unsafe { _mm256_sub_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        unsafe { _mm256_mul_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn div(self, b: Self) -> Self {
        unsafe { _mm256_div_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn fmadd(self, b: Self, c: Self) -> Self {
        unsafe { _mm256_fmadd_ps(self, b, c) }
    }
    #[inline(always)]
    unsafe fn fnmadd(self, b: Self, c: Self) -> Self {
        unsafe { _mm256_fnmadd_ps(self, b, c) }
    }
    #[inline(always)]
    unsafe fn min(self, b: Self) -> Self {
        unsafe { _mm256_min_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn max(self, b: Self) -> Self {
        unsafe { _mm256_max_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn abs(self) -> Self {
        unsafe { _mm256_andnot_ps(_mm256_set1_ps(-0.0), self) }
    }
    #[inline(always)]
    unsafe fn copysign(self, sign: Self) -> Self {
        unsafe {
            let s = _mm256_set1_ps(-0.0);
            _mm256_or_ps(_mm256_andnot_ps(s, self), _mm256_and_ps(s, sign))
        }
    }
    #[inline(always)]
    unsafe fn unord(self, b: Self) -> Self::Mask {
        unsafe { _mm256_cmp_ps::<_CMP_UNORD_Q>(self, b) }
    }
    #[inline(always)]
    unsafe fn lt(self, b: Self) -> Self::Mask {
        unsafe { _mm256_cmp_ps::<_CMP_LT_OQ>(self, b) }
    }
    #[inline(always)]
    unsafe fn gt(self, b: Self) -> Self::Mask {
        unsafe { _mm256_cmp_ps::<_CMP_GT_OQ>(self, b) }
    }
    #[inline(always)]
    unsafe fn eq(self, b: Self) -> Self::Mask {
        unsafe { _mm256_cmp_ps::<_CMP_EQ_OQ>(self, b) }
    }
    #[inline(always)]
    unsafe fn nlt(self, b: Self) -> Self::Mask {
        unsafe { _mm256_cmp_ps::<_CMP_NLT_UQ>(self, b) }
    }
    #[inline(always)]
    unsafe fn select(m: Self::Mask, t: Self, f: Self) -> Self {
        unsafe { _mm256_blendv_ps(f, t, m) }
    }
    #[inline(always)]
    unsafe fn zero_unless(self, m: Self::Mask) -> Self {
        unsafe { _mm256_and_ps(self, m) }
    }
    #[inline(always)]
    unsafe fn any(m: Self::Mask) -> bool {
        unsafe { _mm256_movemask_ps(m) != 0 }
    }
    #[inline(always)]
    unsafe fn all(m: Self::Mask) -> bool {
        unsafe { _mm256_movemask_ps(m) == 0xff }
    }
    #[inline(always)]
    unsafe fn shl23(self) -> Self {
        unsafe { _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_castps_si256(self))) }
    }
}

#[cfg(target_arch = "x86_64")]
// SAFETY: each method calls AVX-512F intrinsics only (no DQ: bit operations go through the
// integer forms); the trait's contract puts the ISA check on the caller.
unsafe impl Lanes for __m512 {
    type Mask = __mmask16;
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        unsafe { _mm512_add_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn sub(self, b: Self) -> Self {
        unsafe { _mm512_sub_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        unsafe { _mm512_mul_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn div(self, b: Self) -> Self {
        unsafe { _mm512_div_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn fmadd(self, b: Self, c: Self) -> Self {
        unsafe { _mm512_fmadd_ps(self, b, c) }
    }
    #[inline(always)]
    unsafe fn fnmadd(self, b: Self, c: Self) -> Self {
        unsafe { _mm512_fnmadd_ps(self, b, c) }
    }
    #[inline(always)]
    unsafe fn min(self, b: Self) -> Self {
        unsafe { _mm512_min_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn max(self, b: Self) -> Self {
        unsafe { _mm512_max_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn abs(self) -> Self {
        unsafe {
            _mm512_castsi512_ps(_mm512_and_si512(
                _mm512_castps_si512(self),
                _mm512_set1_epi32(0x7fff_ffff),
            ))
        }
    }
    #[inline(always)]
    unsafe fn copysign(self, sign: Self) -> Self {
        unsafe {
            let s = _mm512_set1_epi32(i32::MIN);
            _mm512_castsi512_ps(_mm512_or_si512(
                _mm512_andnot_si512(s, _mm512_castps_si512(self)),
                _mm512_and_si512(s, _mm512_castps_si512(sign)),
            ))
        }
    }
    #[inline(always)]
    unsafe fn unord(self, b: Self) -> Self::Mask {
        unsafe { _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(self, b) }
    }
    #[inline(always)]
    unsafe fn lt(self, b: Self) -> Self::Mask {
        unsafe { _mm512_cmp_ps_mask::<_CMP_LT_OQ>(self, b) }
    }
    #[inline(always)]
    unsafe fn gt(self, b: Self) -> Self::Mask {
        unsafe { _mm512_cmp_ps_mask::<_CMP_GT_OQ>(self, b) }
    }
    #[inline(always)]
    unsafe fn eq(self, b: Self) -> Self::Mask {
        unsafe { _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(self, b) }
    }
    #[inline(always)]
    unsafe fn nlt(self, b: Self) -> Self::Mask {
        unsafe { _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(self, b) }
    }
    #[inline(always)]
    unsafe fn select(m: Self::Mask, t: Self, f: Self) -> Self {
        unsafe { _mm512_mask_blend_ps(m, f, t) }
    }
    #[inline(always)]
    unsafe fn zero_unless(self, m: Self::Mask) -> Self {
        unsafe { _mm512_maskz_mov_ps(m, self) }
    }
    #[inline(always)]
    unsafe fn any(m: Self::Mask) -> bool {
        m != 0
    }
    #[inline(always)]
    unsafe fn all(m: Self::Mask) -> bool {
        m == 0xffff
    }
    #[inline(always)]
    unsafe fn shl23(self) -> Self {
        unsafe { _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_castps_si512(self))) }
    }
}
