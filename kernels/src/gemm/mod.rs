//! f32 GEMM: `C[m×n] (+)= scale · A[m×k] · B[k×n]`, then an epilogue (bias, activation, residual)
//! applied to each register tile right after its last k block, while it is still in L1.
//!
//! - A is row-major behind a pointer and a row stride `lda`.
//! - B is packed once ([`pack_b`], [`PackedB`]) into panels of [`NR`] columns; inside a panel the
//!   layout is k-major (`NR` consecutive floats per k), and the last panel is zero-padded.
//!   Panel `p` starts at float `p·k·NR`. Packing accepts `[k, n]` and `[n, k]` (PyTorch Linear) sources.
//! - Blocking (Goto/BLIS order): k in equal blocks of at most [`KC`], m in equal blocks of at most [`MC`]
//!   rows (whole tiles); for each (k, m) block
//!   the A block is packed into caller scratch as MR-row strips (k-major, zero-padded), then for each
//!   B panel (kc×NR, lives in L1) the microkernel walks the A strips (A block lives in L2). A block
//!   with at most two B panels (n ≤ 32 on a thread: attention's P·V), or with k ≤ 64 and at most
//!   16 tiles per strip (attention's Q·Kᵀ), is not packed: its tiles read A's rows in place.
//! - Microkernel: [`MR`]×[`NR`] = 6×16 register tile, 12 ymm accumulators, `vfmadd231ps` with a
//!   broadcast A element and two B vectors per k: per k step 8 loads and 12 FMAs, no spills (15 of 16
//!   ymm registers). Chosen by measurement over 4×24: that tile needs all 16 registers, and LLVM
//!   then spills an accumulator and shuffles the others every iteration (43% of peak against 93%
//!   for 6×16 on 128×384·384×1536). Edge tiles use masked stores; padding makes every load in bounds.
//! - AVX-512F machines (runtime detection, [`Isa::Avx512`]) use a 12×32 tile over the same packed
//!   layouts instead: two consecutive A strips × two consecutive B panels, 24 zmm accumulators, one
//!   instance per row count (1..12) so partial tiles do no padded-row work. Per element it does the
//!   same FMAs in the same order and the same store and epilogue as the 6×16 tile, so the results
//!   are bitwise identical to the AVX2 path. The tiles sharing a B panel (pair) prefetch the next
//!   one, each an equal slice of its k steps (B comes from L3/memory when m is small).
//! - Threads: the (m, n) work is cut into as many contiguous ranges of B panels (or of A rows) as
//!   there are threads, each with its own A-packing scratch. Each element of C goes through the same
//!   operations in every split, so results are bitwise identical for any thread count.
//!
//! Nothing here allocates except [`pack_b`] (which a plan calls once at upload/lower time).
//!
//! Files: this one holds the safe entry points ([`gemm`], [`gemm_prepacked`]); `epilogue` the
//! epilogue's forms, `pack` B packing and scratch sizes, `arch` the per-ISA function table,
//! `scalar`/`avx2`/`avx512` the tile kernels, A packing and epilogue passes, `block` one thread's
//! loops, `split` the cut across threads, `batched` the strided batched GEMM. The exact integer
//! GEMM: `int16` (i16 pairs, its entry points), `int8` (byte quads), `int_b` (its packed B),
//! `avx2_i16`/`avx512_i16`/`avx512_u8` their tiles (`avx512_int` what the AVX-512 ones share),
//! `amx` the byte quads on AMX tiles.

use crate::aligned::AlignedBuf;
use crate::error::{check_len, span};
use crate::math::Activation;
use crate::threadpool::{scratch_slots, ThreadPool};
use crate::{effective_isa, Isa, KernelError};

/// Rows of the register tile.
pub const MR: usize = 6;
/// Columns of the register tile and of a packed B panel.
pub const NR: usize = 16;
/// k block: a B micro-panel of KC×NR floats (24 KiB) stays in L1. 384 rather than 256: MiniLM's
/// k = 384 GEMMs then run in one k pass, so C is written once instead of stored and reloaded;
/// at m = 1024 the reloads missed the caches (C is 6 MiB) and cost 8-13% of one thread's time
/// (gemm_bench 1024×384·384×1536, 1 thread: 82-87% → 95% of peak on AVX-512, 80% → 92% on AVX2;
/// the m = 128 shapes within noise).
pub const KC: usize = 384;
/// Largest m block (a multiple of 2·MR, the AVX-512 tile's rows): the packed A block of MC×KC
/// floats (216 KiB) stays in L2. 144 rather than 120 so that a 128-row GEMM (MiniLM at 1×128, and
/// each thread's share of many others) is one m block: every m block streams all of its B
/// panels, and a second block of 8 rows read the whole B again for 6% of the work.
pub const MC: usize = 144;
/// Floats of slack per scratch region so it can be aligned to 64 bytes.
const ALIGN_SLACK: usize = 16;
/// Below this many multiply-adds a GEMM runs on one thread.
const PAR_MIN_MACS: usize = 1 << 17;

#[cfg(target_arch = "x86_64")]
mod amx;
mod arch;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_i16;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_i16;
#[cfg(target_arch = "x86_64")]
mod avx512_int;
#[cfg(target_arch = "x86_64")]
mod avx512_u8;
mod batched;
mod block;
mod epilogue;
mod int16;
mod int8;
mod int_b;
mod pack;
mod scalar;
mod split;
mod steal;

pub(crate) use arch::Arch;
use arch::PACKED;
pub(crate) use batched::{gemm_batched_raw, injective};
pub use batched::{batched_scratch_len, batched_scratch_len_per_thread, gemm_batched, BatchedGemmArgs, Strided, StridedMut};
pub(crate) use block::{gemm_block, GemmDesc};
use block::prefetch_stretch;
pub(crate) use epilogue::TilePost;
pub use epilogue::{Epilogue, EpilogueRef, GATED};
pub(crate) use pack::{align64, apack_len, pack_b_raw};
pub use pack::{gemm_scratch_len, pack_b, pack_b_into, packed_b_len, PackedB};
pub(crate) use int16::gemm_i16_raw;
pub use int16::{as_i16, gemm_i16, gemm_i16_scratch_len, gemm_i16_variant, IntTiles};
use int_b::read_header;
pub use int_b::{int_layout_for, pack_b_int_into, packed_b_int_bytes, IntB, IntLayout, INT_B_HEADER};
pub(crate) use split::{gemm_raw, gemm_raw_with};
pub(crate) use steal::{even_ranges, Taker, MAX_STEAL_TASKS};
pub use split::Split;

/// Whether the byte-quad integer GEMM runs on AMX tiles in this process (benchmarks' labels).
#[doc(hidden)]
pub fn amx_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        amx::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// 32-row blocks the AMX tiles have run in this process (tests: a fallback to the VNNI tile
/// gives the same bits, so only this shows that AMX ran).
#[doc(hidden)]
pub fn amx_blocks_run() -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        amx::blocks_run()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

/// What runs the integer GEMM of an int8 weight in this process (for benchmarks' and `kiln
/// bench`'s labels; a weight past [-128, 127] runs the i16 pairs): the name the dispatch
/// itself ([`Arch::for_int`]) gives the kernels it picks for such a weight's layout.
pub fn int8_tile_name() -> &'static str {
    Arch::for_int(IntLayout::for_weight(true), Isa::Avx512, IntTiles::Best).name
}

/// Validates a safe-API GEMM and builds its raw description; `b` is packed B (f32, or i16
/// pairs for the integer GEMM) of at least `b_len` elements.
#[allow(clippy::too_many_arguments)]
fn desc<B>(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    lda: usize,
    b: &[B],
    b_len: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    epi: &EpilogueRef<'_>,
) -> Result<GemmDesc, KernelError> {
    check_len("a", a.len(), span("a", m, k, lda)?)?;
    check_len("packed b", b.len(), b_len)?;
    check_len("c", c.len(), span("c", m, n, ldc)?)?;
    let e = epi.to_raw(m, n)?;
    Ok(GemmDesc {
        m,
        n,
        k,
        a: a.as_ptr(),
        lda,
        b: b.as_ptr().cast(),
        c: c.as_mut_ptr(),
        ldc,
        accumulate,
        epi: e,
        act: epi.activation,
    })
}

/// `C[m×n] = epilogue(scale·A·B (+ C))` with B packed by [`pack_b`].
///
/// `a`: m rows of `b.k()` floats at row stride `lda`; `c`: m rows of `b.n()` floats at stride `ldc`.
/// `scratch`: at least `gemm_scratch_len(m, n, k, 1)` floats; with `pool` the work is split over as
/// many of its threads as the scratch has room for.
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    m: usize,
    a: &[f32],
    lda: usize,
    b: &PackedB,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    epi: &EpilogueRef<'_>,
    scratch: &mut [f32],
    pool: Option<&ThreadPool>,
) -> Result<(), KernelError> {
    gemm_prepacked(
        m,
        b.k(),
        b.n(),
        a,
        lda,
        b.as_slice(),
        c,
        ldc,
        accumulate,
        epi,
        scratch,
        pool,
        crate::detect_isa(),
    )
}

/// [`gemm`] with B given as a packed slice (from [`pack_b_into`]) and a chosen ISA
/// (`Isa::Scalar` forces the portable path).
#[allow(clippy::too_many_arguments)]
pub fn gemm_prepacked(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    lda: usize,
    b_packed: &[f32],
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    epi: &EpilogueRef<'_>,
    scratch: &mut [f32],
    pool: Option<&ThreadPool>,
    isa: Isa,
) -> Result<(), KernelError> {
    gemm_split(
        m,
        k,
        n,
        a,
        lda,
        b_packed,
        c,
        ldc,
        accumulate,
        epi,
        scratch,
        pool,
        isa,
        Split::Auto,
    )
}

/// [`gemm_prepacked`] with a forced work split (benchmarks and tests).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn gemm_split(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    lda: usize,
    b_packed: &[f32],
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    epi: &EpilogueRef<'_>,
    scratch: &mut [f32],
    pool: Option<&ThreadPool>,
    isa: Isa,
    split: Split,
) -> Result<(), KernelError> {
    let d = desc(m, k, n, a, lda, b_packed, packed_b_len(k, n), c, ldc, accumulate, epi)?;
    // SAFETY: desc checked every operand extent; scratch is a distinct &mut borrow.
    unsafe { gemm_raw(&d, scratch.as_mut_ptr(), scratch.len(), pool, isa, split) }
}
