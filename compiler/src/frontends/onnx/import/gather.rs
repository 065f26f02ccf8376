//! Gathers: Gather (an embedding table's rows, any axis, or known indices as slices),
//! GatherElements, GatherND, and OneHot (a comparison with positions).

use kiln_runtime::graph::{BinaryOp, Dim, Op, ReduceOp, ValueId};
use kiln_runtime::DType;

use super::super::shape;
use super::super::tensor::{Elem, Lit};
use super::{one, unsup, Fail, Importer, NodeCx, Val, R};

/// The ops this file imports.
pub(super) const OPS: &[&str] = &["Gather", "GatherElements", "GatherND", "OneHot"];

impl Importer<'_> {
    /// A node of one of [`OPS`] with a graph-computed input, as kiln ops. Returns its outputs.
    pub(super) fn import_gather(&mut self, cx: &NodeCx) -> R<Vec<ValueId>> {
        let NodeCx { op, name, at, .. } = *cx;
        match op {
            // out[p] = data[p with p[axis] replaced by indices[p]]: one kiln Gather of the data
            // as a [numel, 1] table by flat ids `base[p] + wrap(indices[p])·stride[axis]`, where
            // `base` (the other coordinates' part, known at import) is a literal.
            "GatherElements" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let idx = self.node(&cx.iname(1), &cx.inp(1)?)?;
                let (ds, is) = (self.shape(&Val::Node(x)), self.shape(&Val::Node(idx)));
                let r = ds.len();
                let ax = shape::axis(at.int("axis", 0), r)?;
                if is.len() != r || is.iter().zip(&ds).enumerate().any(|(d, (&i, &n))| d != ax && i > n) {
                    return Err(Fail::Invalid(format!("GatherElements indices of shape {is:?} for data of shape {ds:?} (axis {ax})")));
                }
                if self.dtype(&Val::Node(idx)) != DType::I64 {
                    return unsup("GatherElements indices that are not integers");
                }
                // Flat ids are held exactly below 2^24 (integer math may run in f32).
                let total: usize = ds.iter().product();
                if total >= 1 << 24 {
                    return unsup(format!("GatherElements over {total} elements (flat ids are exact below 2^24)"));
                }
                let dst = shape::strides(&ds);
                let ist = shape::strides(&is);
                let numel: usize = is.iter().product();
                let base: Vec<f64> = (0..numel)
                    .map(|p| (0..r).filter(|&d| d != ax).map(|d| (p / ist[d] % is[d]) * dst[d]).sum::<usize>() as f64)
                    .collect();
                let base = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::I64, is.clone(), base)))?;
                let n = ds[ax];
                let idx = self.wrap_negative(name, idx, n)?;
                let (zero, len) = (self.k(name, 0.0, DType::I64)?, self.k(name, n as f32, DType::I64)?);
                let stride = self.scalar(&self.fresh(name), dst[ax] as f32, DType::I64)?;
                let off = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![idx, stride])?;
                let flat = self.tmp(name, Op::Binary(BinaryOp::Add), vec![base, off])?;
                // An index still outside [0, n) after wrapping would land on another element:
                // it becomes id `total`, past the table, which the Gather reports.
                let (lo, hi) = (self.tmp(name, Op::Binary(BinaryOp::Lt), vec![idx, zero])?, self.tmp(name, Op::Binary(BinaryOp::Le), vec![len, idx])?);
                let bad = self.tmp(name, Op::Binary(BinaryOp::Max), vec![lo, hi])?;
                let bad = self.as_bool(&self.fresh(name), bad)?;
                let past = self.scalar(&self.fresh(name), total as f32, DType::I64)?;
                let flat = self.tmp(name, Op::Where, vec![bad, past, flat])?;
                let table = self.reshape(&self.fresh(name), x, &[total, 1])?;
                let g = self.tmp(name, Op::Gather, vec![table, flat])?;
                one(self.reshape(name, g, &is)?)
            }
            // values[1] where the position along the new axis equals the index (negative ones
            // counting from the end), values[0] elsewhere; indices truncated to integers.
            "OneHot" => {
                let idx = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let depth = cx.lit_of(1, "OneHot's depth")?.floats().first().copied().ok_or_else(|| Fail::Invalid("an empty OneHot depth".into()))?;
                if !(depth >= 1.0 && depth <= (1u64 << 24) as f64) {
                    return Err(Fail::Invalid(format!("OneHot depth {depth}")));
                }
                let depth = depth as usize;
                let vals = self.node(&cx.iname(2), &cx.inp(2)?)?;
                let vs = self.shape(&Val::Node(vals));
                if vs.iter().product::<usize>() != 2 {
                    return Err(Fail::Invalid(format!("OneHot values of shape {vs:?} (two: off, on)")));
                }
                let is = self.shape(&Val::Node(idx));
                let ax = shape::axis(at.int("axis", -1), is.len() + 1)?;
                let i = self.cast_to(name, idx, DType::I64)?;
                let i = self.cast_to(name, i, DType::F32)?;
                let i = self.wrap_negative(name, i, depth)?;
                let mut us = is.clone();
                us.insert(ax, 1);
                let i = self.reshape(&self.fresh(name), i, &us)?;
                let pos = self.positions(name, depth, is.len() - ax)?;
                let hit = self.tmp(name, Op::Binary(BinaryOp::Eq), vec![pos, i])?;
                let hit = self.as_bool(&self.fresh(name), hit)?;
                let flat = self.reshape(&self.fresh(name), vals, &[2])?;
                let off = self.tmp(name, Op::Slice { axis: 0, start: 0, end: Dim::Fixed(1) }, vec![flat])?;
                let on = self.tmp(name, Op::Slice { axis: 0, start: 1, end: Dim::Fixed(2) }, vec![flat])?;
                let (off, on) = (self.reshape(&self.fresh(name), off, &[])?, self.reshape(&self.fresh(name), on, &[])?);
                one(self.push(name, Op::Where, vec![hit, on, off])?)
            }
            "Gather" => {
                let data = cx.inp(0)?;
                let ids = cx.inp(1)?;
                let ds = self.shape(&data);
                let ax = shape::axis(at.int("axis", 0), ds.len())?;
                match &ids {
                    // Rows of a matrix (an embedding table): one kiln Gather. Ids are not
                    // wrapped here: a negative token id is a run-time error, not row n - 1.
                    Val::Node(_) if ax == 0 && ds.len() == 2 => {
                        let t = self.node(&cx.iname(0), &data)?;
                        let i = self.node(&cx.iname(1), &ids)?;
                        one(self.push(name, Op::Gather, vec![t, i])?)
                    }
                    Val::Node(_) => {
                        let x = self.node(&cx.iname(0), &data)?;
                        let i = self.node(&cx.iname(1), &ids)?;
                        one(self.gather_axis(name, x, &ds, ax, i, true)?)
                    }
                    Val::Lit(l) if l.numel() > 64 => {
                        let x = self.node(&cx.iname(0), &data)?;
                        let i = self.node(&cx.iname(1), &ids)?;
                        one(self.gather_axis(name, x, &ds, ax, i, l.ints().iter().any(|&v| v < 0))?)
                    }
                    Val::Lit(l) => {
                        // Known indices: slices (and a concat) of the data.
                        let x = self.node(&cx.iname(0), &data)?;
                        let d = ds[ax] as i64;
                        let idx: Vec<usize> = l
                            .ints()
                            .iter()
                            .map(|&i| {
                                let j = if i < 0 { i + d } else { i };
                                if (0..d).contains(&j) { Ok(j as usize) } else { Err(Fail::Invalid(format!("Gather index {i} out of range for dim {d}"))) }
                            })
                            .collect::<R<_>>()?;
                        let mut parts = Vec::new();
                        for &i in &idx {
                            let nm = self.fresh(name);
                            parts.push(self.push(&nm, Op::Slice { axis: ax, start: i, end: Dim::Fixed(i + 1) }, vec![x])?);
                        }
                        let cat = if parts.len() == 1 { parts[0] } else { self.tmp(name, Op::Concat { axis: ax }, parts)? };
                        let mut out = ds[..ax].to_vec();
                        out.extend(&l.shape);
                        out.extend(&ds[ax + 1..]);
                        one(self.reshape(name, cat, &out)?)
                    }
                }
            }
            "GatherND" => {
                let data = self.node(&cx.iname(0), &cx.inp(0)?)?;
                if at.int("batch_dims", 0) != 0 {
                    return unsup("GatherND with batch_dims");
                }
                let ds = self.shape(&Val::Node(data));
                if let Val::Node(_) = cx.inp(1)? {
                    let i = self.node(&cx.iname(1), &cx.inp(1)?)?;
                    return one(self.gather_nd(name, data, &ds, i)?);
                }
                let idx = cx.lit_of(1, "GatherND indices")?;
                let k = *idx.shape.last().ok_or_else(|| Fail::Invalid("GatherND indices of rank 0".into()))?;
                if k > ds.len() {
                    return Err(Fail::Invalid(format!("GatherND indices of depth {k} into rank {}", ds.len())));
                }
                let st = shape::strides(&ds[..k]);
                let (iv, lead) = (idx.ints(), idx.shape[..idx.shape.len() - 1].to_vec());
                let mut rows = Vec::with_capacity(iv.len() / k.max(1));
                for c in iv.chunks(k.max(1)) {
                    let mut r = 0i64;
                    for (d, &i) in c.iter().enumerate() {
                        let n = ds[d] as i64;
                        let j = if i < 0 { i + n } else { i };
                        if !(0..n).contains(&j) {
                            return Err(Fail::Invalid(format!("GatherND index {i} out of range for dim {n}")));
                        }
                        r += j * st[d] as i64;
                    }
                    rows.push(r);
                }
                let mut out = lead.clone();
                out.extend(&ds[k..]);
                one(self.gather_rows(name, data, &ds, k, rows, &lead, &out)?)
            }
            _ => unsup(format!("op `{op}` is not supported")),
        }
    }

    /// GatherND (batch_dims 0) by run-time indices `[.., k]`: the flat row index
    /// `Σ_d wrap(i_d)·stride_d` over data's first k dims, computed in f32 (exact below 2^24
    /// rows), then one kiln Gather of the data seen as `[rows, rest]`.
    fn gather_nd(&mut self, name: &str, data: ValueId, ds: &[usize], idx: ValueId) -> R<ValueId> {
        let is = self.shape(&Val::Node(idx));
        let k = *is.last().ok_or_else(|| Fail::Invalid("GatherND indices of rank 0".into()))?;
        if k == 0 || k > ds.len() {
            return unsup(format!("GatherND indices of depth {k} into rank {}", ds.len()));
        }
        let st = shape::strides(&ds[..k]);
        let f = self.tmp(name, Op::Cast { to: DType::F32 }, vec![idx])?;
        let dims = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![k], ds[..k].iter().map(|&d| d as f64).collect())))?;
        let strides = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![k], st.iter().map(|&d| d as f64).collect())))?;
        let zero = self.scalar(&self.fresh(name), 0.0, DType::F32)?;
        let neg = self.tmp(name, Op::Binary(BinaryOp::Lt), vec![f, zero])?;
        let neg = self.as_bool(&self.fresh(name), neg)?;
        let up = self.tmp(name, Op::Binary(BinaryOp::Add), vec![f, dims])?;
        let w = self.tmp(name, Op::Where, vec![neg, up, f])?;
        let p = self.tmp(name, Op::Binary(BinaryOp::Mul), vec![w, strides])?;
        let rows = self.tmp(name, Op::Reduce { op: ReduceOp::Sum, axes: vec![is.len() - 1], keep_dims: false }, vec![p])?;
        let rows = self.tmp(name, Op::Cast { to: DType::I64 }, vec![rows])?;
        let rest: Vec<usize> = ds[k..].to_vec();
        let table = self.reshape(&self.fresh(name), data, &[ds[..k].iter().product(), rest.iter().product()])?;
        let g = self.tmp(name, Op::Gather, vec![table, rows])?;
        let out: Vec<usize> = is[..is.len() - 1].iter().chain(&rest).copied().collect();
        self.reshape(name, g, &out)
    }

    /// Rows of `data` (shape `ds`) picked by known flat row indices over its first `k` dims:
    /// the data seen as a `[rows, row_len]` table and one kiln `Gather` with constant ids, shaped
    /// `lead`, then reshaped to `out`.
    #[allow(clippy::too_many_arguments)]
    fn gather_rows(&mut self, name: &str, data: ValueId, ds: &[usize], k: usize, rows: Vec<i64>, lead: &[usize], out: &[usize]) -> R<ValueId> {
        let nrows: usize = ds[..k].iter().product();
        let row_len: usize = ds[k..].iter().product();
        if nrows >= 1 << 24 {
            return unsup(format!("a gather from {nrows} rows"));
        }
        let table = self.reshape(&self.fresh(name), data, &[nrows, row_len])?;
        let lead = if lead.is_empty() { vec![1] } else { lead.to_vec() };
        let ids = self.node(&self.fresh(name), &Val::Lit(Lit::int(lead.clone(), rows)))?;
        let g = self.tmp(name, Op::Gather, vec![table, ids])?;
        self.reshape(name, g, out)
    }
}
