//! The reference backend, op by op, against small hand-computed values; then at the `Backend`
//! trait level (bad batches and outputs are typed errors), and a MiniLM-sized timing run.

use kiln_compiler::reference::{interpret, interpret_all, ReferenceBackend};
use kiln_compiler::ir::GraphBuilder;
use kiln_runtime::{Backend, Batch, Bucket, DType, Dim, Error, Graph, HostTensor, InputRole, Outputs, TensorData, UnaryOp};

const B11: Bucket = Bucket::new(1, 1);

fn fixed(s: &[usize]) -> Vec<Dim> {
    s.iter().map(|&d| Dim::Fixed(d)).collect()
}

fn f32t(shape: &[usize], v: &[f32]) -> HostTensor {
    HostTensor::f32(shape.to_vec(), v.to_vec()).unwrap()
}

/// Asserts `t` has `shape` and values within 1e-6 (relative to max(1, |want|)) of `want`.
#[track_caller]
fn assert_close(t: &HostTensor, shape: &[usize], want: &[f64]) {
    assert_eq!(t.shape, shape, "shape");
    let got = t.data.to_f64_vec();
    assert_eq!(got.len(), want.len(), "length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = 1e-6 * w.abs().max(1.0);
        assert!((g - w).abs() <= tol, "element {i}: got {g}, want {w}\n got: {got:?}\nwant: {want:?}");
    }
}

/// A graph with f32 inputs of fixed shapes `ins`, built by `f` from the input values; its
/// outputs are what `f` returns.
fn graph_of(ins: &[&[usize]], f: impl FnOnce(&mut GraphBuilder, &[kiln_runtime::ValueId]) -> Vec<kiln_runtime::ValueId>) -> Graph {
    let mut g = GraphBuilder::new();
    let xs: Vec<_> = ins
        .iter()
        .enumerate()
        .map(|(i, s)| g.input(&format!("x{i}"), DType::F32, fixed(s), InputRole::Other).unwrap())
        .collect();
    for (i, o) in f(&mut g, &xs).into_iter().enumerate() {
        g.output(&format!("y{i}"), o);
    }
    g.finish().unwrap()
}

#[test]
fn binary_ops_broadcast() {
    // a: [2,3], b: [3] (broadcast over rows), c: [2,1] (broadcast over columns).
    let g = graph_of(&[&[2, 3], &[3], &[2, 1]], |g, x| {
        vec![
            g.add(x[0], x[1]).unwrap(),
            g.sub(x[0], x[2]).unwrap(),
            g.mul(x[1], x[2]).unwrap(), // [3] * [2,1] -> [2,3]
            g.div(x[0], x[1]).unwrap(),
            g.max(x[0], x[2]).unwrap(),
            g.binary(kiln_runtime::BinaryOp::Min, x[2], x[1]).unwrap(),
            g.binary(kiln_runtime::BinaryOp::Eq, x[0], x[2]).unwrap(),
            g.binary(kiln_runtime::BinaryOp::Ne, x[0], x[2]).unwrap(),
            g.binary(kiln_runtime::BinaryOp::Lt, x[0], x[2]).unwrap(),
            g.binary(kiln_runtime::BinaryOp::Le, x[0], x[2]).unwrap(),
        ]
    });
    let a = f32t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let b = f32t(&[3], &[10., 20., 40.]);
    let c = f32t(&[2, 1], &[2., 5.]);
    let out = interpret(&g, &[], &[a, b, c], B11).unwrap();
    assert_close(&out[0], &[2, 3], &[11., 22., 43., 14., 25., 46.]);
    assert_close(&out[1], &[2, 3], &[-1., 0., 1., -1., 0., 1.]);
    assert_close(&out[2], &[2, 3], &[20., 40., 80., 50., 100., 200.]);
    assert_close(&out[3], &[2, 3], &[0.1, 0.1, 0.075, 0.4, 0.25, 0.15]);
    assert_close(&out[4], &[2, 3], &[2., 2., 3., 5., 5., 6.]);
    assert_close(&out[5], &[2, 3], &[2., 2., 2., 5., 5., 5.]);
    // a vs c = [[2],[5]]: a = [[1,2,3],[4,5,6]].
    assert_close(&out[6], &[2, 3], &[0., 1., 0., 0., 1., 0.]);
    assert_close(&out[7], &[2, 3], &[1., 0., 1., 1., 0., 1.]);
    assert_close(&out[8], &[2, 3], &[1., 0., 0., 1., 0., 0.]);
    assert_close(&out[9], &[2, 3], &[1., 1., 0., 1., 1., 0.]);
}

#[test]
fn binary_symbolic_shapes_and_scalar_constant() {
    let mut g = GraphBuilder::new();
    let x = g.input("x", DType::F32, vec![Dim::Batch, Dim::Seq], InputRole::Other).unwrap();
    let col = g.input("col", DType::F32, vec![Dim::Batch, Dim::Fixed(1)], InputRole::Other).unwrap();
    let s = g.scalar(0.5).unwrap();
    let y = g.mul(x, s).unwrap();
    let z = g.add(y, col).unwrap();
    g.output("z", z);
    let g = g.finish().unwrap();
    let x = f32t(&[2, 3], &[2., 4., 6., 8., 10., 12.]);
    let out = interpret(&g, &[], &[x, f32t(&[2, 1], &[1., 2.])], Bucket::new(2, 3)).unwrap();
    assert_close(&out[0], &[2, 3], &[2., 3., 4., 6., 7., 8.]);
}

#[test]
fn unary_ops() {
    use UnaryOp::*;
    let ops = [Gelu, Tanh, Relu, Silu, Exp, Sqrt, Rsqrt, Neg, Recip, GeluTanh, Sigmoid, Erf, Abs, Log, Softplus, Floor, Ceil, Round, Sin, Cos, Atan];
    // Every op has its values here, computed independently of `kiln_compiler::ops`.
    assert_eq!(ops.len(), kiln_compiler::ops::unary::ALL.len());
    let g = graph_of(&[&[3]], |g, x| ops.iter().map(|&op| g.unary(op, x[0]).unwrap()).collect());
    let out = interpret(&g, &[], &[f32t(&[3], &[1., -1., 4.])], B11).unwrap();
    let want: [[f64; 3]; 21] = [
        // x * Φ(x): Φ(1) = 0.8413447460685429, Φ(4) = 0.9999683287581669
        [0.8413447460685429, -0.15865525393145707, 3.9998733150326676],
        [0.7615941559557649, -0.7615941559557649, 0.999329299739067],
        [1., 0., 4.],
        // x * sigmoid(x)
        [0.7310585786300049, -0.2689414213699951, 3.928055160151634],
        [std::f64::consts::E, 1. / std::f64::consts::E, 54.598150033144236],
        [1., f64::NAN, 2.],
        [1., f64::NAN, 0.5],
        [-1., 1., -4.],
        [1., -1., 0.25],
        // x/2 · (1 + tanh(√(2/π)(x + 0.044715x³)))
        [0.8411919906082768, -0.15880800939172324, 3.9999297540518075],
        // 1 / (1 + e^-x)
        [0.7310585786300049, 0.2689414213699951, 0.9820137900379085],
        // erf (Python's math.erf)
        [0.8427007929497149, -0.8427007929497149, 0.9999999845827421],
        [1., 1., 4.],
        [0., f64::NAN, 1.3862943611198906],
        // Python's math.log1p(math.exp(x))
        [1.3132616875182228, 0.31326168751822286, 4.0181499279178094],
        // floor, ceil, round of integers (fractions: `rounding_ops_match_std`)
        [1., -1., 4.],
        [1., -1., 4.],
        [1., -1., 4.],
        // Python's math.sin, math.cos
        [0.8414709848078965, -0.8414709848078965, -0.7568024953079282],
        [0.5403023058681398, 0.5403023058681398, -0.6536436208636119],
        // Python's math.atan
        [std::f64::consts::FRAC_PI_4, -std::f64::consts::FRAC_PI_4, 1.3258176636680326],
    ];
    for (k, w) in want.iter().enumerate() {
        let got = out[k].data.to_f64_vec();
        for i in 0..3 {
            let ok = if w[i].is_nan() { got[i].is_nan() } else { (got[i] - w[i]).abs() <= 1e-6 * w[i].abs().max(1.0) };
            assert!(ok, "{:?}({}) = {}, want {}", ops[k], [1., -1., 4.][i], got[i], w[i]);
        }
    }
}

#[test]
fn matmul_plain_and_transposed() {
    // A = [[1,2,3],[4,5,6]], B = [[1,0],[0,1],[1,1]]: A·B = [[4,5],[10,11]].
    let a = f32t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let b = f32t(&[3, 2], &[1., 0., 0., 1., 1., 1.]);
    let at = f32t(&[3, 2], &[1., 4., 2., 5., 3., 6.]);
    let bt = f32t(&[2, 3], &[1., 0., 1., 0., 1., 1.]);
    let want = [4., 5., 10., 11.];
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let (sa, sb) = (if ta { [3, 2] } else { [2, 3] }, if tb { [2, 3] } else { [3, 2] });
        let g = graph_of(&[&sa, &sb], |g, x| vec![g.matmul_t(x[0], x[1], ta, tb).unwrap()]);
        let inputs = [if ta { at.clone() } else { a.clone() }, if tb { bt.clone() } else { b.clone() }];
        let out = interpret(&g, &[], &inputs, B11).unwrap();
        assert_close(&out[0], &[2, 2], &want);
    }
}

#[test]
fn matmul_batched_with_broadcast() {
    // a: [2,1,2,2] (A0, A1), b: [3,2,2] (I, 2I, [[1,1],[0,1]]) -> [2,3,2,2].
    let g = graph_of(&[&[2, 1, 2, 2], &[3, 2, 2]], |g, x| vec![g.matmul(x[0], x[1]).unwrap()]);
    let a = f32t(&[2, 1, 2, 2], &[1., 2., 3., 4., 0., 1., 1., 0.]);
    let b = f32t(&[3, 2, 2], &[1., 0., 0., 1., 2., 0., 0., 2., 1., 1., 0., 1.]);
    let out = interpret(&g, &[], &[a, b], B11).unwrap();
    #[rustfmt::skip]
    let want = [
        1., 2., 3., 4.,   2., 4., 6., 8.,   1., 3., 3., 7.,
        0., 1., 1., 0.,   0., 2., 2., 0.,   0., 1., 1., 1.,
    ];
    assert_close(&out[0], &[2, 3, 2, 2], &want);

    // A rank-2 weight against a rank-3 activation, transposed (a Linear layer): [2,2,3]·[2,3]ᵀ.
    let g = graph_of(&[&[2, 2, 3], &[2, 3]], |g, x| vec![g.matmul_t(x[0], x[1], false, true).unwrap()]);
    let x = f32t(&[2, 2, 3], &[1., 2., 3., 4., 5., 6., 7., 8., 9., 1., 0., 1.]);
    let w = f32t(&[2, 3], &[1., 0., 1., 0., 1., 0.]);
    let out = interpret(&g, &[], &[x, w], B11).unwrap();
    assert_close(&out[0], &[2, 2, 2], &[4., 2., 10., 5., 16., 8., 2., 0.]);
}

#[test]
fn softmax_middle_axis_with_mask() {
    // x: [2,3,2], softmax over axis 1; mask [3,1] = [0, ln 2, -1e4] broadcast over the rest.
    let g = graph_of(&[&[2, 3, 2], &[3, 1]], |g, x| vec![g.softmax(x[0], 1, Some(x[1])).unwrap()]);
    // column (0,·,0) = [1,2,3]; (0,·,1) = [1000,1000,1000] (stability); batch 1 all zeros.
    let x = f32t(&[2, 3, 2], &[1., 1000., 2., 1000., 3., 1000., 0., 0., 0., 0., 0., 0.]);
    let mask = f32t(&[3, 1], &[0., std::f32::consts::LN_2, -1e4]);
    let out = interpret(&g, &[], &[x, mask], B11).unwrap();
    let e = std::f64::consts::E;
    // (0,·,0) ∝ [e, 2e², ~0]; the others ∝ [1, 2, ~0].
    let (p0, p1) = (1. / (1. + 2. * e), 2. * e / (1. + 2. * e));
    let (t, u) = (1. / 3., 2. / 3.);
    assert_close(&out[0], &[2, 3, 2], &[p0, t, p1, u, 0., 0., t, t, u, u, 0., 0.]);
}

#[test]
fn softmax_last_axis_no_mask() {
    let g = graph_of(&[&[2, 2]], |g, x| vec![g.softmax(x[0], 1, None).unwrap()]);
    let out = interpret(&g, &[], &[f32t(&[2, 2], &[0., 0., 1., 1. + std::f32::consts::LN_2 * 2.])], B11).unwrap();
    assert_close(&out[0], &[2, 2], &[0.5, 0.5, 0.2, 0.8]);
}

#[test]
fn layer_norm_and_rms_norm() {
    // x row [1,2,3,4]: mean 2.5, biased var 1.25; eps 0.75 makes var + eps = 2.
    let mut g = GraphBuilder::new();
    let x = g.input("x", DType::F32, fixed(&[2, 4]), InputRole::Other).unwrap();
    let gamma = g.weight("gamma", DType::F32, &[4]).unwrap();
    let beta = g.weight("beta", DType::F32, &[4]).unwrap();
    let ln = g.layer_norm(x, gamma, beta, 0.75).unwrap();
    let rms = g.rms_norm(x, gamma, 5.0).unwrap();
    g.output("ln", ln);
    g.output("rms", rms);
    let g = g.finish().unwrap();
    let weights = [f32t(&[4], &[1., 1., 2., 2.]), f32t(&[4], &[0., 1., 0., 1.])];
    let out = interpret(&g, &weights, &[f32t(&[2, 4], &[1., 2., 3., 4., 2., -2., 2., -2.])], B11).unwrap();
    let r = std::f64::consts::FRAC_1_SQRT_2;
    // row 2 [2,-2,2,-2]: mean 0, var 4 -> /sqrt(4.75).
    let s = 1. / 4.75f64.sqrt();
    assert_close(
        &out[0],
        &[2, 4],
        &[-1.5 * r, -0.5 * r + 1., 0.5 * r * 2., 1.5 * r * 2. + 1., 2. * s, -2. * s + 1., 4. * s, -4. * s + 1.],
    );
    // rms: row 1 mean square 7.5 -> /sqrt(12.5); row 2 mean square 4 -> /3.
    let q = 1. / 12.5f64.sqrt();
    assert_close(&out[1], &[2, 4], &[q, 2. * q, 6. * q, 8. * q, 2. / 3., -2. / 3., 4. / 3., -4. / 3.]);
}

#[test]
fn reshape_and_transpose() {
    let g = graph_of(&[&[2, 3, 4]], |g, x| {
        let t = g.transpose(x[0], &[2, 0, 1]).unwrap(); // [4,2,3]
        let r = g.reshape(x[0], fixed(&[6, 4])).unwrap();
        let rt = g.transpose(r, &[1, 0]).unwrap(); // [4,6]
        vec![t, r, rt]
    });
    let v: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let out = interpret(&g, &[], &[f32t(&[2, 3, 4], &v)], B11).unwrap();
    // t[k,i,j] = x[i,j,k] = 12i + 4j + k
    let want_t: Vec<f64> = (0..4)
        .flat_map(|k| (0..2).flat_map(move |i| (0..3).map(move |j| (12 * i + 4 * j + k) as f64)))
        .collect();
    assert_close(&out[0], &[4, 2, 3], &want_t);
    assert_close(&out[1], &[6, 4], &(0..24).map(|i| i as f64).collect::<Vec<_>>());
    let want_rt: Vec<f64> = (0..4).flat_map(|c| (0..6).map(move |r| (4 * r + c) as f64)).collect();
    assert_close(&out[2], &[4, 6], &want_rt);
    // Spot checks by hand: t[1,0,2] = x[0,2,1] = 9; t[3,1,0] = x[1,0,3] = 15.
    assert_eq!(out[0].data.to_f64_vec()[6 + 2], 9.);
    assert_eq!(out[0].data.to_f64_vec()[18 + 3], 15.);
}

fn gather_graph() -> Graph {
    let mut g = GraphBuilder::new();
    let ids = g.input("ids", DType::I64, vec![Dim::Batch, Dim::Seq], InputRole::TokenIds).unwrap();
    let table = g.weight("table", DType::F32, &[4, 2]).unwrap();
    let e = g.gather(table, ids).unwrap();
    g.output("e", e);
    g.finish().unwrap()
}

#[test]
fn gather_rows() {
    let g = gather_graph();
    let table = f32t(&[4, 2], &[0., 1., 10., 11., 20., 21., 30., 31.]);
    let ids = HostTensor::i64(vec![2, 2], vec![3, 0, 1, 1]).unwrap();
    let out = interpret(&g, &[table], &[ids], Bucket::new(2, 2)).unwrap();
    assert_close(&out[0], &[2, 2, 2], &[30., 31., 0., 1., 10., 11., 10., 11.]);
}

#[test]
fn gather_out_of_range_is_a_typed_error() {
    let g = gather_graph();
    let table = f32t(&[4, 2], &[0.; 8]);
    for bad in [4i64, -1, 1 << 40] {
        let ids = HostTensor::i64(vec![1, 3], vec![0, bad, 1]).unwrap();
        match interpret(&g, std::slice::from_ref(&table), &[ids], Bucket::new(1, 3)) {
            Err(Error::Graph { node, message }) => {
                assert!(node.contains("gather"), "node {node}");
                assert!(message.contains(&bad.to_string()) && message.contains("[0, 4)"), "{message}");
            }
            other => panic!("id {bad}: expected a graph error, got {other:?}"),
        }
    }
}

#[test]
fn concat_axes() {
    let g = graph_of(&[&[2, 1], &[2, 2], &[1, 2]], |g, x| {
        vec![g.concat(&[x[0], x[1]], 1).unwrap(), g.concat(&[x[1], x[2]], 0).unwrap()]
    });
    let a = f32t(&[2, 1], &[1., 2.]);
    let b = f32t(&[2, 2], &[3., 4., 5., 6.]);
    let c = f32t(&[1, 2], &[7., 8.]);
    let out = interpret(&g, &[], &[a, b, c], B11).unwrap();
    assert_close(&out[0], &[2, 3], &[1., 3., 4., 2., 5., 6.]);
    assert_close(&out[1], &[3, 2], &[3., 4., 5., 6., 7., 8.]);
}

#[test]
fn slice_fixed_and_symbolic_end() {
    let mut g = GraphBuilder::new();
    let x = g.input("x", DType::F32, fixed(&[2, 4]), InputRole::Other).unwrap();
    let pos = g.weight("pos", DType::F32, &[6, 2]).unwrap();
    let s1 = g.slice(x, 1, 1, Dim::Fixed(3)).unwrap();
    let s2 = g.slice(pos, 0, 0, Dim::Seq).unwrap(); // [seq, 2]
    g.output("s1", s1);
    g.output("s2", s2);
    let g = g.finish().unwrap();
    let pos = f32t(&[6, 2], &(0..12).map(|i| i as f32).collect::<Vec<_>>());
    let x = f32t(&[2, 4], &[1., 2., 3., 4., 5., 6., 7., 8.]);
    let out = interpret(&g, std::slice::from_ref(&pos), std::slice::from_ref(&x), Bucket::new(1, 3)).unwrap();
    assert_close(&out[0], &[2, 2], &[2., 3., 6., 7.]);
    assert_close(&out[1], &[3, 2], &[0., 1., 2., 3., 4., 5.]);
    // A bucket whose seq runs past the table is rejected when lowering, with the node named.
    match interpret(&g, &[pos], &[x], Bucket::new(1, 7)) {
        Err(Error::Graph { node, .. }) => assert!(node.contains("slice"), "{node}"),
        other => panic!("expected a graph error, got {other:?}"),
    }
}

#[test]
fn reduce_with_and_without_keep_dims() {
    use kiln_runtime::ReduceOp::*;
    let g = graph_of(&[&[2, 3, 2]], |g, x| {
        vec![
            g.reduce(Sum, x[0], &[1], false).unwrap(),
            g.reduce(Mean, x[0], &[0, 2], true).unwrap(),
            g.reduce(Max, x[0], &[2], false).unwrap(),
            g.reduce(Sum, x[0], &[0, 1, 2], false).unwrap(),
        ]
    });
    // x[i,j,k] = 6i + 2j + k
    let v: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let out = interpret(&g, &[], &[f32t(&[2, 3, 2], &v)], B11).unwrap();
    assert_close(&out[0], &[2, 2], &[6., 9., 24., 27.]);
    assert_close(&out[1], &[1, 3, 1], &[3.5, 5.5, 7.5]);
    assert_close(&out[2], &[2, 3], &[1., 3., 5., 7., 9., 11.]);
    assert_close(&out[3], &[], &[66.]);
}

#[test]
fn where_broadcasts() {
    let mut g = GraphBuilder::new();
    let cond = g.input("cond", DType::I64, fixed(&[2, 1]), InputRole::Other).unwrap();
    let a = g.input("a", DType::F32, fixed(&[2, 3]), InputRole::Other).unwrap();
    let b = g.scalar(-1.0).unwrap();
    let w = g.where_(cond, a, b).unwrap();
    g.output("w", w);
    let g = g.finish().unwrap();
    let cond = HostTensor::i64(vec![2, 1], vec![0, 7]).unwrap();
    let out = interpret(&g, &[], &[cond, f32t(&[2, 3], &[1., 2., 3., 4., 5., 6.])], B11).unwrap();
    assert_close(&out[0], &[2, 3], &[-1., -1., -1., 4., 5., 6.]);
}

#[test]
fn cast_and_integer_arithmetic() {
    let mut g = GraphBuilder::new();
    let x = g.input("x", DType::F32, fixed(&[5]), InputRole::Other).unwrap();
    let n = g.input("n", DType::I64, fixed(&[3]), InputRole::Other).unwrap();
    let xi = g.cast(x, DType::I64).unwrap();
    let xh = g.cast(x, DType::F16).unwrap();
    let nf = g.cast(n, DType::F32).unwrap();
    let q = g.div(n, n).unwrap();
    let two = g.cast(xi, DType::I32).unwrap();
    g.output("xi", xi);
    g.output("xh", xh);
    g.output("nf", nf);
    g.output("q", q);
    g.output("two", two);
    let g = g.finish().unwrap();
    let x = f32t(&[5], &[-1.7, 2.5, 0.3, -0.9, 1.0 / 3.0]);
    let n = HostTensor::i64(vec![3], vec![7, -7, 9_007_199_254_740_993]).unwrap();
    let out = interpret(&g, &[], &[x, n], B11).unwrap();
    assert_eq!(out[0].data, TensorData::I64(vec![-1, 2, 0, 0, 0]));
    // f16 has 10 fraction bits: 0.3 -> 1229/4096, 1/3 -> 0.333251953125.
    assert_close(&out[1], &[5], &[-1.7001953125, 2.5, 0.300048828125, -0.89990234375, 0.333251953125]);
    assert_eq!(out[2].as_f32().unwrap()[..2], [7.0, -7.0]);
    assert_eq!(out[3].data.to_f64_vec()[..2], [1., 1.]);
    assert_eq!(out[4].data, TensorData::I32(vec![-1, 2, 0, 0, 0]));

    // Integer division truncates toward zero.
    let mut g = GraphBuilder::new();
    let a = g.input("a", DType::I64, fixed(&[4]), InputRole::Other).unwrap();
    let b = g.input("b", DType::I64, fixed(&[4]), InputRole::Other).unwrap();
    let d = g.div(a, b).unwrap();
    g.output("d", d);
    let g = g.finish().unwrap();
    let a = HostTensor::i64(vec![4], vec![7, -7, 7, 6]).unwrap();
    let b = HostTensor::i64(vec![4], vec![2, 2, -3, 3]).unwrap();
    let out = interpret(&g, &[], &[a, b], B11).unwrap();
    assert_eq!(out[0].data, TensorData::I64(vec![3, -3, -2, 2]));
}

#[test]
fn interpret_all_returns_every_node() {
    let g = graph_of(&[&[2]], |g, x| {
        let s = g.scalar(3.0).unwrap();
        let y = g.mul(x[0], s).unwrap();
        vec![g.relu(y).unwrap()]
    });
    let all = interpret_all(&g, &[], &[f32t(&[2], &[1., -2.])], B11).unwrap();
    assert_eq!(all.len(), g.nodes.len());
    assert_close(&all[0], &[2], &[1., -2.]);
    assert_close(&all[1], &[], &[3.]);
    assert_close(&all[2], &[2], &[3., -6.]);
    assert_close(&all[3], &[2], &[3., 0.]);
}

// ---- Backend trait level ----

fn token_graph() -> Graph {
    let mut g = GraphBuilder::new();
    let ids = g.input("ids", DType::I64, vec![Dim::Batch, Dim::Seq], InputRole::TokenIds).unwrap();
    let table = g.weight("table", DType::F32, &[5, 3]).unwrap();
    let e = g.gather(table, ids).unwrap();
    let t = g.tanh(e).unwrap();
    g.output("hidden", t);
    g.finish().unwrap()
}

fn table() -> HostTensor {
    f32t(&[5, 3], &(0..15).map(|i| i as f32 * 0.1).collect::<Vec<_>>())
}

#[test]
fn backend_run_checks_batch_and_outputs() {
    let be = ReferenceBackend;
    let g = token_graph();
    assert_eq!(be.caps().name, "reference");
    let w = be.upload(&[table()], &g).unwrap();
    assert_eq!(be.weight_bytes(&w), 15 * 8);
    let bucket = Bucket::new(2, 4);
    let mut plan = be.lower(&w, &g, bucket).unwrap();
    // Values ids (2x4), gather (2x4x3), tanh (2x4x3), all f64: the ids buffer is free once the
    // gather has run, and is grown for tanh instead of a third buffer being made.
    assert_eq!(be.plan_bytes(&plan), (24 + 24) * 8);
    let keep = be.lower_keeping_all(&w, &g, bucket).unwrap();
    assert_eq!(be.plan_bytes(&keep), (8 + 24 + 24) * 8);

    let good = Batch { tensors: vec![HostTensor::i64(vec![2, 4], vec![0, 1, 2, 3, 4, 0, 1, 2]).unwrap()] };
    let mut out = Outputs::for_bucket(&g, bucket);
    be.run(&mut plan, &good, &mut out).unwrap();
    // The ids' buffer was reused: only the output (and weights) can still be read.
    assert_eq!(plan.value(kiln_runtime::ValueId(0)), None);
    assert!(plan.value(kiln_runtime::ValueId(1)).is_some()); // the weight
    assert_eq!(plan.value(g.outputs[0]).map(|v| v.len()), Some(24));
    assert_close(&out.tensors[0], &[2, 4, 3], &{
        let ids = [0, 1, 2, 3, 4, 0, 1, 2];
        ids.iter().flat_map(|&r| (0..3).map(move |c| ((r * 3 + c) as f64 * 0.1f32 as f64).tanh())).collect::<Vec<_>>()
    });

    // Wrong shape (smaller than the bucket: run does not pad), wrong dtype, wrong count.
    let bads = [
        Batch { tensors: vec![HostTensor::i64(vec![2, 3], vec![0; 6]).unwrap()] },
        Batch { tensors: vec![HostTensor::i64(vec![1, 4], vec![0; 4]).unwrap()] },
        Batch { tensors: vec![HostTensor::new(vec![2, 4], TensorData::I32(vec![0; 8])).unwrap()] },
        Batch { tensors: vec![] },
        Batch { tensors: vec![good.tensors[0].clone(), good.tensors[0].clone()] },
        // A tensor whose data does not fill its shape (fields are public).
        Batch { tensors: vec![HostTensor { shape: vec![2, 4], data: TensorData::I64(vec![0; 3]) }] },
    ];
    for bad in &bads {
        let mut out = Outputs::for_bucket(&g, bucket);
        assert!(matches!(be.run(&mut plan, bad, &mut out), Err(Error::BadBatch { .. })), "{bad:?}");
    }

    // Outputs of the wrong shape, dtype, or count.
    let wrong_outs = [
        Outputs { tensors: vec![HostTensor::zeros(DType::F32, vec![2, 4, 2])] },
        Outputs { tensors: vec![HostTensor::zeros(DType::F32, vec![1, 4, 3])] },
        Outputs { tensors: vec![HostTensor::zeros(DType::F16, vec![2, 4, 3])] },
        Outputs { tensors: vec![] },
    ];
    for mut o in wrong_outs {
        assert!(matches!(be.run(&mut plan, &good, &mut o), Err(Error::BadBatch { .. })), "{o:?}");
    }
    // A gather error leaves the plan usable.
    let oob = Batch { tensors: vec![HostTensor::i64(vec![2, 4], vec![0, 1, 2, 3, 9, 0, 1, 2]).unwrap()] };
    assert!(matches!(be.run(&mut plan, &oob, &mut out), Err(Error::Graph { .. })));
    let mut again = Outputs::for_bucket(&g, bucket);
    be.run(&mut plan, &good, &mut again).unwrap();
    assert_eq!(again, out);
}

#[test]
fn backend_upload_and_lower_check_weights() {
    let be = ReferenceBackend;
    let g = token_graph();
    assert!(matches!(be.upload(&[f32t(&[3, 5], &[0.; 15])], &g), Err(Error::TensorMismatch { .. })));
    assert!(be.upload(&[], &g).is_err());
    // Weights uploaded for another graph do not lower.
    let other = gather_graph();
    let w = be.upload(&[f32t(&[4, 2], &[0.; 8])], &other).unwrap();
    assert!(be.lower(&w, &g, Bucket::new(1, 1)).is_err());
}

// ---- A MiniLM-sized encoder: 6 layers, hidden 384, 12 heads, ffn 1536, seq 128, batch 1 ----

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
    }
}

fn minilm_like(layers: usize, hidden: usize, heads: usize, ffn: usize, vocab: usize) -> Graph {
    let mut g = GraphBuilder::new();
    let ids = g.input("input_ids", DType::I64, vec![Dim::Batch, Dim::Seq], InputRole::TokenIds).unwrap();
    let mask = g.input("attention_mask", DType::I64, vec![Dim::Batch, Dim::Seq], InputRole::AttentionMask).unwrap();
    let word = g.weight("word", DType::F32, &[vocab, hidden]).unwrap();
    let pos = g.weight("pos", DType::F32, &[512, hidden]).unwrap();
    let e = g.gather(word, ids).unwrap();
    let p = g.slice(pos, 0, 0, Dim::Seq).unwrap();
    let e = g.add(e, p).unwrap();
    let lg = g.weight("emb.ln.g", DType::F32, &[hidden]).unwrap();
    let lb = g.weight("emb.ln.b", DType::F32, &[hidden]).unwrap();
    let mut x = g.layer_norm(e, lg, lb, 1e-12).unwrap();
    // additive mask [batch,1,1,seq] = (1 - mask) * -1e4
    let mf = g.cast(mask, DType::F32).unwrap();
    let one = g.scalar(1.0).unwrap();
    let inv = g.sub(one, mf).unwrap();
    let big = g.scalar(-1e4).unwrap();
    let am = g.mul(inv, big).unwrap();
    let am = g.reshape(am, vec![Dim::Batch, Dim::Fixed(1), Dim::Fixed(1), Dim::Seq]).unwrap();
    let dh = hidden / heads;
    let scale = g.scalar(1.0 / (dh as f32).sqrt()).unwrap();
    for l in 0..layers {
        let w = |g: &mut GraphBuilder, n: &str, s: &[usize]| g.weight(&format!("l{l}.{n}"), DType::F32, s).unwrap();
        let split = |g: &mut GraphBuilder, v| {
            let r = g.reshape(v, vec![Dim::Batch, Dim::Seq, Dim::Fixed(heads), Dim::Fixed(dh)]).unwrap();
            g.transpose(r, &[0, 2, 1, 3]).unwrap()
        };
        let proj = |g: &mut GraphBuilder, n: &str| {
            let (wt, b) = (w(g, &format!("{n}.w"), &[hidden, hidden]), w(g, &format!("{n}.b"), &[hidden]));
            let y = g.linear(x, wt, Some(b)).unwrap();
            split(g, y)
        };
        let (q, k, v) = (proj(&mut g, "q"), proj(&mut g, "k"), proj(&mut g, "v"));
        let s = g.matmul_t(q, k, false, true).unwrap();
        let s = g.mul(s, scale).unwrap();
        let a = g.softmax(s, 3, Some(am)).unwrap();
        let c = g.matmul(a, v).unwrap();
        let c = g.transpose(c, &[0, 2, 1, 3]).unwrap();
        let c = g.reshape(c, vec![Dim::Batch, Dim::Seq, Dim::Fixed(hidden)]).unwrap();
        let (ow, ob) = (w(&mut g, "o.w", &[hidden, hidden]), w(&mut g, "o.b", &[hidden]));
        let o = g.linear(c, ow, Some(ob)).unwrap();
        let r = g.add(o, x).unwrap();
        let (g1, b1) = (w(&mut g, "ln1.g", &[hidden]), w(&mut g, "ln1.b", &[hidden]));
        let h = g.layer_norm(r, g1, b1, 1e-12).unwrap();
        let (iw, ib) = (w(&mut g, "i.w", &[ffn, hidden]), w(&mut g, "i.b", &[ffn]));
        let f = g.linear(h, iw, Some(ib)).unwrap();
        let f = g.gelu(f).unwrap();
        let (fw, fb) = (w(&mut g, "f.w", &[hidden, ffn]), w(&mut g, "f.b", &[hidden]));
        let f = g.linear(f, fw, Some(fb)).unwrap();
        let r = g.add(f, h).unwrap();
        let (g2, b2) = (w(&mut g, "ln2.g", &[hidden]), w(&mut g, "ln2.b", &[hidden]));
        x = g.layer_norm(r, g2, b2, 1e-12).unwrap();
    }
    g.output("last_hidden_state", x);
    g.finish().unwrap()
}

#[test]
fn minilm_sized_encoder_runs_quickly() {
    let (hidden, seq) = (384, 128);
    let g = minilm_like(6, hidden, 12, 1536, 1000);
    let mut rng = Lcg(42);
    let weights: Vec<HostTensor> = g
        .weights
        .iter()
        .map(|w| {
            let n: usize = w.shape.iter().product();
            let v = if w.name.ends_with(".g") { vec![1.0; n] } else { (0..n).map(|_| rng.next()).collect() };
            HostTensor::f32(w.shape.clone(), v).unwrap()
        })
        .collect();
    let be = ReferenceBackend;
    let w = be.upload(&weights, &g).unwrap();
    let bucket = Bucket::new(1, seq);
    let t0 = std::time::Instant::now();
    let mut plan = be.lower(&w, &g, bucket).unwrap();
    let lower_s = t0.elapsed().as_secs_f64();
    let ids: Vec<i64> = (0..seq as i64).map(|i| (i * 7919) % 1000).collect();
    let batch = Batch::from_token_ids(&g, &[ids]).unwrap();
    let mut out = Outputs::for_bucket(&g, bucket);
    let t1 = std::time::Instant::now();
    be.run(&mut plan, &batch, &mut out).unwrap();
    let run_s = t1.elapsed().as_secs_f64();
    eprintln!(
        "MiniLM-sized reference run: lower {lower_s:.3} s, run {run_s:.3} s, plan {:.1} MB, weights {:.1} MB",
        be.plan_bytes(&plan) as f64 / 1e6,
        be.weight_bytes(&w) as f64 / 1e6
    );
    // The last op is a LayerNorm with gamma 1 and beta ~0: every row has mean ~beta-mean, var ~1.
    let y = out.tensors[0].data.to_f64_vec();
    assert_eq!(out.tensors[0].shape, [1, seq, hidden]);
    assert!(y.iter().all(|v| v.is_finite()));
    for row in y.chunks(hidden) {
        let m = row.iter().sum::<f64>() / hidden as f64;
        let var = row.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / hidden as f64;
        assert!(m.abs() < 0.01 && (var - 1.0).abs() < 0.01, "row mean {m}, var {var}");
    }
    // Generous bound: a dev build on a loaded 2-core machine should still stay far under it.
    assert!(run_s < 20.0, "reference run took {run_s:.1} s");

    // Buffer reuse changes nothing: a plan that keeps every value gives the same bits.
    let mut keep = be.lower_keeping_all(&w, &g, bucket).unwrap();
    let mut out2 = Outputs::for_bucket(&g, bucket);
    be.run(&mut keep, &batch, &mut out2).unwrap();
    assert_eq!(out, out2);
    assert!(be.plan_bytes(&plan) * 4 < be.plan_bytes(&keep), "reuse should shrink the plan");
    eprintln!("keep-all plan {:.1} MB", be.plan_bytes(&keep) as f64 / 1e6);
}

/// A one-layer encoder through the interpreter against the same math written out as plain loops
/// over rows: checks that reshapes, head transposes, the broadcast mask and the linear layers
/// compose the way a BERT layer means them to.
#[test]
fn tiny_encoder_matches_a_direct_implementation() {
    let (hidden, heads, ffn, vocab) = (8, 2, 16, 20);
    let dh = hidden / heads;
    let g = minilm_like(1, hidden, heads, ffn, vocab);
    let mut rng = Lcg(7);
    let mut by_name = std::collections::HashMap::new();
    let weights: Vec<HostTensor> = g
        .weights
        .iter()
        .map(|w| {
            let n: usize = w.shape.iter().product();
            let v: Vec<f32> = (0..n).map(|_| rng.next() * 20.0 + if w.name.ends_with(".g") { 1.0 } else { 0.0 }).collect();
            by_name.insert(w.name.clone(), v.iter().map(|&x| x as f64).collect::<Vec<f64>>());
            HostTensor::f32(w.shape.clone(), v).unwrap()
        })
        .collect();
    let w = |n: &str| by_name[n].as_slice();
    let seqs = vec![vec![3i64, 17, 5], vec![11, 2]];
    let batch = Batch::from_token_ids(&g, &seqs).unwrap();
    let out = interpret(&g, &weights, &batch.tensors, Bucket::new(2, 3)).unwrap();

    type M = Vec<Vec<f64>>;
    let linear = |x: &M, wt: &[f64], b: &[f64], n_out: usize| -> M {
        x.iter()
            .map(|row| (0..n_out).map(|o| b[o] + row.iter().enumerate().map(|(i, v)| v * wt[o * row.len() + i]).sum::<f64>()).collect())
            .collect()
    };
    let eps = 1e-12f32 as f64;
    let ln = |x: &M, gm: &[f64], bt: &[f64]| -> M {
        x.iter()
            .map(|r| {
                let m = r.iter().sum::<f64>() / r.len() as f64;
                let var = r.iter().map(|v| (v - m).powi(2)).sum::<f64>() / r.len() as f64;
                r.iter().enumerate().map(|(i, v)| (v - m) / (var + eps).sqrt() * gm[i] + bt[i]).collect()
            })
            .collect()
    };
    let add = |a: &M, b: &M| -> M { a.iter().zip(b).map(|(x, y)| x.iter().zip(y).map(|(p, q)| p + q).collect()).collect() };
    let scale = (1.0 / (dh as f32).sqrt()) as f64;
    let mut want = Vec::new();
    for s in &seqs {
        let seq = 3;
        let ids: Vec<usize> = (0..seq).map(|t| s.get(t).copied().unwrap_or(0) as usize).collect();
        let mask: Vec<f64> = (0..seq).map(|t| if t < s.len() { 0.0 } else { -1e4 }).collect();
        let e: M = (0..seq)
            .map(|t| (0..hidden).map(|c| w("word")[ids[t] * hidden + c] + w("pos")[t * hidden + c]).collect())
            .collect();
        let x = ln(&e, w("emb.ln.g"), w("emb.ln.b"));
        let q = linear(&x, w("l0.q.w"), w("l0.q.b"), hidden);
        let k = linear(&x, w("l0.k.w"), w("l0.k.b"), hidden);
        let v = linear(&x, w("l0.v.w"), w("l0.v.b"), hidden);
        let mut ctx = vec![vec![0.0; hidden]; seq];
        for h in 0..heads {
            for i in 0..seq {
                let sc: Vec<f64> = (0..seq)
                    .map(|j| (0..dh).map(|d| q[i][h * dh + d] * k[j][h * dh + d]).sum::<f64>() * scale + mask[j])
                    .collect();
                let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let ex: Vec<f64> = sc.iter().map(|v| (v - mx).exp()).collect();
                let z: f64 = ex.iter().sum();
                for d in 0..dh {
                    ctx[i][h * dh + d] = (0..seq).map(|j| ex[j] / z * v[j][h * dh + d]).sum();
                }
            }
        }
        let o = linear(&ctx, w("l0.o.w"), w("l0.o.b"), hidden);
        let h1 = ln(&add(&o, &x), w("l0.ln1.g"), w("l0.ln1.b"));
        let f: M = linear(&h1, w("l0.i.w"), w("l0.i.b"), ffn)
            .into_iter()
            .map(|r| r.into_iter().map(|v| v * 0.5 * (1.0 + libm::erf(v / std::f64::consts::SQRT_2))).collect())
            .collect();
        let f2 = linear(&f, w("l0.f.w"), w("l0.f.b"), hidden);
        let y = ln(&add(&f2, &h1), w("l0.ln2.g"), w("l0.ln2.b"));
        want.extend(y.into_iter().flatten());
    }
    assert_close(&out[0], &[2, 3, hidden], &want);
}

/// A graph without weights run on the reference interpreter and on the CPU backend (its
/// default options), bucket 1×1: (reference outputs, CPU outputs).
fn reference_and_cpu(g: &Graph, input: HostTensor) -> (Vec<HostTensor>, Vec<HostTensor>) {
    use kiln_compiler::backends::cpu::CpuBackend;
    let reference = interpret(g, &[], std::slice::from_ref(&input), B11).unwrap();
    let be = CpuBackend::new().unwrap();
    let w = be.upload(&[], g).unwrap();
    let mut plan = be.lower(&w, g, B11).unwrap();
    let mut cpu = Outputs::for_bucket(g, B11);
    be.run(&mut plan, &Batch { tensors: vec![input] }, &mut cpu).unwrap();
    (reference, cpu.tensors)
}

/// Floor, Ceil and Round (ties to even, as ONNX says) against Rust's own f64 functions, bit for
/// bit, on the reference interpreter and the CPU backend (vector lanes and the scalar tail;
/// its Round is the `nearest` instruction): halves, the sign of zero (ceil(-0.5) = round(-0.4)
/// = -0), NaN, infinities, denormals and values past 2^23 where every f32 is an integer.
#[test]
fn rounding_ops_match_std() {
    use UnaryOp::*;
    let xs: [f32; 22] = [
        -2.5, -1.5, -0.5, -0.4, -0.0, 0.0, 0.4, 0.5, 0.6, 1.5, 2.5, 2.7, -2.7, -3.0, 3.0, 8388607.5, 8388609.0, -8388607.5,
        f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e-40,
    ];
    type Std = fn(f64) -> f64;
    let std_fns: [(UnaryOp, Std); 3] = [(Floor, f64::floor), (Ceil, f64::ceil), (Round, f64::round_ties_even)];
    let g = graph_of(&[&[xs.len()]], |g, x| std_fns.iter().map(|&(op, _)| g.unary(op, x[0]).unwrap()).collect());
    let (out, cpu) = reference_and_cpu(&g, f32t(&[xs.len()], &xs));
    for (k, (op, f)) in std_fns.iter().enumerate() {
        for (who, res) in [("reference", &out[k]), ("cpu", &cpu[k])] {
            let got = res.data.to_f64_vec();
            for (i, &x) in xs.iter().enumerate() {
                let want = f(x as f64);
                let same = if want.is_nan() { got[i].is_nan() } else { got[i].to_bits() == want.to_bits() };
                assert!(same, "{who}: {op:?}({x}) = {}, want {want}", got[i]);
            }
        }
    }
}

/// Max and Min against constants on the CPU backend, which emits a compare and a blend where
/// the constant is not NaN (a quantized model's clamps, ReLU) and Cranelift's `fmax` / `fmin`
/// otherwise: the reference's values bit for bit (NaN as NaN) on NaN, ±0 against ±0, ±inf,
/// values equal to the constant and on either side, in vector lanes and the scalar tail, with
/// the constant on either side.
#[test]
fn clamps_against_constants_match_the_reference() {
    use kiln_runtime::graph::BinaryOp::{self, Max, Min};
    let xs: [f32; 23] = [
        f32::NAN, -0.0, 0.0, 6.0, -3.0, 5.9, 6.1, -3.1, -2.9, 0.5, -2.5, f32::INFINITY, f32::NEG_INFINITY, 1e-40, -1e-40, 127.0, -128.0, 300.0,
        -300.0, 0.25, 2.0, -7.0, f32::MAX,
    ];
    let cases: [(BinaryOp, f32, bool); 16] = [
        (Max, 6.0, false),
        (Min, -3.0, false),
        (Max, -2.5, true),
        (Min, 0.5, true),
        (Max, 0.0, false),
        (Max, 0.0, true),
        (Max, -0.0, false),
        (Max, -0.0, true),
        (Min, 0.0, false),
        (Min, 0.0, true),
        (Min, -0.0, false),
        (Min, -0.0, true),
        (Min, f32::INFINITY, false),
        (Max, f32::NEG_INFINITY, true),
        (Max, f32::NAN, false),
        (Max, 127.0, true),
    ];
    let g = graph_of(&[&[xs.len()]], |g, x| {
        cases
            .iter()
            .map(|&(op, c, first)| {
                let k = g.scalar(c).unwrap();
                let (a, b) = if first { (k, x[0]) } else { (x[0], k) };
                g.binary(op, a, b).unwrap()
            })
            .collect()
    });
    let (want, cpu) = reference_and_cpu(&g, f32t(&[xs.len()], &xs));
    for (k, &(op, c, first)) in cases.iter().enumerate() {
        let (got, want) = (cpu[k].to_f32_vec(), want[k].to_f32_vec());
        for (i, &x) in xs.iter().enumerate() {
            let same = if want[i].is_nan() { got[i].is_nan() } else { got[i].to_bits() == want[i].to_bits() };
            assert!(same, "{op:?}({}) = {}, want {}", if first { format!("{c}, {x}") } else { format!("{x}, {c}") }, got[i], want[i]);
        }
    }
}

/// kiln's sin/cos against libm's on the reference interpreter (f64) and the CPU backend (f32,
/// vector and scalar lanes): |x| up to 2^16 (rotary angles), points next to multiples of π/2,
/// atan against f64's over the reduction's seams (tan(π/8), 1, tan(3π/8)), tiny, huge and
/// special values, on the reference and the CPU; -0 keeps its sign, ±inf gives ±π/2.
#[test]
fn atan_matches_std() {
    let mut xs: Vec<f32> = (0..4001).map(|i| (i as f32 - 2000.0) / 100.0).collect();
    for seam in [0.414_213_56f64, 1.0, 2.414_213_6] {
        for d in [-1e-6, -1e-7, 0.0, 1e-7, 1e-6] {
            xs.extend([(seam + d) as f32, -(seam + d) as f32]);
        }
    }
    xs.extend([0.0, -0.0, 1e-30, -1e-30, 9.9e-5, 1.01e-4, 1e10, -1e10, f32::MAX, f32::INFINITY, f32::NEG_INFINITY]);
    let g = graph_of(&[&[xs.len()]], |g, x| vec![g.unary(UnaryOp::Atan, x[0]).unwrap()]);
    let (reference, cpu) = reference_and_cpu(&g, f32t(&[xs.len()], &xs));
    for (who, out, tol) in [("reference", &reference[0], 3e-7), ("cpu", &cpu[0], 4e-7)] {
        let got = out.data.to_f64_vec();
        for (i, &x) in xs.iter().enumerate() {
            let want = (x as f64).atan();
            assert!((got[i] - want).abs() <= tol * want.abs().max(1e-30), "{who}: atan({x}) = {}, want {want}", got[i]);
        }
        let at = xs.iter().position(|x| x.to_bits() == (-0.0f32).to_bits()).unwrap();
        assert_eq!(got[at].to_bits(), (-0.0f64).to_bits(), "{who}: atan(-0) keeps the sign");
    }
    let nan = graph_of(&[&[1]], |g, x| vec![g.unary(UnaryOp::Atan, x[0]).unwrap()]);
    let (r, c) = reference_and_cpu(&nan, f32t(&[1], &[f32::NAN]));
    assert!(r[0].data.to_f64_vec()[0].is_nan() && c[0].data.to_f64_vec()[0].is_nan(), "atan(NaN)");
}

/// ±0; NaN past 2^22.
#[test]
fn sin_cos_match_std() {
    use UnaryOp::*;
    let mut xs: Vec<f32> = (0..4001).map(|i| (i as f32 - 2000.0) * 32.768).collect();
    for k in -40..40 {
        let q = k as f64 * std::f64::consts::FRAC_PI_2;
        xs.extend([q as f32, (q + 1e-4) as f32, (q - 1e-4) as f32]);
    }
    xs.extend([0.0, -0.0, 1e-30, -1e-30, 0.5, -3.0, 65536.0, -65536.0, 5e6, -5e6]);
    let g = graph_of(&[&[xs.len()]], |g, x| [Sin, Cos].iter().map(|&op| g.unary(op, x[0]).unwrap()).collect());
    let (reference, cpu) = reference_and_cpu(&g, f32t(&[xs.len()], &xs));
    for (k, f) in [f64::sin as fn(f64) -> f64, f64::cos].into_iter().enumerate() {
        for (who, out, tol) in [("reference", &reference[k], 3e-7), ("cpu", &cpu[k], 2e-6)] {
            let got = out.data.to_f64_vec();
            for (i, &x) in xs.iter().enumerate() {
                let want = f(x as f64);
                let ok = if x.abs() > 4194304.0 { got[i].is_nan() } else { (got[i] - want).abs() <= tol };
                assert!(ok, "{who}: {:?}({x}) = {}, want {want}", [Sin, Cos][k], got[i]);
            }
            if k == 0 {
                let at = xs.iter().position(|x| x.to_bits() == (-0.0f32).to_bits()).unwrap();
                assert_eq!(got[at].to_bits(), (-0.0f64).to_bits(), "{who}: sin(-0) keeps the sign");
            }
        }
    }
}
