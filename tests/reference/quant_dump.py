#!/usr/bin/env python3
"""Independent float64 cross-check of approx-bench's quantized-attention methods (METHODS.md §8) against a
sweep's ``trials.csv``.

A second implementation written from ``../shared/METHODS.md`` §8 (and §7.1–7.2 for grouped-query heads and
the causal mask), not from the Rust sources. Everything is numpy float64 except where §8.2 says f32 (the ggml
blocks, which go through gguf-py, llama.cpp's reference quantizer in numpy):

    formats (§8.2)   f16: numpy's float64 -> float16 cast (one round-to-nearest-even of the f64 value; the
                     self-test proves it single-rounding against an exact rational oracle on double-rounding
                     traps); bf16: round-to-nearest-even on the float64 bit pattern; E4M3 (float8_e4m3fn,
                     saturating at ±448, subnormal step 2^-9): np.frexp / np.ldexp / np.rint on the f64 value;
                     Q8_0 Q5_1 Q5_0 Q4_1 Q4_0: x -> f32 -> gguf.quants.quantize -> dequantize -> f64;
                     KIVI asymmetric and SageAttention symmetric integer groups in float64.
    kv_* (§8.3)      Ô = softmax_mask((Q̂·K̂ᵀ)/√p)·V̂, K̂ and V̂ per K/V head, Q̂ per query head (ggml: Q in Q8_0).
    sage* (§8.4)     K̃ = K − mean_n(K), Q′ = Q/√p quantized, then a literal online softmax over key blocks
                     of 64 inside query blocks of 128, P quantized against the running row max, ℓ of the
                     unquantized p.
    columns          error = ‖O − Ô‖₂ (LAPACK SVD), frob_error, cos_sim, rel_l1, rmse (§8.5, flattened n×p),
                     kv_bits (§8.3–8.4), kv_read = kv_bits/16, keys = n or (n+1)/2, mass = 1, d = 0,
                     plus exact_norm = ‖O‖₂ and rel_error, nonfinite_rows = 0.

Inputs: ``approx-bench dump-qkv`` files (q [H, n, p], k and v [H_kv, n, p]; query head h reads K/V head
⌊h·H_kv/H⌋, §7.1; H_kv is read from the shapes) with their sidecar ``<file>.json`` when present (its model_id,
layer, n and window select the CSV rows that belong to the dump; its mask is the --table default), and the
sweep's ``trials.csv``. The mask of a CSV row is its ``mask`` column (``none`` when absent or empty, as the
tool reads old files). Empty cells read as None.

For every CSV row of a §8 method (selected by --methods) on a dumped (n, window, head) it compares
  error, frob_error, rmse, rel_l1, exact_norm, rel_error: relative difference ≤ --tol (default 1e-6);
  cos_sim: 1 − cos_sim relative ≤ --tol, or |Δ| ≤ 1e-12 (cos_sim ≈ 1, so the absolute floor);
  kv_bits, kv_read, mass: |Δ| ≤ 1e-12;  keys: |Δ| ≤ 1e-9;  d = 0;  nonfinite_rows = 0;  target softmax.
A §8 method that has rows in the CSV must have a row for every dumped head of every dumped (n, window) the CSV
covers (one per mask present there). For every other row with kv_bits = 16 and keys present (§6–7
restrict-and-renormalise methods) it checks kv_read = keys·16/(16·mean_i |D_i|) (|D_i| = n, or i+1 causal)
within 1e-12. Rows it cannot compute are counted as skipped, never failures. It prints, per method, the rows
and the largest differences, then a final line. Exit 0 when every row agrees, 1 otherwise, 2 on bad input.

Precision: ``dump-qkv`` stores Q/K/V as f32 (``--dtype`` sets what they are computed in before that rounding)
while a ``--dtype f64`` sweep quantizes the f64 values. The ggml types round to f32 first, so they see the
same codes and agree to ~1e-6 (O itself moves by the f32 rounding); for the others an f32 value that lies
exactly on an f16/bf16 midpoint (about 1 in 8192 / 65536 values) or within 6e-8 of an INT8/E4M3 boundary takes
another code than its f64 original, so their rows differ by up to ~2e-2 (kv_bf16), ~2e-3 (kv_f16), ~1e-3
(sage1, sage2_8b) relative on real heads. The script says so when the dump is f32; a dump of F64 tensors
(which the loader reads) has no such gap, and only then is the default --tol meaningful for every method.

Readings of §8 where the text leaves room (the Rust side must make the same ones):
  * kv_*: Q̂ is Q quantized as it stands (Q8_0 for every ggml type; Q8_1's f16 d·Σq is left out, §8.3), and
    S = (Q̂·K̂ᵀ)/√p. kv_fp8: one scale s = max|X|/448 over the K/V head's whole n×p window, X̂ = s·E4M3(X/s),
    for K and V; Q unquantized. KIVI: K tokens [0, n − n mod 128) quantized per channel in groups of 32
    tokens from token 0, V tokens [0, max(n − 128, 0)) per token in groups of 32 channels, the rest exact;
    every query row (causal too) reads that one post-prefill cache.
  * sage*: k̄ is the mean of K over all n tokens of the K/V head (causal too); Q′ = Q/√p. sage1: one INT8
    scale per 128-row query block over its rows × p, one per 64-row key block over its rows × p (of K̃);
    V̂ = f16(V), Q_P = f16. sage2_*: per-token (per-row) scales of Q′ and K̃; V per channel, s_c = max_t|V_tc|/448
    over all n tokens; Q_P(p) = E4M3(448·p)/448. sage2_4b: q̄_b is the mean of Q′ over the rows of query block b
    (the ragged last block over its own rows), Q′ − q̄_b is INT4 per token, and the added term is q̄_b·K̃_j with
    K̃ the smoothed, unquantized K (not K̂). INT8/INT4 round half away from zero; KIVI rounds half to even.
  * Online softmax: key blocks of 64 from token 0 in order, per row m = max(m_prev, max_j S_ij) with masked
    S = −∞ (key block 0 always holds an unmasked key, so m is finite from the start), p = exp(S − m), ℓ and
    acc rescaled by exp(m_prev − m), ℓ += Σ p (unquantized), acc += Q_P(p)·V̂; Ô = acc/ℓ. Under the causal mask
    the key blocks past the diagonal are skipped (they would add nothing: p = 0 and m unchanged).
  * kv_bits: KIVI's token-averaged figure depends on n only (not on the mask); keys = (n+1)/2 under causal.

--selftest (seconds, no files): f16, bf16 and E4M3 against an exact rational round-to-nearest-even oracle on
random values and double-rounding traps (and ml_dtypes where installed); all 254 E4M3 code points round-trip,
midpoints tie to even, saturation; the five ggml types of gguf-py against §8.2's table written out in f32 on
random and adversarial blocks; every method with identity quantizers (and the online softmax) = exact attention
under both masks, ragged blocks and GQA; the online softmax with Q_P = id = the closed form on the same Ŝ; GQA
caches shared per K/V head and Q per query head; KIVI's full-precision tokens at n = 127, 128, 129; kv_bits;
the usage errors (p not a multiple of 32, f16 overflow).

With --table it prints, per dump, the mean over heads of error, cos_sim (%) and kv_read per method (the
layout of METHODS.md §8's evidence table), from this implementation alone. --selftest needs no files.

Run (from the repository root):
    B=./target/release/approx-bench
    M="--model pretrained --model-dir ../shared/data/SmolLM2-135M-Instruct-Q4_1 --corpus ../shared/data/wikitext-2/wiki.test.raw"
    $B dump-qkv $M --layer 15 --length 1024 --window 0 --dtype f64 --out /tmp/qd/l15.safetensors
    $B $M --layer 15 --lengths 1024 --windows 1 --mask causal --dtype f64 \\
       --methods kv_f16,kv_bf16,kv_fp8,kv_q8_0,kv_q5_1,kv_q5_0,kv_q4_1,kv_q4_0,kivi4,kivi2,sage1,sage2_8b,sage2_4b \\
       --out /tmp/qd/l15 --quiet
    python3 tests/reference/quant_dump.py --qkv /tmp/qd/l15.safetensors --csv /tmp/qd/l15/trials.csv --table
    python3 tests/reference/quant_dump.py --selftest

Needs numpy and gguf (pip package ``gguf``, for the five ggml types). Memory O(n²) per head (n = 2048 is
fine); n = 1024, 9 heads, 13 methods take well under a minute on one core.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import struct
import sys
import time
from collections import defaultdict
from fractions import Fraction

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

try:  # llama.cpp's reference quantizer in numpy (§8.2: "gguf-py ... is the cross-check")
    import gguf.quants as _gq  # noqa: E402
    from gguf import GGMLQuantizationType as _GT  # noqa: E402
except ImportError:  # pragma: no cover - reported where needed
    _gq = None
    _GT = None

QB, KB = 128, 64  # SageAttention query and key blocks (§8.4)
G, R = 32, 128  # KIVI group and residual (§8.3); also the ggml block along p
E4M3_MAX = 448.0


class UsageError(Exception):
    """What the tool reports as a usage error (§8.1/§8.2): the method is refused on these inputs."""


# ------------------------------------------------------------------------------------------
# input (loader as in prefill_dump.py)


def load_safetensors(path: str) -> dict[str, np.ndarray]:
    dtypes = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "U32": "<u4", "U8": "u1"}
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        s, e = info["data_offsets"]
        arr = np.frombuffer(raw[8 + hlen + s: 8 + hlen + e], dtype=dtypes[info["dtype"]])
        out[name] = arr.reshape(info["shape"])
    return out


# ------------------------------------------------------------------------------------------
# number formats (§8.2)


def _range_check_f16(y16: np.ndarray, x: np.ndarray, name: str) -> None:
    bad = ~np.isfinite(y16) & np.isfinite(x)
    if bad.any():
        raise UsageError(f"{name} overflows f16: largest |value| {float(np.max(np.abs(x))):.6g} ≥ 65520")


def f16(x, name: str = "x") -> np.ndarray:
    """binary16, one round-to-nearest-even of the float64 value. numpy's double -> half conversion works on
    the double's bits (npy_doublebits_to_halfbits), never through f32; selftest_formats proves it on
    double-rounding traps against the exact rational oracle rne_exact."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore"):
        y = x.astype(np.float16)
    _range_check_f16(y, x, name)
    return y.astype(np.float64)


def bf16(x) -> np.ndarray:
    """bfloat16 (8-bit exponent like f32, 7 stored mantissa bits): one round-to-nearest-even of the float64
    bit pattern, i.e. drop the low 45 of the 52 mantissa bits with ties to even. Below bf16's normal range
    (2^-126) the quantum is 2^-133 (bf16 subnormals); values that round past the largest finite bf16
    (2^127·(2 − 2^-7)) become ±inf, as f32 would."""
    x = np.asarray(x, dtype=np.float64)
    bits = x.view(np.uint64)
    drop = np.uint64(45)
    lsb = (bits >> drop) & np.uint64(1)
    r = (bits + (np.uint64((1 << 44) - 1) + lsb)) & ~np.uint64((1 << 45) - 1)  # + half − 1 + lsb, truncate
    y = r.view(np.float64).copy()
    fin = np.isfinite(x)
    y = np.where(fin, y, x)
    tiny = fin & (np.abs(x) < 2.0 ** -126)  # bf16 subnormal range: a fixed quantum 2^-133
    if tiny.any():
        y = np.where(tiny, np.ldexp(np.rint(np.ldexp(x, 133)), -133), y)
    big = fin & (np.abs(y) >= 2.0 ** 128)
    if big.any():
        y = np.where(big, np.copysign(np.inf, x), y)
    return y


def round_minifloat(x, mbits: int, emin: int) -> np.ndarray:
    """Round float64 x to a binary format with mbits stored mantissa bits and minimum normal exponent emin
    (no upper bound: the caller saturates or overflows): one round-to-nearest-even via frexp/ldexp/rint.
    For |x| in [2^e, 2^(e+1)) the quantum is 2^(max(e, emin) − mbits)."""
    x = np.asarray(x, dtype=np.float64)
    _, e = np.frexp(x)  # x = m·2^e, 0.5 ≤ |m| < 1: |x| in [2^(e−1), 2^e)
    E = np.maximum(e - 1, emin)
    return np.ldexp(np.rint(np.ldexp(x, mbits - E)), E - mbits)  # scalings by 2^k are exact


def e4m3(x) -> np.ndarray:
    """float8_e4m3fn, saturating: |x| > 448 -> ±448 (448 is a code, so clipping first and rounding is the
    same as rounding and clipping); normals 2^-6..448 with 3 mantissa bits, subnormals in steps of 2^-9."""
    x = np.clip(np.asarray(x, dtype=np.float64), -E4M3_MAX, E4M3_MAX)
    return round_minifloat(x, 3, -6)


def scaled_e4m3(x: np.ndarray, s) -> np.ndarray:
    """x̂ = s·E4M3(x/s); s = 0 (an all-zero head or channel) gives x̂ = 0."""
    s = np.asarray(s, dtype=np.float64)
    safe = np.where(s == 0, 1.0, s)
    return np.where(s == 0, 0.0, safe * e4m3(x / safe))


GGML_BITS = {"q8_0": 8.5, "q5_1": 6.0, "q5_0": 5.5, "q4_1": 5.0, "q4_0": 4.5}


def ggml(x: np.ndarray, qtype: str, name: str = "x") -> np.ndarray:
    """One ggml type along the last axis (blocks of 32): x rounded to f32 (the cache write), gguf-py's
    quantize + dequantize (f32 arithmetic, f16 scales), widened to f64."""
    if _gq is None:
        raise UsageError("the ggml types need the pip package gguf (gguf-py)")
    x32 = np.ascontiguousarray(np.asarray(x, dtype=np.float64).astype(np.float32))
    t = getattr(_GT, qtype.upper())
    with np.errstate(over="ignore", invalid="ignore"):
        y = _gq.dequantize(_gq.quantize(x32, t), t)
    if not np.isfinite(y).all():
        raise UsageError(f"{name} in {qtype}: a block's f16 scale or offset overflows "
                         f"(largest |value| {float(np.max(np.abs(x32))):.6g})")
    return np.asarray(y, dtype=np.float32).reshape(x32.shape).astype(np.float64)


def round_half_away(y: np.ndarray) -> np.ndarray:
    """round(y) with halves away from zero (C roundf), exact: floor(|y| + 0.5) would misround
    0.49999999999999994 because the sum rounds."""
    a = np.abs(y)
    f = np.floor(a)
    return np.copysign(f + (a - f >= 0.5), y)


def sym_quant(x: np.ndarray, qmax: int, axis) -> np.ndarray:
    """SageAttention symmetric groups: s = max|x|/Q_max over `axis`; q = clamp(round_half_away(x/s), ±Q_max);
    x̂ = s·q; s = 0 -> 0."""
    s = np.max(np.abs(x), axis=axis, keepdims=True) / qmax
    safe = np.where(s == 0, 1.0, s)
    q = np.clip(round_half_away(x / safe), -qmax, qmax)
    return np.where(s == 0, 0.0, safe * q)


def asym_quant(x: np.ndarray, b: int, axis) -> np.ndarray:
    """KIVI asymmetric groups: mn, mx over `axis`, s = (mx − mn)/(2^b − 1),
    q = round_half_even(clamp((x − mn)/s, 0, 2^b − 1)), x̂ = q·s + mn; x̂ = mn when s = 0."""
    top = (1 << b) - 1
    mn = np.min(x, axis=axis, keepdims=True)
    mx = np.max(x, axis=axis, keepdims=True)
    s = (mx - mn) / top
    safe = np.where(s == 0, 1.0, s)
    q = np.rint(np.clip((x - mn) / safe, 0, top))
    return np.where(s == 0, mn, q * safe + mn)


# ------------------------------------------------------------------------------------------
# quantizers, as one object so that --selftest can swap them all for the identity


class Fmt:
    identity = False

    def f16(self, x, name="x"):
        return f16(x, name)

    def bf16(self, x, name="x"):
        return bf16(x)

    def fp8_tensor(self, x, name="x"):  # kv_fp8: one scale per K/V head's window
        return scaled_e4m3(x, np.max(np.abs(x)) / E4M3_MAX)

    def fp8_channels(self, x, name="x"):  # sage2 V: one scale per channel over the head's tokens
        return scaled_e4m3(x, np.max(np.abs(x), axis=0, keepdims=True) / E4M3_MAX)

    def ggml(self, x, t, name="x"):
        return ggml(x, t, name)

    def sym(self, x, qmax, axis):
        return sym_quant(x, qmax, axis)

    def asym(self, x, b, axis):
        return asym_quant(x, b, axis)

    def qp_f16(self, p):  # sage1: Q_P(p) = f16(p)
        return f16(p, "P")

    def qp_e4m3(self, p):  # sage2: Q_P(p) = E4M3(448·p)/448
        return e4m3(E4M3_MAX * p) / E4M3_MAX


class IdentityFmt(Fmt):
    """Every quantizer replaced by the identity: every method must reproduce exact attention."""
    identity = True

    def f16(self, x, name="x"):
        return np.asarray(x, dtype=np.float64)

    bf16 = f16

    def fp8_tensor(self, x, name="x"):
        return x

    fp8_channels = fp8_tensor

    def ggml(self, x, t, name="x"):
        return np.asarray(x, dtype=np.float64)

    def sym(self, x, qmax, axis):
        return x

    def asym(self, x, b, axis):
        return x

    def qp_f16(self, p):
        return p

    qp_e4m3 = qp_f16


def kivi_k(fmt: Fmt, K: np.ndarray, b: int) -> np.ndarray:
    """K per channel: tokens [0, n − n mod R) in groups of G consecutive tokens from token 0; the last
    n mod R tokens stay full precision."""
    n, p = K.shape
    nq = n - n % R
    out = K.copy()
    if nq:
        out[:nq] = fmt.asym(K[:nq].reshape(nq // G, G, p), b, axis=1).reshape(nq, p)
    return out


def kivi_v(fmt: Fmt, V: np.ndarray, b: int) -> np.ndarray:
    """V per token: each token's p channels in groups of G; the last R tokens (all of V when n ≤ R) stay
    full precision."""
    n, p = V.shape
    nq = max(n - R, 0)
    out = V.copy()
    if nq:
        out[:nq] = fmt.asym(V[:nq].reshape(nq, p // G, G), b, axis=2).reshape(nq, p)
    return out


def kivi_bits(n: int, b: int) -> float:
    """§8.3: residual tokens 16 bits, quantized ones b + 32/G = b + 1; mean of K's and V's token averages."""
    kq = n - n % R
    vq = max(n - R, 0)
    k = (kq * (b + 1) + (n - kq) * 16) / n
    v = (vq * (b + 1) + (n - vq) * 16) / n
    return (k + v) / 2


# ------------------------------------------------------------------------------------------
# the methods (§8.3, §8.4)

KV_METHODS = ["kv_f16", "kv_bf16", "kv_fp8", "kv_q8_0", "kv_q5_1", "kv_q5_0", "kv_q4_1", "kv_q4_0",
              "kivi4", "kivi2"]
SAGE_METHODS = ["sage1", "sage2_8b", "sage2_4b"]
METHODS = KV_METHODS + SAGE_METHODS
NEEDS_32 = {m for m in METHODS if m.startswith("kv_q") or m.startswith("kivi")}


def kv_bits(method: str, n: int) -> float:
    if method in ("kv_f16", "kv_bf16"):
        return 16.0
    if method == "kv_fp8":
        return 8.0
    if method.startswith("kv_q"):
        return GGML_BITS[method[3:]]
    if method.startswith("kivi"):
        return kivi_bits(n, int(method[4:]))
    return {"sage1": 12.0, "sage2_8b": 8.0, "sage2_4b": 6.0}[method]


def causal_mask(n: int) -> np.ndarray:
    return np.tril(np.ones((n, n), dtype=bool))


def masked_softmax_av(S: np.ndarray, V: np.ndarray, causal: bool) -> np.ndarray:
    if causal:
        S = np.where(causal_mask(S.shape[0]), S, -np.inf)
    m = S.max(axis=1, keepdims=True)
    E = np.exp(S - m)
    return (E @ V) / E.sum(axis=1, keepdims=True)


def kv_prepare(method: str, fmt: Fmt, K: np.ndarray, V: np.ndarray):
    """K̂, V̂ of one K/V head (the cache holds K/V heads)."""
    p = K.shape[1]
    if method in NEEDS_32 and p % G:
        raise UsageError(f"{method}: the head dimension p = {p} is not a multiple of 32")
    if method == "kv_f16":
        return fmt.f16(K, "K"), fmt.f16(V, "V")
    if method == "kv_bf16":
        return fmt.bf16(K, "K"), fmt.bf16(V, "V")
    if method == "kv_fp8":
        return fmt.fp8_tensor(K, "K"), fmt.fp8_tensor(V, "V")
    if method.startswith("kv_q"):
        t = method[3:]
        return fmt.ggml(K, t, "K"), fmt.ggml(V, t, "V")
    if method.startswith("kivi"):
        b = int(method[4:])
        return kivi_k(fmt, K, b), kivi_v(fmt, V, b)
    raise KeyError(method)


def kv_query(method: str, fmt: Fmt, Q: np.ndarray) -> np.ndarray:
    """Q̂ of one query head: f16/bf16 for those caches, the K type's dot type for ggml (Q8_0; Q8_1 for
    Q5_1/Q4_1 has Q8_0's values), unquantized for kv_fp8 and KIVI."""
    if method == "kv_f16":
        return fmt.f16(Q, "Q")
    if method == "kv_bf16":
        return fmt.bf16(Q, "Q")
    if method.startswith("kv_q"):
        return fmt.ggml(Q, "q8_0", "Q")
    return Q


def kv_attention(Qh: np.ndarray, Kh: np.ndarray, Vh: np.ndarray, causal: bool) -> np.ndarray:
    """softmax((Q̂·K̂ᵀ)/√p)·V̂: 1/√p after the dot product (llama.cpp's `scale` after vec_dot)."""
    p = Qh.shape[1]
    return masked_softmax_av((Qh @ Kh.T) / math.sqrt(p), Vh, causal)


def sage_prepare(method: str, fmt: Fmt, K: np.ndarray, V: np.ndarray) -> dict:
    """Per K/V head: K̃ = K − k̄ (k̄ the mean over all n tokens, whatever the mask), K̂ and V̂."""
    n, p = K.shape
    Kt = K - K.mean(axis=0, keepdims=True)
    if method == "sage1":  # INT8 per 64-row key block (one scale over the block's rows × p)
        Kh = np.empty_like(Kt)
        for j0 in range(0, n, KB):
            Kh[j0:j0 + KB] = fmt.sym(Kt[j0:j0 + KB], 127, axis=None)
        Vh = fmt.f16(V, "V")
    else:  # INT8 / INT4 per token; V per channel in E4M3
        Kh = fmt.sym(Kt, 127 if method == "sage2_8b" else 7, axis=1)
        Vh = fmt.fp8_channels(V, "V")
    return {"Kt": Kt, "Kh": Kh, "Vh": Vh}


def sage_attention(method: str, fmt: Fmt, Q: np.ndarray, kv: dict, causal: bool) -> np.ndarray:
    """The kernel's online softmax, literally: per query block of QB rows (vectorised over its rows), key
    blocks of KB in order (causal: up to the diagonal), m⁽ᶜ⁾ = max(m⁽ᶜ⁻¹⁾, max_j S_ij) with masked S = −∞,
    p = exp(S − m⁽ᶜ⁾), ℓ ← ℓ·α + Σp (unquantized), acc ← acc·α + Q_P(p)·V̂, α = exp(m⁽ᶜ⁻¹⁾ − m⁽ᶜ⁾);
    Ô = acc/ℓ."""
    n, p = Q.shape
    Kt, Kh, Vh = kv["Kt"], kv["Kh"], kv["Vh"]
    Qp = Q / math.sqrt(p)  # 1/√p folded into Q′ before quantizing
    qp = fmt.qp_f16 if method == "sage1" else fmt.qp_e4m3
    out = np.empty((n, Vh.shape[1]))
    for i0 in range(0, n, QB):
        i1 = min(i0 + QB, n)
        rows = Qp[i0:i1]
        bias = None
        if method == "sage1":  # INT8, one scale over the block's rows × p
            Qh = fmt.sym(rows, 127, axis=None)
        elif method == "sage2_8b":  # INT8 per token
            Qh = fmt.sym(rows, 127, axis=1)
        else:  # sage2_4b: smooth Q per block, INT4 per token, q̄_b·K̃_j unquantized
            qbar = rows.mean(axis=0)
            Qh = fmt.sym(rows - qbar, 7, axis=1)
            bias = Kt @ qbar  # [n]
        ii = np.arange(i0, i1)[:, None]
        m = np.full(i1 - i0, -np.inf)
        ell = np.zeros(i1 - i0)
        acc = np.zeros((i1 - i0, Vh.shape[1]))
        for j0 in range(0, n, KB):
            if causal and j0 > i1 - 1:
                break  # key blocks up to the diagonal
            j1 = min(j0 + KB, n)
            S = Qh @ Kh[j0:j1].T
            if bias is not None:
                S = S + bias[j0:j1]
            if causal:
                S = np.where(np.arange(j0, j1)[None, :] <= ii, S, -np.inf)
            m_new = np.maximum(m, S.max(axis=1))
            alpha = np.exp(m - m_new)  # block 0: exp(−∞) = 0
            P = np.exp(S - m_new[:, None])
            ell = ell * alpha + P.sum(axis=1)
            acc = acc * alpha[:, None] + qp(P) @ Vh[j0:j1]
            m = m_new
        out[i0:i1] = acc / ell[:, None]
    return out


# ------------------------------------------------------------------------------------------
# heads and metrics


def metrics(O: np.ndarray, Oh: np.ndarray) -> dict:
    E = O - Oh
    nO, nH = np.linalg.norm(O), np.linalg.norm(Oh)
    one_minus_cos = 0.5 * float(np.sum((O / nO - Oh / nH) ** 2))  # 1 − cos without the cancellation
    return {
        "error": float(np.linalg.norm(E, 2)),
        "frob_error": float(np.linalg.norm(E)),
        "cos_sim": float(np.sum(O * Oh) / (nO * nH)),
        "one_minus_cos": one_minus_cos,
        "rel_l1": float(np.abs(E).sum() / np.abs(O).sum()),
        "rmse": float(math.sqrt(np.mean(E * E))),
        "nonfinite_rows": int((~np.isfinite(Oh).all(axis=1)).sum()),
    }


class Group:
    """One K/V head (shared by its query heads): its quantized caches, per method."""

    def __init__(self, K, V, fmt: Fmt):
        self.K = np.asarray(K, dtype=np.float64)
        self.V = np.asarray(V, dtype=np.float64)
        self.fmt = fmt
        self.cache = {}

    def prepared(self, method: str):
        if method not in self.cache:
            try:
                if method in SAGE_METHODS:
                    self.cache[method] = sage_prepare(method, self.fmt, self.K, self.V)
                else:
                    self.cache[method] = kv_prepare(method, self.fmt, self.K, self.V)
            except UsageError as e:
                self.cache[method] = e
        r = self.cache[method]
        if isinstance(r, UsageError):
            raise r
        return r


class Head:
    def __init__(self, q, group: Group):
        self.Q = np.asarray(q, dtype=np.float64)
        self.g = group
        self.n, self.p = self.Q.shape
        self._O = {}
        self._res = {}

    def O(self, causal: bool) -> np.ndarray:
        if causal not in self._O:
            self._O[causal] = masked_softmax_av(self.Q @ self.g.K.T / math.sqrt(self.p), self.g.V, causal)
        return self._O[causal]

    def approx(self, method: str, causal: bool) -> np.ndarray:
        fmt = self.g.fmt
        if method in SAGE_METHODS:
            return sage_attention(method, fmt, self.Q, self.g.prepared(method), causal)
        Kh, Vh = self.g.prepared(method)
        return kv_attention(kv_query(method, fmt, self.Q), Kh, Vh, causal)

    def result(self, method: str, causal: bool) -> dict:
        """All columns of a §8 row (raises UsageError where the tool refuses the method)."""
        key = (method, causal)
        if key not in self._res:
            try:
                O = self.O(causal)
                r = metrics(O, self.approx(method, causal))
                r["exact_norm"] = float(np.linalg.norm(O, 2))
                r["rel_error"] = r["error"] / r["exact_norm"]
                r["kv_bits"] = kv_bits(method, self.n)
                r["kv_read"] = r["kv_bits"] / 16
                r["keys"] = (self.n + 1) / 2 if causal else float(self.n)
                r["mass"] = 1.0
                self._res[key] = r
            except UsageError as e:
                self._res[key] = e
        r = self._res[key]
        if isinstance(r, UsageError):
            raise r
        return r


def make_heads(q, k, v, fmt: Fmt) -> list[Head]:
    H, Hkv = q.shape[0], k.shape[0]
    groups = [Group(k[g], v[g], fmt) for g in range(Hkv)]
    return [Head(q[h], groups[h * Hkv // H]) for h in range(H)]


# ------------------------------------------------------------------------------------------
# self-test (no files)


def rne_exact(x: float, mbits: int, emin: int, maxfinite: float, saturate: bool) -> float:
    """Exact rational round-to-nearest-even of x (a float64) to a binary format: the oracle."""
    if x == 0 or not math.isfinite(x):
        return x
    a = abs(Fraction(x))
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    assert Fraction(2) ** e <= a < Fraction(2) ** (e + 1)
    quantum = Fraction(2) ** (max(e, emin) - mbits)
    r = a / quantum
    fl = r.numerator // r.denominator
    rem = r - fl
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and fl % 2):
        fl += 1
    val = fl * quantum
    if val > Fraction(maxfinite):
        val = Fraction(maxfinite) if saturate else None
    out = math.inf if val is None else float(val)
    return math.copysign(out, x)


F16_SPEC = (10, -14, 65504.0, False)
BF16_SPEC = (7, -126, float.fromhex("0x1.fep127"), False)
E4M3_SPEC = (3, -6, 448.0, True)


def e4m3_decode(code: int) -> float | None:
    s, e, m = code >> 7, (code >> 3) & 15, code & 7
    if e == 15 and m == 7:
        return None  # NaN
    v = (m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -v if s else v


def selftest_formats(check) -> None:
    rng = np.random.default_rng(7)
    # double-rounding traps: a value just past a midpoint of the target, whose f32 rounding lands exactly on
    # the midpoint (then ties-to-even goes the other way), or just short of one that f32 rounds up onto it.
    def traps(mbits, emin, emax):
        out = []
        for e in (emin, emin + 3, 0, 1, emax - 1):
            for m in (0, 1, 2, 5, (1 << mbits) - 2):
                base = (1 + m / 2 ** mbits) * 2.0 ** e
                mid = base + 2.0 ** (e - mbits - 1)
                for t in (2.0 ** (e - 40), -(2.0 ** (e - 40))):
                    out += [mid + t, -(mid + t)]
            sub = 2.0 ** (emin - mbits) * 2.5  # subnormal midpoint (a tie to even, 2)
            out += [sub, sub + 2.0 ** (emin - 60), sub - 2.0 ** (emin - 60)]
        return np.array(out)

    for name, fn, spec, emax in (("f16", lambda x: f16(x), F16_SPEC, 15), ("bf16", bf16, BF16_SPEC, 127),
                                 ("E4M3", e4m3, E4M3_SPEC, 8)):
        mbits, emin, mx, sat = spec
        t = traps(mbits, emin, emax)
        t = t[np.abs(t) <= mx]
        vals = np.concatenate([t, rng.standard_normal(2000) * 2.0 ** rng.integers(emin - 4, min(emax, 20), 2000),
                               [0.0, -0.0, mx, -mx, 2.0 ** (emin - mbits), 2.0 ** (emin - mbits - 1),
                                2.0 ** (emin - mbits - 1) * 1.0000001]])
        if name != "f16":
            vals = np.concatenate([vals, [mx * 1.001, -mx * 1.01, 1e30 if name == "E4M3" else 3e38]])
        with np.errstate(over="ignore"):
            got = fn(vals)
        want = np.array([rne_exact(float(v), mbits, emin, mx, sat) for v in vals])
        bad = int(np.sum(got != want))
        check(bad == 0, f"{name}: one RNE of the f64 value on {len(vals)} values ({len(t)} double-rounding traps)"
                        f": {bad} differ from the exact rational oracle")
        # a via-f32 path must differ on the traps (the traps are real traps)
        # the traps are real: rounding through f32 (f16 for E4M3) first gives another value on many of them
        via = (f16(t.astype(np.float32)) if name == "f16" else bf16(t.astype(np.float32).astype(np.float64))
               if name == "bf16" else e4m3(t.astype(np.float16).astype(np.float64)))
        nvia = int(np.sum(via != want[:len(t)]))
        check(nvia > 0, f"{name}: a double rounding differs on {nvia} of the {len(t)} traps")
    check(f16(np.array([1 + 2 ** -11 + 2 ** -40]))[0] == 1 + 2 ** -10,
          "f16(1 + 2^-11 + 2^-40) = 1 + 2^-10 (through f32 it would be 1)")
    check(bf16(np.array([1 + 2 ** -8 + 2 ** -40]))[0] == 1 + 2 ** -7,
          "bf16(1 + 2^-8 + 2^-40) = 1 + 2^-7 (through f32 it would be 1)")
    # bf16 bits against the frexp path (normal range)
    x = rng.standard_normal(100000) * 2.0 ** rng.integers(-60, 60, 100000)
    check(np.array_equal(bf16(x), round_minifloat(x, 7, -126)), "bf16 bit path = frexp/ldexp/rint path (1e5 values)")
    # E4M3: every code point round-trips, midpoints tie to even, saturation, subnormal step
    codes = [(c, e4m3_decode(c)) for c in range(256)]
    finite = [(c, v) for c, v in codes if v is not None]
    rt = all(e4m3(np.array([v]))[0] == v for _, v in finite)
    check(rt and len(finite) == 254, f"E4M3: all {len(finite)} non-NaN code points round-trip")
    pos = sorted({v for _, v in finite if v >= 0})
    mids = [(a + b) / 2 for a, b in zip(pos, pos[1:])]
    # pos[i] is code i (0x00..0x7E in order), so the even neighbour of a midpoint has the even code
    even = [pos[i] if i % 2 == 0 else pos[i + 1] for i in range(len(mids))]
    got = e4m3(np.array(mids))
    check(np.array_equal(got, np.array(even)) and np.array_equal(e4m3(-np.array(mids)), -np.array(even)),
          f"E4M3: all {len(mids)} positive midpoints (and their negatives) tie to the even code")
    check(np.array_equal(e4m3(np.array([448.0, 449.0, 464.0, 1e9, -500.0])), np.array([448, 448, 448, 448, -448.0])),
          "E4M3 saturates: 449, 464, 1e9 -> 448, −500 -> −448")
    check(pos[1] == 2.0 ** -9 and pos[8] == 2.0 ** -6 and pos[-1] == 448.0, "E4M3: subnormal step 2^-9, min normal 2^-6")
    try:
        import ml_dtypes  # optional third opinion on values that are exactly f32

        xs = (rng.standard_normal(200000) * 2.0 ** rng.integers(-12, 9, 200000)).astype(np.float32)
        xs = xs[np.abs(xs) <= 448]
        ref = xs.astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
        check(np.array_equal(e4m3(xs.astype(np.float64)), ref), f"E4M3 = ml_dtypes.float8_e4m3fn on {len(xs)} f32 values")
        ref = xs.astype(ml_dtypes.bfloat16).astype(np.float64)
        check(np.array_equal(bf16(xs.astype(np.float64)), ref), f"bf16 = ml_dtypes.bfloat16 on {len(xs)} f32 values")
    except ImportError:
        print("[INFO] ml_dtypes not installed: no third-party E4M3/bf16 comparison")
    # symmetric/asymmetric helpers
    check(np.array_equal(round_half_away(np.array([0.5, -0.5, 1.5, 2.5, 0.49999999999999994, -2.5000000000000004])),
                         np.array([1, -1, 2, 3, 0, -3.0])), "round_half_away: halves away from zero, exact")
    check(np.array_equal(asym_quant(np.array([[0.0, 0.5, 1.5, 3.0]]), 2, axis=1), np.array([[0.0, 0.0, 2.0, 3.0]])),
          "KIVI asym: s = 1 at b = 2, round half even (0.5 -> 0, 1.5 -> 2)")
    check(np.array_equal(asym_quant(np.full((1, 4), 2.5), 4, axis=1), np.full((1, 4), 2.5)), "KIVI asym: s = 0 -> mn")
    check(np.array_equal(sym_quant(np.array([[7.0, 0.5, -0.5, 3.5, 0.0]]), 7, axis=1), np.array([[7.0, 1, -1, 4, 0]])),
          "Sage sym INT4: s = 1, half away from zero; all-zero group -> 0")


def ggml_spec(x: np.ndarray, t: str) -> np.ndarray:
    """§8.2's table written out in f32 (blocks of 32 on the last axis), to test gguf-py."""
    f = np.float32
    b = x.astype(f).reshape(-1, 32)
    h = lambda v: v.astype(np.float16).astype(f)  # noqa: E731  f16(·) storage, widened to f32
    with np.errstate(divide="ignore"):
        if t in ("q8_0",):
            d = np.abs(b).max(axis=1, keepdims=True) / f(127)
            idv = np.where(d == 0, f(0), f(1) / d).astype(f)
            y = (b * idv).astype(f)
            q = np.copysign(np.floor(np.abs(y)) + (np.abs(y) - np.floor(np.abs(y)) >= f(0.5)), y).astype(f)
            out = h(d) * q
        elif t in ("q5_1", "q4_1"):
            top = f(31 if t == "q5_1" else 15)
            mx, mn = b.max(axis=1, keepdims=True), b.min(axis=1, keepdims=True)
            d = (mx - mn) / top
            idv = np.where(d == 0, f(0), f(1) / d).astype(f)
            q = np.minimum(top, np.trunc(((b - mn) * idv + f(0.5)).astype(f)))
            out = (h(d) * q).astype(f) + h(mn)
        else:
            half = f(16 if t == "q5_0" else 8)
            top = f(31 if t == "q5_0" else 15)
            xmax = np.take_along_axis(b, np.abs(b).argmax(axis=1)[:, None], axis=1)
            d = xmax / -half
            idv = np.where(d == 0, f(0), f(1) / d).astype(f)
            q = np.minimum(top, np.trunc((b * idv + (half + f(0.5))).astype(f)))
            out = h(d) * (q - half)
    return out.astype(f).reshape(x.shape)


def selftest_ggml(check) -> None:
    if _gq is None:
        check(False, "gguf-py (pip package gguf) is importable")
        return
    rng = np.random.default_rng(11)
    blocks = [rng.standard_normal((400, 32)) * 10.0 ** rng.uniform(-3, 2, (400, 1)),
              np.zeros((1, 32)), np.full((1, 32), 1.7), np.full((1, 32), -3.25)]
    one = np.zeros((3, 32))
    one[0, 5], one[1, 31], one[2, 0] = 100.0, -7.0, 1e-3
    one[:, 10] += 0.01
    ties = np.tile(np.arange(32) - 15.5, (1, 1)).astype(np.float64)  # ±.5 values, with exact d = 1 cases
    ties2 = np.concatenate([[127.0], np.arange(31) + 0.5])[None, :]
    ties3 = np.concatenate([[-8.0], (np.arange(31) % 16) - 7.5])[None, :]
    ties4 = np.concatenate([[-16.0], (np.arange(31) % 32) - 15.5])[None, :]
    blocks += [one, ties, ties2, ties3, ties4, rng.standard_normal((50, 32)).astype(np.float32).astype(np.float64)]
    X = np.concatenate(blocks)
    for t in GGML_BITS:
        a, b = ggml(X, t), ggml_spec(X, t).astype(np.float64)
        check(np.array_equal(a, b), f"{t}: gguf-py = §8.2's table in f32 on {len(X)} random and adversarial blocks "
                                    f"({int(np.sum(np.any(a != b, axis=1)))} blocks differ)")
    # §8.1: for p = 64 scaling by 1/8 before or after gives the same codes
    q = rng.standard_normal((20, 64))
    check(np.array_equal(ggml(q / 8, "q8_0"), ggml(q, "q8_0") / 8), "Q8_0 codes of Q/8 = codes of Q (p = 64)")


def random_problem(rng, H, Hkv, n, p, sink=True):
    q = rng.standard_normal((H, n, p)) * 1.5
    k = rng.standard_normal((Hkv, n, p)) * 1.5 + rng.standard_normal((Hkv, 1, p)) * 2  # channel offsets
    v = rng.standard_normal((Hkv, n, p))
    if sink:
        k[:, 0] *= 0.2
        q[:, :, :4] += 3
    return q, k, v


def selftest_methods(check) -> None:
    rng = np.random.default_rng(3)
    # identity quantizers: exact attention, both masks, ragged blocks, GQA
    for n in (200, 64, 129):
        q, k, v = random_problem(rng, 4, 2, n, 64)
        heads = make_heads(q, k, v, IdentityFmt())
        worst = 0.0
        for causal in (False, True):
            for h in heads:
                O = h.O(causal)
                for m in METHODS:
                    worst = max(worst, float(np.max(np.abs(h.approx(m, causal) - O))))
        check(worst < 1e-12, f"identity quantizers, n = {n}: all 13 methods (online softmax included) = exact "
                             f"attention under both masks (max |Δ| {worst:.1e})")
    # the online softmax with Q_P = identity but real Q/K/V quantizers = the closed form on the same Ŝ
    q, k, v = random_problem(rng, 2, 1, 300, 64)
    h = make_heads(q, k, v, Fmt())[0]

    class OnlyP(Fmt):
        def qp_f16(self, p):
            return p
        qp_e4m3 = qp_f16
    for m in SAGE_METHODS:
        for causal in (False, True):
            g = Group(k[0], v[0], OnlyP())
            kv = g.prepared(m)
            Qp = h.Q / 8
            if m == "sage1":
                S = np.concatenate([sym_quant(Qp[i:i + QB], 127, None) for i in range(0, 300, QB)]) @ kv["Kh"].T
            elif m == "sage2_8b":
                S = sym_quant(Qp, 127, 1) @ kv["Kh"].T
            else:
                S = np.concatenate([sym_quant(Qp[i:i + QB] - Qp[i:i + QB].mean(0), 7, 1) @ kv["Kh"].T
                                    + (kv["Kt"] @ Qp[i:i + QB].mean(0))[None, :] for i in range(0, 300, QB)])
            ref = masked_softmax_av(S, kv["Vh"], causal)
            d = float(np.max(np.abs(sage_attention(m, OnlyP(), h.Q, kv, causal) - ref)))
            check(d < 1e-12, f"{m} {'causal' if causal else 'none'}: online softmax with Q_P = id = closed form "
                             f"on the same Ŝ, V̂ ({d:.1e})")
    # GQA: query heads of one group read one K̂/V̂; Q per query head, K/V per K/V head
    q, k, v = random_problem(rng, 4, 2, 160, 64)
    heads = make_heads(q, k, v, Fmt())
    same = heads[0].g is heads[1].g and heads[2].g is heads[3].g and heads[0].g is not heads[2].g
    eq = True
    for m in METHODS:
        a = heads[0].g.prepared(m)
        b = Group(k[0], v[0], Fmt()).prepared(m)  # quantized afresh from the K/V head alone
        pa = a if isinstance(a, tuple) else (a["Kh"], a["Vh"])
        pb = b if isinstance(b, tuple) else (b["Kh"], b["Vh"])
        eq &= all(np.array_equal(x, y) for x, y in zip(pa, pb))
    check(same and eq, "GQA: query heads 0 and 1 read one K̂/V̂ (that of K/V head 0, quantized from it alone)")
    q2, k2 = q.copy(), k.copy()
    q2[1] *= 37.0  # another query head of the same group
    k2[1] *= 23.0  # the other K/V head
    heads2 = make_heads(q2, k2, v, Fmt())
    ok = all(np.array_equal(heads[0].approx(m, c), heads2[0].approx(m, c)) for m in METHODS for c in (False, True))
    check(ok, "Q quantized per query head, K/V per K/V head: rescaling another query head or the other K/V head "
              "leaves head 0's Ô bit-identical")
    # KIVI boundaries
    for n, kfull, vfull in ((127, range(0, 127), range(0, 127)), (128, range(0), range(0, 128)),
                            (129, range(128, 129), range(1, 129))):
        K = rng.standard_normal((n, 64))
        Vv = rng.standard_normal((n, 64))
        kh, vh = kivi_k(Fmt(), K, 2), kivi_v(Fmt(), Vv, 2)
        kf = set(np.flatnonzero((kh == K).all(axis=1)))
        vf = set(np.flatnonzero((vh == Vv).all(axis=1)))
        check(kf == set(kfull) and vf == set(vfull),
              f"KIVI n = {n}: full-precision K tokens {rng_str(kfull)}, V tokens {rng_str(vfull)}")
    check(abs(kivi_bits(2048, 2) - 3.40625) < 1e-15 and abs(kivi_bits(2048, 2) / 16 - 0.2129) < 1e-4,
          f"kivi2 at n = 2048: kv_bits {kivi_bits(2048, 2)} (§8.3: 3.41), kv_read {kivi_bits(2048, 2) / 16:.4f}")
    check([kv_bits(m, 1024) for m in METHODS] == [16, 16, 8, 8.5, 6, 5.5, 5, 4.5, 5.6875, 3.8125, 12, 8, 6],
          "kv_bits of the 13 methods at n = 1024 (kivi4 5.6875, kivi2 3.8125)")
    # usage errors
    q, k, v = random_problem(rng, 1, 1, 40, 48)
    h = make_heads(q, k, v, Fmt())[0]
    refused = []
    for m in METHODS:
        try:
            h.result(m, False)
        except UsageError:
            refused.append(m)
    check(set(refused) == NEEDS_32, f"p = 48: refused exactly kv_q* and kivi* ({len(refused)} methods)")
    try:
        f16(np.array([1.0, 65520.0]), "K")
        check(False, "f16 overflow is a usage error")
    except UsageError as e:
        check("K" in str(e) and "65520" in str(e), f"f16 overflow is a usage error naming the tensor ({e})")
    check(f16(np.array([65519.99]))[0] == 65504.0, "f16: 65519.99 -> 65504 (finite)")


def rng_str(r) -> str:
    r = list(r)
    return "none" if not r else f"{r[0]}..{r[-1]}"


def selftest() -> int:
    t0 = time.time()
    fails = []

    def check(ok, what):
        print(f"[{'ok' if ok else 'FAIL'}] {what}")
        if not ok:
            fails.append(what)

    selftest_formats(check)
    selftest_ggml(check)
    selftest_methods(check)
    print(f"selftest: {'all checks passed' if not fails else f'{len(fails)} FAILED'} ({time.time() - t0:.1f} s)")
    return 1 if fails else 0


# ------------------------------------------------------------------------------------------
# CSV comparison


def cell(row: dict, name: str):
    v = row.get(name)
    if v is None or v == "":
        return None
    return float(v)


REL_COLS = ["error", "frob_error", "rmse", "rel_l1", "exact_norm", "rel_error"]
ABS_COLS = {"kv_bits": 1e-12, "kv_read": 1e-12, "mass": 1e-12, "keys": 1e-9}


def compare_row(row: dict, want: dict, tol: float, floor: float) -> tuple[list[str], dict]:
    """Differences of one §8 row; returns (failures, {column: difference})."""
    bad, diff = [], {}
    for c in REL_COLS:
        got = cell(row, c)
        if got is None:
            bad.append(f"{c} empty")
            continue
        fl = floor if c in ("error", "frob_error", "exact_norm") else 0.0
        if c == "rmse":
            fl = floor / math.sqrt(want.get("_np", 1))
        if c == "rel_error":
            fl = 1e-6
        denom = max(abs(want[c]), fl, 1e-300)
        diff[c] = abs(got - want[c]) / denom
        if not diff[c] <= tol:
            bad.append(f"{c} {got!r} vs {want[c]:.12g}")
    got = cell(row, "cos_sim")
    if got is None:
        bad.append("cos_sim empty")
    else:
        a, b = 1.0 - got, want["one_minus_cos"]
        diff["1-cos_sim"] = abs(a - b) / max(abs(b), 1e-300)
        if not (abs(a - b) <= tol * abs(b) or abs(a - b) <= 1e-12):
            bad.append(f"cos_sim {got!r} vs {1 - b:.15g}")
    for c, t in ABS_COLS.items():
        got = cell(row, c)
        if got is None:
            bad.append(f"{c} empty")
            continue
        diff[c] = abs(got - want[c])
        if not diff[c] <= t:
            bad.append(f"{c} {got!r} vs {want[c]!r}")
    if row.get("d") not in (None, "") and int(row["d"]) != 0:
        bad.append(f"d = {row['d']} (a §8 method writes d = 0)")
    if row.get("nonfinite_rows") not in (None, "") and int(row["nonfinite_rows"]) != want["nonfinite_rows"]:
        bad.append(f"nonfinite_rows {row['nonfinite_rows']} vs {want['nonfinite_rows']}")
    if (row.get("target") or "softmax") != "softmax":
        bad.append(f"target {row['target']} (§8 methods take the softmax target only)")
    return bad, diff


def main() -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n")[:2]))
    ap.add_argument("--qkv", action="append", default=[], help="FILE[:WINDOW] from dump-qkv (repeatable)")
    ap.add_argument("--csv", action="append", default=[], help="trials.csv of the sweep on the same dumps")
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--table", action="store_true", help="print mean error / cos_sim %% / kv_read per method")
    ap.add_argument("--mask", choices=["none", "causal"], help="--table's mask (default: the dump's sidecar, "
                    "else causal)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--selftest", action="store_true", help="format and identity checks, no files needed")
    args = ap.parse_args()
    if args.selftest:
        return selftest()
    if not args.qkv:
        ap.error("--qkv is required (or --selftest)")
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        print(f"unknown §8 method(s): {', '.join(unknown)} (known: {', '.join(METHODS)})", file=sys.stderr)
        return 2

    dumps = []  # dicts: path, n, window, heads, meta
    by_nw = {}
    f32_dump = False
    for spec in args.qkv:
        path, _, win = spec.partition(":")
        meta = {}
        try:
            t = load_safetensors(path)
            if os.path.exists(path + ".json"):
                with open(path + ".json") as f:
                    meta = json.load(f)
        except (OSError, ValueError, KeyError, struct.error) as e:
            print(f"{path}: cannot read ({e})", file=sys.stderr)
            return 2
        if not {"q", "k", "v"} <= set(t):
            print(f"{path}: no q, k, v tensors", file=sys.stderr)
            return 2
        q, k, v = t["q"], t["k"], t["v"]
        if q.ndim != 3 or k.ndim != 3 or k.shape != v.shape or q.shape[1:] != k.shape[1:] or q.shape[0] % k.shape[0]:
            print(f"{path}: bad shapes q {q.shape} k {k.shape} v {v.shape}", file=sys.stderr)
            return 2
        window = int(win) if win else int(meta.get("window", 0))
        if win and "window" in meta and int(meta["window"]) != window:
            print(f"[NOTE] {path}: window {window} from the command line, {meta['window']} in the sidecar")
        n = q.shape[1]
        f32_dump |= q.dtype != np.float64
        layer = meta.get("inputs", {}).get("layer")
        dump = {"path": path, "n": n, "window": window, "meta": meta, "heads": make_heads(q, k, v, Fmt()),
                "H": q.shape[0], "Hkv": k.shape[0], "p": q.shape[2], "id": len(dumps),
                "model_id": meta.get("model_id"), "layer": None if layer is None else int(layer)}
        for other in by_nw.get((n, window), []):
            if other["model_id"] == dump["model_id"] and other["layer"] == dump["layer"]:
                print(f"{path}: the same (model, layer, n = {n}, window = {window}) as {other['path']} "
                      f"(a sidecar tells dumps apart by model_id and layer)", file=sys.stderr)
                return 2
        by_nw.setdefault((n, window), []).append(dump)
        dumps.append(dump)
        inp = meta.get("inputs", {})
        print(f"{path}: q {q.dtype} {q.shape}, k/v {k.shape} (H_kv = {k.shape[0]}), window {window}"
              + (f", layer {inp.get('layer')}, dtype {inp.get('dtype')}, mask {meta.get('mask')}" if meta else ""))
    if f32_dump and args.csv:
        print("[NOTE] the dump holds f32 Q/K/V while a --dtype f64 sweep works on the f64 values (≤ 6e-8 "
              "relative apart): an f32 value that sits exactly on an f16/bf16 midpoint rounds by ties-to-even "
              "here but by the side of its f64 original there, INT8/E4M3 codes next to a boundary can flip, and "
              "O itself moves. Seen on SmolLM2 layers 0 and 15, n = 1024 (max relative difference in error or "
              "1 − cos_sim): kv_f16 ~2e-3, kv_bf16 up to 2e-2, sage1 ~1e-4, sage2_8b up to 8e-4, sage2_4b and "
              "kv_fp8 ~5e-6, the ggml types and KIVI ≤ 1.2e-6 (same codes; only O moves). Jittering the f32 "
              "values within half an f32 ulp here reproduces those sizes. A dump of F64 tensors has no such gap")

    failed = False
    if args.csv:
        worst = defaultdict(lambda: defaultdict(float))
        nrows = defaultdict(int)
        skipped = defaultdict(int)
        seen = defaultdict(set)  # method -> {(dump id, head, mask)}
        covered = set()  # (dump id, mask) that some CSV row of a §8 method covers
        kvread_rows, kvread_worst = 0, 0.0
        odd = defaultdict(int)  # rows with exactly one of kv_bits, kv_read
        for path in args.csv:
            try:
                f = open(path, newline="")
            except OSError as e:
                print(f"{path}: cannot read ({e})", file=sys.stderr)
                return 2
            with f:
                rd = csv.DictReader(f)
                need = {"method", "n", "window", "head"}
                if not rd.fieldnames or not need <= set(rd.fieldnames):
                    print(f"{path}: not a trials.csv (needs columns {sorted(need)})", file=sys.stderr)
                    return 2
                for row in rd:
                    m = row["method"]
                    n, window, head = int(row["n"]), int(row["window"]), int(row["head"])
                    mask = row.get("mask") or "none"
                    if mask not in ("none", "causal"):
                        print(f"{path}: mask {mask!r}", file=sys.stderr)
                        return 2
                    causal = mask == "causal"
                    # the dump of this row: same n and window, and same model_id and layer where both say
                    cands = [dp for dp in by_nw.get((n, window), [])
                             if (dp["model_id"] is None or row.get("model_id") in (None, "", dp["model_id"]))
                             and (dp["layer"] is None or row.get("layer") in (None, "")
                                  or int(row["layer"]) == dp["layer"])]
                    dump = cands[0] if len(cands) == 1 else None
                    if len(cands) > 1:
                        print(f"{path}: a row of n = {n}, window = {window} matches several dumps "
                              f"({', '.join(dp['path'] for dp in cands)}); give them sidecars", file=sys.stderr)
                        return 2
                    # §6–7 restrict-and-renormalise rows: kv_read from their own keys column
                    kb, keys, kr = cell(row, "kv_bits"), cell(row, "keys"), cell(row, "kv_read")
                    if m not in METHODS and (kb is None) != (kr is None):
                        odd[m] += 1
                    if m not in METHODS and kb == 16 and keys is not None:
                        kvread_rows += 1
                        dense = (n + 1) / 2 if causal else float(n)
                        want = keys * 16 / (16 * dense)
                        dv = abs(kr - want) if kr is not None else math.inf
                        kvread_worst = max(kvread_worst, dv)
                        if not dv <= 1e-12:
                            failed = True
                            print(f"[FAIL] {m} d={row.get('d')} n={n} window={window} head={head} {mask}: kv_read "
                                  f"{kr!r}, keys {keys!r}·16/(16·{dense}) = {want!r}")
                    if m not in METHODS or m not in methods or dump is None or head >= dump["H"]:
                        skipped[m] += 1
                        continue
                    covered.add((dump["id"], mask))
                    seen[m].add((dump["id"], head, mask))
                    h = dump["heads"][head]
                    try:
                        want = h.result(m, causal)
                    except UsageError as e:
                        failed = True
                        print(f"[FAIL] {m} n={n} window={window} head={head} {mask}: a row where the method is "
                              f"refused ({e})")
                        continue
                    want = dict(want, _np=h.n * h.p)
                    bad, diff = compare_row(row, want, args.tol, 1e-6 * want["exact_norm"])
                    nrows[m] += 1
                    for c, x in diff.items():
                        worst[m][c] = max(worst[m][c], x)
                    if bad:
                        failed = True
                        print(f"[FAIL] {m} n={n} window={window} head={head} {mask}: " + "; ".join(bad))
        # a §8 method with rows must have them for every dumped head it could have run on
        for m in methods:
            if m not in seen:
                continue
            for (did, mask) in sorted(covered):
                dump = dumps[did]
                n, window = dump["n"], dump["window"]
                for head in range(dump["H"]):
                    if (did, head, mask) in seen[m]:
                        continue
                    try:
                        dump["heads"][head].result(m, mask == "causal")
                    except UsageError:
                        continue  # refused here too: no row is right
                    failed = True
                    print(f"[FAIL] {m}: no row for n={n} window={window} head={head} mask={mask}")
        cols = ["error", "frob_error", "1-cos_sim", "rel_l1", "rmse", "exact_norm", "kv_bits", "kv_read", "keys"]
        print(f"{'method':10} {'rows':>5} " + " ".join(f"{c:>10}" for c in cols)
              + "   (max relative differences; kv_bits, kv_read, keys absolute)")
        for m in methods:
            if nrows[m]:
                print(f"{m:10} {nrows[m]:5d} " + " ".join(f"{worst[m][c]:10.2e}" for c in cols))
            else:
                print(f"{m:10} no rows in the CSV")
        if kvread_rows:
            print(f"§6–7 rows with kv_bits 16: {kvread_rows}, max |kv_read − keys/mean|D_i|| {kvread_worst:.2e}")
        if odd:
            print("[NOTE] rows with kv_bits but no kv_read or the reverse (§8.5 defines kv_read from kv_bits): "
                  + ", ".join(f"{m} {c}" for m, c in sorted(odd.items())))
        nskip = sum(skipped.values())
        if nskip:
            print(f"skipped {nskip} rows not computed here: "
                  + ", ".join(f"{m} {c}" for m, c in sorted(skipped.items())))
    if args.table:
        for dump in dumps:
            mask = args.mask or dump["meta"].get("mask") or "causal"
            causal = mask == "causal"
            print(f"\n{dump['path']}: n = {dump['n']}, window {dump['window']}, {mask}, {dump['H']} heads "
                  f"(mean over heads)")
            print(f"{'method':10} {'error':>10} {'cos_sim %':>11} {'1-cos':>9} {'rel_l1':>9} {'kv_read':>8}")
            for m in methods:
                rs = []
                try:
                    rs = [h.result(m, causal) for h in dump["heads"]]
                except UsageError as e:
                    print(f"{m:10} refused: {e}")
                    continue
                err = np.mean([r["error"] for r in rs])
                cs = np.mean([r["cos_sim"] for r in rs])
                omc = np.mean([r["one_minus_cos"] for r in rs])
                l1 = np.mean([r["rel_l1"] for r in rs])
                print(f"{m:10} {err:10.4g} {100 * cs:11.6f} {omc:9.2e} {l1:9.2e} {rs[0]['kv_read']:8.4f}")
    if args.csv:
        print("quant_dump: " + ("DISAGREEMENT (see [FAIL] lines)" if failed else "all compared rows agree"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
