//! `cse`: common-subexpression elimination. Two nodes with the same op (attributes and
//! constant bits included), the same (already merged) inputs and the same type compute the
//! same value; the later one is replaced by the earlier one.

use std::collections::HashMap;

use kiln_runtime::graph::{Graph, Op, ValueId};
use kiln_runtime::Result;

use super::{Pass, PassCtx, Rewriter};

pub struct Cse;

/// A hashable identity of a node: op (floats by bits), inputs, dtype, shape.
fn key(op: &Op, inputs: &[ValueId], n: &kiln_runtime::Node) -> String {
    let op_key = match op {
        Op::Constant { values } => {
            let bits: Vec<u32> = values.iter().map(|v| v.to_bits()).collect();
            format!("const{bits:?}")
        }
        Op::LayerNorm { eps } => format!("ln{}", eps.to_bits()),
        Op::RmsNorm { eps } => format!("rms{}", eps.to_bits()),
        other => format!("{other:?}"),
    };
    format!("{op_key}|{inputs:?}|{}|{:?}", n.dtype, n.shape)
}

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }

    fn run(&self, graph: &Graph, _ctx: &mut PassCtx) -> Result<Graph> {
        let mut rw = Rewriter::new(graph);
        let mut seen: HashMap<String, ValueId> = HashMap::new();
        for (i, n) in graph.nodes.iter().enumerate() {
            let inputs: Vec<ValueId> = n.inputs.iter().map(|&v| rw.get(v)).collect();
            let k = key(&n.op, &inputs, n);
            if let Some(&v) = seen.get(&k) {
                rw.set(i, v);
                continue;
            }
            let v = rw.copy(i)?;
            seen.insert(k, v);
        }
        Ok(rw.finish())
    }
}
