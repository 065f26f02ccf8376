//! A text-embedding engine behind one object-safe trait, and the tokenizer that feeds it.
//!
//! `kiln serve` holds an `Arc<dyn Embedder>` and calls it once per *batch*: the dynamic dispatch
//! is per batch, never per op — the [`Engine`] inside stays generic over its backend, as the
//! seed traits ask. One implementation, [`Pooled`], covers every source (a model folder, an ONNX
//! file) and every runner (a compiling backend, precompiled plans).

use std::sync::Arc;

use kiln_runtime::{Backend, Batch, Bucket, Engine, Error, Result};

use crate::onnx::{l2_normalize, pool_raw, Pooling};

pub mod once;
pub mod open;
mod tokenizer;
pub use tokenizer::{TextTokenizer, TokenizeError};

/// What a client sees of the model (`GET /info`).
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub name: String,
    /// Length of one embedding.
    pub dims: usize,
    /// The longest token sequence (special tokens included) one text may have.
    pub max_tokens: usize,
    /// The backend and its device, in words.
    pub backend: String,
    /// The vectors are pooled from per-token states (a rank-3 output), not the model's own
    /// per-text output.
    pub pooled: bool,
}

pub trait Embedder: Send + Sync {
    fn info(&self) -> &ModelInfo;
    /// Every bucket the engine may run, smallest first.
    fn buckets(&self) -> &[Bucket];
    /// Buckets that have a plan now.
    fn compiled_buckets(&self) -> Vec<Bucket>;
    fn is_compiled(&self, bucket: Bucket) -> bool;
    /// How many buckets this process has compiled (plans loaded from an artifact are not
    /// lowerings).
    fn lowerings(&self) -> usize;
    /// The smallest bucket that fits `rows` × `tokens`.
    fn pick_bucket(&self, rows: usize, tokens: usize) -> Option<Bucket>;
    /// Makes sure `bucket` has a plan (compiles it at most once, however many callers wait).
    fn prepare(&self, bucket: Bucket) -> Result<()>;
    /// One embedding per token sequence, as the model gives it (pooled, not re-normalized).
    fn embed(&self, seqs: &[Vec<i64>]) -> Result<Vec<Vec<f32>>>;
    /// Whether [`Embedder::embed`]'s vectors are already L2-normalized by the model itself.
    fn normalized(&self) -> bool;
}

/// An engine and how its output becomes one vector per text.
pub struct Pooled<B: Backend> {
    pub engine: Engine<B>,
    /// Index of the output used.
    pub output: usize,
    pub pooling: Pooling,
    /// The output is L2-normalized by the model (MiniLM's graph ends in its Normalize module).
    pub normalized: bool,
    pub info: ModelInfo,
}

impl<B: Backend> Embedder for Pooled<B> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }
    fn buckets(&self) -> &[Bucket] {
        self.engine.buckets()
    }
    fn compiled_buckets(&self) -> Vec<Bucket> {
        self.engine.compiled_buckets()
    }
    fn is_compiled(&self, bucket: Bucket) -> bool {
        self.engine.compiled_buckets().contains(&bucket)
    }
    fn lowerings(&self) -> usize {
        self.engine.lowerings()
    }
    fn pick_bucket(&self, rows: usize, tokens: usize) -> Option<Bucket> {
        self.engine.pick_bucket(rows, tokens).ok()
    }
    fn prepare(&self, bucket: Bucket) -> Result<()> {
        self.engine.prepare(bucket)
    }
    fn embed(&self, seqs: &[Vec<i64>]) -> Result<Vec<Vec<f32>>> {
        let g = self.engine.graph();
        let out = self.engine.infer(&Batch::from_token_ids(g, seqs)?)?;
        pool_raw(&out.tensors[self.output], seqs, self.pooling)
            .map_err(|m| Error::Unsupported(format!("{}: output `{}`: {m}", self.info.name, g.output_names[self.output])))
    }
    fn normalized(&self) -> bool {
        self.normalized
    }
}

/// The vectors a client asked for: L2-normalized unless the model already did it or the client
/// asked for the raw pooled vectors.
pub fn finish(e: &dyn Embedder, mut v: Vec<f32>, normalize: bool) -> Vec<f32> {
    if normalize && !e.normalized() {
        v = l2_normalize(v);
    }
    v
}

/// A shared embedder.
pub type SharedEmbedder = Arc<dyn Embedder>;
