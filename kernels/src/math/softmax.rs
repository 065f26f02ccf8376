//! Softmax rows: the masked max/exp/sum pass attention uses, and the row softmax of the kernel
//! table.

use super::*;

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
    use super::avx2::tail_mask;
    use super::simd::{exp_nonpos, exp_nonpos_n};
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
        // slow). Two accumulators per pass hide the max/add latency; the max of the non-NaN
        // values does not depend on their order (a NaN makes the sum NaN whatever max it left).
        let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
        let (mut m0, mut m1) = (ninf, ninf);
        let mut i = 0;
        // SAFETY (both passes): full vectors at i + 8 <= n, tail lanes masked to < n.
        unsafe {
            if !mask.is_null() {
                // Masked: x += mask first, taking the max on the way (two chains of maxes).
                while i + 16 <= n {
                    let v0 = _mm256_add_ps(_mm256_loadu_ps(x.add(i)), _mm256_loadu_ps(mask.add(i)));
                    let v1 = _mm256_add_ps(_mm256_loadu_ps(x.add(i + 8)), _mm256_loadu_ps(mask.add(i + 8)));
                    _mm256_storeu_ps(x.add(i), v0);
                    _mm256_storeu_ps(x.add(i + 8), v1);
                    m0 = _mm256_max_ps(m0, v0);
                    m1 = _mm256_max_ps(m1, v1);
                    i += 16;
                }
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
            // Four exponentials side by side (`exp_nonpos_n`), their sums into the two
            // accumulators in the order of the 16-float loop below. Measured (`attn_bench 512`,
            // 1 thread, Zen 4): attention 5.25 -> 4.96 ms on this path, 4.84 -> 4.75 ms on the
            // AVX-512 one (its loop below); eight side by side were no faster.
            while i + 32 <= n {
                let mut v = [mxv; 4];
                for (j, vj) in v.iter_mut().enumerate() {
                    *vj = _mm256_sub_ps(_mm256_loadu_ps(x.add(i + 8 * j)), mxv);
                }
                let e = exp_nonpos_n(v);
                for (j, &ej) in e.iter().enumerate() {
                    _mm256_storeu_ps(x.add(i + 8 * j), ej);
                }
                s0 = _mm256_add_ps(s0, e[0]);
                s1 = _mm256_add_ps(s1, e[1]);
                s0 = _mm256_add_ps(s0, e[2]);
                s1 = _mm256_add_ps(s1, e[3]);
                i += 32;
            }
            while i + 16 <= n {
                let e0 = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(x.add(i)), mxv));
                let e1 = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(x.add(i + 8)), mxv));
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
                let e = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(x.add(i)), mxv));
                _mm256_storeu_ps(x.add(i), e);
                s0 = _mm256_add_ps(s0, e);
                i += 8;
            }
            if i < n {
                let m = tail_mask(n - i);
                let e = exp_nonpos(_mm256_sub_ps(_mm256_maskload_ps(x.add(i), m), mxv));
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
        let (mut mv, mut mv1) = (ninf, ninf);
        let mut i = 0;
        // SAFETY (both passes): full vectors at i + 16 <= n, masked lanes < n.
        unsafe {
            // Two chains of maxes over full vector pairs, then the rest one (masked) vector at
            // a time.
            while i + 32 <= n {
                let mut v0 = _mm512_loadu_ps(x.add(i));
                let mut v1 = _mm512_loadu_ps(x.add(i + 16));
                if !mask.is_null() {
                    v0 = _mm512_add_ps(v0, _mm512_loadu_ps(mask.add(i)));
                    v1 = _mm512_add_ps(v1, _mm512_loadu_ps(mask.add(i + 16)));
                    _mm512_storeu_ps(x.add(i), v0);
                    _mm512_storeu_ps(x.add(i + 16), v1);
                }
                mv = _mm512_max_ps(mv, v0);
                mv1 = _mm512_max_ps(mv1, v1);
                i += 32;
            }
            mv = _mm512_max_ps(mv, mv1);
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
            while i + 64 <= n {
                let mut v = [mxv; 4];
                for (j, vj) in v.iter_mut().enumerate() {
                    *vj = _mm512_sub_ps(_mm512_loadu_ps(x.add(i + 16 * j)), mxv);
                }
                let e = exp_nonpos_n(v);
                for (j, &ej) in e.iter().enumerate() {
                    _mm512_storeu_ps(x.add(i + 16 * j), ej);
                    s = _mm512_add_ps(s, ej);
                }
                i += 64;
            }
            while i + 16 <= n {
                let e = exp_nonpos(_mm512_sub_ps(_mm512_loadu_ps(x.add(i)), mxv));
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
