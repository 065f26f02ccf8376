//! Opening an [`Embedder`]: a model folder or an ONNX file, compiled at each bucket's first
//! request (JIT) or mapped from a plan artifact at start-up (no lowering at all).

use std::path::PathBuf;
use std::sync::Arc;

use kiln_compiler::frontends::onnx::{DimRole, OnnxBackend, OnnxModel};
use kiln_compiler::models::bert::BertOutputs;
use kiln_runtime::artifact::{Artifact, Target};
use kiln_runtime::cpu::Threads;
use kiln_runtime::{Backend, Bucket, Dim, Engine, Error, Graph, HostTensor, LowerPolicy, Result, TrustPolicy};

use super::{ModelInfo, Pooled, SharedEmbedder, TextTokenizer};
use crate::model::SentenceModel;
use crate::onnx::Pooling;

/// Where the model comes from.
pub enum ModelSource {
    /// A BERT model folder (config.json, model.safetensors, tokenizer.json).
    Folder(PathBuf),
    /// An ONNX file and its tokenizer.
    Onnx { file: PathBuf, tokenizer: PathBuf, dims: Vec<(String, DimRole)>, pooling: Pooling, output: Option<String> },
}

/// How buckets get their plans.
pub enum Runner {
    /// Compiled in this process at each bucket's first request.
    Jit(JitBackend),
    /// Every plan of an artifact (`kiln compile -o`), mapped at start-up; its buckets are the
    /// only ones served.
    Plan { path: PathBuf, trust: TrustPolicy },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JitBackend {
    Cpu,
    Cuda,
    Reference,
}

/// The bucket ladder: every `rows × seq` pair, seqs past the model's longest input dropped and
/// that longest input added as the top rung.
#[derive(Debug, Clone)]
pub struct Ladder {
    pub rows: Vec<usize>,
    pub seqs: Vec<usize>,
    /// An explicit bucket list instead of the product (seqs are still capped).
    pub explicit: Vec<Bucket>,
}

impl Default for Ladder {
    fn default() -> Self {
        // Seqs every 8 tokens to 128, every 16 to 256, then every 32: a text is padded by under
        // 8 tokens where most sentences are, and lowering a rung takes ~20 ms (measured with
        // examples/serve_load: real/computed tokens 0.90 against 0.82 with steps of 16).
        let mut seqs: Vec<usize> = (1..=16).map(|k| 8 * k).collect();
        seqs.extend((9..=16).map(|k| 16 * k));
        seqs.extend((9..=16).map(|k| 32 * k));
        Ladder { rows: vec![1, 2, 4, 8, 16, 32], seqs, explicit: Vec::new() }
    }
}

impl Ladder {
    /// The buckets for a model taking at most `max_tokens` tokens.
    pub fn buckets(&self, max_tokens: usize) -> Result<Vec<Bucket>> {
        let mut out: Vec<Bucket> = if self.explicit.is_empty() {
            let mut seqs: Vec<usize> = self.seqs.iter().copied().filter(|&s| s < max_tokens).collect();
            seqs.push(max_tokens);
            self.rows.iter().flat_map(|&r| seqs.iter().map(move |&s| Bucket::new(r, s))).collect()
        } else {
            self.explicit.iter().map(|b| Bucket::new(b.batch, b.seq.min(max_tokens))).collect()
        };
        out.retain(|b| b.batch > 0 && b.seq > 0);
        out.sort();
        out.dedup();
        if out.is_empty() {
            return Err(Error::bad_batch("the bucket ladder is empty"));
        }
        Ok(out)
    }
}

/// Everything [`open`] needs.
pub struct OpenOptions {
    pub source: ModelSource,
    pub runner: Runner,
    pub ladder: Ladder,
    /// Cap on tokens per text (default: the model's own limit; 512 for ONNX models).
    pub max_tokens: Option<usize>,
    pub threads: Threads,
}

/// The model's graph, weights, tokenizer and how its output is read.
struct Loaded {
    name: String,
    graph: Graph,
    weights: Vec<HostTensor>,
    onnx: Option<Arc<OnnxModel>>,
    tokenizer: PathBuf,
    max_tokens: usize,
    vocab: usize,
    output: usize,
    pooling: Pooling,
    normalized: bool,
}

/// Opens the model and its engine. JIT engines compile nothing here; plan engines map every
/// plan here (so the first request runs at once).
pub fn open(opts: OpenOptions) -> Result<(SharedEmbedder, TextTokenizer)> {
    let artifact = match &opts.runner {
        Runner::Plan { path, trust } => Some(Artifact::from_file_with(path, trust).map_err(|e| e.context(path.display()))?),
        Runner::Jit(_) => None,
    };
    let mut m = load(&opts.source, artifact.as_ref())?;
    if let Some(cap) = opts.max_tokens {
        m.max_tokens = m.max_tokens.min(cap);
    }
    let buckets = match &artifact {
        Some(a) => a.header.buckets.clone(),
        None => opts.ladder.buckets(m.max_tokens)?,
    };
    // The buckets are all there is: no text may be longer than the longest (an artifact's, or
    // an explicit list's), so longer ones are refused (413) or truncated, never unrunnable.
    m.max_tokens = m.max_tokens.min(buckets.iter().map(|b| b.seq).max().unwrap_or(0));
    let tokenizer = TextTokenizer::from_file(&m.tokenizer, m.max_tokens, m.vocab)?;
    let threads = opts.threads;
    let e: SharedEmbedder = match (&opts.runner, artifact) {
        (Runner::Jit(JitBackend::Cpu), _) => {
            let be = kiln_compiler::backends::cpu::CpuBackend::with_options(kiln_compiler::backends::cpu::CpuOptions { threads, ..Default::default() })?;
            jit(be, m, &buckets)?
        }
        (Runner::Jit(JitBackend::Cuda), _) => jit(kiln_compiler::backends::cuda::CudaBackend::new()?, m, &buckets)?,
        (Runner::Jit(JitBackend::Reference), _) => jit(kiln_compiler::reference::ReferenceBackend, m, &buckets)?,
        (Runner::Plan { path, .. }, Some(a)) => {
            let at = |e: Error| e.context(path.display());
            match a.header.target.clone() {
                Target::CpuX86_64 { .. } => precompiled(kiln_runtime::cpu::PrecompiledCpu::with_threads(a, threads).map_err(at)?, m, &buckets).map_err(at)?,
                Target::Cuda { .. } => precompiled(kiln_runtime::cuda::PrecompiledCuda::new(a).map_err(at)?, m, &buckets).map_err(at)?,
            }
        }
        (Runner::Plan { .. }, None) => unreachable!("the artifact was read above"),
    };
    Ok((e, tokenizer))
}

fn load(source: &ModelSource, artifact: Option<&Artifact>) -> Result<Loaded> {
    match source {
        ModelSource::Folder(dir) => {
            let sm = SentenceModel::open(dir, BertOutputs::default())?;
            let mut graph = sm.graph.clone();
            if let Some(a) = artifact {
                // The plans must be this folder's graph (its config.json and checkpoint).
                a.check_graph(&sm.graph).map_err(|e| e.context(format!("model {}", dir.join("config.json").display())))?;
                graph = a.body.signature.graph();
            }
            let weights = kiln_runtime::load_graph_weights(&kiln_runtime::SafetensorsLoader::new(), &dir.join("model.safetensors"), &graph.weights)?;
            let output = graph
                .output_names
                .iter()
                .position(|n| n == "embeddings")
                .ok_or_else(|| Error::Unsupported("the graph has no `embeddings` output".into()))?;
            Ok(Loaded {
                name: dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned()),
                graph,
                weights,
                onnx: None,
                tokenizer: dir.join("tokenizer.json"),
                max_tokens: sm.max_tokens,
                vocab: sm.config.vocab_size,
                output,
                pooling: Pooling::None,
                normalized: true,
            })
        }
        ModelSource::Onnx { file, tokenizer, dims, pooling, output } => {
            let model = Arc::new(OnnxModel::open(file, dims)?);
            let graph = model.signature()?.graph();
            if let Some(a) = artifact {
                a.check_graph(&graph).map_err(|e| e.context(format!("model {}", file.display())))?;
            }
            let k = crate::onnx::output_index(&graph, output.as_deref(), file)?;
            let loader = kiln_compiler::frontends::onnx::OnnxLoader::with_model(model.clone());
            let weights = kiln_runtime::load_table(&loader, &kiln_runtime::WeightSource::Onnx(model.path.clone()), &graph.weights)?;
            Ok(Loaded {
                name: file.file_stem().map_or_else(|| file.display().to_string(), |n| n.to_string_lossy().into_owned()),
                graph,
                weights,
                onnx: Some(model),
                tokenizer: tokenizer.clone(),
                max_tokens: 512,
                vocab: usize::MAX,
                output: k,
                pooling: *pooling,
                normalized: false,
            })
        }
    }
}

/// The embedding length: the output's last dim, which must be fixed.
fn dims_of(m: &Loaded) -> Result<usize> {
    let shape = &m.graph.node(m.graph.outputs[m.output]).shape;
    match shape.last() {
        Some(Dim::Fixed(n)) if (2..=3).contains(&shape.len()) => Ok(*n),
        _ => Err(Error::Unsupported(format!(
            "{}: output `{}` has shape {shape:?}; an embedding output is [batch, dims] or [batch, seq, dims]",
            m.name, m.graph.output_names[m.output]
        ))),
    }
}

fn info<B: Backend>(be: &B, m: &Loaded, extra: &str) -> Result<ModelInfo> {
    let caps = be.caps();
    Ok(ModelInfo { name: m.name.clone(), dims: dims_of(m)?, max_tokens: m.max_tokens, backend: format!("{} ({}){extra}", caps.name, caps.device) })
}

/// A compiling backend: nothing is lowered until a bucket's first request.
fn jit<B: Backend + 'static>(be: B, m: Loaded, buckets: &[Bucket]) -> Result<SharedEmbedder> {
    match m.onnx.clone() {
        Some(model) => build(OnnxBackend::new(be, model), m, buckets, LowerPolicy::OnFirstRequest, "JIT"),
        None => build(be, m, buckets, LowerPolicy::OnFirstRequest, "JIT"),
    }
}

/// Precompiled plans: every bucket mapped now, none ever lowered.
fn precompiled<B: Backend + 'static>(be: B, m: Loaded, buckets: &[Bucket]) -> Result<SharedEmbedder> {
    build(be, m, buckets, LowerPolicy::PrecompiledOnly, "plans")
}

fn build<B: Backend + 'static>(be: B, m: Loaded, buckets: &[Bucket], policy: LowerPolicy, how: &str) -> Result<SharedEmbedder> {
    let info = info(&be, &m, &format!(", {how}"))?;
    let engine = Engine::new(be, m.graph, &m.weights, buckets, policy)?;
    if policy == LowerPolicy::PrecompiledOnly {
        for &b in buckets {
            let plan = engine.backend().lower(engine.weights(), engine.graph(), b).map_err(|e| e.context(format!("bucket {b}")))?;
            engine.insert_plan(b, plan)?;
        }
    }
    Ok(Arc::new(Pooled { engine, output: m.output, pooling: m.pooling, normalized: m.normalized, info }))
}
