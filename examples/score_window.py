"""Score your own attention approximation next to the built-in ones, on identical inputs.

Defines sliding-window attention in numpy, runs it through approx-bench's sweep beside
Skeinformer and Nyströmformer (same Q/K/V, seeds, spectral-norm metric and statistics), and
draws the figure. Run from the repository root after `pip install ./python`:

    python examples/score_window.py                # bert-base-cased through the hub cache
    python examples/score_window.py --offline      # ../shared/data's copies, initialized
"""

import sys

import numpy as np

import approx_bench as ab


def sliding_window(q, k, v, d, rng):
    """Each query attends to the d/2 keys on either side of it (about d keys, like a budget-d
    method), exact softmax over them. Dense for clarity: an efficient version gathers bands."""
    n, p = q.shape
    w = max(d // 2, 1)
    s = (q.astype(np.float64) @ k.T.astype(np.float64)) / np.sqrt(p)
    i = np.arange(n)
    s[np.abs(i[:, None] - i[None, :]) > w] = -np.inf
    s -= s.max(axis=1, keepdims=True)
    e = np.exp(s)
    return (e / e.sum(axis=1, keepdims=True)) @ v.astype(np.float64)


if __name__ == "__main__":
    inputs = dict(model="pretrained")
    if "--offline" in sys.argv:
        inputs = dict(
            model="initialized",
            model_dir="../shared/data/bert-base-cased",
            corpus="../shared/data/wikitext-2/wiki.test.raw",
        )
    out = "results/example-window"
    ab.sweep(
        ["skeinformer", "nystromformer", sliding_window],
        out=out,
        lengths=[1024],
        windows=2,
        features=[16, 32, 64, 128, 256],
        **inputs,
    )
    for path in ab.plot(out, out):
        print(path)
