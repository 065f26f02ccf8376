//! One thread's share of a GEMM: the raw description, and the k/m/panel loops that pack A and
//! run the tiles over it.

use super::*;

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
/// A block of at most this many B panels reads A in place (see `gemm_block`).
const DIRECT_PANELS: usize = 4;
/// A thread's share of a panel split of at most this many panels reads A in place on the
/// one-panel tiles (AVX2, portable; see `gemm_block`).
const SHARE_DIRECT_PANELS: usize = 12;

#[inline]
pub(super) fn prefetch_slice(t: usize, tiles: usize, kc: usize) -> (usize, usize) {
    (t * kc / tiles, (t + 1) * kc / tiles)
}

/// A tile's prefetch slice `pf` held inside its `kc` k steps, `p0 <= p1 <= kc`: the tiles run
/// their k loop as `0..p0`, `p0..p1` (prefetching) and `p1..kc`, so that no step tests whether
/// it prefetches (that test was 8 of the AVX2 loop's 30 instructions), and no stretch runs a
/// step past kc whatever slice a caller hands in.
#[inline(always)]
pub(super) fn prefetch_stretch(pf: (usize, usize), kc: usize) -> (usize, usize) {
    let p0 = pf.0.min(kc);
    (p0, pf.1.clamp(p0, kc))
}

/// How [`gemm_block`] cuts `rows` rows of `d` into blocks (also what `split` needs to know of
/// them: its owners' pieces are these m blocks, and a panel split steals only in one block).
pub(super) struct Blocking {
    /// The packed operands' k extent: one slot per column of A (f32), or per pair of columns
    /// (the i16 path, see `int16`).
    pub(super) k: usize,
    /// Equal k blocks of at most KC (k = 1536 → 4 × 384; k = 512 → 2 × 256 rather than
    /// 384 + 128). The i16 path runs k in one block: its exact integer sums are converted to
    /// f32 once.
    pub(super) kc_step: usize,
    /// Equal m blocks of at most MC rows, in whole tiles (m = 300 → 108 + 108 + 84, not
    /// 144 + 144 + 12): no short block streams all of B for a few rows.
    pub(super) mc_step: usize,
}

impl Blocking {
    pub(super) fn new(d: &GemmDesc, rows: usize, arch: &Arch) -> Blocking {
        let k = d.k.div_ceil(arch.slot_cols) + arch.a_extra;
        let kc_step = if arch.whole_k { k } else { k.div_ceil(k.div_ceil(KC)) };
        let tile_rows = if arch.wide.is_some() { 2 * MR } else { MR };
        let rows = rows.max(1);
        let mc_step = rows.div_ceil(rows.div_ceil(MC)).next_multiple_of(tile_rows).min(MC);
        Blocking { k, kc_step, mc_step }
    }

    /// Whether `rows` rows of a GEMM with k > 0 are one k block and one m block.
    pub(super) fn single(&self, rows: usize) -> bool {
        self.kc_step >= self.k && self.mc_step >= rows
    }
}

/// Whether [`gemm_block`] over `panels` B panels of `d` (a thread's share when fewer than all)
/// reads A's rows in place rather than packing them (why and when: in `gemm_block_with`).
pub(super) fn reads_a_in_place(d: &GemmDesc, panels: usize, arch: &Arch) -> bool {
    let tiles_per_strip = if arch.wide.is_some() { panels.div_ceil(2) } else { panels };
    let share = arch.wide.is_none() && panels < d.n.div_ceil(NR) && panels <= SHARE_DIRECT_PANELS;
    arch.slot_cols == 1 && d.lda != PACKED && (panels <= DIRECT_PANELS || share || (d.k <= 64 && tiles_per_strip <= 16))
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
    // SAFETY: forwarded; the panels are p0..p1 in every block.
    unsafe { gemm_block_with(d, r0, r1, p0, p1, &mut FixedPanels { p0, p1, given: false }, apack, arch) }
}

/// Where the tiles of each (k block, m block) find their B panels.
pub(crate) trait PanelSource {
    /// A new block begins.
    fn start(&mut self);
    /// The next range of panels to run in this block, or None when the block is done.
    fn next(&mut self) -> Option<(usize, usize)>;
}

/// The same range in every block.
struct FixedPanels {
    p0: usize,
    p1: usize,
    given: bool,
}

impl PanelSource for FixedPanels {
    fn start(&mut self) {
        self.given = false;
    }
    fn next(&mut self) -> Option<(usize, usize)> {
        (!std::mem::replace(&mut self.given, true)).then_some((self.p0, self.p1))
    }
}

/// [`gemm_block`] with the panels of each block from `panels`; `p0..p1` is the thread's nominal
/// range (which sets whether A is read in place).
///
/// # Safety
/// As [`gemm_block`], for every range `panels` gives: inside `0..ceil(n/NR)`, and C's tiles there
/// written by no other thread. A source that gives different ranges in different blocks is only
/// sound for a GEMM of one k block and one m block (a tile's k blocks must run on one thread, in
/// order).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_block_with(
    d: &GemmDesc,
    r0: usize,
    r1: usize,
    p0: usize,
    p1: usize,
    panels: &mut dyn PanelSource,
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
    let Blocking { k, kc_step, mc_step } = Blocking::new(d, r1 - r0, arch);
    // A B panel's extent in slots (the byte-quad path's trailers differ from A's).
    let kb = k - arch.a_extra + arch.b_extra;
    // A is packed so that the tiles of many B panels reuse it from L1/L2 in the order they read
    // it. When this block has at most two panels (attention's P·V with a head dim of 32, narrow
    // classifier heads) each A element is read by one or two tiles, and packing it costs more
    // than it saves; so it does when k is short and the tiles few (attention's Q·Kᵀ: k = 32,
    // a strip of A is 12 rows × 2 cache lines that stay in L1 across its tiles). Then the tiles
    // read A's rows in place (same FMAs in the same order: bitwise the packed path's results).
    // Measured, attn_bench 8×128: 86.5 → 89.6 GF/s on AVX-512 (4 tiles per strip), 52.1 → 52.9
    // on AVX2 (8); at 8×512 AVX-512 98.2 → 100.4 (16) but AVX2 56.1 → 54.6 (32): hence ≤ 16.
    // Up to four panels (DIRECT_PANELS: a ResNet's 64-channel convolutions, n = 64) A is read in
    // place too: gemm_bench on the Xeon of 2026-12-06, 2 threads, 3136×576·576×64 341–350 →
    // 378–382 GF/s (pack_a had been 30% of the time), 12544×147·147×64 (the stem) 342–361 →
    // 367–378; on AVX2 81–85% → 87–98% of the peak. Eight panels (n = 128) measured mixed.
    // A thread's share of a panel split (fewer panels than the GEMM has) reads A in place up
    // to SHARE_DIRECT_PANELS on the one-panel tiles (AVX2, portable): packed, every thread
    // would pack all of A for only its share of the panels, and the loads of the rows the
    // other thread wrote would stall it before its first FMA; the tiles overlap them.
    // Measured on the AVX2-only Zen 3 of 2026-12-07, 2 threads (`chain_gemms`, the model's
    // chained GEMMs, passes alternated in one process, best / lower quartile): at 128
    // tokens the output projection 1.276 → 1.242 / 1.326 → 1.271 ms for the six layers and
    // FFN-down (four k blocks) 5.096 → 4.919 / 5.218 → 5.058, the 24 GEMMs 15.54 → 15.36 ms;
    // at 16 and 64 tokens out −7% and −9%, down −5% and −3%; 256 tokens and more split by
    // rows, unchanged. Hot (`gemm_bench` shapes, bias): 128×384·384×384 185 → 194 GF/s,
    // 128×1536·1536×384 185 → 190. The whole range of one thread (24 panels, 1 thread) read
    // in place measured 0.3–0.8% slower, so it keeps packing; the AVX-512 tile (two panels
    // wide, twelve rows of broadcasts) was not measurable on this machine and keeps the rule
    // above.
    let direct = reads_a_in_place(d, p1 - p0, arch);
    let mut kc0 = 0;
    while kc0 < k {
        let kc = kc_step.min(k - kc0);
        let beta = d.accumulate || kc0 > 0;
        let last = kc0 + kc == k;
        // The last k block's tiles apply the epilogue as they store.
        let tile_post = |row0: usize, col0: usize| (last && post).then_some(TilePost { epi: &d.epi, act: d.act, row0, col0 });
        let mut mc0 = r0;
        while mc0 < r1 {
            let mc = mc_step.min(r1 - mc0);
            // SAFETY: A rows mc0..mc0+mc < m, columns from kc0's first one (< d.k).
            let a_blk = unsafe { d.a.add(mc0 * d.lda + kc0 * arch.slot_cols) };
            // The source columns of this k block (the last pair of an odd k has one).
            let cols = (kc * arch.slot_cols).min(d.k - kc0 * arch.slot_cols);
            // How the tiles read A: row ir of the block is at a_base + ir·a_step.
            let (a_ld, a_base, a_step) = if direct {
                (d.lda, a_blk, d.lda)
            } else {
                // SAFETY: apack holds the packed block.
                unsafe { (arch.pack_a)(a_blk, d.lda, mc, kc, cols, apack) };
                (PACKED, apack.cast_const(), kc)
            };
            let strip = |ir: usize| a_base.wrapping_add(ir * a_step);
            if let Some(wide) = arch.wide {
                // Tiles of two strips × two panels (the last ones narrower).
                panels.start();
                while let Some((pa, pb)) = panels.next() {
                    let mut p = pa;
                    while p < pb {
                        let np = 2.min(pb - p);
                        let col0 = p * NR;
                        let nr = (np * NR).min(d.n - col0);
                        // SAFETY: panels p, p+np-1 < ceil(n/NR), k offset kc0 + kc <= k.
                        let bp = unsafe { d.b.add(p * kb * NR + kc0 * NR) };
                        let mut ir = 0;
                        while ir < mc {
                            let mr = (2 * MR).min(mc - ir);
                            let pf = prefetch_slice(ir / (2 * MR), mc.div_ceil(2 * MR), kc);
                            // SAFETY: C tile rows mc0+ir..+mr < r1, columns col0..col0+nr <= n; A's
                            // rows ir..ir+mr of the block (packed: the strips at ir·kc).
                            unsafe {
                                let cp = d.c.add((mc0 + ir) * d.ldc + col0);
                                wide(kc, strip(ir), a_ld, bp, kb * NR, cp, d.ldc, alpha, beta, mr, nr, pf, tile_post(mc0 + ir, col0));
                            }
                            ir += 2 * MR;
                        }
                        p += np;
                    }
                }
                mc0 += mc;
                continue;
            }
            panels.start();
            while let Some((pa, pb)) = panels.next() {
                for p in pa..pb {
                    let col0 = p * NR;
                    let nr = NR.min(d.n - col0);
                    // SAFETY: panel p < ceil(n/NR), k offset kc0 + kc <= k: inside packed B.
                    let bp = unsafe { d.b.add(p * kb * NR + kc0 * NR) };
                    let mut ir = 0;
                    while ir < mc {
                        let mr = MR.min(mc - ir);
                        // SAFETY: C tile rows mc0+ir..+mr < r1, columns col0..col0+nr <= n; A's rows
                        // ir..ir+mr of the block (packed: the strip at ir·kc).
                        unsafe {
                            let cp = d.c.add((mc0 + ir) * d.ldc + col0);
                            let bn = bp.wrapping_add(kb * NR);
                            let pf = prefetch_slice(ir / MR, mc.div_ceil(MR), kc);
                            (arch.kernel)(kc, strip(ir), a_ld, bp, bn, cp, d.ldc, alpha, beta, mr, nr, pf, tile_post(mc0 + ir, col0));
                        }
                        ir += MR;
                    }
                }
            }
            mc0 += mc;
        }
        kc0 += kc;
    }
}
