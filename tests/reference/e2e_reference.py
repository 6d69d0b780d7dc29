#!/usr/bin/env python3
"""Independent float64 cross-check of ``approx-bench e2e`` (METHODS.md §10): a §7, §8 or §9 method in every
layer of a decoder LLM, the damage measured at the output (next-token KL, top-1, NLL) and per layer (local
operator errors), against the tool's ``e2e.csv`` and ``e2e_layers.csv``.

A second implementation written from ``../shared/METHODS.md`` §10 (and §7.1 for the model), not from the Rust
sources. The model is this file's own float64 numpy Llama forward, built from the GGUF with the ``gguf`` package
(gguf.quants.dequantize to f32, then widened to f64; llama.cpp's q/k row permutation undone as transformers'
GGUF loader does, so RoPE is rotate-half):

    X⁰ = token_embd[ids]; per layer ℓ: h = RMSNorm(X) (w·x/√(mean x² + ε), f64), q/k/v = h·Wᵀ, RoPE with the angle
    i·inv_freq_t formed in f64 (inv_freq_t = 1/θ^(2t/p)), per query head h (K/V head ⌊h·H_kv/H⌋) the attention
    output of the ROUTED per-head code below, o_proj, residual, RMSNorm, SwiGLU down(silu(gate h)·up h), residual;
    final RMSNorm; LM head tied to token_embd. Everything float64 end to end (§10.4).

Per-head attention is never re-implemented here; it is imported from the sibling independent references:
    prefill §7 ids   prefill_dump.py: the method's dense mask M (METHODS[method](Head, d)), Ô = masked softmax
                     over M times V (Head.masked_weights), error/keys/mass from Head.score (diagonal rule as
                     prefill_dump's main: topk may miss its own key); 1 − cos from quant_dump.metrics.
    prefill §8 ids   quant_dump.py: Head.result(method, causal=True) (K̂/V̂ per K/V head over this layer's whole
                     window, Q̂ per query head, sage online softmax); Ô is captured from its metrics() call.
    decode §9 ids    decode_dump.py: Layer(q, k, v, n_f, layer_index=ℓ, layers=L).result(method, d, h) on the
                     layer's [exact prompt | this run's continuation] Q/K/V; Ô_F captured from metrics().
    decode d<cache>  decode_dump.py: the same Layer's §8-cache-under-the-protocol rows (d = 0).
The exact run (§7.2 causal attention) is prefill_dump.Head(q, k, v).O per head, cached per window and shared by
every method; decode mode runs only the n_f continuation tokens (positions n_p..n−1) against the exact run's
recorded prompt K/V (§10.1 [REC]); the prediction at n_p − 1 is the exact run's.

Output metrics (§10.1): log-probabilities by a max-shifted log_softmax in f64 at the scored positions
i = n_p−1 … n−2 (label ids[i+1]); KL(p_i ‖ p̂_i) per position clamped at 0; kl_mean, kl_p99 (numpy's linear
percentile), kl_max; top1 (np.argmax: ties to the lower id); nll_exact, nll_method, dnll, ppl_ratio = e^dnll.
Layer metrics: per layer, the mean over query heads of error = ‖O − Ô‖₂, rel_error = error/‖O‖₂, one_minus_cos,
keys, mass, kv_read on the layer's own (perturbed) Q/K/V (prefill: all n rows; decode: the n_f rows of F);
summary = means over layers; one_layer_*_l{0,⌊L/2⌋}: the method on the exact run's Q/K/V of that layer.

Comparison (§10.5): x passes against the reference r when |x − r| ≤ max(abs, rel·|r|), the column of the table
chosen by the tool's dtype (f64 → the f64 column for every method; f32 → `select` for §7/§9 ids, `quant` for §8
ids and the d-prefixed cache reads). Per window, Spearman ρ(tool kl_mean, reference kl_mean) over its rows ≥ 0.98
(windows with fewer than 3 rows are not ranked). Readings where §10.5 leaves room (see TOL below):
  * top1's "± 2.5/256" and "± 20/256" are counts of scored positions: |Δtop1|·n_f ≤ 2.5 (20); f64: identical.
  * kl_p99/kl_max take kl_mean's abs floor; ppl_ratio is checked with dnll's abs as a relative bound;
    one_layer_err_* as op_err_mean, one_layer_1mcos_* as op_1mcos_mean; per-layer rel_error as per-layer ‖E‖₂;
    per-layer keys/kv_read as keys_mean except f32 select rows (1e-2, the per-layer column: one layer's sets may
    move at f32 near-ties more than the layer mean); mass (not in the table): select 1e-3, quant 1e-6, f64 1e-6
    relative (per layer: select 1e-2).
  * operator errors at exactness limits are ~0 on both sides: absolute floors (FLOORS) for ‖E‖₂, ‖E‖₂/‖O‖₂ and
    1 − cos: 1e-9, 1e-11, 1e-18 for f64 rows; 1e-4, 1e-6, 1e-10 for f32 rows.
  * KL is clamped at 0 per scored position (a vocabulary term p·(log p − log p̂) may be negative legitimately).
Rows of methods without an independent check here (vmean, svd_optimal, performer_favor, anything unknown) are
listed as skipped, not counted.

--self-test (about a second, no files) on tiny random Llamas (numpy weights; 2 layers, hidden 128, 4 query heads
over 2 K/V heads, p = 32, vocab 50, n = 48, n_f = 16; and hidden 64, p = 16): the output metrics on hand cases (KL,
kl_p99, kl_max, top-1 with ties, NLL, ppl_ratio, the max shift at |logit| 1000, the clamp), Spearman with ties; the
GGUF q/k un-permutation inverts llama.cpp's permutation; the routed exact run equals a monolithic einsum forward;
(a) prefill window/topk/streaming at d = n, n + 5 (and all nine §7 methods at d = 2n) give the exact logits
(≤ 1e-12 relative) with keys (n+1)/2, kv_read 1, mass 1; (b) every §9 method at d = n_p, n_p + 3 gives the exact
logits (pyramidkv with L = 2), and the continuation-only decode forward equals a full forward whose prompt rows are
exact (dec_window d = 8); (c) every §8 method and every cache read with quant_dump.IdentityFmt gives the exact
logits, and with the real formats perturbs (kv_q4_0 kv_read 4.5/16); p = 16 refuses kv_q4_0.

Timing (the 2-core build machine with a Rust build beside it, one core used; one (method, d) point including its
two one-layer views; the model load, ~8 s, and the exact run, shared by all rows of a window, are extra):
    n = 1024, n_f = 256: exact run ~15 s; prefill §7 19–48 s (topk the slowest); prefill §8 14–26 s; decode 4–10 s.
    n =  512, n_f = 256: exact run ~5 s;  prefill §7 8–10 s;  prefill §8 ~6 s;   decode 3–4 s.

Run (from the repository root; the tool writes OUT/ids.txt, OUT/e2e.csv and OUT/e2e_layers.csv):
    python3 tests/reference/e2e_reference.py --gguf ../shared/data/SmolLM2-135M-Instruct-Q4_1/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --ids OUT/ids.txt --n-f 256 --csv OUT/e2e.csv --layers-csv OUT/e2e_layers.csv [--windows 0,1]
    python3 tests/reference/e2e_reference.py --self-test
    python3 tests/reference/e2e_reference.py --gguf ... --ids OUT/ids.txt --n-f 256 --bench prefill:window:64,decode:snapkv:64
        (no CSV: one reference point per spec with its time; --check-transformers adds a float32 transformers sanity
        check of the exact logits, ≤ 1e-3 relative, when torch and transformers are installed)
    --dump FILE (repeatable, with the CSV or --bench): a ``dump-qkv`` file of a window (sidecar FILE.json) is
        compared with this forward's exact run: token ids identical, Q/K/V ≤ 1e-10 relative for F64 tensors.

Checked (2026-11-28, SmolLM2 Q4_1, n = 1024): the exact run's layer-15 Q/K/V equal the tool's
``dump-qkv --dtype f64`` of window 0 to 1e-14 relative; routed per head = a monolithic einsum forward to 5e-15; the
exact logits equal transformers 5.24's float32 Llama loaded from the GGUF to 5.8e-6 relative (argmax 256/256).
On the tool's windows 0 | 1 (token ids from dump-qkv) this reproduces METHODS.md §10.6's per-window figures:
nll_exact 2.597 | 2.995, prefill streaming d = 256 kl_mean 0.961 | 0.0686, kv_q4_0 0.1077 | 0.0709, decode snapkv
d = 256 0.648 | 0.0699, and the window means topk d = 64 0.080, topk_dec d = 64 0.020; the one-layer views of
window 0 match §8's table (kv_q4_0 L0 0.302, L15 5.95; streaming d = 256 L0 0.309, L15 12.2).

Needs numpy and gguf (the ggml formats of §8 and the GGUF loader). Memory: ~1.3 GB of f64 weights plus the
cached exact run (~300 MB at n = 1024).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
from collections import OrderedDict, defaultdict

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode_dump as dd  # noqa: E402  (§9 sets and the §8 caches under the protocol)
import prefill_dump as pf  # noqa: E402  (§7.4–7.5 masks, exact causal attention)
import quant_dump as qd  # noqa: E402  (§8 formats and methods, §8.5 metrics)

PREFILL_METHODS = list(pf.METHODS)  # window topk streaming h2o quest moba block_sparse xattention vertical_slash
QUANT_METHODS = list(qd.METHODS)  # kv_f16 … sage2_4b
DECODE_METHODS = list(dd.EVICT_METHODS)  # dec_window … evict_oracle
CACHE_READS = ["d" + m for m in dd.CACHE_METHODS]  # dkv_f16 … dkivi2
UNCHECKED = {"vmean", "svd_optimal", "performer_favor"}


def method_mode(method: str) -> str | None:
    if method in PREFILL_METHODS or method in QUANT_METHODS:
        return "prefill"
    if method in DECODE_METHODS or method in CACHE_READS:
        return "decode"
    return None


def method_class(method: str) -> str:
    """§10.5's f32 columns: 'select' (§7 sparse, §9 sets) or 'quant' (§8, cache reads)."""
    return "quant" if (method in QUANT_METHODS or method in CACHE_READS) else "select"


# ------------------------------------------------------------------------------------------
# the model (float64)


class Model:
    """Llama decoder weights in float64 (HF layout: W [out, in]; q/k rows in HF's rotate-half order)."""

    def __init__(self, emb, layers, out_norm, H, Hkv, eps, theta, name="model"):
        self.emb = emb
        self.layers = layers  # list of dicts: wq wk wv wo w_gate w_up w_down attn_norm ffn_norm
        self.out_norm = out_norm
        self.H, self.Hkv = H, Hkv
        self.hidden = emb.shape[1]
        self.p = self.hidden // H
        self.eps, self.theta = float(eps), float(theta)
        self.L = len(layers)
        self.vocab = emb.shape[0]
        self.name = name

    def truncated(self, nl: int) -> "Model":
        return Model(self.emb, self.layers[:nl], self.out_norm, self.H, self.Hkv, self.eps, self.theta,
                     f"{self.name}[:{nl} layers]")


def reverse_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's convert permutation of attn_q/attn_k rows (transformers' GGUF loader
    reverse_permute_weights): rows [n_head, 2, p/2] <- [n_head, p/2, 2]."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def load_gguf(path: str) -> Model:
    import gguf  # noqa: PLC0415

    r = gguf.GGUFReader(path)

    def field(name):
        f = r.fields[name]
        v = f.parts[f.data[0]]
        return v[0] if len(v) == 1 else v

    arch = bytes(r.fields["general.architecture"].parts[r.fields["general.architecture"].data[0]]).decode()
    if arch != "llama":
        raise SystemExit(f"{path}: architecture {arch!r}; this reference implements the llama family only")
    L = int(field("llama.block_count"))
    H = int(field("llama.attention.head_count"))
    Hkv = int(field("llama.attention.head_count_kv"))
    eps = float(field("llama.attention.layer_norm_rms_epsilon"))  # stored f32, widened exactly
    theta = float(field("llama.rope.freq_base")) if "llama.rope.freq_base" in r.fields else 10000.0
    if "llama.rope.scaling.type" in r.fields:
        raise SystemExit(f"{path}: rope scaling is not implemented here")
    T = {}
    for t in r.tensors:
        T[t.name] = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).astype(np.float64)
    emb = T["token_embd.weight"]
    if "output.weight" in T:
        raise SystemExit(f"{path}: an untied output.weight; this reference implements SmolLM2's tied LM head")
    layers = []
    for l in range(L):
        b = f"blk.{l}."
        layers.append({
            "wq": reverse_permute(T[b + "attn_q.weight"], H),
            "wk": reverse_permute(T[b + "attn_k.weight"], Hkv),
            "wv": T[b + "attn_v.weight"],
            "wo": T[b + "attn_output.weight"],
            "w_gate": T[b + "ffn_gate.weight"],
            "w_up": T[b + "ffn_up.weight"],
            "w_down": T[b + "ffn_down.weight"],
            "attn_norm": T[b + "attn_norm.weight"],
            "ffn_norm": T[b + "ffn_norm.weight"],
        })
    return Model(emb, layers, T["output_norm.weight"], H, Hkv, eps, theta, os.path.basename(path))


def random_model(rng, L=2, hidden=128, H=4, Hkv=2, vocab=50, inter=96, theta=10000.0) -> Model:
    """A tiny random Llama (the self-test's): Gaussian weights scaled by 1/√fan_in, norms near 1, a small
    embedding (so that attention moves the output: window d = 8 has KL ≈ 1)."""
    s = 1 / math.sqrt(hidden)
    p = hidden // H
    layers = []
    for _ in range(L):
        layers.append({
            "wq": rng.standard_normal((H * p, hidden)) * 2 * s,
            "wk": rng.standard_normal((Hkv * p, hidden)) * 2 * s,
            "wv": rng.standard_normal((Hkv * p, hidden)) * s,
            "wo": rng.standard_normal((hidden, H * p)) * s,
            "w_gate": rng.standard_normal((inter, hidden)) * s,
            "w_up": rng.standard_normal((inter, hidden)) * s,
            "w_down": rng.standard_normal((hidden, inter)) / math.sqrt(inter),
            "attn_norm": 1 + 0.1 * rng.standard_normal(hidden),
            "ffn_norm": 1 + 0.1 * rng.standard_normal(hidden),
        })
    emb = 0.1 * rng.standard_normal((vocab, hidden))  # small, so that the residual is not one token's embedding
    return Model(emb, layers, 1 + 0.1 * rng.standard_normal(hidden), H, Hkv, 1e-5, theta, "random")


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def rope(model: Model, pos: np.ndarray):
    """cos, sin [n, p] (rotate-half: the p/2 angles repeated over both halves), angle i·inv_freq in f64."""
    p = model.p
    inv_freq = 1.0 / (model.theta ** (np.arange(0, p, 2, dtype=np.float64) / p))
    ang = pos.astype(np.float64)[:, None] * inv_freq[None, :]
    ang = np.concatenate([ang, ang], axis=1)
    return np.cos(ang), np.sin(ang)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rot * sin


def layer_qkv(model: Model, l: int, X: np.ndarray, cs):
    """Post-RoPE q [H, n, p], k and v [H_kv, n, p] of layer l for the rows X (positions given by cs)."""
    lw = model.layers[l]
    n, p = X.shape[0], model.p
    h = rmsnorm(X, lw["attn_norm"], model.eps)
    q = (h @ lw["wq"].T).reshape(n, model.H, p).transpose(1, 0, 2)
    k = (h @ lw["wk"].T).reshape(n, model.Hkv, p).transpose(1, 0, 2)
    v = (h @ lw["wv"].T).reshape(n, model.Hkv, p).transpose(1, 0, 2)
    cos, sin = cs
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), np.ascontiguousarray(v)


def layer_finish(model: Model, l: int, X: np.ndarray, heads_out: np.ndarray) -> np.ndarray:
    """heads_out [H, n, p] -> o_proj, residual, post-attention RMSNorm, SwiGLU MLP, residual."""
    lw = model.layers[l]
    n = X.shape[0]
    A = heads_out.transpose(1, 0, 2).reshape(n, model.H * model.p)
    X = X + A @ lw["wo"].T
    h = rmsnorm(X, lw["ffn_norm"], model.eps)
    g = h @ lw["w_gate"].T
    with np.errstate(over="ignore"):
        act = g / (1.0 + np.exp(-g))
    return X + (act * (h @ lw["w_up"].T)) @ lw["w_down"].T


def head_logits(model: Model, X: np.ndarray) -> np.ndarray:
    return rmsnorm(X, model.out_norm, model.eps) @ model.emb.T


def log_softmax(z: np.ndarray) -> np.ndarray:
    s = z - z.max(axis=-1, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=-1, keepdims=True))


def kv_of(model: Model, h: int) -> int:
    return h * model.Hkv // model.H


# ------------------------------------------------------------------------------------------
# the exact run (cached per window)


class ExactRun:
    """The window through the model with exact causal attention (§7.2, prefill_dump.Head): every layer's
    post-RoPE Q/K/V, the logits at the scored positions and the labels."""

    def __init__(self, model: Model, ids: np.ndarray, n_f: int):
        n = len(ids)
        if not 0 < n_f < n:
            raise SystemExit(f"n_f = {n_f} outside 1..n−1 (n = {n})")
        self.ids, self.n, self.n_f, self.n_p = ids, n, n_f, n - n_f
        t0 = time.time()
        X = model.emb[ids]
        cs = rope(model, np.arange(n))
        self.Q, self.K, self.V = [], [], []
        for l in range(model.L):
            q, k, v = layer_qkv(model, l, X, cs)
            self.Q.append(q)
            self.K.append(k)
            self.V.append(v)
            out = np.stack([pf.Head(q[h], k[kv_of(model, h)], v[kv_of(model, h)]).O for h in range(model.H)])
            X = layer_finish(model, l, X, out)
        rows = np.arange(self.n_p - 1, n - 1)  # scored positions i, label ids[i+1]
        self.logits = head_logits(model, X[rows])
        self.logp = log_softmax(self.logits)
        self.labels = np.asarray(ids[rows + 1])
        self.seconds = time.time() - t0


# ------------------------------------------------------------------------------------------
# per-layer attention through the imported references


class _CaptureMetrics:
    """Record the Ô that quant_dump.metrics(O, Ô) is called with (quant_dump.Head.result and
    decode_dump.HeadCtx.evaluate / Layer.cache_result both end in that call)."""

    def __enter__(self):
        self.orig = qd.metrics
        self.calls = []

        def wrapped(O, Oh):
            self.calls.append((O, Oh))
            return self.orig(O, Oh)

        qd.metrics = wrapped
        return self

    def __exit__(self, *exc):
        qd.metrics = self.orig
        return False

    def only(self):
        if len(self.calls) != 1:
            raise RuntimeError(f"expected one metrics() call, got {len(self.calls)}")
        return self.calls[0]


def prefill_layer(method: str, d: int, q, k, v, H: int, Hkv: int, fmt=None):
    """Ô [H, n, p] and the head list of stats for one layer in prefill mode (every row approximated)."""
    n = q.shape[1]
    outs, stats = [], []
    if method in pf.METHODS:
        for h in range(H):
            g = h * Hkv // H
            head = pf.Head(q[h], k[g], v[g])
            M = pf.METHODS[method](head, d)
            Wm = head.masked_weights(M)
            Oh = Wm @ head.V
            # score() recomputes masked_weights(M): hand it the same weights (saves one n² softmax per head)
            head.masked_weights = lambda M2, _M=M, _W=Wm, _h=head: _W if M2 is _M else pf.Head.masked_weights(_h, M2)
            r = head.score(M, diagonal=method != "topk")
            m = qd.metrics(head.O, Oh)
            norm = float(np.linalg.norm(head.O, 2))
            outs.append(Oh)
            stats.append({"abs_error": r["error"], "rel_error": r["error"] / norm,
                          "one_minus_cos": m["one_minus_cos"], "keys": r["keys"], "mass": r["mass"],
                          "kv_read": r["keys"] / ((n + 1) / 2)})  # kv_bits 16: Σ|S_i| / Σ(i+1)
    elif method in qd.METHODS:
        heads = qd.make_heads(q, k, v, fmt or qd.Fmt())
        for hd in heads:
            with _CaptureMetrics() as cap:
                r = hd.result(method, True)
            O, Oh = cap.only()
            outs.append(Oh)
            stats.append({"abs_error": r["error"], "rel_error": r["rel_error"], "one_minus_cos": r["one_minus_cos"],
                          "keys": r["keys"], "mass": r["mass"], "kv_read": r["kv_read"]})
    else:
        raise KeyError(method)
    return np.stack(outs), stats


def decode_layer(method: str, d: int, q, k, v, n_f: int, layer: int, L: int, fmt=None):
    """Ô_F [H, n_f, p] and the head stats of one layer in decode mode: decode_dump.Layer on the layer's full
    (exact prompt | continuation) Q/K/V."""
    lay = dd.Layer(q, k, v, n_f, layer_index=layer, layers=L, fmt=fmt or qd.Fmt())
    name = method[1:] if method in CACHE_READS else method
    outs, stats = [], []
    for h in range(q.shape[0]):
        with _CaptureMetrics() as cap:
            r = lay.result(name, d, h)
        O, Oh = cap.only()
        assert O is lay.heads[h].OF
        outs.append(Oh)
        stats.append({"abs_error": r["error"], "rel_error": r["rel_error"], "one_minus_cos": r["one_minus_cos"],
                      "keys": r["keys"], "mass": r["mass"], "kv_read": r["kv_read"]})
    return np.stack(outs), stats


def head_mean(stats: list[dict]) -> dict:
    return {c: float(np.mean([s[c] for s in stats])) for c in stats[0]}


# ------------------------------------------------------------------------------------------
# a method run


def output_metrics(logp: np.ndarray, logq: np.ndarray, labels: np.ndarray) -> dict:
    """§10.1's output metrics from the exact (logp) and method (logq) log-probabilities [n_f, vocab]."""
    P = np.exp(logp)
    kl = np.maximum(np.sum(P * (logp - logq), axis=1), 0.0)
    rows = np.arange(len(labels))
    nll_e = float(-np.mean(logp[rows, labels]))
    nll_m = float(-np.mean(logq[rows, labels]))
    return {"kl_mean": float(kl.mean()), "kl_p99": float(np.percentile(kl, 99)), "kl_max": float(kl.max()),
            "top1": float(np.mean(np.argmax(logp, axis=1) == np.argmax(logq, axis=1))),
            "nll_exact": nll_e, "nll_method": nll_m, "dnll": nll_m - nll_e, "ppl_ratio": math.exp(nll_m - nll_e),
            "_kl": kl}


def method_run(model: Model, ex: ExactRun, mode: str, method: str, d: int, fmt=None,
               one_layers=None) -> dict:
    """Every layer approximated; returns the e2e.csv quantities, the per-layer head means and the logits."""
    t0 = time.time()
    L, n_f, n_p, n = model.L, ex.n_f, ex.n_p, ex.n
    layer_rows = []
    if mode == "prefill":
        X = model.emb[ex.ids]
        cs = rope(model, np.arange(n))
        for l in range(L):
            q, k, v = layer_qkv(model, l, X, cs)
            out, st = prefill_layer(method, d, q, k, v, model.H, model.Hkv, fmt)
            layer_rows.append(head_mean(st))
            X = layer_finish(model, l, X, out)
        logits = head_logits(model, X[n_p - 1: n - 1])
    elif mode == "decode":
        X = model.emb[ex.ids[n_p:]]
        cs = rope(model, np.arange(n_p, n))
        for l in range(L):
            qF, kF, vF = layer_qkv(model, l, X, cs)
            q = np.concatenate([ex.Q[l][:, :n_p], qF], axis=1)
            k = np.concatenate([ex.K[l][:, :n_p], kF], axis=1)
            v = np.concatenate([ex.V[l][:, :n_p], vF], axis=1)
            out, st = decode_layer(method, d, q, k, v, n_f, l, L, fmt)
            layer_rows.append(head_mean(st))
            X = layer_finish(model, l, X, out)
        # position n_p − 1 is the prefill's own (exact); n_p..n−2 from continuation rows 0..n_f−2
        logits = np.concatenate([ex.logits[:1], head_logits(model, X[: n_f - 1])], axis=0)
    else:
        raise KeyError(mode)
    res = output_metrics(ex.logp, log_softmax(logits), ex.labels)
    res["logits"] = logits
    res["layers"] = layer_rows
    for c_out, c in (("op_err_mean", "abs_error"), ("op_rel_err_mean", "rel_error"),
                     ("op_1mcos_mean", "one_minus_cos"), ("keys_mean", "keys"), ("kv_read", "kv_read"),
                     ("mass_mean", "mass")):
        res[c_out] = float(np.mean([r[c] for r in layer_rows]))
    for ls in (one_layers if one_layers is not None else (0, L // 2)):
        if ls >= L:
            continue
        if mode == "prefill":
            _, st = prefill_layer(method, d, ex.Q[ls], ex.K[ls], ex.V[ls], model.H, model.Hkv, fmt)
        else:
            _, st = decode_layer(method, d, ex.Q[ls], ex.K[ls], ex.V[ls], n_f, ls, L, fmt)
        hm = head_mean(st)
        res[f"one_layer_err_l{ls}"] = hm["abs_error"]
        res[f"one_layer_1mcos_l{ls}"] = hm["one_minus_cos"]
    res["seconds"] = time.time() - t0
    return res


# ------------------------------------------------------------------------------------------
# tolerances (§10.5)

# column -> {class: (rel, abs)}, None = not checked. class: select / quant (f32 runs) / f64.
TOL = {
    "kl_mean": {"select": (1e-3, 1e-6), "quant": (0.5, 1e-5), "f64": (1e-6, 1e-12)},
    "kl_p99": {"select": (5e-3, 1e-6), "quant": None, "f64": (1e-5, 1e-12)},
    "kl_max": {"select": (1e-2, 1e-6), "quant": None, "f64": (1e-5, 1e-12)},
    "dnll": {"select": (0, 5e-3), "quant": (0, 0.12), "f64": (0, 1e-8)},
    "nll_method": {"select": (0, 5e-3), "quant": (0, 0.12), "f64": (0, 1e-8)},
    "nll_exact": {"select": (0, 1e-4), "quant": (0, 1e-4), "f64": (0, 1e-9)},
    "ppl_ratio": {"select": (5e-3, 0), "quant": (0.12, 0), "f64": (1e-8, 0)},
    "op_err_mean": {"select": (1e-3, "err"), "quant": (0.1, "err"), "f64": (1e-6, "err")},
    "op_rel_err_mean": {"select": (1e-3, "rel"), "quant": (0.1, "rel"), "f64": (1e-6, "rel")},
    "op_1mcos_mean": {"select": (2e-3, "cos"), "quant": (0.1, "cos"), "f64": (1e-5, "cos")},
    "keys_mean": {"select": (1e-3, 0), "quant": (1e-6, 0), "f64": (1e-9, 0)},
    "kv_read": {"select": (1e-3, 0), "quant": (1e-6, 0), "f64": (1e-9, 0)},
    "mass_mean": {"select": (1e-3, 0), "quant": (1e-6, 0), "f64": (1e-6, 0)},
}
TOP1_POSITIONS = {"select": 2.5, "quant": 20.0, "f64": 0.0}
LAYER_TOL = {
    "abs_error": {"select": (1e-2, "err"), "quant": (0.5, "err"), "f64": (1e-5, "err")},
    "rel_error": {"select": (1e-2, "rel"), "quant": (0.5, "rel"), "f64": (1e-5, "rel")},
    "one_minus_cos": {"select": (1e-2, "cos"), "quant": (0.5, "cos"), "f64": (1e-4, "cos")},
    "keys": {"select": (1e-2, 0), "quant": (1e-6, 0), "f64": (1e-9, 0)},
    "kv_read": {"select": (1e-2, 0), "quant": (1e-6, 0), "f64": (1e-9, 0)},
    "mass": {"select": (1e-2, 0), "quant": (1e-6, 0), "f64": (1e-6, 0)},
}
# absolute floors for operator errors that are ~0 on both sides (exactness limits): ‖E‖₂, ‖E‖₂/‖O‖₂, 1 − cos
FLOORS = {"f64": {"err": 1e-9, "rel": 1e-11, "cos": 1e-18}, "f32": {"err": 1e-4, "rel": 1e-6, "cos": 1e-10}}


def tol_for(table: dict, col: str, cls: str, dtype: str):
    t = table[col][cls]
    if t is None:
        return None
    rel, ab = t
    if isinstance(ab, str):
        ab = FLOORS[dtype][ab]
    return rel, ab


def check_value(x, r, rel, ab):
    """(ok, deviation/allowed, relative deviation)."""
    if x is None:
        return False, math.inf, math.inf
    allowed = max(ab, rel * abs(r))
    dev = abs(x - r)
    ratio = dev / allowed if allowed > 0 else (0.0 if dev == 0 else math.inf)
    return bool(dev <= allowed), ratio, dev / abs(r) if r != 0 else (0.0 if dev == 0 else math.inf)


def fcell(row: dict, name: str):
    v = row.get(name)
    if v is None or v.strip() == "":
        return None
    return float(v)


def spearman(a, b) -> float:
    def ranks(x):
        x = np.asarray(x, dtype=np.float64)
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        sx = x[order]
        i = 0
        while i < len(x):
            j = i
            while j + 1 < len(x) and sx[j + 1] == sx[i]:
                j += 1
            r[order[i:j + 1]] = 0.5 * (i + j)
            i = j + 1
        return r
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = math.sqrt(float(np.sum(ra * ra) * np.sum(rb * rb)))
    return float(np.sum(ra * rb) / den) if den > 0 else float("nan")


# ------------------------------------------------------------------------------------------
# input


def read_ids(path: str) -> list[np.ndarray]:
    if path.endswith(".npy"):
        a = np.load(path)
        if a.ndim == 1:
            return [a.astype(np.int64)]
        if a.ndim == 2:
            return [row.astype(np.int64) for row in a]
        raise SystemExit(f"{path}: a .npy of ids must be 1-D or 2-D, not {a.shape}")
    out = []
    with open(path) as f:
        for line in f:
            if line.strip():
                out.append(np.array([int(t) for t in line.split()], dtype=np.int64))
    return out


def read_csv(path: str) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------------------------------
# the comparison


def compare(args) -> int:
    windows = read_ids(args.ids)
    rows = read_csv(args.csv)
    need = {"window", "mode", "method", "d", "n", "n_f", "dtype", "kl_mean"}
    if rows and not need <= set(rows[0]):
        print(f"{args.csv}: missing columns {sorted(need - set(rows[0]))}", file=sys.stderr)
        return 2
    layer_rows = defaultdict(dict)
    if args.layers_csv:
        for r in read_csv(args.layers_csv):
            key = (int(r["window"]), r["mode"], r["method"], int(r["d"]))
            layer_rows[key][int(r["layer"])] = r
    want_windows = None if not args.windows else {int(w) for w in args.windows.split(",") if w.strip()}
    t0 = time.time()
    model = load_gguf(args.gguf)
    if args.n_layers:
        model = model.truncated(args.n_layers)
    print(f"model {model.name}: L = {model.L}, hidden {model.hidden}, H = {model.H}, H_kv = {model.Hkv}, "
          f"p = {model.p}, θ = {model.theta:g}, ε = {model.eps!r}, vocab {model.vocab} ({time.time() - t0:.1f} s)")
    ls = [0, model.L // 2]
    by_window = OrderedDict()
    skipped = []
    for r in rows:
        w = int(r["window"])
        if want_windows is not None and w not in want_windows:
            continue
        by_window.setdefault(w, []).append(r)
    n_rows = n_pass = n_fail = 0
    rho_fail = []
    dump_fail = 0
    for w, wrows in by_window.items():
        if w >= len(windows):
            print(f"[FAIL] window {w}: {args.ids} has only {len(windows)} windows")
            n_fail += len(wrows)
            n_rows += len(wrows)
            continue
        ids = windows[w]
        if args.n_f >= len(ids):
            print(f"window {w}: n_f = {args.n_f} ≥ n = {len(ids)}", file=sys.stderr)
            return 2
        ex = ExactRun(model, ids, args.n_f)
        print(f"window {w}: n = {ex.n}, n_f = {ex.n_f}, exact run {ex.seconds:.1f} s, "
              f"nll_exact {float(-np.mean(ex.logp[np.arange(ex.n_f), ex.labels])):.6f}")
        dump_fail += check_dumps(args.dump, model, ex, w)
        pairs = []
        for r in wrows:
            method, mode, d, dtype = r["method"], r["mode"], int(r["d"]), r["dtype"].strip()
            if method_mode(method) is None:
                skipped.append(f"{method} d={d} (window {w})")
                continue
            n_rows += 1
            bad = []
            if mode != method_mode(method):
                bad.append(f"mode {mode} (a {method_mode(method)} method)")
            if dtype not in ("f32", "f64"):
                bad.append(f"dtype {dtype!r}")
                dtype = "f64"
            if int(r["n"]) != ex.n or int(r["n_f"]) != ex.n_f:
                bad.append(f"n/n_f {r['n']}/{r['n_f']} vs {ex.n}/{ex.n_f}")
            if method in QUANT_METHODS + CACHE_READS and d != 0:
                bad.append(f"d = {d} (§8 methods and cache reads write d = 0)")
            cls = "f64" if dtype == "f64" else method_class(method)
            try:
                ref = method_run(model, ex, method_mode(method), method, d, one_layers=ls)
            except (dd.Refused, qd.UsageError) as e:
                print(f"[FAIL] {mode:7} {method:15} d={d:<5} a row where the method is refused ({e})")
                n_fail += 1
                continue
            worst = (0.0, "", 0.0)
            checks = list(TOL) + [f"one_layer_err_l{l}" for l in ls] + [f"one_layer_1mcos_l{l}" for l in ls]
            for col in checks:
                if col.startswith("one_layer_err"):
                    t = tol_for(TOL, "op_err_mean", cls, "f64" if dtype == "f64" else "f32")
                elif col.startswith("one_layer_1mcos"):
                    t = tol_for(TOL, "op_1mcos_mean", cls, "f64" if dtype == "f64" else "f32")
                else:
                    t = tol_for(TOL, col, cls, "f64" if dtype == "f64" else "f32")
                if t is None:
                    continue
                x = fcell(r, col)
                ok, ratio, reldev = check_value(x, ref[col], *t)
                if not ok:
                    bad.append(f"{col} {x!r} vs {ref[col]:.10g} (|Δ| {abs((x or 0) - ref[col]):.3g} > "
                               f"max({t[1]:.0e}, {t[0]:.0e}·|r|))")
                if ratio > worst[0] or not worst[1]:
                    worst = (ratio, col, reldev)
            x = fcell(r, "top1")
            dpos = math.inf if x is None else abs(x - ref["top1"]) * ex.n_f
            if not dpos <= TOP1_POSITIONS[cls] + 1e-9:
                bad.append(f"top1 {x!r} vs {ref['top1']:.6f} ({dpos:.1f} positions > {TOP1_POSITIONS[cls]})")
            # per layer
            lworst = (0.0, "")
            if args.layers_csv:
                have = layer_rows.get((w, mode, method, d), {})
                if len(have) != model.L or set(have) != set(range(model.L)):
                    bad.append(f"e2e_layers.csv has layers {sorted(have)[:5]}… ({len(have)}) for this row, "
                               f"expected 0..{model.L - 1}")
                for l, lr in sorted(have.items()):
                    if l >= model.L:
                        continue
                    for col in LAYER_TOL:
                        t = tol_for(LAYER_TOL, col, cls, "f64" if dtype == "f64" else "f32")
                        x = fcell(lr, col)
                        ok, ratio, _ = check_value(x, ref["layers"][l][col], *t)
                        if ratio > lworst[0] or not lworst[1]:
                            lworst = (ratio, f"{col}@{l}")
                        if not ok:
                            bad.append(f"layer {l} {col} {x!r} vs {ref['layers'][l][col]:.10g}")
            tool_kl = fcell(r, "kl_mean")
            if tool_kl is not None:
                pairs.append((tool_kl, ref["kl_mean"]))
            status = "PASS" if not bad else "FAIL"
            n_pass += not bad
            n_fail += bool(bad)
            print(f"[{status}] w{w} {mode:7} {method:15} d={d:<5} {dtype} kl_mean tool {tool_kl if tool_kl is not None else float('nan'):.6g} "
                  f"ref {ref['kl_mean']:.6g} | worst {worst[1]} rel dev {worst[2]:.2e} ({worst[0]:.2f}× tol)"
                  + (f", layers {lworst[1]} {lworst[0]:.2f}× tol" if args.layers_csv else "")
                  + f" | top1 {ref['top1']:.4f} dnll {ref['dnll']:+.4f} ({ref['seconds']:.1f} s)")
            for b in bad[:12]:
                print(f"        {b}")
            if len(bad) > 12:
                print(f"        … {len(bad) - 12} more")
        if len(pairs) >= 3:
            rho = spearman([a for a, _ in pairs], [b for _, b in pairs])
            ok = rho >= 0.98
            print(f"[{'PASS' if ok else 'FAIL'}] window {w}: Spearman ρ(tool kl_mean, ref kl_mean) = {rho:.4f} "
                  f"over {len(pairs)} rows (≥ 0.98)")
            if not ok:
                rho_fail.append(w)
        else:
            print(f"window {w}: {len(pairs)} rows, too few for the rank test")
    if skipped:
        print(f"skipped {len(skipped)} rows without an independent check here: " + ", ".join(skipped[:20])
              + (" …" if len(skipped) > 20 else ""))
    if rho_fail:
        print(f"[FAIL] Spearman ρ < 0.98 in windows {rho_fail}")
    if dump_fail:
        print(f"[FAIL] {dump_fail} dump-qkv comparisons failed")
    print(f"e2e reference: {n_rows} rows, {n_pass} passed, {n_fail} failed"
          + (f" (and the rank test failed in {len(rho_fail)} windows)" if rho_fail else ""))
    return 1 if (n_fail or rho_fail or dump_fail) else 0


# ------------------------------------------------------------------------------------------
# bench (timing one method point, no CSV)


def bench(args) -> int:
    windows = read_ids(args.ids)
    t0 = time.time()
    model = load_gguf(args.gguf)
    if args.n_layers:
        model = model.truncated(args.n_layers)
    print(f"model {model.name}: L = {model.L} (load {time.time() - t0:.1f} s)")
    w = int((args.windows or "0").split(",")[0])
    ids = windows[w][: args.n] if args.n else windows[w]
    ex = ExactRun(model, ids, args.n_f)
    print(f"window {w}: n = {ex.n}, n_f = {ex.n_f}: exact run {ex.seconds:.1f} s, nll_exact "
          f"{float(-np.mean(ex.logp[np.arange(ex.n_f), ex.labels])):.4f}")
    if check_dumps(args.dump, model, ex, w):
        return 1
    if args.check_transformers:
        full = dense_forward(model, ids)[ex.n_p - 1: ex.n - 1]
        rel = float(np.max(np.abs(full - ex.logits)) / np.max(np.abs(full)))
        print(f"[{'ok' if rel <= 1e-13 else 'FAIL'}] exact run routed per head = a monolithic f64 einsum forward: "
              f"max |Δ|/max|logit| = {rel:.1e}")
        check_transformers(args.gguf, model, ex)
    for spec in [s for s in args.bench.split(",") if s]:
        mode, method, d = spec.split(":")
        r = method_run(model, ex, mode, method, int(d))
        print(f"{mode:7} {method:15} d={d:<5} kl_mean {r['kl_mean']:.6g} p99 {r['kl_p99']:.4g} top1 {r['top1']:.4f} "
              f"dnll {r['dnll']:+.5f} op_err {r['op_err_mean']:.4g} 1-cos {r['op_1mcos_mean']:.3e} "
              f"keys {r['keys_mean']:.2f} kv_read {r['kv_read']:.4f} mass {r['mass_mean']:.4f} "
              f"L0 {r['one_layer_err_l0']:.4g} L{model.L // 2} {r[f'one_layer_err_l{model.L // 2}']:.4g} "
              f"| {r['seconds']:.1f} s")
    return 0


def check_dumps(specs: list[str], model: Model, ex: ExactRun, window: int) -> int:
    """This forward's exact-run Q/K/V against the tool's ``dump-qkv`` files of the same window (sidecar
    <file>.json: layer, window, n): token ids identical; Q/K/V within 1e-10 relative (max |Δ| / max |x|) for F64
    tensors (``--dtype f64``), 1e-5 for F32 ones. Returns the number of failed dumps."""
    bad = 0
    for path in specs:
        try:
            with open(path + ".json") as f:
                meta = json.load(f)
            t = pf.load_safetensors(path)
        except (OSError, ValueError) as e:
            print(f"[FAIL] {path}: cannot read the dump or its sidecar ({e})")
            bad += 1
            continue
        layer, win, n = int(meta["inputs"]["layer"]), int(meta.get("window", 0)), int(meta.get("n", 0))
        if win != window or n != ex.n:
            continue
        if layer >= model.L:
            print(f"[FAIL] {path}: layer {layer} ≥ L = {model.L}")
            bad += 1
            continue
        same_ids = "token_ids" in t and np.array_equal(t["token_ids"].astype(np.int64).ravel(), ex.ids)
        tol = 1e-10 if t["q"].dtype == np.float64 else 1e-5
        devs = {}
        for name, mine in (("q", ex.Q[layer]), ("k", ex.K[layer]), ("v", ex.V[layer])):
            x = t[name].astype(np.float64)
            devs[name] = math.inf if x.shape != mine.shape else float(np.max(np.abs(x - mine)) / np.max(np.abs(mine)))
        ok = same_ids and max(devs.values()) <= tol
        bad += not ok
        print(f"[{'ok' if ok else 'FAIL'}] exact run vs {os.path.basename(path)} (layer {layer}, window {win}, "
              f"{t['q'].dtype}): token ids {'identical' if same_ids else 'DIFFER'}, max rel |Δ| q {devs['q']:.1e} "
              f"k {devs['k']:.1e} v {devs['v']:.1e} (≤ {tol:.0e})")
    return bad


def check_transformers(gguf_path: str, model: Model, ex: ExactRun) -> None:
    """Sanity: this forward's exact logits against transformers' float32 Llama loaded from the same GGUF
    (≤ 1e-3 relative, max |Δ| / max |logit|)."""
    try:
        import torch  # noqa: PLC0415
        from transformers import AutoModelForCausalLM  # noqa: PLC0415
    except ImportError as e:
        print(f"[INFO] transformers check skipped ({e})")
        return
    t0 = time.time()
    tm = AutoModelForCausalLM.from_pretrained(os.path.dirname(os.path.abspath(gguf_path)),
                                              gguf_file=os.path.basename(gguf_path), dtype=torch.float32)
    tm.eval()
    if tm.config.num_hidden_layers != model.L:
        print(f"[INFO] transformers check skipped (the reference runs {model.L} of "
              f"{tm.config.num_hidden_layers} layers)")
        return
    with torch.no_grad():
        out = tm(torch.tensor(ex.ids[None, :], dtype=torch.long)).logits[0].double().numpy()
    ref = out[ex.n_p - 1: ex.n - 1]
    rel = float(np.max(np.abs(ref - ex.logits)) / np.max(np.abs(ex.logits)))
    agree = float(np.mean(np.argmax(ref, axis=1) == np.argmax(ex.logits, axis=1)))
    print(f"[{'ok' if rel <= 1e-3 else 'FAIL'}] exact f64 logits vs transformers float32 (GGUF): max |Δ|/max|logit| "
          f"= {rel:.2e} (≤ 1e-3), argmax agreement {agree:.4f} ({time.time() - t0:.1f} s)")


# ------------------------------------------------------------------------------------------
# self-test


def dense_forward(model: Model, ids: np.ndarray) -> np.ndarray:
    """A second, monolithic exact forward (no per-head routing): all logits [n, vocab]."""
    n, p = len(ids), model.p
    X = model.emb[ids]
    cs = rope(model, np.arange(n))
    mask = np.tril(np.ones((n, n), dtype=bool))
    for l in range(model.L):
        q, k, v = layer_qkv(model, l, X, cs)
        g = np.arange(model.H) * model.Hkv // model.H
        S = np.einsum("hip,hjp->hij", q, k[g]) / math.sqrt(p)
        S = np.where(mask, S, -np.inf)
        Pm = np.exp(S - S.max(axis=2, keepdims=True))
        Pm /= Pm.sum(axis=2, keepdims=True)
        X = layer_finish(model, l, X, Pm @ v[g])
    return head_logits(model, X)


def selftest() -> int:
    t0 = time.time()
    fails = []

    def check(ok, what):
        print(f"[{'ok' if ok else 'FAIL'}] {what}")
        if not ok:
            fails.append(what)

    def relmax(a, b):
        return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))

    # (d) output-metric arithmetic on a hand case
    lp = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.6, 0.3]]))
    lq = np.log(np.array([[0.25, 0.5, 0.25], [0.1, 0.3, 0.6]]))
    m = output_metrics(lp, lq, np.array([0, 2]))
    kl0 = 0.5 * math.log(2) + 0.25 * math.log(0.5)  # = 0.25 ln 2
    kl1 = 0.6 * math.log(2) + 0.3 * math.log(0.5)  # = 0.3 ln 2
    check(abs(m["kl_mean"] - (kl0 + kl1) / 2) < 1e-15 and abs(m["kl_max"] - kl1) < 1e-15
          and abs(m["kl_p99"] - (kl0 + 0.99 * (kl1 - kl0))) < 1e-15,
          f"hand case: KL = 0.25 ln2, 0.3 ln2 -> kl_mean {m['kl_mean']:.6f}, kl_p99 linear, kl_max")
    check(m["top1"] == 0.0 and abs(m["nll_exact"] - (-math.log(0.5) - math.log(0.3)) / 2) < 1e-15
          and abs(m["nll_method"] - (-math.log(0.25) - math.log(0.6)) / 2) < 1e-15
          and abs(m["ppl_ratio"] - math.exp(m["dnll"])) < 1e-15,
          "hand case: top1 0 (argmax 0 vs 1, 1 vs 2), nll_exact, nll_method, ppl_ratio = e^dnll")
    z = np.array([[1000.0, 1000.0, -1000.0]])
    check(np.allclose(np.exp(log_softmax(z)), [[0.5, 0.5, 0.0]]) and
          output_metrics(log_softmax(z), log_softmax(z), np.array([1]))["kl_mean"] == 0.0
          and output_metrics(log_softmax(z), log_softmax(z[:, ::-1].copy()), np.array([1]))["top1"] == 0.0,
          "max-shifted log_softmax at |logit| 1000; KL(p‖p) = 0; argmax ties to the lower id")
    kl_neg = output_metrics(np.log(np.array([[0.3, 0.7]])), np.log(np.array([[0.3, 0.7 * (1 + 1e-16)]])), np.array([0]))
    check(kl_neg["kl_mean"] >= 0, "KL terms clamped at 0")
    r = spearman([1, 2, 3, 4], [10, 20, 40, 30])
    check(abs(r - 0.8) < 1e-15 and abs(spearman([1, 1, 2], [1, 2, 3]) - math.sqrt(3) / 2) < 1e-12,
          f"Spearman ρ: 0.8 on a hand case, average ranks for ties")

    # GGUF permutation: llama.cpp's forward permutation, then ours, is the identity
    rng = np.random.default_rng(5)
    w = rng.standard_normal((4 * 16, 8))
    perm = w.reshape(4, 2, 8, 8).swapaxes(1, 2).reshape(w.shape)  # convert_hf_to_gguf.py's permute
    check(np.array_equal(reverse_permute(perm, 4), w), "reverse_permute undoes llama.cpp's q/k row permutation")

    # the tiny random llama
    model = random_model(rng, L=2, hidden=128, H=4, Hkv=2, vocab=50)
    n, n_f = 48, 16
    ids = rng.integers(0, model.vocab, n)
    ex = ExactRun(model, ids, n_f)
    full = dense_forward(model, ids)
    check(relmax(ex.logits, full[n - n_f - 1: n - 1]) < 1e-13,
          f"exact run (routed per head, prefill_dump.Head) = a monolithic forward: "
          f"{relmax(ex.logits, full[n - n_f - 1: n - 1]):.1e}")

    # (a) prefill window/topk/streaming with d ≥ n are exact
    worst = 0.0
    for meth in ("window", "topk", "streaming"):
        for d in (n, n + 5):
            r = method_run(model, ex, "prefill", meth, d)
            worst = max(worst, relmax(r["logits"], ex.logits))
            ok = (r["kl_mean"] < 1e-20 and r["top1"] == 1 and abs(r["keys_mean"] - (n + 1) / 2) < 1e-12
                  and abs(r["kv_read"] - 1) < 1e-12 and abs(r["mass_mean"] - 1) < 1e-12)
            if not ok:
                check(False, f"{meth} d={d}: kl {r['kl_mean']:.3g} top1 {r['top1']} keys {r['keys_mean']} "
                             f"kv_read {r['kv_read']} mass {r['mass_mean']}")
    check(worst <= 1e-12, f"(a) prefill window, topk, streaming at d = n, n + 5: logits = exact, max rel {worst:.1e}"
                          f" (keys (n+1)/2, kv_read 1, mass 1)")
    # the other prefill methods at d ≥ n: every key kept too (h2o/quest/moba/blocks/vertical_slash at d = n)
    worst = 0.0
    for meth in PREFILL_METHODS:
        r = method_run(model, ex, "prefill", meth, 2 * n)
        worst = max(worst, relmax(r["logits"], ex.logits))
    check(worst <= 1e-12, f"all 9 prefill §7 methods at d = 2n: logits = exact, max rel {worst:.1e}")
    # and below it they differ and the layer metrics are sane
    r = method_run(model, ex, "prefill", "window", 8)
    check(r["kl_mean"] > 1e-6 and r["op_err_mean"] > 0 and abs(r["keys_mean"] - np.mean(np.minimum(8, np.arange(n) + 1))) < 1e-12
          and abs(r["one_layer_err_l0"] - r["layers"][0]["abs_error"]) < 1e-15,
          f"window d = 8: kl_mean {r['kl_mean']:.3g} > 0, keys = mean min(8, i+1), one-layer L0 = layer 0's "
          f"local error (same inputs)")
    # (b) decode methods with d ≥ n_p are exact
    n_p = n - n_f
    worst, ok_all = 0.0, True
    for meth in DECODE_METHODS:
        for d in (n_p, n_p + 3):
            r = method_run(model, ex, "decode", meth, d)
            worst = max(worst, relmax(r["logits"], ex.logits))
            ok_all &= (abs(r["keys_mean"] - np.mean(np.arange(n_p, n) + 1)) < 1e-12 and abs(r["kv_read"] - 1) < 1e-12
                       and abs(r["mass_mean"] - 1) < 1e-12 and r["op_err_mean"] < 1e-12)
    check(worst <= 1e-12 and ok_all, f"(b) all {len(DECODE_METHODS)} decode methods at d = n_p, n_p + 3 "
                                     f"(pyramidkv with L = 2): logits = exact, max rel {worst:.1e}")
    r = method_run(model, ex, "decode", "snapkv", 8)
    check(r["kl_mean"] > 1e-8 and abs(r["kl_p99"]) >= 0 and r["op_err_mean"] > 0,
          f"decode snapkv d = 8 (= dec_window): kl_mean {r['kl_mean']:.3g} > 0")
    # the decode protocol = a full forward whose prompt rows are exact (the [REC] shortcut changes nothing):
    # dec_window d = 8 by a full-window run with the prompt rows exact in every layer
    X = model.emb[ids]
    cs = rope(model, np.arange(n))
    for l in range(model.L):
        q, k, v = layer_qkv(model, l, X, cs)
        check_prompt = np.max(np.abs(q[:, :n_p] - ex.Q[l][:, :n_p])) <= 1e-12 * np.max(np.abs(ex.Q[l]))
        if not check_prompt:
            check(False, f"layer {l}: prompt Q of the full decode-protocol run ≠ exact")
        outs = []
        for h in range(model.H):
            g = kv_of(model, h)
            hd = pf.Head(q[h], k[g], v[g])
            M = np.tril(np.ones((n, n), dtype=bool))
            M[n_p:, : n_p - 8] = False  # continuation rows keep the last 8 prompt keys and {n_p..t}
            outs.append(hd.masked_weights(M) @ hd.V)
        X = layer_finish(model, l, X, np.stack(outs))
    lg = head_logits(model, X[n_p - 1: n - 1])
    r = method_run(model, ex, "decode", "dec_window", 8)
    check(relmax(r["logits"], lg) < 1e-12,
          f"decode dec_window d = 8 (continuation-only forward) = a full forward with exact prompt rows and "
          f"masked continuation rows: {relmax(r['logits'], lg):.1e}")
    # (c) §8 methods with identity formats: exact
    worst = 0.0
    for meth in QUANT_METHODS:
        r = method_run(model, ex, "prefill", meth, 0, fmt=qd.IdentityFmt())
        worst = max(worst, relmax(r["logits"], ex.logits))
    for meth in CACHE_READS:
        r = method_run(model, ex, "decode", meth, 0, fmt=qd.IdentityFmt())
        worst = max(worst, relmax(r["logits"], ex.logits))
    check(worst <= 1e-12, f"(c) all {len(QUANT_METHODS)} §8 methods (prefill) and {len(CACHE_READS)} cache reads "
                          f"(decode) with identity formats: logits = exact, max rel {worst:.1e}")
    # and with their real formats they perturb, with kv_read = kv_bits/16
    r = method_run(model, ex, "prefill", "kv_q4_0", 0)
    r2 = method_run(model, ex, "decode", "dkivi2", 0)
    check(r["kl_mean"] > 1e-3 and abs(r["kv_read"] - 4.5 / 16) < 1e-15 and r["mass_mean"] == 1
          and relmax(r2["logits"], ex.logits) < 1e-12 and r2["keys_mean"] == np.mean(np.arange(n_p, n) + 1)
          and abs(r2["kv_read"] - 1) < 1e-15,
          f"kv_q4_0: kl_mean {r['kl_mean']:.3g} > 0, kv_read 4.5/16, mass 1; dkivi2 at n = {n} < R = 128 reads only "
          f"full-precision tokens: exact, kv_read 1")
    # p = 16 (the brief's tiny shape): the §7/§9 limits hold there too; kv_q*/kivi* are refused (p % 32)
    m16 = random_model(np.random.default_rng(11), L=2, hidden=64, H=4, Hkv=2, vocab=50)
    ex16 = ExactRun(m16, ids, n_f)
    w16 = max(relmax(method_run(m16, ex16, "prefill", "topk", n)["logits"], ex16.logits),
              relmax(method_run(m16, ex16, "decode", "adakv", n_p)["logits"], ex16.logits),
              relmax(method_run(m16, ex16, "prefill", "sage2_4b", 0, fmt=qd.IdentityFmt())["logits"], ex16.logits))
    try:
        method_run(m16, ex16, "prefill", "kv_q4_0", 0)
        refused = False
    except qd.UsageError:
        refused = True
    check(w16 <= 1e-12 and refused, f"hidden 64, p = 16: topk d = n, adakv d = n_p, identity sage2_4b exact "
                                    f"({w16:.1e}); kv_q4_0 refused (p not a multiple of 32)")
    print(f"self-test: {'all checks passed' if not fails else f'{len(fails)} FAILED'} ({time.time() - t0:.1f} s)")
    return 1 if fails else 0


# ------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", help="the model's GGUF file (SmolLM2-135M-Instruct.Q4_1.gguf)")
    ap.add_argument("--ids", help="token ids: text (one window per non-empty line) or .npy (1-D or 2-D)")
    ap.add_argument("--n-f", type=int, default=256, help="continuation length n_f (§10.1)")
    ap.add_argument("--csv", help="the tool's e2e.csv")
    ap.add_argument("--layers-csv", help="the tool's e2e_layers.csv")
    ap.add_argument("--windows", default="", help="comma-separated window indices (default: every window in the CSV)")
    ap.add_argument("--self-test", action="store_true", help="tiny random Llama checks, no files needed")
    ap.add_argument("--bench", default="", help="MODE:METHOD:D[,…]: run reference points and time them (no CSV)")
    ap.add_argument("--n", type=int, default=0, help="--bench: use the first N ids of the window")
    ap.add_argument("--n-layers", type=int, default=0, help="development only: the first N layers of the model")
    ap.add_argument("--dump", action="append", default=[],
                    help="a dump-qkv file (with its .json sidecar) of one of the windows: its token ids and Q/K/V "
                         "are compared with this forward's exact run (repeatable)")
    ap.add_argument("--check-transformers", action="store_true",
                    help="--bench: compare the exact logits with transformers' float32 model (needs torch)")
    args = ap.parse_args()
    if args.self_test:
        return selftest()
    if not args.gguf or not args.ids:
        ap.error("--gguf and --ids are required (or --self-test)")
    if args.bench:
        return bench(args)
    if not args.csv:
        ap.error("--csv is required (or --bench / --self-test)")
    if args.n_layers:
        print("[NOTE] --n-layers truncates the model: the tool's rows will not match")
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
