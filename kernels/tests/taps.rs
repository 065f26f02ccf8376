//! `tap_sum_raw` on every ISA of this machine against the definition written out in f32 (each
//! product rounded, added in tap order, the bias, then the clamps): bitwise, over channel counts
//! that leave every tail of 16 and 8 lanes, strided pixels, 2..=32 taps, with and without a bias,
//! with ReLU6-like clamps (and ±0 and NaN through them); and the argument errors through the table.

mod common;

use common::{isas, Rng};
use kiln_kernels::table::{raw_tap_sum_f32, KernelTable};
use kiln_kernels::taps::{tap_sum_raw, TapSumArgs, MAX_POST, MAX_TAPS, TAP_MAX, TAP_MIN};

/// The clamps as the expression defines them: `max(v, c)` takes c where v < c (v <= c for c = +0),
/// `min(v, c)` where c < v (c <= v for c = -0); NaN stays.
fn clamp(v: f32, op: u32, c: f32) -> f32 {
    let take = if op == TAP_MAX {
        if c == 0.0 && c.is_sign_positive() { v <= c } else { v < c }
    } else if c == 0.0 && c.is_sign_negative() {
        c <= v
    } else {
        c < v
    };
    if take { c } else { v }
}

fn args(n: usize, c: usize, xs: usize, out: *mut f32, os: usize, taps: usize) -> TapSumArgs {
    TapSumArgs {
        n,
        c,
        x_stride: xs,
        out,
        out_stride: os,
        bias: std::ptr::null(),
        taps,
        x: [std::ptr::null(); MAX_TAPS],
        w: [std::ptr::null(); MAX_TAPS],
        post: 0,
        post_op: [0; MAX_POST],
        post_c: [0.0; MAX_POST],
    }
}

#[test]
fn tap_sums_match_the_definition_bitwise() {
    let mut rng = Rng::new(7);
    for isa in isas() {
        for &c in &[1usize, 5, 8, 15, 16, 17, 31, 33, 96] {
            for &taps in &[2usize, 9, 25, MAX_TAPS] {
                for (bias, post) in [(false, 0), (true, 0), (true, 2), (false, 1)] {
                    let (n, xs, os) = (5usize, c + 3, c + 1);
                    let mut xdata: Vec<Vec<f32>> = (0..taps).map(|_| rng.vec(n * xs)).collect();
                    // Specials through the sum and the clamps: a NaN, and (one tap) ±0.
                    xdata[0][xs + c / 2] = f32::NAN;
                    if taps == 2 {
                        xdata[0][2 * xs] = -0.0;
                        xdata[1][2 * xs] = 0.0;
                    }
                    let wdata: Vec<Vec<f32>> = (0..taps).map(|_| rng.vec(c)).collect();
                    let b = rng.vec(c);
                    let mut out = vec![f32::NAN; n * os];
                    let mut a = args(n, c, xs, out.as_mut_ptr(), os, taps);
                    if bias {
                        a.bias = b.as_ptr();
                    }
                    // ReLU6's two clamps (max against +0 turns -0 into +0), or one min against -0
                    // (which +0 meets with `<=`).
                    let posts = if post == 2 { vec![(TAP_MAX, 0.0f32), (TAP_MIN, 0.25)] } else { vec![(TAP_MIN, -0.0f32)] };
                    a.post = post;
                    for (i, &(op, cv)) in posts.iter().take(post).enumerate() {
                        a.post_op[i] = op;
                        a.post_c[i] = cv;
                    }
                    for t in 0..taps {
                        a.x[t] = xdata[t].as_ptr();
                        a.w[t] = wdata[t].as_ptr();
                    }
                    // SAFETY: every view sized for n pixels of c channels at its stride.
                    unsafe { tap_sum_raw(&a, isa) }.unwrap();
                    for p in 0..n {
                        for ch in 0..c {
                            let mut s = xdata[0][p * xs + ch] * wdata[0][ch];
                            for t in 1..taps {
                                s += xdata[t][p * xs + ch] * wdata[t][ch];
                            }
                            if bias {
                                s += b[ch];
                            }
                            for &(op, cv) in posts.iter().take(post) {
                                s = clamp(s, op, cv);
                            }
                            let got = out[p * os + ch];
                            assert!(got.to_bits() == s.to_bits() || (got.is_nan() && s.is_nan()), "{isa:?} c={c} taps={taps} bias={bias} post={post} ({p}, {ch}): {got} vs {s}");
                        }
                        // Between the rows' channels nothing is written.
                        if os > c {
                            assert!(out[p * os + c].is_nan());
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn bad_tap_counts_and_null_arguments_are_statuses() {
    let table = KernelTable::new(None);
    let x = [1.0f32; 4];
    let mut out = [0.0f32; 4];
    let mut a = args(1, 4, 4, out.as_mut_ptr(), 4, 0);
    a.x = [x.as_ptr(); MAX_TAPS];
    a.w = [x.as_ptr(); MAX_TAPS];
    for taps in [0, MAX_TAPS + 1] {
        a.taps = taps;
        // SAFETY: the pointers cover one pixel of 4 channels.
        assert_eq!(unsafe { raw_tap_sum_f32(&table, &a) }, 5, "{taps} taps");
    }
    a.taps = 3;
    for (post, op, c) in [(3, TAP_MAX, 0.0), (1, 7, 0.0), (1, TAP_MIN, f32::NAN)] {
        a.post = post;
        a.post_op[0] = op;
        a.post_c[0] = c;
        // SAFETY: as above.
        assert_eq!(unsafe { raw_tap_sum_f32(&table, &a) }, 5, "post {post} op {op} c {c}");
    }
    a.post = 0;
    // SAFETY: a null argument pointer is refused before any read.
    assert_eq!(unsafe { raw_tap_sum_f32(&table, std::ptr::null()) }, 5);
    a.taps = 3;
    // SAFETY: as above.
    assert_eq!(unsafe { raw_tap_sum_f32(&table, &a) }, 0);
    assert_eq!(out, [3.0; 4]);
}
