//! [`OnnxBackend`]: any kiln backend, lowering each bucket from that bucket's import of an ONNX
//! model. The engine holds the model's interface graph (its signature, symbolic in batch and
//! seq); `lower` imports the graph for the bucket and hands it to the inner backend. Generic
//! over the inner backend, so nothing is dispatched dynamically.

use std::sync::Arc;

use kiln_runtime::{Backend, Batch, Bucket, Caps, Error, Graph, HostTensor, Outputs, Result};

use super::OnnxModel;

pub struct OnnxBackend<B: Backend> {
    pub inner: B,
    pub model: Arc<OnnxModel>,
}

impl<B: Backend> OnnxBackend<B> {
    pub fn new(inner: B, model: Arc<OnnxModel>) -> Self {
        OnnxBackend { inner, model }
    }
}

impl<B: Backend> Backend for OnnxBackend<B> {
    type Weights = B::Weights;
    type Plan = B::Plan;

    fn caps(&self) -> Caps {
        self.inner.caps()
    }

    fn upload(&self, tensors: &[HostTensor], graph: &Graph) -> Result<B::Weights> {
        self.inner.upload(tensors, graph)
    }

    fn lower(&self, weights: &B::Weights, graph: &Graph, bucket: Bucket) -> Result<B::Plan> {
        let g = self.model.graph_for(bucket)?;
        if g.weights != graph.weights || g.inputs.len() != graph.inputs.len() || g.outputs.len() != graph.outputs.len() {
            return Err(Error::Unsupported(format!(
                "{}: bucket {bucket}: the imported graph's weights or signature differ from the model's",
                self.model.path.display()
            )));
        }
        self.inner.lower(weights, &g, bucket)
    }

    fn run(&self, plan: &mut B::Plan, batch: &Batch, outputs: &mut Outputs) -> Result<()> {
        self.inner.run(plan, batch, outputs)
    }

    fn weight_bytes(&self, weights: &B::Weights) -> usize {
        self.inner.weight_bytes(weights)
    }

    fn plan_bytes(&self, plan: &B::Plan) -> usize {
        self.inner.plan_bytes(plan)
    }
}
