//! Graph-to-graph passes of the middle-end, one file each, run in a fixed order by the
//! pipeline. Every pass takes a valid graph and returns a valid graph (the pipeline
//! validates after each one in debug builds).
//!
//! | pass | does |
//! |---|---|
//! | `specialize` | resolves `batch`/`seq` to the bucket: every dim becomes `Fixed` |
//! | `const_fold` | evaluates nodes whose inputs are all constants (small results only) |
//! | `simplify` | algebra: reshape/transpose chains collapse, identity reshapes/transposes/casts go, `x*1`, `x+0`, `x-0`, `x/1`, `--x` go, a last-two-dims transpose feeding a MatMul becomes its transpose flag |
//! | `cse` | merges nodes with the same op, inputs and type |
//! | `norms` | LayerNorm / RMSNorm written out as means and elementwise ops become the norm op |
//! | `activations` | GELU written out (`x·½·(1 + erf(x/√2))`, or its tanh form) becomes the `gelu` (`gelutanh`) op |
//! | `dce` | drops nodes no output depends on |
//! | `layout` | decides weight layouts under the target's `LayoutPolicy` (see `kernel_ir::WeightLayout`) |

pub mod activations;
pub mod const_fold;
pub mod cse;
pub mod dce;
pub mod layout;
pub mod norms;
pub mod simplify;
pub mod specialize;

use crate::ir::GraphExt as _;
use kiln_runtime::graph::{Bucket, Dim, Graph, Op, ValueId};
use kiln_runtime::Result;

use crate::kernel_ir::WeightLayout;
pub use layout::LayoutPolicy;

/// What passes share besides the graph.
#[derive(Debug, Clone)]
pub struct PassCtx {
    pub bucket: Bucket,
    /// The target's wish for weight layouts (read by the `layout` pass).
    pub layout_policy: LayoutPolicy,
    /// One entry per weight-table entry; filled by the `layout` pass.
    pub layouts: Vec<WeightLayout>,
}

impl PassCtx {
    pub fn new(graph: &Graph, bucket: Bucket, layout_policy: LayoutPolicy) -> Self {
        PassCtx { bucket, layout_policy, layouts: vec![WeightLayout::AsIs; graph.weights.len()] }
    }
}

/// One graph transformation.
pub trait Pass {
    /// The name used by `KILN_DUMP` and `--dump-after`.
    fn name(&self) -> &'static str;
    fn run(&self, graph: &Graph, ctx: &mut PassCtx) -> Result<Graph>;
    /// Extra lines for the IR dump after this pass (e.g. decisions that are not in the graph).
    fn dump_extra(&self, _graph: &Graph, _ctx: &PassCtx) -> String {
        String::new()
    }
}

/// The passes in the order the pipeline runs them.
pub fn standard_passes() -> Vec<Box<dyn Pass>> {
    vec![
        Box::new(specialize::Specialize),
        Box::new(const_fold::ConstFold),
        Box::new(simplify::Simplify),
        Box::new(cse::Cse),
        Box::new(norms::Norms),
        Box::new(activations::Activations),
        Box::new(dce::Dce),
        Box::new(layout::LayoutPass),
    ]
}

/// Builds a new graph from an old one node by node, keeping a map old value → new value.
/// Inputs and the weight table are kept as they are (indices stay valid).
pub struct Rewriter<'a> {
    pub old: &'a Graph,
    pub new: Graph,
    map: Vec<Option<ValueId>>,
}

impl<'a> Rewriter<'a> {
    pub fn new(old: &'a Graph) -> Self {
        let new = Graph {
            nodes: Vec::with_capacity(old.nodes.len()),
            inputs: old.inputs.clone(),
            weights: old.weights.clone(),
            outputs: Vec::new(),
            output_names: Vec::new(),
        };
        Rewriter { old, new, map: vec![None; old.nodes.len()] }
    }

    /// The new value of old value `v` (which must have been handled already).
    pub fn get(&self, v: ValueId) -> ValueId {
        self.map[v.index()].expect("rewriter: value used before it was defined")
    }

    pub fn set(&mut self, old: usize, new: ValueId) {
        self.map[old] = Some(new);
    }

    /// Appends a node to the new graph (shape inferred; `shape` is the recorded one for ops
    /// that need it: Reshape, Constant).
    pub fn push(&mut self, name: &str, op: Op, inputs: Vec<ValueId>, shape: &[Dim]) -> Result<ValueId> {
        self.new.push_shaped(name.to_string(), op, inputs, Some(shape.to_vec()))
    }

    /// Copies old node `i` with its inputs mapped, and maps it.
    pub fn copy(&mut self, i: usize) -> Result<ValueId> {
        let n = &self.old.nodes[i];
        let inputs = n.inputs.iter().map(|&v| self.get(v)).collect();
        let v = self.push(&n.name.clone(), n.op.clone(), inputs, &n.shape.clone())?;
        self.set(i, v);
        Ok(v)
    }

    /// The new graph with the old outputs mapped.
    pub fn finish(mut self) -> Graph {
        self.new.outputs = self.old.outputs.iter().map(|&o| self.map[o.index()].expect("output defined")).collect();
        self.new.output_names = self.old.output_names.clone();
        self.new
    }
}

/// Concrete dims of a fully specialized shape, or `None` if a dim is symbolic.
pub fn fixed_shape(s: &[Dim]) -> Option<Vec<usize>> {
    s.iter().map(|d| d.fixed()).collect()
}

/// The scalar value of a constant node with one element.
pub fn scalar_const(g: &Graph, v: ValueId) -> Option<f32> {
    match &g.node(v).op {
        Op::Constant { values } if values.len() == 1 => Some(values[0]),
        _ => None,
    }
}

/// How many times each node is read, a graph output counting as one read.
pub fn use_counts(graph: &Graph) -> Vec<usize> {
    let mut uses = vec![0usize; graph.nodes.len()];
    for n in &graph.nodes {
        for i in &n.inputs {
            uses[i.index()] += 1;
        }
    }
    for o in &graph.outputs {
        uses[o.index()] += 1;
    }
    uses
}

/// The single value of a constant node whose elements are all equal.
pub fn splat_const(g: &Graph, v: ValueId) -> Option<f32> {
    match &g.node(v).op {
        Op::Constant { values } if !values.is_empty() && values.iter().all(|x| x.to_bits() == values[0].to_bits()) => {
            Some(values[0])
        }
        _ => None,
    }
}
