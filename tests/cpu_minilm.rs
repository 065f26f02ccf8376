//! all-MiniLM-L6-v2 on the CPU backend (Cranelift native code) against the golden outputs of an
//! independent float64 implementation (tests/data/minilm/golden.json): unpadded and padded
//! embeddings and the encoder output, single-threaded and on two threads, then the same plans
//! through an artifact and the compiler-free `PrecompiledCpu` backend.
//!
//! The model comes from `kiln fetch-model minilm` (`.ci/run` fetches it). Without it the test
//! fails under CI (CI set) and is skipped with a printed reason elsewhere.

mod common;

use common::{buckets, check_backend, golden, model_dir};
use kiln::model::SentenceModel;
use kiln_compiler::backends::cpu::{CpuBackend, CpuOptions};
use kiln_compiler::models::bert::BertOutputs;
use kiln_runtime::artifact::Artifact;
use kiln_runtime::cpu::{PrecompiledCpu, Threads};
use kiln_runtime::{Backend, Bucket};

#[test]
fn minilm_cpu_matches_golden() {
    let Some(dir) = model_dir() else { return };
    let g = golden();
    let m = SentenceModel::open(&dir, BertOutputs { embeddings: true, last_hidden_state: true }).unwrap();
    let weights = m.load_weights().unwrap();
    check_backend(CpuBackend::single_threaded().unwrap(), &m, &weights, &g);
    let two = CpuOptions { threads: Threads::Count(2), ..Default::default() };
    check_backend(CpuBackend::with_options(two).unwrap(), &m, &weights, &g);
}

#[test]
fn minilm_precompiled_cpu_matches_golden() {
    let Some(dir) = model_dir() else { return };
    let g = golden();
    let m = SentenceModel::open(&dir, BertOutputs { embeddings: true, last_hidden_state: true }).unwrap();
    let weights = m.load_weights().unwrap();
    let artifact = CpuBackend::new().unwrap().build_artifact(&m.graph, &buckets(&g)).unwrap();
    let artifact = Artifact::from_bytes(&artifact.to_bytes()).unwrap();
    check_backend(PrecompiledCpu::with_threads(artifact, Threads::Count(2)).unwrap(), &m, &weights, &g);
}

/// Lowering one MiniLM bucket (middle-end + Cranelift for every kernel + load) stays under
/// 150 ms in release builds (weights were packed once at upload). Debug builds only print.
#[test]
fn minilm_cpu_lowering_is_fast() {
    let Some(dir) = model_dir() else { return };
    let m = SentenceModel::open(&dir, BertOutputs::default()).unwrap();
    let weights = m.load_weights().unwrap();
    let be = CpuBackend::new().unwrap();
    let w = be.upload(&weights, &m.graph).unwrap();
    for b in [Bucket::new(1, 128), Bucket::new(8, 128)] {
        let t = std::time::Instant::now();
        let (_, times) = be.lower_timed(&w, &m.graph, b).unwrap();
        let ms = t.elapsed().as_secs_f64() * 1e3;
        println!("lowering {b}: {ms:.1} ms ({times:?})");
        if !cfg!(debug_assertions) {
            assert!(ms < 150.0, "lowering {b} took {ms:.1} ms");
        }
    }
}
