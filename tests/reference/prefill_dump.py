#!/usr/bin/env python3
"""Independent float64 cross-check of approx-bench's causal prefill methods (METHODS.md §7.5) and the
causal forms of ``window`` and ``topk`` (§7.4) against a sweep's ``trials.csv``.

A second implementation written from ``../shared/METHODS.md`` §7.2–§7.5, not from the Rust sources. Every
method is a dense n×n boolean mask M (the test oracle §7.5 allows: "A dense boolean mask with a masked
softmax is a fine test oracle; only the sets S_i are normative") built by loops and numpy reductions that
follow the text, then the masked softmax:

    Ô_i = Σ_{j: M_ij} e^{s_ij − m_i} v_j / Σ_{j: M_ij} e^{s_ij − m_i},   s_ij = q_i·k_j/√p,
    error = σ_max(O − Ô) (LAPACK SVD), frob = ‖O − Ô‖_F,
    keys = mean_i |S_i|,  mass = mean_i Σ_{j∈S_i} P_ij  (P the exact causal attention, §7.2).

Inputs: ``approx-bench dump-qkv`` files (q [H, n, p], k and v [H_kv, n, p]; query head h reads K/V head
⌊h·H_kv/H⌋, §7.1 — H_kv is read from the shapes) and the sweep's ``trials.csv`` (columns method, d, window,
head, error, frob_error, keys, mass). For every CSV row of a method implemented here it compares:
  error and frob_error, relative difference ≤ --tol (default 1e-6);
  mass, absolute difference ≤ --tol;
  keys, absolute difference ≤ 1e-9.
and prints, per method, the largest differences. Exit 0 when every row agrees, 1 otherwise, 2 on bad input.

With --table it also prints the mean error / mass / keys per (method, d) over the dumped heads (§7.6's
evidence layout), from this implementation alone.

Run (from the repository root):
    B=./target/release/approx-bench
    M="--model pretrained --model-dir ../shared/data/SmolLM2-135M-Instruct-Q4_1 --corpus ../shared/data/wikitext-2/wiki.test.raw"
    $B dump-qkv $M --layer 15 --length 512 --window 0 --dtype f64 --out /tmp/pf/l15.safetensors
    $B $M --layer 15 --lengths 512 --windows 1 --mask causal --dtype f64 --features 1,2,8,16,24,33,64,100,256,512,1024 \
       --methods window,topk,streaming,h2o,quest,moba,block_sparse,xattention,vertical_slash --out /tmp/pf/l15 --quiet
    python3 tests/reference/prefill_dump.py --qkv /tmp/pf/l15.safetensors --csv /tmp/pf/l15/trials.csv

Needs only numpy. Memory O(n²) per head (n = 2048 is fine).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import struct
import sys
from collections import defaultdict

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

B = 16  # pages and blocks (§7.5)
SINKS = 4  # §7.5.1, §7.5.6
STRIDE = 4  # §7.5.7
LAST = 64  # §7.5.6


# ------------------------------------------------------------------------------------------
# input


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
# one head under the causal mask (§7.2)


def stable_top(values: np.ndarray, m: int) -> np.ndarray:
    """The m largest, ties to the lower index (a stable sort of −values)."""
    if m <= 0:
        return np.zeros(0, dtype=int)
    return np.sort(np.argsort(-np.asarray(values), kind="stable")[:m])


class Head:
    def __init__(self, q, k, v):
        self.Q, self.K, self.V = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
        self.n, self.p = self.Q.shape
        n = self.n
        self.causal = np.tril(np.ones((n, n), dtype=bool))
        self.S = self.Q @ self.K.T / math.sqrt(self.p)
        self.P = self.masked_weights(self.causal)
        self.O = self.P @ self.V

    def masked_weights(self, M: np.ndarray) -> np.ndarray:
        S = np.where(M, self.S, -np.inf)
        m = S.max(axis=1, keepdims=True)
        E = np.where(M, np.exp(S - m), 0.0)
        return E / E.sum(axis=1, keepdims=True)

    def score(self, M: np.ndarray, diagonal: bool = True) -> dict:
        assert not (M & ~self.causal).any(), "a set reaches a future key"
        # §7.5: i ∈ S_i always (topk's §7.4 sets need not hold it)
        assert not diagonal or M[np.arange(self.n), np.arange(self.n)].all(), "a row misses its own key"
        W = self.masked_weights(M)
        E = self.O - W @ self.V
        return {
            "error": float(np.linalg.svd(E, compute_uv=False)[0]),
            "frob_error": float(np.linalg.norm(E)),
            "keys": float(M.sum(axis=1).mean()),
            "mass": float((self.P * M).sum(axis=1).mean()),
        }


# ------------------------------------------------------------------------------------------
# the sets S_i (§7.4, §7.5), each as a dense mask


def m_window(h: Head, d: int) -> np.ndarray:
    i, j = np.indices((h.n, h.n))
    return (j <= i) & (i - j < d)


def m_topk(h: Head, d: int) -> np.ndarray:
    M = np.zeros((h.n, h.n), dtype=bool)
    for i in range(h.n):
        M[i, stable_top(h.S[i, : i + 1], min(d, i + 1))] = True
    return M


def m_streaming(h: Head, d: int) -> np.ndarray:
    # S_i = {j < s} ∪ {j : max(0, i−(d−s)+1) ≤ j ≤ i}, within j ≤ i
    i, j = np.indices((h.n, h.n))
    return (j <= i) & ((j < SINKS) | (j >= np.maximum(0, i - (d - SINKS) + 1)))


def m_h2o(h: Head, d: int) -> np.ndarray:
    n, P = h.n, h.P
    hh, r = d // 2, d - d // 2
    M = np.zeros((n, n), dtype=bool)
    a = P[:hh].sum(axis=0)  # column sums of the exact causal rows P_0..P_{h−1}
    for i in range(n):
        if i < hh:
            M[i, : i + 1] = True
            continue
        H = np.append(stable_top(a, max(hh - 1, 0)), i)  # over all n keys
        keep = np.zeros(n, dtype=bool)
        keep[H] = True
        a = (a + P[i]) * keep
        M[i, H] = True
        M[i, max(0, i - r + 1): i + 1] = True
    return M


def page_mask(h: Head, d: int, score) -> np.ndarray:
    """§7.5.3/§7.5.4: own page (keys ≤ i) + the ⌈d/b⌉−1 complete past pages with the largest score."""
    n = h.n
    m = -(-d // B) - 1
    pages = n // B
    U = score(pages) if pages else np.zeros((n, 0))  # [n, pages]
    M = np.zeros((n, n), dtype=bool)
    for i in range(n):
        own = i // B
        M[i, own * B: i + 1] = True
        for t in stable_top(U[i, :own], m):
            M[i, t * B: (t + 1) * B] = True
    return M


def m_quest(h: Head, d: int) -> np.ndarray:
    def score(pages):
        Kp = h.K[: pages * B].reshape(pages, B, h.p)
        lo, hi = Kp.min(axis=1), Kp.max(axis=1)
        q = h.Q[:, None, :]
        return np.maximum(q * lo[None], q * hi[None]).sum(axis=2)  # U(q, p) = Σ_c max(q_c m_pc, q_c M_pc)
    return page_mask(h, d, score)


def m_moba(h: Head, d: int) -> np.ndarray:
    def score(pages):
        kbar = h.K[: pages * B].reshape(pages, B, h.p).mean(axis=1)
        return h.Q @ kbar.T
    return page_mask(h, d, score)


def block_mask(h: Head, d: int, score: np.ndarray) -> np.ndarray:
    """§7.5.5/§7.5.7: per query block a, the diagonal block (causal inside), block 0, and the ⌈d/b⌉−2
    blocks 0 < c < a with the largest score[a, c]."""
    n = h.n
    nb = -(-n // B)
    m = max(-(-d // B) - 2, 0)
    M = np.zeros((n, n), dtype=bool)
    for a in range(nb):
        kept = [0, a] + [c + 1 for c in stable_top(score[a, 1:a], m)]
        rows = slice(a * B, min((a + 1) * B, n))
        for c in kept:
            M[rows, c * B: min((c + 1) * B, n)] = True
    return M & h.causal


def m_block_sparse(h: Head, d: int) -> np.ndarray:
    n = h.n
    nb = -(-n // B)
    qbar = np.stack([h.Q[a * B: min((a + 1) * B, n)].mean(axis=0) for a in range(nb)])
    kbar = np.stack([h.K[a * B: min((a + 1) * B, n)].mean(axis=0) for a in range(nb)])
    return block_mask(h, d, qbar @ kbar.T)


def xattention_scores(h: Head) -> np.ndarray:
    n, p = h.n, h.p
    g, nb = n // STRIDE, -(-n // B)
    # q̃_a = concat_{t<S} q_{aS+S−1−t}, k̃_c = concat_{t<S} k_{cS+t}; the last partial stride group is out.
    qt = np.stack([np.concatenate([h.Q[a * STRIDE + STRIDE - 1 - t] for t in range(STRIDE)]) for a in range(g)])
    kt = np.stack([np.concatenate([h.K[c * STRIDE + t] for t in range(STRIDE)]) for c in range(g)])
    L = qt @ kt.T / (math.sqrt(p) * STRIDE)
    mask = np.tril(np.ones((g, g), dtype=bool))  # a ≥ c
    L = np.where(mask, L, -np.inf)
    W = np.exp(L - L.max(axis=1, keepdims=True))
    W = W / W.sum(axis=1, keepdims=True)
    per = B // STRIDE
    score = np.zeros((nb, nb))
    for a in range(g):
        for c in range(a + 1):
            score[a // per, c // per] += W[a, c]
    return score


def m_xattention(h: Head, d: int) -> np.ndarray:
    if "xs" not in h.__dict__:
        h.xs = xattention_scores(h)
    return block_mask(h, d, h.xs)


def m_vertical_slash(h: Head, d: int) -> np.ndarray:
    n = h.n
    w = min(LAST, n)
    A = h.P[n - w:]  # exact causal rows of queries n−w..n−1
    c = A.sum(axis=0)
    s = np.zeros(n)
    for r in range(w):
        i = n - w + r
        for o in range(i + 1):
            s[o] += A[r, i - o]
    v = d // 2
    ns = min(SINKS, v, n)
    cols = list(range(ns)) + [j + ns for j in stable_top(c[ns:], v - ns)]
    offs = [0] + [o + 1 for o in stable_top(s[1:], d - v - 1)]
    M = np.zeros((n, n), dtype=bool)
    M[:, cols] = True
    i = np.arange(n)
    for o in offs:
        ok = i >= o
        M[i[ok], i[ok] - o] = True
    return M & h.causal


METHODS = {
    "window": m_window,
    "topk": m_topk,
    "streaming": m_streaming,
    "h2o": m_h2o,
    "quest": m_quest,
    "moba": m_moba,
    "block_sparse": m_block_sparse,
    "xattention": m_xattention,
    "vertical_slash": m_vertical_slash,
}


# ------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--qkv", action="append", required=True, help="FILE[:WINDOW] from dump-qkv (repeatable)")
    ap.add_argument("--csv", action="append", default=[], help="trials.csv of the sweep on the same dumps")
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--table", default="", help="comma-separated d values: print mean error/mass/keys per method")
    ap.add_argument("--methods", default=",".join(METHODS))
    args = ap.parse_args()
    methods = [m for m in args.methods.split(",") if m]

    heads = {}  # (window, head) -> Head
    for spec in args.qkv:
        path, _, win = spec.partition(":")
        win = int(win or 0)
        t = load_safetensors(path)
        q, k, v = t["q"], t["k"], t["v"]
        H, Hkv = q.shape[0], k.shape[0]
        if H % Hkv or k.shape != v.shape:
            print(f"bad shapes q {q.shape} k {k.shape} v {v.shape}", file=sys.stderr)
            return 2
        for hq in range(H):
            g = hq * Hkv // H
            heads[(win, hq)] = Head(q[hq], k[g], v[g])
        print(f"{path}: q {q.dtype} {q.shape}, k/v {k.shape} (H_kv = {Hkv})")

    cache = {}

    def ours(method, d, key):
        ck = (method, d, key)
        if ck not in cache:
            cache[ck] = heads[key].score(METHODS[method](heads[key], d), diagonal=method != "topk")
        return cache[ck]

    failed = False
    if args.csv:
        worst = defaultdict(lambda: {"rows": 0, "error": 0.0, "frob": 0.0, "mass": 0.0, "keys": 0.0})
        for path in args.csv:
            with open(path, newline="") as f:
                for row in csv.DictReader(f):
                    m = row["method"]
                    if m not in METHODS or m not in methods:
                        continue
                    key = (int(row["window"]), int(row["head"]))
                    if key not in heads:
                        continue
                    d = int(row["d"])
                    want = ours(m, d, key)
                    w = worst[m]
                    w["rows"] += 1
                    floor = 1e-6 * float(np.linalg.norm(heads[key].O, 2))
                    rel = lambda a, b: abs(a - b) / max(abs(b), floor)  # noqa: E731
                    w["error"] = max(w["error"], rel(float(row["error"]), want["error"]))
                    w["frob"] = max(w["frob"], rel(float(row["frob_error"]), want["frob_error"]))
                    w["mass"] = max(w["mass"], abs(float(row["mass"]) - want["mass"]))
                    w["keys"] = max(w["keys"], abs(float(row["keys"]) - want["keys"]))
                    bad = (rel(float(row["error"]), want["error"]) > args.tol
                           or abs(float(row["mass"]) - want["mass"]) > args.tol
                           or abs(float(row["keys"]) - want["keys"]) > 1e-9)
                    if bad:
                        failed = True
                        print(f"[FAIL] {m} d={d} window={key[0]} head={key[1]}: csv error {row['error']} mass "
                              f"{row['mass']} keys {row['keys']} | here {want['error']:.10g} {want['mass']:.10g} "
                              f"{want['keys']:.10g}")
        print(f"{'method':16} {'rows':>5} {'max rel err':>12} {'max rel frob':>12} {'max |Δmass|':>12} {'max |Δkeys|':>12}")
        for m in methods:
            if m in worst:
                w = worst[m]
                print(f"{m:16} {w['rows']:5d} {w['error']:12.2e} {w['frob']:12.2e} {w['mass']:12.2e} {w['keys']:12.2e}")
            else:
                print(f"{m:16} no rows in the CSV")
    if args.table:
        ds = [int(x) for x in args.table.split(",")]
        for m in methods:
            cells = []
            for d in ds:
                r = [ours(m, d, key) for key in heads]
                cells.append(f"{np.mean([x['error'] for x in r]):.3g} m{np.mean([x['mass'] for x in r]):.2f} "
                             f"k{np.mean([x['keys'] for x in r]):.0f}")
            print(f"{m:16} " + " | ".join(cells))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
