//! kiln-kernels: hand-tuned microkernels reached by generated code through a function table,
//! and CUDA C templates that the CUDA code generator specializes.
//!
//! The CPU part is a small, dependency-free compute core:
//! - [`gemm`]: f32 SGEMM against a pre-packed B ([`gemm::PackedB`]) with an AVX2+FMA 6×16
//!   register-blocked microkernel (12×32 AVX-512 tile where AVX-512F is detected at run time), k/m cache blocking, A-panel packing into caller-provided scratch
//!   and a fused epilogue (scale, bias, activation, residual) applied per register tile; strided
//!   batched GEMM with on-the-fly packing of B.
//! - [`attention`]: fused softmax(Q·Kᵀ·scale + mask)·V per (batch, head), one block of query rows
//!   at a time.
//! - [`math`]: vectorized exp / erf / tanh / sigmoid / SiLU / GELU with measured error bounds, and
//!   row softmax.
//! - [`threadpool`]: a persistent spin-then-park pool; `run` neither allocates nor spawns.
//! - [`table`]: the `#[repr(C)]` [`table::KernelTable`] of `extern "C"` entry points that
//!   Cranelift-generated code calls indirectly (SystemV call convention).
//!
//! Every hot entry point is allocation-free and panic-free on bad input (typed [`KernelError`]s,
//! status codes through the table). Without AVX2+FMA (checked at run time), or on other
//! architectures, the same entry points run portable scalar code with the same data layouts.
//!
//! # How a plan uses it
//! 1. **Upload/lower**: pack every GEMM weight once with [`gemm::pack_b_into`] (PyTorch Linear
//!    weights `[out, in]` with `transposed = true`) into [`gemm::packed_b_len`]`(k, n)` floats of
//!    the weight arena (64-byte alignment recommended).
//! 2. **Lower**: reserve scratch in the arena: the maximum over kernels of
//!    [`gemm::gemm_scratch_len`]`(m, n, k, threads)`,
//!    [`gemm::batched_scratch_len`]`(m, n, k, threads)` and
//!    [`attention::attention_batched_scratch_len`]`(dims, threads)`. With less scratch a kernel
//!    runs on fewer threads; below one thread's worth it returns status 3.
//! 3. **Load**: create one [`threadpool::ThreadPool`] (threads = cores; 1 = single-threaded) and a
//!    [`table::KernelTable::new`]`(Some(&pool))` that outlives the plan; pass `&table` to the
//!    generated entry.
//! 4. **Run**: generated code loads entries at `KernelTable::OFF_*` and calls them with
//!    `call_indirect` (SystemV); see [`table`] for the exact signatures. Nothing allocates.

pub mod aligned;
pub mod attention;

pub mod error;
pub mod gemm;
mod lanes;
pub mod math;
pub mod peak;
pub mod rowmax;
pub mod table;
pub mod taps;

pub mod threadpool;

pub use error::KernelError;

/// Which instruction set the kernels run with on this machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// x86-64 with AVX2 and FMA: the hand-written SIMD kernels.
    Avx2Fma,
    /// x86-64 with AVX-512F as well: the AVX2 kernels, and a 12×32 AVX-512 GEMM microkernel over
    /// the same packed layouts (results are bitwise identical to `Avx2Fma`). Detected at run time;
    /// `KILN_NO_AVX512=1` in the environment (read once per process) turns it off.
    Avx512,
    /// Portable scalar Rust (any architecture, or x86 without AVX2/FMA).
    Scalar,
}

impl Isa {
    /// Whether this ISA runs the AVX2+FMA kernels (true for `Avx2Fma` and `Avx512`).
    #[inline]
    pub fn has_avx2(self) -> bool {
        matches!(self, Isa::Avx2Fma | Isa::Avx512)
    }
}

#[inline]
fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// AVX-512F present (and AVX2+FMA), and not turned off by `KILN_NO_AVX512`.
fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| {
            has_avx2_fma()
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::env::var_os("KILN_NO_AVX512").is_none_or(|v| v.is_empty() || v == "0")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The best ISA this process can use (runtime detection; cached).
#[inline]
pub fn detect_isa() -> Isa {
    if has_avx512() {
        Isa::Avx512
    } else if has_avx2_fma() {
        Isa::Avx2Fma
    } else {
        Isa::Scalar
    }
}

/// Resolves a requested ISA against the machine: asking for an ISA the machine lacks gives the
/// best one below it (AVX-512 → AVX2 → Scalar); never one above the request.
#[inline]
pub(crate) fn effective_isa(requested: Isa) -> Isa {
    match requested {
        Isa::Scalar => Isa::Scalar,
        Isa::Avx2Fma if has_avx2_fma() => Isa::Avx2Fma,
        Isa::Avx2Fma => Isa::Scalar,
        Isa::Avx512 => detect_isa(),
    }
}
