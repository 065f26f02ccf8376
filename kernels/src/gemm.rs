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

use crate::aligned::AlignedBuf;
use crate::error::{check_len, span};
use crate::math::Activation;
use crate::threadpool::ThreadPool;
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

// ---------------------------------------------------------------------------------------------
// Epilogue

/// The GEMM epilogue, C ABI layout (32 bytes):
///
/// | offset | field             | CLIF type | meaning                                             |
/// |-------:|-------------------|-----------|-----------------------------------------------------|
/// | 0      | `bias`            | i64       | `*const f32`, `n` floats, or null                   |
/// | 8      | `residual`        | i64       | `*const f32`, row `i` at `residual + i·stride`, or null |
/// | 16     | `residual_stride` | i64       | floats between residual rows (≥ n when m > 1)       |
/// | 24     | `activation`      | i32       | [`Activation`] code                                 |
/// | 28     | `scale`           | f32       | multiplies the product A·B                           |
///
/// Result: `C[i,j] = act(scale·Σₚ A[i,p]·B[p,j] + (accumulate ? C_old[i,j] : 0) + bias[j]) + residual[i,j]`.
/// The residual must not alias C (to add into C in place, use `accumulate` instead).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Epilogue {
    pub bias: *const f32,
    pub residual: *const f32,
    pub residual_stride: usize,
    pub activation: u32,
    pub scale: f32,
}

impl Epilogue {
    /// No epilogue: scale 1, no bias, no activation, no residual.
    pub const NONE: Epilogue = Epilogue {
        bias: std::ptr::null(),
        residual: std::ptr::null(),
        residual_stride: 0,
        activation: 0,
        scale: 1.0,
    };

    /// The bias and residual of C's row `row0 + i` from column `col0` on (null when absent).
    ///
    /// # Safety
    /// The bias/residual extents read from there are inside their allocations.
    #[inline(always)]
    unsafe fn operands(&self, i: usize, row0: usize, col0: usize) -> (*const f32, *const f32) {
        // SAFETY: the caller's contract.
        unsafe {
            let bp = if self.bias.is_null() { std::ptr::null() } else { self.bias.add(col0) };
            let rp = if self.residual.is_null() {
                std::ptr::null()
            } else {
                self.residual.add((row0 + i) * self.residual_stride + col0)
            };
            (bp, rp)
        }
    }

    fn has_post(&self) -> bool {
        !self.bias.is_null()
            || !self.residual.is_null()
            || self.activation != Activation::None as u32
    }
}

impl Default for Epilogue {
    fn default() -> Self {
        Epilogue::NONE
    }
}

/// The epilogue of one C tile at (`row0`, `col0`), handed to the tile kernel of the last k block:
/// the kernel applies it to each vector between its scaling and its store, so the tile is not
/// stored, reloaded and stored again. Per element the same operations in the same order as the
/// separate pass ([`EpilogueFn`], still used when k = 0): the same bits. In `perf` a quarter of
/// that pass's samples sat on reloading a tile whose lines were still on their way in (C cold in
/// a model, written for the first time); MiniLM 8×128, 2 threads, Zen 4: GEMM time 2.5–3% lower
/// on the AVX2 tile, the FFN-up + GELU kernel 1.19 → 1.11× the FFN-down one (same FLOPs).
#[derive(Clone, Copy)]
pub(crate) struct TilePost<'a> {
    epi: &'a Epilogue,
    act: Activation,
    row0: usize,
    col0: usize,
}

impl TilePost<'_> {
    /// Bias and residual of the tile's row `i` from its column `col` on (null when absent).
    ///
    /// # Safety
    /// As [`Epilogue::operands`] for the tile's row `i`, columns from `col`.
    #[inline(always)]
    unsafe fn operands(&self, i: usize, col: usize) -> (*const f32, *const f32) {
        // SAFETY: the caller's contract.
        unsafe { self.epi.operands(i, self.row0, self.col0 + col) }
    }
}

/// The safe-API epilogue: borrowed slices instead of raw pointers.
#[derive(Clone, Copy, Debug)]
pub struct EpilogueRef<'a> {
    /// Per-column bias (`n` floats).
    pub bias: Option<&'a [f32]>,
    /// Residual added after the activation: `(data, row_stride)`.
    pub residual: Option<(&'a [f32], usize)>,
    pub activation: Activation,
    /// Multiplies A·B.
    pub scale: f32,
}

impl Default for EpilogueRef<'_> {
    fn default() -> Self {
        EpilogueRef {
            bias: None,
            residual: None,
            activation: Activation::None,
            scale: 1.0,
        }
    }
}

impl<'a> EpilogueRef<'a> {
    /// Checks the slices against an m×n output and gives the raw form.
    fn to_raw(self, m: usize, n: usize) -> Result<Epilogue, KernelError> {
        let mut e = Epilogue {
            activation: self.activation as u32,
            scale: self.scale,
            ..Epilogue::NONE
        };
        if let Some(b) = self.bias {
            check_len("bias", b.len(), n)?;
            e.bias = b.as_ptr();
        }
        if let Some((r, rs)) = self.residual {
            check_len("residual", r.len(), span("residual", m, n, rs)?)?;
            e.residual = r.as_ptr();
            e.residual_stride = rs;
        }
        Ok(e)
    }
}

// ---------------------------------------------------------------------------------------------
// Packed B

/// Floats a packed B of `k`×`n` occupies: `ceil(n/NR)·NR·k`.
pub fn packed_b_len(k: usize, n: usize) -> usize {
    n.div_ceil(NR) * NR * k
}

/// B packed for [`gemm`]: `ceil(n/NR)` panels of `k×NR` floats (k-major), 64-byte aligned.
#[derive(Clone, Debug)]
pub struct PackedB {
    buf: AlignedBuf,
    k: usize,
    n: usize,
}

impl PackedB {
    /// Rows of B (the reduction dimension).
    pub fn k(&self) -> usize {
        self.k
    }
    /// Columns of B (the output width).
    pub fn n(&self) -> usize {
        self.n
    }
    /// The packed floats ([`packed_b_len`] of them).
    pub fn as_slice(&self) -> &[f32] {
        self.buf.as_slice()
    }
}

/// Packs B once. `transposed == false`: `b` is `[k, n]` row-major, element (p, j) at `b[p·ldb + j]`.
/// `transposed == true`: `b` is `[n, k]` row-major (a PyTorch Linear weight `[out, in]`), element
/// (p, j) at `b[j·ldb + p]`.
pub fn pack_b(
    b: &[f32],
    k: usize,
    n: usize,
    ldb: usize,
    transposed: bool,
) -> Result<PackedB, KernelError> {
    let mut buf = AlignedBuf::zeroed(packed_b_len(k, n));
    pack_b_into(b, k, n, ldb, transposed, buf.as_mut_slice())?;
    Ok(PackedB { buf, k, n })
}

/// [`pack_b`] into a caller buffer of at least [`packed_b_len`]`(k, n)` floats (for example a
/// plan's weight arena). Use with [`gemm_prepacked`]. 64-byte alignment of `dst` is recommended.
pub fn pack_b_into(
    b: &[f32],
    k: usize,
    n: usize,
    ldb: usize,
    transposed: bool,
    dst: &mut [f32],
) -> Result<(), KernelError> {
    let need = if transposed {
        span("b", n, k, ldb)?
    } else {
        span("b", k, n, ldb)?
    };
    check_len("b", b.len(), need)?;
    check_len("packed b", dst.len(), packed_b_len(k, n))?;
    // SAFETY: lengths checked above against the extents pack_b_raw touches.
    unsafe { pack_b_raw(b.as_ptr(), k, n, ldb, transposed, dst.as_mut_ptr()) };
    Ok(())
}

/// Raw packing, see [`pack_b`].
///
/// # Safety
/// `src` readable over the extent of the chosen layout; `dst` writable for `packed_b_len(k, n)`
/// floats; no overlap.
pub(crate) unsafe fn pack_b_raw(
    src: *const f32,
    k: usize,
    n: usize,
    ldb: usize,
    transposed: bool,
    dst: *mut f32,
) {
    let vector_transpose = transposed && crate::detect_isa().has_avx2();
    for pan in 0..n.div_ceil(NR) {
        let j0 = pan * NR;
        let w = NR.min(n - j0);
        // SAFETY (whole block): every index stays inside the extents stated in the contract:
        // p < k, j0 + jj < n, and panel offsets below packed_b_len(k, n).
        unsafe {
            let d = dst.add(pan * k * NR);
            if !transposed {
                for p in 0..k {
                    let s = src.add(p * ldb + j0);
                    let dp = d.add(p * NR);
                    if w == NR {
                        // A constant length: inline moves, not a memmove call per 64 bytes
                        // (attention packs V, 32 floats a row, per head).
                        std::ptr::copy_nonoverlapping(s, dp, NR);
                        continue;
                    }
                    std::ptr::copy_nonoverlapping(s, dp, w);
                    for jj in w..NR {
                        *dp.add(jj) = 0.0;
                    }
                }
            } else if cfg!(target_arch = "x86_64") && w == NR && vector_transpose {
                // SAFETY: AVX2 detected; a full panel (columns j0..j0+NR <= n) of a transposed
                // source: NR rows of k floats at stride ldb.
                #[cfg(target_arch = "x86_64")]
                avx2::pack_panel_transposed(src.add(j0 * ldb), k, ldb, d);
            } else {
                for jj in 0..w {
                    let s = src.add((j0 + jj) * ldb);
                    for p in 0..k {
                        *d.add(p * NR + jj) = *s.add(p);
                    }
                }
                for p in 0..k {
                    for jj in w..NR {
                        *d.add(p * NR + jj) = 0.0;
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Scratch

/// Floats of A-packing scratch one thread needs for an m×k A.
pub(crate) fn apack_len(m: usize, k: usize) -> usize {
    if k == 0 || m == 0 {
        return 0;
    }
    m.min(MC).div_ceil(MR) * MR * k.min(KC) + ALIGN_SLACK
}

/// Scratch floats [`gemm`] needs to run an m×n×k product on `threads` threads. With less scratch it
/// runs on as many threads as fit (at least one thread's worth is required).
pub fn gemm_scratch_len(m: usize, n: usize, k: usize, threads: usize) -> usize {
    let _ = n;
    threads.max(1) * apack_len(m, k)
}

/// Rounds a float pointer up to 64-byte alignment (at most 15 floats further).
#[inline]
pub(crate) fn align64(p: *mut f32) -> *mut f32 {
    let mis = (p as usize) & 63;
    if mis == 0 {
        p
    } else {
        p.wrapping_add((64 - mis) / 4)
    }
}

// ---------------------------------------------------------------------------------------------
// Architecture-specific pieces behind function pointers chosen once per call.

/// `kernel(kc, a, a_ld, b_panel, b_next, c, ldc, alpha, beta, mr, nr, pf, post)`: C[mr×nr] =
/// post(alpha·A·B (+ C if beta)), `post` the tile's epilogue when set; `b_next` (a prefetch
/// hint, never dereferenced) is where the next panel's same k block starts, and the tile
/// prefetches its k steps `pf.0..pf.1` (see [`prefetch_slice`]). A is a packed strip when `a_ld`
/// is [`PACKED`], else mr row-major rows at stride `a_ld` (the source itself, see [`gemm_block`]).
type KernelFn = unsafe fn(
    usize, *const f32, usize, *const f32, *const f32, *mut f32, usize, f32, bool, usize, usize, (usize, usize), Option<TilePost>,
);
/// `pack_a(a, lda, mc, kc, dst)`.
type PackAFn = unsafe fn(*const f32, usize, usize, usize, *mut f32);
/// `epilogue(c_tile, ldc, rows, cols, row0, col0, epi, act)`.
type EpilogueFn = unsafe fn(*mut f32, usize, usize, usize, usize, usize, &Epilogue, Activation);

/// `wide(kc, a, a_ld, b, b_stride, c, ldc, alpha, beta, mr, nr, pf, post)`: a tile of up to 2·MR
/// rows (two consecutive packed A strips, or mr row-major rows at stride `a_ld` as in
/// [`KernelFn`]) × 2·NR columns (panels `b` and `b + b_stride`); C = post(alpha·A·B (+ C));
/// prefetches k steps `pf.0..pf.1` of the next two panels.
type WideFn = unsafe fn(
    usize, *const f32, usize, *const f32, usize, *mut f32, usize, f32, bool, usize, usize, (usize, usize), Option<TilePost>,
);

/// The `a_ld` of a tile kernel whose A is packed strips.
const PACKED: usize = 0;

#[derive(Clone, Copy)]
pub(crate) struct Arch {
    kernel: KernelFn,
    pack_a: PackAFn,
    epilogue: EpilogueFn,
    /// The 2·MR × 2·NR tile kernel, where the ISA has one (AVX-512). Same packed layouts and, per
    /// element, the same operations in the same order as `kernel`, so results are bitwise equal.
    wide: Option<WideFn>,
}

impl Arch {
    pub(crate) fn for_isa(isa: Isa) -> Arch {
        match effective_isa(isa) {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Fma => Arch {
                kernel: avx2::kernel,
                pack_a: avx2::pack_a,
                epilogue: avx2::epilogue,
                wide: None,
            },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Arch {
                kernel: avx2::kernel,
                pack_a: avx2::pack_a,
                epilogue: avx512::epilogue,
                wide: Some(avx512::wide),
            },
            _ => Arch {
                kernel: scalar::kernel,
                pack_a: scalar::pack_a,
                epilogue: scalar::epilogue,
                wide: None,
            },
        }
    }
}

mod scalar {
    use super::*;

    /// # Safety
    /// `a` holds kc·MR floats (`a_ld` = [`PACKED`]) or mr rows of kc floats at stride `a_ld`, `b`
    /// kc·NR floats; `c` writable for mr rows of nr floats at stride ldc.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn kernel(
        kc: usize,
        a: *const f32,
        a_ld: usize,
        b: *const f32,
        _b_next: *const f32,
        c: *mut f32,
        ldc: usize,
        alpha: f32,
        beta: bool,
        mr: usize,
        nr: usize,
        _pf: (usize, usize),
        post: Option<TilePost>,
    ) {
        let mut acc = [[0.0f32; NR]; MR];
        for p in 0..kc {
            // SAFETY: p < kc, inside the panel.
            let bp = unsafe { std::slice::from_raw_parts(b.add(p * NR), NR) };
            for (i, row) in acc.iter_mut().enumerate() {
                let ai = match a_ld {
                    // SAFETY: inside the packed strip (zero rows past mr).
                    PACKED => unsafe { *a.add(p * MR + i) },
                    // SAFETY: row i < mr, column p < kc of the source rows.
                    ld if i < mr => unsafe { *a.add(i * ld + p) },
                    _ => 0.0,
                };
                for j in 0..NR {
                    row[j] += ai * bp[j];
                }
            }
        }
        for (i, row) in acc.iter().enumerate().take(mr) {
            for (j, &v) in row.iter().enumerate().take(nr) {
                // SAFETY: i < mr, j < nr: inside the caller's C tile.
                unsafe {
                    let cp = c.add(i * ldc + j);
                    *cp = if beta { alpha * v + *cp } else { alpha * v };
                }
            }
        }
        if let Some(t) = post {
            // SAFETY: the tile and its epilogue operands (caller contract).
            unsafe { epilogue(c, ldc, mr, nr, t.row0, t.col0, t.epi, t.act) };
        }
    }

    /// # Safety
    /// `a` readable for mc rows of kc floats at stride lda; `dst` writable for ceil(mc/MR)·MR·kc floats.
    pub(super) unsafe fn pack_a(a: *const f32, lda: usize, mc: usize, kc: usize, dst: *mut f32) {
        let mut d = dst;
        for s in (0..mc).step_by(MR) {
            let mr = MR.min(mc - s);
            for p in 0..kc {
                for i in 0..MR {
                    // SAFETY: row s + i < mc, column p < kc; d stays within the strips.
                    unsafe {
                        *d.add(i) = if i < mr {
                            *a.add((s + i) * lda + p)
                        } else {
                            0.0
                        };
                    }
                }
                d = d.wrapping_add(MR);
            }
        }
    }

    /// # Safety
    /// `c` is the tile (rows×cols at stride ldc); bias/residual (if set) cover columns col0+cols and rows row0+rows.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn epilogue(
        c: *mut f32,
        ldc: usize,
        rows: usize,
        cols: usize,
        row0: usize,
        col0: usize,
        e: &Epilogue,
        act: Activation,
    ) {
        for i in 0..rows {
            for j in 0..cols {
                // SAFETY: inside the tile and the epilogue operands' extents (caller contract).
                unsafe {
                    let cp = c.add(i * ldc + j);
                    let mut v = *cp;
                    if !e.bias.is_null() {
                        v += *e.bias.add(col0 + j);
                    }
                    v = act.apply(v);
                    if !e.residual.is_null() {
                        v += *e.residual.add((row0 + i) * e.residual_stride + col0 + j);
                    }
                    *cp = v;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! AVX2+FMA versions. `Arch::for_isa` hands these out only after runtime detection.
    use super::*;
    use crate::math::avx2::tail_mask;
    use crate::math::simd;
    use std::arch::x86_64::*;

    const NV: usize = NR / 8;

    /// The 6×16 microkernel, instantiated per valid row count so a partial strip (m = 16 =
    /// 6 + 6 + 4) does only its rows' FMAs.
    ///
    /// # Safety
    /// AVX2+FMA present; `a` holds kc·MR floats (`a_ld` = [`PACKED`]) or mr rows of kc floats at
    /// stride `a_ld`, `b` kc·NR floats; `c` writable for mr ≤ MR rows of nr ≤ NR floats at stride
    /// ldc.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn kernel(
        kc: usize,
        a: *const f32,
        a_ld: usize,
        b: *const f32,
        b_next: *const f32,
        c: *mut f32,
        ldc: usize,
        alpha: f32,
        beta: bool,
        mr: usize,
        nr: usize,
        pf: (usize, usize),
        post: Option<TilePost>,
    ) {
        macro_rules! rows {
            ($direct:literal, $post:literal) => {
                // SAFETY (each arm): forwarded; the instance reads rows < mr of A.
                unsafe {
                    match mr {
                        1 => kernel_r::<1, $direct, $post>(kc, a, a_ld, b, b_next, c, ldc, alpha, beta, mr, nr, pf, post),
                        2 => kernel_r::<2, $direct, $post>(kc, a, a_ld, b, b_next, c, ldc, alpha, beta, mr, nr, pf, post),
                        3 => kernel_r::<3, $direct, $post>(kc, a, a_ld, b, b_next, c, ldc, alpha, beta, mr, nr, pf, post),
                        4 => kernel_r::<4, $direct, $post>(kc, a, a_ld, b, b_next, c, ldc, alpha, beta, mr, nr, pf, post),
                        5 => kernel_r::<5, $direct, $post>(kc, a, a_ld, b, b_next, c, ldc, alpha, beta, mr, nr, pf, post),
                        _ => kernel_r::<MR, $direct, $post>(kc, a, a_ld, b, b_next, c, ldc, alpha, beta, mr, nr, pf, post),
                    }
                }
            };
        }
        // With an epilogue, instances of their own (see `avx512::wide`).
        match (a_ld == PACKED, post.is_some()) {
            (true, false) => rows!(false, false),
            (true, true) => rows!(false, true),
            (false, false) => rows!(true, false),
            (false, true) => rows!(true, true),
        }
    }

    /// R ≤ MR rows × 16 columns; A packed, or (`DIRECT`) read from rows at stride `a_ld`.
    ///
    /// # Safety
    /// See [`kernel`]; mr ≤ R, and mr == R when `DIRECT`.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn kernel_r<const R: usize, const DIRECT: bool, const POST: bool>(
        kc: usize,
        a: *const f32,
        a_ld: usize,
        b: *const f32,
        b_next: *const f32,
        c: *mut f32,
        ldc: usize,
        alpha: f32,
        beta: bool,
        mr: usize,
        nr: usize,
        pf: (usize, usize),
        post: Option<TilePost>,
    ) {
        let mut acc = [[_mm256_setzero_ps(); NV]; R];
        let mut ap = a;
        let mut bp = b;
        for p in 0..kc {
            if p >= pf.0 && p < pf.1 {
                // Hint only (prefetches never fault): the next panel's B, cold when m is small.
                _mm_prefetch::<_MM_HINT_T0>(b_next.wrapping_add(p * NR).cast());
            }
            // SAFETY: kc steps of MR (a packed) or 1 (a direct) and NR (b) floats stay inside the
            // operands.
            unsafe {
                let mut bv = [_mm256_setzero_ps(); NV];
                for (v, bvv) in bv.iter_mut().enumerate() {
                    *bvv = _mm256_loadu_ps(bp.add(v * 8));
                }
                for (i, row) in acc.iter_mut().enumerate() {
                    let av = _mm256_broadcast_ss(&*ap.add(if DIRECT { i * a_ld } else { i }));
                    for v in 0..NV {
                        row[v] = _mm256_fmadd_ps(av, bv[v], row[v]);
                    }
                }
                ap = ap.add(if DIRECT { 1 } else { MR });
                bp = bp.add(NR);
            }
        }
        // SAFETY: forwarded.
        unsafe { store_tile(&acc, c, ldc, alpha, beta, mr, nr, if POST { post } else { None }) }
    }

    /// Stores an accumulator tile: C = post(alpha·acc (+ C if beta)), valid part mr×nr only.
    ///
    /// # Safety
    /// AVX2 present; `c` writable for mr rows of nr floats at stride ldc.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn store_tile<const R: usize>(
        acc: &[[__m256; NV]; R],
        c: *mut f32,
        ldc: usize,
        alpha: f32,
        beta: bool,
        mr: usize,
        nr: usize,
        post: Option<TilePost>,
    ) {
        let alpha_v = _mm256_set1_ps(alpha);
        if mr == R && nr == NR {
            if let Some(t) = post {
                for (i, row) in acc.iter().enumerate() {
                    // SAFETY: full tile: row i < R.
                    unsafe { store_row_post(row, i, c, ldc, alpha_v, beta, t) };
                }
                return;
            }
            for (i, row) in acc.iter().enumerate() {
                for (v, &x) in row.iter().enumerate() {
                    // SAFETY: full tile: row i < MR, columns v*8..v*8+8 <= NR.
                    unsafe {
                        let p = c.add(i * ldc + v * 8);
                        let r = if beta {
                            _mm256_fmadd_ps(x, alpha_v, _mm256_loadu_ps(p))
                        } else {
                            _mm256_mul_ps(x, alpha_v)
                        };
                        _mm256_storeu_ps(p, r);
                    }
                }
            }
        } else {
            // Spill with constant indices (keeps `acc` in registers in the loop above), then
            // store the valid part with masks.
            let mut tile = [0.0f32; MR * NR];
            for (i, row) in acc.iter().enumerate() {
                for (v, &x) in row.iter().enumerate() {
                    // SAFETY: i*NR + v*8 + 8 <= MR*NR.
                    unsafe { _mm256_storeu_ps(tile.as_mut_ptr().add(i * NR + v * 8), x) };
                }
            }
            for i in 0..mr {
                let mut col = 0;
                while col < nr {
                    let m = tail_mask(nr - col);
                    // SAFETY: masked lanes cover only columns < nr of row i < mr.
                    unsafe {
                        let p = c.add(i * ldc + col);
                        let x = _mm256_loadu_ps(tile.as_ptr().add(i * NR + col));
                        let mut r = if beta {
                            _mm256_fmadd_ps(x, alpha_v, _mm256_maskload_ps(p, m))
                        } else {
                            _mm256_mul_ps(x, alpha_v)
                        };
                        if let Some(t) = post {
                            r = post8::<true, 1>([r], m, [t.operands(i, col)], t.act)[0];
                        }
                        _mm256_maskstore_ps(p, m, r);
                    }
                    col += 8;
                }
            }
        }
    }

    /// Stores row `i` of a full tile with its epilogue, the row's NV vectors through one
    /// [`post8`] so that their activations run side by side. (Measured on a Zen 4, AVX2 tile,
    /// 1024×384·384×1536 + bias + GELU: 83–84% of the FMA peak one vector at a time, 85–87% a
    /// row at a time, 84–85% two rows at a time, which LLVM schedules with the ten table rows
    /// held in registers and the accumulators spilled. Kept apart from `store_tile`'s plain loop,
    /// though the scaling is the same: one loop for both, with the epilogue under `if let`,
    /// measured 82–83%.)
    ///
    /// # Safety
    /// AVX2 present; `c` and the epilogue operands as in [`store_tile`] for a full tile, i < MR.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn store_row_post(
        row: &[__m256; NV],
        i: usize,
        c: *mut f32,
        ldc: usize,
        alpha_v: __m256,
        beta: bool,
        t: TilePost,
    ) {
        // SAFETY: the caller's contract; columns w*8..w*8+8 <= NR of row i.
        unsafe {
            let mut v = [alpha_v; NV];
            let mut ops = [(std::ptr::null(), std::ptr::null()); NV];
            for w in 0..NV {
                let p = c.add(i * ldc + w * 8);
                v[w] = if beta { _mm256_fmadd_ps(row[w], alpha_v, _mm256_loadu_ps(p)) } else { _mm256_mul_ps(row[w], alpha_v) };
                ops[w] = t.operands(i, w * 8);
            }
            let v = post8::<false, NV>(v, _mm256_set1_epi32(-1), ops, t.act);
            for (w, &x) in v.iter().enumerate() {
                _mm256_storeu_ps(c.add(i * ldc + w * 8), x);
            }
        }
    }

    /// Packs mc rows × kc columns of A into MR-row strips, k-major, zero-padded to a multiple of MR rows.
    ///
    /// # Safety
    /// AVX2 present; `a` readable for mc rows of kc floats at stride lda; `dst` writable for
    /// ceil(mc/MR)·MR·kc floats.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn pack_a(a: *const f32, lda: usize, mc: usize, kc: usize, dst: *mut f32) {
        let mut d = dst;
        let mut s = 0;
        while s < mc {
            let mr = MR.min(mc - s);
            if mr == MR {
                // 8 columns at a time: load 8 floats of each of the 6 rows, transpose in registers,
                // write 8 groups of 6.
                let mut p = 0;
                while p + 8 <= kc {
                    // SAFETY: rows s..s+6 < mc, columns p..p+8 <= kc; 48 floats written at d.
                    unsafe {
                        let r: [__m256; MR] = [
                            _mm256_loadu_ps(a.add(s * lda + p)),
                            _mm256_loadu_ps(a.add((s + 1) * lda + p)),
                            _mm256_loadu_ps(a.add((s + 2) * lda + p)),
                            _mm256_loadu_ps(a.add((s + 3) * lda + p)),
                            _mm256_loadu_ps(a.add((s + 4) * lda + p)),
                            _mm256_loadu_ps(a.add((s + 5) * lda + p)),
                        ];
                        // 8×8 transpose with two zero rows: c[q] = column q = (r0[q], …, r5[q], 0, 0).
                        let z = _mm256_setzero_ps();
                        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
                        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
                        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
                        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
                        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
                        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
                        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
                        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
                        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
                        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
                        let u4 = _mm256_shuffle_ps::<0x44>(t4, z);
                        let u5 = _mm256_shuffle_ps::<0xEE>(t4, z);
                        let u6 = _mm256_shuffle_ps::<0x44>(t5, z);
                        let u7 = _mm256_shuffle_ps::<0xEE>(t5, z);
                        let c = [
                            _mm256_permute2f128_ps::<0x20>(u0, u4),
                            _mm256_permute2f128_ps::<0x20>(u1, u5),
                            _mm256_permute2f128_ps::<0x20>(u2, u6),
                            _mm256_permute2f128_ps::<0x20>(u3, u7),
                            _mm256_permute2f128_ps::<0x31>(u0, u4),
                            _mm256_permute2f128_ps::<0x31>(u1, u5),
                            _mm256_permute2f128_ps::<0x31>(u2, u6),
                            _mm256_permute2f128_ps::<0x31>(u3, u7),
                        ];
                        // Column q goes to d[6q..6q+6]. An 8-float store also writes two floats of
                        // column q+1's slot, which the next store overwrites; the last column is
                        // stored as 4 + 2 floats so nothing past the 48-float block is written.
                        for (q, cq) in c.iter().enumerate().take(7) {
                            _mm256_storeu_ps(d.add(q * MR), *cq);
                        }
                        _mm_storeu_ps(d.add(7 * MR), _mm256_castps256_ps128(c[7]));
                        _mm_storel_epi64(
                            d.add(7 * MR + 4).cast(),
                            _mm_castps_si128(_mm256_extractf128_ps::<1>(c[7])),
                        );
                        d = d.add(8 * MR);
                    }
                    p += 8;
                }
                while p < kc {
                    for i in 0..MR {
                        // SAFETY: row s+i < mc, column p < kc.
                        unsafe { *d.add(i) = *a.add((s + i) * lda + p) };
                    }
                    d = d.wrapping_add(MR);
                    p += 1;
                }
            } else {
                for p in 0..kc {
                    for i in 0..MR {
                        // SAFETY: row s+i < mc when read; d within the strip.
                        unsafe {
                            *d.add(i) = if i < mr {
                                *a.add((s + i) * lda + p)
                            } else {
                                0.0
                            }
                        };
                    }
                    d = d.wrapping_add(MR);
                }
            }
            s += MR;
        }
    }

    /// Packs one full panel from a transposed source: `src` holds NR rows (columns j of B) of k
    /// floats at stride ldb; `d[p·NR + jj] = src[jj·ldb + p]`. 8×8 blocks transposed in registers.
    ///
    /// # Safety
    /// AVX2 present; `src` readable for NR rows of k floats at stride ldb; `d` writable for k·NR.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn pack_panel_transposed(src: *const f32, k: usize, ldb: usize, d: *mut f32) {
        for jb in 0..NR / 8 {
            let s = src.wrapping_add(jb * 8 * ldb);
            let mut p = 0;
            while p + 8 <= k {
                // SAFETY: rows jb·8..jb·8+8 < NR, columns p..p+8 <= k; 8 floats at 8 rows of d.
                unsafe {
                    let r: [__m256; 8] = std::array::from_fn(|q| _mm256_loadu_ps(s.add(q * ldb + p)));
                    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
                    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
                    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
                    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
                    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
                    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
                    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
                    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
                    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
                    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
                    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
                    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
                    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
                    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
                    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
                    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
                    let c = [
                        _mm256_permute2f128_ps::<0x20>(u0, u4),
                        _mm256_permute2f128_ps::<0x20>(u1, u5),
                        _mm256_permute2f128_ps::<0x20>(u2, u6),
                        _mm256_permute2f128_ps::<0x20>(u3, u7),
                        _mm256_permute2f128_ps::<0x31>(u0, u4),
                        _mm256_permute2f128_ps::<0x31>(u1, u5),
                        _mm256_permute2f128_ps::<0x31>(u2, u6),
                        _mm256_permute2f128_ps::<0x31>(u3, u7),
                    ];
                    for (q, cq) in c.iter().enumerate() {
                        _mm256_storeu_ps(d.add((p + q) * NR + jb * 8), *cq);
                    }
                }
                p += 8;
            }
            while p < k {
                for q in 0..8 {
                    // SAFETY: row jb·8+q < NR, column p < k.
                    unsafe { *d.add(p * NR + jb * 8 + q) = *s.add(q * ldb + p) };
                }
                p += 1;
            }
        }
    }

    /// Bias, activation and residual on one C tile.
    ///
    /// # Safety
    /// AVX2+FMA present; `c` is the tile (rows×cols at stride ldc); bias/residual (when set) cover
    /// columns col0..col0+cols and rows row0..row0+rows.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn epilogue(
        c: *mut f32,
        ldc: usize,
        rows: usize,
        cols: usize,
        row0: usize,
        col0: usize,
        e: &Epilogue,
        act: Activation,
    ) {
        let all = _mm256_set1_epi32(-1);
        for i in 0..rows {
            // SAFETY (loop): columns j..j+8 (full vectors) or j..cols (masked tail) of row i, inside
            // the tile and the bias/residual extents.
            unsafe {
                let cp = c.add(i * ldc);
                let mut j = 0;
                while j + 8 <= cols {
                    let v = post8::<false, 1>([_mm256_loadu_ps(cp.add(j))], all, [e.operands(i, row0, col0 + j)], act)[0];
                    _mm256_storeu_ps(cp.add(j), v);
                    j += 8;
                }
                if j < cols {
                    let m = tail_mask(cols - j);
                    let v = post8::<true, 1>([_mm256_maskload_ps(cp.add(j), m)], m, [e.operands(i, row0, col0 + j)], act)[0];
                    _mm256_maskstore_ps(cp.add(j), m, v);
                }
            }
        }
    }

    /// K vectors of the epilogue: `act(v + bias) + residual` (bias and residual skipped where
    /// null), their lanes loaded under `m` when `MASKED`; the K activations side by side
    /// (`simd::act_n`). The one definition the separate pass and the tile store share.
    ///
    /// # Safety
    /// AVX2+FMA present; `bp`/`rp` null or readable for 8 floats (the lanes of `m` when `MASKED`).
    #[inline(always)]
    unsafe fn post8<const MASKED: bool, const K: usize>(
        mut v: [__m256; K],
        m: __m256i,
        ops: [(*const f32, *const f32); K],
        act: Activation,
    ) -> [__m256; K] {
        // SAFETY: the caller's contract.
        unsafe {
            for (x, &(bp, _)) in v.iter_mut().zip(&ops) {
                if !bp.is_null() {
                    *x = _mm256_add_ps(*x, if MASKED { _mm256_maskload_ps(bp, m) } else { _mm256_loadu_ps(bp) });
                }
            }
            v = simd::act_n(act, v);
            for (x, &(_, rp)) in v.iter_mut().zip(&ops) {
                if !rp.is_null() {
                    *x = _mm256_add_ps(*x, if MASKED { _mm256_maskload_ps(rp, m) } else { _mm256_loadu_ps(rp) });
                }
            }
            v
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! AVX-512F tile kernel over the AVX2 packed layouts. `Arch::for_isa` hands it out only after
    //! runtime detection of AVX-512F.
    use super::*;
    use std::arch::x86_64::*;

    /// Dispatches to the monomorphized tile for 1 or 2 strips × 1 or 2 panels.
    ///
    /// # Safety
    /// AVX-512F present; `a` holds ceil(mr/MR) packed strips of kc·MR floats (consecutive; `a_ld`
    /// = [`PACKED`]) or mr rows of kc floats at stride `a_ld`, `b` (and `b + b_stride` when
    /// nr > NR) kc·NR floats; `c` writable for mr ≤ 2·MR rows of nr ≤ 2·NR floats at stride ldc.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn wide(
        kc: usize,
        a: *const f32,
        a_ld: usize,
        b: *const f32,
        b_stride: usize,
        c: *mut f32,
        ldc: usize,
        alpha: f32,
        beta: bool,
        mr: usize,
        nr: usize,
        pf: (usize, usize),
        post: Option<TilePost>,
    ) {
        // One instance per row count: a partial tile (m not a multiple of 12, e.g. 16 = 12 + 4)
        // does only its valid rows' FMAs instead of a full strip's.
        macro_rules! rows {
            ($direct:literal, $post:literal; $($r:literal)*) => {
                match (mr, nr > NR) {
                    $(
                        // SAFETY: forwarded; the instance reads only rows < mr of A and the
                        // panels that exist.
                        ($r, true) => unsafe {
                            tile::<$r, 2, true, $direct, $post>(kc, a, a_ld, b, b_stride, c, ldc, alpha, beta, mr, nr, pf, post)
                        },
                        // SAFETY: as above.
                        ($r, false) => unsafe {
                            tile::<$r, 1, false, $direct, $post>(kc, a, a_ld, b, b_stride, c, ldc, alpha, beta, mr, nr, pf, post)
                        },
                    )*
                    _ => {}
                }
            };
        }
        // The tiles with an epilogue are instances of their own: the others keep the store
        // without it, their accumulators in registers (sharing one instance spilled the tile).
        match (a_ld == PACKED, post.is_some()) {
            (true, false) => rows!(false, false; 1 2 3 4 5 6 7 8 9 10 11 12),
            (true, true) => rows!(false, true; 1 2 3 4 5 6 7 8 9 10 11 12),
            (false, false) => rows!(true, false; 1 2 3 4 5 6 7 8 9 10 11 12),
            (false, true) => rows!(true, true; 1 2 3 4 5 6 7 8 9 10 11 12),
        }
    }

    /// Bias, activation and residual on one C tile, 16 lanes at a time. Per element these are
    /// the operations of `avx2::epilogue` (both run `math::simd`, instantiated at 8 and 16
    /// lanes), so the results are bitwise equal; half the instructions per element is what makes
    /// the exact-erf GELU cheap next to the GEMM.
    ///
    /// # Safety
    /// AVX-512F present; as `avx2::epilogue`.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn epilogue(
        c: *mut f32,
        ldc: usize,
        rows: usize,
        cols: usize,
        row0: usize,
        col0: usize,
        e: &Epilogue,
        act: Activation,
    ) {
        for i in 0..rows {
            // SAFETY (loop): the masked lanes cover columns j..min(j+16, cols) of row i, inside
            // the tile and the bias/residual extents.
            unsafe {
                let cp = c.add(i * ldc);
                let mut j = 0;
                while j < cols {
                    let w = (cols - j).min(16);
                    let m: __mmask16 = if w == 16 { 0xFFFF } else { (1u16 << w) - 1 };
                    let (bp, rp) = e.operands(i, row0, col0 + j);
                    let v = post16(_mm512_maskz_loadu_ps(m, cp.add(j)), m, bp, rp, act);
                    _mm512_mask_storeu_ps(cp.add(j), m, v);
                    j += 16;
                }
            }
        }
    }

    /// One vector of the epilogue: `act(v + bias) + residual` (bias and residual skipped where
    /// null, their lanes loaded under `m`); shared by the separate pass and the tile store.
    ///
    /// # Safety
    /// AVX-512F present; `bp`/`rp` null or readable in the lanes of `m`.
    #[inline(always)]
    unsafe fn post16(mut v: __m512, m: __mmask16, bp: *const f32, rp: *const f32, act: Activation) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe {
            if !bp.is_null() {
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bp));
            }
            v = crate::math::simd::act(act, v);
            if !rp.is_null() {
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, rp));
            }
            v
        }
    }

    /// R ≤ 12 rows (rows < 6 from the first A strip, the rest from the second; with `DIRECT`
    /// row i from `a + i·a_ld`) × P panels of 16 columns, one zmm per (row, panel): per k, P loads
    /// of B, R broadcasts of A, R·P FMAs (24 accumulators at 12×2, 27 registers).
    ///
    /// # Safety
    /// See [`wide`].
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const R: usize, const P: usize, const PF: bool, const DIRECT: bool, const POST: bool>(
        kc: usize,
        a: *const f32,
        a_ld: usize,
        b: *const f32,
        b_stride: usize,
        c: *mut f32,
        ldc: usize,
        alpha: f32,
        beta: bool,
        mr: usize,
        nr: usize,
        pf: (usize, usize),
        post: Option<TilePost>,
    ) {
        let mut acc = [[_mm512_setzero_ps(); P]; R];
        let a1 = a.wrapping_add(kc * MR);
        let b1 = b.wrapping_add(b_stride);
        let mut p = 0;
        while p < kc {
            // SAFETY: k step p < kc: MR floats of each strip and NR of each panel are in bounds.
            unsafe {
                let mut bv = [_mm512_setzero_ps(); P];
                bv[0] = _mm512_loadu_ps(b.add(p * NR));
                if P == 2 {
                    bv[P - 1] = _mm512_loadu_ps(b1.add(p * NR));
                }
                if PF && p >= pf.0 && p < pf.1 {
                    // The same k step of the panels two ahead (the next tile pair's B, which
                    // otherwise comes cold from L3/memory when m is small). A hint: never faults.
                    _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(2 * b_stride + p * NR).cast());
                    _mm_prefetch::<_MM_HINT_T0>(b1.wrapping_add(2 * b_stride + p * NR).cast());
                }
                for (i, row) in acc.iter_mut().enumerate() {
                    let src = if DIRECT {
                        a.add(i * a_ld + p)
                    } else if i < MR {
                        a.add(p * MR + i)
                    } else {
                        a1.add(p * MR + i - MR)
                    };
                    let av = _mm512_set1_ps(*src);
                    for v in 0..P {
                        row[v] = _mm512_fmadd_ps(av, bv[v], row[v]);
                    }
                }
            }
            p += 1;
        }
        // SAFETY: forwarded.
        unsafe { store_rows::<R, P>(acc, c, ldc, alpha, beta, mr, nr, if POST { post } else { None }) }
    }

    /// C = post(alpha·acc (+ C if beta)) for the valid mr × nr part of a tile.
    ///
    /// # Safety
    /// AVX-512F present (the callers are its `#[target_feature]` functions); `c` writable for mr
    /// rows of nr floats at stride ldc; `post`'s operands cover them.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn store_rows<const R: usize, const P: usize>(
        acc: [[__m512; P]; R],
        c: *mut f32,
        ldc: usize,
        alpha: f32,
        beta: bool,
        mr: usize,
        nr: usize,
        post: Option<TilePost>,
    ) {
        // SAFETY: AVX-512F present (contract).
        let alpha_v = unsafe { _mm512_set1_ps(alpha) };
        for (i, row) in acc.iter().enumerate() {
            if i >= mr {
                break;
            }
            // One vector at a time, epilogue included: the GELU already evaluates two polynomial
            // chains per vector, and the row's two vectors side by side held more registers than
            // the 24-accumulator tile leaves (gemm_bench 1024×384·384×1536 + bias+GELU, three
            // alternations: 85.4–86.3% of peak on 1 thread with the row's vectors together,
            // 87.7–88.1% one at a time; the AVX2 tile, with 12 accumulators, measures the same
            // both ways and keeps its row).
            for (v, &x) in row.iter().enumerate() {
                let col = v * NR;
                if col >= nr {
                    break;
                }
                let w = (nr - col).min(NR);
                let m: __mmask16 = if w == NR { 0xFFFF } else { (1u16 << w) - 1 };
                // SAFETY: masked lanes cover only columns < nr of row i < mr, and the tile's
                // epilogue operands there.
                unsafe {
                    let cp = c.add(i * ldc + col);
                    // Same operations per element as the AVX2 tile's store (bitwise equal).
                    let mut r = if beta {
                        _mm512_fmadd_ps(x, alpha_v, _mm512_maskz_loadu_ps(m, cp))
                    } else {
                        _mm512_mul_ps(x, alpha_v)
                    };
                    if let Some(t) = post {
                        let (bp, rp) = t.operands(i, col);
                        r = post16(r, m, bp, rp, t.act);
                    }
                    _mm512_mask_storeu_ps(cp, m, r);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Drivers

/// One GEMM problem in raw form.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GemmDesc {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: *const f32,
    pub lda: usize,
    /// Packed B (see module docs).
    pub b: *const f32,
    pub c: *mut f32,
    pub ldc: usize,
    pub accumulate: bool,
    pub epi: Epilogue,
    pub act: Activation,
}

// SAFETY: a GemmDesc is shared by the threads of one call; they read A, B and the epilogue operands
// and write disjoint parts of C (disjoint row or panel ranges), which is what the callers guarantee.
unsafe impl Sync for GemmDesc {}
// SAFETY: as above.
unsafe impl Send for GemmDesc {}

/// The k steps of the next B panel(s) that tile `t` of the `tiles` sharing a panel prefetches:
/// an equal slice each, so the panel is fetched once, spread over the tiles, instead of every
/// tile prefetching all of it again (11 times at m = 128 on AVX-512, 22 on AVX2). gemm_bench,
/// 2 threads, B cold (`COLD=b`): 128×384·384×384 278-285 → 284-298 GF/s, ·384×1536 300 →
/// 309-328, 128×1536·1536×384 276-280 → 279-287; 1024 rows within noise. AVX2 path
/// (`KILN_NO_AVX512=1`): 155-157 → 163-164, 160-165 → 167-168, 151-159 → 160-161.
#[inline]
fn prefetch_slice(t: usize, tiles: usize, kc: usize) -> (usize, usize) {
    (t * kc / tiles, (t + 1) * kc / tiles)
}

/// Runs rows `r0..r1` × panels `p0..p1` of `d` on the calling thread.
///
/// # Safety
/// `d` describes valid operands (A: m rows × k at lda; B: packed k×n; C: m rows × n at ldc;
/// epilogue extents); `apack` writable for `apack_len(r1 - r0, k)` floats minus the alignment slack
/// and 64-byte aligned; no other thread writes the same C range.
pub(crate) unsafe fn gemm_block(
    d: &GemmDesc,
    r0: usize,
    r1: usize,
    p0: usize,
    p1: usize,
    apack: *mut f32,
    arch: &Arch,
) {
    let post = d.epi.has_post();
    if d.k == 0 {
        for p in p0..p1 {
            let col0 = p * NR;
            let nr = NR.min(d.n - col0);
            for i in r0..r1 {
                if !d.accumulate {
                    // SAFETY: row i < m, columns col0..col0+nr < n.
                    unsafe { std::ptr::write_bytes(d.c.add(i * d.ldc + col0), 0, nr) };
                }
            }
            if post {
                // SAFETY: the tile rows r0..r1 × columns col0..col0+nr is inside C.
                unsafe {
                    (arch.epilogue)(
                        d.c.add(r0 * d.ldc + col0),
                        d.ldc,
                        r1 - r0,
                        nr,
                        r0,
                        col0,
                        &d.epi,
                        d.act,
                    )
                };
            }
        }
        return;
    }
    let alpha = d.epi.scale;
    // Equal k blocks of at most KC (k = 1536 → 4 × 384; k = 512 → 2 × 256 rather than 384 + 128).
    let kc_step = d.k.div_ceil(d.k.div_ceil(KC));
    // Equal m blocks of at most MC rows, in whole tiles (m = 300 → 108 + 108 + 84, not
    // 144 + 144 + 12): no short block streams all of B for a few rows.
    let tile_rows = if arch.wide.is_some() { 2 * MR } else { MR };
    let rows = (r1 - r0).max(1);
    let mc_step = rows.div_ceil(rows.div_ceil(MC)).next_multiple_of(tile_rows).min(MC);
    // A is packed so that the tiles of many B panels reuse it from L1/L2 in the order they read
    // it. When this block has at most two panels (attention's P·V with a head dim of 32, narrow
    // classifier heads) each A element is read by one or two tiles, and packing it costs more
    // than it saves; so it does when k is short and the tiles few (attention's Q·Kᵀ: k = 32,
    // a strip of A is 12 rows × 2 cache lines that stay in L1 across its tiles). Then the tiles
    // read A's rows in place (same FMAs in the same order: bitwise the packed path's results).
    // Measured, attn_bench 8×128: 86.5 → 89.6 GF/s on AVX-512 (4 tiles per strip), 52.1 → 52.9
    // on AVX2 (8); at 8×512 AVX-512 98.2 → 100.4 (16) but AVX2 56.1 → 54.6 (32): hence ≤ 16.
    let tiles_per_strip = if arch.wide.is_some() { (p1 - p0).div_ceil(2) } else { p1 - p0 };
    let direct = d.lda != PACKED && (p1 - p0 <= 2 || (d.k <= 64 && tiles_per_strip <= 16));
    let mut kc0 = 0;
    while kc0 < d.k {
        let kc = kc_step.min(d.k - kc0);
        let beta = d.accumulate || kc0 > 0;
        let last = kc0 + kc == d.k;
        // The last k block's tiles apply the epilogue as they store.
        let tile_post = |row0: usize, col0: usize| (last && post).then_some(TilePost { epi: &d.epi, act: d.act, row0, col0 });
        let mut mc0 = r0;
        while mc0 < r1 {
            let mc = mc_step.min(r1 - mc0);
            // SAFETY: A rows mc0..mc0+mc < m, columns kc0..kc0+kc <= k.
            let a_blk = unsafe { d.a.add(mc0 * d.lda + kc0) };
            // How the tiles read A: row ir of the block is at a_base + ir·a_step.
            let (a_ld, a_base, a_step) = if direct {
                (d.lda, a_blk, d.lda)
            } else {
                // SAFETY: apack holds the packed block.
                unsafe { (arch.pack_a)(a_blk, d.lda, mc, kc, apack) };
                (PACKED, apack.cast_const(), kc)
            };
            let strip = |ir: usize| a_base.wrapping_add(ir * a_step);
            if let Some(wide) = arch.wide {
                // Tiles of two strips × two panels (the last ones narrower).
                let mut p = p0;
                while p < p1 {
                    let np = 2.min(p1 - p);
                    let col0 = p * NR;
                    let nr = (np * NR).min(d.n - col0);
                    // SAFETY: panels p, p+np-1 < ceil(n/NR), k offset kc0 + kc <= k.
                    let bp = unsafe { d.b.add(p * d.k * NR + kc0 * NR) };
                    let mut ir = 0;
                    while ir < mc {
                        let mr = (2 * MR).min(mc - ir);
                        let pf = prefetch_slice(ir / (2 * MR), mc.div_ceil(2 * MR), kc);
                        // SAFETY: C tile rows mc0+ir..+mr < r1, columns col0..col0+nr <= n; A's
                        // rows ir..ir+mr of the block (packed: the strips at ir·kc).
                        unsafe {
                            let cp = d.c.add((mc0 + ir) * d.ldc + col0);
                            wide(kc, strip(ir), a_ld, bp, d.k * NR, cp, d.ldc, alpha, beta, mr, nr, pf, tile_post(mc0 + ir, col0));
                        }
                        ir += 2 * MR;
                    }
                    p += np;
                }
                mc0 += mc;
                continue;
            }
            for p in p0..p1 {
                let col0 = p * NR;
                let nr = NR.min(d.n - col0);
                // SAFETY: panel p < ceil(n/NR), k offset kc0 + kc <= k: inside packed B.
                let bp = unsafe { d.b.add(p * d.k * NR + kc0 * NR) };
                let mut ir = 0;
                while ir < mc {
                    let mr = MR.min(mc - ir);
                    // SAFETY: C tile rows mc0+ir..+mr < r1, columns col0..col0+nr <= n; A's rows
                    // ir..ir+mr of the block (packed: the strip at ir·kc).
                    unsafe {
                        let cp = d.c.add((mc0 + ir) * d.ldc + col0);
                        let bn = bp.wrapping_add(d.k * NR);
                        let pf = prefetch_slice(ir / MR, mc.div_ceil(MR), kc);
                        (arch.kernel)(kc, strip(ir), a_ld, bp, bn, cp, d.ldc, alpha, beta, mr, nr, pf, tile_post(mc0 + ir, col0));
                    }
                    ir += MR;
                }
            }
            mc0 += mc;
        }
        kc0 += kc;
    }
}

/// How a GEMM's work is cut across threads.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Decide from the shape.
    Auto,
    /// Contiguous ranges of B panels (each thread packs all of A).
    Panels,
    /// Contiguous ranges of A rows (each thread streams all of B).
    Rows,
}

/// Raw multi-threaded GEMM.
///
/// # Safety
/// `d` describes valid operands (see [`gemm_block`]); `scratch` writable for `scratch_len` floats
/// and disjoint from every operand.
pub(crate) unsafe fn gemm_raw(
    d: &GemmDesc,
    scratch: *mut f32,
    scratch_len: usize,
    pool: Option<&ThreadPool>,
    isa: Isa,
    split: Split,
) -> Result<(), KernelError> {
    if d.m == 0 || d.n == 0 {
        return Ok(());
    }
    let arch = Arch::for_isa(isa);
    let per = apack_len(d.m, d.k);
    if scratch_len < per {
        return Err(KernelError::ScratchTooSmall {
            needed: per,
            got: scratch_len,
        });
    }
    let fit = scratch_len.checked_div(per).unwrap_or(usize::MAX);
    let mut threads = pool.map_or(1, |p| p.threads()).min(fit);
    if d.m * d.n * d.k.max(1) < PAR_MIN_MACS {
        threads = 1;
    }
    let n_panels = d.n.div_ceil(NR);
    let m_strips = d.m.div_ceil(MR);
    let by_rows = match split {
        Split::Rows => true,
        Split::Panels => false,
        Split::Auto => m_strips > n_panels,
    };
    let units = if by_rows { m_strips } else { n_panels };
    let tasks = threads.min(units).max(1);
    let sp = scratch as usize;
    let body = |t: usize| {
        let u0 = t * units / tasks;
        let u1 = (t + 1) * units / tasks;
        let (r0, r1, p0, p1) = if by_rows {
            ((u0 * MR).min(d.m), (u1 * MR).min(d.m), 0, n_panels)
        } else {
            (0, d.m, u0, u1)
        };
        let apack = align64((sp as *mut f32).wrapping_add(t * per));
        // SAFETY: task t owns scratch region t (t < tasks <= fit) and a disjoint range of rows or
        // panels of C; the operands are valid per this function's contract.
        unsafe { gemm_block(d, r0, r1, p0, p1, apack, &arch) };
    };
    match pool {
        Some(p) if tasks > 1 => p.run(tasks, &body),
        _ => body(0),
    }
    Ok(())
}

/// Validates a safe-API GEMM and builds its raw description.
#[allow(clippy::too_many_arguments)]
fn desc(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    epi: &EpilogueRef<'_>,
) -> Result<GemmDesc, KernelError> {
    check_len("a", a.len(), span("a", m, k, lda)?)?;
    check_len("packed b", b.len(), packed_b_len(k, n))?;
    check_len("c", c.len(), span("c", m, n, ldc)?)?;
    let e = epi.to_raw(m, n)?;
    Ok(GemmDesc {
        m,
        n,
        k,
        a: a.as_ptr(),
        lda,
        b: b.as_ptr(),
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
        b.k,
        b.n,
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
    let d = desc(m, k, n, a, lda, b_packed, c, ldc, accumulate, epi)?;
    // SAFETY: desc checked every operand extent; scratch is a distinct &mut borrow.
    unsafe { gemm_raw(&d, scratch.as_mut_ptr(), scratch.len(), pool, isa, split) }
}

// ---------------------------------------------------------------------------------------------
// Strided batched GEMM with B packed on the fly (attention-sized products).

/// Strided batched GEMM, C ABI layout (`repr(C)`, 144 bytes; every field is 8 bytes (CLIF `i64`)
/// except `alpha` (f32 at offset 120) and `_pad` (u32 at 124)). Item `i < batch` computes
/// `C_i[m×n] = alpha·A_i·B_i (+ C_i if accumulate != 0)` with `A_i = a + i·stride_a` (m rows of k at
/// `lda`), `B_i = b + i·stride_b` (`[k, n]` at `ldb`, or `[n, k]` at `ldb` when `b_transposed != 0`),
/// `C_i = c + i·stride_c` (m rows of n at `ldc`). B is packed per item into scratch; items are spread
/// over the thread pool, each worker with its own [`batched_scratch_len_per_thread`] floats.
///
/// Offsets in declaration order: batch 0, m 8, n 16, k 24, a 32, lda 40, stride_a 48, b 56, ldb 64,
/// stride_b 72, b_transposed 80, c 88, ldc 96, stride_c 104, accumulate 112, alpha 120, _pad 124,
/// scratch 128, scratch_len 136 (size 144). `tests/table.rs` checks them with `offset_of!`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BatchedGemmArgs {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: *const f32,
    pub lda: usize,
    pub stride_a: usize,
    pub b: *const f32,
    pub ldb: usize,
    pub stride_b: usize,
    pub b_transposed: usize,
    pub c: *mut f32,
    pub ldc: usize,
    pub stride_c: usize,
    pub accumulate: usize,
    pub alpha: f32,
    pub _pad: u32,
    pub scratch: *mut f32,
    pub scratch_len: usize,
}

// SAFETY: the args are shared by the workers of one call, which read A and B, write disjoint C
// blocks and use disjoint scratch regions (the raw entry's contract).
unsafe impl Sync for BatchedGemmArgs {}
// SAFETY: as above.
unsafe impl Send for BatchedGemmArgs {}

/// Scratch floats one worker of a batched GEMM needs.
pub fn batched_scratch_len_per_thread(m: usize, n: usize, k: usize) -> usize {
    packed_b_len(k, n) + ALIGN_SLACK + apack_len(m, k)
}

/// Scratch floats a batched GEMM needs on `threads` threads.
pub fn batched_scratch_len(m: usize, n: usize, k: usize, threads: usize) -> usize {
    threads.max(1) * batched_scratch_len_per_thread(m, n, k)
}

/// Raw batched GEMM.
///
/// # Safety
/// Every item's A, B and C extents are valid (see [`BatchedGemmArgs`]); the C blocks of different
/// items are pairwise disjoint; `scratch` writable for `scratch_len` floats, disjoint from operands.
pub(crate) unsafe fn gemm_batched_raw(
    g: &BatchedGemmArgs,
    pool: Option<&ThreadPool>,
    isa: Isa,
) -> Result<(), KernelError> {
    if g.batch == 0 || g.m == 0 || g.n == 0 {
        return Ok(());
    }
    let per = batched_scratch_len_per_thread(g.m, g.n, g.k);
    if g.scratch_len < per || g.scratch.is_null() {
        return Err(KernelError::ScratchTooSmall {
            needed: per,
            got: if g.scratch.is_null() {
                0
            } else {
                g.scratch_len
            },
        });
    }
    let arch = Arch::for_isa(isa);
    let workers = pool
        .map_or(1, |p| p.threads())
        .min(g.scratch_len / per)
        .max(1);
    let serial = workers == 1 || g.m * g.n * g.k.max(1) * g.batch < PAR_MIN_MACS;
    let sp = g.scratch as usize;
    let g = *g;
    let body = move |i: usize, w: usize| {
        // Use `g` whole so the closure captures the (Sync) struct, not its raw-pointer fields.
        let g = &g;
        let base = (sp as *mut f32).wrapping_add(w * per);
        let bpack = align64(base);
        let apack = align64(bpack.wrapping_add(packed_b_len(g.k, g.n)));
        let d = GemmDesc {
            m: g.m,
            n: g.n,
            k: g.k,
            a: g.a.wrapping_add(i * g.stride_a),
            lda: g.lda,
            b: bpack,
            c: g.c.wrapping_add(i * g.stride_c),
            ldc: g.ldc,
            accumulate: g.accumulate != 0,
            epi: Epilogue {
                scale: g.alpha,
                ..Epilogue::NONE
            },
            act: Activation::None,
        };
        // SAFETY: worker w owns scratch region w (w < workers <= scratch_len / per); item i's
        // operands are valid and its C block is disjoint from other items' (caller contract).
        unsafe {
            pack_b_raw(
                g.b.wrapping_add(i * g.stride_b),
                g.k,
                g.n,
                g.ldb,
                g.b_transposed != 0,
                bpack,
            );
            gemm_block(&d, 0, g.m, 0, g.n.div_ceil(NR), apack, &arch);
        }
    };
    match pool {
        Some(p) if !serial && workers == p.threads() => p.run_indexed(g.batch, &body),
        Some(p) if !serial => {
            // Pools bigger than the scratch allows: only `workers` distinct scratch regions exist,
            // so run `workers` tasks, each striding over the items.
            let n_tasks = workers.min(g.batch);
            p.run(n_tasks, &|t| {
                let mut i = t;
                while i < g.batch {
                    body(i, t);
                    i += n_tasks;
                }
            })
        }
        _ => {
            for i in 0..g.batch {
                body(i, 0);
            }
        }
    }
    Ok(())
}

/// A strided batch of row-major matrices: item `i` starts at `data[i·batch_stride]`, rows `ld` apart.
#[derive(Clone, Copy, Debug)]
pub struct Strided<'a> {
    pub data: &'a [f32],
    pub ld: usize,
    pub batch_stride: usize,
}

/// Mutable [`Strided`].
#[derive(Debug)]
pub struct StridedMut<'a> {
    pub data: &'a mut [f32],
    pub ld: usize,
    pub batch_stride: usize,
}

/// Whether a strided layout `(extent, stride)` maps distinct indices to distinct elements
/// (sufficient check: sorted by stride, each stride is at least the span of all smaller dimensions).
pub(crate) fn injective(dims: &mut [(usize, usize)]) -> bool {
    dims.sort_by_key(|&(_, s)| s);
    let mut span = 1usize;
    for &(e, s) in dims.iter() {
        if e <= 1 {
            continue;
        }
        if s < span {
            return false;
        }
        span = match s.checked_mul(e - 1).and_then(|x| x.checked_add(span)) {
            Some(v) => v,
            None => return false,
        };
    }
    true
}

/// `C_i = alpha·A_i·B_i (+ C_i)` for `i < batch`, B packed on the fly (`b_transposed`: B_i given as
/// `[n, k]`). `scratch`: at least [`batched_scratch_len_per_thread`] floats; with `pool` items run
/// in parallel on as many threads as the scratch has room for. C blocks of different items must not
/// overlap (checked).
#[allow(clippy::too_many_arguments)]
pub fn gemm_batched(
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    a: Strided<'_>,
    b: Strided<'_>,
    b_transposed: bool,
    c: StridedMut<'_>,
    alpha: f32,
    accumulate: bool,
    scratch: &mut [f32],
    pool: Option<&ThreadPool>,
    isa: Isa,
) -> Result<(), KernelError> {
    if batch == 0 || m == 0 || n == 0 {
        return Ok(());
    }
    let last = |what, stride: usize, one: usize| -> Result<usize, KernelError> {
        if one == 0 {
            return Ok(0);
        }
        (batch - 1)
            .checked_mul(stride)
            .and_then(|x| x.checked_add(one))
            .ok_or(KernelError::Invalid(what))
    };
    check_len(
        "a",
        a.data.len(),
        last("a extent overflows", a.batch_stride, span("a", m, k, a.ld)?)?,
    )?;
    let b_one = if b_transposed {
        span("b", n, k, b.ld)?
    } else {
        span("b", k, n, b.ld)?
    };
    check_len(
        "b",
        b.data.len(),
        last("b extent overflows", b.batch_stride, b_one)?,
    )?;
    check_len(
        "c",
        c.data.len(),
        last("c extent overflows", c.batch_stride, span("c", m, n, c.ld)?)?,
    )?;
    if !injective(&mut [(batch, c.batch_stride), (m, c.ld), (n, 1)]) {
        return Err(KernelError::Invalid(
            "batched gemm: C blocks of different items overlap",
        ));
    }
    let args = BatchedGemmArgs {
        batch,
        m,
        n,
        k,
        a: a.data.as_ptr(),
        lda: a.ld,
        stride_a: a.batch_stride,
        b: b.data.as_ptr(),
        ldb: b.ld,
        stride_b: b.batch_stride,
        b_transposed: b_transposed as usize,
        c: c.data.as_mut_ptr(),
        ldc: c.ld,
        stride_c: c.batch_stride,
        accumulate: accumulate as usize,
        alpha,
        _pad: 0,
        scratch: scratch.as_mut_ptr(),
        scratch_len: scratch.len(),
    };
    // SAFETY: extents and C disjointness checked above; scratch is a distinct &mut borrow.
    unsafe { gemm_batched_raw(&args, pool, isa) }
}
