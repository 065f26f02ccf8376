//! Code generators: kernel IR → machine code (CPU) or CUDA C → PTX (GPU).

pub mod cuda;
