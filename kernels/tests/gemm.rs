//! GEMM against a naive f64 reference: many odd sizes (1..70 including primes, across the MR/NR/KC/MC
//! block edges) and the MiniLM shapes, both packing orientations, padded strides, accumulate, every
//! epilogue, both ISA paths; threaded results must be bitwise identical to single-threaded ones.

mod common;

use common::*;
use kiln_kernels::gemm::{
    gemm, gemm_prepacked, gemm_scratch_len, gemm_split, pack_b, pack_b_into, packed_b_len,
    EpilogueRef, Split, KC, MC, MR, NR,
};
use kiln_kernels::math::Activation;
use kiln_kernels::threadpool::ThreadPool;
use kiln_kernels::{Isa, KernelError};

/// Problem data with padded strides: A is m×k at lda = k + pad, B is stored [k, n] or [n, k].
struct Case {
    m: usize,
    n: usize,
    k: usize,
    lda: usize,
    ldb: usize,
    ldc: usize,
    a: Vec<f32>,
    b: Vec<f32>,
    transposed: bool,
    bias: Vec<f32>,
    res: Vec<f32>,
    ldr: usize,
}

impl Case {
    fn new(m: usize, n: usize, k: usize, transposed: bool, pad: usize, seed: u64) -> Case {
        let mut r = Rng::new(seed);
        let lda = k + pad;
        let ldb = if transposed { k + pad } else { n + pad };
        let b_rows = if transposed { n } else { k };
        Case {
            m,
            n,
            k,
            lda,
            ldb,
            ldc: n + pad,
            a: r.vec(m * lda),
            b: r.vec(b_rows * ldb),
            transposed,
            bias: r.vec(n),
            res: r.vec(m * (n + 2)),
            ldr: n + 2,
        }
    }
    fn b_at(&self, p: usize, j: usize) -> f32 {
        if self.transposed {
            self.b[j * self.ldb + p]
        } else {
            self.b[p * self.ldb + j]
        }
    }
    /// f64 reference of the full epilogue, plus the per-element error scale Σ|a||b|.
    fn reference(
        &self,
        c0: &[f32],
        accumulate: bool,
        epi: &EpilogueRef<'_>,
    ) -> (Vec<f64>, Vec<f64>) {
        let mut out = vec![0.0; self.m * self.n];
        let mut mag = vec![0.0; self.m * self.n];
        for i in 0..self.m {
            for j in 0..self.n {
                let mut s = 0.0f64;
                let mut g = 0.0f64;
                for p in 0..self.k {
                    let t = self.a[i * self.lda + p] as f64 * self.b_at(p, j) as f64;
                    s += t;
                    g += t.abs();
                }
                let mut v = epi.scale as f64 * s;
                if accumulate {
                    v += c0[i * self.ldc + j] as f64;
                }
                if let Some(b) = epi.bias {
                    v += b[j] as f64;
                }
                v = act64(epi.activation, v);
                if let Some((r, rs)) = epi.residual {
                    v += r[i * rs + j] as f64;
                }
                out[i * self.n + j] = v;
                mag[i * self.n + j] = g * epi.scale.abs() as f64 + 1.0;
            }
        }
        (out, mag)
    }
}

/// Runs one GEMM and compares with the reference; checks the padding of C is untouched.
#[allow(clippy::too_many_arguments)]
fn check(
    cs: &Case,
    accumulate: bool,
    epi: &EpilogueRef<'_>,
    isa: Isa,
    pool: Option<&ThreadPool>,
) -> Vec<f32> {
    let pb = pack_b(&cs.b, cs.k, cs.n, cs.ldb, cs.transposed).unwrap();
    let mut c = Rng::new(99).vec(cs.m * cs.ldc);
    let c0 = c.clone();
    let threads = pool.map_or(1, |p| p.threads());
    let mut scratch = vec![0.0f32; gemm_scratch_len(cs.m, cs.n, cs.k, threads)];
    gemm_prepacked(
        cs.m,
        cs.k,
        cs.n,
        &cs.a,
        cs.lda,
        pb.as_slice(),
        &mut c,
        cs.ldc,
        accumulate,
        epi,
        &mut scratch,
        pool,
        isa,
    )
    .unwrap();
    let (want, mag) = cs.reference(&c0, accumulate, epi);
    for i in 0..cs.m {
        for j in 0..cs.ldc {
            let got = c[i * cs.ldc + j];
            if j >= cs.n {
                assert_eq!(
                    got.to_bits(),
                    c0[i * cs.ldc + j].to_bits(),
                    "padding of C changed at ({i},{j})"
                );
                continue;
            }
            let w = want[i * cs.n + j];
            // f32 accumulation error ≤ ~k·2⁻²⁴·Σ|ab|; plus activation error (~1e-6 relative).
            let tol = 2e-6 * mag[i * cs.n + j] * (1.0 + (cs.k as f64).sqrt()) + 1e-6 * w.abs();
            assert!(
                (got as f64 - w).abs() <= tol,
                "m{} n{} k{} T{} acc{} {:?} {isa:?}: C[{i},{j}] = {got}, want {w} (tol {tol:e})",
                cs.m,
                cs.n,
                cs.k,
                cs.transposed,
                accumulate,
                epi.activation
            );
        }
    }
    c
}

const ODD: [usize; 22] = [
    1, 2, 3, 5, 6, 7, 8, 11, 13, 15, 16, 17, 23, 24, 29, 31, 32, 33, 47, 61, 67, 70,
];

#[test]
fn odd_sizes_all_isas() {
    let mut rng = Rng::new(1);
    for isa in isas() {
        for &m in &ODD {
            for _ in 0..6 {
                let n = ODD[rng.below(ODD.len())];
                let k = ODD[rng.below(ODD.len())];
                let t = rng.below(2) == 1;
                let cs = Case::new(m, n, k, t, rng.below(3), rng.next_u64());
                check(&cs, false, &EpilogueRef::default(), isa, None);
            }
        }
    }
}

#[test]
fn every_small_size_avx2() {
    // Exhaustive over m, n in 1..=40 with a prime k: every edge-tile combination of the 6×16 tile
    // (AVX2) and of the 12×32 tile (AVX-512, where present).
    for isa in isas().into_iter().filter(|i| i.has_avx2()) {
        for m in 1..=40 {
            for n in 1..=40 {
                if isa == Isa::Avx2Fma && (m > 20 || n > 20) {
                    continue;
                }
                let cs = Case::new(m, n, 13, (m + n) % 2 == 0, 1, (m * 100 + n) as u64);
                check(&cs, m % 3 == 0, &EpilogueRef::default(), isa, None);
            }
        }
    }
}

#[test]
fn avx512_tile_is_bitwise_equal_to_avx2() {
    // The AVX-512 tile does, per element, the same FMAs in the same order as the AVX2 tile, and
    // the same epilogue: results must match bit for bit (skipped without AVX-512).
    if kiln_kernels::detect_isa() != Isa::Avx512 {
        eprintln!("no AVX-512 on this machine: skipped");
        return;
    }
    let pool = ThreadPool::new(2);
    let mut rng = Rng::new(5);
    let mut shapes = vec![(128, 384, 384), (16, 1536, 384), (130, 50, 600), (13, 33, 7)];
    for _ in 0..40 {
        shapes.push((1 + rng.below(150), 1 + rng.below(150), 1 + rng.below(300)));
    }
    for (i, &(m, n, k)) in shapes.iter().enumerate() {
        let cs = Case::new(m, n, k, i % 2 == 0, i % 3, 500 + i as u64);
        let epi = EpilogueRef {
            bias: Some(&cs.bias),
            residual: Some((&cs.res, cs.ldr)),
            activation: Activation::GeluErf,
            scale: 0.5,
        };
        let pb = pack_b(&cs.b, k, n, cs.ldb, cs.transposed).unwrap();
        let c0 = Rng::new(7).vec(m * cs.ldc);
        let mut runs = Vec::new();
        for isa in [Isa::Avx2Fma, Isa::Avx512] {
            let mut c = c0.clone();
            let mut scratch = vec![0.0f32; gemm_scratch_len(m, n, k, 2)];
            gemm_prepacked(
                m,
                k,
                n,
                &cs.a,
                cs.lda,
                pb.as_slice(),
                &mut c,
                cs.ldc,
                i % 2 == 1,
                &epi,
                &mut scratch,
                Some(&pool),
                isa,
            )
            .unwrap();
            runs.push(c);
        }
        assert!(
            runs[0].iter().zip(&runs[1]).all(|(x, y)| x.to_bits() == y.to_bits()),
            "shape {m}×{n}×{k}: AVX-512 differs from AVX2"
        );
    }
}

#[test]
fn reading_a_in_place_is_bitwise_equal_to_packing_it() {
    // A GEMM block with at most two B panels (n <= 32 on one thread), or with k <= 64 and few
    // panels (n = 100, 128), reads A's rows in place instead of packing them; the same columns of
    // a GEMM wide enough to pack A must match bit for bit, for every row count of the tiles, k
    // blocks (k > KC) and padded strides.
    let mut rng = Rng::new(11);
    for isa in isas() {
        for (i, &n) in [1usize, 7, 16, 17, 31, 32, 100, 128].iter().enumerate() {
            for &m in &[1usize, 5, 6, 7, 11, 12, 13, 25, 96, MC + 7] {
                let k = [3usize, 32, 129, KC + 50][(i + m) % 4];
                let wide = n + 40 * NR + 5;
                let lda = k + 3;
                let a = rng.vec(m * lda);
                let b_wide = rng.vec(k * wide);
                let b: Vec<f32> = (0..k).flat_map(|p| b_wide[p * wide..p * wide + n].to_vec()).collect();
                let bias = rng.vec(wide);
                let run = |b: &[f32], cols: usize| {
                    let epi = EpilogueRef {
                        bias: Some(&bias[..cols]),
                        residual: None,
                        activation: Activation::GeluErf,
                        scale: 0.75,
                    };
                    let pb = pack_b(b, k, cols, cols, false).unwrap();
                    let mut c = vec![0.0f32; m * cols];
                    let mut scratch = vec![0.0f32; gemm_scratch_len(m, cols, k, 1)];
                    gemm_prepacked(m, k, cols, &a, lda, pb.as_slice(), &mut c, cols, false, &epi, &mut scratch, None, isa)
                        .unwrap();
                    c
                };
                let (direct, packed) = (run(&b, n), run(&b_wide, wide));
                for r in 0..m {
                    for j in 0..n {
                        assert_eq!(
                            direct[r * n + j].to_bits(),
                            packed[r * wide + j].to_bits(),
                            "{isa:?} {m}x{n}x{k}: element ({r}, {j}) differs between A in place and A packed"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn avx512_epilogue_is_bitwise_equal_to_avx2_for_every_activation() {
    // C = A·B with k = 1 and B entries ±1 (exact), so the epilogue sees a dense sweep of f32
    // values (subnormals to 1e30, ±0, ±inf, NaN) at every lane position of full and masked
    // vectors; the 16-lane epilogue must give the 8-lane one's bits for each activation.
    if kiln_kernels::detect_isa() != Isa::Avx512 {
        eprintln!("no AVX-512 on this machine: skipped");
        return;
    }
    let mut xs = vec![0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 88.5, -88.5];
    let top = 1e30f32.to_bits();
    let mut bits = 0u32;
    while bits <= top {
        xs.push(f32::from_bits(bits));
        bits += 1 << 16;
    }
    let (m, k, n) = (xs.len(), 1, 37);
    let b: Vec<f32> = (0..n).map(|j| if j % 3 == 1 { -1.0 } else { 1.0 }).collect();
    let pb = pack_b(&b, k, n, n, false).unwrap();
    let bias = vec![0.0f32; n];
    for act in Activation::ALL {
        let epi = EpilogueRef {
            bias: Some(&bias),
            activation: act,
            ..EpilogueRef::default()
        };
        let mut runs = Vec::new();
        for isa in [Isa::Avx2Fma, Isa::Avx512] {
            let mut c = vec![0.0f32; m * n];
            let mut scratch = vec![0.0f32; gemm_scratch_len(m, n, k, 1)];
            gemm_prepacked(m, k, n, &xs, 1, pb.as_slice(), &mut c, n, false, &epi, &mut scratch, None, isa)
                .unwrap();
            runs.push(c);
        }
        for (idx, (x, y)) in runs[0].iter().zip(&runs[1]).enumerate() {
            assert!(
                x.to_bits() == y.to_bits(),
                "{act:?} at input {:e}: AVX2 {x:e}, AVX-512 {y:e}",
                xs[idx / n] * b[idx % n]
            );
        }
    }
}

#[test]
fn block_edges() {
    // k across KC, m across MC, n across several panels; k = 0 and m/n = 0 handled.
    let shapes = [
        (MC + 1, 2 * NR + 3, KC + 1),
        (MC - 1, NR - 1, 2 * KC + 7),
        (2 * MC + MR + 1, 3 * NR, KC),
        (7, 5, 600),
        (130, 33, 257),
    ];
    for isa in isas() {
        for (i, &(m, n, k)) in shapes.iter().enumerate() {
            let cs = Case::new(m, n, k, i % 2 == 0, 2, i as u64 + 10);
            check(&cs, false, &EpilogueRef::default(), isa, None);
            check(&cs, true, &EpilogueRef::default(), isa, None);
        }
    }
}

#[test]
fn k_zero_gives_zero_or_keeps_c_then_epilogue() {
    for isa in isas() {
        let cs = Case::new(5, 19, 0, false, 1, 3);
        check(&cs, false, &EpilogueRef::default(), isa, None);
        check(&cs, true, &EpilogueRef::default(), isa, None);
        let epi = EpilogueRef {
            bias: Some(&cs.bias),
            activation: Activation::Relu,
            ..Default::default()
        };
        check(&cs, false, &epi, isa, None);
    }
}

#[test]
fn empty_m_or_n_is_a_no_op() {
    let pb = pack_b(&[], 3, 0, 0, false).unwrap();
    let mut c = [7.0f32; 4];
    gemm(
        2,
        &[1.0; 6],
        3,
        &pb,
        &mut c,
        0,
        false,
        &EpilogueRef::default(),
        &mut [],
        None,
    )
    .unwrap();
    assert_eq!(c, [7.0; 4]);
    let pb = pack_b(&[1.0; 6], 3, 2, 2, false).unwrap();
    gemm(
        0,
        &[],
        3,
        &pb,
        &mut [],
        2,
        false,
        &EpilogueRef::default(),
        &mut [],
        None,
    )
    .unwrap();
}

#[test]
fn epilogues_every_activation() {
    for isa in isas() {
        for (i, act) in Activation::ALL.into_iter().enumerate() {
            for &(m, n, k) in &[(7, 21, 19), (13, 40, 64), (1, 3, 5)] {
                let cs = Case::new(m, n, k, i % 2 == 1, 1, (i * 31 + m) as u64);
                let epi = EpilogueRef {
                    bias: Some(&cs.bias),
                    residual: Some((&cs.res, cs.ldr)),
                    activation: act,
                    scale: 0.37,
                };
                check(&cs, false, &epi, isa, None);
                check(&cs, true, &epi, isa, None);
                // Activation alone and bias alone.
                check(
                    &cs,
                    false,
                    &EpilogueRef {
                        activation: act,
                        ..Default::default()
                    },
                    isa,
                    None,
                );
            }
        }
        let cs = Case::new(9, 17, 11, false, 0, 5);
        check(
            &cs,
            false,
            &EpilogueRef {
                bias: Some(&cs.bias),
                ..Default::default()
            },
            isa,
            None,
        );
        check(
            &cs,
            false,
            &EpilogueRef {
                residual: Some((&cs.res, cs.ldr)),
                ..Default::default()
            },
            isa,
            None,
        );
    }
}

#[test]
fn minilm_shapes() {
    let isa = kiln_kernels::detect_isa();
    for (i, &(m, k, n)) in [(128, 384, 384), (128, 384, 1536), (128, 1536, 384)]
        .iter()
        .enumerate()
    {
        let cs = Case::new(m, n, k, true, 0, 40 + i as u64);
        let epi = EpilogueRef {
            bias: Some(&cs.bias),
            activation: Activation::GeluErf,
            ..Default::default()
        };
        check(&cs, false, &epi, isa, None);
    }
}

#[test]
fn both_orientations_pack_the_same() {
    let (k, n) = (37, 45);
    let mut r = Rng::new(4);
    let kn = r.vec(k * n);
    let mut nk = vec![0.0f32; n * k];
    for p in 0..k {
        for j in 0..n {
            nk[j * k + p] = kn[p * n + j];
        }
    }
    let a = pack_b(&kn, k, n, n, false).unwrap();
    let b = pack_b(&nk, k, n, k, true).unwrap();
    assert_eq!(a.as_slice(), b.as_slice());
    assert_eq!(a.as_slice().len(), packed_b_len(k, n));
    // Layout: panel p, row kk, column jj at p·k·NR + kk·NR + jj; padding zero.
    let s = a.as_slice();
    for p in 0..n.div_ceil(NR) {
        for kk in 0..k {
            for jj in 0..NR {
                let j = p * NR + jj;
                let want = if j < n { kn[kk * n + j] } else { 0.0 };
                assert_eq!(s[p * k * NR + kk * NR + jj], want);
            }
        }
    }
    // Aligned to 64 bytes.
    assert_eq!(s.as_ptr() as usize % 64, 0);
    // pack_b_into gives the same floats.
    let mut dst = vec![1.0f32; packed_b_len(k, n)];
    pack_b_into(&nk, k, n, k, true, &mut dst).unwrap();
    assert_eq!(dst, s);
}

/// C of `cs` with its bias and residual around the erf GELU, on `pool` (scratch for three
/// threads) cut by `split`.
fn split_gemm(cs: &Case, pool: Option<&ThreadPool>, isa: Isa, split: Split) -> Vec<f32> {
    let (m, n, k) = (cs.m, cs.n, cs.k);
    let epi = gelu_epilogue(cs);
    let pb = pack_b(&cs.b, k, n, cs.ldb, cs.transposed).unwrap();
    let mut c = vec![0.0f32; m * cs.ldc];
    let mut scratch = vec![0.0f32; gemm_scratch_len(m, n, k, 3)];
    gemm_split(m, k, n, &cs.a, cs.lda, pb.as_slice(), &mut c, cs.ldc, false, &epi, &mut scratch, pool, isa, split).unwrap();
    c
}

/// `cs`'s bias and residual around the erf GELU.
fn gelu_epilogue(cs: &Case) -> EpilogueRef<'_> {
    EpilogueRef {
        bias: Some(&cs.bias),
        residual: Some((&cs.res, cs.ldr)),
        activation: Activation::GeluErf,
        scale: 1.0,
    }
}

fn same_bits(x: &[f32], y: &[f32]) -> bool {
    x.iter().zip(y).all(|(a, b)| a.to_bits() == b.to_bits())
}

#[test]
fn threaded_results_are_bitwise_identical() {
    let pool = ThreadPool::new(3);
    let isa = kiln_kernels::detect_isa();
    for (i, &(m, n, k)) in [
        (128, 384, 384),
        (61, 200, 70),
        (300, 48, 33),
        (6, 1000, 17),
        (250, 250, 300),
        // A panel split of several k blocks: each thread's share (8 panels) reads A in place.
        (128, 384, 1000),
    ]
    .iter()
    .enumerate()
    {
        let cs = Case::new(m, n, k, i % 2 == 0, 1, 70 + i as u64);
        let want = split_gemm(&cs, None, isa, Split::Auto);
        for split in [Split::Auto, Split::Rows, Split::Panels] {
            assert!(same_bits(&want, &split_gemm(&cs, Some(&pool), isa, split)), "shape {m}×{n}×{k} {split:?}: threaded differs");
        }
        // And the threaded result is right.
        check(&cs, false, &gelu_epilogue(&cs), isa, Some(&pool));
    }
}

#[test]
fn work_a_busy_thread_left_is_taken_from_the_back() {
    // Inside a pool task the pool is busy, so a nested GEMM's tasks run one after another on that
    // thread: task 0 runs its own rows (or panels) from the front, then takes each other task's
    // from the back, a piece at a time (`gemm/steal.rs`), before those tasks start. The result
    // must be the one-thread one, bit for bit, epilogue included. Panels are taken in a GEMM of
    // one k block and one m block (the first two panel shapes) and, on the one-panel tiles,
    // where the shares read A in place (the last two: k in several blocks, pieces of a panel's
    // rows); the others' tasks keep their ranges.
    let pool = ThreadPool::new(3);
    let isa = kiln_kernels::detect_isa();
    let cases = [
        (300, 48, 33, Split::Rows),
        (1000, 40, 70, Split::Rows),
        (97, 16, 384, Split::Rows),
        (64, 300, 100, Split::Panels),
        (130, 1000, 384, Split::Panels),
        (200, 300, 50, Split::Panels),
        (64, 300, 1000, Split::Panels),
        (61, 200, 1000, Split::Panels),
    ];
    for (i, &(m, n, k, split)) in cases.iter().enumerate() {
        let cs = Case::new(m, n, k, i % 2 == 1, 1, 90 + i as u64);
        let want = split_gemm(&cs, None, isa, split);
        let got = std::sync::Mutex::new(Vec::new());
        pool.run(2, &|t| {
            if t == 0 {
                *got.lock().unwrap() = split_gemm(&cs, Some(&pool), isa, split);
            }
        });
        assert!(same_bits(&want, &got.into_inner().unwrap()), "{m}×{n}×{k} {split:?}: differs");
    }
}

#[test]
fn scratch_for_fewer_threads_still_works() {
    let pool = ThreadPool::new(4);
    let cs = Case::new(100, 300, 50, false, 0, 8);
    let pb = pack_b(&cs.b, cs.k, cs.n, cs.ldb, false).unwrap();
    let mut c1 = vec![0.0f32; 100 * cs.ldc];
    let mut c2 = c1.clone();
    let mut s1 = vec![0.0f32; gemm_scratch_len(100, 300, 50, 1)];
    let mut s2 = vec![0.0f32; gemm_scratch_len(100, 300, 50, 2)];
    gemm(
        100,
        &cs.a,
        cs.lda,
        &pb,
        &mut c1,
        cs.ldc,
        false,
        &EpilogueRef::default(),
        &mut s1,
        Some(&pool),
    )
    .unwrap();
    gemm(
        100,
        &cs.a,
        cs.lda,
        &pb,
        &mut c2,
        cs.ldc,
        false,
        &EpilogueRef::default(),
        &mut s2,
        Some(&pool),
    )
    .unwrap();
    assert_eq!(c1, c2);
}

#[test]
fn bad_arguments_are_errors() {
    let pb = pack_b(&[0.5; 12], 3, 4, 4, false).unwrap();
    let a = [1.0f32; 6];
    let mut c = [0.0f32; 8];
    let mut s = vec![0.0f32; gemm_scratch_len(2, 4, 3, 1)];
    let e = EpilogueRef::default();
    // A too short.
    assert!(matches!(
        gemm(2, &a[..5], 3, &pb, &mut c, 4, false, &e, &mut s, None),
        Err(KernelError::BufferTooSmall { .. })
    ));
    // lda < k.
    assert!(matches!(
        gemm(2, &a, 2, &pb, &mut c, 4, false, &e, &mut s, None),
        Err(KernelError::BadStride { .. })
    ));
    // C too short / ldc < n.
    assert!(matches!(
        gemm(2, &a, 3, &pb, &mut c[..7], 4, false, &e, &mut s, None),
        Err(KernelError::BufferTooSmall { .. })
    ));
    assert!(matches!(
        gemm(2, &a, 3, &pb, &mut c, 3, false, &e, &mut s, None),
        Err(KernelError::BadStride { .. })
    ));
    // Scratch too small.
    assert!(matches!(
        gemm(2, &a, 3, &pb, &mut c, 4, false, &e, &mut s[..3], None),
        Err(KernelError::ScratchTooSmall { .. })
    ));
    // Bias / residual too short.
    let short = [0.0f32; 3];
    let eb = EpilogueRef {
        bias: Some(&short),
        ..Default::default()
    };
    assert!(gemm(2, &a, 3, &pb, &mut c, 4, false, &eb, &mut s, None).is_err());
    let er = EpilogueRef {
        residual: Some((&short, 4)),
        ..Default::default()
    };
    assert!(gemm(2, &a, 3, &pb, &mut c, 4, false, &er, &mut s, None).is_err());
    // B source too short for its layout.
    assert!(pack_b(&[0.0; 11], 3, 4, 4, false).is_err());
    assert!(pack_b(&[0.0; 11], 3, 4, 3, true).is_err());
    assert!(pack_b_into(&[0.0; 12], 3, 4, 4, false, &mut [0.0; 10]).is_err());
    // The packed slice must match k and n.
    assert!(gemm_prepacked(
        2,
        3,
        4,
        &a,
        3,
        &pb.as_slice()[..20],
        &mut c,
        4,
        false,
        &e,
        &mut s,
        None,
        Isa::Scalar
    )
    .is_err());
}
