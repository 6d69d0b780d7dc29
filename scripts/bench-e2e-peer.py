#!/usr/bin/env python3
"""The PyTorch peer of one `approx-bench e2e` point (issues 43, 55; BENCHMARKS.md): a model from its GGUF in
transformers (float32), every layer's attention replaced through transformers' `AttentionInterface` by the
same method, the causal sliding window of d keys (`window`, docs/reference.md §7.4: query i reads keys i − d < j ≤ i),
one forward over one window of token ids, on the same thread count.

It times what a PyTorch user would run to get the method's next-token distribution: a dense masked softmax
per layer (the mask built once), the forward, and the logits of the scored positions. The tool's point
(`seconds` of e2e.csv) also measures every layer's local error (exact attention of the layer's own inputs,
spectral norms, agreement) and runs the method on gathered key sets; both are printed side by side.

    python scripts/bench-e2e-peer.py --gguf ../shared/data/SmolLM2-135M-Instruct-Q4_1/SmolLM2-135M-Instruct.Q4_1.gguf \
        --ids OUT/ids.txt --d 256 --n-f 256 --threads 2 --repeats 3 [--tool-csv OUT/e2e.csv]

It also reports the KL of the patched model's scored positions against its own unpatched run, beside the tool's
kl_mean for the same point (a sanity check that the peer runs the same method, f32 against f32).
"""

import argparse
import csv
import os
import statistics
import time

import numpy as np
import torch


def window_attention(d):
    def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        # query [b, H, n, p], key/value [b, H_kv, n, p]; GQA by repeating K/V over the group.
        b, h, n, p = query.shape
        group = h // key.shape[1]
        key = key.repeat_interleave(group, dim=1)
        value = value.repeat_interleave(group, dim=1)
        scores = torch.matmul(query, key.transpose(-1, -2)) * (scaling or p ** -0.5)
        lag = torch.arange(n)[:, None] - torch.arange(n)[None, :]
        scores = scores.masked_fill((lag < 0) | (lag >= d), float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), value)
        return out.transpose(1, 2).contiguous(), None

    return attend


def scored_logp(model, ids, n_f):
    # Only the rows that predict the scored positions go through the LM head (`logits_to_keep`), as
    # in the tool: with Gemma 3's 262,144-token vocabulary the head over every row would cost more
    # than the rest of the forward.
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=False, logits_to_keep=n_f + 1).logits[0]
    return torch.log_softmax(out[:n_f].double(), dim=-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--ids", required=True, help="ids.txt of an e2e run (its first window is used)")
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--n-f", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tool-csv", help="the tool's e2e.csv with a `window` row at this d, to print beside")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from transformers import AttentionInterface, AutoModelForCausalLM

    AttentionInterface.register("window_peer", window_attention(a.d))
    ids = [int(x) for x in open(a.ids).readline().split()]
    path = os.path.abspath(a.gguf)
    load = lambda impl: AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), torch_dtype=torch.float32,
        attn_implementation=impl).eval()
    exact, patched = load("eager"), load("window_peer")
    p = scored_logp(exact, ids, a.n_f)
    times = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        q = scored_logp(patched, ids, a.n_f)
        times.append(time.perf_counter() - t0)
    kl = (p.exp() * (p - q)).sum(-1).clamp(min=0).mean().item()
    print(f"peer: window d = {a.d}, n = {len(ids)}, {a.threads} threads: forward median {statistics.median(times):.2f} s "
          f"over {a.repeats} ({', '.join(f'{t:.2f}' for t in times)}); kl_mean {kl:.6g}")
    if a.tool_csv:
        for r in csv.DictReader(open(a.tool_csv)):
            if r["method"] == "window" and int(r["d"]) == a.d and r["window"] == "0":
                print(f"tool: window d = {a.d}: point {float(r['seconds']):.2f} s (forward + every layer's local "
                      f"error); kl_mean {float(r['kl_mean']):.6g}")


if __name__ == "__main__":
    main()
