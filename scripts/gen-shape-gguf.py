#!/usr/bin/env python3
"""Writes an initialized decoder of a published model's shape as a Q4_0 GGUF (issue 56), with a
GGUF tokenizer of its vocabulary size, so that the tool's memory and speed can be measured at
that size without downloading the model. The weights are random Q4_0 blocks (f16 scales of an
N(0, 0.02²) weight's block maximum over 8, uniform 4-bit codes), the norms 1, the biases 0: not
a language model, but a forward of exactly the real model's cost and shapes.

    scripts/gen-shape-gguf.py qwen2.5-7b /tmp/qwen7b-shape/model.gguf
    scripts/gen-shape-gguf.py llama3.2-1b /tmp/llama1b-shape/model.gguf

Needs numpy and gguf (pip install gguf). Never commit the output (GBs)."""

import argparse
import os

import numpy as np
import gguf

SHAPES = {
    # Qwen2.5-7B: q/k/v biases, untied head, θ = 1e6.
    "qwen2.5-7b": dict(arch="qwen2", layers=28, hidden=3584, heads=28, kv_heads=4,
                       inter=18944, vocab=152064, theta=1e6, eps=1e-6, tied=False, qkv_bias=True),
    # Llama-3.2-1B: tied head, θ = 5e5 (its llama3 frequency scaling left out: the cost is the same).
    "llama3.2-1b": dict(arch="llama", layers=16, hidden=2048, heads=32, kv_heads=8,
                        inter=8192, vocab=128256, theta=5e5, eps=1e-5, tied=True, qkv_bias=False),
}

QK4_0 = 32  # values per Q4_0 block: an f16 scale and 16 bytes of 4-bit codes


def q4_0_blocks(rng, rows, cols):
    """Random Q4_0 data of a [rows, cols] matrix as gguf-py takes it: uint8 [rows, cols/32·18]."""
    nb = cols // QK4_0
    out = np.empty((rows, nb, 18), dtype=np.uint8)
    scale = (np.abs(rng.standard_normal((rows, nb), dtype=np.float32)) * 0.02 * 2.5 / 8).astype(np.float16)
    out[:, :, :2] = scale.view(np.uint8).reshape(rows, nb, 2)
    out[:, :, 2:] = rng.integers(0, 256, size=(rows, nb, 16), dtype=np.uint8)
    return out.reshape(rows, nb * 18)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    s = SHAPES[a.shape]
    rng = np.random.default_rng(a.seed)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    w = gguf.GGUFWriter(a.out, s["arch"])
    arch = s["arch"]
    p = s["hidden"] // s["heads"]
    w.add_block_count(s["layers"])
    w.add_context_length(32768)
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["inter"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_freq_base(s["theta"])
    w.add_layer_norm_rms_eps(s["eps"])
    # A byte-level vocabulary of the model's size: the 256 byte tokens, then placeholders.
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if arch == "qwen2" else "llama-bpe")
    toks = [bytes([b]).decode("latin-1") for b in range(256)] + ["ab"]
    toks += [f"<t{i}>" for i in range(len(toks), s["vocab"])]
    w.add_token_list(toks)
    w.add_token_types([1] * s["vocab"])
    w.add_token_merges(["a b"])
    w.add_add_bos_token(False)

    def mat(name, rows, cols):
        w.add_tensor(name, q4_0_blocks(rng, rows, cols),
                     raw_dtype=gguf.GGMLQuantizationType.Q4_0)

    def vec(name, n, value):
        w.add_tensor(name, np.full(n, value, dtype=np.float32))

    h, kvd = s["hidden"], s["kv_heads"] * p
    mat("token_embd.weight", s["vocab"], h)
    for l in range(s["layers"]):
        b = f"blk.{l}"
        vec(f"{b}.attn_norm.weight", h, 1.0)
        mat(f"{b}.attn_q.weight", h, h)
        mat(f"{b}.attn_k.weight", kvd, h)
        mat(f"{b}.attn_v.weight", kvd, h)
        if s["qkv_bias"]:
            vec(f"{b}.attn_q.bias", h, 0.0)
            vec(f"{b}.attn_k.bias", kvd, 0.0)
            vec(f"{b}.attn_v.bias", kvd, 0.0)
        mat(f"{b}.attn_output.weight", h, h)
        vec(f"{b}.ffn_norm.weight", h, 1.0)
        mat(f"{b}.ffn_gate.weight", s["inter"], h)
        mat(f"{b}.ffn_up.weight", s["inter"], h)
        mat(f"{b}.ffn_down.weight", h, s["inter"])
    vec("output_norm.weight", h, 1.0)
    if not s["tied"]:
        mat("output.weight", s["vocab"], h)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{a.out}: {os.path.getsize(a.out) / 1e9:.2f} GB, {a.shape} shape, Q4_0")


if __name__ == "__main__":
    main()
