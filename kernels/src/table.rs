//! The function table generated code calls through.
//!
//! Generated (Cranelift) code receives a `*const KernelTable` as an entry argument, loads a function
//! pointer at a fixed offset and calls it with `call_indirect` using the **SystemV** calling
//! convention (`CallConv::SystemV` on x86-64 Linux; the entries are `extern "C"`). Every argument is
//! a pointer or `usize` (CLIF `i64`), a `u32` (`i32`) or an `f32`; every fallible entry returns an
//! `i32` status (0 = success, else [`KernelError::code`]). Offsets are `KernelTable::OFF_*`.
//!
//! | entry | CLIF signature (SystemV) |
//! |---|---|
//! | `gemm_f32(table, m, n, k, a, lda, b_packed, c, ldc, accumulate, epilogue, scratch, scratch_len) -> status` | `(i64 ×13) -> i32` |
//! | `gemm_i16(table, m, n, k, a, lda, b_packed_i16, c, ldc, accumulate, epilogue, scratch, scratch_len) -> status` | `(i64 ×13) -> i32` |
//! | `gemm_batched_f32(table, args: *const BatchedGemmArgs) -> status` | `(i64, i64) -> i32` |
//! | `attention_f32(table, args: *const AttentionArgs) -> status` | `(i64, i64) -> i32` |
//! | `pack_b_f32(src, k, n, ldb, transposed, dst)` | `(i64 ×6)` |
//! | `exp_f32` / `erf_f32` / `tanh_f32` / `sigmoid_f32` / `silu_f32` / `gelu_erf_f32` / `gelu_tanh_f32` / `relu_f32` `(x, y, n)` | `(i64, i64, i64)` |
//! | `activation_f32(x, y, n, act: u32) -> status` | `(i64, i64, i64, i32) -> i32` |
//! | `softmax_rows_f32(x, rows, cols, ld)` | `(i64 ×4)` |
//! | `tap_sum_f32(table, args: *const TapSumArgs) -> status` | `(i64, i64) -> i32` |
//! | `max_rows_f32(table, args: *const MaxRowsArgs) -> status` | `(i64, i64) -> i32` |
//!
//! No entry allocates, spawns or panics (a panic could not unwind through `extern "C"`).

use crate::attention::{attention_batched_raw, AttentionArgs};
use crate::error::KernelError;
use crate::gemm::{
    gemm_batched_raw, gemm_i16_raw, gemm_raw, pack_b_raw, BatchedGemmArgs, Epilogue, GemmDesc, Split,
};
use crate::math::{map_raw, softmax_rows_raw, Activation, Unary};
use crate::rowmax::{max_rows_raw, MaxRowsArgs};
use crate::taps::{tap_sum_raw, TapSumArgs};
use crate::threadpool::ThreadPool;
use crate::{effective_isa, Isa};
use std::mem::offset_of;

/// Version of the table layout and entry semantics; generated code may check it.
/// 2: `AttentionArgs::flags` (was padding) carries `ATTN_ZERO_NAN_ROWS`.
/// 3: the GEMM epilogue's activation code 7, `Activation::Relu6`.
/// 4: the GEMM epilogue's `GATED` bit: `(acc + bias) · act(residual)`.
/// 5: the `gemm_i16` entry (integer operands, exact sums).
/// 6: the `tap_sum_f32` entry (per-channel weighted sums of shifted rows).
/// 7: `gemm_i16`'s packed B starts with a header naming its layout (i16 pairs or byte quads,
///    `gemm::int_b`); its A scratch covers the byte-quad packing; the `max_rows_f32` entry.
pub const KERNEL_ABI_VERSION: u32 = 7;

/// A GEMM entry whose packed B holds `B` elements: `(table, m, n, k, a, lda, b_packed, c, ldc,
/// accumulate, epilogue, scratch, scratch_len) -> status`.
pub type GemmFnOf<B> = unsafe extern "C" fn(
    *const KernelTable,
    usize,
    usize,
    usize,
    *const f32,
    usize,
    *const B,
    *mut f32,
    usize,
    usize,
    *const Epilogue,
    *mut f32,
    usize,
) -> i32;
/// `gemm_f32`: `C[m×n] = epilogue(scale·A·B (+ C if accumulate != 0))`, see [`raw_gemm_f32`].
pub type GemmFn = GemmFnOf<f32>;
/// `gemm_i16`: [`GemmFn`]'s arguments with B packed by [`crate::gemm::pack_b_int_into`], see
/// [`raw_gemm_i16`].
pub type GemmI16Fn = GemmFnOf<u8>;
/// `gemm_batched_f32(table, args)`.
pub type BatchedGemmFn = unsafe extern "C" fn(*const KernelTable, *const BatchedGemmArgs) -> i32;
/// `attention_f32(table, args)`.
pub type AttentionFn = unsafe extern "C" fn(*const KernelTable, *const AttentionArgs) -> i32;
/// `pack_b_f32(src, k, n, ldb, transposed, dst)`.
pub type PackBFn = unsafe extern "C" fn(*const f32, usize, usize, usize, usize, *mut f32);
/// Elementwise `y[i] = f(x[i])`, `x == y` allowed.
pub type UnaryFn = unsafe extern "C" fn(*const f32, *mut f32, usize);
/// `activation_f32(x, y, n, act) -> status`.
pub type ActivationFn = unsafe extern "C" fn(*const f32, *mut f32, usize, u32) -> i32;
/// `softmax_rows_f32(x, rows, cols, ld)`, in place.
pub type SoftmaxRowsFn = unsafe extern "C" fn(*mut f32, usize, usize, usize);
/// `tap_sum_f32(table, args) -> status`, see [`crate::taps`].
pub type TapSumFn = unsafe extern "C" fn(*const KernelTable, *const TapSumArgs) -> i32;
/// `max_rows_f32(table, args) -> status`, see [`crate::rowmax`].
pub type MaxRowsFn = unsafe extern "C" fn(*const KernelTable, *const MaxRowsArgs) -> i32;

/// The table (C layout). Build it with [`KernelTable::new`]; it holds a raw pointer to the pool,
/// which must outlive every call made through the table.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KernelTable {
    /// [`KERNEL_ABI_VERSION`].
    pub abi_version: u32,
    /// ISA the kernels use: 0 = scalar, 1 = AVX2+FMA, 2 = AVX-512 (AVX2 kernels + AVX-512 GEMM tile).
    pub isa: u32,
    /// Thread pool for GEMM and attention, or null for single-threaded.
    pub pool: *const ThreadPool,
    pub gemm_f32: GemmFn,
    pub gemm_batched_f32: BatchedGemmFn,
    pub attention_f32: AttentionFn,
    pub pack_b_f32: PackBFn,
    pub exp_f32: UnaryFn,
    pub erf_f32: UnaryFn,
    pub tanh_f32: UnaryFn,
    pub sigmoid_f32: UnaryFn,
    pub silu_f32: UnaryFn,
    pub gelu_erf_f32: UnaryFn,
    pub gelu_tanh_f32: UnaryFn,
    pub relu_f32: UnaryFn,
    pub activation_f32: ActivationFn,
    pub softmax_rows_f32: SoftmaxRowsFn,
    pub gemm_i16: GemmI16Fn,
    pub tap_sum_f32: TapSumFn,
    pub max_rows_f32: MaxRowsFn,
}

// SAFETY: the table is immutable data: function pointers plus a pointer to a `Sync` pool.
unsafe impl Send for KernelTable {}
// SAFETY: as above.
unsafe impl Sync for KernelTable {}

impl KernelTable {
    pub const OFF_ABI_VERSION: usize = offset_of!(KernelTable, abi_version);
    pub const OFF_ISA: usize = offset_of!(KernelTable, isa);
    pub const OFF_POOL: usize = offset_of!(KernelTable, pool);
    pub const OFF_GEMM_F32: usize = offset_of!(KernelTable, gemm_f32);
    pub const OFF_GEMM_I16: usize = offset_of!(KernelTable, gemm_i16);
    pub const OFF_GEMM_BATCHED_F32: usize = offset_of!(KernelTable, gemm_batched_f32);
    pub const OFF_ATTENTION_F32: usize = offset_of!(KernelTable, attention_f32);
    pub const OFF_PACK_B_F32: usize = offset_of!(KernelTable, pack_b_f32);
    pub const OFF_EXP_F32: usize = offset_of!(KernelTable, exp_f32);
    pub const OFF_ERF_F32: usize = offset_of!(KernelTable, erf_f32);
    pub const OFF_TANH_F32: usize = offset_of!(KernelTable, tanh_f32);
    pub const OFF_SIGMOID_F32: usize = offset_of!(KernelTable, sigmoid_f32);
    pub const OFF_SILU_F32: usize = offset_of!(KernelTable, silu_f32);
    pub const OFF_GELU_ERF_F32: usize = offset_of!(KernelTable, gelu_erf_f32);
    pub const OFF_GELU_TANH_F32: usize = offset_of!(KernelTable, gelu_tanh_f32);
    pub const OFF_RELU_F32: usize = offset_of!(KernelTable, relu_f32);
    pub const OFF_ACTIVATION_F32: usize = offset_of!(KernelTable, activation_f32);
    pub const OFF_SOFTMAX_ROWS_F32: usize = offset_of!(KernelTable, softmax_rows_f32);
    pub const OFF_TAP_SUM_F32: usize = offset_of!(KernelTable, tap_sum_f32);
    pub const OFF_MAX_ROWS_F32: usize = offset_of!(KernelTable, max_rows_f32);

    /// A table using the best ISA of this machine and `pool` (None = single-threaded). The pool must
    /// outlive every call through the table.
    pub fn new(pool: Option<&ThreadPool>) -> KernelTable {
        KernelTable::with_isa(pool, crate::detect_isa())
    }

    /// A table forced to `isa` (`Isa::Scalar` for the portable path; AVX2 falls back to scalar on
    /// machines without it).
    pub fn with_isa(pool: Option<&ThreadPool>, isa: Isa) -> KernelTable {
        let isa = effective_isa(isa);
        KernelTable {
            abi_version: KERNEL_ABI_VERSION,
            isa: match isa {
                Isa::Scalar => 0,
                Isa::Avx2Fma => 1,
                Isa::Avx512 => 2,
            },
            pool: pool.map_or(std::ptr::null(), |p| p as *const ThreadPool),
            gemm_f32: raw_gemm_f32,
            gemm_i16: raw_gemm_i16,
            gemm_batched_f32: raw_gemm_batched_f32,
            attention_f32: raw_attention_f32,
            pack_b_f32: raw_pack_b_f32,
            exp_f32: raw_exp_f32,
            erf_f32: raw_erf_f32,
            tanh_f32: raw_tanh_f32,
            sigmoid_f32: raw_sigmoid_f32,
            silu_f32: raw_silu_f32,
            gelu_erf_f32: raw_gelu_erf_f32,
            gelu_tanh_f32: raw_gelu_tanh_f32,
            relu_f32: raw_relu_f32,
            activation_f32: raw_activation_f32,
            softmax_rows_f32: raw_softmax_rows_f32,
            tap_sum_f32: raw_tap_sum_f32,
            max_rows_f32: raw_max_rows_f32,
        }
    }
}

fn status(r: Result<(), KernelError>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => e.code(),
    }
}

/// Reads the ISA and pool of a table.
///
/// # Safety
/// `table` points to a live `KernelTable` whose pool (if not null) is alive.
unsafe fn context<'a>(
    table: *const KernelTable,
) -> Result<(Isa, Option<&'a ThreadPool>), KernelError> {
    if table.is_null() {
        return Err(KernelError::Invalid("null kernel table"));
    }
    // SAFETY: caller contract.
    let t = unsafe { &*table };
    let isa = match t.isa {
        1 => effective_isa(Isa::Avx2Fma),
        2 => effective_isa(Isa::Avx512),
        _ => Isa::Scalar,
    };
    // SAFETY: caller contract: the pool outlives the call.
    Ok((isa, unsafe { t.pool.as_ref() }))
}

/// GEMM entry of the table.
///
/// `C[m×n] = act(scale·A·B + (accumulate != 0 ? C : 0) + bias) + residual` with the epilogue read
/// from `epi` (null = [`Epilogue::NONE`]). Status 0 on success; 2 when `lda < k` or `ldc < n`
/// (with more than one row), 3 when the scratch cannot hold one thread's A block
/// (`gemm_scratch_len(m, n, k, 1)`), 4 for an unknown activation, 5 for null pointers.
///
/// # Safety
/// `table` as for [`KernelTable::new`]; `a` readable for m rows of k floats at `lda`; `b_packed`
/// readable for `packed_b_len(k, n)` floats in the [`crate::gemm::pack_b`] layout; `c` writable for
/// m rows of n floats at `ldc`; the epilogue's bias (n floats) and residual (m rows of n at its
/// stride) readable and not overlapping C; `scratch` writable for `scratch_len` floats and
/// overlapping nothing else.
pub unsafe extern "C" fn raw_gemm_f32(
    table: *const KernelTable,
    m: usize,
    n: usize,
    k: usize,
    a: *const f32,
    lda: usize,
    b_packed: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: usize,
    epi: *const Epilogue,
    scratch: *mut f32,
    scratch_len: usize,
) -> i32 {
    // SAFETY: caller contract, forwarded.
    status(unsafe {
        gemm_entry(
            table,
            m,
            n,
            k,
            a,
            lda,
            b_packed,
            c,
            ldc,
            accumulate,
            epi,
            scratch,
            scratch_len,
            false,
        )
    })
}

/// Integer GEMM entry: as [`raw_gemm_f32`] with A's f32 values integers in [-32768, 32767]
/// (others converted as `gemm::int16` documents), B packed by
/// [`crate::gemm::pack_b_int_into`] (either layout: its header says which, and its k and n
/// must be the call's), the sums exact (the caller keeps k·max|a|·max|b| < 2^31),
/// and scratch for `gemm_i16_scratch_len(m, k, 1)` floats at least.
///
/// # Safety
/// As [`raw_gemm_f32`], with `b_packed` readable for the `packed_b_int_bytes(k, n, layout)`
/// bytes of the layout its header names.
pub unsafe extern "C" fn raw_gemm_i16(
    table: *const KernelTable,
    m: usize,
    n: usize,
    k: usize,
    a: *const f32,
    lda: usize,
    b_packed: *const u8,
    c: *mut f32,
    ldc: usize,
    accumulate: usize,
    epi: *const Epilogue,
    scratch: *mut f32,
    scratch_len: usize,
) -> i32 {
    // SAFETY: caller contract, forwarded.
    status(unsafe { gemm_entry(table, m, n, k, a, lda, b_packed.cast(), c, ldc, accumulate, epi, scratch, scratch_len, true) })
}

#[allow(clippy::too_many_arguments)]
unsafe fn gemm_entry(
    table: *const KernelTable,
    m: usize,
    n: usize,
    k: usize,
    a: *const f32,
    lda: usize,
    b_packed: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: usize,
    epi: *const Epilogue,
    scratch: *mut f32,
    scratch_len: usize,
    int16: bool,
) -> Result<(), KernelError> {
    // SAFETY: caller contract.
    let (isa, pool) = unsafe { context(table)? };
    if m == 0 || n == 0 {
        return Ok(());
    }
    crate::error::span("a", m, k, lda)?;
    crate::error::span("c", m, n, ldc)?;
    // SAFETY: caller contract: epi is null or points to an Epilogue.
    let e = if epi.is_null() {
        Epilogue::NONE
    } else {
        unsafe { *epi }
    };
    let gated = e.activation & crate::gemm::GATED != 0;
    let act = Activation::from_u32(e.activation & !crate::gemm::GATED)
        .filter(|_| !gated || !e.residual.is_null())
        .ok_or(KernelError::BadActivation(e.activation))?;
    if !e.residual.is_null() {
        crate::error::span("residual", m, n, e.residual_stride)?;
    }
    if c.is_null() || (k > 0 && (a.is_null() || b_packed.is_null() || scratch.is_null())) {
        return Err(KernelError::Invalid("null operand pointer"));
    }
    let d = GemmDesc {
        m,
        n,
        k,
        a,
        lda,
        b: b_packed,
        c,
        ldc,
        accumulate: accumulate != 0,
        epi: e,
        act,
    };
    // SAFETY: operand validity is the caller's contract; strides checked above.
    unsafe {
        if int16 {
            gemm_i16_raw(&d, scratch, scratch_len, pool, isa, crate::gemm::IntTiles::Best)
        } else {
            gemm_raw(&d, scratch, scratch_len, pool, isa, Split::Auto)
        }
    }
}

/// Batched GEMM entry (B packed on the fly), see [`BatchedGemmArgs`].
///
/// # Safety
/// `table` as for [`KernelTable::new`]; `args` points to a `BatchedGemmArgs` whose every item's
/// operands are valid, whose C blocks are pairwise disjoint and disjoint from the inputs, and whose
/// scratch (`scratch_len` floats) overlaps nothing else.
pub unsafe extern "C" fn raw_gemm_batched_f32(
    table: *const KernelTable,
    args: *const BatchedGemmArgs,
) -> i32 {
    // SAFETY: caller contract.
    status(unsafe {
        context(table).and_then(|(isa, pool)| {
            if args.is_null() {
                return Err(KernelError::Invalid("null args"));
            }
            let g = &*args;
            if g.batch > 0 && g.m > 0 && g.n > 0 {
                crate::error::span("a", g.m, g.k, g.lda)?;
                crate::error::span("c", g.m, g.n, g.ldc)?;
                if g.b_transposed != 0 {
                    crate::error::span("b", g.n, g.k, g.ldb)?;
                } else {
                    crate::error::span("b", g.k, g.n, g.ldb)?;
                }
            }
            gemm_batched_raw(g, pool, isa)
        })
    })
}

/// Tap-sum entry of the table ([`crate::taps::tap_sum_raw`] on the calling thread: generated
/// code splits the pixels over tasks). Status 0, or 5 for null arguments or a tap count outside
/// 1..=32.
///
/// # Safety
/// `table` as for [`KernelTable::new`]; `args` as for [`crate::taps::tap_sum_raw`].
pub unsafe extern "C" fn raw_tap_sum_f32(table: *const KernelTable, args: *const TapSumArgs) -> i32 {
    // SAFETY: caller contract.
    status(unsafe {
        context(table).and_then(|(isa, _)| match args.as_ref() {
            None => Err(KernelError::Invalid("null args")),
            Some(a) => tap_sum_raw(a, isa),
        })
    })
}

/// Row-max entry of the table ([`crate::rowmax::max_rows_raw`] on the calling thread:
/// generated code splits the rows over tasks). Status 0, or 5 for null arguments.
///
/// # Safety
/// `table` as for [`KernelTable::new`]; `args` as for [`crate::rowmax::max_rows_raw`].
pub unsafe extern "C" fn raw_max_rows_f32(table: *const KernelTable, args: *const MaxRowsArgs) -> i32 {
    // SAFETY: caller contract.
    status(unsafe {
        context(table).and_then(|(isa, _)| match args.as_ref() {
            None => Err(KernelError::Invalid("null args")),
            Some(a) => max_rows_raw(a, isa),
        })
    })
}

/// Batched attention entry, see [`AttentionArgs`].
///
/// # Safety
/// `table` as for [`KernelTable::new`]; `args` points to an `AttentionArgs` whose heads' operands
/// are valid, whose output heads are pairwise disjoint and disjoint from the inputs, and whose
/// scratch (`scratch_len` floats, at least `attention_scratch_len(dims)`) overlaps nothing else.
pub unsafe extern "C" fn raw_attention_f32(
    table: *const KernelTable,
    args: *const AttentionArgs,
) -> i32 {
    // SAFETY: caller contract.
    status(unsafe {
        context(table).and_then(|(isa, pool)| {
            if args.is_null() {
                return Err(KernelError::Invalid("null args"));
            }
            let g = &*args;
            if g.seq_q > 0 && g.head_dim_v > 0 && g.batch * g.heads > 0 {
                crate::error::span("q", g.seq_q, g.head_dim, g.q_row_stride)?;
                crate::error::span("k", g.seq_k, g.head_dim, g.k_row_stride)?;
                crate::error::span("v", g.seq_k, g.head_dim_v, g.v_row_stride)?;
                crate::error::span("out", g.seq_q, g.head_dim_v, g.out_row_stride)?;
            }
            attention_batched_raw(g, pool, isa)
        })
    })
}

/// Packs B for `gemm_f32` (see [`crate::gemm::pack_b`]; `transposed != 0`: `src` is `[n, k]`).
///
/// # Safety
/// `src` readable over its layout's extent (`ldb ≥ n`, or `ldb ≥ k` when transposed); `dst` writable
/// for `packed_b_len(k, n)` floats; no overlap.
pub unsafe extern "C" fn raw_pack_b_f32(
    src: *const f32,
    k: usize,
    n: usize,
    ldb: usize,
    transposed: usize,
    dst: *mut f32,
) {
    // SAFETY: caller contract.
    unsafe { pack_b_raw(src, k, n, ldb, transposed != 0, dst) }
}

macro_rules! unary_entry {
    ($name:ident, $f:expr, $doc:literal) => {
        #[doc = $doc]
        ///
        /// # Safety
        /// `x` readable and `y` writable for `n` floats; the ranges identical or disjoint.
        pub unsafe extern "C" fn $name(x: *const f32, y: *mut f32, n: usize) {
            // SAFETY: caller contract.
            unsafe { map_raw($f, x, y, n, crate::detect_isa()) }
        }
    };
}

unary_entry!(raw_exp_f32, Unary::Exp, "`y = exp(x)`.");
unary_entry!(raw_erf_f32, Unary::Erf, "`y = erf(x)`.");
unary_entry!(raw_tanh_f32, Unary::Act(Activation::Tanh), "`y = tanh(x)`.");
unary_entry!(
    raw_sigmoid_f32,
    Unary::Act(Activation::Sigmoid),
    "`y = 1/(1+exp(-x))`."
);
unary_entry!(
    raw_silu_f32,
    Unary::Act(Activation::Silu),
    "`y = x·sigmoid(x)`."
);
unary_entry!(
    raw_gelu_erf_f32,
    Unary::Act(Activation::GeluErf),
    "`y = x/2·(1+erf(x/√2))`."
);
unary_entry!(
    raw_gelu_tanh_f32,
    Unary::Act(Activation::GeluTanh),
    "`y = x/2·(1+tanh(√(2/π)(x+0.044715x³)))`."
);
unary_entry!(
    raw_relu_f32,
    Unary::Act(Activation::Relu),
    "`y = max(x, 0)`."
);

/// `y = act(x)` for an [`Activation`] code; status 4 for an unknown code.
///
/// # Safety
/// `x` readable and `y` writable for `n` floats; the ranges identical or disjoint.
pub unsafe extern "C" fn raw_activation_f32(x: *const f32, y: *mut f32, n: usize, act: u32) -> i32 {
    match Activation::from_u32(act) {
        Some(a) => {
            // SAFETY: caller contract.
            unsafe { map_raw(Unary::Act(a), x, y, n, crate::detect_isa()) };
            0
        }
        None => KernelError::BadActivation(act).code(),
    }
}

/// In-place softmax of `rows` rows of `cols` floats at row stride `ld` (fully masked rows become 0).
///
/// # Safety
/// `x` readable and writable over the view.
pub unsafe extern "C" fn raw_softmax_rows_f32(x: *mut f32, rows: usize, cols: usize, ld: usize) {
    // SAFETY: caller contract.
    unsafe { softmax_rows_raw(x, rows, cols, ld, crate::detect_isa()) }
}
