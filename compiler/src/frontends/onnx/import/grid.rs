//! Sampling grids: GridSample (nearest, linear, cubic; zeros, border and reflection padding;
//! 2-D and 3-D) at positions computed at run time, and AffineGrid, which makes such grids.
//!
//! GridSample is one Gather per tap: the input as rows of channels (`[N·ΠS, C]` plus a zero
//! row that out-of-range taps read under zeros padding), each output position's tap row
//! computed from the grid by kiln ops (denormalized, rounded or floored, clamped or reflected
//! per axis as onnx's reference does), then the taps' rows weighted (the product of each axis's
//! linear or cubic coefficients) and summed.

use kiln_runtime::graph::{BinaryOp, Dim, Op, UnaryOp, ValueId};
use kiln_runtime::DType;

use super::super::tensor::{Elem, Lit};
use super::{unsup, Fail, Importer, NodeCx, Val, R};

/// The ops this file imports.
pub(super) const OPS: &[&str] = &["GridSample", "AffineGrid"];

/// One axis's taps: per tap, its index and weight ([N, P] f32 each) and, under zeros padding,
/// whether it lies inside the axis (0/1).
type Taps = Vec<(ValueId, Option<ValueId>, Option<ValueId>)>;

impl Importer<'_> {
    /// A node of one of [`OPS`] with a graph-computed input, as kiln ops. Returns its outputs.
    pub(super) fn import_grid(&mut self, cx: &NodeCx) -> R<Vec<ValueId>> {
        let NodeCx { op, name, at, .. } = *cx;
        if op == "AffineGrid" {
            return self.affine_grid(cx);
        }
        let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
        let grid = self.node(&cx.iname(1), &cx.inp(1)?)?;
        let (xs, gs) = (self.shape(&Val::Node(x)), self.shape(&Val::Node(grid)));
        let dt = self.dtype(&Val::Node(x));
        let d = xs.len().saturating_sub(2);
        if !(2..=3).contains(&d) || gs.len() != d + 2 || gs[0] != xs[0] || gs[d + 1] != d || !dt.is_float() {
            return Err(Fail::Invalid(format!("GridSample of {dt} {xs:?} by a grid of shape {gs:?}")));
        }
        let (n, c, s) = (xs[0], xs[1], xs[2..].to_vec());
        let out: Vec<usize> = gs[1..=d].to_vec();
        let p: usize = out.iter().product();
        let ps: usize = s.iter().product();
        if n * ps + 1 >= 1 << 24 {
            return unsup(format!("GridSample over {} positions (ids exact in f32 below 2^24)", n * ps));
        }
        let mode = match at.string("mode").unwrap_or_else(|| "linear".into()).as_str() {
            "bilinear" | "linear" => "linear",
            "bicubic" | "cubic" => "cubic",
            "nearest" => "nearest",
            m => return Err(Fail::Invalid(format!("mode `{m}`"))),
        };
        let padding = at.string("padding_mode").unwrap_or_else(|| "zeros".into());
        if !matches!(padding.as_str(), "zeros" | "border" | "reflection") {
            return Err(Fail::Invalid(format!("padding_mode `{padding}`")));
        }
        let align = at.int("align_corners", 0) != 0;
        let grid = self.cast_to(name, grid, DType::F32)?;
        let grid = self.reshape(&self.fresh(name), grid, &[n, p, d])?;
        // Per spatial axis j (the grid's last dim lists them backwards: x first).
        let mut axes: Vec<Taps> = Vec::new();
        for (j, &len) in s.iter().enumerate() {
            let k = d - 1 - j;
            let g = self.tmp(name, Op::Slice { axis: 2, start: k, end: Dim::Fixed(k + 1) }, vec![grid])?;
            let g = self.reshape(&self.fresh(name), g, &[n, p])?;
            axes.push(self.grid_axis(name, g, len, mode, &padding, align)?);
        }
        // Rows [N·ΠS (+ a zero row), C].
        let xf = self.cast_to(name, x, DType::F32)?;
        let rows = self.channel_rows(name, xf)?;
        let table = if padding == "zeros" { self.with_fill_row(name, rows, 0.0)? } else { rows };
        let base = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![n, 1], (0..n).map(|b| (b * ps) as f64).collect())))?;
        let strides = super::super::shape::strides(&s);
        // Every combination of the axes' taps.
        let counts: Vec<usize> = axes.iter().map(Vec::len).collect();
        let total: usize = counts.iter().product();
        let mut acc: Option<ValueId> = None;
        for combo in 0..total {
            let (mut rem, mut flat, mut weight, mut inside) = (combo, base, None::<ValueId>, None::<ValueId>);
            for j in (0..d).rev() {
                let (idx, w, ok) = axes[j][rem % counts[j]];
                rem /= counts[j];
                let st = self.k(name, strides[j] as f32, DType::F32)?;
                let term = self.bin(name, BinaryOp::Mul, idx, st)?;
                flat = self.bin(name, BinaryOp::Add, flat, term)?;
                for (slot, v) in [(&mut weight, w), (&mut inside, ok)] {
                    if let Some(v) = v {
                        *slot = Some(match *slot {
                            Some(a) => self.bin(name, BinaryOp::Mul, a, v)?,
                            None => v,
                        });
                    }
                }
            }
            if let Some(ok) = inside {
                let ok = self.as_bool(&self.fresh(name), ok)?;
                let zero_row = self.k(name, (n * ps) as f32, DType::F32)?;
                flat = self.tmp(name, Op::Where, vec![ok, flat, zero_row])?;
            }
            let ids = self.tmp(name, Op::Cast { to: DType::I32 }, vec![flat])?;
            let mut v = self.tmp(name, Op::Gather, vec![table, ids])?;
            if let Some(w) = weight {
                let w = self.reshape(&self.fresh(name), w, &[n, p, 1])?;
                v = self.bin(name, BinaryOp::Mul, v, w)?;
            }
            acc = Some(match acc {
                Some(a) => self.bin(name, BinaryOp::Add, a, v)?,
                None => v,
            });
        }
        let y = acc.ok_or_else(|| Fail::Invalid("no taps".into()))?;
        let y = self.tmp(name, Op::Transpose { perm: vec![0, 2, 1] }, vec![y])?;
        let shape: Vec<usize> = [n, c].into_iter().chain(out).collect();
        let y = self.reshape(&self.fresh(name), y, &shape)?;
        Ok(vec![self.cast_to(name, y, dt)?])
    }

    /// One axis of length `len` of GridSample: the denormalized coordinate of grid values `g`
    /// ([N, P]), out-of-range coordinates clamped or reflected, and its taps.
    fn grid_axis(&mut self, name: &str, g: ValueId, len: usize, mode: &str, padding: &str, align: bool) -> R<Taps> {
        use BinaryOp::{Add, Lt, Mul, Sub};
        let lenf = len as f32;
        // x = (g + 1)/2·(len - 1) (align_corners) or ((g + 1)·len - 1)/2.
        let one = self.k(name, 1.0, DType::F32)?;
        let g1 = self.bin(name, Add, g, one)?;
        let mut x = if align {
            let k = self.k(name, (lenf - 1.0) / 2.0, DType::F32)?;
            self.bin(name, Mul, g1, k)?
        } else {
            let k = self.k(name, lenf, DType::F32)?;
            let v = self.bin(name, Mul, g1, k)?;
            let v = self.bin(name, Sub, v, one)?;
            let half = self.k(name, 0.5, DType::F32)?;
            self.bin(name, Mul, v, half)?
        };
        if mode == "nearest" {
            x = self.un(name, UnaryOp::Round, x)?;
        }
        let (lo, hi) = if align { (0.0, lenf - 1.0) } else { (-0.5, lenf - 0.5) };
        x = match padding {
            "border" => self.clamp_to(name, x, 0.0, lenf - 1.0)?,
            "reflection" => self.reflect(name, x, lo, hi)?,
            _ => x,
        };
        // Each tap index as the padding mode reads it: (index, inside) under zeros.
        let tap = |me: &mut Self, i: ValueId| -> R<(ValueId, Option<ValueId>)> {
            Ok(match padding {
                "zeros" => {
                    let (zero, top) = (me.k(name, -0.5, DType::F32)?, me.k(name, lenf - 0.5, DType::F32)?);
                    let above = me.bin(name, Lt, zero, i)?;
                    let below = me.bin(name, Lt, i, top)?;
                    (i, Some(me.bin(name, Mul, above, below)?))
                }
                "border" => (me.clamp_to(name, i, 0.0, lenf - 1.0)?, None),
                _ => {
                    let r = me.reflect(name, i, lo, hi)?;
                    // int(): toward zero.
                    let (f, c) = (me.un(name, UnaryOp::Floor, r)?, me.un(name, UnaryOp::Ceil, r)?);
                    let z = me.k(name, 0.0, DType::F32)?;
                    let neg = me.bin(name, Lt, r, z)?;
                    let neg = me.as_bool(&me.fresh(name), neg)?;
                    let t = me.tmp(name, Op::Where, vec![neg, c, f])?;
                    (me.clamp_to(name, t, 0.0, lenf - 1.0)?, None)
                }
            })
        };
        if mode == "nearest" {
            let (i, ok) = tap(self, x)?;
            return Ok(vec![(i, None, ok)]);
        }
        let x0 = self.un(name, UnaryOp::Floor, x)?;
        let frac = self.bin(name, Sub, x, x0)?;
        let (offsets, coeffs): (Vec<f32>, Vec<ValueId>) = if mode == "linear" {
            let w0 = self.bin(name, Sub, one, frac)?;
            (vec![0.0, 1.0], vec![w0, frac])
        } else {
            (vec![-1.0, 0.0, 1.0, 2.0], self.cubic_coeffs(name, frac)?)
        };
        let mut taps = Vec::new();
        for (o, w) in offsets.into_iter().zip(coeffs) {
            let ko = self.k(name, o, DType::F32)?;
            let i = self.bin(name, Add, x0, ko)?;
            let (i, ok) = tap(self, i)?;
            taps.push((i, Some(w), ok));
        }
        Ok(taps)
    }

    /// Keys' cubic convolution weights (A = -0.75) of the four taps around a point `t` past its
    /// floor, as onnx's reference computes them.
    fn cubic_coeffs(&mut self, name: &str, t: ValueId) -> R<Vec<ValueId>> {
        let a = -0.75f32;
        // w(d) for a tap at distance d: (A+2)d³ - (A+3)d² + 1 (d ≤ 1), A d³ - 5A d² + 8A d - 4A.
        let near = |me: &mut Self, d: ValueId| -> R<ValueId> {
            let (k1, k2, one) = (me.k(name, a + 2.0, DType::F32)?, me.k(name, a + 3.0, DType::F32)?, me.k(name, 1.0, DType::F32)?);
            let v = me.bin(name, BinaryOp::Mul, d, k1)?;
            let v = me.bin(name, BinaryOp::Sub, v, k2)?;
            let v = me.bin(name, BinaryOp::Mul, v, d)?;
            let v = me.bin(name, BinaryOp::Mul, v, d)?;
            me.bin(name, BinaryOp::Add, v, one)
        };
        let far = |me: &mut Self, d: ValueId| -> R<ValueId> {
            let (ka, k5, k8, k4) = (me.k(name, a, DType::F32)?, me.k(name, 5.0 * a, DType::F32)?, me.k(name, 8.0 * a, DType::F32)?, me.k(name, 4.0 * a, DType::F32)?);
            let v = me.bin(name, BinaryOp::Mul, d, ka)?;
            let v = me.bin(name, BinaryOp::Sub, v, k5)?;
            let v = me.bin(name, BinaryOp::Mul, v, d)?;
            let v = me.bin(name, BinaryOp::Add, v, k8)?;
            let v = me.bin(name, BinaryOp::Mul, v, d)?;
            me.bin(name, BinaryOp::Sub, v, k4)
        };
        let one = self.k(name, 1.0, DType::F32)?;
        let two = self.k(name, 2.0, DType::F32)?;
        let t1 = self.bin(name, BinaryOp::Add, t, one)?;
        let u = self.bin(name, BinaryOp::Sub, one, t)?;
        let u2 = self.bin(name, BinaryOp::Sub, two, t)?;
        Ok(vec![far(self, t1)?, near(self, t)?, near(self, u)?, far(self, u2)?])
    }

    /// `x` bounded to [lo, hi].
    fn clamp_to(&mut self, name: &str, x: ValueId, lo: f32, hi: f32) -> R<ValueId> {
        let (l, h) = (self.k(name, lo, DType::F32)?, self.k(name, hi, DType::F32)?);
        let v = self.bin(name, BinaryOp::Max, x, l)?;
        self.bin(name, BinaryOp::Min, v, h)
    }

    /// `x` reflected into [lo, hi] as often as it takes (onnx's `_gs_reflect`).
    fn reflect(&mut self, name: &str, x: ValueId, lo: f32, hi: f32) -> R<ValueId> {
        use BinaryOp::{Add, Lt, Mul, Sub};
        let rng = hi - lo;
        let (kl, kh, kr, half, two) = (self.k(name, lo, DType::F32)?, self.k(name, hi, DType::F32)?, self.k(name, rng, DType::F32)?, self.k(name, 0.5, DType::F32)?, self.k(name, 2.0, DType::F32)?);
        // Past the low end by dx = lo - x, or the high end by dx = x - hi.
        let below = self.bin(name, Lt, x, kl)?;
        let below = self.as_bool(&self.fresh(name), below)?;
        let above = self.bin(name, Lt, kh, x)?;
        let above = self.as_bool(&self.fresh(name), above)?;
        let dl = self.bin(name, Sub, kl, x)?;
        let dh = self.bin(name, Sub, x, kh)?;
        let dx = self.tmp(name, Op::Where, vec![below, dl, dh])?;
        let q = self.bin(name, BinaryOp::Div, dx, kr)?;
        let nf = self.un(name, UnaryOp::Floor, q)?;
        let r = self.bin(name, Mul, nf, kr)?;
        let r = self.bin(name, Sub, dx, r)?;
        // n even: back from the end it passed; odd: from the other end.
        let h = self.bin(name, Mul, nf, half)?;
        let hf = self.un(name, UnaryOp::Floor, h)?;
        let h2 = self.bin(name, Mul, hf, two)?;
        let odd = self.bin(name, Sub, nf, h2)?;
        let odd = self.as_bool(&self.fresh(name), odd)?;
        let lo_r = self.bin(name, Add, kl, r)?;
        let hi_r = self.bin(name, Sub, kh, r)?;
        let from_low = self.tmp(name, Op::Where, vec![odd, hi_r, lo_r])?;
        let from_high = self.tmp(name, Op::Where, vec![odd, lo_r, hi_r])?;
        let v = self.tmp(name, Op::Where, vec![above, from_high, x])?;
        self.tmp(name, Op::Where, vec![below, from_low, v])
    }

    /// AffineGrid: each output position's normalized coordinates (x first), times θᵀ.
    fn affine_grid(&mut self, cx: &NodeCx) -> R<Vec<ValueId>> {
        let name = cx.name;
        let theta = self.node(&cx.iname(0), &cx.inp(0)?)?;
        let ts = self.shape(&Val::Node(theta));
        let size: Vec<usize> = cx.lit_of(1, "AffineGrid's size")?.ints().iter().map(|&v| v.max(0) as usize).collect();
        let d = size.len().saturating_sub(2);
        if !(2..=3).contains(&d) || ts != [size[0], d, d + 1] || size[2..].contains(&0) {
            return Err(Fail::Invalid(format!("AffineGrid of θ {ts:?} for size {size:?}")));
        }
        let align = cx.at.int("align_corners", 0) != 0;
        let spatial = &size[2..];
        let p: usize = spatial.iter().product();
        let coord = |i: usize, len: usize| -> f64 {
            if align {
                if len == 1 { 0.0 } else { -1.0 + 2.0 * i as f64 / (len - 1) as f64 }
            } else {
                (2.0 * i as f64 + 1.0) / len as f64 - 1.0
            }
        };
        // Rows [x, y, (z,) 1] for every position (the last spatial axis varies fastest).
        let mut base = Vec::with_capacity(p * (d + 1));
        for e in 0..p {
            let mut rem = e;
            let mut idx = vec![0; d];
            for j in (0..d).rev() {
                idx[j] = rem % spatial[j];
                rem /= spatial[j];
            }
            for j in (0..d).rev() {
                base.push(coord(idx[j], spatial[j]));
            }
            base.push(1.0);
        }
        let base = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![p, d + 1], base)))?;
        let dt = self.dtype(&Val::Node(theta));
        let th = self.cast_to(name, theta, DType::F32)?;
        let y = self.tmp(name, Op::MatMul { transpose_a: false, transpose_b: true }, vec![base, th])?;
        let shape: Vec<usize> = std::iter::once(size[0]).chain(spatial.iter().copied()).chain(std::iter::once(d)).collect();
        let y = self.reshape(&self.fresh(name), y, &shape)?;
        Ok(vec![self.cast_to(name, y, dt)?])
    }
}
