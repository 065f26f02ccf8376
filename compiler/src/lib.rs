//! kiln-compiler: the graph builder, passes, fusion, memory planning, code generation and the
//! backends that lower a graph for one bucket.

pub mod backends;
pub mod build;
pub mod codegen;
pub mod ir;
pub mod kernel_ir;
pub mod memory_plan;
pub mod frontends;
pub mod fuse;
pub mod models;
pub mod ops;
pub mod passes;
pub mod placement;
pub mod pipeline;
pub mod reference;
pub mod target;
