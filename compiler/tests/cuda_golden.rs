//! Golden tests of the CUDA C the code generator emits for small hand-built kernels, one per
//! template variant (`tests/golden/cuda/<case>.txt`; `BLESS=1` rewrites them). The same
//! programs also compile with NVRTC where the library is present.

use kiln_compiler::codegen::cuda::{emit_program, nvrtc, CudaTarget, DevicePlacement};
use kiln_testkit::golden::check_golden;
use kiln_compiler::kernel_ir::*;
use kiln_runtime::graph::{BinaryOp, Bucket, ReduceOp, UnaryOp};
use kiln_runtime::DType;

/// A one-kernel program builder.
struct P {
    buffers: Vec<Buffer>,
    inputs: Vec<Option<BufferId>>,
    weights: Vec<Option<BufferId>>,
}

impl P {
    fn new() -> P {
        P { buffers: vec![], inputs: vec![], weights: vec![] }
    }
    fn buf(&mut self, name: &str, dtype: DType, shape: &[usize], kind: BufferKind) -> BufferId {
        match kind {
            BufferKind::Input { .. } => self.inputs.push(Some(BufferId(self.buffers.len() as u32))),
            BufferKind::Weight { .. } => self.weights.push(Some(BufferId(self.buffers.len() as u32))),
            _ => {}
        }
        self.buffers.push(Buffer { name: name.into(), dtype, shape: shape.to_vec(), kind });
        BufferId(self.buffers.len() as u32 - 1)
    }
    fn input(&mut self, name: &str, dtype: DType, shape: &[usize]) -> BufferId {
        let index = self.inputs.len();
        self.buf(name, dtype, shape, BufferKind::Input { index })
    }
    fn weight(&mut self, name: &str, dtype: DType, shape: &[usize], layout: WeightLayout) -> BufferId {
        let index = self.weights.len();
        self.buf(name, dtype, shape, BufferKind::Weight { index, layout, concat: None })
    }
    fn output(&mut self, name: &str, dtype: DType, shape: &[usize]) -> BufferId {
        self.buf(name, dtype, shape, BufferKind::Output { index: 0 })
    }
    fn finish(self, op: KernelOp, inputs: Vec<BufferView>, output: BufferView) -> KernelProgram {
        let out = output.buffer;
        KernelProgram {
            bucket: Bucket::new(1, 1),
            buffers: self.buffers,
            kernels: vec![Kernel { name: "case".into(), op, inputs, output, fused: vec![] }],
            inputs: self.inputs,
            weights: self.weights,
            outputs: vec![out],
            output_names: vec!["out".into()],
        }
    }
}

fn dense(b: BufferId, shape: &[usize]) -> BufferView {
    BufferView::dense(b, shape)
}

fn expr(nodes: Vec<ExprNode>) -> Expr {
    Expr { nodes }
}

/// Emits the program and checks (or blesses) the golden; compiles it where NVRTC exists.
fn golden(case: &str, prog: &KernelProgram, arch: &str) {
    let target = CudaTarget::new(arch).unwrap();
    let place = DevicePlacement::unshared(prog);
    let m = emit_program(prog, &place, &target).unwrap();
    let k = &m.kernels[0];
    let params: Vec<String> = k.params.iter().map(|p| format!("p{}={}", k.params.iter().position(|q| q == p).unwrap(), p.buffer)).collect();
    let text = format!(
        "// case {case} for {arch}: kind {}, grid {:?}, block {:?}, shared {} B, params {}\n{}",
        k.kind,
        k.grid,
        k.block,
        k.shared_bytes,
        params.join(" "),
        k.source
    );
    check_golden(&format!("tests/golden/cuda/{case}.txt"), &text);
    if nvrtc::nvrtc_present() {
        nvrtc::compile_ptx(&m.source, arch, case).unwrap_or_else(|e| panic!("{case}: {e}"));
    }
}

#[test]
fn elementwise_bias_gelu() {
    let mut p = P::new();
    let x = p.input("x", DType::F32, &[4, 6]);
    let b = p.weight("b", DType::F32, &[6], WeightLayout::AsIs);
    let o = p.output("out", DType::F32, &[4, 6]);
    let e = expr(vec![ExprNode::Load(0), ExprNode::Load(1), ExprNode::Binary(BinaryOp::Add, 0, 1), ExprNode::Unary(UnaryOp::Gelu, 2)]);
    let prog = p.finish(KernelOp::Elementwise { expr: e }, vec![dense(x, &[4, 6]), dense(b, &[6]).broadcast_to(&[4, 6]).unwrap()], dense(o, &[4, 6]));
    golden("elementwise_bias_gelu", &prog, "sm_90");
}

#[test]
fn copy_transpose_i64() {
    let mut p = P::new();
    let x = p.input("x", DType::I64, &[3, 5]);
    let o = p.output("out", DType::I64, &[5, 3]);
    let prog = p.finish(KernelOp::Elementwise { expr: expr(vec![ExprNode::Load(0)]) }, vec![dense(x, &[3, 5]).permute(&[1, 0])], dense(o, &[5, 3]));
    golden("copy_transpose_i64", &prog, "sm_90");
}

/// nn.Linear: B is a weight stored transposed; bias + GELU fused; f32 SIMT.
#[test]
fn gemm_linear_gelu_f32() {
    let mut p = P::new();
    let a = p.input("x", DType::F32, &[8, 16]);
    // A linear layer's weight in its checkpoint layout [out, in], read as B = Wᵀ.
    let w = p.weight("w", DType::F32, &[12, 16], WeightLayout::AsIs);
    let b = p.weight("b", DType::F32, &[12], WeightLayout::AsIs);
    let o = p.output("out", DType::F32, &[8, 12]);
    let e = expr(vec![ExprNode::Acc, ExprNode::Load(2), ExprNode::Binary(BinaryOp::Add, 0, 1), ExprNode::Unary(UnaryOp::Gelu, 2)]);
    let prog = p.finish(
        KernelOp::Gemm { batch: vec![], m: 8, n: 12, k: 16, alpha: 1.0, epilogue: Some(e), int_bounds: None },
        vec![dense(a, &[8, 16]), dense(w, &[12, 16]).permute(&[1, 0]), dense(b, &[12]).broadcast_to(&[8, 12]).unwrap()],
        dense(o, &[8, 12]),
    );
    golden("gemm_linear_gelu_f32", &prog, "sm_90");
}

/// Batched scores Q·Kᵀ with alpha over [batch, heads]; f16 inputs on tensor cores.
#[test]
fn gemm_batched_mma_f16() {
    let mut p = P::new();
    let q = p.input("q", DType::F16, &[2, 3, 10, 8]);
    let k = p.input("k", DType::F16, &[2, 3, 10, 8]);
    let o = p.output("out", DType::F16, &[2, 3, 10, 10]);
    let prog = p.finish(
        KernelOp::Gemm { batch: vec![2, 3], m: 10, n: 10, k: 8, alpha: 0.125, epilogue: None, int_bounds: None },
        vec![dense(q, &[2, 3, 10, 8]), dense(k, &[2, 3, 10, 8]).permute(&[0, 1, 3, 2])],
        dense(o, &[2, 3, 10, 10]),
    );
    golden("gemm_batched_mma_f16", &prog, "sm_80");
}

#[test]
fn layer_norm_residual() {
    let mut p = P::new();
    let x = p.input("x", DType::F32, &[2, 5, 16]);
    let r = p.input("r", DType::F32, &[2, 5, 16]);
    let g = p.weight("g", DType::F32, &[16], WeightLayout::AsIs);
    let b = p.weight("b", DType::F32, &[16], WeightLayout::AsIs);
    let o = p.output("out", DType::F32, &[2, 5, 16]);
    let e = expr(vec![ExprNode::Load(0), ExprNode::Load(1), ExprNode::Binary(BinaryOp::Add, 0, 1)]);
    let prog = p.finish(
        KernelOp::Norm { kind: NormKind::LayerNorm, eps: 1e-12, prologue: e, gamma: 2, beta: Some(3) },
        vec![dense(x, &[2, 5, 16]), dense(r, &[2, 5, 16]), dense(g, &[16]), dense(b, &[16])],
        dense(o, &[2, 5, 16]),
    );
    golden("layer_norm_residual", &prog, "sm_90");
}

#[test]
fn softmax_scale_mask() {
    let mut p = P::new();
    let s = p.input("s", DType::F32, &[2, 3, 7, 7]);
    let m = p.input("m", DType::F32, &[2, 7]);
    let o = p.output("out", DType::F32, &[2, 3, 7, 7]);
    let mv = BufferView { buffer: m, offset: 0, shape: vec![2, 3, 7, 7], strides: vec![7, 0, 0, 1] };
    let e = expr(vec![ExprNode::Load(0), ExprNode::Const(0.125), ExprNode::Binary(BinaryOp::Mul, 0, 1), ExprNode::Load(1), ExprNode::Binary(BinaryOp::Add, 2, 3)]);
    let prog = p.finish(KernelOp::Softmax { prologue: e }, vec![dense(s, &[2, 3, 7, 7]), mv], dense(o, &[2, 3, 7, 7]));
    golden("softmax_scale_mask", &prog, "sm_90");
}

/// BERT-style attention: Q/K/V are head views of [b, s, h·d] buffers, the output is written
/// straight into [b, s, h·d].
#[test]
fn attention_heads() {
    let (b, s, h, d) = (2usize, 10usize, 3usize, 8usize);
    let mut p = P::new();
    let q = p.input("q", DType::F32, &[b, s, h * d]);
    let k = p.input("k", DType::F32, &[b, s, h * d]);
    let v = p.input("v", DType::F32, &[b, s, h * d]);
    let m = p.input("m", DType::F32, &[b, s]);
    let o = p.output("out", DType::F32, &[b, s, h * d]);
    let heads = |x: BufferId| dense(x, &[b, s, h * d]).reshape(&[b, s, h, d]).unwrap().permute(&[0, 2, 1, 3]);
    let mv = BufferView { buffer: m, offset: 0, shape: vec![b, h, s, s], strides: vec![s, 0, 0, 1] };
    let prog = p.finish(
        KernelOp::Attention { batch: vec![b, h], seq_q: s, seq_kv: s, head_dim: d, v_dim: d, scale: 0.35355338, mask: Some(3), zero_nan_rows: false },
        vec![heads(q), heads(k), heads(v), mv],
        heads(o),
    );
    golden("attention_heads", &prog, "sm_90");
}

#[test]
fn gather_rows() {
    let mut p = P::new();
    let t = p.weight("table", DType::F32, &[20, 6], WeightLayout::AsIs);
    let ids = p.input("ids", DType::I64, &[2, 5]);
    let o = p.output("out", DType::F32, &[2, 5, 6]);
    let prog = p.finish(KernelOp::Gather, vec![dense(t, &[20, 6]), dense(ids, &[2, 5])], dense(o, &[2, 5, 6]));
    golden("gather_rows", &prog, "sm_90");
}

/// Masked mean pooling over the sequence: the reduced dim is a strided (non-last) one.
#[test]
fn reduce_masked_sum() {
    let mut p = P::new();
    let x = p.input("x", DType::F32, &[2, 5, 6]);
    let m = p.input("m", DType::I64, &[2, 5]);
    let o = p.output("out", DType::F32, &[2, 6]);
    let xv = dense(x, &[2, 5, 6]).permute(&[0, 2, 1]);
    let mv = BufferView { buffer: m, offset: 0, shape: vec![2, 6, 5], strides: vec![5, 0, 1] };
    let e = expr(vec![ExprNode::Load(0), ExprNode::Load(1), ExprNode::Binary(BinaryOp::Mul, 0, 1)]);
    let prog = p.finish(KernelOp::Reduce { op: ReduceOp::Sum, shape: vec![2, 6, 5], reduced_dims: 1, prologue: e }, vec![xv, mv], dense(o, &[2, 6]));
    golden("reduce_masked_sum", &prog, "sm_90");
}

#[test]
fn concat_last_axis() {
    let mut p = P::new();
    let a = p.input("a", DType::F32, &[3, 4]);
    let b = p.input("b", DType::F32, &[3, 2]);
    let o = p.output("out", DType::F32, &[3, 6]);
    let prog = p.finish(KernelOp::Concat { axis: 1 }, vec![dense(a, &[3, 4]), dense(b, &[3, 2])], dense(o, &[3, 6]));
    golden("concat_last_axis", &prog, "sm_90");
}

/// Emitter input errors are typed, not panics.
#[test]
fn bad_kernels_are_errors() {
    let mut p = P::new();
    let x = p.input("x", DType::F32, &[4, 6]);
    let o = p.output("out", DType::F32, &[4, 6]);
    // An input view whose shape is not the iteration shape.
    let prog = p.finish(KernelOp::Elementwise { expr: expr(vec![ExprNode::Load(0)]) }, vec![dense(x, &[24])], dense(o, &[4, 6]));
    let t = CudaTarget::new("sm_90").unwrap();
    assert!(emit_program(&prog, &DevicePlacement::unshared(&prog), &t).is_err());
    // Attention with a head dim the kernel does not support.
    let mut p = P::new();
    let q = p.input("q", DType::F32, &[1, 4, 256]);
    let o = p.output("out", DType::F32, &[1, 4, 256]);
    let prog = p.finish(
        KernelOp::Attention { batch: vec![1], seq_q: 4, seq_kv: 4, head_dim: 256, v_dim: 256, scale: 1.0, mask: None, zero_nan_rows: false },
        vec![dense(q, &[1, 4, 256]), dense(q, &[1, 4, 256]), dense(q, &[1, 4, 256])],
        dense(o, &[1, 4, 256]),
    );
    let e = emit_program(&prog, &DevicePlacement::unshared(&prog), &t).unwrap_err();
    assert!(e.to_string().contains("head dims"), "{e}");
    assert!(CudaTarget::new("sm_60").is_err() && CudaTarget::new("compute_90").is_err());
}
