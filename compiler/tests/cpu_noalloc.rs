//! `Backend::run` of a CPU plan allocates nothing: a counting global allocator watches every
//! thread (the caller and the pool's workers) while a BERT-shaped plan — gather, layer norms,
//! GEMMs with fused epilogues, attention, reductions, kernels split over the pool — runs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use kiln_compiler::backends::cpu::{CpuBackend, CpuOptions};
use kiln_compiler::reference::interpret;
use kiln_compiler::models::bert::{build_bert, BertConfig, BertOutputs};
use kiln_testkit::random::{compare, random_inputs, random_weights, Rng};
use kiln_runtime::cpu::Threads;
use kiln_runtime::{Backend, Batch, Bucket, Outputs};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn config() -> BertConfig {
    serde_json::from_str(
        r#"{"vocab_size": 60, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 256, "max_position_embeddings": 64}"#,
    )
    .unwrap()
}

fn check(threads: Threads) {
    let graph = build_bert(&config(), "", BertOutputs { embeddings: true, last_hidden_state: true }).unwrap();
    let mut rng = Rng::new(11);
    let bucket = Bucket::new(4, 64);
    let weights = random_weights(&graph, &mut rng);
    let inputs = random_inputs(&graph, bucket, &mut rng);
    let backend = CpuBackend::with_options(CpuOptions { threads, ..Default::default() }).unwrap();
    let w = backend.upload(&weights, &graph).unwrap();
    let mut plan = backend.lower(&w, &graph, bucket).unwrap();
    if backend.threads() > 1 {
        assert!(plan.image().steps.iter().any(|s| s.tasks > 1), "no step is split over the pool");
    }
    let batch = Batch { tensors: inputs.clone() };
    let mut out = Outputs::for_bucket(&graph, bucket);
    // Warm up (first touches of the pool, lazily initialized std internals).
    for _ in 0..3 {
        backend.run(&mut plan, &batch, &mut out).unwrap();
    }
    let before = ALLOCS.load(Ordering::SeqCst);
    for _ in 0..20 {
        backend.run(&mut plan, &batch, &mut out).unwrap();
    }
    let allocs = ALLOCS.load(Ordering::SeqCst) - before;
    assert_eq!(allocs, 0, "{allocs} allocations during 20 runs on {} thread(s)", backend.threads());
    let want = interpret(&graph, &weights, &inputs, bucket).unwrap();
    compare(&out.tensors, &want, 1e-3, 1e-3).unwrap();
}

#[test]
fn run_does_not_allocate() {
    check(Threads::Single);
    check(Threads::Count(2));
}
