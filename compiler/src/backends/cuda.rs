//! `CudaBackend`: the graph lowered by the middle-end, emitted as CUDA C per fused kernel,
//! compiled by NVRTC, and run through the driver API by the runtime's executor
//! (`kiln_runtime::cuda`).
//!
//! - `new` opens GPU 0; on a machine without the NVIDIA driver it returns a one-line
//!   `Error::Backend` naming the missing library (cudarc loads it dynamically, so the
//!   workspace builds and runs everywhere), and likewise when NVRTC is missing.
//! - `upload` copies the weights to the device once, in their checkpoint layout.
//! - `lower` runs the middle-end for the bucket, emits and compiles the kernels for this
//!   device's architecture, and loads the plan: one arena of the memory plan's size, the launch
//!   list resolved to device pointers. The same [`CudaPlanSpec`] can be compiled ahead of time
//!   with [`compile_graph`] (NVRTC only, no GPU) and loaded by the runtime alone.
//! - `run` copies the padded inputs in, replays the launches (as a CUDA graph once captured),
//!   and copies the outputs out.

use std::sync::Arc;

use kiln_runtime::backend::{check_weights, Backend, Batch, Caps, Outputs};
use kiln_runtime::cuda::{CudaDevice, CudaPlan, CudaPlanSpec, CudaWeights};
use kiln_runtime::{Bucket, Graph, HostTensor, Result};

use crate::codegen::cuda::{compile_graph, nvrtc, CudaTarget};

/// The CUDA backend on one GPU.
pub struct CudaBackend {
    dev: Arc<CudaDevice>,
    target: CudaTarget,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBackend({:?})", self.dev)
    }
}

impl CudaBackend {
    /// The backend on GPU 0. Errors (one line, never a panic) when the CUDA driver library,
    /// a GPU, or the NVRTC library is missing.
    pub fn new() -> Result<Self> {
        Self::with_device(0)
    }

    /// The backend on GPU `ordinal`.
    pub fn with_device(ordinal: usize) -> Result<Self> {
        let dev = CudaDevice::open(ordinal)?;
        nvrtc::require_nvrtc()?;
        let target = CudaTarget::new(&dev.arch())?;
        Ok(CudaBackend { dev, target })
    }

    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }

    pub fn target(&self) -> &CudaTarget {
        &self.target
    }

    /// Compiles the plan for `bucket` without loading it (what an artifact would carry).
    pub fn compile(&self, graph: &Graph, bucket: Bucket) -> Result<CudaPlanSpec> {
        Ok(compile_graph(graph, bucket, &self.target)?.spec)
    }
}

impl Backend for CudaBackend {
    type Weights = CudaWeights;
    type Plan = CudaPlan;

    fn caps(&self) -> Caps {
        self.dev.caps("cuda", true)
    }

    fn upload(&self, tensors: &[HostTensor], graph: &Graph) -> Result<CudaWeights> {
        check_weights(tensors, graph)?;
        self.dev.upload_weights(tensors)
    }

    fn lower(&self, weights: &CudaWeights, graph: &Graph, bucket: Bucket) -> Result<CudaPlan> {
        let spec = self.compile(graph, bucket)?;
        self.dev.load_plan(spec, weights)
    }

    fn run(&self, plan: &mut CudaPlan, batch: &Batch, outputs: &mut Outputs) -> Result<()> {
        plan.run(batch, outputs)
    }

    fn weight_bytes(&self, weights: &CudaWeights) -> usize {
        weights.bytes()
    }

    fn plan_bytes(&self, plan: &CudaPlan) -> usize {
        plan.bytes()
    }
}
