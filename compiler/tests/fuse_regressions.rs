//! Fusion regressions found by other stages.

use kiln_compiler::reference::interpret;
use kiln_compiler::ir::GraphBuilder;
use kiln_compiler::pipeline::run_pipeline;
use kiln_runtime::graph::{Dim, InputRole};
use kiln_runtime::{Bucket, DType, HostTensor};

/// A MatMul whose result is itself a graph output (no epilogue user) used to panic in fusion.
#[test]
fn matmul_as_graph_output() {
    for also_used in [false, true] {
        let mut g = GraphBuilder::new();
        let x = g.input("x", DType::F32, vec![Dim::Batch, Dim::Fixed(3)], InputRole::Other).unwrap();
        let w = g.weight("w", DType::F32, &[3, 2]).unwrap();
        let y = g.matmul(x, w).unwrap();
        g.output("y", y);
        if also_used {
            let z = g.relu(y).unwrap();
            g.output("z", z);
        }
        let graph = g.finish().unwrap();
        let b = Bucket::new(2, 1);
        // Also in f16 (fusion only).
        let mut h = GraphBuilder::new();
        let x16 = h.input("x", DType::F16, vec![Dim::Batch, Dim::Fixed(3)], InputRole::Other).unwrap();
        let w16 = h.weight("w", DType::F16, &[3, 2]).unwrap();
        let y16 = h.matmul(x16, w16).unwrap();
        h.output("y", y16);
        run_pipeline(&h.finish().unwrap(), b).unwrap();
        let lowered = run_pipeline(&graph, b).unwrap();
        assert_eq!(lowered.program.kernels_by_kind().get("gemm"), Some(&1));
        let xs = HostTensor::f32(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]).unwrap();
        let ws = HostTensor::f32(vec![3, 2], vec![1., 0., 0., 1., 1., 1.]).unwrap();
        let out = interpret(&graph, &[ws], &[xs], b).unwrap();
        assert_eq!(out[0].to_f32_vec(), vec![4., 5., 10., 11.]);
    }
}
