//! Every kind of CPU kernel on small graphs, against the reference interpreter (1 and 2
//! threads), and the Cranelift IR of small kernels as goldens (tests/golden/clif/<case>.txt,
//! generated for the fixed x86-64-v3 target so they do not depend on this machine;
//! `BLESS=1` rewrites them).

use kiln_compiler::backends::cpu::{CpuBackend, CpuOptions};
use kiln_compiler::reference::interpret;
use kiln_compiler::codegen::cpu::CpuTarget;
use kiln_testkit::golden::check_golden;
use kiln_compiler::ir::GraphBuilder;
use kiln_testkit::random::{random_inputs, random_weights, Rng};
use kiln_runtime::cpu::Threads;
use kiln_runtime::graph::{BinaryOp, ReduceOp, UnaryOp};
use kiln_runtime::{Backend, Batch, Bucket, DType, Dim, Graph, InputRole, Outputs};

fn f(n: usize) -> Dim {
    Dim::Fixed(n)
}

/// `|got - want| <= tol·(1 + |want|)`; infinities and NaNs must match exactly.
fn compare(got: &[kiln_runtime::HostTensor], want: &[kiln_runtime::HostTensor], tol: f64, _: f64) -> Result<(), String> {
    for (o, (g, w)) in got.iter().zip(want).enumerate() {
        if g.shape != w.shape || g.dtype() != w.dtype() {
            return Err(format!("output {o}: {} {:?}, expected {} {:?}", g.dtype(), g.shape, w.dtype(), w.shape));
        }
        for (i, (a, b)) in g.data.to_f64_vec().iter().zip(w.data.to_f64_vec()).enumerate() {
            let ok = if b.is_nan() { a.is_nan() } else if b.is_infinite() { *a == b } else { (a - b).abs() <= tol * (1.0 + b.abs()) };
            if !ok {
                return Err(format!("output {o} element {i}: got {a}, expected {b}"));
            }
        }
    }
    Ok(())
}

/// Runs `g` on the CPU backend (1 and 2 threads) and compares with the reference.
fn check(name: &str, g: &Graph, bucket: Bucket, tol: f64) {
    let mut rng = Rng::new(name.len() as u64 * 7919);
    let weights = random_weights(g, &mut rng);
    let inputs = random_inputs(g, bucket, &mut rng);
    let want = interpret(g, &weights, &inputs, bucket).unwrap();
    for threads in [Threads::Single, Threads::Count(2)] {
        let be = CpuBackend::with_options(CpuOptions { threads, ..Default::default() }).unwrap();
        let w = be.upload(&weights, g).unwrap();
        let mut plan = be.lower(&w, g, bucket).unwrap();
        let mut out = Outputs::for_bucket(g, bucket);
        be.run(&mut plan, &Batch { tensors: inputs.clone() }, &mut out).unwrap();
        if let Err(e) = compare(&out.tensors, &want, tol, tol) {
            panic!("{name} ({threads:?}): {e}");
        }
    }
}

/// The CLIF of every kernel of `g` for the x86-64-v3 target, 2 threads.
fn clif_golden(case: &str, g: &Graph, bucket: Bucket) {
    let be = CpuBackend::with_options(CpuOptions { threads: Threads::Count(2), target: CpuTarget::x86_64_v3() }).unwrap();
    let (c, _) = be.compile(g, bucket, true).unwrap();
    let mut text = String::new();
    for ((name, clif), step) in c.clif.iter().zip(&c.image.steps) {
        text.push_str(&format!("; kernel `{name}`, {} task(s)\n{clif}\n", step.tasks));
    }
    check_golden(&format!("tests/golden/clif/{case}.txt"), &text);
}

fn bias_gelu() -> Graph {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![Dim::Batch, Dim::Seq, f(11)], InputRole::Other).unwrap();
    let bias = b.weight("bias", DType::F32, &[11]).unwrap();
    let y = b.add(x, bias).unwrap();
    let y = b.gelu(y).unwrap();
    b.output("y", y);
    b.finish().unwrap()
}

#[test]
fn elementwise_bias_gelu() {
    let g = bias_gelu();
    check("bias_gelu", &g, Bucket::new(2, 3), 1e-5);
    clif_golden("elementwise_bias_gelu", &g, Bucket::new(1, 2));
}

#[test]
fn elementwise_ops_and_select() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![Dim::Batch, f(9)], InputRole::Other).unwrap();
    let y = b.input("y", DType::F32, vec![Dim::Batch, f(9)], InputRole::Other).unwrap();
    let mut v = x;
    for op in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Max, BinaryOp::Min] {
        v = b.binary(op, v, y).unwrap();
    }
    for op in [UnaryOp::Tanh, UnaryOp::Relu, UnaryOp::Silu, UnaryOp::Exp, UnaryOp::Neg] {
        v = b.unary(op, v).unwrap();
    }
    let two = b.scalar(2.0).unwrap();
    let s = b.add(v, two).unwrap();
    let s = b.sqrt(s).unwrap();
    let r = b.rsqrt(s).unwrap();
    let q = b.div(r, s).unwrap();
    let w = b.where_(x, q, y).unwrap();
    b.output("w", w);
    let g = b.finish().unwrap();
    check("elementwise_ops", &g, Bucket::new(5, 1), 1e-5);
}

#[test]
fn layer_norm_residual_and_rms_norm() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![Dim::Batch, Dim::Seq, f(13)], InputRole::Other).unwrap();
    let r = b.input("r", DType::F32, vec![Dim::Batch, Dim::Seq, f(13)], InputRole::Other).unwrap();
    let gm = b.weight("g", DType::F32, &[13]).unwrap();
    let bt = b.weight("b", DType::F32, &[13]).unwrap();
    let s = b.add(x, r).unwrap();
    let y = b.layer_norm(s, gm, bt, 1e-5).unwrap();
    let z = b.rms_norm(y, gm, 1e-6).unwrap();
    b.output("z", z);
    b.output("y", y);
    let g = b.finish().unwrap();
    check("norms", &g, Bucket::new(3, 7), 1e-4);
    clif_golden("layer_norm_residual", &g, Bucket::new(1, 2));
}

#[test]
fn softmax_scale_mask_on_any_axis() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![Dim::Batch, f(3), Dim::Seq, Dim::Seq], InputRole::Other).unwrap();
    let m = b.input("attention_mask", DType::I64, vec![Dim::Batch, Dim::Seq], InputRole::AttentionMask).unwrap();
    let mf = b.cast(m, DType::F32).unwrap();
    let one = b.scalar(1.0).unwrap();
    let inv = b.sub(one, mf).unwrap();
    let big = b.scalar(-10000.0).unwrap();
    let add = b.mul(inv, big).unwrap();
    let add = b.reshape(add, vec![Dim::Batch, f(1), f(1), Dim::Seq]).unwrap();
    let sc = b.scalar(0.125).unwrap();
    let s = b.mul(x, sc).unwrap();
    let s = b.add(s, add).unwrap();
    let p = b.softmax(s, 3, None).unwrap();
    let q = b.softmax(x, 1, None).unwrap();
    b.output("p", p);
    b.output("q", q);
    let g = b.finish().unwrap();
    check("softmax", &g, Bucket::new(2, 9), 1e-5);
    clif_golden("softmax_scale_mask", &g, Bucket::new(1, 5));
}

#[test]
fn linear_layers_with_fused_epilogues() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![Dim::Batch, Dim::Seq, f(24)], InputRole::Other).unwrap();
    let w1 = b.weight("w1", DType::F32, &[40, 24]).unwrap();
    let b1 = b.weight("b1", DType::F32, &[40]).unwrap();
    let h = b.linear(x, w1, Some(b1)).unwrap();
    let h = b.gelu(h).unwrap();
    let w2 = b.weight("w2", DType::F32, &[24, 40]).unwrap();
    let b2 = b.weight("b2", DType::F32, &[24]).unwrap();
    let o = b.linear(h, w2, Some(b2)).unwrap();
    let o = b.add(o, x).unwrap();
    // A plain matmul against a [k, n] weight, an activation after it, and a product of two
    // activations (B packed at run time, transposed view).
    let w3 = b.weight("w3", DType::F32, &[24, 8]).unwrap();
    let p = b.matmul(o, w3).unwrap();
    let p = b.tanh(p).unwrap();
    let t = b.matmul_t(o, o, false, true).unwrap();
    b.output("o", o);
    b.output("p", p);
    b.output("t", t);
    let g = b.finish().unwrap();
    check("linear", &g, Bucket::new(2, 37), 1e-4);
    clif_golden("gemm_bias_gelu_residual", &g, Bucket::new(1, 4));
}

/// Linear layers reading the same input merge into one GEMM over their concatenated weights
/// (PyTorch `[n, k]` weights and ONNX `[k, n]` ones, never with each other), each reader then
/// reading its columns of the merged output; a reader whose view wraps rows (a flattening
/// reshape) keeps its group apart. Checked against the reference on 1 and 2 threads.
#[test]
fn sibling_linear_layers_merge_into_one_gemm() {
    for flat_reader in [false, true] {
        let mut b = GraphBuilder::new();
        let x = b.input("x", DType::F32, vec![Dim::Batch, f(13), f(24)], InputRole::Other).unwrap();
        let linear = |b: &mut GraphBuilder, name: &str, torch: bool| {
            let shape: [usize; 2] = if torch { [40, 24] } else { [24, 40] };
            let w = b.weight(&format!("w{name}"), DType::F32, &shape).unwrap();
            let bias = b.weight(&format!("b{name}"), DType::F32, &[40]).unwrap();
            if torch {
                b.linear(x, w, Some(bias)).unwrap()
            } else {
                let y = b.matmul(x, w).unwrap();
                b.add(y, bias).unwrap()
            }
        };
        let (ta, tb) = (linear(&mut b, "a", true), linear(&mut b, "b", true));
        let (oc, od, oe) = (linear(&mut b, "c", false), linear(&mut b, "d", false), linear(&mut b, "e", false));
        // Each output read as the A operand of a GEMM (a reader that takes no bias into its
        // prologue, so every bias stays in its own GEMM's epilogue, as before attention).
        let wr = b.weight("wr", DType::F32, &[40, 8]).unwrap();
        let mut sum = None;
        for v in [ta, tb, oc, od, oe] {
            let r = b.matmul(v, wr).unwrap();
            sum = Some(match sum {
                None => r,
                Some(s) => b.add(s, r).unwrap(),
            });
        }
        b.output("sum", sum.unwrap());
        if flat_reader {
            let e = b.reshape(oe, vec![Dim::Batch, f(13 * 40)]).unwrap();
            let e = b.reduce_sum(e, &[1], false).unwrap();
            b.output("e", e);
        }
        let g = b.finish().unwrap();
        let bucket = Bucket::new(3, 1);
        let l = kiln_compiler::pipeline::run_pipeline_for(&g, bucket, kiln_compiler::passes::LayoutPolicy::TransposeLinearWeights).unwrap();
        let widths: Vec<usize> = l
            .program
            .kernels
            .iter()
            .filter_map(|k| match k.op {
                kiln_compiler::kernel_ir::KernelOp::Gemm { n, .. } => Some(n),
                _ => None,
            })
            .collect();
        let merged: &[usize] = if flat_reader { &[80, 40, 40, 40] } else { &[80, 120] };
        let want: Vec<usize> = merged.iter().copied().chain([8; 5]).collect();
        assert_eq!(widths, want, "flat reader: {flat_reader}\n{}", l.program.print());
        // The GPU uploads checkpoint tensors as they are: nothing merges there.
        let gpu = kiln_compiler::pipeline::run_pipeline_for(&g, bucket, kiln_compiler::passes::LayoutPolicy::Checkpoint).unwrap();
        assert_eq!(gpu.program.kernels_by_kind().get("gemm"), Some(&10));
        check("siblings", &g, bucket, 1e-4);
    }
}

#[test]
fn clip_0_6_is_the_microkernels_relu6() {
    // min(max(x·W + b, 0), 6), ONNX's Clip(0, 6) as imported (MobileNet's ReLU6): the GEMM's
    // own epilogue (activation code 7 in the CLIF's epilogue struct), both ends reached.
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![Dim::Batch, f(16)], InputRole::Other).unwrap();
    let ten = b.scalar(10.0).unwrap();
    let x = b.mul(x, ten).unwrap();
    let w = b.weight("w", DType::F32, &[16, 20]).unwrap();
    let bias = b.weight("b", DType::F32, &[20]).unwrap();
    let y = b.matmul(x, w).unwrap();
    let y = b.add(y, bias).unwrap();
    let zero = b.scalar(0.0).unwrap();
    let six = b.scalar(6.0).unwrap();
    let y = b.max(y, zero).unwrap();
    let y = b.binary(BinaryOp::Min, six, y).unwrap();
    b.output("y", y);
    let g = b.finish().unwrap();
    check("relu6", &g, Bucket::new(7, 1), 1e-4);
    clif_golden("gemm_relu6", &g, Bucket::new(3, 1));
}

#[test]
fn unfusable_epilogue_runs_unfused() {
    // x·W scaled then divided by an operand: no microkernel epilogue matches.
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![Dim::Batch, f(16)], InputRole::Other).unwrap();
    let d = b.input("d", DType::F32, vec![Dim::Batch, f(20)], InputRole::Other).unwrap();
    let w = b.weight("w", DType::F32, &[16, 20]).unwrap();
    let y = b.matmul(x, w).unwrap();
    let two = b.scalar(2.0).unwrap();
    let y = b.add(y, two).unwrap();
    let y = b.div(y, d).unwrap();
    b.output("y", y);
    let g = b.finish().unwrap();
    check("unfused", &g, Bucket::new(7, 1), 1e-4);
}

/// Unfused epilogues on two threads: the GEMM's own tasks each run their rows (many row strips),
/// their column panels (few), or their batch entries (a batched GEMM), and the elementwise pass
/// over exactly that part. Against the reference on 1 and 2 threads, bit for bit between the two,
/// and with the 2-thread kernel really in 2 tasks (a one-task kernel runs its pass on one thread).
#[test]
fn unfused_epilogues_split_with_their_gemm() {
    // `(x·W)² + d`: the square maps onto no microkernel epilogue.
    let linear = |k: usize, n: usize| {
        let mut b = GraphBuilder::new();
        let x = b.input("x", DType::F32, vec![Dim::Batch, Dim::Seq, f(k)], InputRole::Other).unwrap();
        let d = b.input("d", DType::F32, vec![Dim::Batch, Dim::Seq, f(n)], InputRole::Other).unwrap();
        let w = b.weight("w", DType::F32, &[k, n]).unwrap();
        let y = b.matmul(x, w).unwrap();
        let y = b.mul(y, y).unwrap();
        let y = b.add(y, d).unwrap();
        b.output("y", y);
        b.finish().unwrap()
    };
    // Scores of 2 × 3 heads, squared.
    let batched = {
        let mut b = GraphBuilder::new();
        let q = b.input("q", DType::F32, vec![Dim::Batch, f(3), Dim::Seq, f(64)], InputRole::Other).unwrap();
        let k = b.input("k", DType::F32, vec![Dim::Batch, f(3), Dim::Seq, f(64)], InputRole::Other).unwrap();
        let s = b.matmul_t(q, k, false, true).unwrap();
        let s = b.mul(s, s).unwrap();
        b.output("s", s);
        b.finish().unwrap()
    };
    // m = 96 rows (16 strips) × 40 columns (3 panels): rows; m = 12 (2 strips) × 200 (13
    // panels): panels; 2·3 heads of 64×64·64×64: batch entries.
    let cases = [("rows", linear(64, 40), Bucket::new(2, 48)), ("panels", linear(64, 200), Bucket::new(1, 12)), ("batch", batched, Bucket::new(2, 64))];
    for (name, g, bucket) in cases {
        check(name, &g, bucket, 1e-5);
        let be = CpuBackend::with_options(CpuOptions { threads: Threads::Count(2), target: CpuTarget::x86_64_v3() }).unwrap();
        let (c, _) = be.compile(&g, bucket, false).unwrap();
        assert!(c.image.steps.iter().any(|s| s.tasks == 2), "{name}: no kernel in 2 tasks: {:?}", c.image.steps);
        let mut rng = Rng::new(5);
        let weights = random_weights(&g, &mut rng);
        let inputs = random_inputs(&g, bucket, &mut rng);
        let run = |threads| {
            let be = CpuBackend::with_options(CpuOptions { threads, ..Default::default() }).unwrap();
            let w = be.upload(&weights, &g).unwrap();
            let mut plan = be.lower(&w, &g, bucket).unwrap();
            let mut out = Outputs::for_bucket(&g, bucket);
            be.run(&mut plan, &Batch { tensors: inputs.clone() }, &mut out).unwrap();
            out.tensors[0].to_f32_vec().iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
        };
        assert_eq!(run(Threads::Single), run(Threads::Count(2)), "{name}: 1 and 2 threads differ");
    }
}

#[test]
fn attention_heads() {
    let mut b = GraphBuilder::new();
    let (heads, hd) = (2, 8);
    let x = b.input("x", DType::F32, vec![Dim::Batch, Dim::Seq, f(heads * hd)], InputRole::Other).unwrap();
    let m = b.input("attention_mask", DType::I64, vec![Dim::Batch, Dim::Seq], InputRole::AttentionMask).unwrap();
    let mf = b.cast(m, DType::F32).unwrap();
    let one = b.scalar(1.0).unwrap();
    let inv = b.sub(one, mf).unwrap();
    let big = b.scalar(-10000.0).unwrap();
    let add = b.mul(inv, big).unwrap();
    let add = b.reshape(add, vec![Dim::Batch, f(1), f(1), Dim::Seq]).unwrap();
    let split = |b: &mut GraphBuilder, v| {
        let r = b.reshape(v, vec![Dim::Batch, Dim::Seq, f(heads), f(hd)]).unwrap();
        b.transpose(r, &[0, 2, 1, 3]).unwrap()
    };
    let wq = b.weight("wq", DType::F32, &[heads * hd, heads * hd]).unwrap();
    let q = b.linear(x, wq, None).unwrap();
    let q = split(&mut b, q);
    let k = split(&mut b, x);
    let v = split(&mut b, x);
    let s = b.matmul_t(q, k, false, true).unwrap();
    let sc = b.scalar(1.0 / (hd as f32).sqrt()).unwrap();
    let s = b.mul(s, sc).unwrap();
    let p = b.softmax(s, 3, Some(add)).unwrap();
    let o = b.matmul(p, v).unwrap();
    let o = b.transpose(o, &[0, 2, 1, 3]).unwrap();
    let o = b.reshape(o, vec![Dim::Batch, Dim::Seq, f(heads * hd)]).unwrap();
    b.output("o", o);
    let g = b.finish().unwrap();
    check("attention", &g, Bucket::new(3, 10), 1e-4);
    clif_golden("attention_heads", &g, Bucket::new(1, 4));
}

#[test]
fn gather_reduce_concat_copy() {
    let mut b = GraphBuilder::new();
    let ids = b.input("input_ids", DType::I64, vec![Dim::Batch, Dim::Seq], InputRole::TokenIds).unwrap();
    let table = b.weight("emb", DType::F32, &[9, 6]).unwrap();
    let e = b.gather(table, ids).unwrap();
    let s = b.reduce(ReduceOp::Sum, e, &[2], false).unwrap();
    let mn = b.reduce(ReduceOp::Mean, e, &[1], true).unwrap();
    let mx = b.reduce(ReduceOp::Max, e, &[1, 2], false).unwrap();
    // Over the strided axis 1 with 6 kept columns: four outputs a lane each, then two alone.
    let mx1 = b.reduce(ReduceOp::Max, e, &[1], false).unwrap();
    let s1 = b.reduce(ReduceOp::Sum, e, &[1], false).unwrap();
    let t = b.transpose(e, &[0, 2, 1]).unwrap();
    let c = b.concat(&[e, e], 2).unwrap();
    let it = b.transpose(ids, &[1, 0]).unwrap();
    let i3 = b.reshape(ids, vec![Dim::Batch, Dim::Seq, f(1)]).unwrap();
    let i2 = b.concat(&[i3, i3], 2).unwrap();
    b.output("s", s);
    b.output("mn", mn);
    b.output("mx", mx);
    b.output("mx1", mx1);
    b.output("s1", s1);
    b.output("t", t);
    b.output("c", c);
    b.output("it", it);
    b.output("i2", i2);
    let g = b.finish().unwrap();
    check("gather_reduce", &g, Bucket::new(2, 5), 1e-5);
    clif_golden("gather_reduce_concat", &g, Bucket::new(1, 3));
}

/// A gather from rows with a fill row appended (the importer's padded window grids): on the CPU
/// the concat is folded into the gather, which reads the GEMM's rows and the fill row in place.
/// Against the reference on 1 and 2 threads for ids in both tables; an id past both is the
/// gather's typed error, not a read past the fill row.
#[test]
fn gather_reads_a_concat_of_rows_in_place() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![f(7), f(12)], InputRole::Other).unwrap();
    let ids = b.input("ids", DType::I64, vec![f(5), f(3)], InputRole::Other).unwrap();
    let w = b.weight("w", DType::F32, &[12, 8]).unwrap();
    let rows = b.matmul(x, w).unwrap();
    let rows = b.relu(rows).unwrap();
    let fill = b.constant(vec![-1.5; 8], &[1, 8]).unwrap();
    let table = b.concat(&[rows, fill], 0).unwrap();
    let y = b.gather(table, ids).unwrap();
    b.output("y", y);
    let g = b.finish().unwrap();
    let bucket = Bucket::new(7, 1);
    let be = CpuBackend::with_options(CpuOptions { threads: Threads::Count(2), target: CpuTarget::x86_64_v3() }).unwrap();
    let (c, _) = be.compile(&g, bucket, false).unwrap();
    assert!(c.image.steps.iter().all(|s| !s.name.contains("concat")), "the concat still runs: {:?}", c.image.steps);
    let mut rng = Rng::new(3);
    let weights = random_weights(&g, &mut rng);
    let xin = random_inputs(&g, bucket, &mut rng).remove(0);
    // Rows 0..7 of x·W, 7 the fill row.
    let run = |threads, id_vals: Vec<i64>| {
        let inputs = vec![xin.clone(), kiln_runtime::HostTensor::i64(vec![5, 3], id_vals).unwrap()];
        let be = CpuBackend::with_options(CpuOptions { threads, ..Default::default() }).unwrap();
        let w = be.upload(&weights, &g).unwrap();
        let mut plan = be.lower(&w, &g, bucket).unwrap();
        let mut out = Outputs::for_bucket(&g, bucket);
        be.run(&mut plan, &Batch { tensors: inputs.clone() }, &mut out).map(|_| (out, inputs))
    };
    let good: Vec<i64> = (0..15).map(|i| (i * 5 + 2) % 8).collect();
    assert!(good.contains(&7) && good.contains(&0));
    for threads in [Threads::Single, Threads::Count(2)] {
        let (out, inputs) = run(threads, good.clone()).unwrap();
        let want = interpret(&g, &weights, &inputs, bucket).unwrap();
        compare(&out.tensors, &want, 1e-5, 1e-5).unwrap();
        let Err(e) = run(threads, (0..15).map(|i| if i == 9 { 8 } else { 0 }).collect()) else { panic!("id 8 is past the fill row") };
        assert!(e.to_string().contains("gather"), "{e}");
    }
}

/// A depthwise convolution as the importer writes it — shifted views of one activation, each
/// times a per-channel weight, summed in order, plus a per-channel bias — runs through the kernel
/// table's `tap_sum_f32`: within the (float64) reference's tolerance, and bit for bit the
/// expression evaluated in f32 in its order, on 1 and 2 threads; 21 channels leave a tail on
/// every vector width. Also as the importer continues it: reshaped back to rows, then a ReLU6
/// (`max(·, 0)`, `min(·, 0.5)`): the clamps move above the reshape (`simplify`) into the same
/// one kernel and the same call.
#[test]
fn depthwise_tap_sums_run_in_the_kernel_table() {
    for relu6 in [false, true] {
        let mut b = GraphBuilder::new();
        let x = b.input("x", DType::F32, vec![f(2), f(8), f(9), f(21)], InputRole::Other).unwrap();
        let bias = b.weight("bias", DType::F32, &[21]).unwrap();
        let mut sum = None;
        for dh in 0..3 {
            for dw in 0..3 {
                let v = b.slice(x, 1, dh, f(dh + 6)).unwrap();
                let v = b.slice(v, 2, dw, f(dw + 7)).unwrap();
                let w = b.weight(&format!("w{dh}{dw}"), DType::F32, &[21]).unwrap();
                let p = b.mul(v, w).unwrap();
                sum = Some(match sum {
                    None => p,
                    Some(s) => b.add(s, p).unwrap(),
                });
            }
        }
        let mut y = b.add(sum.unwrap(), bias).unwrap();
        if relu6 {
            y = b.reshape(y, vec![f(84), f(21)]).unwrap();
            let zero = b.scalar(0.0).unwrap();
            let six = b.scalar(0.5).unwrap();
            y = b.max(y, zero).unwrap();
            y = b.binary(BinaryOp::Min, y, six).unwrap();
        }
        b.output("y", y);
        let g = b.finish().unwrap();
        let bucket = Bucket::new(1, 1);
        check("depthwise", &g, bucket, 1e-6);
        let mut rng = Rng::new(17);
        let weights = random_weights(&g, &mut rng);
        let inputs = random_inputs(&g, bucket, &mut rng);
        let (xv, wv): (Vec<f32>, Vec<Vec<f32>>) = (inputs[0].to_f32_vec(), weights.iter().map(|w| w.to_f32_vec()).collect());
        // Weights in creation order: the bias, then w00, w01, …, w22.
        let mut want = Vec::new();
        for n in 0..2 {
            for h in 0..6 {
                for w in 0..7 {
                    for ch in 0..21 {
                        let x = |dh: usize, dw: usize| xv[((n * 8 + h + dh) * 9 + w + dw) * 21 + ch];
                        let mut s = x(0, 0) * wv[1][ch];
                        for t in 1..9 {
                            s += x(t / 3, t % 3) * wv[1 + t][ch];
                        }
                        s += wv[0][ch];
                        if relu6 {
                            // max(s, +0): +0 where s <= 0 (-0 too); min(s, 0.5): 0.5 where 0.5 < s.
                            s = if s <= 0.0 { 0.0 } else { s };
                            s = if 0.5 < s { 0.5 } else { s };
                        }
                        want.push(s.to_bits());
                    }
                }
            }
        }
        for threads in [Threads::Single, Threads::Count(2)] {
            let be = CpuBackend::with_options(CpuOptions { threads, ..Default::default() }).unwrap();
            let w = be.upload(&weights, &g).unwrap();
            let mut plan = be.lower(&w, &g, bucket).unwrap();
            let mut out = Outputs::for_bucket(&g, bucket);
            be.run(&mut plan, &Batch { tensors: inputs.clone() }, &mut out).unwrap();
            let got: Vec<u32> = out.tensors[0].to_f32_vec().iter().map(|v| v.to_bits()).collect();
            assert!(got == want, "relu6 {relu6}, {threads:?}: not the expression's bits");
        }
        let be = CpuBackend::with_options(CpuOptions { threads: Threads::Count(2), target: CpuTarget::x86_64_v3() }).unwrap();
        let (c, _) = be.compile(&g, bucket, true).unwrap();
        assert_eq!(c.image.steps.len(), 1, "relu6 {relu6}: {:?}", c.image.steps);
        let clif: String = c.clif.iter().map(|(_, t)| t.as_str()).collect();
        let off = kiln_kernels::table::KernelTable::OFF_TAP_SUM_F32;
        assert!(clif.contains(&format!("+{off}\n")), "relu6 {relu6}: no tap_sum_f32 call:\n{clif}");
    }
}

/// The maximum as defined on the floats: the largest, -0 below +0, NaN if any is NaN.
fn max_of(v: impl Iterator<Item = f32>) -> f32 {
    let mut m = f32::NEG_INFINITY;
    for x in v {
        if x.is_nan() {
            return f32::NAN;
        }
        if x > m || (x == 0.0 && m == 0.0 && x.is_sign_positive()) {
            m = x;
        }
    }
    m
}

#[test]
fn max_reductions_run_in_the_kernel_table() {
    // A dynamic quantization's range: max(x) per row and max(-x) over whole rows of rows, large
    // enough for two tasks.
    let (a, r, c) = (4, 64, 300);
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![f(a), f(r), f(c)], InputRole::Other).unwrap();
    let m = b.reduce(ReduceOp::Max, x, &[2], false).unwrap();
    let nx = b.unary(UnaryOp::Neg, x).unwrap();
    let n = b.reduce(ReduceOp::Max, nx, &[1, 2], false).unwrap();
    b.output("m", m);
    b.output("n", n);
    let g = b.finish().unwrap();
    let bucket = Bucket::new(1, 1);
    check("rowmax", &g, bucket, 0.0);
    // Rows of one zero sign, of both, with a NaN, of -inf only; the rest random.
    let mut rng = Rng::new(23);
    let mut xv: Vec<f32> = (0..a * r * c).map(|_| rng.uniform(-100.0, 100.0)).collect();
    let row = |xv: &mut Vec<f32>, i: usize, f: &dyn Fn(usize) -> f32| (0..c).for_each(|j| xv[i * c + j] = f(j));
    row(&mut xv, 0, &|_| -0.0);
    row(&mut xv, 1, &|j| if j == 250 { 0.0 } else { -0.0 });
    row(&mut xv, 70, &|j| if j == 299 { f32::NAN } else { -1.0 });
    row(&mut xv, 200, &|_| f32::NEG_INFINITY);
    let want_m: Vec<f32> = (0..a * r).map(|i| max_of(xv[i * c..(i + 1) * c].iter().copied())).collect();
    let want_n: Vec<f32> = (0..a).map(|i| max_of(xv[i * r * c..(i + 1) * r * c].iter().map(|&v| -v))).collect();
    assert!(want_m[0].to_bits() == (-0.0f32).to_bits() && want_m[1].to_bits() == 0 && want_m[70].is_nan() && want_n[1].is_nan());
    let same = |g: &[f32], w: &[f32]| g.len() == w.len() && g.iter().zip(w).all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()));
    let inputs = vec![kiln_runtime::HostTensor::f32(vec![a, r, c], xv).unwrap()];
    for threads in [Threads::Single, Threads::Count(2)] {
        let be = CpuBackend::with_options(CpuOptions { threads, ..Default::default() }).unwrap();
        let w = be.upload(&[], &g).unwrap();
        let mut plan = be.lower(&w, &g, bucket).unwrap();
        let mut out = Outputs::for_bucket(&g, bucket);
        be.run(&mut plan, &Batch { tensors: inputs.clone() }, &mut out).unwrap();
        assert!(same(&out.tensors[0].to_f32_vec(), &want_m), "{threads:?}: row maxima");
        assert!(same(&out.tensors[1].to_f32_vec(), &want_n), "{threads:?}: maxima of the negated rows");
    }
    let be = CpuBackend::with_options(CpuOptions { threads: Threads::Count(2), target: CpuTarget::x86_64_v3() }).unwrap();
    let (c, _) = be.compile(&g, bucket, true).unwrap();
    let clif: String = c.clif.iter().map(|(_, t)| t.as_str()).collect();
    let off = kiln_kernels::table::KernelTable::OFF_MAX_ROWS_F32;
    assert_eq!(clif.matches(&format!("+{off}\n")).count(), 2, "both reductions call max_rows_f32:\n{clif}");
}

#[test]
fn casts_round_like_the_reference() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![Dim::Batch, f(12)], InputRole::Other).unwrap();
    let k = b.scalar(70000.0).unwrap();
    let big = b.mul(x, k).unwrap();
    let h = b.cast(big, DType::F16).unwrap();
    let h = b.cast(h, DType::F32).unwrap();
    let small = b.scalar(1e-6).unwrap();
    let tiny = b.mul(x, small).unwrap();
    let ht = b.cast(tiny, DType::F16).unwrap();
    let ht = b.cast(ht, DType::F32).unwrap();
    let bf = b.cast(big, DType::BF16).unwrap();
    let bf = b.cast(bf, DType::F32).unwrap();
    let i = b.cast(big, DType::I32).unwrap();
    let i = b.cast(i, DType::F32).unwrap();
    let l = b.cast(big, DType::I64).unwrap();
    b.output("h", h);
    b.output("ht", ht);
    b.output("bf", bf);
    b.output("i", i);
    b.output("l", l);
    let g = b.finish().unwrap();
    check("casts", &g, Bucket::new(4, 1), 1e-9);
}

#[test]
fn gather_out_of_range_is_an_error() {
    let mut b = GraphBuilder::new();
    let ids = b.input("input_ids", DType::I64, vec![Dim::Batch, Dim::Seq], InputRole::TokenIds).unwrap();
    let table = b.weight("emb", DType::F32, &[4, 3]).unwrap();
    let e = b.gather(table, ids).unwrap();
    b.output("e", e);
    let g = b.finish().unwrap();
    let be = CpuBackend::single_threaded().unwrap();
    let weights = random_weights(&g, &mut Rng::new(1));
    let w = be.upload(&weights, &g).unwrap();
    let bucket = Bucket::new(1, 3);
    let mut plan = be.lower(&w, &g, bucket).unwrap();
    let mut out = Outputs::for_bucket(&g, bucket);
    for bad in [4i64, -1, i64::MAX] {
        let batch = Batch { tensors: vec![kiln_runtime::HostTensor::i64(vec![1, 3], vec![0, bad, 1]).unwrap()] };
        let e = be.run(&mut plan, &batch, &mut out).unwrap_err();
        assert!(e.to_string().contains("gather id"), "{e}");
    }
    let ok = Batch { tensors: vec![kiln_runtime::HostTensor::i64(vec![1, 3], vec![3, 0, 1]).unwrap()] };
    be.run(&mut plan, &ok, &mut out).unwrap();
    assert_eq!(&out.tensors[0].to_f32_vec()[..3], weights[0].to_f32_vec()[9..12].as_ref());
}

/// A gated FFN, `(x·Wu + bu) · silu(x·Wg)` with SiLU written as PyTorch exports it
/// (`g · sigmoid(g)`): the up projection's GEMM applies the gate in its microkernel epilogue
/// (`GATED`), on both tile widths, matching the reference; GELU-gated (GeGLU) too.
#[test]
fn gemm_gated_epilogue() {
    for gelu in [false, true] {
        let mut b = GraphBuilder::new();
        let x = b.input("x", DType::F32, vec![Dim::Batch, Dim::Seq, f(24)], InputRole::Other).unwrap();
        let wg = b.weight("wg", DType::F32, &[24, 40]).unwrap();
        let wu = b.weight("wu", DType::F32, &[24, 40]).unwrap();
        let bu = b.weight("bu", DType::F32, &[40]).unwrap();
        let g = b.matmul(x, wg).unwrap();
        let act = if gelu {
            b.gelu(g).unwrap()
        } else {
            let s = b.unary(UnaryOp::Sigmoid, g).unwrap();
            b.mul(g, s).unwrap()
        };
        let u = b.matmul(x, wu).unwrap();
        let u = b.add(u, bu).unwrap();
        let y = b.mul(u, act).unwrap();
        b.output("y", y);
        let g = b.finish().unwrap();
        check(if gelu { "geglu" } else { "swiglu" }, &g, Bucket::new(3, 5), 1e-5);
        if !gelu {
            // The gate's activation is in the GEMM call's epilogue: code 6 (SiLU) with GATED.
            let be = CpuBackend::with_options(CpuOptions { threads: Threads::Count(2), target: CpuTarget::x86_64_v3() }).unwrap();
            let (c, _) = be.compile(&g, Bucket::new(1, 2), true).unwrap();
            let clif: String = c.clif.iter().map(|(_, t)| t.as_str()).collect();
            let code = (kiln_kernels::math::Activation::Silu as u32 | kiln_kernels::gemm::GATED).to_string();
            assert!(clif.contains(&format!("iconst.i32 {code}")), "no gated SiLU epilogue in:\n{clif}");
        }
    }
}

/// A dequantizing GEMM, `act(x·W · s + b)` with `s` a one-element run-time value (the
/// `a_scale · b_scale` of a dynamically quantized MatMul): `s` is the microkernel's scale, read
/// when the kernel runs, so the bias and the activation stay in the microkernel's epilogue.
/// Without an activation the output is `(acc · s) + b` rounded as written, bit for bit against
/// the same GEMM's plain product; with GELU it matches the reference and the GELU's code is in
/// the GEMM call's epilogue.
#[test]
fn gemm_runtime_scale_epilogue() {
    let graph = |act: bool, scaled: bool| {
        let mut b = GraphBuilder::new();
        let x = b.input("x", DType::F32, vec![Dim::Batch, Dim::Seq, f(24)], InputRole::Other).unwrap();
        let s = b.input("s", DType::F32, vec![], InputRole::Other).unwrap();
        let w = b.weight("w", DType::F32, &[24, 40]).unwrap();
        let bias = b.weight("b", DType::F32, &[40]).unwrap();
        let mut y = b.matmul(x, w).unwrap();
        if scaled {
            y = b.mul(y, s).unwrap();
            y = b.add(y, bias).unwrap();
        }
        if act {
            y = b.gelu(y).unwrap();
        }
        b.output("y", y);
        b.finish().unwrap()
    };
    check("gemm_scale_gelu", &graph(true, true), Bucket::new(3, 5), 1e-5);
    let be = CpuBackend::with_options(CpuOptions { threads: Threads::Count(2), target: CpuTarget::x86_64_v3() }).unwrap();
    let (c, _) = be.compile(&graph(true, true), Bucket::new(1, 2), true).unwrap();
    let clif: String = c.clif.iter().map(|(_, t)| t.as_str()).collect();
    let code = (kiln_kernels::math::Activation::GeluErf as u32).to_string();
    assert!(clif.contains(&format!("iconst.i32 {code}")), "no GELU in the GEMM's epilogue:\n{clif}");

    let bucket = Bucket::new(3, 5);
    let (scaled, plain) = (graph(false, true), graph(false, false));
    let mut rng = Rng::new(11);
    let weights = random_weights(&scaled, &mut rng);
    let inputs = random_inputs(&scaled, bucket, &mut rng);
    let s = inputs[1].to_f32_vec()[0];
    let run = |g: &Graph, ins: Vec<kiln_runtime::HostTensor>| {
        let w = be.upload(&weights, g).unwrap();
        let mut plan = be.lower(&w, g, bucket).unwrap();
        let mut out = Outputs::for_bucket(g, bucket);
        be.run(&mut plan, &Batch { tensors: ins }, &mut out).unwrap();
        out.tensors[0].to_f32_vec()
    };
    let got = run(&scaled, inputs.clone());
    let acc = run(&plain, inputs);
    let bias = weights[1].to_f32_vec();
    for (i, (&g, &a)) in got.iter().zip(&acc).enumerate() {
        let want = a * s + bias[i % 40];
        assert_eq!(g.to_bits(), want.to_bits(), "element {i}: {g} vs (acc · s) + b = {want}");
    }
}
