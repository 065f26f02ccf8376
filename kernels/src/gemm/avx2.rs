//! AVX2+FMA versions. `Arch::for_isa` hands these out only after runtime detection.

use super::*;
use crate::math::avx2::tail_mask;
use crate::math::simd;
use std::arch::x86_64::*;

pub(super) const NV: usize = NR / 8;

/// The 6×16 microkernel, instantiated per valid row count so a partial strip (m = 16 =
/// 6 + 6 + 4) does only its rows' FMAs.
///
/// # Safety
/// AVX2+FMA present; `a` holds kc·MR floats (`a_ld` = [`PACKED`]) or mr rows of kc floats at
/// stride `a_ld`, `b` kc·NR floats; `c` writable for mr ≤ MR rows of nr ≤ NR floats at stride
/// ldc.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn kernel(
    kc: usize,
    a: *const f32,
    a_ld: usize,
    b: *const f32,
    b_next: *const f32,
    c: *mut f32,
    ldc: usize,
    alpha: f32,
    beta: bool,
    mr: usize,
    nr: usize,
    pf: (usize, usize),
    post: Option<TilePost>,
) {
    macro_rules! rows {
        ($direct:literal, $post:expr) => {
            // SAFETY (each arm): forwarded; the instance reads rows < mr of A.
            unsafe {
                match mr {
                    1 => kernel_r::<1, $direct, $post>(kc, a, a_ld, b, b_next, c, ldc, alpha, beta, mr, nr, pf, post),
                    2 => kernel_r::<2, $direct, $post>(kc, a, a_ld, b, b_next, c, ldc, alpha, beta, mr, nr, pf, post),
                    3 => kernel_r::<3, $direct, $post>(kc, a, a_ld, b, b_next, c, ldc, alpha, beta, mr, nr, pf, post),
                    4 => kernel_r::<4, $direct, $post>(kc, a, a_ld, b, b_next, c, ldc, alpha, beta, mr, nr, pf, post),
                    5 => kernel_r::<5, $direct, $post>(kc, a, a_ld, b, b_next, c, ldc, alpha, beta, mr, nr, pf, post),
                    _ => kernel_r::<MR, $direct, $post>(kc, a, a_ld, b, b_next, c, ldc, alpha, beta, mr, nr, pf, post),
                }
            }
        };
    }
    // With an epilogue, instances of their own (see `avx512::wide`), and a bias or residual
    // alone ([`LINEAR`]) apart from an activation or a gate.
    let kind = match post {
        None => NO_POST,
        Some(t) if t.act == Activation::None && !t.gated() => LINEAR,
        Some(_) => ACT,
    };
    match (a_ld == PACKED, kind) {
        (true, NO_POST) => rows!(false, NO_POST),
        (true, LINEAR) => rows!(false, LINEAR),
        (true, _) => rows!(false, ACT),
        (false, NO_POST) => rows!(true, NO_POST),
        (false, LINEAR) => rows!(true, LINEAR),
        (false, _) => rows!(true, ACT),
    }
}

/// R ≤ MR rows × 16 columns; A packed, or (`DIRECT`) read from rows at stride `a_ld`.
///
/// # Safety
/// See [`kernel`]; mr ≤ R, and mr == R when `DIRECT`.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel_r<const R: usize, const DIRECT: bool, const POST: u8>(
    kc: usize,
    a: *const f32,
    a_ld: usize,
    b: *const f32,
    b_next: *const f32,
    c: *mut f32,
    ldc: usize,
    alpha: f32,
    beta: bool,
    mr: usize,
    nr: usize,
    pf: (usize, usize),
    post: Option<TilePost>,
) {
    let mut acc = [[_mm256_setzero_ps(); NV]; R];
    let mut ap = a;
    let mut bp = b;
    // One k step: NV loads of B, R broadcasts of A, R·NV FMAs.
    let mut step = |acc: &mut [[__m256; NV]; R]| {
        // SAFETY: kc steps of MR (a packed) or 1 (a direct) and NR (b) floats stay inside the
        // operands.
        unsafe {
            let mut bv = [_mm256_setzero_ps(); NV];
            for (v, bvv) in bv.iter_mut().enumerate() {
                *bvv = _mm256_loadu_ps(bp.add(v * 8));
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*ap.add(if DIRECT { i * a_ld } else { i }));
                for v in 0..NV {
                    row[v] = _mm256_fmadd_ps(av, bv[v], row[v]);
                }
            }
            ap = ap.add(if DIRECT { 1 } else { MR });
            bp = bp.add(NR);
        }
    };
    // The k steps before, inside and after the prefetch slice (`prefetch_stretch`).
    let (p0, p1) = prefetch_stretch(pf, kc);
    for _ in 0..p0 {
        step(&mut acc);
    }
    for p in p0..p1 {
        // Hint only (prefetches never fault): the next panel's B, cold when m is small.
        _mm_prefetch::<_MM_HINT_T0>(b_next.wrapping_add(p * NR).cast());
        step(&mut acc);
    }
    for _ in p1..kc {
        step(&mut acc);
    }
    // SAFETY: forwarded.
    unsafe {
        match POST {
            NO_POST => store_tile::<R, false>(&acc, c, ldc, alpha, beta, mr, nr, None),
            LINEAR => store_tile::<R, false>(&acc, c, ldc, alpha, beta, mr, nr, post),
            _ => {
                // The activation's store walks the rows in a loop (not unrolled: the GELU is
                // long), so the accumulators need a memory home. Handed `acc` itself, the
                // instance made `acc` that home from the start: twelve zero stores before the k
                // loop, queued behind the last tile's stores to C. A spill array written only
                // after the loop leaves `acc` in registers. Zen 3 of 2026-12-07, `gemm_bench`
                // bias+GELU, interleaved: 1024×384·384×1536 73–77% → 78–82% of the peak on 1
                // thread (75–77% → 78–83% on 2), 128×384·384×1536 80–83% → 83–85%; MiniLM
                // 8×128 with the bias instances above, old and new run by run in one process,
                // lower quartile 141.7 → 136.6 and 143.9 → 138.5 ms.
                // (SAFETY: all R·NV vectors are written before the array is read.)
                let mut spill = std::mem::MaybeUninit::<[[__m256; NV]; R]>::uninit();
                let sp = spill.as_mut_ptr().cast::<__m256>();
                for (i, row) in acc.iter().enumerate() {
                    for (v, &x) in row.iter().enumerate() {
                        _mm256_storeu_ps(sp.add(i * NV + v).cast(), x);
                    }
                }
                store_tile::<R, true>(spill.assume_init_ref(), c, ldc, alpha, beta, mr, nr, post)
            }
        }
    }
}

/// [`kernel_r`]'s epilogue kinds: none, a bias and/or residual only, any activation or a gate.
///
/// A bias or residual alone has instances of its own, without the activations' code: with it,
/// the instance kept its accumulators in a stack array (zeroed before the k loop, spilled after
/// it), and those stores queued behind the tile's stores to C, cold lines in a model. Measured on
/// the Zen 3 of 2026-12-07 (`gemm_bench EPI=bias`, interleaved bursts, 1 thread): a bias cost
/// 4–10% over no epilogue at 128×384·384×384, 128×384·384×1536 and 1024×384·384×1536, 1–2%
/// with these instances (2 threads, 1024×384·384×1536: 80–86% → 88–89% of the peak). MiniLM
/// runs a bias or a bias and residual on every GEMM but FFN-up's. A GELU-only instance measured
/// level: not kept.
const NO_POST: u8 = 0;
const LINEAR: u8 = 1;
const ACT: u8 = 2;

/// Stores an accumulator tile: C = post(alpha·acc (+ C if beta)), valid part mr×nr only; the
/// activation and gate compiled in only with `ACT` (without, `post` must have neither: see
/// [`LINEAR`]).
///
/// # Safety
/// AVX2 present; `c` writable for mr rows of nr floats at stride ldc.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn store_tile<const R: usize, const ACT: bool>(
    acc: &[[__m256; NV]; R],
    c: *mut f32,
    ldc: usize,
    alpha: f32,
    beta: bool,
    mr: usize,
    nr: usize,
    post: Option<TilePost>,
) {
    debug_assert!(ACT || post.is_none_or(|t| t.act == Activation::None && !t.gated()), "an activation in a store compiled without one");
    let alpha_v = _mm256_set1_ps(alpha);
    // alpha = 1 (every GEMM but attention's scaled products): x·1 = x, one multiply fewer per vector.
    let unit = alpha == 1.0;
    if mr == R && nr == NR {
        // Scale mode: 0 plain (alpha = 1), 1 scaled, 2 scaled and added to C.
        let mode = if beta { 2 } else if unit { 0 } else { 1 };
        // With an activation or a gate, the whole epilogue runs on the accumulators a row at a
        // time (`act_rows`); otherwise its linear part (bias, residual) is applied in registers
        // as the accumulators are stored.
        if let Some(t) = post.filter(|t| ACT && (t.act != Activation::None || t.gated())) {
            // SAFETY: forwarded (a full tile).
            unsafe {
                match mode {
                    0 => act_rows::<R, 0>(acc, c, ldc, alpha_v, t),
                    1 => act_rows::<R, 1>(acc, c, ldc, alpha_v, t),
                    _ => act_rows::<R, 2>(acc, c, ldc, alpha_v, t),
                }
            }
            return;
        }
        // What the store applies is settled once per tile, not per vector: bias at column 0 of
        // the tile, the residual's row 0 and its stride (rows below at `+ i·stride`).
        let (bias, res, rs) = match post {
            // SAFETY: operands of the tile's row 0 (the caller's contract).
            Some(t) => {
                let (b, r) = unsafe { t.operands(0, 0) };
                (b, r, t.epi.residual_stride)
            }
            None => (std::ptr::null(), std::ptr::null(), 0),
        };
        macro_rules! full {
            ($scale:literal, $bias:literal) => {
                // SAFETY: forwarded (a full tile; bias and residual cover it when not null).
                unsafe {
                    if res.is_null() {
                        store_full::<R, $scale, $bias, false>(acc, c, ldc, alpha_v, bias, res, rs)
                    } else {
                        store_full::<R, $scale, $bias, true>(acc, c, ldc, alpha_v, bias, res, rs)
                    }
                }
            };
        }
        match (mode, !bias.is_null()) {
            (0, false) => full!(0, false),
            (0, true) => full!(0, true),
            (1, false) => full!(1, false),
            (1, true) => full!(1, true),
            (_, false) => full!(2, false),
            (_, true) => full!(2, true),
        }
    } else {
        // Spill with constant indices (keeps `acc` in registers in the loop above), then
        // store the valid part with masks.
        let mut tile = [0.0f32; MR * NR];
        for (i, row) in acc.iter().enumerate() {
            for (v, &x) in row.iter().enumerate() {
                // SAFETY: i*NR + v*8 + 8 <= MR*NR.
                unsafe { _mm256_storeu_ps(tile.as_mut_ptr().add(i * NR + v * 8), x) };
            }
        }
        for i in 0..mr {
            let mut col = 0;
            while col < nr {
                let m = tail_mask(nr - col);
                // SAFETY: masked lanes cover only columns < nr of row i < mr.
                unsafe {
                    let p = c.add(i * ldc + col);
                    let x = _mm256_loadu_ps(tile.as_ptr().add(i * NR + col));
                    let mut r = if beta {
                        _mm256_fmadd_ps(x, alpha_v, _mm256_maskload_ps(p, m))
                    } else if unit {
                        x
                    } else {
                        _mm256_mul_ps(x, alpha_v)
                    };
                    if let Some(t) = post {
                        let (act, gated) = if ACT { (t.act, t.gated()) } else { (Activation::None, false) };
                        r = post8::<true, 1>([r], m, [t.operands(i, col)], act, gated)[0];
                    }
                    _mm256_maskstore_ps(p, m, r);
                }
                col += 8;
            }
        }
    }
}

/// The full tile's store with what it applies fixed at compile time: `SCALE` 0 stores the
/// accumulator, 1 `alpha·acc`, 2 `alpha·acc + C`; then `+ bias` (`BIAS`) and `+ residual` (`RES`;
/// row i at `res + i·rs`). The per-tile choice among these (in [`store_tile`]) replaces tests per
/// vector: with them the row loop was not unrolled, so the accumulators went to the stack after
/// the k loop and every vector paid about twenty scalar instructions and branches. Measured on
/// the Zen 3 of 2026-12-07: a bias over the plain GEMM (`gemm_bench`, 1 thread) 4.1–5.3% →
/// -1.7–0.7% at 128×384·384×384; and attention at 512 tokens with its mask tried as the Q·Kᵀ
/// tiles' residual (k = 32, so the store weighs) 7.16 ms with the per-vector tests, 5.98–6.02
/// ms with this store, 5.92 with the mask in the softmax's pass as it stays. The same operations
/// in the same order as before: the same bits.
///
/// # Safety
/// AVX2+FMA present; `c` writable for R rows of NR floats at stride ldc; `bias` (when `BIAS`)
/// readable for NR floats, `res` (when `RES`) for R rows of NR floats at stride `rs`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn store_full<const R: usize, const SCALE: u8, const BIAS: bool, const RES: bool>(
    acc: &[[__m256; NV]; R],
    c: *mut f32,
    ldc: usize,
    alpha_v: __m256,
    bias: *const f32,
    res: *const f32,
    rs: usize,
) {
    for (i, row) in acc.iter().enumerate() {
        for (v, &x) in row.iter().enumerate() {
            // SAFETY: row i < R, columns v*8..v*8+8 <= NR (the caller's contract).
            unsafe {
                let p = c.add(i * ldc + v * 8);
                let mut r = scaled::<SCALE>(x, alpha_v, p);
                if BIAS {
                    r = _mm256_add_ps(r, _mm256_loadu_ps(bias.add(v * 8)));
                }
                if RES {
                    r = _mm256_add_ps(r, _mm256_loadu_ps(res.add(i * rs + v * 8)));
                }
                _mm256_storeu_ps(p, r);
            }
        }
    }
}

/// One accumulator vector as the store takes it: `SCALE` 0 as it is, 1 `alpha·acc`, 2
/// `alpha·acc + C` (C's 8 floats at `p`).
///
/// # Safety
/// AVX2+FMA present; `p` readable for 8 floats when `SCALE` is 2.
#[inline(always)]
unsafe fn scaled<const SCALE: u8>(x: __m256, alpha_v: __m256, p: *const f32) -> __m256 {
    // SAFETY: the caller's contract.
    unsafe {
        match SCALE {
            0 => x,
            1 => _mm256_mul_ps(x, alpha_v),
            _ => _mm256_fmadd_ps(x, alpha_v, _mm256_loadu_ps(p)),
        }
    }
}

/// A full tile's store with an activation or a gate: each row's NV accumulators scaled as
/// [`store_full`] scales them, then [`post8`] (bias, activation, residual or gate) side by side,
/// then stored once. Per element the operations and order of the separate pass: the same bits.
///
/// Until 2026-12-07 the tile was stored with its linear part and then reloaded a row at a time
/// for the activation (one pass had been measured slower on the Xeon of 2026-12-06: the
/// accumulators went through memory for every tile with a bias, which this path leaves to
/// `store_full`). Reloading cost a cheap activation most of its time: on the Zen 3 of
/// 2026-12-07, 1 thread, 128×384·384×1536 + bias (B packed, C warm), ReLU cost 2.4% over no
/// activation as two passes and 0.3% this way; with the GELU (erf) 84.5 -> 86.1 GFLOP/s; in
/// MiniLM's chained GEMMs on 2 threads (`chain_gemms`, alternated in one process, C prefetched
/// in both: see the README's not-kept list) FFN-up + GELU -1.4% (best pass) at 128 tokens and
/// -1 to -2% at 1024.
///
/// # Safety
/// AVX2+FMA present; `c` writable (and readable when `SCALE` is 2) for R rows of NR floats at
/// stride ldc; the epilogue operands as in [`store_tile`] for a full tile.
#[inline(always)]
unsafe fn act_rows<const R: usize, const SCALE: u8>(acc: &[[__m256; NV]; R], c: *mut f32, ldc: usize, alpha_v: __m256, t: TilePost) {
    for (i, row) in acc.iter().enumerate() {
        // SAFETY: the caller's contract; columns w*8..w*8+8 <= NR of row i < R.
        unsafe {
            let mut v = [_mm256_setzero_ps(); NV];
            let mut ops = [(std::ptr::null(), std::ptr::null()); NV];
            for w in 0..NV {
                v[w] = scaled::<SCALE>(row[w], alpha_v, c.add(i * ldc + w * 8));
                ops[w] = t.operands(i, w * 8);
            }
            let v = post8::<false, NV>(v, _mm256_set1_epi32(-1), ops, t.act, t.gated());
            for (w, &x) in v.iter().enumerate() {
                _mm256_storeu_ps(c.add(i * ldc + w * 8), x);
            }
        }
    }
}

/// Packs mc rows × kc columns of A into MR-row strips, k-major, zero-padded to a multiple of MR rows.
///
/// # Safety
/// AVX2 present; `a` readable for mc rows of kc floats at stride lda; `dst` writable for
/// ceil(mc/MR)·MR·kc floats.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn pack_a(a: *const f32, lda: usize, mc: usize, kc: usize, _cols: usize, dst: *mut f32) {
    let mut d = dst;
    let mut s = 0;
    while s < mc {
        let mr = MR.min(mc - s);
        if mr == MR {
            // 8 columns at a time: load 8 floats of each of the 6 rows, transpose in registers,
            // write 8 groups of 6.
            let mut p = 0;
            while p + 8 <= kc {
                // SAFETY: rows s..s+6 < mc, columns p..p+8 <= kc; 48 floats written at d.
                unsafe {
                    let r: [__m256; MR] = [
                        _mm256_loadu_ps(a.add(s * lda + p)),
                        _mm256_loadu_ps(a.add((s + 1) * lda + p)),
                        _mm256_loadu_ps(a.add((s + 2) * lda + p)),
                        _mm256_loadu_ps(a.add((s + 3) * lda + p)),
                        _mm256_loadu_ps(a.add((s + 4) * lda + p)),
                        _mm256_loadu_ps(a.add((s + 5) * lda + p)),
                    ];
                    store_strip_columns(r, d);
                    d = d.add(8 * MR);
                }
                p += 8;
            }
            while p < kc {
                for i in 0..MR {
                    // SAFETY: row s+i < mc, column p < kc.
                    unsafe { *d.add(i) = *a.add((s + i) * lda + p) };
                }
                d = d.wrapping_add(MR);
                p += 1;
            }
        } else {
            // The last, partial strip (zero rows past mr): as the portable path packs it.
            // SAFETY: rows s..s+mr < mc of kc floats; one strip of MR·kc floats at d.
            unsafe { super::scalar::pack_a(a.add(s * lda), lda, mr, kc, kc, d) };
            d = d.wrapping_add(MR * kc);
        }
        s += MR;
    }
}

/// Writes 8 columns of a 6-row strip, given as its rows `r` (8 values each), as 8 groups of 6
/// at `d` (k-major: column q at d[6q..6q+6]): transposed in registers, then stored. An 8-float
/// store also writes two floats of column q+1's group, which the next store overwrites; the last
/// column is stored as 4 + 2 floats so nothing past the 48-float block is written. The f32
/// A packing and the i16 one (whose values are pairs in f32 bits) share it.
///
/// # Safety
/// AVX present (inlined into the AVX2 callers); `d` writable for 48 floats.
#[inline(always)]
pub(super) unsafe fn store_strip_columns(r: [__m256; MR], d: *mut f32) {
    // SAFETY: the caller's contract; the stores cover d[0..48].
    unsafe {
        // c[q] = column q = (r0[q], …, r5[q], 0, 0).
        let z = _mm256_setzero_ps();
        let c = transpose8([r[0], r[1], r[2], r[3], r[4], r[5], z, z]);
        for (q, cq) in c.iter().enumerate().take(7) {
            _mm256_storeu_ps(d.add(q * MR), *cq);
        }
        _mm_storeu_ps(d.add(7 * MR), _mm256_castps256_ps128(c[7]));
        _mm_storel_epi64(d.add(7 * MR + 4).cast(), _mm_castps_si128(_mm256_extractf128_ps::<1>(c[7])));
    }
}

/// The 8×8 transpose of eight row vectors: `c[q][i] = r[i][q]` (unpack, shuffle, then 128-bit
/// lane permutes: 24 shuffles, no memory).
///
/// # Safety
/// AVX present (inlined into the AVX2 callers).
#[inline(always)]
unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    // SAFETY: register-only AVX shuffles; the caller's contract puts AVX present.
    unsafe {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(u0, u4),
            _mm256_permute2f128_ps::<0x20>(u1, u5),
            _mm256_permute2f128_ps::<0x20>(u2, u6),
            _mm256_permute2f128_ps::<0x20>(u3, u7),
            _mm256_permute2f128_ps::<0x31>(u0, u4),
            _mm256_permute2f128_ps::<0x31>(u1, u5),
            _mm256_permute2f128_ps::<0x31>(u2, u6),
            _mm256_permute2f128_ps::<0x31>(u3, u7),
        ]
    }
}

/// Packs one full panel from a transposed source: `src` holds NR rows (columns j of B) of k
/// floats at stride ldb; `d[p·NR + jj] = src[jj·ldb + p]`. 8×8 blocks transposed in registers.
///
/// # Safety
/// AVX2 present; `src` readable for NR rows of k floats at stride ldb; `d` writable for k·NR.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn pack_panel_transposed(src: *const f32, k: usize, ldb: usize, d: *mut f32) {
    for jb in 0..NR / 8 {
        let s = src.wrapping_add(jb * 8 * ldb);
        let mut p = 0;
        while p + 8 <= k {
            // SAFETY: rows jb·8..jb·8+8 < NR, columns p..p+8 <= k; 8 floats at 8 rows of d.
            unsafe {
                let r: [__m256; 8] = std::array::from_fn(|q| _mm256_loadu_ps(s.add(q * ldb + p)));
                let c = transpose8(r);
                for (q, cq) in c.iter().enumerate() {
                    _mm256_storeu_ps(d.add((p + q) * NR + jb * 8), *cq);
                }
            }
            p += 8;
        }
        while p < k {
            for q in 0..8 {
                // SAFETY: row jb·8+q < NR, column p < k.
                unsafe { *d.add(p * NR + jb * 8 + q) = *s.add(q * ldb + p) };
            }
            p += 1;
        }
    }
}

/// Bias, activation and residual on one C tile.
///
/// # Safety
/// AVX2+FMA present; `c` is the tile (rows×cols at stride ldc); bias/residual (when set) cover
/// columns col0..col0+cols and rows row0..row0+rows.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn epilogue(
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    row0: usize,
    col0: usize,
    e: &Epilogue,
    act: Activation,
) {
    let all = _mm256_set1_epi32(-1);
    for i in 0..rows {
        // SAFETY (loop): columns j..j+8 (full vectors) or j..cols (masked tail) of row i, inside
        // the tile and the bias/residual extents.
        unsafe {
            let cp = c.add(i * ldc);
            let mut j = 0;
            while j + 8 <= cols {
                let v = post8::<false, 1>([_mm256_loadu_ps(cp.add(j))], all, [e.operands(i, row0, col0 + j)], act, e.gated())[0];
                _mm256_storeu_ps(cp.add(j), v);
                j += 8;
            }
            if j < cols {
                let m = tail_mask(cols - j);
                let v = post8::<true, 1>([_mm256_maskload_ps(cp.add(j), m)], m, [e.operands(i, row0, col0 + j)], act, e.gated())[0];
                _mm256_maskstore_ps(cp.add(j), m, v);
            }
        }
    }
}

/// K vectors of the epilogue: `act(v + bias) + residual`, or `(v + bias) · act(residual)` when
/// `gated` (bias and residual skipped where null), their lanes loaded under `m` when `MASKED`;
/// the K activations side by side (`simd::act_n`). The one definition the separate pass and the
/// tile store share.
///
/// # Safety
/// AVX2+FMA present; `bp`/`rp` null or readable for 8 floats (the lanes of `m` when `MASKED`).
#[inline(always)]
unsafe fn post8<const MASKED: bool, const K: usize>(
    mut v: [__m256; K],
    m: __m256i,
    ops: [(*const f32, *const f32); K],
    act: Activation,
    gated: bool,
) -> [__m256; K] {
    // SAFETY: the caller's contract.
    unsafe {
        for (x, &(bp, _)) in v.iter_mut().zip(&ops) {
            if !bp.is_null() {
                *x = _mm256_add_ps(*x, if MASKED { _mm256_maskload_ps(bp, m) } else { _mm256_loadu_ps(bp) });
            }
        }
        let load = |rp: *const f32| if MASKED { _mm256_maskload_ps(rp, m) } else { _mm256_loadu_ps(rp) };
        if gated {
            // (The raw entry refuses a gate without a residual.)
            let mut g = v;
            for (x, &(_, rp)) in g.iter_mut().zip(&ops) {
                *x = load(rp);
            }
            let g = simd::act_n(act, g);
            for (x, gx) in v.iter_mut().zip(g) {
                *x = _mm256_mul_ps(*x, gx);
            }
            return v;
        }
        v = simd::act_n(act, v);
        for (x, &(_, rp)) in v.iter_mut().zip(&ops) {
            if !rp.is_null() {
                *x = _mm256_add_ps(*x, load(rp));
            }
        }
        v
    }
}
