//! A graph's signature — its inputs, outputs and weight table — and its fingerprint: all a
//! runtime needs to build batches, check a checkpoint and run precompiled plans. Artifacts ship
//! the signature, not the graph (no ops for a runtime to misread, nothing of the compiler's IR in
//! the file format).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::dtype::DType;
use crate::graph::{Dim, Graph, InputSpec, Node, Op, ValueId, WeightSpec};

/// One graph output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputSpec {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<Dim>,
}

/// What a graph takes and gives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Signature {
    pub inputs: Vec<InputSpec>,
    pub outputs: Vec<OutputSpec>,
    pub weights: Vec<WeightSpec>,
}

impl Graph {
    /// This graph's signature. The graph must pass [`Graph::check_structure`].
    pub fn signature(&self) -> Signature {
        let outputs = self
            .outputs
            .iter()
            .zip(&self.output_names)
            .map(|(&o, name)| OutputSpec { name: name.clone(), dtype: self.node(o).dtype, shape: self.node(o).shape.clone() })
            .collect();
        Signature { inputs: self.inputs.clone(), outputs, weights: self.weights.clone() }
    }
}

impl Signature {
    /// The interface graph of a precompiled artifact: one node per input, per weight and per
    /// output ([`Op::Precompiled`]), so that the engine and the seed `Backend` trait, which take
    /// a `&Graph`, run precompiled plans with no compiler IR at hand. Its signature is `self`.
    pub fn graph(&self) -> Graph {
        let mut nodes = Vec::new();
        for (index, s) in self.inputs.iter().enumerate() {
            let op = Op::Input { index };
            nodes.push(Node { name: s.name.clone(), op, inputs: vec![], dtype: s.dtype, shape: s.shape.clone() });
        }
        for (index, s) in self.weights.iter().enumerate() {
            let shape = s.shape.iter().map(|&d| Dim::Fixed(d)).collect();
            nodes.push(Node { name: s.name.clone(), op: Op::Weight { index }, inputs: vec![], dtype: s.dtype, shape });
        }
        let mut outputs = Vec::new();
        for (output, s) in self.outputs.iter().enumerate() {
            outputs.push(ValueId(nodes.len() as u32));
            let op = Op::Precompiled { output };
            nodes.push(Node { name: s.name.clone(), op, inputs: vec![], dtype: s.dtype, shape: s.shape.clone() });
        }
        let output_names = self.outputs.iter().map(|o| o.name.clone()).collect();
        Graph { nodes, inputs: self.inputs.clone(), weights: self.weights.clone(), outputs, output_names }
    }
}

/// SHA-256 over the graph (ops, shapes, inputs and outputs with their names) and its weight
/// table (names, dtypes, shapes). Node names are not part of it (renaming a node changes no plan),
/// nor are weight values: the same plan serves fine-tuned checkpoints of the same architecture.
pub fn fingerprint(graph: &Graph) -> [u8; 32] {
    let mut g = graph.clone();
    for n in &mut g.nodes {
        n.name.clear();
    }
    let bytes = bincode::serde::encode_to_vec(&g, bincode::config::standard())
        .expect("encoding a graph into a Vec cannot fail");
    let mut h = Sha256::new();
    h.update(b"kiln-graph-v2");
    h.update(&bytes);
    h.finalize().into()
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
