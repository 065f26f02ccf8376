//! `max_rows_raw` on every ISA of this machine against the maximum defined on the floats
//! themselves (largest value, -0 below +0, -inf for an empty row, NaN where the row has one):
//! row lengths that leave every tail of 64, 16 and 8 values, strided rows and outputs, negated
//! rows, and the argument errors through the table.

mod common;

use common::{isas, Rng};
use kiln_kernels::rowmax::{max_rows_raw, MaxRowsArgs};
use kiln_kernels::table::{raw_max_rows_f32, KernelTable};

/// The definition: the largest of the values, -0 below +0; NaN if any is NaN; -inf if none.
fn max_of(v: impl Iterator<Item = f32>) -> f32 {
    let mut m = f32::NEG_INFINITY;
    for x in v {
        if x.is_nan() {
            return f32::NAN;
        }
        if x > m || (x == 0.0 && m == 0.0 && x.is_sign_positive()) {
            m = x;
        }
    }
    m
}

fn run(rows: usize, cols: usize, xs: usize, x: &[f32], os: usize, negate: bool, isa: kiln_kernels::Isa) -> Vec<f32> {
    let mut out = vec![7.0f32; rows.max(1) * os.max(1)];
    let a = MaxRowsArgs { rows, cols, x: x.as_ptr(), x_stride: xs, out: out.as_mut_ptr(), out_stride: os, negate: negate as usize };
    // SAFETY: rows at xs hold cols values; out holds rows at os.
    unsafe { max_rows_raw(&a, isa) }.unwrap();
    out
}

#[test]
fn row_maxima_match_the_definition_on_every_isa() {
    let mut rng = Rng::new(17);
    let specials = [0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::MIN_POSITIVE / 4.0, -f32::MAX, f32::MAX];
    for cols in [0usize, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 384, 1536] {
        let (rows, xs, os) = (5, cols + 3, 2);
        for case in 0..6 {
            let mut x: Vec<f32> = rng.vec(rows * xs).iter().map(|v| v * 100.0).collect();
            match case {
                // All zeros of one sign, then mixed: the sign of the maximum zero.
                1 => x.iter_mut().for_each(|v| *v = -0.0),
                2 => x.iter_mut().enumerate().for_each(|(i, v)| *v = if i % 5 == 3 { 0.0 } else { -0.0 }),
                // Specials anywhere, a NaN in the last row's last value.
                3 => {
                    for (i, v) in x.iter_mut().enumerate() {
                        if i % 3 == 0 {
                            *v = specials[i % specials.len()];
                        }
                    }
                    if cols > 0 {
                        x[(rows - 1) * xs + cols - 1] = f32::NAN;
                    }
                }
                // A negative NaN (sign bit set) and all negative values.
                4 => {
                    x.iter_mut().for_each(|v| *v = -v.abs() - 1.0);
                    if cols > 0 {
                        x[cols / 2] = -f32::NAN;
                    }
                }
                5 => x.iter_mut().for_each(|v| *v = f32::NEG_INFINITY),
                _ => {}
            }
            for negate in [false, true] {
                let want: Vec<f32> = (0..rows).map(|r| max_of(x[r * xs..r * xs + cols].iter().map(|&v| if negate { -v } else { v }))).collect();
                for isa in isas() {
                    let got = run(rows, cols, xs, &x, os, negate, isa);
                    for r in 0..rows {
                        let (g, w) = (got[r * os], want[r]);
                        assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "cols {cols}, case {case}, negate {negate}, row {r} on {isa:?}: {g:?} ({:#x}) != {w:?}", g.to_bits());
                        if r + 1 < rows {
                            assert_eq!(got[r * os + 1], 7.0, "only the output elements are written");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn bad_arguments_are_statuses() {
    let table = KernelTable::new(None);
    // SAFETY: null args / null pointers are what the entry must refuse.
    unsafe {
        assert_eq!(raw_max_rows_f32(&table, std::ptr::null()), 5);
        let a = MaxRowsArgs { rows: 1, cols: 4, x: std::ptr::null(), x_stride: 4, out: std::ptr::null_mut(), out_stride: 1, negate: 0 };
        assert_eq!(raw_max_rows_f32(&table, &a), 5);
        // No rows: nothing read or written.
        let a = MaxRowsArgs { rows: 0, ..a };
        assert_eq!(raw_max_rows_f32(&table, &a), 0);
    }
}
