//! Packed B (panels of NR columns, k-major) and the A-packing scratch sizes.

use super::*;

/// Floats a packed B of `k`×`n` occupies: `ceil(n/NR)·NR·k`.
pub fn packed_b_len(k: usize, n: usize) -> usize {
    n.div_ceil(NR) * NR * k
}

/// B packed for [`gemm`]: `ceil(n/NR)` panels of `k×NR` floats (k-major), 64-byte aligned.
#[derive(Clone, Debug)]
pub struct PackedB {
    buf: AlignedBuf,
    k: usize,
    n: usize,
}

impl PackedB {
    /// Rows of B (the reduction dimension).
    pub fn k(&self) -> usize {
        self.k
    }
    /// Columns of B (the output width).
    pub fn n(&self) -> usize {
        self.n
    }
    /// The packed floats ([`packed_b_len`] of them).
    pub fn as_slice(&self) -> &[f32] {
        self.buf.as_slice()
    }
}

/// Packs B once. `transposed == false`: `b` is `[k, n]` row-major, element (p, j) at `b[p·ldb + j]`.
/// `transposed == true`: `b` is `[n, k]` row-major (a PyTorch Linear weight `[out, in]`), element
/// (p, j) at `b[j·ldb + p]`.
pub fn pack_b(
    b: &[f32],
    k: usize,
    n: usize,
    ldb: usize,
    transposed: bool,
) -> Result<PackedB, KernelError> {
    let mut buf = AlignedBuf::zeroed(packed_b_len(k, n));
    pack_b_into(b, k, n, ldb, transposed, buf.as_mut_slice())?;
    Ok(PackedB { buf, k, n })
}

/// [`pack_b`] into a caller buffer of at least [`packed_b_len`]`(k, n)` floats (for example a
/// plan's weight arena). Use with [`gemm_prepacked`]. 64-byte alignment of `dst` is recommended.
pub fn pack_b_into(
    b: &[f32],
    k: usize,
    n: usize,
    ldb: usize,
    transposed: bool,
    dst: &mut [f32],
) -> Result<(), KernelError> {
    let need = if transposed {
        span("b", n, k, ldb)?
    } else {
        span("b", k, n, ldb)?
    };
    check_len("b", b.len(), need)?;
    check_len("packed b", dst.len(), packed_b_len(k, n))?;
    // SAFETY: lengths checked above against the extents pack_b_raw touches.
    unsafe { pack_b_raw(b.as_ptr(), k, n, ldb, transposed, dst.as_mut_ptr()) };
    Ok(())
}

/// Raw packing, see [`pack_b`].
///
/// # Safety
/// `src` readable over the extent of the chosen layout; `dst` writable for `packed_b_len(k, n)`
/// floats; no overlap.
pub(crate) unsafe fn pack_b_raw(
    src: *const f32,
    k: usize,
    n: usize,
    ldb: usize,
    transposed: bool,
    dst: *mut f32,
) {
    let vector_transpose = transposed && crate::detect_isa().has_avx2();
    for pan in 0..n.div_ceil(NR) {
        let j0 = pan * NR;
        let w = NR.min(n - j0);
        // SAFETY (whole block): every index stays inside the extents stated in the contract:
        // p < k, j0 + jj < n, and panel offsets below packed_b_len(k, n).
        unsafe {
            let d = dst.add(pan * k * NR);
            if !transposed {
                for p in 0..k {
                    let s = src.add(p * ldb + j0);
                    let dp = d.add(p * NR);
                    if w == NR {
                        // A constant length: inline moves, not a memmove call per 64 bytes
                        // (attention packs V, 32 floats a row, per head).
                        std::ptr::copy_nonoverlapping(s, dp, NR);
                        continue;
                    }
                    std::ptr::copy_nonoverlapping(s, dp, w);
                    for jj in w..NR {
                        *dp.add(jj) = 0.0;
                    }
                }
            } else if cfg!(target_arch = "x86_64") && w == NR && vector_transpose {
                // SAFETY: AVX2 detected; a full panel (columns j0..j0+NR <= n) of a transposed
                // source: NR rows of k floats at stride ldb.
                #[cfg(target_arch = "x86_64")]
                avx2::pack_panel_transposed(src.add(j0 * ldb), k, ldb, d);
            } else {
                for jj in 0..w {
                    let s = src.add((j0 + jj) * ldb);
                    for p in 0..k {
                        *d.add(p * NR + jj) = *s.add(p);
                    }
                }
                for p in 0..k {
                    for jj in w..NR {
                        *d.add(p * NR + jj) = 0.0;
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Scratch

/// Floats of A-packing scratch one thread needs for an m×k A.
pub(crate) fn apack_len(m: usize, k: usize) -> usize {
    if k == 0 || m == 0 {
        return 0;
    }
    m.min(MC).div_ceil(MR) * MR * k.min(KC) + ALIGN_SLACK
}

/// Scratch floats [`gemm`] needs to run an m×n×k product on `threads` threads. With less scratch it
/// runs on as many threads as fit (at least one thread's worth is required).
pub fn gemm_scratch_len(m: usize, n: usize, k: usize, threads: usize) -> usize {
    let _ = n;
    threads.max(1) * apack_len(m, k)
}

/// Rounds a float pointer up to 64-byte alignment (at most 15 floats further).
#[inline]
pub(crate) fn align64(p: *mut f32) -> *mut f32 {
    let mis = (p as usize) & 63;
    if mis == 0 {
        p
    } else {
        p.wrapping_add((64 - mis) / 4)
    }
}
