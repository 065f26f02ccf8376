//! Golden tests of the middle-end: the graph after every pass (`tests/golden/passes`), the
//! fused kernel program and fusion report (`tests/golden/fuse`) and the memory plan
//! (`tests/golden/memory_plan`) for small graphs and MiniLM's first layer (synthetic-weights
//! shape: the structure does not depend on weight values). `BLESS=1` rewrites them.

use kiln_testkit::golden::check_golden;
use kiln_compiler::ir::GraphBuilder;
use kiln_compiler::models::bert::{build_bert, BertConfig, BertOutputs};
use kiln_compiler::pipeline::{dump_after, run_pipeline};
use kiln_runtime::graph::{Dim, ReduceOp};
use kiln_runtime::{Bucket, DType, Graph, InputRole};

const GRAPH_PASSES: &[&str] = &["specialize", "const_fold", "simplify", "cse", "dce", "layout"];

fn check_case(name: &str, g: &Graph, b: Bucket) {
    let mut passes = String::new();
    for p in GRAPH_PASSES {
        passes.push_str(&format!("# after {p} (bucket {b})\n"));
        passes.push_str(&dump_after(g, b, p).unwrap());
    }
    check_golden(&format!("tests/golden/passes/{name}.txt"), &passes);
    let l = run_pipeline(g, b).unwrap();
    check_golden(&format!("tests/golden/fuse/{name}.txt"), &format!("{}\n{}", l.fusion, l.program.print()));
    check_golden(&format!("tests/golden/memory_plan/{name}.txt"), &l.plan.print(&l.program));
}

fn f32_input(b: &mut GraphBuilder, name: &str, shape: Vec<Dim>) -> kiln_runtime::ValueId {
    b.input(name, DType::F32, shape, InputRole::Other).unwrap()
}

/// linear → GELU → linear → + residual → LayerNorm.
fn mlp_residual_ln() -> Graph {
    let mut b = GraphBuilder::new();
    let x = f32_input(&mut b, "x", vec![Dim::Batch, Dim::Seq, Dim::Fixed(8)]);
    let w1 = b.weight("fc1.weight", DType::F32, &[16, 8]).unwrap();
    let b1 = b.weight("fc1.bias", DType::F32, &[16]).unwrap();
    let w2 = b.weight("fc2.weight", DType::F32, &[8, 16]).unwrap();
    let b2 = b.weight("fc2.bias", DType::F32, &[8]).unwrap();
    let h = b.linear(x, w1, Some(b1)).unwrap();
    let h = b.gelu(h).unwrap();
    let y = b.linear(h, w2, Some(b2)).unwrap();
    let r = b.add(y, x).unwrap();
    let gm = b.weight("ln.weight", DType::F32, &[8]).unwrap();
    let bt = b.weight("ln.bias", DType::F32, &[8]).unwrap();
    let o = b.layer_norm(r, gm, bt, 1e-12).unwrap();
    b.output("y", o);
    b.finish().unwrap()
}

/// BERT-style self-attention with an additive padding mask.
fn attention_block() -> Graph {
    let (h, heads) = (8usize, 2usize);
    let d = h / heads;
    let mut b = GraphBuilder::new();
    let x = f32_input(&mut b, "x", vec![Dim::Batch, Dim::Seq, Dim::Fixed(h)]);
    let m = b.input("attention_mask", DType::I64, vec![Dim::Batch, Dim::Seq], InputRole::AttentionMask).unwrap();
    let mf = b.cast(m, DType::F32).unwrap();
    let one = b.scalar(1.0).unwrap();
    let inv = b.sub(one, mf).unwrap();
    let big = b.scalar(-10000.0).unwrap();
    let add = b.mul(inv, big).unwrap();
    let mask = b.reshape(add, vec![Dim::Batch, Dim::Fixed(1), Dim::Fixed(1), Dim::Seq]).unwrap();
    let heads_of = |b: &mut GraphBuilder, name: &str| {
        let w = b.weight(&format!("{name}.weight"), DType::F32, &[h, h]).unwrap();
        let bias = b.weight(&format!("{name}.bias"), DType::F32, &[h]).unwrap();
        let t = b.linear(x, w, Some(bias)).unwrap();
        let t = b.reshape(t, vec![Dim::Batch, Dim::Seq, Dim::Fixed(heads), Dim::Fixed(d)]).unwrap();
        b.transpose(t, &[0, 2, 1, 3]).unwrap()
    };
    let q = heads_of(&mut b, "q");
    let k = heads_of(&mut b, "k");
    let v = heads_of(&mut b, "v");
    let s = b.matmul_t(q, k, false, true).unwrap();
    let c = b.scalar((d as f32).sqrt()).unwrap();
    let s = b.div(s, c).unwrap();
    let s = b.add(s, mask).unwrap();
    let p = b.softmax(s, 3, None).unwrap();
    let ctx = b.matmul(p, v).unwrap();
    let ctx = b.transpose(ctx, &[0, 2, 1, 3]).unwrap();
    let ctx = b.reshape(ctx, vec![Dim::Batch, Dim::Seq, Dim::Fixed(h)]).unwrap();
    b.output("ctx", ctx);
    b.finish().unwrap()
}

/// Work for every pass: identities, repeats, constants, dead nodes, a transpose on a weight.
fn simplify_fodder() -> Graph {
    let mut b = GraphBuilder::new();
    let x = f32_input(&mut b, "x", vec![Dim::Batch, Dim::Fixed(3), Dim::Fixed(4)]);
    let one = b.scalar(1.0).unwrap();
    let zero = b.scalar(-0.0).unwrap(); // the identity of float addition (x + +0 is +0 at x = -0)
    let a = b.mul(x, one).unwrap();
    let a = b.add(a, zero).unwrap();
    let t = b.transpose(a, &[0, 2, 1]).unwrap();
    let t = b.transpose(t, &[0, 2, 1]).unwrap();
    let e1 = b.tanh(t).unwrap();
    let e2 = b.tanh(t).unwrap();
    let s = b.add(e1, e2).unwrap();
    let _dead = b.exp(s).unwrap();
    let c = b.constant(vec![1.0, 4.0, 9.0, 16.0], &[4]).unwrap();
    let c = b.sqrt(c).unwrap();
    let s = b.mul(s, c).unwrap();
    let w = b.weight("w", DType::F32, &[5, 4]).unwrap();
    let wt = b.transpose(w, &[1, 0]).unwrap();
    let y = b.matmul(s, wt).unwrap();
    let r = b.reshape(y, vec![Dim::Batch, Dim::Fixed(3), Dim::Fixed(5)]).unwrap();
    b.output("y", r);
    b.finish().unwrap()
}

/// Softmax on a middle axis, a reduction, slice/concat, where, a reshape that needs a copy,
/// and an output that is a view.
fn softmax_reduce_views() -> Graph {
    let mut b = GraphBuilder::new();
    let x = f32_input(&mut b, "x", vec![Dim::Batch, Dim::Fixed(4), Dim::Fixed(6)]);
    let c = b.scalar(0.5).unwrap();
    let xs = b.mul(x, c).unwrap();
    let p = b.softmax(xs, 1, None).unwrap();
    let m = b.reduce(ReduceOp::Mean, p, &[2], true).unwrap();
    let centered = b.sub(p, m).unwrap();
    let pos = b.relu(centered).unwrap();
    let w = b.where_(pos, centered, x).unwrap();
    let sl = b.slice(w, 2, 1, Dim::Fixed(5)).unwrap();
    let cat = b.concat(&[sl, sl], 1).unwrap(); // [b, 8, 4]
    let t = b.transpose(cat, &[0, 2, 1]).unwrap(); // [b, 4, 8]
    let r = b.reshape(t, vec![Dim::Batch, Dim::Fixed(32)]).unwrap(); // needs a copy
    let mx = b.reduce(ReduceOp::Max, r, &[1], false).unwrap();
    b.output("flat", r);
    b.output("max", mx);
    b.output("slice_t", t);
    b.finish().unwrap()
}

#[test]
fn golden_mlp_residual_ln() {
    check_case("mlp_residual_ln", &mlp_residual_ln(), Bucket::new(2, 4));
}

#[test]
fn golden_attention_block() {
    check_case("attention_block", &attention_block(), Bucket::new(2, 4));
}

#[test]
fn golden_simplify_fodder() {
    check_case("simplify_fodder", &simplify_fodder(), Bucket::new(2, 1));
}

#[test]
fn golden_softmax_reduce_views() {
    check_case("softmax_reduce_views", &softmax_reduce_views(), Bucket::new(2, 1));
}

#[test]
fn golden_minilm_first_layer() {
    let mut cfg = BertConfig::minilm_l6();
    cfg.num_hidden_layers = 1;
    let g = build_bert(&cfg, "", BertOutputs::default()).unwrap();
    check_case("minilm_layer1", &g, Bucket::new(1, 128));
}
