//! `dce`: drops every node that no graph output depends on. The input list and the weight
//! table keep their entries (their indices are part of the graph's interface).

use kiln_runtime::graph::Graph;
use kiln_runtime::Result;

use super::{Pass, PassCtx, Rewriter};

pub struct Dce;

/// Which nodes some output depends on.
pub fn live_nodes(graph: &Graph) -> Vec<bool> {
    let mut live = vec![false; graph.nodes.len()];
    for o in &graph.outputs {
        live[o.index()] = true;
    }
    for i in (0..graph.nodes.len()).rev() {
        if live[i] {
            for v in &graph.nodes[i].inputs {
                live[v.index()] = true;
            }
        }
    }
    live
}

impl Pass for Dce {
    fn name(&self) -> &'static str {
        "dce"
    }

    fn run(&self, graph: &Graph, _ctx: &mut PassCtx) -> Result<Graph> {
        let live = live_nodes(graph);
        let mut rw = Rewriter::new(graph);
        for (i, &l) in live.iter().enumerate() {
            if l {
                rw.copy(i)?;
            }
        }
        Ok(rw.finish())
    }
}
