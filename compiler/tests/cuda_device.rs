//! The CUDA backend on a real GPU. Every test that needs a device skips with a printed reason
//! where there is none (no `libcuda`, or the driver reports no GPU), unless `KILN_REQUIRE_GPU=1`
//! (set by scripts/gpu_check.sh), which turns a missing device into a failure.
//!
//! - `no_driver_is_a_one_line_error` runs on machines WITHOUT the driver (what CI checks).
//! - `tiny_bert_on_gpu_matches_reference`: random weights, every kernel kind, vs the reference.
//! - `minilm_on_gpu_matches_golden`: all-MiniLM-L6-v2 vs tests/data/minilm/golden.json
//!   (cos >= 0.99999), unpadded and padded, where the model is present (KILN_MODEL_DIR or
//!   models/all-MiniLM-L6-v2).
//! - `plan_serializes_and_reloads`: a plan compiled ahead of time, bincode round trip, loaded
//!   by the runtime executor alone, same results; CUDA-graph replay equals the first run.
//! - `artifact_runs_through_precompiled_cuda`: the same plan in an artifact, through the
//!   runtime's `PrecompiledCuda` (this device's arch, and sm_80 PTX on newer devices).
//! - `bench_buckets` (ignored; scripts/gpu_check.sh runs it): per-bucket timings as JSON lines.

use std::path::PathBuf;
use std::time::Instant;

use kiln_compiler::backends::cuda::CudaBackend;
use kiln_compiler::reference::interpret;
use kiln_compiler::codegen::cuda::{compile_graph, CudaTarget};
use kiln_compiler::models::bert::{build_bert, BertConfig, BertOutputs};
use kiln_runtime::{
    load_graph_weights, Backend, Batch, Bucket, Engine, Graph, HostTensor, LowerPolicy, Outputs, SafetensorsLoader, TensorData,
};

fn require_gpu() -> bool {
    std::env::var("KILN_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// The backend, or `None` (reason printed) where this machine cannot run it.
fn backend() -> Option<CudaBackend> {
    // SAFETY: only probes for the library.
    let driver = unsafe { cudarc::driver::sys::is_culib_present() };
    match CudaBackend::new() {
        Ok(b) => {
            eprintln!("GPU: {}", b.caps().device);
            Some(b)
        }
        Err(e) if !require_gpu() && !driver => {
            eprintln!("SKIPPED (no GPU here): {e}");
            None
        }
        Err(e) if !require_gpu() => {
            eprintln!("SKIPPED (CUDA driver present but unusable): {e}");
            None
        }
        Err(e) => panic!("KILN_REQUIRE_GPU=1 but the CUDA backend cannot start: {e}"),
    }
}

#[test]
fn no_driver_is_a_one_line_error() {
    // SAFETY: only probes for the library.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        eprintln!("SKIPPED: this machine has a CUDA driver library");
        return;
    }
    let e = CudaBackend::new().unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("CUDA driver library not found"), "{msg}");
    assert!(msg.contains("libcuda"), "{msg}");
    assert!(!msg.contains('\n'), "not one line: {msg}");
    // An ahead-of-time compile needs no driver.
    if kiln_compiler::codegen::cuda::nvrtc::nvrtc_present() {
        let g = build_bert(&BertConfig::tiny(), "", BertOutputs::default()).unwrap();
        compile_graph(&g, Bucket::new(1, 8), &CudaTarget::new("sm_90").unwrap()).unwrap();
    }
}

fn rand_vec(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn random_weights(g: &Graph) -> Vec<HostTensor> {
    g.weights
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let n = w.shape.iter().product();
            HostTensor::new(w.shape.clone(), TensorData::F32(rand_vec(n, i as u64 + 1, 0.5)).convert(w.dtype)).unwrap()
        })
        .collect()
}

fn max_rel_err(a: &HostTensor, b: &HostTensor) -> f64 {
    a.data.to_f64_vec().iter().zip(b.data.to_f64_vec()).map(|(x, y)| (x - y).abs() / y.abs().max(1.0)).fold(0.0, f64::max)
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (*x as f64, *y as f64);
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    ab / (aa.sqrt() * bb.sqrt()).max(1e-300)
}

fn token_batch(b: Bucket, vocab: i64, real: &[usize]) -> Vec<HostTensor> {
    let n = b.batch * b.seq;
    let ids: Vec<i64> = rand_vec(n, 99, 1.0).iter().map(|x| ((x + 1.0) * 0.5 * vocab as f32) as i64 % vocab).collect();
    let mask: Vec<i64> = (0..n).map(|i| (i % b.seq < real[i / b.seq]) as i64).collect();
    vec![
        HostTensor::i64(vec![b.batch, b.seq], ids).unwrap(),
        HostTensor::i64(vec![b.batch, b.seq], mask).unwrap(),
        HostTensor::i64(vec![b.batch, b.seq], vec![0; n]).unwrap(),
    ]
}

#[test]
fn tiny_bert_on_gpu_matches_reference() {
    let Some(be) = backend() else { return };
    let g = build_bert(&BertConfig::tiny(), "", BertOutputs { embeddings: true, last_hidden_state: true }).unwrap();
    let w = random_weights(&g);
    let uploaded = be.upload(&w, &g).unwrap();
    for (b, real) in [(Bucket::new(1, 8), vec![8]), (Bucket::new(3, 40), vec![40, 17, 1])] {
        let inputs = token_batch(b, 50, &real);
        let mut plan = be.lower(&uploaded, &g, b).unwrap();
        let mut out = Outputs::for_bucket(&g, b);
        be.run(&mut plan, &Batch { tensors: inputs.clone() }, &mut out).unwrap();
        let want = interpret(&g, &w, &inputs, b).unwrap();
        for (i, (a, r)) in out.tensors.iter().zip(&want).enumerate() {
            let err = max_rel_err(a, r);
            assert!(err <= 1e-4, "bucket {b} output {i}: error {err:e}");
        }
        // The second run replays the captured CUDA graph: same results.
        let mut again = Outputs::for_bucket(&g, b);
        be.run(&mut plan, &Batch { tensors: inputs }, &mut again).unwrap();
        assert_eq!(again, out, "bucket {b}: graph replay differs from the first run");
        eprintln!("bucket {b}: ok (CUDA graph: {})", plan.uses_graph());
    }
}

fn model_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("KILN_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/all-MiniLM-L6-v2"));
    if dir.join("model.safetensors").is_file() && dir.join("config.json").is_file() {
        Some(dir)
    } else {
        let msg = format!("MiniLM not found in {} (run `kiln fetch-model minilm`)", dir.display());
        if require_gpu() {
            panic!("{msg}");
        }
        eprintln!("SKIPPED: {msg}");
        None
    }
}

fn golden() -> serde_json::Value {
    // KILN_GOLDEN: where a test binary built elsewhere finds it (scripts/gpu_check.sh).
    let p = std::env::var_os("KILN_GOLDEN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/minilm/golden.json"));
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn json_f32(v: &serde_json::Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn json_i64(v: &serde_json::Value) -> Vec<i64> {
    v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect()
}

fn minilm(dir: &std::path::Path) -> (Graph, Vec<HostTensor>) {
    let cfg = BertConfig::from_file(&dir.join("config.json")).unwrap();
    let g = build_bert(&cfg, "", BertOutputs::default()).unwrap();
    let w = load_graph_weights(&SafetensorsLoader::new(), &dir.join("model.safetensors"), &g.weights).unwrap();
    (g, w)
}

#[test]
fn minilm_on_gpu_matches_golden() {
    let Some(be) = backend() else { return };
    let Some(dir) = model_dir() else { return };
    let (g, w) = minilm(&dir);
    let gold = golden();
    let sentences = gold["sentences"].as_array().unwrap();
    let buckets = [Bucket::new(1, 16), Bucket::new(1, 64), Bucket::new(sentences.len(), 64)];
    let engine = Engine::new(be, g.clone(), &w, &buckets, LowerPolicy::OnFirstRequest).unwrap();
    let k = g.output_names.iter().position(|n| n == "embeddings").unwrap();
    let mut worst = 1.0f64;
    for (i, s) in sentences.iter().enumerate() {
        let batch = Batch::from_token_ids(&g, &[json_i64(&s["ids"])]).unwrap();
        let out = engine.infer(&batch).unwrap();
        let c = cosine(&out.tensors[k].to_f32_vec(), &json_f32(&s["embedding"]));
        worst = worst.min(c);
        assert!(c >= 0.99999, "sentence {i}: cosine {c}");
    }
    let seqs: Vec<Vec<i64>> = sentences.iter().map(|s| json_i64(&s["ids"])).collect();
    let out = engine.infer(&Batch::from_token_ids(&g, &seqs).unwrap()).unwrap();
    let e = out.tensors[k].to_f32_vec();
    for (i, s) in sentences.iter().enumerate() {
        let c = cosine(&e[i * 384..(i + 1) * 384], &json_f32(&s["embedding"]));
        worst = worst.min(c);
        assert!(c >= 0.99999, "padded batch row {i}: cosine {c}");
    }
    eprintln!("MiniLM on GPU: worst cosine vs golden {worst:.8} over {} sentences", sentences.len());
}

#[test]
fn plan_serializes_and_reloads() {
    let Some(be) = backend() else { return };
    let g = build_bert(&BertConfig::tiny(), "", BertOutputs::default()).unwrap();
    let w = random_weights(&g);
    let b = Bucket::new(2, 16);
    // Compiled ahead of time for this device's architecture, as a build machine would.
    let spec = compile_graph(&g, b, &CudaTarget::new(&be.device().arch()).unwrap()).unwrap().spec;
    // Through the artifact container, as a shipped plan travels.
    use kiln_runtime::artifact::{Artifact, PlanPayload, Target};
    let (major, minor) = be.device().compute_capability();
    let bytes = Artifact::new(&g, Target::Cuda { major, minor }, vec![(b, PlanPayload::Cuda(spec.clone()))]).to_bytes();
    let back = kiln_runtime::cuda::plan_from_artifact(&Artifact::from_bytes(&bytes).unwrap(), b).unwrap();
    assert_eq!(back, spec);
    let dev = be.device().clone();
    let weights = dev.upload_weights(&w).unwrap();
    let mut plan = dev.load_plan(back, &weights).unwrap();
    let inputs = token_batch(b, 50, &[16, 9]);
    let mut out = Outputs::for_bucket(&g, b);
    plan.run(&Batch { tensors: inputs.clone() }, &mut out).unwrap();
    let want = interpret(&g, &w, &inputs, b).unwrap();
    assert!(max_rel_err(&out.tensors[0], &want[0]) <= 1e-4);
    eprintln!("serialized plan: {} bytes ({} launches, cubin: {})", bytes.len(), spec.launches.len(), spec.cubin.is_some());
}

#[test]
fn artifact_runs_through_precompiled_cuda() {
    use kiln_runtime::artifact::{Artifact, PlanPayload, Target};
    use kiln_runtime::cuda::{parse_arch, PrecompiledCuda};
    let Some(be) = backend() else { return };
    let g = build_bert(&BertConfig::tiny(), "", BertOutputs::default()).unwrap();
    let w = random_weights(&g);
    let b = Bucket::new(2, 16);
    let inputs = token_batch(b, 50, &[16, 9]);
    let want = interpret(&g, &w, &inputs, b).unwrap();
    let cc = be.device().compute_capability();
    // This device's architecture (cubin where ptxas made one) and, on newer devices, sm_80
    // (PTX, JIT-compiled by the driver).
    let mut archs = vec![be.device().arch()];
    if cc > (8, 0) {
        archs.push("sm_80".into());
    }
    for arch in archs {
        let (major, minor) = parse_arch(&arch).unwrap();
        let spec = compile_graph(&g, b, &CudaTarget::new(&arch).unwrap()).unwrap().spec;
        let a = Artifact::new(&g, Target::Cuda { major, minor }, vec![(b, PlanPayload::Cuda(spec.clone()))]);
        let a = Artifact::from_bytes(&a.to_bytes()).unwrap();
        let pre = PrecompiledCuda::new(a).unwrap();
        assert!(!pre.caps().can_lower);
        // As `kiln embed --plan` does: the engine "lowers" a bucket by loading its plan.
        let engine = Engine::new(pre, g.clone(), &w, &[b], LowerPolicy::OnFirstRequest).unwrap();
        let out = engine.infer(&Batch { tensors: inputs.clone() }).unwrap();
        let err = max_rel_err(&out.tensors[0], &want[0]);
        assert!(err <= 1e-4, "{arch} artifact on sm_{}{}: max rel err {err}", cc.0, cc.1);
        eprintln!("PrecompiledCuda: {arch} artifact on sm_{}{} (cubin: {}): max rel err {err:.2e}", cc.0, cc.1, spec.cubin.is_some());
    }
}

/// Timings per bucket as JSON lines on stdout (`KILN_BENCH_BUCKETS=1x128,8x128`, default the
/// four of the GPU check). Random weights where the model is absent: the time does not depend
/// on the values.
#[test]
#[ignore]
fn bench_buckets() {
    let Some(be) = backend() else { return };
    let (g, w) = match model_dir() {
        Some(d) => minilm(&d),
        None => {
            let g = build_bert(&BertConfig::minilm_l6(), "", BertOutputs::default()).unwrap();
            let w = random_weights(&g);
            (g, w)
        }
    };
    let buckets: Vec<Bucket> = std::env::var("KILN_BENCH_BUCKETS")
        .unwrap_or_else(|_| "1x128,8x128,32x128,128x128".into())
        .split(',')
        .map(|s| Bucket::parse(s).unwrap())
        .collect();
    let weights = be.upload(&w, &g).unwrap();
    for b in buckets {
        let t = Instant::now();
        let mut plan = be.lower(&weights, &g, b).unwrap();
        let lower_s = t.elapsed().as_secs_f64();
        let inputs = token_batch(b, 30522, &vec![b.seq; b.batch]);
        let batch = Batch { tensors: inputs };
        let mut out = Outputs::for_bucket(&g, b);
        for _ in 0..3 {
            be.run(&mut plan, &batch, &mut out).unwrap();
        }
        let iters = if b.batch * b.seq >= 4096 { 20 } else { 100 };
        let t = Instant::now();
        for _ in 0..iters {
            be.run(&mut plan, &batch, &mut out).unwrap();
        }
        let e2e_ms = t.elapsed().as_secs_f64() * 1e3 / iters as f64;
        let gpu_ms = plan.time_launches(iters).unwrap();
        println!(
            "{{\"bucket\":\"{b}\",\"kiln_gpu_ms\":{gpu_ms:.4},\"kiln_e2e_ms\":{e2e_ms:.4},\"lower_s\":{lower_s:.3},\"kernels\":{},\"cuda_graph\":{}}}",
            plan.spec().launches.len(),
            plan.uses_graph()
        );
    }
}

/// Where a bucket's GPU time goes (`KILN_BENCH_BUCKETS`, default 128x128): each launch timed on
/// its own, summed per emitted kernel variant, with the matrix products' TFLOP/s; then the same
/// bucket with every f32 GEMM forced to each SIMT tiling, GEMM rows only, to compare tilings
/// per shape. Printed as text; scripts/gpu_check.sh keeps it as profile.txt.
#[test]
#[ignore]
fn profile_buckets() {
    use kiln_compiler::codegen::cuda::{compile_lowered, GemmTile};
    use kiln_compiler::kernel_ir::KernelOp;
    use kiln_compiler::passes::LayoutPolicy;
    use kiln_compiler::pipeline::run_pipeline_for;
    use std::collections::BTreeMap;
    let Some(be) = backend() else { return };
    let g = build_bert(&BertConfig::minilm_l6(), "", BertOutputs::default()).unwrap();
    let w = random_weights(&g);
    let buckets: Vec<Bucket> = std::env::var("KILN_BENCH_BUCKETS")
        .unwrap_or_else(|_| "128x128".into())
        .split(',')
        .map(|s| Bucket::parse(s).unwrap())
        .collect();
    let dev = be.device().clone();
    let weights = dev.upload_weights(&w).unwrap();
    let auto = CudaTarget::new(&dev.arch()).unwrap();
    let mut targets = vec![(auto.clone(), false)];
    for tile in GemmTile::ALL {
        targets.push((auto.clone().with_gemm_tile(tile), true));
    }
    for (b, (target, gemm_only)) in buckets.iter().flat_map(|b| targets.iter().map(move |t| (*b, t))) {
        let lowered = run_pipeline_for(&g, b, LayoutPolicy::Checkpoint).unwrap();
        let compiled = compile_lowered(&g, &lowered, target).unwrap();
        assert_eq!(compiled.module.kernels.len(), lowered.program.kernels.len());
        let mut plan = dev.load_plan(compiled.spec.clone(), &weights).unwrap();
        let inputs = token_batch(b, 30522, &vec![b.seq; b.batch]);
        let mut out = Outputs::for_bucket(&g, b);
        plan.run(&Batch { tensors: inputs }, &mut out).unwrap();
        let times = plan.time_each_launch(20).unwrap();
        // (count, ms, flops) per emitted variant and problem shape.
        let mut rows: BTreeMap<String, (usize, f64, f64)> = BTreeMap::new();
        for ((k, e), ms) in lowered.program.kernels.iter().zip(&compiled.module.kernels).zip(&times) {
            let (shape, flops) = match &k.op {
                KernelOp::Gemm { batch, m, n, k, .. } => {
                    let nb: usize = batch.iter().product();
                    (format!("{nb}x {m}x{n}x{k}"), 2.0 * (nb * m * n * k) as f64)
                }
                KernelOp::Attention { batch, seq_q, seq_kv, head_dim, v_dim, .. } => {
                    let nb: usize = batch.iter().product();
                    (format!("{nb}x {seq_q}x{seq_kv} d{head_dim}"), 2.0 * (nb * seq_q * seq_kv * (head_dim + v_dim)) as f64)
                }
                _ => (String::new(), 0.0),
            };
            let r = rows.entry(format!("{:<22} {shape}", e.kind)).or_default();
            r.0 += 1;
            r.1 += *ms as f64;
            r.2 += flops;
        }
        let total: f64 = times.iter().map(|&t| t as f64).sum();
        match target.gemm_tile {
            None => println!("bucket {b}: {} launches, {total:.3} ms summed one by one", times.len()),
            Some(t) => println!("bucket {b}, every GEMM {t:?}: {total:.3} ms in all"),
        }
        let mut sorted: Vec<_> = rows.into_iter().collect();
        sorted.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        for (name, (n, ms, flops)) in sorted {
            if *gemm_only && !name.starts_with("gemm") {
                continue;
            }
            let tf = if flops > 0.0 { format!("{:7.1} TFLOP/s", flops / (ms * 1e-3) / 1e12) } else { String::new() };
            println!("  {name:<44} x{n:<3} {ms:8.3} ms {:5.1}%  {tf}", 100.0 * ms / total);
        }
    }
}
