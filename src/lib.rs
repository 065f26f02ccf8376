//! kiln: the CLI's library half — model fetching and loading — shared by the `kiln` binary,
//! the examples and the integration tests.

pub mod embedder;
pub mod fetch;
pub mod model;
pub mod onnx;
pub mod serve;
