//! Accuracy of the CPU backend's inline transcendental functions (Cranelift IR, f32x4 and
//! scalar paths) against f64 over dense sweeps, and their special values.
//!
//! Measured on the dense sweeps below (2^20 + 3 evenly spaced points each, so both the f32x4
//! body and the scalar remainder run); the asserted bounds are a little above what was measured.
//! "abs" errors are divided by max(1, |x|) (one ulp of a large result is large).
//!
//! | function | range          | measured max error                          | asserted        |
//! |----------|----------------|---------------------------------------------|-----------------|
//! | exp      | [-87.3, 88.7]  | relative 8.0e-8                             | 3e-7 relative   |
//! | tanh     | [-10, 10]      | relative 3.1e-7                             | 4e-7 relative   |
//! | gelu     | [-10, 10]      | abs 1.9e-7; relative 1.9e-7 for x > 0       | 5e-7 abs and rel|
//! | erf      | [-6, 6]        | abs 3.6e-7 (recovered from gelu, |x| ≥ 1)   | 6e-7 abs        |
//! | silu     | [-20, 20]      | abs 1.2e-7                                  | 5e-7 abs        |
//! | log      | [1e-38, 1e38] (log-spaced), [0.5, 2] | relative 7.6e-8; abs 3.9e-8 on [0.5, 2] | 3e-7 rel, 2e-7 abs |
//! | softplus | [-30, 30]      | relative 2.1e-7                             | 5e-7 relative   |
//!
//! Beyond the clamps (exp: 88.72 / -104; erf: ±4; tanh: ±9) results are exactly inf/0/±1.

use kiln_compiler::backends::cpu::CpuBackend;
use kiln_compiler::ir::GraphBuilder;
use kiln_runtime::graph::UnaryOp;
use kiln_runtime::{Backend, Batch, Bucket, DType, Dim, HostTensor, InputRole, Outputs};

/// Runs `op` elementwise over `xs` through generated code.
fn run_unary(op: UnaryOp, xs: &[f32]) -> Vec<f32> {
    let mut b = GraphBuilder::new();
    let x = b.input("x", DType::F32, vec![Dim::Fixed(xs.len())], InputRole::Other).unwrap();
    let y = b.unary(op, x).unwrap();
    b.output("y", y);
    let g = b.finish().unwrap();
    let be = CpuBackend::single_threaded().unwrap();
    let w = be.upload(&[], &g).unwrap();
    let bucket = Bucket::new(1, 1);
    let mut plan = be.lower(&w, &g, bucket).unwrap();
    let mut out = Outputs::for_bucket(&g, bucket);
    let batch = Batch { tensors: vec![HostTensor::f32(vec![xs.len()], xs.to_vec()).unwrap()] };
    be.run(&mut plan, &batch, &mut out).unwrap();
    out.tensors[0].to_f32_vec()
}

fn sweep(lo: f64, hi: f64) -> Vec<f32> {
    let n = (1 << 20) + 3;
    (0..n).map(|i| (lo + (hi - lo) * i as f64 / (n - 1) as f64) as f32).collect()
}

/// (max abs error, max rel error) of `got` against `f` evaluated in f64 at the same f32 inputs.
/// The absolute error is scaled by max(1, |x|) (one f32 ulp of a large result is large).
fn errors(xs: &[f32], got: &[f32], f: impl Fn(f64) -> f64) -> (f64, f64, f32) {
    let (mut abs, mut rel, mut worst) = (0f64, 0f64, 0f32);
    for (&x, &y) in xs.iter().zip(got) {
        let want = f(x as f64);
        let e = (y as f64 - want).abs();
        abs = abs.max(e / (x.abs() as f64).max(1.0));
        if want.abs() > 1e-30 {
            let r = e / want.abs();
            if r > rel {
                rel = r;
                worst = x;
            }
        }
    }
    (abs, rel, worst)
}

fn gelu64(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

#[test]
fn exp_is_accurate() {
    let xs = sweep(-87.3, 88.7);
    let (_, rel, at) = errors(&xs, &run_unary(UnaryOp::Exp, &xs), f64::exp);
    println!("exp: max rel {rel:.3e} at {at}");
    assert!(rel <= 3e-7, "exp relative error {rel:e} at {at}");
}

#[test]
fn erf_is_accurate() {
    // erf reaches the kernel IR only inside GELU: check GELU on a wide range, then recover erf.
    let xs = sweep(-10.0, 10.0);
    let got = run_unary(UnaryOp::Gelu, &xs);
    let (abs, _, _) = errors(&xs, &got, gelu64);
    let pos: Vec<(f32, f32)> = xs.iter().copied().zip(got.iter().copied()).filter(|(x, _)| *x > 0.0).collect();
    let (px, pg): (Vec<f32>, Vec<f32>) = pos.into_iter().unzip();
    let (_, rel_pos, at) = errors(&px, &pg, gelu64);
    println!("gelu: max abs {abs:.3e}, max rel (x > 0) {rel_pos:.3e} at {at}");
    assert!(abs <= 5e-7, "gelu absolute error {abs:e}");
    assert!(rel_pos <= 5e-7, "gelu relative error for x > 0: {rel_pos:e} at {at}");
    // erf itself: gelu(x) = x/2·(1 + erf(x/√2)) ⇒ erf(u) = 2·gelu(u√2)/(u√2) - 1, exact enough
    // to bound erf's absolute error where |u√2| >= 1 (the division does not amplify there).
    let us = sweep(-6.0, 6.0);
    let xs2: Vec<f32> = us.iter().map(|&u| u * std::f32::consts::SQRT_2).filter(|x| x.abs() >= 1.0).collect();
    let g2 = run_unary(UnaryOp::Gelu, &xs2);
    let mut e_abs = 0f64;
    for (&x, &g) in xs2.iter().zip(&g2) {
        let erf_got = 2.0 * g as f64 / x as f64 - 1.0;
        let u = x as f64 / std::f64::consts::SQRT_2;
        e_abs = e_abs.max((erf_got - libm::erf(u)).abs());
    }
    println!("erf (through gelu): max abs {e_abs:.3e}");
    assert!(e_abs <= 6e-7, "erf absolute error {e_abs:e}");
}

#[test]
fn tanh_is_accurate() {
    let xs = sweep(-10.0, 10.0);
    let (_, rel, at) = errors(&xs, &run_unary(UnaryOp::Tanh, &xs), f64::tanh);
    println!("tanh: max rel {rel:.3e} at {at}");
    assert!(rel <= 4e-7, "tanh relative error {rel:e} at {at}");
}

#[test]
fn silu_is_accurate() {
    let xs = sweep(-20.0, 20.0);
    let (abs, _, _) = errors(&xs, &run_unary(UnaryOp::Silu, &xs), |x| x / (1.0 + (-x).exp()));
    println!("silu: max abs {abs:.3e}");
    assert!(abs <= 5e-7, "silu absolute error {abs:e}");
}

#[test]
fn log_is_accurate() {
    // Log-spaced over the normal range, and dense around 1 where log is small.
    let n = (1 << 20) + 3;
    let xs: Vec<f32> = (0..n).map(|i| (10f64).powf(-38.0 + 76.0 * i as f64 / (n - 1) as f64) as f32).collect();
    let (_, rel, at) = errors(&xs, &run_unary(UnaryOp::Log, &xs), f64::ln);
    println!("log: max rel {rel:.3e} at {at}");
    assert!(rel <= 3e-7, "log relative error {rel:e} at {at}");
    let xs = sweep(0.5, 2.0);
    let (abs, _, _) = errors(&xs, &run_unary(UnaryOp::Log, &xs), f64::ln);
    println!("log near 1: max abs {abs:.3e}");
    assert!(abs <= 2e-7, "log absolute error {abs:e} near 1");
    // Subnormals (scaled into the normal range first).
    let xs = [1e-45f32, 3e-39, 1e-40, f32::MIN_POSITIVE];
    let (_, rel, at) = errors(&xs, &run_unary(UnaryOp::Log, &xs), f64::ln);
    assert!(rel <= 3e-7, "log of subnormals: relative error {rel:e} at {at}");
}

#[test]
fn softplus_is_accurate() {
    let xs = sweep(-30.0, 30.0);
    let (_, rel, at) = errors(&xs, &run_unary(UnaryOp::Softplus, &xs), |x| x.exp().ln_1p());
    println!("softplus: max rel {rel:.3e} at {at}");
    assert!(rel <= 5e-7, "softplus relative error {rel:e} at {at}");
}

#[test]
fn special_values() {
    let xs = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 100.0, -200.0, 88.8];
    let e = run_unary(UnaryOp::Exp, &xs);
    assert!(e[0].is_nan());
    assert_eq!(&e[1..], &[f32::INFINITY, 0.0, 1.0, 1.0, f32::INFINITY, 0.0, f32::INFINITY]);
    let t = run_unary(UnaryOp::Tanh, &xs);
    assert!(t[0].is_nan());
    assert_eq!(&t[1..7], &[1.0, -1.0, 0.0, 0.0, 1.0, -1.0]);
    let g = run_unary(UnaryOp::Gelu, &xs);
    assert!(g[0].is_nan());
    assert_eq!(g[3], 0.0);
    assert_eq!(g[5], 100.0);
    assert_eq!(g[6], 0.0);
    let l = run_unary(UnaryOp::Log, &xs);
    assert!(l[0].is_nan() && l[2].is_nan() && l[6].is_nan());
    assert_eq!([l[1], l[3], l[4]], [f32::INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY]);
    let s = run_unary(UnaryOp::Softplus, &xs);
    assert!(s[0].is_nan());
    assert_eq!([s[1], s[2], s[5], s[6]], [f32::INFINITY, 0.0, 100.0, 0.0]);
    let r = run_unary(UnaryOp::Relu, &[f32::NAN, -1.0, 2.0, -0.0, 3.0]);
    assert!(r[0].is_nan());
    assert_eq!(&r[1..], &[0.0, 2.0, -0.0, 3.0]);
}
