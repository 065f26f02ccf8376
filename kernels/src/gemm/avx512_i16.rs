//! The AVX-512BW tile of the i16 GEMM (see `int16`): 12×32 over i16 pairs, the AVX-512 f32
//! tile's shape and store. `Arch::for_isa_i16` hands it out only after runtime detection.

use super::avx512::store_tile;
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
    macro_rules! rows {
        ($($r:literal)*) => {
            match (mr, nr > NR) {
                $(
                    // SAFETY: forwarded; the instance reads rows < mr of A and the panels
                    // that exist.
                    ($r, true) => unsafe { tile::<$r, 2, VNNI>(kc, a, b, b_stride, c, ldc, alpha, beta, mr, nr, pf, post) },
                    // SAFETY: as above.
                    ($r, false) => unsafe { tile::<$r, 1, VNNI>(kc, a, b, b_stride, c, ldc, alpha, beta, mr, nr, pf, post) },
                )*
                _ => {}
            }
        };
    }
    rows!(1 2 3 4 5 6 7 8 9 10 11 12)
}

wide_entry!(wide_plain, "avx512f,avx512bw,avx2,fma", false);
wide_entry!(wide_vnni, "avx512f,avx512bw,avx512vnni,avx2,fma", true);

/// R ≤ 12 rows (rows < 6 from the first strip) × P panels: per k pair P loads of B, R
/// broadcasts of A's slots, R·P multiply-adds of pairs into i32 accumulators; then i32 → f32
/// and the f32 tile's store (`avx512::store_tile`, its erf-GELU instance included).
///
/// # Safety
/// See `wide_plain`; inlined into an entry with the instructions it uses enabled.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const R: usize, const P: usize, const VNNI: bool>(
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
    let a1 = a0.wrapping_add(kc * MR);
    let b0 = b.cast::<i32>();
    let b1 = b0.wrapping_add(b_stride);
    // SAFETY: the entry enabled AVX-512BW; q < kc: MR slots of each strip and NR of each
    // panel are in bounds.
    unsafe {
        let mut acc = [[_mm512_setzero_si512(); P]; R];
        for q in 0..kc {
            let mut bv = [_mm512_setzero_si512(); P];
            bv[0] = _mm512_loadu_si512(b0.add(q * NR).cast());
            if P == 2 {
                bv[P - 1] = _mm512_loadu_si512(b1.add(q * NR).cast());
            }
            if q >= pf.0 && q < pf.1 {
                // Hint only: the same k step of the panels two ahead.
                _mm_prefetch::<_MM_HINT_T0>(b0.wrapping_add(2 * b_stride + q * NR).cast());
                _mm_prefetch::<_MM_HINT_T0>(b1.wrapping_add(2 * b_stride + q * NR).cast());
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let src = if i < MR { a0.add(q * MR + i) } else { a1.add(q * MR + i - MR) };
                let av = _mm512_set1_epi32(*src);
                for v in 0..P {
                    row[v] = if VNNI {
                        _mm512_dpwssd_epi32(row[v], av, bv[v])
                    } else {
                        _mm512_add_epi32(row[v], _mm512_madd_epi16(av, bv[v]))
                    };
                }
            }
        }
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
