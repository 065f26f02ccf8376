//! ONE definition of each elementwise op's scalar semantics.
//!
//! An op is written once, as a formula over a small set of primitives ([`Prims`]); every place
//! that computes elementwise ops interprets that formula with its own implementation of the
//! primitives:
//!
//! | interpreter | `Prims` implementation | where |
//! |---|---|---|
//! | reference interpreter (the f64 oracle) | [`eval::F64`] | `reference.rs` |
//! | kernel-level evaluator (f32, the planned arena) | [`eval::F32`] | `kiln_testkit::kernel_eval` |
//! | CPU code generation (Cranelift IR, f32 / f32x4) | `ClifPrims` | `codegen/cpu/expr.rs` |
//! | CUDA C emission (and so the host emulator) | `CudaPrims` | `codegen/cuda/expr.rs` |
//!
//! Adding a unary op is three files: its variant in the graph's `UnaryOp`, its formula (and
//! test domain) in [`unary`], and its test. A new *primitive* (say `log`) is the only thing each
//! interpreter has to learn (`log` was one: `eval`'s `ln`, `codegen/cpu/math.rs`'s polynomial,
//! CUDA's `logf`).
//!
//! Why a formula over primitives (a "tagless" interpreter) rather than one function per backend
//! per op: tract gives each op a struct that owns its eval and its rewrites, which still leaves
//! one eval per data type and a separate codegen; Cranelift's ISLE writes lowering rules as data
//! but per target. Here the semantics *are* the formula, so the four interpreters cannot drift
//! apart except in how they implement a primitive, and that is what the cross-backend
//! differential test with NaN, ±inf, -0 and denormals (compiler/tests/nan_contract.rs) checks.
//!
//! ## The special-value contract (one table, every backend)
//!
//! | primitive | NaN in | ±inf | -0 |
//! |---|---|---|---|
//! | `add sub mul div fma neg sqrt` | NaN out | IEEE 754 | IEEE 754 |
//! | `max`, `min` | NaN out if either operand is NaN | ordered | -0 < +0 (`max(-0,+0) = +0`, `min = -0`) |
//! | `exp` | NaN | `exp(+inf) = +inf`, `exp(-inf) = +0` | `exp(-0) = 1` |
//! | `log` | NaN (and for x < 0) | `log(+inf) = +inf` | `log(±0) = -inf` |
//! | `erf`, `tanh` | NaN | `±1` | `-0` (odd functions keep the sign) |
//! | `lt`, `ne` (masks) | `lt` false, `ne` true | ordered | `-0 == +0` |
//! | `select(m, a, b)` | — | — | — |
//! | `trunc` | NaN | ±inf | -0 |
//!
//! Everything an op does with special values follows from its formula: e.g. `relu(NaN) = NaN`
//! (`select(lt(x, 0), 0, x)`), `gelu(-inf) = NaN` (`-inf/2 · (1 + erf(-inf)) = -inf·0`).
//! Floating-point ops run in f32 on every backend but the oracle (f64); denormals are kept
//! (no flush to zero).

pub mod binary;
pub mod eval;
pub mod range;
pub mod unary;

/// The primitive operations op formulas are written in. `V` is a value (a scalar, a vector of
/// lanes, a CUDA C expression name), `M` a comparison mask.
pub trait Prims {
    type V: Copy;
    type M: Copy;
    /// A constant, rounded to the interpreter's float type.
    fn c(&mut self, v: f64) -> Self::V;
    fn add(&mut self, a: Self::V, b: Self::V) -> Self::V;
    fn sub(&mut self, a: Self::V, b: Self::V) -> Self::V;
    fn mul(&mut self, a: Self::V, b: Self::V) -> Self::V;
    fn div(&mut self, a: Self::V, b: Self::V) -> Self::V;
    /// `a·b + c`, rounded once where the target has FMA.
    fn fma(&mut self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    fn neg(&mut self, a: Self::V) -> Self::V;
    fn sqrt(&mut self, a: Self::V) -> Self::V;
    /// NaN-propagating maximum; -0 < +0.
    fn max(&mut self, a: Self::V, b: Self::V) -> Self::V;
    /// NaN-propagating minimum; -0 < +0.
    fn min(&mut self, a: Self::V, b: Self::V) -> Self::V;
    /// Rounds toward zero (integer division).
    fn trunc(&mut self, a: Self::V) -> Self::V;
    fn exp(&mut self, a: Self::V) -> Self::V;
    /// Natural logarithm.
    fn log(&mut self, a: Self::V) -> Self::V;
    fn erf(&mut self, a: Self::V) -> Self::V;
    fn tanh(&mut self, a: Self::V) -> Self::V;
    /// `a < b` (false when either is NaN).
    fn lt(&mut self, a: Self::V, b: Self::V) -> Self::M;
    /// `a != b` (true when either is NaN).
    fn ne(&mut self, a: Self::V, b: Self::V) -> Self::M;
    /// `m ? a : b`.
    fn select(&mut self, m: Self::M, a: Self::V, b: Self::V) -> Self::V;
    /// The nearest integer, ties to even (IEEE roundToIntegralTiesToEven; -0.4 gives -0, NaN
    /// and ±inf stay). By default [`unary::round_even`] from the primitives above; a target
    /// whose instruction computes exactly this overrides it (same bits, fewer instructions).
    fn nearest(&mut self, a: Self::V) -> Self::V {
        unary::round_even(self, a)
    }
}
