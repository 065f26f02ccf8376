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
//!   `gelu_tanh(x) = x/2·(1+tanh(√(2/π)(x+0.044715x³)))`. `gelu_erf(x) = x·Φ(x)` with
//!   `Φ(x) ≈ 1/2 + xc·P(xc²)/Q(xc²)`, xc = x clamped to ±4√2 (P of degree 6, Q of degree 4,
//!   fitted for Φ's absolute error by `scripts/fit_gelu.py`; 20 vector operations and one
//!   division, no table and no exp): the `1 + erf` form of PyTorch and onnxruntime, whose
//!   relative error grows where the result is tiny (x below about -3), with Φ kept ≥ 0 so a
//!   negative x never gives a positive result. `gelu_tanh(x) = x/(1 + exp(-2u))` (no
//!   `1 + tanh` cancellation).
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
//! | gelu_erf | (0, 10] / [-10, 10] | 2.1e-7 / – (Φ's error 2.1e-7·\|x\|) | 8.9e-7 (at x≈4.8) |
//! | gelu_tanh | [-3, 10] / [-10, 10] | 8.4e-7 / 1.2e-5 (tail cond. ≈ 2u) | 5.2e-7 (at x≈4.7) |
//!
//! NaN inputs give NaN outputs. SiLU and both GELUs follow their defining f32 formulas in the
//! tails, where the clamped exponentials here would not (kiln's special-value contract,
//! `kiln_compiler::ops`; PyTorch's eager kernels agree): beyond |x| > 88 the result is x for
//! x > 0 and -0 for x < 0 (SiLU: x/(1 + e^-x); the GELUs: x/2·(1 + (-1)), the sign of the true
//! tiny negative value), and NaN at -inf (`-inf·0`).
//!
//! Files: this one holds the activation codes and the elementwise entry points ([`map`]);
//! `coeffs` every approximation's constants, `scalar` the scalar path, `simd` the vector
//! algorithms generic over the width, `avx2` their 8-lane entry points, `softmax` the row softmax.

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
    /// `min(max(x, 0), 6)` (ONNX `Clip(x, 0, 6)`, MobileNet's ReLU6): NaN stays NaN, -0
    /// gives +0, as kiln's graph Max and Min compute it.
    Relu6 = 7,
}

impl Activation {
    /// All activations, in code order.
    pub const ALL: [Activation; 8] = [
        Activation::None,
        Activation::Relu,
        Activation::GeluErf,
        Activation::GeluTanh,
        Activation::Tanh,
        Activation::Sigmoid,
        Activation::Silu,
        Activation::Relu6,
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
            Activation::Relu6 => relu6(x),
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

pub mod coeffs;
mod scalar;
pub(crate) mod simd;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
mod softmax;

use coeffs::*;
pub use scalar::{erf, exp, gelu_erf, gelu_tanh, relu, relu6, sigmoid, silu, tanh};
pub use softmax::softmax_rows;
pub(crate) use softmax::{exp_shift_sum_raw, scale_raw, softmax_rows_raw};

/// Beyond ±[`TAIL`], SiLU and the GELUs are `x` (x > 0) or -0 (x < 0; NaN at -inf).
const TAIL: f32 = 88.0;

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
                Unary::Act(Activation::Relu6) => avx2::map_relu6(x, y, n),
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
