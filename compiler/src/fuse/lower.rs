//! Lowering groups to kernels: buffers, views (layout ops folded into strides), GEMM and
//! elementwise kernels.

use kiln_runtime::graph::{BinaryOp, Op};
use kiln_runtime::{DType, Result};

use super::*;

impl<'a> Fuser<'a> {
    pub(super) fn new_buffer(&mut self, name: &str, dtype: DType, shape: &[usize], kind: BufferKind) -> BufferId {
        self.buffers.push(Buffer { name: name.to_string(), dtype, shape: shape.to_vec(), kind });
        BufferId((self.buffers.len() - 1) as u32)
    }

    /// The view of a materialized value (leaf, group root, or a view op over those).
    pub(super) fn view_of(&mut self, v: usize) -> Result<BufferView> {
        if let Some(t) = &self.views[v] {
            return Ok(t.clone());
        }
        let g = self.g;
        let n = &g.nodes[v];
        let shape = self.shapes[v].clone();
        let t = match &n.op {
            Op::Input { index } => {
                let b = match self.input_bufs[*index] {
                    Some(b) => b,
                    None => {
                        let b = self.new_buffer(&n.name, n.dtype, &shape, BufferKind::Input { index: *index });
                        self.input_bufs[*index] = Some(b);
                        b
                    }
                };
                BufferView::dense(b, &shape)
            }
            Op::Weight { index } => {
                let layout = self.layouts[*index];
                let stored: Vec<usize> = match layout {
                    WeightLayout::Transposed => vec![shape[1], shape[0]],
                    WeightLayout::AsIs => shape.clone(),
                };
                let b = match self.weight_bufs[*index] {
                    Some(b) => b,
                    None => {
                        let name = g.weights[*index].name.clone();
                        let b = self.new_buffer(&name, n.dtype, &stored, BufferKind::Weight { index: *index, layout, concat: None });
                        self.weight_bufs[*index] = Some(b);
                        b
                    }
                };
                match layout {
                    WeightLayout::Transposed => BufferView::dense(b, &stored).permute(&[1, 0]),
                    WeightLayout::AsIs => BufferView::dense(b, &shape),
                }
            }
            Op::Constant { values } => {
                let b = self.new_buffer(&n.name, DType::F32, &shape, BufferKind::Constant { values: values.clone() });
                BufferView::dense(b, &shape)
            }
            Op::Reshape => {
                let x = self.view_of(n.inputs[0].index())?;
                match x.reshape(&shape) {
                    Some(t) => t,
                    None => {
                        let name = format!("{}.copy", n.name);
                        let c = self.emit_copy(&name, n.dtype, &x, std::slice::from_ref(&n.name))?;
                        c.reshape(&shape).ok_or_else(|| internal("reshape of a dense copy failed"))?
                    }
                }
            }
            Op::Transpose { perm } => self.view_of(n.inputs[0].index())?.permute(perm),
            Op::Slice { axis, start, end } => {
                let x = self.view_of(n.inputs[0].index())?;
                let end = end.resolve(self.bucket);
                x.slice(*axis, *start, end - start)
            }
            _ => return Err(internal(format!("value {} used before its kernel was emitted", n.name))),
        };
        self.views[v] = Some(t.clone());
        Ok(t)
    }

    /// A copy kernel materializing `x` densely in a new arena buffer.
    pub(super) fn emit_copy(&mut self, name: &str, dtype: DType, x: &BufferView, fused: &[String]) -> Result<BufferView> {
        let b = self.new_buffer(name, dtype, &x.shape, BufferKind::Arena);
        let out = BufferView::dense(b, &x.shape);
        self.kernels.push(Kernel {
            name: name.to_string(),
            op: KernelOp::Elementwise { expr: Expr { nodes: vec![ExprNode::Load(0)] } },
            inputs: vec![x.clone()],
            output: out.clone(),
            fused: fused.to_vec(),
        });
        Ok(out)
    }

    /// The output buffer of group root `r`, and the view the kernel writes. `sink` allows
    /// writing the layout of a transpose that is `r`'s only user.
    pub(super) fn alloc_output(&mut self, r: usize, sink: bool) -> BufferView {
        let g = self.g;
        let n = &g.nodes[r];
        let shape = self.shapes[r].clone();
        if let Some(oi) = (0..self.g.outputs.len()).find(|&oi| self.g.outputs[oi].index() == r && self.output_bufs[oi].is_none()) {
            let b = self.new_buffer(&self.g.output_names[oi].clone(), n.dtype, &shape, BufferKind::Output { index: oi });
            self.output_bufs[oi] = Some(b);
            let t = BufferView::dense(b, &shape);
            self.views[r] = Some(t.clone());
            return t;
        }
        if sink && !self.is_output[r] && self.use_count[r] == 1 {
            let u = self.users[r][0];
            if let Op::Transpose { perm } = &g.nodes[u].op {
                let tshape = self.shapes[u].clone();
                let b = self.new_buffer(&n.name, n.dtype, &tshape, BufferKind::Arena);
                let mut inv = vec![0; perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    inv[p] = i;
                }
                let t = BufferView::dense(b, &tshape).permute(&inv);
                self.views[r] = Some(t.clone());
                return t;
            }
        }
        let b = self.new_buffer(&n.name, n.dtype, &shape, BufferKind::Arena);
        let t = BufferView::dense(b, &shape);
        self.views[r] = Some(t.clone());
        t
    }

    // ---------------------------------------------------------------- kernels

    pub(super) fn emit_group(&mut self, gid: usize) -> Result<()> {
        let g = self.g;
        let group = self.groups[gid].clone();
        let mut members_sorted = group.members.clone();
        members_sorted.sort_unstable();
        let fused: Vec<String> = members_sorted.iter().map(|&m| g.nodes[m].name.clone()).collect();
        let members: HashSet<usize> = group.members.iter().copied().collect();
        let r = group.root;
        let name = g.nodes[r].name.clone();
        let mut inputs = Vec::new();
        let (op, output) = match &group.kind {
            GroupKind::Elementwise => {
                let iter = self.shapes[r].clone();
                let mut eb = ExprBuilder::new(&members, None, &iter);
                let root = eb.value(self, r, &mut inputs)?;
                let expr = eb.finish(root);
                let out = self.alloc_output(r, true);
                (KernelOp::Elementwise { expr }, out)
            }
            GroupKind::Gemm { core } => self.build_gemm(*core, r, &members, &mut inputs)?,
            GroupKind::Norm { core } => {
                let c = &g.nodes[*core];
                let iter = self.shapes[*core].clone();
                let (x, gamma_v, beta_v) = (c.inputs[0].index(), c.inputs[1].index(), c.inputs.get(2).map(|v| v.index()));
                let (kind, eps) = match c.op {
                    Op::LayerNorm { eps } => (NormKind::LayerNorm, eps),
                    Op::RmsNorm { eps } => (NormKind::RmsNorm, eps),
                    _ => unreachable!(),
                };
                let mut eb = ExprBuilder::new(&members, None, &iter);
                let root = eb.value(self, x, &mut inputs)?;
                let prologue = eb.finish(root);
                inputs.push(self.view_of(gamma_v)?);
                let gamma = inputs.len() - 1;
                let beta = match beta_v {
                    Some(b) => {
                        inputs.push(self.view_of(b)?);
                        Some(inputs.len() - 1)
                    }
                    None => None,
                };
                let out = self.alloc_output(r, false);
                (KernelOp::Norm { kind, eps, prologue, gamma, beta }, out)
            }
            GroupKind::Softmax { core } => {
                let c = &g.nodes[*core];
                let Op::Softmax { axis } = c.op else { unreachable!() };
                let iter = self.shapes[*core].clone();
                let mut eb = ExprBuilder::new(&members, None, &iter);
                let mut root = eb.value(self, c.inputs[0].index(), &mut inputs)?;
                if let Some(m) = c.inputs.get(1) {
                    let me = eb.value(self, m.index(), &mut inputs)?;
                    root = eb.push(ExprNode::Binary(BinaryOp::Add, root, me));
                }
                let prologue = eb.finish(root);
                let mut out = self.alloc_output(r, false);
                let rank = iter.len();
                if axis + 1 != rank {
                    // Move the softmax axis last in every view.
                    let perm: Vec<usize> = (0..rank).filter(|&d| d != axis).chain([axis]).collect();
                    for t in inputs.iter_mut() {
                        *t = t.permute(&perm);
                    }
                    out = out.permute(&perm);
                }
                (KernelOp::Softmax { prologue }, out)
            }
            GroupKind::Reduce { core } => {
                let c = &g.nodes[*core];
                let Op::Reduce { op, axes, .. } = c.op.clone() else { unreachable!() };
                let x = c.inputs[0].index();
                let iter = self.shapes[x].clone();
                let mut eb = ExprBuilder::new(&members, None, &iter);
                let root = eb.value(self, x, &mut inputs)?;
                let prologue = eb.finish(root);
                let kept: Vec<usize> = (0..iter.len()).filter(|d| !axes.contains(d)).collect();
                let perm: Vec<usize> = kept.iter().copied().chain(axes.iter().copied()).collect();
                for t in inputs.iter_mut() {
                    *t = t.permute(&perm);
                }
                let kept_shape: Vec<usize> = kept.iter().map(|&d| iter[d]).collect();
                let out = self.alloc_output(r, false);
                let out = out.reshape(&kept_shape).ok_or_else(|| internal("reduce output view"))?;
                let shape: Vec<usize> = perm.iter().map(|&d| iter[d]).collect();
                (KernelOp::Reduce { op, shape, reduced_dims: axes.len(), prologue }, out)
            }
            GroupKind::Gather { core } => {
                let c = &g.nodes[*core];
                let (t, ids) = (c.inputs[0].index(), c.inputs[1].index());
                inputs.push(self.view_of(t)?);
                inputs.push(self.view_of(ids)?);
                let out = self.alloc_output(r, false);
                (KernelOp::Gather, out)
            }
            GroupKind::Concat { core } => {
                let c = &g.nodes[*core];
                let Op::Concat { axis } = c.op else { unreachable!() };
                for v in c.inputs.clone() {
                    inputs.push(self.view_of(v.index())?);
                }
                let out = self.alloc_output(r, false);
                (KernelOp::Concat { axis }, out)
            }
            GroupKind::Attention(m) => self.build_attention(m, &mut inputs)?,
        };
        self.kernels.push(Kernel { name, op, inputs, output, fused });
        Ok(())
    }

    pub(super) fn build_gemm(
        &mut self,
        core: usize,
        root: usize,
        members: &HashSet<usize>,
        inputs: &mut Vec<BufferView>,
    ) -> Result<(KernelOp, BufferView)> {
        let g = self.g;
        let c = &g.nodes[core];
        let Op::MatMul { transpose_a, transpose_b } = c.op else { unreachable!() };
        let (av, bv) = (c.inputs[0].index(), c.inputs[1].index());
        let os = self.shapes[core].clone();
        let r = os.len();
        let batch = os[..r - 2].to_vec();
        let (m, n) = (os[r - 2], os[r - 1]);
        // A scalar scale right after the matmul becomes alpha.
        let mut alpha = 1.0f32;
        let mut acc_node = core;
        if self.single_use(core) {
            let u = self.users[core][0];
            if members.contains(&u) {
                if let Some((x, f)) = self.scalar_scale(u) {
                    if x == core {
                        alpha = f;
                        acc_node = u;
                    }
                }
            }
        }
        let mut a = self.view_of(av)?;
        if transpose_a {
            a = swap_last_two(&a);
        }
        let mut b = self.view_of(bv)?;
        if transpose_b {
            b = swap_last_two(&b);
        }
        let k = a.shape[a.rank() - 1];
        // Integer operands (a quantized activation minus its zero point times a weight of
        // declared integers, which the backend checks as it packs it): their bounds, where both
        // fit i16 and every sum of k products fits i32.
        let ra = self.ranges[av];
        let a_int = (ra.int && ra.magnitude() <= i16::MAX as f64).then(|| ra.magnitude() as u32);
        let b_int = crate::ir::ranges::weight_bound(g, bv).filter(|&b| b <= i16::MAX as u32);
        let int_bounds = a_int.zip(b_int).filter(|&(x, y)| (k as f64) * (x as f64) * (y as f64) < 2f64.powi(31));
        let shape_with = |last: [usize; 2]| -> Vec<usize> { batch.iter().copied().chain(last).collect() };
        let a = fit_to(&a, &shape_with([m, k])).ok_or_else(|| internal("gemm A view"))?;
        let b = fit_to(&b, &shape_with([k, n])).ok_or_else(|| internal("gemm B view"))?;
        inputs.push(a);
        inputs.push(b);
        let epilogue = if root == acc_node {
            None
        } else {
            let mut eb = ExprBuilder::new(members, Some(acc_node), &os);
            let e = eb.value(self, root, inputs)?;
            Some(eb.finish(e))
        };
        let out = self.alloc_output(root, true);
        let mut out = out.reshape(&os).ok_or_else(|| internal("gemm output view"))?;
        let mut batch = batch;
        let mut m = m;
        // A B shared over the batch: fold the batch dims into m when every view allows it.
        if !batch.is_empty() && inputs[1].strides[..batch.len()].iter().all(|&s| s == 0) {
            let big_m = batch.iter().product::<usize>() * m;
            let merged: Option<Vec<BufferView>> = std::iter::once(inputs[0].reshape(&[big_m, k]))
                .chain(std::iter::once(Some(BufferView {
                    buffer: inputs[1].buffer,
                    offset: inputs[1].offset,
                    shape: vec![k, n],
                    strides: inputs[1].strides[batch.len()..].to_vec(),
                })))
                .chain(inputs[2..].iter().map(|t| t.reshape(&[big_m, n])))
                .chain(std::iter::once(out.reshape(&[big_m, n])))
                .collect();
            if let Some(mut v) = merged {
                out = v.pop().unwrap();
                *inputs = v;
                batch = Vec::new();
                m = big_m;
            }
        }
        Ok((KernelOp::Gemm { batch, m, n, k, alpha, epilogue, int_bounds }, out))
    }

}
