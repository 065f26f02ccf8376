//! Where every buffer of a program lives for the generated code.
//!
//! The arena of a CPU plan is the shared placement ([`crate::placement`]: intermediates, graph
//! inputs, graph outputs, constants written once at load) under [`CPU_PLACEMENT`], then a scratch
//! region shared by the kernels (they run one after the other) for GEMM/attention working memory
//! and materialized operands. Weights are not in
//! the arena: the code reads entry `i` of the weights pointer array, prepared by the runtime as
//! [`WeightSlot`] `i` says (as is, transposed, or packed for the GEMM microkernel).

use std::collections::BTreeMap;

use kiln_runtime::cpu::{Binding, WeightPrep, WeightSlot};
use kiln_runtime::{DType, Error, Result};

use crate::kernel_ir::{BufferKind, KernelOp, KernelProgram, BufferView, WeightLayout};
use crate::pipeline::Lowered;
use crate::placement::{input_types, place, ConstantHome, IoPlace, Loc, PlacementPolicy};

/// Alignment of every region the layout places, in bytes.
pub const ALIGN: usize = 64;

/// The CPU's placement: 64-byte regions (a cache line, an AVX-512 vector), constants in the
/// arena (written at load), every graph input bound (the runtime writes each one).
pub const CPU_PLACEMENT: PlacementPolicy =
    PlacementPolicy { align: ALIGN, constants: ConstantHome::Arena, bind_unused_inputs: true };

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
    let KernelOp::Gemm { batch, m: _, n, k: kk, int_bounds, .. } = &k.op else { return None };
    let b = k.inputs.get(1)?;
    let buf = program.buffer(b.buffer);
    let BufferKind::Weight { index, layout, concat } = &buf.kind else { return None };
    if !buf.dtype.is_float() || b.strides[..batch.len()].iter().any(|&s| s != 0) {
        return None;
    }
    let r = b.rank();
    let (shape, transposed) = match layout {
        WeightLayout::AsIs => (buf.shape.clone(), false),
        WeightLayout::Transposed if buf.shape.len() == 2 => (vec![buf.shape[1], buf.shape[0]], true),
        WeightLayout::Transposed => return None,
    };
    let (offset, k, n, row_stride, col_stride) = (b.offset, *kk, *n, b.strides[r - 2], b.strides[r - 1]);
    // Integer operands (see `KernelOp::Gemm::int_bounds`): B packed as i16 pairs for the exact
    // integer GEMM, its bound checked when the runtime packs it.
    let prep = match int_bounds {
        Some((_, b_max)) if concat.is_none() => WeightPrep::PackedBI16 { transposed, offset, k, n, row_stride, col_stride, max_abs: *b_max },
        _ => WeightPrep::PackedB { transposed, offset, k, n, row_stride, col_stride },
    };
    Some(WeightSlot { index: *index, concat: concat.clone(), shape, dtype: DType::F32, prep })
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
        // Intermediates, graph inputs and outputs, constants: the shared placement.
        let inputs = input_types(&lowered.graph, lowered.bucket);
        let p = place(program, &plan.offsets, plan.arena_bytes, &inputs, CPU_PLACEMENT)?;
        for (i, loc) in p.locs.iter().enumerate() {
            l.base[i] = match *loc {
                Loc::Arena(off) => Some(Base::Arena(off)),
                // Read through a weight slot (below).
                Loc::Weight(_) => None,
                Loc::Const(_) => return Err(Error::internal("cpu layout", "a constant outside the arena")),
            };
        }
        let binding = |io: &IoPlace| Binding { offset: io.offset.unwrap_or(0), dtype: io.dtype, shape: io.shape.clone() };
        l.inputs = p.inputs.iter().map(binding).collect();
        l.outputs = p.outputs.iter().map(binding).collect();
        l.arena_init = p.arena_init;
        let end = p.end;
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
                if let BufferKind::Weight { index, layout, concat } = &buf.kind {
                    if l.base[t.buffer.index()].is_some() {
                        continue;
                    }
                    let (shape, prep) = match layout {
                        WeightLayout::AsIs => (buf.shape.clone(), WeightPrep::AsIs),
                        WeightLayout::Transposed if buf.shape.len() == 2 => {
                            (vec![buf.shape[1], buf.shape[0]], WeightPrep::Transposed)
                        }
                        WeightLayout::Transposed => {
                            return Err(Error::internal("cpu layout", format!("transposed weight b{} is not rank 2", t.buffer.0)))
                        }
                    };
                    let si = l.slot(WeightSlot { index: *index, concat: concat.clone(), shape, dtype: buf.dtype, prep });
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
