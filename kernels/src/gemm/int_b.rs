//! The integer GEMM's packed B: a 64-byte header naming its layout, k and n, then the panels
//! of that layout — i16 pairs (`int16`) or signed-byte quads with column sums (`int8`).
//!
//! The runtime packs a weight once, in the layout the fastest tile of the machine it runs on
//! reads ([`int_layout_for`]), and the table's one integer entry reads the header: a plan does
//! not name the layout, so a plan compiled on one machine runs on another with the other tile.
//! The header's k and n are checked against the call: B packed for another shape is a typed
//! error, not a read past its end. (Why not two table entries chosen by the compiler: the
//! choice depends on the CPU that runs the plan, not the one that compiled it.)

use super::*;

/// How a packed integer B is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntLayout {
    /// i16 pairs (`vpmaddwd`/`vpdpwssd`): any integers in [-32768, 32767].
    I16Pairs,
    /// Signed-byte quads and per-column sums (`vpdpbusd`): integers in [-128, 127].
    S8Quads,
}

impl IntLayout {
    /// The layout this machine packs a weight in: byte quads where every value fits a byte and
    /// the byte-quad tile runs here, else i16 pairs.
    pub(crate) fn for_weight(fits_bytes: bool) -> IntLayout {
        if fits_bytes && Arch::u8_tile_available(Isa::Avx512) {
            IntLayout::S8Quads
        } else {
            IntLayout::I16Pairs
        }
    }
}

/// Bytes of the header in front of the panels (one cache line, so the panels stay aligned).
pub const INT_B_HEADER: usize = 64;
const MAGIC: [u8; 4] = *b"KIGB";

/// The layout the fastest integer tile of this machine reads for the B that
/// [`pack_b_int_into`] would pack from the same view (see [`IntB::layout`]); i16 pairs for a
/// view the packer refuses (its error is the packer's to name).
pub fn int_layout_for(b: &[f32], k: usize, n: usize, row_stride: usize, col_stride: usize) -> IntLayout {
    IntB::read(b, k, n, row_stride, col_stride, u32::MAX).map_or(IntLayout::I16Pairs, |v| v.layout())
}

/// Bytes a packed B of `k`×`n` occupies in `layout`, header included.
pub fn packed_b_int_bytes(k: usize, n: usize, layout: IntLayout) -> usize {
    let panels = n.div_ceil(NR);
    INT_B_HEADER
        + match layout {
            IntLayout::I16Pairs => panels * NR * 4 * k.div_ceil(2),
            // kq slots of 4 bytes and one slot of column sums per column.
            IntLayout::S8Quads => panels * NR * 4 * (k.div_ceil(4) + 1),
        }
}

/// A B's values read once and checked: what the packer packs, and whether they fit bytes.
/// (So an upload scans a weight once: the layout is decided from the range this pass saw.)
pub struct IntB {
    k: usize,
    n: usize,
    /// B(p, j) at `p·n + j`.
    vals: Vec<i16>,
    /// Every value in [-128, 127].
    fits_bytes: bool,
}

impl IntB {
    /// B(p, j) = `b[p·row_stride + j·col_stride]` for p < k, j < n, each an integer of
    /// magnitude at most `max_abs` (else [`KernelError::NotInteger`] or
    /// [`KernelError::PastBound`] naming the element's index in `b`).
    pub fn read(b: &[f32], k: usize, n: usize, row_stride: usize, col_stride: usize, max_abs: u32) -> Result<IntB, KernelError> {
        let end = if k == 0 || n == 0 {
            0
        } else {
            (k - 1)
                .checked_mul(row_stride)
                .and_then(|r| (n - 1).checked_mul(col_stride).and_then(|c| r.checked_add(c)))
                .and_then(|l| l.checked_add(1))
                .ok_or(KernelError::Invalid("packed b view overflows"))?
        };
        check_len("b", b.len(), end)?;
        let mut vals = vec![0i16; k * n];
        let mut fits_bytes = true;
        for p in 0..k {
            for j in 0..n {
                let at = p * row_stride + j * col_stride;
                let v = b[at];
                if v != v.trunc() || !(-32768.0..=32767.0).contains(&v) {
                    return Err(KernelError::NotInteger { what: "b", index: at });
                }
                if v.abs() > max_abs as f32 {
                    return Err(KernelError::PastBound { what: "b", index: at, bound: max_abs });
                }
                fits_bytes &= (-128.0..=127.0).contains(&v);
                vals[p * n + j] = v as i16;
            }
        }
        Ok(IntB { k, n, vals, fits_bytes })
    }

    /// The layout the fastest integer tile of this machine reads: signed-byte quads where
    /// AVX512-VNNI and AVX512BW are present (and AVX-512 not turned off) and every value fits
    /// [-128, 127], else i16 pairs.
    pub fn layout(&self) -> IntLayout {
        IntLayout::for_weight(self.fits_bytes)
    }

    /// Packs the values in `layout` into `dst` (at least [`packed_b_int_bytes`]`(k, n, layout)`
    /// bytes; padding is zero). Byte quads hold [-128, 127] only, refused past it as
    /// [`KernelError::Invalid`] before anything is written.
    pub fn pack_into(&self, layout: IntLayout, dst: &mut [u8]) -> Result<(), KernelError> {
        let (k, n) = (self.k, self.n);
        let bytes = packed_b_int_bytes(k, n, layout);
        check_len("packed b", dst.len(), bytes)?;
        if layout == IntLayout::S8Quads && !self.fits_bytes {
            return Err(KernelError::Invalid("a value of B past [-128, 127] cannot be packed as bytes"));
        }
        let (head, body) = dst[..bytes].split_at_mut(INT_B_HEADER);
        head.fill(0);
        head[..4].copy_from_slice(&MAGIC);
        head[4] = match layout {
            IntLayout::I16Pairs => 1,
            IntLayout::S8Quads => 2,
        };
        head[8..16].copy_from_slice(&(k as u64).to_le_bytes());
        head[16..24].copy_from_slice(&(n as u64).to_le_bytes());
        let at = |p: usize, j: usize| if p < k && j < n { self.vals[p * n + j] } else { 0 };
        match layout {
            IntLayout::I16Pairs => int16::pack_b_panels(k, n, at, body),
            IntLayout::S8Quads => int8::pack_b_panels(k, n, at, body),
        }
        Ok(())
    }
}

/// Packs B for the integer GEMM ([`gemm_i16`]) in `layout`: [`IntB::read`] then
/// [`IntB::pack_into`], with their errors.
#[allow(clippy::too_many_arguments)]
pub fn pack_b_int_into(
    b: &[f32],
    k: usize,
    n: usize,
    row_stride: usize,
    col_stride: usize,
    max_abs: u32,
    layout: IntLayout,
    dst: &mut [u8],
) -> Result<(), KernelError> {
    check_len("packed b", dst.len(), packed_b_int_bytes(k, n, layout))?;
    IntB::read(b, k, n, row_stride, col_stride, max_abs)?.pack_into(layout, dst)
}

/// The layout of the packed B at `b`, after checking its header against the call's k and n.
///
/// # Safety
/// `b` readable for [`INT_B_HEADER`] bytes.
pub(crate) unsafe fn read_header(b: *const u8, k: usize, n: usize) -> Result<IntLayout, KernelError> {
    // SAFETY: caller contract.
    let h = unsafe { std::slice::from_raw_parts(b, INT_B_HEADER) };
    if h[..4] != MAGIC {
        return Err(KernelError::Invalid("packed b has no integer-GEMM header (not packed by pack_b_int_into)"));
    }
    let word = |at: usize| u64::from_le_bytes(h[at..at + 8].try_into().expect("8 bytes"));
    if word(8) != k as u64 || word(16) != n as u64 {
        return Err(KernelError::Invalid("packed b was packed for another k×n"));
    }
    match h[4] {
        1 => Ok(IntLayout::I16Pairs),
        2 => Ok(IntLayout::S8Quads),
        _ => Err(KernelError::Invalid("packed b names an unknown layout")),
    }
}
