//! Resize (opsets 10 to 19: nearest, linear and cubic, every coordinate transformation,
//! antialias, axes, keep_aspect_ratio_policy, tf_crop_and_resize's extrapolation) and the older
//! Upsample.
//!
//! Interpolation is separable, so each resized axis is one Gather along it by known indices
//! `[O, n]` followed, unless the mode is nearest (`n = 1`), by a product with known weights and
//! a sum over the `n` taps. The indices and weights are those of onnx's reference
//! implementation (`onnx/reference/ops/op_resize.py`, `_interpolate_1d_along_axis`), computed
//! here in f64 for the bucket's fixed shape.

use kiln_runtime::graph::{BinaryOp, Op, ReduceOp, ValueId};

use super::super::tensor::{Elem, Lit};
use super::{given, one, unsup, Fail, Importer, NodeCx, Val, R};

/// The ops this file imports.
pub(super) const OPS: &[&str] = &["Resize", "Upsample"];

/// How output positions weigh their input neighbours along one axis.
#[derive(Clone, Copy)]
enum Kernel {
    /// The nearest input, ties and rounding as `nearest_mode` says.
    Nearest(Rounding),
    Linear { antialias: bool },
    Cubic { a: f64, antialias: bool },
}

/// `nearest_mode`, and opset 10's (and Upsample's) rule.
#[derive(Clone, Copy)]
enum Rounding {
    PreferFloor,
    PreferCeil,
    Floor,
    Ceil,
}

/// The taps of one resized axis: per output position, `n` input positions and their weights,
/// and whether it takes the extrapolation value instead.
struct AxisTaps {
    n: usize,
    idx: Vec<usize>,
    coef: Vec<f64>,
    extrapolated: Vec<bool>,
}

impl Kernel {
    /// The weights of the neighbours of a source coordinate `ratio` past its left one
    /// (`ratio` in (0, 1]), at scale `scale`.
    fn coeffs(self, ratio: f64, scale: f64) -> Vec<f64> {
        match self {
            Kernel::Nearest(r) => {
                let right = ratio == 1.0
                    || match r {
                        Rounding::PreferFloor => ratio > 0.5,
                        Rounding::PreferCeil => ratio >= 0.5,
                        Rounding::Floor => false,
                        Rounding::Ceil => true,
                    };
                if right { vec![0.0, 1.0] } else { vec![1.0, 0.0] }
            }
            Kernel::Linear { antialias: false } => vec![1.0 - ratio, ratio],
            Kernel::Linear { antialias: true } => {
                let scale = scale.min(1.0);
                let start = (-1.0 / scale).floor() as i64 + 1;
                let c: Vec<f64> = (start..start + 2 - 2 * start).map(|i| (1.0 - ((i as f64 - ratio) * scale).abs()).clamp(0.0, 1.0)).collect();
                normalized(c)
            }
            Kernel::Cubic { a, antialias: false } => {
                let (r, q) = (ratio, 1.0 - ratio);
                vec![
                    ((a * (r + 1.0) - 5.0 * a) * (r + 1.0) + 8.0 * a) * (r + 1.0) - 4.0 * a,
                    ((a + 2.0) * r - (a + 3.0)) * r * r + 1.0,
                    ((a + 2.0) * q - (a + 3.0)) * q * q + 1.0,
                    ((a * (q + 1.0) - 5.0 * a) * (q + 1.0) + 8.0 * a) * (q + 1.0) - 4.0 * a,
                ]
            }
            Kernel::Cubic { a, antialias: true } => {
                let scale = scale.min(1.0);
                let start = (-2.0 / scale).floor() as i64 + 1;
                let f = |x: f64| {
                    let x = x.abs();
                    if x <= 1.0 {
                        (a + 2.0) * x * x * x - (a + 3.0) * x * x + 1.0
                    } else if x < 2.0 {
                        a * x * x * x - 5.0 * a * x * x + 8.0 * a * x - 4.0 * a
                    } else {
                        0.0
                    }
                };
                normalized((start..2 - start).map(|i| f(scale * (i as f64 - ratio))).collect())
            }
        }
    }
}

fn normalized(c: Vec<f64>) -> Vec<f64> {
    let s: f64 = c.iter().sum();
    c.into_iter().map(|v| v / s).collect()
}

/// The taps of one axis of `input` positions resized to `output` at `scale`, as onnx's
/// reference computes them.
#[allow(clippy::too_many_arguments)]
fn axis_taps(kernel: Kernel, mode: &str, scale: f64, input: usize, output: usize, roi: (f64, f64), exclude_outside: bool) -> R<AxisTaps> {
    let (iw, ow) = (input as f64, scale * input as f64);
    let mut taps = AxisTaps { n: 0, idx: Vec::new(), coef: Vec::new(), extrapolated: Vec::new() };
    for y in 0..output {
        let y = y as f64;
        let x = match mode {
            "align_corners" if ow == 1.0 => 0.0,
            "align_corners" => y * (iw - 1.0) / (ow - 1.0),
            "asymmetric" => y / scale,
            "tf_crop_and_resize" => {
                let x = if ow == 1.0 { (roi.1 - roi.0) * (iw - 1.0) / 2.0 } else { y * (roi.1 - roi.0) * (iw - 1.0) / (ow - 1.0) };
                x + roi.0 * (iw - 1.0)
            }
            "pytorch_half_pixel" if ow == 1.0 => -0.5,
            "pytorch_half_pixel" | "half_pixel" => (y + 0.5) / scale - 0.5,
            "half_pixel_symmetric" => {
                let center = iw / 2.0;
                center * (1.0 - output as f64 / ow) + (y + 0.5) / scale - 0.5
            }
            m => return Err(Fail::Invalid(format!("coordinate_transformation_mode `{m}`"))),
        };
        taps.extrapolated.push(mode == "tf_crop_and_resize" && (x < 0.0 || x > iw - 1.0));
        let ratio = if x == x.floor() { 1.0 } else { x - x.floor() };
        // An antialiased kernel spans about 1/scale inputs: refused past 2^12 taps.
        if matches!(kernel, Kernel::Linear { antialias: true } | Kernel::Cubic { antialias: true, .. }) && scale < 1.0 / 1024.0 {
            return unsup(format!("an antialiased Resize by {scale} (more than 2^12 taps per output)"));
        }
        let mut c = kernel.coeffs(ratio, scale);
        let n = c.len();
        taps.n = n;
        // The n nearest positions (edge-clamped), ties to the smaller.
        let pad = n.div_ceil(2) as f64;
        let xp = x + pad;
        let p = xp.floor();
        let frac = xp - p;
        let offset = if n.is_multiple_of(2) {
            if frac == 0.0 { -((n / 2) as i64) } else { -((n / 2) as i64) + 1 }
        } else {
            let base = -(((n - 1) / 2) as i64);
            if frac <= 0.5 { base } else { base + 1 }
        };
        let start = p as i64 + offset - pad as i64;
        let ids: Vec<i64> = (0..n as i64).map(|i| start + i).collect();
        if exclude_outside {
            for (ci, &i) in c.iter_mut().zip(&ids) {
                if i < 0 || i >= input as i64 {
                    *ci = 0.0;
                }
            }
            let s: f64 = c.iter().sum();
            let s = if s == 0.0 { 1.0 } else { s };
            c.iter_mut().for_each(|v| *v /= s);
        }
        taps.idx.extend(ids.iter().map(|&i| i.clamp(0, input as i64 - 1) as usize));
        taps.coef.extend(c);
    }
    Ok(taps)
}

impl Importer<'_> {
    /// A node of one of [`OPS`] with a graph-computed input, as kiln ops. Returns its outputs.
    pub(super) fn import_resize(&mut self, cx: &NodeCx) -> R<Vec<ValueId>> {
        let NodeCx { op, name, ins, at, opset, .. } = *cx;
        let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
        let xs = self.shape(&Val::Node(x));
        let dt = self.dtype(&Val::Node(x));
        let r = xs.len();
        let mode = at.string("mode").unwrap_or_else(|| "nearest".into());
        let legacy = op == "Upsample" || opset < 11;
        // The literal input `k` as floats, absent where not given or empty.
        let input = |k: usize, what: &str| -> R<Option<Vec<f64>>> {
            if !given(ins, k) {
                return Ok(None);
            }
            let l = cx.lit_of(k, what)?;
            Ok((l.numel() > 0).then(|| l.floats()))
        };
        let (roi, scales, sizes) = if op == "Upsample" && opset < 9 {
            (None, at.floats("scales").map(|v| v.iter().map(|&s| s as f64).collect()), None)
        } else if legacy {
            (None, input(1, "scales")?, None)
        } else {
            (input(1, "roi")?, input(2, "scales")?, input(3, "sizes")?)
        };
        let axes: Vec<usize> = match at.ints("axes") {
            Some(a) => a.iter().map(|&v| super::super::shape::axis(v, r)).collect::<Result<_, _>>()?,
            None => (0..r).collect(),
        };
        let (mut scale, mut out) = (vec![1.0f64; r], xs.clone());
        match (&scales, &sizes) {
            (Some(s), None) if s.len() == axes.len() => {
                for (&a, &v) in axes.iter().zip(s) {
                    if !(v > 0.0 && v.is_finite()) {
                        return Err(Fail::Invalid(format!("scale {v} along axis {a}")));
                    }
                    scale[a] = v;
                    out[a] = (v * xs[a] as f64) as usize;
                }
            }
            (None, Some(s)) if s.len() == axes.len() => {
                for (&a, &v) in axes.iter().zip(s) {
                    out[a] = v as usize;
                    scale[a] = v / xs[a] as f64;
                }
                let policy = at.string("keep_aspect_ratio_policy").unwrap_or_else(|| "stretch".into());
                let pick = match policy.as_str() {
                    "stretch" => None,
                    "not_larger" => Some(axes.iter().map(|&a| scale[a]).fold(f64::INFINITY, f64::min)),
                    "not_smaller" => Some(axes.iter().map(|&a| scale[a]).fold(0.0, f64::max)),
                    p => return Err(Fail::Invalid(format!("keep_aspect_ratio_policy `{p}`"))),
                };
                if let Some(s) = pick {
                    for &a in &axes {
                        scale[a] = s;
                        out[a] = (s * xs[a] as f64 + 0.5) as usize;
                    }
                }
            }
            (Some(_), Some(_)) => return Err(Fail::Invalid("both scales and sizes".into())),
            (None, None) => return Err(Fail::Invalid("neither scales nor sizes".into())),
            (Some(s), None) | (None, Some(s)) => return Err(Fail::Invalid(format!("{} scales or sizes for {} axes", s.len(), axes.len()))),
        }
        if out.contains(&0) {
            return unsup(format!("a Resize to {out:?} (kiln has no empty tensors)"));
        }
        // Each output position is an id (exact in f32 below 2^24), and the shape must be one
        // kiln can hold.
        if out.iter().any(|&o| o >= 1 << 24) || super::super::tensor::checked_numel(&out).is_err() {
            return Err(Fail::Invalid(format!("a Resize to {out:?}")));
        }
        let ctm = if legacy { "asymmetric".to_string() } else { at.string("coordinate_transformation_mode").unwrap_or_else(|| "half_pixel".into()) };
        let antialias = at.int("antialias", 0) != 0;
        let kernel = |a: usize| -> R<Kernel> {
            Ok(match mode.as_str() {
                "nearest" if antialias => return Err(Fail::Invalid("antialias with mode nearest".into())),
                // Opset 10 and Upsample: truncation up, ceil down ("simple" in onnxruntime).
                "nearest" if legacy => Kernel::Nearest(if scale[a] >= 1.0 { Rounding::Floor } else { Rounding::Ceil }),
                "nearest" => Kernel::Nearest(match at.string("nearest_mode").as_deref().unwrap_or("round_prefer_floor") {
                    "round_prefer_floor" => Rounding::PreferFloor,
                    "round_prefer_ceil" => Rounding::PreferCeil,
                    "floor" => Rounding::Floor,
                    "ceil" => Rounding::Ceil,
                    m => return Err(Fail::Invalid(format!("nearest_mode `{m}`"))),
                }),
                "linear" | "bilinear" | "trilinear" => Kernel::Linear { antialias },
                "cubic" | "bicubic" => Kernel::Cubic { a: at.float("cubic_coeff_a", -0.75) as f64, antialias },
                m => return Err(Fail::Invalid(format!("mode `{m}`"))),
            })
        };
        // roi [begin.., end..] over `axes`.
        let roi_of = |a: usize| -> R<(f64, f64)> {
            if ctm != "tf_crop_and_resize" {
                return Ok((0.0, 1.0));
            }
            let roi = roi.as_ref().ok_or_else(|| Fail::Invalid("tf_crop_and_resize without a roi".into()))?;
            let k = axes.iter().position(|&b| b == a).unwrap_or(0);
            match (roi.get(k), roi.get(axes.len() + k)) {
                (Some(&b), Some(&e)) if roi.len() == 2 * axes.len() => Ok((b, e)),
                _ => Err(Fail::Invalid(format!("roi of {} values for {} axes", roi.len(), axes.len()))),
            }
        };
        let extrapolation = at.float("extrapolation_value", 0.0) as f64;
        let exclude = at.int("exclude_outside", 0) != 0;
        let mut y = x;
        let resized: Vec<usize> = axes.iter().copied().filter(|&a| out[a] != xs[a] || scale[a] != 1.0 || roi_of(a).is_ok_and(|r| r != (0.0, 1.0))).collect();
        if !dt.is_float() && mode != "nearest" {
            return unsup(format!("{mode} Resize of {dt}"));
        }
        for (i, &a) in resized.iter().enumerate() {
            let taps = axis_taps(kernel(a)?, &ctm, scale[a], xs[a], out[a], roi_of(a)?, exclude)?;
            let last = i + 1 == resized.len();
            y = self.resample(name, y, a, &taps, extrapolation, last)?;
        }
        one(y)
    }

    /// `y` resampled along `axis` by `taps`: a gather, then (unless every output reads one
    /// input with weight 1) a weighted sum over the taps.
    fn resample(&mut self, name: &str, y: ValueId, axis: usize, taps: &AxisTaps, extrapolation: f64, last: bool) -> R<ValueId> {
        let ys = self.shape(&Val::Node(y));
        let o = taps.extrapolated.len();
        let n = taps.n;
        let post = ys.len() - axis - 1;
        let extrapolated = taps.extrapolated.iter().any(|&e| e);
        let nearest = !extrapolated && taps.coef.iter().all(|&c| c == 0.0 || c == 1.0) && taps.coef.chunks(n).all(|c| c.iter().filter(|&&v| v == 1.0).count() == 1);
        let final_name = if last { name.to_string() } else { self.fresh(name) };
        if nearest {
            let ids: Vec<i64> = (0..o).map(|i| taps.idx[i * n + taps.coef[i * n..(i + 1) * n].iter().position(|&c| c == 1.0).unwrap_or(0)] as i64).collect();
            let ids = self.node(&self.fresh(name), &Val::Lit(Lit::int(vec![o], ids)))?;
            return self.gather_axis(&final_name, y, &ys, axis, ids, false);
        }
        let ids = self.node(&self.fresh(name), &Val::Lit(Lit::int(vec![o, n], taps.idx.iter().map(|&i| i as i64).collect())))?;
        let g = self.gather_axis(&self.fresh(name), y, &ys, axis, ids, false)?;
        let dt = self.dtype(&Val::Node(y));
        let wshape: Vec<usize> = [o, n].into_iter().chain(std::iter::repeat_n(1, post)).collect();
        let coef: Vec<f64> = taps.coef.iter().zip(taps.extrapolated.iter().flat_map(|&e| std::iter::repeat_n(e, n))).map(|(&c, e)| if e { 0.0 } else { c }).collect();
        let w = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, wshape, coef)))?;
        let w = self.cast_to(name, w, dt)?;
        let p = self.bin(name, BinaryOp::Mul, g, w)?;
        let s = self.tmp(name, Op::Reduce { op: ReduceOp::Sum, axes: vec![axis + 1], keep_dims: false }, vec![p])?;
        if !extrapolated {
            return self.cast_to(&final_name, s, dt);
        }
        let eshape: Vec<usize> = std::iter::once(o).chain(std::iter::repeat_n(1, post)).collect();
        let e: Vec<f64> = taps.extrapolated.iter().map(|&e| if e { extrapolation } else { 0.0 }).collect();
        let e = self.node(&self.fresh(name), &Val::Lit(Lit::of(Elem::F32, eshape, e)))?;
        let e = self.cast_to(name, e, dt)?;
        self.push(&final_name, Op::Binary(BinaryOp::Add), vec![s, e])
    }
}
