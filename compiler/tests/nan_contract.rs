//! The special-value contract of `kiln_compiler::ops` on every backend: NaN, ±inf, -0 and
//! denormals through every elementwise op, and through random graphs, give the same class of
//! result (NaN, the same infinity, a zero of the same sign, or a close finite value) on the
//! reference interpreter (f64), the kernel-level evaluator (f32), the CPU backend (vector and
//! scalar paths, AVX and SSE4.1-only) and the emitted CUDA C (host emulator).

use kiln_compiler::backends::cpu::{CpuBackend, CpuOptions};
use kiln_compiler::reference::interpret;
use kiln_compiler::codegen::cpu::CpuTarget;
use kiln_testkit::cuda_emu::{host_compiler, EmuModule};
use kiln_compiler::codegen::cuda::{emit_graph, CudaTarget};
use kiln_compiler::ir::GraphBuilder;
use kiln_testkit::kernel_eval::run_program;
use kiln_compiler::ops;
use kiln_compiler::pipeline::run_pipeline;
use kiln_testkit::random::{random_case, Rng};
use kiln_runtime::cpu::Threads;
use kiln_runtime::{Backend, Batch, Bucket, DType, Dim, Graph, HostTensor, InputRole, Outputs, TensorData};

/// Values that every op sees, alone and paired with each other.
const SPECIALS: [f32; 18] = [
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    0.0,
    -0.0,
    1e-45,  // the smallest denormal
    -3e-39, // a negative denormal
    f32::MIN_POSITIVE,
    1.0,
    -1.0,
    0.5,
    -2.5,
    7.0,
    -30.0,
    1e30,
    -1e30,
    f32::MAX,
    -f32::MAX,
];

/// How close two finite results must be: `atol + rtol·|want|`.
#[derive(Clone, Copy)]
struct Tol {
    atol: f64,
    rtol: f64,
}
/// One op: the transcendental approximations' accuracy (the absolute part covers results that
/// underflow to denormals).
const OP_TOL: Tol = Tol { atol: 2e-7, rtol: 1e-5 };
/// Whole graphs: f32 accumulation in GEMMs and norms, as in the other random-graph tests.
const GRAPH_TOL: Tol = Tol { atol: 2e-3, rtol: 2e-3 };

/// Whether `got` is in the same class as the oracle's `want`: both NaN, the same infinity, zeros
/// of the same sign, or finite and within `tol`.
fn same_class(got: f64, want: f64, tol: Tol) -> bool {
    if want.is_nan() || got.is_nan() {
        return want.is_nan() && got.is_nan();
    }
    if want.is_infinite() || got.is_infinite() {
        return got == want;
    }
    if want == 0.0 && got == 0.0 {
        return want.is_sign_negative() == got.is_sign_negative();
    }
    (got - want).abs() <= tol.atol + tol.rtol * want.abs()
}

fn check_outputs(what: &str, who: &str, got: &[HostTensor], want: &[HostTensor], inputs: &[HostTensor], tol: Tol) -> Result<(), String> {
    for (o, (g, w)) in got.iter().zip(want).enumerate() {
        let (gv, wv) = (g.data.to_f64_vec(), w.data.to_f64_vec());
        for (i, (a, b)) in gv.iter().zip(&wv).enumerate() {
            if !same_class(*a, *b, tol) {
                let args: Vec<String> = inputs
                    .iter()
                    .filter(|t| t.data.dtype().is_float() && t.shape == g.shape)
                    .map(|t| format!("{:e}", t.data.to_f64_vec()[i]))
                    .collect();
                return Err(format!("{what}: {who} output {o}[{i}] (inputs {}) = {a:e}, reference {b:e}", args.join(", ")));
            }
        }
    }
    Ok(())
}

/// Every backend on one graph; errors list each disagreement with the oracle.
fn all_backends(what: &str, g: &Graph, weights: &[HostTensor], inputs: &[HostTensor], bucket: Bucket, tol: Tol) -> Vec<String> {
    let want = interpret(g, weights, inputs, bucket).unwrap_or_else(|e| panic!("{what}: reference: {e}"));
    let f32_want: Vec<HostTensor> =
        want.iter().map(|t| HostTensor::new(t.shape.clone(), t.data.convert(DType::F32)).unwrap()).collect();
    let mut errs = Vec::new();

    let l = run_pipeline(g, bucket).unwrap_or_else(|e| panic!("{what}: pipeline: {e}"));
    match run_program(&l.program, &l.plan, weights, inputs) {
        Ok(got) => errs.extend(check_outputs(what, "kernel_eval", &got, &f32_want, inputs, tol).err()),
        Err(e) => errs.push(format!("{what}: kernel_eval: {e}")),
    }

    let sse = ["sse3", "ssse3", "sse4.1", "sse4.2", "popcnt"].iter().map(|s| s.to_string()).collect();
    let cpus = [
        ("cpu", CpuOptions { threads: Threads::Count(1), ..Default::default() }),
        ("cpu-sse4.1", CpuOptions { threads: Threads::Count(1), target: CpuTarget::X86_64 { features: sse } }),
    ];
    for (who, opts) in cpus {
        let be = CpuBackend::with_options(opts).unwrap();
        let w = be.upload(weights, g).unwrap();
        let mut plan = be.lower(&w, g, bucket).unwrap_or_else(|e| panic!("{what}: {who}: lower: {e}"));
        let mut out = Outputs::for_bucket(g, bucket);
        be.run(&mut plan, &Batch { tensors: inputs.to_vec() }, &mut out).unwrap();
        errs.extend(check_outputs(what, who, &out.tensors, &f32_want, inputs, tol).err());
    }

    if host_compiler().is_some() {
        let e = emit_graph(g, bucket, &CudaTarget::new("sm_90").unwrap()).unwrap_or_else(|e| panic!("{what}: cuda emit: {e}"));
        let m = EmuModule::build(&e.module).unwrap_or_else(|e| panic!("{what}: emu build: {e}"));
        let got = m.run_plan(&e.spec, weights, inputs).unwrap_or_else(|e| panic!("{what}: emu run: {e}"));
        errs.extend(check_outputs(what, "cuda-emu", &got, &f32_want, inputs, tol).err());
    } else {
        eprintln!("SKIPPED (cuda-emu only): no host C++ compiler");
    }
    errs
}

/// The 18 specials, then 3 more so the 4-lane body and the scalar tail both see specials.
fn op_inputs() -> Vec<f32> {
    SPECIALS.iter().chain(&SPECIALS[..3]).copied().collect()
}

fn vector_input(b: &mut GraphBuilder, name: &str, n: usize) -> kiln_runtime::graph::ValueId {
    b.input(name, DType::F32, vec![Dim::Fixed(n)], InputRole::Other).unwrap()
}

#[test]
fn every_unary_op_on_special_values() {
    let xs = op_inputs();
    let mut errs = Vec::new();
    for op in ops::unary::ALL {
        let mut b = GraphBuilder::new();
        let x = vector_input(&mut b, "x", xs.len());
        let y = b.unary(op, x).unwrap();
        b.output("y", y);
        let g = b.finish().unwrap();
        let inputs = [HostTensor::f32(vec![xs.len()], xs.clone()).unwrap()];
        errs.extend(all_backends(&format!("{op:?}"), &g, &[], &inputs, Bucket::new(1, 1), OP_TOL));
    }
    assert!(errs.is_empty(), "{} disagreements:\n{}", errs.len(), errs.join("\n"));
}

/// The same through a GEMM epilogue: `op(x @ [[1]])` is `op(x)`, and the CPU backend applies
/// Relu, the GELUs, Tanh and SiLU with the kernel library's activations.
#[test]
fn every_unary_op_as_a_gemm_epilogue() {
    let xs = op_inputs();
    let mut errs = Vec::new();
    for op in ops::unary::ALL {
        let mut b = GraphBuilder::new();
        let x = b.input("x", DType::F32, vec![Dim::Fixed(xs.len()), Dim::Fixed(1)], InputRole::Other).unwrap();
        let w = b.weight("one", DType::F32, &[1, 1]).unwrap();
        let y = b.matmul(x, w).unwrap();
        let y = b.unary(op, y).unwrap();
        b.output("y", y);
        let g = b.finish().unwrap();
        let inputs = [HostTensor::f32(vec![xs.len(), 1], xs.clone()).unwrap()];
        let weights = [HostTensor::f32(vec![1, 1], vec![1.0]).unwrap()];
        errs.extend(all_backends(&format!("matmul+{op:?}"), &g, &weights, &inputs, Bucket::new(1, 1), OP_TOL));
    }
    assert!(errs.is_empty(), "{} disagreements:\n{}", errs.len(), errs.join("\n"));
}

#[test]
fn every_binary_op_on_pairs_of_special_values() {
    let (mut a, mut bv) = (Vec::new(), Vec::new());
    for &x in &SPECIALS {
        for &y in &SPECIALS {
            a.push(x);
            bv.push(y);
        }
    }
    let mut errs = Vec::new();
    for op in ops::binary::ALL {
        let mut b = GraphBuilder::new();
        let x = vector_input(&mut b, "a", a.len());
        let y = vector_input(&mut b, "b", a.len());
        let z = b.binary(op, x, y).unwrap();
        b.output("z", z);
        let g = b.finish().unwrap();
        let inputs = [HostTensor::f32(vec![a.len()], a.clone()).unwrap(), HostTensor::f32(vec![a.len()], bv.clone()).unwrap()];
        errs.extend(all_backends(&format!("{op:?}"), &g, &[], &inputs, Bucket::new(1, 1), OP_TOL));
    }
    assert!(errs.is_empty(), "{} disagreements:\n{}", errs.len(), errs.join("\n"));
}

/// Random graphs (GEMMs with epilogues, attention, norms, softmax, reductions, elementwise
/// chains) whose float inputs have NaN, ±inf, ±0 or a denormal in some elements. (Huge finite
/// values are left to the per-op tests: inside a fused kernel a sum of squares or a dot product
/// may overflow f32 where the f64 oracle does not, which is the precision of the kernel, not
/// the special-value contract.)
#[test]
fn random_graphs_with_special_values_in_their_inputs() {
    let cases: u64 = std::env::var("KILN_RANDOM_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(120);
    // `KILN_SEED=n` replays one case.
    let only: Option<u64> = std::env::var("KILN_SEED").ok().and_then(|v| v.parse().ok());
    let mut errs = Vec::new();
    for seed in 0..cases {
        if only.is_some_and(|s| s != seed) {
            continue;
        }
        let mut case = random_case(90_000 + seed);
        let mut rng = Rng::new(seed);
        for (t, spec) in case.inputs.iter_mut().zip(&case.graph.inputs) {
            // A mask is 0/1 by definition (the fused attention reads it as such).
            if spec.role == InputRole::AttentionMask {
                continue;
            }
            if let TensorData::F32(v) = &mut t.data {
                for x in v.iter_mut() {
                    if rng.chance(0.15) {
                        *x = rng.pick(&SPECIALS[..8]);
                    }
                }
            }
        }
        errs.extend(all_backends(&format!("seed {seed} (KILN_SEED={seed})"), &case.graph, &case.weights, &case.inputs, case.bucket, GRAPH_TOL));
    }
    assert!(errs.is_empty(), "{} disagreements:\n{}", errs.len(), errs.join("\n"));
}

/// The softmax guard of PyTorch's SDPA export, fused into attention (`zero_nan_rows`): a row with
/// a NaN query and a fully masked row (-inf mask) give 0·V on every backend, the other rows are
/// untouched. The graph is the filetest's.
#[test]
fn guarded_attention_zeroes_nan_rows_on_every_backend() {
    let path = kiln_testkit::golden::workspace_root().join("tests/golden/filecheck/attention_sdpa_export.kir");
    let g = kiln_compiler::ir::parse(&std::fs::read_to_string(path).unwrap()).unwrap();
    let bucket = Bucket::new(1, 4);
    let l = run_pipeline(&g, bucket).unwrap();
    assert!(l.program.print().contains("zero_nan_rows"), "{}", l.program.print());
    let mut rng = Rng::new(7);
    let mut inputs: Vec<HostTensor> = [64usize, 64, 64, 16]
        .iter()
        .map(|&n| {
            let shape = if n == 16 { vec![1, 1, 4, 4] } else { vec![1, 2, 4, 8] };
            HostTensor::new(shape, TensorData::F32((0..n).map(|_| rng.uniform(-1.0, 1.0)).collect())).unwrap()
        })
        .collect();
    // Head 0, query row 1: NaN; query row 3 (every head): every key masked.
    let TensorData::F32(q) = &mut inputs[0].data else { unreachable!() };
    q[8 + 5] = f32::NAN;
    let TensorData::F32(m) = &mut inputs[3].data else { unreachable!() };
    m[12..16].fill(f32::NEG_INFINITY);
    let errs = all_backends("guarded attention", &g, &[], &inputs, bucket, GRAPH_TOL);
    assert!(errs.is_empty(), "{}", errs.join("\n"));
    // The oracle itself: those rows are +0, the rest finite and not all zero.
    let want = interpret(&g, &[], &inputs, bucket).unwrap()[0].data.to_f64_vec();
    for (i, x) in want.iter().enumerate() {
        let (h, row) = (i / 32, i / 8 % 4);
        if (h == 0 && row == 1) || row == 3 {
            assert_eq!(x.to_bits(), 0, "element {i}: {x}");
        } else {
            assert!(x.is_finite() && *x != 0.0, "element {i}: {x}");
        }
    }
}
