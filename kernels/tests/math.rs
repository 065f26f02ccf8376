//! Dense sweeps of the vector math approximations against f64 references, on every ISA this
//! machine has (the scalar path always, the AVX2 path when detected). Each function is evaluated on
//! every 257th f32 bit pattern of its range (both signs; millions of points, densely covering tiny
//! magnitudes too), and the maximum relative and absolute errors are printed and checked against
//! the bounds documented in `src/math.rs`.

mod common;

use common::*;
use kiln_kernels::math::{self, Activation, Unary};
use kiln_kernels::Isa;

/// Every `stride`-th f32 with |x| <= hi (both signs), plus the exact bounds.
fn sweep(hi: f32, stride: u32) -> Vec<f32> {
    let top = hi.to_bits();
    let mut v = Vec::new();
    let mut b = 0u32;
    while b <= top {
        let x = f32::from_bits(b);
        v.push(x);
        v.push(-x);
        b += stride;
    }
    v.push(hi);
    v.push(-hi);
    v
}

struct Err {
    max_rel: f64,
    at_rel: f32,
    max_abs: f64,
    at_abs: f32,
}

/// Max errors of `f` (evaluated through the slice API on `isa`) against `r`. Relative error is taken
/// where |reference| >= `rel_floor` and `rel_where(x)` holds.
fn measure(
    f: Unary,
    isa: Isa,
    xs: &[f32],
    r: impl Fn(f64) -> f64,
    rel_floor: f64,
    rel_where: impl Fn(f32) -> bool,
) -> Err {
    let mut y = vec![0.0f32; xs.len()];
    math::map_with_isa(f, xs, &mut y, isa).unwrap();
    let mut e = Err {
        max_rel: 0.0,
        at_rel: 0.0,
        max_abs: 0.0,
        at_abs: 0.0,
    };
    for (&x, &yv) in xs.iter().zip(&y) {
        let want = r(x as f64);
        assert!(
            !yv.is_nan(),
            "{f:?} {isa:?}: NaN at x = {x:e} (want {want:e})"
        );
        let abs = (yv as f64 - want).abs();
        if abs > e.max_abs {
            e.max_abs = abs;
            e.at_abs = x;
        }
        if want.abs() >= rel_floor && rel_where(x) {
            let rel = abs / want.abs();
            if rel > e.max_rel {
                e.max_rel = rel;
                e.at_rel = x;
            }
        }
    }
    println!(
        "{:<22} {:<8} max rel {:.3e} (at {:e})  max abs {:.3e} (at {:e})",
        format!("{f:?}"),
        format!("{isa:?}"),
        e.max_rel,
        e.at_rel,
        e.max_abs,
        e.at_abs
    );
    e
}

const MIN_NORMAL: f64 = f32::MIN_POSITIVE as f64;

#[test]
fn exp_sweep() {
    let mut xs = sweep(88.7, 257);
    xs.retain(|&x| x >= -103.0);
    for isa in isas() {
        let e = measure(Unary::Exp, isa, &xs, f64::exp, MIN_NORMAL, |_| true);
        assert!(
            e.max_rel < 1.2e-7,
            "exp rel error {:e} at {:e}",
            e.max_rel,
            e.at_rel
        );
    }
}

#[test]
fn exp_special_values() {
    for isa in isas() {
        let xs = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            89.0,
            1000.0,
            -1000.0,
            -104.5,
            0.0,
            -0.0,
        ];
        let mut y = [0.0f32; 9];
        math::map_with_isa(Unary::Exp, &xs, &mut y, isa).unwrap();
        assert!(y[0].is_nan());
        assert_eq!(y[1], f32::INFINITY);
        assert_eq!(y[2], 0.0);
        assert_eq!(y[3], f32::INFINITY);
        assert_eq!(y[4], f32::INFINITY);
        assert_eq!(y[5], 0.0);
        assert_eq!(y[6], 0.0);
        assert_eq!(y[7], 1.0);
        assert_eq!(y[8], 1.0);
        // Subnormal results are still produced (exp(-100) ~ 3.7e-44).
        let mut z = [0.0f32; 1];
        math::map_with_isa(Unary::Exp, &[-100.0], &mut z, isa).unwrap();
        assert!(
            (z[0] as f64 - (-100.0f64).exp()).abs() < 2e-45,
            "{isa:?}: exp(-100) = {:e}",
            z[0]
        );
    }
}

#[test]
fn erf_sweep() {
    let xs = sweep(6.0, 257);
    for isa in isas() {
        let e = measure(Unary::Erf, isa, &xs, libm::erf, 1e-37, |_| true);
        assert!(
            e.max_rel < 1.5e-7,
            "erf rel error {:e} at {:e}",
            e.max_rel,
            e.at_rel
        );
        assert!(
            e.max_abs < 1.2e-7,
            "erf abs error {:e} at {:e}",
            e.max_abs,
            e.at_abs
        );
    }
}

#[test]
fn tanh_sweep() {
    let xs = sweep(12.0, 257);
    for isa in isas() {
        let e = measure(
            Unary::Act(Activation::Tanh),
            isa,
            &xs,
            f64::tanh,
            1e-37,
            |_| true,
        );
        assert!(
            e.max_rel < 1.5e-7,
            "tanh rel error {:e} at {:e}",
            e.max_rel,
            e.at_rel
        );
    }
}

#[test]
fn sigmoid_silu_sweep() {
    let mut xs = sweep(30.0, 257);
    xs.extend(sweep(87.0, 65537));
    for isa in isas() {
        let e = measure(
            Unary::Act(Activation::Sigmoid),
            isa,
            &xs,
            sigmoid64,
            MIN_NORMAL,
            |_| true,
        );
        assert!(
            e.max_rel < 2.5e-7,
            "sigmoid rel error {:e} at {:e}",
            e.max_rel,
            e.at_rel
        );
        let e = measure(
            Unary::Act(Activation::Silu),
            isa,
            &xs,
            |x| x * sigmoid64(x),
            MIN_NORMAL,
            |_| true,
        );
        assert!(
            e.max_rel < 2.5e-7,
            "silu rel error {:e} at {:e}",
            e.max_rel,
            e.at_rel
        );
    }
}

#[test]
fn gelu_sweep() {
    // The erf GELU is the `1 + erf` form (scripts/fit_gelu.py): Φ's error is absolute, so the
    // bound is on |GELU(x) - ref| / |x| (Φ's error, 2.4e-7 = 4 ulps of 1/2) everywhere, relative
    // above 0; below -4√2 it returns -0 (an absolute error below 4.4e-8), and a negative x never
    // gives a positive result. The tanh GELU keeps its relative error (no `1 + tanh`
    // cancellation): bounded over the whole range down to results of 1e-30.
    let xs = sweep(10.0, 257);
    for isa in isas() {
        let e = measure(
            Unary::Act(Activation::GeluErf),
            isa,
            &xs,
            gelu_erf64,
            1e-30,
            |x| x > 0.0,
        );
        assert!(e.max_rel < 2.5e-7, "gelu_erf rel error {:e} at {:e} (x > 0)", e.max_rel, e.at_rel);
        assert!(e.max_abs < 1.4e-6, "gelu_erf abs error {:e} at {:e}", e.max_abs, e.at_abs);
        let mut y = vec![1.0f32; xs.len()];
        math::map_with_isa(Unary::Act(Activation::GeluErf), &xs, &mut y, isa).unwrap();
        let mut worst = (0.0f64, 0.0f32);
        for (&x, &v) in xs.iter().zip(&y) {
            let want = gelu_erf64(x as f64);
            // (Above 1e-30: x/2 of a subnormal x rounds to the subnormal grid.)
            if x.abs() > 1e-30 {
                let phi_err = (v as f64 - want).abs() / (x as f64).abs();
                if phi_err > worst.0 {
                    worst = (phi_err, x);
                }
            }
            if x < 0.0 {
                assert!(v.is_sign_negative(), "gelu_erf({x:e}) = {v:e}: positive for a negative x");
            }
            if x < -math::coeffs::GELU_CLAMP {
                assert_eq!(v.to_bits(), (-0.0f32).to_bits(), "gelu_erf({x:e}) = {v:e}, want -0 (true {want:e})");
            }
        }
        println!("gelu_erf {isa:?}: |GELU(x) - ref| / |x| at most {:.3e} (at {:e})", worst.0, worst.1);
        assert!(worst.0 < 2.5e-7, "gelu_erf: Φ's error {:e} at {:e}", worst.0, worst.1);
        let e = measure(
            Unary::Act(Activation::GeluTanh),
            isa,
            &xs,
            gelu_tanh64,
            1e-30,
            |x| x >= -3.0,
        );
        assert!(
            e.max_rel < 1.2e-6,
            "gelu_tanh rel error {:e} at {:e}",
            e.max_rel,
            e.at_rel
        );
        // Below x = -3 the tail exp(-2u), u ≈ 0.0356·x³, has condition number 2u: rounding u in f32
        // alone costs ~2u·2⁻²⁴ relative.
        let e = measure(
            Unary::Act(Activation::GeluTanh),
            isa,
            &xs,
            gelu_tanh64,
            1e-30,
            |_| true,
        );
        assert!(
            e.max_rel < 3.0e-5,
            "gelu_tanh rel error {:e} at {:e}",
            e.max_rel,
            e.at_rel
        );
    }
}

#[test]
fn relu_and_none_exact() {
    let xs = sweep(5.0, 100_003);
    for isa in isas() {
        let mut y = vec![0.0f32; xs.len()];
        math::map_with_isa(Unary::Act(Activation::Relu), &xs, &mut y, isa).unwrap();
        for (&x, &v) in xs.iter().zip(&y) {
            assert_eq!(v, x.max(0.0));
        }
        math::map_with_isa(Unary::Act(Activation::None), &xs, &mut y, isa).unwrap();
        assert_eq!(xs, y);
    }
}

#[test]
fn nan_propagates() {
    for isa in isas() {
        for a in Activation::ALL {
            let mut y = [0.0f32; 3];
            math::map_with_isa(Unary::Act(a), &[f32::NAN, 1.0, f32::NAN], &mut y, isa).unwrap();
            assert!(y[0].is_nan() && y[2].is_nan(), "{a:?} {isa:?}");
        }
        let mut y = [0.0f32; 1];
        math::map_with_isa(Unary::Erf, &[f32::NAN], &mut y, isa).unwrap();
        assert!(y[0].is_nan());
    }
}

#[test]
fn vector_and_scalar_paths_agree_closely() {
    // Same algorithm, FMA vs separate multiply-add: answers differ by at most a few ulps.
    if kiln_kernels::detect_isa() != Isa::Avx2Fma {
        return;
    }
    let xs = sweep(8.0, 7919);
    for f in [
        Unary::Exp,
        Unary::Erf,
        Unary::Act(Activation::Tanh),
        Unary::Act(Activation::GeluErf),
    ] {
        let mut a = vec![0.0f32; xs.len()];
        let mut b = vec![0.0f32; xs.len()];
        math::map_with_isa(f, &xs, &mut a, Isa::Scalar).unwrap();
        math::map_with_isa(f, &xs, &mut b, Isa::Avx2Fma).unwrap();
        for ((&x, &p), &q) in xs.iter().zip(&a).zip(&b) {
            let tol = 4.0 * f32::EPSILON * p.abs().max(q.abs()) + 1e-37;
            assert!(
                (p - q).abs() <= tol,
                "{f:?} at {x:e}: scalar {p:e} vs avx2 {q:e}"
            );
        }
    }
}

#[test]
fn gelu_erf_is_bitwise_equal_on_every_path() {
    // The scalar GELU does the vector one's operations (mul_add for each FMA): every ISA gives
    // the same bits, specials included.
    let mut xs = sweep(100.0, 97);
    xs.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::MIN_POSITIVE, -f32::MIN_POSITIVE, 1e-45, -1e-45]);
    xs.extend([5.9999, -5.9999, 6.0, -6.0, 6.0001, -6.0001, f32::MAX, f32::MIN]);
    let run = |isa| {
        let mut y = vec![0.0f32; xs.len()];
        math::map_with_isa(Unary::Act(Activation::GeluErf), &xs, &mut y, isa).unwrap();
        y
    };
    let want = run(Isa::Scalar);
    for isa in isas() {
        for ((&x, &p), &q) in xs.iter().zip(&want).zip(&run(isa)) {
            assert!(
                p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()),
                "gelu_erf({x:e}): scalar {p:e} vs {isa:?} {q:e}"
            );
        }
    }
    let special = run(Isa::Scalar);
    let n = xs.len();
    assert_eq!(special[n - 14].to_bits(), f32::INFINITY.to_bits(), "gelu(+inf)");
    assert!(special[n - 13].is_nan(), "gelu(-inf) is -inf·0 = NaN");
    assert_eq!(special[n - 2].to_bits(), f32::MAX.to_bits(), "gelu(MAX)");
    assert_eq!(special[n - 1].to_bits(), (-0.0f32).to_bits(), "gelu(MIN)");
}

#[test]
fn softmax_rows_matches_reference() {
    let mut rng = Rng::new(7);
    for &(rows, cols) in &[(1, 1), (3, 7), (5, 8), (4, 9), (2, 33), (6, 128)] {
        let ld = cols + 3;
        let mut x: Vec<f32> = (0..rows * ld).map(|_| rng.f32() * 20.0).collect();
        // One fully masked row and one partly masked row.
        if rows > 2 {
            for j in 0..cols {
                x[ld + j] = f32::NEG_INFINITY;
            }
            x[2 * ld] = f32::NEG_INFINITY;
        }
        let orig = x.clone();
        math::softmax_rows(&mut x, rows, cols, ld).unwrap();
        for r in 0..rows {
            let row = &orig[r * ld..r * ld + cols];
            let mx = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let s: f64 = row.iter().map(|&v| (v as f64 - mx).exp()).sum();
            for j in 0..cols {
                let want = if mx == f64::NEG_INFINITY {
                    0.0
                } else {
                    (row[j] as f64 - mx).exp() / s
                };
                let got = x[r * ld + j] as f64;
                assert!(
                    (got - want).abs() <= 2e-6 * want.max(1e-3),
                    "row {r} col {j}: {got} vs {want}"
                );
            }
            // Padding between rows untouched.
            for j in cols..ld {
                assert_eq!(x[r * ld + j].to_bits(), orig[r * ld + j].to_bits());
            }
        }
    }
}

/// NaN anywhere in a row makes the row NaN, also when the max (`maxps`, which skips NaN) finds
/// only -inf besides it; an -inf score gets an exact 0 weight (a value of ±inf times it must
/// give NaN, not ±inf).
#[test]
fn softmax_rows_special_values() {
    let (n, i, nan) = (f32::NEG_INFINITY, f32::INFINITY, f32::NAN);
    let rows: [&[f32]; 5] = [&[nan, n, n], &[n, nan, n, n, n, n, n, n, n, n], &[1.0, nan, 2.0], &[i, 1.0, 0.0], &[0.0, n, 1.0]];
    for (k, row) in rows.iter().enumerate() {
        let mut x = row.to_vec();
        math::softmax_rows(&mut x, 1, row.len(), row.len()).unwrap();
        match k {
            0..=3 => assert!(x.iter().all(|v| v.is_nan()), "row {k}: {x:?}"),
            _ => assert!(x[1].to_bits() == 0 && x[0] > 0.0 && x[2] > x[0], "row {k}: {x:?}"),
        }
    }
}
