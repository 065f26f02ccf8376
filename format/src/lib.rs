//! kiln-format: what kiln's crates exchange as data, in one place and with no machinery.
//!
//! - [`graph`]: the graph as plain data (the seed `Backend` trait takes it) with a structural
//!   check; [`signature`]: its inputs, outputs and weight table, and its fingerprint.
//! - [`plan`]: one bucket's compiled plan for the CPU ([`plan::cpu::CpuPlanImage`]) or a CUDA GPU
//!   ([`plan::cuda::CudaPlanSpec`]), with the checks that need no code to run.
//! - [`artifact`]: the container that ships plans (version derived from a schema hash, kiln
//!   version checked, checksum, optional signature — [`trust`]).
//! - [`features`]: the one table of x86 features (probed by the runtime, targeted by the compiler).
//!
//! The compiler (shape inference, ops' meaning, passes, code generation) and the executors
//! (mapping code, launching kernels) depend on this crate; it depends on neither. Like IREE's
//! schemas and wasmtime's `environ` crate, it is the wall between the two; unlike them it keeps
//! serde + bincode rather than a FlatBuffers schema, with the schema hash in `build.rs` standing in
//! for the schema's version.

pub mod artifact;
pub mod bucket;
pub mod dtype;
pub mod error;
pub mod features;
pub mod graph;
pub mod plan;
pub mod signature;
pub mod trust;

pub use bucket::Bucket;
pub use dtype::{DType, HostTensor, TensorData};
pub use error::{Error, Result};
pub use graph::{BinaryOp, Dim, Graph, InputRole, InputSpec, Node, Op, ReduceOp, UnaryOp, ValueId, WeightConcat, WeightSpec};
pub use signature::{fingerprint, OutputSpec, Signature};
pub use trust::TrustPolicy;
