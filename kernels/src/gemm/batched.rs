//! Strided batched GEMM with B packed on the fly (attention-sized products).

use super::*;

/// Strided batched GEMM, C ABI layout (`repr(C)`, 144 bytes; every field is 8 bytes (CLIF `i64`)
/// except `alpha` (f32 at offset 120) and `_pad` (u32 at 124)). Item `i < batch` computes
/// `C_i[m×n] = alpha·A_i·B_i (+ C_i if accumulate != 0)` with `A_i = a + i·stride_a` (m rows of k at
/// `lda`), `B_i = b + i·stride_b` (`[k, n]` at `ldb`, or `[n, k]` at `ldb` when `b_transposed != 0`),
/// `C_i = c + i·stride_c` (m rows of n at `ldc`). B is packed per item into scratch; items are spread
/// over the thread pool, each worker with its own [`batched_scratch_len_per_thread`] floats.
///
/// Offsets in declaration order: batch 0, m 8, n 16, k 24, a 32, lda 40, stride_a 48, b 56, ldb 64,
/// stride_b 72, b_transposed 80, c 88, ldc 96, stride_c 104, accumulate 112, alpha 120, _pad 124,
/// scratch 128, scratch_len 136 (size 144). `tests/table.rs` checks them with `offset_of!`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BatchedGemmArgs {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: *const f32,
    pub lda: usize,
    pub stride_a: usize,
    pub b: *const f32,
    pub ldb: usize,
    pub stride_b: usize,
    pub b_transposed: usize,
    pub c: *mut f32,
    pub ldc: usize,
    pub stride_c: usize,
    pub accumulate: usize,
    pub alpha: f32,
    pub _pad: u32,
    pub scratch: *mut f32,
    pub scratch_len: usize,
}

// SAFETY: the args are shared by the workers of one call, which read A and B, write disjoint C
// blocks and use disjoint scratch regions (the raw entry's contract).
unsafe impl Sync for BatchedGemmArgs {}
// SAFETY: as above.
unsafe impl Send for BatchedGemmArgs {}

/// Scratch floats one worker of a batched GEMM needs.
pub fn batched_scratch_len_per_thread(m: usize, n: usize, k: usize) -> usize {
    packed_b_len(k, n) + ALIGN_SLACK + apack_len(m, k)
}

/// Scratch floats a batched GEMM needs on `threads` threads.
pub fn batched_scratch_len(m: usize, n: usize, k: usize, threads: usize) -> usize {
    threads.max(1) * batched_scratch_len_per_thread(m, n, k)
}

/// Raw batched GEMM.
///
/// # Safety
/// Every item's A, B and C extents are valid (see [`BatchedGemmArgs`]); the C blocks of different
/// items are pairwise disjoint; `scratch` writable for `scratch_len` floats, disjoint from operands.
pub(crate) unsafe fn gemm_batched_raw(
    g: &BatchedGemmArgs,
    pool: Option<&ThreadPool>,
    isa: Isa,
) -> Result<(), KernelError> {
    if g.batch == 0 || g.m == 0 || g.n == 0 {
        return Ok(());
    }
    let per = batched_scratch_len_per_thread(g.m, g.n, g.k);
    let workers = scratch_slots(g.scratch, g.scratch_len, per, pool)?;
    let arch = Arch::for_isa(isa);
    let serial = workers == 1 || g.m * g.n * g.k.max(1) * g.batch < PAR_MIN_MACS;
    let sp = g.scratch as usize;
    let g = *g;
    let body = move |i: usize, w: usize| {
        // Use `g` whole so the closure captures the (Sync) struct, not its raw-pointer fields.
        let g = &g;
        let base = (sp as *mut f32).wrapping_add(w * per);
        let bpack = align64(base);
        let apack = align64(bpack.wrapping_add(packed_b_len(g.k, g.n)));
        let d = GemmDesc {
            m: g.m,
            n: g.n,
            k: g.k,
            a: g.a.wrapping_add(i * g.stride_a),
            lda: g.lda,
            b: bpack,
            c: g.c.wrapping_add(i * g.stride_c),
            ldc: g.ldc,
            accumulate: g.accumulate != 0,
            epi: Epilogue {
                scale: g.alpha,
                ..Epilogue::NONE
            },
            act: Activation::None,
        };
        // SAFETY: worker w owns scratch region w (w < workers <= scratch_len / per); item i's
        // operands are valid and its C block is disjoint from other items' (caller contract).
        unsafe {
            pack_b_raw(
                g.b.wrapping_add(i * g.stride_b),
                g.k,
                g.n,
                g.ldb,
                g.b_transposed != 0,
                bpack,
            );
            gemm_block(&d, 0, g.m, 0, g.n.div_ceil(NR), apack, &arch);
        }
    };
    match pool {
        Some(p) if !serial => p.run_slots(g.batch, workers, &body),
        _ => (0..g.batch).for_each(|i| body(i, 0)),
    }
    Ok(())
}

/// A strided batch of row-major matrices: item `i` starts at `data[i·batch_stride]`, rows `ld` apart.
#[derive(Clone, Copy, Debug)]
pub struct Strided<'a> {
    pub data: &'a [f32],
    pub ld: usize,
    pub batch_stride: usize,
}

/// Mutable [`Strided`].
#[derive(Debug)]
pub struct StridedMut<'a> {
    pub data: &'a mut [f32],
    pub ld: usize,
    pub batch_stride: usize,
}

/// Whether a strided layout `(extent, stride)` maps distinct indices to distinct elements
/// (sufficient check: sorted by stride, each stride is at least the span of all smaller dimensions).
pub(crate) fn injective(dims: &mut [(usize, usize)]) -> bool {
    dims.sort_by_key(|&(_, s)| s);
    let mut span = 1usize;
    for &(e, s) in dims.iter() {
        if e <= 1 {
            continue;
        }
        if s < span {
            return false;
        }
        span = match s.checked_mul(e - 1).and_then(|x| x.checked_add(span)) {
            Some(v) => v,
            None => return false,
        };
    }
    true
}

/// `C_i = alpha·A_i·B_i (+ C_i)` for `i < batch`, B packed on the fly (`b_transposed`: B_i given as
/// `[n, k]`). `scratch`: at least [`batched_scratch_len_per_thread`] floats; with `pool` items run
/// in parallel on as many threads as the scratch has room for. C blocks of different items must not
/// overlap (checked).
#[allow(clippy::too_many_arguments)]
pub fn gemm_batched(
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    a: Strided<'_>,
    b: Strided<'_>,
    b_transposed: bool,
    c: StridedMut<'_>,
    alpha: f32,
    accumulate: bool,
    scratch: &mut [f32],
    pool: Option<&ThreadPool>,
    isa: Isa,
) -> Result<(), KernelError> {
    if batch == 0 || m == 0 || n == 0 {
        return Ok(());
    }
    let last = |what, stride: usize, one: usize| -> Result<usize, KernelError> {
        if one == 0 {
            return Ok(0);
        }
        (batch - 1)
            .checked_mul(stride)
            .and_then(|x| x.checked_add(one))
            .ok_or(KernelError::Invalid(what))
    };
    check_len(
        "a",
        a.data.len(),
        last("a extent overflows", a.batch_stride, span("a", m, k, a.ld)?)?,
    )?;
    let b_one = if b_transposed {
        span("b", n, k, b.ld)?
    } else {
        span("b", k, n, b.ld)?
    };
    check_len(
        "b",
        b.data.len(),
        last("b extent overflows", b.batch_stride, b_one)?,
    )?;
    check_len(
        "c",
        c.data.len(),
        last("c extent overflows", c.batch_stride, span("c", m, n, c.ld)?)?,
    )?;
    if !injective(&mut [(batch, c.batch_stride), (m, c.ld), (n, 1)]) {
        return Err(KernelError::Invalid(
            "batched gemm: C blocks of different items overlap",
        ));
    }
    let args = BatchedGemmArgs {
        batch,
        m,
        n,
        k,
        a: a.data.as_ptr(),
        lda: a.ld,
        stride_a: a.batch_stride,
        b: b.data.as_ptr(),
        ldb: b.ld,
        stride_b: b.batch_stride,
        b_transposed: b_transposed as usize,
        c: c.data.as_mut_ptr(),
        ldc: c.ld,
        stride_c: c.batch_stride,
        accumulate: accumulate as usize,
        alpha,
        _pad: 0,
        scratch: scratch.as_mut_ptr(),
        scratch_len: scratch.len(),
    };
    // SAFETY: extents and C disjointness checked above; scratch is a distinct &mut borrow.
    unsafe { gemm_batched_raw(&args, pool, isa) }
}
