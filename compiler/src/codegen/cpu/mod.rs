//! The CPU code generator: a fused, memory-planned [`KernelProgram`] → x86-64 machine code
//! with Cranelift → a [`CpuPlanImage`] (plain data the runtime verifies, maps and runs).
//!
//! One Cranelift function per kernel, with the kernel ABI of `kiln_runtime::cpu`
//! (`(arena, weights, table, task, n_tasks) -> status`):
//! - elementwise, copy, concat ([`elementwise`]), layer/RMS norm ([`norm`]), softmax
//!   ([`softmax`]), reduce ([`reduce`]), gather ([`gather`]): loop nests over the bucket's static
//!   shapes, `f32x4` with scalar remainders, transcendental functions inline ([`math`]), the
//!   outermost dim split across `n_tasks` (the runtime runs the tasks on its pool);
//! - GEMM ([`gemm`]) and attention ([`attention`]): calls through the kernel table into the
//!   AVX2/FMA microkernels, weights pre-packed once, epilogues fused into the microkernel.
//!
//! Buffers live where [`layout::Layout`] puts them. Every function is compiled to raw bytes on
//! its own ([`module`]), relocations refused, and the bytes concatenated 16-byte aligned.

pub mod attention;
pub mod elementwise;
pub mod emit;
pub mod expr;
pub mod gather;
pub mod gemm;
pub mod layout;
pub mod math;
pub mod module;
pub mod norm;
pub mod reduce;
pub mod rows;
pub mod rowmax;
pub mod softmax;
pub mod table_rows;
pub mod taps;

use std::time::Instant;

use cranelift_codegen::ir::{Function, UserFuncName};
use cranelift_codegen::Context;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use kiln_runtime::cpu::{CpuPlanImage, CpuStep};
use kiln_runtime::{Error, Result};

use crate::kernel_ir::{Kernel, KernelOp, KernelProgram};
use crate::pipeline::Lowered;
use emit::{kernel_signature, Env, Fx};
pub use layout::Layout;

/// Linear layers' weights stored transposed, `[in, out]`: the GEMM packs B from `[k, n]` rows.
pub const LAYOUT_POLICY: crate::passes::LayoutPolicy = crate::passes::LayoutPolicy::TransposeLinearWeights;
pub use module::{build_isa, CpuTarget, CodegenIsa};

/// How to generate code.
#[derive(Debug, Clone)]
pub struct CodegenOptions {
    pub target: CpuTarget,
    /// Threads the plan will run on: elementwise/norm kernels are split into at most this many
    /// tasks, and GEMM/attention scratch is sized for this many workers.
    pub threads: usize,
    /// Keep each kernel's Cranelift IR text (for goldens and `--dump-clif`).
    pub keep_clif: bool,
}

impl Default for CodegenOptions {
    fn default() -> Self {
        CodegenOptions { target: CpuTarget::Host, threads: 1, keep_clif: false }
    }
}

/// A compiled program.
#[derive(Debug, Clone)]
pub struct CompiledProgram {
    pub image: CpuPlanImage,
    /// `(kernel name, CLIF text)` per kernel when [`CodegenOptions::keep_clif`].
    pub clif: Vec<(String, String)>,
    /// Milliseconds spent building and compiling the functions.
    pub codegen_ms: f64,
}

/// Emits the CLIF function of kernel `ki`; returns it and the task count.
fn build_kernel(env: &Env, isa: &CodegenIsa, ki: usize, k: &Kernel, fctx: &mut FunctionBuilderContext) -> (Function, u32, usize) {
    let mut func = Function::with_name_signature(UserFuncName::user(0, ki as u32), kernel_signature());
    let b = FunctionBuilder::new(&mut func, fctx);
    let mut fx = Fx::new(b, env);
    let tasks = match &k.op {
        KernelOp::Elementwise { expr } => elementwise::emit_elementwise(&mut fx, k, expr),
        KernelOp::Gemm { batch, m, n, k: kk, alpha, epilogue, .. } => {
            gemm::emit_gemm(&mut fx, ki, k, batch, *m, *n, *kk, *alpha, epilogue.as_ref())
        }
        KernelOp::Norm { kind, eps, prologue, gamma, beta } => norm::emit_norm(&mut fx, k, *kind, *eps, prologue, *gamma, *beta),
        KernelOp::Softmax { prologue } => softmax::emit_softmax(&mut fx, k, prologue),
        KernelOp::Attention { batch, seq_q, seq_kv, head_dim, v_dim, scale, mask, zero_nan_rows } => {
            attention::emit_attention(&mut fx, k, batch, *seq_q, *seq_kv, *head_dim, *v_dim, *scale, *mask, *zero_nan_rows)
        }
        KernelOp::Gather => gather::emit_gather(&mut fx, k),
        KernelOp::Reduce { op, shape, reduced_dims, prologue } => {
            reduce::emit_reduce(&mut fx, k, *op, shape, *reduced_dims, prologue)
        }
        KernelOp::Concat { axis } => elementwise::emit_concat(&mut fx, k, *axis),
    };
    let scratch = fx.scratch_used;
    fx.finish(isa.isa.frontend_config());
    (func, tasks, scratch)
}

/// Compiles a lowered program (the pipeline's output for one bucket) into a CPU plan image.
pub fn compile_program(lowered: &Lowered, opts: &CodegenOptions) -> Result<CompiledProgram> {
    let t0 = Instant::now();
    let isa = build_isa(&opts.target)?;
    compile_with_isa(lowered, opts, &isa).map(|mut c| {
        c.codegen_ms = t0.elapsed().as_secs_f64() * 1e3;
        c
    })
}

/// [`compile_program`] with an ISA built once by the caller.
pub fn compile_with_isa(lowered: &Lowered, opts: &CodegenOptions, isa: &CodegenIsa) -> Result<CompiledProgram> {
    let t0 = Instant::now();
    let program: &KernelProgram = &lowered.program;
    program.validate()?;
    let layout = Layout::new(lowered)?;
    let threads = opts.threads.max(1);
    let env = Env { program, layout: &layout, fma: isa.has_fma, threads };
    let mut fctx = FunctionBuilderContext::new();
    let mut ctx = Context::new();
    let mut code = Vec::new();
    let mut steps = Vec::new();
    let mut clif = Vec::new();
    let mut scratch = 0usize;
    for (ki, k) in program.kernels.iter().enumerate() {
        let (func, tasks, used) = build_kernel(&env, isa, ki, k, &mut fctx);
        scratch = scratch.max(used);
        if opts.keep_clif {
            clif.push((k.name.clone(), func.display().to_string()));
        }
        let bytes = module::compile_function(isa, func, &mut ctx)
            .map_err(|e| Error::internal("cranelift", format!("kernel k{ki} `{}` ({}): {e}", k.name, k.op.kind_name())))?;
        let entry = module::append_aligned(&mut code, &bytes);
        steps.push(CpuStep { name: k.name.clone(), entry, tasks: tasks.max(1) });
    }
    if code.is_empty() {
        // A program with no kernels still needs valid code for the image.
        code.push(0xC3);
    }
    let arena_bytes = layout.scratch_offset + scratch.div_ceil(64) * 64;
    let image = CpuPlanImage {
        bucket: lowered.bucket,
        code,
        steps,
        arena_bytes,
        inputs: layout.inputs.clone(),
        outputs: layout.outputs.clone(),
        required_features: isa.features.clone(),
        arena_init: layout.arena_init.clone(),
        weights: layout.slots.clone(),
        kernel_abi: kiln_kernels::table::KERNEL_ABI_VERSION,
        scratch_threads: threads as u32,
    };
    Ok(CompiledProgram { image, clif, codegen_ms: t0.elapsed().as_secs_f64() * 1e3 })
}
