//! Backends that lower a graph for one bucket and run it. The reference interpreter, also a
//! backend, is the top-level `reference` module: the middle end's constant folding runs it, and
//! living outside `backends` keeps `passes` from depending on the backends that run the passes.

pub mod cpu;
pub mod cuda;
