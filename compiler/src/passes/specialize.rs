//! `specialize`: resolves the symbolic `batch` and `seq` dims to a bucket's sizes, so every
//! later stage sees concrete shapes only. The graph is first validated for the bucket, so a
//! bucket that does not fit the graph (e.g. `seq` past the position table) is a typed error
//! naming the node.

use crate::ir::GraphExt as _;
use kiln_runtime::graph::{Dim, Graph, Op};
use kiln_runtime::Result;

use super::{Pass, PassCtx, Rewriter};

pub struct Specialize;

impl Pass for Specialize {
    fn name(&self) -> &'static str {
        "specialize"
    }

    fn run(&self, graph: &Graph, ctx: &mut PassCtx) -> Result<Graph> {
        let b = ctx.bucket;
        graph.validate(Some(b))?;
        let fix = |s: &[Dim]| -> Vec<Dim> { s.iter().map(|d| Dim::Fixed(d.resolve(b))).collect() };
        let mut rw = Rewriter::new(graph);
        for spec in &mut rw.new.inputs {
            spec.shape = fix(&spec.shape);
        }
        for (i, n) in graph.nodes.iter().enumerate() {
            let op = match &n.op {
                Op::Slice { axis, start, end } => Op::Slice { axis: *axis, start: *start, end: Dim::Fixed(end.resolve(b)) },
                op => op.clone(),
            };
            let inputs = n.inputs.iter().map(|&v| rw.get(v)).collect();
            let v = rw.push(&n.name, op, inputs, &fix(&n.shape))?;
            rw.set(i, v);
        }
        Ok(rw.finish())
    }
}
