//! Model front ends: turn a checkpoint's config into a kiln graph.

pub mod bert;
