"""approx-bench from Python: score attention approximations on the benchmark's own inputs,
seeds and metric.

Everything here calls the Rust library that the `approx-bench` CLI runs (no second
implementation): ``exact`` is the CLI's target, ``spectral_error`` its metric, ``approximate``
its trials, bit for bit.

Arrays are numpy; anything ``numpy.asarray`` accepts (torch on CPU, JAX) is converted at the
door. One head's Q, K, V are ``[n, p]`` arrays of float32 (the CLI's default dtype) or float64.
"""

from __future__ import annotations

import numpy as np

from . import _core

__version__ = _core.__version__

__all__ = [
    "exact",
    "spectral_error",
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


def exact(q, k, v) -> np.ndarray:
    """O = softmax(QKᵀ/√p)V for one head, computed as the benchmark computes its target."""
    return _core.exact(*_qkv(q, k, v))


def spectral_error(o, o_hat) -> tuple[float, float, float]:
    """(‖O − Ô‖₂, ‖O − Ô‖₂ / ‖O‖₂, ‖O − Ô‖_F), computed in float64 as the benchmark does."""
    o, o_hat = _head("o", o), _head("o_hat", o_hat)
    dtype = np.result_type(o, o_hat)
    return _core.spectral_error(o.astype(dtype, copy=False), o_hat.astype(dtype, copy=False))


def approximate(method: str, q, k, v, d: int, seed: int) -> np.ndarray:
    """Ô of built-in method ``method`` with budget ``d`` for one head.

    ``seed`` is the trial's derived seed (the ``seed`` column of trials.csv, or
    :func:`trial_seed`); with the same Q, K, V the result equals the CLI's trial bit for bit.
    """
    if int(d) < 1:
        raise ValueError(f"d = {d}: the budget must be a positive integer")
    return _core.approximate(method, *_qkv(q, k, v), int(d), int(seed))


def trial_seed(seed: int, n: int, window: int, head: int, method: str, d: int) -> int:
    """The derived seed of one trial, as trials.csv records it (run seed ``seed``)."""
    return _core.trial_seed(int(seed), int(n), int(window), int(head), method, int(d))


def methods() -> list[tuple[str, str, bool]]:
    """The built-in methods: (id, what d means, randomized)."""
    return _core.methods()
