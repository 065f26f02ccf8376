//! all-MiniLM-L6-v2 end to end on the reference backend (the f64 oracle) against golden outputs
//! of an independent float64 implementation (tests/data/minilm/golden.json): tokenization,
//! unpadded and padded embeddings, and the encoder output. `cpu_minilm.rs` checks the CPU
//! backend the same way (see `common::check_backend`).
//!
//! The model comes from `kiln fetch-model minilm` (`.ci/run` fetches it). Without it the test
//! fails under CI (CI set) and is skipped with a printed reason elsewhere.

mod common;

use common::{check_backend, golden, ids, model_dir};
use kiln::model::SentenceModel;
use kiln_compiler::reference::ReferenceBackend;
use kiln_compiler::models::bert::BertOutputs;

#[test]
fn minilm_matches_golden() {
    let Some(dir) = model_dir() else { return };
    let g = golden();
    let m = SentenceModel::open(&dir, BertOutputs { embeddings: true, last_hidden_state: true }).unwrap();
    // Tokenization matches the independent implementation's ids.
    for s in g["sentences"].as_array().unwrap() {
        let got = m.tokenize(&[s["text"].as_str().unwrap()]).unwrap();
        assert_eq!(got[0], ids(&s["ids"]), "token ids of {:?}", s["text"]);
    }
    let weights = m.load_weights().unwrap();
    check_backend(ReferenceBackend, &m, &weights, &g);
}
