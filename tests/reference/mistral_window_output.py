#!/usr/bin/env python3
"""transformers' own attention output of the tiny Mistral fixture's layer 1 (issue 54): the sliding
window question. fixtures/decoders/mistral has sliding_window 16 and 40 ids, and its expected.safetensors
holds the plain causal output of METHODS.md §7.2. This writes what transformers' MistralAttention itself
computes there (the input of o_proj, [H, n, p], float32 eager, its own sliding-window mask) to
fixtures/decoders/mistral/attention_output.safetensors, so the Rust tests can pin that the sweep's and
dump's exact target of a sliding layer is the windowed one, as e2e's is.

    mistral_window_output.py            write it
    mistral_window_output.py --check    recompute and compare (1e-6 relative)
"""

import argparse
import os
import sys

import torch
from safetensors.torch import load_file, save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DIR = os.path.join(ROOT, "fixtures", "decoders", "mistral")
LAYER = 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(DIR, dtype=torch.float32, attn_implementation="eager").eval()
    ids = load_file(os.path.join(DIR, "expected.safetensors"))["ids"]
    attn = model.model.layers[LAYER].self_attn
    seen = {}
    handle = attn.o_proj.register_forward_pre_hook(lambda _m, args: seen.__setitem__("o", args[0].detach().clone()))
    with torch.no_grad():
        model(ids[None], use_cache=False)
    handle.remove()
    n = ids.shape[0]
    out = seen["o"][0].reshape(n, -1, attn.head_dim).transpose(0, 1).contiguous()
    path = os.path.join(DIR, "attention_output.safetensors")
    if a.check:
        old = load_file(path)["attention_output"]
        err = ((old - out).abs().max() / out.abs().max()).item()
        if err > 1e-6:
            sys.exit(f"{path}: transformers now gives {err:.2e} away")
        print(f"{path}: transformers' output recomputed ({err:.1e})")
    else:
        save_file({"attention_output": out}, path, metadata={"format": "pt"})
        print(f"wrote {path}: {tuple(out.shape)}")


if __name__ == "__main__":
    main()
