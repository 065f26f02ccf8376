//! The integer GEMM: `C[m×n] = epilogue(scale·A·B (+ C))` where A and B hold integers in
//! [-32768, 32767] (a quantized model's `(a - a_zero)·(b - b_zero)`), summed exactly in i32 and
//! converted to f32 once, before the same store and epilogue as the f32 GEMM.
//!
//! - **Why i16 pairs**: `vpmaddwd` (AVX2, AVX-512BW) multiplies 16-bit pairs and adds each pair
//!   into an i32 lane, two multiply-adds per lane per instruction, twice the f32 FMA's; with
//!   VNNI (`vpdpwssd`, AVX512-VNNI or AVX-VNNI) the add into the accumulator is the same
//!   instruction. A dynamically quantized activation minus its zero point lies in [-255, 255],
//!   and asymmetric (uint8) weights minus theirs too: the pairs hold them as they are. Where
//!   the machine has AVX512-VNNI and B fits a signed byte, the runtime packs B as byte quads
//!   instead (`int8`: four products per lane, A offset per row and corrected by column sums);
//!   the packed B's header says which (`int_b`).
//! - **Exact**: every product and partial sum is an exact i32 (the caller keeps
//!   k·max|a|·max|b| < 2^31), so the result is the same on every ISA, every tile and every
//!   split across threads, and it is the exact integer rounded once to f32 — where the f32 GEMM
//!   of the same integers rounds each partial sum past 2^24.
//! - **Layouts**: the f32 GEMM's, with a 4-byte slot holding two i16 (k steps 2q and 2q+1, the
//!   lower one in the low half) in place of one f32, so the blocking, threading and epilogue
//!   code are the f32 GEMM's own (`block`, `split`; `Arch::slot_cols` = 2). Packed B (after the
//!   header): panels of
//!   [`NR`] columns, `ceil(k/2)` slots per column, k-pair-major; packed A: [`MR`]-row strips of
//!   slots, converted from f32 as they are packed (round to nearest, NaN to -32768, as
//!   `cvtps2dq` + `packssdw` do). k runs in one block (`Arch::whole_k`): C is written once,
//!   from the exact sum.

use super::*;

/// Floats of A-packing scratch one thread of the integer GEMM needs for an m×k A (one k
/// block): the larger of the two layouts' — i16 pairs, ceil(k/2) slots a row, or byte quads,
/// kq = ceil(k/4) slots of low bytes, two trailer slots, kq more of high bytes (`int8`).
pub(crate) fn apack_len_i16(m: usize, k: usize) -> usize {
    if k == 0 || m == 0 {
        return 0;
    }
    let slots = k.div_ceil(2).max(2 * k.div_ceil(4) + 2);
    m.min(MC).div_ceil(MR) * MR * slots + ALIGN_SLACK
}

/// Scratch floats [`gemm_i16`] needs on `threads` threads (with less it runs on as many as fit).
pub fn gemm_i16_scratch_len(m: usize, k: usize, threads: usize) -> usize {
    threads.max(1) * apack_len_i16(m, k)
}

/// An integer in [-32768, 32767] held in f32, or `None`.
#[inline]
pub fn as_i16(x: f32) -> Option<i16> {
    (x == x.trunc() && (-32768.0..=32767.0).contains(&x)).then_some(x as i16)
}

/// The i16-pair panels (after the header, see `int_b`): panels of [`NR`] columns,
/// `ceil(k/2)` slots per column, k-pair-major, B(p, j) = `at(p, j)` (zero past k and n).
pub(super) fn pack_b_panels(k: usize, n: usize, at: impl Fn(usize, usize) -> i16, dst: &mut [u8]) {
    let pairs = k.div_ceil(2);
    for pan in 0..n.div_ceil(NR) {
        for p in 0..pairs * 2 {
            for jj in 0..NR {
                let o = ((pan * pairs + p / 2) * NR + jj) * 4 + (p % 2) * 2;
                dst[o..o + 2].copy_from_slice(&at(p, pan * NR + jj).to_le_bytes());
            }
        }
    }
}

/// `x` as the packed A holds it: nearest integer (ties to even), saturated to i16, NaN and
/// |x| ≥ 2^31 to -32768 (what `cvtps2dq` then `packssdw` give, so every path packs the same).
#[inline]
pub(super) fn to_i16(x: f32) -> i16 {
    if x.is_nan() || x.abs() >= 2147483648.0 {
        return i16::MIN;
    }
    x.round_ties_even().clamp(-32768.0, 32767.0) as i16
}

/// One slot: the i16 pair (lo, hi) as one 32-bit lane.
#[inline]
fn slot(lo: i16, hi: i16) -> i32 {
    (lo as u16 as u32 | ((hi as u16 as u32) << 16)) as i32
}

/// Slot q of a row of A (`row`: its first float, `None` for a padding row): columns 2q and
/// 2q + 1 by [`to_i16`], zero at and past `cols`.
///
/// # Safety
/// `row` readable for `cols` floats.
#[inline]
pub(super) unsafe fn row_slot(row: Option<*const f32>, cols: usize, q: usize) -> i32 {
    // SAFETY: read only below `cols`.
    let at = |p: usize| row.filter(|_| p < cols).map_or(0, |r| to_i16(unsafe { *r.add(p) }));
    slot(at(2 * q), at(2 * q + 1))
}

/// Packs mc rows × `cols` columns of f32 A into MR-row strips of kc slots (kc ≥ cols/2),
/// converted by [`to_i16`], zero-padded rows and columns.
///
/// # Safety
/// `a` readable for mc rows of `cols` floats at stride lda; `dst` writable for
/// ceil(mc/MR)·MR·kc slots.
pub(super) unsafe fn pack_a(a: *const f32, lda: usize, mc: usize, kc: usize, cols: usize, dst: *mut f32) {
    let d = dst.cast::<i32>();
    for (si, s) in (0..mc).step_by(MR).enumerate() {
        let mr = MR.min(mc - s);
        for q in 0..kc {
            for i in 0..MR {
                let row = (i < mr).then(|| a.wrapping_add((s + i) * lda));
                // SAFETY: row s + i < mc holds `cols` floats; the slot lies in strip si.
                unsafe { *d.add(si * MR * kc + q * MR + i) = row_slot(row, cols, q) };
            }
        }
    }
}

/// The portable i16 tile (`arch::KernelFn`, A packed): exact i32 sums, then the f32 tile's store.
///
/// # Safety
/// `a` holds kc·MR slots, `b` kc·NR slots; `c` writable for mr rows of nr floats at stride ldc.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn kernel(
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
    let (a, b) = (a.cast::<i32>(), b.cast::<i32>());
    let mut acc = [[0i32; NR]; MR];
    let pair = |s: i32| (s as i16 as i32, (s >> 16) as i16 as i32);
    for q in 0..kc {
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: q < kc: inside the packed strip and panel.
            let (a0, a1) = pair(unsafe { *a.add(q * MR + i) });
            for (j, r) in row.iter_mut().enumerate() {
                // SAFETY: as above.
                let (b0, b1) = pair(unsafe { *b.add(q * NR + j) });
                // The vector paths' vpmaddwd: the pair's products added, then accumulated
                // (wrapping as they do; the caller's bound keeps every sum exact).
                *r = r.wrapping_add((a0 * b0).wrapping_add(a1 * b1));
            }
        }
    }
    let accf = acc.map(|row| row.map(|v| v as f32));
    // SAFETY: forwarded.
    unsafe { scalar::store(&accf, c, ldc, alpha, beta, mr, nr, post) }
}

impl Arch {
    /// The i16 GEMM's kernels for `isa`: the f32 arch of that ISA (its epilogue, for k = 0)
    /// with the i16 tiles and A packing — AVX-512BW's 12×32 tile (with VNNI where present and
    /// `vnni`), the AVX2 6×16 tile (with AVX-VNNI where present and `vnni`), or the portable one.
    pub(crate) fn for_isa_i16(isa: Isa, vnni: bool) -> Arch {
        let portable = Arch { kernel, pack_a, wide: None, slot_cols: 2, whole_k: true, name: "portable integer code", ..Arch::for_isa(isa) };
        #[cfg(target_arch = "x86_64")]
        {
            // Probed here, not in `kiln_format::features`: only this dispatch uses them (the
            // generated code never does), and std caches the answers.
            macro_rules! has {
                ($f:tt) => {
                    vnni && std::arch::is_x86_feature_detected!($f)
                };
            }
            let isa = effective_isa(isa);
            if isa.has_avx2() {
                let wide = (isa == Isa::Avx512 && std::arch::is_x86_feature_detected!("avx512bw")).then(|| has!("avx512vnni"));
                let name = match (wide, has!("avxvnni")) {
                    (Some(true), _) => "AVX512-VNNI i16 pairs",
                    (Some(false), _) => "AVX-512BW i16 pairs",
                    (None, true) => "AVX-VNNI i16 pairs",
                    (None, false) => "vpmaddwd i16 pairs",
                };
                let wide = wide.map(avx512_i16::wide_for);
                return Arch { kernel: avx2_i16::kernel_for(has!("avxvnni")), pack_a: avx2_i16::pack_a, wide, name, ..portable };
            }
        }
        let _ = vnni;
        portable
    }

    /// The integer GEMM's kernels for a B packed in `layout`.
    pub(crate) fn for_int(layout: IntLayout, isa: Isa, tiles: IntTiles) -> Arch {
        match layout {
            IntLayout::I16Pairs => Arch::for_isa_i16(isa, tiles != IntTiles::NoVnni),
            IntLayout::S8Quads => Arch::for_isa_u8(isa, tiles),
        }
    }
}

/// `C[m×n] = epilogue(scale·A·B (+ C))` over integers: `a` m rows of k f32 integers at stride
/// `lda`, `b_packed` from [`pack_b_int_into`] in either layout (its header says which);
/// `scratch` at least [`gemm_i16_scratch_len`]`(m, k, 1)` floats. The caller keeps
/// k·max|a|·max|b| < 2^31 (the sums exact) and every A value an integer in [-32768, 32767];
/// others are converted as the module docs say.
#[allow(clippy::too_many_arguments)]
pub fn gemm_i16(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    lda: usize,
    b_packed: &[u8],
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    epi: &EpilogueRef<'_>,
    scratch: &mut [f32],
    pool: Option<&ThreadPool>,
    isa: Isa,
) -> Result<(), KernelError> {
    gemm_i16_variant(m, k, n, a, lda, b_packed, c, ldc, accumulate, epi, scratch, pool, isa, IntTiles::Best)
}

/// Which integer tiles a GEMM may use (tests and benchmarks of each tile on a machine that has
/// a faster one; they all give the same bits).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntTiles {
    /// The fastest this machine has.
    Best,
    /// No AMX (the AVX512-VNNI byte-quad tile instead).
    NoAmx,
    /// No VNNI instructions and no AMX (byte quads then run the portable tile).
    NoVnni,
}

/// [`gemm_i16`] with only the tiles `tiles` allows.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn gemm_i16_variant(
    m: usize,
    k: usize,
    n: usize,
    a: &[f32],
    lda: usize,
    b_packed: &[u8],
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    epi: &EpilogueRef<'_>,
    scratch: &mut [f32],
    pool: Option<&ThreadPool>,
    isa: Isa,
    tiles: IntTiles,
) -> Result<(), KernelError> {
    check_len("packed b", b_packed.len(), INT_B_HEADER)?;
    // SAFETY: the header's bytes are in the slice.
    let layout = unsafe { read_header(b_packed.as_ptr(), k, n)? };
    let d = desc(m, k, n, a, lda, b_packed, packed_b_int_bytes(k, n, layout), c, ldc, accumulate, epi)?;
    // SAFETY: every operand extent checked above; scratch is a distinct &mut borrow.
    unsafe { gemm_i16_raw(&d, scratch.as_mut_ptr(), scratch.len(), pool, isa, tiles) }
}

/// Raw integer GEMM (`d.b` packed by [`pack_b_int_into`], header first; `d.k` A's columns);
/// the tiles `tiles` allows.
///
/// # Safety
/// As [`gemm_raw`], with `d.b` (when k > 0) a packed integer B of the size its header's layout
/// gives for k×n.
pub(crate) unsafe fn gemm_i16_raw(
    d: &GemmDesc,
    scratch: *mut f32,
    scratch_len: usize,
    pool: Option<&ThreadPool>,
    isa: Isa,
    tiles: IntTiles,
) -> Result<(), KernelError> {
    let mut d = *d;
    let arch = if d.k == 0 {
        // Nothing of B is read.
        Arch::for_int(IntLayout::I16Pairs, isa, tiles)
    } else {
        // SAFETY: caller contract: the header precedes the panels.
        let layout = unsafe { read_header(d.b.cast(), d.k, d.n)? };
        d.b = d.b.cast::<u8>().wrapping_add(INT_B_HEADER).cast();
        Arch::for_int(layout, isa, tiles)
    };
    // SAFETY: forwarded.
    unsafe { gemm_raw_with(&d, &arch, apack_len_i16(d.m, d.k), scratch, scratch_len, pool, Split::Auto) }
}
