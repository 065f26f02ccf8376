//! The middle-end pipeline: graph passes, fusion, memory planning, for one bucket.
//!
//! ```text
//! Graph ─specialize─const_fold─simplify─cse─dce─layout─► Graph (concrete shapes) + layouts
//!       ─fuse─► KernelProgram ─memory_plan─► MemoryPlan
//! ```
//! `KILN_DUMP=pass[,pass..]` (or `all`) prints the IR after those stages to stderr;
//! [`dump_after`] returns the same text (`kiln compile --dump-after PASS`).

use crate::ir::GraphExt as _;
use std::collections::BTreeMap;
use std::fmt;

use kiln_runtime::graph::{Bucket, Graph};
use kiln_runtime::{Error, Result};
use serde::{Deserialize, Serialize};

use crate::fuse::{count_ops, fold_gather_tables, fuse, merge_siblings, FusionReport};
use crate::kernel_ir::{KernelProgram, WeightLayout};
use crate::memory_plan::{plan_memory, MemoryPlan};
use crate::passes::{standard_passes, LayoutPolicy, PassCtx};

/// Every stage name [`dump_after`] and `KILN_DUMP` accept, in pipeline order.
pub const STAGES: &[&str] = &["specialize", "const_fold", "simplify", "cse", "norms", "activations", "dce", "layout", "fuse", "memory_plan"];

/// Everything the middle-end produces for one bucket: what a backend lowers from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lowered {
    pub bucket: Bucket,
    /// The graph after the passes (every dim `Fixed`).
    pub graph: Graph,
    /// Layout decision per weight-table entry (also recorded in the program's weight buffers).
    pub layouts: Vec<WeightLayout>,
    pub program: KernelProgram,
    pub plan: MemoryPlan,
    pub fusion: FusionReport,
}

/// Whether a `KILN_DUMP` value (`pass[,pass..]` or `all`) asks for `stage`.
pub fn dump_spec_matches(spec: &str, stage: &str) -> bool {
    spec.split(',').map(str::trim).any(|s| s == stage || s == "all")
}

fn dump_requested(stage: &str) -> bool {
    std::env::var("KILN_DUMP").is_ok_and(|v| dump_spec_matches(&v, stage))
}

/// The most bytes one tensor of a bucket may take (2⁴⁶, 64 TiB): a larger bucket is refused
/// before any pass runs, which keeps every later size and offset sum far from overflow.
pub const MAX_TENSOR_BYTES: u64 = 1 << 46;

/// Refuses a bucket in which some tensor of `graph` would exceed [`MAX_TENSOR_BYTES`].
pub fn check_bucket_sizes(graph: &Graph, bucket: Bucket) -> Result<()> {
    for n in &graph.nodes {
        let bytes = n.shape.iter().try_fold(n.dtype.size() as u64, |acc, d| acc.checked_mul(d.resolve(bucket) as u64));
        if bytes.is_none_or(|b| b > MAX_TENSOR_BYTES) {
            let dims: Vec<usize> = n.shape.iter().map(|d| d.resolve(bucket)).collect();
            return Err(Error::Unsupported(format!(
                "bucket {bucket}: tensor `{}` {dims:?} would take more than {MAX_TENSOR_BYTES} bytes",
                n.name
            )));
        }
    }
    Ok(())
}

fn run_with(
    graph: &Graph,
    bucket: Bucket,
    policy: LayoutPolicy,
    hook: &mut dyn FnMut(&str, &dyn Fn() -> String),
) -> Result<Lowered> {
    check_bucket_sizes(graph, bucket)?;
    let mut ctx = PassCtx::new(graph, bucket, policy);
    let mut g = graph.clone();
    for pass in standard_passes() {
        g = pass.run(&g, &mut ctx)?;
        if cfg!(debug_assertions) {
            g.validate(Some(bucket))?;
        }
        hook(pass.name(), &|| format!("{}{}", g.print(), pass.dump_extra(&g, &ctx)));
    }
    let mut program = fuse(&g, bucket, &ctx.layouts)?;
    if ctx.layout_policy.merges_sibling_weights() {
        merge_siblings(&mut program)?;
    }
    if ctx.layout_policy.gathers_from_several_tables() {
        fold_gather_tables(&mut program)?;
    }
    hook("fuse", &|| program.print());
    let plan = plan_memory(&program)?;
    hook("memory_plan", &|| plan.print(&program));
    let fusion = FusionReport::new(&g, &program);
    Ok(Lowered { bucket, graph: g, layouts: ctx.layouts, program, plan, fusion })
}

/// Runs the whole middle-end for `bucket` under the default layout policy (the CPU's: what
/// reports, dumps and goldens show). Honors `KILN_DUMP` (stderr).
pub fn run_pipeline(graph: &Graph, bucket: Bucket) -> Result<Lowered> {
    run_pipeline_for(graph, bucket, LayoutPolicy::default())
}

/// Runs the whole middle-end for `bucket` with a target's layout policy. Honors `KILN_DUMP`.
pub fn run_pipeline_for(graph: &Graph, bucket: Bucket, policy: LayoutPolicy) -> Result<Lowered> {
    run_with(graph, bucket, policy, &mut |stage, text| {
        if dump_requested(stage) {
            eprintln!("===== kiln IR after {stage} (bucket {bucket}) =====\n{}", text());
        }
    })
}

/// The IR text after stage `stage` (one of [`STAGES`]).
pub fn dump_after(graph: &Graph, bucket: Bucket, stage: &str) -> Result<String> {
    if !STAGES.contains(&stage) {
        return Err(Error::Unsupported(format!("unknown pass `{stage}` (passes: {})", STAGES.join(", "))));
    }
    let mut out = None;
    run_with(graph, bucket, LayoutPolicy::default(), &mut |s, text| {
        if s == stage {
            out = Some(text());
        }
    })?;
    Ok(out.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kiln_dump_spec() {
        assert!(dump_spec_matches("fuse", "fuse"));
        assert!(dump_spec_matches("simplify, memory_plan", "memory_plan"));
        assert!(dump_spec_matches("all", "cse"));
        assert!(!dump_spec_matches("simplify", "cse"));
        assert!(!dump_spec_matches("", "cse"));
    }
}

/// What `kiln compile --report` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompileReport {
    pub bucket: Bucket,
    /// Compute and layout nodes of the graph as given (inputs, weights, constants not counted).
    pub ops_before: usize,
    pub ops_before_by_kind: BTreeMap<String, usize>,
    /// The same count after the graph passes.
    pub ops_after_passes: usize,
    pub kernels_after: usize,
    pub kernels_by_kind: BTreeMap<String, usize>,
    pub arena_bytes: usize,
    pub naive_bytes: usize,
    pub lower_bound_bytes: usize,
    /// [`KernelProgram::matmul_flops`](crate::kernel_ir::KernelProgram::matmul_flops) of the plan.
    pub matmul_flops: u128,
    /// The part of `matmul_flops` with integer operands
    /// ([`KernelProgram::integer_matmul_flops`](crate::kernel_ir::KernelProgram::integer_matmul_flops)).
    pub int_matmul_flops: u128,
}

impl CompileReport {
    pub fn ratio(&self) -> f64 {
        if self.lower_bound_bytes == 0 {
            1.0
        } else {
            self.arena_bytes as f64 / self.lower_bound_bytes as f64
        }
    }
}

/// Runs the pipeline and summarizes it.
pub fn compile_report(graph: &Graph, bucket: Bucket) -> Result<CompileReport> {
    let lowered = run_pipeline(graph, bucket)?;
    Ok(report_of(graph, &lowered))
}

/// The report of an already lowered graph (`graph` = the graph given to the pipeline).
pub fn report_of(graph: &Graph, lowered: &Lowered) -> CompileReport {
    let (ops_before, ops_before_by_kind) = count_ops(graph);
    CompileReport {
        bucket: lowered.bucket,
        ops_before,
        ops_before_by_kind,
        ops_after_passes: lowered.fusion.ops,
        kernels_after: lowered.fusion.kernels,
        kernels_by_kind: lowered.fusion.kernels_by_kind.clone(),
        arena_bytes: lowered.plan.arena_bytes,
        naive_bytes: lowered.plan.naive_bytes,
        lower_bound_bytes: lowered.plan.lower_bound_bytes,
        matmul_flops: lowered.program.matmul_flops(),
        int_matmul_flops: lowered.program.integer_matmul_flops(),
    }
}

fn counts(m: &BTreeMap<String, usize>) -> String {
    m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
}

impl fmt::Display for CompileReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "bucket: {}", self.bucket)?;
        writeln!(f, "ops before: {} ({})", self.ops_before, counts(&self.ops_before_by_kind))?;
        writeln!(f, "ops after passes: {}", self.ops_after_passes)?;
        writeln!(f, "kernels after: {} ({})", self.kernels_after, counts(&self.kernels_by_kind))?;
        writeln!(f, "arena bytes: {}", self.arena_bytes)?;
        writeln!(f, "naive bytes: {}", self.naive_bytes)?;
        writeln!(f, "lower bound bytes: {}", self.lower_bound_bytes)?;
        writeln!(f, "arena / lower bound: {:.3}", self.ratio())?;
        write!(f, "matmul flop: {} ({:.3} GFLOP)", self.matmul_flops, self.matmul_flops as f64 / 1e9)
    }
}
