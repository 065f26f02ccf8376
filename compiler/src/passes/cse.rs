//! `cse`: common-subexpression elimination. Two nodes with the same op (attributes and
//! constant bits included), the same (already merged) inputs and the same type compute the
//! same value; the later one is replaced by the earlier one.

use std::collections::HashMap;

use kiln_runtime::graph::{Graph, Op, ValueId};
use kiln_runtime::Result;

use super::{Pass, PassCtx, Rewriter};

pub struct Cse;

/// A node's op as a hashable identity: a constant by its values' bits (hashed as they are: a
/// causal mask or a rotary table has 10^5 values, and formatting them as text made this pass
/// 90% of a Llama export's middle end), any other op by its Debug text (floats there print
/// exactly; the norms' eps by bits all the same).
#[derive(PartialEq, Eq, Hash)]
enum OpKey {
    Constant(Vec<u32>),
    Text(String),
}

/// A hashable identity of a node: op, inputs, dtype, shape.
fn key(op: &Op, inputs: &[ValueId], n: &kiln_runtime::Node) -> (OpKey, Vec<ValueId>, String) {
    let op_key = match op {
        Op::Constant { values } => OpKey::Constant(values.iter().map(|v| v.to_bits()).collect()),
        Op::LayerNorm { eps } => OpKey::Text(format!("ln{}", eps.to_bits())),
        Op::RmsNorm { eps } => OpKey::Text(format!("rms{}", eps.to_bits())),
        other => OpKey::Text(format!("{other:?}")),
    };
    (op_key, inputs.to_vec(), format!("{}|{:?}", n.dtype, n.shape))
}

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }

    fn run(&self, graph: &Graph, _ctx: &mut PassCtx) -> Result<Graph> {
        let mut rw = Rewriter::new(graph);
        let mut seen: HashMap<(OpKey, Vec<ValueId>, String), ValueId> = HashMap::new();
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
