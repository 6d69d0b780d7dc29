#!/usr/bin/env python3
"""Where the flash kernel's exponential polynomial comes from (src/numerics/flash/tiles.rs, exp8).

Fits p(r) = 1 + c1 r + ... + c5 r^5 to exp(r) on |r| <= ln2/2 by minimising the maximum relative
error (Lawson's iteratively reweighted least squares), rounds the coefficients to f32, then
simulates the kernel's f32 arithmetic (two-step Cody-Waite reduction, Horner in fused
multiply-adds, the exact product by 2^n) over all of [-87.3, 0] against float64's exp.

    python3 scripts/fit-exp-poly.py   # prints the coefficients and the simulated max error
"""
import numpy as np

F = np.float32


def fit(degree, half_width=np.log(2) / 2 * 1.0001):
    xs = np.cos(np.linspace(0, np.pi, 4000)) * half_width
    a = np.stack([xs**k for k in range(1, degree + 1)], 1) / np.exp(xs)[:, None]
    b = 1 - 1 / np.exp(xs)
    w = np.ones_like(xs)
    for _ in range(200):
        sw = np.sqrt(w)
        c, *_ = np.linalg.lstsq(a * sw[:, None], b * sw, rcond=None)
        err = np.abs(a @ c - b)
        w = w * err
        w /= w.sum()
    return c, err.max()


def fma(a, b, c):
    # a·b is exact in f64 for f32 a, b; one rounding to f32 (up to a rare double rounding).
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(F)


def simulate(coeffs):
    x = np.linspace(-87.3, 0, 2_000_001).astype(F)
    full = lambda v: np.full_like(x, F(v))
    t = fma(x, full(np.log2(np.e)), full(12_582_912.0))
    n = (t - F(12_582_912.0)).astype(F)
    r = fma(-n, full(0.693_359_4), x)  # LN2_HI
    r = fma(-n, full(-2.121_944_4e-4), r)  # LN2_LO
    p = full(coeffs[-1])
    for c in reversed(coeffs[:-1]):
        p = fma(p, r, full(c))
    p = fma(p, r, full(1.0))
    y = (p.astype(np.float64) * np.exp2(n.astype(np.float64))).astype(F)
    want = np.exp(x.astype(np.float64))
    normal = want > np.finfo(F).tiny
    return (np.abs(y - want) / want)[normal].max()


if __name__ == "__main__":
    c, err = fit(5)
    c32 = [F(v) for v in c]
    print("c1..c5 (f32):", ", ".join(repr(float(v)) for v in c32))
    print(f"fit's max relative error {err:.3g}; simulated in f32 over [-87.3, 0]: {simulate(c32):.3g}")
