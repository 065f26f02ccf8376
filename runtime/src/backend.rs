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
    /// an attention mask of 1 for real tokens and 0 for padding, token types 0, position ids
    /// 0, 1, 2, ... An input of role `Other` is refused: nothing says what it holds. Inputs with
    /// a fixed batch or sequence dim are padded to it (more rows or tokens are an error).
    pub fn from_token_ids(graph: &Graph, seqs: &[Vec<i64>]) -> Result<Batch> {
        if seqs.is_empty() {
            return Err(Error::bad_batch("no sequences given"));
        }
        let mut rows = seqs.len();
        let mut tokens = seqs.iter().map(|s| s.len()).max().unwrap_or(0);
        if tokens == 0 {
            return Err(Error::bad_batch("every sequence is empty"));
        }
        // A model exported for one sequence length (or batch size) gets its inputs padded to it.
        let (mut fixed_rows, mut fixed_tokens) = (None, None);
        for spec in &graph.inputs {
            let (r, t) = match spec.shape[..] {
                [r @ (Dim::Batch | Dim::Fixed(_)), t @ (Dim::Seq | Dim::Fixed(_))] => (r, t),
                _ => {
                    return Err(Error::bad_batch(format!(
                        "input `{}` is not a [batch, seq] token input; build the Batch by hand",
                        spec.name
                    )))
                }
            };
            for (d, fixed, have, what) in [(r, &mut fixed_rows, rows, "sequences"), (t, &mut fixed_tokens, tokens, "tokens")] {
                if let Dim::Fixed(n) = d {
                    if have > n {
                        return Err(Error::bad_batch(format!("{have} {what}: input `{}` takes {n} (a fixed dim of the model)", spec.name)));
                    }
                    if fixed.is_some_and(|f| f != n) {
                        return Err(Error::bad_batch(format!("input `{}` fixes its dim at {n}, another input at {}", spec.name, fixed.unwrap_or(0))));
                    }
                    *fixed = Some(n);
                }
            }
        }
        rows = fixed_rows.unwrap_or(rows);
        tokens = fixed_tokens.unwrap_or(tokens);
        let mut tensors = Vec::new();
        for spec in &graph.inputs {
            if spec.role == InputRole::Other {
                return Err(Error::bad_batch(format!(
                    "input `{}` is not token ids, an attention mask, token types or position ids; build the Batch by hand",
                    spec.name
                )));
            }
            let mut v = vec![0i64; rows * tokens];
            for (r, s) in seqs.iter().enumerate() {
                for (t, &id) in s.iter().enumerate() {
                    v[r * tokens + t] = match spec.role {
                        InputRole::TokenIds => id,
                        InputRole::Other => 0, // refused above
                        InputRole::AttentionMask => 1,
                        InputRole::TokenTypes => 0,
                        InputRole::PositionIds => t as i64,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::InputSpec;

    fn graph(roles: &[(&str, InputRole)]) -> Graph {
        let mut g = Graph::default();
        for (name, role) in roles {
            g.inputs.push(InputSpec { name: name.to_string(), dtype: DType::I64, shape: vec![Dim::Batch, Dim::Seq], role: *role });
        }
        g
    }

    #[test]
    fn token_batches_fill_each_role() {
        let g = graph(&[
            ("input_ids", InputRole::TokenIds),
            ("attention_mask", InputRole::AttentionMask),
            ("token_type_ids", InputRole::TokenTypes),
            ("position_ids", InputRole::PositionIds),
        ]);
        let b = Batch::from_token_ids(&g, &[vec![101, 7, 102], vec![101, 102]]).unwrap();
        let v: Vec<Vec<f64>> = b.tensors.iter().map(|t| t.data.to_f64_vec()).collect();
        assert_eq!(v[0], [101.0, 7.0, 102.0, 101.0, 102.0, 0.0]);
        assert_eq!(v[1], [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]);
        assert_eq!(v[2], [0.0; 6]);
        assert_eq!(v[3], [0.0, 1.0, 2.0, 0.0, 1.0, 0.0]);
        let e = Batch::from_token_ids(&graph(&[("input_ids", InputRole::TokenIds), ("pixel_values", InputRole::Other)]), &[vec![1]]).unwrap_err();
        assert!(e.to_string().contains("input `pixel_values` is not token ids"), "{e}");
    }

    #[test]
    fn fixed_dims_are_padded_to() {
        let mut g = graph(&[("input_ids", InputRole::TokenIds), ("attention_mask", InputRole::AttentionMask)]);
        for i in &mut g.inputs {
            i.shape = vec![Dim::Fixed(3), Dim::Fixed(4)];
        }
        let b = Batch::from_token_ids(&g, &[vec![5, 6], vec![7]]).unwrap();
        assert_eq!(b.tensors[0].shape, [3, 4]);
        assert_eq!(b.tensors[0].data.to_f64_vec(), [5.0, 6.0, 0.0, 0.0, 7.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(b.tensors[1].data.to_f64_vec(), [1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(b.check(&g).unwrap(), (1, 1));
        let e = Batch::from_token_ids(&g, &[vec![1; 5]]).unwrap_err().to_string();
        assert!(e.contains("5 tokens: input `input_ids` takes 4"), "{e}");
        let e = Batch::from_token_ids(&g, &[vec![1], vec![1], vec![1], vec![1]]).unwrap_err().to_string();
        assert!(e.contains("4 sequences: input `input_ids` takes 3"), "{e}");
    }
}
