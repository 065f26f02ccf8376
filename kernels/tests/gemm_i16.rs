//! The integer GEMM: exact integer sums on every ISA path, packed-B layout (i16 pairs, byte
//! quads) and thread count, against an i64 reference, and bitwise the f32 GEMM's results
//! wherever that one is exact too.

mod common;

use common::*;
use kiln_kernels::gemm::{
    amx_available, amx_blocks_run, gemm_i16_scratch_len, gemm_i16_variant, gemm_prepacked, IntTiles, gemm_scratch_len, pack_b_int_into, pack_b_into, packed_b_int_bytes,
    packed_b_len, EpilogueRef, IntLayout, MC, MR, NR,
};
use kiln_kernels::math::Activation;
use kiln_kernels::threadpool::ThreadPool;
use kiln_kernels::{Isa, KernelError};

/// Integers in [lo, hi] as f32.
fn ints(rng: &mut Rng, n: usize, lo: i32, hi: i32) -> Vec<f32> {
    (0..n).map(|_| (lo + rng.below((hi - lo + 1) as usize) as i32) as f32).collect()
}

const LAYOUTS: [IntLayout; 2] = [IntLayout::I16Pairs, IntLayout::S8Quads];

/// B `[k, n]` (row stride n) packed for the integer GEMM in `layout`.
fn packed(b: &[f32], k: usize, n: usize, layout: IntLayout) -> Vec<u8> {
    let mut p = vec![0u8; packed_b_int_bytes(k, n, layout)];
    let max_abs = b.iter().fold(0f32, |m, x| m.max(x.abs())) as u32;
    pack_b_int_into(b, k, n, n, 1, max_abs, layout, &mut p).unwrap();
    p
}

/// The integer GEMM on `isa` with every tile set — the best (AMX where the machine has it),
/// without AMX, without VNNI — which must agree: checked equal bit for bit here.
#[allow(clippy::too_many_arguments)]
fn run16(m: usize, k: usize, n: usize, a: &[f32], lda: usize, bp: &[u8], epi: &EpilogueRef<'_>, pool: Option<&ThreadPool>, isa: Isa) -> Vec<f32> {
    let threads = pool.map_or(1, |p| p.threads());
    let mut scratch = vec![0f32; gemm_i16_scratch_len(m, k, threads)];
    let outs: Vec<Vec<f32>> = [IntTiles::Best, IntTiles::NoAmx, IntTiles::NoVnni]
        .iter()
        .map(|&tiles| {
            let mut c = vec![f32::NAN; m * n];
            gemm_i16_variant(m, k, n, a, lda, bp, &mut c, n, false, epi, &mut scratch, pool, isa, tiles).unwrap();
            c
        })
        .collect();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&outs[0]), bits(&outs[1]), "{m}x{k}x{n} on {isa:?}: AMX and the VNNI tile differ");
    assert_eq!(bits(&outs[1]), bits(&outs[2]), "{m}x{k}x{n} on {isa:?}: VNNI and pairs-then-add differ");
    outs.into_iter().next().unwrap()
}

#[test]
fn exact_integer_sums_on_every_isa_and_thread_count() {
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(7);
    // Tile and block edges: partial strips and panels, odd k (a half-filled last pair), k past
    // the f32 GEMM's k block, m past MC.
    for &(m, k, n) in &[(1, 1, 1), (5, 3, 17), (13, 7, 33), (12, 64, 32), (37, 385, 50), (MC + 7, 900, 2 * NR + 3), (3 * MR + 1, 2000, 9), (16, 64, 16), (70, 256, 48), (MC + 7, 1024, 2 * NR + 3), (33, 61, 17), (300, 384, 64)] {
        // Values whose sums reach far past 2^24 (the f32 GEMM would round them).
        // Rows spanning 511 (the byte quads' high plane), a quantized activation's 256
        // consecutive integers, and rows of one value.
        let zp = rng.below(256) as i32;
        for a in [ints(&mut rng, m * k, -255, 255), ints(&mut rng, m * k, -zp, 255 - zp), vec![-7.0; m * k]] {
            let b = ints(&mut rng, k * n, -128, 127);
            let exact: Vec<i64> = (0..m * n)
                .map(|ij| (0..k).map(|p| a[(ij / n) * k + p] as i64 * b[p * n + ij % n] as i64).sum())
                .collect();
            let want: Vec<f32> = exact.iter().map(|&v| v as f32).collect();
            for layout in LAYOUTS {
                let bp = packed(&b, k, n, layout);
                for isa in isas() {
                    for pool in [None, Some(&pool)] {
                        let got = run16(m, k, n, &a, k, &bp, &EpilogueRef::default(), pool, isa);
                        assert_eq!(got, want, "{m}x{k}x{n}, {layout:?} on {isa:?}, {} thread(s)", pool.map_or(1, |p| p.threads()));
                    }
                }
            }
        }
    }
}

#[test]
fn equals_the_f32_gemm_bitwise_where_that_is_exact() {
    // Small integers keep every f32 partial sum exact: both GEMMs then give the same sum, and
    // the same store and epilogue must give the same bits (bias, scale, each activation,
    // residual, gated).
    let mut rng = Rng::new(11);
    // The second shape takes the AMX tiles where the machine has them (ceil(k/4) a multiple of
    // 16, enough rows), the first the VNNI tile.
    for (m, k, n) in [(29, 70, 45), (45, 128, 45)] {
        exact_shape_equals_f32(&mut rng, m, k, n);
    }
}

fn exact_shape_equals_f32(rng: &mut Rng, m: usize, k: usize, n: usize) {
    let a = ints(rng, m * k, -20, 20);
    let b = ints(rng, k * n, -20, 20);
    let bias = rng.vec(n);
    let res = rng.vec(m * n);
    let mut bf = vec![0f32; packed_b_len(k, n)];
    pack_b_into(&b, k, n, n, false, &mut bf).unwrap();
    for act in [Activation::None, Activation::Relu, Activation::GeluErf, Activation::GeluTanh, Activation::Silu, Activation::Tanh] {
        for residual in [None, Some((&res[..], n))] {
            let epi = EpilogueRef { bias: Some(&bias), residual, activation: act, scale: 0.0123 };
            for (layout, isa) in LAYOUTS.into_iter().flat_map(|l| isas().into_iter().map(move |i| (l, i))) {
                let got = run16(m, k, n, &a, k, &packed(&b, k, n, layout), &epi, None, isa);
                let mut want = vec![0f32; m * n];
                let mut scratch = vec![0f32; gemm_scratch_len(m, n, k, 1)];
                gemm_prepacked(m, k, n, &a, k, &bf, &mut want, n, false, &epi, &mut scratch, None, isa).unwrap();
                let same = got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{act:?}, residual {}, {layout:?} on {isa:?}", residual.is_some());
            }
        }
    }
}

/// Where the machine has AMX-INT8 (and grants it), the byte-quad GEMM really runs on it: a
/// fallback to the VNNI tile would give the same bits, so the tiles' block count is what shows.
#[test]
fn amx_runs_where_the_machine_has_it() {
    if !amx_available() {
        eprintln!("SKIPPED: no AMX-INT8 here (or not granted, or AVX-512 turned off)");
        return;
    }
    let mut rng = Rng::new(5);
    let (m, k, n) = (64, 384, 64);
    let a = ints(&mut rng, m * k, -100, 100);
    let b = ints(&mut rng, k * n, -128, 127);
    let bp = packed(&b, k, n, IntLayout::S8Quads);
    let mut c = vec![0f32; m * n];
    let mut scratch = vec![0f32; gemm_i16_scratch_len(m, k, 1)];
    let before = amx_blocks_run();
    gemm_i16_variant(m, k, n, &a, k, &bp, &mut c, n, false, &EpilogueRef::default(), &mut scratch, None, Isa::Avx512, IntTiles::Best).unwrap();
    // Two 32-row blocks (other tests may add more meanwhile).
    assert!(amx_blocks_run() >= before + 2, "the AMX tiles did not run");
}

#[test]
fn a_is_converted_as_documented() {
    // A holds what the compiler proves integral; the rest is converted the same way on every
    // path: nearest (ties to even), saturated, NaN to -32768.
    let vals = [0.5f32, 1.5, 2.5, -0.5, -2.5, 40000.0, -40000.0, f32::NAN, 3.0e9, 7.0];
    let k = vals.len();
    for p in 0..k {
        // One-hot B picks column p of A.
        let mut bk = vec![0f32; k];
        bk[p] = 1.0;
        let want = [0.0f32, 2.0, 2.0, -0.0, -2.0, 32767.0, -32768.0, -32768.0, -32768.0, 7.0][p];
        for layout in LAYOUTS {
            let bp = packed(&bk, k, 1, layout);
            for isa in isas() {
                let got = run16(1, k, 1, &vals, k, &bp, &EpilogueRef::default(), None, isa);
                assert_eq!(got[0], want, "column {p} ({}), {layout:?} on {isa:?}", vals[p]);
            }
        }
    }
}

#[test]
fn packing_refuses_what_is_not_an_integer_within_the_bound() {
    for layout in LAYOUTS {
        let mut dst = vec![0u8; packed_b_int_bytes(2, 2, layout)];
        for (bad, at) in [([1.0f32, 2.0, 0.5, 3.0], 2), ([1.0, 32768.0, 0.0, 0.0], 1), ([f32::NAN, 0.0, 0.0, 0.0], 0)] {
            assert_eq!(pack_b_int_into(&bad, 2, 2, 2, 1, 100, layout, &mut dst), Err(KernelError::NotInteger { what: "b", index: at }));
        }
        let past = [1.0f32, 2.0, -101.0, 3.0];
        assert_eq!(pack_b_int_into(&past, 2, 2, 2, 1, 100, layout, &mut dst), Err(KernelError::PastBound { what: "b", index: 2, bound: 100 }));
        // Strided views: column-major storage reads the same matrix.
        let b = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let (mut r, mut c) = (vec![0u8; packed_b_int_bytes(2, 3, layout)], vec![0u8; packed_b_int_bytes(2, 3, layout)]);
        pack_b_int_into(&b, 2, 3, 3, 1, 6, layout, &mut r).unwrap();
        let bt = [1.0f32, 4.0, 2.0, 5.0, 3.0, 6.0];
        pack_b_int_into(&bt, 2, 3, 1, 2, 6, layout, &mut c).unwrap();
        assert_eq!(r, c);
        assert!(matches!(pack_b_int_into(&b, 3, 3, 3, 1, 6, layout, &mut r), Err(KernelError::BufferTooSmall { .. })));
    }
    // Byte quads hold [-128, 127] only.
    let mut dst = vec![0u8; packed_b_int_bytes(1, 2, IntLayout::S8Quads)];
    assert!(pack_b_int_into(&[-128.0, 127.0], 1, 2, 2, 1, 200, IntLayout::S8Quads, &mut dst).is_ok());
    assert!(matches!(pack_b_int_into(&[1.0, 128.0], 1, 2, 2, 1, 200, IntLayout::S8Quads, &mut dst), Err(KernelError::Invalid(_))));
}

#[test]
fn a_packed_b_of_another_shape_or_none_is_refused() {
    let (m, k, n) = (3, 8, 5);
    let a = vec![1.0f32; m * k];
    let b = vec![1.0f32; k * n];
    for layout in LAYOUTS {
        let bp = packed(&b, k, n, layout);
        let mut scratch = vec![0f32; gemm_i16_scratch_len(m, k + 4, 1)];
        let mut c = vec![0f32; m * n];
        // The same bytes called as k + 4 or n - 1: the header says otherwise.
        let e = gemm_i16_variant(m, k - 4, n, &a, k, &bp, &mut c, n, false, &EpilogueRef::default(), &mut scratch, None, Isa::Scalar, IntTiles::Best);
        assert!(matches!(e, Err(KernelError::Invalid(_))), "{e:?}");
        let e = gemm_i16_variant(m, k, n - 1, &a, k, &bp, &mut c, n, false, &EpilogueRef::default(), &mut scratch, None, Isa::Scalar, IntTiles::Best);
        assert!(matches!(e, Err(KernelError::Invalid(_))), "{e:?}");
    }
    // f32 values where a header belongs.
    let raw = vec![0u8; packed_b_int_bytes(k, n, IntLayout::I16Pairs)];
    let mut scratch = vec![0f32; gemm_i16_scratch_len(m, k, 1)];
    let mut c = vec![0f32; m * n];
    let e = gemm_i16_variant(m, k, n, &a, k, &raw, &mut c, n, false, &EpilogueRef::default(), &mut scratch, None, Isa::Scalar, IntTiles::Best);
    assert!(matches!(e, Err(KernelError::Invalid(_))), "{e:?}");
}
