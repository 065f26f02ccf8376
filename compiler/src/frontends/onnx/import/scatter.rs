//! ScatterND, ScatterElements and the older Scatter, with indices computed at run time.
//!
//! Both are "rows of data receive update rows": the data as `[R, W]` (ScatterND: the indexed
//! leading dims by the rest; ScatterElements: every element a row of one), the updates as
//! `[U, W]`, and each update's flat target row `f[u]` computed from its indices (negative ones
//! wrapped). A 0/1 match matrix `M[r, u] = (f[u] == r)` makes the scatter a GEMM: `none` keeps
//! the rows no update hits and takes `M·updates` in the others, `add` adds `M·updates`; `mul`,
//! `max` and `min` reduce the matching updates of each row over `[R, U, W]` (rows no update
//! hits keep their data). kiln has no scatter kernel: as a GEMM every backend runs it, at
//! `R·U` of work (`R·U·W` reducing by mul/max/min), refused past 2^24.

use kiln_runtime::graph::{BinaryOp, Op, ReduceOp, UnaryOp, ValueId};
use kiln_runtime::DType;

use super::super::shape;
use super::super::tensor::{Elem, Lit};
use super::{unsup, Fail, Importer, NodeCx, Val, R};

/// The ops this file imports.
pub(super) const OPS: &[&str] = &["ScatterND", "ScatterElements", "Scatter"];

impl Importer<'_> {
    /// A node of one of [`OPS`] with a graph-computed input, as kiln ops. Returns its outputs.
    pub(super) fn import_scatter(&mut self, cx: &NodeCx) -> R<Vec<ValueId>> {
        let NodeCx { op, name, at, .. } = *cx;
        let data = self.node(&cx.iname(0), &cx.inp(0)?)?;
        let ids = self.node(&cx.iname(1), &cx.inp(1)?)?;
        let upd = self.node(&cx.iname(2), &cx.inp(2)?)?;
        let (ds, is, us) = (self.shape(&Val::Node(data)), self.shape(&Val::Node(ids)), self.shape(&Val::Node(upd)));
        let dt = self.dtype(&Val::Node(data));
        if self.dtype(&Val::Node(ids)).is_float() {
            return Err(Fail::Invalid("float indices".into()));
        }
        let reduction = at.string("reduction").unwrap_or_else(|| "none".into());
        if !matches!(reduction.as_str(), "none" | "add" | "mul" | "max" | "min") {
            return Err(Fail::Invalid(format!("reduction `{reduction}`")));
        }
        let idf = self.cast_to(name, ids, DType::F32)?;
        // (rows R, row width W, updates U, each update's flat target row f: [U] in f32).
        let (rows, width, count, target) = if op == "ScatterND" {
            let q = *is.last().ok_or_else(|| Fail::Invalid("rank-0 indices".into()))?;
            if q == 0 || q > ds.len() || us != [&is[..is.len() - 1], &ds[q..]].concat() {
                return Err(Fail::Invalid(format!("ScatterND of data {ds:?}, indices {is:?}, updates {us:?}")));
            }
            let count: usize = is[..is.len() - 1].iter().product();
            let idx = self.reshape(&self.fresh(name), idf, &[count, q])?;
            // f = Σ_d wrap(idx[:, d])·stride_d over the q indexed dims.
            let mut f = None;
            let mut stride = 1usize;
            for d in (0..q).rev() {
                let col = self.tmp(name, Op::Slice { axis: 1, start: d, end: kiln_runtime::graph::Dim::Fixed(d + 1) }, vec![idx])?;
                let col = self.reshape(&self.fresh(name), col, &[count])?;
                let col = self.wrap_negative(name, col, ds[d])?;
                let k = self.k(name, stride as f32, DType::F32)?;
                let term = self.bin(name, BinaryOp::Mul, col, k)?;
                f = Some(match f {
                    Some(acc) => self.bin(name, BinaryOp::Add, acc, term)?,
                    None => term,
                });
                stride *= ds[d];
            }
            (ds[..q].iter().product::<usize>(), ds[q..].iter().product::<usize>(), count, f.ok_or_else(|| Fail::Invalid("no indices".into()))?)
        } else {
            let r = ds.len();
            let ax = shape::axis(at.int("axis", 0), r)?;
            if is != us || is.len() != r || is.iter().zip(&ds).enumerate().any(|(d, (&i, &n))| d != ax && i > n) {
                return Err(Fail::Invalid(format!("{op} of data {ds:?}, indices {is:?}, updates {us:?} along axis {ax}")));
            }
            // Each update's own coordinates but along the axis, where its index goes.
            let dst = shape::strides(&ds);
            let count: usize = is.iter().product();
            let base: Vec<f64> = (0..count)
                .map(|u| {
                    let mut rem = u;
                    let mut flat = 0;
                    for d in (0..r).rev() {
                        let c = rem % is[d];
                        rem /= is[d];
                        if d != ax {
                            flat += c * dst[d];
                        }
                    }
                    flat as f64
                })
                .collect();
            let base = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![count], base)))?;
            let idx = self.reshape(&self.fresh(name), idf, &[count])?;
            let idx = self.wrap_negative(name, idx, ds[ax])?;
            let k = self.k(name, dst[ax] as f32, DType::F32)?;
            let off = self.bin(name, BinaryOp::Mul, idx, k)?;
            (ds.iter().product::<usize>(), 1, count, self.bin(name, BinaryOp::Add, base, off)?)
        };
        // The match matrix (and, reducing by mul/max/min, the matches times the row width) is a
        // run-time tensor: at most 2^24 entries (64 MiB of f32).
        let entries = rows.checked_mul(count).and_then(|v| if matches!(reduction.as_str(), "none" | "add") { Some(v) } else { v.checked_mul(width) });
        if entries.is_none_or(|v| v > 1 << 24) || rows >= 1 << 24 {
            return unsup(format!("{op} of {count} updates into {rows} rows of {width} (kiln's match tensor takes at most 2^24 entries)"));
        }
        // M[r, u] = (f[u] == r), [R, U] in f32.
        let rowpos = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![rows, 1], (0..rows).map(|r| r as f64).collect())))?;
        let f1 = self.reshape(&self.fresh(name), target, &[1, count])?;
        let m = self.bin(name, BinaryOp::Eq, rowpos, f1)?;
        let d2 = self.cast_to(name, data, DType::F32)?;
        let d2 = self.reshape(&self.fresh(name), d2, &[rows, width])?;
        let u2 = self.cast_to(name, upd, DType::F32)?;
        let u2 = self.reshape(&self.fresh(name), u2, &[count, width])?;
        let hits = self.tmp(name, Op::Reduce { op: ReduceOp::Max, axes: vec![1], keep_dims: true }, vec![m])?;
        let hit = self.as_bool(&self.fresh(name), hits)?;
        let y = match reduction.as_str() {
            "none" | "add" => {
                let mu = self.tmp(name, Op::MatMul { transpose_a: false, transpose_b: false }, vec![m, u2])?;
                if reduction == "add" {
                    self.bin(name, BinaryOp::Add, d2, mu)?
                } else {
                    self.tmp(name, Op::Where, vec![hit, mu, d2])?
                }
            }
            red => {
                // The matching updates of each row over [R, U, W], the rest neutral.
                let m3 = self.reshape(&self.fresh(name), m, &[rows, count, 1])?;
                let m3 = self.as_bool(&self.fresh(name), m3)?;
                let u3 = self.reshape(&self.fresh(name), u2, &[1, count, width])?;
                let neutral = match red {
                    "mul" => 1.0,
                    "max" => f32::NEG_INFINITY,
                    _ => f32::INFINITY,
                };
                let nk = self.k(name, neutral, DType::F32)?;
                let picked = self.tmp(name, Op::Where, vec![m3, u3, nk])?;
                let combined = match red {
                    "mul" => {
                        let mut sum = |me: &mut Self, v: ValueId| me.tmp(name, Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keep_dims: false }, vec![v]);
                        let p = self.product_of(name, picked, &mut sum, !dt.is_float())?;
                        self.bin(name, BinaryOp::Mul, d2, p)?
                    }
                    "max" => {
                        let mx = self.tmp(name, Op::Reduce { op: ReduceOp::Max, axes: vec![1], keep_dims: false }, vec![picked])?;
                        self.bin(name, BinaryOp::Max, d2, mx)?
                    }
                    _ => {
                        let neg = self.un(name, UnaryOp::Neg, picked)?;
                        let mx = self.tmp(name, Op::Reduce { op: ReduceOp::Max, axes: vec![1], keep_dims: false }, vec![neg])?;
                        let mn = self.un(name, UnaryOp::Neg, mx)?;
                        self.bin(name, BinaryOp::Min, d2, mn)?
                    }
                };
                self.tmp(name, Op::Where, vec![hit, combined, d2])?
            }
        };
        let y = self.reshape(&self.fresh(name), y, &ds)?;
        Ok(vec![self.cast_to(name, y, dt)?])
    }
}
