//! Shared by the MiniLM integration tests: where the model is, the golden data, and one check
//! of a backend against every golden value.
#![allow(dead_code)]

use std::path::PathBuf;

use kiln::model::{cosine, embed_ids, SentenceModel};
use kiln_runtime::{Backend, Batch, Bucket, Engine, HostTensor, LowerPolicy};
use serde_json::Value;

/// The model directory, or `None` (test skipped with a printed reason) when it is absent outside
/// CI. Under CI (`CI` set) a missing model fails the test: the golden tests must really run there.
pub fn model_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("KILN_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/all-MiniLM-L6-v2"));
    if kiln::fetch::is_complete(&dir) {
        return Some(dir);
    }
    let msg = format!("MiniLM not found in {} (run `kiln fetch-model minilm`)", dir.display());
    if std::env::var_os("CI").is_some() {
        panic!("{msg}: the MiniLM tests must run in CI");
    }
    eprintln!("SKIPPED: {msg}");
    None
}

pub fn golden() -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/minilm/golden.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

pub fn ids(v: &Value) -> Vec<i64> {
    v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect()
}

pub fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let cos = cosine(got, want);
    let max_abs = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    println!("{what}: cosine {cos:.9}, max abs diff {max_abs:.2e}");
    assert!(cos >= 0.99999, "{what}: cosine {cos} < 0.99999");
    assert!(max_abs <= 1e-4, "{what}: max abs diff {max_abs} > 1e-4");
}

/// Checks one backend against every golden value.
pub fn check_backend<B: Backend>(backend: B, m: &SentenceModel, weights: &[HostTensor], g: &Value) {
    let name = format!("{} ({})", backend.caps().name, backend.caps().device);
    let sentences = g["sentences"].as_array().unwrap();
    // A precompiled backend's `lower` loads the artifact's plan instead of compiling.
    let engine = Engine::new(backend, m.graph.clone(), weights, &buckets(g), LowerPolicy::OnFirstRequest).unwrap();

    // Unpadded: one sentence at a time (the engine pads tokens up to the bucket).
    for (i, s) in sentences.iter().enumerate() {
        let e = embed_ids(&engine, &[ids(&s["ids"])]).unwrap();
        assert_close(&format!("{name}: sentence {i} alone"), &e[0], &floats(&s["embedding"]));
    }

    // The golden padded batch, fed as given (ids padded with 0, its attention mask).
    let pb = &g["padded_batch"];
    let rows: Vec<Vec<i64>> = pb["ids"].as_array().unwrap().iter().map(ids).collect();
    let mask: Vec<Vec<i64>> = pb["attention_mask"].as_array().unwrap().iter().map(ids).collect();
    let (r, t) = (rows.len(), rows[0].len());
    let batch = Batch {
        tensors: vec![
            HostTensor::i64(vec![r, t], rows.concat()).unwrap(),
            HostTensor::i64(vec![r, t], mask.concat()).unwrap(),
            HostTensor::i64(vec![r, t], vec![0; r * t]).unwrap(),
        ],
    };
    let out = engine.infer(&batch).unwrap();
    let k = engine.graph().output_names.iter().position(|n| n == "embeddings").unwrap();
    let e = out.tensors[k].to_f32_vec();
    for (i, want) in pb["embeddings"].as_array().unwrap().iter().enumerate() {
        assert_close(&format!("{name}: padded row {i}"), &e[i * 384..(i + 1) * 384], &floats(want));
    }

    // The encoder output of sentence 0, first 8 values per token.
    let k = engine.graph().output_names.iter().position(|n| n == "last_hidden_state").unwrap();
    let s0 = ids(&sentences[0]["ids"]);
    let out = engine.infer(&Batch::from_token_ids(engine.graph(), std::slice::from_ref(&s0)).unwrap()).unwrap();
    let h = out.tensors[k].to_f32_vec();
    for (tok, want) in g["last_hidden_state_sentence0_first8"].as_array().unwrap().iter().enumerate() {
        let got = &h[tok * 384..tok * 384 + 8];
        let want = floats(want);
        let max_abs = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(max_abs <= 1e-4, "{name}: hidden state token {tok}: max abs diff {max_abs}");
    }
}

pub fn buckets(g: &Value) -> Vec<Bucket> {
    let n = g["sentences"].as_array().unwrap().len();
    vec![Bucket::new(1, 16), Bucket::new(1, 64), Bucket::new(n, 64)]
}

