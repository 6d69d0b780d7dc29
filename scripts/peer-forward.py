#!/usr/bin/env python3
"""The PyTorch peer of `approx-bench dump-qkv` on SmolLM2 (issue 33, BENCHMARKS.md): transformers'
SDPA forward of a window through the layers before L (f32, `--threads` threads), loading excluded,
and SDPA's causal attention per head at the same n. Usage:

    scripts/peer-forward.py --n 8192 --layer 15 --threads 2
    scripts/peer-forward.py --n 8192 --sdpa-only   # SDPA alone (SmolLM2's 9 heads, p = 64)
"""
import argparse
import time

import torch
from transformers import AutoModelForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--n", type=int, default=8192)
ap.add_argument("--layer", type=int, default=15)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--model-dir", default="../shared/data/SmolLM2-135M-Instruct-Q4_1")
ap.add_argument("--gguf", default="SmolLM2-135M-Instruct.Q4_1.gguf")
ap.add_argument("--sdpa-only", action="store_true")
a = ap.parse_args()
torch.set_num_threads(a.threads)


def sdpa_per_head(n, h, p):
    q, k, v = (torch.randn(1, h, n, p) for _ in range(3))
    f = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    f()
    ts = []
    for _ in range(3):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[1] / h


if a.sdpa_only:
    print(f"SDPA causal per head, n = {a.n}: {sdpa_per_head(a.n, 9, 64)*1e3:.1f} ms")
    raise SystemExit
t0 = time.perf_counter()
model = AutoModelForCausalLM.from_pretrained(
    a.model_dir, gguf_file=a.gguf, dtype=torch.float32, attn_implementation="sdpa"
)
model.eval()
# Layers 0..L−1 run whole and layer L's input norm and projections give its Q/K/V: keep L + 1
# layers (the measured layer's MLP is a few percent of the forward, charged to the peer).
model.model.layers = model.model.layers[: a.layer + 1]
load = time.perf_counter() - t0
ids = torch.randint(0, model.config.vocab_size, (1, a.n))
with torch.no_grad():
    model.model(input_ids=ids[:, :256])  # warm-up
    t0 = time.perf_counter()
    model.model(input_ids=ids)
    fwd = time.perf_counter() - t0
cfg = model.config
h, p = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
sdpa = sdpa_per_head(a.n, h, p)
print(f"torch {torch.__version__}, {a.threads} threads, n = {a.n}: load {load:.1f} s; forward through layers 0..{a.layer} {fwd:.2f} s; SDPA causal per head {sdpa*1e3:.1f} ms")
