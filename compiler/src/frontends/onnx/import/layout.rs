//! Layout ops: the reshapes (Reshape, Flatten, Squeeze, Unsqueeze), Transpose, Concat, Slice,
//! Split, Expand, Tile, Pad, Trilu, DepthToSpace, SpaceToDepth and CenterCropPad.

use kiln_runtime::graph::{BinaryOp, Dim, Op, ValueId};
use kiln_runtime::DType;

use super::super::shape;
use super::super::tensor::{Elem, Lit};
use super::{one, unsup, Fail, Importer, NodeCx, Val, R};

/// The ops this file imports.
pub(super) const OPS: &[&str] = &[
    "Trilu", "Unsqueeze", "Squeeze", "Flatten", "Reshape", "Transpose", "Concat", "Slice", "Split",
    "Expand", "Tile", "Pad", "DepthToSpace", "SpaceToDepth", "CenterCropPad",
];

impl Importer<'_> {
    /// A node of one of [`OPS`] with a graph-computed input, as kiln ops. Returns its outputs.
    pub(super) fn import_layout(&mut self, cx: &NodeCx) -> R<Vec<ValueId>> {
        let NodeCx { op, name, ins, at, opset, .. } = *cx;
        match op {
            // Padding per axis: negative pads crop (a Slice); `constant` concatenates blocks of
            // the value, `edge`, `reflect` and `wrap` gather along the axis by known indices
            // (numpy's rules, reflection repeating past the edge as np.pad's does).
            "Pad" => {
                let y = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let r = self.shape(&Val::Node(y)).len();
                let mut run_value = None;
                let (pads, value, axes) = if opset < 11 {
                    let p = at.ints("pads").or_else(|| at.ints("paddings")).ok_or_else(|| Fail::Invalid("Pad without pads".into()))?;
                    (p, at.float("value", 0.0) as f64, None)
                } else {
                    let p = cx.lit_of(1, "Pad's pads")?.ints();
                    let v = match ins.get(2).cloned().flatten() {
                        Some(Val::Lit(l)) => l.floats().first().copied().unwrap_or(0.0),
                        // A value computed at run time: added to blocks of zeros below.
                        Some(Val::Node(id)) => {
                            if self.shape(&Val::Node(id)).iter().product::<usize>() != 1 {
                                return Err(Fail::Invalid(format!("Pad's constant_value of shape {:?}", self.shape(&Val::Node(id)))));
                            }
                            run_value = Some(self.reshape(&self.fresh(name), id, &[])?);
                            0.0
                        }
                        None => 0.0,
                    };
                    let a = match ins.get(3).cloned().flatten() {
                        Some(_) => Some(cx.lit_of(3, "Pad's axes")?.ints()),
                        None => None,
                    };
                    (p, v, a)
                };
                let axes: Vec<usize> = match axes {
                    Some(a) => a.iter().map(|&v| shape::axis(v, r)).collect::<Result<_, _>>()?,
                    None => (0..r).collect(),
                };
                if pads.len() != 2 * axes.len() {
                    return Err(Fail::Invalid(format!("{} pads for {} axes", pads.len(), axes.len())));
                }
                let mode = at.string("mode").unwrap_or_else(|| "constant".into());
                if !matches!(mode.as_str(), "constant" | "edge" | "reflect" | "wrap") {
                    return unsup(format!("Pad mode `{mode}`"));
                }
                let dt = self.dtype(&Val::Node(y));
                let y = self.pad_axes(name, y, &axes, &pads, &mode, value, run_value)?;
                one(self.push(name, Op::Cast { to: dt }, vec![y])?)
            }
            // The upper (or lower) triangle from diagonal k, as Where with a known mask.
            // Blocks of `b×b` pixels to and from channels: a reshape to 6-D, a transpose, a
            // reshape. DCR orders the new channels block-major, CRD channel-major.
            "DepthToSpace" | "SpaceToDepth" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let s = self.shape(&Val::Node(x));
                let b = usize::try_from(at.int("blocksize", 0)).ok().filter(|&b| (1..=1 << 16).contains(&b)).ok_or_else(|| Fail::Invalid(format!("blocksize {}", at.int("blocksize", 0))))?;
                let mode = at.string("mode").unwrap_or_else(|| "DCR".into());
                let &[n, c, h, w] = s.as_slice() else {
                    return Err(Fail::Invalid(format!("{op} of shape {s:?} (it takes [N, C, H, W])")));
                };
                let (view, perm, out) = match (op, mode.as_str()) {
                    ("DepthToSpace", "DCR") if c % (b * b) == 0 => ([n, b, b, c / (b * b), h, w], [0, 3, 4, 1, 5, 2], [n, c / (b * b), h * b, w * b]),
                    ("DepthToSpace", "CRD") if c % (b * b) == 0 => ([n, c / (b * b), b, b, h, w], [0, 1, 4, 2, 5, 3], [n, c / (b * b), h * b, w * b]),
                    ("SpaceToDepth", "DCR") if h % b == 0 && w % b == 0 => ([n, c, h / b, b, w / b, b], [0, 3, 5, 1, 2, 4], [n, c * b * b, h / b, w / b]),
                    ("SpaceToDepth", "CRD") if h % b == 0 && w % b == 0 => ([n, c, h / b, b, w / b, b], [0, 1, 3, 5, 2, 4], [n, c * b * b, h / b, w / b]),
                    (_, "DCR" | "CRD") => return Err(Fail::Invalid(format!("{op} of shape {s:?} with blocksize {b}"))),
                    (_, m) => return Err(Fail::Invalid(format!("mode `{m}`"))),
                };
                let v = self.reshape(&self.fresh(name), x, &view)?;
                let v = self.tmp(name, Op::Transpose { perm: perm.to_vec() }, vec![v])?;
                one(self.reshape(name, v, &out)?)
            }
            // Each listed axis cut or zero-padded to its target, centred (the odd one at the end).
            "CenterCropPad" => {
                let y = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let s = self.shape(&Val::Node(y));
                let r = s.len();
                let target = cx.lit_of(1, "CenterCropPad's shape")?.ints();
                let axes: Vec<usize> = match at.ints("axes") {
                    Some(a) => a.iter().map(|&v| shape::axis(v, r)).collect::<Result<_, _>>()?,
                    None => (0..r).collect(),
                };
                if target.len() != axes.len() || target.iter().any(|&t| !(1..=1 << 24).contains(&t)) {
                    return Err(Fail::Invalid(format!("CenterCropPad to {target:?} over axes {axes:?}")));
                }
                // As Pad's: begins then ends, negative where the axis is cut (an axis listed
                // twice is sized from its first target, as the pads apply in order).
                let mut dims: Vec<i64> = s.iter().map(|&d| d as i64).collect();
                let (mut begins, mut ends) = (Vec::new(), Vec::new());
                for (&a, &t) in axes.iter().zip(&target) {
                    let dim = dims[a];
                    let b = if t < dim { -((dim - t) / 2) } else { (t - dim) / 2 };
                    begins.push(b);
                    ends.push(t - dim - b);
                    dims[a] = t;
                }
                let pads: Vec<i64> = begins.into_iter().chain(ends).collect();
                let y = self.pad_axes(name, y, &axes, &pads, "constant", 0.0, None)?;
                one(self.reshape(name, y, &self.shape(&Val::Node(y)))?)
            }
            "Trilu" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let s = self.shape(&Val::Node(x));
                let r = s.len();
                if r < 2 {
                    return Err(Fail::Invalid(format!("Trilu of a rank-{r} tensor")));
                }
                let k = match ins.get(1).cloned().flatten() {
                    Some(_) => cx.lit_of(1, "Trilu's k")?.ints().first().copied().unwrap_or(0),
                    None => 0,
                };
                let upper = at.int("upper", 1) != 0;
                let (rows, cols) = (s[r - 2], s[r - 1]);
                let keep: Vec<f64> = (0..rows * cols)
                    .map(|e| {
                        let d = (e % cols) as i64 - (e / cols) as i64;
                        f64::from(u8::from(if upper { d >= k } else { d <= k }))
                    })
                    .collect();
                let mask = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::Bool, vec![rows, cols], keep)))?;
                let z = self.scalar(&self.fresh(name), 0.0, self.dtype(&Val::Node(x)))?;
                one(self.push(name, Op::Where, vec![mask, x, z])?)
            }
            "Unsqueeze" | "Squeeze" | "Flatten" | "Reshape" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let s = self.shape(&Val::Node(x));
                let axes = if opset >= 13 {
                    match ins.get(1).cloned().flatten() {
                        Some(_) => Some(cx.lit_of(1, "axes")?.ints()),
                        None => None,
                    }
                } else {
                    at.ints("axes")
                };
                let to = match op {
                    "Unsqueeze" => shape::unsqueeze(&s, &axes.ok_or_else(|| Fail::Invalid("Unsqueeze needs axes".into()))?)?,
                    "Squeeze" => shape::squeeze(&s, axes.as_deref())?,
                    "Flatten" => {
                        let k = shape::flatten_axis(at.int("axis", 1), s.len())?;
                        vec![s[..k].iter().product(), s[k..].iter().product()]
                    }
                    _ => {
                        let t = if opset >= 5 { cx.lit_of(1, "a Reshape target")?.ints() } else { at.ints("shape").unwrap_or_default() };
                        shape::reshape(&s, &t, at.int("allowzero", 0) != 0)?
                    }
                };
                one(self.push_shaped(name, Op::Reshape, vec![x], &to)?)
            }
            "Transpose" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let r = self.shape(&Val::Node(x)).len();
                let perm = shape::perm(at.ints("perm").as_deref(), r)?;
                one(self.push(name, Op::Transpose { perm }, vec![x])?)
            }
            "Concat" => {
                let mut xs = Vec::new();
                for (k, v) in ins.iter().enumerate() {
                    if let Some(v) = v {
                        if self.shape(v).contains(&0) {
                            continue;
                        }
                        xs.push(self.node(&cx.iname(k), v)?);
                    }
                }
                let r = self.shape(&Val::Node(xs[0])).len();
                let ax = shape::axis(at.int("axis", 0), r)?;
                let dt = self.dtype(&Val::Node(xs[0]));
                for x in xs.iter_mut() {
                    *x = self.cast_to(name, *x, dt)?;
                }
                if xs.len() == 1 {
                    return one(xs[0]);
                }
                one(self.push(name, Op::Concat { axis: ax }, xs)?)
            }
            "Slice" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let s = self.shape(&Val::Node(x));
                let cuts = slice_cuts(cx, &s)?;
                let mut y = x;
                for (ax, b, step, len) in cuts {
                    if len == 0 {
                        // (`empty_outputs` binds an empty Slice before this.)
                        return unsup("an empty Slice (kiln has no empty tensors)");
                    }
                    if step != 1 {
                        // Strided or reversed: a gather of the known positions along the axis.
                        let idx: Vec<f64> = (0..len as i64).map(|i| (b + i * step) as f64).collect();
                        let ids = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::I64, vec![len], idx)))?;
                        let cur = self.shape(&Val::Node(y));
                        let nm = self.fresh(name);
                        y = self.gather_axis(&nm, y, &cur, ax, ids, false)?;
                        continue;
                    }
                    if b == 0 && len == s[ax] {
                        continue;
                    }
                    let nm = self.fresh(name);
                    y = self.push(&nm, Op::Slice { axis: ax, start: b as usize, end: Dim::Fixed(b as usize + len) }, vec![y])?;
                }
                one(y)
            }
            "Split" => {
                let mut outs = Vec::new();
                for v in self.split(cx)? {
                    match v {
                        Val::Node(id) => outs.push(id),
                        // (`empty_outputs` binds a Split with an empty piece before this.)
                        Val::Lit(_) => return unsup("an empty Split output"),
                    }
                }
                Ok(outs)
            }
            "Expand" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let to: Vec<usize> = cx.lit_of(1, "an Expand shape")?.ints().iter().map(|&d| d.max(0) as usize).collect();
                let s = self.shape(&Val::Node(x));
                let out = shape::broadcast(&s, &to)?;
                if out == s {
                    return one(x);
                }
                let dt = self.dtype(&Val::Node(x));
                let n1 = super::super::lit::fold_numel(&out, s.iter().product())?;
                let ones = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, out.clone(), vec![1.0; n1])))?;
                let ones = if dt != DType::F32 { self.tmp(name, Op::Cast { to: dt }, vec![ones])? } else { ones };
                one(self.push(name, Op::Binary(BinaryOp::Mul), vec![x, ones])?)
            }
            "Tile" => {
                let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
                let reps = cx.lit_of(1, "Tile repeats")?.ints();
                let mut y = x;
                for (ax, &k) in reps.iter().enumerate() {
                    if k > 1 {
                        if k > 64 {
                            return unsup(format!("Tile by {k}"));
                        }
                        y = self.tmp(name, Op::Concat { axis: ax }, vec![y; k as usize])?;
                    }
                }
                one(y)
            }
            _ => unsup(format!("op `{op}` is not supported")),
        }
    }

    /// `y` padded along each of `axes` by `pads` (begins, then ends; a negative one crops):
    /// `constant` concatenates blocks of `value` (plus `run_value` where the value is computed
    /// at run time), `edge`, `reflect` and `wrap` gather along the axis by known indices.
    #[allow(clippy::too_many_arguments)]
    fn pad_axes(&mut self, name: &str, mut y: ValueId, axes: &[usize], pads: &[i64], mode: &str, value: f64, run_value: Option<ValueId>) -> R<ValueId> {
        let dt = self.dtype(&Val::Node(y));
        for (k, &ax) in axes.iter().enumerate() {
            let (b, e) = (pads[k], pads[k + axes.len()]);
            let mut s = self.shape(&Val::Node(y));
            let n = s[ax] as i64;
            if b < 0 || e < 0 {
                let (start, end) = ((-b).max(0), n - (-e).max(0));
                if start >= end {
                    return unsup(format!("Pad cropping axis {ax} of {n} to nothing (kiln has no empty tensors)"));
                }
                y = self.tmp(name, Op::Slice { axis: ax, start: start as usize, end: Dim::Fixed(end as usize) }, vec![y])?;
                s = self.shape(&Val::Node(y));
            }
            let (b, e, n) = (b.max(0) as usize, e.max(0) as usize, s[ax]);
            if b == 0 && e == 0 {
                continue;
            }
            // The padded value, and the blocks or indices made for it, are bounded as
            // folded literals are.
            let mut padded = s.clone();
            padded[ax] = n.checked_add(b).and_then(|v| v.checked_add(e)).ok_or_else(|| Fail::Invalid(format!("pads {b} and {e}")))?;
            super::super::lit::fold_numel(&padded, s.iter().product())?;
            if mode == "constant" {
                let elem = match dt {
                    DType::F16 => Elem::F16,
                    DType::BF16 => Elem::BF16,
                    DType::F32 => Elem::F32,
                    _ => Elem::I64,
                };
                let mut parts = Vec::new();
                for (len, before) in [(b, true), (e, false)] {
                    if len == 0 {
                        continue;
                    }
                    let mut bs = s.clone();
                    bs[ax] = len;
                    let numel = bs.iter().product();
                    let mut blk = self.node(&self.fresh(name), &Val::Lit(Lit::of(elem, bs, vec![value; numel])))?;
                    if let Some(v) = run_value {
                        let v = self.cast_to(name, v, dt)?;
                        blk = self.tmp(name, Op::Binary(BinaryOp::Add), vec![blk, v])?;
                    }
                    parts.push((before, blk));
                }
                let mut ins: Vec<ValueId> = parts.iter().filter(|p| p.0).map(|p| p.1).collect();
                ins.push(y);
                ins.extend(parts.iter().filter(|p| !p.0).map(|p| p.1));
                y = self.tmp(name, Op::Concat { axis: ax }, ins)?;
            } else {
                let (ni, period) = (n as i64, 2 * (n as i64 - 1));
                let ids: Vec<f64> = (0..(b + n + e) as i64)
                    .map(|i| {
                        let j = i - b as i64;
                        (match mode {
                            "edge" => j.clamp(0, ni - 1),
                            "wrap" => j.rem_euclid(ni),
                            _ if ni == 1 => 0,
                            _ => {
                                let m = j.rem_euclid(period);
                                if m < ni { m } else { period - m }
                            }
                        }) as f64
                    })
                    .collect();
                let ids = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::I64, vec![ids.len()], ids)))?;
                y = self.gather_axis(&self.fresh(name), y, &s, ax, ids, false)?;
            }
        }
        Ok(y)
    }
}

/// A Slice node's cuts of a value of shape `s`: (axis, first index, step, length) per sliced
/// axis, from its starts/ends/axes/steps inputs (attributes before opset 10).
pub(super) fn slice_cuts(cx: &NodeCx, s: &[usize]) -> R<Vec<(usize, i64, i64, usize)>> {
    let (starts, ends, axes, steps) = if cx.opset >= 10 {
        let opt = |k: usize, w: &str| -> R<Option<Vec<i64>>> {
            match cx.ins.get(k).cloned().flatten() {
                Some(_) => Ok(Some(cx.lit_of(k, w)?.ints())),
                None => Ok(None),
            }
        };
        (cx.lit_of(1, "slice starts")?.ints(), cx.lit_of(2, "slice ends")?.ints(), opt(3, "slice axes")?, opt(4, "slice steps")?)
    } else {
        let at = cx.at;
        (at.ints("starts").unwrap_or_default(), at.ints("ends").unwrap_or_default(), at.ints("axes"), None)
    };
    Ok(shape::slice_axes(s, &starts, &ends, axes.as_deref(), steps.as_deref())?)
}

/// A Split node's axis of a value of shape `s` and the sizes of its pieces along it (the
/// `split` input or attribute, else `num_outputs` or the node's output count as equal parts).
pub(super) fn split_sizes(cx: &NodeCx, s: &[usize]) -> R<(usize, Vec<usize>)> {
    let at = cx.at;
    let ax = shape::axis(at.int("axis", 0), s.len())?;
    let given = match (cx.opset >= 13, cx.ins.get(1).cloned().flatten(), at.ints("split")) {
        (true, Some(_), _) => Some(cx.lit_of(1, "split sizes")?.ints()),
        (false, _, Some(v)) => Some(v),
        _ => None,
    };
    let sizes = match given {
        Some(v) => {
            if v.iter().any(|&l| l < 0) || v.iter().sum::<i64>() != s[ax] as i64 {
                return Err(Fail::Invalid(format!("Split sizes {v:?} of an axis of {}", s[ax])));
            }
            v.iter().map(|&l| l as usize).collect()
        }
        None => {
            let k = at.int("num_outputs", cx.n.output.len() as i64);
            if k < 1 {
                return Err(Fail::Invalid(format!("Split into {k} outputs")));
            }
            let each = s[ax].div_ceil(k as usize);
            (0..k as usize).map(|i| each.min(s[ax] - (i * each).min(s[ax]))).collect()
        }
    };
    Ok((ax, sizes))
}

impl Importer<'_> {
    /// A Split node's pieces: slices of its input, or empty literals where a piece has no
    /// elements (`empty_outputs` binds those; kiln's graph has no empty tensors).
    pub(super) fn split(&mut self, cx: &NodeCx) -> R<Vec<Val>> {
        let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
        let s = self.shape(&Val::Node(x));
        let (ax, sizes) = split_sizes(cx, &s)?;
        let mut outs = Vec::new();
        let mut start = 0;
        for (i, &len) in sizes.iter().enumerate() {
            if len == 0 {
                let mut piece = s.clone();
                piece[ax] = 0;
                outs.push(Val::Lit(Lit::of(self.elem(&Val::Node(x)), piece, vec![])));
                continue;
            }
            let nm = cx.n.output.get(i).cloned().unwrap_or_else(|| self.fresh(cx.name));
            outs.push(Val::Node(self.push(&nm, Op::Slice { axis: ax, start, end: Dim::Fixed(start + len) }, vec![x])?));
            start += len;
        }
        Ok(outs)
    }
}
