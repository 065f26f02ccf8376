#!/usr/bin/env python3
"""Fits the rational approximation of kiln's vector GELU (erf form) and prints the Rust constants.

    PYTHONPATH=.pydeps python3 scripts/fit_gelu.py > /tmp/gelu.rs   # paste into kernels/src/math/coeffs.rs

GELU(x) = x·Φ(x), Φ(x) = 1/2 + 1/2·erf(x/√2). With xc = x clamped to [-C, C] (C = 4√2 in f32,
where erf(x/√2) is ±1 in f32) and s = xc², Φ(x) ≈ 1/2 + xc·P(s)/Q(s): P of degree 6, Q of
degree 4 with Q(0) = 1, fitted for the absolute error of Φ on [0, C] (odd symmetry covers the
rest) by the linearised rational least squares of Loeb (each step weighted by 1/Q of the step
before), then Lawson's reweighting toward minimax. The kernels evaluate, one rounding per step:
P and Q by Estrin's scheme with FMAs, one IEEE division (the same bits on every ISA, unlike vrcpps),
e = xc·(P/Q), φ = max(e + 1/2, 0), GELU = x·φ. e rounds to exactly ∓1/2 at ∓C, so φ is 0 there
(x·0: -0 below -C, NaN at -inf as x/2·(1 + erf) gives) and 1 at +C (x itself above C).

This is the `1 + erf` form of PyTorch and onnxruntime: its error is absolute (a few f32 ulps of
Φ, times |x|), so the relative error grows where GELU(x) is tiny (x below about -3); the max keeps
the sign of such results. The last part evaluates the f32 constants exactly as the kernels do on
a dense sweep against math.erf in f64 and prints the worst errors.
"""
import math
import numpy as np

f32 = np.float32
NP, NQ = 7, 5  # coefficients of P and Q (Q's first is 1)
C = float(f32(4.0 * math.sqrt(2.0)))


def phi_minus_half(x):
    return 0.5 * np.vectorize(math.erf)(x / math.sqrt(2.0))


def fit():
    n = 6000
    x = C * (1.0 - np.cos(np.linspace(0.0, math.pi, n)))[1:] / 2.0  # Chebyshev-spaced on (0, C]
    f, y = phi_minus_half(x), x * x
    q_prev = np.ones_like(x)
    lawson = np.ones_like(x)
    best = (math.inf, None)
    for it in range(200):
        a = np.concatenate(
            [x[:, None] * y[:, None] ** np.arange(NP)[None, :], -(f[:, None] * y[:, None] ** np.arange(1, NQ)[None, :])],
            axis=1,
        )
        w = lawson / q_prev
        m = a * w[:, None]
        scale = np.abs(m).max(0)
        sol = np.linalg.lstsq(m / scale, f * w, rcond=None)[0] / scale
        p, q = sol[:NP], np.concatenate([[1.0], sol[NP:]])
        q_new = np.polyval(q[::-1], y)
        assert q_new.min() > 0, f"step {it}: Q has a zero on [0, C]"
        err = np.abs(x * np.polyval(p[::-1], y) / q_new - f)
        if err.max() < best[0]:
            best = (err.max(), (p, q))
        q_prev = q_new
        if it >= 20:
            lawson = lawson * (err / err.max()) ** 0.25
            lawson /= lawson.mean()
    return best


def r32(v):
    return np.asarray(v, dtype=np.float64).astype(f32)


def fma(a, b, c):  # a·b is exact in f64; the sum rounds there, then to f32 (close enough here)
    return r32(a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64))


def gelu32(x, p, q):
    """The kernels' evaluation, step by step in f32."""
    xc = np.minimum(np.maximum(x, f32(-C)), f32(C))
    s = r32(xc.astype(np.float64) ** 2)
    s2 = r32(s.astype(np.float64) ** 2)
    s4 = r32(s2.astype(np.float64) ** 2)

    def k(v):
        return np.full_like(s, v)

    # Estrin's scheme, as simd::gelu_erf_n: P = (p0 + p1 s + s²(p2 + p3 s)) + s⁴(p4 + p5 s + p6 s²).
    p03 = fma(fma(k(p[3]), s, k(p[2])), s2, fma(k(p[1]), s, k(p[0])))
    pp = fma(fma(k(p[6]), s2, fma(k(p[5]), s, k(p[4]))), s4, p03)
    qq = fma(k(q[4]), s4, fma(fma(k(q[3]), s, k(q[2])), s2, fma(k(q[1]), s, k(q[0]))))
    e = r32(xc.astype(np.float64) * r32(pp.astype(np.float64) / qq))
    phi = np.maximum(r32(e.astype(np.float64) + 0.5), f32(0.0))
    return r32(x.astype(np.float64) * phi), phi


def main():
    err, (p, q) = fit()
    p32, q32 = r32(p), r32(q)

    def lit(v):  # the shortest literal that reads back as this f32
        for digits in range(1, 10):
            s = f"{float(v):.{digits}e}"
            if f32(s) == v:  # trailing zeros dropped (clippy's excessive_precision)
                mant, exp = s.split("e")
                mant = mant.rstrip("0")
                return f"{mant}0e{exp}" if mant.endswith(".") else f"{mant}e{exp}"
        return repr(float(v))

    print(f"// fit: max |Φ - approximation| on [0, C] in f64 {err:.2e}")
    print(f"pub const GELU_CLAMP: f32 = {lit(f32(C))};")
    print(f"pub const GELU_P: [f32; {NP}] = [" + ", ".join(lit(v) for v in p32) + "];")
    print(f"pub const GELU_Q: [f32; {NQ}] = [" + ", ".join(lit(v) for v in q32) + "];")

    x = np.linspace(-12.0, 12.0, 2_400_001).astype(f32)
    g, phi = gelu32(x, p32, q32)
    xd = x.astype(np.float64)
    ref = xd * (0.5 + phi_minus_half(xd))
    ae = np.abs(g - ref)
    at = ae.argmax()
    print(f"// f32 evaluation on [-12, 12]: max absolute error {ae[at]:.2e} at {xd[at]:.4f}")
    for lo, hi in [(-12, -6), (-6, -3), (-3, 0), (0, 3), (3, 6), (6, 12)]:
        sel = (xd >= lo) & (xd < hi) & (np.abs(ref) > 1e-30)
        rel = ae[sel] / np.abs(ref[sel])
        print(f"// [{lo}, {hi}): absolute {ae[sel].max():.2e}, relative {rel.max():.2e}")
    edge = gelu32(np.array([-C, C], dtype=f32), p32, q32)[1]
    assert edge[0] == 0.0 and edge[1] == 1.0, f"Φ at ∓C is {edge}, not 0 and 1"
    assert (np.sign(g[x < 0]) <= 0).all(), "a positive GELU of a negative x"


if __name__ == "__main__":
    main()
