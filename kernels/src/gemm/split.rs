//! How a GEMM's work is cut across threads, and the multi-threaded raw entry.

use super::block::{gemm_block_with, reads_a_in_place, Blocking};
use super::steal::{even_ranges, even_share, Taker, MAX_STEAL_TASKS};
use super::*;

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

/// Row chunks per panel of a stealing panel split that reads A in place (`in_place_pieces`).
const CHUNKS: usize = 4;

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
    // SAFETY: forwarded.
    unsafe { gemm_raw_with(d, &Arch::for_isa(isa), apack_len(d.m, d.k), scratch, scratch_len, pool, split) }
}

/// [`gemm_raw`] with the tile kernels of `arch` (f32 or i16) and `per` floats of A-packing
/// scratch per thread.
///
/// # Safety
/// As [`gemm_raw`], with `d.b` packed for `arch`.
pub(crate) unsafe fn gemm_raw_with(
    d: &GemmDesc,
    arch: &Arch,
    per: usize,
    scratch: *mut f32,
    scratch_len: usize,
    pool: Option<&ThreadPool>,
    split: Split,
) -> Result<(), KernelError> {
    if d.m == 0 || d.n == 0 {
        return Ok(());
    }
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
    // (k = 0 is one epilogue pass per tile, without blocks.)
    let blocking = (d.k > 0).then(|| Blocking::new(d, d.m, arch));
    // Rows when there are more strips than panels, and when A takes several m blocks and rows
    // move fewer operand floats per thread: a panel split packs all of A on every thread and
    // reads its share of B once per m block (and, not one block, cannot steal); a row split
    // packs its share of A and reads all of B once per m block of its rows. With 2 threads and
    // MiniLM's FFN-up (n = 1536) that gives rows at m = 256 and 512, panels at 384 (`model_gemms`
    // at 384 tokens: 45.9–46.3 ms so, 46.1–54.9 with rows forced); with many threads, panels
    // again (16 threads at m = 512: rows would read 4× the B). Measured on the AVX2-only Zen 3
    // of 2026-12-07, 2 threads, `gemm_bench` hot: 512×384·384×1536 84–85% of the peak by
    // panels, 90–94% by rows (256 rows: 88–89% / 90–94%); `model_gemms` (MiniLM's 36 GEMMs,
    // cold weights) at 512 tokens 71.6–82.4 ms → 63.9–66.2 ms. At one m block (m ≤ 144) panels
    // stay: there each thread streams its share of a cold B, and rows measured slower
    // (`model_gemms` at 128 tokens).
    let rows_read_less = blocking.as_ref().is_some_and(|b| {
        let t = threads.max(1);
        let (a, bk) = (d.m.saturating_mul(d.k), d.k.saturating_mul(d.n));
        let by_rows = (a / t).saturating_add(bk.saturating_mul(d.m.div_ceil(t).div_ceil(b.mc_step)));
        let by_panels = a.saturating_add((bk / t).saturating_mul(d.m.div_ceil(b.mc_step)));
        b.mc_step < d.m && by_rows <= by_panels
    });
    let by_rows = match split {
        Split::Rows => true,
        Split::Panels => false,
        Split::Auto => m_strips > n_panels || rows_read_less,
    };
    let units = if by_rows { m_strips } else { n_panels };
    let tasks = threads.min(units).max(1);
    let sp = scratch as usize;
    let block = arch.block.unwrap_or(gemm_block);
    // Each thread's rows or panels are a stealable range (`steal`): it runs its own from the
    // front — rows in the m blocks a static split would give it, the last ones halving — then
    // takes small pieces from the back of ranges not yet done. A panel split steals only where
    // the GEMM is one k block and one m block: every thread has then packed the same A, which
    // a thief reuses (or, a share of at most SHARE_DIRECT_PANELS, reads A in place as the
    // owner does: `gemm_block`); with more blocks a thief would re-pack A for what it takes,
    // and a tile's k blocks must stay on one thread. (A panel split of the integer AMX block, which packs
    // A per 32-row block, keeps the static split; its row splits steal like the others.)
    let one_block = blocking.is_some_and(|b| b.single(d.m));
    // A panel split of several blocks whose shares read A in place (FFN-down at 128 tokens on
    // AVX2: k = 1536 in four blocks, 12 panels a thread) steals too, in pieces of a panel and
    // [`CHUNKS`]-th of the rows (in panel order, so a thread runs each panel's row chunks one
    // after another with the panel in L1) that one `gemm_block` call runs through all their k
    // blocks: nothing is packed, and each tile's k blocks stay on one thread, in order. With
    // the static split such a GEMM left a thread waiting 0.05–0.13 ms of its 0.9 ms (MiniLM
    // 1×128, 2 threads, the Zen 3 of 2026-12-07); with whole panels as the pieces (75 µs each
    // on one thread) 0.02–0.08; in a busy minute, old and new in alternate processes,
    // 0.14–0.30 -> 0.02–0.14 ms, and all joins of the model 1.5–2.4 -> 0.9–1.2 ms per run.
    // One-panel tiles only (AVX2, portable): the AVX-512 tile spans two panels, and splitting
    // its pairs was not measurable (nor its bits checkable) on this machine.
    let in_place_pieces =
        !by_rows && !one_block && d.k > 0 && arch.block.is_none() && arch.wide.is_none() && reads_a_in_place(d, units.div_ceil(tasks), arch);
    let chunk_strips = m_strips.div_ceil(CHUNKS);
    let chunks = m_strips.div_ceil(chunk_strips.max(1));
    let steal_units = if in_place_pieces { n_panels * chunks } else { units };
    let stealing = tasks > 1
        && tasks <= MAX_STEAL_TASKS
        && steal_units <= u32::MAX as usize
        && (by_rows || (one_block && arch.block.is_none()) || in_place_pieces);
    let ranges = even_ranges(steal_units, if stealing { tasks } else { 0 });
    let body = |t: usize| {
        let apack = align64((sp as *mut f32).wrapping_add(t * per));
        let (u0, u1) = even_share(units, tasks, t);
        if !stealing {
            let (r0, r1, p0, p1) = if by_rows {
                ((u0 * MR).min(d.m), (u1 * MR).min(d.m), 0, n_panels)
            } else {
                (0, d.m, u0, u1)
            };
            // SAFETY: task t owns scratch region t (t < tasks <= fit) and a disjoint range of rows
            // or panels of C; the operands are valid per this function's contract.
            unsafe { block(d, r0, r1, p0, p1, apack, arch) };
            return;
        }
        let own = u1 - u0;
        if in_place_pieces {
            // Unit u: panel u / chunks, strips (u % chunks)·chunk_strips.. of it.
            let (s0, s1) = even_share(steal_units, tasks, t);
            let own = s1 - s0;
            let mut taker = Taker { own: t, ranges: &ranges[..tasks], most: own, bite: 1, least: 1 };
            while let Some((a, b)) = taker.take() {
                for p in a / chunks..b.div_ceil(chunks) {
                    let (c0, c1) = (a.max(p * chunks) - p * chunks, b.min((p + 1) * chunks) - p * chunks);
                    let (r0, r1) = ((c0 * chunk_strips * MR).min(d.m), (c1 * chunk_strips * MR).min(d.m));
                    // SAFETY: each unit is taken once (compare-and-swap) and run through all its
                    // k blocks here, so its tiles of C are written by no other task; a block of
                    // one panel reads A in place (`reads_a_in_place`), so the scratch region t
                    // is not even used; operands as this function's contract.
                    unsafe { block(d, r0, r1, p, p + 1, apack, arch) };
                }
            }
            return;
        }
        if !by_rows {
            // Panels: pairs on the AVX-512 tile (it spans two), single panels on the others (a
            // thread finishing first then waits for at most one panel's tiles: 16 µs at 128
            // rows on one core of the Zen 3), the owner's halving from all of its range. MiniLM
            // 1×128 on 2 threads of the Zen 3 of 2026-12-07 (fifteenth session), old and new in
            // alternate processes, a busy host: threads waiting at the joins 0.78, 1.16, 0.83,
            // 0.91 -> 0.75, 0.64, 0.71, 0.63 ms per run (`kiln bench --profile`).
            let least = if arch.wide.is_some() { 2 } else { 1 };
            let mut taker = Taker { own: t, ranges: &ranges[..tasks], most: own, bite: least, least };
            // SAFETY: one k block and one m block (`one_block`), so the panels `taker` gives are
            // whole tile columns, each taken once (compare-and-swap) and run by no other task;
            // task t owns scratch region t (t < tasks <= fit); operands as this function's contract.
            unsafe { gemm_block_with(d, 0, d.m, u0, u1, &mut taker, apack, arch) };
            return;
        }
        // Rows: the owner's pieces are the m blocks `gemm_block` would cut its whole range into
        // (whole tiles, so a multiple of MR rows); a thief's a quarter of that, so the tail
        // evens out without many short blocks that each stream all of B. Both halve what is left
        // towards the end, down to one tile's strips: the last pieces of a 1024-row FFN GEMM were 6
        // strips (0.5 ms on one thread), and a thread finishing first waited up to that long.
        // Threads waiting at the joins (`kiln bench --profile`), MiniLM 8×128 on 2 threads of
        // the Zen 3 of 2026-12-07 (with the norms' finer split, `tasks_for`), old and new in
        // alternate processes: 2.6 and 4.3 -> 1.9 and 2.1 ms per run; 1×512 2.3 -> 1.8.
        // (Down to one tile: two strips on the AVX-512 tile, which spans two.)
        let piece = Blocking::new(d, own * MR, arch).mc_step / MR;
        let bite = piece.div_ceil(4).next_multiple_of(2);
        let least = if arch.wide.is_some() { 2 } else { 1 };
        let mut taker = Taker { own: t, ranges: &ranges[..tasks], most: piece, bite, least };
        while let Some((s0, s1)) = taker.take() {
            // SAFETY: each strip range is taken once (compare-and-swap), so the rows of C written
            // here are written by no other task; task t owns scratch region t (t < tasks <= fit);
            // the operands are valid per this function's contract.
            unsafe { block(d, (s0 * MR).min(d.m), (s1 * MR).min(d.m), 0, n_panels, apack, arch) };
        }
    };
    match pool {
        Some(p) if tasks > 1 => p.run(tasks, &body),
        _ => body(0),
    }
    Ok(())
}
