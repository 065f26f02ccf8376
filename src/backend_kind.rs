//! Which backend a command runs on, named once for the CLI (`--backend`), the ONNX runner and
//! the embedder.

/// The compiler's CPU (Cranelift) or CUDA (NVRTC) backend, or the f64 reference interpreter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    Reference,
    Cpu,
    Cuda,
}
