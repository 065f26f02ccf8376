//! CUDA C emission: one `extern "C" __global__` kernel per [`Kernel`] of a [`KernelProgram`],
//! specialized from the templates of `kernels/cuda/` with the bucket's static shapes.
//!
//! Conventions of the emitted code:
//! - Each distinct buffer a kernel touches is one pointer parameter `pJ` (the output's is
//!   writable; inputs are `const`). `__restrict__` is only put on a pointer whose device bytes
//!   overlap no other parameter's (the memory plan may run an elementwise kernel in place).
//! - Views are folded into index arithmetic with constant offsets and strides. GPU plans are
//!   lowered with every weight in its checkpoint layout ([`super::LAYOUT_POLICY`]), so the CUDA
//!   backend uploads weights exactly once and as they are (its GEMM tiles go through shared
//!   memory, where either layout loads coalesced).
//! - Expressions compute in f32; loads convert to f32 and stores convert like Rust's `as`
//!   (see `kernels/cuda/prelude.cuh`); a copy of equal element types is a raw copy.
//!
//! Files: this one holds the per-kernel context (buffers, index arithmetic) and the program;
//! `pointwise`, `rows`, `gemm` and `attention` emit the kernel kinds.

use std::fmt::Write;

use kiln_runtime::graph::ReduceOp;
use kiln_runtime::{DType, Error, Result};

use super::expr::CudaPrims;
use super::template::{self, specialize};
use crate::ops;
use crate::placement::{place, ConstantHome, IoPlace, Loc, PlacementPolicy};
use crate::kernel_ir::{BufferId, BufferKind, Expr, ExprNode, Kernel, KernelOp, KernelProgram, NormKind, BufferView, WeightLayout};

mod attention;
mod gemm;
mod pointwise;
mod rows;

use attention::emit_attention;
use gemm::emit_gemm;
use pointwise::{emit_concat, emit_elementwise, emit_gather};
use rows::{emit_reduce, emit_row, RowKind};


/// Where a buffer's bytes live on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufLoc {
    /// `arena + offset`.
    Arena { offset: u64 },
    /// The uploaded buffer of graph weight `index` (checkpoint layout).
    Weight { index: u32 },
    /// Plan constant `index`.
    Const { index: u32 },
}

/// Device placement of every buffer of a program: the shared placement
/// ([`crate::placement`]) under [`CUDA_PLACEMENT`], in the plan's integer widths.
#[derive(Debug, Clone, PartialEq)]
pub struct DevicePlacement {
    pub locs: Vec<BufLoc>,
    pub arena_bytes: u64,
    /// Bytes of each plan constant (the buffer's dtype, little-endian).
    pub constants: Vec<Vec<u8>>,
    /// Each graph input's slot (`None` offset: no kernel reads it; the runtime checks its type
    /// and copies nothing).
    pub inputs: Vec<IoPlace>,
    pub outputs: Vec<IoPlace>,
}

/// The GPU's placement: 256-byte regions (what `cudaMalloc` guarantees, so vector loads of any
/// width stay aligned), constants in their own device buffers, unread inputs unbound.
pub const CUDA_PLACEMENT: PlacementPolicy =
    PlacementPolicy { align: 256, constants: ConstantHome::OwnBuffers, bind_unused_inputs: false };

const ALIGN: u64 = CUDA_PLACEMENT.align as u64;

fn align_up(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

impl DevicePlacement {
    /// Places the program's buffers: arena buffers at the memory plan's `offsets` (indexed like
    /// `program.buffers`, `Some` for every [`BufferKind::Arena`] buffer) inside `planned_bytes`;
    /// graph inputs (of the types `inputs` gives) and outputs in their own slots after that;
    /// weights and constants in their own device buffers.
    pub fn new(
        program: &KernelProgram,
        offsets: &[Option<usize>],
        planned_bytes: usize,
        inputs: &[(DType, Vec<usize>)],
    ) -> Result<DevicePlacement> {
        let p = place(program, offsets, planned_bytes, inputs, CUDA_PLACEMENT)?;
        let locs = p
            .locs
            .iter()
            .map(|l| match *l {
                Loc::Arena(offset) => BufLoc::Arena { offset: offset as u64 },
                Loc::Weight(index) => BufLoc::Weight { index: index as u32 },
                Loc::Const(index) => BufLoc::Const { index: index as u32 },
            })
            .collect();
        Ok(DevicePlacement { locs, arena_bytes: p.end as u64, constants: p.constants, inputs: p.inputs, outputs: p.outputs })
    }

    /// A placement without a memory plan (hand-built programs in tests): every arena buffer
    /// gets its own slot (no reuse), inputs the types of their buffers.
    pub fn unshared(program: &KernelProgram) -> DevicePlacement {
        let mut offsets = Vec::with_capacity(program.buffers.len());
        let mut next = 0u64;
        for b in &program.buffers {
            if b.is_arena() {
                offsets.push(Some(next as usize));
                next = align_up(next + b.bytes() as u64);
            } else {
                offsets.push(None);
            }
        }
        let inputs: Vec<(DType, Vec<usize>)> = program
            .inputs
            .iter()
            .map(|b| b.map_or((DType::F32, vec![0]), |b| (program.buffer(b).dtype, program.buffer(b).shape.clone())))
            .collect();
        DevicePlacement::new(program, &offsets, next as usize, &inputs).expect("an unshared placement is valid")
    }

    fn byte_range(&self, program: &KernelProgram, b: BufferId) -> (u8, u64, u64) {
        let len = program.buffer(b).bytes() as u64;
        match self.locs[b.index()] {
            BufLoc::Arena { offset } => (0, offset, offset + len),
            BufLoc::Weight { index } => (1, (index as u64) << 40, ((index as u64) << 40) + len),
            BufLoc::Const { index } => (2, (index as u64) << 40, ((index as u64) << 40) + len),
        }
    }
}

/// The target of emission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaTarget {
    /// e.g. `sm_90`.
    pub arch: String,
    /// e.g. 90.
    pub sm: u32,
    /// How f32 GEMMs are tiled: `None` picks per shape ([`GemmTile::pick`]); a fixed tile is for
    /// measuring variants against each other (`profile_buckets` in compiler/tests/cuda_device.rs).
    pub gemm_tile: Option<GemmTile>,
}

/// One tiling of the f32 SIMT GEMM template (kernels/cuda/gemm_simt.cuh): a `bm`x`bn` output
/// tile per block of (`bm`/`tm`)·(`bn`/`tn`) threads, each owning a `tm`x`tn` register tile, and
/// whether the next k slice's global loads are issued before this slice's arithmetic.
///
/// With `split`, a thread's rows and columns come in groups of 4 spread over the block tile
/// (rows `ty*4 + i + g*(bm*4/tm)`), not `tm` adjacent ones: 16 lanes reading 4 adjacent floats
/// each then cover 256 contiguous bytes of shared memory (2 wavefronts) where `tn` = 8 adjacent
/// would stride 32 bytes apart (4). Needs `tm` and `tn` multiples of 4.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmTile {
    pub bm: usize,
    pub bn: usize,
    pub tm: usize,
    pub tn: usize,
    pub prefetch: bool,
    pub split: bool,
}

impl GemmTile {
    pub const T128X128: GemmTile = GemmTile { bm: 128, bn: 128, tm: 8, tn: 8, prefetch: true, split: true };
    pub const T128X64: GemmTile = GemmTile { bm: 128, bn: 64, tm: 8, tn: 4, prefetch: true, split: false };
    pub const T64X64: GemmTile = GemmTile { bm: 64, bn: 64, tm: 4, tn: 4, prefetch: true, split: false };
    pub const T32X32: GemmTile = GemmTile { bm: 32, bn: 32, tm: 2, tn: 2, prefetch: true, split: false };
    /// The tilings there are, largest first.
    pub const ALL: [GemmTile; 4] = [Self::T128X128, Self::T128X64, Self::T64X64, Self::T32X32];

    /// The tile for `nbatch` GEMMs of `m`x`n`: 128x64 where that still gives about two blocks
    /// per SM of a large GPU (132 SMs on an H100/H200), else 64x64 where that gives at least 96
    /// blocks, else 32x32 (most parallel). Measured on an H200 (`profile_buckets`, every GEMM of
    /// MiniLM forced to each tile, m = 1024, 4096, 16384): 128x64 ran 32-35 TFLOP/s at
    /// m = 16384, 64x64 28-29, 128x128 28-30 with split fragments (23-28 without; a 64x128
    /// split tile 30-32); at m = 4096, n = 384 (192 blocks of 128x64) 64x64 won by 8%; at
    /// m = 1024, n = 384 (96 blocks of 64x64), 64x64 beat 32x32 by 9% and 128x64 by 35%.
    pub fn pick(nbatch: usize, m: usize, n: usize) -> GemmTile {
        let blocks = |t: &GemmTile| m.div_ceil(t.bm) * n.div_ceil(t.bn) * nbatch.max(1);
        if blocks(&Self::T128X64) >= 264 {
            Self::T128X64
        } else if blocks(&Self::T64X64) >= 96 {
            Self::T64X64
        } else {
            Self::T32X32
        }
    }

    pub fn threads(&self) -> usize {
        (self.bm / self.tm) * (self.bn / self.tn)
    }
}

impl CudaTarget {
    pub fn new(arch: &str) -> Result<CudaTarget> {
        let (maj, min) = kiln_runtime::cuda::parse_arch(arch)
            .ok_or_else(|| Error::Unsupported(format!("`{arch}` is not a CUDA architecture (sm_XY)")))?;
        if maj < 7 {
            return Err(Error::Unsupported(format!("CUDA architecture {arch}: kiln needs sm_70 or newer")));
        }
        Ok(CudaTarget { arch: arch.to_string(), sm: maj * 10 + min, gemm_tile: None })
    }
    /// The same target with every f32 GEMM tiled as `tile`.
    pub fn with_gemm_tile(mut self, tile: GemmTile) -> CudaTarget {
        self.gemm_tile = Some(tile);
        self
    }
    /// Whether f16/bf16 GEMMs use `mma.sync.m16n8k16` (sm_80+).
    pub fn has_mma_m16n8k16(&self) -> bool {
        self.sm >= 80
    }
}

/// One kernel parameter: the buffer it points at.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    pub buffer: BufferId,
    /// The C pointer type, e.g. `const float*`.
    pub ty: String,
    /// The C declaration, e.g. `const float* __restrict__ p0`.
    pub decl: String,
}

/// One emitted kernel and how to launch it.
#[derive(Debug, Clone, PartialEq)]
pub struct EmittedKernel {
    pub name: String,
    /// The kernel IR kind (`gemm`, `layer_norm`, ...) and the template variant.
    pub kind: String,
    pub source: String,
    pub params: Vec<Param>,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
}

/// The CUDA C of a whole program: the prelude once, then every kernel in execution order.
#[derive(Debug, Clone, PartialEq)]
pub struct EmittedModule {
    pub target: CudaTarget,
    pub source: String,
    pub kernels: Vec<EmittedKernel>,
}

/// Emits every kernel of `program` for `target` with buffers at `place`.
pub fn emit_program(program: &KernelProgram, place: &DevicePlacement, target: &CudaTarget) -> Result<EmittedModule> {
    let mut kernels = Vec::with_capacity(program.kernels.len());
    for (i, k) in program.kernels.iter().enumerate() {
        kernels.push(emit_kernel(program, place, target, i, k)?);
    }
    let mut source = String::new();
    let _ = writeln!(
        source,
        "// Generated by kiln for {} (bucket {}): {} kernels.\n",
        target.arch,
        program.bucket,
        kernels.len()
    );
    source.push_str(template::PRELUDE);
    for k in &kernels {
        source.push('\n');
        source.push_str(&k.source);
    }
    Ok(EmittedModule { target: target.clone(), source, kernels })
}

fn c_type(dt: DType) -> &'static str {
    match dt {
        DType::F32 => "float",
        DType::F16 => "kiln_f16",
        DType::BF16 => "kiln_bf16",
        DType::I64 => "long long",
        DType::I32 => "int",
    }
}

/// A value of element type `dt` converted to f32.
fn to_f32(dt: DType, raw: &str) -> String {
    match dt {
        DType::F32 => raw.to_string(),
        DType::F16 => format!("kiln_f16_to_f32({raw})"),
        DType::BF16 => format!("kiln_bf16_to_f32({raw})"),
        DType::I64 | DType::I32 => format!("(float)({raw})"),
    }
}

/// An f32 value converted to element type `dt`, like Rust's `as`.
fn from_f32(dt: DType, v: &str) -> String {
    match dt {
        DType::F32 => v.to_string(),
        DType::F16 => format!("kiln_f32_to_f16({v})"),
        DType::BF16 => format!("kiln_f32_to_bf16({v})"),
        DType::I64 => format!("kiln_f32_to_i64({v})"),
        DType::I32 => format!("kiln_f32_to_i32({v})"),
    }
}

/// A C float literal for `v`.
pub fn f32_lit(v: f32) -> String {
    if v.is_nan() {
        "__int_as_float(0x7fc00000)".into()
    } else if v == f32::INFINITY {
        "KILN_INF".into()
    } else if v == f32::NEG_INFINITY {
        "(-KILN_INF)".into()
    } else {
        let s = format!("{v:e}");
        // `{:e}` is the shortest round-trip form (`1e-12`, `-2.5e0`): valid C with an `f`.
        format!("{s}f")
    }
}

/// Integer index arithmetic type of a kernel: 32-bit when every buffer it touches is small.
#[derive(Clone, Copy)]
struct Idx {
    wide: bool,
}

impl Idx {
    fn ty(self) -> &'static str {
        if self.wide {
            "unsigned long long"
        } else {
            "unsigned"
        }
    }
    fn lit(self, v: u64) -> String {
        if self.wide {
            format!("{v}ull")
        } else {
            format!("{v}u")
        }
    }
    fn coord(self, c: &str) -> String {
        if self.wide {
            format!("(unsigned long long){c}")
        } else {
            c.to_string()
        }
    }
}

struct Ctx<'a> {
    prog: &'a KernelProgram,
    kernel: &'a Kernel,
    name: String,
    params: Vec<Param>,
    idx: Idx,
}

impl<'a> Ctx<'a> {
    fn new(prog: &'a KernelProgram, place: &DevicePlacement, index: usize, kernel: &'a Kernel) -> Result<Ctx<'a>> {
        let mut bufs: Vec<BufferId> = Vec::new();
        for t in kernel.inputs.iter().chain(std::iter::once(&kernel.output)) {
            if !bufs.contains(&t.buffer) {
                bufs.push(t.buffer);
            }
        }
        for &b in &bufs {
            if b.index() >= prog.buffers.len() {
                return Err(Error::internal("cuda emit", format!("kernel `{}` names buffer {b}, which does not exist", kernel.name)));
            }
        }
        let ranges: Vec<_> = bufs.iter().map(|&b| place.byte_range(prog, b)).collect();
        let mut params = Vec::new();
        for (j, &b) in bufs.iter().enumerate() {
            let written = b == kernel.output.buffer;
            let (sp, lo, hi) = ranges[j];
            let alone = ranges.iter().enumerate().all(|(o, &(so, l2, h2))| o == j || so != sp || hi <= l2 || h2 <= lo);
            let dt = prog.buffer(b).dtype;
            let ty = format!("{}{}*", if written { "" } else { "const " }, c_type(dt));
            let decl = format!("{ty} {}p{j}", if alone { "__restrict__ " } else { "" });
            params.push(Param { buffer: b, ty, decl });
        }
        let wide = bufs.iter().any(|&b| prog.buffer(b).numel() >= (1usize << 31));
        let kind = kernel.op.kind_name();
        Ok(Ctx { prog, kernel, name: format!("k{index}_{kind}"), params, idx: Idx { wide } })
    }

    fn param_list(&self) -> String {
        self.params.iter().map(|p| p.decl.clone()).collect::<Vec<_>>().join(", ")
    }

    fn p(&self, b: BufferId) -> String {
        let j = self.params.iter().position(|p| p.buffer == b).expect("every buffer of the kernel is a parameter");
        format!("p{j}")
    }

    fn dtype(&self, b: BufferId) -> DType {
        self.prog.buffer(b).dtype
    }

    fn err(&self, m: impl std::fmt::Display) -> Error {
        Error::Unsupported(format!("CUDA backend, kernel `{}` ({}): {m}", self.kernel.name, self.kernel.op.kind_name()))
    }

    /// The view as the device stores it. GPU plans are lowered with weights in their checkpoint
    /// layout ([`super::LAYOUT_POLICY`]); a program lowered for another target's layout is a
    /// kiln bug, refused rather than misread.
    fn device_view(&self, v: &BufferView) -> Result<BufferView> {
        let b = self.prog.buffer(v.buffer);
        if matches!(&b.kind, BufferKind::Weight { concat: Some(_), .. }) {
            return Err(Error::internal(
                "cuda emit",
                format!("weight `{}` is a concatenation the CPU's layout made (GPU plans read checkpoint tensors)", b.name),
            ));
        }
        if matches!(b.kind, BufferKind::Weight { layout: WeightLayout::Transposed, .. }) {
            return Err(Error::internal(
                "cuda emit",
                format!("weight `{}` is laid out for another target (lower GPU plans with LayoutPolicy::Checkpoint)", b.name),
            ));
        }
        Ok(v.clone())
    }

    /// Element index of `v` at coordinates `coords` (C expressions, one per dim; dims of size
    /// 1 are skipped, so their coordinate may be anything).
    fn index(&self, v: &BufferView, coords: &[String]) -> Result<String> {
        let v = self.device_view(v)?;
        debug_assert_eq!(coords.len(), v.rank());
        let mut terms = Vec::new();
        if v.offset != 0 {
            terms.push(self.idx.lit(v.offset as u64));
        }
        for ((&n, &s), c) in v.shape.iter().zip(&v.strides).zip(coords) {
            if n == 1 || s == 0 {
                continue;
            }
            if s == 1 {
                terms.push(self.idx.coord(c));
            } else {
                terms.push(format!("{} * {}", self.idx.coord(c), self.idx.lit(s as u64)));
            }
        }
        Ok(if terms.is_empty() { self.idx.lit(0) } else { terms.join(" + ") })
    }

    /// `base + coords·strides` of the trailing dims of `v` (`base` an index variable of the
    /// leading dims, from [`Ctx::index`] over a prefix of coordinates).
    fn split_index(&self, v: &BufferView, lead: usize, lead_coords: &[String]) -> Result<(String, BufferView)> {
        let dv = self.device_view(v)?;
        let head = BufferView {
            buffer: dv.buffer,
            offset: dv.offset,
            shape: dv.shape[..lead].to_vec(),
            strides: dv.strides[..lead].to_vec(),
        };
        let tail = BufferView { buffer: dv.buffer, offset: 0, shape: dv.shape[lead..].to_vec(), strides: dv.strides[lead..].to_vec() };
        let base = {
            let mut terms = Vec::new();
            if head.offset != 0 {
                terms.push(self.idx.lit(head.offset as u64));
            }
            for ((&n, &s), c) in head.shape.iter().zip(&head.strides).zip(lead_coords) {
                if n == 1 || s == 0 {
                    continue;
                }
                terms.push(if s == 1 { self.idx.coord(c) } else { format!("{} * {}", self.idx.coord(c), self.idx.lit(s as u64)) });
            }
            if terms.is_empty() {
                self.idx.lit(0)
            } else {
                terms.join(" + ")
            }
        };
        Ok((base, tail))
    }

    /// Tail index relative to a base variable (tail views are already in device layout).
    fn tail_index(&self, base: &str, tail: &BufferView, coords: &[String]) -> String {
        let mut terms = vec![base.to_string()];
        for ((&n, &s), c) in tail.shape.iter().zip(&tail.strides).zip(coords) {
            if n == 1 || s == 0 {
                continue;
            }
            terms.push(if s == 1 { self.idx.coord(c) } else { format!("{} * {}", self.idx.coord(c), self.idx.lit(s as u64)) });
        }
        terms.join(" + ")
    }

    fn load_f32(&self, b: BufferId, index: &str) -> String {
        to_f32(self.dtype(b), &format!("{}[{index}]", self.p(b)))
    }

    fn store_f32(&self, b: BufferId, index: &str, v: &str) -> String {
        format!("{}[{index}] = {};", self.p(b), from_f32(self.dtype(b), v))
    }

    fn check_shape(&self, what: &str, v: &BufferView, shape: &[usize]) -> Result<()> {
        if v.shape != shape || v.strides.len() != shape.len() {
            return Err(Error::internal("cuda emit", format!(
                "kernel `{}`: {what} view has shape {:?}, the kernel needs {shape:?}",
                self.kernel.name, v.shape
            )));
        }
        Ok(())
    }
}

/// Statements decomposing the linear index `lin` over `shape` into `const unsigned {prefix}d`
/// (32-bit division by constants when the shape has fewer than 2^32 elements).
fn coords_code(indent: &str, lin: &str, shape: &[usize], prefix: &str) -> (String, Vec<String>) {
    let mut code = String::new();
    let names: Vec<String> = (0..shape.len()).map(|d| format!("{prefix}{d}")).collect();
    if shape.is_empty() {
        return (code, names);
    }
    let narrow = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64)).is_some_and(|n| n <= u32::MAX as u64);
    let (ty, suf) = if narrow { ("unsigned", "u") } else { ("unsigned long long", "ull") };
    let _ = writeln!(code, "{indent}{ty} {prefix}r = ({ty})({lin});");
    for d in (0..shape.len()).rev() {
        if d == 0 {
            let _ = writeln!(code, "{indent}const unsigned {prefix}{d} = (unsigned){prefix}r;");
        } else if shape[d] == 1 {
            let _ = writeln!(code, "{indent}const unsigned {prefix}{d} = 0u;");
        } else {
            let _ = writeln!(
                code,
                "{indent}const unsigned {prefix}{d} = (unsigned)({prefix}r % {n}{suf}); {prefix}r /= {n}{suf};",
                n = shape[d]
            );
        }
    }
    let _ = writeln!(code, "{indent}(void){prefix}r;");
    (code, names)
}

/// C statements evaluating `expr` into `const float {prefix}N` variables; returns the code and
/// the name of the root's variable. `load(k)` gives the f32 value of kernel input `k`.
fn expr_code(
    expr: &Expr,
    prefix: &str,
    indent: &str,
    load: &mut dyn FnMut(usize) -> Result<String>,
    acc: Option<&str>,
) -> Result<(String, String)> {
    if expr.nodes.is_empty() {
        return Err(Error::internal("cuda emit", "empty expression"));
    }
    let mut code = String::new();
    let v = |i: u32| format!("{prefix}{i}");
    for (i, n) in expr.nodes.iter().enumerate() {
        for operand in match n {
            ExprNode::Unary(_, a) | ExprNode::Cast(_, a) => vec![*a],
            ExprNode::Binary(_, a, b) => vec![*a, *b],
            ExprNode::Select(c, a, b) => vec![*c, *a, *b],
            _ => vec![],
        } {
            if operand as usize >= i {
                return Err(Error::internal("cuda emit", format!("expression node {i} uses later node {operand}")));
            }
        }
        let rhs = match n {
            ExprNode::Load(k) => load(*k)?,
            ExprNode::Acc => acc.ok_or_else(|| Error::internal("cuda emit", "`acc` outside a GEMM epilogue"))?.to_string(),
            ExprNode::Const(c) => f32_lit(*c),
            ExprNode::Unary(op, a) => {
                let mut p = CudaPrims::new(format!("{prefix}{i}_"));
                let x = p.input(v(*a));
                let y = ops::unary::apply(&mut p, *op, x);
                p.finish(y, &v(i as u32), &mut code, indent);
                continue;
            }
            ExprNode::Binary(op, a, b) => {
                let mut p = CudaPrims::new(format!("{prefix}{i}_"));
                let (a, b) = (p.input(v(*a)), p.input(v(*b)));
                let y = ops::binary::apply(&mut p, *op, false, a, b);
                p.finish(y, &v(i as u32), &mut code, indent);
                continue;
            }
            ExprNode::Select(c, a, b) => format!("{} != 0.0f ? {} : {}", v(*c), v(*a), v(*b)),
            ExprNode::Cast(dt, a) => {
                let a = v(*a);
                match dt {
                    DType::F32 => a,
                    DType::F16 => format!("kiln_f16_to_f32(kiln_f32_to_f16({a}))"),
                    DType::BF16 => format!("kiln_bf16_to_f32(kiln_f32_to_bf16({a}))"),
                    DType::I64 => format!("(float)kiln_f32_to_i64({a})"),
                    DType::I32 => format!("(float)kiln_f32_to_i32({a})"),
                }
            }
        };
        let _ = writeln!(code, "{indent}const float {prefix}{i} = {rhs};");
    }
    Ok((code, v(expr.root())))
}

fn grid_1d(ctx: &Ctx, n: u64, per_block: u64) -> Result<[u32; 3]> {
    let blocks = n.div_ceil(per_block).max(1);
    if blocks > i32::MAX as u64 {
        return Err(ctx.err(format!("{n} elements need {blocks} blocks")));
    }
    Ok([blocks as u32, 1, 1])
}

fn emit_kernel(prog: &KernelProgram, place: &DevicePlacement, target: &CudaTarget, index: usize, k: &Kernel) -> Result<EmittedKernel> {
    let ctx = Ctx::new(prog, place, index, k)?;
    let out = emit_kernel_body(&ctx, target)?;
    let shared = static_shared_bytes(&out.kind);
    Ok(EmittedKernel {
        name: ctx.name.clone(),
        kind: out.kind,
        source: out.source,
        params: ctx.params.clone(),
        grid: out.grid,
        block: out.block,
        shared_bytes: shared,
    })
}

/// Dynamic shared memory a template variant needs (all of kiln's templates use static shared
/// memory, so 0).
fn static_shared_bytes(_kind: &str) -> u32 {
    0
}

struct Body {
    kind: String,
    source: String,
    grid: [u32; 3],
    block: [u32; 3],
}

fn emit_kernel_body(ctx: &Ctx, target: &CudaTarget) -> Result<Body> {
    let k = ctx.kernel;
    match &k.op {
        KernelOp::Elementwise { expr } => emit_elementwise(ctx, expr),
        KernelOp::Gemm { batch, m, n, k: kk, alpha, epilogue, .. } => {
            emit_gemm(ctx, target, batch, *m, *n, *kk, *alpha, epilogue.as_ref())
        }
        KernelOp::Norm { kind, eps, prologue, gamma, beta } => {
            emit_row(ctx, RowKind::Norm { kind: *kind, eps: *eps, gamma: *gamma, beta: *beta }, prologue)
        }
        KernelOp::Softmax { prologue } => emit_row(ctx, RowKind::Softmax, prologue),
        KernelOp::Attention { batch, seq_q, seq_kv, head_dim, v_dim, scale, mask, zero_nan_rows } => {
            emit_attention(ctx, batch, *seq_q, *seq_kv, *head_dim, *v_dim, *scale, *mask, *zero_nan_rows)
        }
        KernelOp::Gather => emit_gather(ctx),
        KernelOp::Reduce { op, shape, reduced_dims, prologue } => emit_reduce(ctx, *op, shape, *reduced_dims, prologue),
        KernelOp::Concat { axis } => emit_concat(ctx, *axis),
    }
}

/// `const IDX {name} = base;` lines for the views `views` at batch coordinates `zc`.
fn batch_code(ctx: &Ctx, batch: &[usize], zc_names: &[String], views: &[(&str, &BufferView)]) -> Result<(String, Vec<BufferView>)> {
    let mut code = String::new();
    let mut tails = Vec::new();
    for (name, v) in views {
        let (base, tail) = ctx.split_index(v, batch.len(), zc_names)?;
        let _ = writeln!(code, "    const {} {name} = {base};", ctx.idx.ty());
        tails.push(tail);
    }
    Ok((code, tails))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_literals_are_c() {
        assert_eq!(f32_lit(1.0), "1e0f");
        assert_eq!(f32_lit(1e-12), "1e-12f");
        assert_eq!(f32_lit(-0.125), "-1.25e-1f");
        assert_eq!(f32_lit(f32::NEG_INFINITY), "(-KILN_INF)");
        let x = 0.1f32;
        let s = f32_lit(x);
        assert_eq!(s.trim_end_matches('f').parse::<f32>().unwrap(), x);
    }

    #[test]
    fn coords_decompose_row_major() {
        let (code, names) = coords_code("", "i", &[2, 1, 5], "c");
        assert_eq!(names, vec!["c0", "c1", "c2"]);
        assert!(code.contains("const unsigned c2 = (unsigned)(cr % 5u); cr /= 5u;"));
        assert!(code.contains("const unsigned c1 = 0u;"));
        assert!(code.contains("const unsigned c0 = (unsigned)cr;"));
    }
}
