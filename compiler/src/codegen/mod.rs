//! Code generators: kernel IR → machine code (CPU) or CUDA C → PTX (GPU).

pub mod cpu;
pub mod cuda;
