//! `tap_sum_raw` on every ISA of this machine against the definition written out in f32 (each
//! product rounded, added in tap order, the bias last): bitwise, over channel counts that leave
//! every tail of 16 and 8 lanes, strided pixels, 2..=32 taps, with and without a bias; and the
//! tap-count and null-argument errors through the table.

mod common;

use common::{isas, Rng};
use kiln_kernels::table::{raw_tap_sum_f32, KernelTable};
use kiln_kernels::taps::{tap_sum_raw, TapSumArgs, MAX_TAPS};

#[test]
fn tap_sums_match_the_definition_bitwise() {
    let mut rng = Rng::new(7);
    for isa in isas() {
        for &c in &[1usize, 5, 8, 15, 16, 17, 31, 33, 96] {
            for &taps in &[2usize, 9, 25, MAX_TAPS] {
                for bias in [false, true] {
                    let (n, xs, os) = (5usize, c + 3, c + 1);
                    let xdata: Vec<Vec<f32>> = (0..taps).map(|_| rng.vec(n * xs)).collect();
                    let wdata: Vec<Vec<f32>> = (0..taps).map(|_| rng.vec(c)).collect();
                    let b = rng.vec(c);
                    let mut out = vec![f32::NAN; n * os];
                    let mut a = TapSumArgs {
                        n,
                        c,
                        x_stride: xs,
                        out: out.as_mut_ptr(),
                        out_stride: os,
                        bias: if bias { b.as_ptr() } else { std::ptr::null() },
                        taps,
                        x: [std::ptr::null(); MAX_TAPS],
                        w: [std::ptr::null(); MAX_TAPS],
                    };
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
                            let got = out[p * os + ch];
                            assert_eq!(got.to_bits(), s.to_bits(), "{isa:?} c={c} taps={taps} bias={bias} ({p}, {ch}): {got} vs {s}");
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
    let mut a = TapSumArgs {
        n: 1,
        c: 4,
        x_stride: 4,
        out: out.as_mut_ptr(),
        out_stride: 4,
        bias: std::ptr::null(),
        taps: 0,
        x: [x.as_ptr(); MAX_TAPS],
        w: [x.as_ptr(); MAX_TAPS],
    };
    for taps in [0, MAX_TAPS + 1] {
        a.taps = taps;
        // SAFETY: the pointers cover one pixel of 4 channels.
        assert_eq!(unsafe { raw_tap_sum_f32(&table, &a) }, 5, "{taps} taps");
    }
    // SAFETY: a null argument pointer is refused before any read.
    assert_eq!(unsafe { raw_tap_sum_f32(&table, std::ptr::null()) }, 5);
    a.taps = 3;
    // SAFETY: as above.
    assert_eq!(unsafe { raw_tap_sum_f32(&table, &a) }, 0);
    assert_eq!(out, [3.0; 4]);
}
