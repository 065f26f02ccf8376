#!/usr/bin/env python3
"""Fits the piecewise polynomial of kiln's vector GELU (erf form) and prints the Rust table.

    PYTHONPATH=.pydeps python3 scripts/fit_gelu.py > /tmp/table.rs   # paste into kernels/src/math.rs

GELU(x) = x·Φ(x). With t = |x|, q(t) = Φ(-t) = erfc(t/√2)/2 is tabulated: u = t·GELU_K splits
[0, GELU_T) into 16 intervals centred on the integers 0..15 (u rounds to j, s = t·GELU_K - j in
[-0.5, 0.5], with u's rounding error added back), and on interval j q(t) ≈ Σ_k GELU_Q[k][j]·s^k (degree 7). Then
GELU(x) = x·q for x ≤ 0 and x - x·q for x > 0 (no 1 + erf cancellation), and q = 0 past GELU_T.

Each interval is fitted for relative error (minimax by Lawson's iteration on Chebyshev points),
then the coefficients are rounded to f32 one at a time from the highest degree, refitting the lower
ones after each rounding, so the f32 table keeps the f64 fit's accuracy. The last part evaluates
the f32 table exactly as the kernels do (FMA Horner) on a dense sweep against math.erfc in f64
and prints the worst relative errors.
"""
import math
import numpy as np

f32 = np.float32

T = 6.0          # past this, Φ(-t) < 1e-9: GELU(x) = x (x > 0) or -0 (x < 0)
N = 16           # intervals (one 16-lane permute per coefficient on AVX-512)
D = 7            # degree
K = float(f32((N - 0.5) / T))  # the f32 value the kernels multiply by


def q(t):
    return 0.5 * math.erfc(t / math.sqrt(2.0))


def interval_points(j, n=400):
    lo = 0.0 if j == 0 else -0.5
    k = np.arange(n)
    s = (lo + 0.5) / 2 + (0.5 - lo) / 2 * np.cos(np.pi * (k + 0.5) / n)
    t = (j + s) / K
    return s, np.array([q(v) for v in t])


def lawson(A, y, fixed_part):
    """Minimax-in-relative-error coefficients of A for y - fixed_part."""
    w = np.ones(len(y))
    rhs = (y - fixed_part) / y
    M = A / y[:, None]
    c = None
    for _ in range(60):
        sw = np.sqrt(w)
        c = np.linalg.lstsq(M * sw[:, None], rhs * sw, rcond=None)[0]
        e = np.abs(M @ c - rhs) + 1e-300
        w = w * e
        w /= w.sum()
    return c


def fit(j):
    s, y = interval_points(j)
    V = np.vander(s, D + 1, increasing=True)
    fixed = {}
    for deg in range(D, -1, -1):
        free = [k for k in range(D + 1) if k not in fixed]
        part = sum(V[:, k] * float(v) for k, v in fixed.items()) if fixed else np.zeros(len(s))
        c = lawson(V[:, free], y, part)
        fixed[deg] = f32(c[free.index(deg)])
    return [fixed[k] for k in range(D + 1)]


def fma(a, b, c):
    return f32(float(a) * float(b) + float(c))  # exact product, one rounding (as vfmadd)


def gelu32(x, table):
    x = f32(x)
    t = f32(abs(x))
    u = f32(t * f32(K))
    if not u < f32(N - 0.5):
        return x if x > 0 else f32(-0.0) * x
    j = int(np.rint(u))  # round half to even, as the magic-number add
    # s = t·K - j exactly up to one rounding: u's own rounding error (t·K - u, exact by FMA)
    # added back, or it would cost t·ulp(u)/K relative (7e-7 at x = -4).
    e = f32(float(t) * K - float(u))
    s = f32(f32(u - f32(j)) + e)
    p = table[D][j]
    for k in range(D - 1, -1, -1):
        p = fma(p, s, table[k][j])
    return fma(-x, p, x) if x > 0 else f32(x * p)


def main():
    cols = [fit(j) for j in range(N)]
    table = [[cols[j][k] for j in range(N)] for k in range(D + 1)]
    def lit(v):  # the shortest literal that reads back as this f32
        return np.format_float_scientific(f32(v), unique=True, trim="0").replace("e+", "e")

    print(f"    pub const GELU_K: f32 = {lit(K)};")
    print(f"    pub const GELU_Q: [[f32; {N}]; {D + 1}] = [")
    for row in table:
        print("        [" + ", ".join(lit(v) for v in row) + "],")
    print("    ];")
    worst = {"x > 0": (0, 0), "-4 < x <= 0": (0, 0), f"-{T} < x <= -4": (0, 0)}
    for x in np.linspace(-T, 10, 400001).astype(f32):
        r = float(x) * q(-float(x))
        if r == 0 or not f32(abs(x) * f32(K)) < f32(N - 0.5):
            continue  # past GELU_T: -0 by design
        e = abs(float(gelu32(x, table)) - r) / abs(r)
        key = "x > 0" if x > 0 else ("-4 < x <= 0" if x > -4 else f"-{T} < x <= -4")
        if e > worst[key][0]:
            worst[key] = (e, float(x))
    for k, (e, at) in worst.items():
        print(f"// {k}: max relative error {e:.2e} at {at:.4f}")


if __name__ == "__main__":
    main()
