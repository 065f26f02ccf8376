//! The seed trait every backend implements, and the data that crosses it.

use serde::{Deserialize, Serialize};

use crate::dtype::{DType, HostTensor, TensorData};
use crate::error::{Error, Result};
use crate::graph::{Bucket, Dim, Graph, InputRole};

/// What a backend is and can do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Caps {
    /// Backend name, e.g. `reference`, `cpu`, `cuda`.
    pub name: String,
    /// The device in words (CPU model and features, GPU name and compute capability).
    pub device: String,
    /// Element types the backend computes in.
    pub dtypes: Vec<DType>,
    /// Whether `lower` compiles new buckets (false for precompiled-only backends).
    pub can_lower: bool,
    /// Device memory in bytes, where known.
    pub memory_bytes: Option<u64>,
}

/// A batch of graph inputs, one tensor per [`Graph::inputs`] entry and in that order.
/// Every input's leading dims are `[rows, tokens]` where its spec says `[batch, seq]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub tensors: Vec<HostTensor>,
}

impl Batch {
    /// Builds a batch for a token model from unpadded token id sequences: ids padded with 0,
    /// an attention mask of 1 for real tokens and 0 for padding, token types 0.
    pub fn from_token_ids(graph: &Graph, seqs: &[Vec<i64>]) -> Result<Batch> {
        if seqs.is_empty() {
            return Err(Error::bad_batch("no sequences given"));
        }
        let rows = seqs.len();
        let tokens = seqs.iter().map(|s| s.len()).max().unwrap_or(0);
        if tokens == 0 {
            return Err(Error::bad_batch("every sequence is empty"));
        }
        let mut tensors = Vec::new();
        for spec in &graph.inputs {
            if spec.shape != [Dim::Batch, Dim::Seq] {
                return Err(Error::bad_batch(format!(
                    "input `{}` is not a [batch, seq] token input; build the Batch by hand",
                    spec.name
                )));
            }
            let mut v = vec![0i64; rows * tokens];
            for (r, s) in seqs.iter().enumerate() {
                for (t, &id) in s.iter().enumerate() {
                    v[r * tokens + t] = match spec.role {
                        InputRole::TokenIds | InputRole::Other => id,
                        InputRole::AttentionMask => 1,
                        InputRole::TokenTypes => 0,
                    };
                }
            }
            let data = TensorData::I64(v).convert(spec.dtype);
            tensors.push(HostTensor::new(vec![rows, tokens], data)?);
        }
        Ok(Batch { tensors })
    }

    /// Rows and tokens of the batch, checked against the graph's inputs: count, dtype, rank,
    /// fixed dims, and that every input agrees on the batch and seq sizes.
    pub fn check(&self, graph: &Graph) -> Result<(usize, usize)> {
        if self.tensors.len() != graph.inputs.len() {
            return Err(Error::bad_batch(format!(
                "the graph takes {} inputs ({}), the batch has {}",
                graph.inputs.len(),
                graph.inputs.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", "),
                self.tensors.len()
            )));
        }
        let (mut rows, mut tokens) = (None::<usize>, None::<usize>);
        for (t, spec) in self.tensors.iter().zip(&graph.inputs) {
            if t.dtype() != spec.dtype {
                return Err(Error::bad_batch(format!(
                    "input `{}` must be {}, got {}",
                    spec.name,
                    spec.dtype,
                    t.dtype()
                )));
            }
            if t.shape.len() != spec.shape.len() {
                return Err(Error::bad_batch(format!(
                    "input `{}` must have rank {}, got shape {:?}",
                    spec.name,
                    spec.shape.len(),
                    t.shape
                )));
            }
            for (&n, d) in t.shape.iter().zip(&spec.shape) {
                let slot = match d {
                    Dim::Fixed(f) if n != *f => {
                        return Err(Error::bad_batch(format!(
                            "input `{}` has shape {:?}, expected a dim of {f}",
                            spec.name, t.shape
                        )))
                    }
                    Dim::Fixed(_) => continue,
                    Dim::Batch => &mut rows,
                    Dim::Seq => &mut tokens,
                };
                match slot {
                    Some(prev) if *prev != n => {
                        return Err(Error::bad_batch(format!(
                            "input `{}` has shape {:?}, disagreeing with another input's {d} size {prev}",
                            spec.name, t.shape
                        )))
                    }
                    _ => *slot = Some(n),
                }
            }
        }
        let (rows, tokens) = (rows.unwrap_or(1), tokens.unwrap_or(1));
        if rows == 0 || tokens == 0 {
            return Err(Error::bad_batch("the batch is empty"));
        }
        Ok((rows, tokens))
    }

    /// Pads every input to the bucket's batch and seq with zeros (padding rows and tokens are
    /// masked out because the attention mask pads with 0).
    pub fn pad_to(&self, graph: &Graph, bucket: Bucket) -> Result<Batch> {
        let (rows, tokens) = self.check(graph)?;
        if !bucket.fits(rows, tokens) {
            return Err(Error::bad_batch(format!(
                "{rows} rows x {tokens} tokens do not fit bucket {bucket}"
            )));
        }
        let mut out = Vec::with_capacity(self.tensors.len());
        for (t, spec) in self.tensors.iter().zip(&graph.inputs) {
            let to: Vec<usize> = spec.shape.iter().map(|d| d.resolve(bucket)).collect();
            out.push(t.resized(&to));
        }
        Ok(Batch { tensors: out })
    }
}

/// Outputs of one run, one tensor per [`Graph::outputs`] entry, at the bucket's full size.
#[derive(Debug, Clone, PartialEq)]
pub struct Outputs {
    pub tensors: Vec<HostTensor>,
}

impl Outputs {
    /// Zeroed outputs of the graph for `bucket`.
    pub fn for_bucket(graph: &Graph, bucket: Bucket) -> Outputs {
        let tensors = graph
            .outputs
            .iter()
            .map(|&o| HostTensor::zeros(graph.node(o).dtype, graph.shape_in(o, bucket)))
            .collect();
        Outputs { tensors }
    }

    /// Checks that the outputs have the graph's shapes for `bucket`.
    pub fn check(&self, graph: &Graph, bucket: Bucket) -> Result<()> {
        if self.tensors.len() != graph.outputs.len() {
            return Err(Error::bad_batch(format!(
                "outputs hold {} tensors, the graph has {} outputs",
                self.tensors.len(),
                graph.outputs.len()
            )));
        }
        for ((t, &o), name) in self.tensors.iter().zip(&graph.outputs).zip(&graph.output_names) {
            let want = graph.shape_in(o, bucket);
            if t.shape != want || t.dtype() != graph.node(o).dtype {
                return Err(Error::bad_batch(format!(
                    "output `{name}` buffer is {} {:?}, bucket {bucket} needs {} {want:?}",
                    t.dtype(),
                    t.shape,
                    graph.node(o).dtype
                )));
            }
        }
        Ok(())
    }
}

/// A compute backend. The engine is generic over it, so the hot path is monomorphized.
pub trait Backend: Send + Sync {
    /// Weights in the backend's layout, indexed like [`Graph::weights`].
    type Weights: Send + Sync;
    /// A compiled plan for one bucket: all memory is allocated when it is built.
    type Plan: Send;

    fn caps(&self) -> Caps;

    /// Converts checkpoint tensors (indexed like `graph.weights`) into the backend's layout.
    fn upload(&self, tensors: &[HostTensor], graph: &Graph) -> Result<Self::Weights>;

    /// Compiles the graph for one bucket. `Error::Unsupported` for what the backend cannot run.
    fn lower(&self, weights: &Self::Weights, graph: &Graph, bucket: Bucket) -> Result<Self::Plan>;

    /// Runs a plan on a batch already padded to exactly the plan's bucket.
    fn run(&self, plan: &mut Self::Plan, batch: &Batch, outputs: &mut Outputs) -> Result<()>;

    /// Bytes the weights occupy in the backend's memory.
    fn weight_bytes(&self, _weights: &Self::Weights) -> usize {
        0
    }

    /// Bytes a plan holds (arena, code, scratch).
    fn plan_bytes(&self, _plan: &Self::Plan) -> usize {
        0
    }
}

/// Checks the weight tensors given to `upload` against the graph's weight table.
pub fn check_weights(tensors: &[HostTensor], graph: &Graph) -> Result<()> {
    if tensors.len() != graph.weights.len() {
        return Err(Error::graph(
            "<weights>",
            format!("the graph has {} weights, {} tensors were given", graph.weights.len(), tensors.len()),
        ));
    }
    for (t, spec) in tensors.iter().zip(&graph.weights) {
        if t.shape != spec.shape || t.dtype() != spec.dtype {
            return Err(Error::TensorMismatch {
                path: "<upload>".into(),
                tensor: spec.name.clone(),
                expected: format!("{} {:?}", spec.dtype, spec.shape),
                found: format!("{} {:?}", t.dtype(), t.shape),
            });
        }
    }
    Ok(())
}
