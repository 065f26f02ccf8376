//! A heap buffer of f32 aligned to 64 bytes (one cache line), without `unsafe` allocation code.

/// One cache line of f32. `repr(C, align(64))` with a 64-byte payload: no padding inside.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// A zero-initialized f32 buffer whose first element is 64-byte aligned.
#[derive(Clone)]
pub struct AlignedBuf {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedBuf {
    /// A buffer of `len` zeros.
    pub fn zeroed(len: usize) -> Self {
        AlignedBuf {
            lines: vec![Line([0.0; 16]); len.div_ceil(16)],
            len,
        }
    }

    /// Number of f32 elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements.
    pub fn as_slice(&self) -> &[f32] {
        // SAFETY: `Line` is `repr(C)` around `[f32; 16]` with size 64 = 16 * 4, so `lines` is
        // `16 * lines.len() >= len` contiguous, initialized f32 values.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<f32>(), self.len) }
    }

    /// The elements, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: as in `as_slice`, and `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<f32>(), self.len) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .finish()
    }
}
