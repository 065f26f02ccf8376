//! Sentence embeddings from plans compiled at build time. This binary links `kiln-runtime` only:
//! the plans (`include_bytes!`) are verified (magic, version, CPU features, checksum, graph
//! fingerprint) and mapped; nothing is compiled at run time.
//!
//! Usage: `minilm-aot [--model DIR] TEXT...` (prints `{"embeddings": [[...], ...]}`).

use std::path::PathBuf;
use std::process::ExitCode;

use kiln_runtime::artifact::Artifact;
use kiln_runtime::cpu::PrecompiledCpu;
use kiln_runtime::{load_graph_weights, Batch, Engine, Error, LowerPolicy, Result, SafetensorsLoader};

static PLANS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/minilm.kiln"));

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut dir = std::env::var_os("KILN_MODEL_DIR").map(PathBuf::from).unwrap_or_else(|| "models/all-MiniLM-L6-v2".into());
    if args.first().map(|a| a == "--model").unwrap_or(false) {
        if args.len() < 2 {
            return Err(Error::bad_batch("--model needs a directory"));
        }
        dir = PathBuf::from(args.remove(1));
        args.remove(0);
    }
    if args.is_empty() {
        return Err(Error::bad_batch("usage: minilm-aot [--model DIR] TEXT..."));
    }

    let artifact = Artifact::from_bytes(PLANS)?;
    let graph = artifact.body.signature.graph();
    let buckets = artifact.header.buckets.clone();
    let weights = load_graph_weights(&SafetensorsLoader::new(), &dir.join("model.safetensors"), &graph.weights)?;
    let engine = Engine::new(PrecompiledCpu::new(artifact), graph, &weights, &buckets, LowerPolicy::OnFirstRequest)?;

    let tok_path = dir.join("tokenizer.json");
    let mut tok = tokenizers::Tokenizer::from_file(&tok_path)
        .map_err(|e| Error::Model { path: tok_path.clone(), message: e.to_string() })?;
    tok.with_padding(None);
    let max = buckets.iter().map(|b| b.seq).max().unwrap_or(128);
    tok.with_truncation(Some(tokenizers::TruncationParams { max_length: max, ..Default::default() }))
        .map_err(|e| Error::Model { path: tok_path.clone(), message: e.to_string() })?;
    let mut seqs = Vec::new();
    for t in &args {
        let enc = tok.encode(t.as_str(), true).map_err(|e| Error::Model { path: tok_path.clone(), message: e.to_string() })?;
        seqs.push(enc.get_ids().iter().map(|&i| i as i64).collect::<Vec<i64>>());
    }
    let out = engine.infer(&Batch::from_token_ids(engine.graph(), &seqs)?)?;
    let e = &out.tensors[0];
    let rows: Vec<Vec<f32>> = e.to_f32_vec().chunks(e.shape[1]).map(|c| c.to_vec()).collect();
    println!("{}", serde_json::json!({ "embeddings": rows }));
    Ok(())
}
