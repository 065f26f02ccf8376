//! The AVX-512BW tile of the i16 GEMM (see `int16`): 12×32 over i16 pairs, the AVX-512 f32
//! tile's shape and store. `Arch::for_isa_i16` hands it out only after runtime detection.

use super::avx512::store_tile;
use super::avx512_int::{by_rows, plane, Madd, PairsPlain, PairsVnni};
use super::*;
use std::arch::x86_64::*;

/// The wide tile: with AVX512-VNNI (`vpdpwssd`) where `vnni`, else `vpmaddwd` + `vpaddd` (the
/// same i32 sums).
pub(super) fn wide_for(vnni: bool) -> arch::WideFn {
    if vnni {
        wide_vnni
    } else {
        wide_plain
    }
}

macro_rules! wide_entry {
    ($name:ident, $feat:literal, $vnni:literal) => {
        /// # Safety
        /// The CPU has the enabled features; `a` holds ceil(mr/MR) consecutive packed strips of
        /// kc·MR slots, `b` (and `b + b_stride` when nr > NR) kc·NR slots; `c` writable for
        /// mr ≤ 2·MR rows of nr ≤ 2·NR floats at stride ldc.
        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name(
            kc: usize,
            a: *const f32,
            _a_ld: usize,
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
            // SAFETY: forwarded.
            unsafe { dispatch::<$vnni>(kc, a, b, b_stride, c, ldc, alpha, beta, mr, nr, pf, post) }
        }
    };
}
/// One tile instance per row count (1..12) and panel count, as the f32 tile (`avx512::wide`).
///
/// # Safety
/// See `wide_plain`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn dispatch<const VNNI: bool>(
    kc: usize,
    a: *const f32,
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
    by_rows!(mr, nr > NR, |R, P| {
        // SAFETY: forwarded; the instance reads rows < mr of A and the panels that exist.
        unsafe {
            if VNNI {
                tile::<PairsVnni, R, P>(kc, a, b, b_stride, c, ldc, alpha, beta, mr, nr, pf, post)
            } else {
                tile::<PairsPlain, R, P>(kc, a, b, b_stride, c, ldc, alpha, beta, mr, nr, pf, post)
            }
        }
    })
}

wide_entry!(wide_plain, "avx512f,avx512bw,avx2,fma", false);
wide_entry!(wide_vnni, "avx512f,avx512bw,avx512vnni,avx2,fma", true);

/// R ≤ 12 rows (rows < 6 from the first strip) × P panels: the pairs' sums (`avx512_int::plane`
/// with `M`'s multiply-add) into i32 accumulators, then i32 → f32 and the f32 tile's store
/// (`avx512::store_tile`, its erf-GELU instance included).
///
/// # Safety
/// See `wide_plain`; inlined into an entry with the instructions it uses enabled.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<M: Madd, const R: usize, const P: usize>(
    kc: usize,
    a: *const f32,
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
    let a0 = a.cast::<i32>();
    let b0 = b.cast::<i32>();
    // SAFETY: the entry enabled AVX-512BW (and VNNI for `PairsVnni`); q < kc: MR slots of each
    // strip and NR of each panel are in bounds.
    unsafe {
        let mut acc = [[_mm512_setzero_si512(); P]; R];
        plane::<M, R, P>(&mut acc, kc, a0, a0.wrapping_add(kc * MR), b0, b0.wrapping_add(b_stride), b_stride, pf);
        // Loops, not `array::map`: a closure does not inherit the target features, and its
        // conversions were calls (28% of the tile's time in perf).
        let mut accf = [[_mm512_setzero_ps(); P]; R];
        for (f, row) in accf.iter_mut().zip(&acc) {
            for (x, &v) in f.iter_mut().zip(row) {
                *x = _mm512_cvtepi32_ps(v);
            }
        }
        store_tile(accf, c, ldc, alpha, beta, mr, nr, post)
    }
}
