"""approx-bench from Python: score attention approximations on the benchmark's own inputs,
seeds and metric.

Everything here calls the Rust library that the `approx-bench` CLI runs (no second
implementation): ``exact`` is the CLI's target, ``spectral_error`` its metric, ``approximate``
its trials, bit for bit.

Arrays are numpy; anything ``numpy.asarray`` accepts (torch on CPU, JAX) is converted at the
door. One head's Q, K, V are ``[n, p]`` arrays of float32 (the CLI's default dtype) or float64.
"""

from __future__ import annotations

import hashlib
import inspect
import marshal
import os
import sys
from typing import Callable, Sequence, Union

import numpy as np

from . import _core

__version__ = _core.__version__

__all__ = [
    "inputs",
    "sweep",
    "e2e",
    "plot",
    "exact",
    "spectral_error",
    "agreement",
    "approximate",
    "trial_seed",
    "methods",
]


def _head(name: str, x) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 2:
        raise ValueError(f"{name}: expected one head as a 2-D array [n, p], got shape {a.shape}")
    if a.dtype not in (np.float32, np.float64):
        if not np.issubdtype(a.dtype, np.number):
            raise ValueError(f"{name}: expected a float array, got dtype {a.dtype}")
        a = a.astype(np.float32)
    return np.ascontiguousarray(a)


def _qkv(q, k, v):
    q, k, v = _head("q", q), _head("k", k), _head("v", v)
    dtype = np.result_type(q, k, v)
    return q.astype(dtype, copy=False), k.astype(dtype, copy=False), v.astype(dtype, copy=False)


def _spec(scale, softcap, window, sink) -> dict:
    """A layer's attention keywords (docs/reference.md §7.7.0) as the core takes them."""
    return dict(
        scale=None if scale is None else float(scale),
        softcap=None if softcap is None else float(softcap),
        window=None if window is None else int(window),
        sink=None if sink is None else float(sink),
    )


def exact(q, k, v, target: str = "softmax", mask: str = "none", *, scale=None, softcap=None,
          window=None, sink=None) -> np.ndarray:
    """One head's target, computed as the benchmark computes it: O = softmax(QKᵀ/√p)V in the
    inputs' dtype (over the keys j ≤ i with ``mask="causal"``, docs/reference.md §7.2), or with
    ``target="kernelized"`` C·V, C_ij = exp(−‖q̃_i − k̃_j‖²/2), q̃ = q·p^-1/4, in float64
    (docs/reference.md §6.4.1).

    A §7.7 family's layer (docs/reference.md §7.7.0): ``scale`` τ instead of 1/√p, ``softcap`` c
    (logits c·tanh(s/c)), ``window`` W (causal: keys i − W < j ≤ i) and this head's ``sink``
    logit σ (a key with a zero value in every row's softmax), as a dump's sidecar states them.
    V may have its own head size (DeepSeek's MLA)."""
    return _core.exact(*_qkv(q, k, v), target, mask, **_spec(scale, softcap, window, sink))


def spectral_error(o, o_hat) -> tuple[float, float, float]:
    """(‖O − Ô‖₂, ‖O − Ô‖₂ / ‖O‖₂, ‖O − Ô‖_F), computed in float64 as the benchmark does."""
    o, o_hat = _head("o", o), _head("o_hat", o_hat)
    dtype = np.result_type(o, o_hat)
    return _core.spectral_error(o.astype(dtype, copy=False), o_hat.astype(dtype, copy=False))


def agreement(o, o_hat) -> tuple[float, float, float]:
    """(cos_sim, rel_l1, rmse) of Ô against O on the flattened output, in float64, as trials.csv
    records them (docs/reference.md §8.5; the units of SageAttention's and KV-cache papers' tables)."""
    o, o_hat = _head("o", o), _head("o_hat", o_hat)
    dtype = np.result_type(o, o_hat)
    return _core.agreement(o.astype(dtype, copy=False), o_hat.astype(dtype, copy=False))


def approximate(method: str, q, k, v, d: int, seed: int, mask: str = "none", *, scale=None,
                softcap=None, window=None, sink=None) -> np.ndarray:
    """Ô of built-in method ``method`` with budget ``d`` for one head (its causal form with
    ``mask="causal"``, docs/reference.md §7.4; a method without one raises ValueError).

    ``seed`` is the trial's derived seed (the ``seed`` column of trials.csv, or
    :func:`trial_seed`); with the same Q, K, V the result equals the CLI's trial bit for bit.
    The quantized family (``kv_q4_0``, ``kivi2``, ``sage2_8b``, …; docs/reference.md §8) has no budget:
    pass ``d=0`` (trials.csv's d) and any seed. ``scale``, ``softcap``, ``window`` and ``sink``
    give a §7.7 family's layer, as for :func:`exact`: the method runs under the layer's rules
    (docs/reference.md §7.7.6), and one that does not implement a feature raises ValueError.
    """
    if int(d) < 0:
        raise ValueError(f"d = {d}: the budget must be a non-negative integer")
    return _core.approximate(method, *_qkv(q, k, v), int(d), int(seed), mask,
                             **_spec(scale, softcap, window, sink))


def trial_seed(seed: int, n: int, window: int, head: int, method: str, d: int) -> int:
    """The derived seed of one trial, as trials.csv records it (run seed ``seed``)."""
    return _core.trial_seed(int(seed), int(n), int(window), int(head), method, int(d))


def methods() -> list[tuple[str, str, bool]]:
    """The built-in methods: (id, what d means, randomized)."""
    return _core.methods()


def inputs(n: int, window: int = 0, **options):
    """Q, K, V of window ``window`` (tokens [window·n, (window+1)·n)) as arrays: Q [heads, n, p],
    K and V [kv_heads, n, p] (a decoder with grouped-query heads: query head h reads K/V head
    ⌊h·kv_heads/heads⌋; a window then starts with BOS when the tokenizer adds one).

    Options are the CLI's long flags with underscores and mean the same: ``model``
    ("pretrained" | "initialized"), ``model_id``, ``revision``, ``model_dir``, ``corpus``,
    ``split``, ``embedding``, ``embeddings_from``, ``embedding_dropout``, ``layer``,
    ``model_seed``, ``init``, ``dtype`` ("f32" | "f64"), ``qkv_cache`` (a directory where the
    window's Q/K/V are kept for the next call, or "off"; default: decoders only, in the user's
    cache directory).
    """
    for key in ("model_dir", "corpus", "qkv_cache"):
        if options.get(key) is not None:
            options[key] = os.fspath(options[key])
    return _core.inputs(int(n), int(window), **options)


UserMethod = Callable[..., "np.ndarray"]


def _describe(f) -> tuple[str, str]:
    """(origin, sha256 of the source): recorded in the manifest and compared on resume."""
    origin = f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', repr(f))}"
    try:
        blob = inspect.getsource(f).encode()
    except (OSError, TypeError):
        code = getattr(f, "__code__", None)
        blob = marshal.dumps(code) if code is not None else repr(f).encode()
    return origin, hashlib.sha256(blob).hexdigest()


def _takes_spec(f) -> bool:
    """Whether ``f`` takes a ``spec`` keyword (by name, or through ``**kwargs``)."""
    try:
        params = inspect.signature(f).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "spec" or p.kind == p.VAR_KEYWORD for p in params)


def _named(m, what: str):
    """(name, function) of a user's method given as a function or a (name, function) pair."""
    if isinstance(m, tuple) and len(m) == 2 and isinstance(m[0], str) and callable(m[1]):
        return m
    if callable(m):
        name = getattr(m, "__name__", "")
        if not name or name == "<lambda>":
            raise ValueError("a lambda has no name: pass (name, function) instead")
        return name, m
    raise ValueError(f"{what}: {m!r} is neither a method id nor a function")


def sweep(
    methods: Sequence[Union[str, UserMethod, tuple]],
    *,
    out,
    force: bool = False,
    quiet: bool = False,
    **options,
) -> str:
    """Runs (or resumes) the CLI's sweep into ``out`` and returns its path.

    ``methods`` mixes built-in ids and presets ("skeinformer", "figure", "field", "kernelized",
    "all") with your own
    methods: a function ``f(q, k, v, d, rng) -> o_hat`` (one head's [n, p] arrays, the budget d,
    and a ``numpy.random.Generator`` seeded with the trial's derived seed — the ``seed`` column
    of trials.csv), or a pair ``(name, f)``. Its output is anything ``numpy.asarray`` takes,
    of shape [n, p]. Options: the CLI's flags with underscores (``target`` ("softmax" |
    "kernelized": what every method, yours included, is scored against), ``lengths``,
    ``features``, ``windows``, ``heads``, ``seed``, ``figure``, ``decode`` and every option of
    :func:`inputs`). ``decode=n_f`` runs the decode protocol (docs/reference.md §9.1): the last n_f rows of
    each window are the continuation and the rows scored; your function is called with
    ``mask="causal", n_f=n_f`` and returns those n_f rows (or the whole window's [n, p]), or the
    prompt keys the continuation reads: one integer array (every continuation row) or a list of
    n_f of them; the tool then computes the rows, ``keys``, ``mass`` and ``kv_read``.
    On a §7.7 family's layer (Gemma 2/3, Phi-3, gpt-oss, DeepSeek) a function with a ``spec``
    parameter is called with ``spec={"causal", "scale", "softcap", "window", "sink"}`` (this head's
    τ, c, W and σ, None where absent) and the head's own Q, K; one without it runs only where the
    layer's one feature is its scale, on Q and K rescaled so that QKᵀ/√p is τ·QKᵀ, and elsewhere the
    sweep is refused, naming the feature.
    Writes trials.csv, summary.csv and manifest.json exactly as the CLI does; the function's
    module, name and source hash are in the manifest, and a resumed run with an edited
    function is refused (use another ``out`` or ``force=True``).
    """
    names: list[str] = []
    user = []
    for m in methods:
        if isinstance(m, str):
            names.append(m)
            continue
        name, f = _named(m, "methods")
        if any(name == u[0] for u in user):
            raise ValueError(f"methods: two of your methods are named {name!r}")
        origin, digest = _describe(f)
        names.append(name)
        user.append((name, f, origin, digest, _takes_spec(f)))
    for key in ("model_dir", "corpus", "qkv_cache"):
        if options.get(key) is not None:
            options[key] = os.fspath(options[key])
    command = [os.path.basename(sys.executable)] + list(sys.argv)
    return _core.sweep(names, user, os.fspath(out), bool(force), bool(quiet), command, **options)


def e2e(
    model_dir,
    attention: Union[str, UserMethod, tuple, Sequence] = (),
    *,
    out,
    methods: Sequence[str] = (),
    features: Sequence[int] = (64, 256, 1024),
    lengths: Sequence[int] = (1024,),
    windows: int = 4,
    n_f: int = 256,
    ids=None,
    seed: int = 0,
    quiet: bool = True,
    **options,
) -> list[dict]:
    """Runs your attention in every layer of a decoder LLM (``approx-bench e2e``, docs/reference.md §10)
    and returns the rows of ``e2e.csv``: next-token ``kl_mean``, ``top1``, ``dnll``, … against
    the exact model, beside each layer's operator error, for your method and the built-in
    ``methods`` (ids or the presets "prefill", "quant", "decode", "all") side by side.

    ``attention`` is a function ``f(q, k, v, d, rng, mask="causal")`` returning one query head's
    causal attention output [n, p] (numpy in; anything ``numpy.asarray`` takes out, so torch
    tensors on the CPU too), a pair ``(name, f)``, a triple ``(name, f, "decode")`` for a
    decode-time method (called with ``n_f=…`` as in :func:`sweep`, returning the continuation's
    rows or the prompt keys it reads), or a list of these. It is called for every query head of
    every layer, on that layer's own Q, K, V (which carry the earlier layers' errors), at each
    budget d of ``features``. On a §7.7 family every layer has its own attention; a function with
    a ``spec`` parameter is told it, as in :func:`sweep`, and one without runs only where no layer
    has more than a scale. ``ids`` is a file of token ids (one window a line) used instead of
    the corpus. Other options are :func:`inputs`'s (``corpus``, ``dtype``, ``model``, …).
    Rerunning with the same ``out`` resumes; a wrong shape or a non-finite value from your
    function raises ValueError naming the layer, head and d, and rows already written stay.
    """
    import csv

    if isinstance(attention, (str, tuple)) or callable(attention):
        attention = [attention]
    names: list[str] = list(methods)
    user = []
    for m in attention:
        if isinstance(m, str):
            names.append(m)
            continue
        mode = "prefill"
        if isinstance(m, tuple) and len(m) == 3:
            m, mode = m[:2], m[2]
        name, f = _named(m, "attention")
        if mode not in ("prefill", "decode"):
            raise ValueError(f"attention {name!r}: mode {mode!r} is neither 'prefill' nor 'decode'")
        names.append(name)
        user.append((name, f, mode == "decode", _takes_spec(f), *_describe(f)))
    for key in ("corpus", "qkv_cache"):
        if options.get(key) is not None:
            options[key] = os.fspath(options[key])
    command = [os.path.basename(sys.executable)] + list(sys.argv)
    out = _core.e2e(
        names,
        user,
        os.fspath(out),
        bool(quiet),
        command,
        [int(n) for n in lengths],
        int(windows),
        int(n_f),
        [int(d) for d in features],
        ids=None if ids is None else os.fspath(ids),
        seed=int(seed),
        model_dir=os.fspath(model_dir),
        **options,
    )
    with open(os.path.join(out, "e2e.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k, v in r.items():
            if k not in ("mode", "method", "dtype"):
                r[k] = float(v) if k not in ("window", "d", "n", "n_f") else int(v)
    return rows


def plot(runs, out, statistic: str = "mean") -> list[str]:
    """Draws the CLI's figures (``approx-bench plot``) from run directories into ``out``.

    Your methods get their own colours and legend entries beside the built-in ones.
    """
    if isinstance(runs, (str, os.PathLike)):
        runs = [runs]
    return _core.plot([os.fspath(r) for r in runs], os.fspath(out), statistic)
