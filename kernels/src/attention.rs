//! Fused attention for one (batch, head), and a batched driver over batch × heads:
//! `out = softmax(Q·Kᵀ·scale + mask)·V`, computed one block of [`ROW_BLOCK`] query rows at a time,
//! so only `ROW_BLOCK × seq_k` scores ever exist; beyond [`TWO_PASS_MAX_KEYS`] keys also one block
//! of [`KEY_BLOCK`] keys at a time with an online softmax ([`head_blocked`]), so only
//! `ROW_BLOCK × KEY_BLOCK`.
//!
//! Per head: Kᵀ and V are packed once into GEMM B panels (scratch). Per row block:
//! 1. `S = scale·Q_blk·Kᵀ` with the GEMM microkernel (scale folded into the tile store);
//! 2. each score row gets its mask row added in the max pass, then becomes `exp(s - max)` with its
//!    sum (exact two-pass softmax on the row, in L1);
//! 3. `O_blk = P·V` with the microkernel, then each output row is scaled by 1/sum.
//!
//! Padded keys: with one mask row for all queries, keys after the last open one are skipped when
//! their probabilities are provably exactly 0 ([`padded_tail`]), so a short text in a long bucket
//! pays attention for its own length only; the result is that over all keys up to the order in
//! which the softmax sum adds its terms.
//!
//! A fully masked row (all scores -inf) gives an all-zero output row. With
//! [`ATTN_ZERO_NAN_ROWS`] a row whose softmax is NaN (a NaN or +inf score, which makes every
//! probability of the row NaN) has probabilities 0 instead: PyTorch's SDPA export guards its
//! softmax with `Where(IsNaN(p), 0, p)`, and this flag is that guard fused.

use crate::error::check_len;
use crate::gemm::{
    align64, apack_len, even_ranges, gemm_block, pack_b_raw, packed_b_len, Arch, Epilogue, GemmDesc, Taker, MAX_STEAL_TASKS, NR,
};
use crate::math::{exp_shift_sum_raw, scale_raw, Activation};
use crate::threadpool::{scratch_slots, ThreadPool};
use crate::{Isa, KernelError};

/// Query rows per block (a multiple of the microkernel's MR).
pub const ROW_BLOCK: usize = 96;
/// Up to this many keys, attention runs the two-pass softmax over whole score rows
/// ([`head_over_keys`]); beyond, key blocks of [`KEY_BLOCK`] with an online softmax
/// ([`head_blocked`]). Measured (`attn_bench`, 1 thread, Xeon with 2 MiB L2 per core, 12 heads of
/// 32): whole rows 104–106 GF/s at 512–4096 keys but 97 at 8192 (a 3 MiB score block), key blocks
/// 102–104 at every length (the rescaling costs 2–3% while whole rows still fit L2). 2048 keys
/// (768 KiB of scores) keeps whole rows where they fit the smaller L2 of other x86 cores too.
pub const TWO_PASS_MAX_KEYS: usize = 2048;
/// Keys per block of the online softmax: `ROW_BLOCK × KEY_BLOCK` scores (192 KiB) stay in L2.
/// (256 measured 10% slower: the P·V GEMM's k gets short.)
pub const KEY_BLOCK: usize = 512;
const SLACK: usize = 16;

/// Sizes of one attention head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnDims {
    /// Query rows.
    pub seq_q: usize,
    /// Key / value rows.
    pub seq_k: usize,
    /// Q and K width.
    pub head_dim: usize,
    /// V and output width.
    pub head_dim_v: usize,
}

/// Row strides (in floats) of one head's operands. Columns are contiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnStrides {
    pub q: usize,
    pub k: usize,
    pub v: usize,
    pub out: usize,
    /// Mask row stride; 0 broadcasts one mask row (`seq_k` floats) over all query rows.
    pub mask: usize,
}

/// Scratch floats one head (one worker) needs.
pub fn attention_scratch_len(d: AttnDims) -> usize {
    let rb = ROW_BLOCK.min(d.seq_q).max(1);
    let two_pass = packed_b_len(d.head_dim, d.seq_k)
        + packed_b_len(d.seq_k, d.head_dim_v)
        + rb * d.seq_k
        + rb
        + apack_len(rb, d.head_dim.max(d.seq_k))
        + 5 * SLACK;
    // The key-blocked path uses less for scores and more for its row state and P·V block; the
    // two-pass fallback (NaN rows) needs the above.
    let blocked = if d.seq_k > TWO_PASS_MAX_KEYS { rb * d.head_dim_v.next_multiple_of(NR) + 4 * rb + 5 * SLACK } else { 0 };
    two_pass + blocked
}

/// One head in raw form.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeadDesc {
    pub dims: AttnDims,
    pub q: *const f32,
    pub k: *const f32,
    pub v: *const f32,
    /// Null for no mask.
    pub mask: *const f32,
    pub out: *mut f32,
    pub strides: AttnStrides,
    pub scale: f32,
    /// [`ATTN_ZERO_NAN_ROWS`] set.
    pub zero_nan_rows: bool,
}

impl HeadDesc {
    /// The GEMM of `S = scale·Q·Kᵀ` for query rows `r0..r0 + rb` against `keys` packed keys,
    /// score column j written at `c + j` of each row (row stride `ldc`).
    fn scores(&self, r0: usize, rb: usize, keys: usize, kpack: *const f32, c: *mut f32, ldc: usize) -> GemmDesc {
        GemmDesc {
            m: rb,
            n: keys,
            k: self.dims.head_dim,
            a: self.q.wrapping_add(r0 * self.strides.q),
            lda: self.strides.q,
            b: kpack,
            c,
            ldc,
            accumulate: false,
            epi: Epilogue { scale: self.scale, bias: self.folded_mask(), ..Epilogue::NONE },
            act: Activation::None,
        }
    }

    /// Query rows `r0..r0 + n` of this head, as a head of their own (the same keys).
    fn rows(&self, r0: usize, n: usize) -> HeadDesc {
        HeadDesc {
            dims: AttnDims { seq_q: n, ..self.dims },
            q: self.q.wrapping_add(r0 * self.strides.q),
            mask: if self.mask.is_null() { self.mask } else { self.mask.wrapping_add(r0 * self.strides.mask) },
            out: self.out.wrapping_add(r0 * self.strides.out),
            ..*self
        }
    }

    /// A broadcast mask row (`strides.mask == 0`) as the scores GEMM's bias: each score gets its
    /// key's mask value added as the tile stores it (`scale·acc`, then `+ mask`: the two
    /// roundings of a scaled store followed by the softmax pass's addition), so that pass only
    /// reads for the row max instead of adding and storing back. Null otherwise (no mask, or a
    /// row per query, which the softmax pass adds).
    fn folded_mask(&self) -> *const f32 {
        if self.strides.mask == 0 { self.mask } else { std::ptr::null() }
    }

    /// Query row `row`'s mask for keys `k0..`, as the softmax pass adds it: null where there is
    /// none or the scores GEMM added it ([`HeadDesc::folded_mask`]).
    fn pass_mask(&self, row: usize, k0: usize) -> *const f32 {
        if self.mask.is_null() || !self.folded_mask().is_null() {
            std::ptr::null()
        } else {
            self.mask.wrapping_add(row * self.strides.mask + k0)
        }
    }

    /// The GEMM of `O = P·V` for `rb` rows of probabilities over `keys` keys (row stride `ldp`)
    /// against those keys' packed V, into `c` at row stride `ldc`.
    #[allow(clippy::too_many_arguments)]
    fn values(&self, rb: usize, keys: usize, p: *const f32, ldp: usize, vpack: *const f32, c: *mut f32, ldc: usize) -> GemmDesc {
        GemmDesc {
            m: rb,
            n: self.dims.head_dim_v,
            k: keys,
            a: p,
            lda: ldp,
            b: vpack,
            c,
            ldc,
            accumulate: false,
            epi: Epilogue::NONE,
            act: Activation::None,
        }
    }
}

/// [`AttentionArgs::flags`] bit: a row whose probabilities are NaN uses probabilities 0.
pub const ATTN_ZERO_NAN_ROWS: u32 = 1;

/// Runs one head on the calling thread: its row units ([`ROW_BLOCK`] query rows each) in order.
///
/// # Safety
/// Q: seq_q rows × head_dim at strides.q; K: seq_k × head_dim at strides.k; V: seq_k × head_dim_v at
/// strides.v; out: seq_q × head_dim_v at strides.out (writable, disjoint from the inputs); mask (if
/// not null): seq_k floats per row, seq_q rows at strides.mask (or one row when 0); `scratch`
/// writable for `attention_scratch_len(dims)` floats, disjoint from everything else.
pub(crate) unsafe fn attention_head_raw(h: &HeadDesc, scratch: *mut f32, arch: &Arch, isa: Isa) {
    let mut cache = HeadCache::new();
    for u in 0..row_units(h.dims.seq_q) {
        // SAFETY: forwarded.
        unsafe { attention_unit(h, 0, u, scratch, arch, isa, &mut cache) };
    }
}

/// Row units of a head with `seq_q` query rows: [`ROW_BLOCK`] rows each, the last one shorter.
///
/// A unit is what a thread runs at once, and what every decision about the keys is made for
/// (padded keys skipped or not, the fallbacks): its result depends on its own rows only, never on
/// which thread runs it or what ran before, so any split of the units gives the same bits. A head
/// was the unit until 2026-12-07 (fifteenth session): at MiniLM 1×512 — 12 heads of 0.5 ms on one
/// thread, 6 a thread — the thread finishing first waited 0.13–0.19 ms of each layer's 3.4 ms
/// attention for the other's last head (0.23–0.29 ms on a busy host); a unit is a sixth of that head.
/// Measured there (`kiln bench --profile`, 2 threads, heads and units in alternate processes, a
/// host busy at times): the attention's waits 0.74, 1.66, 1.74, 1.96 → 0.48, 0.41, 0.72, 0.75 ms
/// per run, its time 20.7, 22.8, 27.2, 29.0 → 20.0, 21.4, 26.2, 26.1 ms.
pub(crate) fn row_units(seq_q: usize) -> usize {
    seq_q.div_ceil(ROW_BLOCK)
}

/// What one worker's scratch holds between the units it runs: the head they belong to (an index
/// of the caller's), that head's keys-side padding facts, and which keys of its K and V are
/// packed, in which layout. Units of one head in a row reuse them.
pub(crate) struct HeadCache {
    head: usize,
    key_tail: Option<Option<KeyTail>>,
    /// Keys packed, and whether in the key-blocked layout ([`head_blocked`]).
    packed: Option<(usize, bool)>,
}

impl HeadCache {
    pub(crate) const fn new() -> HeadCache {
        HeadCache { head: usize::MAX, key_tail: None, packed: None }
    }

    /// Forgets what it holds unless it is head `head`'s.
    fn enter(&mut self, head: usize) {
        if self.head != head {
            *self = HeadCache { head, ..HeadCache::new() };
        }
    }
}

/// Runs row unit `u` of head `h` (numbered `head` for `cache`) on the calling thread.
///
/// # Safety
/// As [`attention_head_raw`]; `u < row_units(seq_q)`; `cache` used only with this `scratch`, and
/// `head` names one head (the same operands) for it.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn attention_unit(h: &HeadDesc, head: usize, u: usize, scratch: *mut f32, arch: &Arch, isa: Isa, cache: &mut HeadCache) {
    let r0 = u * ROW_BLOCK;
    let sub = h.rows(r0, ROW_BLOCK.min(h.dims.seq_q - r0));
    cache.enter(head);
    // SAFETY: the head's K, V and mask (the caller's contract).
    let key_tail = *cache.key_tail.get_or_insert_with(|| unsafe { key_tail(h) });
    // Keys 0..keys, by key blocks when there are more than TWO_PASS_MAX_KEYS of them.
    let run = |keys: usize, upper: Option<f64>, packed: &mut Option<(usize, bool)>| {
        // SAFETY (all calls here): the caller's contract, forwarded (`sub` is rows of `h`);
        // keys <= seq_k.
        if keys > TWO_PASS_MAX_KEYS {
            unsafe { head_blocked(&sub, keys, upper, scratch, arch, isa, packed) }
        } else if unsafe { head_over_keys(&sub, keys, upper, scratch, arch, isa, packed) } {
            Outcome::Done
        } else {
            Outcome::Unclear
        }
    };
    // SAFETY: the unit's Q rows (the caller's contract).
    if let Some(skip) = key_tail.and_then(|kt| unsafe { padded_tail(&sub, &kt) }) {
        if let Outcome::Done = run(skip.keep, Some(skip.upper), &mut cache.packed) {
            return;
        }
    }
    if let Outcome::Done = run(h.dims.seq_k, None, &mut cache.packed) {
        return;
    }
    // A NaN row in key blocks: the two-pass softmax over whole rows defines what it gives.
    unsafe { head_over_keys(&sub, h.dims.seq_k, None, scratch, arch, isa, &mut cache.packed) };
}

/// How a pass over the keys ended.
enum Outcome {
    Done,
    /// The skipped keys' bound was not clear of a row's max: run all keys.
    Unclear,
    /// A row's scores hold a NaN (or +inf): run the two-pass softmax, which defines that case.
    NanRow,
}

/// Keys at the end that a broadcast mask pads out, and a bound on their scores.
struct PaddedTail {
    /// Keys `0..keep` are computed; `keep..seq_k` are skipped.
    keep: usize,
    /// An upper bound on every skipped key's score, mask included (computed scores, rounding
    /// allowed for).
    upper: f64,
}

/// The keys' side of [`PaddedTail`], the same for every query row of a head.
#[derive(Clone, Copy)]
struct KeyTail {
    keep: usize,
    /// The largest norm of a skipped key.
    kmax: f64,
    /// The largest mask value of a skipped key.
    mtail: f64,
}

/// A mask value at or below this makes a key a candidate for skipping.
const PAD_CANDIDATE: f32 = -1000.0;

/// A row's Euclidean norm, in f32: eight independent sums (the loop vectorizes; f64 made this
/// scan a tenth of a half-padded seq-128 head), relative error under n·2⁻²⁴, inside the bound's
/// 1e-4 margin; an overflow gives inf, and inf refuses the skip.
///
/// # Safety
/// `p` readable for `n` floats.
unsafe fn norm(p: *const f32, n: usize) -> f64 {
    // SAFETY: the caller's contract.
    let row = unsafe { std::slice::from_raw_parts(p, n) };
    let mut acc = [0f32; 8];
    let chunks = row.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().map(|&x| x * x).sum();
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += x * x;
        }
    }
    ((acc.iter().sum::<f32>() + tail) as f64).sqrt()
}

/// Padded keys: with one mask row for all queries (BERT's `[batch, 1, 1, seq]` mask), the keys
/// after the last one the mask leaves open (value > -1000) are skipped when that provably changes
/// nothing: by Cauchy–Schwarz no skipped score exceeds `|scale|·max‖q‖·max‖k‖` plus its mask, and
/// [`head_over_keys`] checks per row that this stays 110 below the row's max, where `exp` is
/// exactly 0. Skipped K and V rows must be finite (a NaN or inf would reach the output through
/// `0·v`). This is the keys' part, once per head: None when nothing can be skipped. Costs
/// O(seq_k·head_dim) against attention's O(seq_q·seq_k·head_dim).
///
/// # Safety
/// As [`attention_head_raw`].
unsafe fn key_tail(h: &HeadDesc) -> Option<KeyTail> {
    let AttnDims { seq_q: _, seq_k: sk, head_dim: d, head_dim_v: dv } = h.dims;
    if h.mask.is_null() || h.strides.mask != 0 || sk == 0 {
        return None;
    }
    // SAFETY: one mask row of sk floats (strides.mask == 0).
    let mask = unsafe { std::slice::from_raw_parts(h.mask, sk) };
    // Open: above the candidate value, or NaN (never skipped).
    let keep = mask.iter().rposition(|&m| m > PAD_CANDIDATE || m.is_nan()).map_or(0, |j| j + 1);
    if keep == 0 || keep == sk {
        return None;
    }
    let mut kmax = 0f64;
    for j in keep..sk {
        // (Each row's norm checked before the max: f64::max would drop a NaN.)
        // SAFETY: rows j < sk of K and V.
        let kn = unsafe { norm(h.k.wrapping_add(j * h.strides.k), d) };
        let v = unsafe { std::slice::from_raw_parts(h.v.wrapping_add(j * h.strides.v), dv) };
        if !kn.is_finite() || v.iter().any(|x| !x.is_finite()) {
            return None;
        }
        kmax = kmax.max(kn);
    }
    let mtail = mask[keep..].iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    Some(KeyTail { keep, kmax, mtail })
}

/// The skip of [`key_tail`] for the query rows of `h` (a unit's): the bound on their scores.
///
/// # Safety
/// As [`attention_head_raw`].
unsafe fn padded_tail(h: &HeadDesc, kt: &KeyTail) -> Option<PaddedTail> {
    // SAFETY: rows i < seq_q of Q.
    let qmax = (0..h.dims.seq_q).map(|i| unsafe { norm(h.q.wrapping_add(i * h.strides.q), h.dims.head_dim) }).fold(0f64, f64::max);
    let bound = (h.scale.abs() as f64) * qmax * kt.kmax;
    // The computed dot product may exceed the exact one by d·eps·‖q‖‖k‖; the mask's addition
    // rounds once more.
    let upper = bound * (1.0 + 1e-4) + kt.mtail * (1.0 - 1e-6);
    (upper.is_finite() || upper == f64::NEG_INFINITY).then_some(PaddedTail { keep: kt.keep, upper })
}

/// Attention of one head over keys `0..keys`. With `skipped_upper` (keys `keys..seq_k` skipped,
/// their scores at most that), returns false as soon as a row's max is not far enough above it
/// for the skipped keys' probabilities to be exactly 0; the caller then runs all keys.
///
/// # Safety
/// As [`attention_head_raw`]; `keys <= seq_k`.
unsafe fn head_over_keys(h: &HeadDesc, keys: usize, skipped_upper: Option<f64>, scratch: *mut f32, arch: &Arch, isa: Isa, packed: &mut Option<(usize, bool)>) -> bool {
    let AttnDims {
        seq_q: sq,
        seq_k: _,
        head_dim: d,
        head_dim_v: dv,
    } = h.dims;
    let sk = keys;
    if sq == 0 || dv == 0 {
        return true;
    }
    let rb_max = ROW_BLOCK.min(sq);
    let kpack = align64(scratch);
    let vpack = align64(kpack.wrapping_add(packed_b_len(d, sk)));
    let s = align64(vpack.wrapping_add(packed_b_len(sk, dv)));
    let inv = align64(s.wrapping_add(rb_max * sk));
    let apack = align64(inv.wrapping_add(rb_max));
    // SAFETY (whole body): the regions above lie inside the scratch extent by construction of
    // attention_scratch_len; operand extents are the caller's contract.
    unsafe {
        if *packed != Some((sk, false)) {
            // Kᵀ as B of S = Q·Kᵀ: B(p, j) = K[j, p], i.e. a transposed [n = sk, k = d] source.
            pack_b_raw(h.k, d, sk, h.strides.k, true, kpack);
            // V as B of O = P·V: [k = sk, n = dv].
            pack_b_raw(h.v, sk, dv, h.strides.v, false, vpack);
            *packed = Some((sk, false));
        }
        let mut r0 = 0;
        while r0 < sq {
            let rb = rb_max.min(sq - r0);
            if sk == 0 {
                // Softmax over nothing: define the output as zeros.
                for i in 0..rb {
                    std::ptr::write_bytes(h.out.add((r0 + i) * h.strides.out), 0, dv);
                }
                r0 += rb;
                continue;
            }
            let sd = h.scores(r0, rb, sk, kpack, s, sk);
            gemm_block(&sd, 0, rb, 0, sk.div_ceil(NR), apack, arch);
            for i in 0..rb {
                let (max, sum) = exp_shift_sum_raw(s.add(i * sk), h.pass_mask(r0 + i, 0), sk, isa);
                if let Some(upper) = skipped_upper {
                    // A skipped key's exp(score - max) is exactly 0 when its score is more than
                    // 104 below the row's max; otherwise (or a NaN max) run all keys.
                    let clear = upper + 110.0 < max as f64;
                    if !clear {
                        return false;
                    }
                }
                *inv.add(i) = if sum == 0.0 { 0.0 } else { 1.0 / sum };
                if h.zero_nan_rows && sum.is_nan() {
                    // Probabilities 0: the row becomes 0·V (NaN only where V is not finite).
                    std::ptr::write_bytes(s.add(i * sk), 0, sk);
                    *inv.add(i) = 1.0;
                }
            }
            let od = h.values(rb, sk, s, sk, vpack, h.out.add(r0 * h.strides.out), h.strides.out);
            gemm_block(&od, 0, rb, 0, dv.div_ceil(NR), apack, arch);
            for i in 0..rb {
                scale_raw(h.out.add((r0 + i) * h.strides.out), dv, *inv.add(i), isa);
            }
            r0 += rb;
        }
    }
    true
}

/// Attention of one head over keys `0..keys` (more than [`TWO_PASS_MAX_KEYS`]) in key blocks of at most
/// `KEY_BLOCK`, with an online softmax (Milakov & Gimelshein 2018, as in FlashAttention): per
/// row block and key block, `S = scale·Q·K_blkᵀ` (+ mask), `P = exp(S - m_blk)` with its row sum
/// (the same exp pass as the two-pass path), `T = P·V_blk`; then each row's running max `m`,
/// sum `l` and output `O` are rescaled to the new max: `O = O·e^(m - m') + T·e^(m_blk - m')`.
/// At the end `O /= l`; a row whose every key is masked (max -inf) is zeros, as in the two-pass
/// path. Only `ROW_BLOCK × KEY_BLOCK` scores exist at a time. `skipped_upper` as in
/// [`head_over_keys`], checked against each row's final max.
///
/// # Safety
/// As [`attention_head_raw`]; `TWO_PASS_MAX_KEYS < keys <= seq_k`.
#[allow(clippy::too_many_arguments)]
unsafe fn head_blocked(h: &HeadDesc, keys: usize, skipped_upper: Option<f64>, scratch: *mut f32, arch: &Arch, isa: Isa, packed: &mut Option<(usize, bool)>) -> Outcome {
    let AttnDims { seq_q: sq, seq_k: _, head_dim: d, head_dim_v: dv } = h.dims;
    let sk = keys;
    if sq == 0 || dv == 0 {
        return Outcome::Done;
    }
    let rb_max = ROW_BLOCK.min(sq);
    // Key blocks of equal size in whole panels (2600 keys: 5 × 448 + 360 rather than
    // 5 × 512 + 40, whose last block would be all overhead).
    let kb = sk.div_ceil(sk.div_ceil(KEY_BLOCK)).next_multiple_of(NR).min(KEY_BLOCK);
    let dvp = dv.next_multiple_of(NR);
    let kpack = align64(scratch);
    let vpack = align64(kpack.wrapping_add(packed_b_len(d, sk)));
    let s = align64(vpack.wrapping_add(packed_b_len(sk, dv)));
    let t = align64(s.wrapping_add(rb_max * kb));
    let run_max = align64(t.wrapping_add(rb_max * dvp));
    let run_sum = run_max.wrapping_add(rb_max);
    let keep_old = run_sum.wrapping_add(rb_max);
    let take_new = keep_old.wrapping_add(rb_max);
    let apack = align64(take_new.wrapping_add(rb_max));
    // SAFETY (whole body): the regions above lie inside the scratch extent by construction of
    // attention_scratch_len (seq_k > TWO_PASS_MAX_KEYS); operand extents are the caller's contract.
    unsafe {
        if *packed != Some((sk, true)) {
            pack_b_raw(h.k, d, sk, h.strides.k, true, kpack);
            // V packed per key block (block k0 at vpack + k0·dvp), so each block is a whole packed B.
            let mut k0 = 0;
            while k0 < sk {
                let n = kb.min(sk - k0);
                pack_b_raw(h.v.add(k0 * h.strides.v), n, dv, h.strides.v, false, vpack.add(k0 * dvp));
                k0 += n;
            }
            *packed = Some((sk, true));
        }
        let mut r0 = 0;
        while r0 < sq {
            let rb = rb_max.min(sq - r0);
            for i in 0..rb {
                *run_max.add(i) = f32::NEG_INFINITY;
                *run_sum.add(i) = 0.0;
                std::ptr::write_bytes(h.out.add((r0 + i) * h.strides.out), 0, dv);
            }
            let mut k0 = 0;
            while k0 < sk {
                let n = kb.min(sk - k0);
                // Scores of keys k0..k0+n: panels k0/NR.., written at s (C column j at s + j - k0).
                let sd = h.scores(r0, rb, sk, kpack, s.wrapping_sub(k0), kb);
                gemm_block(&sd, 0, rb, k0 / NR, (k0 + n).div_ceil(NR), apack, arch);
                for i in 0..rb {
                    let (m_blk, l_blk) = exp_shift_sum_raw(s.add(i * kb), h.pass_mask(r0 + i, k0), n, isa);
                    if m_blk.is_nan() || l_blk.is_nan() {
                        return Outcome::NanRow;
                    }
                    let m_old = *run_max.add(i);
                    let m_new = m_old.max(m_blk);
                    // A -inf max (nothing open yet, or this block all masked) weighs 0.
                    let w = |m: f32| if m == f32::NEG_INFINITY { 0.0 } else { crate::math::exp(m - m_new) };
                    let (a, b) = (w(m_old), w(m_blk));
                    *keep_old.add(i) = a;
                    *take_new.add(i) = b;
                    *run_sum.add(i) = *run_sum.add(i) * a + l_blk * b;
                    *run_max.add(i) = m_new;
                }
                let od = h.values(rb, n, s, kb, vpack.add(k0 * dvp), t, dvp);
                gemm_block(&od, 0, rb, 0, dv.div_ceil(NR), apack, arch);
                for i in 0..rb {
                    let o = std::slice::from_raw_parts_mut(h.out.add((r0 + i) * h.strides.out), dv);
                    let tr = std::slice::from_raw_parts(t.add(i * dvp), dv);
                    let (a, b) = (*keep_old.add(i), *take_new.add(i));
                    for (x, &y) in o.iter_mut().zip(tr) {
                        *x = *x * a + y * b;
                    }
                }
                k0 += n;
            }
            for i in 0..rb {
                let m = *run_max.add(i);
                if let Some(upper) = skipped_upper {
                    // As in head_over_keys: the skipped keys' probabilities must be exactly 0.
                    let clear = upper + 110.0 < m as f64;
                    if !clear {
                        return Outcome::Unclear;
                    }
                }
                let o = h.out.add((r0 + i) * h.strides.out);
                if m == f32::NEG_INFINITY {
                    std::ptr::write_bytes(o, 0, dv);
                } else {
                    scale_raw(o, dv, 1.0 / *run_sum.add(i), isa);
                }
            }
            r0 += rb;
        }
    }
    Outcome::Done
}

/// Elements a row-major view spans (0 when empty), as an error when the stride is too small.
fn view(what: &'static str, rows: usize, cols: usize, ld: usize) -> Result<usize, KernelError> {
    crate::error::span(what, rows, cols, ld)
}

/// Fused attention for one (batch, head): `out = softmax(Q·Kᵀ·scale + mask)·V`.
///
/// `mask` is additive (`-inf` or a large negative value masks a key); with `strides.mask == 0` it is
/// one row of `seq_k` floats for every query. `scratch`: at least [`attention_scratch_len`] floats.
#[allow(clippy::too_many_arguments)]
pub fn attention_f32(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: Option<&[f32]>,
    out: &mut [f32],
    dims: AttnDims,
    strides: AttnStrides,
    scale: f32,
    scratch: &mut [f32],
    isa: Isa,
) -> Result<(), KernelError> {
    let AttnDims {
        seq_q: sq,
        seq_k: sk,
        head_dim: d,
        head_dim_v: dv,
    } = dims;
    check_len("q", q.len(), view("q", sq, d, strides.q)?)?;
    check_len("k", k.len(), view("k", sk, d, strides.k)?)?;
    check_len("v", v.len(), view("v", sk, dv, strides.v)?)?;
    check_len("out", out.len(), view("out", sq, dv, strides.out)?)?;
    if let Some(m) = mask {
        let rows = if strides.mask == 0 { 1 } else { sq };
        check_len(
            "mask",
            m.len(),
            view("mask", rows, sk, strides.mask.max(sk))?,
        )?;
    }
    let need = attention_scratch_len(dims);
    check_len("attention scratch", scratch.len(), need).map_err(|_| {
        KernelError::ScratchTooSmall {
            needed: need,
            got: scratch.len(),
        }
    })?;
    let h = HeadDesc {
        dims,
        q: q.as_ptr(),
        k: k.as_ptr(),
        v: v.as_ptr(),
        mask: mask.map_or(std::ptr::null(), |m| m.as_ptr()),
        out: out.as_mut_ptr(),
        strides,
        scale,
        zero_nan_rows: false,
    };
    // SAFETY: every extent checked above; out and scratch are distinct &mut borrows.
    unsafe { attention_head_raw(&h, scratch.as_mut_ptr(), &Arch::for_isa(isa), isa) };
    Ok(())
}

/// Batched multi-head attention, C ABI layout (`repr(C)`; all fields 8 bytes (CLIF `i64`) except
/// `scale` (f32) and `flags` (u32, [`ATTN_ZERO_NAN_ROWS`])). Head `(b, h)` reads
/// `q + b·q_batch_stride + h·q_head_stride` (seq_q rows at `q_row_stride`), likewise K, V and the
/// mask (null for none; `mask_row_stride == 0` broadcasts one row over the queries; use stride 0 on
/// the head to share one mask across heads) and writes `out + b·out_batch_stride + h·out_head_stride`.
///
/// Offsets in declaration order: batch 0, heads 8, seq_q 16, seq_k 24, head_dim 32, head_dim_v 40,
/// q 48, q_batch_stride 56, q_head_stride 64, q_row_stride 72, k 80, k_batch_stride 88,
/// k_head_stride 96, k_row_stride 104, v 112, v_batch_stride 120, v_head_stride 128,
/// v_row_stride 136, out 144, out_batch_stride 152, out_head_stride 160, out_row_stride 168,
/// mask 176, mask_batch_stride 184, mask_head_stride 192, mask_row_stride 200, scale 208 (f32),
/// flags 212, scratch 216, scratch_len 224; size 232. `tests/table.rs` checks them.
///
/// Scratch: `threads × attention_scratch_len(dims)` floats for `threads` parallel heads.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttentionArgs {
    pub batch: usize,
    pub heads: usize,
    pub seq_q: usize,
    pub seq_k: usize,
    pub head_dim: usize,
    pub head_dim_v: usize,
    pub q: *const f32,
    pub q_batch_stride: usize,
    pub q_head_stride: usize,
    pub q_row_stride: usize,
    pub k: *const f32,
    pub k_batch_stride: usize,
    pub k_head_stride: usize,
    pub k_row_stride: usize,
    pub v: *const f32,
    pub v_batch_stride: usize,
    pub v_head_stride: usize,
    pub v_row_stride: usize,
    pub out: *mut f32,
    pub out_batch_stride: usize,
    pub out_head_stride: usize,
    pub out_row_stride: usize,
    pub mask: *const f32,
    pub mask_batch_stride: usize,
    pub mask_head_stride: usize,
    pub mask_row_stride: usize,
    pub scale: f32,
    pub flags: u32,
    pub scratch: *mut f32,
    pub scratch_len: usize,
}

// SAFETY: shared by the workers of one call, which read Q/K/V/mask, write disjoint output heads and
// use disjoint scratch regions (the raw entry's contract).
unsafe impl Sync for AttentionArgs {}
// SAFETY: as above.
unsafe impl Send for AttentionArgs {}

impl AttentionArgs {
    pub fn dims(&self) -> AttnDims {
        AttnDims {
            seq_q: self.seq_q,
            seq_k: self.seq_k,
            head_dim: self.head_dim,
            head_dim_v: self.head_dim_v,
        }
    }
}

/// Scratch floats for batched attention on `threads` threads.
pub fn attention_batched_scratch_len(dims: AttnDims, threads: usize) -> usize {
    threads.max(1) * attention_scratch_len(dims)
}

/// Raw batched attention.
///
/// # Safety
/// Every head's operands valid as in [`attention_head_raw`]; output heads pairwise disjoint and
/// disjoint from the inputs; scratch writable for `scratch_len` floats and disjoint from the rest.
pub(crate) unsafe fn attention_batched_raw(
    g: &AttentionArgs,
    pool: Option<&ThreadPool>,
    isa: Isa,
) -> Result<(), KernelError> {
    let items = g.batch * g.heads;
    if items == 0 || g.seq_q == 0 || g.head_dim_v == 0 {
        return Ok(());
    }
    let per = attention_scratch_len(g.dims());
    let workers = scratch_slots(g.scratch, g.scratch_len, per, pool)?;
    let arch = Arch::for_isa(isa);
    let sp = g.scratch as usize;
    let g = *g;
    // Item i's head.
    let head = move |item: usize| {
        // (The whole of `g`, which is Sync: not its pointer fields one by one.)
        let g = &g;
        let (b, hd) = (item / g.heads, item % g.heads);
        HeadDesc {
            dims: g.dims(),
            q: g.q
                .wrapping_add(b * g.q_batch_stride + hd * g.q_head_stride),
            k: g.k
                .wrapping_add(b * g.k_batch_stride + hd * g.k_head_stride),
            v: g.v
                .wrapping_add(b * g.v_batch_stride + hd * g.v_head_stride),
            mask: if g.mask.is_null() {
                std::ptr::null()
            } else {
                g.mask
                    .wrapping_add(b * g.mask_batch_stride + hd * g.mask_head_stride)
            },
            out: g
                .out
                .wrapping_add(b * g.out_batch_stride + hd * g.out_head_stride),
            strides: AttnStrides {
                q: g.q_row_stride,
                k: g.k_row_stride,
                v: g.v_row_stride,
                out: g.out_row_stride,
                mask: g.mask_row_stride,
            },
            scale: g.scale,
            zero_nan_rows: g.flags & ATTN_ZERO_NAN_ROWS != 0,
        }
    };
    let per_head = row_units(g.seq_q);
    let scratch_of = |w: usize| (sp as *mut f32).wrapping_add(w * per);
    // Item i whole, on worker w.
    // SAFETY: worker w < workers owns scratch region w; operands per the caller's contract.
    let whole = |item: usize, w: usize| unsafe { attention_head_raw(&head(item), scratch_of(w), &arch, isa) };
    let units = items.saturating_mul(per_head);
    match pool {
        // A scratch region per thread: each thread owns a contiguous range of the (batch, head,
        // row unit) units, runs it from the front — a whole head at a time, four at most — and
        // then takes single units from the back of the others' (`gemm::steal`, as the GEMMs'
        // splits), instead of all threads claiming the next head from one counter. A thread's
        // heads are then neighbours: their Q, K and V columns are adjacent in the rows, which the
        // prefetchers follow, and the two threads do not read the lines around each other's
        // heads. Measured (`attn_bench`, 2 threads, the two ways alternated run by run in one
        // process, best of ~1000) on the AVX2-only Zen 3 of 2026-12-07: 1×128 210.4 → 202.3,
        // 209.9 → 201.8, 209.7 → 201.8 µs for the 12 heads; 8×128 1717 → 1708, 1705 → 1654,
        // 1953 → 1930 µs. A thread taking a unit of a head it has not packed packs that head's
        // K and V (`HeadCache`); each unit is computed as on one thread: the same bits.
        // (Beyond MAX_STEAL_TASKS threads, one counter over whole heads.)
        Some(p) if workers >= p.threads() && p.threads() <= MAX_STEAL_TASKS && (2..=u32::MAX as usize).contains(&units) => {
            let tasks = p.threads().min(units);
            let ranges = even_ranges(units, tasks);
            p.run_indexed(tasks, &|t, w| {
                let mut cache = HeadCache::new();
                let mut taker = Taker { own: t, ranges: &ranges[..tasks], most: 4 * per_head, bite: 1, least: 1 };
                while let Some((a, b)) = taker.take() {
                    for unit in a..b {
                        let item = unit / per_head;
                        // SAFETY: worker w < workers owns scratch region w, and `cache` is this
                        // task's, for that region; operands per the caller's contract.
                        unsafe { attention_unit(&head(item), item, unit % per_head, scratch_of(w), &arch, isa, &mut cache) };
                    }
                }
            });
        }
        Some(p) if workers > 1 => p.run_slots(items, workers, &whole),
        _ => (0..items).for_each(|i| whole(i, 0)),
    }
    Ok(())
}

/// One operand of [`attention_batched`]: data plus batch, head and row strides (columns contiguous).
#[derive(Clone, Copy, Debug)]
pub struct HeadsRef<'a> {
    pub data: &'a [f32],
    pub batch_stride: usize,
    pub head_stride: usize,
    pub row_stride: usize,
}

/// Mutable [`HeadsRef`].
#[derive(Debug)]
pub struct HeadsMut<'a> {
    pub data: &'a mut [f32],
    pub batch_stride: usize,
    pub head_stride: usize,
    pub row_stride: usize,
}

#[allow(clippy::too_many_arguments)]
fn heads_extent(
    what: &'static str,
    batch: usize,
    heads: usize,
    rows: usize,
    cols: usize,
    bs: usize,
    hs: usize,
    rs: usize,
) -> Result<usize, KernelError> {
    if batch == 0 || heads == 0 || rows == 0 || cols == 0 {
        return Ok(0);
    }
    let one = view(what, rows, cols, rs)?;
    (batch - 1)
        .checked_mul(bs)
        .and_then(|x| (heads - 1).checked_mul(hs).and_then(|y| x.checked_add(y)))
        .and_then(|x| x.checked_add(one))
        .ok_or(KernelError::Invalid(
            "attention operand extent overflows usize",
        ))
}

/// Multi-head attention over `batch × heads` heads, spread over `pool`. `mask` (additive) is
/// indexed with its own batch/head/row strides (row stride 0 = one row broadcast over queries).
/// Output heads must not overlap (checked). `scratch`: at least
/// [`attention_batched_scratch_len`]`(dims, 1)` floats; more lets more heads run in parallel.
#[allow(clippy::too_many_arguments)]
pub fn attention_batched(
    batch: usize,
    heads: usize,
    dims: AttnDims,
    q: HeadsRef<'_>,
    k: HeadsRef<'_>,
    v: HeadsRef<'_>,
    mask: Option<HeadsRef<'_>>,
    out: HeadsMut<'_>,
    scale: f32,
    scratch: &mut [f32],
    pool: Option<&ThreadPool>,
    isa: Isa,
) -> Result<(), KernelError> {
    let AttnDims {
        seq_q: sq,
        seq_k: sk,
        head_dim: d,
        head_dim_v: dv,
    } = dims;
    let ext = |w, x: &HeadsRef<'_>, rows, cols| {
        heads_extent(
            w,
            batch,
            heads,
            rows,
            cols,
            x.batch_stride,
            x.head_stride,
            x.row_stride,
        )
    };
    check_len("q", q.data.len(), ext("q", &q, sq, d)?)?;
    check_len("k", k.data.len(), ext("k", &k, sk, d)?)?;
    check_len("v", v.data.len(), ext("v", &v, sk, dv)?)?;
    check_len(
        "out",
        out.data.len(),
        heads_extent(
            "out",
            batch,
            heads,
            sq,
            dv,
            out.batch_stride,
            out.head_stride,
            out.row_stride,
        )?,
    )?;
    if let Some(m) = &mask {
        let rows = if m.row_stride == 0 { 1 } else { sq };
        check_len(
            "mask",
            m.data.len(),
            heads_extent(
                "mask",
                batch,
                heads,
                rows,
                sk,
                m.batch_stride,
                m.head_stride,
                m.row_stride.max(sk),
            )?,
        )?;
    }
    if !crate::gemm::injective(&mut [
        (batch, out.batch_stride),
        (heads, out.head_stride),
        (sq, out.row_stride),
        (dv, 1),
    ]) {
        return Err(KernelError::Invalid("attention: output heads overlap"));
    }
    let m = mask.unwrap_or(HeadsRef {
        data: &[],
        batch_stride: 0,
        head_stride: 0,
        row_stride: 0,
    });
    let args = AttentionArgs {
        batch,
        heads,
        seq_q: sq,
        seq_k: sk,
        head_dim: d,
        head_dim_v: dv,
        q: q.data.as_ptr(),
        q_batch_stride: q.batch_stride,
        q_head_stride: q.head_stride,
        q_row_stride: q.row_stride,
        k: k.data.as_ptr(),
        k_batch_stride: k.batch_stride,
        k_head_stride: k.head_stride,
        k_row_stride: k.row_stride,
        v: v.data.as_ptr(),
        v_batch_stride: v.batch_stride,
        v_head_stride: v.head_stride,
        v_row_stride: v.row_stride,
        out: out.data.as_mut_ptr(),
        out_batch_stride: out.batch_stride,
        out_head_stride: out.head_stride,
        out_row_stride: out.row_stride,
        mask: if mask.is_some() {
            m.data.as_ptr()
        } else {
            std::ptr::null()
        },
        mask_batch_stride: m.batch_stride,
        mask_head_stride: m.head_stride,
        mask_row_stride: m.row_stride,
        scale,
        flags: 0,
        scratch: scratch.as_mut_ptr(),
        scratch_len: scratch.len(),
    };
    // SAFETY: extents and output disjointness checked above; out (&mut) cannot alias the inputs;
    // scratch is a distinct &mut borrow.
    unsafe { attention_batched_raw(&args, pool, isa) }
}
