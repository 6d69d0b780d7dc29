#!/usr/bin/env python3
"""Independent float64 cross-check of approx-bench's decode-time KV-cache compression (METHODS.md §9,
``--decode N_F``) against a sweep's ``trials.csv``, row by row.

A second implementation written from ``../shared/METHODS.md`` §9 (and §7.1–7.2 for grouped-query heads and
the causal mask, §7.5.3 for Quest's page bound, §8.3/§8.5 for the quantized caches and the columns), not
from the Rust sources. Everything is numpy float64; the §8 quantizers and the §8.5 metrics are imported from
the sibling ``quant_dump.py`` (gguf-py for the ggml types).

Protocol (§9.1). A window of n tokens: prompt {0..n_p−1}, n_p = n − n_f, continuation F = {n_p..n−1}.
Per query head h (K/V head ⌊h·H_kv/H⌋) a method gives a kept set C_h ⊆ {0..n_p−1} (per-query methods:
C_{h,t}); row t ∈ F reads S_t = C_h ∪ {n_p..t}:

    O_t = Σ_{j≤t} e^{s_tj − m_t} v_j / Σ_{j≤t} e^{s_tj − m_t}          (exact causal row, s_tj = q_t·k_j/√p)
    Ô_t = Σ_{j∈S_t} e^{s_tj − m̂_t} v_j / Σ_{j∈S_t} e^{s_tj − m̂_t}      (restrict and renormalise, m̂_t over S_t)
    error = σ_max(O_F − Ô_F) (LAPACK SVD), frob_error, cos_sim, rel_l1, rmse over the flattened n_f×p
    matrices (§8.5, quant_dump.metrics), exact_norm = ‖O_F‖₂, rel_error = error/exact_norm,
    keys = mean_t |S_t|, mass = mean_t Σ_{j∈S_t} P_tj (P exact causal), kv_bits = 16,
    kv_read = (kv_bits/16)·Σ_t |S_t| / Σ_t (t+1),
    kv_union = |∪_{g in the K/V group} C_g| (per-query methods: mean_t |∪_g C_{g,t}|), prompt keys only.

Methods (§9.2; w = 32; every top-k is a stable sort of −score: ties to the lower index, also after
pooling; d ≥ n_p keeps all n_p prompt keys for every method, whatever its schedule):
    dec_window     the last d prompt tokens.
    dec_streaming  tokens 0..3 and the last d − 4 prompt tokens; d < 8 is refused (a row there fails).
    snapkv         a_j = Σ_{i=n_p−w}^{n_p−1} A_ij for j < n_p − w, A_i the causal softmax row of prompt query i
                   over keys 0..i; max_pool1d(7, pad 3, −∞ padding); C = top(d − w) ∪ {n_p−w..n_p−1}.
    snapkv_avg5    as snapkv with avg_pool1d(5, pad 2), zeros counted (always /5).
    pyramidkv      snapkv's pooled scores; budget of layer ℓ of L: n_p < 2(d−w) → d − w; else
                   mn = (d−w)//20, mx = 2(d−w) − mn, if mx ≥ n_p − w: mx = n_p − w, mn = 2(d−w) − mx;
                   steps = (mx − mn)//(L − 1); keep = mx − ℓ·steps pooled tokens ∪ the window.
    adakv          B = d − w; per query head (its own K/V head) the window-mean scores, max-pooled 7; the H·B
                   largest of all H heads' pooled scores (ties: lower head, then lower position) give c_h;
                   cap_h = round_half_even(0.8·c_h + int(0.2·B)); head h keeps its top cap_h ∪ the window.
    h2o_dec        a_j = Σ_{i<n_p} P_ij (prompt causal rows, row i over keys ≤ i); r = d − ⌊d/2⌋;
                   C = top ⌊d/2⌋ of a over j < n_p − r ∪ {n_p−r..n_p−1}.
    tova           mean over all H query heads of the softmax row of prompt query n_p − 1 over keys 0..n_p−1
                   (each with its K/V head); C = top d; one set for every head.
    quest_dec      pages of 16 tokens from token 0 over the prompt (a partial last page bounded over its real
                   tokens); per t the ⌈d/16⌉ pages with the largest U(q_t, page) = Σ_c max(q_c·m_c, q_c·M_c)
                   (ties to the lower page); all pages when ⌈d/16⌉ ≥ the page count.
    topk_dec       per t the top d prompt keys by q_t·k_j.
    evict_oracle   top d of a_j = Σ_{t∈F} P_tj over j < n_p (P_t the exact causal row t over j ≤ t).
    snapkv, snapkv_avg5, pyramidkv and adakv at d ≤ w are dec_window at that d.

§8 caches under the protocol (d = 0, mass = 1, keys = mean_{t∈F}(t+1) = n_p + (n_f+1)/2,
kv_read = kv_bits/16, kv_union = n_p when the column is filled):
    kv_f16 kv_bf16 kv_fp8 kv_q8_0 kv_q5_1 kv_q5_0 kv_q4_1 kv_q4_0: §8.3's causal computation on all n tokens
        (K̂, V̂ of the K/V head's whole window, kv_fp8's scale over it; Q̂ per query head as §8.3), rows F only;
        kv_bits = §8.3's figure (16, 16, 8, 8.5, 6, 5.5, 5, 4.5).
    kivi4 kivi2: K̂ per channel in groups of 32 tokens from token 0, V̂ per token in groups of 32 channels (the
        quantized value of a token does not depend on t); row t reads K̂_j for j < T_K(t) = (t+1) − (t+1) mod 128
        and V̂_j for j < T_V(t) = max(t + 1 − 128, 0), K_j and V_j otherwise. kv_bits is the read-weighted mean
        of the bits per value read:
            kv_bits = Σ_{t∈F} [ (b+1)·(T_K + T_V) + 16·(2(t+1) − T_K − T_V) ] / Σ_{t∈F} 2(t+1),
        b + 1 bits for a quantized value (b + 32/G with an f16 scale and zero per group of G = 32), 16 for a
        full-precision one.
    sage* rows are not computed here (the protocol names only the cache types); they are counted as skipped.

Readings where §9 leaves room (the Rust side is to make the same ones; they change numbers):
  1. SnapKV's window rows are normalised over all their keys ≤ i (the window's own causal block included), the
     scores summed over the 32 rows; Ada-KV ranks the window mean (sum/32: the same order, exact ties kept).
  2. PyramidKV: d ≥ n_p → everything; d ≤ 32 → dec_window; then the schedule above, with ℓ and L from the
     manifest's "decode" object (or --layer-index/--layers). keep may be 0 (window only).
  3. Ada-KV: all H query heads of the dump; the cross-head top H·B is taken on the pooled scores; each head then
     keeps its own top cap_h pooled positions (cap_h may exceed d − w); int(0.2·B) = ⌊B/5⌋ for every B < 10^5.
  4. H2O: the heavy top ⌊d/2⌋ is taken among j < n_p − r only, so heavy and recent sets are disjoint and |C| = d.
  5. TOVA averages the probabilities (softmax rows), not the logits, over the H query heads.
  6. Quest: only prompt pages compete (decoded tokens are always read, §9.1), ⌈d/16⌉ pages (not max(3, …)), no
     forced last page; |C_{h,t}| may exceed d (whole pages) or fall short (the partial last page).
  7. evict_oracle's P_t is normalised over all keys ≤ t (continuation keys included), as the exact target.
  8. kv_union is over the query heads of the row's K/V group (the dump has them all), prompt keys only;
     n_p for every method at d ≥ n_p, and for the §8 caches (every prompt key is read) should the tool fill it
     there (it leaves it empty, and an empty cell is not compared).
  9. KIVI kv_bits as above (per-value bits weighted by the values each row reads; K and V count equally).

Inputs: ``approx-bench dump-qkv`` files (q [H, n, p], k and v [H_kv, n, p], F64 under --dtype f64; the
sidecar <file>.json gives model_id, layer, n, window), the sweep's trials.csv (columns read by name; ``n_f``
non-empty marks a decode row) and its manifest.json (default: beside the CSV) whose ``"decode": {"n_f",
"layer", "layers"}`` gives PyramidKV's ℓ and L; --n-f, --layer-index, --layers override it.

Comparisons, per CSV row of a method implemented here:
  error, frob_error, rmse, rel_l1, exact_norm, rel_error: relative difference ≤ --tol (default 1e-6), with a floor
      (1e-6·‖O_F‖₂ for the norms, 1e-6 for rel_l1 and rel_error) so that exact rows (d ≥ n_p) compare;
  cos_sim: 1 − cos_sim relative ≤ --tol, or |Δ| ≤ 1e-12;
  mass, keys: |Δ| ≤ 1e-9;  kv_read, kv_bits: |Δ| ≤ 1e-12 (kivi: 1e-9);  kv_union: exact when filled;
  d as written (0 for the caches), nonfinite_rows 0, kv_head = ⌊h·H_kv/H⌋ when present.
A failing row prints both values and, for a selected set, the smallest relative gap between distinct scores
at a selection cut (exact ties, common after max pooling, are decided by the lower-index rule on both sides; a
gap at rounding level would mean the two implementations may legitimately keep different sets: it is printed,
never used to pass a row; per-query methods report the smallest over the rows t). Exit 0 when all agree, 1
otherwise, 2 on bad input.

--self-test (seconds, no files) asserts on random Gaussian data (GQA, H = 4, H_kv = 2): d ≥ n_p is exact for
every method; the restricted evaluation equals a dense-mask masked softmax; dec_window/dec_streaming sets by
hand; max-pool ties to the lower index, avg-pool zeros counted; PyramidKV at METHODS.md's example; Ada-KV caps and
the cross-head tie rule on hand examples; evict_oracle's mass ≥ every static method's of no more keys; topk_dec
maximises each row's logit sum; quest_dec's pages (partial last page); KIVI with identity quantizers is exact and
its read-weighted kv_bits equals a per-row count; the §8 caches with identity quantizers are exact.

Run (from the repository root):
    B=./target/release/approx-bench
    M="--model pretrained --model-dir ../shared/data/SmolLM2-135M-Instruct-Q4_1 --corpus ../shared/data/wikitext-2/wiki.test.raw"
    $B dump-qkv $M --layer 15 --length 1024 --window 0 --dtype f64 --out /tmp/decref/l15.safetensors
    $B $M --layer 15 --lengths 1024 --windows 1 --dtype f64 --decode 256 --features 16,32,64,100,256,768,1024 \\
       --methods decode --out /tmp/decref/l15 --quiet
    python3 tests/reference/decode_dump.py --qkv /tmp/decref/l15.safetensors --csv /tmp/decref/l15/trials.csv
    python3 tests/reference/decode_dump.py --self-test

Checked against the tool (build of 2026-11-27, SmolLM2-135M f64 dumps): layer 15, n = 1024, n_f = 256, window 0,
d = 16..1024, 11 §9 methods (693 rows) and the 10 caches (90 rows); layer 0, n = 1000, n_f = 100 (a partial last
Quest page), window 1, d = 8..1000 through every PyramidKV branch (1278 rows): all agree, the largest relative
difference in error 6e-13 (topk_dec) where d < n_p.

Needs numpy, and gguf (pip package) for the ggml cache types. n = 1024, n_f = 256, 9 heads, 8 values of d and
every method: a few seconds on one core.
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

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import quant_dump as qd  # noqa: E402  (§8 quantizers, metrics, safetensors loader)

W = 32  # SnapKV observation window (§9.2)
BETA = 20  # PyramidKV
ALPHA = 0.2  # Ada-KV floor
SINKS = 4  # dec_streaming
PAGE = 16  # quest_dec
R_KIVI = qd.R  # 128

EVICT_METHODS = ["dec_window", "dec_streaming", "snapkv", "snapkv_avg5", "pyramidkv", "adakv", "h2o_dec", "tova",
                 "quest_dec", "topk_dec", "evict_oracle"]
PER_QUERY = {"quest_dec", "topk_dec"}
SNAP_FAMILY = {"snapkv", "snapkv_avg5", "pyramidkv", "adakv"}
CACHE_METHODS = ["kv_f16", "kv_bf16", "kv_fp8", "kv_q8_0", "kv_q5_1", "kv_q5_0", "kv_q4_1", "kv_q4_0",
                 "kivi4", "kivi2"]
METHODS = EVICT_METHODS + CACHE_METHODS


class Refused(Exception):
    """The method is refused at this (d, n_p) (a usage error on the tool's side: no row may exist)."""


# ------------------------------------------------------------------------------------------
# selection helpers


def stable_order(values: np.ndarray) -> np.ndarray:
    """Indices by descending value, ties to the lower index (a stable sort of −values)."""
    return np.argsort(-np.asarray(values, dtype=np.float64), kind="stable")


def top_mask(values: np.ndarray, m: int) -> tuple[np.ndarray, float]:
    """Boolean mask of the m largest (ties to the lower index) and the relative gap at the cut between
    distinct scores (inf when nothing is cut). An exact tie across the cut is decided by the lower-index rule,
    so the gap is then measured from the tied value to the nearest different kept or dropped value."""
    values = np.asarray(values, dtype=np.float64)
    out = np.zeros(values.shape[0], dtype=bool)
    m = max(0, min(m, values.shape[0]))
    order = stable_order(values)
    out[order[:m]] = True
    gap = math.inf
    if 0 < m < values.shape[0]:
        sv = values[order]
        a, b = sv[m - 1], sv[m]
        rel = lambda x, y: abs(x - y) / max(abs(x), abs(y), 1e-300)  # noqa: E731
        if a != b:
            gap = rel(a, b)
        else:
            above, below = sv[:m][sv[:m] != a], sv[m:][sv[m:] != a]
            if above.size:
                gap = min(gap, rel(above[-1], a))
            if below.size:
                gap = min(gap, rel(a, below[0]))
    return out, gap


def max_pool(s: np.ndarray, k: int = 7) -> np.ndarray:
    """max_pool1d(kernel k, padding k//2, stride 1), −∞ padding: same length."""
    h = k // 2
    pad = np.concatenate([np.full(h, -np.inf), s, np.full(h, -np.inf)])
    return np.lib.stride_tricks.sliding_window_view(pad, k).max(axis=1)


def avg_pool(s: np.ndarray, k: int = 5) -> np.ndarray:
    """avg_pool1d(kernel k, padding k//2, stride 1), zero padding counted (always /k)."""
    h = k // 2
    pad = np.concatenate([np.zeros(h), s, np.zeros(h)])
    return np.lib.stride_tricks.sliding_window_view(pad, k).sum(axis=1) / k


def pyramid_keep(d: int, n_p: int, layer: int, layers: int) -> int:
    """PyramidKV's pooled-token count for layer ℓ of L at average budget d (d > w, d < n_p); the window is
    added on top."""
    if layers < 2:
        raise Refused("pyramidkv: L < 2 is refused")
    if not 0 <= layer < layers:
        raise Refused(f"pyramidkv: layer {layer} outside 0..{layers - 1}")
    if n_p < 2 * (d - W):
        return d - W  # uniform SnapKV
    mn = (d - W) // BETA
    mx = 2 * (d - W) - mn
    if mx >= n_p - W:
        mx = n_p - W
        mn = 2 * (d - W) - mx
    steps = (mx - mn) // (layers - 1)
    return mx - layer * steps


def adakv_counts(pooled: np.ndarray, B: int) -> np.ndarray:
    """c_h: how many of the H·B largest entries of the [H, L0] pooled scores fall in head h; ties to the lower
    head, then the lower position (a stable sort of the head-major flattening)."""
    H, L0 = pooled.shape
    order = stable_order(pooled.reshape(-1))[: H * B]
    return np.bincount(order // L0, minlength=H)


def adakv_caps(pooled: np.ndarray, B: int) -> np.ndarray:
    c = adakv_counts(pooled, B)
    return np.rint(c * (1 - ALPHA) + int(ALPHA * B)).astype(int)  # torch.round: half to even


# ------------------------------------------------------------------------------------------
# one query head under the protocol


def softmax_rows(S: np.ndarray, M: np.ndarray) -> np.ndarray:
    """Masked softmax of each row of S over M (every row has a key)."""
    Sm = np.where(M, S, -np.inf)
    m = Sm.max(axis=1, keepdims=True)
    E = np.exp(Sm - m)
    return E / E.sum(axis=1, keepdims=True)


class HeadCtx:
    """Per query head h: the exact rows of F and the per-head products that every d reuses."""

    def __init__(self, q, k, v, n_f: int, kv_head: int):
        self.Q, self.K, self.V = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
        self.n, self.p = self.Q.shape
        self.n_f, self.n_p = n_f, self.n - n_f
        if not 0 < n_f < self.n:
            raise ValueError(f"n_f = {n_f} outside 1..n−1 (n = {self.n})")
        self.kv_head = kv_head
        self.scale = 1.0 / math.sqrt(self.p)
        n, n_p = self.n, self.n_p
        self.t = np.arange(n_p, n)  # the rows F
        self.causal_F = np.arange(n)[None, :] <= self.t[:, None]  # [n_f, n]
        self.tri = np.tril(np.ones((n_f, n_f), dtype=bool))
        self.SF = (self.Q[n_p:] @ self.K.T) * self.scale  # [n_f, n] logits
        self.PF = softmax_rows(self.SF, self.causal_F)  # exact causal rows of F
        self.OF = self.PF @ self.V
        self.exact_norm = float(np.linalg.norm(self.OF, 2))
        self.dense_reads = float(np.sum(self.t + 1))  # Σ_{t∈F} (t+1)
        self._cache = {}

    def lazy(self, name, fn):
        if name not in self._cache:
            self._cache[name] = fn()
        return self._cache[name]

    # prompt-side products -------------------------------------------------------------

    def snap_raw(self) -> np.ndarray:
        """s_j = Σ_{i=n_p−w}^{n_p−1} A_ij, j < n_p − w; A_i the causal softmax row of prompt query i over 0..i."""
        def f():
            n_p = self.n_p
            i = np.arange(n_p - W, n_p)
            S = (self.Q[i] @ self.K[:n_p].T) * self.scale
            A = softmax_rows(S, np.arange(n_p)[None, :] <= i[:, None])
            return A[:, : n_p - W].sum(axis=0)
        return self.lazy("snap_raw", f)

    def snap_pooled(self, kind: str) -> np.ndarray:
        if kind == "max":
            return self.lazy("snap_max", lambda: max_pool(self.snap_raw(), 7))
        if kind == "avg":
            return self.lazy("snap_avg", lambda: avg_pool(self.snap_raw(), 5))
        if kind == "mean_max":  # Ada-KV: the window mean, max-pooled
            return self.lazy("snap_mean_max", lambda: max_pool(self.snap_raw() / W, 7))
        raise KeyError(kind)

    def h2o_scores(self) -> np.ndarray:
        """Column sums of the prompt's exact causal rows (row i over keys ≤ i), j < n_p."""
        def f():
            n_p = self.n_p
            S = (self.Q[:n_p] @ self.K[:n_p].T) * self.scale
            return softmax_rows(S, np.tril(np.ones((n_p, n_p), dtype=bool))).sum(axis=0)
        return self.lazy("h2o", f)

    def tova_row(self) -> np.ndarray:
        """Softmax row of prompt query n_p − 1 over keys 0..n_p−1."""
        def f():
            n_p = self.n_p
            s = (self.K[:n_p] @ self.Q[n_p - 1]) * self.scale
            e = np.exp(s - s.max())
            return e / e.sum()
        return self.lazy("tova", f)

    def evict_scores(self) -> np.ndarray:
        return self.lazy("evict", lambda: self.PF[:, : self.n_p].sum(axis=0))

    def topk_rank(self):
        """rank[t, j] of prompt key j in row t's descending logit order (ties to the lower index), and the
        sorted logits."""
        def f():
            L = self.SF[:, : self.n_p]
            order = np.argsort(-L, axis=1, kind="stable")
            rank = np.empty_like(order)
            rows = np.arange(L.shape[0])[:, None]
            rank[rows, order] = np.arange(L.shape[1])[None, :]
            return rank, np.take_along_axis(L, order, axis=1)
        return self.lazy("topk", f)

    def quest_rank(self):
        """Page ranks per t by U(q_t, page) (ties to the lower page), the sorted U, and the page of each
        prompt key."""
        def f():
            n_p, p = self.n_p, self.p
            npg = -(-n_p // PAGE)
            lo = np.empty((npg, p))
            hi = np.empty((npg, p))
            for c in range(npg):
                blk = self.K[c * PAGE: min((c + 1) * PAGE, n_p)]
                lo[c], hi[c] = blk.min(axis=0), blk.max(axis=0)
            q = self.Q[n_p:][:, None, :]  # [n_f, 1, p]
            U = np.maximum(q * lo[None], q * hi[None]).sum(axis=2)  # [n_f, pages]
            order = np.argsort(-U, axis=1, kind="stable")
            rank = np.empty_like(order)
            rank[np.arange(U.shape[0])[:, None], order] = np.arange(npg)[None, :]
            return rank, np.take_along_axis(U, order, axis=1), np.arange(n_p) // PAGE
        return self.lazy("quest", f)

    # evaluation -----------------------------------------------------------------------

    def evaluate(self, C: np.ndarray) -> dict:
        """Restrict-and-renormalise rows F over S_t = C ∪ {n_p..t}; C is [n_p] (static) or [n_f, n_p]."""
        n_f, n_p = self.n_f, self.n_p
        M = np.zeros((n_f, self.n), dtype=bool)
        M[:, :n_p] = C
        M[:, n_p:] = self.tri
        Oh = softmax_rows(self.SF, M) @ self.V
        r = qd.metrics(self.OF, Oh)
        sizes = M.sum(axis=1)
        r["exact_norm"] = self.exact_norm
        r["rel_error"] = r["error"] / self.exact_norm
        r["keys"] = float(sizes.mean())
        r["mass"] = float(np.sum(self.PF * M, axis=1).mean())
        r["kv_bits"] = 16.0
        r["kv_read"] = float(sizes.sum()) / self.dense_reads
        return r


# ------------------------------------------------------------------------------------------
# a layer (one dump): the sets of every method, per query head


class Layer:
    def __init__(self, q, k, v, n_f: int, layer_index=None, layers=None, fmt=None):
        H, Hkv = q.shape[0], k.shape[0]
        self.H, self.Hkv = H, Hkv
        self.heads = [HeadCtx(q[h], k[h * Hkv // H], v[h * Hkv // H], n_f, h * Hkv // H) for h in range(H)]
        self.n, self.n_f, self.p = q.shape[1], n_f, q.shape[2]
        self.n_p = self.n - n_f
        self.layer_index, self.layers = layer_index, layers
        self.k, self.v = np.asarray(k, dtype=np.float64), np.asarray(v, dtype=np.float64)
        self.fmt = fmt or qd.Fmt()
        self._sets = {}
        self._res = {}
        self._groups = {}

    # sets -----------------------------------------------------------------------------

    def kept(self, method: str, d: int, h: int):
        """(C, gap): C the kept prompt set of query head h ([n_p] or [n_f, n_p] bool), gap the smallest
        relative score gap at a selection cut (inf when no score decides)."""
        key = (method, d)
        if key not in self._sets:
            try:
                self._sets[key] = self._layer_sets(method, d)
            except Refused as e:
                self._sets[key] = e
        r = self._sets[key]
        if isinstance(r, Refused):
            raise r
        return r[h]

    def _layer_sets(self, method: str, d: int) -> list:
        n_p, H = self.n_p, self.H
        if method not in EVICT_METHODS:
            raise KeyError(method)
        if d < 1:
            raise Refused(f"{method}: d = {d}")
        if method == "dec_streaming" and d < 2 * SINKS:
            raise Refused(f"dec_streaming: d = {d} < 8 is refused")
        if method == "pyramidkv" and (self.layers is None or self.layer_index is None):
            raise Refused("pyramidkv: the layer index ℓ and the layer count L are unknown (manifest "
                          "'decode' or --layer-index/--layers)")
        if method == "pyramidkv" and self.layers < 2:
            raise Refused("pyramidkv: L < 2 is refused")
        if d >= n_p:  # every method keeps everything (§9.1)
            full = np.ones(n_p, dtype=bool)
            return [(full, math.inf)] * H
        if method in SNAP_FAMILY and d <= W:
            method = "dec_window"
        if method == "dec_window":
            C = np.zeros(n_p, dtype=bool)
            C[n_p - d:] = True
            return [(C, math.inf)] * H
        if method == "dec_streaming":
            C = np.zeros(n_p, dtype=bool)
            C[:SINKS] = True
            C[n_p - (d - SINKS):] = True
            return [(C, math.inf)] * H
        if method in ("snapkv", "snapkv_avg5", "pyramidkv"):
            keep = d - W if method != "pyramidkv" else pyramid_keep(d, n_p, self.layer_index, self.layers)
            out = []
            for hc in self.heads:
                pooled = hc.snap_pooled("avg" if method == "snapkv_avg5" else "max")
                top, gap = top_mask(pooled, keep)
                C = np.zeros(n_p, dtype=bool)
                C[: n_p - W] = top
                C[n_p - W:] = True
                out.append((C, gap))
            return out
        if method == "adakv":
            B = d - W
            pooled = np.stack([hc.snap_pooled("mean_max") for hc in self.heads])
            caps = adakv_caps(pooled, B)
            flat = pooled.reshape(-1)
            _, cross_gap = top_mask(flat, H * B)
            out = []
            for h, hc in enumerate(self.heads):
                top, gap = top_mask(pooled[h], int(caps[h]))
                C = np.zeros(n_p, dtype=bool)
                C[: n_p - W] = top
                C[n_p - W:] = True
                out.append((C, min(gap, cross_gap)))
            return out
        if method == "h2o_dec":
            hh = d // 2
            r = d - hh
            out = []
            for hc in self.heads:
                top, gap = top_mask(hc.h2o_scores()[: n_p - r], hh)
                C = np.zeros(n_p, dtype=bool)
                C[: n_p - r] = top
                C[n_p - r:] = True
                out.append((C, gap))
            return out
        if method == "tova":
            a = np.mean([hc.tova_row() for hc in self.heads], axis=0)
            C, gap = top_mask(a, d)
            return [(C, gap)] * H
        if method == "evict_oracle":
            return [top_mask(hc.evict_scores(), d) for hc in self.heads]
        if method == "topk_dec":
            out = []
            for hc in self.heads:
                rank, sv = hc.topk_rank()
                a, b = sv[:, d - 1], sv[:, d]
                gap = float(np.min(np.abs(a - b) / np.maximum(np.maximum(np.abs(a), np.abs(b)), 1e-300)))
                out.append((rank < d, gap))
            return out
        if method == "quest_dec":
            m = -(-d // PAGE)
            out = []
            for hc in self.heads:
                rank, sv, page_of = hc.quest_rank()
                npg = sv.shape[1]
                if m >= npg:
                    out.append((np.ones((self.n_f, n_p), dtype=bool), math.inf))
                    continue
                a, b = sv[:, m - 1], sv[:, m]
                gap = float(np.min(np.abs(a - b) / np.maximum(np.maximum(np.abs(a), np.abs(b)), 1e-300)))
                out.append(((rank < m)[:, page_of], gap))
            return out
        raise KeyError(method)

    def kv_union(self, method: str, d: int, g: int) -> float:
        """|∪ C_h| over the query heads h of K/V head g (per-query methods: mean over t)."""
        members = [h for h in range(self.H) if h * self.Hkv // self.H == g]
        sets = [self.kept(method, d, h)[0] for h in members]
        U = np.logical_or.reduce(sets)
        return float(U.sum(axis=-1).mean()) if U.ndim == 2 else float(U.sum())

    # results --------------------------------------------------------------------------

    def result(self, method: str, d: int, h: int) -> dict:
        key = (method, d, h)
        if key not in self._res:
            try:
                if method in EVICT_METHODS:
                    C, gap = self.kept(method, d, h)
                    r = self.heads[h].evaluate(C)
                    r["gap"] = gap
                    r["kv_union"] = self.kv_union(method, d, self.heads[h].kv_head)
                    r["d"] = d
                else:
                    r = self.cache_result(method, h)
                self._res[key] = r
            except (Refused, qd.UsageError) as e:
                self._res[key] = e
        r = self._res[key]
        if isinstance(r, Exception):
            raise r
        return r

    def group_cache(self, method: str, g: int):
        """K̂, V̂ of K/V head g over all n tokens (§8.3), shared by its query heads."""
        key = (method, g)
        if key not in self._groups:
            try:
                if method.startswith("kivi"):
                    b = int(method[4:])
                    if self.p % qd.G:
                        raise qd.UsageError(f"{method}: the head dimension p = {self.p} is not a multiple of 32")
                    self._groups[key] = (qd.kivi_k(self.fmt, self.k[g], b), qd.kivi_v(self.fmt, self.v[g], b))
                else:
                    self._groups[key] = qd.kv_prepare(method, self.fmt, self.k[g], self.v[g])
            except qd.UsageError as e:
                self._groups[key] = e
        r = self._groups[key]
        if isinstance(r, Exception):
            raise r
        return r

    def cache_result(self, method: str, h: int) -> dict:
        hc = self.heads[h]
        n_p, n = hc.n_p, hc.n
        Kh, Vh = self.group_cache(method, hc.kv_head)
        QF = hc.Q[n_p:]
        if method.startswith("kivi"):
            b = int(method[4:])
            t1 = hc.t + 1
            TK = t1 - t1 % R_KIVI
            TV = np.maximum(t1 - R_KIVI, 0)
            j = np.arange(n)[None, :]
            kq = j < TK[:, None]
            vq = j < TV[:, None]
            S = np.where(kq, QF @ Kh.T, QF @ hc.K.T) * hc.scale
            Wt = softmax_rows(S, hc.causal_F)
            Oh = np.where(vq, Wt, 0.0) @ Vh + np.where(vq, 0.0, Wt) @ hc.V
            bits = np.sum((b + 1) * (TK + TV) + 16 * (2 * t1 - TK - TV)) / np.sum(2 * t1)
            kv_bits = float(bits)
        else:
            Qh = qd.kv_query(method, self.fmt, QF)
            S = (Qh @ Kh.T) / math.sqrt(hc.p)  # 1/√p after the dot product (§8.1)
            Oh = softmax_rows(S, hc.causal_F) @ Vh
            kv_bits = qd.kv_bits(method, n)
        r = qd.metrics(hc.OF, Oh)
        r["exact_norm"] = hc.exact_norm
        r["rel_error"] = r["error"] / hc.exact_norm
        r["keys"] = float(np.mean(hc.t + 1))
        r["mass"] = 1.0
        r["kv_bits"] = kv_bits
        r["kv_read"] = kv_bits / 16
        r["kv_union"] = float(n_p)
        r["gap"] = math.inf
        r["d"] = 0
        return r


# ------------------------------------------------------------------------------------------
# self-test (no files)


def random_problem(rng, H, Hkv, n, p, sink=True):
    q = rng.standard_normal((H, n, p)) * 1.5
    k = rng.standard_normal((Hkv, n, p)) * 1.5 + rng.standard_normal((Hkv, 1, p)) * 2
    v = rng.standard_normal((Hkv, n, p))
    if sink:
        k[:, 0] *= 0.2
        q[:, :, :4] += 3
    return q, k, v


def selftest() -> int:
    t0 = time.time()
    fails = []

    def check(ok, what):
        print(f"[{'ok' if ok else 'FAIL'}] {what}")
        if not ok:
            fails.append(what)

    rng = np.random.default_rng(9)
    H, Hkv, n, p, n_f = 4, 2, 200, 64, 40
    n_p = n - n_f
    q, k, v = random_problem(rng, H, Hkv, n, p)
    lay = Layer(q, k, v, n_f, layer_index=1, layers=4)

    # 1. d ≥ n_p: exact for every method
    worst, ok_keys = 0.0, True
    for m in EVICT_METHODS:
        for d in (n_p, n_p + 7):
            for h in range(H):
                r = lay.result(m, d, h)
                worst = max(worst, r["error"] / r["exact_norm"])
                ok_keys &= (abs(r["keys"] - np.mean(np.arange(n_p, n) + 1)) < 1e-12 and abs(r["kv_read"] - 1) < 1e-15
                            and abs(r["mass"] - 1) < 1e-12 and r["kv_union"] == n_p)
    check(worst < 1e-13 and ok_keys, f"d ≥ n_p: all {len(EVICT_METHODS)} methods exact (max rel error {worst:.1e}), "
                                     f"keys = mean(t+1), mass = 1, kv_read = 1, kv_union = n_p")

    # 2. restricted evaluation = a dense n×n masked softmax (prefill_dump's oracle) on rows F
    hc = lay.heads[3]
    C = rng.random(n_p) < 0.3
    Mfull = np.tril(np.ones((n, n), dtype=bool))
    Mfull[n_p:, :n_p] &= C[None, :]
    Sfull = hc.Q @ hc.K.T / math.sqrt(p)
    Sm = np.where(Mfull, Sfull, -np.inf)
    Wd = np.exp(Sm - Sm.max(axis=1, keepdims=True))
    Wd /= Wd.sum(axis=1, keepdims=True)
    Od = (Wd @ hc.V)[n_p:]
    Se = np.where(np.tril(np.ones((n, n), dtype=bool)), Sfull, -np.inf)
    Pe = np.exp(Se - Se.max(axis=1, keepdims=True))
    Pe /= Pe.sum(axis=1, keepdims=True)
    Oe = (Pe @ hc.V)[n_p:]
    r = hc.evaluate(C)
    E = Oe - Od
    sizes = Mfull[n_p:].sum(axis=1)
    check(abs(r["error"] - np.linalg.svd(E, compute_uv=False)[0]) < 1e-12 * max(1, r["error"])
          and abs(r["frob_error"] - np.sqrt((E ** 2).sum())) < 1e-12
          and abs(r["exact_norm"] - np.linalg.svd(Oe, compute_uv=False)[0]) < 1e-12 * r["exact_norm"]
          and abs(r["mass"] - (Pe[n_p:] * Mfull[n_p:]).sum(axis=1).mean()) < 1e-14
          and abs(r["keys"] - (C.sum() + (n_f + 1) / 2)) < 1e-12
          and abs(r["kv_read"] - sizes.sum() / np.sum(np.arange(n_p, n) + 1)) < 1e-15,
          "restrict-and-renormalise over S_t = C ∪ {n_p..t} = a dense masked softmax on rows F (error, frob, "
          "exact_norm, mass, keys = |C| + (n_f+1)/2, kv_read)")

    # 3. dec_window / dec_streaming by hand
    Cw = lay.kept("dec_window", 10, 0)[0]
    Cs = lay.kept("dec_streaming", 10, 2)[0]
    check(list(np.flatnonzero(Cw)) == list(range(150, 160)), "dec_window d = 10, n_p = 160: keys 150..159")
    check(list(np.flatnonzero(Cs)) == [0, 1, 2, 3] + list(range(154, 160)),
          "dec_streaming d = 10: keys 0..3 and 154..159")
    try:
        lay.kept("dec_streaming", 7, 0)
        check(False, "dec_streaming d = 7 is refused")
    except Refused:
        check(True, "dec_streaming d = 7 is refused")
    same = all(np.array_equal(lay.kept(m, 32, h)[0], lay.kept("dec_window", 32, h)[0])
               and np.array_equal(lay.kept(m, 20, h)[0], lay.kept("dec_window", 20, h)[0])
               for m in SNAP_FAMILY for h in range(H))
    check(same, "snapkv, snapkv_avg5, pyramidkv, adakv at d = 20 and 32 (≤ w) are dec_window")

    # 4. pooling and ties
    s = np.zeros(20)
    s[6], s[19] = 5.0, 3.0
    pm = max_pool(s, 7)
    t1, _ = top_mask(pm, 1)
    t8, _ = top_mask(pm, 8)
    check(list(np.flatnonzero(pm == 5)) == list(range(3, 10)) and list(np.flatnonzero(t1)) == [3]
          and list(np.flatnonzero(t8)) == list(range(3, 10)) + [16],
          "max_pool 7: a spike at 6 ties positions 3..9; top 1 = {3}; top 8 = {3..9, 16} (ties to the lower index)")
    s = np.zeros(10)
    s[0] = 1.0
    pa = avg_pool(s, 5)
    check(pa[0] == 0.2 and pa[2] == 0.2 and pa[3] == 0.0 and np.isclose(avg_pool(np.ones(10))[0], 0.6),
          "avg_pool 5: zero padding counted (ones -> 3/5 at the edge)")
    # SnapKV end-to-end on real scores: window kept, |C| = d, set = top(d−w) of the pooled raw sums
    hc0 = lay.heads[0]
    raw = np.zeros(n_p - W)
    for i in range(n_p - W, n_p):
        sc = hc0.Q[i] @ hc0.K[: i + 1].T / math.sqrt(p)
        e = np.exp(sc - sc.max())
        raw += (e / e.sum())[: n_p - W]
    Csn = lay.kept("snapkv", 50, 0)[0]
    pooled = np.array([raw[max(0, j - 3): j + 4].max() for j in range(n_p - W)])
    ref = sorted(sorted(range(n_p - W), key=lambda j: (-pooled[j], j))[:18])
    check(np.allclose(raw, hc0.snap_raw(), rtol=1e-13, atol=0) and Csn[n_p - W:].all() and Csn.sum() == 50
          and list(np.flatnonzero(Csn[: n_p - W])) == ref,
          "snapkv d = 50: the window's 32 keys + top 18 of the max-pooled window column sums (loop oracle)")

    # 5. PyramidKV budgets (METHODS.md §9.2's example) and branches
    ks = [pyramid_keep(64, 1792, l, 30) for l in range(30)]
    check(ks[0] == 63 and ks[1] == 61 and ks[29] == 5 and np.mean(ks) == 34,
          f"pyramidkv d = 64, n_p = 1792, L = 30: layer 0 keeps {ks[0]}, 1 {ks[1]}, 29 {ks[29]}, mean {np.mean(ks)}")
    check(pyramid_keep(100, 130, 3, 30) == 68, "pyramidkv: n_p < 2(d − w) is uniform SnapKV (d − w)")
    # mx clipped: d = 100, n_p = 150: mn = 3, mx = 133 ≥ 118 -> mx = 118, mn = 18, steps = 100 // 29 = 3
    check(pyramid_keep(100, 150, 0, 30) == 118 and pyramid_keep(100, 150, 29, 30) == 118 - 29 * 3,
          "pyramidkv: max ≥ n_p − w clips max to n_p − w and raises min (layer 0 keeps all pooled positions)")
    Cp = lay.kept("pyramidkv", 50, 1)[0]  # n_p = 160, d = 50: 2(d−w) = 36 ≤ 160
    kp = pyramid_keep(50, 160, 1, 4)
    # 2(d−w) = 36 ≤ 160: mn = 0, mx = 36, steps = 36 // 3 = 12, layer 1 keeps 24
    check(kp == 24 and Cp.sum() == 24 + W and Cp[n_p - W:].all()
          and np.array_equal(Cp[: n_p - W], top_mask(lay.heads[1].snap_pooled("max"), 24)[0]),
          f"pyramidkv d = 50, n_p = 160, ℓ = 1 of L = 4 keeps {kp} (= 24) max-pooled + the window")

    # 6. Ada-KV caps by hand
    pooled = np.array([[9.0] * 8, [5, 5, 5, 5, 1, 1, 1, 1], [5, 0, 0, 0, 0, 0, 0, 0]])
    c4, cap4 = adakv_counts(pooled, 4).tolist(), adakv_caps(pooled, 4).tolist()
    check(c4 == [8, 4, 0] and cap4 == [6, 3, 0],
          f"adakv B = 4: counts {c4} (the 5 at head 2 loses the tie to head 1's 5s: lower head first), "
          f"caps {cap4} = round(0.8·c), Σ 9 < H·B = 12")
    c5, cap5 = adakv_counts(pooled, 5).tolist(), adakv_caps(pooled, 5).tolist()
    check(c5 == [8, 6, 1] and cap5 == [7, 6, 2],
          f"adakv B = 5: counts {c5}, caps {cap5} = round(0.8·c + int(0.2·5))")
    check(list(adakv_caps(np.array([[1.0] * 10, [0.0] * 10]), 5)) == [9, 1] and int(np.rint(2.5)) == 2,
          "adakv: caps 0.8·10 + 1 = 9 and 0 + 1 = 1 (a head may keep more than d − w); rint halves to even")
    # layer-level: each head keeps its top cap_h of its own pooled window-mean scores ∪ window
    B = 50 - W
    pl = np.stack([hc.snap_pooled("mean_max") for hc in lay.heads])
    caps = adakv_caps(pl, B)
    ok = all(lay.kept("adakv", 50, h)[0].sum() == caps[h] + W
             and np.array_equal(lay.kept("adakv", 50, h)[0][: n_p - W], top_mask(pl[h], int(caps[h]))[0])
             for h in range(H))
    check(ok and abs(caps.sum() - H * B) <= H, f"adakv d = 50 on the layer: caps {caps.tolist()} (Σ within H of H·B "
                                               f"= {H * B}), each head its own top cap_h ∪ window")

    # 7. oracles
    static = ["dec_window", "dec_streaming", "snapkv", "snapkv_avg5", "pyramidkv", "adakv", "h2o_dec", "tova"]
    ok, comps = True, 0
    for d in (16, 33, 40, 64, 100):
        for h in range(H):
            mo = lay.result("evict_oracle", d, h)["mass"]
            for m in static:
                if lay.kept(m, d, h)[0].sum() <= d:
                    comps += 1
                    ok &= lay.result(m, d, h)["mass"] <= mo + 1e-15
    check(ok, f"evict_oracle's mass ≥ every static method's of ≤ d prompt keys ({comps} comparisons)")
    ok = True
    for d in (5, 17, 64):
        for h in (0, 3):
            Ck = lay.kept("topk_dec", d, h)[0]
            L = lay.heads[h].SF[:, :n_p]
            ok &= bool((Ck.sum(axis=1) == d).all())
            ok &= bool(np.all(np.where(Ck, L, np.inf).min(axis=1) >= np.where(Ck, -np.inf, L).max(axis=1)))
    check(ok, "topk_dec: per row d keys, every kept logit ≥ every dropped one")
    sizes_ok = all(lay.kept(m, 40, h)[0].sum() == 40 for m in ("dec_window", "dec_streaming", "snapkv", "snapkv_avg5",
                                                                 "h2o_dec", "tova", "evict_oracle") for h in range(H))
    Ch = lay.kept("h2o_dec", 41, 1)[0]
    check(sizes_ok and Ch[n_p - 21:].all() and Ch[: n_p - 21].sum() == 20,
          "|C| = d for the uniform static methods; h2o_dec d = 41: last 21 + 20 heavy before them")
    tv = [lay.kept("tova", 40, h)[0] for h in range(H)]
    check(all(np.array_equal(tv[0], x) for x in tv) and lay.kv_union("tova", 40, 1) == 40,
          "tova: one set for every head, kv_union = d")

    # 8. quest_dec pages: n_p = 150 (a partial last page of 6 tokens)
    q2, k2, v2 = random_problem(rng, 2, 1, 190, 64)
    lq = Layer(q2, k2, v2, 40)
    hq = lq.heads[1]
    ok = True
    for d in (16, 20, 48, 100, 149):
        Cq = lq.kept("quest_dec", d, 1)[0]
        m = -(-d // 16)
        for ti in (0, 17, 39):
            qv = hq.Q[150 + ti]
            U = []
            for c in range(10):
                blk = hq.K[c * 16: min(c * 16 + 16, 150)]
                U.append(sum(max(qv[x] * blk[:, x].min(), qv[x] * blk[:, x].max()) for x in range(64)))
            pages = sorted(sorted(range(10), key=lambda c: (-U[c], c))[: min(m, 10)])
            want = np.zeros(150, dtype=bool)
            for c in pages:
                want[c * 16: min(c * 16 + 16, 150)] = True
            ok &= np.array_equal(Cq[ti], want)
    check(ok, "quest_dec: ⌈d/16⌉ pages by U(q_t, page) (loop oracle), the partial last page bounded over its 6 "
              "tokens, all 10 pages at d = 149")

    # 9. quantized caches: identity quantizers are exact; KIVI's read-weighted kv_bits by a per-row count
    for nn, nf in ((300, 60), (260, 10), (200, 100)):
        q3, k3, v3 = random_problem(rng, 4, 2, nn, 64)
        li = Layer(q3, k3, v3, nf, fmt=qd.IdentityFmt())
        worst = max(li.result(m, 0, h)["error"] / li.result(m, 0, h)["exact_norm"] for m in CACHE_METHODS
                    for h in range(4))
        check(worst < 1e-13, f"n = {nn}, n_f = {nf}: the 10 caches with identity quantizers are exact ({worst:.1e})")
        lr = Layer(q3, k3, v3, nf)
        for b in (2, 4):
            tot, cnt = 0, 0
            for t in range(nn - nf, nn):
                for j in range(t + 1):
                    kqz = j < (t + 1) - (t + 1) % 128
                    vqz = j < t + 1 - 128
                    tot += (b + 1 if kqz else 16) + (b + 1 if vqz else 16)
                    cnt += 2
            r = lr.result(f"kivi{b}", 0, 1)
            check(abs(r["kv_bits"] - tot / cnt) < 1e-12 and abs(r["kv_read"] - tot / cnt / 16) < 1e-15,
                  f"kivi{b} n = {nn}, n_f = {nf}: kv_bits {r['kv_bits']:.6f} = per-row count of read values")
    # KIVI at t: the tokens read quantized are exactly j < T_K(t) (K) and j < T_V(t) (V)
    q3, k3, v3 = random_problem(rng, 1, 1, 300, 64)
    lk = Layer(q3, k3, v3, 60)
    Kh, Vh = lk.group_cache("kivi2", 0)
    check(list(np.flatnonzero((Kh != k3[0]).any(axis=1))) == list(range(256))
          and list(np.flatnonzero((Vh != v3[0]).any(axis=1))) == list(range(172)),
          "kivi2, n = 300: K̂ quantized on 0..255 (n − n mod 128), V̂ on 0..171 (n − 128); rows pick by t")
    # one row by hand: t = 299 reads K̂ for j < 256, V̂ for j < 172
    hk = lk.heads[0]
    t = 299
    kk = np.where((np.arange(300) < 256)[:, None], Kh, hk.K)
    vv = np.where((np.arange(300) < 172)[:, None], Vh, hk.V)
    sc = kk @ hk.Q[t] / 8
    e = np.exp(sc - sc.max())
    o = (e / e.sum()) @ vv
    hk_ctx = lk.heads[0]
    Kq = lk.group_cache("kivi2", 0)[0]
    t1 = hk_ctx.t + 1
    S = np.where(np.arange(300)[None, :] < (t1 - t1 % 128)[:, None], hk_ctx.Q[240:] @ Kq.T, hk_ctx.Q[240:] @ hk_ctx.K.T) / 8
    Wt = softmax_rows(S, hk_ctx.causal_F)
    vq = np.arange(300)[None, :] < np.maximum(t1 - 128, 0)[:, None]
    Oh = np.where(vq, Wt, 0) @ Vh + np.where(vq, 0, Wt) @ hk_ctx.V
    r = lk.result("kivi2", 0, 0)
    ok = np.allclose(Oh[-1], o, rtol=0, atol=1e-13)
    check(ok and abs(r["error"] - np.linalg.norm(hk_ctx.OF - Oh, 2)) < 1e-12,
          "kivi2 row t = 299 by hand (K̂ for j < 256, V̂ for j < 172)")
    r = lay.result("kv_q4_0", 0, 2)
    check(r["kv_bits"] == 4.5 and r["kv_read"] == 4.5 / 16 and r["mass"] == 1.0 and r["d"] == 0
          and abs(r["keys"] - (n_p + (n_f + 1) / 2)) < 1e-12 and r["error"] > 0,
          "kv_q4_0: kv_bits 4.5, kv_read 0.28125, mass 1, d 0, keys n_p + (n_f+1)/2")

    print(f"self-test: {'all checks passed' if not fails else f'{len(fails)} FAILED'} ({time.time() - t0:.1f} s)")
    return 1 if fails else 0


# ------------------------------------------------------------------------------------------
# CSV comparison


def cell(row: dict, name: str):
    v = row.get(name)
    if v is None or v == "":
        return None
    return float(v)


REL_COLS = ["error", "frob_error", "rmse", "rel_l1", "exact_norm", "rel_error"]


def compare_row(method: str, row: dict, want: dict, tol: float, n_f: int, p: int) -> tuple[list[str], dict]:
    bad, diff = [], {}
    floor = 1e-6 * want["exact_norm"]
    for c in REL_COLS:
        got = cell(row, c)
        if got is None:
            bad.append(f"{c} empty")
            continue
        fl = {"error": floor, "frob_error": floor, "exact_norm": floor, "rmse": floor / math.sqrt(n_f * p),
              "rel_l1": 1e-6, "rel_error": 1e-6}[c]
        diff[c] = abs(got - want[c]) / max(abs(want[c]), fl, 1e-300)
        if not diff[c] <= tol:
            bad.append(f"{c} {got!r} vs {want[c]:.12g}")
    got = cell(row, "cos_sim")
    if got is None:
        bad.append("cos_sim empty")
    else:
        a, b = 1.0 - got, want["one_minus_cos"]
        diff["1-cos_sim"] = abs(a - b) / max(abs(b), 1e-12 / tol)  # ≤ tol exactly when the row passes
        if not (abs(a - b) <= tol * abs(b) or abs(a - b) <= 1e-12):
            bad.append(f"cos_sim {got!r} vs {1 - b:.15g}")
    kv_tol = 1e-9 if method.startswith("kivi") else 1e-12
    for c, t in (("mass", 1e-9), ("keys", 1e-9), ("kv_bits", kv_tol), ("kv_read", kv_tol)):
        got = cell(row, c)
        if got is None:
            bad.append(f"{c} empty")
            continue
        diff[c] = abs(got - want[c])
        if not diff[c] <= t:
            bad.append(f"{c} {got!r} vs {want[c]!r}")
    got = cell(row, "kv_union")
    if got is not None:
        diff["kv_union"] = abs(got - want["kv_union"])
        if got != want["kv_union"]:
            bad.append(f"kv_union {got!r} vs {want['kv_union']!r}")
    if row.get("nonfinite_rows") not in (None, "") and int(row["nonfinite_rows"]) != want["nonfinite_rows"]:
        bad.append(f"nonfinite_rows {row['nonfinite_rows']} vs {want['nonfinite_rows']}")
    if method in CACHE_METHODS and row.get("d") not in (None, "") and int(row["d"]) != 0:
        bad.append(f"d = {row['d']} (a §8 cache writes d = 0)")
    return bad, diff


def load_dump(spec: str):
    path, _, win = spec.partition(":")
    t = qd.load_safetensors(path)
    meta = {}
    if os.path.exists(path + ".json"):
        with open(path + ".json") as f:
            meta = json.load(f)
    if not {"q", "k", "v"} <= set(t):
        raise ValueError("no q, k, v tensors")
    q, k, v = t["q"], t["k"], t["v"]
    if q.ndim != 3 or k.ndim != 3 or k.shape != v.shape or q.shape[1:] != k.shape[1:] or q.shape[0] % k.shape[0]:
        raise ValueError(f"bad shapes q {q.shape} k {k.shape} v {v.shape}")
    window = int(win) if win else int(meta.get("window", 0))
    layer = meta.get("inputs", {}).get("layer")
    return {"path": path, "q": q, "k": k, "v": v, "n": q.shape[1], "window": window, "meta": meta,
            "model_id": meta.get("model_id"), "layer": None if layer is None else int(layer), "layers_by_nf": {}}


def main() -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n")[:2]))
    ap.add_argument("--qkv", action="append", default=[], help="FILE[:WINDOW] from dump-qkv (repeatable)")
    ap.add_argument("--csv", help="trials.csv of a --decode sweep on the same dump(s)")
    ap.add_argument("--manifest", help="the sweep's manifest.json (default: beside the CSV)")
    ap.add_argument("--n-f", type=int, help="override the continuation length (else each row's n_f)")
    ap.add_argument("--layer-index", type=int, help="override the manifest's decode.layer (PyramidKV's ℓ)")
    ap.add_argument("--layers", type=int, help="override the manifest's decode.layers (PyramidKV's L)")
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--table", action="store_true", help="also print the mean over heads per (method, d)")
    ap.add_argument("--self-test", "--selftest", dest="selftest", action="store_true")
    args = ap.parse_args()
    if args.selftest:
        return selftest()
    if not args.qkv or not args.csv:
        ap.error("--qkv and --csv are required (or --self-test)")
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        print(f"unknown method(s): {', '.join(unknown)} (known: {', '.join(METHODS)})", file=sys.stderr)
        return 2

    # manifest
    decode = {}
    mpath = args.manifest or os.path.join(os.path.dirname(os.path.abspath(args.csv)), "manifest.json")
    if os.path.exists(mpath):
        try:
            with open(mpath) as f:
                decode = json.load(f).get("decode") or {}
        except (OSError, ValueError) as e:
            print(f"{mpath}: cannot read ({e})", file=sys.stderr)
            return 2
        print(f"{mpath}: decode = {json.dumps(decode) if decode else '(none)'}")
    elif args.manifest:
        print(f"{mpath}: no such file", file=sys.stderr)
        return 2
    layer_index = args.layer_index if args.layer_index is not None else decode.get("layer")
    layers = args.layers if args.layers is not None else decode.get("layers")

    dumps = []
    for spec in args.qkv:
        try:
            dp = load_dump(spec)
        except (OSError, ValueError, KeyError, struct.error) as e:
            print(f"{spec}: cannot read ({e})", file=sys.stderr)
            return 2
        dumps.append(dp)
        print(f"{dp['path']}: q {dp['q'].dtype} {dp['q'].shape}, k/v {dp['k'].shape}, window {dp['window']}"
              + (f", layer {dp['layer']}" if dp["layer"] is not None else ""))
        if dp["q"].dtype != np.float64:
            print(f"[NOTE] {dp['path']} holds {dp['q'].dtype} Q/K/V: a --dtype f64 sweep works on the f64 values, "
                  f"so rows differ at the f32 rounding level and near-tied selections may differ")
        if layer_index is not None and dp["layer"] is not None and layer_index != dp["layer"]:
            print(f"[NOTE] PyramidKV's ℓ = {layer_index} (manifest/override), the dump's layer {dp['layer']}")

    def layer_for(dp, n_f):
        if n_f not in dp["layers_by_nf"]:
            dp["layers_by_nf"][n_f] = Layer(dp["q"], dp["k"], dp["v"], n_f, layer_index, layers)
        return dp["layers_by_nf"][n_f]

    t0 = time.time()
    failed = False
    worst = defaultdict(lambda: defaultdict(float))
    nrows = defaultdict(int)
    skipped = defaultdict(int)
    seen = defaultdict(set)  # (method, d) -> heads
    notes = set()
    try:
        f = open(args.csv, newline="")
    except OSError as e:
        print(f"{args.csv}: cannot read ({e})", file=sys.stderr)
        return 2
    with f:
        rd = csv.DictReader(f)
        need = {"method", "n", "window", "head", "d", "n_f"}
        if not rd.fieldnames or not need <= set(rd.fieldnames):
            print(f"{args.csv}: not a decode trials.csv (needs columns {sorted(need)}; has "
                  f"{rd.fieldnames})", file=sys.stderr)
            return 2
        has_union = "kv_union" in rd.fieldnames
        for row in rd:
            m = row["method"]
            if row.get("n_f") in (None, ""):
                skipped["(non-decode rows)"] += 1
                continue
            if m not in methods:
                skipped[m] += 1
                continue
            n, window, head, d = int(row["n"]), int(row["window"]), int(row["head"]), int(row["d"])
            n_f = args.n_f if args.n_f is not None else int(row["n_f"])
            if int(row["n_f"]) != n_f or ("n_f" in decode and int(decode["n_f"]) != int(row["n_f"])):
                note = f"[NOTE] row n_f {row['n_f']}, manifest n_f {decode.get('n_f')}, used {n_f}"
                if note not in notes:
                    notes.add(note)
                    print(note)
            cands = [dp for dp in dumps if dp["n"] == n and dp["window"] == window
                     and (dp["model_id"] is None or row.get("model_id") in (None, "", dp["model_id"]))
                     and (dp["layer"] is None or row.get("layer") in (None, "") or int(row["layer"]) == dp["layer"])]
            if len(cands) > 1:
                print(f"a row of n = {n}, window = {window} matches several dumps", file=sys.stderr)
                return 2
            if not cands or head >= cands[0]["q"].shape[0]:
                skipped[m] += 1
                continue
            lay = layer_for(cands[0], n_f)
            where = f"{m} d={d} head={head} n={n} n_f={n_f} window={window}"
            if row.get("kv_head") not in (None, "") and int(row["kv_head"]) != lay.heads[head].kv_head:
                failed = True
                print(f"[FAIL] {where}: kv_head {row['kv_head']} vs {lay.heads[head].kv_head}")
            try:
                want = lay.result(m, d, head)
            except Refused as e:
                if m == "pyramidkv" and (layers is None or layer_index is None):
                    print(f"pyramidkv rows but no layer count: {e}", file=sys.stderr)
                    return 2
                failed = True
                print(f"[FAIL] {where}: a row where the method is refused ({e})")
                continue
            except qd.UsageError as e:
                failed = True
                print(f"[FAIL] {where}: a row where the method is refused ({e})")
                continue
            bad, diff = compare_row(m, row, want, args.tol, n_f, lay.p)
            nrows[m] += 1
            seen[(m, d, id(lay))].add(head)
            for c, x in diff.items():
                worst[m][c] = max(worst[m][c], x)
            if bad:
                failed = True
                g = want.get("gap", math.inf)
                print(f"[FAIL] {where}: " + "; ".join(bad)
                      + (f" [smallest score gap at a selection cut here {g:.2e}]" if g < math.inf else ""))
    # coverage: a (method, d) with rows should have one per dumped head
    for (m, d, lid), hs in sorted(seen.items(), key=lambda x: (x[0][0], x[0][1])):
        H = next(len(l.heads) for dp in dumps for l in dp["layers_by_nf"].values() if id(l) == lid)
        if len(hs) != H:
            print(f"[NOTE] {m} d={d}: rows for {len(hs)} of {H} heads")
    cols = ["error", "frob_error", "1-cos_sim", "rel_l1", "rmse", "exact_norm", "mass", "keys", "kv_read", "kv_bits"]
    if has_union:
        cols.append("kv_union")
    print(f"\n{'method':14} {'rows':>5} " + " ".join(f"{c:>10}" for c in cols)
          + "   (max relative differences; mass, keys, kv_* absolute)")
    for m in methods:
        if nrows[m]:
            print(f"{m:14} {nrows[m]:5d} " + " ".join(f"{worst[m][c]:10.2e}" for c in cols))
        else:
            print(f"{m:14} no rows in the CSV")
    if skipped:
        print("skipped rows: " + ", ".join(f"{m} {c}" for m, c in sorted(skipped.items())))
    if args.table:
        for dp in dumps:
            for n_f, lay in dp["layers_by_nf"].items():
                ds = sorted({d for (m, d, lid) in seen if lid == id(lay) and m in EVICT_METHODS})
                print(f"\n{dp['path']}: n = {lay.n}, n_f = {n_f}: mean over {lay.H} heads of error "
                      f"(kv_read) per d = {ds}")
                for m in methods:
                    try:
                        dd = ds if m in EVICT_METHODS else [0]
                        cells = []
                        for d in dd:
                            rs = [lay.result(m, d, h) for h in range(lay.H)]
                            cells.append(f"{np.mean([r['error'] for r in rs]):.4g} "
                                         f"({np.mean([r['kv_read'] for r in rs]):.3f})")
                        print(f"{m:14} " + "  ".join(cells))
                    except (Refused, qd.UsageError) as e:
                        print(f"{m:14} refused: {e}")
    total = sum(nrows.values())
    print(f"decode_dump: {total} rows compared in {time.time() - t0:.1f} s: "
          + ("DISAGREEMENT (see [FAIL] lines)" if failed else "all compared rows agree" if total
             else "no decode rows of the selected methods"))
    if not total:
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
