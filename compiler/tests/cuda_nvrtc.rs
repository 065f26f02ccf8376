//! NVRTC on every MiniLM kernel, without a GPU: the emitted CUDA C of whole MiniLM plans
//! compiles to PTX for sm_90 and sm_80 (and assembles to cubin where ptxas is on PATH), as do
//! the tensor-core (f16/bf16) GEMM variants.
//!
//! Without the NVRTC library these tests fail when `KILN_REQUIRE_NVRTC=1` (CI sets it after
//! installing the nvidia-cuda-nvrtc-cu12 wheel) and are skipped with a printed reason otherwise.

use std::time::Instant;

use kiln_compiler::codegen::cuda::nvrtc::{compile_ptx, find_ptxas, nvrtc_version};
use kiln_compiler::codegen::cuda::{compile_graph, CudaTarget};
use kiln_compiler::ir::GraphBuilder;
use kiln_compiler::models::bert::{build_bert, BertConfig, BertOutputs};
use kiln_testkit::random::nvrtc_or_skip;
use kiln_runtime::cuda::ptx_entries;
use kiln_runtime::graph::{Dim, InputRole};
use kiln_runtime::{Bucket, DType, Error, Graph};

/// Compiles `g` for every (arch, bucket) and checks the PTX defines every launched kernel.
fn compile_all(what: &str, g: &Graph, archs: &[&str], buckets: &[Bucket]) {
    let (maj, min) = nvrtc_version().unwrap();
    let ptxas = find_ptxas();
    for arch in archs {
        let target = CudaTarget::new(arch).unwrap();
        for &b in buckets {
            let t = Instant::now();
            let c = compile_graph(g, b, &target).unwrap_or_else(|e| panic!("{what} {b} {arch}: {e}"));
            let entries = ptx_entries(&c.spec.ptx);
            assert_eq!(entries.len(), c.module.kernels.len(), "{what} {b} {arch}: one .entry per kernel");
            for l in &c.spec.launches {
                assert!(entries.contains(&l.kernel), "{what} {b} {arch}: kernel {} missing from the PTX", l.kernel);
            }
            assert!(c.spec.ptx.contains(&format!(".target {arch}")), "{what} {b} {arch}: PTX for another target");
            if ptxas.is_some() {
                assert!(c.spec.cubin.as_ref().is_some_and(|c| !c.is_empty()), "{what} {b} {arch}: ptxas on PATH but no cubin");
            }
            let mut kinds = std::collections::BTreeMap::<String, usize>::new();
            for k in &c.module.kernels {
                *kinds.entry(k.kind.clone()).or_default() += 1;
            }
            eprintln!(
                "{what} {b} {arch}: {} kernels {kinds:?}, {} KiB CUDA C, {} KiB PTX, cubin {}, NVRTC {maj}.{min}, {:.2} s",
                c.module.kernels.len(),
                c.module.source.len() / 1024,
                c.spec.ptx.len() / 1024,
                c.spec.cubin.as_ref().map_or("none (no ptxas)".to_string(), |c| format!("{} KiB", c.len() / 1024)),
                t.elapsed().as_secs_f64()
            );
        }
    }
}

#[test]
fn minilm_kernels_compile_for_sm90_and_sm80() {
    if !nvrtc_or_skip() {
        return;
    }
    let g = build_bert(&BertConfig::minilm_l6(), "", BertOutputs { embeddings: true, last_hidden_state: true }).unwrap();
    compile_all("MiniLM", &g, &["sm_90", "sm_80"], &[Bucket::new(1, 128), Bucket::new(32, 128), Bucket::new(3, 17)]);
}

#[test]
fn tensor_core_gemms_compile() {
    if !nvrtc_or_skip() {
        return;
    }
    for dt in [DType::F16, DType::BF16] {
        let mut gb = GraphBuilder::new();
        let x = gb.input("x", dt, vec![Dim::Batch, Dim::Seq, Dim::Fixed(384)], InputRole::Other).unwrap();
        let w = gb.weight("w", dt, &[1536, 384]).unwrap();
        let b = gb.weight("b", dt, &[1536]).unwrap();
        let h = gb.linear(x, w, Some(b)).unwrap();
        let h = gb.gelu(h).unwrap();
        gb.output("h", h);
        let g = gb.finish().unwrap();
        let c = compile_graph(&g, Bucket::new(8, 128), &CudaTarget::new("sm_90").unwrap()).unwrap();
        assert!(c.module.kernels.iter().any(|k| k.kind.starts_with("gemm/mma_")), "{dt}: no tensor-core GEMM");
        assert!(c.spec.ptx.contains("mma.sync.aligned.m16n8k16"), "{dt}: PTX has no mma.sync");
        compile_all(&format!("{dt} linear"), &g, &["sm_80", "sm_90"], &[Bucket::new(8, 128)]);
    }
}

#[test]
fn nvrtc_errors_are_typed_with_the_log() {
    if !nvrtc_or_skip() {
        return;
    }
    let e = compile_ptx("extern \"C\" __global__ void k(float* x) { x[0] = undefined_name; }", "sm_90", "bad").unwrap_err();
    match e {
        Error::Internal { stage, message } => {
            assert!(stage == "nvrtc" && message.contains("undefined_name") && message.contains("`bad`"), "{message}")
        }
        other => panic!("expected an internal error (kiln emitted bad CUDA C), got {other:?}"),
    }
    assert!(compile_ptx("", "gfx90a", "x").is_err());
}

/// `build::precompile` builds GPU artifacts through the same target seam as `kiln compile`:
/// the header names the architecture and every bucket's plan decodes and validates.
#[test]
fn precompile_builds_gpu_artifacts() {
    if !nvrtc_or_skip() {
        return;
    }
    use kiln_compiler::build::{precompile, Precompile};
    use kiln_runtime::artifact::{Artifact, Target};
    let dir = std::env::temp_dir().join(format!("kiln-precompile-gpu-{}", std::process::id()));
    let out = dir.join("tiny.kiln");
    let spec = Precompile {
        graph: build_bert(&BertConfig::tiny(), "", BertOutputs::default()).unwrap(),
        buckets: vec![Bucket::new(1, 8), Bucket::new(2, 16)],
        target: "cuda:sm_80".into(),
    };
    precompile(&spec, &out).unwrap();
    let a = Artifact::from_file(&out).unwrap();
    assert_eq!(a.header.target, Target::Cuda { major: 8, minor: 0 });
    for &b in &spec.buckets {
        let plan = kiln_runtime::cuda::plan_from_artifact(&a, b).unwrap();
        assert_eq!(plan.arch, "sm_80");
        assert!(!plan.ptx.is_empty());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
