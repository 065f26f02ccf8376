//! `const_fold`: a node whose inputs are all constants becomes a constant, evaluated by the
//! reference interpreter (the numeric oracle, so folding cannot change semantics). Only f32
//! results of at most [`MAX_FOLD_ELEMENTS`] elements are folded: a large folded tensor would
//! cost more to embed than to compute.

use crate::ir::GraphExt as _;
use kiln_runtime::graph::{Dim, Graph, Op};
use kiln_runtime::{DType, Result};

use super::{Pass, PassCtx, Rewriter};
use crate::reference;

pub struct ConstFold;

/// Largest result (in elements) the pass folds.
pub const MAX_FOLD_ELEMENTS: usize = 1 << 16;

impl Pass for ConstFold {
    fn name(&self) -> &'static str {
        "const_fold"
    }

    fn run(&self, graph: &Graph, ctx: &mut PassCtx) -> Result<Graph> {
        let mut rw = Rewriter::new(graph);
        for (i, n) in graph.nodes.iter().enumerate() {
            let foldable = !n.inputs.is_empty()
                && n.dtype == DType::F32
                && n.inputs.iter().all(|&v| matches!(rw.new.node(rw.get(v)).op, Op::Constant { .. }));
            let numel = n.shape.iter().map(|d| d.resolve(ctx.bucket)).product::<usize>();
            if foldable && numel <= MAX_FOLD_ELEMENTS {
                // A one-node graph over the constant operands, run by the reference interpreter.
                let mut mini = Graph::default();
                let mut args = Vec::new();
                for &v in &n.inputs {
                    let c = rw.new.node(rw.get(v));
                    args.push(mini.push_shaped(c.name.clone(), c.op.clone(), vec![], Some(c.shape.clone()))?);
                }
                let out = mini.push_shaped(n.name.clone(), n.op.clone(), args, Some(n.shape.clone()))?;
                mini.outputs.push(out);
                mini.output_names.push("folded".into());
                // An error here is the model's (the same op would fail at run time): reported,
                // not hidden by leaving the node unfolded.
                let mut r = reference::interpret(&mini, &[], &[], ctx.bucket)?;
                if let Some(vals) = r.pop().and_then(|t| t.as_f32().map(|s| s.to_vec())) {
                    let shape: Vec<Dim> = n.shape.iter().map(|d| Dim::Fixed(d.resolve(ctx.bucket))).collect();
                    let v = rw.push(&n.name, Op::Constant { values: vals }, vec![], &shape)?;
                    rw.set(i, v);
                    continue;
                }
            }
            rw.copy(i)?;
        }
        Ok(rw.finish())
    }
}
