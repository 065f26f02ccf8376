//! AVX2 pieces of the integer GEMM (see `int16`): the 6×16 tile over i16 pairs and the A packing
//! that converts f32 to them, and the byte-quad tile's store where no VNNI tile runs (`int8`).
//! `Arch::for_isa_i16` and `Arch::for_isa_u8` hand them out only after runtime detection.

use super::avx2::{store_tile, NV};
use super::int16::row_slot;
use super::*;
use std::arch::x86_64::*;

/// The tile kernel: with AVX-VNNI (`vpdpwssd`) where `vnni`, else `vpmaddwd` + `vpaddd` (the
/// same i32 sums).
pub(super) fn kernel_for(vnni: bool) -> arch::KernelFn {
    if vnni {
        kernel_vnni
    } else {
        kernel_plain
    }
}

macro_rules! tile_entry {
    ($name:ident, $feat:literal, $vnni:literal) => {
        /// # Safety
        /// The CPU has the enabled features; `a` holds kc·MR slots (packed), `b` kc·NR slots;
        /// `c` writable for mr ≤ MR rows of nr ≤ NR floats at stride ldc.
        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name(
            kc: usize,
            a: *const f32,
            _a_ld: usize,
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
            // One instance per row count, as the f32 tile (`avx2::kernel`).
            // SAFETY (each arm): forwarded.
            unsafe {
                match mr {
                    1 => tile::<1, $vnni>(kc, a, b, b_next, c, ldc, alpha, beta, mr, nr, pf, post),
                    2 => tile::<2, $vnni>(kc, a, b, b_next, c, ldc, alpha, beta, mr, nr, pf, post),
                    3 => tile::<3, $vnni>(kc, a, b, b_next, c, ldc, alpha, beta, mr, nr, pf, post),
                    4 => tile::<4, $vnni>(kc, a, b, b_next, c, ldc, alpha, beta, mr, nr, pf, post),
                    5 => tile::<5, $vnni>(kc, a, b, b_next, c, ldc, alpha, beta, mr, nr, pf, post),
                    _ => tile::<MR, $vnni>(kc, a, b, b_next, c, ldc, alpha, beta, mr, nr, pf, post),
                }
            }
        }
    };
}
tile_entry!(kernel_plain, "avx2,fma", false);
tile_entry!(kernel_vnni, "avx2,fma,avxvnni", true);

/// R ≤ MR rows × 16 columns: per k pair 2 loads of B, R broadcasts of A's slots, 2·R
/// multiply-adds of pairs into i32 accumulators; then i32 → f32 and the f32 tile's store.
///
/// # Safety
/// See `kernel_plain`; inlined into an entry with the instructions it uses enabled.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const R: usize, const VNNI: bool>(
    kc: usize,
    a: *const f32,
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
    let (a, b) = (a.cast::<i32>(), b.cast::<i32>());
    // SAFETY: AVX2 enabled by the entry; kc steps of MR (A) and NR (B) slots stay inside the
    // packed operands.
    unsafe {
        let mut acc = [[_mm256_setzero_si256(); NV]; R];
        // One k pair q: 2 loads of B, R broadcasts of A, 2·R multiply-adds. (A macro, not a
        // closure: this function is inlined into the entry that enables the instructions, and
        // a closure would not inherit them.)
        macro_rules! step {
            ($q:expr) => {{
                let q = $q;
                let bp = b.add(q * NR);
                let mut bv = [_mm256_setzero_si256(); NV];
                for (v, x) in bv.iter_mut().enumerate() {
                    *x = _mm256_loadu_si256(bp.add(v * 8).cast());
                }
                for (i, row) in acc.iter_mut().enumerate() {
                    let av = _mm256_set1_epi32(*a.add(q * MR + i));
                    for v in 0..NV {
                        row[v] = if VNNI {
                            _mm256_dpwssd_avx_epi32(row[v], av, bv[v])
                        } else {
                            _mm256_add_epi32(row[v], _mm256_madd_epi16(av, bv[v]))
                        };
                    }
                }
            }};
        }
        // Before, inside and after the prefetch slice, as the f32 tile (`avx2::kernel_r`).
        let (p0, p1) = prefetch_stretch(pf, kc);
        for q in 0..p0 {
            step!(q);
        }
        for q in p0..p1 {
            // Hint only: the next panel's same k step.
            _mm_prefetch::<_MM_HINT_T0>(b_next.wrapping_add(q * NR).cast());
            step!(q);
        }
        for q in p1..kc {
            step!(q);
        }
        // Loops, not `array::map`: a closure does not inherit the target features.
        let mut accf = [[_mm256_setzero_ps(); NV]; R];
        for (f, row) in accf.iter_mut().zip(&acc) {
            for (x, &v) in f.iter_mut().zip(row) {
                *x = _mm256_cvtepi32_ps(v);
            }
        }
        store_tile::<R, true>(&accf, c, ldc, alpha, beta, mr, nr, post)
    }
}

/// Packs mc rows × `cols` columns of f32 A into MR-row strips of kc slots, as
/// `int16::pack_a` (the same values: `cvtps2dq` rounds to nearest even and gives i32::MIN for
/// NaN and out-of-range values, `packssdw` saturates). A full strip goes 16 columns (8 slots)
/// of its 6 rows at a time: converted, packed to pairs, and stored as the f32 `avx2::pack_a`
/// stores its columns (`avx2::store_strip_columns`), the 6 slots of each pair index together.
///
/// # Safety
/// AVX2 present; as `int16::pack_a`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn pack_a(a: *const f32, lda: usize, mc: usize, kc: usize, cols: usize, dst: *mut f32) {
    let d = dst.cast::<i32>();
    for (si, s) in (0..mc).step_by(MR).enumerate() {
        let mr = MR.min(mc - s);
        // SAFETY: strip si's kc·MR slots are inside dst.
        let sd = unsafe { d.add(si * MR * kc) };
        let mut q = 0;
        if mr == MR {
            while 2 * q + 16 <= cols {
                // SAFETY: rows s..s+6 < mc, columns 2q..2q+16 <= cols; slots q..q+8 < kc of
                // the strip (48 written, the last group's two extra lanes kept inside below).
                unsafe {
                    let pairs = |i: usize| sixteen_to_pairs(a.add((s + i) * lda + 2 * q));
                    let rows = [pairs(0), pairs(1), pairs(2), pairs(3), pairs(4), pairs(5)];
                    super::avx2::store_strip_columns(rows, sd.add(q * MR).cast::<f32>());
                }
                q += 8;
            }
        }
        while q < kc {
            for i in 0..MR {
                let row = (i < mr).then(|| a.wrapping_add((s + i) * lda));
                // SAFETY: row s + i < mc holds `cols` floats; slot q < kc of row i.
                unsafe { *sd.add(q * MR + i) = row_slot(row, cols, q) };
            }
            q += 1;
        }
    }
}

/// 16 floats at `p` as 8 slots (i16 pairs, in order), in a ymm register's bits.
///
/// # Safety
/// AVX2 present (inlined into the AVX2 caller: not a closure, which would not inherit the
/// target features); `p` readable for 16 floats.
#[inline(always)]
unsafe fn sixteen_to_pairs(p: *const f32) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe {
        let lo = _mm256_cvtps_epi32(_mm256_loadu_ps(p));
        let hi = _mm256_cvtps_epi32(_mm256_loadu_ps(p.add(8)));
        // packs works per 128-bit lane: (lo 0-3, hi 0-3 | lo 4-7, hi 4-7) → 64-bit chunks 0, 2, 1, 3.
        _mm256_castsi256_ps(_mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(lo, hi)))
    }
}

/// The byte-quad tile where the table runs without the AVX512-VNNI one: `int8::sums`, stored by
/// the AVX2 f32 tile's store (so the bits are the AVX2 and AVX-512 paths').
///
/// # Safety
/// AVX2 and FMA present; as `int8::sums`; `c` writable for mr ≤ MR rows of nr ≤ NR floats at
/// stride ldc.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn kernel_u8(
    kc: usize,
    a: *const f32,
    _a_ld: usize,
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
    // SAFETY: forwarded; each row's NR sums are read as NV vectors of 8.
    unsafe {
        let acc = super::int8::sums(kc, a, b);
        let mut accf = [[_mm256_setzero_ps(); NV]; MR];
        for (f, row) in accf.iter_mut().zip(&acc) {
            for (v, x) in f.iter_mut().enumerate() {
                *x = _mm256_cvtepi32_ps(_mm256_loadu_si256(row[v * 8..].as_ptr().cast()));
            }
        }
        store_tile::<MR, true>(&accf, c, ldc, alpha, beta, mr, nr, post)
    }
}
