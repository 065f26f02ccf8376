//! The middle-end on MiniLM-shaped graphs (`models::bert`, synthetic weights: the graph's
//! structure does not depend on weight values): fusion counts, memory-plan quality and
//! checks, and kernel-level execution against the reference interpreter.

use kiln_compiler::reference::interpret;
use kiln_testkit::kernel_eval::run_program;
use kiln_compiler::kernel_ir::{KernelOp, WeightLayout};
use kiln_compiler::memory_plan::check_plan;
use kiln_compiler::models::bert::{build_bert, BertConfig, BertOutputs};
use kiln_compiler::pipeline::{compile_report, run_pipeline};
use kiln_testkit::random::{compare, random_inputs, random_weights, Rng};
use kiln_runtime::{Bucket, Graph};

fn minilm(layers: usize, outputs: BertOutputs) -> Graph {
    let mut cfg = BertConfig::minilm_l6();
    cfg.num_hidden_layers = layers;
    build_bert(&cfg, "", outputs).unwrap()
}

#[test]
fn minilm_arena_is_within_ten_percent_of_the_lower_bound() {
    let g = minilm(6, BertOutputs::default());
    for b in [Bucket::new(1, 128), Bucket::new(8, 128), Bucket::new(32, 128)] {
        let l = run_pipeline(&g, b).unwrap();
        check_plan(&l.program, &l.plan).unwrap();
        let p = &l.plan;
        println!(
            "MiniLM {b}: arena {} B, naive {} B, lower bound {} B, ratio {:.4}",
            p.arena_bytes,
            p.naive_bytes,
            p.lower_bound_bytes,
            p.ratio()
        );
        assert!(p.arena_bytes >= p.lower_bound_bytes);
        assert!(p.ratio() <= 1.10, "bucket {b}: arena/lower bound = {:.4}", p.ratio());
        assert!(p.naive_bytes > 5 * p.arena_bytes, "bucket {b}: reuse should be large");
    }
}

#[test]
fn minilm_fusion_at_1x128() {
    let g = minilm(6, BertOutputs::default());
    let l = run_pipeline(&g, Bucket::new(1, 128)).unwrap();
    let by_kind = l.program.kernels_by_kind();
    println!("{}", l.fusion);
    // One attention kernel per layer, no softmax left over; every matmul of a linear layer is
    // a GEMM with its bias (and GELU / residual) in the epilogue.
    assert_eq!(by_kind.get("attention"), Some(&6));
    assert_eq!(by_kind.get("softmax"), None);
    // Per layer: Q, K and V merged into one GEMM over the concatenated weights, the output
    // projection, FFN up and FFN down.
    assert_eq!(by_kind.get("gemm"), Some(&24));
    let qkv = l.program.kernels.iter().filter(|k| matches!(k.op, KernelOp::Gemm { n: 1152, k: 384, .. })).count();
    assert_eq!(qkv, 6, "one merged Q/K/V projection per layer");
    assert_eq!(by_kind.get("layer_norm"), Some(&13));
    let mut gelu_epilogues = 0;
    for k in &l.program.kernels {
        if let KernelOp::Gemm { batch, epilogue, .. } = &k.op {
            assert!(batch.is_empty(), "{}: linear layers run as one [batch*seq, k] GEMM", k.name);
            let e = epilogue.as_ref().unwrap_or_else(|| panic!("{}: bias not fused", k.name));
            if e.print().contains("gelu") {
                gelu_epilogues += 1;
            }
        }
        // No transpose is materialized: attention reads Q/K/V and writes its output in place.
        assert!(!k.op.is_copy() || k.name.starts_with("mask."), "unexpected copy kernel {}", k.name);
    }
    assert_eq!(gelu_epilogues, 6);
    // Every linear weight is pre-transposed once at lowering.
    let transposed = l.layouts.iter().filter(|&&x| x == WeightLayout::Transposed).count();
    assert_eq!(transposed, 36);
    assert!(l.program.kernels.len() <= 70, "{} kernels", l.program.kernels.len());
}

#[test]
fn compile_report_prints_counts_and_bytes() {
    let g = minilm(6, BertOutputs::default());
    let r = compile_report(&g, Bucket::new(1, 128)).unwrap();
    let text = r.to_string();
    println!("{text}");
    for key in ["ops before: ", "kernels after: ", "arena bytes: ", "naive bytes: ", "lower bound bytes: ", "arena / lower bound: "] {
        assert!(text.contains(key), "missing `{key}` in\n{text}");
    }
    assert_eq!(r.ops_before, 195);
    assert_eq!(r.kernels_after, r.kernels_by_kind.values().sum::<usize>());
    assert!(r.arena_bytes <= r.naive_bytes && r.lower_bound_bytes <= r.arena_bytes);
    assert!(text.contains("matmul flop: "), "missing the flop line in\n{text}");
}

#[test]
fn matmul_flops_match_the_textbook_count() {
    // Per layer and token row: Q, K, V and the output projection (4·h·h), the FFN (2·h·f);
    // per head: Q·Kᵀ and P·V (2·s·s·d). Two flops per multiply-add.
    let (h, f, heads, d, layers) = (384u64, 1536u64, 12u64, 32u64, 6u64);
    let g = minilm(6, BertOutputs::default());
    for (batch, seq) in [(1u64, 16u64), (1, 128), (8, 128)] {
        let r = compile_report(&g, Bucket::new(batch as usize, seq as usize)).unwrap();
        let rows = batch * seq;
        let linear = 2 * rows * (4 * h * h + 2 * h * f);
        let attention = 2 * batch * heads * seq * seq * 2 * d;
        assert_eq!(r.matmul_flops, u128::from(layers * (linear + attention)), "bucket {batch}x{seq}");
    }
}

fn check_against_reference(g: &Graph, b: Bucket, seed: u64) {
    let mut rng = Rng::new(seed);
    let w = random_weights(g, &mut rng);
    let x = random_inputs(g, b, &mut rng);
    let l = run_pipeline(g, b).unwrap();
    let got = run_program(&l.program, &l.plan, &w, &x).unwrap();
    let want = interpret(g, &w, &x, b).unwrap();
    compare(&got, &want, 2e-4, 2e-3).unwrap_or_else(|e| panic!("bucket {b}: {e}"));
}

#[test]
fn tiny_bert_kernels_match_the_reference() {
    let outs = BertOutputs { embeddings: true, last_hidden_state: true };
    let g = build_bert(&BertConfig::tiny(), "", outs).unwrap();
    for (i, b) in [Bucket::new(1, 1), Bucket::new(1, 7), Bucket::new(3, 5), Bucket::new(2, 16)].into_iter().enumerate() {
        check_against_reference(&g, b, i as u64);
    }
}

#[test]
fn minilm_one_layer_kernels_match_the_reference() {
    let outs = BertOutputs { embeddings: true, last_hidden_state: true };
    check_against_reference(&minilm(1, outs), Bucket::new(2, 16), 7);
}
