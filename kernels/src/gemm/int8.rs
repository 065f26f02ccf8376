//! The integer GEMM over unsigned × signed byte quads, for AVX512-VNNI's `vpdpbusd`: four byte
//! products summed into each i32 lane per instruction, twice the work of `vpdpwssd` on the i16
//! pairs (`int16`). Same contract and the same exact integers, so the same f32 results, bit for
//! bit; the runtime packs B this way where the machine has the tile and B's values fit a signed
//! byte (`int_b::int_layout_for`).
//!
//! - **B** (a weight, packed once): panels of [`NR`] columns, kq = ceil(k/4) slots per column of
//!   four signed bytes (k steps 4q..4q+3, the lowest first), then one slot per column holding
//!   its column sum Σ_p B(p, j) as an i32. Panel extent kq + 1 (`Arch::b_extra` = 1).
//! - **A** (packed per call, as the f32 path packs it): [`MR`]-row strips of kq + 2 slots —
//!   kq slots of four unsigned bytes w = v + o (v = A's integer as `int16::to_i16` reads it,
//!   o = -min of the row's v, so every w ≥ 0), one slot of the rows' o, and one slot whose lane
//!   0 says where the strip's high bytes are (0: none). A row of a quantized activation minus its
//!   zero point spans at most 255, so w is one byte; when some row of the block spans more (an
//!   integer operand that is not one), every strip gets a second plane of kq slots of w >> 8,
//!   after all the strips, its low plane holding w & 255.
//! - **Tile**: acc = Σ high·B, acc <<= 8, acc += Σ low·B, acc -= o·colsum: Σ_p (w - o)·B(p, j)
//!   = Σ_p v·B(p, j) in wrapping i32 arithmetic, exact under the caller's bound as every other
//!   path. (oneDNN adds a fixed 128 to signed A; a per-row offset is what fits any 256
//!   consecutive integers, wherever the zero point put them in [-255, 255].)

use super::*;

/// The byte-quad panels (after the header, see `int_b`): B(p, j) = `at(p, j)` in [-128, 127]
/// (zero past k and n), then each column's sum.
pub(super) fn pack_b_panels(k: usize, n: usize, at: impl Fn(usize, usize) -> i16, dst: &mut [u8]) {
    let kq = k.div_ceil(4);
    for pan in 0..n.div_ceil(NR) {
        let panel = &mut dst[pan * (kq + 1) * NR * 4..(pan + 1) * (kq + 1) * NR * 4];
        for jj in 0..NR {
            let mut sum = 0i32;
            for p in 0..kq * 4 {
                let v = at(p, pan * NR + jj);
                sum += v as i32;
                panel[((p / 4) * NR + jj) * 4 + p % 4] = v as i8 as u8;
            }
            panel[(kq * NR + jj) * 4..(kq * NR + jj + 1) * 4].copy_from_slice(&sum.to_le_bytes());
        }
    }
}

/// Packs mc rows × `cols` columns of f32 A into MR-row strips of kc = kq + 2 slots (see the
/// module docs), the high-byte plane after the strips when a row spans more than 255.
///
/// # Safety
/// `a` readable for mc rows of `cols` floats at stride lda; `dst` writable for
/// ceil(mc/MR)·MR·(2·kc - 2) slots.
pub(super) unsafe fn pack_a(a: *const f32, lda: usize, mc: usize, kc: usize, cols: usize, dst: *mut f32) {
    // Each row's v, its offset, and whether the block needs the high plane.
    let v = |r: usize, p: usize| -> i32 {
        // SAFETY: r < mc, p < cols.
        if p < cols { int16::to_i16(unsafe { *a.add(r * lda + p) }) as i32 } else { 0 }
    };
    let mut offs = [0i32; MC];
    let mut high = false;
    for (r, o) in offs.iter_mut().enumerate().take(mc) {
        let (lo, hi) = (0..cols).fold((i32::MAX, i32::MIN), |(lo, hi), p| (lo.min(v(r, p)), hi.max(v(r, p))));
        *o = -lo;
        high |= hi - lo > 255;
    }
    // SAFETY: caller contract: `dst` holds every strip and, when `high`, every high plane.
    unsafe { write_strips(mc, kc, high, &offs, dst.cast(), |r, p| v(r, p) + offs[r]) }
}

/// Writes the strips of [`pack_a`] from each row's w (`w(r, p)`, for p < kq·4).
///
/// # Safety
/// As [`pack_a`]'s `dst`.
#[inline]
unsafe fn write_strips(mc: usize, kc: usize, high: bool, offs: &[i32; MC], d: *mut i32, w: impl Fn(usize, usize) -> i32) {
    let kq = kc - 2;
    let strips = mc.div_ceil(MR);
    for si in 0..strips {
        let s = si * MR * kc;
        let plane = strips * MR * kc + si * MR * kq;
        for i in 0..MR {
            let r = si * MR + i;
            for q in 0..kq {
                let ws = |t: usize| if r < mc { w(r, 4 * q + t) } else { 0 };
                let lo = u32::from_le_bytes([ws(0) as u8, ws(1) as u8, ws(2) as u8, ws(3) as u8]);
                // SAFETY: slot q of row i in strip si (and its high plane when `high`).
                unsafe {
                    *d.add(s + q * MR + i) = lo as i32;
                    if high {
                        let hi = u32::from_le_bytes([(ws(0) >> 8) as u8, (ws(1) >> 8) as u8, (ws(2) >> 8) as u8, (ws(3) >> 8) as u8]);
                        *d.add(plane + q * MR + i) = hi as i32;
                    }
                }
            }
            // SAFETY: the trailer slots of strip si.
            unsafe {
                *d.add(s + kq * MR + i) = if r < mc { offs[r] } else { 0 };
                *d.add(s + (kq + 1) * MR + i) = if high { (plane - s) as i32 } else { 0 };
            }
        }
    }
}

/// The dot product of a slot of unsigned bytes with a slot of signed bytes (`vpdpbusd`'s lane).
#[inline]
fn dot4(a: i32, b: i32) -> i32 {
    let (a, b) = (a.to_le_bytes(), b.to_le_bytes());
    (0..4).map(|t| a[t] as i32 * b[t] as i8 as i32).sum()
}

/// The exact sums of a tile of MR × NR from a packed strip and panel of kc - 1 slots (see the
/// module docs), in wrapping i32 arithmetic as the vector tile computes them.
///
/// # Safety
/// `a` holds a packed strip of kc slots (and its high plane where it links one), `b` a panel of
/// kc - 1 slots.
pub(super) unsafe fn sums(kc: usize, a: *const f32, b: *const f32) -> [[i32; NR]; MR] {
    let kq = kc - 2;
    let (a, b) = (a.cast::<i32>(), b.cast::<i32>());
    // SAFETY (every read): inside the strip, its high plane, or the panel, by the contract.
    let at = |p: *const i32, i: usize| unsafe { *p.add(i) };
    let link = at(a, (kq + 1) * MR) as usize;
    let mut acc = [[0i32; NR]; MR];
    let plane = |acc: &mut [[i32; NR]; MR], src: *const i32| {
        for q in 0..kq {
            for (i, row) in acc.iter_mut().enumerate() {
                for (j, r) in row.iter_mut().enumerate() {
                    *r = r.wrapping_add(dot4(at(src, q * MR + i), at(b, q * NR + j)));
                }
            }
        }
    };
    if link != 0 {
        plane(&mut acc, a.wrapping_add(link));
        acc = acc.map(|row| row.map(|v| v.wrapping_shl(8)));
    }
    plane(&mut acc, a);
    for (i, row) in acc.iter_mut().enumerate() {
        for (j, r) in row.iter_mut().enumerate() {
            *r = r.wrapping_sub(at(a, kq * MR + i).wrapping_mul(at(b, kq * NR + j)));
        }
    }
    acc
}

/// The portable byte-quad tile (`arch::KernelFn`, A packed): [`sums`], then the scalar f32
/// tile's store.
///
/// # Safety
/// As [`sums`]; `c` writable for mr rows of nr floats at stride ldc.
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
    // SAFETY: forwarded.
    let accf = unsafe { sums(kc, a, b) }.map(|row| row.map(|v| v as f32));
    // SAFETY: forwarded.
    unsafe { scalar::store(&accf, c, ldc, alpha, beta, mr, nr, post) }
}

impl Arch {
    /// Whether the byte-quad tile runs on this machine at `isa`: AVX-512 in use (see
    /// `effective_isa`) with AVX512BW and AVX512-VNNI.
    pub(crate) fn u8_tile_available(isa: Isa) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            effective_isa(isa) == Isa::Avx512 && std::arch::is_x86_feature_detected!("avx512bw") && std::arch::is_x86_feature_detected!("avx512vnni")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = isa;
            false
        }
    }

    /// The byte-quad GEMM's kernels for `isa`: the f32 arch of that ISA (its epilogue, for k = 0)
    /// with the AVX512-VNNI 12×32 tile and its A packing where `tiles` allows VNNI and
    /// [`Arch::u8_tile_available`] — run by AMX's loops (`amx::block`) where `tiles` is `Best`
    /// and the process has AMX —; else the portable sums, stored by the ISA's own f32 store
    /// (a B packed on a VNNI machine and run by a table held to AVX2 gives the AVX2 path's
    /// bits: slow, never wrong).
    pub(crate) fn for_isa_u8(isa: Isa, tiles: IntTiles) -> Arch {
        let vnni = tiles != IntTiles::NoVnni;
        let portable = Arch { kernel, pack_a, wide: None, slot_cols: 4, whole_k: true, a_extra: 2, b_extra: 1, name: "portable integer code", ..Arch::for_isa(isa) };
        #[cfg(target_arch = "x86_64")]
        {
            if vnni && Arch::u8_tile_available(isa) {
                let amx = tiles == IntTiles::Best && effective_isa(isa) == Isa::Avx512 && amx::available();
                let block = amx.then_some(amx::block as arch::BlockFn);
                let name = if amx { "AMX-INT8 tiles (a few rows, or k not a multiple of 64: AVX512-VNNI byte quads)" } else { "AVX512-VNNI byte quads" };
                return Arch { pack_a: avx512_u8::pack_a, wide: Some(avx512_u8::wide), block, name, ..portable };
            }
            if effective_isa(isa).has_avx2() {
                return Arch { kernel: avx2_i16::kernel_u8, name: "portable byte-quad sums, AVX2 store", ..portable };
            }
        }
        let _ = (vnni, tiles);
        portable
    }
}
