//! A sentence-embedding model on disk: config, checkpoint, tokenizer → graph, weights, token ids.

use std::path::{Path, PathBuf};

use kiln_compiler::models::bert::{build_bert, detect_prefix, BertConfig, BertOutputs};
use kiln_runtime::{
    block_on, load_graph_weights, Backend, Batch, Bucket, Engine, Error, Graph, HostTensor, Result, SafetensorsLoader, WeightLoader,
    WeightSource,
};
use tokenizers::Tokenizer;

pub struct SentenceModel {
    pub dir: PathBuf,
    pub config: BertConfig,
    pub graph: Graph,
    pub tokenizer: Tokenizer,
    /// Longest token sequence the model takes (special tokens included).
    pub max_tokens: usize,
}

impl SentenceModel {
    /// Reads `config.json`, the tokenizer and the checkpoint's header; builds the graph.
    pub fn open(dir: &Path, outputs: BertOutputs) -> Result<Self> {
        let config = BertConfig::from_file(&dir.join("config.json"))?;
        let loader = SafetensorsLoader::new();
        let meta = block_on(loader.get_metadata(&WeightSource::Safetensors(dir.join("model.safetensors"))))?;
        let prefix = detect_prefix(meta.tensors.iter().map(|t| t.name.as_str())).ok_or_else(|| Error::Model {
            path: dir.join("model.safetensors"),
            message: "no `embeddings.word_embeddings.weight` tensor: not a BERT checkpoint".into(),
        })?;
        config
            .check_checkpoint(prefix, meta.tensors.iter().map(|t| (t.name.as_str(), t.shape.as_slice())))
            .map_err(|m| Error::Model {
                path: dir.join("config.json"),
                message: format!("does not match model.safetensors: {m}"),
            })?;
        let graph = build_bert(&config, prefix, outputs)?;
        let tok_path = dir.join("tokenizer.json");
        let mut tokenizer = Tokenizer::from_file(&tok_path)
            .map_err(|e| Error::Model { path: tok_path.clone(), message: format!("cannot load tokenizer: {e}") })?;
        // An id past the embedding table would fail inside the gather kernel; say which file.
        let vocab = tokenizer.get_vocab_size(true);
        if vocab > config.vocab_size {
            return Err(Error::Model {
                path: tok_path,
                message: format!("has {vocab} tokens, the model's embedding table (vocab_size in config.json) has {}", config.vocab_size),
            });
        }
        // sentence-transformers truncates at max_seq_length and never pads: the engine pads.
        let max_tokens = read_max_seq_length(dir).unwrap_or(config.max_position_embeddings).min(config.max_position_embeddings);
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(tokenizers::TruncationParams { max_length: max_tokens, ..Default::default() }))
            .map_err(|e| Error::Model { path: tok_path, message: format!("cannot set truncation: {e}") })?;
        Ok(SentenceModel { dir: dir.into(), config, graph, tokenizer, max_tokens })
    }

    /// Loads the checkpoint tensors in the graph's weight-table order.
    pub fn load_weights(&self) -> Result<Vec<HostTensor>> {
        load_graph_weights(&SafetensorsLoader::new(), &self.dir.join("model.safetensors"), &self.graph.weights)
    }

    /// Token ids (with [CLS]/[SEP]) of each text, unpadded.
    pub fn tokenize(&self, texts: &[&str]) -> Result<Vec<Vec<i64>>> {
        texts
            .iter()
            .map(|t| {
                self.tokenizer
                    .encode(*t, true)
                    .map(|e| e.get_ids().iter().map(|&i| i as i64).collect())
                    .map_err(|e| Error::Model { path: self.dir.join("tokenizer.json"), message: format!("cannot tokenize {t:?}: {e}") })
            })
            .collect()
    }
}

/// Runs token sequences through an engine built on a sentence-embedding graph and returns one
/// embedding per sequence (the graph's `embeddings` output).
pub fn embed_ids<B: Backend>(engine: &Engine<B>, seqs: &[Vec<i64>]) -> Result<Vec<Vec<f32>>> {
    let g = engine.graph();
    let k = g.output_names.iter().position(|n| n == "embeddings").ok_or_else(|| {
        Error::Unsupported("the graph has no `embeddings` output".into())
    })?;
    let out = engine.infer(&Batch::from_token_ids(g, seqs)?)?;
    let e = &out.tensors[k];
    let dim = e.shape[1];
    Ok(e.to_f32_vec().chunks(dim).map(|c| c.to_vec()).collect())
}

fn read_max_seq_length(dir: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(dir.join("sentence_bert_config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("max_seq_length")?.as_u64().map(|n| n as usize)
}

/// Cosine similarity of two vectors.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        ab += x as f64 * y as f64;
        aa += x as f64 * x as f64;
        bb += y as f64 * y as f64;
    }
    ab / (aa.sqrt() * bb.sqrt()).max(1e-30)
}

/// Token ids that fill `bucket` exactly, for benchmarks: every row full length, `[CLS]` then
/// arbitrary in-vocabulary word pieces (the run time does not depend on which).
pub fn bench_token_ids(bucket: Bucket) -> Vec<Vec<i64>> {
    (0..bucket.batch)
        .map(|r| (0..bucket.seq).map(|t| if t == 0 { 101 } else { 1000 + ((r * 7919 + t * 104729) % 20000) as i64 }).collect())
        .collect()
}
