//! The seam between the middle end and code generation, and the driver over it: a [`Target`]
//! turns one bucket the middle end has lowered into an artifact's plan payload; [`parse_target`]
//! reads the names users write (`cpu`, `cpu-native`, `cuda:sm_90`); [`build_artifact`] runs the
//! middle end once per bucket and the target's code generator on its result. The CLI's
//! `kiln compile -o`, `build::precompile` and `CpuBackend::build_artifact` all go through it, so a
//! GPU artifact is built the same way as a CPU one.
//!
//! (wasmtime's `Compiler` trait is the model: one trait object per target, chosen once, called
//! per function; here per bucket, so the dynamic call is nowhere near an op.)

use kiln_runtime::artifact::{self, Artifact, PlanPayload};
use kiln_runtime::{Bucket, Error, Graph, Result};

use crate::codegen::cpu::{compile_with_isa, CodegenOptions, CpuTarget, CodegenIsa};
use crate::codegen::cuda::{compile_lowered, CudaTarget};
use crate::passes::LayoutPolicy;
use crate::pipeline::{run_pipeline_for, Lowered};

/// A code generator for one kind of machine.
pub trait Target: Send + Sync {
    /// What the artifact header records, and the runtime checks against the machine.
    fn artifact_target(&self) -> artifact::Target;
    /// How this target wants weights laid out (the middle end's `layout` pass applies it).
    fn layout_policy(&self) -> LayoutPolicy;
    /// Machine code for one bucket of `graph` that the middle end has lowered.
    fn compile(&self, graph: &Graph, lowered: &Lowered) -> Result<PlanPayload>;
}

/// x86-64 code from Cranelift.
pub struct Cpu {
    isa: CodegenIsa,
    opts: CodegenOptions,
}

impl Cpu {
    /// Code for `target`, its kernel scratch sized for `threads` threads.
    pub fn new(target: CpuTarget, threads: usize) -> Result<Self> {
        let isa = crate::codegen::cpu::build_isa(&target)?;
        Ok(Cpu { isa, opts: CodegenOptions { target, threads, keep_clif: false } })
    }
}

impl Cpu {
    /// A CPU target over an ISA already built (a backend's).
    pub(crate) fn with_isa(isa: CodegenIsa, opts: CodegenOptions) -> Self {
        Cpu { isa, opts }
    }
}

impl Target for Cpu {
    fn artifact_target(&self) -> artifact::Target {
        artifact::Target::CpuX86_64 { features: self.isa.features.clone() }
    }
    fn layout_policy(&self) -> LayoutPolicy {
        crate::codegen::cpu::LAYOUT_POLICY
    }
    fn compile(&self, _graph: &Graph, lowered: &Lowered) -> Result<PlanPayload> {
        Ok(PlanPayload::Cpu(compile_with_isa(lowered, &self.opts, &self.isa)?.image))
    }
}

/// CUDA C compiled by NVRTC (PTX, and a cubin where ptxas is installed). Needs no GPU.
pub struct Cuda(pub CudaTarget);

impl Target for Cuda {
    fn artifact_target(&self) -> artifact::Target {
        artifact::Target::Cuda { major: self.0.sm / 10, minor: self.0.sm % 10 }
    }
    fn layout_policy(&self) -> LayoutPolicy {
        crate::codegen::cuda::LAYOUT_POLICY
    }
    fn compile(&self, graph: &Graph, lowered: &Lowered) -> Result<PlanPayload> {
        Ok(PlanPayload::Cuda(compile_lowered(graph, lowered, &self.0)?.spec))
    }
}

/// The target named `name`: `cpu` (x86-64-v3: AVX2 + FMA, portable), `cpu-native` (this
/// machine's every feature) or `cuda:sm_XY`. CPU plans size their kernel scratch for this
/// machine's threads.
pub fn parse_target(name: &str) -> Result<Box<dyn Target>> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(kiln_runtime::cpu::MAX_THREADS);
    match name {
        "cpu" | "x86-64-v3" => Ok(Box::new(Cpu::new(CpuTarget::x86_64_v3(), threads)?)),
        "cpu-native" => Ok(Box::new(Cpu::new(CpuTarget::Host, threads)?)),
        _ => match name.strip_prefix("cuda:") {
            Some(arch) => Ok(Box::new(Cuda(CudaTarget::new(arch)?))),
            None => Err(Error::Unsupported(format!("unknown target `{name}` (cpu, cpu-native, cuda:sm_XY)"))),
        },
    }
}

/// Compiles `buckets` of `graph` for `target` into one artifact, running the middle end once
/// per bucket. `on_lowered` sees each bucket's middle-end result before code generation (for
/// reports and limits; an error from it stops the build).
pub fn build_artifact(
    graph: &Graph,
    buckets: &[Bucket],
    target: &dyn Target,
    on_lowered: &mut dyn FnMut(&Lowered) -> Result<()>,
) -> Result<Artifact> {
    let mut plans = Vec::with_capacity(buckets.len());
    for &b in buckets {
        let lowered = run_pipeline_for(graph, b, target.layout_policy())?;
        on_lowered(&lowered)?;
        plans.push((b, target.compile(graph, &lowered)?));
    }
    Ok(Artifact::new(graph, target.artifact_target(), plans))
}
