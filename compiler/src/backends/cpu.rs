//! The CPU backend: the middle-end's fused, memory-planned kernel program compiled to native
//! x86-64 code with Cranelift (see [`crate::codegen::cpu`]), run by `kiln_runtime::cpu`.
//!
//! - `upload` keeps the checkpoint tensors and prepares each weight layout the plans read
//!   (transposed, packed for the GEMM microkernel) once; every bucket's plan shares them.
//! - `lower` runs the pipeline for the bucket, generates and compiles one function per kernel,
//!   and loads the image exactly as a precompiled artifact's plan is loaded (verify + map).
//! - `run` copies the inputs into the plan's arena, calls each kernel (splitting elementwise and
//!   norm kernels over the persistent pool; GEMM and attention use the pool themselves) and
//!   copies the outputs out: no allocation, no dispatch on kernel kinds.
//!
//! The same images go into artifacts ([`CpuBackend::build_artifact`]) that
//! `kiln_runtime::cpu::PrecompiledCpu` runs without the compiler.

use crate::ir::GraphExt as _;
use std::sync::Arc;
use std::time::Instant;

use kiln_runtime::artifact::Artifact;
use kiln_runtime::backend::{check_weights, Backend, Batch, Caps, Outputs};
use kiln_runtime::cpu::{cpu_caps, CpuContext, CpuPlan, CpuPlanImage, CpuWeights, Threads};
use kiln_runtime::graph::{Bucket, Graph};
use kiln_runtime::{HostTensor, Result};

use crate::codegen::cpu::{build_isa, compile_with_isa, CodegenOptions, CompiledProgram, CpuTarget, CodegenIsa, Layout};
use crate::codegen::cpu::LAYOUT_POLICY;
use crate::pipeline::run_pipeline_for;

/// Options of a [`CpuBackend`].
#[derive(Debug, Clone)]
pub struct CpuOptions {
    pub threads: Threads,
    /// The machine the code is for ([`CpuTarget::Host`] to run here).
    pub target: CpuTarget,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions { threads: Threads::Auto, target: CpuTarget::Host }
    }
}

/// The Cranelift CPU backend.
pub struct CpuBackend {
    ctx: Arc<CpuContext>,
    isa: CodegenIsa,
    opts: CpuOptions,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend").field("threads", &self.ctx.threads()).field("features", &self.isa.features).finish()
    }
}

/// Timing of one lowering, in milliseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct LowerTimes {
    pub pipeline_ms: f64,
    pub codegen_ms: f64,
    pub load_ms: f64,
}

impl CpuBackend {
    /// Host code, all available threads.
    pub fn new() -> Result<Self> {
        Self::with_options(CpuOptions::default())
    }
    /// Host code on one thread (no pool).
    pub fn single_threaded() -> Result<Self> {
        Self::with_options(CpuOptions { threads: Threads::Single, ..Default::default() })
    }
    pub fn with_options(opts: CpuOptions) -> Result<Self> {
        let isa = build_isa(&opts.target)?;
        Ok(CpuBackend { ctx: CpuContext::new(opts.threads)?, isa, opts })
    }
    pub fn threads(&self) -> usize {
        self.ctx.threads()
    }
    pub fn isa(&self) -> &CodegenIsa {
        &self.isa
    }

    fn codegen_options(&self, keep_clif: bool) -> CodegenOptions {
        CodegenOptions { target: self.opts.target.clone(), threads: self.ctx.threads(), keep_clif }
    }

    /// Runs the pipeline and the code generator for one bucket (no loading).
    pub fn compile(&self, graph: &Graph, bucket: Bucket, keep_clif: bool) -> Result<(CompiledProgram, LowerTimes)> {
        let t0 = Instant::now();
        let lowered = run_pipeline_for(graph, bucket, LAYOUT_POLICY)?;
        let pipeline_ms = t0.elapsed().as_secs_f64() * 1e3;
        let c = compile_with_isa(&lowered, &self.codegen_options(keep_clif), &self.isa)?;
        Ok((c.clone(), LowerTimes { pipeline_ms, codegen_ms: c.codegen_ms, load_ms: 0.0 }))
    }

    /// [`Backend::lower`] with its timing.
    pub fn lower_timed(&self, weights: &CpuWeights, graph: &Graph, bucket: Bucket) -> Result<(CpuPlan, LowerTimes)> {
        let (c, mut times) = self.compile(graph, bucket, false)?;
        let t = Instant::now();
        let plan = CpuPlan::load(c.image, weights, self.ctx.clone())?;
        times.load_ms = t.elapsed().as_secs_f64() * 1e3;
        Ok((plan, times))
    }

    /// Loads an image compiled earlier (by this backend or from an artifact).
    pub fn load(&self, image: CpuPlanImage, weights: &CpuWeights) -> Result<CpuPlan> {
        CpuPlan::load(image, weights, self.ctx.clone())
    }

    /// Compiles `buckets` into an artifact for this backend's target.
    pub fn build_artifact(&self, graph: &Graph, buckets: &[Bucket]) -> Result<Artifact> {
        let target = crate::target::Cpu::with_isa(self.isa.clone(), self.codegen_options(false));
        crate::target::build_artifact(graph, buckets, &target, &mut |_| Ok(()))
    }
}

impl Backend for CpuBackend {
    type Weights = CpuWeights;
    type Plan = CpuPlan;

    fn caps(&self) -> Caps {
        cpu_caps("cpu", self.ctx.threads(), true)
    }

    /// Keeps the tensors and prepares, once, the weight layouts plans will read: the slots of a
    /// one-token lowering (linear layers' packed weights do not depend on the bucket). Slots a
    /// later bucket needs beyond those are prepared at its lowering, also once.
    fn upload(&self, tensors: &[HostTensor], graph: &Graph) -> Result<CpuWeights> {
        check_weights(tensors, graph)?;
        let w = CpuWeights::new(tensors.to_vec());
        // Only a head start: a graph that cannot be lowered at 1×1 (a bucket-dependent shape)
        // still uploads, and each bucket's lowering prepares its own slots and reports its own
        // errors. Errors of the preparation itself are returned.
        if let Ok(lowered) = run_pipeline_for(graph, Bucket::new(1, 1), LAYOUT_POLICY) {
            if let Ok(layout) = Layout::new(&lowered) {
                for s in &layout.slots {
                    w.prepare_slot(s)?;
                }
            }
        }
        Ok(w)
    }

    fn lower(&self, weights: &CpuWeights, graph: &Graph, bucket: Bucket) -> Result<CpuPlan> {
        graph.validate(Some(bucket))?;
        self.lower_timed(weights, graph, bucket).map(|(p, _)| p)
    }

    fn run(&self, plan: &mut CpuPlan, batch: &Batch, outputs: &mut Outputs) -> Result<()> {
        plan.run(&batch.tensors, &mut outputs.tensors)
    }

    fn weight_bytes(&self, weights: &CpuWeights) -> usize {
        weights.bytes()
    }

    fn plan_bytes(&self, plan: &CpuPlan) -> usize {
        plan.bytes()
    }
}
