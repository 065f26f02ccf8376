//! Attention kernels: one call to the kernel table's fused attention (`attention_f32`: per
//! head, `softmax(scale·Q·Kᵀ + mask)·V` one block of query rows at a time, heads spread over
//! the pool) with an `AttentionArgs` block built on the stack.
//!
//! Views with unit column stride are passed in place with their batch/head/row strides; any
//! other view (or a non-f32 one) is first copied dense into scratch (and the output copied back).
//! Batch dims beyond the table's two (batch, heads) are looped over here.
//!
//! Differences from the reference a caller may see: a row whose every score is `-inf` gives
//! zeros (the reference gives NaN), and `seq_kv == 0` gives zeros.

use std::mem::offset_of;

use cranelift_codegen::ir::types::I32;
use cranelift_codegen::ir::{InstBuilder, Value};
use kiln_kernels::attention::{attention_scratch_len, AttentionArgs, AttnDims, ATTN_ZERO_NAN_ROWS};
use kiln_kernels::table::KernelTable;
use kiln_runtime::DType;

use super::elementwise::{coalesce, materialize, store_dense};
use super::emit::{mf, Fx};
use crate::kernel_ir::{dense_strides, Kernel, BufferView};

// Emitted for exactly this entry signature (see gemm.rs).
const _: unsafe extern "C" fn(*const KernelTable, *const AttentionArgs) -> i32 = kiln_kernels::table::raw_attention_f32;

fn direct(t: &BufferView, dt: DType) -> bool {
    let r = t.rank();
    dt == DType::F32 && (t.strides[r - 1] == 1 || t.shape[r - 1] == 1)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn emit_attention(
    fx: &mut Fx,
    k: &Kernel,
    batch: &[usize],
    seq_q: usize,
    seq_kv: usize,
    head_dim: usize,
    v_dim: usize,
    scale: f32,
    mask: Option<usize>,
    zero_nan_rows: bool,
) -> u32 {
    if batch.contains(&0) || seq_q == 0 || v_dim == 0 {
        return 1;
    }
    let nb = batch.len();
    let mut views: Vec<&BufferView> = vec![&k.inputs[0], &k.inputs[1], &k.inputs[2], &k.output];
    if let Some(mk) = mask {
        views.push(&k.inputs[mk]);
    }
    // Pointers and strides each view is passed with (materialized ones are dense in scratch).
    let mut ptrs: Vec<Value> = Vec::new();
    let mut strides: Vec<Vec<usize>> = Vec::new();
    let mut out_dense: Option<Value> = None;
    for (i, t) in views.iter().enumerate() {
        let dt = fx.dtype(t.buffer);
        if direct(t, dt) {
            ptrs.push(fx.view_base(t));
            strides.push(t.strides.clone());
        } else {
            let off = fx.claim_scratch(t.numel() * 4);
            let d = fx.scratch_ptr(off);
            if i != 3 {
                materialize(fx, t, d);
            } else {
                out_dense = Some(d);
            }
            ptrs.push(d);
            strides.push(dense_strides(&t.shape));
        }
    }
    let bst: Vec<Vec<i64>> = strides.iter().map(|s| s[..nb].iter().map(|&x| x as i64).collect()).collect();
    let (mut bdims, mut bst) = coalesce(batch, &bst);
    while bdims.len() < 2 {
        bdims.insert(0, 1);
        for s in bst.iter_mut() {
            s.insert(0, 0);
        }
    }
    let nd = bdims.len();
    let loop_dims = bdims[..nd - 2].to_vec();
    let loop_bytes: Vec<Vec<i64>> = bst.iter().map(|s| s[..nd - 2].iter().map(|&x| x * 4).collect()).collect();
    let row = |s: &Vec<usize>| s[s.len() - 2];
    let dims = AttnDims { seq_q, seq_k: seq_kv, head_dim, head_dim_v: v_dim };
    let per = attention_scratch_len(dims);
    let threads = fx.env.threads.max(1);
    let scr_off = fx.claim_scratch(threads * per * 4);

    let slot = fx.stack(std::mem::size_of::<AttentionArgs>() as u32);
    let args = fx.stack_addr(slot);
    let put = |fx: &mut Fx, off: usize, v: i64| {
        let c = fx.iconst(v);
        fx.b.ins().store(mf(), c, args, off as i32);
    };
    put(fx, offset_of!(AttentionArgs, batch), bdims[nd - 2] as i64);
    put(fx, offset_of!(AttentionArgs, heads), bdims[nd - 1] as i64);
    put(fx, offset_of!(AttentionArgs, seq_q), seq_q as i64);
    put(fx, offset_of!(AttentionArgs, seq_k), seq_kv as i64);
    put(fx, offset_of!(AttentionArgs, head_dim), head_dim as i64);
    put(fx, offset_of!(AttentionArgs, head_dim_v), v_dim as i64);
    let fields = [
        (offset_of!(AttentionArgs, q_batch_stride), offset_of!(AttentionArgs, q_head_stride), offset_of!(AttentionArgs, q_row_stride)),
        (offset_of!(AttentionArgs, k_batch_stride), offset_of!(AttentionArgs, k_head_stride), offset_of!(AttentionArgs, k_row_stride)),
        (offset_of!(AttentionArgs, v_batch_stride), offset_of!(AttentionArgs, v_head_stride), offset_of!(AttentionArgs, v_row_stride)),
        (offset_of!(AttentionArgs, out_batch_stride), offset_of!(AttentionArgs, out_head_stride), offset_of!(AttentionArgs, out_row_stride)),
        (offset_of!(AttentionArgs, mask_batch_stride), offset_of!(AttentionArgs, mask_head_stride), offset_of!(AttentionArgs, mask_row_stride)),
    ];
    for (v, s) in strides.iter().enumerate() {
        let (fb, fh, fr) = fields[v];
        put(fx, fb, bst[v][nd - 2]);
        put(fx, fh, bst[v][nd - 1]);
        // A single-row operand's row stride is never used; give the kernel a valid one.
        let rs = row(s);
        let rows = views[v].shape[views[v].rank() - 2];
        let cols = views[v].shape[views[v].rank() - 1];
        put(fx, fr, if rows <= 1 && v != 4 { cols.max(1) as i64 } else { rs as i64 });
    }
    if mask.is_none() {
        put(fx, offset_of!(AttentionArgs, mask), 0);
        for f in [offset_of!(AttentionArgs, mask_batch_stride), offset_of!(AttentionArgs, mask_head_stride), offset_of!(AttentionArgs, mask_row_stride)] {
            put(fx, f, 0);
        }
    }
    let sc = fx.b.ins().f32const(scale);
    fx.b.ins().store(mf(), sc, args, offset_of!(AttentionArgs, scale) as i32);
    let flags = fx.b.ins().iconst(I32, if zero_nan_rows { i64::from(ATTN_ZERO_NAN_ROWS) } else { 0 });
    fx.b.ins().store(mf(), flags, args, offset_of!(AttentionArgs, flags) as i32);
    let scr = fx.scratch_ptr(scr_off);
    fx.b.ins().store(mf(), scr, args, offset_of!(AttentionArgs, scratch) as i32);
    put(fx, offset_of!(AttentionArgs, scratch_len), (threads * per) as i64);
    let ptr_fields = [
        offset_of!(AttentionArgs, q),
        offset_of!(AttentionArgs, k),
        offset_of!(AttentionArgs, v),
        offset_of!(AttentionArgs, out),
        offset_of!(AttentionArgs, mask),
    ];
    fx.nest(&loop_dims, &ptrs, &loop_bytes, None, &mut |fx, p| {
        for (v, &pv) in p.iter().enumerate() {
            fx.b.ins().store(mf(), pv, args, ptr_fields[v] as i32);
        }
        let st = fx.call_table(KernelTable::OFF_ATTENTION_F32, &[fx.table, args], true).expect("attention returns a status");
        fx.check_status(st);
    });
    if let Some(d) = out_dense {
        store_dense(fx, d, &k.output);
    }
    1
}
