//! The graph IR: plain data from `kiln_runtime::graph`, and the builder.

pub mod builder;

pub use builder::GraphBuilder;
pub use kiln_runtime::graph::*;
