//! Fixtures shared by the artifact tests: a one-op graph and a CPU plan image whose code is
//! `ud2` (an illegal instruction), so executing it by mistake kills the test.
#![allow(dead_code)]

use kiln_runtime::cpu::{Binding, CpuPlanImage, CpuStep};
use kiln_runtime::graph::{Graph, InputRole, InputSpec, Op, WeightSpec};
use kiln_runtime::{DType, Dim};
use kiln_runtime::Bucket;

/// `y = x * w` with `x: [batch, width]` and the weight `w: [width]`.
pub fn graph(width: usize) -> Graph {
    let mut g = Graph::default();
    g.inputs.push(InputSpec { name: "x".into(), dtype: DType::F32, shape: vec![Dim::Batch, Dim::Fixed(width)], role: InputRole::Other });
    g.weights.push(WeightSpec { name: "w".into(), dtype: DType::F32, shape: vec![width] });
    let x = g.push("x", Op::Input { index: 0 }, vec![]).unwrap();
    let w = g.push("w", Op::Weight { index: 0 }, vec![]).unwrap();
    let y = g.push("y", Op::Binary(kiln_runtime::BinaryOp::Mul), vec![x, w]).unwrap();
    g.outputs.push(y);
    g.output_names.push("y".into());
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
