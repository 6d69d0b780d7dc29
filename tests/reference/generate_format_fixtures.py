#!/usr/bin/env python3
"""Generate the number-format fixtures of METHODS.md §8.2 under fixtures/formats/.

Read by ``src/numerics/formats/tests.rs`` (std only). Nothing here shares code with the Rust side;
every expected value comes from an independent implementation, and the script cross-checks those
implementations against each other before writing anything:

* **Exact reference** (``Table`` below): the format's representable values are *enumerated*
  (all 65536 f16 / bf16 bit patterns, all 256 E4M3 codes, decoded by numpy / ml_dtypes and checked
  against the closed-form decoding), and x goes to the nearest one, found by bisection and decided
  with ``fractions.Fraction`` (exact), a tie going to the even code (= even mantissa). Overflow:
  the value one step above the largest finite one (2^16, 2^128, 480) joins the table as a virtual
  neighbour; landing on it means ±inf for f16/bf16 and ±448 for E4M3 (saturating, §8.2). This is
  a table search, not the scale-and-``rint`` algorithm of the Rust code.
* **f16**: numpy's ``astype(np.float16)`` from float64 and from float32. numpy's float64→float16
  cast is one rounding (``npy_double_to_half`` works on the double's bits): the script asserts it
  equals the exact reference on *every* f16 input written, including the double-rounding traps.
* **bf16**: f32 inputs from ``ml_dtypes.bfloat16`` (asserted equal to the exact reference); f64
  inputs from the exact reference only, because ml_dtypes' and torch's float64→bfloat16 casts
  round through f32 (a double rounding; the script counts the trap cases where they differ).
* **E4M3** (``float8_e4m3fn``): f32 inputs from PyTorch's ``torch.float8_e4m3fn`` cast when torch
  imports (it saturates, like CUDA's satfinite; used for the committed files: torch 2.15), else
  from ``ml_dtypes.float8_e4m3fn`` (which gives NaN above 464, so the saturated code is
  substituted there); both are asserted equal to the exact reference and to each other inside
  ±464. f64 inputs come from the exact reference; torch and ml_dtypes are compared with it only on
  f64 inputs that are f32 values, because both round float64 through float32 (shown by the traps).
  ``--torch`` makes torch mandatory; ``--no-torch`` skips it.
* **ggml** blocks: gguf-py's ``gguf.quants.quantize`` (raw block bytes: f16 scale bits, f16 offset
  bits, qh, codes) and ``dequantize``; gguf-py is llama.cpp's ``quantize_row_*_ref`` in numpy.
  One known difference, kept in the fixtures on purpose: for blocks of ±0 only, C takes x_max = +0
  (its initial value; only a strictly larger |v| replaces it) and the first strict minimum, while
  numpy's argmax/min may pick −0, so d or m (and x̂) can differ in the sign of a zero. The Rust
  test accepts exactly that on all-zero blocks and follows the C.

Files (little-endian, fixed-size records, no header; ``index.json`` lists layout and counts):
* ``ggml_input.bin``: N blocks × 32 f32 (random normal, random with scales 1e-3..1e3, adversarial).
* ``ggml_<type>.bin`` for q8_0, q5_1, q5_0, q4_1, q4_0: N × (type_size raw bytes, 32 f32
  dequantized). A block whose f16 scale or offset overflows has an inf there (Rust must refuse it).
* ``f16_f64.bin`` (f64 x, u16 bits), ``f16_f32.bin`` (f32 x, u16 bits), ``bf16_f64.bin``,
  ``bf16_f32.bin`` (same layouts), ``e4m3_f64.bin`` (f64 x, u8 code), ``e4m3_f32.bin`` (f32 x, u8).
  Inputs: special values, every E4M3 code and midpoint (f16/bf16: a random sample of midpoints),
  f64/f32 neighbours of each midpoint, midpoint ± δ with δ below f32's half-ulp (the double-rounding
  traps: f32 rounding would land on the midpoint), values beyond the range, random values.

Run:  python tests/reference/generate_format_fixtures.py [--torch | --no-torch]
(numpy, gguf, ml_dtypes; torch optional. The committed files were made with
/tmp/torchenv/bin/python, i.e. torch 2.15.0, numpy 2.4.6, ml_dtypes 0.6.0, gguf 0.19.0;
index.json records the versions.)
"""

import argparse
import bisect
import json
import math
import struct
import sys
from fractions import Fraction
from pathlib import Path

import ml_dtypes
import numpy as np
from gguf import GGMLQuantizationType as GT
from gguf import quants

OUT = Path(__file__).resolve().parents[2] / "fixtures" / "formats"
SEED = 20260427


# ---------------------------------------------------------------- exact reference (table search)
class Table:
    """Nearest representable value by exact comparison; ties to the even code."""

    def __init__(self, name, codes, values, sign_bit, top_virtual, overflow_code):
        pos = [(v, c) for c, v in zip(codes, values) if not (c & sign_bit) and math.isfinite(v)]
        pos.sort()
        self.vals = [v for v, _ in pos]
        self.codes = [c for _, c in pos]
        assert self.vals[0] == 0.0 and all(a < b for a, b in zip(self.vals, self.vals[1:])), name
        self.name, self.sign_bit = name, sign_bit
        self.top_virtual, self.overflow_code = top_virtual, overflow_code
        # the virtual neighbour's code parity decides the tie at the overflow boundary
        self.top_code = self.codes[-1] + 1

    def code(self, x):
        x = float(x)
        if math.isnan(x):
            return None
        sign = self.sign_bit if math.copysign(1.0, x) < 0 else 0
        a = abs(x)
        i = bisect.bisect_right(self.vals, a) - 1
        if self.vals[i] == a:
            return sign | self.codes[i]
        lo, lo_code = self.vals[i], self.codes[i]
        if i + 1 < len(self.vals):
            hi, hi_code = self.vals[i + 1], self.codes[i + 1]
        else:
            hi, hi_code = self.top_virtual, self.top_code
        if a > hi:  # beyond even the virtual neighbour
            return sign | self.overflow_code
        mid = (Fraction(lo) + Fraction(hi)) / 2
        fa = Fraction(a)
        if fa < mid or (fa == mid and lo_code % 2 == 0):
            return sign | lo_code
        if hi_code == self.top_code and i + 1 == len(self.vals):
            return sign | self.overflow_code
        return sign | hi_code

    def midpoints(self):
        vs = self.vals + [self.top_virtual]
        return [(Fraction(a) + Fraction(b)) / 2 for a, b in zip(vs, vs[1:])]


def f16_table():
    codes = np.arange(65536, dtype=np.uint16)
    vals = codes.view(np.float16).astype(np.float64)
    # closed-form decoding as an independent check of numpy's
    for c in range(0, 0x7C00, 97):
        e, m = c >> 10, c & 0x3FF
        assert vals[c] == (m * 2.0**-24 if e == 0 else (1024 + m) * 2.0 ** (e - 25)), c
    return Table("f16", codes.tolist(), vals.tolist(), 0x8000, 65536.0, 0x7C00)


def bf16_table():
    codes = np.arange(65536, dtype=np.uint16)
    vals = codes.view(ml_dtypes.bfloat16).astype(np.float64)
    for c in range(0, 0x7F80, 89):
        e, m = c >> 7, c & 0x7F
        assert vals[c] == (m * 2.0**-133 if e == 0 else (128 + m) * 2.0 ** (e - 134)), c
    return Table("bf16", codes.tolist(), vals.tolist(), 0x8000, 2.0**128, 0x7F80)


def e4m3_table():
    codes = np.arange(256, dtype=np.uint8)
    vals = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    for c in range(256):
        e, m = (c >> 3) & 0xF, c & 7
        if c & 0x7F == 0x7F:
            assert math.isnan(vals[c])
            continue
        v = m * 2.0**-9 if e == 0 else (8 + m) * 2.0 ** (e - 10)
        assert vals[c] == (-v if c & 0x80 else v), c
    # 480 would be code 0x7F (odd): the tie at 464 goes to 448; anything nearer 480 saturates.
    return Table("e4m3", codes.tolist(), vals.tolist(), 0x80, 480.0, 0x7E)


# ------------------------------------------------------------------------------ input generation
def f32_neighbours(v):
    v = np.float32(v)
    return [np.nextafter(v, np.float32(-np.inf)), v, np.nextafter(v, np.float32(np.inf))]


def f64_trap_inputs(mids, rng, n_pick):
    """Midpoints (exact in f64), their f64 neighbours, and mid ± δ, 0 < δ < half an f32 ulp."""
    out = []
    picks = mids if n_pick is None else [mids[i] for i in rng.choice(len(mids), n_pick, False)]
    for mf in picks:
        m = float(mf)
        assert Fraction(m) == mf  # midpoints are f64 values
        sign = -1.0 if rng.random() < 0.5 else 1.0
        out += [sign * m, sign * math.nextafter(m, math.inf), sign * math.nextafter(m, -math.inf)]
        half_ulp32 = float(np.spacing(np.float32(m))) / 2 if m < 3.4e38 else 2.0**103
        for s in (1.0, -1.0):
            delta = half_ulp32 * rng.uniform(1e-6, 0.999)
            x = m + s * delta
            if x != m and np.float32(x) == np.float32(m):  # f32 would land on the midpoint
                out.append(sign * x)
    return out


def float_inputs(table, rng, specials, n_mid, n_rand, log2_range):
    mids = table.midpoints()
    x64 = list(specials) + f64_trap_inputs(mids, rng, n_mid)
    e = rng.uniform(*log2_range, n_rand)
    x64 += (rng.choice([-1.0, 1.0], n_rand) * rng.uniform(1, 2, n_rand) * 2.0**e).tolist()
    # f32 inputs: midpoints that are f32 values, their f32 neighbours, random f32
    x32 = [np.float32(s) for s in specials if abs(s) < 3.4e38 or not math.isfinite(s)]
    m32 = [float(m) for m in mids if np.float32(float(m)) == float(m)]
    pick = m32 if n_mid is None else [m32[i] for i in rng.choice(len(m32), min(n_mid, len(m32)), False)]
    for m in pick:
        sign = np.float32(-1.0 if rng.random() < 0.5 else 1.0)
        x32 += [sign * v for v in f32_neighbours(m)]
    with np.errstate(over="ignore"):
        x32 += (np.float32(rng.choice([-1.0, 1.0], n_rand)) * np.float32(rng.uniform(1, 2, n_rand) * 2.0**e)).tolist()
    return np.array(x64, dtype=np.float64), np.array(x32, dtype=np.float32)


def write_records(name, xs, codes, code_fmt, index, source):
    rec = ("<d" if xs.dtype == np.float64 else "<f") + code_fmt
    with open(OUT / name, "wb") as f:
        for x, c in zip(xs.tolist(), codes):
            f.write(struct.pack(rec, x, c))
    index[name] = {"record": rec, "count": len(codes), "expected_from": source}


def codes_of(table, xs, nan_code):
    return [nan_code if (c := table.code(x)) is None else c for x in xs.tolist()]


# --------------------------------------------------------------------------------- the formats
def gen_f16(rng, index):
    t = f16_table()
    specials = [0.0, -0.0, math.inf, -math.inf, 65504.0, 65519.999, 65520.0, -65520.0,
                math.nextafter(65520.0, 0.0), 65536.0, 1e10, 2.0**-24, 2.0**-25,
                math.nextafter(2.0**-25, 1.0), 3 * 2.0**-25, 2.0**-14, 2.0**-14 - 2.0**-25,
                5e-324, -5e-324, 1e-300, -1e-300, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11]
    x64, x32 = float_inputs(t, rng, specials, 1700, 1500, (-27, 17))
    ref64 = codes_of(t, x64, 0x7E00)
    np64 = x64.astype(np.float16).view(np.uint16).tolist()
    assert np64 == ref64, "numpy float64->float16 is not one rounding?"
    np32 = x32.astype(np.float16).view(np.uint16).tolist()
    assert np32 == codes_of(t, x32, 0x7E00)
    traps = sum(a != b for a, b in zip(x64.astype(np.float32).astype(np.float16).view(np.uint16).tolist(), ref64))
    write_records("f16_f64.bin", x64, np64, "H", index, "numpy float64->float16 (== exact table)")
    write_records("f16_f32.bin", x32, np32, "H", index, "numpy float32->float16 (== exact table)")
    index["f16_f64.bin"]["double_rounding_traps"] = traps


def gen_bf16(rng, index, torch):
    t = bf16_table()
    big = 3.3895313892515355e38
    specials = [0.0, -0.0, math.inf, -math.inf, big, -big, (2 - 2.0**-8) * 2.0**127,
                math.nextafter((2 - 2.0**-8) * 2.0**127, 0.0), 1e39, 2.0**-133, 2.0**-134,
                3 * 2.0**-134, 2.0**-126, 1e-45, 5e-324, -5e-324, 1.0 + 2.0**-8,
                1.0 + 3 * 2.0**-8, 1.0 + 2.0**-8 + 2.0**-40]
    x64, x32 = float_inputs(t, rng, specials, 1700, 1500, (-140, 128))
    ref64 = codes_of(t, x64, 0x7FC0)
    ml32 = x32.astype(ml_dtypes.bfloat16).view(np.uint16).tolist()
    ref32 = codes_of(t, x32, 0x7FC0)
    assert [c if (c & 0x7FFF) <= 0x7F80 else 0x7FC0 for c in ml32] == ref32
    # ml_dtypes' float64 cast rounds through f32: count the traps where it differs
    with np.errstate(over="ignore"):
        ml64 = x64.astype(ml_dtypes.bfloat16).view(np.uint16).tolist()
    index_traps = sum(a != b for a, b in zip(ml64, ref64) if (b & 0x7FFF) <= 0x7F80)
    write_records("bf16_f64.bin", x64, ref64, "H", index, "exact table (Fraction RNE)")
    write_records("bf16_f32.bin", x32, ref32, "H", index, "ml_dtypes float32->bfloat16 (== exact table)")
    index["bf16_f64.bin"]["ml_dtypes_f64_cast_differs"] = index_traps
    if torch is not None:
        tb = torch.from_numpy(x32.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        assert [c if (c & 0x7FFF) <= 0x7F80 else 0x7FC0 for c in tb.tolist()] == ref32


def gen_e4m3(rng, index, torch):
    t = e4m3_table()
    codes = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64).tolist()
    beyond = [448.0, 449.0, 463.9, 464.0, 464.0001, 470.0, 479.0, 480.0, 496.0, 500.0, 512.0,
              1e6, 1e30, 1e300, math.inf]
    specials = codes + beyond + [-b for b in beyond] + [2.0**-10, -(2.0**-10), 2.0**-11,
               3 * 2.0**-10, 5 * 2.0**-10, 2.0**-6 - 2.0**-10, 5e-324, -5e-324]
    x64, x32 = float_inputs(t, rng, specials, None, 1500, (-12, 10))
    x64 = np.concatenate([x64, rng.uniform(-520, 520, 300)])
    x32 = np.concatenate([x32, np.float32(rng.uniform(-520, 520, 300))])
    ref64, ref32 = codes_of(t, x64, 0x7F), codes_of(t, x32, 0x7F)
    sat = lambda x: 0x7E | (0x80 if x < 0 else 0)  # noqa: E731
    # ml_dtypes: NaN (0x7F/0xFF) above 464; agree elsewhere
    ml32 = x32.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).tolist()
    ml32 = [sat(x) if c & 0x7F == 0x7F and not math.isnan(x) else c for x, c in zip(x32.tolist(), ml32)]
    assert [c & 0x7F == 0x7F for c in ml32] == [math.isnan(x) for x in x32.tolist()]
    assert [c for c, x in zip(ml32, x32.tolist()) if not math.isnan(x)] == [
        c for c, x in zip(ref32, x32.tolist()) if not math.isnan(x)]
    source = "ml_dtypes float32->float8_e4m3fn, saturated above 464 (== exact table)"
    exp32 = [r if math.isnan(x) else c for c, r, x in zip(ml32, ref32, x32.tolist())]  # NaN: 0x7F
    if torch is not None:
        tt = torch.from_numpy(x32.copy()).to(torch.float8_e4m3fn).view(torch.uint8).numpy().tolist()
        finite = [not math.isnan(x) for x in x32.tolist()]
        assert [c for c, f in zip(tt, finite) if f] == [c for c, f in zip(ref32, finite) if f], "torch"
        exp32 = [c if f else r for c, f, r in zip(tt, finite, ref32)]
        source = f"torch {torch.__version__} float32->float8_e4m3fn (saturating; == exact table == ml_dtypes)"
        # torch and ml_dtypes round float64 through float32: compare only on f32-exact inputs
        with np.errstate(over="ignore"):
            f32_exact = np.float64(np.float32(x64)) == x64
        t64 = torch.from_numpy(x64.copy()).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
        assert all(int(c) == r for c, r, e in zip(t64, ref64, f32_exact) if e)
        index["torch_f64_cast_differs_on_traps"] = int(sum(int(c) != r for c, r in zip(t64, ref64)))
    write_records("e4m3_f64.bin", x64, ref64, "B", index, "exact table (Fraction RNE, saturating)")
    write_records("e4m3_f32.bin", x32, exp32, "B", index, source)


# ------------------------------------------------------------------------------------ ggml blocks
GGML = [("q8_0", GT.Q8_0), ("q5_1", GT.Q5_1), ("q5_0", GT.Q5_0), ("q4_1", GT.Q4_1), ("q4_0", GT.Q4_0)]


def ggml_blocks(rng):
    b = []
    b += list(rng.standard_normal((110, 32)))
    b += list(rng.standard_normal((80, 32)) * 10.0 ** rng.uniform(-3, 3, (80, 1)))
    b += list(rng.uniform(-1, 1, (20, 32)) * 10.0 ** rng.uniform(-3, 3, (20, 1)))
    for v in (1.0, -3.7, 1e-3, 0.0, -0.0, 1234.5):  # all equal / all zero: d = 0 or d from one value
        b.append(np.full(32, v))
    b.append(np.array([0.0, -0.0] * 16))
    for pos, big in ((0, 100.0), (7, -100.0), (31, 1e3), (16, -1e3), (5, 50.0)):  # one outlier
        x = rng.standard_normal(32) * 0.01
        x[pos] = big
        b.append(x)
    # exact .5 ties of x·id: d a power of two so that x·id is exact
    half = np.arange(-15.5, 16.5, 1.0)  # 32 half-integers
    b.append(np.concatenate([[127.0], half[:31]]))  # Q8_0: d = 1, id = 1, roundf at .5
    b.append(np.concatenate([[-127.0], -half[:31] / 4]))
    b.append(np.concatenate([[-8.0], np.clip(half, -8, 8)[:31]]))  # Q4_0: d = 1
    b.append(np.concatenate([[16.0], np.clip(half, -16, 16)[:31]]))  # Q5_0: d = -1
    b.append(np.concatenate([[0.0, 15.0], np.clip(half + 7.5, 0, 15)[:30]]))  # Q4_1: d = 1, m = 0
    b.append(np.concatenate([[0.0, 31.0], np.clip(half + 15.5, 0, 31)[:30]]))  # Q5_1: d = 1
    b.append(np.concatenate([[-64.0, 60.0], rng.integers(-128, 121, 30) / 2.0]))
    # negative-dominant; ± max equal in magnitude (first one decides the sign of x_max)
    b.append(-np.abs(rng.standard_normal(32)) * 5 + 1.0)
    for first in (5.0, -5.0):
        x = rng.uniform(-4, 4, 32)
        x[3], x[20] = first, -first
        b.append(x)
    x = rng.uniform(-4, 4, 32)
    x[0], x[31] = -2.5, 2.5
    b.append(x)
    # near the f16 scale overflow (d just below 65520 for one type; others overflow: Err)
    for amax in (65519.0 * 127, 65504.0 * 127, 65520.0 * 127, 65519.0 * 8, 65519.0 * 16):
        x = rng.uniform(-1, 1, 32) * amax * 0.9
        x[9] = -amax
        b.append(x)
    lo = -65000.0  # Q4_1/Q5_1 offsets near overflow
    b.append(lo + rng.uniform(0, 1, 32) * 65519.0 * 15 * np.array([0.0] + [1.0] * 30 + [1.0]))
    b.append(np.concatenate([[-65519.0, -65520.0 + 0.004], rng.uniform(-65519, 0, 30)]))
    b.append(np.concatenate([[-65530.0], rng.uniform(-10, 10, 31)]))
    # tiny scales: f16(d) subnormal or 0 (id stays finite)
    for s in (1e-4, 1e-5, 1e-6, 1e-8, 1e-12, 1e-30):
        b.append(rng.standard_normal(32) * s)
    b += list(rng.standard_normal((60, 32)) ** 3)  # heavy tails
    return np.array(b, dtype=np.float32)


def gen_ggml(rng, index):
    blocks = ggml_blocks(rng)
    (OUT / "ggml_input.bin").write_bytes(blocks.astype("<f4").tobytes())
    index["ggml_input.bin"] = {"record": "<32f", "count": len(blocks)}
    for name, qt in GGML:
        with np.errstate(all="ignore"):
            raw = quants.quantize(blocks, qt)
            deq = quants.dequantize(raw, qt).astype("<f4")
        assert raw.shape == (len(blocks), {"q8_0": 34, "q5_1": 24, "q5_0": 22, "q4_1": 20, "q4_0": 18}[name])
        rows = np.concatenate([raw, deq.view(np.uint8).reshape(len(blocks), 128)], axis=1)
        (OUT / f"ggml_{name}.bin").write_bytes(rows.tobytes())
        d = raw[:, :2].copy().view("<u2")[:, 0]
        overflow = int(np.sum((d & 0x7FFF) == 0x7C00))
        if name in ("q5_1", "q4_1"):
            m = raw[:, 2:4].copy().view("<u2")[:, 0]
            overflow = int(np.sum(((d & 0x7FFF) == 0x7C00) | ((m & 0x7FFF) == 0x7C00)))
        index[f"ggml_{name}.bin"] = {"record": f"<{raw.shape[1]}B32f", "count": len(blocks),
                                     "expected_from": "gguf.quants.quantize/dequantize",
                                     "blocks_with_f16_overflow": overflow}


def check_committed(fixtures: Path) -> int:
    """Recomputes the committed ggml tables from their committed inputs with the installed gguf-py
    (and the f16 tables with numpy's one-rounding cast), whatever numpy's random streams do in the
    installed version: the `.ci/run` step. Returns the number of mismatching records."""
    bad = 0
    blocks = np.frombuffer((fixtures / "ggml_input.bin").read_bytes(), dtype="<f4").reshape(-1, 32)
    for name, qt in GGML:
        with np.errstate(all="ignore"):
            raw = quants.quantize(blocks, qt)
            deq = quants.dequantize(raw, qt).astype("<f4")
        rows = np.concatenate([raw, deq.view(np.uint8).reshape(len(blocks), 128)], axis=1)
        want = np.frombuffer((fixtures / f"ggml_{name}.bin").read_bytes(), dtype=np.uint8).reshape(rows.shape)
        n = int(np.sum(np.any(rows != want, axis=1)))
        print(f"ggml_{name}.bin: {len(blocks)} blocks, {n} differ from gguf-py {version_of('gguf')}")
        bad += n
    for f, xt in (("f16_f64.bin", "<f8"), ("f16_f32.bin", "<f4")):
        rec = np.dtype([("x", xt), ("bits", "<u2")])
        t = np.frombuffer((fixtures / f).read_bytes(), dtype=rec)
        with np.errstate(all="ignore"):
            got = t["x"].astype(np.float16).view(np.uint16)
        n = int(np.sum(got != t["bits"]))
        print(f"{f}: {len(t)} values, {n} differ from numpy {np.__version__}'s float16 cast")
        bad += n
    return bad


def version_of(pkg):
    from importlib.metadata import version
    return version(pkg)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--torch", action="store_true", help="require torch for E4M3")
    g.add_argument("--no-torch", action="store_true", help="ml_dtypes only")
    ap.add_argument("--out", default=None, help="write here instead of fixtures/formats (CI regenerates the "
                    "tables with gguf-py and compares them with the committed ones)")
    ap.add_argument("--check", default=None, metavar="DIR",
                    help="recompute the committed tables in DIR from their inputs instead of writing; exit 1 on a difference")
    args = ap.parse_args()
    if args.check:
        sys.exit(1 if check_committed(Path(args.check)) else 0)
    global OUT
    if args.out:
        OUT = Path(args.out)
    torch = None
    if not args.no_torch:
        try:
            import torch  # noqa: F811
        except ImportError:
            if args.torch:
                raise
    OUT.mkdir(parents=True, exist_ok=True)
    from importlib.metadata import version
    index = {"versions": {p: version(p) for p in ("numpy", "ml_dtypes", "gguf")}, "seed": SEED}
    if torch is not None:
        index["versions"]["torch"] = torch.__version__
    rng = np.random.default_rng(SEED)
    gen_f16(rng, index)
    gen_bf16(rng, index, torch)
    gen_e4m3(rng, index, torch)
    gen_ggml(rng, index)
    (OUT / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(json.dumps(index, indent=1, sort_keys=True), f"\ntotal {total} bytes")


if __name__ == "__main__":
    main()
