//! AVX-512F tile kernel over the AVX2 packed layouts. `Arch::for_isa` hands it out only after
//! runtime detection of AVX-512F.

use super::avx512_int::by_rows;
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
    // One instance per row count (`by_rows`). The tiles with an epilogue are instances of
    // their own: the others keep the store without it, their accumulators in registers (sharing
    // one instance spilled the tile). Only two-panel tiles prefetch the next pair.
    let (direct, has_post) = (a_ld != PACKED, post.is_some());
    by_rows!(mr, nr > NR, |R, P| {
        // SAFETY: forwarded; the instance reads only rows < mr of A and the panels that exist.
        unsafe {
            match (direct, has_post) {
                (false, false) => tile::<R, P, { P == 2 }, false, false>(kc, a, a_ld, b, b_stride, c, ldc, alpha, beta, mr, nr, pf, post),
                (false, true) => tile::<R, P, { P == 2 }, false, true>(kc, a, a_ld, b, b_stride, c, ldc, alpha, beta, mr, nr, pf, post),
                (true, false) => tile::<R, P, { P == 2 }, true, false>(kc, a, a_ld, b, b_stride, c, ldc, alpha, beta, mr, nr, pf, post),
                (true, true) => tile::<R, P, { P == 2 }, true, true>(kc, a, a_ld, b, b_stride, c, ldc, alpha, beta, mr, nr, pf, post),
            }
        }
    })
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
                let v = post16(_mm512_maskz_loadu_ps(m, cp.add(j)), m, bp, rp, act, e.gated());
                _mm512_mask_storeu_ps(cp.add(j), m, v);
                j += 16;
            }
        }
    }
}

/// One vector of the epilogue: `act(v + bias) + residual`, or `(v + bias) · act(residual)` when
/// `gated` (bias and residual skipped where null, their lanes loaded under `m`); shared by the
/// separate pass and the tile store.
///
/// # Safety
/// AVX-512F present; `bp`/`rp` null or readable in the lanes of `m`.
#[inline(always)]
unsafe fn post16(mut v: __m512, m: __mmask16, bp: *const f32, rp: *const f32, act: Activation, gated: bool) -> __m512 {
    // SAFETY: the caller's contract.
    unsafe {
        if !bp.is_null() {
            v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bp));
        }
        if gated {
            // (The raw entry refuses a gate without a residual.)
            return _mm512_mul_ps(v, crate::math::simd::act(act, _mm512_maskz_loadu_ps(m, rp)));
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
    // One k step p < kc: P loads of B, R broadcasts of A, R·P FMAs.
    let step = |acc: &mut [[__m512; P]; R], p: usize| {
        // SAFETY: k step p < kc: MR floats of each strip and NR of each panel are in bounds.
        unsafe {
            let mut bv = [_mm512_setzero_ps(); P];
            bv[0] = _mm512_loadu_ps(b.add(p * NR));
            if P == 2 {
                bv[P - 1] = _mm512_loadu_ps(b1.add(p * NR));
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
    };
    // Before, inside and after the prefetch slice, as the AVX2 tile (`avx2::kernel_r`): no
    // step tests whether it prefetches.
    let (p0, p1) = if PF { prefetch_stretch(pf, kc) } else { (kc, kc) };
    for p in 0..p0 {
        step(&mut acc, p);
    }
    for p in p0..p1 {
        // The same k step of the panels two ahead (the next tile pair's B, which otherwise
        // comes cold from L3/memory when m is small). A hint: never faults.
        _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(2 * b_stride + p * NR).cast());
        _mm_prefetch::<_MM_HINT_T0>(b1.wrapping_add(2 * b_stride + p * NR).cast());
        step(&mut acc, p);
    }
    for p in p1..kc {
        step(&mut acc, p);
    }
    // SAFETY: forwarded.
    unsafe { store_tile(acc, c, ldc, alpha, beta, mr, nr, if POST { post } else { None }) }
}

/// [`store_rows`] of a finished tile. The erf GELU's tiles get an instance of their own, the
/// activation a constant there: LLVM then keeps the GELU's ten table rows in registers across
/// the tile's rows instead of reloading them per vector (gemm_bench 128×384·384×1536 +
/// bias+GELU, 1 thread, Zen 4: +5.8–5.9% over the plain GEMM with the activation read at run
/// time, +5.1–5.3% with it). The f32 tile and the i16 one store through it.
///
/// # Safety
/// As [`store_rows`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn store_tile<const R: usize, const P: usize>(
    acc: [[__m512; P]; R],
    c: *mut f32,
    ldc: usize,
    alpha: f32,
    beta: bool,
    mr: usize,
    nr: usize,
    post: Option<TilePost>,
) {
    // SAFETY: forwarded.
    unsafe {
        match post {
            Some(t) if t.act == Activation::GeluErf => store_rows::<R, P, true>(acc, c, ldc, alpha, beta, mr, nr, post),
            _ => store_rows::<R, P, false>(acc, c, ldc, alpha, beta, mr, nr, post),
        }
    }
}

/// C = post(alpha·acc (+ C if beta)) for the valid mr × nr part of a tile.
///
/// # Safety
/// AVX-512F present (the callers are its `#[target_feature]` functions); `c` writable for mr
/// rows of nr floats at stride ldc; `post`'s operands cover them.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn store_rows<const R: usize, const P: usize, const GELU: bool>(
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
    // alpha = 1 (every GEMM but attention's scaled products): x·1 = x, one multiply fewer per vector.
    let unit = alpha == 1.0;
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
                } else if unit {
                    x
                } else {
                    _mm512_mul_ps(x, alpha_v)
                };
                if let Some(t) = post {
                    let (bp, rp) = t.operands(i, col);
                    r = post16(r, m, bp, rp, if GELU { Activation::GeluErf } else { t.act }, t.gated());
                }
                _mm512_mask_storeu_ps(cp, m, r);
            }
        }
    }
}
