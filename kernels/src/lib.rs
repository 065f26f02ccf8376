//! kiln-kernels: hand-tuned microkernels reached by generated code through a function table,
//! and CUDA C templates that the CUDA code generator specializes.
