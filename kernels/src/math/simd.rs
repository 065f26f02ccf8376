//! The vector algorithms the GEMM epilogue and the softmax use, generic over the vector width.
//! Each is the same sequence of IEEE-exact lane operations at every width, so an AVX-512
//! caller gets the AVX2 answer bit for bit (`kernels/tests/gemm.rs` checks every activation
//! through both epilogues on a dense sweep, `kernels/tests/attention.rs` the softmax).
//! All functions are `unsafe`: the caller is a `#[target_feature]` function of `V`'s ISA
//! (none for `f32`, the scalar path).

use super::*;
use crate::lanes::Lanes;

#[inline(always)]
pub unsafe fn horner<V: Lanes>(t: V, c: &[f32]) -> V {
    unsafe {
        let mut acc = V::splat(c[c.len() - 1]);
        let mut i = c.len() - 1;
        while i > 0 {
            i -= 1;
            acc = acc.fmadd(t, V::splat(c[i]));
        }
        acc
    }
}

/// e^x for the internal uses (softmax, erf, tanh, GELU, sigmoid): one scaling step, so
/// inputs are clamped to [-87.3, 88.3] and the results stay normal; below -87.3 the result
/// is flushed to zero (not e^-87.3: a softmax weight of an -inf score must be an exact 0, or
/// `weight·inf` in the value product turns 0·inf = NaN into ±inf). NaN propagates. Same
/// accuracy as the full-range `exp8` inside that range.
#[inline(always)]
pub unsafe fn exp_lean<V: Lanes>(x: V) -> V {
    unsafe { exp_clamped_n::<V, true, 1>([x])[0] }
}

/// [`exp_lean`] for `x <= 0` or NaN (a softmax's `s - max`), bit for bit: the upper clamp,
/// which such an `x` never reaches, is left out.
#[inline(always)]
pub unsafe fn exp_nonpos<V: Lanes>(x: V) -> V {
    unsafe { exp_clamped_n::<V, false, 1>([x])[0] }
}

/// [`exp_nonpos`] of K vectors, each step for all K before the next (as [`gelu_erf_n`]): K
/// independent chains in flight instead of one. The same operations per element.
#[inline(always)]
pub unsafe fn exp_nonpos_n<V: Lanes, const K: usize>(x: [V; K]) -> [V; K] {
    unsafe { exp_clamped_n::<V, false, K>(x) }
}

/// [`exp_lean`] of K vectors side by side, with its upper clamp only when `UPPER`: the one
/// definition the three forms above share.
#[inline(always)]
unsafe fn exp_clamped_n<V: Lanes, const UPPER: bool, const K: usize>(x: [V; K]) -> [V; K] {
    unsafe {
        let lo = V::splat(EXP_LEAN_MIN);
        // The bias 127 rides along in the magic constant: t's low bits hold n + 127.
        let magic = V::splat(ROUND_MAGIC + 127.0);
        let (mut t, mut r, mut y) = (x, x, x);
        for i in 0..K {
            let xc = if UPPER { lo.max(V::splat(EXP_LEAN_MAX).min(x[i])) } else { lo.max(x[i]) };
            t[i] = xc.fmadd(V::splat(LOG2E), magic);
            let n = t[i].sub(magic);
            r[i] = n.fnmadd(V::splat(LN2_LO), n.fnmadd(V::splat(LN2_HI), xc));
        }
        for i in 0..K {
            y[i] = horner(r[i], &EXP_P);
        }
        for i in 0..K {
            let e = y[i].fmadd(r[i].mul(r[i]), r[i]).add(V::splat(1.0));
            // Kept where x >= -87.3 or x is NaN (not-less-than, unordered is true).
            y[i] = e.mul(t[i].shl23()).zero_unless(x[i].nlt(lo));
        }
        y
    }
}

/// erf(x): `x + x·Q(x²)` below the split, `±(1 - erfc(|x|))` above (see the module doc).
#[inline(always)]
pub unsafe fn erf<V: Lanes>(x: V) -> V {
    unsafe {
        let one = V::splat(1.0);
        let a = x.abs().min(V::splat(ERF_CLAMP));
        let t = a.mul(a);
        let small = a.lt(V::splat(ERF_SPLIT));
        let ys = x.fmadd(horner(t, &ERF_SMALL), x);
        if V::all(small) {
            return ys;
        }
        // erfc(a) for 0.9 <= a <= 10: exp(-a²)·R(1/(1 + a/2)).
        let v = one.div(a.fmadd(V::splat(0.5), one));
        let erfc = exp_lean(V::splat(0.0).sub(t)).mul(horner(v, &ERFC_T));
        let yb = one.sub(erfc).copysign(x);
        let y = V::select(small, ys, yb);
        // NaN: |NaN| compares false with the split, so it took the large branch; restore it.
        V::select(x.unord(x), x, y)
    }
}

#[inline(always)]
pub unsafe fn tanh<V: Lanes>(x: V) -> V {
    unsafe {
        let a = x.abs().min(V::splat(TANH_CLAMP));
        let t = a.mul(a);
        let small = a.lt(V::splat(TANH_SPLIT));
        let ys = x.mul(t).fmadd(horner(t, &TANH_SMALL), x);
        if V::all(small) {
            return ys;
        }
        let one = V::splat(1.0);
        let e = exp_lean(a.add(a));
        let yb = one.sub(V::splat(2.0).div(e.add(one))).copysign(x);
        let y = V::select(small, ys, yb);
        V::select(x.unord(x), x, y)
    }
}

#[inline(always)]
pub unsafe fn relu<V: Lanes>(x: V) -> V {
    // max returns its second operand when either is NaN: NaN stays NaN.
    unsafe { V::splat(0.0).max(x) }
}

/// `min(max(x, 0), 6)` as kiln's graph Max and Min compute it (ONNX `Clip(x, 0, 6)`): the
/// max with +0 second gives +0 for ±0, and a NaN input is returned as it is.
#[inline(always)]
pub unsafe fn relu6<V: Lanes>(x: V) -> V {
    unsafe {
        let r = x.max(V::splat(0.0)).min(V::splat(6.0));
        V::select(x.unord(x), x, r)
    }
}

#[inline(always)]
pub unsafe fn sigmoid<V: Lanes>(x: V) -> V {
    unsafe {
        let one = V::splat(1.0);
        let e = exp_lean(V::splat(0.0).sub(x));
        one.div(one.add(e))
    }
}

/// `y`, with the tails of the module doc in the lanes where |x| > [`TAIL`]: `x` for x > 0,
/// -0 for x < 0, NaN at -inf. The fix-up runs only when some lane is that large (never in
/// a real model's activations), so the common path pays one compare and one branch.
#[inline(always)]
unsafe fn tails<V: Lanes>(x: V, y: V) -> V {
    unsafe {
        let big = x.abs().gt(V::splat(TAIL));
        if !V::any(big) {
            return y;
        }
        let pos = x.gt(V::splat(0.0));
        let t = V::select(pos, x, V::splat(-0.0));
        let t = V::select(x.eq(V::splat(f32::NEG_INFINITY)), V::splat(f32::NAN), t);
        V::select(big, t, y)
    }
}

#[inline(always)]
pub unsafe fn silu<V: Lanes>(x: V) -> V {
    unsafe {
        let one = V::splat(1.0);
        let e = exp_lean(V::splat(0.0).sub(x));
        tails(x, x.div(one.add(e)))
    }
}

/// GELU (erf): `x·Φ(x)` with Φ a rational approximation of `1/2 + erf(x/√2)/2` (see the
/// scalar `gelu_erf` and `coeffs`). The scalar path runs this same definition at one lane.
#[inline(always)]
pub unsafe fn gelu_erf<V: Lanes>(x: V) -> V {
    unsafe { gelu_erf_n([x])[0] }
}

/// [`gelu_erf`] of K vectors at once (K independent chains in one straight-line block, which
/// the compiler interleaves; in a GEMM tile's store, where it runs, nothing else is left to
/// overlap). Every element gets exactly the operations of the one-vector form: xc = x clamped
/// to ±`GELU_CLAMP`, s = xc², P(s) and Q(s) by Estrin's scheme, e = xc·(P/Q),
/// φ = max(e + 1/2, 0), x·φ. 20 operations a vector and one division, no table lookups and no
/// exp.
///
/// Until 2026-12-07 this was a piecewise degree-9 polynomial for Φ(-|x|) whose coefficients
/// came from 10 `vpermps` table lookups a vector: relative accuracy in the negative tail (no
/// `1 + erf` cancellation) at about 33 FMA-pipe slots a vector on Zen 3, where `vpermps` takes
/// the FMA pipes (20.0–21.1 cycles a vector over an L1 array; 10.2–10.6 with P and Q by
/// Horner, 11.5–11.7 by Estrin, same run).
/// `gemm_bench`, three alternations, 1 thread, + bias+GELU: 1024×384·384×1536 79.5–80.9 →
/// 81.6–83.7 GFLOP/s, 128×384·384×1536 83.9–86.7 → 89.0–90.5 (P and Q by Horner); Estrin
/// then, medians of seven alternations: m = 128 87.8 → 90.0 on 1 thread, 172.5 → 177.9 on 2;
/// m = 1024 level (83.5 → 83.5, 166.8 → 165.4): in the store the GELU is bound by its latency
/// as much as by its operation count. The error is now absolute, as in PyTorch's and
/// onnxruntime's `1 + erf` form (`coeffs::GELU_P`).
/// (Plain index loops: closures would not inherit the caller's target features.)
#[inline(always)]
pub unsafe fn gelu_erf_n<V: Lanes, const K: usize>(x: [V; K]) -> [V; K] {
    unsafe {
        let (lo, hi) = (V::splat(-GELU_CLAMP), V::splat(GELU_CLAMP));
        let (mut xc, mut s, mut p, mut q) = (x, x, x, x);
        for i in 0..K {
            // max gives its second operand, -C, for a NaN x: φ = 0 and x·φ = NaN.
            xc[i] = x[i].max(lo).min(hi);
            s[i] = xc[i].mul(xc[i]);
        }
        // P (degree 6) and Q (degree 4) in s by Estrin's scheme: three dependent steps after
        // s², s⁴ instead of Horner's six and four, for two multiplies more.
        // The steps below name every coefficient: a refit of other degrees must rewrite them
        // (and `scripts/fit_gelu.py`'s `gelu32`), not drop coefficients silently.
        const { assert!(GELU_P.len() == 7 && GELU_Q.len() == 5) };
        let (cp, cq) = (GELU_P, GELU_Q);
        for i in 0..K {
            let s2 = s[i].mul(s[i]);
            let s4 = s2.mul(s2);
            let p01 = V::splat(cp[1]).fmadd(s[i], V::splat(cp[0]));
            let p23 = V::splat(cp[3]).fmadd(s[i], V::splat(cp[2]));
            let p45 = V::splat(cp[5]).fmadd(s[i], V::splat(cp[4]));
            let p03 = p23.fmadd(s2, p01);
            let p46 = V::splat(cp[6]).fmadd(s2, p45);
            p[i] = p46.fmadd(s4, p03);
            let q01 = V::splat(cq[1]).fmadd(s[i], V::splat(cq[0]));
            let q23 = V::splat(cq[3]).fmadd(s[i], V::splat(cq[2]));
            let q03 = q23.fmadd(s2, q01);
            q[i] = V::splat(cq[4]).fmadd(s4, q03);
        }
        let mut y = x;
        for i in 0..K {
            // e rounds to exactly ∓1/2 at ∓C: φ = 0 below -C (x·0 = -0, and NaN at -inf, as
            // x/2·(1 + erf) gives), 1 above C (x itself, inf at inf). The max keeps φ ≥ 0 where
            // the absolute error exceeds Φ(x) (x below about -4), so GELU(x) ≤ 0 for x < 0.
            let e = xc[i].mul(p[i].div(q[i]));
            let phi = e.add(V::splat(0.5)).max(V::splat(0.0));
            y[i] = x[i].mul(phi);
        }
        y
    }
}

/// See the scalar `gelu_tanh`: `x / (1 + exp(-2u))`.
#[inline(always)]
pub unsafe fn gelu_tanh<V: Lanes>(x: V) -> V {
    unsafe {
        let x3 = x.mul(x).mul(x);
        let u2 = x3.fmadd(V::splat(GELU_TANH_C), x).mul(V::splat(-2.0 * SQRT_2_OVER_PI));
        tails(x, x.div(V::splat(1.0).add(exp_lean(u2))))
    }
}

/// The activation of one vector.
#[inline(always)]
pub unsafe fn act<V: Lanes>(act: Activation, x: V) -> V {
    unsafe {
        match act {
            Activation::None => x,
            Activation::Relu => relu(x),
            Activation::GeluErf => gelu_erf(x),
            Activation::GeluTanh => gelu_tanh(x),
            Activation::Tanh => tanh(x),
            Activation::Sigmoid => sigmoid(x),
            Activation::Silu => silu(x),
            Activation::Relu6 => relu6(x),
        }
    }
}

/// The activation of K vectors: the GELU (erf) side by side ([`gelu_erf_n`]), the others
/// one vector after another.
#[inline(always)]
pub unsafe fn act_n<V: Lanes, const K: usize>(a: Activation, x: [V; K]) -> [V; K] {
    unsafe {
        if a == Activation::GeluErf {
            return gelu_erf_n(x);
        }
        let mut y = x;
        for i in 0..K {
            y[i] = act(a, x[i]);
        }
        y
    }
}
