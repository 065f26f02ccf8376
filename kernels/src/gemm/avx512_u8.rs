//! The AVX512-VNNI pieces of the byte-quad integer GEMM (see `int8`): the 12×32 tile over
//! `vpdpbusd` and the A packing that converts f32 rows to offset bytes. `Arch::for_isa_u8`
//! hands them out only after runtime detection.

use super::avx512::store_tile;
use super::avx512_int::{by_rows, plane, Quads};
use super::*;
use std::arch::x86_64::*;

/// f32 → the integer `int16::to_i16` gives (nearest, ties to even; saturated; NaN and
/// |x| ≥ 2^31, which `cvtps2dq` makes i32::MIN, to -32768), as i32 lanes.
///
/// # Safety
/// AVX-512F present; inlined into a function that enables it.
#[inline(always)]
pub(super) unsafe fn to_i16_lanes(x: __m512) -> __m512i {
    // SAFETY: AVX-512F (contract).
    unsafe { _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(x), _mm512_set1_epi32(-32768)), _mm512_set1_epi32(32767)) }
}

/// The offset o = -min of a row's integers (`to_i16_lanes` of its `cols` floats), or None when
/// the row spans more than 255 (its w = v + o would not fit a byte).
///
/// # Safety
/// AVX-512F/BW present (inlined into a function that enables them); `row` readable for
/// `cols` floats.
#[inline(always)]
pub(super) unsafe fn row_offset(row: *const f32, cols: usize) -> Option<i32> {
    let tail = cols % 16;
    let tail_mask: __mmask16 = ((1u32 << tail) - 1) as u16;
    // SAFETY: every load is inside the row's `cols` floats (the tail masked).
    unsafe {
        let (mut lo, mut hi) = (_mm512_set1_epi32(i32::MAX), _mm512_set1_epi32(i32::MIN));
        let mut p = 0;
        while p + 16 <= cols {
            let v = to_i16_lanes(_mm512_loadu_ps(row.add(p)));
            lo = _mm512_min_epi32(lo, v);
            hi = _mm512_max_epi32(hi, v);
            p += 16;
        }
        if tail > 0 {
            let v = to_i16_lanes(_mm512_maskz_loadu_ps(tail_mask, row.add(p)));
            lo = _mm512_mask_min_epi32(lo, tail_mask, lo, v);
            hi = _mm512_mask_max_epi32(hi, tail_mask, hi, v);
        }
        let (lo, hi) = (_mm512_reduce_min_epi32(lo), _mm512_reduce_max_epi32(hi));
        (hi - lo <= 255).then_some(-lo)
    }
}

/// `int8::pack_a`, vectorized: each row's range from its converted values, then the low bytes
/// of w = v + o written as the strips' slots. A block with a row spanning more than 255 (no
/// quantized activation does) is packed by the portable code, high plane included.
///
/// # Safety
/// As `int8::pack_a`.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
pub(super) unsafe fn pack_a(a: *const f32, lda: usize, mc: usize, kc: usize, cols: usize, dst: *mut f32) {
    let kq = kc - 2;
    let tail = cols % 16;
    let tail_mask: __mmask16 = ((1u32 << tail) - 1) as u16;
    let mut offs = [0i32; MC];
    for (r, o) in offs.iter_mut().enumerate().take(mc) {
        // SAFETY: row r < mc has `cols` floats (contract).
        match unsafe { row_offset(a.add(r * lda), cols) } {
            Some(v) => *o = v,
            // SAFETY: the same contract.
            None => return unsafe { int8::pack_a(a, lda, mc, kc, cols, dst) },
        }
    }
    let d = dst.cast::<i32>();
    let strips = mc.div_ceil(MR);
    for si in 0..strips {
        let s = si * MR * kc;
        for i in 0..MR {
            let r = si * MR + i;
            // SAFETY: row r < mc's floats as above; slots q < kq of row i in strip si and its
            // two trailer slots lie in `dst` (contract).
            unsafe {
                if r < mc {
                    let row = a.add(r * lda);
                    let o = _mm512_set1_epi32(offs[r]);
                    let mut p = 0;
                    while p < cols {
                        let x = if p + 16 <= cols { _mm512_loadu_ps(row.add(p)) } else { _mm512_maskz_loadu_ps(tail_mask, row.add(p)) };
                        // Truncation to bytes: w & 255, w itself (0 ≤ w ≤ 255).
                        let bytes = _mm512_cvtepi32_epi8(_mm512_add_epi32(to_i16_lanes(x), o));
                        let q0 = p / 4;
                        let at = d.add(s + q0 * MR + i);
                        if q0 + 4 <= kq {
                            *at = _mm_cvtsi128_si32(bytes);
                            *at.add(MR) = _mm_extract_epi32::<1>(bytes);
                            *at.add(2 * MR) = _mm_extract_epi32::<2>(bytes);
                            *at.add(3 * MR) = _mm_extract_epi32::<3>(bytes);
                        } else {
                            let slots: [i32; 4] = std::mem::transmute(bytes);
                            for (t, &v) in slots.iter().enumerate().take(kq - q0) {
                                *at.add(t * MR) = v;
                            }
                        }
                        p += 16;
                    }
                } else {
                    for q in 0..kq {
                        *d.add(s + q * MR + i) = 0;
                    }
                }
                *d.add(s + kq * MR + i) = if r < mc { offs[r] } else { 0 };
                *d.add(s + (kq + 1) * MR + i) = 0;
            }
        }
    }
}

/// The 12×32 tile (`arch::WideFn`): one instance per row count and panel count, as the f32
/// tile (`avx512::wide`).
///
/// # Safety
/// AVX512F/BW/VNNI present; `a` holds ceil(mr/MR) consecutive packed strips of kc slots (and
/// the high planes they link), `b` (and `b + b_stride` when nr > NR) kc - 1 slots; `c` writable
/// for mr ≤ 2·MR rows of nr ≤ 2·NR floats at stride ldc.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn wide(
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
    by_rows!(mr, nr > NR, |R, P| {
        // SAFETY: forwarded; the instance reads rows < mr of A and the panels that exist.
        unsafe { tile::<R, P>(kc, a, b, b_stride, c, ldc, alpha, beta, mr, nr, pf, post) }
    })
}

/// R ≤ 12 rows (rows < 6 from the first strip) × P panels: the high plane where linked, shifted
/// by 8, the low plane, the offsets' correction; then i32 → f32 and the f32 tile's store
/// (`avx512::store_tile`, its erf-GELU instance included).
///
/// # Safety
/// See [`wide`]; inlined into it.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const R: usize, const P: usize>(
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
    let kq = kc - 2;
    let a0 = a.cast::<i32>();
    let a1 = a0.wrapping_add(kc * MR);
    let b0 = b.cast::<i32>();
    let b1 = b0.wrapping_add(b_stride);
    // SAFETY: the entry enabled AVX-512 with VNNI; the trailers are inside each strip and panel.
    unsafe {
        let mut acc = [[_mm512_setzero_si512(); P]; R];
        // Every strip of a block links a high plane or none does (`int8::write_strips`).
        let link = *a0.add((kq + 1) * MR) as usize;
        if link != 0 {
            let link1 = if R > MR { *a1.add((kq + 1) * MR) as usize } else { 0 };
            plane::<Quads, R, P>(&mut acc, kq, a0.add(link), a1.wrapping_add(link1), b0, b1, b_stride, (0, 0));
            for row in acc.iter_mut() {
                for v in row.iter_mut() {
                    *v = _mm512_slli_epi32::<8>(*v);
                }
            }
        }
        plane::<Quads, R, P>(&mut acc, kq, a0, a1, b0, b1, b_stride, pf);
        let mut sums = [_mm512_setzero_si512(); P];
        sums[0] = _mm512_loadu_si512(b0.add(kq * NR).cast());
        if P == 2 {
            sums[P - 1] = _mm512_loadu_si512(b1.add(kq * NR).cast());
        }
        let mut accf = [[_mm512_setzero_ps(); P]; R];
        for (i, (f, row)) in accf.iter_mut().zip(&acc).enumerate() {
            let o = _mm512_set1_epi32(if i < MR { *a0.add(kq * MR + i) } else { *a1.add(kq * MR + i - MR) });
            for v in 0..P {
                f[v] = _mm512_cvtepi32_ps(_mm512_sub_epi32(row[v], _mm512_mullo_epi32(o, sums[v])));
            }
        }
        store_tile(accf, c, ldc, alpha, beta, mr, nr, post)
    }
}
