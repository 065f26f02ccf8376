//! The CUDA code generator: kernel IR → CUDA C (templates of `kernels/cuda/` specialized with
//! the bucket's static shapes) → PTX (NVRTC) and, where `ptxas` is installed, a cubin → a
//! serializable [`CudaPlanSpec`] (code + launch list + arena size) that the runtime's driver-API
//! executor loads.
//!
//! | kernel IR | template | notes |
//! |---|---|---|
//! | elementwise / copy | `elementwise.cuh` | one thread per element, strided loads |
//! | gemm (+ epilogue) | `gemm_simt.cuh`, `gemm_mma.cuh` | f32: shared-memory tiled SIMT (64x64 or 32x32 tiles); f16/bf16 on sm_80+: tensor cores, `mma.sync.m16n8k16`, f32 accumulate |
//! | layer_norm / rms_norm / softmax | `rownorm.cuh` | a warp per row (≤ 1024 cols) or a block per row, warp-shuffle reductions, row in registers |
//! | attention | `attention.cuh` | flash-style: K/V tiles in shared memory, online softmax, scores never stored |
//! | reduce | `reduce.cuh` | a warp per output element |
//! | gather / concat | `gather.cuh`, `concat.cuh` | one thread per element |
//!
//! [`emu`] runs the emitted CUDA C on the host (C++20 threads), which is how the generated
//! kernels are tested on machines without a GPU.

pub mod emit;
mod expr;
pub mod nvrtc;
pub mod template;

pub use emit::{emit_program, f32_lit, BufLoc, CudaTarget, EmittedKernel, GemmTile, EmittedModule, Param, DevicePlacement};

use kiln_runtime::cuda::{CudaPlanSpec, IoSlot, KernelArg, LaunchSpec, WeightEntry, CUDA_PLAN_VERSION};
use kiln_runtime::{Graph, Result};

use crate::kernel_ir::KernelProgram;

/// The launch list and I/O bindings of an emitted module, with empty code: the plan minus PTX.
pub fn plan_skeleton(
    program: &KernelProgram,
    place: &DevicePlacement,
    module: &EmittedModule,
    weights: Vec<WeightEntry>,
) -> Result<CudaPlanSpec> {
    let arg = |b: crate::kernel_ir::BufferId| -> KernelArg {
        match place.locs[b.index()] {
            BufLoc::Arena { offset } => KernelArg::Arena { offset },
            BufLoc::Weight { index } => KernelArg::Weight { index },
            BufLoc::Const { index } => KernelArg::Const { index },
        }
    };
    let launches = module
        .kernels
        .iter()
        .map(|k| LaunchSpec {
            kernel: k.name.clone(),
            grid: k.grid,
            block: k.block,
            shared_bytes: k.shared_bytes,
            args: k.params.iter().map(|p| arg(p.buffer)).collect(),
        })
        .collect();
    let slot = |io: &crate::placement::IoPlace| IoSlot {
        offset: io.offset.map(|o| o as u64),
        dtype: io.dtype,
        shape: io.shape.clone(),
    };
    let inputs = place.inputs.iter().map(slot).collect();
    let outputs = place.outputs.iter().map(slot).collect();
    Ok(CudaPlanSpec {
        version: CUDA_PLAN_VERSION,
        bucket: program.bucket,
        arch: module.target.arch.clone(),
        ptx: String::new(),
        cubin: None,
        arena_bytes: place.arena_bytes,
        launches,
        inputs,
        outputs,
        weights,
        constants: place.constants.clone(),
    })
}

/// The weight table of `graph` as the plan records it (checkpoint dtype and shape).
pub fn weight_entries(graph: &Graph) -> Vec<WeightEntry> {
    graph.weights.iter().map(|w| WeightEntry { dtype: w.dtype, shape: w.shape.clone() }).collect()
}

/// A program compiled for one GPU architecture.
#[derive(Debug, Clone)]
pub struct CompiledCuda {
    pub module: EmittedModule,
    pub spec: CudaPlanSpec,
}

/// Emits `program`, compiles it with NVRTC (and ptxas where installed) for `target`, and
/// returns the serializable plan. Needs NVRTC, not a GPU.
pub fn compile_to_plan(
    program: &KernelProgram,
    place: &DevicePlacement,
    target: &CudaTarget,
    weights: Vec<WeightEntry>,
) -> Result<CompiledCuda> {
    let module = emit_program(program, place, target)?;
    let mut spec = plan_skeleton(program, place, &module, weights)?;
    spec.ptx = nvrtc::compile_ptx(&module.source, &target.arch, &format!("kiln_{}", program.bucket))?;
    spec.cubin = match nvrtc::ptxas_cubin(&spec.ptx, &target.arch) {
        None => None,
        Some(Ok(c)) => Some(c),
        // A broken ptxas install must not stop lowering: the driver JIT-compiles the PTX.
        Some(Err(_)) => None,
    };
    spec.validate()?;
    Ok(CompiledCuda { module, spec })
}

/// A graph lowered for the GPU without compiling: the middle-end's output, its placement and
/// the emitted CUDA C (what the golden tests and the host emulator use).
#[derive(Debug, Clone)]
pub struct EmittedPlan {
    pub lowered: crate::pipeline::Lowered,
    pub place: DevicePlacement,
    pub module: EmittedModule,
    /// The plan with empty code (`ptx` is filled by [`compile_graph`]).
    pub spec: CudaPlanSpec,
}

/// Weights stay in their checkpoint layout on the GPU: kernels read any layout through strides,
/// and weights upload as they are.
pub const LAYOUT_POLICY: crate::passes::LayoutPolicy = crate::passes::LayoutPolicy::Checkpoint;

/// The GPU placement of a lowered bucket (the memory plan's offsets).
pub fn placement(lowered: &crate::pipeline::Lowered) -> Result<DevicePlacement> {
    let inputs = crate::placement::input_types(&lowered.graph, lowered.bucket);
    DevicePlacement::new(&lowered.program, &lowered.plan.offsets, lowered.plan.arena_bytes, &inputs)
}

/// Runs the middle-end for `bucket` and emits CUDA C for `target`.
pub fn emit_graph(graph: &Graph, bucket: kiln_runtime::Bucket, target: &CudaTarget) -> Result<EmittedPlan> {
    let lowered = crate::pipeline::run_pipeline_for(graph, bucket, LAYOUT_POLICY)?;
    let place = placement(&lowered)?;
    let module = emit_program(&lowered.program, &place, target)?;
    let spec = plan_skeleton(&lowered.program, &place, &module, weight_entries(graph))?;
    Ok(EmittedPlan { lowered, place, module, spec })
}

/// Compiles a bucket the middle end has lowered into a serializable GPU plan for `target`
/// (NVRTC PTX, plus a cubin where ptxas is installed). Needs NVRTC, not a GPU.
pub fn compile_lowered(graph: &Graph, lowered: &crate::pipeline::Lowered, target: &CudaTarget) -> Result<CompiledCuda> {
    nvrtc::require_nvrtc()?;
    compile_to_plan(&lowered.program, &placement(lowered)?, target, weight_entries(graph))
}

/// Lowers `graph` for `bucket` all the way to a serializable GPU plan for `target`: the
/// middle end, then [`compile_lowered`]. This is also how GPU plans are compiled ahead of time
/// on a build machine.
pub fn compile_graph(graph: &Graph, bucket: kiln_runtime::Bucket, target: &CudaTarget) -> Result<CompiledCuda> {
    compile_lowered(graph, &crate::pipeline::run_pipeline_for(graph, bucket, LAYOUT_POLICY)?, target)
}
