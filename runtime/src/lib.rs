//! kiln-runtime: the thin runtime of kiln. It holds the seed traits ([`Backend`],
//! [`WeightLoader`]), the [`Engine`], weight loading and the CPU and CUDA executors. The data it
//! exchanges (graph, plans, artifacts) is `kiln-format`'s, re-exported here under the same
//! paths. It depends on no compiler (no Cranelift, no NVRTC, no shape inference):
//! `cargo tree -p kiln-runtime` shows it.

pub mod backend;
pub mod cpu;
/// GPU plans' checks and, behind the `cuda` feature, the driver-API executor and
/// `PrecompiledCuda`.
pub mod cuda;
pub mod engine;
pub mod weights;

pub use kiln_format::{artifact, bucket, dtype, error, graph, signature, trust};

pub use backend::{check_weights, Backend, Batch, Caps, Outputs};
pub use dtype::{DType, HostTensor, TensorData};
pub use engine::{Engine, LowerPolicy};
pub use error::{Error, Result};
pub use graph::{
    BinaryOp, Bucket, Dim, Graph, InputRole, InputSpec, Node, Op, ReduceOp, UnaryOp, ValueId, WeightSpec,
};
pub use signature::{OutputSpec, Signature};
pub use trust::TrustPolicy;
pub use weights::{
    block_on, load_graph_weights, load_table, BoxFuture, SafetensorsLoader, TensorInfo, TensorRef, TensorSpec, WeightLoader,
    WeightLoaderCapabilities, WeightMetadata, WeightSource,
};
