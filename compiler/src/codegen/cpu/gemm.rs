//! GEMM kernels: calls into the kernel table's AVX2/FMA GEMM (`gemm_f32`) with B pre-packed,
//! or its exact integer GEMM (`gemm_i16`) where the kernel's operands are integers
//! (`KernelOp::Gemm::int_bounds`) and B is a weight packed as i16 pairs
//! ([`WeightPrep::PackedBI16`], see `layout.rs`).
//!
//! - **B**: a weight shared by every batch entry was packed once by the runtime (a
//!   [`WeightPrep::PackedB`](kiln_runtime::cpu::WeightPrep) slot); any other B is packed per
//!   batch entry into scratch with the table's `pack_b_f32` (straight from a row- or
//!   column-major view, or after a strided copy).
//! - **A** is passed in place when it is f32 with unit column stride; otherwise it is copied
//!   dense into scratch first.
//! - **Epilogue**: the common shapes — `act(acc + bias) + residual` with a per-column bias, one
//!   of the table's activations and a row-major residual, or a gated FFN's `(acc + bias) ·
//!   act(gate)` — map onto the microkernel's own epilogue, applied to each register tile while it is hot. A residual that is the output
//!   itself (in place) becomes `accumulate`. Anything else runs the GEMM into scratch, then the
//!   epilogue expression as an elementwise pass.

use cranelift_codegen::ir::types::{F32, I32, I64};
use cranelift_codegen::ir::{InstBuilder, Value};
use kiln_kernels::gemm::{gemm_i16_scratch_len, gemm_scratch_len, packed_b_len};
use kiln_runtime::cpu::WeightPrep;
use kiln_kernels::table::KernelTable;
use kiln_runtime::graph::{BinaryOp, UnaryOp};
use kiln_runtime::DType;

use super::elementwise::{coalesce, emit_map, MapBody, MapView, Part};
use super::emit::{mf, Fx};
use super::expr::emit_expr;
use crate::kernel_ir::{Expr, ExprId, ExprNode, Kernel, BufferView};

// The calls below are emitted for these exact entry signatures (written out here, not taken
// from kiln-kernels' `GemmFnOf`): a change in kiln-kernels must fail to compile here rather than
// be called with the wrong arguments. B's element is f32 (`gemm_f32`) or bytes (`gemm_i16`: a header, then its layout's panels).
type EmittedGemm<B> = unsafe extern "C" fn(
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
    *const kiln_kernels::gemm::Epilogue,
    *mut f32,
    usize,
) -> i32;
const _: EmittedGemm<f32> = kiln_kernels::table::raw_gemm_f32;
const _: EmittedGemm<u8> = kiln_kernels::table::raw_gemm_i16;
const _: kiln_kernels::table::GemmFn = kiln_kernels::table::raw_gemm_f32;
const _: kiln_kernels::table::GemmI16Fn = kiln_kernels::table::raw_gemm_i16;
const _: unsafe extern "C" fn(*const f32, usize, usize, usize, usize, *mut f32) = kiln_kernels::table::raw_pack_b_f32;
const _: () = assert!(std::mem::size_of::<kiln_kernels::gemm::Epilogue>() == 32);
const _: () = assert!(std::mem::offset_of!(kiln_kernels::gemm::Epilogue, bias) == 0);
const _: () = assert!(std::mem::offset_of!(kiln_kernels::gemm::Epilogue, residual) == 8);
const _: () = assert!(std::mem::offset_of!(kiln_kernels::gemm::Epilogue, residual_stride) == 16);
const _: () = assert!(std::mem::offset_of!(kiln_kernels::gemm::Epilogue, activation) == 24);
const _: () = assert!(std::mem::offset_of!(kiln_kernels::gemm::Epilogue, scale) == 28);

/// The microkernel epilogue an expression maps onto.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fused {
    pub bias: Option<usize>,
    /// `kiln_kernels::math::Activation` code.
    pub act: u32,
    pub residual: Option<usize>,
    /// The residual is a gate (`kiln_kernels::gemm::GATED`): `(acc + bias) · act(residual)`.
    pub gated: bool,
    /// A one-element operand multiplying the product (`acc · s`, a dequantization's run-time
    /// `a_scale · b_scale`): the microkernel's `scale`, read when the kernel runs.
    pub scale: Option<usize>,
}

/// Where node `t` is the accumulator, plain (`Some(None)`) or times a one-element load
/// (`Some(Some(l))`).
fn acc_term(e: &Expr, t: ExprId, scalar: &dyn Fn(usize) -> bool) -> Option<Option<usize>> {
    match e.nodes[t as usize] {
        ExprNode::Acc => Some(None),
        ExprNode::Binary(BinaryOp::Mul, a, b) => [(a, b), (b, a)].into_iter().find_map(|(x, y)| match (&e.nodes[x as usize], &e.nodes[y as usize]) {
            (ExprNode::Acc, ExprNode::Load(l)) if scalar(*l) => Some(Some(*l)),
            _ => None,
        }),
        _ => None,
    }
}

/// The add terms of node `id` as exactly one accumulator term (plain or scaled: its scale
/// operand) plus loads; `None` where any other term or a second accumulator appears.
fn acc_plus_loads(e: &Expr, id: ExprId, scalar: &dyn Fn(usize) -> bool) -> Option<(Option<usize>, Vec<usize>)> {
    let mut terms = Vec::new();
    add_terms(e, id, &mut terms);
    let (mut acc, mut loads) = (None, Vec::new());
    for t in terms {
        match (acc_term(e, t, scalar), &e.nodes[t as usize]) {
            (Some(s), _) if acc.is_none() => acc = Some(s),
            (None, ExprNode::Load(l)) => loads.push(*l),
            _ => return None,
        }
    }
    Some((acc?, loads))
}

fn activation(op: UnaryOp) -> Option<u32> {
    use kiln_kernels::math::Activation;
    Some(match op {
        UnaryOp::Relu => Activation::Relu,
        UnaryOp::Gelu => Activation::GeluErf,
        UnaryOp::GeluTanh => Activation::GeluTanh,
        UnaryOp::Tanh => Activation::Tanh,
        UnaryOp::Silu => Activation::Silu,
        _ => return None,
    } as u32)
}

/// `x` where node `id` is `min(max(x, 0), 6)` (either operand order): ONNX `Clip(x, 0, 6)` as
/// imported, the microkernel's ReLU6 (kiln's graph Max and Min are symmetric).
fn relu6_of(e: &Expr, id: ExprId) -> Option<ExprId> {
    let is_const = |i: ExprId, v: f32| matches!(e.nodes[i as usize], ExprNode::Const(c) if c == v && c.is_sign_positive());
    let other = |a: ExprId, b: ExprId, v: f32| {
        if is_const(b, v) {
            Some(a)
        } else if is_const(a, v) {
            Some(b)
        } else {
            None
        }
    };
    let ExprNode::Binary(BinaryOp::Min, a, b) = e.nodes[id as usize] else { return None };
    let m = other(a, b, 6.0)?;
    let ExprNode::Binary(BinaryOp::Max, c, d) = e.nodes[m as usize] else { return None };
    other(c, d, 0.0)
}

/// Operands of a tree of `Add`s rooted at `id`.
fn add_terms(e: &Expr, id: ExprId, out: &mut Vec<ExprId>) {
    match &e.nodes[id as usize] {
        ExprNode::Binary(BinaryOp::Add, a, b) => {
            add_terms(e, *a, out);
            add_terms(e, *b, out);
        }
        _ => out.push(id),
    }
}

/// How an epilogue load is laid out over the (m, n) tile.
#[derive(PartialEq)]
enum Operand {
    /// Per column: row stride 0, unit column stride.
    Bias,
    /// Row-major with unit column stride.
    Full,
    Other,
}

fn operand_kind(t: &BufferView, m: usize, n: usize, dt: DType) -> Operand {
    let r = t.rank();
    let (rs, cs) = (t.strides[r - 2], t.strides[r - 1]);
    if dt != DType::F32 || !(cs == 1 || n == 1) {
        return Operand::Other;
    }
    if rs == 0 || m == 1 {
        if m == 1 && rs != 0 {
            return Operand::Full;
        }
        return Operand::Bias;
    }
    if rs >= n {
        Operand::Full
    } else {
        Operand::Other
    }
}

/// `act(g)` of a load g at node `id`: the activation's code and the load. SiLU also as
/// `g · sigmoid(g)`, as PyTorch's exporters write it.
fn activation_of_load(e: &Expr, id: ExprId) -> Option<(u32, usize)> {
    let load = |x: ExprId| match e.nodes[x as usize] {
        ExprNode::Load(l) => Some(l),
        _ => None,
    };
    match e.nodes[id as usize] {
        ExprNode::Unary(op, x) => Some((activation(op)?, load(x)?)),
        ExprNode::Binary(BinaryOp::Mul, p, q) => [(p, q), (q, p)].into_iter().find_map(|(g, s)| match e.nodes[s as usize] {
            ExprNode::Unary(UnaryOp::Sigmoid, y) if y == g => Some((kiln_kernels::math::Activation::Silu as u32, load(g)?)),
            _ => None,
        }),
        _ => None,
    }
}

/// Matches `(acc + bias?) · act(gate)` with a full m×n gate (a gated FFN's `up · silu(gate)`,
/// GeGLU's with the GELU): the microkernel's gated epilogue, the gate's activation applied as
/// the tile is stored instead of in a pass over the GEMM's result afterwards (a PyTorch Llama
/// export's FFN at 1x128: 1.04 ms as that pass, the same GEMM without it 0.72).
fn match_gated(e: &Expr, k: &Kernel, m: usize, n: usize, dt: &dyn Fn(usize) -> DType) -> Option<Fused> {
    let kind = |l: usize| operand_kind(&k.inputs[l], m, n, dt(l));
    let scalar = |l: usize| is_scalar(&k.inputs[l], dt(l));
    let ExprNode::Binary(BinaryOp::Mul, a, b) = e.nodes[e.root() as usize] else { return None };
    [(a, b), (b, a)].into_iter().find_map(|(lin, gate)| {
        let (act, g) = activation_of_load(e, gate)?;
        if kind(g) != Operand::Full {
            return None;
        }
        let (scale, loads) = acc_plus_loads(e, lin, &scalar)?;
        let bias = match loads[..] {
            [] => None,
            [l] if kind(l) == Operand::Bias => Some(l),
            _ => return None,
        };
        Some(Fused { bias, act, residual: Some(g), gated: true, scale })
    })
}

/// Matches `act?(acc + bias?) + residual?` (adds in any order and association), or
/// `(acc + bias?) · act(gate)` ([`match_gated`]).
pub(crate) fn match_epilogue(e: &Expr, k: &Kernel, m: usize, n: usize, dt: &dyn Fn(usize) -> DType) -> Option<Fused> {
    if let Some(f) = match_gated(e, k, m, n, dt) {
        return Some(f);
    }
    let kind = |l: usize| operand_kind(&k.inputs[l], m, n, dt(l));
    let scalar = |l: usize| is_scalar(&k.inputs[l], dt(l));
    // Splits terms into (exactly one Acc, scaled or not, or one activation node, loads).
    let mut outer = Vec::new();
    add_terms(e, e.root(), &mut outer);
    let mut core = None;
    // The core's scale operand where the core is the accumulator itself.
    let mut core_acc = None;
    let mut post_loads = Vec::new();
    for &t in &outer {
        if core.is_none() {
            if let Some(s) = acc_term(e, t, &scalar) {
                (core, core_acc) = (Some(t), Some(s));
                continue;
            }
        }
        match &e.nodes[t as usize] {
            ExprNode::Load(l) => post_loads.push(*l),
            ExprNode::Unary(..) if core.is_none() => core = Some(t),
            ExprNode::Binary(BinaryOp::Min, ..) if core.is_none() && relu6_of(e, t).is_some() => core = Some(t),
            _ => return None,
        }
    }
    let core = core?;
    let mut scale = core_acc.flatten();
    let (act, inner_root) = match &e.nodes[core as usize] {
        _ if core_acc.is_some() => (0, None),
        ExprNode::Unary(op, x) => (activation(*op)?, Some(*x)),
        ExprNode::Binary(..) => (kiln_kernels::math::Activation::Relu6 as u32, Some(relu6_of(e, core)?)),
        _ => return None,
    };
    let mut bias = None;
    let mut residual = None;
    let mut place = |l: usize, allow_full: bool, allow_bias: bool| -> Option<()> {
        match kind(l) {
            Operand::Bias if allow_bias && bias.is_none() => bias = Some(l),
            Operand::Full if allow_full && residual.is_none() => residual = Some(l),
            _ => return None,
        }
        Some(())
    };
    match inner_root {
        None => {
            // acc + loads: one bias, one residual at most (both added before no activation).
            for &l in &post_loads {
                place(l, true, true)?;
            }
        }
        Some(x) => {
            let (s, loads) = acc_plus_loads(e, x, &scalar)?;
            scale = s;
            for l in loads {
                place(l, false, true)?;
            }
            for &l in &post_loads {
                place(l, true, false)?;
            }
        }
    }
    Some(Fused { bias, act, residual, gated: false, scale })
}

/// A view of one f32 broadcast everywhere (every stride 0).
fn is_scalar(t: &BufferView, dt: DType) -> bool {
    dt == DType::F32 && t.strides.iter().all(|&s| s == 0)
}

fn strides2(t: &BufferView) -> (usize, usize) {
    let r = t.rank();
    (t.strides[r - 2], t.strides[r - 1])
}

/// How A reaches the GEMM: in place with this row stride, or copied dense.
fn a_direct(t: &BufferView, dt: DType, m: usize, k: usize) -> Option<usize> {
    let (ri, cp) = strides2(t);
    if dt != DType::F32 || !(cp == 1 || k <= 1) {
        return None;
    }
    if m <= 1 {
        Some(k.max(1))
    } else if ri >= k.max(1) {
        Some(ri)
    } else {
        None
    }
}

/// How B is packed from its view: `(ldb, transposed)`, or `None` (copy dense first).
fn b_packable(t: &BufferView, dt: DType, k: usize, n: usize) -> Option<(usize, bool)> {
    let (rp, cj) = strides2(t);
    if dt != DType::F32 {
        return None;
    }
    if (cj == 1 || n <= 1) && (k <= 1 || rp >= n) {
        return Some((if k <= 1 { n.max(1) } else { rp }, false));
    }
    if (rp == 1 || k <= 1) && (n <= 1 || cj >= k) {
        return Some((if n <= 1 { k.max(1) } else { cj }, true));
    }
    None
}

#[allow(clippy::too_many_arguments)]
/// Copies an `rows × cols` strided matrix (element strides `rs`, `cs`) to dense f32 at `dst`.
fn copy_dense(fx: &mut Fx, src: Value, dt: DType, rows: usize, cols: usize, rs: usize, cs: usize, dst: Value) {
    let views = [
        MapView { ptr: src, strides: vec![rs as i64, cs as i64], dtype: dt },
        MapView { ptr: dst, strides: vec![cols as i64, 1], dtype: DType::F32 },
    ];
    emit_map(fx, &[rows, cols], &views, Part::All, MapBody::Float(&mut |_fx: &mut Fx, v: &[Value], _w| v[0]));
}

/// Emits a GEMM kernel. Returns its task count (1: the table's GEMM uses the pool itself).
#[allow(clippy::too_many_arguments)]
pub(crate) fn emit_gemm(
    fx: &mut Fx,
    ki: usize,
    k: &Kernel,
    batch: &[usize],
    m: usize,
    n: usize,
    kk: usize,
    alpha: f32,
    epilogue: Option<&Expr>,
) -> u32 {
    if m == 0 || n == 0 || batch.contains(&0) {
        return 1;
    }
    let nb = batch.len();
    let (a, b, out) = (&k.inputs[0], &k.inputs[1], &k.output);
    let dts: Vec<DType> = k.inputs.iter().map(|t| fx.dtype(t.buffer)).collect();
    let out_dt = fx.dtype(out.buffer);
    let (oi, oj) = strides2(out);
    let c_direct = out_dt == DType::F32 && (oj == 1 || n == 1) && (m == 1 || oi >= n);
    let ldc = if m == 1 { n } else { oi };
    let fused = match epilogue {
        None => Some(Fused { bias: None, act: 0, residual: None, gated: false, scale: None }),
        // A run-time scale takes the microkernel's `scale`, which alpha otherwise holds.
        Some(e) => match_epilogue(e, k, m, n, &|l| dts[l]).filter(|f| f.scale.is_none() || alpha == 1.0),
    };
    // A residual stored over the output (the planner's in-place reuse) is added by
    // accumulating into C; any other overlap with C takes the unfused path.
    let (fused, accumulate) = match fused {
        Some(f) if c_direct => {
            let overlaps = |l: Option<usize>| l.is_some_and(|l| fx.env.layout.overlap(fx.env.program, &k.inputs[l], out));
            if overlaps(f.bias) {
                (None, false)
            } else if overlaps(f.residual) {
                let r = &k.inputs[f.residual.unwrap()];
                if fx.env.layout.same_elements(fx.env.program, r, out) && f.act == 0 && !f.gated {
                    (Some(Fused { residual: None, ..f }), true)
                } else {
                    (None, false)
                }
            } else {
                (Some(f), false)
            }
        }
        _ => (None, false),
    };
    let lda_direct = a_direct(a, dts[0], m, kk);
    let packed_slot = fx.env.layout.packed_b.get(&ki).copied();
    let b_pack = if packed_slot.is_some() { None } else { b_packable(b, dts[1], kk, n) };
    // B packed as i16 pairs: the exact integer GEMM (`gemm_i16`, the table's other entry).
    let int16 = packed_slot.is_some_and(|s| matches!(fx.env.layout.slots[s].prep, WeightPrep::PackedBI16 { .. }));
    let scratch_len = |threads: usize| if int16 { gemm_i16_scratch_len(m, kk, threads) } else { gemm_scratch_len(m, n, kk, threads) };

    // The epilogue struct: bias 0, residual 8, residual_stride 16, activation 24, scale 28.
    let slot = fx.stack(32);
    let epi = fx.stack_addr(slot);
    let zero = fx.iconst(0);
    fx.b.ins().store(mf(), zero, epi, 0);
    fx.b.ins().store(mf(), zero, epi, 8);
    let rstride = match fused.and_then(|f| f.residual) {
        Some(r) => {
            let (ri, _) = strides2(&k.inputs[r]);
            if m == 1 {
                n
            } else {
                ri
            }
        }
        None => 0,
    };
    let rs = fx.iconst(rstride as i64);
    fx.b.ins().store(mf(), rs, epi, 16);
    let act = fx.b.ins().iconst(I32, fused.map_or(0, |f| f.act | if f.gated { kiln_kernels::gemm::GATED } else { 0 }) as i64);
    fx.b.ins().store(mf(), act, epi, 24);
    let sc = match fused.and_then(|f| f.scale) {
        Some(l) => {
            let at = fx.view_base(&k.inputs[l]);
            fx.b.ins().load(F32, mf(), at, 0)
        }
        None => fx.b.ins().f32const(alpha),
    };
    fx.b.ins().store(mf(), sc, epi, 28);

    // Per-batch pointers: A, B, out, then every epilogue operand.
    let mut views: Vec<&BufferView> = vec![a, b, out];
    let epi_inputs: Vec<usize> = (2..k.inputs.len()).collect();
    for &l in &epi_inputs {
        views.push(&k.inputs[l]);
    }
    // A pre-packed B is read through its slot only (its plain storage is not mapped).
    let ptrs: Vec<Value> = views
        .iter()
        .enumerate()
        .map(|(i, t)| if i == 1 && packed_slot.is_some() { fx.iconst(0) } else { fx.view_base(t) })
        .collect();
    let bst: Vec<Vec<i64>> = views.iter().map(|t| t.strides[..nb].iter().map(|&s| s as i64).collect()).collect();
    let (bdims, bst) = coalesce(batch, &bst);
    let sizes: Vec<i64> = views.iter().map(|t| fx.dtype(t.buffer).size() as i64).collect();
    let bbytes: Vec<Vec<i64>> = bst.iter().zip(&sizes).map(|(s, &z)| s.iter().map(|&x| x * z).collect()).collect();
    let b_shared = bst[1].iter().all(|&s| s == 0);

    // Work split: the kernel's own (inside one call, over the table's pool), or ours (this
    // function runs as `threads` tasks, each one call on a range of rows or column panels, or
    // each the whole GEMMs of a range of batch entries; nested pool use inside runs inline).
    let threads = fx.env.threads.max(1);
    let split = if nb == 0 {
        choose_split(threads, m, n, kk, packed_slot.is_some() && lda_direct.is_some(), fused.is_none(), !int16)
    } else {
        choose_batch_split(threads, &bdims, batch.iter().product::<usize>() * m * n * kk.max(1), fused.is_none())
    };
    // Scratch: a copy of each per-entry region per task when tasks run batch entries.
    let copies = if split == GemmSplit::Batch { threads } else { 1 };
    let apack_floats = scratch_len(threads);
    let apack_off = fx.claim_scratch(apack_floats * 4);
    let per_copy = |floats: usize| floats * 4;
    let bpack_off = if packed_slot.is_none() { Some(fx.claim_scratch(copies * per_copy(packed_b_len(kk, n)))) } else { None };
    let adense_off = if lda_direct.is_none() { Some(fx.claim_scratch(copies * per_copy(m * kk))) } else { None };
    let bdense_off = if packed_slot.is_none() && b_pack.is_none() { Some(fx.claim_scratch(copies * per_copy(kk * n))) } else { None };
    let ctmp_off = if fused.is_none() { Some(fx.claim_scratch(copies * per_copy(m * n))) } else { None };
    // This task's copy of a region of `floats` floats at `off`.
    let region = |fx: &mut Fx, off: usize, floats: usize| -> Value {
        let base = fx.scratch_ptr(off);
        if copies > 1 {
            fx.offset(base, fx.task, per_copy(floats) as i64)
        } else {
            base
        }
    };

    let apack = fx.scratch_ptr(apack_off);
    let apack_len = fx.iconst(apack_floats as i64);
    let (sb_p, sb_j) = strides2(b);
    // Packs B of one batch entry (at `bp`) into the scratch panel; returns the packed pointer.
    let pack = |fx: &mut Fx, bp: Value| -> Value {
        let dst = region(fx, bpack_off.expect("scratch for packing B"), packed_b_len(kk, n));
        let (src, ldb, tr) = match b_pack {
            Some((ldb, tr)) => (bp, ldb, tr),
            None => {
                let d = region(fx, bdense_off.expect("scratch for a dense B"), kk * n);
                copy_dense(fx, bp, dts[1], kk, n, sb_p, sb_j, d);
                (d, n.max(1), false)
            }
        };
        let kv = fx.iconst(kk as i64);
        let nv = fx.iconst(n as i64);
        let lv = fx.iconst(ldb as i64);
        let tv = fx.iconst(tr as i64);
        fx.call_table(KernelTable::OFF_PACK_B_F32, &[src, kv, nv, lv, tv, dst], false);
        dst
    };
    let prepacked: Option<Value> = match packed_slot {
        Some(s) => Some(fx.b.ins().load(I64, mf().with_readonly(), fx.weights, (8 * s) as i32)),
        None if b_shared && nb > 0 => Some(pack(fx, ptrs[1])),
        None => None,
    };
    let (sa_i, sa_p) = strides2(a);
    let fused_c = fused;
    let per_thread = scratch_len(1) as i64;
    let entries = if split == GemmSplit::Batch { Some(fx.task_range(bdims[0], 1)) } else { None };
    fx.nest(&bdims, &ptrs, &bbytes, entries, &mut |fx, p| {
        let bpk = match prepacked {
            Some(v) => v,
            None => pack(fx, p[1]),
        };
        let (aptr, lda) = match lda_direct {
            Some(lda) => (p[0], lda),
            None => {
                let d = region(fx, adense_off.expect("scratch for a dense A"), m * kk);
                copy_dense(fx, p[0], dts[0], m, kk, sa_i, sa_p, d);
                (d, kk.max(1))
            }
        };
        let (cptr, ldc_v) = match ctmp_off {
            None => (p[2], ldc),
            Some(off) => (region(fx, off, m * n), n),
        };
        // This call's part: all of it, or this task's rows / column panels.
        let (mut mv_, mut nv_, mut aptr, mut bpk, mut cptr) = (fx.iconst(m as i64), fx.iconst(n as i64), aptr, bpk, cptr);
        let (mut apack_t, mut apack_len_t) = (apack, apack_len);
        let (mut row0, mut col0) = (None, None);
        // The part of C this task writes, which its epilogue pass (if any) then covers.
        let part = match split {
            GemmSplit::Kernel | GemmSplit::Batch => Part::All,
            GemmSplit::Rows => {
                let (r0, r1) = fx.task_range(m, kiln_kernels::gemm::MR);
                mv_ = fx.b.ins().isub(r1, r0);
                aptr = fx.offset(aptr, r0, (lda * 4) as i64);
                cptr = fx.offset(cptr, r0, (ldc_v * 4) as i64);
                row0 = Some(r0);
                Part::Rows(r0, r1)
            }
            GemmSplit::Panels => {
                let nr = kiln_kernels::gemm::NR;
                let (j0, j1) = fx.task_range(n, nr);
                nv_ = fx.b.ins().isub(j1, j0);
                // Bytes of packed B per column: k floats (never the integer GEMM's, see
                // `choose_split`).
                debug_assert!(!int16, "no panel split of an integer GEMM");
                bpk = fx.offset(bpk, j0, (kk * 4) as i64);
                cptr = fx.offset(cptr, j0, 4);
                col0 = Some(j0);
                Part::Cols(j0, j1)
            }
        };
        if split != GemmSplit::Kernel {
            apack_t = fx.offset(apack, fx.task, per_thread * 4);
            apack_len_t = fx.iconst(per_thread);
        }
        if let Some(f) = fused_c {
            let bias = match f.bias {
                Some(l) => match col0 {
                    Some(j0) => fx.offset(p[3 + (l - 2)], j0, 4),
                    None => p[3 + (l - 2)],
                },
                None => fx.iconst(0),
            };
            fx.b.ins().store(mf(), bias, epi, 0);
            let res = match f.residual {
                Some(l) => {
                    let r = p[3 + (l - 2)];
                    match (row0, col0) {
                        (Some(r0), _) => fx.offset(r, r0, (rstride * 4) as i64),
                        (_, Some(j0)) => fx.offset(r, j0, 4),
                        _ => r,
                    }
                }
                None => fx.iconst(0),
            };
            fx.b.ins().store(mf(), res, epi, 8);
        }
        let args = [
            fx.table,
            mv_,
            nv_,
            fx.iconst(kk as i64),
            aptr,
            fx.iconst(lda as i64),
            bpk,
            cptr,
            fx.iconst(ldc_v as i64),
            fx.iconst(accumulate as i64),
            epi,
            apack_t,
            apack_len_t,
        ];
        let entry = if int16 { KernelTable::OFF_GEMM_I16 } else { KernelTable::OFF_GEMM_F32 };
        let st = fx.call_table(entry, &args, true).expect("gemm returns a status");
        fx.check_status(st);
        if let Some(off) = ctmp_off {
            // The epilogue as an elementwise pass from the scratch tile into the output view.
            let ct = region(fx, off, m * n);
            let mut mv = vec![MapView { ptr: ct, strides: vec![n as i64, 1], dtype: DType::F32 }];
            for &l in &epi_inputs {
                let (ri, cj) = strides2(&k.inputs[l]);
                mv.push(MapView { ptr: p[3 + (l - 2)], strides: vec![ri as i64, cj as i64], dtype: dts[l] });
            }
            mv.push(MapView { ptr: p[2], strides: vec![oi as i64, oj as i64], dtype: out_dt });
            let ninputs = k.inputs.len();
            let mut body = |fx: &mut Fx, v: &[Value], w: usize| -> Value {
                match epilogue {
                    None => v[0],
                    Some(e) => {
                        let mut by_input: Vec<Option<Value>> = vec![None; ninputs];
                        for (j, &l) in epi_inputs.iter().enumerate() {
                            by_input[l] = Some(v[1 + j]);
                        }
                        emit_expr(fx, e, w, &by_input, Some(v[0]))
                    }
                }
            };
            emit_map(fx, &[m, n], &mv, part, MapBody::Float(&mut body));
        }
    });
    if split == GemmSplit::Kernel {
        1
    } else {
        fx.env.threads as u32
    }
}

/// Who splits a GEMM across threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GemmSplit {
    /// One call; the kernel splits it over the table's pool.
    Kernel,
    /// One task per thread, each on a range of rows (A packed once in total).
    Rows,
    /// One task per thread, each on a range of 16-column panels.
    Panels,
    /// One task per thread, each the whole GEMMs (one call each, run inline) of a range of
    /// batch entries.
    Batch,
}

/// The split of a batched GEMM over its (coalesced) batch dims `bdims`: with an unfused
/// epilogue, tasks take whole batch entries when the outermost dim has one per thread (a QDQ
/// model's unfused attention: 12 heads of 128×32·32×128, each call too small to split well,
/// and the pass over its scores otherwise on one thread); otherwise each call splits itself.
/// (Below 2^17 multiply-adds in all, as for one GEMM, one task.)
fn choose_batch_split(threads: usize, bdims: &[usize], macs: usize, unfused: bool) -> GemmSplit {
    match bdims.first() {
        Some(&d) if threads > 1 && unfused && d >= threads && macs >= 1 << 17 && std::env::var("KILN_GEMM_SPLIT").as_deref() != Ok("kernel") => {
            GemmSplit::Batch
        }
        _ => GemmSplit::Kernel,
    }
}

/// The split of an unbatched GEMM with a pre-packed B and A read in place (`ours_ok`).
///
/// The kernel's own split is the default: it picks rows or panels per call and keeps the
/// threads' working sets apart. An epilogue the microkernel cannot apply (`unfused`: e.g. a
/// QDQ model's chains of quantize/dequantize steps after each MatMul) runs as an elementwise
/// pass over C after the call, and in one task that pass would be single-threaded (a QDQ
/// MiniLM spent more time there than in its GEMMs); then each task runs the GEMM on its rows
/// (or panels, the kernel's `Auto` rule: rows when there are more row strips than panels)
/// and the pass over the same part. `KILN_GEMM_SPLIT` (`kernel`, `rows`, `panels`) overrides
/// the choice for experiments. `panels_ok` is false for the integer GEMM: its packed B's
/// layout is the runtime's choice (a header, then i16 pairs or byte quads, `gemm::int_b`), so
/// generated code cannot point into it at a panel; a row split passes B whole.
fn choose_split(threads: usize, m: usize, n: usize, k: usize, ours_ok: bool, unfused: bool, panels_ok: bool) -> GemmSplit {
    if threads <= 1 || !ours_ok || m * n * k.max(1) < (1 << 17) {
        return GemmSplit::Kernel;
    }
    let strips = m.div_ceil(kiln_kernels::gemm::MR);
    let panels = n.div_ceil(kiln_kernels::gemm::NR);
    let rows = strips >= threads;
    let cols = panels_ok && panels >= threads;
    match std::env::var("KILN_GEMM_SPLIT").as_deref() {
        Ok("kernel") => GemmSplit::Kernel,
        Ok("rows") if rows => GemmSplit::Rows,
        Ok("panels") if cols => GemmSplit::Panels,
        _ if unfused && rows && (strips > panels || !cols) => GemmSplit::Rows,
        _ if unfused && cols => GemmSplit::Panels,
        _ => GemmSplit::Kernel,
    }
}
