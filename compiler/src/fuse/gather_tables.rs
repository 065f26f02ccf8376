//! A gather from a concatenation of rows → one gather over several tables.
//!
//! The ONNX importer pads a convolution's or a pool's window grid by appending one fill row to
//! the activation rows (`Concat([rows, fill], 0)`) and gathering the grid's rows from that
//! table, the fill row's id standing for every padded position. Run as written, the concat
//! copies the whole activation (a MobileNetV2 expand layer's 12544×96: 4.8 MB) to append 96
//! floats, and the gather then copies it again. Here the gather reads its rows from the
//! concat's inputs directly — table 0's rows, then table 1's, … — and the concat kernel goes.
//!
//! A fusion of the kernel program for targets whose gather reads several tables (the CPU's);
//! the reference interpreter and the GPU see the graph's Concat and Gather as they are.

use std::collections::HashMap;

use crate::kernel_ir::*;

/// Folds every axis-0 concat of rank-2 tables that only gathers read (whole-buffer output, no
/// other reader, every table with the same columns and element type) into those gathers;
/// returns how many concats it removed.
pub(crate) fn fold_concats_into_gathers(p: &mut KernelProgram) -> usize {
    let mut readers: HashMap<BufferId, Vec<usize>> = HashMap::new();
    for (ki, k) in p.kernels.iter().enumerate() {
        for v in &k.inputs {
            readers.entry(v.buffer).or_default().push(ki);
        }
    }
    let mut removed = std::collections::HashSet::new();
    for ci in 0..p.kernels.len() {
        let c = &p.kernels[ci];
        if !matches!(c.op, KernelOp::Concat { axis: 0 }) || !foldable(p, c) {
            continue;
        }
        let out = c.output.clone();
        let Some(rs) = readers.get(&out.buffer) else { continue };
        // Every reader a gather reading the whole concatenation as its table (and nothing else
        // of it: not its ids).
        let only_gathers = rs.iter().all(|&ri| {
            let r = &p.kernels[ri];
            matches!(r.op, KernelOp::Gather)
                && r.inputs.len() == 2
                && r.inputs[0] == out
                && r.inputs[1].buffer != out.buffer
        });
        if !only_gathers {
            continue;
        }
        let tables = p.kernels[ci].inputs.clone();
        let fused = p.kernels[ci].fused.clone();
        for &ri in rs {
            let g = &mut p.kernels[ri];
            let ids = g.inputs[1].clone();
            g.inputs = std::iter::once(tables[0].clone()).chain([ids]).chain(tables[1..].iter().cloned()).collect();
            g.fused.extend(fused.iter().cloned());
        }
        removed.insert(ci);
    }
    if !removed.is_empty() {
        let mut i = 0;
        p.kernels.retain(|_| {
            i += 1;
            !removed.contains(&(i - 1))
        });
        super::siblings::drop_unused_buffers(p);
    }
    removed.len()
}

/// A concat whose output is a whole arena buffer (not a graph output, which must be written)
/// and whose inputs are rank-2 tables of one element type and column count, each with dense
/// columns (the gather copies a row as one run) and a positive row stride.
fn foldable(p: &KernelProgram, c: &Kernel) -> bool {
    let out = &c.output;
    let ob = p.buffer(out.buffer);
    if ob.kind != BufferKind::Arena || out.rank() != 2 || out.offset != 0 || !out.is_contiguous() || out.numel() != ob.numel() {
        return false;
    }
    let cols = out.shape[1];
    c.inputs.len() >= 2
        && c.inputs.iter().all(|t| {
            t.rank() == 2
                && t.shape[1] == cols
                && t.shape[0] > 0
                && t.strides[0] > 0
                && (t.strides[1] == 1 || cols == 1)
                && p.buffer(t.buffer).dtype == ob.dtype
        })
}
