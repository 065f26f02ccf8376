//! `kiln bench`: time forward passes per bucket, against the measured FMA peak on the CPU.

use std::path::PathBuf;

use kiln::model::{bench_token_ids, SentenceModel};
use kiln::BackendKind;
use kiln_compiler::models::bert::BertOutputs;
use kiln_compiler::pipeline;
use kiln_compiler::reference::ReferenceBackend;
use kiln_runtime::{Backend, Bucket, Error, Result};

use crate::{cpu_threads, resolve_model};


/// `kiln bench`: lowers each bucket once, warms up, then times `runs` forward passes; prints the
/// median and the matmul GFLOP/s, against this machine's measured FMA peak on the CPU.
pub(crate) fn bench(
    model: Option<PathBuf>,
    onnx: Option<(PathBuf, Vec<String>)>,
    buckets: &[String],
    backend: BackendKind,
    threads: Option<usize>,
    runs: usize,
    profile: bool,
) -> Result<()> {
    use kiln_compiler::backends::cpu::{CpuBackend, CpuOptions};
    if let Some((file, dims)) = onnx {
        if !matches!(backend, BackendKind::Cpu) {
            return Err(Error::Unsupported("kiln bench --onnx times the cpu backend only".into()));
        }
        let be = CpuBackend::with_options(CpuOptions { threads: cpu_threads(threads), ..Default::default() })?;
        let peak = print_peak(be.threads());
        let m = kiln_compiler::frontends::onnx::OnnxModel::open(&file, &kiln::onnx::parse_dims(&dims)?)?;
        let iface = m.signature()?.graph();
        for b in buckets.iter().map(|b| Bucket::parse(b)).collect::<Result<Vec<_>>>()? {
            let g = m.graph_for(b)?;
            let t = std::time::Instant::now();
            let w = be.upload(&m.weights(&g)?, &g)?;
            println!("bucket {b}: import + upload {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
            bench_cpu_bucket(&be, &w, &g, &iface, b, runs, peak, profile)?;
        }
        return Ok(());
    }
    let dir = resolve_model(model)?;
    let m = SentenceModel::open(&dir, BertOutputs::default())?;
    let weights = m.load_weights()?;
    let buckets = buckets.iter().map(|b| Bucket::parse(b)).collect::<Result<Vec<_>>>()?;
    // Matmul flops per bucket (GEMMs and attention products), the figure GFLOP/s are quoted for.
    let flops = |b: Bucket| pipeline::compile_report(&m.graph, b).map(|r| r.matmul_flops as f64);
    match backend {
        BackendKind::Cpu => {
            let be = CpuBackend::with_options(CpuOptions { threads: cpu_threads(threads), ..Default::default() })?;
            let peak = print_peak(be.threads());
            let t = std::time::Instant::now();
            let w = be.upload(&weights, &m.graph)?;
            println!("upload (weights transposed/packed once): {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
            for b in buckets {
                bench_cpu_bucket(&be, &w, &m.graph, &m.graph, b, runs, peak, profile)?;
            }
        }
        BackendKind::Reference => {
            let w = ReferenceBackend.upload(&weights, &m.graph)?;
            for b in buckets {
                let mut plan = ReferenceBackend.lower(&w, &m.graph, b)?;
                let ms = bench_runs(&ReferenceBackend, &mut plan, &m.graph, &m.graph, b, runs, 1)?;
                print_gflops(b, flops(b)?, ms, None);
            }
        }
        BackendKind::Cuda => {
            let be = kiln_compiler::backends::cuda::CudaBackend::new()?;
            let caps = be.caps();
            println!("device: {}", caps.device);
            let t = std::time::Instant::now();
            let w = be.upload(&weights, &m.graph)?;
            println!("upload: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
            for b in buckets {
                let t = std::time::Instant::now();
                let mut plan = be.lower(&w, &m.graph, b)?;
                println!("bucket {b}: lowering {:.1} ms (middle-end, CUDA C, NVRTC, load)", t.elapsed().as_secs_f64() * 1e3);
                let ms = bench_runs(&be, &mut plan, &m.graph, &m.graph, b, runs, 1)?;
                print_gflops(b, flops(b)?, ms, None);
            }
        }
    }
    Ok(())
}

/// Measures and prints this machine's FMA peak for `threads` threads.
pub(crate) fn print_peak(threads: usize) -> Option<f64> {
    let peak = kiln_kernels::peak::fma_peak_gflops(threads, 10, 15.0);
    match peak {
        Some(p) => println!(
            "FMA peak (measured, {threads} thread(s), register-only {} FMA loop): {p:.1} GFLOP/s",
            kiln_kernels::peak::fma_register()
        ),
        None => println!("FMA peak: not measured (no AVX2+FMA)"),
    }
    peak
}

/// One bucket on the CPU: lowering times, the timed runs, GFLOP/s and (with `profile`) the time
/// of every kernel.
#[allow(clippy::too_many_arguments)]
pub(crate) fn bench_cpu_bucket(
    be: &kiln_compiler::backends::cpu::CpuBackend,
    w: &<kiln_compiler::backends::cpu::CpuBackend as Backend>::Weights,
    graph: &kiln_runtime::Graph,
    inputs: &kiln_runtime::Graph,
    b: Bucket,
    runs: usize,
    peak: Option<f64>,
    profile: bool,
) -> Result<()> {
    let (mut plan, t) = be.lower_timed(w, graph, b)?;
    println!(
        "bucket {b}: lowering {:.1} ms (middle-end {:.1}, codegen {:.1}, load + weight prep {:.1})",
        t.pipeline_ms + t.codegen_ms + t.load_ms,
        t.pipeline_ms,
        t.codegen_ms,
        t.load_ms
    );
    let ms = bench_runs(be, &mut plan, graph, inputs, b, runs, be.threads())?;
    let r = pipeline::compile_report(graph, b)?;
    if r.int_matmul_flops > 0 {
        // Integer GEMMs run up to twice the f32 FMA rate (i16 pairs, VNNI): a share of the
        // f32 peak would mislead.
        print_gflops(b, r.matmul_flops as f64, ms, None);
        println!(
            "bucket {b}: {:.3} GFLOP of those have integer operands (the exact integer GEMM where B is a packed weight, here on {}): no % of the f32 FMA peak",
            r.int_matmul_flops as f64 / 1e9,
            kiln_kernels::gemm::int8_tile_name()
        );
    } else {
        print_gflops(b, r.matmul_flops as f64, ms, peak);
        if peak.is_some() {
            if let Some(s) = share_beside_probes(be, &mut plan, graph, inputs, b, r.matmul_flops as f64, runs.div_ceil(2).max(5))? {
                println!(
                    "bucket {b}: {:.0}% of the peak read beside the runs (median of {} probe-then-run ratios; the peak read {:.1}–{:.1} GFLOP/s meanwhile)",
                    100.0 * s.median,
                    s.pairs,
                    s.lo,
                    s.hi
                );
            }
        }
    }
    if profile {
        let batch = bench_batch(graph, inputs, b)?;
        let mut out = kiln_runtime::Outputs::for_bucket(graph, b);
        let mut p = plan.profile(&batch.tensors, &mut out.tensors, runs)?;
        let total: f64 = p.iter().map(|x| x.1.wall).sum();
        let idle: f64 = p.iter().map(|x| x.1.idle).sum();
        // The share of each kind of work: the plan's steps are the program's kernels, by name.
        let program = pipeline::run_pipeline(graph, b)?.program;
        let kind_of: std::collections::HashMap<&str, &str> = program.kernels.iter().map(|k| (k.name.as_str(), k.op.kind_name())).collect();
        let mut shares: std::collections::BTreeMap<&str, f64> = std::collections::BTreeMap::new();
        for (name, t) in &p {
            let ms = &t.wall;
            let group = match kind_of.get(name.as_str()).copied().unwrap_or("other") {
                "gemm" => "gemm",
                "attention" => "attention",
                "layer_norm" | "rms_norm" => "norms",
                _ => "the rest",
            };
            *shares.entry(group).or_default() += ms;
        }
        let line: Vec<String> = shares.iter().map(|(g, ms)| format!("{g} {:.1}%", 100.0 * ms / total)).collect();
        println!("bucket {b}: time by kind: {} ({total:.3} ms of kernels)", line.join(", "));
        if be.threads() > 1 {
            // With 2 threads, idle / total is the share of the second thread's time lost at joins.
            println!(
                "bucket {b}: threads waiting at the joins of split kernels: {idle:.3} ms per run ({:.1}% of the kernels' time)",
                100.0 * idle / total
            );
        }
        p.sort_by(|a, b| b.1.wall.total_cmp(&a.1.wall));
        for (name, t) in p.iter() {
            println!("  {:9.3} ms {:5.1}%  {:7.3} ms waiting  {name}", t.wall, 100.0 * t.wall / total, t.idle);
        }
    }
    Ok(())
}

pub(crate) fn print_gflops(b: Bucket, flops: f64, median_ms: f64, peak: Option<f64>) {
    let gf = flops / (median_ms * 1e-3) / 1e9;
    match peak {
        Some(p) => println!(
            "bucket {b}: {gf:.1} GFLOP/s ({:.3} GFLOP of matmuls), {:.0}% of the measured peak",
            flops / 1e9,
            100.0 * gf / p
        ),
        None => println!("bucket {b}: {gf:.1} GFLOP/s ({:.3} GFLOP of matmuls)", flops / 1e9),
    }
}

/// Times `runs` forward passes after a warm-up; prints and returns the median in ms.
/// `inputs` is the graph whose `[batch, seq]` inputs the token ids fill (an ONNX bucket's import
/// has fixed dims: its model's interface graph is passed).
pub(crate) fn bench_runs<B: Backend>(
    be: &B,
    plan: &mut B::Plan,
    graph: &kiln_runtime::Graph,
    inputs: &kiln_runtime::Graph,
    b: Bucket,
    runs: usize,
    threads: usize,
) -> Result<f64> {
    let batch = bench_batch(graph, inputs, b)?;
    let mut out = kiln_runtime::Outputs::for_bucket(graph, b);
    let warm = std::time::Instant::now();
    let mut warmups = 0;
    while warmups < 3 || (warm.elapsed().as_secs_f64() < 0.5 && warmups < 50) {
        be.run(plan, &batch, &mut out)?;
        warmups += 1;
    }
    let mut ms = Vec::with_capacity(runs.max(1));
    for _ in 0..runs.max(1) {
        let t = std::time::Instant::now();
        be.run(plan, &batch, &mut out)?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    let median = ms[ms.len() / 2];
    println!(
        "bucket {b}: median {median:.3} ms (min {:.3}, max {:.3}, {} runs, {threads} thread(s))",
        ms[0],
        ms[ms.len() - 1],
        ms.len()
    );
    Ok(median)
}

/// The matmul rate as a share of the FMA peak read in the same seconds.
struct Share {
    median: f64,
    pairs: usize,
    lo: f64,
    hi: f64,
}

/// `pairs` times: a peak probe on the plan's threads, one untimed run (the pool's workers parked
/// during the probe; waking them is not the plan's time), one timed run; each timed run's
/// GFLOP/s over the probe's. On a shared host the FMA rate moves by up to 1.5× within minutes
/// (turbo, other tenants), so the share of a peak read once at the start says as much about
/// the host as about kiln; the probe beside each run compares rates of the same seconds.
/// None where no SIMD peak is measured.
fn share_beside_probes(
    be: &kiln_compiler::backends::cpu::CpuBackend,
    plan: &mut <kiln_compiler::backends::cpu::CpuBackend as Backend>::Plan,
    graph: &kiln_runtime::Graph,
    inputs: &kiln_runtime::Graph,
    b: Bucket,
    flops: f64,
    pairs: usize,
) -> Result<Option<Share>> {
    let batch = bench_batch(graph, inputs, b)?;
    let mut out = kiln_runtime::Outputs::for_bucket(graph, b);
    let mut ratios = Vec::with_capacity(pairs);
    let (mut lo, mut hi) = (f64::INFINITY, 0f64);
    for _ in 0..pairs {
        let Some(p) = kiln_kernels::peak::fma_peak_probe(be.threads()) else { return Ok(None) };
        be.run(plan, &batch, &mut out)?;
        let t = std::time::Instant::now();
        be.run(plan, &batch, &mut out)?;
        let gf = flops / t.elapsed().as_secs_f64() / 1e9;
        ratios.push(gf / p);
        (lo, hi) = (lo.min(p), hi.max(p));
    }
    ratios.sort_by(|a, b| a.total_cmp(b));
    Ok(Some(Share { median: ratios[ratios.len() / 2], pairs, lo, hi }))
}

/// What a bench runs: token ids for a token model (every input `[batch, seq]` of integers);
/// for any other (an image model), each input at the bucket's shape filled with the same
/// pseudo-random values in [-1, 1) on every run (integers: zeros).
fn bench_batch(graph: &kiln_runtime::Graph, inputs: &kiln_runtime::Graph, b: Bucket) -> Result<kiln_runtime::Batch> {
    if inputs.inputs.iter().all(|s| s.shape.len() == 2 && !s.dtype.is_float()) {
        return kiln_runtime::Batch::from_token_ids(inputs, &bench_token_ids(b));
    }
    // xorshift64: the values only need to be the same on every run and machine.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    };
    let tensors = graph
        .inputs
        .iter()
        .map(|s| {
            let shape: Vec<usize> = s.shape.iter().map(|d| d.resolve(b)).collect();
            let v: Vec<f64> = (0..shape.iter().product()).map(|_| if s.dtype.is_float() { next() } else { 0.0 }).collect();
            kiln_runtime::HostTensor::new(shape, kiln_runtime::TensorData::from_f64(s.dtype, &v))
        })
        .collect::<Result<_>>()?;
    Ok(kiln_runtime::Batch { tensors })
}
