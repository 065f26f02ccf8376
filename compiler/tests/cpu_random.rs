//! The CPU backend on random graphs from the middle-end generator: every graph is lowered to
//! native code (fusion, memory planning, Cranelift) and run, and its outputs are compared with
//! the reference interpreter on the original graph. Single-threaded and 2-thread plans both.
//!
//! `KILN_RANDOM_CASES=N` runs N seeds instead of the default; `KILN_SEED_BASE=S` starts at S.

use kiln_compiler::ir::GraphExt as _;
use kiln_compiler::backends::cpu::{CpuBackend, CpuOptions};
use kiln_compiler::codegen::cpu::CpuTarget;
use kiln_compiler::reference::interpret;
use kiln_testkit::random::{compare, random_case};
use kiln_runtime::cpu::Threads;
use kiln_runtime::{Backend, Batch, Outputs};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn check_seed(backend: &CpuBackend, seed: u64) -> Result<(), String> {
    let case = random_case(seed);
    let want = interpret(&case.graph, &case.weights, &case.inputs, case.bucket).map_err(|e| format!("reference: {e}"))?;
    let w = backend.upload(&case.weights, &case.graph).map_err(|e| format!("upload: {e}"))?;
    let mut plan = backend.lower(&w, &case.graph, case.bucket).map_err(|e| format!("lower: {e}"))?;
    let mut out = Outputs::for_bucket(&case.graph, case.bucket);
    let batch = Batch { tensors: case.inputs.clone() };
    backend.run(&mut plan, &batch, &mut out).map_err(|e| format!("run: {e}"))?;
    compare(&out.tensors, &want, 2e-3, 2e-3).map_err(|e| format!("cpu differs: {e}"))?;
    // A second run on the same plan gives the same answer (no state leaks between runs).
    let first = out.tensors.clone();
    backend.run(&mut plan, &batch, &mut out).map_err(|e| format!("second run: {e}"))?;
    if first != out.tensors {
        return Err("a second run gave different outputs".into());
    }
    Ok(())
}

fn run_seeds(backend: &CpuBackend, n: usize, base: u64) {
    let mut failures = Vec::new();
    for seed in base..base + n as u64 {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check_seed(backend, seed))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push((seed, e)),
            Err(p) => {
                let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
                failures.push((seed, format!("panic: {}", msg.unwrap_or_default())));
            }
        }
    }
    if let Some((first, _)) = failures.first() {
        let case = random_case(*first);
        panic!(
            "{} of {n} random graphs failed on the CPU backend ({} threads):\n{}\nfirst failing graph, bucket {}:\n{}",
            failures.len(),
            backend.threads(),
            failures.iter().take(20).map(|(s, e)| format!("seed {s}: {e}")).collect::<Vec<_>>().join("\n"),
            case.bucket,
            case.graph.print()
        );
    }
}

#[test]
fn random_graphs_match_the_reference_single_threaded() {
    let backend = CpuBackend::single_threaded().unwrap();
    run_seeds(&backend, env_usize("KILN_RANDOM_CASES", 400), env_usize("KILN_SEED_BASE", 0) as u64);
}

#[test]
fn random_graphs_match_the_reference_on_two_threads() {
    let backend = CpuBackend::with_options(CpuOptions { threads: Threads::Count(2), ..Default::default() }).unwrap();
    run_seeds(&backend, env_usize("KILN_RANDOM_CASES", 400) / 2, env_usize("KILN_SEED_BASE", 0) as u64 + 7000);
}

/// An SSE4.1-only target (no AVX, no FMA): separate multiply and add, legacy SSE encodings whose
/// folded memory operands must be 16-byte aligned — so unaligned vector accesses would fault.
#[test]
fn random_graphs_match_the_reference_on_an_sse41_target() {
    let features = ["sse3", "ssse3", "sse4.1", "sse4.2", "popcnt"].iter().map(|s| s.to_string()).collect();
    let opts = CpuOptions { threads: Threads::Count(2), target: CpuTarget::X86_64 { features } };
    let backend = CpuBackend::with_options(opts).unwrap();
    assert!(!backend.isa().has_fma);
    run_seeds(&backend, env_usize("KILN_RANDOM_CASES", 400) / 4, env_usize("KILN_SEED_BASE", 0) as u64 + 20000);
}
