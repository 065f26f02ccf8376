//! One bucket's compiled plan, per target, as plain data.

pub mod cpu;
pub mod cuda;
