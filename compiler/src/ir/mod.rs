//! The graph IR: plain data from `kiln_format::graph` (re-exported through `kiln_runtime::graph`)
//! and the compiler's machinery over it — shape inference ([`infer`]), the builder, the text form
//! ([`print`], read back by [`parse`]).

pub mod builder;
pub mod infer;
pub mod parse;
pub mod print;
pub mod ranges;

pub use builder::GraphBuilder;
pub use infer::{broadcast_shapes, GraphExt};
pub use parse::parse;
pub use kiln_runtime::graph::*;
