//! Embedding lookup: `out[ids.., c] = table[id, c]`. An id outside `0..rows` makes the kernel
//! return status `GATHER_OUT_OF_RANGE` (a typed error at run time; never an out-of-bounds read).
//! Further tables (inputs 2..) continue the first's rows: each row's source is picked by
//! comparing its id with where each table starts.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{InstBuilder, Value};

use super::elementwise::{coalesce, emit_map, tasks_for, MapBody, MapView, Part};
use super::emit::Fx;
use crate::kernel_ir::Kernel;

pub(crate) fn emit_gather(fx: &mut Fx, k: &Kernel) -> u32 {
    let (t, ids) = (&k.inputs[0], &k.inputs[1]);
    let tables: Vec<_> = std::iter::once(t).chain(&k.inputs[2..]).collect();
    let rows: usize = tables.iter().map(|x| x.shape[0]).sum();
    let cols = t.shape[1];
    let r = ids.rank();
    let n_ids = ids.numel();
    if n_ids == 0 {
        return 1;
    }
    let t_dt = fx.dtype(t.buffer);
    let ids_dt = fx.dtype(ids.buffer);
    let out_dt = fx.dtype(k.output.buffer);
    // (base, first id, row bytes) of every table.
    let mut starts = Vec::new();
    let mut first = 0usize;
    for x in &tables {
        let base = fx.view_base(x);
        starts.push((base, first as i64, (x.strides[0] * t_dt.size()) as i64));
        first += x.shape[0];
    }
    let ptrs = [fx.view_base(ids), fx.view_base(&k.output)];
    let st = vec![
        ids.strides.iter().map(|&s| s as i64).collect::<Vec<_>>(),
        k.output.strides[..r].iter().map(|&s| s as i64).collect::<Vec<_>>(),
    ];
    let (dims, st) = coalesce(&ids.shape, &st);
    let bytes = vec![
        st[0].iter().map(|&s| s * ids_dt.size() as i64).collect::<Vec<_>>(),
        st[1].iter().map(|&s| s * out_dt.size() as i64).collect::<Vec<_>>(),
    ];
    // A task per 8192 copied elements, not the elementwise maps' 32768: a gather's rows come
    // from a table larger than the caches (MiniLM's word embeddings: 47 MB), so it waits on
    // memory a row at a time, and two cores wait side by side. MiniLM 1×128 (128 rows of 384:
    // one task before, two with this threshold, six since `tasks_for` gives up to four per
    // thread), `kiln bench --profile`, Zen 3, 2 threads: 0.084–0.098 -> 0.048–0.052 ms (one
    // task -> two).
    let tasks = if dims.is_empty() { 1 } else { tasks_for(fx.env.threads, n_ids * cols, 1 << 13).min(dims[0] as u32) };
    let range = if tasks > 1 { Some(fx.task_range(dims[0], 1)) } else { None };
    let t_cs = t.strides[1] as i64;
    let o_cs = k.output.strides[r] as i64;
    let int = t_dt.is_int() && out_dt.is_int();
    fx.nest(&dims, &ptrs, &bytes, range, &mut |fx, p| {
        let id = fx.load_i64(ids_dt, p[0]);
        let bad = fx.b.ins().icmp_imm_s(IntCC::UnsignedGreaterThanOrEqual, id, rows as i64);
        fx.fail_if(bad, kiln_runtime::cpu::status::GATHER_OUT_OF_RANGE);
        let (b0, _, rb0) = starts[0];
        let mut src = fx.offset(b0, id, rb0);
        for &(base, start, rb) in &starts[1..] {
            // Rows from `start` on are this table's (the later the table, the later it wins).
            let at = fx.b.ins().iadd_imm_s(id, -start);
            let here = fx.offset(base, at, rb);
            let past = fx.b.ins().icmp_imm_s(IntCC::SignedGreaterThanOrEqual, id, start);
            src = fx.b.ins().select(past, here, src);
        }
        let views = [
            MapView { ptr: src, strides: vec![t_cs], dtype: t_dt },
            MapView { ptr: p[1], strides: vec![o_cs], dtype: out_dt },
        ];
        let body = if int { MapBody::IntCopy } else { MapBody::Float(&mut |_fx: &mut Fx, v: &[Value], _w| v[0]) };
        emit_map(fx, &[cols], &views, Part::All, body);
    });
    tasks
}
