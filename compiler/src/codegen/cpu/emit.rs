//! The function emitter every kernel generator uses: entry parameters, buffer addresses, loops,
//! typed loads and stores (with the kernel IR's conversion rules), kernel-table calls, scratch
//! and status returns.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, F32X4, I32, I32X4, I64};
use cranelift_codegen::ir::{
    AbiParam, Block, ConstantData, Endianness, InstBuilder, MemFlagsData, Signature, StackSlot, StackSlotData,
    StackSlotKind, Type, Value,
};
use cranelift_codegen::isa::CallConv;
use cranelift_frontend::{FunctionBuilder, Variable};
use kiln_runtime::DType;

use super::layout::{Base, Layout};
use crate::kernel_ir::{BufferId, KernelProgram, BufferView};

/// What every kernel's code generator can see.
pub(crate) struct Env<'p> {
    pub program: &'p KernelProgram,
    pub layout: &'p Layout,
    pub fma: bool,
    /// Threads the kernel-table scratch is sized for.
    pub threads: usize,
}

/// One function being built.
pub(crate) struct Fx<'a, 'p> {
    pub b: FunctionBuilder<'a>,
    pub env: &'a Env<'p>,
    pub arena: Value,
    pub weights: Value,
    pub table: Value,
    pub task: Value,
    pub ntasks: Value,
    /// Bytes of the scratch region this kernel has claimed so far.
    pub scratch_used: usize,
    err_block: Option<Block>,
}

/// Memory flags of scalar accesses: kernels touch only valid memory (the views were checked)
/// and every element is aligned to its size (arena regions are 64-byte aligned).
pub(crate) fn mf() -> MemFlagsData {
    MemFlagsData::trusted()
}

/// Memory flags of 4-lane accesses: valid, but only element-aligned (never assume 16 bytes).
pub(crate) fn mf_vec() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

fn vflags() -> MemFlagsData {
    MemFlagsData::new().with_endianness(Endianness::Little)
}

/// The kernel signature: `(arena, weights, table, task, n_tasks) -> status`.
pub(crate) fn kernel_signature() -> Signature {
    let mut s = Signature::new(CallConv::SystemV);
    for _ in 0..5 {
        s.params.push(AbiParam::new(I64));
    }
    s.returns.push(AbiParam::new(I32));
    s
}

impl<'a, 'p> Fx<'a, 'p> {
    /// Starts the function: entry block with the ABI parameters.
    pub fn new(mut b: FunctionBuilder<'a>, env: &'a Env<'p>) -> Self {
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        b.seal_block(entry);
        let p = b.block_params(entry).to_vec();
        Fx { b, env, arena: p[0], weights: p[1], table: p[2], task: p[3], ntasks: p[4], scratch_used: 0, err_block: None }
    }

    /// Returns status 0 and finishes the function.
    pub fn finish(mut self, cfg: cranelift_codegen::isa::TargetFrontendConfig) {
        let z = self.b.ins().iconst(I32, 0);
        self.b.ins().return_(&[z]);
        if let Some(e) = self.err_block {
            self.b.switch_to_block(e);
            let st = self.b.block_params(e)[0];
            self.b.ins().return_(&[st]);
        }
        self.b.seal_all_blocks();
        self.b.finalize(cfg);
    }

    // ----- constants and arithmetic on indices -------------------------------------------------

    pub fn iconst(&mut self, v: i64) -> Value {
        self.b.ins().iconst(I64, v)
    }
    pub fn fconst(&mut self, v: f32, w: usize) -> Value {
        if w == 4 {
            let mut bytes = Vec::with_capacity(16);
            for _ in 0..4 {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            let c = self.b.func.dfg.constants.insert(ConstantData::from(bytes));
            self.b.ins().vconst(F32X4, c)
        } else {
            self.b.ins().f32const(v)
        }
    }
    pub fn iconst_w(&mut self, v: i32, w: usize) -> Value {
        if w == 4 {
            let mut bytes = Vec::with_capacity(16);
            for _ in 0..4 {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            let c = self.b.func.dfg.constants.insert(ConstantData::from(bytes));
            self.b.ins().vconst(I32X4, c)
        } else {
            self.b.ins().iconst(I32, v as i64)
        }
    }
    /// `p + i * scale` (bytes).
    pub fn offset(&mut self, p: Value, i: Value, scale: i64) -> Value {
        if scale == 0 {
            return p;
        }
        let s = self.b.ins().imul_imm_s(i, scale);
        self.b.ins().iadd(p, s)
    }
    pub fn add_imm(&mut self, p: Value, n: i64) -> Value {
        if n == 0 {
            p
        } else {
            self.b.ins().iadd_imm_s(p, n)
        }
    }

    // ----- float helpers that work on f32 and f32x4 ------------------------------------------------

    /// Reinterprets the bits of a float (vector) as int (vector) or back.
    pub fn bits_to_int(&mut self, x: Value) -> Value {
        let ty = self.b.func.dfg.value_type(x);
        if ty == F32X4 {
            self.b.ins().bitcast(I32X4, vflags(), x)
        } else {
            self.b.ins().bitcast(I32, MemFlagsData::new(), x)
        }
    }
    pub fn bits_to_float(&mut self, x: Value) -> Value {
        let ty = self.b.func.dfg.value_type(x);
        if ty == I32X4 {
            self.b.ins().bitcast(F32X4, vflags(), x)
        } else {
            self.b.ins().bitcast(F32, MemFlagsData::new(), x)
        }
    }
    /// A float comparison as a selector for [`Fx::sel`].
    pub fn fcmp(&mut self, cc: FloatCC, a: Value, b: Value) -> Value {
        self.b.ins().fcmp(cc, a, b)
    }
    /// `mask ? a : b` for a mask from [`Fx::fcmp`] (lane-wise for vectors).
    pub fn sel(&mut self, mask: Value, a: Value, b: Value) -> Value {
        let ty = self.b.func.dfg.value_type(a);
        if ty.is_vector() {
            let m = self.b.ins().bitcast(ty, vflags(), mask);
            self.b.ins().bitselect(m, a, b)
        } else {
            self.b.ins().select(mask, a, b)
        }
    }
    /// The constant every lane of `v` holds, where `v` is an `f32const` or a `vconst` of four
    /// equal lanes (what [`Fx::fconst`] emits).
    pub fn const_lanes(&self, v: Value) -> Option<f32> {
        use cranelift_codegen::ir::InstructionData;
        let dfg = &self.b.func.dfg;
        let inst = dfg.value_def(v).inst()?;
        match dfg.insts[inst] {
            InstructionData::UnaryIeee32 { imm, .. } => Some(f32::from_bits(imm.bits())),
            InstructionData::UnaryConst { constant_handle, .. } => {
                let bytes = dfg.constants.get(constant_handle).as_slice();
                let lane = |i: usize| u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
                (bytes.len() == 16 && (1..4).all(|i| lane(i) == lane(0))).then(|| f32::from_bits(lane(0)))
            }
            _ => None,
        }
    }
    /// `a < b ? a : b` (x86 `minps` semantics: `b` when either is NaN).
    pub fn pmin(&mut self, a: Value, b: Value) -> Value {
        let m = self.fcmp(FloatCC::LessThan, a, b);
        self.sel(m, a, b)
    }
    /// `b < a ? a : b` (x86 `maxps` semantics: `b` when either is NaN).
    pub fn pmax(&mut self, a: Value, b: Value) -> Value {
        let m = self.fcmp(FloatCC::LessThan, b, a);
        self.sel(m, a, b)
    }
    /// `a·b + c`, fused when the target has FMA.
    pub fn fma(&mut self, a: Value, b: Value, c: Value) -> Value {
        if self.env.fma {
            self.b.ins().fma(a, b, c)
        } else {
            let p = self.b.ins().fmul(a, b);
            self.b.ins().fadd(p, c)
        }
    }
    pub fn splat(&mut self, x: Value) -> Value {
        self.b.ins().splat(F32X4, x)
    }
    /// Sum of the 4 lanes.
    pub fn hsum(&mut self, v: Value) -> Value {
        let l: Vec<Value> = (0..4u8).map(|i| self.b.ins().extractlane(v, i)).collect();
        let a = self.b.ins().fadd(l[0], l[1]);
        let c = self.b.ins().fadd(l[2], l[3]);
        self.b.ins().fadd(a, c)
    }
    /// NaN-propagating max of the 4 lanes.
    pub fn hmax(&mut self, v: Value) -> Value {
        let l: Vec<Value> = (0..4u8).map(|i| self.b.ins().extractlane(v, i)).collect();
        let a = self.b.ins().fmax(l[0], l[1]);
        let c = self.b.ins().fmax(l[2], l[3]);
        self.b.ins().fmax(a, c)
    }

    // ----- addresses -----------------------------------------------------------------------------

    /// Address of element 0 of buffer `b`.
    pub fn buffer_base(&mut self, b: BufferId) -> Value {
        match self.env.layout.base[b.index()].expect("every buffer a kernel touches has a location") {
            Base::Arena(o) => self.add_imm(self.arena, o as i64),
            Base::Slot(s) => self.b.ins().load(I64, mf().with_readonly().with_can_move(), self.weights, (8 * s) as i32),
        }
    }
    /// Address of a view's first element.
    pub fn view_base(&mut self, t: &BufferView) -> Value {
        let base = self.buffer_base(t.buffer);
        let size = self.dtype(t.buffer).size();
        self.add_imm(base, (t.offset * size) as i64)
    }
    pub fn dtype(&self, b: BufferId) -> DType {
        self.env.program.buffer(b).dtype
    }
    /// Address of scratch bytes `[off, off+len)` of this kernel.
    pub fn scratch_ptr(&mut self, off: usize) -> Value {
        let at = self.env.layout.scratch_offset + off;
        self.add_imm(self.arena, at as i64)
    }
    /// Claims `bytes` of scratch (64-byte aligned); returns its offset within the scratch region.
    pub fn claim_scratch(&mut self, bytes: usize) -> usize {
        let at = self.scratch_used.div_ceil(64) * 64;
        self.scratch_used = at + bytes;
        at
    }

    // ----- loops ---------------------------------------------------------------------------------

    /// `for (i = lo; i < hi; i += step) body(i)` (signed compare).
    pub fn for_range(&mut self, lo: Value, hi: Value, step: i64, body: &mut dyn FnMut(&mut Self, Value)) {
        // Rotated: one guard, then the test at the bottom (one compare-and-branch per trip).
        let inner = self.b.create_block();
        self.b.append_block_param(inner, I64);
        let exit = self.b.create_block();
        let c0 = self.b.ins().icmp(IntCC::SignedLessThan, lo, hi);
        self.b.ins().brif(c0, inner, &[lo.into()], exit, &[]);
        self.b.switch_to_block(inner);
        let i = self.b.block_params(inner)[0];
        body(self, i);
        let next = self.b.ins().iadd_imm_s(i, step);
        let c = self.b.ins().icmp(IntCC::SignedLessThan, next, hi);
        self.b.ins().brif(c, inner, &[next.into()], exit, &[]);
        self.b.seal_block(inner);
        self.b.switch_to_block(exit);
        self.b.seal_block(exit);
    }

    /// Nested loops over `dims` (row-major); `ptrs[v]` advances by `strides[v][d]` bytes per step
    /// of dim `d`. Dim 0 runs over `range` when given (task splitting). `body` gets the pointers.
    pub fn nest(
        &mut self,
        dims: &[usize],
        ptrs: &[Value],
        strides: &[Vec<i64>],
        range: Option<(Value, Value)>,
        body: &mut dyn FnMut(&mut Self, &[Value]),
    ) {
        if dims.is_empty() {
            body(self, ptrs);
            return;
        }
        let (lo, hi) = match range {
            Some(r) => r,
            None => (self.iconst(0), self.iconst(dims[0] as i64)),
        };
        let strides0: Vec<i64> = strides.iter().map(|s| s[0]).collect();
        let rest: Vec<Vec<i64>> = strides.iter().map(|s| s[1..].to_vec()).collect();
        let dims_rest = dims[1..].to_vec();
        self.for_range(lo, hi, 1, &mut |fx, i| {
            let p: Vec<Value> = ptrs.iter().zip(&strides0).map(|(&p, &s)| fx.offset(p, i, s)).collect();
            fx.nest(&dims_rest, &p, &rest, None, body);
        });
    }

    /// This task's share `[lo, hi)` of `0..n`, in units of `grain` (the last share takes the rest).
    pub fn task_range(&mut self, n: usize, grain: usize) -> (Value, Value) {
        let grain = grain.max(1);
        let units = n.div_ceil(grain) as i64;
        let u = self.iconst(units);
        let t0 = self.b.ins().imul(self.task, u);
        let lo_u = self.b.ins().udiv(t0, self.ntasks);
        let t1 = self.b.ins().iadd_imm_s(self.task, 1);
        let t1 = self.b.ins().imul(t1, u);
        let hi_u = self.b.ins().udiv(t1, self.ntasks);
        let lo = self.b.ins().imul_imm_s(lo_u, grain as i64);
        let hi = self.b.ins().imul_imm_s(hi_u, grain as i64);
        let nn = self.iconst(n as i64);
        let lo = self.b.ins().umin(lo, nn);
        let hi = self.b.ins().umin(hi, nn);
        (lo, hi)
    }

    pub fn var(&mut self, ty: Type, init: Value) -> Variable {
        let v = self.b.declare_var(ty);
        self.b.def_var(v, init);
        v
    }

    // ----- status --------------------------------------------------------------------------------

    /// Returns `st` from the function when it is not 0.
    pub fn check_status(&mut self, st: Value) {
        let err = self.err_block();
        let ok = self.b.create_block();
        self.b.ins().brif(st, err, &[st.into()], ok, &[]);
        self.b.switch_to_block(ok);
        self.b.seal_block(ok);
    }
    /// Returns `code` when `fail` (an i8 condition) holds.
    pub fn fail_if(&mut self, fail: Value, code: i32) {
        let err = self.err_block();
        let ok = self.b.create_block();
        let c = self.b.ins().iconst(I32, code as i64);
        self.b.ins().brif(fail, err, &[c.into()], ok, &[]);
        self.b.switch_to_block(ok);
        self.b.seal_block(ok);
    }
    fn err_block(&mut self) -> Block {
        if let Some(b) = self.err_block {
            return b;
        }
        let e = self.b.create_block();
        self.b.append_block_param(e, I32);
        self.b.set_cold_block(e);
        self.err_block = Some(e);
        e
    }

    // ----- kernel table ------------------------------------------------------------------------

    /// Calls table entry at byte offset `off` with i64 arguments; returns its i32 result if any.
    pub fn call_table(&mut self, off: usize, args: &[Value], returns: bool) -> Option<Value> {
        let mut sig = Signature::new(CallConv::SystemV);
        for _ in args {
            sig.params.push(AbiParam::new(I64));
        }
        if returns {
            sig.returns.push(AbiParam::new(I32));
        }
        let sr = self.b.import_signature(sig);
        let f = self.b.ins().load(I64, mf().with_readonly(), self.table, off as i32);
        let call = self.b.ins().call_indirect(sr, f, args);
        self.b.inst_results(call).first().copied()
    }

    /// A stack slot of `bytes` (8-byte aligned).
    pub fn stack(&mut self, bytes: u32) -> StackSlot {
        self.b.create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, bytes, 3))
    }
    pub fn stack_addr(&mut self, s: StackSlot) -> Value {
        self.b.ins().stack_addr(I64, s, 0)
    }

    // ----- typed loads and stores ------------------------------------------------------------------

    /// Loads element(s) of `dt` at `p` as f32 (`w` = 1) or f32x4 (`w` = 4, f32 only).
    pub fn load_f(&mut self, dt: DType, p: Value, w: usize) -> Value {
        if w == 4 {
            debug_assert_eq!(dt, DType::F32);
            return self.b.ins().load(F32X4, mf_vec(), p, 0);
        }
        match dt {
            DType::F32 => self.b.ins().load(F32, mf(), p, 0),
            DType::I64 => {
                let v = self.b.ins().load(I64, mf(), p, 0);
                self.b.ins().fcvt_from_sint(F32, v)
            }
            DType::I32 => {
                let v = self.b.ins().load(I32, mf(), p, 0);
                self.b.ins().fcvt_from_sint(F32, v)
            }
            DType::BF16 => {
                let h = self.b.ins().uload16(I32, mf(), p, 0);
                let s = self.b.ins().ishl_imm_s(h, 16);
                self.bits_to_float(s)
            }
            DType::F16 => {
                let h = self.b.ins().uload16(I32, mf(), p, 0);
                self.f16_bits_to_f32(h)
            }
        }
    }

    /// Stores f32 value(s) at `p` converted to `dt` like Rust's `as` (ints: truncation toward
    /// zero, saturating, NaN → 0; f16/bf16: round to nearest even).
    pub fn store_f(&mut self, dt: DType, v: Value, p: Value) {
        let ty = self.b.func.dfg.value_type(v);
        if ty == F32X4 {
            debug_assert_eq!(dt, DType::F32);
            self.b.ins().store(mf_vec(), v, p, 0);
            return;
        }
        match dt {
            DType::F32 => {
                self.b.ins().store(mf(), v, p, 0);
            }
            DType::I64 => {
                let i = self.b.ins().fcvt_to_sint_sat(I64, v);
                self.b.ins().store(mf(), i, p, 0);
            }
            DType::I32 => {
                let i = self.b.ins().fcvt_to_sint_sat(I32, v);
                self.b.ins().store(mf(), i, p, 0);
            }
            DType::BF16 => {
                let h = self.f32_to_bf16_bits(v);
                self.b.ins().istore16(mf(), h, p, 0);
            }
            DType::F16 => {
                let h = self.f32_to_f16_bits(v);
                self.b.ins().istore16(mf(), h, p, 0);
            }
        }
    }

    /// Loads an integer element as i64 (exact); floats are truncated (saturating).
    pub fn load_i64(&mut self, dt: DType, p: Value) -> Value {
        match dt {
            DType::I64 => self.b.ins().load(I64, mf(), p, 0),
            DType::I32 => self.b.ins().sload32(mf(), p, 0),
            _ => {
                let f = self.load_f(dt, p, 1);
                self.b.ins().fcvt_to_sint_sat(I64, f)
            }
        }
    }
    /// Stores an i64 into an integer element (i32 wraps like Rust's `as`).
    pub fn store_i64(&mut self, dt: DType, v: Value, p: Value) {
        match dt {
            DType::I64 => {
                self.b.ins().store(mf(), v, p, 0);
            }
            DType::I32 => {
                self.b.ins().istore32(mf(), v, p, 0);
            }
            _ => {
                let f = self.b.ins().fcvt_from_sint(F32, v);
                self.store_f(dt, f, p);
            }
        }
    }

    /// f16 bits (low 16 bits of an i32) to f32, exact (subnormals, inf, NaN).
    pub fn f16_bits_to_f32(&mut self, h: Value) -> Value {
        let sign = self.b.ins().band_imm_s(h, 0x8000);
        let sign = self.b.ins().ishl_imm_s(sign, 16);
        let em = self.b.ins().band_imm_s(h, 0x7fff);
        let sh = self.b.ins().ishl_imm_s(em, 13);
        // Normal and subnormal halves: the shifted bits are the value times 2^-112.
        let f = self.bits_to_float(sh);
        let scale = self.b.ins().f32const(f32::from_bits(0x7780_0000)); // 2^112
        let v = self.b.ins().fmul(f, scale);
        let vb = self.bits_to_int(v);
        let infnan = self.b.ins().bor_imm_s(sh, 0x7f80_0000);
        let big = self.b.ins().icmp_imm_s(IntCC::UnsignedGreaterThanOrEqual, em, 0x7c00);
        let r = self.b.ins().select(big, infnan, vb);
        let r = self.b.ins().bor(r, sign);
        self.bits_to_float(r)
    }

    /// f32 to f16 bits (in an i32), round to nearest even.
    pub fn f32_to_f16_bits(&mut self, x: Value) -> Value {
        let bits = self.bits_to_int(x);
        let sign = self.b.ins().ushr_imm_s(bits, 16);
        let sign = self.b.ins().band_imm_s(sign, 0x8000);
        let a = self.b.ins().band_imm_s(bits, 0x7fff_ffff);
        // Normal range: rebias and round the mantissa to 10 bits (carries into the exponent).
        let lsb = self.b.ins().ushr_imm_s(a, 13);
        let lsb = self.b.ins().band_imm_s(lsb, 1);
        let n = self.b.ins().iadd_imm_s(a, 0xfff - 0x3800_0000);
        let n = self.b.ins().iadd(n, lsb);
        let normal = self.b.ins().ushr_imm_s(n, 13);
        // Subnormal range (|x| < 2^-14): multiples of 2^-24, rounded to nearest even.
        let ax = self.b.ins().fabs(x);
        let s24 = self.b.ins().f32const(16_777_216.0);
        let q = self.b.ins().fmul(ax, s24);
        let q = self.b.ins().nearest(q);
        let sub = self.b.ins().fcvt_to_sint_sat(I32, q);
        let is_sub = self.b.ins().icmp_imm_s(IntCC::UnsignedLessThan, a, 0x3880_0000);
        let r = self.b.ins().select(is_sub, sub, normal);
        // Overflow to infinity (65520 and above round past the largest half), NaN stays NaN.
        let inf = self.b.ins().iconst(I32, 0x7c00);
        let over = self.b.ins().icmp_imm_s(IntCC::UnsignedGreaterThanOrEqual, a, 0x477f_f000);
        let r = self.b.ins().select(over, inf, r);
        let qnan = self.b.ins().iconst(I32, 0x7e00);
        let nan = self.b.ins().icmp_imm_s(IntCC::UnsignedGreaterThan, a, 0x7f80_0000);
        let r = self.b.ins().select(nan, qnan, r);
        self.b.ins().bor(r, sign)
    }

    /// f32 to bf16 bits (in an i32), round to nearest even; NaN stays NaN.
    pub fn f32_to_bf16_bits(&mut self, x: Value) -> Value {
        let bits = self.bits_to_int(x);
        let lsb = self.b.ins().ushr_imm_s(bits, 16);
        let lsb = self.b.ins().band_imm_s(lsb, 1);
        let r = self.b.ins().iadd_imm_s(bits, 0x7fff);
        let r = self.b.ins().iadd(r, lsb);
        let r = self.b.ins().ushr_imm_s(r, 16);
        let q = self.b.ins().ushr_imm_s(bits, 16);
        let q = self.b.ins().bor_imm_s(q, 0x40);
        let nan = self.fcmp(FloatCC::Unordered, x, x);
        self.b.ins().select(nan, q, r)
    }

    /// Rounds f32 value(s) to the value set of `dt` (the `Cast` expression node).
    pub fn round_to(&mut self, dt: DType, x: Value) -> Value {
        let ty = self.b.func.dfg.value_type(x);
        let w = if ty == F32X4 { 4 } else { 1 };
        match dt {
            DType::F32 => x,
            DType::I64 | DType::I32 => {
                // x as iN as f32: truncate, saturate at the type's range (as f32), NaN → 0.
                let lim = if dt == DType::I64 { 9.223_372e18f32 } else { 2_147_483_648.0f32 };
                let t = self.b.ins().trunc(x);
                let hi = self.fconst(lim, w);
                let lo = self.fconst(-lim, w);
                let t = self.pmin(t, hi);
                let t = self.pmax(t, lo);
                let zero = self.fconst(0.0, w);
                let nan = self.fcmp(FloatCC::Unordered, x, x);
                self.sel(nan, zero, t)
            }
            DType::BF16 | DType::F16 => {
                if w == 4 {
                    let lanes: Vec<Value> = (0..4u8)
                        .map(|i| {
                            let l = self.b.ins().extractlane(x, i);
                            self.round_to(dt, l)
                        })
                        .collect();
                    let mut v = self.splat(lanes[0]);
                    for (i, &l) in lanes.iter().enumerate().skip(1) {
                        v = self.b.ins().insertlane(v, l, i as u8);
                    }
                    return v;
                }
                if dt == DType::BF16 {
                    let h = self.f32_to_bf16_bits(x);
                    let s = self.b.ins().ishl_imm_s(h, 16);
                    self.bits_to_float(s)
                } else {
                    let h = self.f32_to_f16_bits(x);
                    self.f16_bits_to_f32(h)
                }
            }
        }
    }
}
