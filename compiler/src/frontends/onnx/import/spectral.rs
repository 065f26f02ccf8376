//! The Fourier transforms: DFT (forward, inverse, one-sided, the real inverse of a one-sided
//! spectrum) and STFT, as products with cosine and sine matrices of the bucket's fixed length.
//!
//! A length-N transform is two GEMMs against `[n, K]` tables cos(2πtk/N) and sin(2πtk/N)
//! (computed in f64 at import): O(n·K) work where an FFT does O(N log N), which for the frame
//! and signal lengths of audio front-ends (a few hundred points) is GEMM-shaped work kiln's
//! kernels run fast, and it needs no kernel of its own on any backend.

use kiln_runtime::graph::{BinaryOp, Dim, Op, ValueId};
use kiln_runtime::DType;

use super::super::shape;
use super::super::tensor::{Elem, Lit};
use super::{given, unsup, Fail, Importer, NodeCx, Val, R};

/// The ops this file imports.
pub(super) const OPS: &[&str] = &["DFT", "STFT"];

/// Points a transform may have at most.
const MAX_POINTS: usize = 1 << 13;

/// Entries of each of a transform's two tables at most (n·K f32 constants: 16 MiB).
const MAX_TABLE: usize = 1 << 22;

impl Importer<'_> {
    /// A node of one of [`OPS`] with a graph-computed input, as kiln ops. Returns its outputs.
    pub(super) fn import_spectral(&mut self, cx: &NodeCx) -> R<Vec<ValueId>> {
        let NodeCx { op, name, ins, at, opset, .. } = *cx;
        let x = self.node(&cx.iname(0), &cx.inp(0)?)?;
        let dt = self.dtype(&Val::Node(x));
        if !dt.is_float() {
            return unsup(format!("{op} of {dt}"));
        }
        let x = self.cast_to(name, x, DType::F32)?;
        let xs = self.shape(&Val::Node(x));
        let r = xs.len();
        if r < 2 || !matches!(xs[r - 1], 1 | 2) {
            return Err(Fail::Invalid(format!("{op} input of shape {xs:?} (its last dim is 1 for real, 2 for complex)")));
        }
        let known = |k: usize, what: &str| -> R<Option<i64>> {
            if !given(ins, k) {
                return Ok(None);
            }
            Ok(cx.lit_of(k, what)?.ints().first().copied())
        };
        let y = if op == "DFT" {
            let axis = if opset >= 20 { known(2, "DFT axis")?.unwrap_or(-2) } else { at.int("axis", 1) };
            let ax = shape::axis(axis, r)?;
            if ax == r - 1 {
                return Err(Fail::Invalid(format!("DFT along axis {axis} of shape {xs:?}")));
            }
            let (inverse, onesided) = (at.int("inverse", 0) != 0, at.int("onesided", 0) != 0);
            let n = xs[ax];
            let len = match known(1, "dft_length")? {
                Some(l) => usize::try_from(l).ok().filter(|&l| l >= 1).ok_or_else(|| Fail::Invalid(format!("dft_length {l}")))?,
                None if inverse && onesided => 2 * (n.max(2) - 1),
                None => n,
            };
            self.dft(name, x, ax, len, inverse, onesided)?
        } else {
            // STFT: frames of `frame_length` every `frame_step` along axis 1, times the window,
            // each transformed (one-sided by default).
            let step = known(1, "STFT frame_step")?.ok_or_else(|| Fail::Invalid("STFT without frame_step".into()))?;
            let window = if given(ins, 2) { Some(self.node(&cx.iname(2), &cx.inp(2)?)?) } else { None };
            let flen = match (known(3, "STFT frame_length")?, window) {
                (Some(l), _) => l,
                (None, Some(w)) => self.shape(&Val::Node(w)).first().copied().unwrap_or(0) as i64,
                (None, None) => return Err(Fail::Invalid("STFT without a window or frame_length".into())),
            };
            if r != 3 || step < 1 || flen < 1 || flen as usize > xs[1] {
                return Err(Fail::Invalid(format!("STFT of a signal {xs:?}, frame_step {step}, frame_length {flen}")));
            }
            let (step, flen) = (step as usize, flen as usize);
            let frames = (xs[1] - flen) / step + 1;
            let ids: Vec<i64> = (0..frames).flat_map(|f| (0..flen).map(move |t| (f * step + t) as i64)).collect();
            let ids = self.node(&self.fresh(name), &Val::Lit(Lit::int(vec![frames, flen], ids)))?;
            let mut fr = self.gather_axis(&self.fresh(name), x, &xs, 1, ids, false)?;
            if let Some(w) = window {
                if self.shape(&Val::Node(w)) != [flen] {
                    return Err(Fail::Invalid(format!("STFT window of shape {:?} for frames of {flen}", self.shape(&Val::Node(w)))));
                }
                let w = self.cast_to(name, w, DType::F32)?;
                let w = self.reshape(&self.fresh(name), w, &[flen, 1])?;
                fr = self.bin(name, BinaryOp::Mul, fr, w)?;
            }
            self.dft(name, fr, 2, flen, false, at.int("onesided", 1) != 0)?
        };
        Ok(vec![self.cast_to(name, y, dt)?])
    }

    /// The DFT of `x` (`[.., n at ax, .., 1 | 2]`, real or complex in the last dim) along `ax`
    /// with `len` points: forward (e^{-iθ}), inverse (e^{+iθ}/N), one-sided (the first N/2 + 1
    /// bins), or the real inverse of a one-sided spectrum (numpy's irfft: the bins past the
    /// first and the Nyquist one count twice, a real output).
    fn dft(&mut self, name: &str, x: ValueId, ax: usize, len: usize, inverse: bool, onesided: bool) -> R<ValueId> {
        let xs = self.shape(&Val::Node(x));
        let r = xs.len();
        let (n, complex) = (xs[ax], xs[r - 1] == 2);
        if len > MAX_POINTS || n > MAX_POINTS {
            return unsup(format!("a DFT of {len} points over {n} (kiln's tables take at most {MAX_POINTS})"));
        }
        // [rows, n, C]: the transformed axis just before the complex one.
        let lead: Vec<usize> = (0..r - 1).filter(|&d| d != ax).collect();
        let perm: Vec<usize> = lead.iter().copied().chain([ax, r - 1]).collect();
        let moved = if perm.iter().enumerate().all(|(i, &p)| i == p) { x } else { self.tmp(name, Op::Transpose { perm: perm.clone() }, vec![x])? };
        let rows: usize = lead.iter().map(|&d| xs[d]).product();
        let c = xs[r - 1];
        let v = self.reshape(&self.fresh(name), moved, &[rows, n, c])?;
        let real_inverse = inverse && onesided;
        // Input points used: the signal cut or zero-padded to the length (a one-sided
        // spectrum to N/2 + 1 bins).
        let used = n.min(if real_inverse { len / 2 + 1 } else { len });
        let part = |me: &mut Self, k: usize| -> R<ValueId> {
            let p = me.tmp(name, Op::Slice { axis: 2, start: k, end: Dim::Fixed(k + 1) }, vec![v])?;
            let p = me.reshape(&me.fresh(name), p, &[rows, n])?;
            if used < n {
                return me.tmp(name, Op::Slice { axis: 1, start: 0, end: Dim::Fixed(used) }, vec![p]);
            }
            Ok(p)
        };
        let re = part(self, 0)?;
        let im = if complex { Some(part(self, 1)?) } else { None };
        let bins = if real_inverse { len } else if onesided { len / 2 + 1 } else { len };
        if used * bins > MAX_TABLE {
            return unsup(format!("a DFT of {len} points over {used} (its {used}×{bins} tables; kiln's take at most 2^22 entries)"));
        }
        let scale = if inverse { 1.0 / len as f64 } else { 1.0 };
        // cos and sin tables [used, bins], scaled (irfft: doubled bins).
        let table = |me: &mut Self, sin: bool| -> R<ValueId> {
            let v: Vec<f64> = (0..used * bins)
                .map(|e| {
                    let (t, k) = (e / bins, e % bins);
                    // irfft: t is the input bin, k the output sample.
                    let weight = if real_inverse && t != 0 && !(len.is_multiple_of(2) && t == len / 2) { 2.0 } else { 1.0 };
                    let theta = 2.0 * std::f64::consts::PI * ((t * k) % len) as f64 / len as f64;
                    scale * weight * if sin { theta.sin() } else { theta.cos() }
                })
                .collect();
            me.node(&me.fresh(name), &Val::Lit(Lit::of(Elem::F32, vec![used, bins], v)))
        };
        let (cos, sin) = (table(self, false)?, table(self, true)?);
        let mm = |me: &mut Self, a: ValueId, b: ValueId| me.tmp(name, Op::MatMul { transpose_a: false, transpose_b: false }, vec![a, b]);
        // Forward: (re + i·im)(cos - i·sin); inverse: (re + i·im)(cos + i·sin).
        let rc = mm(self, re, cos)?;
        let rs = mm(self, re, sin)?;
        let (yr, yi) = match im {
            Some(im) => {
                let ic = mm(self, im, cos)?;
                let is = mm(self, im, sin)?;
                if inverse {
                    (self.bin(name, BinaryOp::Sub, rc, is)?, self.bin(name, BinaryOp::Add, ic, rs)?)
                } else {
                    (self.bin(name, BinaryOp::Add, rc, is)?, self.bin(name, BinaryOp::Sub, ic, rs)?)
                }
            }
            None if inverse => (rc, rs),
            None => (rc, self.un(name, kiln_runtime::graph::UnaryOp::Neg, rs)?),
        };
        let out_c = if real_inverse { 1 } else { 2 };
        let y = if real_inverse {
            self.reshape(&self.fresh(name), yr, &[rows, bins, 1])?
        } else {
            let a = self.reshape(&self.fresh(name), yr, &[rows, bins, 1])?;
            let b = self.reshape(&self.fresh(name), yi, &[rows, bins, 1])?;
            self.tmp(name, Op::Concat { axis: 2 }, vec![a, b])?
        };
        let moved_shape: Vec<usize> = lead.iter().map(|&d| xs[d]).chain([bins, out_c]).collect();
        let y = self.reshape(&self.fresh(name), y, &moved_shape)?;
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(y);
        }
        let mut back = vec![0; r];
        for (i, &p) in perm.iter().enumerate() {
            back[p] = i;
        }
        self.tmp(name, Op::Transpose { perm: back }, vec![y])
    }
}
