//! The target ISA and turning one Cranelift function into position-independent bytes.
//!
//! Each kernel is compiled on its own with `Context::compile` into raw machine code. Constants
//! live in the function's own constant pool (RIP-relative, inside the bytes); helpers are
//! reached only through the kernel table passed at entry. So a function needs no relocation,
//! and any relocation Cranelift reports (a libcall for an instruction the target lacks, say) is
//! refused with `Error::Backend`. Functions are concatenated 16-byte aligned into one buffer.

use std::sync::Arc;

use cranelift_codegen::ir::Function;
use cranelift_codegen::isa::{self, OwnedTargetIsa, TargetIsa};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_codegen::Context;
use kiln_runtime::{Error, Result};

/// x86 features (by their `is_x86_feature_detected!` names) with the Cranelift flags enabling
/// them: from the one table, `kiln_runtime::cpu::X86_FEATURES`.
fn feature_flags() -> impl Iterator<Item = (&'static str, &'static str)> {
    kiln_runtime::cpu::X86_FEATURES.iter().filter_map(|f| Some((f.name, f.cranelift_flag?)))
}

/// What machine the code is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuTarget {
    /// This machine, every feature it has (JIT).
    Host,
    /// x86-64 with exactly these features (ahead of time), e.g. `["sse4.1", "avx", "avx2", "fma"]`.
    X86_64 { features: Vec<String> },
}

impl CpuTarget {
    /// The portable AVX2 target kiln's kernels are tuned for (Haswell and later, Zen).
    pub fn x86_64_v3() -> Self {
        let f = ["sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx", "avx2", "fma", "bmi1", "bmi2", "lzcnt"];
        CpuTarget::X86_64 { features: f.iter().map(|s| s.to_string()).collect() }
    }
}

/// A built ISA and the runtime feature names the code may use.
#[derive(Clone)]
pub struct CodegenIsa {
    pub isa: Arc<dyn TargetIsa>,
    pub features: Vec<String>,
    pub has_fma: bool,
}

impl std::fmt::Debug for CodegenIsa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodegenIsa").field("features", &self.features).finish()
    }
}

fn berr(m: impl std::fmt::Display) -> Error {
    Error::internal("cranelift", m.to_string())
}

/// Builds the ISA for `target`.
pub fn build_isa(target: &CpuTarget) -> Result<CodegenIsa> {
    if !cfg!(target_arch = "x86_64") && *target == CpuTarget::Host {
        return Err(Error::Unsupported("the CPU backend generates x86-64 code; this host is not x86-64".into()));
    }
    let mut shared = settings::builder();
    shared.set("opt_level", "speed").map_err(berr)?;
    shared.set("enable_verifier", if cfg!(debug_assertions) { "true" } else { "false" }).map_err(berr)?;
    let mut builder = match target {
        CpuTarget::Host => cranelift_native::builder().map_err(berr)?,
        CpuTarget::X86_64 { features } => {
            let mut b = isa::lookup_by_name("x86_64").map_err(|e| berr(format!("no x86-64 backend: {e:?}")))?;
            for f in features {
                let flag = feature_flags()
                    .find(|(n, _)| n == f)
                    .ok_or_else(|| Error::Unsupported(format!("unknown x86 feature `{f}`")))?
                    .1;
                b.enable(flag).map_err(berr)?;
            }
            b
        }
    };
    let _ = &mut builder;
    let isa: OwnedTargetIsa = builder.finish(settings::Flags::new(shared)).map_err(berr)?;
    // Read back what the ISA has enabled: that is what the code may use.
    let enabled: Vec<String> = isa
        .isa_flags()
        .iter()
        .filter(|v| v.as_bool() == Some(true))
        .map(|v| v.name.to_string())
        .collect();
    let features: Vec<String> = feature_flags()
        .filter(|(_, flag)| enabled.iter().any(|e| e == flag))
        .map(|(n, _)| n.to_string())
        .collect();
    let has_fma = features.iter().any(|f| f == "fma");
    Ok(CodegenIsa { isa, features, has_fma })
}

/// Compiles one function into raw bytes; refuses relocations.
pub fn compile_function(isa: &CodegenIsa, func: Function, ctx: &mut Context) -> Result<Vec<u8>> {
    ctx.clear();
    let name = func.name.to_string();
    ctx.func = func;
    let code = ctx
        .compile(&*isa.isa, &mut Default::default())
        .map_err(|e| Error::internal("cranelift", format!("cranelift could not compile kernel {name}: {:?}", e.inner)))?;
    if let Some(r) = code.buffer.relocs().first() {
        return Err(Error::internal("cranelift", format!(
            "kernel {name}: generated code needs a relocation ({:?} to {:?} at offset {}); CPU plans must be \
             position-independent (does the target lack an instruction, e.g. SSE4.1 rounding or FMA?)",
            r.kind, r.target, r.offset
        )));
    }
    Ok(code.code_buffer().to_vec())
}

/// Appends `bytes` to `code` at a 16-byte boundary (padding with `int3`); returns the offset.
pub fn append_aligned(code: &mut Vec<u8>, bytes: &[u8]) -> u32 {
    while !code.len().is_multiple_of(16) {
        code.push(0xCC);
    }
    let at = code.len() as u32;
    code.extend_from_slice(bytes);
    at
}
