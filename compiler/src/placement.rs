//! Where every buffer of a kernel program lives — the one placement that the CPU and CUDA code
//! generators (and the host emulator of the CUDA C) build on, parameterized by the target's
//! [`PlacementPolicy`]:
//!
//! 1. intermediates at the memory plan's offsets (`0..planned_bytes`);
//! 2. then one slot per graph input, in graph order (an input no kernel reads gets a slot only
//!    if the policy binds unused inputs: the CPU runtime writes every input, the GPU runtime
//!    checks and skips it);
//! 3. then one slot per graph output, in graph order;
//! 4. then the constants, when the policy keeps them in the arena (CPU: written at load); a GPU
//!    plan keeps each in its own device buffer instead;
//! 5. weights are never in the arena: a kernel reads weight-table entry `i` (how the CPU stores
//!    it — as is, transposed, packed — is its code generator's business: `codegen::cpu::layout`).
//!
//! Every region starts at a multiple of the policy's alignment. Weights reach placement in the
//! layout the `layout` pass chose for the target ([`crate::passes::layout::LayoutPolicy`]), so no
//! target undoes another's decision.

use kiln_runtime::{DType, Error, Result, TensorData};

use kiln_runtime::graph::{Bucket, Graph};

use crate::kernel_ir::{BufferId, BufferKind, KernelProgram};

/// Each graph input's dtype and shape in `bucket`: what [`place`] needs for inputs the program
/// does not read.
pub fn input_types(graph: &Graph, bucket: Bucket) -> Vec<(DType, Vec<usize>)> {
    graph.inputs.iter().map(|s| (s.dtype, s.shape.iter().map(|d| d.resolve(bucket)).collect())).collect()
}

/// Where constants live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConstantHome {
    /// In the arena, written once when the plan is loaded.
    Arena,
    /// Each in a buffer of its own, owned by the plan.
    OwnBuffers,
}

/// What a target asks of placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacementPolicy {
    /// Alignment of every region, in bytes.
    pub align: usize,
    pub constants: ConstantHome,
    /// Whether a graph input no kernel reads still gets an arena slot.
    pub bind_unused_inputs: bool,
}

/// Where a buffer's element 0 is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loc {
    /// At this byte offset of the arena.
    Arena(usize),
    /// Weight-table entry `index`, outside the arena.
    Weight(usize),
    /// Constant `index` of [`Placement::constants`], in its own buffer.
    Const(usize),
}

/// A graph input or output's slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoPlace {
    /// Arena byte offset; `None` for an input no kernel reads (when the policy does not bind it).
    pub offset: Option<usize>,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl IoPlace {
    pub fn bytes(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// By buffer index.
    pub locs: Vec<Loc>,
    /// By graph input.
    pub inputs: Vec<IoPlace>,
    /// By graph output.
    pub outputs: Vec<IoPlace>,
    /// Constants in their own buffers ([`ConstantHome::OwnBuffers`]), little-endian bytes.
    pub constants: Vec<Vec<u8>>,
    /// Constants in the arena ([`ConstantHome::Arena`]): `(offset, bytes)` written at load.
    pub arena_init: Vec<(usize, Vec<u8>)>,
    /// End of the placed regions (aligned): where a target's own regions (scratch) may start.
    pub end: usize,
}

/// The bytes of a constant buffer's values in its dtype.
pub fn constant_bytes(dtype: DType, values: &[f32]) -> Vec<u8> {
    TensorData::F32(values.to_vec()).convert(dtype).to_le_bytes()
}

/// Places `program`'s buffers. `offsets` (indexed like `program.buffers`) and `planned_bytes`
/// are the memory plan's; `inputs` gives each graph input's dtype and concrete shape (for an
/// input no kernel reads, whose type the program does not record).
pub fn place(
    program: &KernelProgram,
    offsets: &[Option<usize>],
    planned_bytes: usize,
    inputs: &[(DType, Vec<usize>)],
    policy: PlacementPolicy,
) -> Result<Placement> {
    let internal = |m: String| Error::internal("placement", m);
    let align = |n: usize| n.div_ceil(policy.align) * policy.align;
    if offsets.len() != program.buffers.len() || inputs.len() != program.inputs.len() {
        return Err(internal(format!(
            "memory plan covers {} buffers and {} inputs, the program has {} and {}",
            offsets.len(),
            inputs.len(),
            program.buffers.len(),
            program.inputs.len()
        )));
    }
    let mut locs = Vec::with_capacity(program.buffers.len());
    for (i, b) in program.buffers.iter().enumerate() {
        locs.push(match &b.kind {
            BufferKind::Arena => {
                let off = offsets[i].ok_or_else(|| internal(format!("arena buffer b{i} (`{}`) has no offset", b.name)))?;
                if off.checked_add(b.bytes()).is_none_or(|e| e > planned_bytes) {
                    return Err(internal(format!(
                        "b{i} (`{}`, {} bytes) at {off} runs past the {planned_bytes}-byte plan",
                        b.name,
                        b.bytes()
                    )));
                }
                Loc::Arena(off)
            }
            BufferKind::Weight { index, .. } => Loc::Weight(*index),
            // Placed below.
            BufferKind::Input { .. } | BufferKind::Output { .. } | BufferKind::Constant { .. } => Loc::Arena(usize::MAX),
        });
    }
    let mut end = align(planned_bytes);
    let mut slot = |locs: &mut Vec<Loc>, b: Option<BufferId>, dtype: DType, shape: Vec<usize>| {
        let io = IoPlace { offset: Some(end), dtype, shape };
        if let Some(b) = b {
            locs[b.index()] = Loc::Arena(end);
        }
        end = align(end + io.bytes());
        io
    };
    let mut in_places = Vec::with_capacity(inputs.len());
    for (gi, (dtype, shape)) in inputs.iter().enumerate() {
        in_places.push(match program.inputs[gi] {
            Some(b) => {
                let buf = program.buffer(b);
                slot(&mut locs, Some(b), buf.dtype, buf.shape.clone())
            }
            None if policy.bind_unused_inputs => slot(&mut locs, None, *dtype, shape.clone()),
            None => IoPlace { offset: None, dtype: *dtype, shape: shape.clone() },
        });
    }
    let mut out_places = Vec::with_capacity(program.outputs.len());
    for &b in &program.outputs {
        let buf = program.buffer(b);
        out_places.push(slot(&mut locs, Some(b), buf.dtype, buf.shape.clone()));
    }
    let (mut constants, mut arena_init) = (Vec::new(), Vec::new());
    for (i, b) in program.buffers.iter().enumerate() {
        if let BufferKind::Constant { values } = &b.kind {
            if values.len() != b.numel() {
                return Err(internal(format!("constant b{i} has {} values for shape {:?}", values.len(), b.shape)));
            }
            let bytes = constant_bytes(b.dtype, values);
            locs[i] = match policy.constants {
                ConstantHome::Arena => {
                    let (off, n) = (end, bytes.len());
                    arena_init.push((off, bytes));
                    end = align(end + n);
                    Loc::Arena(off)
                }
                ConstantHome::OwnBuffers => {
                    constants.push(bytes);
                    Loc::Const(constants.len() - 1)
                }
            };
        }
    }
    if let Some(i) = locs.iter().position(|l| *l == Loc::Arena(usize::MAX)) {
        return Err(internal(format!("b{i} (`{}`) is an input or output of no graph slot", program.buffers[i].name)));
    }
    Ok(Placement { locs, inputs: in_places, outputs: out_places, constants, arena_init, end })
}
