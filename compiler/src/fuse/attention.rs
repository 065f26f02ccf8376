//! Attention: matching `matmul(softmax(scale·matmul(Q, Kᵀ) + mask), V)` and building its kernel.

use kiln_runtime::graph::{BinaryOp, Op};
use kiln_runtime::{DType, Result};

use super::*;

impl<'a> Fuser<'a> {
    /// `x * c`, `c * x` or `x / c` with a scalar constant `c` that keeps x's shape: (x, factor).
    pub(super) fn scalar_scale(&self, v: usize) -> Option<(usize, f32)> {
        let n = &self.g.nodes[v];
        let (a, b) = match n.op {
            Op::Binary(BinaryOp::Mul) | Op::Binary(BinaryOp::Div) => (n.inputs[0].index(), n.inputs[1].index()),
            _ => return None,
        };
        if n.dtype != DType::F32 {
            return None;
        }
        let r = match n.op {
            Op::Binary(BinaryOp::Mul) => match (scalar_constant(self.g, a), scalar_constant(self.g, b)) {
                (_, Some(c)) => Some((a, c)),
                (Some(c), None) => Some((b, c)),
                _ => None,
            },
            _ => scalar_constant(self.g, b).map(|c| (a, 1.0 / c)),
        }?;
        (self.shapes[r.0] == self.shapes[v]).then_some(r)
    }

    /// `Where(IsNaN(p), 0, p)` over a softmax `p` used by nothing else (PyTorch's SDPA export
    /// guards fully masked rows so): (p, the guard's nodes). IsNaN is `Ne(p, p)`, maybe cast.
    fn nan_guard(&self, w: usize) -> Option<(usize, Vec<usize>)> {
        let n = &self.g.nodes[w];
        if n.op != Op::Where || !self.single_use(w) || self.group_of[w].is_some() {
            return None;
        }
        let (mut c, z, p) = (n.inputs[0].index(), n.inputs[1].index(), n.inputs[2].index());
        if scalar_constant(self.g, z).map(f32::to_bits) != Some(0) || self.shapes[w] != self.shapes[p] {
            return None;
        }
        let mut guard = vec![w];
        if matches!(self.g.nodes[c].op, Op::Cast { .. }) {
            if !self.single_use(c) || self.group_of[c].is_some() {
                return None;
            }
            guard.push(c);
            c = self.g.nodes[c].inputs[0].index();
        }
        let ne = &self.g.nodes[c];
        let is_nan = ne.op == Op::Binary(BinaryOp::Ne) && ne.inputs.iter().all(|i| i.index() == p);
        if !is_nan || !self.single_use(c) || self.group_of[c].is_some() || self.shapes[c] != self.shapes[p] {
            return None;
        }
        guard.push(c);
        // p's uses: the two operands of Ne and the Where.
        (self.use_count[p] == 3 && !self.is_output[p]).then_some((p, guard))
    }

    // ---------------------------------------------------------------- grouping

    pub(super) fn match_attention(&self, pv: usize) -> Option<AttnMatch> {
        let n = &self.g.nodes[pv];
        let Op::MatMul { transpose_a: false, .. } = n.op else { return None };
        if n.dtype != DType::F32 {
            return None;
        }
        let (mut p, v) = (n.inputs[0].index(), n.inputs[1].index());
        let mut members = vec![pv];
        let mut zero_nan_rows = false;
        if let Some((sm, guard)) = self.nan_guard(p) {
            members.extend(guard);
            zero_nan_rows = true;
            p = sm;
        } else if !self.single_use(p) {
            return None;
        }
        let sm = &self.g.nodes[p];
        let Op::Softmax { axis } = sm.op else { return None };
        if axis + 1 != self.shapes[p].len() || self.group_of[p].is_some() {
            return None;
        }
        members.push(p);
        let mut mask = sm.inputs.get(1).map(|m| m.index());
        let mut scale = 1.0f32;
        let mut saw_scale = false;
        let mut cur = sm.inputs[0].index();
        let qk = loop {
            if !self.single_use(cur) || self.group_of[cur].is_some() {
                return None;
            }
            members.push(cur);
            let c = &self.g.nodes[cur];
            match c.op {
                Op::MatMul { .. } => break cur,
                Op::Binary(BinaryOp::Mul) | Op::Binary(BinaryOp::Div) => {
                    let (x, f) = self.scalar_scale(cur)?;
                    scale *= f;
                    saw_scale = true;
                    cur = x;
                }
                Op::Binary(BinaryOp::Add) => {
                    if saw_scale || mask.is_some() {
                        return None;
                    }
                    let (a, b) = (c.inputs[0].index(), c.inputs[1].index());
                    let chainy = |x: usize| {
                        matches!(self.g.nodes[x].op, Op::MatMul { .. } | Op::Binary(_)) && self.single_use(x)
                    };
                    let (chain, m) = if chainy(a) && self.shapes[a] == self.shapes[cur] {
                        (a, b)
                    } else if chainy(b) && self.shapes[b] == self.shapes[cur] {
                        (b, a)
                    } else {
                        return None;
                    };
                    mask = Some(m);
                    cur = chain;
                }
                _ => return None,
            }
        };
        let Op::MatMul { transpose_a: qt, .. } = self.g.nodes[qk].op else { return None };
        if qt {
            return None;
        }
        let (mut q, mut k) = (self.g.nodes[qk].inputs[0].index(), self.g.nodes[qk].inputs[1].index());
        // Scalar scales on Q or K fold into the attention scale.
        for side in [&mut q, &mut k] {
            while self.single_use(*side) && self.group_of[*side].is_none() {
                match self.scalar_scale(*side) {
                    Some((x, f)) => {
                        members.push(*side);
                        scale *= f;
                        *side = x;
                    }
                    None => break,
                }
            }
        }
        let scores = &self.shapes[qk];
        let out = &self.shapes[pv];
        let r = scores.len();
        if out.len() != r || out[..r - 2] != scores[..r - 2] {
            return None;
        }
        if let Some(m) = mask {
            if self.g.nodes[m].dtype != DType::F32 {
                return None;
            }
        }
        members.sort_unstable();
        members.dedup();
        Some(AttnMatch { qk, pv, q, k, v, scale, mask, zero_nan_rows, members })
    }

    pub(super) fn build_attention(&mut self, am: &AttnMatch, inputs: &mut Vec<BufferView>) -> Result<(KernelOp, BufferView)> {
        let g = self.g;
        let scores = self.shapes[am.qk].clone();
        let r = scores.len();
        let batch = scores[..r - 2].to_vec();
        let (seq_q, seq_kv) = (scores[r - 2], scores[r - 1]);
        let Op::MatMul { transpose_b: k_t, .. } = g.nodes[am.qk].op else { unreachable!() };
        let Op::MatMul { transpose_b: v_t, .. } = g.nodes[am.pv].op else { unreachable!() };
        let q = self.view_of(am.q)?;
        let head_dim = q.shape[q.rank() - 1];
        let mut k = self.view_of(am.k)?;
        if !k_t {
            k = swap_last_two(&k);
        }
        let mut v = self.view_of(am.v)?;
        if v_t {
            v = swap_last_two(&v);
        }
        let v_dim = v.shape[v.rank() - 1];
        let with = |last: [usize; 2]| -> Vec<usize> { batch.iter().copied().chain(last).collect() };
        inputs.push(fit_to(&q, &with([seq_q, head_dim])).ok_or_else(|| internal("attention Q view"))?);
        inputs.push(fit_to(&k, &with([seq_kv, head_dim])).ok_or_else(|| internal("attention K view"))?);
        inputs.push(fit_to(&v, &with([seq_kv, v_dim])).ok_or_else(|| internal("attention V view"))?);
        let mask = match am.mask {
            Some(mv) => {
                let t = self.view_of(mv)?;
                inputs.push(fit_to(&t, &scores).ok_or_else(|| internal("attention mask view"))?);
                Some(inputs.len() - 1)
            }
            None => None,
        };
        let out = self.alloc_output(am.pv, true);
        let out = out.reshape(&with([seq_q, v_dim])).ok_or_else(|| internal("attention output view"))?;
        Ok((KernelOp::Attention { batch, seq_q, seq_kv, head_dim, v_dim, scale: am.scale, mask, zero_nan_rows: am.zero_nan_rows }, out))
    }

}
