//! Row maxima: `out[r] = max over c of ±x[r, c]`, what generated code's max reduction gives —
//! the largest value, -0 below +0, -inf for an empty row, a NaN where the row holds one — 16
//! (AVX-512F) or 8 (AVX2) lanes at a time. A dynamic quantization's range is two of these over
//! the whole activation (`max(x)`, `max(-x)`): generated code runs them 4 lanes wide, each step
//! an `fmax` that is a chain of instructions (NaN and signed-zero exact), about 0.3 ns per value
//! per thread (MiniLM's 8×128×1536 FFN activation: 0.45 ms each on 2 threads).
//!
//! How: each value's bits as an integer key whose signed order is the floats' order (a negative
//! float's magnitude bits flipped: -0 is key -1, +0 key 0), the largest key by integer max, the
//! NaNs tracked apart (any NaN: the quiet NaN `f32::NAN`; a NaN's payload is not part of kiln's
//! NaN contract, and generated code's `fmax` gives either input's). The maximum of a set does
//! not depend on the order it is taken in, so every path and split gives the same value.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::error::KernelError;
use crate::Isa;

/// The arguments (C layout, 8-byte fields): `rows` rows of `cols` values, row r at
/// `x + r·x_stride`, its maximum to `out + r·out_stride`; `negate` nonzero: of the negated values.
/// Offsets: rows 0, cols 8, x 16, x_stride 24, out 32, out_stride 40, negate 48.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MaxRowsArgs {
    pub rows: usize,
    pub cols: usize,
    pub x: *const f32,
    pub x_stride: usize,
    pub out: *mut f32,
    pub out_stride: usize,
    pub negate: usize,
}

/// The order key of a float's bits (an involution: the key of a key is the bits).
#[inline]
fn key(bits: i32) -> i32 {
    bits ^ ((bits >> 31) & i32::MAX)
}

/// The key of -inf: the maximum of an empty row.
const KEY_NEG_INF: i32 = (0xFF80_0000u32 as i32) ^ i32::MAX;

/// The float of the largest key, or NaN.
#[inline]
fn value(k: i32, nan: bool) -> f32 {
    if nan {
        f32::NAN
    } else {
        f32::from_bits(key(k) as u32)
    }
}

/// Runs [`MaxRowsArgs`] on the calling thread.
///
/// # Safety
/// `x` readable at `r·x_stride + c` and `out` writable at `r·out_stride` for every `r < rows`,
/// `c < cols`.
pub unsafe fn max_rows_raw(a: &MaxRowsArgs, isa: Isa) -> Result<(), KernelError> {
    if a.rows > 0 && (a.out.is_null() || (a.cols > 0 && a.x.is_null())) {
        return Err(KernelError::Invalid("row max: null pointer"));
    }
    let flip = if a.negate != 0 { i32::MIN } else { 0 };
    for r in 0..a.rows {
        let row = a.x.wrapping_add(r * a.x_stride);
        let m = match crate::effective_isa(isa) {
            // SAFETY: the ISA is present; the row's extent forwarded.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { row_avx512(row, a.cols, flip) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Fma => unsafe { row_avx2(row, a.cols, flip) },
            // SAFETY: the row's extent forwarded.
            _ => unsafe { row_scalar(row, a.cols, flip) },
        };
        // SAFETY: out + r·out_stride is writable (contract).
        unsafe { *a.out.add(r * a.out_stride) = m };
    }
    Ok(())
}

/// # Safety
/// `x` readable for `n` values.
unsafe fn row_scalar(x: *const f32, n: usize, flip: i32) -> f32 {
    let (mut k, mut nan) = (KEY_NEG_INF, false);
    for c in 0..n {
        // SAFETY: c < n.
        let b = unsafe { (*x.add(c)).to_bits() as i32 } ^ flip;
        nan |= f32::from_bits(b as u32).is_nan();
        k = k.max(key(b));
    }
    value(k, nan)
}

/// # Safety
/// AVX-512F present; `x` readable for `n` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn row_avx512(x: *const f32, n: usize, flip: i32) -> f32 {
    let (f, low) = (_mm512_set1_epi32(flip), _mm512_set1_epi32(i32::MAX));
    // Four independent maxima (an integer max has a one-cycle latency, a load more).
    let mut k = [_mm512_set1_epi32(KEY_NEG_INF); 4];
    let mut nan: __mmask16 = 0;
    let mut c = 0;
    // SAFETY: every load is below n (the tail masked).
    unsafe {
        while c + 64 <= n {
            for (j, kj) in k.iter_mut().enumerate() {
                let v = _mm512_xor_si512(_mm512_loadu_si512(x.add(c + 16 * j).cast()), f);
                step512(kj, &mut nan, !0, v, low);
            }
            c += 64;
        }
        while c < n {
            let m: __mmask16 = if n - c >= 16 { !0 } else { ((1u32 << (n - c)) - 1) as u16 };
            let v = _mm512_xor_si512(_mm512_maskz_loadu_epi32(m, x.add(c).cast()), f);
            step512(&mut k[0], &mut nan, m, v, low);
            c += 16;
        }
    }
    let all = _mm512_max_epi32(_mm512_max_epi32(k[0], k[1]), _mm512_max_epi32(k[2], k[3]));
    value(_mm512_reduce_max_epi32(all), nan != 0)
}

/// One masked step of [`row_avx512`] (a function, not a closure: a closure would not inherit
/// the caller's target features).
///
/// # Safety
/// AVX-512F present; inlined into [`row_avx512`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn step512(k: &mut __m512i, nan: &mut __mmask16, m: __mmask16, v: __m512i, low: __m512i) {
    // SAFETY: AVX-512F (contract).
    unsafe {
        *nan |= _mm512_mask_cmp_ps_mask::<_CMP_UNORD_Q>(m, _mm512_castsi512_ps(v), _mm512_castsi512_ps(v));
        let key = _mm512_xor_si512(v, _mm512_and_si512(_mm512_srai_epi32::<31>(v), low));
        *k = _mm512_mask_max_epi32(*k, m, *k, key);
    }
}

/// # Safety
/// AVX2 present; `x` readable for `n` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn row_avx2(x: *const f32, n: usize, flip: i32) -> f32 {
    let (f, low) = (_mm256_set1_epi32(flip), _mm256_set1_epi32(i32::MAX));
    let mut k = [_mm256_set1_epi32(KEY_NEG_INF); 4];
    let mut nan = _mm256_setzero_ps();
    let mut c = 0;
    // SAFETY: every load is below n; the last values go through the scalar path.
    unsafe {
        while c + 32 <= n {
            for (j, kj) in k.iter_mut().enumerate() {
                let v = _mm256_xor_si256(_mm256_loadu_si256(x.add(c + 8 * j).cast()), f);
                let vf = _mm256_castsi256_ps(v);
                nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(vf, vf));
                *kj = _mm256_max_epi32(*kj, _mm256_xor_si256(v, _mm256_and_si256(_mm256_srai_epi32::<31>(v), low)));
            }
            c += 32;
        }
        let all = _mm256_max_epi32(_mm256_max_epi32(k[0], k[1]), _mm256_max_epi32(k[2], k[3]));
        let mut lanes = [0i32; 8];
        _mm256_storeu_si256(lanes.as_mut_ptr().cast(), all);
        let tail = row_scalar(x.add(c), n - c, flip);
        let (tk, tnan) = (key(tail.to_bits() as i32), tail.is_nan());
        let k = lanes.iter().fold(tk, |a, &b| a.max(b));
        value(k, tnan || _mm256_movemask_ps(nan) != 0)
    }
}
