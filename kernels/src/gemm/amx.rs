//! Intel AMX (AMX-INT8) for the byte-quad integer GEMM (see `int8`): where the CPU has the
//! tiles and Linux grants them, a thread's share of the GEMM runs as 32×32 blocks of `tdpbusd`
//! (16×16 i32 sums of 64 u8 × s8 products per instruction, eight times AVX512-VNNI's work per
//! cycle) instead of the 12×32 `vpdpbusd` tile.
//!
//! - **B**: the byte-quad panels as `int_b` packs them, unchanged: slot q of a panel is 16
//!   columns × 4 bytes = 64 bytes, so 16 consecutive slots are one AMX B tile (16 rows of 64
//!   bytes at stride 64), and the column sums after them are read as the VNNI tile reads them.
//!   A plan does not know which tile runs it.
//! - **A** (packed per call): rows of kq + 16 slots — kq slots of the four bytes w = v + o (each
//!   row's offset o as `int8` defines it), the row's o, padding to a cache line — row-major, so
//!   16 rows × 64 bytes at the row pitch are an A tile; rows padded with zeros to a multiple of 32.
//! - **Sums**: 2×2 C tiles per 32×32 block, stored to the stack, then acc - o·colsum, i32 →
//!   f32 and the AVX-512 tile's store (`avx512::store_tile`, 12 rows at a time): the same
//!   integers and the same store as the VNNI tile, so the same bits.
//!
//! It runs when kq is a multiple of 16 (k of MiniLM's and most models' GEMMs: 384, 1536) and
//! the A scratch a plan reserves for the VNNI tile (`apack_len_i16`) holds 32 padded rows (from
//! m = 19 at k = 384, m = 13 at k = 1536); anything else — or an m block with a row spanning
//! more than 255, the VNNI tile's high plane — runs the VNNI tile, through `gemm_block`. `KILN_NO_AMX=1`
//! (or `KILN_NO_AVX512=1`) turns it off. (Tile registers are written by inline assembly: the
//! AMX intrinsics are not stable Rust.)

use super::avx512::store_tile;
use super::avx512_int::by_rows;
use super::avx512_u8::{row_offset, to_i16_lanes};
use super::*;
use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Rows per m block: one 32-row tile row, whose packed A (32 rows × (kq + 16) slots, 14 KiB at
/// k = 384) stays in L1 while every B panel pair streams past it from L2. With only eight tile
/// registers a 32×32 block loads 4 KiB per four `tdpbusd`, and where both operands came from L2
/// the loads, not the multiplies, set the pace: 1024×384·384×1536 on 1 thread, 128-row blocks
/// (A from L2) 1.27–1.44 ms, 64 rows 0.90–0.98 (same minutes); in slower minutes 64 rows
/// 2.23–2.38, 32 rows 1.83–1.89 (the VNNI tile 3.44–3.46).
const MB: usize = 32;

/// 32-row blocks run on the tiles so far in this process: tests check that AMX really runs
/// where the machine has it (a fallback gives the same bits, so only this can tell).
static BLOCKS_RUN: AtomicUsize = AtomicUsize::new(0);

/// See [`BLOCKS_RUN`].
pub(super) fn blocks_run() -> usize {
    BLOCKS_RUN.load(Ordering::Relaxed)
}

/// `ldtilecfg`'s operand: palette 1, all eight tiles 16 rows × 64 bytes (tmm0–3 the 2×2 C
/// tiles, tmm4–5 the two 16-row halves of A, tmm6–7 the two B panels).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const CONFIG: TileConfig = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = 16;
        t += 1;
    }
    TileConfig(c)
};

/// Whether AMX-INT8 runs in this process: CPUID reports AMX-TILE and AMX-INT8, AVX-512 is in
/// use (the store is the AVX-512 tile's), `KILN_NO_AMX` is unset, and Linux granted the tile
/// data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, process-wide). Asked once.
pub(super) fn available() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let off = std::env::var_os("KILN_NO_AMX").is_some_and(|v| !v.is_empty() && v != "0");
        let (max, l7) = (__cpuid(0).eax, __cpuid_count(7, 0));
        let cpu = max >= 7 && l7.edx & (1 << 24) != 0 && l7.edx & (1 << 25) != 0;
        !off && cpu && Arch::u8_tile_available(Isa::Avx512) && request_tile_data()
    })
}

#[cfg(target_os = "linux")]
fn request_tile_data() -> bool {
    // The libc std links; declared here rather than adding the libc crate for one call.
    extern "C" {
        fn syscall(num: i64, ...) -> i64;
    }
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    // SAFETY: arch_prctl with these arguments only changes the process's permitted xsave
    // features (or fails with an error code).
    unsafe { syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn request_tile_data() -> bool {
    false
}

/// Slots from one packed A row to the next: kq, the offset, padding to a whole cache line, so
/// that every 64-byte row of an A tile is one line (at kq + 1 a tile load touched two lines
/// per row: gemm 1024×384·384×1536, 1 thread, 3.2–3.8 → 2.5–2.6 ms).
fn pitch(kq: usize) -> usize {
    kq + 16
}

/// Rows (a multiple of 32) an m block may have with `slots` i32 slots of scratch for A.
fn block_rows(slots: usize, kq: usize) -> usize {
    (slots / pitch(kq) / 32 * 32).min(MB)
}

/// `gemm_block` with AMX (an `arch::BlockFn`): rows `r0..r1` × panels `p0..p1` of `d`, B in
/// byte quads, k in one block; `arch` the VNNI byte-quad arch, which runs what AMX does not.
///
/// # Safety
/// As `gemm_block`, with [`available`] true, `d.b` byte-quad panels (header skipped) and
/// `apack` holding `apack_len_i16(d.m, d.k)` floats less the alignment slack.
pub(super) unsafe fn block(d: &GemmDesc, r0: usize, r1: usize, p0: usize, p1: usize, apack: *mut f32, arch: &Arch) {
    let vnni = Arch { block: None, ..*arch };
    let kq = d.k.div_ceil(4);
    let rows = block_rows(int16::apack_len_i16(d.m, d.k).saturating_sub(ALIGN_SLACK), kq);
    if d.k == 0 || !kq.is_multiple_of(16) || rows == 0 {
        // SAFETY: forwarded.
        return unsafe { gemm_block(d, r0, r1, p0, p1, apack, &vnni) };
    }
    let mut m0 = r0;
    while m0 < r1 {
        let mb = rows.min(r1 - m0);
        // SAFETY: forwarded; `rows` rows of A fit `apack` (block_rows), and mb ≤ rows.
        unsafe {
            if !m_block(d, m0, mb, p0, p1, apack.cast(), kq) {
                gemm_block(d, m0, m0 + mb, p0, p1, apack, &vnni);
            }
        }
        m0 += mb;
    }
}

/// Rows `m0..m0 + mb` × panels `p0..p1`: packs A, runs the 32×32 blocks. False (nothing
/// written to C) when a row spans more than 255.
///
/// # Safety
/// As [`block`]; `apack` writable for mb.next_multiple_of(32) rows of [`pitch`] slots.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn m_block(d: &GemmDesc, m0: usize, mb: usize, p0: usize, p1: usize, apack: *mut i32, kq: usize) -> bool {
    let pitch = pitch(kq);
    // SAFETY: A rows m0..m0 + mb of d.k floats (contract); apack as above.
    if !unsafe { pack_a(d.a.add(m0 * d.lda), d.lda, mb, d.k, kq, apack) } {
        return false;
    }
    BLOCKS_RUN.fetch_add(1, Ordering::Relaxed);
    let post = d.epi.has_post();
    let panel = (kq + 1) * NR; // i32 slots per panel
    let bq = d.b.cast::<i32>();
    let mut sums = Sums([0; 32 * 32]);
    // SAFETY (the loops): tile configuration loaded before any tile instruction, released after.
    unsafe { asm!("ldtilecfg [{c}]", c = in(reg) &CONFIG, options(nostack, readonly)) };
    let mut p = p0;
    while p < p1 {
        let np = 2.min(p1 - p);
        let col0 = p * NR;
        let nr = (np * NR).min(d.n - col0);
        let b0 = bq.wrapping_add(p * panel);
        let b1 = if np == 2 { b0.wrapping_add(panel) } else { b0 };
        let mut ir = 0;
        while ir < mb {
            let mr = 32.min(mb - ir);
            let a = apack.wrapping_add(ir * pitch);
            // SAFETY: 32 packed rows from ir (padded), kq slots of both panels.
            unsafe { tiles(a, pitch, b0, b1, np == 2, kq, &mut sums) };
            // Twelve rows at a time through the AVX-512 tile's store.
            let mut i0 = 0;
            while i0 < mr {
                let rows = 12.min(mr - i0);
                let row0 = m0 + ir + i0;
                let tp = post.then_some(TilePost { epi: &d.epi, act: d.act, row0, col0 });
                // SAFETY: C rows row0.. < m, columns col0..col0 + nr ≤ n; the panels' column
                // sums at slot kq; A's offsets at slot kq of each row.
                by_rows!(rows, nr > NR, |R, P| unsafe {
                    let mut acc = [[_mm512_setzero_ps(); P]; R];
                    for (i, f) in acc.iter_mut().enumerate() {
                        let o = _mm512_set1_epi32(*a.add((i0 + i) * pitch + kq));
                        for (v, x) in f.iter_mut().enumerate() {
                            let panel_v = if v == 0 { b0 } else { b1 };
                            let col_sums = _mm512_loadu_si512(panel_v.add(kq * NR).cast());
                            let s = _mm512_loadu_si512(sums.0.as_ptr().add((i0 + i) * 32 + v * 16).cast());
                            *x = _mm512_cvtepi32_ps(_mm512_sub_epi32(s, _mm512_mullo_epi32(o, col_sums)));
                        }
                    }
                    store_tile(acc, d.c.add(row0 * d.ldc + col0), d.ldc, d.epi.scale, d.accumulate, rows, nr, tp)
                });
                i0 += rows;
            }
            ir += 32;
        }
        p += np;
    }
    // SAFETY: leaves the tile state initial (no AMX state kept in the thread).
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
    true
}

/// One 32×32 block's sums, row-major (row stride 32 i32).
#[repr(C, align(64))]
struct Sums([i32; 32 * 32]);

/// The 2×2 (or 2×1 with one panel) C tiles of 32 packed A rows from `a` (row pitch `pitch`
/// slots) × panels `b0`, `b1` over kq slots (a multiple of 16), stored to `out`.
///
/// # Safety
/// The tile configuration loaded; `a` readable for 32 rows of kq slots at the pitch, `b0`
/// (and `b1` when `two`) for kq slots of 64 bytes.
#[inline(always)]
unsafe fn tiles(a: *const i32, pitch: usize, b0: *const i32, b1: *const i32, two: bool, kq: usize, out: &mut Sums) {
    let (pa, pb) = (pitch * 4, 64usize);
    // SAFETY: the contract; every tile load reads 16 rows of 64 bytes inside the operands.
    unsafe {
        asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
        let mut q = 0;
        while q < kq {
            let a0 = a.add(q);
            let a1 = a0.add(16 * pitch);
            if two {
                asm!(
                    "tileloadd tmm4, [{a0} + {pa}*1]",
                    "tileloadd tmm5, [{a1} + {pa}*1]",
                    "tileloadd tmm6, [{b0} + {pb}*1]",
                    "tileloadd tmm7, [{b1} + {pb}*1]",
                    "tdpbusd tmm0, tmm4, tmm6",
                    "tdpbusd tmm1, tmm4, tmm7",
                    "tdpbusd tmm2, tmm5, tmm6",
                    "tdpbusd tmm3, tmm5, tmm7",
                    a0 = in(reg) a0, a1 = in(reg) a1, b0 = in(reg) b0.add(q * NR), b1 = in(reg) b1.add(q * NR),
                    pa = in(reg) pa, pb = in(reg) pb, options(nostack, readonly),
                );
            } else {
                asm!(
                    "tileloadd tmm4, [{a0} + {pa}*1]",
                    "tileloadd tmm5, [{a1} + {pa}*1]",
                    "tileloadd tmm6, [{b0} + {pb}*1]",
                    "tdpbusd tmm0, tmm4, tmm6",
                    "tdpbusd tmm2, tmm5, tmm6",
                    a0 = in(reg) a0, a1 = in(reg) a1, b0 = in(reg) b0.add(q * NR),
                    pa = in(reg) pa, pb = in(reg) pb, options(nostack, readonly),
                );
            }
            q += 16;
        }
        let o = out.0.as_mut_ptr();
        let pc = 32 * 4usize;
        asm!(
            "tilestored [{c0} + {pc}*1], tmm0",
            "tilestored [{c1} + {pc}*1], tmm1",
            "tilestored [{c2} + {pc}*1], tmm2",
            "tilestored [{c3} + {pc}*1], tmm3",
            c0 = in(reg) o, c1 = in(reg) o.add(16), c2 = in(reg) o.add(16 * 32), c3 = in(reg) o.add(16 * 32 + 16),
            pc = in(reg) pc, options(nostack),
        );
    }
}

/// Packs `mb` rows of A (`cols` floats each at stride `lda`) as rows of [`pitch`] slots: the
/// bytes of w = v + o (v as `int16::to_i16` reads A, o the row's offset; past `cols`, w = o: B
/// is zero there), then o (the padding after it is never read); rows mb.. up to a multiple of
/// 32 zero. False when a row spans more than 255 (nothing of use written).
///
/// # Safety
/// AVX-512F/BW present; `a` readable as said; `dst` writable for mb.next_multiple_of(32) rows
/// of [`pitch`] slots; kq·4 ≥ cols.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn pack_a(a: *const f32, lda: usize, mb: usize, cols: usize, kq: usize, dst: *mut i32) -> bool {
    let pitch = pitch(kq);
    for r in 0..mb {
        // SAFETY: row r < mb has `cols` floats; its slots lie in `dst` (contract).
        unsafe {
            let row = a.add(r * lda);
            let Some(off) = row_offset(row, cols) else { return false };
            let o = _mm512_set1_epi32(off);
            let out = dst.add(r * pitch).cast::<u8>();
            let mut p = 0;
            while p < kq * 4 {
                let w = cols.saturating_sub(p).min(16);
                let m: __mmask16 = ((1u32 << w) - 1) as u16;
                // (A zero mask reads nothing: the address past the row is never dereferenced.)
                let x = _mm512_maskz_loadu_ps(m, row.wrapping_add(p));
                // w = v + o in [0, 255]: its low byte is w.
                let bytes = _mm512_cvtepi32_epi8(_mm512_add_epi32(to_i16_lanes(x), o));
                _mm_storeu_si128(out.add(p).cast(), bytes);
                p += 16;
            }
            *dst.add(r * pitch + kq) = off;
        }
    }
    // SAFETY: the padding rows are inside `dst` (contract).
    unsafe { std::ptr::write_bytes(dst.add(mb * pitch), 0, (mb.next_multiple_of(32) - mb) * pitch) };
    true
}
