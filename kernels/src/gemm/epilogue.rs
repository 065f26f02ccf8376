//! The GEMM epilogue: its C-ABI form, the per-tile handle the last k block's tiles apply, and the
//! safe-API form.

use super::*;

/// The GEMM epilogue, C ABI layout (32 bytes):
///
/// | offset | field             | CLIF type | meaning                                             |
/// |-------:|-------------------|-----------|-----------------------------------------------------|
/// | 0      | `bias`            | i64       | `*const f32`, `n` floats, or null                   |
/// | 8      | `residual`        | i64       | `*const f32`, row `i` at `residual + i·stride`, or null |
/// | 16     | `residual_stride` | i64       | floats between residual rows (≥ n when m > 1)       |
/// | 24     | `activation`      | i32       | [`Activation`] code, plus [`GATED`]                 |
/// | 28     | `scale`           | f32       | multiplies the product A·B                           |
///
/// Result: `C[i,j] = act(scale·Σₚ A[i,p]·B[p,j] + (accumulate ? C_old[i,j] : 0) + bias[j]) + residual[i,j]`,
/// or with [`GATED`] `(scale·Σₚ A[i,p]·B[p,j] + (accumulate ? C_old[i,j] : 0) + bias[j]) · act(residual[i,j])`
/// (a gated FFN's `up · silu(gate)`, GeGLU's with the GELU). The residual must not alias C (to
/// add into C in place, use `accumulate` instead).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Epilogue {
    pub bias: *const f32,
    pub residual: *const f32,
    pub residual_stride: usize,
    pub activation: u32,
    pub scale: f32,
}

/// The `activation` bit that makes the residual a gate: the activation applies to it, and it
/// multiplies instead of adding (it needs a residual).
pub const GATED: u32 = 1 << 8;

impl Epilogue {
    /// Whether the residual is a gate ([`GATED`]).
    #[inline(always)]
    pub(super) fn gated(&self) -> bool {
        self.activation & GATED != 0
    }

    /// No epilogue: scale 1, no bias, no activation, no residual.
    pub const NONE: Epilogue = Epilogue {
        bias: std::ptr::null(),
        residual: std::ptr::null(),
        residual_stride: 0,
        activation: 0,
        scale: 1.0,
    };

    /// The bias and residual of C's row `row0 + i` from column `col0` on (null when absent).
    ///
    /// # Safety
    /// The bias/residual extents read from there are inside their allocations.
    #[inline(always)]
    pub(super) unsafe fn operands(&self, i: usize, row0: usize, col0: usize) -> (*const f32, *const f32) {
        // SAFETY: the caller's contract.
        unsafe {
            let bp = if self.bias.is_null() { std::ptr::null() } else { self.bias.add(col0) };
            let rp = if self.residual.is_null() {
                std::ptr::null()
            } else {
                self.residual.add((row0 + i) * self.residual_stride + col0)
            };
            (bp, rp)
        }
    }

    pub(super) fn has_post(&self) -> bool {
        !self.bias.is_null()
            || !self.residual.is_null()
            || self.activation != Activation::None as u32
    }
}

impl Default for Epilogue {
    fn default() -> Self {
        Epilogue::NONE
    }
}

/// The epilogue of one C tile at (`row0`, `col0`), handed to the tile kernel of the last k block:
/// the kernel applies it to each vector between its scaling and its store, so the tile is not
/// stored, reloaded and stored again. Per element the same operations in the same order as the
/// separate pass ([`EpilogueFn`](super::arch::EpilogueFn), still used when k = 0): the same bits. In `perf` a quarter of
/// that pass's samples sat on reloading a tile whose lines were still on their way in (C cold in
/// a model, written for the first time); MiniLM 8×128, 2 threads, Zen 4: GEMM time 2.5–3% lower
/// on the AVX2 tile, the FFN-up + GELU kernel 1.19 → 1.11× the FFN-down one (same FLOPs).
#[derive(Clone, Copy)]
pub(crate) struct TilePost<'a> {
    pub(super) epi: &'a Epilogue,
    pub(super) act: Activation,
    pub(super) row0: usize,
    pub(super) col0: usize,
}

impl TilePost<'_> {
    /// Bias and residual of the tile's row `i` from its column `col` on (null when absent).
    ///
    /// # Safety
    /// As [`Epilogue::operands`] for the tile's row `i`, columns from `col`.
    #[inline(always)]
    pub(super) unsafe fn operands(&self, i: usize, col: usize) -> (*const f32, *const f32) {
        // SAFETY: the caller's contract.
        unsafe { self.epi.operands(i, self.row0, self.col0 + col) }
    }

    /// Whether the residual is a gate ([`GATED`]).
    #[inline(always)]
    pub(super) fn gated(&self) -> bool {
        self.epi.gated()
    }
}

/// The safe-API epilogue: borrowed slices instead of raw pointers.
#[derive(Clone, Copy, Debug)]
pub struct EpilogueRef<'a> {
    /// Per-column bias (`n` floats).
    pub bias: Option<&'a [f32]>,
    /// Residual added after the activation: `(data, row_stride)`.
    pub residual: Option<(&'a [f32], usize)>,
    pub activation: Activation,
    /// Multiplies A·B.
    pub scale: f32,
}

impl Default for EpilogueRef<'_> {
    fn default() -> Self {
        EpilogueRef {
            bias: None,
            residual: None,
            activation: Activation::None,
            scale: 1.0,
        }
    }
}

impl<'a> EpilogueRef<'a> {
    /// Checks the slices against an m×n output and gives the raw form.
    pub(super) fn to_raw(self, m: usize, n: usize) -> Result<Epilogue, KernelError> {
        let mut e = Epilogue {
            activation: self.activation as u32,
            scale: self.scale,
            ..Epilogue::NONE
        };
        if let Some(b) = self.bias {
            check_len("bias", b.len(), n)?;
            e.bias = b.as_ptr();
        }
        if let Some((r, rs)) = self.residual {
            check_len("residual", r.len(), span("residual", m, n, rs)?)?;
            e.residual = r.as_ptr();
            e.residual_stride = rs;
        }
        Ok(e)
    }
}
