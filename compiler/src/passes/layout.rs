//! `layout`: layout decisions that pay for themselves, recorded for the backends rather than
//! done per run. A rank-2 weight whose every use is the B operand of a MatMul with
//! `transpose_b` (a PyTorch `nn.Linear` weight `[out, in]`) is marked
//! [`WeightLayout::Transposed`]: the backend stores it once as `[in, out]` row-major (and may
//! pack it further) when it lowers the plan, so every GEMM reads B without a transpose. The
//! graph itself is unchanged; the decision lives in `PassCtx::layouts` and reaches the kernel
//! IR as the weight buffer's layout.

use std::fmt::Write;

use kiln_runtime::graph::{Graph, Op};
use kiln_runtime::Result;

use super::{Pass, PassCtx};
use crate::kernel_ir::WeightLayout;

pub struct LayoutPass;

/// How a target wants its weights stored: the middle end's one knob for the target, so that no
/// code generator undoes another target's layout decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LayoutPolicy {
    /// A linear layer's weight (every use the B operand of a `transpose_b` MatMul) is stored
    /// transposed, `[in, out]`: the CPU's GEMM packs B from `[k, n]` rows.
    #[default]
    TransposeLinearWeights,
    /// Every weight stays in its checkpoint layout: the GPU kernels read any layout through
    /// strides, and weights are uploaded as they are.
    Checkpoint,
}

impl LayoutPolicy {
    /// Whether this target may join weights into new tensors at preparation time (the merged
    /// weight of sibling GEMMs): the CPU prepares every weight per plan anyway; the GPU uploads
    /// checkpoint tensors as they are.
    pub fn merges_sibling_weights(self) -> bool {
        self == LayoutPolicy::TransposeLinearWeights
    }

    /// Whether this target's gather kernel reads its rows from several tables in turn (a
    /// concat of rows folded into the gather that reads it): the CPU's does; the GPU's reads
    /// one. (The one per-target switch the middle-end has is this policy, hence here.)
    pub fn gathers_from_several_tables(self) -> bool {
        self == LayoutPolicy::TransposeLinearWeights
    }
}

/// The layout decision for every weight-table entry of `graph` under `policy`.
pub fn decide_layouts(graph: &Graph, policy: LayoutPolicy) -> Vec<WeightLayout> {
    if policy == LayoutPolicy::Checkpoint {
        return vec![WeightLayout::AsIs; graph.weights.len()];
    }
    let mut all_tb = vec![true; graph.weights.len()];
    let mut used = vec![false; graph.weights.len()];
    let weight_of = |v: kiln_runtime::ValueId| match graph.node(v).op {
        Op::Weight { index } => Some(index),
        _ => None,
    };
    for n in &graph.nodes {
        for (k, &inp) in n.inputs.iter().enumerate() {
            if let Some(w) = weight_of(inp) {
                used[w] = true;
                let ok = matches!(n.op, Op::MatMul { transpose_b: true, .. }) && k == 1;
                all_tb[w] &= ok;
            }
        }
    }
    for o in &graph.outputs {
        if let Some(w) = weight_of(*o) {
            all_tb[w] = false;
        }
    }
    graph
        .weights
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            if used[i] && all_tb[i] && spec.shape.len() == 2 {
                WeightLayout::Transposed
            } else {
                WeightLayout::AsIs
            }
        })
        .collect()
}

impl Pass for LayoutPass {
    fn name(&self) -> &'static str {
        "layout"
    }

    fn run(&self, graph: &Graph, ctx: &mut PassCtx) -> Result<Graph> {
        ctx.layouts = decide_layouts(graph, ctx.layout_policy);
        Ok(graph.clone())
    }

    fn dump_extra(&self, graph: &Graph, ctx: &PassCtx) -> String {
        let mut s = String::new();
        for (i, l) in ctx.layouts.iter().enumerate() {
            if *l == WeightLayout::Transposed {
                let _ = writeln!(s, "layout weight#{i} \"{}\": transposed (pre-transposed at lowering)", graph.weights[i].name);
            }
        }
        s
    }
}
