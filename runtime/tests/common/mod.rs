//! Fixtures shared by the artifact tests: a one-op graph and a CPU plan image whose code is
//! `ud2` (an illegal instruction), so executing it by mistake kills the test.
#![allow(dead_code)]

use kiln_runtime::cpu::{Binding, CpuPlanImage, CpuStep};
use kiln_runtime::graph::{Graph, InputRole, InputSpec, Node, Op, ValueId, WeightSpec};
use kiln_runtime::{DType, Dim};
use kiln_runtime::Bucket;

/// `y = x * w` with `x: [batch, width]` and the weight `w: [width]`, written as data (the
/// runtime has no graph builder: that is the compiler's).
pub fn graph(width: usize) -> Graph {
    let x = vec![Dim::Batch, Dim::Fixed(width)];
    let node = |name: &str, op, inputs, shape| Node { name: name.into(), op, inputs, dtype: DType::F32, shape };
    let g = Graph {
        inputs: vec![InputSpec { name: "x".into(), dtype: DType::F32, shape: x.clone(), role: InputRole::Other }],
        weights: vec![WeightSpec::new("w", DType::F32, vec![width])],
        nodes: vec![
            node("x", Op::Input { index: 0 }, vec![], x.clone()),
            node("w", Op::Weight { index: 0 }, vec![], vec![Dim::Fixed(width)]),
            node("y", Op::Binary(kiln_runtime::BinaryOp::Mul), vec![ValueId(0), ValueId(1)], x),
        ],
        outputs: vec![ValueId(2)],
        output_names: vec!["y".into()],
    };
    g.check_structure().unwrap();
    g
}

/// A CPU plan image of `ud2; ret; nop` for `bucket`, needing `features`, with a small arena
/// (one input, one output, 4 initialized bytes).
pub fn ud2_image(bucket: Bucket, features: &[&str]) -> CpuPlanImage {
    CpuPlanImage {
        bucket,
        code: vec![0x0f, 0x0b, 0xc3, 0x90],
        steps: vec![CpuStep { name: "k0".into(), entry: 0, tasks: 1 }],
        arena_bytes: 128,
        inputs: vec![Binding { offset: 0, dtype: DType::F32, shape: vec![bucket.batch, 4] }],
        outputs: vec![Binding { offset: 64, dtype: DType::F32, shape: vec![bucket.batch, 4] }],
        required_features: features.iter().map(|s| s.to_string()).collect(),
        arena_init: vec![(96, vec![1, 2, 3, 4])],
        weights: vec![],
        kernel_abi: kiln_kernels::table::KERNEL_ABI_VERSION,
        scratch_threads: 1,
    }
}
