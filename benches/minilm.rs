//! Criterion benchmarks of MiniLM on the CPU backend: one forward pass per bucket (1×16, 1×128,
//! 8×128, 32×128, 1×512) and lowering one bucket (middle end + Cranelift + load), with the matmul
//! throughput reported by criterion as elements = flops (read "Gelem/s" as GFLOP/s).
//!
//! `cargo bench --bench minilm` (the model must be present: `kiln fetch-model minilm`, or
//! `KILN_MODEL_DIR`). `KILN_BENCH_BUCKETS=1x16,1x128` picks buckets. For the comparison with
//! onnxruntime in the same run, see `scripts/ort_compare.py`; `kiln bench` prints the same
//! medians with the GFLOP/s against the measured FMA peak.

use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kiln::model::{bench_token_ids, SentenceModel};
use kiln_compiler::backends::cpu::CpuBackend;
use kiln_compiler::models::bert::BertOutputs;
use kiln_compiler::pipeline::compile_report;
use kiln_runtime::{Backend, Batch, Bucket, Outputs};

fn model_dir() -> Option<PathBuf> {
    // `cargo bench` runs in the package root, where the default (relative) model folder lives.
    let dir = kiln::fetch::default_model_dir();
    if kiln::fetch::is_complete(&dir) {
        Some(dir)
    } else {
        eprintln!("SKIPPED: MiniLM not found in {} (run `kiln fetch-model minilm`)", dir.display());
        None
    }
}

fn buckets() -> Vec<Bucket> {
    let spec = std::env::var("KILN_BENCH_BUCKETS").unwrap_or_else(|_| "1x16,1x128,8x128,32x128,1x512".into());
    spec.split(',').map(|b| Bucket::parse(b.trim()).expect("KILN_BENCH_BUCKETS: a list like 1x16,1x128")).collect()
}

fn minilm(c: &mut Criterion) {
    let Some(dir) = model_dir() else { return };
    let m = SentenceModel::open(&dir, BertOutputs::default()).expect("open MiniLM");
    let host = m.load_weights().expect("load weights");
    let be = CpuBackend::new().expect("cpu backend");
    let w = be.upload(&host, &m.graph).expect("upload");

    let mut lower = c.benchmark_group("minilm_lower");
    lower.sample_size(10);
    for b in buckets() {
        lower.bench_function(b.to_string(), |bench| bench.iter(|| be.lower(&w, &m.graph, b).expect("lower")));
    }
    lower.finish();

    let mut fwd = c.benchmark_group(format!("minilm_forward_{}t", be.threads()));
    fwd.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    for b in buckets() {
        let flops = compile_report(&m.graph, b).expect("report").matmul_flops;
        fwd.throughput(Throughput::Elements(u64::try_from(flops).expect("MiniLM flops fit in u64")));
        let mut plan = be.lower(&w, &m.graph, b).expect("lower");
        let batch = Batch::from_token_ids(&m.graph, &bench_token_ids(b)).expect("batch");
        let mut out = Outputs::for_bucket(&m.graph, b);
        fwd.bench_function(b.to_string(), |bench| bench.iter(|| be.run(&mut plan, &batch, &mut out).expect("run")));
    }
    fwd.finish();
}

criterion_group!(benches, minilm);
criterion_main!(benches);
