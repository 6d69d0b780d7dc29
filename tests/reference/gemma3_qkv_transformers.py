#!/usr/bin/env python3
"""Gemma 3 270M's Q, K, V as `approx-bench dump-qkv` writes them from the GGUF alone, against
transformers' float32 forward of the same GGUF (its own loader and gguf-py's dequantizers) on the same
token ids (issue 55).

Every layer's attention goes through a registered function that records the post-RoPE, post-q_norm/
k_norm query, key and value it is handed, then runs transformers' eager attention. The mask function
is registered under the same name (eager_mask: the additive float mask that eager attention adds to the
logits; sdpa_mask is boolean and would be added as 0 or 1): transformers builds a layer's mask by the attention
implementation's name, and without a mask function it passes none, so the sliding layers would
attend to the whole window and every later layer would differ.

    gemma3_qkv_transformers.py --gguf G.gguf --dump L4.safetensors:4 --dump L5.safetensors:5 [--tol 1e-4]

A dump's layer is compared relative to the tensor's largest magnitude (measured on the build
machine: at most 3e-5 for q, k and v at layer 4, which slides, and layer 5, which is global).
"""

import argparse
import os
import sys

import torch
from safetensors.numpy import load_file


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--dump", action="append", required=True, help="FILE:LAYER of dump-qkv")
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    from transformers import AttentionInterface, AttentionMaskInterface, AutoModelForCausalLM
    from transformers.masking_utils import eager_mask
    from transformers.models.gemma3 import modeling_gemma3

    seen = {}

    def capture(module, query, key, value, attention_mask, **kwargs):
        seen[module.layer_idx] = (query[0].detach().clone(), key[0].detach().clone(), value[0].detach().clone())
        return modeling_gemma3.eager_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("capture", capture)
    AttentionMaskInterface.register("capture", eager_mask)
    path = os.path.abspath(a.gguf)
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32,
        attn_implementation="capture").eval()
    window = model.config.sliding_window
    worst = 0.0
    for spec in a.dump:
        file, layer = spec.rsplit(":", 1)
        layer = int(layer)
        dump = load_file(file)
        ids = torch.tensor(dump["token_ids"].astype("int64"))[None]
        seen.clear()
        with torch.no_grad():
            model(input_ids=ids)
        kind = model.config.layer_types[layer]
        for name, ref in zip("qkv", seen[layer]):
            ours = torch.from_numpy(dump[name])
            if ours.shape != ref.shape:
                sys.exit(f"layer {layer} {name}: shape {tuple(ours.shape)}, transformers {tuple(ref.shape)}")
            err = ((ours - ref).abs().max() / ref.abs().max()).item()
            worst = max(worst, err)
            print(f"layer {layer} ({kind}, n = {ids.shape[1]}, window {window}) {name}: max |Δ| / max |ref| = {err:.2e}")
    if worst > a.tol:
        sys.exit(f"FAIL: worst {worst:.2e} > {a.tol:.0e}")
    print(f"Gemma 3 dump-qkv agrees with transformers' float32 forward of the GGUF: worst {worst:.2e} <= {a.tol:.0e}")


if __name__ == "__main__":
    main()
