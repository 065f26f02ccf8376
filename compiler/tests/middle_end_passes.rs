//! Unit-level tests of the middle-end stages: each pass's rewrites, fusion decisions, the
//! memory-plan checker and the evaluator catching corrupted plans, errors for bad input.

use kiln_compiler::ir::GraphExt as _;
use kiln_compiler::reference::interpret;
use kiln_compiler::fuse::fuse;
use kiln_compiler::ir::GraphBuilder;
use kiln_testkit::kernel_eval::run_program;
use kiln_compiler::kernel_ir::{KernelOp, WeightLayout};
use kiln_compiler::memory_plan::{check_plan, plan_memory};
use kiln_compiler::models::bert::{build_bert, BertConfig, BertOutputs};
use kiln_compiler::pipeline::{dump_after, run_pipeline, STAGES};
use kiln_testkit::random::{compare, random_case};
use kiln_runtime::graph::{Dim, Op};
use kiln_runtime::{Bucket, DType, Error, Graph, InputRole};

fn ops(g: &Graph) -> Vec<String> {
    g.nodes.iter().map(|n| n.op.name()).collect()
}

#[test]
fn simplify_removes_identities_and_collapses_chains() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![Dim::Batch, Dim::Fixed(4), Dim::Fixed(6)], InputRole::Other).unwrap();
    let one = b.scalar(1.0).unwrap();
    let zero = b.scalar(0.0).unwrap();
    let neg_zero = b.scalar(-0.0).unwrap();
    let a = b.mul(x, one).unwrap();
    let a = b.add(neg_zero, a).unwrap();
    let a = b.sub(a, zero).unwrap();
    let a = b.div(a, one).unwrap();
    let t = b.transpose(a, &[0, 2, 1]).unwrap();
    let t = b.transpose(t, &[0, 2, 1]).unwrap();
    let r = b.reshape(t, vec![Dim::Batch, Dim::Fixed(24)]).unwrap();
    let r = b.reshape(r, vec![Dim::Batch, Dim::Fixed(4), Dim::Fixed(6)]).unwrap();
    let n = b.unary(kiln_runtime::UnaryOp::Neg, r).unwrap();
    let n = b.unary(kiln_runtime::UnaryOp::Neg, n).unwrap();
    let c = b.cast(n, DType::F32).unwrap();
    let y = b.tanh(c).unwrap();
    b.output("y", y);
    let g = b.finish().unwrap();
    let l = run_pipeline(&g, Bucket::new(2, 1)).unwrap();
    assert_eq!(ops(&l.graph), vec!["input#0", "tanh"], "{}", l.graph.print());
    assert_eq!(l.program.kernels.len(), 1);
}

/// `x + +0` is not `x` (at x = -0 it is +0), nor is `x - -0`: both stay; the bits of a -0
/// input come out as the reference says.
#[test]
fn simplify_keeps_additions_that_change_the_sign_of_zero() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![Dim::Batch, Dim::Fixed(2)], InputRole::Other).unwrap();
    let zero = b.scalar(0.0).unwrap();
    let neg_zero = b.scalar(-0.0).unwrap();
    let a = b.add(x, zero).unwrap();
    let s = b.sub(x, neg_zero).unwrap();
    b.output("a", a);
    b.output("s", s);
    let g = b.finish().unwrap();
    let l = run_pipeline(&g, Bucket::new(1, 1)).unwrap();
    assert_eq!(ops(&l.graph).iter().filter(|o| *o == "add" || *o == "sub").count(), 2, "{}", l.graph.print());
    let input = kiln_runtime::HostTensor::new(vec![1, 2], kiln_runtime::TensorData::F32(vec![-0.0, 1.0])).unwrap();
    let out = interpret(&l.graph, &[], &[input], Bucket::new(1, 1)).unwrap();
    for t in &out {
        let v = t.data.to_f64_vec();
        assert!(v[0] == 0.0 && v[0].is_sign_positive(), "{v:?}");
    }
}

#[test]
fn transposes_feeding_matmuls_become_flags_or_strides() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![Dim::Batch, Dim::Fixed(3), Dim::Fixed(5)], InputRole::Other).unwrap();
    let w = b.weight("w", DType::F32, &[4, 5]).unwrap();
    let wt = b.transpose(w, &[1, 0]).unwrap();
    let y = b.matmul(x, wt).unwrap(); // [b,3,4]
    let xt = b.transpose(x, &[0, 2, 1]).unwrap(); // [b,5,3]
    let z = b.matmul(xt, y).unwrap(); // [b,5,4]: transpose on A, batched
    b.output("z", z);
    let g = b.finish().unwrap();
    let l = run_pipeline(&g, Bucket::new(2, 1)).unwrap();
    assert!(l.graph.nodes.iter().all(|n| !matches!(n.op, Op::Transpose { .. })), "{}", l.graph.print());
    assert!(l.graph.nodes.iter().any(|n| n.op == Op::MatMul { transpose_a: true, transpose_b: false }));
    assert_eq!(l.layouts, vec![WeightLayout::Transposed]);
    assert!(l.program.kernels.iter().all(|k| matches!(k.op, KernelOp::Gemm { .. })), "{}", l.program.print());

    // The layout is the target's choice: the GPU keeps the checkpoint layout, reads Wᵀ through
    // strides, and refuses a program laid out for the CPU rather than misreading it.
    use kiln_compiler::codegen::cuda::{emit_program, placement, CudaTarget, LAYOUT_POLICY};
    let gpu = kiln_compiler::pipeline::run_pipeline_for(&g, Bucket::new(2, 1), LAYOUT_POLICY).unwrap();
    assert_eq!(gpu.layouts, vec![WeightLayout::AsIs]);
    let t = CudaTarget::new("sm_80").unwrap();
    emit_program(&gpu.program, &placement(&gpu).unwrap(), &t).unwrap();
    let e = emit_program(&l.program, &placement(&l).unwrap(), &t).unwrap_err();
    assert!(matches!(e, kiln_runtime::Error::Internal { .. }) && e.to_string().contains("another target"), "{e}");
}

#[test]
fn cse_dce_and_const_fold() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![Dim::Fixed(2), Dim::Fixed(3)], InputRole::Other).unwrap();
    let e1 = b.exp(x).unwrap();
    let e2 = b.exp(x).unwrap();
    let s = b.add(e1, e2).unwrap();
    let _dead = b.tanh(s).unwrap();
    let c1 = b.constant(vec![1.0, 2.0, 3.0], &[3]).unwrap();
    let c2 = b.scalar(2.0).unwrap();
    let c = b.mul(c1, c2).unwrap();
    let c = b.sqrt(c).unwrap();
    let y = b.mul(s, c).unwrap();
    b.output("y", y);
    let g = b.finish().unwrap();
    let l = run_pipeline(&g, Bucket::new(1, 1)).unwrap();
    assert_eq!(ops(&l.graph), vec!["input#0", "exp", "add", "const", "mul"], "{}", l.graph.print());
    let Op::Constant { values } = &l.graph.nodes[3].op else { panic!() };
    let want = [2f32.sqrt(), 2.0, 6f32.sqrt()];
    assert!(values.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6), "{values:?}");
    // One elementwise kernel does it all.
    assert_eq!(l.program.kernels.len(), 1);
}

#[test]
fn shared_intermediates_and_outputs_stop_fusion() {
    // softmax(q kᵀ) whose scores are also an output: no attention kernel.
    let mut b = GraphBuilder::new();
    let q = b.input("q", DType::F32, vec![Dim::Batch, Dim::Seq, Dim::Fixed(4)], InputRole::Other).unwrap();
    let s = b.matmul_t(q, q, false, true).unwrap();
    let p = b.softmax(s, 2, None).unwrap();
    let o = b.matmul(p, q).unwrap();
    b.output("o", o);
    b.output("scores", s);
    let g = b.finish().unwrap();
    let l = run_pipeline(&g, Bucket::new(2, 3)).unwrap();
    let kinds = l.program.kernels_by_kind();
    assert_eq!(kinds.get("attention"), None, "{}", l.program.print());
    assert_eq!(kinds.get("softmax"), Some(&1));
    // Without the extra output it is one attention kernel.
    let mut g2 = g.clone();
    g2.outputs.pop();
    g2.output_names.pop();
    let l2 = run_pipeline(&g2, Bucket::new(2, 3)).unwrap();
    assert_eq!(l2.program.kernels_by_kind().get("attention"), Some(&1), "{}", l2.program.print());
    assert_eq!(l2.program.kernels.len(), 1);
}

#[test]
fn dump_after_every_stage_and_unknown_stage() {
    let g = build_bert(&BertConfig::tiny(), "", BertOutputs::default()).unwrap();
    let b = Bucket::new(1, 8);
    for s in STAGES {
        let text = dump_after(&g, b, s).unwrap();
        assert!(!text.is_empty(), "{s}");
        assert!(!text.contains("batch") || *s == "fuse", "{s}: shapes must be concrete after specialize");
    }
    assert!(dump_after(&g, b, "layout").unwrap().contains("transposed"));
    assert!(dump_after(&g, b, "memory_plan").unwrap().starts_with("arena "));
    match dump_after(&g, b, "fusion") {
        Err(Error::Unsupported(m)) => assert!(m.contains("memory_plan"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn bad_buckets_and_unspecialized_graphs_are_typed_errors() {
    let g = build_bert(&BertConfig::tiny(), "", BertOutputs::default()).unwrap();
    // The tiny model has 64 positions.
    match run_pipeline(&g, Bucket::new(1, 65)) {
        Err(Error::Graph { node, .. }) => assert!(node.contains("slice"), "{node}"),
        other => panic!("{other:?}"),
    }
    let layouts = vec![WeightLayout::AsIs; g.weights.len()];
    assert!(matches!(fuse(&g, Bucket::new(1, 8), &layouts), Err(Error::Graph { .. })));
}

/// Moves one arena buffer onto another that is live at the same time.
fn corrupt(l: &mut kiln_compiler::pipeline::Lowered) -> bool {
    let ps = l.plan.placements.clone();
    for a in &ps {
        for b in &ps {
            let together = a.buffer != b.buffer && a.first <= b.first && b.first <= a.last && a.last > b.first;
            if together && a.bytes > 0 && b.bytes > 0 && a.offset != b.offset {
                l.plan.offsets[b.buffer.index()] = Some(a.offset);
                return true;
            }
        }
    }
    false
}

#[test]
fn corrupted_plans_fail_the_checker_and_the_evaluator() {
    let (mut tried, mut caught_by_eval) = (0, 0);
    for seed in 0..400 {
        let case = random_case(seed);
        let mut l = run_pipeline(&case.graph, case.bucket).unwrap();
        if !corrupt(&mut l) {
            continue;
        }
        tried += 1;
        assert!(check_plan(&l.program, &l.plan).is_err(), "seed {seed}: checker missed an overlap");
        let want = interpret(&case.graph, &case.weights, &case.inputs, case.bucket).unwrap();
        match run_program(&l.program, &l.plan, &case.weights, &case.inputs) {
            Ok(got) if compare(&got, &want, 2e-3, 2e-3).is_ok() => {}
            _ => caught_by_eval += 1,
        }
    }
    println!("corrupted {tried} plans, the evaluator saw {caught_by_eval} of them");
    assert!(tried >= 100, "only {tried} plans could be corrupted");
    assert!(caught_by_eval * 10 >= tried * 7, "evaluator caught only {caught_by_eval} of {tried}");
}

#[test]
fn misaligned_or_out_of_bounds_offsets_fail_the_checker() {
    let g = build_bert(&BertConfig::tiny(), "", BertOutputs::default()).unwrap();
    let l = run_pipeline(&g, Bucket::new(2, 8)).unwrap();
    let b = l.plan.placements[0].buffer;
    let mut p = l.plan.clone();
    p.offsets[b.index()] = Some(p.offsets[b.index()].unwrap() + 4);
    assert!(check_plan(&l.program, &p).is_err());
    let mut p = l.plan.clone();
    p.arena_bytes -= 64;
    assert!(check_plan(&l.program, &p).is_err());
    let mut p = l.plan.clone();
    p.offsets[b.index()] = None;
    // A corrupted plan is a kiln bug, reported as one (not as a problem in the user's graph).
    let e = check_plan(&l.program, &p).unwrap_err();
    assert!(matches!(&e, kiln_runtime::Error::Internal { stage, .. } if stage == "memory plan"), "{e}");
    assert!(e.to_string().starts_with("internal error in memory plan (a kiln bug"), "{e}");
    // The planner's own output passes, and re-planning is deterministic.
    check_plan(&l.program, &l.plan).unwrap();
    assert_eq!(plan_memory(&l.program).unwrap(), l.plan);
}

#[test]
fn lowered_programs_round_trip_through_serde() {
    let g = build_bert(&BertConfig::tiny(), "", BertOutputs::default()).unwrap();
    let l = run_pipeline(&g, Bucket::new(2, 8)).unwrap();
    let text = serde_json::to_string(&l).unwrap();
    let back: kiln_compiler::pipeline::Lowered = serde_json::from_str(&text).unwrap();
    assert_eq!(back, l);
    assert_eq!(back.program.print(), l.program.print());
}

/// RMSNorm as PyTorch's TorchScript export writes it, `x · (1 / sqrt(mean(x²) + eps)) · γ`
/// (`torch.rsqrt` as a division of the constant 1), is one rms_norm kernel, and computes what
/// the written-out ops do.
#[test]
fn norms_finds_rms_norm_over_a_division_of_one() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![Dim::Batch, Dim::Seq, Dim::Fixed(16)], InputRole::Other).unwrap();
    let gamma = b.weight("g", DType::F32, &[16]).unwrap();
    let sq = b.mul(x, x).unwrap();
    let ms = b.reduce_mean(sq, &[2], true).unwrap();
    let eps = b.scalar(1e-6).unwrap();
    let s = b.add(ms, eps).unwrap();
    let r = b.sqrt(s).unwrap();
    let one = b.scalar(1.0).unwrap();
    let inv = b.div(one, r).unwrap();
    let n = b.mul(x, inv).unwrap();
    let y = b.mul(gamma, n).unwrap();
    b.output("y", y);
    let g = b.finish().unwrap();
    let bucket = Bucket::new(2, 5);
    let lowered = run_pipeline(&g, bucket).unwrap();
    let kinds = lowered.program.kernels_by_kind();
    assert_eq!((kinds.get("rms_norm"), kinds.len()), (Some(&1), 1), "{kinds:?}");
    let mut rng = kiln_testkit::random::Rng::new(3);
    let w = kiln_testkit::random::random_weights(&g, &mut rng);
    let inputs = kiln_testkit::random::random_inputs(&g, bucket, &mut rng);
    let want = interpret(&g, &w, &inputs, bucket).unwrap();
    let got = run_program(&lowered.program, &lowered.plan, &w, &inputs).unwrap();
    compare(&got, &want, 1e-5, 1e-5).unwrap();
}
