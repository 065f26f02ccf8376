//! kiln-runtime: the thin runtime of kiln. It holds the seed traits ([`Backend`],
//! [`WeightLoader`]), the [`Engine`], the graph's plain data, and weight loading. It depends on
//! no compiler (no Cranelift, no NVRTC): `cargo tree -p kiln-runtime` shows it.

pub mod backend;
pub mod bucket;
pub mod artifact;
pub mod cpu;
/// GPU plans as data and their checks; the driver-API executor and `PrecompiledCuda` are behind
/// the `cuda` feature.
pub mod cuda;
pub mod dtype;
pub mod engine;
pub mod error;
pub mod graph;
pub mod trust;
pub mod weights;

pub use backend::{check_weights, Backend, Batch, Caps, Outputs};
pub use dtype::{DType, HostTensor, TensorData};
pub use engine::{Engine, LowerPolicy};
pub use error::{Error, Result};
pub use graph::{
    BinaryOp, Bucket, Dim, Graph, InputRole, InputSpec, Node, Op, ReduceOp, UnaryOp, ValueId, WeightSpec,
};
pub use trust::TrustPolicy;
pub use weights::{
    block_on, load_graph_weights, BoxFuture, SafetensorsLoader, TensorInfo, TensorRef, TensorSpec, WeightLoader,
    WeightLoaderCapabilities, WeightMetadata, WeightSource,
};
