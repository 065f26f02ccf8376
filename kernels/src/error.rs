//! Typed errors of the safe kernel API. The raw `extern "C"` entry points map them to status codes.

use std::fmt;

/// Why a kernel call was rejected. No kernel panics on bad input; it returns one of these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelError {
    /// A slice is shorter than the shape and strides require.
    BufferTooSmall {
        what: &'static str,
        needed: usize,
        got: usize,
    },
    /// A stride is smaller than the row it must skip over.
    BadStride {
        what: &'static str,
        stride: usize,
        min: usize,
    },
    /// The scratch buffer cannot hold even a single-thread working set.
    ScratchTooSmall { needed: usize, got: usize },
    /// An activation code that `math::Activation` does not know.
    BadActivation(u32),
    /// Element `index` of an operand the i16 GEMM packs is not an integer in [-32768, 32767].
    NotInteger { what: &'static str, index: usize },
    /// Element `index` of an operand the integer GEMM packs is past the bound `bound` on its
    /// magnitude (the one its sums were proven exact under).
    PastBound { what: &'static str, index: usize, bound: u32 },
    /// Any other inconsistent argument.
    Invalid(&'static str),
}

impl KernelError {
    /// The status code the raw `extern "C"` entry points return for this error (0 is success).
    pub fn code(&self) -> i32 {
        match self {
            KernelError::BufferTooSmall { .. } => 1,
            KernelError::BadStride { .. } => 2,
            KernelError::ScratchTooSmall { .. } => 3,
            KernelError::BadActivation(_) => 4,
            KernelError::Invalid(_) | KernelError::NotInteger { .. } | KernelError::PastBound { .. } => 5,
        }
    }
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelError::BufferTooSmall { what, needed, got } => {
                write!(
                    f,
                    "{what}: buffer holds {got} elements, the shape needs {needed}"
                )
            }
            KernelError::BadStride { what, stride, min } => {
                write!(
                    f,
                    "{what}: stride {stride} is smaller than the row length {min}"
                )
            }
            KernelError::ScratchTooSmall { needed, got } => {
                write!(f, "scratch holds {got} f32, at least {needed} are needed")
            }
            KernelError::BadActivation(c) => write!(f, "unknown activation code {c}"),
            KernelError::NotInteger { what, index } => {
                write!(f, "{what}: element {index} is not an integer in [-32768, 32767]")
            }
            KernelError::PastBound { what, index, bound } => {
                write!(f, "{what}: element {index} is past the bound ±{bound}")
            }
            KernelError::Invalid(msg) => write!(f, "invalid kernel argument: {msg}"),
        }
    }
}

impl std::error::Error for KernelError {}

/// Elements a row-major matrix view of `rows` rows of `cols` used elements with row stride `ld`
/// spans, or an error if `ld < cols`. Zero-sized views span nothing.
pub(crate) fn span(
    what: &'static str,
    rows: usize,
    cols: usize,
    ld: usize,
) -> Result<usize, KernelError> {
    if rows == 0 || cols == 0 {
        return Ok(0);
    }
    if ld < cols && rows > 1 {
        return Err(KernelError::BadStride {
            what,
            stride: ld,
            min: cols,
        });
    }
    (rows - 1)
        .checked_mul(ld)
        .and_then(|x| x.checked_add(cols))
        .ok_or(KernelError::Invalid("matrix extent overflows usize"))
}

/// Checks that `len >= needed`.
pub(crate) fn check_len(what: &'static str, len: usize, needed: usize) -> Result<(), KernelError> {
    if len < needed {
        Err(KernelError::BufferTooSmall {
            what,
            needed,
            got: len,
        })
    } else {
        Ok(())
    }
}
