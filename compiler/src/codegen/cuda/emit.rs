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

use std::fmt::Write;

use kiln_runtime::graph::ReduceOp;
use kiln_runtime::{DType, Error, Result};

use super::expr::CudaPrims;
use super::template::{self, specialize};
use crate::ops;
use crate::placement::{place, ConstantHome, IoPlace, Loc, PlacementPolicy};
use crate::kernel_ir::{BufferId, BufferKind, Expr, ExprNode, Kernel, KernelOp, KernelProgram, NormKind, BufferView, WeightLayout};

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
        KernelOp::Gemm { batch, m, n, k: kk, alpha, epilogue } => {
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

fn emit_elementwise(ctx: &Ctx, expr: &Expr) -> Result<Body> {
    let k = ctx.kernel;
    let shape = k.output.shape.clone();
    let numel: usize = shape.iter().product();
    for (j, t) in k.inputs.iter().enumerate() {
        ctx.check_shape(&format!("input {j}"), t, &shape)?;
    }
    let (coords, names) = coords_code("    ", "i", &shape, "c");
    let out_idx = ctx.index(&k.output, &names)?;
    let out_dt = ctx.dtype(k.output.buffer);
    let mut body = String::new();
    let copy_of = expr.as_copy().filter(|&j| {
        let in_dt = ctx.dtype(k.inputs[j].buffer);
        in_dt == out_dt || (in_dt.is_int() && out_dt.is_int())
    });
    let kind;
    if let Some(j) = copy_of {
        // A raw copy: exact for every element type (ints never go through f32).
        let t = &k.inputs[j];
        let src = format!("{}[{}]", ctx.p(t.buffer), ctx.index(t, &names)?);
        let _ = writeln!(body, "    {}[{out_idx}] = ({}){src};", ctx.p(k.output.buffer), c_type(out_dt));
        kind = "copy".to_string();
    } else {
        let mut load = |j: usize| -> Result<String> {
            let t = k.inputs.get(j).ok_or_else(|| ctx.err(format!("expression loads input {j}")))?;
            Ok(ctx.load_f32(t.buffer, &ctx.index(t, &names)?))
        };
        let (code, root) = expr_code(expr, "e", "    ", &mut load, None)?;
        body.push_str(&code);
        let _ = writeln!(body, "    {}", ctx.store_f32(k.output.buffer, &out_idx, &root));
        kind = "elementwise".to_string();
    }
    let source = specialize(
        "elementwise.cuh",
        template::ELEMENTWISE,
        &[
            ("NAME", ctx.name.clone()),
            ("PARAMS", ctx.param_list()),
            ("NUMEL", numel.to_string()),
            ("COORDS", coords.trim_end().to_string()),
            ("BODY", body.trim_end().to_string()),
        ],
    )?;
    Ok(Body { kind, source, grid: grid_1d(ctx, numel as u64, 256)?, block: [256, 1, 1] })
}

fn emit_gather(ctx: &Ctx) -> Result<Body> {
    let k = ctx.kernel;
    if k.inputs.len() != 2 || k.inputs[0].rank() != 2 {
        return Err(Error::internal("cuda emit", format!("gather `{}` needs a rank-2 table and ids", k.name)));
    }
    let (table, ids) = (&k.inputs[0], &k.inputs[1]);
    let ids_dt = ctx.dtype(ids.buffer);
    if !ids_dt.is_int() {
        return Err(ctx.err(format!("ids of type {ids_dt}")));
    }
    let mut shape = ids.shape.clone();
    shape.push(table.shape[1]);
    ctx.check_shape("output", &k.output, &shape)?;
    let numel: usize = shape.iter().product();
    let (coords, names) = coords_code("    ", "i", &shape, "c");
    let id_load = format!("{}[{}]", ctx.p(ids.buffer), ctx.index(ids, &names[..names.len() - 1])?);
    let (tdt, odt) = (ctx.dtype(table.buffer), ctx.dtype(k.output.buffer));
    let tv = ctx.device_view(table)?;
    let t_idx = {
        let mut terms = Vec::new();
        if tv.offset != 0 {
            terms.push(format!("{}ull", tv.offset));
        }
        terms.push(format!("(unsigned long long)id * {}ull", tv.strides[0]));
        if tv.shape[1] > 1 && tv.strides[1] != 0 {
            terms.push(format!("(unsigned long long){} * {}ull", names[names.len() - 1], tv.strides[1]));
        }
        terms.join(" + ")
    };
    let out_idx = ctx.index(&k.output, &names)?;
    let src = format!("{}[{t_idx}]", ctx.p(table.buffer));
    let store = if tdt == odt {
        format!("    {}[{out_idx}] = {src};", ctx.p(k.output.buffer))
    } else {
        format!("    {}", ctx.store_f32(k.output.buffer, &out_idx, &to_f32(tdt, &src)))
    };
    let source = specialize(
        "gather.cuh",
        template::GATHER,
        &[
            ("NAME", ctx.name.clone()),
            ("PARAMS", ctx.param_list()),
            ("NUMEL", numel.to_string()),
            ("COORDS", coords.trim_end().to_string()),
            ("ID_LOAD", id_load),
            ("ROWS", table.shape[0].to_string()),
            ("STORE", store),
        ],
    )?;
    Ok(Body { kind: "gather".into(), source, grid: grid_1d(ctx, numel as u64, 256)?, block: [256, 1, 1] })
}

fn emit_concat(ctx: &Ctx, axis: usize) -> Result<Body> {
    let k = ctx.kernel;
    let shape = k.output.shape.clone();
    if axis >= shape.len() || k.inputs.is_empty() {
        return Err(Error::internal("cuda emit", format!("concat `{}` along axis {axis} of {:?}", k.name, shape)));
    }
    let numel: usize = shape.iter().product();
    let (coords, names) = coords_code("    ", "i", &shape, "c");
    let out_idx = ctx.index(&k.output, &names)?;
    let odt = ctx.dtype(k.output.buffer);
    let mut body = String::new();
    let mut start = 0usize;
    for (j, t) in k.inputs.iter().enumerate() {
        let mut want = shape.clone();
        want[axis] = t.shape.get(axis).copied().unwrap_or(0);
        ctx.check_shape(&format!("input {j}"), t, &want)?;
        let end = start + t.shape[axis];
        let mut cs = names.clone();
        cs[axis] = format!("(c{axis} - {start}u)");
        let src = format!("{}[{}]", ctx.p(t.buffer), ctx.index(t, &cs)?);
        let idt = ctx.dtype(t.buffer);
        let store = if idt == odt || (idt.is_int() && odt.is_int()) {
            format!("{}[{out_idx}] = ({}){src};", ctx.p(k.output.buffer), c_type(odt))
        } else {
            ctx.store_f32(k.output.buffer, &out_idx, &to_f32(idt, &src))
        };
        let cond = if j + 1 == k.inputs.len() { "else".to_string() } else { format!("{}if (c{axis} < {end}u)", if j == 0 { "" } else { "else " }) };
        let cond = if k.inputs.len() == 1 { "".to_string() } else { cond };
        let _ = writeln!(body, "    {cond} {{ {store} }}");
        start = end;
    }
    if start != shape[axis] {
        return Err(Error::internal("cuda emit", format!("concat `{}`: inputs cover {start} of {} along axis {axis}", k.name, shape[axis])));
    }
    let source = specialize(
        "concat.cuh",
        template::CONCAT,
        &[
            ("NAME", ctx.name.clone()),
            ("PARAMS", ctx.param_list()),
            ("NUMEL", numel.to_string()),
            ("COORDS", coords.trim_end().to_string()),
            ("BODY", body.trim_end().to_string()),
        ],
    )?;
    Ok(Body { kind: "concat".into(), source, grid: grid_1d(ctx, numel as u64, 256)?, block: [256, 1, 1] })
}

enum RowKind {
    Norm { kind: NormKind, eps: f32, gamma: usize, beta: Option<usize> },
    Softmax,
}

fn emit_row(ctx: &Ctx, kind: RowKind, prologue: &Expr) -> Result<Body> {
    let k = ctx.kernel;
    let shape = k.output.shape.clone();
    let cols = *shape.last().ok_or_else(|| ctx.err("a row kernel of a scalar"))?;
    let lead = shape.len() - 1;
    let rows: usize = shape[..lead].iter().product();
    let (group, threads, rows_per_block) = if cols <= 1024 { (32usize, 128usize, 4usize) } else { (256, 256, 1) };
    let per = cols.div_ceil(group);
    if per > 32 {
        return Err(ctx.err(format!("rows of {cols} elements (at most 8192)")));
    }
    let (row, lane) = if group == 32 {
        ("blockIdx.x * 4u + (threadIdx.x >> 5)".to_string(), "threadIdx.x & 31u".to_string())
    } else {
        ("blockIdx.x".to_string(), "threadIdx.x".to_string())
    };
    let (rc, rnames) = coords_code("    ", "row", &shape[..lead], "r");
    let mut row_coords = rc;
    // Row bases of every input the prologue loads and of the output.
    let mut tails: Vec<Option<BufferView>> = vec![None; k.inputs.len()];
    let param_inputs: Vec<usize> = match &kind {
        RowKind::Norm { gamma, beta, .. } => std::iter::once(*gamma).chain(*beta).collect(),
        RowKind::Softmax => vec![],
    };
    for j in prologue.loads() {
        let t = k.inputs.get(j).ok_or_else(|| ctx.err(format!("prologue loads input {j}")))?;
        if param_inputs.contains(&j) {
            return Err(ctx.err(format!("prologue loads the scale/shift input {j}")));
        }
        ctx.check_shape(&format!("input {j}"), t, &shape)?;
        let (base, tail) = ctx.split_index(t, lead, &rnames)?;
        let _ = writeln!(row_coords, "    const {} rb{j} = {base};", ctx.idx.ty());
        tails[j] = Some(tail);
    }
    let (obase, otail) = ctx.split_index(&k.output, lead, &rnames)?;
    let _ = writeln!(row_coords, "    const {} ob = {obase};", ctx.idx.ty());
    let col = vec!["col".to_string()];
    let mut load = |j: usize| -> Result<String> {
        let t = k.inputs[j].buffer;
        Ok(ctx.load_f32(t, &ctx.tail_index(&format!("rb{j}"), tails[j].as_ref().expect("loaded input"), &col)))
    };
    let (pcode, proot) = expr_code(prologue, "e", "            ", &mut load, None)?;
    let prologue_code = format!("{pcode}            v = {proot};");
    // Group reductions: a warp's shuffles, or the whole block's (through `kiln_red`).
    let (sum, max) = ("sum", "max");
    let red = |f: &str, v: &str| -> String {
        if group == 32 {
            format!("kiln_warp_{f}({v})")
        } else {
            format!("kiln_block_{f}({v}, kiln_red)")
        }
    };
    let loop_valid = |body: &str| -> String {
        format!(
            "#pragma unroll\n    for (int u = 0; u < {per}; ++u) {{\n        const unsigned col = t + (unsigned)u * {group}u;\n        if (col < {cols}u) {{ {body} }}\n    }}\n"
        )
    };
    let out_idx = ctx.tail_index("ob", &otail, &col);
    let param_load = |j: usize| -> Result<String> {
        let t = k.inputs.get(j).ok_or_else(|| ctx.err(format!("no input {j}")))?;
        ctx.check_shape(&format!("scale/shift input {j}"), t, &[cols])?;
        Ok(ctx.load_f32(t.buffer, &ctx.index(t, &col)?))
    };
    let cols_f = f32_lit(cols as f32);
    let (math, store, pad, kind_name) = match kind {
        RowKind::Norm { kind: nk, eps, gamma, beta } => {
            let eps = f32_lit(eps);
            let mut math = String::new();
            let y = match nk {
                NormKind::LayerNorm => {
                    let _ = writeln!(math, "    float s = 0.0f;\n#pragma unroll\n    for (int u = 0; u < {per}; ++u) s += x[u];");
                    let _ = writeln!(math, "    const float mean = {} / {cols_f};", red(sum, "s"));
                    let _ = write!(math, "    float q = 0.0f;\n{}", loop_valid("const float d = x[u] - mean; q = fmaf(d, d, q);"));
                    let _ = writeln!(math, "    const float rstd = 1.0f / sqrtf({} / {cols_f} + {eps});", red(sum, "q"));
                    let beta = match beta {
                        Some(b) => format!(" + {}", param_load(b)?),
                        None => String::new(),
                    };
                    format!("(x[u] - mean) * rstd * {}{beta}", param_load(gamma)?)
                }
                NormKind::RmsNorm => {
                    let _ = writeln!(math, "    float q = 0.0f;\n#pragma unroll\n    for (int u = 0; u < {per}; ++u) q = fmaf(x[u], x[u], q);");
                    let _ = writeln!(math, "    const float rstd = 1.0f / sqrtf({} / {cols_f} + {eps});", red(sum, "q"));
                    format!("x[u] * rstd * {}", param_load(gamma)?)
                }
            };
            let store = format!("            const float y = {y};\n            {}", ctx.store_f32(k.output.buffer, &out_idx, "y"));
            let name = if nk == NormKind::LayerNorm { "layer_norm" } else { "rms_norm" };
            (math, store, "0.0f".to_string(), name)
        }
        RowKind::Softmax => {
            let mut math = String::new();
            let _ = writeln!(math, "    float m = -KILN_INF;\n#pragma unroll\n    for (int u = 0; u < {per}; ++u) m = kiln_max(m, x[u]);");
            let _ = writeln!(math, "    m = {};", red(max, "m"));
            let _ = write!(math, "    float s = 0.0f;\n{}", loop_valid("x[u] = expf(x[u] - m); s += x[u];"));
            let _ = writeln!(math, "    s = {};", red(sum, "s"));
            let store = format!("            {}", ctx.store_f32(k.output.buffer, &out_idx, "x[u] / s"));
            (math, store, "-KILN_INF".to_string(), "softmax")
        }
    };
    let source = specialize(
        "rownorm.cuh",
        template::ROWNORM,
        &[
            ("NAME", ctx.name.clone()),
            ("PARAMS", ctx.param_list()),
            ("THREADS", threads.to_string()),
            ("ROW", row),
            ("LANE", lane),
            ("ROWS", rows.to_string()),
            ("ROW_COORDS", row_coords.trim_end().to_string()),
            ("PER", per.to_string()),
            ("GROUP", group.to_string()),
            ("PAD", pad),
            ("COLS", cols.to_string()),
            ("PROLOGUE", prologue_code),
            ("MATH", math.trim_end().to_string()),
            ("STORE", store),
        ],
    )?;
    let variant = if group == 32 { "warp" } else { "block" };
    Ok(Body {
        kind: format!("{kind_name}/{variant}"),
        source,
        grid: grid_1d(ctx, rows as u64, rows_per_block as u64)?,
        block: [threads as u32, 1, 1],
    })
}

fn emit_reduce(ctx: &Ctx, op: ReduceOp, shape: &[usize], reduced: usize, prologue: &Expr) -> Result<Body> {
    let k = ctx.kernel;
    if reduced > shape.len() {
        return Err(Error::internal("cuda emit", format!("reduce `{}` of {reduced} dims of {shape:?}", k.name)));
    }
    let lead = shape.len() - reduced;
    let outer: usize = shape[..lead].iter().product();
    let inner: usize = shape[lead..].iter().product();
    ctx.check_shape("output", &k.output, &shape[..lead])?;
    let (oc, onames) = coords_code("    ", "o", &shape[..lead], "oc");
    let mut outer_code = oc;
    let (ic, inames) = coords_code("        ", "r", &shape[lead..], "ic");
    let mut tails: Vec<Option<BufferView>> = vec![None; k.inputs.len()];
    for j in prologue.loads() {
        let t = k.inputs.get(j).ok_or_else(|| ctx.err(format!("prologue loads input {j}")))?;
        ctx.check_shape(&format!("input {j}"), t, shape)?;
        let (base, tail) = ctx.split_index(t, lead, &onames)?;
        let _ = writeln!(outer_code, "    const {} rb{j} = {base};", ctx.idx.ty());
        tails[j] = Some(tail);
    }
    let mut load = |j: usize| -> Result<String> {
        let t = k.inputs[j].buffer;
        Ok(ctx.load_f32(t, &ctx.tail_index(&format!("rb{j}"), tails[j].as_ref().expect("loaded input"), &inames)))
    };
    let (pcode, proot) = expr_code(prologue, "e", "        ", &mut load, None)?;
    let (init, combine, warp) = match op {
        ReduceOp::Sum | ReduceOp::Mean => ("0.0f", format!("acc + {proot}"), "kiln_warp_sum"),
        ReduceOp::Max => ("-KILN_INF", format!("kiln_max(acc, {proot})"), "kiln_warp_max"),
    };
    let finish = match op {
        ReduceOp::Mean => format!("acc / {}", f32_lit(inner as f32)),
        _ => "acc".into(),
    };
    let out_idx = ctx.index(&k.output, &onames)?;
    let source = specialize(
        "reduce.cuh",
        template::REDUCE,
        &[
            ("NAME", ctx.name.clone()),
            ("PARAMS", ctx.param_list()),
            ("OUTER", outer.to_string()),
            ("OUTER_COORDS", outer_code.trim_end().to_string()),
            ("INIT", init.to_string()),
            ("INNER", inner.to_string()),
            ("INNER_COORDS", ic.trim_end().to_string()),
            ("PROLOGUE", pcode.trim_end().to_string()),
            ("COMBINE", combine),
            ("WARP_REDUCE", warp.to_string()),
            ("FINISH", finish),
            ("STORE", format!("        {}", ctx.store_f32(k.output.buffer, &out_idx, "v"))),
        ],
    )?;
    Ok(Body { kind: "reduce".into(), source, grid: grid_1d(ctx, outer as u64, 8)?, block: [256, 1, 1] })
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

#[allow(clippy::too_many_arguments)]
fn emit_gemm(
    ctx: &Ctx,
    target: &CudaTarget,
    batch: &[usize],
    m: usize,
    n: usize,
    kd: usize,
    alpha: f32,
    epilogue: Option<&Expr>,
) -> Result<Body> {
    let k = ctx.kernel;
    if k.inputs.len() < 2 {
        return Err(Error::internal("cuda emit", format!("gemm `{}` has {} inputs", k.name, k.inputs.len())));
    }
    let bshape = |tail: [usize; 2]| -> Vec<usize> { batch.iter().copied().chain(tail).collect() };
    ctx.check_shape("A", &k.inputs[0], &bshape([m, kd]))?;
    ctx.check_shape("B", &k.inputs[1], &bshape([kd, n]))?;
    ctx.check_shape("output", &k.output, &bshape([m, n]))?;
    for j in 2..k.inputs.len() {
        ctx.check_shape(&format!("epilogue input {j}"), &k.inputs[j], &bshape([m, n]))?;
    }
    if let Some(e) = epilogue {
        if e.loads().iter().any(|&j| j < 2 || j >= k.inputs.len()) {
            return Err(ctx.err("the epilogue loads A, B or a missing input"));
        }
    }
    let nbatch: usize = batch.iter().product();
    if nbatch > 65535 {
        return Err(ctx.err(format!("a batch of {nbatch} GEMMs (grid z is at most 65535)")));
    }
    let (adt, bdt) = (ctx.dtype(k.inputs[0].buffer), ctx.dtype(k.inputs[1].buffer));
    if !adt.is_float() || !bdt.is_float() {
        return Err(ctx.err(format!("a GEMM of {adt} x {bdt}")));
    }
    let mma = adt == bdt && matches!(adt, DType::F16 | DType::BF16) && target.has_mma_m16n8k16();

    // Batch coordinates and per-operand bases.
    let (zcode, znames) = coords_code("    ", "blockIdx.z", batch, "z");
    let mut views: Vec<(String, &BufferView)> = vec![("a_base".into(), &k.inputs[0]), ("b_base".into(), &k.inputs[1])];
    for j in 2..k.inputs.len() {
        views.push((format!("e{j}_base"), &k.inputs[j]));
    }
    views.push(("o_base".into(), &k.output));
    let vrefs: Vec<(&str, &BufferView)> = views.iter().map(|(n, v)| (n.as_str(), *v)).collect();
    let (bcode, tails) = batch_code(ctx, batch, &znames, &vrefs)?;
    let batch_block = format!("{zcode}{bcode}");
    let (at, bt) = (&tails[0], &tails[1]);
    let a_kcontig = at.strides[1] == 1 || at.shape[1] == 1;
    let b_ncontig = bt.strides[1] == 1 || bt.shape[1] == 1;
    let sv = |s: &[String]| s.to_vec();
    let a_idx = ctx.tail_index("a_base", at, &sv(&["gm".into(), "gk".into()]));
    let b_idx = ctx.tail_index("b_base", bt, &sv(&["gk".into(), "gn".into()]));

    // The epilogue, per output element (gi, gj).
    let ij = sv(&["gi".into(), "gj".into()]);
    let ind = if mma { "                    " } else { "                " };
    let mut epi = String::new();
    let vroot = match epilogue {
        Some(e) => {
            let mut load = |j: usize| -> Result<String> {
                Ok(ctx.load_f32(k.inputs[j].buffer, &ctx.tail_index(&format!("e{j}_base"), &tails[j], &ij)))
            };
            let (code, root) = expr_code(e, "e", ind, &mut load, Some("kiln_acc"))?;
            epi.push_str(&code);
            root
        }
        None => "kiln_acc".to_string(),
    };
    let otail = tails.last().expect("output tail");
    let _ = write!(epi, "{ind}{}", ctx.store_f32(k.output.buffer, &ctx.tail_index("o_base", otail, &ij), &vroot));

    if mma {
        let dt = if adt == DType::F16 { "f16" } else { "bf16" };
        let (a_mm, a_kk) = if a_kcontig { ("e / 32u", "e % 32u") } else { ("e % 64u", "e / 64u") };
        let (b_kk, b_nn) = if b_ncontig { ("e / 64u", "e % 64u") } else { ("e % 32u", "e / 32u") };
        let grid = [n.div_ceil(64) as u32, m.div_ceil(64) as u32, nbatch.max(1) as u32];
        if grid[1] > 65535 {
            return Err(ctx.err(format!("m = {m} needs {} row blocks (at most 65535)", grid[1])));
        }
        let source = specialize(
            "gemm_mma.cuh",
            template::GEMM_MMA,
            &[
                ("NAME", ctx.name.clone()),
                ("PARAMS", ctx.param_list()),
                ("DT", dt.to_string()),
                ("BATCH", batch_block.trim_end().to_string()),
                ("M", m.to_string()),
                ("N", n.to_string()),
                ("K", kd.to_string()),
                ("A_MM", a_mm.into()),
                ("A_KK", a_kk.into()),
                ("B_KK", b_kk.into()),
                ("B_NN", b_nn.into()),
                ("A_LOAD", format!("{}[{a_idx}]", ctx.p(k.inputs[0].buffer))),
                ("B_LOAD", format!("{}[{b_idx}]", ctx.p(k.inputs[1].buffer))),
                ("ALPHA", f32_lit(alpha)),
                ("EPILOGUE", epi),
            ],
        )?;
        return Ok(Body { kind: format!("gemm/mma_{dt}"), source, grid, block: [128, 1, 1] });
    }

    let tile = target.gemm_tile.unwrap_or_else(|| GemmTile::pick(nbatch, m, n));
    let (bm, bn, tm, tn) = (tile.bm, tile.bn, tile.tm, tile.tn);
    let bk = 16usize;
    let tx = bn / tn;
    let threads = tile.threads();
    let (a_per, b_per) = (bm * bk / threads, bk * bn / threads);
    let (a_mm, a_kk) = if a_kcontig { (format!("e / {bk}u"), format!("e % {bk}u")) } else { (format!("e % {bm}u"), format!("e / {bm}u")) };
    let (b_kk, b_nn) = if b_ncontig { (format!("e / {bn}u"), format!("e % {bn}u")) } else { (format!("e % {bk}u"), format!("e / {bk}u")) };
    // Vector shared-memory loads of each thread's TM rows of A and TN columns of B.
    if tile.split && (tm % 4 != 0 || tn % 4 != 0) {
        return Err(ctx.err(format!("split GEMM tile {tile:?}: tm and tn must be multiples of 4")));
    }
    // Where a thread's `t` rows (or columns) of the block tile start: adjacent, or in groups of
    // 4 spread `span*4/t` apart (`split`). Returns the vector loads of them from shared memory
    // and the index expression of element `v` (the epilogue's loop variable).
    let frag = |arr: &str, dst: &str, idx: &str, t: usize, span: usize, v: &str| -> (String, String) {
        let mut f = String::new();
        if tile.split {
            let gap = span * 4 / t;
            for g in 0..t / 4 {
                let off = if g == 0 { String::new() } else { format!(" + {}u", g * gap) };
                let d = if g == 0 { dst.to_string() } else { format!("{dst} + {}", 4 * g) };
                let _ = writeln!(f, "            kiln_ld4(&{arr}[kk][{idx} * 4u{off}], {d});");
            }
            return (f, format!("{idx} * 4u + (unsigned)({v} % 4) + (unsigned)({v} / 4) * {gap}u"));
        }
        let mut o = 0;
        while o < t {
            let w = if t - o >= 4 { 4 } else { 2 };
            let off = if o == 0 { String::new() } else { format!(" + {o}u") };
            let d = if o == 0 { dst.to_string() } else { format!("{dst} + {o}") };
            let _ = writeln!(f, "            kiln_ld{w}(&{arr}[kk][{idx} * {t}u{off}], {d});");
            o += w;
        }
        (f, format!("{idx} * {t}u + (unsigned){v}"))
    };
    let (fa, row_of) = frag("As", "a", "ty", tm, bm, "r");
    let (fb, col_of) = frag("Bs", "b", "tx", tn, bn, "c");
    let frags = format!("{fa}{fb}");
    let lds = tm.div_ceil(4) + tn.div_ceil(4);
    let grid = [n.div_ceil(bn) as u32, m.div_ceil(bm) as u32, nbatch.max(1) as u32];
    if grid[1] > 65535 {
        return Err(ctx.err(format!("m = {m} needs {} row blocks (at most 65535)", grid[1])));
    }
    let source = specialize(
        "gemm_simt.cuh",
        template::GEMM_SIMT,
        &[
            ("NAME", ctx.name.clone()),
            ("PARAMS", ctx.param_list()),
            ("THREADS", threads.to_string()),
            ("BM", bm.to_string()),
            ("BN", bn.to_string()),
            ("BK", bk.to_string()),
            ("TM", tm.to_string()),
            ("TN", tn.to_string()),
            ("TX", tx.to_string()),
            ("PREFETCH", if tile.prefetch { "true" } else { "false" }.to_string()),
            ("ROW", row_of),
            ("COL", col_of),
            ("LDS", lds.to_string()),
            ("FRAGS", frags.trim_end().to_string()),
            ("BATCH", batch_block.trim_end().to_string()),
            ("M", m.to_string()),
            ("N", n.to_string()),
            ("K", kd.to_string()),
            ("A_PER", a_per.to_string()),
            ("B_PER", b_per.to_string()),
            ("A_MM", a_mm),
            ("A_KK", a_kk),
            ("B_KK", b_kk),
            ("B_NN", b_nn),
            ("A_LOAD", ctx.load_f32(k.inputs[0].buffer, &a_idx)),
            ("B_LOAD", ctx.load_f32(k.inputs[1].buffer, &b_idx)),
            ("ALPHA", f32_lit(alpha)),
            ("EPILOGUE", epi),
        ],
    )?;
    let pf = if tile.prefetch { "" } else { "_noprefetch" };
    let sp = if tile.split { "_split" } else { "" };
    Ok(Body { kind: format!("gemm/simt_{bm}x{bn}{sp}{pf}"), source, grid, block: [threads as u32, 1, 1] })
}

#[allow(clippy::too_many_arguments)]
fn emit_attention(
    ctx: &Ctx,
    batch: &[usize],
    sq: usize,
    skv: usize,
    d: usize,
    dv: usize,
    scale: f32,
    mask: Option<usize>,
    zero_nan_rows: bool,
) -> Result<Body> {
    let k = ctx.kernel;
    let bshape = |tail: [usize; 2]| -> Vec<usize> { batch.iter().copied().chain(tail).collect() };
    if k.inputs.len() < 3 {
        return Err(Error::internal("cuda emit", format!("attention `{}` has {} inputs", k.name, k.inputs.len())));
    }
    ctx.check_shape("Q", &k.inputs[0], &bshape([sq, d]))?;
    ctx.check_shape("K", &k.inputs[1], &bshape([skv, d]))?;
    ctx.check_shape("V", &k.inputs[2], &bshape([skv, dv]))?;
    ctx.check_shape("output", &k.output, &bshape([sq, dv]))?;
    if d > 128 || dv > 128 || d == 0 || dv == 0 {
        return Err(ctx.err(format!("head dims {d}/{dv} (the fused kernel supports 1..=128)")));
    }
    let shared = (16 * d.next_multiple_of(4) + 32 * (d + 1) + 32 * (dv + 1) + 4 * 32) * 4;
    if shared > 48 * 1024 {
        return Err(ctx.err(format!("{shared} bytes of shared memory")));
    }
    let nbatch: usize = batch.iter().product::<usize>().max(1);
    if nbatch > 65535 {
        return Err(ctx.err(format!("{nbatch} attention problems (grid y is at most 65535)")));
    }
    let (zcode, znames) = coords_code("    ", "blockIdx.y", batch, "z");
    let mut views: Vec<(&str, &BufferView)> = vec![("q_base", &k.inputs[0]), ("k_base", &k.inputs[1]), ("v_base", &k.inputs[2])];
    if let Some(mi) = mask {
        let mv = k.inputs.get(mi).ok_or_else(|| ctx.err(format!("mask input {mi} missing")))?;
        ctx.check_shape("mask", mv, &bshape([sq, skv]))?;
        views.push(("m_base", mv));
    }
    views.push(("o_base", &k.output));
    let (bcode, tails) = batch_code(ctx, batch, &znames, &views)?;
    let s2 = |a: &str, b: &str| vec![a.to_string(), b.to_string()];
    let q_load = ctx.load_f32(k.inputs[0].buffer, &ctx.tail_index("q_base", &tails[0], &s2("qi", "d")));
    let k_load = ctx.load_f32(k.inputs[1].buffer, &ctx.tail_index("k_base", &tails[1], &s2("kj", "d")));
    let v_load = ctx.load_f32(k.inputs[2].buffer, &ctx.tail_index("v_base", &tails[2], &s2("kj", "d")));
    let mask_code = match mask {
        Some(mi) => format!(
            "                    s += {};",
            ctx.load_f32(k.inputs[mi].buffer, &ctx.tail_index("m_base", &tails[3], &s2("qi", "kj")))
        ),
        None => "                    (void)0;".to_string(),
    };
    // A row whose probabilities are NaN becomes Σ_j 0·V[j] (NaN only where V is not finite), as
    // the guard `Where(IsNaN(p), 0, p)` before P·V gives on the reference; so does a fully
    // masked row (sum 0), whose softmax is NaN there too.
    let nan_rows = if zero_nan_rows {
        format!(
            "        if (isnan(l_i[r]) || l_i[r] == 0.0f) {{\n            l_i[r] = 1.0f;\n#pragma unroll\n            for (int dd = 0; dd < {lanes}; ++dd) {{\n                const unsigned d = lane + 32u * (unsigned)dd;\n                float z = 0.0f;\n                if (d < {dv}u)\n                    for (unsigned kj = 0; kj < {skv}u; ++kj) z = fmaf(0.0f, {v_load}, z);\n                o[r][dd] = z;\n            }}\n        }}\n",
            lanes = dv.div_ceil(32)
        )
    } else {
        String::new()
    };
    let otail = tails.last().expect("output tail");
    let store = format!("                {}", ctx.store_f32(k.output.buffer, &ctx.tail_index("o_base", otail, &s2("qi", "d")), "v"));
    let source = specialize(
        "attention.cuh",
        template::ATTENTION,
        &[
            ("NAME", ctx.name.clone()),
            ("PARAMS", ctx.param_list()),
            ("D", d.to_string()),
            ("DQ", d.next_multiple_of(4).to_string()),
            ("DV", dv.to_string()),
            ("DV_LANE", dv.div_ceil(32).to_string()),
            ("BATCH", format!("{zcode}{bcode}").trim_end().to_string()),
            ("SQ", sq.to_string()),
            ("SKV", skv.to_string()),
            ("Q_LOAD", q_load),
            ("K_LOAD", k_load),
            ("V_LOAD", v_load),
            ("SCALE", f32_lit(scale)),
            ("MASK", mask_code),
            ("NAN_ROWS", nan_rows),
            ("STORE", store),
        ],
    )?;
    Ok(Body { kind: "attention".into(), source, grid: [sq.div_ceil(16) as u32, nbatch as u32, 1], block: [128, 1, 1] })
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
