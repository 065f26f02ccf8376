//! Backends that lower a graph for one bucket and run it.

pub mod cpu;
pub mod cuda;
pub mod reference;

pub use reference::{interpret, interpret_all, ReferenceBackend, ReferencePlan, ReferenceWeights, WeightArray};
