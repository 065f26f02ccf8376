//! Static memory planning: every arena buffer of a [`KernelProgram`] gets an offset in one
//! arena, so a plan allocates all its memory once.
//!
//! 1. **Liveness** over the schedule: a buffer is live from the kernel that writes it to the
//!    last kernel that reads it (inclusive; inputs and output of one kernel are live together).
//! 2. **In-place reuse**: an elementwise kernel (or a GEMM epilogue operand) whose input view is
//!    identical to its output view (contiguous, whole buffer, same size) and whose input dies
//!    at this kernel writes over that input (see the in-place contract in
//!    [`crate::kernel_ir`]). The two buffers then share one storage.
//! 3. **Offsets**: storages are placed greedily with best fit (the smallest gap between
//!    already-placed, time-overlapping storages that fits), for several orders (by size, by
//!    start, by size×lifetime…); the smallest arena wins. Sizes and offsets are multiples of
//!    [`ALIGN`] bytes.
//!
//! The report gives the arena size, the naive size (every intermediate its own memory) and a
//! lower bound (the largest total of storages live at one kernel), which no offset assignment
//! for these lifetimes can beat. [`check_plan`] verifies a plan independently of how it was
//! made (lifetimes recomputed from the program) and runs on every plan in debug builds.

use std::fmt::{self, Write};

use kiln_runtime::{Error, Result};
use serde::{Deserialize, Serialize};

use crate::kernel_ir::*;

/// Alignment of every arena offset, in bytes.
pub const ALIGN: usize = 64;

fn align_up(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// Where one arena buffer lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub buffer: BufferId,
    /// Byte offset in the arena (a multiple of [`ALIGN`]).
    pub offset: usize,
    /// Bytes of the buffer.
    pub bytes: usize,
    /// Index of the kernel that writes it.
    pub first: usize,
    /// Index of the last kernel that reads it (`first` when nothing reads it).
    pub last: usize,
    /// The buffer whose bytes this one reuses in place (an input of kernel `first`).
    pub inplace_of: Option<BufferId>,
}

/// The arena layout of one program.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryPlan {
    pub alignment: usize,
    /// Bytes of the arena.
    pub arena_bytes: usize,
    /// One entry per arena buffer, by buffer id.
    pub placements: Vec<Placement>,
    /// Sum of the (aligned) sizes of all arena buffers: memory with no reuse at all.
    pub naive_bytes: usize,
    /// Max over kernels of the (aligned) bytes of storages live there: no offset assignment
    /// for these lifetimes and in-place decisions can use less.
    pub lower_bound_bytes: usize,
    /// Byte offset of every buffer of the program that lives in the arena (by buffer index).
    pub offsets: Vec<Option<usize>>,
}

impl MemoryPlan {
    pub fn offset(&self, b: BufferId) -> Option<usize> {
        self.offsets.get(b.index()).copied().flatten()
    }
    /// `arena_bytes / lower_bound_bytes` (1 when there is nothing to place).
    pub fn ratio(&self) -> f64 {
        if self.lower_bound_bytes == 0 {
            1.0
        } else {
            self.arena_bytes as f64 / self.lower_bound_bytes as f64
        }
    }
    /// A deterministic listing: totals, then one line per arena buffer.
    pub fn print(&self, program: &KernelProgram) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "arena {} bytes, naive {} bytes, lower bound {} bytes, ratio {:.3}, align {}",
            self.arena_bytes,
            self.naive_bytes,
            self.lower_bound_bytes,
            self.ratio(),
            self.alignment
        );
        for p in &self.placements {
            let b = program.buffer(p.buffer);
            let inplace = p.inplace_of.map(|i| format!(" inplace-of {i}")).unwrap_or_default();
            let _ = writeln!(
                s,
                "{} [{:>8}, {:>8}) k{}..k{} {} \"{}\"{inplace}",
                p.buffer,
                p.offset,
                p.offset + p.bytes,
                p.first,
                p.last,
                b.bytes(),
                b.name
            );
        }
        s
    }
}

impl fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "arena {} bytes (naive {}, lower bound {}, ratio {:.3})",
            self.arena_bytes,
            self.naive_bytes,
            self.lower_bound_bytes,
            self.ratio()
        )
    }
}

/// Live range of every arena buffer, recomputed from the program: (first, last) by buffer index.
pub fn lifetimes(program: &KernelProgram) -> Vec<Option<(usize, usize)>> {
    let mut lt: Vec<Option<(usize, usize)>> = vec![None; program.buffers.len()];
    for (ki, k) in program.kernels.iter().enumerate() {
        let o = k.output.buffer.index();
        if program.buffers[o].is_arena() && lt[o].is_none() {
            lt[o] = Some((ki, ki));
        }
        for t in &k.inputs {
            if let Some((_, last)) = &mut lt[t.buffer.index()] {
                *last = (*last).max(ki);
            }
        }
    }
    lt
}

/// Whether kernel `k` may write its output over arena buffer `input` (which must die at `k`):
/// see the in-place contract in [`crate::kernel_ir`].
pub fn inplace_legal(program: &KernelProgram, k: &Kernel, input: BufferId) -> bool {
    let out = &k.output;
    let (ob, ib) = (program.buffer(out.buffer), program.buffer(input));
    if !ob.is_arena() || !ib.is_arena() || ob.bytes() != ib.bytes() || ob.dtype.size() != ib.dtype.size() {
        return false;
    }
    let first_operand = match &k.op {
        KernelOp::Elementwise { .. } => 0,
        KernelOp::Gemm { epilogue: Some(_), .. } => 2,
        _ => return false,
    };
    if !(out.offset == 0 && out.is_contiguous() && out.numel() == ob.numel()) {
        return false;
    }
    let mut seen = false;
    for (i, t) in k.inputs.iter().enumerate() {
        if t.buffer != input {
            continue;
        }
        // Every read of the input must be at the element the kernel writes at the same index.
        if i < first_operand || t.offset != out.offset || t.shape != out.shape || !t.is_contiguous() {
            return false;
        }
        seen = true;
    }
    seen
}

/// One storage: buffers sharing bytes through in-place chains.
#[derive(Debug, Clone)]
struct Storage {
    size: usize,
    first: usize,
    last: usize,
}

/// Plans the arena of `program`.
pub fn plan_memory(program: &KernelProgram) -> Result<MemoryPlan> {
    let lt = lifetimes(program);
    let nb = program.buffers.len();
    // Storage of every arena buffer, merging in-place pairs.
    let mut storage_of: Vec<Option<usize>> = vec![None; nb];
    let mut storages: Vec<Storage> = Vec::new();
    let mut inplace_of: Vec<Option<BufferId>> = vec![None; nb];
    for (ki, k) in program.kernels.iter().enumerate() {
        let o = k.output.buffer;
        let Some((first, last)) = lt[o.index()] else { continue };
        if first != ki {
            continue;
        }
        let mut reused = None;
        let mut cands: Vec<BufferId> = k.inputs.iter().map(|t| t.buffer).collect();
        cands.dedup();
        for b in cands {
            let dies_here = matches!(lt[b.index()], Some((_, l)) if l == ki);
            if dies_here && storage_of[b.index()].is_some() && inplace_legal(program, k, b) {
                reused = Some(b);
                break;
            }
        }
        let bytes = align_up(program.buffer(o).bytes().max(1));
        match reused {
            Some(b) => {
                let s = storage_of[b.index()].unwrap();
                storages[s].last = storages[s].last.max(last);
                storages[s].size = storages[s].size.max(bytes);
                storage_of[o.index()] = Some(s);
                inplace_of[o.index()] = Some(b);
            }
            None => {
                storages.push(Storage { size: bytes, first, last });
                storage_of[o.index()] = Some(storages.len() - 1);
            }
        }
    }

    // Lower bound: the most bytes live at one kernel.
    let nk = program.kernels.len();
    // (difference array, computed separately to stay in usize)
    let mut delta = vec![0i64; nk + 1];
    for s in &storages {
        delta[s.first] += s.size as i64;
        delta[s.last + 1] -= s.size as i64;
    }
    let mut cur = 0i64;
    let mut lower = 0i64;
    for d in delta.iter().take(nk) {
        cur += d;
        lower = lower.max(cur);
    }

    let offsets = assign_offsets(&storages);
    let arena_bytes = storages.iter().zip(&offsets).map(|(s, o)| o + s.size).max().unwrap_or(0);

    let mut placements = Vec::new();
    let mut buf_offsets = vec![None; nb];
    let mut naive = 0;
    for b in 0..nb {
        if let (Some(s), Some((first, last))) = (storage_of[b], lt[b]) {
            let bytes = program.buffers[b].bytes();
            naive += align_up(bytes.max(1));
            buf_offsets[b] = Some(offsets[s]);
            placements.push(Placement {
                buffer: BufferId(b as u32),
                offset: offsets[s],
                bytes,
                first,
                last,
                inplace_of: inplace_of[b],
            });
        }
    }
    let plan = MemoryPlan {
        alignment: ALIGN,
        arena_bytes,
        placements,
        naive_bytes: naive,
        lower_bound_bytes: lower as usize,
        offsets: buf_offsets,
    };
    if cfg!(debug_assertions) {
        check_plan(program, &plan)?;
    }
    Ok(plan)
}

/// Best-fit placement of `storages` for one order; returns offsets and the arena size.
fn place(storages: &[Storage], order: &[usize]) -> (Vec<usize>, usize) {
    let mut offsets = vec![usize::MAX; storages.len()];
    let mut placed: Vec<usize> = Vec::new();
    let mut arena = 0;
    for &i in order {
        let s = &storages[i];
        let mut busy: Vec<(usize, usize)> = placed
            .iter()
            .filter(|&&j| storages[j].first <= s.last && s.first <= storages[j].last)
            .map(|&j| (offsets[j], offsets[j] + storages[j].size))
            .collect();
        busy.sort_unstable();
        let mut best: Option<(usize, usize)> = None; // (gap, offset)
        let mut end = 0;
        for (a, b) in busy {
            if a > end {
                let gap = a - end;
                if gap >= s.size && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, end));
                }
            }
            end = end.max(b);
        }
        let off = best.map(|(_, o)| o).unwrap_or(end);
        offsets[i] = off;
        arena = arena.max(off + s.size);
        placed.push(i);
    }
    (offsets, arena)
}

fn assign_offsets(storages: &[Storage]) -> Vec<usize> {
    let n = storages.len();
    let idx: Vec<usize> = (0..n).collect();
    let life = |s: &Storage| s.last - s.first + 1;
    let mut orders: Vec<Vec<usize>> = Vec::new();
    let mut o = idx.clone();
    o.sort_by_key(|&i| (std::cmp::Reverse(storages[i].size), storages[i].first, i));
    orders.push(o);
    let mut o = idx.clone();
    o.sort_by_key(|&i| (storages[i].first, std::cmp::Reverse(storages[i].size), i));
    orders.push(o);
    let mut o = idx.clone();
    o.sort_by_key(|&i| (std::cmp::Reverse(storages[i].size * life(&storages[i])), i));
    orders.push(o);
    let mut o = idx.clone();
    o.sort_by_key(|&i| (std::cmp::Reverse(life(&storages[i])), std::cmp::Reverse(storages[i].size), i));
    orders.push(o);
    let mut o = idx;
    o.sort_by_key(|&i| (std::cmp::Reverse(storages[i].size), std::cmp::Reverse(life(&storages[i])), i));
    orders.push(o);
    let mut best: Option<(usize, Vec<usize>)> = None;
    for order in &orders {
        let (offs, arena) = place(storages, order);
        if best.as_ref().is_none_or(|(a, _)| arena < *a) {
            best = Some((arena, offs));
        }
    }
    best.map(|(_, o)| o).unwrap_or_default()
}

/// Verifies a plan against its program: every arena buffer placed, aligned, inside the arena;
/// no two buffers live at the same kernel share a byte unless they are a legal in-place pair
/// (the output of kernel `t` over an input that dies at `t`). Lifetimes are recomputed here.
pub fn check_plan(program: &KernelProgram, plan: &MemoryPlan) -> Result<()> {
    let err = |m: String| Error::internal("memory plan", m);
    let lt = lifetimes(program);
    let mut ranges = Vec::new();
    for (b, l) in lt.iter().enumerate() {
        let Some((first, last)) = *l else { continue };
        let off = plan.offsets.get(b).copied().flatten().ok_or_else(|| err(format!("b{b} has no offset")))?;
        let bytes = program.buffers[b].bytes();
        if plan.alignment == 0 || !off.is_multiple_of(plan.alignment) || !plan.alignment.is_multiple_of(ALIGN) {
            return Err(err(format!("b{b} at offset {off} is not {ALIGN}-byte aligned")));
        }
        if off + bytes > plan.arena_bytes {
            return Err(err(format!("b{b} [{off}, {}) runs past the arena of {} bytes", off + bytes, plan.arena_bytes)));
        }
        ranges.push((b, off, off + bytes, first, last));
    }
    for (b, o) in plan.offsets.iter().enumerate() {
        if o.is_some() && lt[b].is_none() {
            return Err(err(format!("b{b} is not an arena buffer but has an offset")));
        }
    }
    // Sweep by first use: compare each buffer with the ones still live when it starts.
    ranges.sort_by_key(|r| (r.3, r.0));
    for (i, a) in ranges.iter().enumerate() {
        for b in &ranges[i + 1..] {
            if b.3 > a.4 {
                break;
            }
            // a.first <= b.first <= a.last: live together at b.first.
            let overlap = a.1 < b.2 && b.1 < a.2;
            if !overlap {
                continue;
            }
            let legal = a.4 == b.3 && {
                let k = &program.kernels[b.3];
                k.output.buffer.index() == b.0 && inplace_legal(program, k, BufferId(a.0 as u32))
            };
            if !legal {
                return Err(err(format!(
                    "b{} [{}, {}) live k{}..k{} overlaps b{} [{}, {}) live k{}..k{}",
                    a.0, a.1, a.2, a.3, a.4, b.0, b.1, b.2, b.3, b.4
                )));
            }
        }
    }
    Ok(())
}
