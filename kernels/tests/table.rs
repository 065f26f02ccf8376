//! The C ABI: field offsets documented for generated code, calls through the `extern "C"` function
//! pointers (as Cranelift's call_indirect would make them) agree with the safe API, status codes,
//! and the strided batched GEMM used for attention-sized products.

mod common;

use common::*;
use kiln_kernels::attention::{attention_batched_scratch_len, AttentionArgs, AttnDims, ATTN_ZERO_NAN_ROWS};
use kiln_kernels::gemm::{
    batched_scratch_len, gemm, gemm_batched, gemm_scratch_len, pack_b, packed_b_len,
    BatchedGemmArgs, Epilogue, EpilogueRef, Strided, StridedMut,
};
use kiln_kernels::math::{self, Activation, Unary};
use kiln_kernels::table::{KernelTable, KERNEL_ABI_VERSION};
use kiln_kernels::threadpool::ThreadPool;
use kiln_kernels::{Isa, KernelError};
use std::mem::{offset_of, size_of};

#[test]
fn documented_offsets() {
    assert_eq!(size_of::<Epilogue>(), 32);
    assert_eq!(offset_of!(Epilogue, bias), 0);
    assert_eq!(offset_of!(Epilogue, residual), 8);
    assert_eq!(offset_of!(Epilogue, residual_stride), 16);
    assert_eq!(offset_of!(Epilogue, activation), 24);
    assert_eq!(offset_of!(Epilogue, scale), 28);
    {
        use kiln_kernels::taps::{TapSumArgs, MAX_TAPS};
        let at = [offset_of!(TapSumArgs, n), offset_of!(TapSumArgs, c), offset_of!(TapSumArgs, x_stride), offset_of!(TapSumArgs, out), offset_of!(TapSumArgs, out_stride), offset_of!(TapSumArgs, bias), offset_of!(TapSumArgs, taps), offset_of!(TapSumArgs, x), offset_of!(TapSumArgs, w)];
        assert_eq!(at, [0, 8, 16, 24, 32, 40, 48, 56, 56 + 8 * MAX_TAPS]);
        let post = 56 + 16 * MAX_TAPS;
        assert_eq!([offset_of!(TapSumArgs, post), offset_of!(TapSumArgs, post_op), offset_of!(TapSumArgs, post_c)], [post, post + 8, post + 16]);
        assert_eq!(size_of::<TapSumArgs>(), post + 24);
    }
    {
        use kiln_kernels::rowmax::MaxRowsArgs;
        let at = [
            offset_of!(MaxRowsArgs, rows),
            offset_of!(MaxRowsArgs, cols),
            offset_of!(MaxRowsArgs, x),
            offset_of!(MaxRowsArgs, x_stride),
            offset_of!(MaxRowsArgs, out),
            offset_of!(MaxRowsArgs, out_stride),
            offset_of!(MaxRowsArgs, negate),
        ];
        assert_eq!(at, [0, 8, 16, 24, 32, 40, 48]);
        assert_eq!(size_of::<MaxRowsArgs>(), 56);
    }

    let b = [
        offset_of!(BatchedGemmArgs, batch),
        offset_of!(BatchedGemmArgs, m),
        offset_of!(BatchedGemmArgs, n),
        offset_of!(BatchedGemmArgs, k),
        offset_of!(BatchedGemmArgs, a),
        offset_of!(BatchedGemmArgs, lda),
        offset_of!(BatchedGemmArgs, stride_a),
        offset_of!(BatchedGemmArgs, b),
        offset_of!(BatchedGemmArgs, ldb),
        offset_of!(BatchedGemmArgs, stride_b),
        offset_of!(BatchedGemmArgs, b_transposed),
        offset_of!(BatchedGemmArgs, c),
        offset_of!(BatchedGemmArgs, ldc),
        offset_of!(BatchedGemmArgs, stride_c),
        offset_of!(BatchedGemmArgs, accumulate),
        offset_of!(BatchedGemmArgs, alpha),
        offset_of!(BatchedGemmArgs, _pad),
        offset_of!(BatchedGemmArgs, scratch),
        offset_of!(BatchedGemmArgs, scratch_len),
    ];
    assert_eq!(
        b,
        [0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 124, 128, 136]
    );
    assert_eq!(size_of::<BatchedGemmArgs>(), 144);

    assert_eq!(offset_of!(AttentionArgs, q), 48);
    assert_eq!(offset_of!(AttentionArgs, k), 80);
    assert_eq!(offset_of!(AttentionArgs, v), 112);
    assert_eq!(offset_of!(AttentionArgs, out), 144);
    assert_eq!(offset_of!(AttentionArgs, mask), 176);
    assert_eq!(offset_of!(AttentionArgs, mask_row_stride), 200);
    assert_eq!(offset_of!(AttentionArgs, scale), 208);
    assert_eq!(offset_of!(AttentionArgs, flags), 212);
    assert_eq!(offset_of!(AttentionArgs, scratch), 216);
    assert_eq!(offset_of!(AttentionArgs, scratch_len), 224);
    assert_eq!(size_of::<AttentionArgs>(), 232);

    // Table: two u32 then pointer-sized entries in declaration order.
    assert_eq!(KernelTable::OFF_ABI_VERSION, 0);
    assert_eq!(KernelTable::OFF_ISA, 4);
    assert_eq!(KernelTable::OFF_POOL, 8);
    let entries = [
        KernelTable::OFF_GEMM_F32,
        KernelTable::OFF_GEMM_BATCHED_F32,
        KernelTable::OFF_ATTENTION_F32,
        KernelTable::OFF_PACK_B_F32,
        KernelTable::OFF_EXP_F32,
        KernelTable::OFF_ERF_F32,
        KernelTable::OFF_TANH_F32,
        KernelTable::OFF_SIGMOID_F32,
        KernelTable::OFF_SILU_F32,
        KernelTable::OFF_GELU_ERF_F32,
        KernelTable::OFF_GELU_TANH_F32,
        KernelTable::OFF_RELU_F32,
        KernelTable::OFF_ACTIVATION_F32,
        KernelTable::OFF_SOFTMAX_ROWS_F32,
        KernelTable::OFF_GEMM_I16,
        KernelTable::OFF_TAP_SUM_F32,
        KernelTable::OFF_MAX_ROWS_F32,
    ];
    for (i, off) in entries.iter().enumerate() {
        assert_eq!(*off, 16 + 8 * i);
    }
    assert_eq!(size_of::<KernelTable>(), 16 + 8 * entries.len());
}

#[test]
fn gemm_through_the_table_matches_safe_api() {
    let pool = ThreadPool::new(2);
    for isa in isas() {
        let table = KernelTable::with_isa(Some(&pool), isa);
        assert_eq!(table.abi_version, KERNEL_ABI_VERSION);
        let (m, n, k) = (37, 70, 45);
        let mut r = Rng::new(3);
        let a = r.vec(m * k);
        let w = r.vec(n * k);
        let bias = r.vec(n);
        let res = r.vec(m * n);
        // Pack through the table, then check it equals the Rust packing.
        let mut packed = vec![0.0f32; packed_b_len(k, n)];
        // SAFETY: w is [n, k] with ldb = k; packed holds packed_b_len(k, n) floats.
        unsafe { (table.pack_b_f32)(w.as_ptr(), k, n, k, 1, packed.as_mut_ptr()) };
        let pb = pack_b(&w, k, n, k, true).unwrap();
        assert_eq!(packed, pb.as_slice());

        let epi = Epilogue {
            bias: bias.as_ptr(),
            residual: res.as_ptr(),
            residual_stride: n,
            activation: Activation::GeluErf as u32,
            scale: 0.5,
        };
        let mut scratch = vec![0.0f32; gemm_scratch_len(m, n, k, 2)];
        let mut c_raw = vec![0.0f32; m * n];
        // SAFETY: all operands sized for m, n, k above.
        let st = unsafe {
            (table.gemm_f32)(
                &table,
                m,
                n,
                k,
                a.as_ptr(),
                k,
                packed.as_ptr(),
                c_raw.as_mut_ptr(),
                n,
                0,
                &epi,
                scratch.as_mut_ptr(),
                scratch.len(),
            )
        };
        assert_eq!(st, 0);
        let mut c_safe = vec![0.0f32; m * n];
        let e = EpilogueRef {
            bias: Some(&bias),
            residual: Some((&res, n)),
            activation: Activation::GeluErf,
            scale: 0.5,
        };
        kiln_kernels::gemm::gemm_prepacked(
            m,
            k,
            n,
            &a,
            k,
            pb.as_slice(),
            &mut c_safe,
            n,
            false,
            &e,
            &mut scratch,
            None,
            isa,
        )
        .unwrap();
        assert_eq!(c_raw, c_safe, "{isa:?}");

        // Null epilogue = plain product; accumulate adds.
        let mut c2 = c_safe.clone();
        // SAFETY: as above.
        let st = unsafe {
            (table.gemm_f32)(
                &table,
                m,
                n,
                k,
                a.as_ptr(),
                k,
                packed.as_ptr(),
                c2.as_mut_ptr(),
                n,
                1,
                std::ptr::null(),
                scratch.as_mut_ptr(),
                scratch.len(),
            )
        };
        assert_eq!(st, 0);
        let mut plain = vec![0.0f32; m * n];
        gemm(
            m,
            &a,
            k,
            &pb,
            &mut plain,
            n,
            false,
            &EpilogueRef::default(),
            &mut scratch,
            None,
        )
        .unwrap();
        for i in 0..m * n {
            assert!((c2[i] - (c_safe[i] + plain[i])).abs() <= 1e-4 * (1.0 + c2[i].abs()));
        }
    }
}

/// A gated epilogue (`(scale·A·B (+ C) + bias) · act(residual)`, reachable only through the C
/// ABI: generated code uses it for SwiGLU/GeGLU): on every ISA close to an f64 reference, and the
/// AVX2 and AVX-512 tiles bit for bit (their full tiles apply the bias as they store and the gate
/// over the stored rows; the edge tiles in one pass). Shapes with full and edge tiles of both.
#[test]
fn gated_epilogue_on_every_isa() {
    for &(m, n, k) in &[(13, 40, 64), (24, 64, 33), (7, 21, 19)] {
        let mut r = Rng::new((m * n + k) as u64);
        let (a, w, bias, res, c0) = (r.vec(m * k), r.vec(n * k), r.vec(n), r.vec(m * n), r.vec(m * n));
        let pb = pack_b(&w, k, n, k, true).unwrap();
        for act in Activation::ALL {
            for accumulate in [0usize, 1] {
                let epi = Epilogue {
                    bias: bias.as_ptr(),
                    residual: res.as_ptr(),
                    residual_stride: n,
                    activation: act as u32 | kiln_kernels::gemm::GATED,
                    scale: 0.37,
                };
                let mut runs = Vec::new();
                for isa in isas() {
                    let table = KernelTable::with_isa(None, isa);
                    let mut scratch = vec![0.0f32; gemm_scratch_len(m, n, k, 1)];
                    let mut c = c0.clone();
                    // SAFETY: every operand sized for m, n, k above; the residual is not C.
                    let st = unsafe {
                        (table.gemm_f32)(&table, m, n, k, a.as_ptr(), k, pb.as_slice().as_ptr(), c.as_mut_ptr(), n, accumulate, &epi, scratch.as_mut_ptr(), scratch.len())
                    };
                    assert_eq!(st, 0, "{act:?} on {isa:?}");
                    for i in 0..m {
                        for j in 0..n {
                            let dot: f64 = (0..k).map(|p| a[i * k + p] as f64 * w[j * k + p] as f64).sum();
                            let v = 0.37 * dot + if accumulate == 1 { c0[i * n + j] as f64 } else { 0.0 } + bias[j] as f64;
                            let want = v * act64(act, res[i * n + j] as f64);
                            let got = c[i * n + j] as f64;
                            assert!((got - want).abs() <= 1e-5 + 1e-4 * want.abs(), "{act:?} on {isa:?} at ({i}, {j}) of {m}×{n}: {got} against {want}");
                        }
                    }
                    runs.push((isa, c));
                }
                let simd: Vec<_> = runs.iter().filter(|(isa, _)| *isa != Isa::Scalar).collect();
                for pair in simd.windows(2) {
                    let same = pair[0].1.iter().zip(&pair[1].1).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{act:?}, accumulate {accumulate}: {:?} and {:?} differ", pair[0].0, pair[1].0);
                }
            }
        }
    }
}

#[test]
fn status_codes() {
    let table = KernelTable::new(None);
    let a = [1.0f32; 4];
    let b = [1.0f32; 32];
    let mut c = [0.0f32; 4];
    let mut s = vec![0.0f32; gemm_scratch_len(2, 2, 2, 1)];
    let bad_act = Epilogue {
        activation: 99,
        ..Epilogue::NONE
    };
    // SAFETY: every call below passes buffers large enough for the shapes, or fails validation first.
    unsafe {
        let call = |lda: usize,
                    ldc: usize,
                    epi: *const Epilogue,
                    slen: usize,
                    s: &mut [f32],
                    c: &mut [f32]| {
            (table.gemm_f32)(
                &table,
                2,
                2,
                2,
                a.as_ptr(),
                lda,
                b.as_ptr(),
                c.as_mut_ptr(),
                ldc,
                0,
                epi,
                s.as_mut_ptr(),
                slen,
            )
        };
        let sl = s.len();
        assert_eq!(call(2, 2, std::ptr::null(), sl, &mut s, &mut c), 0);
        assert_eq!(c, [2.0; 4]);
        assert_eq!(
            call(1, 2, std::ptr::null(), sl, &mut s, &mut c),
            KernelError::BadStride {
                what: "",
                stride: 0,
                min: 0
            }
            .code()
        );
        assert_eq!(
            call(2, 2, &bad_act, sl, &mut s, &mut c),
            KernelError::BadActivation(99).code()
        );
        // A gate needs a residual to gate with.
        let gate_without_residual = Epilogue { activation: 6 | kiln_kernels::gemm::GATED, ..Epilogue::NONE };
        assert_eq!(
            call(2, 2, &gate_without_residual, sl, &mut s, &mut c),
            KernelError::BadActivation(6 | kiln_kernels::gemm::GATED).code()
        );
        assert_eq!(
            call(2, 2, std::ptr::null(), 1, &mut s, &mut c),
            KernelError::ScratchTooSmall { needed: 0, got: 0 }.code()
        );
        assert_eq!(
            (table.gemm_f32)(
                std::ptr::null(),
                2,
                2,
                2,
                a.as_ptr(),
                2,
                b.as_ptr(),
                c.as_mut_ptr(),
                2,
                0,
                std::ptr::null(),
                s.as_mut_ptr(),
                sl
            ),
            KernelError::Invalid("").code()
        );
        let mut y = [0.0f32; 2];
        assert_eq!(
            (table.activation_f32)([1.0f32, -1.0].as_ptr(), y.as_mut_ptr(), 2, 1),
            0
        );
        assert_eq!(y, [1.0, 0.0]);
        assert_eq!(
            (table.activation_f32)([7.5f32, -0.0].as_ptr(), y.as_mut_ptr(), 2, 7),
            0
        );
        assert_eq!((y[0], y[1].to_bits()), (6.0, 0), "ReLU6 clamps, and -0 gives +0");
        assert_eq!(
            (table.activation_f32)(a.as_ptr(), y.as_mut_ptr(), 2, 8),
            KernelError::BadActivation(8).code()
        );
    }
}

#[test]
fn unary_entries_match_math_module() {
    let table = KernelTable::new(None);
    let xs: Vec<f32> = (0..203).map(|i| (i as f32 - 100.0) * 0.07).collect();
    let entries: [(kiln_kernels::table::UnaryFn, Unary); 8] = [
        (table.exp_f32, Unary::Exp),
        (table.erf_f32, Unary::Erf),
        (table.tanh_f32, Unary::Act(Activation::Tanh)),
        (table.sigmoid_f32, Unary::Act(Activation::Sigmoid)),
        (table.silu_f32, Unary::Act(Activation::Silu)),
        (table.gelu_erf_f32, Unary::Act(Activation::GeluErf)),
        (table.gelu_tanh_f32, Unary::Act(Activation::GeluTanh)),
        (table.relu_f32, Unary::Act(Activation::Relu)),
    ];
    for (f, u) in entries {
        let mut got = xs.clone();
        // SAFETY: in place over xs.len() floats.
        unsafe { f(got.as_ptr(), got.as_mut_ptr(), got.len()) };
        let mut want = vec![0.0f32; xs.len()];
        math::map(u, &xs, &mut want).unwrap();
        assert_eq!(got, want, "{u:?}");
    }
    let mut x = vec![1.0f32, 2.0, 3.0, 0.0, 0.0, 0.0];
    // SAFETY: 2 rows of 3 at ld 3.
    unsafe { (table.softmax_rows_f32)(x.as_mut_ptr(), 2, 3, 3) };
    let s: f32 = x[..3].iter().sum();
    assert!((s - 1.0).abs() < 1e-6 && (x[3] - 1.0 / 3.0).abs() < 1e-7);
}

/// Q·Kᵀ and P·V shaped products through the batched GEMM, safe API and table, vs f64.
#[test]
fn batched_gemm_attention_shapes() {
    let pool = ThreadPool::new(2);
    for isa in isas() {
        let table = KernelTable::with_isa(Some(&pool), isa);
        for &(batch, m, n, k, bt) in &[
            (12, 128, 128, 32, true),
            (12, 128, 32, 128, false),
            (5, 7, 13, 3, true),
            (3, 1, 1, 1, false),
        ] {
            let mut r = Rng::new((m * n + k) as u64);
            let (lda, ldb, ldc) = (k + 1, if bt { k + 2 } else { n + 2 }, n + 3);
            let b_rows = if bt { n } else { k };
            let (sa, sb, sc) = (m * lda + 5, b_rows * ldb + 1, m * ldc);
            let a = r.vec(batch * sa);
            let b = r.vec(batch * sb);
            let c_init = r.vec(batch * sc);
            let alpha = 0.25f32;
            let mut c = c_init.clone();
            let mut scratch = vec![0.0f32; batched_scratch_len(m, n, k, 2)];
            gemm_batched(
                batch,
                m,
                n,
                k,
                Strided {
                    data: &a,
                    ld: lda,
                    batch_stride: sa,
                },
                Strided {
                    data: &b,
                    ld: ldb,
                    batch_stride: sb,
                },
                bt,
                StridedMut {
                    data: &mut c,
                    ld: ldc,
                    batch_stride: sc,
                },
                alpha,
                true,
                &mut scratch,
                Some(&pool),
                isa,
            )
            .unwrap();
            for bi in 0..batch {
                for i in 0..m {
                    for j in 0..n {
                        let mut s = 0.0f64;
                        for p in 0..k {
                            let bv = if bt {
                                b[bi * sb + j * ldb + p]
                            } else {
                                b[bi * sb + p * ldb + j]
                            };
                            s += a[bi * sa + i * lda + p] as f64 * bv as f64;
                        }
                        let want = alpha as f64 * s + c_init[bi * sc + i * ldc + j] as f64;
                        let got = c[bi * sc + i * ldc + j] as f64;
                        assert!(
                            (got - want).abs() < 1e-4 * (1.0 + k as f64).sqrt(),
                            "batch {bi} ({i},{j}): {got} vs {want}"
                        );
                    }
                }
            }
            // Same through the table entry, bitwise.
            let mut c2 = c_init.clone();
            let args = BatchedGemmArgs {
                batch,
                m,
                n,
                k,
                a: a.as_ptr(),
                lda,
                stride_a: sa,
                b: b.as_ptr(),
                ldb,
                stride_b: sb,
                b_transposed: bt as usize,
                c: c2.as_mut_ptr(),
                ldc,
                stride_c: sc,
                accumulate: 1,
                alpha,
                _pad: 0,
                scratch: scratch.as_mut_ptr(),
                scratch_len: scratch.len(),
            };
            // SAFETY: args describe the buffers above.
            assert_eq!(unsafe { (table.gemm_batched_f32)(&table, &args) }, 0);
            assert_eq!(c, c2);
        }
    }
}

#[test]
fn batched_gemm_rejects_overlapping_outputs() {
    let a = [1.0f32; 16];
    let mut c = [0.0f32; 16];
    let mut s = vec![0.0f32; batched_scratch_len(2, 2, 2, 1)];
    let r = gemm_batched(
        2,
        2,
        2,
        2,
        Strided {
            data: &a,
            ld: 2,
            batch_stride: 4,
        },
        Strided {
            data: &a,
            ld: 2,
            batch_stride: 4,
        },
        false,
        StridedMut {
            data: &mut c,
            ld: 2,
            batch_stride: 1,
        },
        1.0,
        false,
        &mut s,
        None,
        Isa::Scalar,
    );
    assert!(matches!(r, Err(KernelError::Invalid(_))));
}

#[test]
fn attention_through_the_table() {
    let pool = ThreadPool::new(2);
    let table = KernelTable::new(Some(&pool));
    let (b, h, s, d) = (1, 3, 20, 8);
    let mut r = Rng::new(9);
    let q = r.vec(b * h * s * d);
    let k = r.vec(b * h * s * d);
    let v = r.vec(b * h * s * d);
    let dims = AttnDims {
        seq_q: s,
        seq_k: s,
        head_dim: d,
        head_dim_v: d,
    };
    let mut scratch = vec![0.0f32; attention_batched_scratch_len(dims, 2)];
    let mut out = vec![0.0f32; b * h * s * d];
    // [B, H, S, D] contiguous heads.
    let args = AttentionArgs {
        batch: b,
        heads: h,
        seq_q: s,
        seq_k: s,
        head_dim: d,
        head_dim_v: d,
        q: q.as_ptr(),
        q_batch_stride: h * s * d,
        q_head_stride: s * d,
        q_row_stride: d,
        k: k.as_ptr(),
        k_batch_stride: h * s * d,
        k_head_stride: s * d,
        k_row_stride: d,
        v: v.as_ptr(),
        v_batch_stride: h * s * d,
        v_head_stride: s * d,
        v_row_stride: d,
        out: out.as_mut_ptr(),
        out_batch_stride: h * s * d,
        out_head_stride: s * d,
        out_row_stride: d,
        mask: std::ptr::null(),
        mask_batch_stride: 0,
        mask_head_stride: 0,
        mask_row_stride: 0,
        scale: 0.35,
        flags: 0,
        scratch: scratch.as_mut_ptr(),
        scratch_len: scratch.len(),
    };
    // SAFETY: args describe the buffers above.
    assert_eq!(unsafe { (table.attention_f32)(&table, &args) }, 0);
    for hi in 0..h {
        let off = hi * s * d;
        for i in 0..s {
            let sc: Vec<f64> = (0..s)
                .map(|j| {
                    0.35 * (0..d)
                        .map(|p| q[off + i * d + p] as f64 * k[off + j * d + p] as f64)
                        .sum::<f64>()
                })
                .collect();
            let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = sc.iter().map(|x| (x - mx).exp()).collect();
            let sum: f64 = e.iter().sum();
            for c in 0..d {
                let want: f64 = (0..s).map(|j| e[j] / sum * v[off + j * d + c] as f64).sum();
                let got = out[off + i * d + c] as f64;
                assert!(
                    (got - want).abs() < 2e-5,
                    "head {hi} row {i} col {c}: {got} vs {want}"
                );
            }
        }
    }
    // A NaN in row 2 of head 1's queries makes that row's probabilities NaN: NaN out without the
    // flag, 0·V = 0 with it (V is finite); every other row is unchanged.
    let mut qn = q.clone();
    qn[s * d + 2 * d] = f32::NAN;
    let plain = out.clone();
    for (flags, want_nan) in [(0u32, true), (ATTN_ZERO_NAN_ROWS, false)] {
        let mut o2 = vec![0.0f32; out.len()];
        let a2 = AttentionArgs {
            q: qn.as_ptr(),
            out: o2.as_mut_ptr(),
            flags,
            ..args
        };
        // SAFETY: as above, with buffers of the same sizes.
        assert_eq!(unsafe { (table.attention_f32)(&table, &a2) }, 0);
        for (i, (&x, &y)) in o2.iter().zip(&plain).enumerate() {
            if i / d == s + 2 {
                assert_eq!(x.is_nan(), want_nan, "flags {flags}: {x}");
                if !want_nan {
                    assert_eq!(x.to_bits(), 0, "flags {flags}: {x}");
                }
            } else {
                assert_eq!(x.to_bits(), y.to_bits(), "flags {flags}, element {i}");
            }
        }
    }
    // Too little scratch is a status, not a crash.
    let small = AttentionArgs {
        scratch_len: 10,
        ..args
    };
    // SAFETY: as above; the call fails validation before touching memory.
    assert_eq!(
        unsafe { (table.attention_f32)(&table, &small) },
        KernelError::ScratchTooSmall { needed: 0, got: 0 }.code()
    );
}

#[test]
fn integer_gemm_through_the_table_matches_safe_api() {
    let pool = ThreadPool::new(2);
    for isa in isas() {
        let table = KernelTable::with_isa(Some(&pool), isa);
        let (m, n, k) = (37, 70, 45);
        let mut r = Rng::new(5);
        let a: Vec<f32> = r.vec(m * k).iter().map(|x| (x * 255.0).round()).collect();
        let w: Vec<f32> = r.vec(n * k).iter().map(|x| (x * 127.0).round()).collect();
        let bias = r.vec(n);
        // The layout this machine's runtime packs a weight of this bound in.
        let layout = kiln_kernels::gemm::int_layout_for(&w, k, n, n, 1);
        let mut packed = vec![0u8; kiln_kernels::gemm::packed_b_int_bytes(k, n, layout)];
        kiln_kernels::gemm::pack_b_int_into(&w, k, n, n, 1, 127, layout, &mut packed).unwrap();
        let epi = Epilogue { bias: bias.as_ptr(), residual: std::ptr::null(), residual_stride: 0, activation: Activation::Relu as u32, scale: 0.25 };
        let mut scratch = vec![0.0f32; kiln_kernels::gemm::gemm_i16_scratch_len(m, k, 2)];
        let mut c_raw = vec![0.0f32; m * n];
        // SAFETY: all operands sized for m, n, k above.
        let st = unsafe {
            (table.gemm_i16)(&table, m, n, k, a.as_ptr(), k, packed.as_ptr(), c_raw.as_mut_ptr(), n, 0, &epi, scratch.as_mut_ptr(), scratch.len())
        };
        assert_eq!(st, 0);
        let mut c_safe = vec![0.0f32; m * n];
        let e = EpilogueRef { bias: Some(&bias), residual: None, activation: Activation::Relu, scale: 0.25 };
        kiln_kernels::gemm::gemm_i16(m, k, n, &a, k, &packed, &mut c_safe, n, false, &e, &mut scratch, None, isa).unwrap();
        assert_eq!(c_raw, c_safe, "{isa:?}");
        // Too little scratch is a status, not a crash.
        // SAFETY: as above, with a shorter scratch length.
        let st = unsafe {
            (table.gemm_i16)(&table, m, n, k, a.as_ptr(), k, packed.as_ptr(), c_raw.as_mut_ptr(), n, 0, &epi, scratch.as_mut_ptr(), 3)
        };
        assert_eq!(st, KernelError::ScratchTooSmall { needed: 0, got: 0 }.code());
    }
}
