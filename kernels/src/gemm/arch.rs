//! The ISA-specific pieces behind function pointers, chosen once per call.

use super::*;

/// `kernel(kc, a, a_ld, b_panel, b_next, c, ldc, alpha, beta, mr, nr, pf, post)`: C[mr×nr] =
/// post(alpha·A·B (+ C if beta)), `post` the tile's epilogue when set; `b_next` (a prefetch
/// hint, never dereferenced) is where the next panel's same k block starts, and the tile
/// prefetches its k steps `pf.0..pf.1` (see [`prefetch_slice`](super::block::prefetch_slice)). A is a packed strip when `a_ld`
/// is [`PACKED`], else mr row-major rows at stride `a_ld` (the source itself, see [`gemm_block`]).
pub(super) type KernelFn = unsafe fn(
    usize, *const f32, usize, *const f32, *const f32, *mut f32, usize, f32, bool, usize, usize, (usize, usize), Option<TilePost>,
);
/// `pack_a(a, lda, mc, kc, cols, dst)`: mc rows of A into strips of kc packed slots; `cols`
/// is how many source columns those slots cover (kc for f32; at most 2·kc for the i16 path,
/// whose last pair is zero-padded when k is odd).
pub(super) type PackAFn = unsafe fn(*const f32, usize, usize, usize, usize, *mut f32);
/// `epilogue(c_tile, ldc, rows, cols, row0, col0, epi, act)`.
pub(super) type EpilogueFn = unsafe fn(*mut f32, usize, usize, usize, usize, usize, &Epilogue, Activation);

/// `wide(kc, a, a_ld, b, b_stride, c, ldc, alpha, beta, mr, nr, pf, post)`: a tile of up to 2·MR
/// rows (two consecutive packed A strips, or mr row-major rows at stride `a_ld` as in
/// [`KernelFn`]) × 2·NR columns (panels `b` and `b + b_stride`); C = post(alpha·A·B (+ C));
/// prefetches k steps `pf.0..pf.1` of the next two panels.
pub(super) type WideFn = unsafe fn(
    usize, *const f32, usize, *const f32, usize, *mut f32, usize, f32, bool, usize, usize, (usize, usize), Option<TilePost>,
);

/// `block(d, r0, r1, p0, p1, apack, arch)`: a thread's share of a GEMM as
/// [`gemm_block`](super::gemm_block) runs it, by another loop nest (AMX's 32×32 tiles).
pub(super) type BlockFn = unsafe fn(&GemmDesc, usize, usize, usize, usize, *mut f32, &Arch);

/// The `a_ld` of a tile kernel whose A is packed strips.
pub(super) const PACKED: usize = 0;

#[derive(Clone, Copy)]
pub(crate) struct Arch {
    pub(super) kernel: KernelFn,
    pub(super) pack_a: PackAFn,
    pub(super) epilogue: EpilogueFn,
    /// The 2·MR × 2·NR tile kernel, where the ISA has one (AVX-512). Same packed layouts and, per
    /// element, the same operations in the same order as `kernel`, so results are bitwise equal.
    pub(super) wide: Option<WideFn>,
    /// Columns of A per packed slot: 1 (f32), 2 (the i16 path: a slot is a pair of i16).
    pub(super) slot_cols: usize,
    /// k runs in one block (the integer paths: their sums are converted to f32 once).
    pub(super) whole_k: bool,
    /// Packed slots past ceil(k/slot_cols) in each A strip and each B panel: the byte-quad
    /// path's trailers (its rows' offsets and high-byte link; its columns' sums, see `int8`).
    pub(super) a_extra: usize,
    pub(super) b_extra: usize,
    /// A thread's share run by loops of its own instead of `gemm_block`'s (AMX).
    pub(super) block: Option<BlockFn>,
    /// What runs the tiles, for labels (`int8_tile_name`): set where the kernels are chosen, so
    /// the label cannot name another path than the dispatch took.
    pub(super) name: &'static str,
}

impl Arch {
    pub(crate) fn for_isa(isa: Isa) -> Arch {
        match effective_isa(isa) {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Fma => Arch {
                kernel: avx2::kernel,
                pack_a: avx2::pack_a,
                epilogue: avx2::epilogue,
                wide: None,
                slot_cols: 1,
                whole_k: false,
                a_extra: 0,
                b_extra: 0,
                block: None,
                name: "AVX2 6×16 f32 tile",
            },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Arch {
                kernel: avx2::kernel,
                pack_a: avx2::pack_a,
                epilogue: avx512::epilogue,
                wide: Some(avx512::wide),
                slot_cols: 1,
                whole_k: false,
                a_extra: 0,
                b_extra: 0,
                block: None,
                name: "AVX-512 12×32 f32 tile",
            },
            _ => Arch {
                kernel: scalar::kernel,
                pack_a: scalar::pack_a,
                epilogue: scalar::epilogue,
                wide: None,
                slot_cols: 1,
                whole_k: false,
                a_extra: 0,
                b_extra: 0,
                block: None,
                name: "portable f32 code",
            },
        }
    }
}
