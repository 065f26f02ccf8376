//! How a GEMM's work is cut across threads, and the multi-threaded raw entry.

use super::steal::StealRange;
use super::*;

/// Threads beyond this many split rows statically (the stealable ranges live on the stack).
const MAX_STEAL_TASKS: usize = 64;

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
    let by_rows = match split {
        Split::Rows => true,
        Split::Panels => false,
        Split::Auto => m_strips > n_panels,
    };
    let units = if by_rows { m_strips } else { n_panels };
    let tasks = threads.min(units).max(1);
    let sp = scratch as usize;
    let block = arch.block.unwrap_or(gemm_block);
    // Rows split across threads are stealable (`steal`): each thread runs its own range from the
    // front in the m blocks a static split would give it (the last ones halving), then takes
    // small pieces from the back of ranges not yet done. Panel splits (m within one or two m blocks) stay static: a thief
    // there would re-pack A for every k block of what it takes.
    let ranges: [StealRange; MAX_STEAL_TASKS] = std::array::from_fn(|t| {
        if by_rows && t < tasks {
            StealRange::new(t * units / tasks, (t + 1) * units / tasks)
        } else {
            StealRange::new(0, 0)
        }
    });
    let stealing = by_rows && tasks > 1 && tasks <= MAX_STEAL_TASKS;
    let body = |t: usize| {
        let apack = align64((sp as *mut f32).wrapping_add(t * per));
        let u0 = t * units / tasks;
        let u1 = (t + 1) * units / tasks;
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
        // The owner's pieces: the m blocks `gemm_block` would cut its whole range into (in pairs of
        // strips: the AVX-512 tile spans two).
        let own = u1 - u0;
        let piece = own.div_ceil(own.div_ceil(MC / MR).max(1)).next_multiple_of(2);
        // A thief's: a quarter of that, so the tail evens out without many short blocks that
        // each stream all of B.
        let bite = piece.div_ceil(4).next_multiple_of(2);
        let run = |(s0, s1): (usize, usize)| {
            // SAFETY: each strip range is taken from its StealRange once (compare-and-swap), so
            // the rows of C written here are written by no other task; task t owns scratch
            // region t (t < tasks <= fit); the operands are valid per this function's contract.
            unsafe { block(d, (s0 * MR).min(d.m), (s1 * MR).min(d.m), 0, n_panels, apack, arch) };
        };
        while let Some(r) = ranges[t].take_front(piece, bite) {
            run(r);
        }
        for v in 1..tasks {
            while let Some(r) = ranges[(t + v) % tasks].take_back(bite) {
                run(r);
            }
        }
    };
    match pool {
        Some(p) if tasks > 1 => p.run(tasks, &body),
        _ => body(0),
    }
    Ok(())
}
