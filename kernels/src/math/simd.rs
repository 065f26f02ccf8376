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

/// GELU (erf): `x - x·Φ(-|x|)` for x > 0, `x·Φ(-|x|)` otherwise, Φ(-|x|) a tabulated
/// piecewise polynomial (see the scalar `gelu_erf` and `coeffs`). The scalar path runs this
/// same definition at one lane.
#[inline(always)]
pub unsafe fn gelu_erf<V: Lanes>(x: V) -> V {
    unsafe { gelu_erf_n([x])[0] }
}

/// [`gelu_erf`] of K vectors at once, each step done for all K before the next: the table
/// polynomial is a chain of dependent permute+FMA steps, and with one vector at a time the
/// out-of-order window fills with ops waiting on that chain (in a GEMM tile's store, where
/// it runs, nothing else is left to overlap). K chains side by side keep K times as many
/// ops ready. Every element gets exactly the operations of the one-vector form.
/// The degree-9 polynomial is two chains of 4 FMAs in s² (even and odd coefficients) joined
/// by one, not one chain of 9: one multiply more, about half the latency. Measured on a Zen
/// 4 (gemm_bench, three alternations): the AVX2 tile's 1024×384·384×1536 + bias + GELU went
/// from 77–83% to 84–87% of the FMA peak on 1 thread (79–83% to 84–89% on 2); AVX-512 lost
/// 1–2 points. (Full Estrin spilled on AVX2's 16 registers: 65–78%.)
/// (Plain index loops: closures would not inherit the caller's target features.)
#[inline(always)]
pub unsafe fn gelu_erf_n<V: Lanes, const K: usize>(x: [V; K]) -> [V; K] {
    unsafe {
        let k = V::splat(GELU_K);
        let magic = V::splat(ROUND_MAGIC);
        let (mut t, mut u, mut r, mut s) = (x, x, x, x);
        for i in 0..K {
            // t = |x|, but f32::MAX at x = +inf, so that t·q is 0 there (+inf·0 would be NaN);
            // min keeps its second operand, a NaN. (The same q: past the table either way.)
            t[i] = V::splat(f32::MAX).min(x[i]).abs();
            u[i] = t[i].fmadd(k, V::splat(GELU_C));
            // The low mantissa bits of r hold j = round(u): the interval, and the table index.
            r[i] = u[i].add(magic);
            s[i] = t[i].fmsub(k, r[i].sub(magic));
        }
        // q = E(s²) + s·O(s²): the even and the odd coefficients as two Horner chains in
        // s², side by side, joined by one FMA (4 + 1 dependent FMAs after s² instead of 9).
        const { assert!(GELU_Q.len().is_multiple_of(2) && GELU_Q.len() >= 4) };
        let n = GELU_Q.len();
        let (mut qe, mut qo, mut s2) = (x, x, x);
        for i in 0..K {
            s2[i] = s[i].mul(s[i]);
            qe[i] = V::lookup8(r[i], &GELU_Q[n - 2]);
            qo[i] = V::lookup8(r[i], &GELU_Q[n - 1]);
        }
        for j in (0..n - 2).step_by(2).rev() {
            for i in 0..K {
                qe[i] = qe[i].fmadd(s2[i], V::lookup8(r[i], &GELU_Q[j]));
                qo[i] = qo[i].fmadd(s2[i], V::lookup8(r[i], &GELU_Q[j + 1]));
            }
        }
        let mut q = x;
        for i in 0..K {
            q[i] = qo[i].fmadd(s[i], qe[i]);
        }
        let mut y = x;
        for i in 0..K {
            // Past the table (and for NaN or inf): q = 0.
            let qi = q[i].zero_unless(u[i].lt(V::splat(GELU_U_END)));
            // max(-0, x) - t·q: x - x·q for x > 0, and -0 - |x|·q = x·q otherwise, each with
            // one rounding, the sign of a zero result as x·q's (max gives -0 for x < 0 and keeps
            // its second operand, x, at ±0 and NaN). NaN stays NaN, -inf gives -0 - inf·0 = NaN,
            // +inf gives inf - f32::MAX·0 = inf. Two operations where a compare, a multiply and
            // a blend chose between the two forms (all three on the FMA pipes of a Zen 3: the
            // GELU alone 21.2 -> 20.1 cycles per vector there), and the same bits.
            y[i] = t[i].fnmadd(qi, V::splat(-0.0).max(x[i]));
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
