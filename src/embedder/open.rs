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
use crate::BackendKind;

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
    Jit(BackendKind),
    /// Every plan of an artifact (`kiln compile -o`), mapped at start-up; its buckets are the
    /// only ones served.
    Plan { path: PathBuf, trust: TrustPolicy },
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

/// Where the texts' tokenizer comes from: the model folder's, already read with the model, or
/// a file given with an ONNX model.
enum TokenizerSource {
    Loaded(Box<tokenizers::Tokenizer>),
    File,
}

/// The model's graph, weights, tokenizer and how its output is read.
struct Loaded {
    name: String,
    graph: Graph,
    weights: Vec<HostTensor>,
    onnx: Option<Arc<OnnxModel>>,
    tokenizer_path: PathBuf,
    tokenizer: TokenizerSource,
    max_tokens: usize,
    vocab: usize,
    output: usize,
    pooling: Pooling,
    normalized: bool,
}

/// Whether plans from an artifact are all mapped when the engine starts (a server: the first
/// request runs at once, nothing is lowered later) or each at its bucket's first use (a one-off
/// `kiln embed`, which runs one bucket).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    AllNow,
    OnUse,
}

/// A model read for embedding, before its buckets are chosen: `kiln serve` takes them from its
/// ladder, `kiln embed` from the texts at hand; an artifact's plans fix them for both.
pub struct Opened {
    m: Loaded,
    plans: Plans,
    threads: Threads,
}

/// A [`Runner`] with its artifact read and checked.
enum Plans {
    Jit(BackendKind),
    Artifact { path: PathBuf, artifact: Box<Artifact> },
}

impl Opened {
    /// Reads the model (and, for [`Runner::Plan`], the artifact, checked against the model).
    pub fn new(source: &ModelSource, runner: Runner, threads: Threads) -> Result<Opened> {
        let plans = match runner {
            Runner::Plan { path, trust } => {
                let artifact = Artifact::from_file_with(&path, &trust).map_err(|e| e.context(path.display()))?;
                Plans::Artifact { path, artifact: Box::new(artifact) }
            }
            Runner::Jit(kind) => Plans::Jit(kind),
        };
        let m = match &plans {
            Plans::Artifact { path, artifact } => load(source, Some((artifact, path)))?,
            Plans::Jit(_) => load(source, None)?,
        };
        Ok(Opened { m, plans, threads })
    }

    /// The plan artifact's path, where plans come from one.
    pub fn plan_path(&self) -> Option<&std::path::Path> {
        match &self.plans {
            Plans::Artifact { path, .. } => Some(path),
            Plans::Jit(_) => None,
        }
    }

    /// Tokens one text may have (special tokens included).
    pub fn max_tokens(&self) -> usize {
        self.m.max_tokens
    }

    /// Lowers [`Opened::max_tokens`] to `cap`.
    pub fn cap_tokens(&mut self, cap: usize) {
        self.m.max_tokens = self.m.max_tokens.min(cap);
    }

    /// The batch and sequence sizes the model's token inputs fix, if any (an export for one
    /// sequence length or batch size): every bucket has them.
    pub fn fixed_dims(&self) -> (Option<usize>, Option<usize>) {
        let fixed = |k: usize| {
            self.m.graph.inputs.iter().find_map(|i| match i.shape.get(k) {
                Some(Dim::Fixed(n)) if i.shape.len() == 2 => Some(*n),
                _ => None,
            })
        };
        (fixed(0), fixed(1))
    }

    /// The artifact's buckets, where plans come from one: the only ones that can run.
    pub fn artifact_buckets(&self) -> Option<&[Bucket]> {
        match &self.plans {
            Plans::Artifact { artifact, .. } => Some(&artifact.header.buckets),
            Plans::Jit(_) => None,
        }
    }

    /// The texts' tokenizer, truncating at [`Opened::max_tokens`] when asked.
    pub fn tokenizer(&self) -> Result<TextTokenizer> {
        match &self.m.tokenizer {
            TokenizerSource::Loaded(t) => TextTokenizer::new(&self.m.tokenizer_path, (**t).clone(), self.m.max_tokens, self.m.vocab),
            TokenizerSource::File => TextTokenizer::from_file(&self.m.tokenizer_path, self.m.max_tokens, self.m.vocab),
        }
    }

    /// The engine over `buckets` (an artifact's, when plans come from one). A JIT engine
    /// compiles nothing here.
    pub fn start(self, buckets: &[Bucket], mapping: Mapping) -> Result<SharedEmbedder> {
        let Opened { m, plans, threads } = self;
        match plans {
            Plans::Jit(BackendKind::Cpu) => {
                let be = kiln_compiler::backends::cpu::CpuBackend::with_options(kiln_compiler::backends::cpu::CpuOptions { threads, ..Default::default() })?;
                jit(be, m, buckets)
            }
            Plans::Jit(BackendKind::Cuda) => jit(kiln_compiler::backends::cuda::CudaBackend::new()?, m, buckets),
            Plans::Jit(BackendKind::Reference) => jit(kiln_compiler::reference::ReferenceBackend, m, buckets),
            Plans::Artifact { path, artifact } => {
                let a = *artifact;
                let at = |e: Error| e.context(path.display());
                match a.header.target.clone() {
                    Target::CpuX86_64 { .. } => {
                        precompiled(kiln_runtime::cpu::PrecompiledCpu::with_threads(a, threads).map_err(at)?, m, buckets, mapping).map_err(at)
                    }
                    target @ Target::Cuda { .. } => {
                        // Without a GPU this fails here, before any plan is touched.
                        let be = kiln_runtime::cuda::PrecompiledCuda::new(a).map_err(|e| match e {
                            e @ Error::Environment(_) => e.context(format!("{} holds GPU plans ({target})", path.display())),
                            other => at(other),
                        })?;
                        precompiled(be, m, buckets, mapping).map_err(at)
                    }
                }
            }
        }
    }
}

/// Opens the model and its engine over the ladder's buckets (or the artifact's). A JIT engine
/// compiles nothing here; a plan engine maps every plan here (so the first request runs at once).
pub fn open(opts: OpenOptions) -> Result<(SharedEmbedder, TextTokenizer)> {
    let mut o = Opened::new(&opts.source, opts.runner, opts.threads)?;
    if let Some(cap) = opts.max_tokens {
        o.cap_tokens(cap);
    }
    let buckets = match (o.artifact_buckets(), o.fixed_dims()) {
        (Some(b), _) => b.to_vec(),
        (None, (None, None)) => opts.ladder.buckets(o.max_tokens())?,
        // A model with a fixed sequence length (or batch size) runs at that size only.
        (None, (rows, seq)) => {
            let rows = rows.map_or_else(|| opts.ladder.rows.clone(), |r| vec![r]);
            let seq = seq.unwrap_or(o.max_tokens());
            rows.into_iter().map(|r| Bucket::new(r, seq)).collect()
        }
    };
    // The buckets are all there is: no text may be longer than the longest (an artifact's, or
    // an explicit list's), so longer ones are refused (413) or truncated, never unrunnable.
    o.cap_tokens(buckets.iter().map(|b| b.seq).max().unwrap_or(0));
    let tokenizer = o.tokenizer()?;
    Ok((o.start(&buckets, Mapping::AllNow)?, tokenizer))
}

/// Reads the model; with an artifact (and its path), checks that its plans are this model's
/// and takes the artifact's graph.
fn load(source: &ModelSource, artifact: Option<(&Artifact, &std::path::Path)>) -> Result<Loaded> {
    // The plans must be this model's (a folder's config.json and checkpoint, an ONNX file).
    let check = |a: &Artifact, plan: &std::path::Path, g: &Graph, model: &std::path::Path| {
        a.check_graph(g).map_err(|e| e.context(format!("{} (model {})", plan.display(), model.display())))
    };
    match source {
        ModelSource::Folder(dir) => {
            let sm = SentenceModel::open(dir, BertOutputs::default())?;
            let mut graph = sm.graph.clone();
            if let Some((a, plan)) = artifact {
                check(a, plan, &sm.graph, &dir.join("config.json"))?;
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
                tokenizer_path: dir.join("tokenizer.json"),
                tokenizer: TokenizerSource::Loaded(Box::new(sm.tokenizer)),
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
            if let Some((a, plan)) = artifact {
                check(a, plan, &graph, file)?;
            }
            let k = crate::onnx::output_index(&graph, output.as_deref(), file)?;
            let loader = kiln_compiler::frontends::onnx::OnnxLoader::with_model(model.clone());
            let weights = kiln_runtime::load_table(&loader, &kiln_runtime::WeightSource::Onnx(model.path.clone()), &graph.weights)?;
            Ok(Loaded {
                name: file.file_stem().map_or_else(|| file.display().to_string(), |n| n.to_string_lossy().into_owned()),
                graph,
                weights,
                onnx: Some(model),
                tokenizer_path: tokenizer.clone(),
                tokenizer: TokenizerSource::File,
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
    let pooled = m.graph.node(m.graph.outputs[m.output]).shape.len() == 3;
    Ok(ModelInfo {
        name: m.name.clone(),
        dims: dims_of(m)?,
        max_tokens: m.max_tokens,
        backend: format!("{} ({}){extra}", caps.name, caps.device),
        pooled,
    })
}

/// A compiling backend: nothing is lowered until a bucket's first request.
fn jit<B: Backend + 'static>(be: B, m: Loaded, buckets: &[Bucket]) -> Result<SharedEmbedder> {
    match m.onnx.clone() {
        Some(model) => build(OnnxBackend::new(be, model), m, buckets, LowerPolicy::OnFirstRequest, "JIT"),
        None => build(be, m, buckets, LowerPolicy::OnFirstRequest, "JIT"),
    }
}

/// Precompiled plans: every bucket mapped now (none ever lowered), or each at its first use.
fn precompiled<B: Backend + 'static>(be: B, m: Loaded, buckets: &[Bucket], mapping: Mapping) -> Result<SharedEmbedder> {
    match mapping {
        Mapping::AllNow => build(be, m, buckets, LowerPolicy::PrecompiledOnly, "plans"),
        Mapping::OnUse => build(be, m, buckets, LowerPolicy::OnFirstRequest, "plans"),
    }
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
