#!/usr/bin/env python3
"""Fits the piecewise polynomial of kiln's vector GELU (erf form) and prints the Rust table.

    PYTHONPATH=.pydeps python3 scripts/fit_gelu.py > /tmp/table.rs   # paste into kernels/src/math/coeffs.rs

GELU(x) = x·Φ(x). With t = |x|, q(t) = Φ(-t) = erfc(t/√2)/2 is tabulated on [0, T) in N = 8
intervals of width T/N, so that one lookup is one 8-lane permute (vpermps ymm; on AVX-512 the
table is doubled to 16 lanes): u = fma(t, GELU_K, GELU_C) rounds to j in 1..=8, the interval
[(j-1)/K, j/K), and s = fma(t, GELU_K, -j) lies in [-1, 0] (one rounding). On interval j,
q ≈ Σ_k GELU_Q[k][j mod 8]·s^k (degree D = 9). Then GELU(x) = x·q for x ≤ 0 and x - x·q for
x > 0 (no 1 + erf cancellation), and q = 0 past T.

Each interval's polynomial is expanded at its right end, where q is smallest: q falls like
e^(-t·s/K) across an interval, and about that end its leading terms c_k·s^k share a sign, so
Horner's partial sums stay about the result's size (expanded at the centre, as with 16 intervals before, the
terms alternate and the last interval loses a factor e^(t/K) ≈ 100 of relative accuracy to f32
rounding). GELU_C = 0.5 + 2^-20 puts t = 0 at s = -1 of interval 1 (j = round-to-even of
t·K + 1/2 would give 0 there).

Each interval is fitted for relative error (minimax by Lawson's iteration on Chebyshev points),
then the coefficients are rounded to f32 one at a time from the highest degree, refitting the lower
ones after each rounding, so the f32 table keeps the f64 fit's accuracy. The last part evaluates
the f32 table exactly as the kernels do (E(s²) + s·O(s²), even and odd coefficients in two FMA
Horner chains; the leading terms share a sign, so E and s·O do too) on a dense sweep against math.erfc in f64
and prints the worst relative errors.
"""
import math
import numpy as np

f32 = np.float32

T = 6.0          # past this, Φ(-t) < 1e-9: GELU(x) = x (x > 0) or -0 (x < 0)
N = 8            # intervals (one 8-lane permute per coefficient)
D = 9            # degree
K = float(f32(N / T))          # the f32 values the kernels use
C = float(f32(0.5 + 2.0**-20))
U_END = N + 0.5  # u = t·K + C at t = T


def q(t):
    return 0.5 * math.erfc(t / math.sqrt(2.0))


def interval_points(j, n=400):
    # s in [-1, 0], a hair wider (rounding of s) except at t = 0, where s = -1 exactly.
    ext = 1.0 if j == 1 else 1.0001
    k = np.arange(n)
    s = -0.5 + 0.5 * ext * np.cos(np.pi * (k + 0.5) / n)
    t = np.maximum((j + s) / K, 0.0)
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
    u = fma(t, K, C)
    if not u < f32(U_END):
        return x if x > 0 else f32(-0.0) * x
    j = int(np.rint(u))  # round half to even, as the magic-number add
    s = fma(t, K, -j)
    # q = E(s²) + s·O(s²): even and odd coefficients as two FMA Horner chains in s², as the
    # kernels evaluate it (D odd: D + 1 coefficients, an even count).
    s2 = f32(s * s)
    e, o = table[D - 1][j % N], table[D][j % N]
    for k in range(D - 3, -1, -2):
        e = fma(e, s2, table[k][j % N])
        o = fma(o, s2, table[k + 1][j % N])
    p = fma(o, s, e)
    return fma(-x, p, x) if x > 0 else f32(x * p)


def main():
    cols = {j: fit(j) for j in range(1, N + 1)}
    # Table index j mod 8: interval 8 sits at index 0 (t = 0 is in interval 1).
    table = [[cols[i if i else N][k] for i in range(N)] for k in range(D + 1)]

    def lit(v):  # the shortest literal that reads back as this f32
        return np.format_float_scientific(f32(v), unique=True, trim="0").replace("e+", "e")

    print(f"    pub const GELU_K: f32 = {lit(K)};")
    print(f"    pub const GELU_C: f32 = {lit(C)};")
    print(f"    pub const GELU_Q: [[f32; {N}]; {D + 1}] = [")
    for row in table:
        print("        [" + ", ".join(lit(v) for v in row) + "],")
    print("    ];")
    print(f"    pub const GELU_U_END: f32 = {lit(U_END)};")
    worst = {"x > 0": (0, 0), "-4 < x <= 0": (0, 0), f"-{T} < x <= -4": (0, 0)}
    for x in np.linspace(-T, 10, 400001).astype(f32):
        r = float(x) * q(-float(x))
        if r == 0 or not fma(abs(x), K, C) < f32(U_END):
            continue  # past T: -0 by design
        e = abs(float(gelu32(x, table)) - r) / abs(r)
        key = "x > 0" if x > 0 else ("-4 < x <= 0" if x > -4 else f"-{T} < x <= -4")
        if e > worst[key][0]:
            worst[key] = (e, float(x))
    for k, (e, at) in worst.items():
        print(f"// {k}: max relative error {e:.2e} at {at:.4f}")


if __name__ == "__main__":
    main()
