//! Semantic tests of the middle-end: random graphs are specialized, simplified, fused and
//! memory-planned, then the kernel program is executed by the kernel-level evaluator (every
//! kernel from its own kernel-IR description, on the planned arena) and compared with the
//! reference interpreter on the original, unfused graph.
//!
//! `KILN_RANDOM_CASES=N` runs N seeds instead of the default; `KILN_SEED_BASE=S` starts at S
//! (to explore new seeds across runs; CI keeps the fixed default list).

use kiln_compiler::ir::GraphExt as _;
use kiln_compiler::reference::interpret;
use kiln_testkit::kernel_eval::run_program;
use kiln_compiler::memory_plan::check_plan;
use kiln_compiler::pipeline::run_pipeline;
use kiln_testkit::random::{compare, random_case};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn check_seed(seed: u64) -> Result<(), String> {
    let case = random_case(seed);
    let lowered = run_pipeline(&case.graph, case.bucket).map_err(|e| format!("pipeline: {e}"))?;
    check_plan(&lowered.program, &lowered.plan).map_err(|e| format!("plan: {e}"))?;
    let want = interpret(&case.graph, &case.weights, &case.inputs, case.bucket).map_err(|e| format!("reference: {e}"))?;
    // The passes alone must not change what the graph computes (up to f32 rounding: the
    // reference rounds at an f32->f32 cast, which `simplify` removes as an identity).
    let after_passes = interpret(&lowered.graph, &case.weights, &case.inputs, case.bucket)
        .map_err(|e| format!("reference on the optimized graph: {e}"))?;
    compare(&after_passes, &want, 2e-3, 2e-3).map_err(|e| format!("passes changed the result: {e}"))?;
    let got = run_program(&lowered.program, &lowered.plan, &case.weights, &case.inputs)
        .map_err(|e| format!("kernel eval: {e}"))?;
    compare(&got, &want, 2e-3, 2e-3).map_err(|e| format!("fused program differs: {e}"))
}

#[test]
fn random_graphs_fused_and_planned_match_the_reference() {
    let n = env_usize("KILN_RANDOM_CASES", 8000);
    let base = env_usize("KILN_SEED_BASE", 0) as u64;
    let mut failures = Vec::new();
    for seed in base..base + n as u64 {
        match std::panic::catch_unwind(|| check_seed(seed)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(format!("seed {seed}: {e}")),
            Err(p) => {
                let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
                failures.push(format!("seed {seed}: panic: {}", msg.unwrap_or_default()));
            }
        }
    }
    if !failures.is_empty() {
        let first: u64 = failures[0].split(':').next().unwrap()[5..].parse().unwrap();
        let shown = std::panic::catch_unwind(|| {
            let case = random_case(first);
            format!("bucket {}:\n{}", case.bucket, case.graph.print())
        })
        .unwrap_or_default();
        panic!(
            "{} of {n} random graphs failed:\n{}\nfirst failing graph, {shown}",
            failures.len(),
            failures.iter().take(20).cloned().collect::<Vec<_>>().join("\n"),
        );
    }
}

#[test]
fn random_graphs_cover_every_kernel_kind() {
    use std::collections::BTreeMap;
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    let (mut nodes, mut kernels, mut inplace) = (0, 0, 0);
    for seed in 0..1500u64 {
        let case = random_case(seed);
        nodes += case.graph.nodes.len();
        let l = run_pipeline(&case.graph, case.bucket).unwrap();
        kernels += l.program.kernels.len();
        inplace += l.plan.placements.iter().filter(|p| p.inplace_of.is_some()).count();
        for (k, v) in l.program.kernels_by_kind() {
            *kinds.entry(k.to_string()).or_insert(0) += v;
        }
    }
    println!("nodes {nodes} kernels {kernels} inplace {inplace} {kinds:?}");
    // The generator must keep exercising every kernel kind and the in-place path.
    for kind in ["attention", "concat", "copy", "elementwise", "gather", "gemm", "layer_norm", "reduce", "rms_norm", "softmax"] {
        let n = kinds.get(kind).copied().unwrap_or(0);
        assert!(n >= 50, "only {n} `{kind}` kernels in 1500 random graphs");
    }
    assert!(inplace >= 100, "only {inplace} in-place reuses");
    assert!(nodes > 20 * 1500 && kernels < nodes / 3, "graphs too small or fusion too weak");
}
