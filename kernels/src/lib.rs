//! kiln-kernels: hand-tuned microkernels reached by generated code through a function table,
//! and CUDA C templates that the CUDA code generator specializes.
//!
//! The CPU part is a small, dependency-free compute core:
//! - [`gemm`]: f32 SGEMM against a pre-packed B ([`gemm::PackedB`]) with an AVX2+FMA register-blocked
//!   microkernel, cache blocking, A-panel packing into caller-provided scratch and a fused epilogue
//!   (scale, bias, activation, residual); strided batched GEMM with on-the-fly packing of B.
//! - [`attention`]: fused softmax(Q·Kᵀ·scale + mask)·V per (batch, head), one query row block at a time.
//! - [`math`]: vectorized exp / erf / tanh / sigmoid / GELU approximations with measured error bounds.
//! - [`threadpool`]: a persistent spin-then-park pool; `run` neither allocates nor spawns.
//! - [`table`]: the `#[repr(C)]` [`table::KernelTable`] of `extern "C"` entry points that Cranelift-generated
//!   code calls indirectly (SystemV call convention).
//!
//! Every hot entry point is allocation-free: scratch sizes are exposed (`*_scratch_len`) so a plan can
//! reserve them once at lower time.

pub mod aligned;
pub mod attention;

pub mod error;
pub mod gemm;
pub mod math;
pub mod table;

pub mod threadpool;

pub use error::KernelError;

/// Which instruction set the kernels run with on this machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// x86-64 with AVX2 and FMA: the hand-written SIMD kernels.
    Avx2Fma,
    /// Portable scalar Rust (any architecture, or x86 without AVX2/FMA).
    Scalar,
}

/// The best ISA this process can use (runtime detection; cached by std).
#[inline]
pub fn detect_isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return Isa::Avx2Fma;
        }
    }
    Isa::Scalar
}

/// Resolves a requested ISA against the machine: asking for AVX2 on a machine without it gives Scalar.
#[inline]
pub(crate) fn effective_isa(requested: Isa) -> Isa {
    match requested {
        Isa::Scalar => Isa::Scalar,
        Isa::Avx2Fma => detect_isa(),
    }
}
