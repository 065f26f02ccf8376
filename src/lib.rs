//! kiln: the CLI's library half — model fetching and loading — shared by the `kiln` binary,
//! the examples and the integration tests.

pub mod backend_kind;
pub mod embedder;
pub mod fetch;
pub mod model;
pub mod onnx;
pub mod serve;

pub use backend_kind::BackendKind;
