//! Where every buffer of a program lives for the generated code.
//!
//! The arena of a CPU plan is, in order: the memory plan's intermediates (at the planned
//! offsets), then one slot per graph input, one per graph output, the constant tensors
//! (written once at load), and a scratch region shared by the kernels (they run one after
//! the other) for GEMM/attention working memory and materialized operands. Weights are not in
//! the arena: the code reads entry `i` of the weights pointer array, prepared by the runtime as
//! [`WeightSlot`] `i` says (as is, transposed, or packed for the GEMM microkernel).

use std::collections::BTreeMap;

use kiln_runtime::cpu::{Binding, WeightPrep, WeightSlot};
use kiln_runtime::{DType, Error, Result, TensorData};

use crate::kernel_ir::{BufferKind, KernelOp, KernelProgram, BufferView, WeightLayout};
use crate::pipeline::Lowered;

/// Alignment of every region the layout places, in bytes.
pub const ALIGN: usize = 64;

fn align(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// Where a buffer's element 0 is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Base {
    /// At this byte offset of the arena.
    Arena(usize),
    /// At the pointer in entry `i` of the weights array.
    Slot(usize),
}

#[derive(Debug, Clone)]
pub struct Layout {
    /// By buffer index; `None` for buffers no kernel reads as themselves (e.g. a weight only
    /// read through its packed slot).
    pub base: Vec<Option<Base>>,
    pub slots: Vec<WeightSlot>,
    /// Kernel index → slot of its pre-packed GEMM B operand.
    pub packed_b: BTreeMap<usize, usize>,
    pub arena_init: Vec<(usize, Vec<u8>)>,
    pub inputs: Vec<Binding>,
    pub outputs: Vec<Binding>,
    /// Start of the scratch region (bytes).
    pub scratch_offset: usize,
}

/// The packed-B slot a GEMM kernel's weight operand gets, if it is a weight shared by every
/// batch entry (a linear layer).
pub fn packed_b_slot(program: &KernelProgram, ki: usize) -> Option<WeightSlot> {
    let k = &program.kernels[ki];
    let KernelOp::Gemm { batch, m: _, n, k: kk, .. } = &k.op else { return None };
    let b = k.inputs.get(1)?;
    let buf = program.buffer(b.buffer);
    let BufferKind::Weight { index, layout } = &buf.kind else { return None };
    if !buf.dtype.is_float() || b.strides[..batch.len()].iter().any(|&s| s != 0) {
        return None;
    }
    let r = b.rank();
    let (shape, transposed) = match layout {
        WeightLayout::AsIs => (buf.shape.clone(), false),
        WeightLayout::Transposed if buf.shape.len() == 2 => (vec![buf.shape[1], buf.shape[0]], true),
        WeightLayout::Transposed => return None,
    };
    Some(WeightSlot {
        index: *index,
        shape,
        dtype: DType::F32,
        prep: WeightPrep::PackedB {
            transposed,
            offset: b.offset,
            k: *kk,
            n: *n,
            row_stride: b.strides[r - 2],
            col_stride: b.strides[r - 1],
        },
    })
}

impl Layout {
    /// Lays out every buffer of `lowered.program` (see the module docs).
    pub fn new(lowered: &Lowered) -> Result<Layout> {
        let program = &lowered.program;
        let plan = &lowered.plan;
        let nb = program.buffers.len();
        let mut l = Layout {
            base: vec![None; nb],
            slots: Vec::new(),
            packed_b: BTreeMap::new(),
            arena_init: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            scratch_offset: 0,
        };
        // Intermediates at their planned offsets.
        for (i, b) in program.buffers.iter().enumerate() {
            if b.is_arena() {
                let off = plan.offsets.get(i).copied().flatten().ok_or_else(|| {
                    Error::Backend(format!("buffer b{i} \"{}\" has no arena offset in the memory plan", b.name))
                })?;
                if off + b.bytes() > plan.arena_bytes {
                    return Err(Error::Backend(format!("buffer b{i} runs past the planned arena")));
                }
                l.base[i] = Some(Base::Arena(off));
            }
        }
        let mut end = align(plan.arena_bytes);
        // Inputs: one binding per graph input, in graph order.
        for (gi, spec) in lowered.graph.inputs.iter().enumerate() {
            let (dtype, shape) = match program.inputs.get(gi).copied().flatten() {
                Some(b) => {
                    let buf = program.buffer(b);
                    l.base[b.index()] = Some(Base::Arena(end));
                    (buf.dtype, buf.shape.clone())
                }
                None => (spec.dtype, spec.shape.iter().map(|d| d.resolve(lowered.bucket)).collect()),
            };
            let bind = Binding { offset: end, dtype, shape };
            end = align(end + bind.bytes());
            l.inputs.push(bind);
        }
        for &b in &program.outputs {
            let buf = program.buffer(b);
            l.base[b.index()] = Some(Base::Arena(end));
            l.outputs.push(Binding { offset: end, dtype: buf.dtype, shape: buf.shape.clone() });
            end = align(end + buf.bytes());
        }
        for (i, b) in program.buffers.iter().enumerate() {
            if let BufferKind::Constant { values } = &b.kind {
                if values.len() != b.numel() {
                    return Err(Error::Backend(format!("constant b{i} has {} values for shape {:?}", values.len(), b.shape)));
                }
                let v: Vec<f64> = values.iter().map(|&x| x as f64).collect();
                let bytes = TensorData::from_f64(b.dtype, &v).to_le_bytes();
                l.base[i] = Some(Base::Arena(end));
                let n = bytes.len();
                l.arena_init.push((end, bytes));
                end = align(end + n);
            }
        }
        // Weights: packed B operands, then every other weight read directly.
        for ki in 0..program.kernels.len() {
            if let Some(s) = packed_b_slot(program, ki) {
                let si = l.slot(s);
                l.packed_b.insert(ki, si);
            }
        }
        for (ki, k) in program.kernels.iter().enumerate() {
            for (ii, t) in k.inputs.iter().enumerate() {
                if ii == 1 && l.packed_b.contains_key(&ki) {
                    continue;
                }
                let buf = program.buffer(t.buffer);
                if let BufferKind::Weight { index, layout } = &buf.kind {
                    if l.base[t.buffer.index()].is_some() {
                        continue;
                    }
                    let (shape, prep) = match layout {
                        WeightLayout::AsIs => (buf.shape.clone(), WeightPrep::AsIs),
                        WeightLayout::Transposed if buf.shape.len() == 2 => {
                            (vec![buf.shape[1], buf.shape[0]], WeightPrep::Transposed)
                        }
                        WeightLayout::Transposed => {
                            return Err(Error::Backend(format!("transposed weight b{} is not rank 2", t.buffer.0)))
                        }
                    };
                    let si = l.slot(WeightSlot { index: *index, shape, dtype: buf.dtype, prep });
                    l.base[t.buffer.index()] = Some(Base::Slot(si));
                }
            }
        }
        l.scratch_offset = end;
        Ok(l)
    }

    /// Byte range `[start, end)` a view spans in the arena, if it lives there.
    fn arena_span(&self, program: &KernelProgram, t: &BufferView) -> Option<(usize, usize)> {
        let Some(Base::Arena(o)) = self.base[t.buffer.index()] else { return None };
        let size = program.buffer(t.buffer).dtype.size();
        let ext = t.extent();
        if ext == 0 {
            return None;
        }
        Some((o + t.offset * size, o + ext * size))
    }

    /// Whether two views may touch the same bytes (different buffers can share storage when
    /// the memory plan reuses an input's bytes in place).
    pub fn overlap(&self, program: &KernelProgram, a: &BufferView, b: &BufferView) -> bool {
        match (self.arena_span(program, a), self.arena_span(program, b)) {
            (Some((a0, a1)), Some((b0, b1))) => a0 < b1 && b0 < a1,
            _ => false,
        }
    }

    /// Whether two views name exactly the same elements at the same addresses.
    pub fn same_elements(&self, program: &KernelProgram, a: &BufferView, b: &BufferView) -> bool {
        let sa = self.arena_span(program, a);
        sa.is_some()
            && sa == self.arena_span(program, b)
            && a.shape == b.shape
            && a.strides == b.strides
            && program.buffer(a.buffer).dtype.size() == program.buffer(b.buffer).dtype.size()
    }

    /// The index of `s` in the slot list (added once).
    pub fn slot(&mut self, s: WeightSlot) -> usize {
        if let Some(i) = self.slots.iter().position(|x| *x == s) {
            return i;
        }
        self.slots.push(s);
        self.slots.len() - 1
    }
}
