//! How a GEMM's work is cut across threads, and the multi-threaded raw entry.

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
    let body = |t: usize| {
        let u0 = t * units / tasks;
        let u1 = (t + 1) * units / tasks;
        let (r0, r1, p0, p1) = if by_rows {
            ((u0 * MR).min(d.m), (u1 * MR).min(d.m), 0, n_panels)
        } else {
            (0, d.m, u0, u1)
        };
        let apack = align64((sp as *mut f32).wrapping_add(t * per));
        // SAFETY: task t owns scratch region t (t < tasks <= fit) and a disjoint range of rows or
        // panels of C; the operands are valid per this function's contract.
        unsafe { (arch.block.unwrap_or(gemm_block))(d, r0, r1, p0, p1, apack, arch) };
    };
    match pool {
        Some(p) if tasks > 1 => p.run(tasks, &body),
        _ => body(0),
    }
    Ok(())
}
