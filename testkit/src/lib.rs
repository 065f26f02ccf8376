//! kiln-testkit: what kiln's tests share, kept out of the library crates' normal build (as
//! wasmtime keeps its filetests and fuzzing crates apart). Only dev-dependencies use it.
//!
//! - [`random`]: seeded random graphs, inputs and weights, and tolerant comparison;
//! - [`golden`]: golden files under `tests/golden/`, rewritten only by `BLESS=1`;
//! - [`filecheck`]: FileCheck-style `CHECK:` assertions over dumps (`tests/golden/filecheck/`);
//! - [`kernel_eval`]: an evaluator of fused kernel programs in their planned arena (the middle
//!   end's check between the passes and code generation);
//! - [`cuda_emu`]: the emitted CUDA C compiled for the host and run, for machines without a GPU;
//! - [`onnx_proto`]: ONNX protos built by hand.

pub mod cuda_emu;
pub mod filecheck;
pub mod golden;
pub mod kernel_eval;
pub mod onnx_proto;
pub mod random;
