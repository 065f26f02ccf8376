//! Products: MatMul (a vector as a 1-row or 1-column matrix), Gemm and Einsum (the quantized
//! forms are in `quant.rs`).

use kiln_runtime::graph::{BinaryOp, Op, ReduceOp, ValueId};

use super::super::shape;
use super::super::tensor::{Elem, Lit};
use super::{one, unsup, Fail, Importer, NodeCx, Val, R};

/// An Einsum operand while it is reduced: its value and one letter per dim.
type Term = (ValueId, Vec<char>);

/// The ops this file imports.
pub(super) const OPS: &[&str] = &[
    "MatMul", "Gemm", "Einsum",
];

impl Importer<'_> {
    /// A node of one of [`OPS`] with a graph-computed input, as kiln ops. Returns its outputs.
    pub(super) fn import_linalg(&mut self, cx: &NodeCx) -> R<Vec<ValueId>> {
        let NodeCx { op, name, ins, at, .. } = *cx;
        match op {
            "MatMul" => {
                let (a, b) = (self.node(&cx.iname(0), &cx.inp(0)?)?, self.node(&cx.iname(1), &cx.inp(1)?)?);
                let (sa, sb) = (self.shape(&Val::Node(a)), self.shape(&Val::Node(b)));
                let a2 = if sa.len() == 1 { self.reshape(&self.fresh(name), a, &[1, sa[0]])? } else { a };
                let b2 = if sb.len() == 1 { self.reshape(&self.fresh(name), b, &[sb[0], 1])? } else { b };
                let mut y = self.push(name, Op::MatMul { transpose_a: false, transpose_b: false }, vec![a2, b2])?;
                if sa.len() == 1 || sb.len() == 1 {
                    let mut s = self.shape(&Val::Node(y));
                    if sb.len() == 1 {
                        s.pop();
                    }
                    if sa.len() == 1 {
                        s.remove(s.len() - 1 - usize::from(sb.len() != 1));
                    }
                    y = self.reshape(&self.fresh(name), y, &s)?;
                }
                one(y)
            }
            "Gemm" => {
                let (a, b) = (self.node(&cx.iname(0), &cx.inp(0)?)?, self.node(&cx.iname(1), &cx.inp(1)?)?);
                let (ta, tb) = (at.int("transA", 0) != 0, at.int("transB", 0) != 0);
                let (alpha, beta) = (at.float("alpha", 1.0), at.float("beta", 1.0));
                let mm = if alpha == 1.0 && ins.get(2).cloned().flatten().is_none() { name.to_string() } else { self.fresh(name) };
                let mut y = self.push(&mm, Op::MatMul { transpose_a: ta, transpose_b: tb }, vec![a, b])?;
                if alpha != 1.0 {
                    let k = self.scalar(name, alpha, self.dtype(&Val::Node(y)))?;
                    y = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![y, k])?;
                }
                if let Some(c) = ins.get(2).cloned().flatten() {
                    let mut c = self.node(&cx.iname(2), &c)?;
                    if beta != 1.0 {
                        let k = self.scalar(name, beta, self.dtype(&Val::Node(c)))?;
                        c = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![c, k])?;
                    }
                    y = self.push(name, Op::Binary(BinaryOp::Add), vec![y, c])?;
                }
                one(y)
            }
            // Operands taken left to right: a letter repeated within one operand takes the
            // diagonal (one gather by known flat ids); a letter no later operand and not the
            // output needs is summed away; two operands meet in one batched GEMM,
            // [batch, left, shared]·[batch, shared, right]; the result is transposed to the
            // output's letters. `...` stands for the same dims in every operand.
            "Einsum" => {
                let eq: String = at.string("equation").ok_or_else(|| Fail::Invalid("Einsum without an equation".into()))?.chars().filter(|c| !c.is_whitespace()).collect();
                let (lhs, out) = match eq.split_once("->") {
                    Some((l, o)) => (l.to_string(), Some(o.to_string())),
                    None => (eq.clone(), None),
                };
                let specs: Vec<&str> = lhs.split(',').collect();
                let vals: Vec<ValueId> = (0..ins.len()).map(|k| self.node(&cx.iname(k), &cx.inp(k)?)).collect::<R<_>>()?;
                if specs.len() != vals.len() {
                    return Err(Fail::Invalid(format!("Einsum equation `{eq}` for {} inputs", vals.len())));
                }
                if vals.iter().any(|&v| !self.dtype(&Val::Node(v)).is_float()) {
                    return unsup("Einsum of integers");
                }
                if !eq.is_ascii() || eq.matches("->").count() > 1 || specs.iter().chain(out.as_deref().into_iter().collect::<Vec<_>>().iter()).any(|t| t.matches("...").count() > 1) {
                    return Err(Fail::Invalid(format!("Einsum equation `{eq}`")));
                }
                // `...` becomes the digits '0'.. (right-aligned across operands).
                let mut ell = 0;
                for (&v, sp) in vals.iter().zip(&specs) {
                    if sp.contains("...") {
                        let r = self.shape(&Val::Node(v)).len();
                        let k = (r + 3).checked_sub(sp.len()).ok_or_else(|| Fail::Invalid(format!("Einsum term `{sp}` for rank {r}")))?;
                        ell = ell.max(k);
                    }
                }
                if ell > 10 {
                    return unsup(format!("Einsum `...` over {ell} dims"));
                }
                let expand = |sp: &str, rank: usize| -> R<Vec<char>> {
                    let Some((a, b)) = sp.split_once("...") else { return Ok(sp.chars().collect()) };
                    let k = rank.checked_sub(a.len() + b.len()).ok_or_else(|| Fail::Invalid(format!("Einsum term `{sp}` for rank {rank}")))?;
                    Ok(a.chars().chain((ell - k..ell).map(|d| char::from(b'0' + d as u8))).chain(b.chars()).collect())
                };
                let mut terms: Vec<Term> = Vec::new();
                for (&v, sp) in vals.iter().zip(&specs) {
                    let letters = expand(sp, self.shape(&Val::Node(v)).len())?;
                    if letters.len() != self.shape(&Val::Node(v)).len() || letters.iter().any(|c| !c.is_ascii_alphanumeric()) {
                        return Err(Fail::Invalid(format!("Einsum term `{sp}` for an input of shape {:?}", self.shape(&Val::Node(v)))));
                    }
                    terms.push((v, letters));
                }
                let out: Vec<char> = match out {
                    Some(o) => expand(&o, ell + o.replace("...", "").len())?,
                    None => {
                        // Implicit: the letters seen once, sorted, after the `...` dims.
                        let all: Vec<char> = terms.iter().flat_map(|t| t.1.clone()).collect();
                        let mut o: Vec<char> = all.iter().copied().filter(|c| c.is_ascii_alphabetic() && all.iter().filter(|d| *d == c).count() == 1).collect();
                        o.sort_unstable();
                        (0..ell).map(|d| char::from(b'0' + d as u8)).chain(o).collect()
                    }
                };
                if out.iter().enumerate().any(|(i, c)| out[..i].contains(c) || !terms.iter().any(|t| t.1.contains(c))) {
                    return Err(Fail::Invalid(format!("Einsum equation `{eq}`: each output letter must appear once, and in an input")));
                }
                let letters: Vec<Vec<char>> = terms.iter().map(|t| t.1.clone()).collect();
                let mut acc: Option<Term> = None;
                for (k, t) in terms.into_iter().enumerate() {
                    // The letters the output or a later operand still needs.
                    let later: Vec<char> = out.iter().chain(letters[k + 1..].iter().flatten()).copied().collect();
                    let t = self.einsum_diagonal(name, t)?;
                    acc = Some(match acc {
                        None => self.einsum_sum_away(name, t, &later)?,
                        Some(a) => {
                            let t = self.einsum_sum_away(name, t, &[later.as_slice(), &a.1].concat())?;
                            let a = self.einsum_sum_away(name, a, &[later.as_slice(), &t.1].concat())?;
                            self.einsum_pair(name, a, t, &later)?
                        }
                    });
                }
                let (v, letters) = acc.ok_or_else(|| Fail::Invalid("Einsum of no inputs".into()))?;
                if out.iter().any(|c| !letters.contains(c)) || letters.len() != out.len() {
                    return Err(Fail::Invalid(format!("Einsum output `{}` from the letters `{}`", out.iter().collect::<String>(), letters.iter().collect::<String>())));
                }
                let perm: Vec<usize> = out.iter().map(|c| letters.iter().position(|l| l == c).unwrap_or(0)).collect();
                if perm.iter().enumerate().all(|(i, &p)| i == p) {
                    return one(self.push(name, Op::Cast { to: self.dtype(&Val::Node(v)) }, vec![v])?);
                }
                one(self.push(name, Op::Transpose { perm }, vec![v])?)
            }
            _ => unsup(format!("op `{op}` is not supported")),
        }
    }


    /// The diagonal of `t` over each letter it repeats: one gather of the flat values.
    fn einsum_diagonal(&mut self, name: &str, t: Term) -> R<Term> {
        let (v, letters) = t;
        let mut uniq: Vec<char> = Vec::new();
        for &c in &letters {
            if !uniq.contains(&c) {
                uniq.push(c);
            }
        }
        if uniq.len() == letters.len() {
            return Ok((v, letters));
        }
        let s = self.shape(&Val::Node(v));
        if s.iter().product::<usize>() >= 1 << 24 {
            return unsup("an Einsum diagonal of 2^24 elements or more (flat ids are exact below 2^24)");
        }
        let mut us = Vec::new();
        for &c in &uniq {
            let dims: Vec<usize> = letters.iter().zip(&s).filter(|(l, _)| **l == c).map(|(_, &d)| d).collect();
            if dims.iter().any(|&d| d != dims[0]) {
                return Err(Fail::Invalid(format!("Einsum letter `{c}` over dims {dims:?}")));
            }
            us.push(dims[0]);
        }
        let (st, ust) = (shape::strides(&s), shape::strides(&us));
        // Each dim's letter's place among the unique letters.
        let at: Vec<usize> = letters.iter().map(|c| uniq.iter().position(|u| u == c).unwrap_or(0)).collect();
        let numel: usize = us.iter().product();
        let ids: Vec<f64> = (0..numel).map(|p| at.iter().enumerate().map(|(d, &u)| (p / ust[u] % us[u]) * st[d]).sum::<usize>() as f64).collect();
        let ids = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::I64, us.clone(), ids)))?;
        let table = self.reshape(&self.fresh(name), v, &[s.iter().product(), 1])?;
        let g = self.tmp(name, Op::Gather, vec![table, ids])?;
        Ok((self.reshape(&self.fresh(name), g, &us)?, uniq))
    }

    /// `t` with the letters not in `keep` summed away.
    fn einsum_sum_away(&mut self, name: &str, t: Term, keep: &[char]) -> R<Term> {
        let (v, letters) = t;
        let axes: Vec<usize> = (0..letters.len()).filter(|&d| !keep.contains(&letters[d])).collect();
        if axes.is_empty() {
            return Ok((v, letters));
        }
        let y = self.tmp(name, Op::Reduce { op: ReduceOp::Sum, axes: axes.clone(), keep_dims: false }, vec![v])?;
        Ok((y, letters.into_iter().enumerate().filter(|(d, _)| !axes.contains(d)).map(|(_, c)| c).collect()))
    }

    /// Two terms (every letter of each in the other, the output or a later operand) as one
    /// batched GEMM: letters in both and needed later are the batch, in both and not needed the
    /// contraction, the rest each side's free dims. Result letters: batch, left, right.
    fn einsum_pair(&mut self, name: &str, a: Term, b: Term, later: &[char]) -> R<Term> {
        let (sa, sb) = (self.shape(&Val::Node(a.0)), self.shape(&Val::Node(b.0)));
        let size = |t: &Term, s: &[usize], c: char| t.1.iter().position(|&l| l == c).map(|d| s[d]).unwrap_or(1);
        let batch: Vec<char> = a.1.iter().copied().filter(|c| b.1.contains(c) && later.contains(c)).collect();
        let shared: Vec<char> = a.1.iter().copied().filter(|c| b.1.contains(c) && !later.contains(c)).collect();
        let left: Vec<char> = a.1.iter().copied().filter(|c| !b.1.contains(c)).collect();
        let right: Vec<char> = b.1.iter().copied().filter(|c| !a.1.contains(c)).collect();
        for &c in batch.iter().chain(&shared) {
            if size(&a, &sa, c) != size(&b, &sb, c) {
                return unsup(format!("Einsum letter `{c}` of sizes {} and {} (broadcast)", size(&a, &sa, c), size(&b, &sb, c)));
            }
        }
        let prod = |t: &Term, s: &[usize], cs: &[char]| cs.iter().map(|&c| size(t, s, c)).product::<usize>();
        let arrange = |me: &mut Self, t: &Term, order: Vec<char>, dims: [usize; 3]| -> R<ValueId> {
            let perm: Vec<usize> = order.iter().map(|c| t.1.iter().position(|l| l == c).unwrap_or(0)).collect();
            let v = if perm.iter().enumerate().all(|(i, &p)| i == p) { t.0 } else { me.tmp(name, Op::Transpose { perm }, vec![t.0])? };
            me.reshape(&me.fresh(name), v, &dims)
        };
        let (pb, pl, pc, pr) = (prod(&a, &sa, &batch), prod(&a, &sa, &left), prod(&a, &sa, &shared), prod(&b, &sb, &right));
        let a3 = arrange(self, &a, [batch.clone(), left.clone(), shared.clone()].concat(), [pb, pl, pc])?;
        let b3 = arrange(self, &b, [batch.clone(), shared.clone(), right.clone()].concat(), [pb, pc, pr])?;
        let y = self.tmp(name, Op::MatMul { transpose_a: false, transpose_b: false }, vec![a3, b3])?;
        let dims: Vec<usize> = batch.iter().map(|&c| size(&a, &sa, c)).chain(left.iter().map(|&c| size(&a, &sa, c))).chain(right.iter().map(|&c| size(&b, &sb, c))).collect();
        let y = self.reshape(&self.fresh(name), y, &dims)?;
        Ok((y, [batch, left, right].concat()))
    }
}
