//! Sliding windows over `[N, C, spatial..]` values: Conv, ConvTranspose, the integer
//! ConvInteger and QLinearConv, MaxPool, AveragePool, LpPool and the global pools.
//!
//! A window op is one kiln Gather (an im2col): the input as rows of channels, `[N·ΠS, C]`, plus
//! one fill row that padding reads (0, or -inf for MaxPool; only where a tap reads padding),
//! picked by constant ids `[N, ΠO, ΠK]` that [`Window`] computes from the geometry (strides, dilations, pads,
//! `auto_pad`, `ceil_mode`, ConvTranspose's fractional stride). A Conv is then one GEMM per
//! group against its weight rearranged at import to `[ΠK·C/G, M/G]`, the bias its epilogue; a
//! pool is a Reduce over the window axis.
//!
//! Why not a direct convolution kernel (onnxruntime's MLAS, TVM's schedules): kiln's IR has no
//! window op, and as gather + GEMM a Conv runs on every backend (reference, CPU, CUDA) on the
//! GEMM kernels they already tune. The price is the im2col buffer, ΠK times the input, which
//! onnxruntime's CPU Conv pays as well for kernels other than 1×1; a 1×1 Conv of stride 1
//! without pads gathers nothing (its windows are the input's rows).

use kiln_runtime::graph::{Dim, BinaryOp, Op, ReduceOp, UnaryOp, ValueId};
use kiln_runtime::DType;

use super::super::attrs::Attrs;
use super::super::lit::transpose;
use super::super::tensor::{Elem, Lit};
use super::{given, one, unsup, Fail, Importer, NodeCx, Val, R};

/// The ops this file imports.
pub(super) const OPS: &[&str] = &[
    "Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool",
];

/// Gather ids are exact in f32 below this (kiln's constants are f32).
const ID_LIMIT: usize = 1 << 24;

/// A depthwise convolution's geometry: batch, channels, and per spatial axis input, kernel,
/// output, begin pads, strides, dilations.
#[derive(Clone, Copy)]
struct Shift<'a> {
    n: usize,
    c: usize,
    s: &'a [usize],
    k: &'a [usize],
    o: &'a [usize],
    pb: &'a [usize],
    st: &'a [usize],
    dil: &'a [usize],
}

/// Ids of one window op at most (the im2col's rows times taps): past it the op is refused
/// rather than a constant of gigabytes made.
const IDS_MAX: usize = 1 << 26;

/// A window op's geometry: for each spatial axis, the input position each (output position,
/// tap) reads, `None` where it reads padding.
struct Window {
    /// Input spatial dims.
    s: Vec<usize>,
    /// Kernel (taps) per axis.
    k: Vec<usize>,
    /// Output spatial dims.
    o: Vec<usize>,
    /// Per axis, `[o · k]`: the input position read by output position `o`, tap `k`.
    taps: Vec<Vec<Option<usize>>>,
}

impl Window {
    /// A Conv's or a pool's: tap `k` of output `o` reads `o·stride + k·dilation - pad_begin`.
    fn forward(at: &Attrs, s: &[usize], k: &[usize], ceil: bool) -> R<(Window, Vec<usize>, Vec<usize>)> {
        let d = s.len();
        let st = per_axis(at, "strides", d)?;
        let dil = per_axis(at, "dilations", d)?;
        let eff: Vec<usize> = (0..d).map(|j| span(k[j], dil[j], 0, 0)).collect::<R<_>>()?;
        let auto = at.string("auto_pad").unwrap_or_else(|| "NOTSET".into());
        let (mut pb, mut pe, mut o) = (vec![0; d], vec![0; d], vec![0; d]);
        match auto.as_str() {
            "NOTSET" | "VALID" => {
                if auto == "NOTSET" {
                    (pb, pe) = pads(at, d)?;
                }
                for j in 0..d {
                    let span = s[j] + pb[j] + pe[j];
                    if span < eff[j] {
                        return Err(Fail::Invalid(format!("a window of {} over {} (pads included) along spatial axis {j}", eff[j], span)));
                    }
                    let q = span - eff[j];
                    o[j] = if ceil { q.div_ceil(st[j]) + 1 } else { q / st[j] + 1 };
                    // The last window starts inside the input or its begin padding.
                    if ceil && (o[j] - 1) * st[j] >= s[j] + pb[j] {
                        o[j] -= 1;
                    }
                }
            }
            "SAME_UPPER" | "SAME_LOWER" => {
                for j in 0..d {
                    o[j] = s[j].div_ceil(st[j]);
                    let total = ((o[j] - 1) * st[j] + eff[j]).saturating_sub(s[j]);
                    pb[j] = if auto == "SAME_UPPER" { total / 2 } else { total - total / 2 };
                    pe[j] = total - pb[j];
                }
            }
            a => return Err(Fail::Invalid(format!("auto_pad `{a}`"))),
        }
        let taps = taps(&o, k, |j, oo, kk| {
            let p = (oo * st[j] + kk * dil[j]) as i64 - pb[j] as i64;
            (p >= 0 && (p as usize) < s[j]).then_some(p as usize)
        })?;
        Ok((Window { s: s.to_vec(), k: k.to_vec(), o, taps }, pb, pe))
    }

    /// A ConvTranspose's: output `o` gets input `i` through tap `k` where
    /// `i·stride + k·dilation - pad_begin = o`.
    fn backward(at: &Attrs, s: &[usize], k: &[usize]) -> R<Window> {
        let d = s.len();
        let st = per_axis(at, "strides", d)?;
        let dil = per_axis(at, "dilations", d)?;
        let op = match at.ints("output_padding") {
            Some(v) if v.len() == d && v.iter().all(|&p| (0..=ID_LIMIT as i64).contains(&p)) => v.iter().map(|&p| p as usize).collect(),
            Some(v) => return Err(Fail::Invalid(format!("output_padding {v:?} for {d} spatial axes"))),
            None => vec![0; d],
        };
        // The output before any pads: every tap of every input position.
        let full: Vec<usize> = (0..d).map(|j| span(k[j], dil[j], st[j] * (s[j] - 1), op[j])).collect::<R<_>>()?;
        let auto = at.string("auto_pad").unwrap_or_else(|| "NOTSET".into());
        if !matches!(auto.as_str(), "NOTSET" | "VALID" | "SAME_UPPER" | "SAME_LOWER") {
            return Err(Fail::Invalid(format!("auto_pad `{auto}`")));
        }
        let out_shape = at.ints("output_shape").map(|v| if v.len() == d + 2 { v[2..].to_vec() } else { v });
        // ONNX's split of a total padding (negative where the output is larger than the
        // input reaches: extra positions at the end): the odd one at the end for SAME_UPPER, at
        // the begin otherwise, with Python's floor division.
        let begin = |total: i64| if auto == "SAME_UPPER" { total.div_euclid(2) } else { total - total.div_euclid(2) };
        let (pb, o): (Vec<i64>, Vec<usize>) = match out_shape {
            Some(v) if v.len() == d => {
                let mut pb = vec![0; d];
                let mut o = vec![0; d];
                for j in 0..d {
                    let want = usize::try_from(v[j]).ok().filter(|&w| w > 0 && w <= ID_LIMIT).ok_or_else(|| {
                        Fail::Invalid(format!("output_shape {v:?} for an input of spatial shape {s:?}"))
                    })?;
                    pb[j] = begin(full[j] as i64 - want as i64);
                    o[j] = want;
                }
                (pb, o)
            }
            Some(v) => return Err(Fail::Invalid(format!("output_shape {v:?} for {d} spatial axes"))),
            None if auto.starts_with("SAME") => {
                let o: Vec<usize> = (0..d).map(|j| s[j] * st[j]).collect();
                ((0..d).map(|j| begin(full[j] as i64 - o[j] as i64)).collect(), o)
            }
            None => {
                let (pb, pe) = if auto == "NOTSET" { pads(at, d)? } else { (vec![0; d], vec![0; d]) };
                let mut o = vec![0; d];
                for j in 0..d {
                    o[j] = full[j].checked_sub(pb[j] + pe[j]).filter(|&v| v > 0).ok_or_else(|| {
                        Fail::Invalid(format!("pads {pb:?}/{pe:?} remove the whole output ({full:?})"))
                    })?;
                }
                (pb.iter().map(|&p| p as i64).collect(), o)
            }
        };
        let taps = taps(&o, k, |j, oo, kk| {
            let num = oo as i64 + pb[j] - (kk * dil[j]) as i64;
            let i = num / st[j] as i64;
            (num >= 0 && num % st[j] as i64 == 0 && (i as usize) < s[j]).then_some(i as usize)
        })?;
        Ok(Window { s: s.to_vec(), k: k.to_vec(), o, taps })
    }

    fn outputs(&self) -> usize {
        self.o.iter().product()
    }

    fn taps_per_output(&self) -> usize {
        self.k.iter().product()
    }

    /// The flat input position read by flat output `of`, flat tap `kf` (`None`: padding).
    fn read(&self, of: usize, kf: usize) -> Option<usize> {
        let (mut of, mut kf, mut flat, mut stride) = (of, kf, 0, 1);
        for j in (0..self.s.len()).rev() {
            let (oo, kk) = (of % self.o[j], kf % self.k[j]);
            (of, kf) = (of / self.o[j], kf / self.k[j]);
            flat += self.taps[j][oo * self.k[j] + kk]? * stride;
            stride *= self.s[j];
        }
        Some(flat)
    }

    /// Whether every output reads its own input position through one tap (a 1×1 window of
    /// stride 1 without pads).
    fn is_identity(&self) -> bool {
        self.o == self.s && self.taps_per_output() == 1 && (0..self.outputs()).all(|i| self.read(i, 0) == Some(i))
    }

    /// How many taps of each output fall inside `[-before, s + after)` along every axis, for
    /// a forward window with begin pads `pb` (AveragePool's divisor).
    fn counts(&self, at: &Attrs, pb: &[usize], lo: &[usize], hi: &[usize]) -> R<Vec<f64>> {
        let d = self.s.len();
        let st = per_axis(at, "strides", d)?;
        let dil = per_axis(at, "dilations", d)?;
        let per: Vec<Vec<usize>> = (0..d)
            .map(|j| {
                (0..self.o[j])
                    .map(|oo| {
                        (0..self.k[j])
                            .filter(|kk| {
                                let p = (oo * st[j] + kk * dil[j]) as i64 - pb[j] as i64;
                                p >= -(lo[j] as i64) && p < (self.s[j] + hi[j]) as i64
                            })
                            .count()
                    })
                    .collect()
            })
            .collect();
        Ok((0..self.outputs())
            .map(|of| {
                let (mut of, mut c) = (of, 1usize);
                for j in (0..d).rev() {
                    c *= per[j][of % self.o[j]];
                    of /= self.o[j];
                }
                c as f64
            })
            .collect())
    }
}

/// Per axis `j`, `read(j, o, k)` for every output position `o` and tap `k` (`[o · k]`),
/// refused past [`IDS_MAX`] per axis before anything is allocated.
fn taps(o: &[usize], k: &[usize], read: impl Fn(usize, usize, usize) -> Option<usize>) -> R<Vec<Vec<Option<usize>>>> {
    (0..o.len())
        .map(|j| {
            if o[j].checked_mul(k[j]).is_none_or(|n| n > IDS_MAX) {
                return unsup(format!("a window op of {} outputs × {} taps along one axis (kiln gathers at most 2^26 taps)", o[j], k[j]));
            }
            Ok((0..o[j]).flat_map(|oo| (0..k[j]).map(move |kk| (oo, kk))).map(|(oo, kk)| read(j, oo, kk)).collect())
        })
        .collect()
}

/// `(k - 1)·dilation + 1 + before + extra`, the extent of a window (plus what precedes it),
/// refused past [`ID_LIMIT`] (nothing kiln gathers is that long; the attributes are absurd).
fn span(k: usize, dil: usize, before: usize, extra: usize) -> R<usize> {
    (k - 1)
        .checked_mul(dil)
        .and_then(|v| v.checked_add(1 + extra))
        .and_then(|v| v.checked_add(before))
        .filter(|&v| v <= ID_LIMIT)
        .ok_or_else(|| Fail::Invalid(format!("a window of {k} taps, dilation {dil}, over more than 2^24 positions")))
}

/// A per-axis attribute of positive values (1 where absent), at most 2^24.
fn per_axis(at: &Attrs, name: &str, d: usize) -> R<Vec<usize>> {
    match at.ints(name) {
        None => Ok(vec![1; d]),
        Some(v) if v.len() == d && v.iter().all(|&x| (1..=ID_LIMIT as i64).contains(&x)) => Ok(v.iter().map(|&x| x as usize).collect()),
        Some(v) => Err(Fail::Invalid(format!("{name} {v:?} for {d} spatial axes"))),
    }
}

/// Explicit pads `[begin.., end..]` (zeros where absent).
fn pads(at: &Attrs, d: usize) -> R<(Vec<usize>, Vec<usize>)> {
    match at.ints("pads") {
        None => Ok((vec![0; d], vec![0; d])),
        Some(v) if v.len() == 2 * d && v.iter().all(|&x| (0..=ID_LIMIT as i64).contains(&x)) => {
            let v: Vec<usize> = v.iter().map(|&x| x as usize).collect();
            Ok((v[..d].to_vec(), v[d..].to_vec()))
        }
        Some(v) => Err(Fail::Invalid(format!("pads {v:?} for {d} spatial axes"))),
    }
}

/// The kernel of a pool: `kernel_shape`, one positive dim per spatial axis.
fn pool_kernel(at: &Attrs, d: usize) -> R<Vec<usize>> {
    match at.ints("kernel_shape") {
        Some(v) if v.len() == d && v.iter().all(|&x| (1..=ID_LIMIT as i64).contains(&x)) => Ok(v.iter().map(|&x| x as usize).collect()),
        Some(v) => Err(Fail::Invalid(format!("kernel_shape {v:?} for {d} spatial axes"))),
        None => Err(Fail::Invalid("no kernel_shape".into())),
    }
}

impl Importer<'_> {
    /// A node of one of [`OPS`] with a graph-computed input, as kiln ops. Returns its outputs.
    pub(super) fn import_conv(&mut self, cx: &NodeCx) -> R<Vec<ValueId>> {
        let NodeCx { op, name, ins, at, .. } = *cx;
        let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
        let xs = self.shape(&Val::Node(x));
        let dt = self.dtype(&Val::Node(x));
        if xs.len() < 3 {
            return Err(Fail::Invalid(format!("{op} of a rank-{} input (it takes [N, C, spatial..])", xs.len())));
        }
        let (n, c, s) = (xs[0], xs[1], xs[2..].to_vec());
        let d = s.len();
        match op {
            "Conv" | "ConvTranspose" | "ConvInteger" | "QLinearConv" => {
                // ConvInteger: (x - x_zero) ⋆ (w - w_zero) with integers held in f32 (exact
                // below 2^24), an int32 result; pads read x_zero, 0 once centred. QLinearConv:
                // the same plus its int32 bias, requantized by x_scale·w_scale / y_scale (per
                // output channel where w_scale is) as onnxruntime does: in f32, rounded half to
                // even, plus y_zero, saturated.
                let quantized = matches!(op, "ConvInteger" | "QLinearConv");
                // Input positions: x zero, w, w zero, bias.
                let (xz_at, w_at, wz_at, b_at) = if op == "QLinearConv" { (2, 3, 5, 8) } else { (2, 1, 3, 2) };
                let (x, w) = if quantized {
                    let xz = self.opt_f32(name, ins.get(xz_at).cloned().flatten(), &cx.iname(xz_at))?;
                    let xf = self.cast_to(name, x, DType::F32)?;
                    let xc = match xz {
                        Some(z) if self.shape(&Val::Node(z)).iter().product::<usize>() == 1 => {
                            let z = self.reshape(&self.fresh(name), z, &[])?;
                            self.bin(name, BinaryOp::Sub, xf, z)?
                        }
                        Some(z) => return unsup(format!("{op} with an x_zero_point of shape {:?}", self.shape(&Val::Node(z)))),
                        None => xf,
                    };
                    (xc, self.centered_conv_weight(cx, w_at, ins.get(wz_at).cloned().flatten())?)
                } else if !dt.is_float() {
                    return unsup(format!("{op} of {dt}"));
                } else {
                    (x, cx.inp(1)?)
                };
                let out_dt = dt;
                let dt = if quantized { DType::F32 } else { dt };
                let wop = if quantized { "Conv" } else { op };
                let ws = self.shape(&w);
                let g = usize::try_from(at.int("group", 1)).ok().filter(|&g| g >= 1).ok_or_else(|| Fail::Invalid(format!("group {}", at.int("group", 1))))?;
                if ws.len() != xs.len() || ws.contains(&0) {
                    return Err(Fail::Invalid(format!("weight of shape {ws:?} for an input of shape {xs:?}")));
                }
                let k = ws[2..].to_vec();
                if let Some(ks) = at.ints("kernel_shape") {
                    if ks.iter().map(|&v| v as usize).ne(k.iter().copied()) {
                        return Err(Fail::Invalid(format!("kernel_shape {ks:?} and a weight of shape {ws:?}")));
                    }
                }
                // Conv's weight is [M, C/G, K..]; ConvTranspose's [C, M/G, K..].
                let (cg, mg) = if wop == "Conv" { (ws[1], ws[0] / g) } else { (ws[0] / g, ws[1]) };
                if c != cg * g || (wop == "Conv" && !ws[0].is_multiple_of(g)) || (wop == "ConvTranspose" && ws[0] != c) {
                    return Err(Fail::Invalid(format!("weight of shape {ws:?} for {c} input channels in {g} groups")));
                }
                let m = mg * g;
                let (win, pb) = if wop == "Conv" {
                    let (w, pb, _) = Window::forward(at, &s, &k, false)?;
                    (w, Some(pb))
                } else {
                    (Window::backward(at, &s, &k)?, None)
                };
                let pk = win.taps_per_output();
                // A depthwise Conv without channel multiplier: shifted views of the padded input,
                // no windows (`depthwise_shifted`).
                let shifted = wop == "Conv" && cg == 1 && g > 1 && mg == 1;
                let rows = if shifted { x } else { self.windows(name, x, &win, n, c, 0.0)? };
                // Both weights viewed as [G, a, b, ΠK] and permuted to [G, ΠK, C/G, M/G]; a
                // depthwise one (one input channel per group) to [ΠK, G, 1, M/G].
                let depthwise = cg == 1 && g > 1;
                let (view, perm) = match (wop == "Conv", depthwise) {
                    (true, false) => ([g, mg, cg, pk], [0, 3, 2, 1]),
                    (false, false) => ([g, cg, mg, pk], [0, 3, 1, 2]),
                    (true, true) => ([g, mg, cg, pk], [3, 0, 2, 1]),
                    (false, true) => ([g, cg, mg, pk], [3, 0, 1, 2]),
                };
                let (mut w, mut wname) = (w, cx.iname(w_at));
                let mut b_val = (op != "ConvInteger" && given(ins, b_at)).then(|| cx.inp(b_at)).transpose()?;
                let mut bname = cx.iname(b_at);
                let known = |v: &Option<Val>| v.as_ref().is_none_or(|v| matches!(v, Val::Lit(_)));
                if op == "Conv" && dt == DType::F32 && matches!(w, Val::Lit(_)) && known(&b_val) {
                    if let Some(super::channel_norm::FoldedBn { a, b, out: bn_out }) = self.bn_after_conv(cx.n, m)? {
                        let Val::Lit(l) = &w else { unreachable!("a literal weight") };
                        let l = self.lit(&wname, l)?;
                        let per = l.shape.iter().product::<usize>() / m;
                        let scaled: Vec<f64> = l.floats().iter().enumerate().map(|(i, &v)| (v as f32 * a[i / per] as f32) as f64).collect();
                        let bias: Vec<f64> = match &b_val {
                            Some(Val::Lit(bl)) => {
                                let bl = self.lit(&bname, bl)?;
                                bl.floats().iter().zip(&a).zip(&b).map(|((&v, &a), &b)| (v as f32 * a as f32 + b as f32) as f64).collect()
                            }
                            _ => b.clone(),
                        };
                        (wname, bname) = (format!("{wname}+{bn_out}"), format!("{bn_out}.bias"));
                        w = Val::Lit(Lit { weight: true, ..Lit::of(Elem::F32, l.shape.clone(), scaled) });
                        b_val = Some(Val::Lit(Lit::of(Elem::F32, vec![m], bias)));
                    }
                }
                let wt = self.window_weight(name, &wname, &w, view, perm, op)?;
                let bias = match b_val {
                    Some(b) => {
                        let b = self.node(&bname, &b)?;
                        Some(self.norm_channel(name, b, m, dt, "bias")?)
                    }
                    None => None,
                };
                let y = if shifted {
                    let (st, dil) = (per_axis(at, "strides", s.len())?, per_axis(at, "dilations", s.len())?);
                    let pb = pb.unwrap_or_default();
                    let geo = Shift { n, c, s: &s, k: &k, o: &win.o, pb: &pb, st: &st, dil: &dil };
                    self.depthwise_shifted(name, x, &geo, wt, bias)?
                } else if depthwise {
                    self.depthwise(name, rows, wt, bias, n * win.outputs(), pk, g, mg)?
                } else {
                    self.window_gemm(name, rows, wt, bias, n * win.outputs(), pk, g, cg, mg)?
                };
                let y = self.reshape(&self.fresh(name), y, &[n, win.outputs(), m])?;
                let y = self.channels_first(name, y, n, m, &win.o)?;
                match op {
                    "ConvInteger" => one(self.cast_to(name, y, DType::I32)?),
                    "QLinearConv" => {
                        let scale = |me: &mut Self, k: usize| -> R<ValueId> {
                            let v = me.node(&cx.iname(k), &cx.inp(k)?)?;
                            me.cast_to(name, v, DType::F32)
                        };
                        let (xs_, ws_, ys_) = (scale(self, 1)?, scale(self, 4)?, scale(self, 6)?);
                        let wn = self.shape(&Val::Node(ws_)).iter().product::<usize>();
                        if wn != 1 && wn != m {
                            return Err(Fail::Invalid(format!("w_scale of {wn} values for {m} output channels")));
                        }
                        let per: Vec<usize> = std::iter::once(wn).chain(std::iter::repeat_n(1, d)).collect();
                        let ws_ = self.reshape(&self.fresh(name), ws_, &per)?;
                        let xs1 = self.reshape(&self.fresh(name), xs_, &[])?;
                        let ys1 = self.reshape(&self.fresh(name), ys_, &[])?;
                        let xw = self.f32_op(name, BinaryOp::Mul, xs1, ws_)?;
                        let mult = self.f32_op(name, BinaryOp::Div, xw, ys1)?;
                        let v = self.f32_op(name, BinaryOp::Mul, y, mult)?;
                        let zero = self.opt_f32(name, ins.get(7).cloned().flatten(), &cx.iname(7))?;
                        let zero = match zero {
                            Some(z) => Some(self.reshape(&self.fresh(name), z, &[])?),
                            None => None,
                        };
                        let range = super::quant::out_range(self.elem_at(cx.n, ins, 7), &super::Attrs::new(&[]))?;
                        let q = self.requantize(name, v, zero, range)?;
                        one(self.cast_to(name, q, out_dt)?)
                    }
                    _ => one(y),
                }
            }
            "MaxPool" | "AveragePool" | "LpPool" => {
                let k = pool_kernel(at, d)?;
                let ceil = at.int("ceil_mode", 0) != 0;
                if ceil && at.string("auto_pad").is_some_and(|a| a != "NOTSET") {
                    return Err(Fail::Invalid("ceil_mode with auto_pad".into()));
                }
                let (win, pb, pe) = Window::forward(at, &s, &k, ceil)?;
                // Integers (MaxPool of uint8) pool in f32: exact below 2^24.
                let xf = self.cast_to(name, x, if dt.is_float() { dt } else { DType::F32 })?;
                let fill = if op == "MaxPool" { f32::NEG_INFINITY } else { 0.0 };
                let rows = self.windows(name, xf, &win, n, c, fill)?;
                let y = match op {
                    "MaxPool" => self.tmp(name, Op::Reduce { op: ReduceOp::Max, axes: vec![2], keep_dims: false }, vec![rows])?,
                    "AveragePool" => {
                        let sum = self.tmp(name, Op::Reduce { op: ReduceOp::Sum, axes: vec![2], keep_dims: false }, vec![rows])?;
                        let (lo, hi) = if at.int("count_include_pad", 0) != 0 { (pb.clone(), pe) } else { (vec![0; d], vec![0; d]) };
                        let recip: Vec<f64> = win.counts(at, &pb, &lo, &hi)?.iter().map(|&c| if c > 0.0 { 1.0 / c } else { f64::NAN }).collect();
                        let r = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![win.outputs(), 1], recip)))?;
                        let r = self.cast_to(name, r, self.dtype(&Val::Node(sum)))?;
                        self.bin(name, BinaryOp::Mul, sum, r)?
                    }
                    _ => self.lp(name, rows, vec![2], at.int("p", 2), false)?,
                };
                let y = self.channels_first(name, y, n, c, &win.o)?;
                let y = self.cast_to(name, y, dt)?;
                let wants_indices = op == "MaxPool" && cx.n.output.get(1).is_some_and(|o| !o.is_empty() && self.m.is_used(o));
                if !wants_indices {
                    return one(y);
                }
                // Indices: the first largest tap of each window, mapped to its input position
                // (a [ΠO·ΠK] table), flattened over N, C and the spatial dims (row-major, or
                // column-major over the spatial dims with storage_order 1).
                let col_major = at.int("storage_order", 0) != 0;
                let ps: usize = s.iter().product();
                if n * c * ps >= 1 << 24 {
                    return unsup(format!("MaxPool indices over {} elements (exact in f32 below 2^24)", n * c * ps));
                }
                let (po, pk) = (win.outputs(), win.taps_per_output());
                let sst = super::super::shape::strides(&s);
                let table: Vec<f64> = (0..po * pk)
                    .map(|e| {
                        let p = win.read(e / pk, e % pk).unwrap_or(0);
                        if !col_major {
                            return p as f64;
                        }
                        // Row-major position p as column-major.
                        let (mut rem, mut flat, mut stride) = (p, 0, 1);
                        let idx: Vec<usize> = (0..d).map(|j| { let v = rem / sst[j]; rem %= sst[j]; v }).collect();
                        for j in 0..d {
                            flat += idx[j] * stride;
                            stride *= s[j];
                        }
                        flat as f64
                    })
                    .collect();
                let table = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![po * pk, 1], table)))?;
                let best = self.arg_max(name, rows, 2, false, false)?;
                let offs = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![po, 1], (0..po).map(|o| (o * pk) as f64).collect())))?;
                let at_tab = self.bin(name, BinaryOp::Add, best, offs)?;
                let ids = self.tmp(name, Op::Cast { to: DType::I32 }, vec![at_tab])?;
                let pos = self.tmp(name, Op::Gather, vec![table, ids])?;
                let pos = self.reshape(&self.fresh(name), pos, &[n, po, c])?;
                let plane: Vec<f64> = (0..n * c).map(|e| (e * ps) as f64).collect();
                let plane = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![n, 1, c], plane)))?;
                let flat = self.bin(name, BinaryOp::Add, pos, plane)?;
                let flat = self.channels_first(&self.fresh(name), flat, n, c, &win.o)?;
                Ok(vec![y, self.tmp(name, Op::Cast { to: DType::I64 }, vec![flat])?])
            }
            _ => {
                // The global pools: one window over every spatial position.
                let axes: Vec<usize> = (2..xs.len()).collect();
                let y = match op {
                    "GlobalMaxPool" | "GlobalAveragePool" => {
                        let xf = self.cast_to(name, x, if dt.is_float() { dt } else { DType::F32 })?;
                        let rop = if op == "GlobalMaxPool" { ReduceOp::Max } else { ReduceOp::Mean };
                        self.tmp(name, Op::Reduce { op: rop, axes, keep_dims: true }, vec![xf])?
                    }
                    _ => self.lp(name, x, axes, at.int("p", 2), true)?,
                };
                let out: Vec<usize> = [n, c].into_iter().chain(std::iter::repeat_n(1, d)).collect();
                let y = self.reshape(&self.fresh(name), y, &out)?;
                one(self.cast_to(name, y, dt)?)
            }
        }
    }

    /// The windows of `x` (`[N, C, spatial..]`) as `[N, ΠO, ΠK, C]`: one Gather from the input's
    /// channel rows plus a `fill` row for the taps that read padding.
    fn windows(&mut self, name: &str, x: ValueId, win: &Window, n: usize, c: usize, fill: f32) -> R<ValueId> {
        let ps: usize = win.s.iter().product();
        let (po, pk) = (win.outputs(), win.taps_per_output());
        let t = self.channel_rows(name, x)?;
        if win.is_identity() {
            return self.reshape(&self.fresh(name), t, &[n, po, 1, c]);
        }
        let table_rows = n * ps + 1;
        let ids_len = n.checked_mul(po).and_then(|v| v.checked_mul(pk)).filter(|&v| v <= IDS_MAX);
        let Some(ids_len) = ids_len.filter(|_| table_rows < ID_LIMIT) else {
            return unsup(format!("a window op of {n}×{po} outputs × {pk} taps over {ps} positions (kiln gathers at most 2^26 taps from 2^24 rows)"));
        };
        // The fill row only where some tap reads padding (a copy of the whole input else).
        let padded = (0..po).any(|of| (0..pk).any(|kf| win.read(of, kf).is_none()));
        let table = if padded { self.with_fill_row(name, t, fill)? } else { t };
        let mut ids = Vec::with_capacity(ids_len);
        for b in 0..n {
            for of in 0..po {
                for kf in 0..pk {
                    ids.push(win.read(of, kf).map_or(n * ps, |p| b * ps + p) as i64);
                }
            }
        }
        // A large table becomes a weight of its own (`Importer::node`), not a constant cast on
        // every run. (As an i32 weight, half the bytes, ResNet-18 ran at 31 ms instead of 21.7
        // on a Zen 4, every GEMM slower too: not understood yet, so it stays i64.)
        let ids = self.node(&self.fresh(name), &Val::Lit(Lit::int(vec![n, po, pk], ids)))?;
        self.tmp(name, Op::Gather, vec![table, ids])
    }

    /// `x` (`[N, C, spatial..]`) as rows of channels, `[N·ΠS, C]`: the table window ops and
    /// GridSample gather from.
    pub(super) fn channel_rows(&mut self, name: &str, x: ValueId) -> R<ValueId> {
        if let Some(rows) = self.rows_of(x) {
            return Ok(rows);
        }
        let xs = self.shape(&Val::Node(x));
        let (r, c) = (xs.len(), xs[1]);
        let rows: usize = xs.iter().product::<usize>() / c;
        let perm: Vec<usize> = std::iter::once(0).chain(2..r).chain(std::iter::once(1)).collect();
        let t = if c == 1 { x } else { self.tmp(name, Op::Transpose { perm }, vec![x])? };
        let t = self.reshape(&self.fresh(name), t, &[rows, c])?;
        self.set_rows(x, t);
        Ok(t)
    }

    /// `rows` (`[R, C]`) followed by one row of `fill`, what out-of-range taps read.
    pub(super) fn with_fill_row(&mut self, name: &str, rows: ValueId, fill: f32) -> R<ValueId> {
        let c = self.shape(&Val::Node(rows))[1];
        let f = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![1, c], vec![fill as f64; c])))?;
        let f = self.cast_to(name, f, self.dtype(&Val::Node(rows)))?;
        self.tmp(name, Op::Concat { axis: 0 }, vec![rows, f])
    }

    /// A Conv's or ConvTranspose's weight as the GEMM's `[G, ΠK·C/G, M/G]` operand (no `G` dim
    /// for one group): viewed as `view` and permuted by `perm` to `[G, ΠK, C/G, M/G]`. A known
    /// weight is rearranged here, once, into a weight of its own (`<weight>.<op>`); one computed
    /// at run time is rearranged by graph ops.
    fn window_weight(&mut self, name: &str, wname: &str, w: &Val, view: [usize; 4], perm: [usize; 4], op: &str) -> R<ValueId> {
        let g = view[0];
        let to: Vec<usize> = {
            let p: Vec<usize> = perm.iter().map(|&i| view[i]).collect();
            let mut t = vec![p[0], p[1] * p[2], p[3]];
            if g == 1 {
                t.remove(0);
            }
            t
        };
        match w {
            Val::Lit(l) => {
                let mut l = self.lit(wname, l)?;
                l.shape = view.to_vec();
                let mut t = transpose(&l, &perm)?;
                t.shape = to;
                self.node(&format!("{wname}.{op}"), &Val::Lit(t))
            }
            Val::Node(id) => {
                let v = self.reshape(&self.fresh(name), *id, &view)?;
                let v = self.tmp(name, Op::Transpose { perm: perm.to_vec() }, vec![v])?;
                self.reshape(&self.fresh(name), v, &to)
            }
        }
    }

    /// ConvInteger's weight minus its zero point (per tensor or per output channel), in f32: a
    /// known weight as a literal (rearranged like any Conv weight after), one computed at run
    /// time by graph ops.
    fn centered_conv_weight(&mut self, cx: &NodeCx, w_at: usize, zero: Option<Val>) -> R<Val> {
        let w = cx.inp(w_at)?;
        let ws = self.shape(&w);
        if ws.len() < 3 || ws.contains(&0) {
            return Err(Fail::Invalid(format!("weight of shape {ws:?} (it takes [M, C/G, kernel..])")));
        }
        let m = ws[0];
        let per = |zn: usize| zn == 1 || zn == m;
        match (&w, &zero) {
            (Val::Lit(l), None | Some(Val::Lit(_))) => {
                let l = self.lit(&cx.iname(w_at), l)?;
                let z = match &zero {
                    Some(Val::Lit(z)) if per(z.numel()) => z.ints(),
                    Some(Val::Lit(z)) => return Err(Fail::Invalid(format!("w_zero_point of shape {:?} for {m} output channels", z.shape))),
                    _ => vec![0],
                };
                let inner = l.numel() / m.max(1);
                let v: Vec<f64> = l.ints().iter().enumerate().map(|(i, &q)| (q - z[if z.len() == 1 { 0 } else { i / inner }]) as f64).collect();
                let mut c = Lit::of(Elem::F32, ws, v);
                c.weight = l.weight;
                Ok(Val::Lit(c))
            }
            _ => {
                let wn = self.node(&cx.iname(w_at), &w)?;
                let wf = self.cast_to(cx.name, wn, DType::F32)?;
                let Some(z) = self.opt_f32(cx.name, zero, &cx.iname(w_at + 2))? else { return Ok(Val::Node(wf)) };
                let zn = self.shape(&Val::Node(z)).iter().product::<usize>();
                if !per(zn) {
                    return Err(Fail::Invalid(format!("w_zero_point of {zn} values for {m} output channels")));
                }
                let zs: Vec<usize> = std::iter::once(zn).chain(std::iter::repeat_n(1, ws.len() - 1)).collect();
                let z = self.reshape(&self.fresh(cx.name), z, &zs)?;
                Ok(Val::Node(self.bin(cx.name, BinaryOp::Sub, wf, z)?))
            }
        }
    }

    /// The windows (`[N, ΠO, ΠK, C]`, `rows` = N·ΠO of them) times the weight, per group, plus
    /// the bias: `[N·ΠO, M]`.
    #[allow(clippy::too_many_arguments)]
    fn window_gemm(&mut self, name: &str, win: ValueId, wt: ValueId, bias: Option<ValueId>, rows: usize, pk: usize, g: usize, cg: usize, mg: usize) -> R<ValueId> {
        let mm = Op::MatMul { transpose_a: false, transpose_b: false };
        let mut y = if g == 1 {
            let a = self.reshape(&self.fresh(name), win, &[rows, pk * cg])?;
            self.tmp(name, mm, vec![a, wt])?
        } else {
            let a = self.reshape(&self.fresh(name), win, &[rows, pk, g, cg])?;
            let a = self.tmp(name, Op::Transpose { perm: vec![2, 0, 1, 3] }, vec![a])?;
            let a = self.reshape(&self.fresh(name), a, &[g, rows, pk * cg])?;
            let y = self.tmp(name, mm, vec![a, wt])?;
            let y = self.tmp(name, Op::Transpose { perm: vec![1, 0, 2] }, vec![y])?;
            self.reshape(&self.fresh(name), y, &[rows, g * mg])?
        };
        if let Some(b) = bias {
            y = self.bin(name, BinaryOp::Add, y, b)?;
        }
        Ok(y)
    }

    /// A depthwise convolution (one input channel per group): the windows (`[N, ΠO, ΠK, G]`,
    /// `rows` = N·ΠO of them) times the weight (`[ΠK, G, M/G]`) summed over the taps, plus the
    /// bias: `[N·ΠO, M]`. Not a GEMM per group, whose k would be the taps and n the channel
    /// multiplier (a GEMV of 9 × 1 per channel): a product and a reduction over the taps, for
    /// every channel side by side (the reduction's lanes run along the channels).
    #[allow(clippy::too_many_arguments)]
    fn depthwise(&mut self, name: &str, win: ValueId, wt: ValueId, bias: Option<ValueId>, rows: usize, pk: usize, g: usize, mg: usize) -> R<ValueId> {
        let a = self.reshape(&self.fresh(name), win, &[rows, pk, g, 1])?;
        let p = self.bin(name, BinaryOp::Mul, a, wt)?;
        let y = self.tmp(name, Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keep_dims: false }, vec![p])?;
        let mut y = self.reshape(&self.fresh(name), y, &[rows, g * mg])?;
        if let Some(b) = bias {
            y = self.bin(name, BinaryOp::Add, y, b)?;
        }
        Ok(y)
    }

    /// A depthwise convolution of `x` (`[N, C, S..]`), one output channel per input channel,
    /// as `Σ_k shift_k(x) · w_k`: the input laid out once as a padded grid of rows of channels
    /// (one Gather from its rows plus a zero row; a reshape where nothing pads), each tap `k` a
    /// view of it, times that tap's weight row `[1, C]`, the taps summed in order —
    /// elementwise ops over views, one fused kernel that reads each input element from cache
    /// instead of a windows table nine times the input (MobileNet's 3×3 layers). A stride `t`
    /// along an axis splits it into `[blocks, t]` (the grid padded to whole blocks): tap offset
    /// `k·dilation` is block `offset / t`, phase `offset % t`, so every view is a slice.
    /// `wt` is `[ΠK, C, 1]`; `[N·ΠO, C]` out.
    fn depthwise_shifted(&mut self, name: &str, x: ValueId, geo: &Shift, wt: ValueId, bias: Option<ValueId>) -> R<ValueId> {
        let Shift { n, c, s, k, o, pb, st, dil } = *geo;
        let d = s.len();
        // The grid the views span: the last output's last tap, rounded up to whole strides.
        let sp: Vec<usize> = (0..d).map(|j| ((o[j] - 1) * st[j] + (k[j] - 1) * dil[j] + 1).next_multiple_of(st[j])).collect();
        let t = self.channel_rows(name, x)?;
        let ps: usize = s.iter().product();
        let pgrid: usize = sp.iter().product();
        let inside = |q: &[usize]| -> Option<usize> {
            let mut flat = 0;
            for j in 0..d {
                let i = q[j].checked_sub(pb[j]).filter(|&i| i < s[j])?;
                flat = flat * s[j] + i;
            }
            Some(flat)
        };
        let mut ids = Vec::with_capacity(n * pgrid);
        let mut q = vec![0usize; d];
        for b in 0..n {
            for f in 0..pgrid {
                let mut r = f;
                for j in (0..d).rev() {
                    q[j] = r % sp[j];
                    r /= sp[j];
                }
                ids.push(inside(&q).map_or(n * ps, |p| b * ps + p) as i64);
            }
        }
        // [N, sp_1/t_1, t_1, .., C]
        let dims: Vec<usize> =
            std::iter::once(n).chain((0..d).flat_map(|j| [sp[j] / st[j], st[j]])).chain(std::iter::once(c)).collect();
        let grid = if ids.iter().enumerate().all(|(i, &v)| v == i as i64) {
            self.reshape(&self.fresh(name), t, &dims)?
        } else {
            let table = self.with_fill_row(name, t, 0.0)?;
            let ids = self.node(&self.fresh(name), &Val::Lit(Lit::int(vec![n * pgrid], ids)))?;
            let g = self.tmp(name, Op::Gather, vec![table, ids])?;
            self.reshape(&self.fresh(name), g, &dims)?
        };
        let pk: usize = k.iter().product();
        let w = self.reshape(&self.fresh(name), wt, &[pk, c])?;
        let out: Vec<usize> = std::iter::once(n).chain(o.iter().copied()).chain(std::iter::once(c)).collect();
        let mut acc: Option<ValueId> = None;
        for kf in 0..pk {
            let mut v = grid;
            let mut r = kf;
            let mut kidx = vec![0usize; d];
            for j in (0..d).rev() {
                kidx[j] = r % k[j];
                r /= k[j];
            }
            for j in 0..d {
                let off = kidx[j] * dil[j];
                let (block, phase) = (off / st[j], off % st[j]);
                if block != 0 || o[j] != sp[j] / st[j] {
                    v = self.tmp(name, Op::Slice { axis: 1 + 2 * j, start: block, end: Dim::Fixed(block + o[j]) }, vec![v])?;
                }
                if st[j] > 1 {
                    v = self.tmp(name, Op::Slice { axis: 2 + 2 * j, start: phase, end: Dim::Fixed(phase + 1) }, vec![v])?;
                }
            }
            if st.iter().any(|&t| t > 1) {
                v = self.reshape(&self.fresh(name), v, &out)?;
            }
            let wk = self.tmp(name, Op::Slice { axis: 0, start: kf, end: Dim::Fixed(kf + 1) }, vec![w])?;
            let p = self.bin(name, BinaryOp::Mul, v, wk)?;
            acc = Some(match acc {
                Some(a) => self.bin(name, BinaryOp::Add, a, p)?,
                None => p,
            });
        }
        let mut acc = acc.ok_or_else(|| Fail::Invalid("a kernel of no taps".into()))?;
        if let Some(b) = bias {
            acc = self.bin(name, BinaryOp::Add, acc, b)?;
        }
        self.reshape(&self.fresh(name), acc, &[n * o.iter().product::<usize>(), c])
    }

    /// `Σ |x|^p` over `axes`, then its p-th root (LpPool, GlobalLpPool).
    fn lp(&mut self, name: &str, x: ValueId, axes: Vec<usize>, p: i64, keep_dims: bool) -> R<ValueId> {
        if p < 1 {
            return Err(Fail::Invalid(format!("p = {p}")));
        }
        let dt = self.dtype(&Val::Node(x));
        let a = self.un(name, UnaryOp::Abs, x)?;
        let pf = p as f32;
        let pw = match p {
            1 => a,
            2 => self.bin(name, BinaryOp::Mul, a, a)?,
            _ => {
                let l = self.un(name, UnaryOp::Log, a)?;
                let kp = self.k(name, pf, dt)?;
                let l = self.bin(name, BinaryOp::Mul, l, kp)?;
                self.un(name, UnaryOp::Exp, l)?
            }
        };
        let s = self.tmp(name, Op::Reduce { op: ReduceOp::Sum, axes, keep_dims }, vec![pw])?;
        Ok(match p {
            1 => s,
            2 => self.un(name, UnaryOp::Sqrt, s)?,
            _ => {
                let l = self.un(name, UnaryOp::Log, s)?;
                let kp = self.k(name, 1.0 / pf, dt)?;
                let l = self.bin(name, BinaryOp::Mul, l, kp)?;
                self.un(name, UnaryOp::Exp, l)?
            }
        })
    }
}
