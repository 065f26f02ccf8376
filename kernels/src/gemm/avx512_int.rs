//! What the two AVX-512 integer tiles share: the row-count dispatch (as the f32 tile's) and
//! the k loop over i32 slots, generic over the multiply-add that folds a slot into an i32
//! accumulator — i16 pairs (`avx512_i16`: `vpdpwssd`, or `vpmaddwd` + `vpaddd`) or
//! unsigned × signed byte quads (`avx512_u8`: `vpdpbusd`). Each tile keeps only what differs:
//! the multiply-add, and what it does with the sums before the f32 store.

use super::*;
use std::arch::x86_64::*;

/// `acc + Σ` over one slot's lanes of A·B, in i32.
pub(super) trait Madd {
    /// # Safety
    /// The instructions it uses are enabled in the function it is inlined into.
    unsafe fn madd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i;
}

/// i16 pairs with AVX512-VNNI: `vpdpwssd`.
pub(super) struct PairsVnni;
/// i16 pairs without VNNI: `vpmaddwd` + `vpaddd` (the same sums).
pub(super) struct PairsPlain;
/// u8 × s8 quads: `vpdpbusd`.
pub(super) struct Quads;

impl Madd for PairsVnni {
    #[inline(always)]
    unsafe fn madd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: AVX512-VNNI enabled in the caller (contract).
        unsafe { _mm512_dpwssd_epi32(acc, a, b) }
    }
}
impl Madd for PairsPlain {
    #[inline(always)]
    unsafe fn madd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: AVX-512BW enabled in the caller (contract).
        unsafe { _mm512_add_epi32(acc, _mm512_madd_epi16(a, b)) }
    }
}
impl Madd for Quads {
    #[inline(always)]
    unsafe fn madd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: AVX512-VNNI enabled in the caller (contract).
        unsafe { _mm512_dpbusd_epi32(acc, a, b) }
    }
}

/// acc += Σ_q slots of A (strips at `a0`, `a1`: rows < MR from the first) · B's panels (`b0`,
/// `b1`), q < kq: per slot P loads of B, R broadcasts of A, R·P multiply-adds; prefetching k
/// steps `pf.0..pf.1` of the panels two ahead.
///
/// # Safety
/// `M`'s instructions and AVX-512F enabled in the function this is inlined into; q < kq: MR
/// slots of each strip and NR of each panel are in bounds.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn plane<M: Madd, const R: usize, const P: usize>(
    acc: &mut [[__m512i; P]; R],
    kq: usize,
    a0: *const i32,
    a1: *const i32,
    b0: *const i32,
    b1: *const i32,
    b_stride: usize,
    pf: (usize, usize),
) {
    // SAFETY: the contract.
    unsafe {
        // One slot q: P loads of B, R broadcasts of A, R·P multiply-adds (a macro: a closure
        // would not inherit the enabling function's instructions).
        macro_rules! step {
            ($q:expr) => {{
                let q = $q;
                let mut bv = [_mm512_setzero_si512(); P];
                bv[0] = _mm512_loadu_si512(b0.add(q * NR).cast());
                if P == 2 {
                    bv[P - 1] = _mm512_loadu_si512(b1.add(q * NR).cast());
                }
                for (i, row) in acc.iter_mut().enumerate() {
                    let src = if i < MR { a0.add(q * MR + i) } else { a1.add(q * MR + i - MR) };
                    let av = _mm512_set1_epi32(*src);
                    for v in 0..P {
                        row[v] = M::madd(row[v], av, bv[v]);
                    }
                }
            }};
        }
        // Before, inside and after the prefetch slice, as the f32 tiles.
        let (p0, p1) = prefetch_stretch(pf, kq);
        for q in 0..p0 {
            step!(q);
        }
        for q in p0..p1 {
            // Hint only: the same k step of the panels two ahead.
            _mm_prefetch::<_MM_HINT_T0>(b0.wrapping_add(2 * b_stride + q * NR).cast());
            _mm_prefetch::<_MM_HINT_T0>(b1.wrapping_add(2 * b_stride + q * NR).cast());
            step!(q);
        }
        for q in p1..kq {
            step!(q);
        }
    }
}

/// `match (mr, nr > NR)` over the 12 row counts × 1 or 2 panels, `$body` evaluated with the
/// consts `$r` (rows) and `$p` (panels) of the arm: one tile instance per row count, so a
/// partial tile (m not a multiple of 12) does only its valid rows' work. (The f32 tile,
/// `avx512::wide`, and both integer tiles dispatch through it.)
macro_rules! by_rows {
    ($mr:expr, $two:expr, |$r:ident, $p:ident| $body:expr) => {
        by_rows!(@arms $mr, $two, $r, $p, $body; 1 2 3 4 5 6 7 8 9 10 11 12)
    };
    (@arms $mr:expr, $two:expr, $r:ident, $p:ident, $body:expr; $($n:literal)*) => {
        match ($mr, $two) {
            $(
                ($n, true) => {
                    const $r: usize = $n;
                    const $p: usize = 2;
                    $body
                }
                ($n, false) => {
                    const $r: usize = $n;
                    const $p: usize = 1;
                    $body
                }
            )*
            _ => {}
        }
    };
}
pub(super) use by_rows;
