#!/usr/bin/env python3
"""`approx-bench e2e --dtype f64` against transformers' own Llama made float64 end to end (issue 43,
docs/reference.md §10.4 "Dtype").

transformers' Llama cast with `.double()` still computes three things in float32: RMSNorm (it casts
the hidden states to float32), the RoPE angle (`position_ids.float() * inv_freq`, inv_freq itself
formed in float32) and the eager softmax. This script takes them out: every RMSNorm and the rotary
embedding are replaced by float64 forwards, and attention goes through transformers'
`AttentionInterface` as a float64 function (exact causal softmax, or the `window` method of §7.4:
query i reads keys i − d < j ≤ i). The model is SmolLM2 from the same GGUF the tool reads,
dequantized by transformers' own GGUF loader (gguf-py).

It reads an e2e run made with `--positions --dtype f64` and compares, position by position on the
first window:
- the exact run's NLL (`nll_exact`) against transformers' exact float64 forward;
- the `window` point at `--d` (`nll_method`, `kl`) against the same forward with the window.
It also prints how far the float32-computing forward (the three casts left in) is, to show that the
casts are what the replacement removes.

    python tests/reference/e2e_transformers_f64.py \
        --gguf ../shared/data/SmolLM2-135M-Instruct-Q4_1/SmolLM2-135M-Instruct.Q4_1.gguf \
        --run OUT --d 64

Exit 1 if a deviation exceeds its tolerance: 1e-9 relative on each NLL (relative to max(|NLL|, 1)),
1e-9 absolute on each KL (float64 through 30 layers in two summation orders).
"""

import argparse
import csv
import math
import os
import sys

import numpy as np
import torch

NLL_REL = 1e-9
KL_ABS = 1e-9


def float64_rmsnorm(module):
    def forward(hidden_states):
        h = hidden_states.to(torch.float64)
        variance = h.pow(2).mean(-1, keepdim=True)
        return module.weight * (h * torch.rsqrt(variance + module.variance_epsilon))

    return forward


def float64_rotary(module, theta, head_dim):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))

    def forward(x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    return forward


def attention(d):
    """Causal softmax attention in float64 over keys i − d < j ≤ i (d None: every key j ≤ i)."""

    def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        b, h, n, p = query.shape
        group = h // key.shape[1]
        key = key.repeat_interleave(group, dim=1).to(torch.float64)
        value = value.repeat_interleave(group, dim=1).to(torch.float64)
        scores = torch.matmul(query.to(torch.float64), key.transpose(-1, -2)) * (scaling or p ** -0.5)
        lag = torch.arange(n)[:, None] - torch.arange(n)[None, :]
        hidden = lag < 0
        if d is not None:
            hidden = hidden | (lag >= d)
        scores = scores.masked_fill(hidden, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), value)
        return out.transpose(1, 2).contiguous(), None

    return attend


def load(gguf_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), dtype=torch.float32
    )
    return model.double().eval()


def make_float64(model):
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    theta = getattr(cfg, "rope_theta", None) or cfg.rope_parameters["rope_theta"]
    for m in model.modules():
        if type(m).__name__.endswith("RMSNorm"):
            m.forward = float64_rmsnorm(m)
        if type(m).__name__.endswith("RotaryEmbedding"):
            m.forward = float64_rotary(m, float(theta), head_dim)


def scored_logp(model, ids, n_f, d):
    from transformers import AttentionInterface

    name = f"ab_f64_{'exact' if d is None else d}"
    AttentionInterface.register(name, attention(d))
    model.config._attn_implementation = name
    with torch.no_grad():
        logits = model(torch.tensor([ids]), use_cache=False).logits[0].to(torch.float64)
    n = len(ids)
    return torch.log_softmax(logits[n - n_f - 1 : n - 1], dim=-1).numpy()


def tool_positions(run, d):
    """(positions, nll_exact, nll_method, kl) of window 0's `window` point at d."""
    rows = [
        r
        for r in csv.DictReader(open(os.path.join(run, "e2e_positions.csv")))
        if r["window"] == "0" and r["method"] == "window" and int(r["d"]) == d
    ]
    if not rows:
        sys.exit(f"{run}/e2e_positions.csv has no `window` rows at d = {d} for window 0")
    rows.sort(key=lambda r: int(r["position"]))
    col = lambda c: np.array([float(r[c]) for r in rows])
    return np.array([int(r["position"]) for r in rows]), col("nll_exact"), col("nll_method"), col("kl")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--run", required=True, help="an e2e run with --positions --dtype f64 and `window` at --d")
    ap.add_argument("--d", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("RAYON_NUM_THREADS", "2")))

    first = open(os.path.join(args.run, "ids.txt")).readline().split()
    ids = [int(t) for t in first]
    positions, nll_exact, nll_method, kl = tool_positions(args.run, args.d)
    n_f = len(positions)
    labels = np.array(ids[len(ids) - n_f :])
    if positions[0] != len(ids) - n_f - 1:
        sys.exit(f"positions start at {positions[0]}, expected n − n_f − 1 = {len(ids) - n_f - 1}")

    model = load(args.gguf)
    pick = lambda logp: -logp[np.arange(n_f), labels]
    # The forward with transformers' float32 casts left in: how far they are on their own.
    cast_exact = pick(scored_logp(model, ids, n_f, None))
    make_float64(model)
    ref_exact = scored_logp(model, ids, n_f, None)
    ref_window = scored_logp(model, ids, n_f, args.d)
    ref_kl = np.sum(np.exp(ref_exact) * (ref_exact - ref_window), axis=1)

    # Relative to max(|NLL|, 1): a confident prediction's NLL is ~1e-5 nats, where a relative
    # deviation would measure the rounding of log(1 − ε), not the forward.
    rel = lambda a, b: float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1.0)))
    checks = [
        ("nll_exact", rel(nll_exact, pick(ref_exact)), NLL_REL, "relative"),
        (f"nll_method (window, d = {args.d})", rel(nll_method, pick(ref_window)), NLL_REL, "relative"),
        (f"kl (window, d = {args.d})", float(np.max(np.abs(kl - ref_kl))), KL_ABS, "absolute"),
    ]
    print(
        f"n = {len(ids)}, n_f = {n_f}; transformers with its float32 casts left in: "
        f"nll_exact {rel(nll_exact, cast_exact):.2e}"
    )
    failed = 0
    for name, dev, tol, kind in checks:
        ok = dev <= tol and math.isfinite(dev)
        failed += not ok
        print(f"  {name:<28} max {kind} deviation {dev:.2e} (tolerance {tol:.0e}) {'ok' if ok else 'FAIL'}")
    print(f"kl_mean tool {kl.mean():.12f}, transformers float64 {ref_kl.mean():.12f}")
    print("e2e --dtype f64 against transformers float64: " + ("PASS" if not failed else f"{failed} FAILED"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
