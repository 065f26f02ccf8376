//! The recurrent layers: RNN, GRU and LSTM, unrolled over the sequence a bucket fixes.
//!
//! The input projections of every step are one GEMM (`X·Wᵀ + Wb` over all steps at once);
//! each step is then the recurrent product `H·Rᵀ + Rb`, the gates (slices of the sum), their
//! activations and the state update, as ONNX writes the equations. `sequence_lens` (a run-time
//! input) freezes a row's state past its length and zeroes its outputs there (`Where` on
//! `t < len`); the reverse direction walks the steps backwards, so a row starts at its own last
//! valid step. Unrolling is what a compiler with fixed shapes can do without a loop construct
//! (TVM and TensorRT unroll or use a loop op; kiln's IR has none): the graph grows with the
//! sequence, each step's work is small.

use kiln_runtime::graph::{BinaryOp, Dim, Op, UnaryOp, ValueId};
use kiln_runtime::DType;

use super::super::proto::{attribute_proto::AttributeType, AttributeProto, NodeProto};
use super::super::tensor::{Elem, Lit};
use super::{given, unsup, Fail, Importer, NodeCx, Val, R};

/// The ops this file imports.
pub(super) const OPS: &[&str] = &["RNN", "GRU", "LSTM"];

/// One activation of `activations`, with its alpha and beta.
#[derive(Clone)]
struct Act {
    kind: String,
    alpha: f32,
    beta: f32,
}

/// What one direction of one layer reads, each a graph value.
struct Dir {
    /// X·Wᵀ + Wb for every step: [S, B, G·H].
    xw: ValueId,
    /// Rᵀ: [H, G·H].
    rt: ValueId,
    /// Rb: [G·H] (zeros where B is not given).
    rb: Option<ValueId>,
    /// Peepholes (LSTM): [3·H] as i, o, f.
    p: Option<ValueId>,
    h0: ValueId,
    c0: Option<ValueId>,
    acts: Vec<Act>,
    /// `clip`: activations' inputs bounded to [-clip, clip].
    clip: Option<f32>,
}

/// Gates per step: RNN 1, GRU 3 (z, r, h), LSTM 4 (i, o, f, c).
fn gate_count(op: &str) -> usize {
    match op {
        "RNN" => 1,
        "GRU" => 3,
        _ => 4,
    }
}

impl Importer<'_> {
    /// A node of one of [`OPS`] with a graph-computed input, as kiln ops. Returns its outputs.
    pub(super) fn import_recurrent(&mut self, cx: &NodeCx) -> R<Vec<ValueId>> {
        let NodeCx { op, name, ins, at, .. } = *cx;
        let gates = gate_count(op);
        let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
        let dt = self.dtype(&Val::Node(x));
        if !dt.is_float() {
            return unsup(format!("{op} of {dt}"));
        }
        let x = self.cast_to(name, x, DType::F32)?;
        let batch_major = at.int("layout", 0) != 0;
        let xs = self.shape(&Val::Node(x));
        if xs.len() != 3 {
            return Err(Fail::Invalid(format!("{op} X of shape {xs:?}")));
        }
        // X as [S, B, I].
        let x = if batch_major { self.tmp(name, Op::Transpose { perm: vec![1, 0, 2] }, vec![x])? } else { x };
        let (s, b, input) = if batch_major { (xs[1], xs[0], xs[2]) } else { (xs[0], xs[1], xs[2]) };
        let hidden = usize::try_from(at.int("hidden_size", 0)).ok().filter(|&h| h > 0).ok_or_else(|| Fail::Invalid("no positive hidden_size".into()))?;
        if s > 4096 {
            return unsup(format!("{op} over {s} steps (kiln unrolls at most 4096)"));
        }
        let direction = at.string("direction").unwrap_or_else(|| "forward".into());
        let dirs = match direction.as_str() {
            "forward" | "reverse" => 1,
            "bidirectional" => 2,
            d => return Err(Fail::Invalid(format!("direction `{d}`"))),
        };
        if at.int("input_forget", 0) != 0 {
            return unsup(format!("{op} with input_forget"));
        }
        let clip = if at.has("clip") {
            let c = at.float("clip", 0.0);
            if c.is_nan() || c <= 0.0 {
                return Err(Fail::Invalid(format!("clip {c}")));
            }
            Some(c)
        } else {
            None
        };
        let gh = gates * hidden;
        let f32_in = |me: &mut Self, k: usize, want: &[usize], what: &str| -> R<Option<ValueId>> {
            if !given(ins, k) {
                return Ok(None);
            }
            let v = me.node(&cx.iname(k), &cx.inp(k)?)?;
            let sh = me.shape(&Val::Node(v));
            if sh != want {
                return Err(Fail::Invalid(format!("{op} {what} of shape {sh:?} (want {want:?})")));
            }
            Ok(Some(me.cast_to(name, v, DType::F32)?))
        };
        let w = f32_in(self, 1, &[dirs, gh, input], "W")?.ok_or_else(|| Fail::Invalid("no W".into()))?;
        let r = f32_in(self, 2, &[dirs, gh, hidden], "R")?.ok_or_else(|| Fail::Invalid("no R".into()))?;
        let bias = f32_in(self, 3, &[dirs, 2 * gh], "B")?;
        let h0 = f32_in(self, 5, &[dirs, b, hidden], "initial_h")?;
        let c0 = if op == "LSTM" { f32_in(self, 6, &[dirs, b, hidden], "initial_c")? } else { None };
        let peep = if op == "LSTM" { f32_in(self, 7, &[dirs, 3 * hidden], "P")? } else { None };
        // Each row's length as f32 [B, 1] (run-time).
        let lens = if given(ins, 4) {
            let l = self.node(&cx.iname(4), &cx.inp(4)?)?;
            if self.shape(&Val::Node(l)) != [b] {
                return Err(Fail::Invalid(format!("{op} sequence_lens of shape {:?} for batch {b}", self.shape(&Val::Node(l)))));
            }
            let l = self.cast_to(name, l, DType::F32)?;
            Some(self.reshape(&self.fresh(name), l, &[b, 1])?)
        } else {
            None
        };
        let acts = self.rnn_activations(op, at, dirs)?;
        let zeros = |me: &mut Self| me.node(&me.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![b, hidden], vec![0.0; b * hidden])));
        let x2 = self.reshape(&self.fresh(name), x, &[s * b, input])?;
        let mut ys = Vec::new();
        let mut finals = Vec::new();
        for (d, dir_acts) in acts.iter().enumerate() {
            let pick = |me: &mut Self, v: ValueId, shape: &[usize]| -> R<ValueId> {
                let sl = if dirs == 1 { v } else { me.tmp(name, Op::Slice { axis: 0, start: d, end: Dim::Fixed(d + 1) }, vec![v])? };
                me.reshape(&me.fresh(name), sl, shape)
            };
            let wd = pick(self, w, &[gh, input])?;
            let mut xw = self.tmp(name, Op::MatMul { transpose_a: false, transpose_b: true }, vec![x2, wd])?;
            let mut rb = None;
            if let Some(bv) = bias {
                let bd = pick(self, bv, &[2 * gh])?;
                let wb = self.tmp(name, Op::Slice { axis: 0, start: 0, end: Dim::Fixed(gh) }, vec![bd])?;
                let rbv = self.tmp(name, Op::Slice { axis: 0, start: gh, end: Dim::Fixed(2 * gh) }, vec![bd])?;
                xw = self.bin(name, BinaryOp::Add, xw, wb)?;
                rb = Some(rbv);
            }
            let xw = self.reshape(&self.fresh(name), xw, &[s, b, gh])?;
            let rd = pick(self, r, &[gh, hidden])?;
            let rt = self.tmp(name, Op::Transpose { perm: vec![1, 0] }, vec![rd])?;
            let h0d = match h0 {
                Some(v) => pick(self, v, &[b, hidden])?,
                None => zeros(self)?,
            };
            let c0d = match (op, c0) {
                ("LSTM", Some(v)) => Some(pick(self, v, &[b, hidden])?),
                ("LSTM", None) => Some(zeros(self)?),
                _ => None,
            };
            let p = match peep {
                Some(v) => Some(pick(self, v, &[3 * hidden])?),
                None => None,
            };
            let dir = Dir { xw, rt, rb, p, h0: h0d, c0: c0d, acts: dir_acts.clone(), clip };
            let reverse = direction == "reverse" || d == 1;
            let (y, h, c) = self.unroll(name, op, &dir, s, b, hidden, reverse, lens, at.int("linear_before_reset", 0) != 0)?;
            ys.push(y);
            finals.push((h, c));
        }
        // Y: [S, D, B, H] (layout 0) or [B, S, D, H]; Y_h, Y_c: [D, B, H] (or [B, D, H]).
        let mut outs = Vec::new();
        let steps: Vec<ValueId> = ys.iter().flatten().copied().collect();
        let y = {
            // ys[d][t] is [B, H]: stack as [D, S, B, H].
            let mut rows = Vec::new();
            for t in steps {
                rows.push(self.reshape(&self.fresh(name), t, &[1, 1, b, hidden])?);
            }
            let all = self.tmp(name, Op::Concat { axis: 0 }, rows)?;
            let all = self.reshape(&self.fresh(name), all, &[dirs, s, b, hidden])?;
            let perm = if batch_major { vec![2, 1, 0, 3] } else { vec![1, 0, 2, 3] };
            self.tmp(name, Op::Transpose { perm }, vec![all])?
        };
        outs.push(self.cast_to(name, y, dt)?);
        let stack = |me: &mut Self, vs: Vec<ValueId>| -> R<ValueId> {
            let mut rows = Vec::new();
            for v in vs {
                rows.push(me.reshape(&me.fresh(name), v, &[1, b, hidden])?);
            }
            let all = if rows.len() == 1 { rows[0] } else { me.tmp(name, Op::Concat { axis: 0 }, rows)? };
            let all = if batch_major { me.tmp(name, Op::Transpose { perm: vec![1, 0, 2] }, vec![all])? } else { all };
            me.cast_to(name, all, dt)
        };
        let hs: Vec<ValueId> = finals.iter().map(|f| f.0).collect();
        outs.push(stack(self, hs)?);
        if op == "LSTM" {
            let cs: Vec<ValueId> = finals.iter().filter_map(|f| f.1).collect();
            outs.push(stack(self, cs)?);
        }
        Ok(outs)
    }

    /// One direction over the `s` steps: each step's output [B, H] in time order, the final
    /// H and (LSTM) C.
    #[allow(clippy::too_many_arguments)]
    fn unroll(&mut self, name: &str, op: &str, d: &Dir, s: usize, b: usize, hidden: usize, reverse: bool, lens: Option<ValueId>, lbr: bool) -> R<(Vec<ValueId>, ValueId, Option<ValueId>)> {
        let (mut h, mut c) = (d.h0, d.c0);
        let mut ys = vec![None; s];
        let gate = |me: &mut Self, v: ValueId, k: usize| -> R<ValueId> {
            me.tmp(name, Op::Slice { axis: 1, start: k * hidden, end: Dim::Fixed((k + 1) * hidden) }, vec![v])
        };
        let peep = |me: &mut Self, k: usize| -> R<Option<ValueId>> {
            match d.p {
                Some(p) => Ok(Some(me.tmp(name, Op::Slice { axis: 0, start: k * hidden, end: Dim::Fixed((k + 1) * hidden) }, vec![p])?)),
                None => Ok(None),
            }
        };
        let order: Vec<usize> = if reverse { (0..s).rev().collect() } else { (0..s).collect() };
        for t in order {
            let xt = self.tmp(name, Op::Slice { axis: 0, start: t, end: Dim::Fixed(t + 1) }, vec![d.xw])?;
            let xt = self.reshape(&self.fresh(name), xt, &[b, hidden * gate_count(op)])?;
            let mut hr = self.tmp(name, Op::MatMul { transpose_a: false, transpose_b: false }, vec![h, d.rt])?;
            if let Some(rb) = d.rb {
                hr = self.bin(name, BinaryOp::Add, hr, rb)?;
            }
            let (hn, cn) = match op {
                "RNN" => {
                    let z = self.bin(name, BinaryOp::Add, xt, hr)?;
                    (self.rnn_act(name, d, &d.acts[0], z)?, None)
                }
                "GRU" => {
                    // Gates z, r, h.
                    let (xz, xr, xh) = (gate(self, xt, 0)?, gate(self, xt, 1)?, gate(self, xt, 2)?);
                    let (hz, hrr, hh) = (gate(self, hr, 0)?, gate(self, hr, 1)?, gate(self, hr, 2)?);
                    let zs = self.bin(name, BinaryOp::Add, xz, hz)?;
                    let z = self.rnn_act(name, d, &d.acts[0], zs)?;
                    let rs = self.bin(name, BinaryOp::Add, xr, hrr)?;
                    let rg = self.rnn_act(name, d, &d.acts[0], rs)?;
                    let pre = if lbr {
                        // rt ⊙ (H·Rhᵀ + Rbh)
                        let m = self.bin(name, BinaryOp::Mul, rg, hh)?;
                        self.bin(name, BinaryOp::Add, xh, m)?
                    } else {
                        // (rt ⊙ H)·Rhᵀ + Rbh
                        let rh = self.bin(name, BinaryOp::Mul, rg, h)?;
                        let rth = self.tmp(name, Op::Slice { axis: 1, start: 2 * hidden, end: Dim::Fixed(3 * hidden) }, vec![d.rt])?;
                        let mut m = self.tmp(name, Op::MatMul { transpose_a: false, transpose_b: false }, vec![rh, rth])?;
                        if let Some(rb) = d.rb {
                            let rbh = self.tmp(name, Op::Slice { axis: 0, start: 2 * hidden, end: Dim::Fixed(3 * hidden) }, vec![rb])?;
                            m = self.bin(name, BinaryOp::Add, m, rbh)?;
                        }
                        self.bin(name, BinaryOp::Add, xh, m)?
                    };
                    let hc = self.rnn_act(name, d, &d.acts[1], pre)?;
                    // (1 - z)·hc + z·H = hc + z·(H - hc)
                    let diff = self.bin(name, BinaryOp::Sub, h, hc)?;
                    let zd = self.bin(name, BinaryOp::Mul, z, diff)?;
                    (self.bin(name, BinaryOp::Add, hc, zd)?, None)
                }
                _ => {
                    // Gates i, o, f, c; peepholes i, o, f.
                    let sum = self.bin(name, BinaryOp::Add, xt, hr)?;
                    let cprev = c.ok_or_else(|| Fail::Invalid("LSTM without a cell state".into()))?;
                    let with_peep = |me: &mut Self, g: ValueId, k: usize, cell: ValueId| -> R<ValueId> {
                        match peep(me, k)? {
                            Some(p) => {
                                let pc = me.bin(name, BinaryOp::Mul, p, cell)?;
                                me.bin(name, BinaryOp::Add, g, pc)
                            }
                            None => Ok(g),
                        }
                    };
                    let gi = gate(self, sum, 0)?;
                    let gi = with_peep(self, gi, 0, cprev)?;
                    let i = self.rnn_act(name, d, &d.acts[0], gi)?;
                    let gf = gate(self, sum, 2)?;
                    let gf = with_peep(self, gf, 2, cprev)?;
                    let f = self.rnn_act(name, d, &d.acts[0], gf)?;
                    let gc = gate(self, sum, 3)?;
                    let cc = self.rnn_act(name, d, &d.acts[1], gc)?;
                    let fc = self.bin(name, BinaryOp::Mul, f, cprev)?;
                    let ic = self.bin(name, BinaryOp::Mul, i, cc)?;
                    let cn = self.bin(name, BinaryOp::Add, fc, ic)?;
                    let go = gate(self, sum, 1)?;
                    let go = with_peep(self, go, 1, cn)?;
                    let o = self.rnn_act(name, d, &d.acts[0], go)?;
                    let hc = self.rnn_act(name, d, &d.acts[2], cn)?;
                    (self.bin(name, BinaryOp::Mul, o, hc)?, Some(cn))
                }
            };
            // Past a row's length: the state stays, the output is 0.
            let (hn, cn, y) = match lens {
                Some(l) => {
                    let tk = self.k(name, t as f32, DType::F32)?;
                    let live = self.bin(name, BinaryOp::Lt, tk, l)?;
                    let live = self.as_bool(&self.fresh(name), live)?;
                    let zero = self.k(name, 0.0, DType::F32)?;
                    let y = self.tmp(name, Op::Where, vec![live, hn, zero])?;
                    let hn = self.tmp(name, Op::Where, vec![live, hn, h])?;
                    let cn = match (cn, c) {
                        (Some(cn), Some(cp)) => Some(self.tmp(name, Op::Where, vec![live, cn, cp])?),
                        _ => cn,
                    };
                    (hn, cn, y)
                }
                None => (hn, cn, hn),
            };
            ys[t] = Some(y);
            h = hn;
            c = cn;
        }
        Ok((ys.into_iter().flatten().collect(), h, c))
    }

    /// `activations` (with `activation_alpha` / `activation_beta`) per direction, or the op's
    /// defaults: RNN Tanh; GRU Sigmoid, Tanh; LSTM Sigmoid, Tanh, Tanh.
    fn rnn_activations(&self, op: &str, at: &super::Attrs, dirs: usize) -> R<Vec<Vec<Act>>> {
        let per: usize = match op {
            "RNN" => 1,
            "GRU" => 2,
            _ => 3,
        };
        let names: Vec<String> = match at.strings("activations") {
            Some(v) => v,
            None => {
                let d: &[&str] = match op {
                    "RNN" => &["Tanh"],
                    "GRU" => &["Sigmoid", "Tanh"],
                    _ => &["Sigmoid", "Tanh", "Tanh"],
                };
                d.iter().cycle().take(per * dirs).map(|s| s.to_string()).collect()
            }
        };
        if names.len() != per * dirs {
            return Err(Fail::Invalid(format!("{} activations for {dirs} direction(s) of {op} (want {})", names.len(), per * dirs)));
        }
        let (alphas, betas) = (at.floats("activation_alpha").unwrap_or_default(), at.floats("activation_beta").unwrap_or_default());
        let acts: Vec<Act> = names
            .iter()
            .enumerate()
            .map(|(i, k)| Act { kind: k.to_lowercase(), alpha: alphas.get(i).copied().unwrap_or(f32::NAN), beta: betas.get(i).copied().unwrap_or(f32::NAN) })
            .collect();
        Ok(acts.chunks(per).map(|c| c.to_vec()).collect())
    }

    /// `a(x)` for one of the recurrent layers' activation functions, `x` first clipped to
    /// `d.clip` where there is one. The ones that are ONNX ops are imported as those ops are
    /// (`activation.rs`, with `a`'s alpha and beta as their attributes, defaults where absent);
    /// Affine and ScaledTanh, which left the op set, are written here.
    fn rnn_act(&mut self, name: &str, d: &Dir, a: &Act, x: ValueId) -> R<ValueId> {
        use BinaryOp::{Add, Max, Min, Mul};
        let x = match d.clip {
            Some(c) => {
                let (lo, hi) = (self.k(name, -c, DType::F32)?, self.k(name, c, DType::F32)?);
                let v = self.bin(name, Max, x, lo)?;
                self.bin(name, Min, v, hi)?
            }
            None => x,
        };
        let as_op = |k: &str| match k {
            "leakyrelu" => Some("LeakyRelu"),
            "thresholdedrelu" => Some("ThresholdedRelu"),
            "hardsigmoid" => Some("HardSigmoid"),
            "elu" => Some("Elu"),
            "softsign" => Some("Softsign"),
            _ => None,
        };
        Ok(match a.kind.as_str() {
            "sigmoid" => self.un(name, UnaryOp::Sigmoid, x)?,
            "tanh" => self.un(name, UnaryOp::Tanh, x)?,
            "relu" => self.un(name, UnaryOp::Relu, x)?,
            "softplus" => self.un(name, UnaryOp::Softplus, x)?,
            "affine" | "scaledtanh" => {
                let (alpha, beta) = (if a.alpha.is_nan() { 1.0 } else { a.alpha }, if a.beta.is_nan() { 0.0 } else { a.beta });
                let (ka, kb) = (self.k(name, alpha, DType::F32)?, self.k(name, beta, DType::F32)?);
                if a.kind == "affine" {
                    // alpha·x + beta
                    let ax = self.bin(name, Mul, x, ka)?;
                    self.bin(name, Add, ax, kb)?
                } else {
                    // alpha·tanh(beta·x)
                    let bx = self.bin(name, Mul, x, kb)?;
                    let t = self.un(name, UnaryOp::Tanh, bx)?;
                    self.bin(name, Mul, t, ka)?
                }
            }
            k => {
                let Some(op) = as_op(k) else { return unsup(format!("recurrent activation `{k}`")) };
                let float = |n: &str, v: f32| AttributeProto { name: Some(n.into()), f: Some(v), r#type: Some(AttributeType::Float as i32), ..Default::default() };
                let attrs: Vec<AttributeProto> = [("alpha", a.alpha), ("beta", a.beta)].into_iter().filter(|(_, v)| !v.is_nan()).map(|(n, v)| float(n, v)).collect();
                let at = super::Attrs::new(&attrs);
                let node = NodeProto::default();
                let ins = [Some(Val::Node(x))];
                let cx = NodeCx { op, name, n: &node, ins: &ins, at: &at, opset: 22 };
                self.import_activation(&cx)?[0]
            }
        })
    }
}
