//! Weighted sums of shifted rows: `out[p, c] = ((x₀[p, c]·w₀[c] + x₁[p, c]·w₁[c]) + …) (+ bias[c])`
//! over pixels `p` and channels `c` — a depthwise convolution (or any per-channel window
//! sum) as the ONNX importer writes it: one elementwise expression over shifted views of a
//! padded grid, channels innermost.
//!
//! Generated code runs such expressions 4 lanes wide (Cranelift's x86 vectors are 128-bit);
//! this entry runs them 16 (AVX-512F) or 8 (AVX2) wide. Per element it does the expression's
//! operations in the expression's order — each product rounded, then added to the running sum
//! (no FMA), the bias last — so it gives the generated code's bits, and the reference's.
//! (ONNX Runtime's depthwise kernels differ here: they fuse into FMAs.)

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::error::KernelError;
use crate::Isa;

/// Most taps one call takes (a 5×5 window; larger windows stay generated code).
pub const MAX_TAPS: usize = 32;

/// The arguments (C layout, 8-byte fields): `n` pixels of `c` channels; tap `t` reads
/// `x[t] + p·x_stride + ch` and `w[t] + ch`; the output is `out + p·out_stride + ch`; `bias`
/// null for none. Offsets: n 0, c 8, x_stride 16, out 24, out_stride 32, bias 40, taps 48,
/// x 56 (`MAX_TAPS` pointers), w `56 + 8·MAX_TAPS`.
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
