//! The graph IR: plain data from `kiln_format::graph` (re-exported through `kiln_runtime::graph`)
//! and the compiler's machinery over it — shape inference ([`infer`]), the builder, the text form
//! ([`print`]).

pub mod builder;
pub mod infer;
pub mod print;

pub use builder::GraphBuilder;
pub use infer::{broadcast_shapes, GraphExt};
pub use kiln_runtime::graph::*;
