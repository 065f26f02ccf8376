//! Weighted sums of shifted rows: `out[p, c] = post(((x₀[p, c]·w₀[c] + x₁[p, c]·w₁[c]) + …)
//! (+ bias[c]))` over pixels `p` and channels `c` — a depthwise convolution (or any per-channel
//! window sum) as the ONNX importer writes it: one elementwise expression over shifted views of
//! a padded grid, channels innermost; `post` up to two clamps against constants (ReLU, ReLU6).
//!
//! Generated code runs such expressions 4 lanes wide (Cranelift's x86 vectors are 128-bit);
//! this entry runs them 16 (AVX-512F) or 8 (AVX2) wide. Per element it does the expression's
//! operations in the expression's order — each product rounded, then added to the running sum
//! (no FMA), the bias last, then the clamps — so it gives the generated code's bits on every
//! ISA (the reference interprets in f64: within its tolerance).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::error::KernelError;
use crate::Isa;

/// Most taps one call takes (a 5×5 window; larger windows stay generated code).
pub const MAX_TAPS: usize = 32;
/// Most clamps after the sum.
pub const MAX_POST: usize = 2;
/// A clamp `max(v, c)`: `c` where `v < c` (`v <= c` when `c` is +0, so -0 becomes +0), else `v`
/// (NaN stays): the expression's `max` against a constant, as generated code compiles it.
pub const TAP_MAX: u32 = 0;
/// A clamp `min(v, c)`: `c` where `c < v` (`c <= v` when `c` is -0), else `v`.
pub const TAP_MIN: u32 = 1;

/// The arguments (C layout, 8-byte fields): `n` pixels of `c` channels; tap `t` reads
/// `x[t] + p·x_stride + ch` and `w[t] + ch`; the output is `out + p·out_stride + ch`; `bias`
/// null for none; then `post` clamps (`post_op[i]` [`TAP_MAX`] or [`TAP_MIN`] against
/// `post_c[i]`, in order). Offsets: n 0, c 8, x_stride 16, out 24, out_stride 32, bias 40, taps
/// 48, x 56 (`MAX_TAPS` pointers), w `56 + 8·MAX_TAPS`, post `56 + 16·MAX_TAPS`, post_op `+ 8`
/// (u32 each), post_c `+ 16` (f32 each).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TapSumArgs {
    pub n: usize,
    pub c: usize,
    pub x_stride: usize,
    pub out: *mut f32,
    pub out_stride: usize,
    pub bias: *const f32,
    pub taps: usize,
    pub x: [*const f32; MAX_TAPS],
    pub w: [*const f32; MAX_TAPS],
    pub post: usize,
    pub post_op: [u32; MAX_POST],
    pub post_c: [f32; MAX_POST],
}

/// Whether clamp `op` against `c` takes `c` for `v`, and with which comparison: `(lhs_is_v,
/// inclusive)` — `v < c` / `v <= c` for a max, `c < v` / `c <= v` for a min.
fn clamp_form(op: u32, c: f32) -> (bool, bool) {
    if op == TAP_MAX {
        (true, c == 0.0 && c.is_sign_positive())
    } else {
        (false, c == 0.0 && c.is_sign_negative())
    }
}

/// One clamp on one value (the vector paths do this per lane).
fn clamp1(v: f32, op: u32, c: f32) -> f32 {
    let (v_first, incl) = clamp_form(op, c);
    let (a, b) = if v_first { (v, c) } else { (c, v) };
    if (incl && a <= b) || (!incl && a < b) {
        c
    } else {
        v
    }
}

/// Runs [`TapSumArgs`] on the calling thread.
///
/// # Safety
/// For `t < taps`: `x[t]` readable at `p·x_stride + ch`, `w[t]` (and `bias` unless null) at `ch`,
/// `out` writable at `p·out_stride + ch`, for every `p < n`, `ch < c`; the output disjoint from
/// the inputs.
pub unsafe fn tap_sum_raw(a: &TapSumArgs, isa: Isa) -> Result<(), KernelError> {
    if a.taps == 0 || a.taps > MAX_TAPS {
        return Err(KernelError::Invalid("tap sum: 1..=32 taps"));
    }
    if a.post > MAX_POST || a.post_op[..a.post].iter().any(|&o| o > TAP_MIN) || a.post_c[..a.post].iter().any(|c| c.is_nan()) {
        return Err(KernelError::Invalid("tap sum: at most 2 clamps, max or min, against a number"));
    }
    if a.n == 0 || a.c == 0 {
        return Ok(());
    }
    match crate::effective_isa(isa) {
        // SAFETY: the ISA is present; pointer contract forwarded.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512(a) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => unsafe { avx2(a) },
        // SAFETY: pointer contract forwarded.
        _ => unsafe { scalar(a) },
    }
    Ok(())
}

/// # Safety
/// As [`tap_sum_raw`].
unsafe fn scalar(a: &TapSumArgs) {
    for p in 0..a.n {
        for ch in 0..a.c {
            // SAFETY: in bounds by the caller's contract.
            unsafe {
                let px = p * a.x_stride + ch;
                let mut s = *a.x[0].add(px) * *a.w[0].add(ch);
                for t in 1..a.taps {
                    s += *a.x[t].add(px) * *a.w[t].add(ch);
                }
                if !a.bias.is_null() {
                    s += *a.bias.add(ch);
                }
                for i in 0..a.post {
                    s = clamp1(s, a.post_op[i], a.post_c[i]);
                }
                *a.out.add(p * a.out_stride + ch) = s;
            }
        }
    }
}

/// # Safety
/// AVX-512F present; as [`tap_sum_raw`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512(a: &TapSumArgs) {
    for p in 0..a.n {
        let mut ch = 0;
        while ch < a.c {
            let k: __mmask16 = if a.c - ch >= 16 { 0xFFFF } else { (1u16 << (a.c - ch)) - 1 };
            let px = p * a.x_stride + ch;
            // SAFETY: lanes masked to ch..c, in bounds by the caller's contract.
            unsafe {
                let ld = |q: *const f32| _mm512_maskz_loadu_ps(k, q);
                let mut s = _mm512_mul_ps(ld(a.x[0].add(px)), ld(a.w[0].add(ch)));
                for t in 1..a.taps {
                    s = _mm512_add_ps(s, _mm512_mul_ps(ld(a.x[t].add(px)), ld(a.w[t].add(ch))));
                }
                if !a.bias.is_null() {
                    s = _mm512_add_ps(s, ld(a.bias.add(ch)));
                }
                for i in 0..a.post {
                    let c = _mm512_set1_ps(a.post_c[i]);
                    let take = match clamp_form(a.post_op[i], a.post_c[i]) {
                        (true, true) => _mm512_cmp_ps_mask::<_CMP_LE_OQ>(s, c),
                        (true, false) => _mm512_cmp_ps_mask::<_CMP_LT_OQ>(s, c),
                        (false, true) => _mm512_cmp_ps_mask::<_CMP_LE_OQ>(c, s),
                        (false, false) => _mm512_cmp_ps_mask::<_CMP_LT_OQ>(c, s),
                    };
                    s = _mm512_mask_blend_ps(take, s, c);
                }
                _mm512_mask_storeu_ps(a.out.add(p * a.out_stride + ch), k, s);
            }
            ch += 16;
        }
    }
}

/// # Safety
/// AVX2 present; as [`tap_sum_raw`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2(a: &TapSumArgs) {
    for p in 0..a.n {
        let mut ch = 0;
        while ch < a.c {
            let left = (a.c - ch).min(8);
            let m = crate::math::avx2::tail_mask(left);
            let px = p * a.x_stride + ch;
            // SAFETY: lanes masked to ch..c, in bounds by the caller's contract.
            unsafe {
                let ld = |q: *const f32| if left == 8 { _mm256_loadu_ps(q) } else { _mm256_maskload_ps(q, m) };
                let mut s = _mm256_mul_ps(ld(a.x[0].add(px)), ld(a.w[0].add(ch)));
                for t in 1..a.taps {
                    s = _mm256_add_ps(s, _mm256_mul_ps(ld(a.x[t].add(px)), ld(a.w[t].add(ch))));
                }
                if !a.bias.is_null() {
                    s = _mm256_add_ps(s, ld(a.bias.add(ch)));
                }
                for i in 0..a.post {
                    let c = _mm256_set1_ps(a.post_c[i]);
                    let take = match clamp_form(a.post_op[i], a.post_c[i]) {
                        (true, true) => _mm256_cmp_ps::<_CMP_LE_OQ>(s, c),
                        (true, false) => _mm256_cmp_ps::<_CMP_LT_OQ>(s, c),
                        (false, true) => _mm256_cmp_ps::<_CMP_LE_OQ>(c, s),
                        (false, false) => _mm256_cmp_ps::<_CMP_LT_OQ>(c, s),
                    };
                    s = _mm256_blendv_ps(s, c, take);
                }
                let o = a.out.add(p * a.out_stride + ch);
                if left == 8 {
                    _mm256_storeu_ps(o, s);
                } else {
                    _mm256_maskstore_ps(o, m, s);
                }
            }
            ch += 8;
        }
    }
}
