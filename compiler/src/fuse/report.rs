//! What fusion did, for `kiln compile --report` and the goldens.

use std::collections::BTreeMap;
use std::fmt;

use kiln_runtime::graph::{Graph, Op};
use serde::{Deserialize, Serialize};

use super::{class, Class};
use crate::kernel_ir::*;

/// Ops before fusion and kernels after, by kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FusionReport {
    /// Compute and layout nodes of the graph (inputs, weights and constants not counted).
    pub ops: usize,
    pub ops_by_kind: BTreeMap<String, usize>,
    pub kernels: usize,
    pub kernels_by_kind: BTreeMap<String, usize>,
}

/// A short, stable name of an op kind for reports.
pub fn op_kind(op: &Op) -> &'static str {
    match op {
        Op::Input { .. } => "input",
        Op::Weight { .. } => "weight",
        Op::Constant { .. } => "constant",
        Op::MatMul { .. } => "matmul",
        Op::Binary(_) => "binary",
        Op::Unary(_) => "unary",
        Op::Softmax { .. } => "softmax",
        Op::LayerNorm { .. } => "layer_norm",
        Op::RmsNorm { .. } => "rms_norm",
        Op::Reshape => "reshape",
        Op::Transpose { .. } => "transpose",
        Op::Gather => "gather",
        Op::Concat { .. } => "concat",
        Op::Slice { .. } => "slice",
        Op::Reduce { .. } => "reduce",
        Op::Where => "where",
        Op::Cast { .. } => "cast",
        Op::Precompiled { .. } => "precompiled",
    }
}

/// Counts the compute/layout ops of a graph by kind.
pub fn count_ops(graph: &Graph) -> (usize, BTreeMap<String, usize>) {
    let mut m = BTreeMap::new();
    let mut n = 0;
    for node in &graph.nodes {
        if class(&node.op) == Class::Leaf {
            continue;
        }
        n += 1;
        *m.entry(op_kind(&node.op).to_string()).or_insert(0) += 1;
    }
    (n, m)
}

impl FusionReport {
    pub fn new(graph: &Graph, program: &KernelProgram) -> Self {
        let (ops, ops_by_kind) = count_ops(graph);
        FusionReport {
            ops,
            ops_by_kind,
            kernels: program.kernels.len(),
            kernels_by_kind: program.kernels_by_kind().into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        }
    }
}

fn fmt_counts(m: &BTreeMap<String, usize>) -> String {
    m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
}

impl fmt::Display for FusionReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "ops before: {} ({})", self.ops, fmt_counts(&self.ops_by_kind))?;
        write!(f, "kernels after: {} ({})", self.kernels, fmt_counts(&self.kernels_by_kind))
    }
}
