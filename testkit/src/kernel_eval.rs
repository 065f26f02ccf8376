//! A kernel-level evaluator: runs a [`KernelProgram`] kernel by kernel from each kernel's own
//! kernel-IR description, in f32, with every buffer where the targets' shared placement
//! (`kiln_compiler::placement`) puts it: intermediates at their planned offsets and the graph's
//! inputs and outputs after them, in ONE byte arena. A wrong offset, a view outside its buffer, an illegal in-place reuse or a kernel
//! description that does not mean what the graph meant shows up as a wrong result when
//! compared with the reference interpreter on the unfused graph.
//!
//! It is also a model of a CPU backend: every kernel reads its inputs at the moment it needs
//! them (no defensive copies), in the order a straightforward loop nest would, so aliasing the
//! planner gets wrong corrupts results here as it would there. The arena (and the output
//! buffers) start filled with `0xFF` bytes (f32 NaN, integer -1), so reading an element no
//! kernel wrote is visible too.

use half::{bf16, f16};
use kiln_runtime::graph::{BinaryOp, ReduceOp, UnaryOp};
use kiln_runtime::{DType, Error, HostTensor, Result, TensorData};

use kiln_compiler::ops;
use kiln_compiler::kernel_ir::*;
use kiln_compiler::memory_plan::MemoryPlan;
use kiln_compiler::placement::{place, ConstantHome, Loc as PlaceLoc, PlacementPolicy};

/// The evaluator's placement: the targets' regions, constants apart, unread inputs unbound.
const EVAL_PLACEMENT: PlacementPolicy =
    PlacementPolicy { align: 64, constants: ConstantHome::OwnBuffers, bind_unused_inputs: false };

#[derive(Clone, Copy)]
enum Loc {
    Arena(usize),
    Own(usize),
}

struct Mem {
    arena: Vec<u8>,
    own: Vec<Vec<u8>>,
    loc: Vec<Loc>,
    dtype: Vec<DType>,
}

impl Mem {
    #[inline]
    fn slot(&self, b: BufferId, e: usize) -> (&[u8], usize) {
        let size = self.dtype[b.index()].size();
        match self.loc[b.index()] {
            Loc::Arena(o) => (&self.arena, o + e * size),
            Loc::Own(i) => (&self.own[i], e * size),
        }
    }
    #[inline]
    fn get(&self, b: BufferId, e: usize) -> f32 {
        let (d, p) = self.slot(b, e);
        match self.dtype[b.index()] {
            DType::F32 => f32::from_le_bytes(d[p..p + 4].try_into().unwrap()),
            DType::F16 => f16::from_le_bytes(d[p..p + 2].try_into().unwrap()).to_f32(),
            DType::BF16 => bf16::from_le_bytes(d[p..p + 2].try_into().unwrap()).to_f32(),
            DType::I64 => i64::from_le_bytes(d[p..p + 8].try_into().unwrap()) as f32,
            DType::I32 => i32::from_le_bytes(d[p..p + 4].try_into().unwrap()) as f32,
        }
    }
    #[inline]
    fn get_i64(&self, b: BufferId, e: usize) -> i64 {
        let (d, p) = self.slot(b, e);
        match self.dtype[b.index()] {
            DType::I64 => i64::from_le_bytes(d[p..p + 8].try_into().unwrap()),
            DType::I32 => i32::from_le_bytes(d[p..p + 4].try_into().unwrap()) as i64,
            _ => self.get(b, e) as i64,
        }
    }
    #[inline]
    fn slot_mut(&mut self, b: BufferId, e: usize) -> (&mut [u8], usize) {
        let size = self.dtype[b.index()].size();
        match self.loc[b.index()] {
            Loc::Arena(o) => (&mut self.arena, o + e * size),
            Loc::Own(i) => (&mut self.own[i], e * size),
        }
    }
    #[inline]
    fn set(&mut self, b: BufferId, e: usize, v: f32) {
        let dt = self.dtype[b.index()];
        let (d, p) = self.slot_mut(b, e);
        match dt {
            DType::F32 => d[p..p + 4].copy_from_slice(&v.to_le_bytes()),
            DType::F16 => d[p..p + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes()),
            DType::BF16 => d[p..p + 2].copy_from_slice(&bf16::from_f32(v).to_le_bytes()),
            DType::I64 => d[p..p + 8].copy_from_slice(&(v as i64).to_le_bytes()),
            DType::I32 => d[p..p + 4].copy_from_slice(&(v as i32).to_le_bytes()),
        }
    }
    #[inline]
    fn set_i64(&mut self, b: BufferId, e: usize, v: i64) {
        let dt = self.dtype[b.index()];
        let (d, p) = self.slot_mut(b, e);
        match dt {
            DType::I64 => d[p..p + 8].copy_from_slice(&v.to_le_bytes()),
            DType::I32 => d[p..p + 4].copy_from_slice(&(v as i32).to_le_bytes()),
            _ => self.set(b, e, v as f32),
        }
    }
}

/// Calls `f(offsets)` for every index of `shape` in row-major order, where
/// `offsets[v] = bases[v] + Σ_d idx_d · strides[v][d]`.
fn walk(shape: &[usize], bases: &[usize], strides: &[&[usize]], mut f: impl FnMut(&[usize]) -> Result<()>) -> Result<()> {
    if shape.contains(&0) {
        return Ok(());
    }
    let r = shape.len();
    let mut idx = vec![0usize; r];
    let mut offs = bases.to_vec();
    loop {
        f(&offs)?;
        let mut d = r;
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            idx[d] += 1;
            for (v, o) in offs.iter_mut().enumerate() {
                *o += strides[v][d];
            }
            if idx[d] < shape[d] {
                break;
            }
            for (v, o) in offs.iter_mut().enumerate() {
                *o -= strides[v][d] * shape[d];
            }
            idx[d] = 0;
        }
    }
}

pub fn unary(op: UnaryOp, x: f32) -> f32 {
    ops::eval::unary(op, x)
}

pub fn binary(op: BinaryOp, a: f32, b: f32) -> f32 {
    ops::eval::binary(op, false, a, b)
}

/// Rounds to the value set of `to` (see [`ExprNode::Cast`]).
pub fn cast(to: DType, x: f32) -> f32 {
    match to {
        DType::F32 => x,
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::BF16 => bf16::from_f32(x).to_f32(),
        DType::I64 => x as i64 as f32,
        DType::I32 => x as i32 as f32,
    }
}

/// Evaluates `e` with `load(k)` reading kernel input `k` and `acc` the GEMM accumulator.
#[inline]
fn eval(e: &Expr, vals: &mut Vec<f32>, acc: f32, load: impl Fn(usize) -> f32) -> f32 {
    vals.clear();
    for n in &e.nodes {
        let v = match n {
            ExprNode::Load(k) => load(*k),
            ExprNode::Acc => acc,
            ExprNode::Const(c) => *c,
            ExprNode::Unary(op, a) => unary(*op, vals[*a as usize]),
            ExprNode::Binary(op, a, b) => binary(*op, vals[*a as usize], vals[*b as usize]),
            ExprNode::Select(c, a, b) => {
                if vals[*c as usize] != 0.0 {
                    vals[*a as usize]
                } else {
                    vals[*b as usize]
                }
            }
            ExprNode::Cast(t, a) => cast(*t, vals[*a as usize]),
        };
        vals.push(v);
    }
    *vals.last().expect("non-empty expression")
}

/// Offsets of every view at each index of the leading `dims` dims (the batch of a GEMM).
fn batch_bases(batch: &[usize], views: &[&BufferView]) -> Vec<Vec<usize>> {
    let bases: Vec<usize> = views.iter().map(|t| t.offset).collect();
    let strides: Vec<&[usize]> = views.iter().map(|t| &t.strides[..batch.len()]).collect();
    let mut out = Vec::new();
    let _ = walk(batch, &bases, &strides, |o| {
        out.push(o.to_vec());
        Ok(())
    });
    out
}

fn last_stride(t: &BufferView, from_end: usize) -> usize {
    t.strides[t.rank() - from_end]
}

/// Runs `program` with its arena laid out by `plan`. `weights` are indexed like the graph's
/// weight table (checkpoint layout; layout decisions are applied here, once), `inputs` like
/// the graph's inputs (already at the bucket's shapes). Returns the outputs.
pub fn run_program(
    program: &KernelProgram,
    plan: &MemoryPlan,
    weights: &[HostTensor],
    inputs: &[HostTensor],
) -> Result<Vec<HostTensor>> {
    // The targets' placement (intermediates at the planned offsets, then the graph inputs and
    // outputs), so that a planned offset overlapping an I/O slot shows here too; weights and
    // constants in storage of their own.
    let types: Vec<(DType, Vec<usize>)> = program
        .inputs
        .iter()
        .enumerate()
        .map(|(gi, b)| match b {
            Some(b) => (program.buffer(*b).dtype, program.buffer(*b).shape.clone()),
            None => inputs.get(gi).map_or((DType::F32, vec![0]), |t| (t.dtype(), t.shape.clone())),
        })
        .collect();
    let placed = place(program, &plan.offsets, plan.arena_bytes, &types, EVAL_PLACEMENT)?;
    let mut arena = vec![0xFFu8; placed.end];
    let mut own = Vec::new();
    let mut loc = Vec::new();
    for (bi, b) in program.buffers.iter().enumerate() {
        let bytes = match (&b.kind, placed.locs[bi]) {
            (BufferKind::Input { index }, PlaceLoc::Arena(off)) => {
                let t = inputs
                    .get(*index)
                    .ok_or_else(|| Error::bad_batch(format!("input #{index} (`{}`) missing", b.name)))?;
                if t.shape != b.shape || t.dtype() != b.dtype {
                    return Err(Error::bad_batch(format!(
                        "input `{}` is {} {:?}, the program needs {} {:?}",
                        b.name,
                        t.dtype(),
                        t.shape,
                        b.dtype,
                        b.shape
                    )));
                }
                let bytes = t.data.to_le_bytes();
                arena[off..off + bytes.len()].copy_from_slice(&bytes);
                loc.push(Loc::Arena(off));
                continue;
            }
            (_, PlaceLoc::Arena(off)) => {
                loc.push(Loc::Arena(off));
                continue;
            }
            (_, PlaceLoc::Const(ci)) => placed.constants[ci].clone(),
            (BufferKind::Weight { index, layout, concat }, PlaceLoc::Weight(_)) => {
                let part = |i: usize| {
                    weights.get(i).ok_or_else(|| Error::graph("<weights>", format!("weight #{i} (`{}`) missing", b.name)))
                };
                // A merged weight: the parts joined along `c.axis` of the checkpoint layout.
                let joined;
                let t = match concat {
                    None => part(*index)?,
                    Some(c) => {
                        let parts = c.entries(*index).map(part).collect::<Result<Vec<_>>>()?;
                        joined = HostTensor::concat_f32(&parts, c.axis)?;
                        &joined
                    }
                };
                let want: Vec<usize> = match layout {
                    WeightLayout::AsIs => b.shape.clone(),
                    WeightLayout::Transposed => vec![b.shape[1], b.shape[0]],
                };
                if t.shape != want {
                    return Err(Error::TensorMismatch {
                        path: "<kernel eval>".into(),
                        tensor: b.name.clone(),
                        expected: format!("{want:?}"),
                        found: format!("{:?}", t.shape),
                    });
                }
                let data = t.data.convert(b.dtype);
                let data = match layout {
                    WeightLayout::AsIs => data,
                    WeightLayout::Transposed => {
                        let (r, c) = (want[0], want[1]);
                        let v = data.to_f64_vec();
                        let mut tr = vec![0f64; v.len()];
                        for i in 0..r {
                            for j in 0..c {
                                tr[j * r + i] = v[i * c + j];
                            }
                        }
                        TensorData::from_f64(b.dtype, &tr)
                    }
                };
                data.to_le_bytes()
            }
            (kind, l) => return Err(Error::internal("kernel eval", format!("b{bi} ({kind:?}) placed at {l:?}"))),
        };
        own.push(bytes);
        loc.push(Loc::Own(own.len() - 1));
    }
    let mut mem = Mem { arena, own, loc, dtype: program.buffers.iter().map(|b| b.dtype).collect() };
    for k in &program.kernels {
        run_kernel(program, k, &mut mem)?;
    }
    let mut outs = Vec::new();
    for &b in &program.outputs {
        let buf = program.buffer(b);
        let Loc::Arena(off) = mem.loc[b.index()] else {
            return Err(Error::internal("kernel eval", format!("output `{}` is not in the arena", buf.name)));
        };
        let bytes = &mem.arena[off..off + buf.bytes()];
        outs.push(HostTensor::new(buf.shape.clone(), TensorData::from_le_bytes(buf.dtype, bytes))?);
    }
    Ok(outs)
}

fn run_kernel(program: &KernelProgram, k: &Kernel, mem: &mut Mem) -> Result<()> {
    let out = &k.output;
    let ob = out.buffer;
    let mut vals = Vec::new();
    match &k.op {
        KernelOp::Elementwise { expr } => {
            let int_copy = expr.as_copy().is_some()
                && mem.dtype[k.inputs[0].buffer.index()].is_int()
                && mem.dtype[ob.index()].is_int();
            let mut views: Vec<&BufferView> = k.inputs.iter().collect();
            views.push(out);
            let bases: Vec<usize> = views.iter().map(|t| t.offset).collect();
            let strides: Vec<&[usize]> = views.iter().map(|t| t.strides.as_slice()).collect();
            let n = k.inputs.len();
            walk(&out.shape, &bases, &strides, |o| {
                if int_copy {
                    let v = mem.get_i64(k.inputs[0].buffer, o[0]);
                    mem.set_i64(ob, o[n], v);
                } else {
                    let v = eval(expr, &mut vals, 0.0, |i| mem.get(k.inputs[i].buffer, o[i]));
                    mem.set(ob, o[n], v);
                }
                Ok(())
            })?;
        }
        KernelOp::Gemm { batch, m, n, k: kk, alpha, epilogue, int_bounds } => {
            let (a, b) = (&k.inputs[0], &k.inputs[1]);
            let mut views: Vec<&BufferView> = k.inputs.iter().collect();
            views.push(out);
            let nv = views.len();
            let (sa_i, sa_p) = (last_stride(a, 2), last_stride(a, 1));
            let (sb_p, sb_j) = (last_stride(b, 2), last_stride(b, 1));
            let mut bmat = vec![0f32; kk * n];
            let mut arow = vec![0f32; *kk];
            for bases in batch_bases(batch, &views) {
                // B is read once per batch entry (a backend packs it); A row by row.
                for p in 0..*kk {
                    for j in 0..*n {
                        bmat[p * n + j] = mem.get(b.buffer, bases[1] + p * sb_p + j * sb_j);
                    }
                }
                for i in 0..*m {
                    for (p, x) in arow.iter_mut().enumerate() {
                        *x = mem.get(a.buffer, bases[0] + i * sa_i + p * sa_p);
                    }
                    for j in 0..*n {
                        let mut acc = if int_bounds.is_some() {
                            // Integer operands: the exact sum (f64 holds it: below 2^31), rounded
                            // once, as an integer GEMM gives it.
                            (0..*kk).map(|p| arow[p] as f64 * bmat[p * n + j] as f64).sum::<f64>() as f32
                        } else {
                            let mut acc = 0f32;
                            for p in 0..*kk {
                                acc += arow[p] * bmat[p * n + j];
                            }
                            acc
                        };
                        acc *= alpha;
                        let at = |v: usize| bases[v] + i * last_stride(views[v], 2) + j * last_stride(views[v], 1);
                        let y = match epilogue {
                            Some(e) => eval(e, &mut vals, acc, |v| mem.get(k.inputs[v].buffer, at(v))),
                            None => acc,
                        };
                        mem.set(ob, at(nv - 1), y);
                    }
                }
            }
        }
        KernelOp::Norm { kind, eps, prologue, gamma, beta } => {
            let r = out.rank();
            let cols = out.shape[r - 1];
            let loads = prologue.loads();
            let mut views: Vec<&BufferView> = loads.iter().map(|&l| &k.inputs[l]).collect();
            views.push(out);
            let bases: Vec<usize> = views.iter().map(|t| t.offset).collect();
            let strides: Vec<&[usize]> = views.iter().map(|t| &t.strides[..r - 1]).collect();
            let (g, bt) = (&k.inputs[*gamma], beta.map(|b| &k.inputs[b]));
            let mut row = vec![0f32; cols];
            let mut at = vec![0usize; k.inputs.len()];
            walk(&out.shape[..r - 1], &bases, &strides, |o| {
                for (c, x) in row.iter_mut().enumerate() {
                    for (li, &l) in loads.iter().enumerate() {
                        at[l] = o[li] + c * last_stride(&k.inputs[l], 1);
                    }
                    *x = eval(prologue, &mut vals, 0.0, |l| mem.get(k.inputs[l].buffer, at[l]));
                }
                let nf = cols as f32;
                let (mean, denom) = match kind {
                    NormKind::LayerNorm => {
                        let mean = row.iter().sum::<f32>() / nf;
                        let var = row.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / nf;
                        (mean, (var + eps).sqrt())
                    }
                    NormKind::RmsNorm => (0.0, (row.iter().map(|x| x * x).sum::<f32>() / nf + eps).sqrt()),
                };
                let oo = o[loads.len()];
                for (c, x) in row.iter().enumerate() {
                    let gv = mem.get(g.buffer, g.offset + c * g.strides[0]);
                    // RmsNorm neither centers nor shifts (so a -0 stays -0, as on every backend).
                    let centered = if *kind == NormKind::LayerNorm { x - mean } else { *x };
                    let mut y = centered / denom * gv;
                    if let Some(b) = bt {
                        y += mem.get(b.buffer, b.offset + c * b.strides[0]);
                    }
                    mem.set(ob, oo + c * last_stride(out, 1), y);
                }
                Ok(())
            })?;
        }
        KernelOp::Softmax { prologue } => {
            let r = out.rank();
            let cols = out.shape[r - 1];
            let loads = prologue.loads();
            let mut views: Vec<&BufferView> = loads.iter().map(|&l| &k.inputs[l]).collect();
            views.push(out);
            let bases: Vec<usize> = views.iter().map(|t| t.offset).collect();
            let strides: Vec<&[usize]> = views.iter().map(|t| &t.strides[..r - 1]).collect();
            let mut row = vec![0f32; cols];
            let mut at = vec![0usize; k.inputs.len()];
            walk(&out.shape[..r - 1], &bases, &strides, |o| {
                for (c, x) in row.iter_mut().enumerate() {
                    for (li, &l) in loads.iter().enumerate() {
                        at[l] = o[li] + c * last_stride(&k.inputs[l], 1);
                    }
                    *x = eval(prologue, &mut vals, 0.0, |l| mem.get(k.inputs[l].buffer, at[l]));
                }
                softmax_row(&mut row);
                let oo = o[loads.len()];
                for (c, x) in row.iter().enumerate() {
                    mem.set(ob, oo + c * last_stride(out, 1), *x);
                }
                Ok(())
            })?;
        }
        KernelOp::Attention { batch, seq_q, seq_kv, head_dim, v_dim, scale, mask, zero_nan_rows } => {
            let (q, kk, v) = (&k.inputs[0], &k.inputs[1], &k.inputs[2]);
            let mk = mask.map(|m| &k.inputs[m]);
            let mut views = vec![q, kk, v, out];
            if let Some(m) = mk {
                views.push(m);
            }
            let mut p = vec![0f32; *seq_kv];
            let mut qrow = vec![0f32; *head_dim];
            let mut orow = vec![0f32; *v_dim];
            for bases in batch_bases(batch, &views) {
                for i in 0..*seq_q {
                    for (d, x) in qrow.iter_mut().enumerate() {
                        *x = mem.get(q.buffer, bases[0] + i * last_stride(q, 2) + d * last_stride(q, 1));
                    }
                    for (j, pj) in p.iter_mut().enumerate() {
                        let mut s = 0f32;
                        for (d, x) in qrow.iter().enumerate() {
                            s += x * mem.get(kk.buffer, bases[1] + j * last_stride(kk, 2) + d * last_stride(kk, 1));
                        }
                        s *= scale;
                        if let Some(m) = mk {
                            s += mem.get(m.buffer, bases[4] + i * last_stride(m, 2) + j * last_stride(m, 1));
                        }
                        *pj = s;
                    }
                    softmax_row(&mut p);
                    if *zero_nan_rows && p.iter().any(|x| x.is_nan()) {
                        p.fill(0.0);
                    }
                    orow.fill(0.0);
                    for (j, pj) in p.iter().enumerate() {
                        for (d, o) in orow.iter_mut().enumerate() {
                            *o += pj * mem.get(v.buffer, bases[2] + j * last_stride(v, 2) + d * last_stride(v, 1));
                        }
                    }
                    for (d, o) in orow.iter().enumerate() {
                        mem.set(ob, bases[3] + i * last_stride(out, 2) + d * last_stride(out, 1), *o);
                    }
                }
            }
        }
        KernelOp::Gather => {
            let ids = &k.inputs[1];
            // Table 0, then any further tables (inputs 2..) continuing its rows.
            let tables: Vec<&BufferView> = std::iter::once(&k.inputs[0]).chain(&k.inputs[2..]).collect();
            let rows: usize = tables.iter().map(|t| t.shape[0]).sum();
            let cols = k.inputs[0].shape[1];
            let r = ids.rank();
            let views = [ids, out];
            let bases = [ids.offset, out.offset];
            let strides: Vec<&[usize]> = vec![&ids.strides, &out.strides[..r]];
            let _ = views;
            walk(&ids.shape, &bases, &strides, |o| {
                let id = mem.get_i64(ids.buffer, o[0]);
                if id < 0 || id as usize >= rows {
                    return Err(Error::graph(&k.name, format!("gather id {id} is outside the table's 0..{rows}")));
                }
                let (mut t, mut row) = (tables[0], id as usize);
                for x in &tables {
                    t = x;
                    if row < x.shape[0] {
                        break;
                    }
                    row -= x.shape[0];
                }
                for c in 0..cols {
                    let v = mem.get(t.buffer, t.offset + row * t.strides[0] + c * t.strides[1]);
                    mem.set(ob, o[1] + c * out.strides[r], v);
                }
                Ok(())
            })?;
        }
        KernelOp::Reduce { op, shape, reduced_dims, prologue } => {
            let outer = shape.len() - reduced_dims;
            let loads = prologue.loads();
            let mut views: Vec<&BufferView> = loads.iter().map(|&l| &k.inputs[l]).collect();
            views.push(out);
            let bases: Vec<usize> = views.iter().map(|t| t.offset).collect();
            let strides: Vec<&[usize]> =
                views.iter().enumerate().map(|(i, t)| if i < loads.len() { &t.strides[..outer] } else { &t.strides[..] }).collect();
            let inner_shape = &shape[outer..];
            let count: usize = inner_shape.iter().product();
            let inner_strides: Vec<&[usize]> = loads.iter().map(|&l| &k.inputs[l].strides[outer..]).collect();
            let mut at = vec![0usize; k.inputs.len()];
            walk(&shape[..outer], &bases, &strides, |o| {
                let mut accum = match op {
                    ReduceOp::Sum | ReduceOp::Mean => 0f32,
                    ReduceOp::Max => f32::NEG_INFINITY,
                };
                walk(inner_shape, &o[..loads.len()], &inner_strides, |io| {
                    for (li, &l) in loads.iter().enumerate() {
                        at[l] = io[li];
                    }
                    let x = eval(prologue, &mut vals, 0.0, |l| mem.get(k.inputs[l].buffer, at[l]));
                    accum = match op {
                        ReduceOp::Sum | ReduceOp::Mean => accum + x,
                        ReduceOp::Max => binary(BinaryOp::Max, accum, x),
                    };
                    Ok(())
                })?;
                if *op == ReduceOp::Mean {
                    accum /= count as f32;
                }
                mem.set(ob, o[loads.len()], accum);
                Ok(())
            })?;
        }
        KernelOp::Concat { axis } => {
            let mut start = 0;
            for t in &k.inputs {
                let len = t.shape[*axis];
                let dst = out.slice(*axis, start, len);
                start += len;
                let int = mem.dtype[t.buffer.index()].is_int() && mem.dtype[ob.index()].is_int();
                walk(&t.shape, &[t.offset, dst.offset], &[&t.strides, &dst.strides], |o| {
                    if int {
                        let v = mem.get_i64(t.buffer, o[0]);
                        mem.set_i64(ob, o[1], v);
                    } else {
                        let v = mem.get(t.buffer, o[0]);
                        mem.set(ob, o[1], v);
                    }
                    Ok(())
                })?;
            }
        }
    }
    let _ = program;
    Ok(())
}

fn softmax_row(row: &mut [f32]) {
    let mx = row.iter().fold(f32::NEG_INFINITY, |a, &b| if a.is_nan() || b.is_nan() { f32::NAN } else { a.max(b) });
    let mut sum = 0f32;
    for x in row.iter_mut() {
        *x = (*x - mx).exp();
        sum += *x;
    }
    for x in row.iter_mut() {
        *x /= sum;
    }
}
