#!/usr/bin/env python3
"""Reference attention of SmolLM2-135M-Instruct (Q4_1 GGUF) layers 0 and 15, from transformers.

Writes ``fixtures/smollm2_layer0_15.safetensors`` for the ignored test
``smollm2_gguf_attention_matches_transformers`` in tests/shared_data.rs.

* Tokens: the first ``TEXT_CHARS`` characters of ``../shared/data/wikitext-2/wiki.test.raw``
  encoded with the model's ``tokenizer.json`` (tokenizers library) without special tokens; the
  first ``N`` ids are kept (stored as ``ids``; the Rust test re-tokenizes and compares).
* Model: ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)``, which dequantizes the
  GGUF and undoes llama.cpp's q/k row permutation itself; float32, eager attention.
* For each layer L in LAYERS a forward pre-hook on ``model.layers[L].self_attn`` captures the
  post-``input_layernorm`` hidden states and (cos, sin); Q/K/V come from the module's own
  projections and the modeling file's ``apply_rotary_pos_emb``. Stored per layer:
  ``layer{L}.logits`` = QKᵀ/√p per query head (K/V head via ``repeat_kv``) [9, n, n] (invariant
  to any per-head reordering of Q/K dims, so it checks the RoPE pairing, not a layout),
  ``layer{L}.v`` [3, n, 64] and ``layer{L}.causal_output`` [9, n, 64] (causal softmax in float32).
"""

import os
import sys

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DATA = os.path.join(ROOT, "..", "shared", "data")
MODEL_DIR = os.path.join(DATA, "SmolLM2-135M-Instruct-Q4_1")
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT_CHARS = 2000
N = 64
LAYERS = [0, 15]


def main():
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    with open(os.path.join(DATA, "wikitext-2", "wiki.test.raw"), encoding="utf-8", newline="") as f:
        text = f.read(TEXT_CHARS)
    tok = Tokenizer.from_file(os.path.join(MODEL_DIR, "tokenizer.json"))
    ids = tok.encode(text, add_special_tokens=False).ids[:N]
    assert len(ids) == N
    model = AutoModelForCausalLM.from_pretrained(
        MODEL_DIR, gguf_file=GGUF, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    modeling = sys.modules[type(model.model).__module__]
    seen = {}

    def hook_for(layer):
        def hook(_m, args, kwargs):
            seen[layer] = (kwargs.get("hidden_states", args[0] if args else None), kwargs["position_embeddings"])

        return hook

    handles = [model.model.layers[l].self_attn.register_forward_pre_hook(hook_for(l), with_kwargs=True) for l in LAYERS]
    with torch.no_grad():
        model(torch.tensor([ids]), use_cache=False)
    for h in handles:
        h.remove()
    out = {"ids": torch.tensor(ids, dtype=torch.int64)}
    for l in LAYERS:
        attn = model.model.layers[l].self_attn
        h, (cos, sin) = seen[l]
        p = attn.head_dim
        with torch.no_grad():
            shape = (*h.shape[:-1], -1, p)
            q = attn.q_proj(h).view(shape).transpose(1, 2)
            k = attn.k_proj(h).view(shape).transpose(1, 2)
            v = attn.v_proj(h).view(shape).transpose(1, 2)
            q, k = modeling.apply_rotary_pos_emb(q, k, cos, sin)
            groups = q.shape[1] // k.shape[1]
            kr, vr = modeling.repeat_kv(k, groups), modeling.repeat_kv(v, groups)
            logits = torch.matmul(q, kr.transpose(2, 3)) * attn.scaling
            mask = torch.full((N, N), float("-inf")).triu(1)
            w = torch.nn.functional.softmax(logits + mask, dim=-1, dtype=torch.float32)
            o = torch.matmul(w, vr)
        out[f"layer{l}.logits"] = logits[0].contiguous()
        out[f"layer{l}.v"] = v[0].contiguous()
        out[f"layer{l}.causal_output"] = o[0].contiguous()
    path = os.path.join(ROOT, "fixtures", "smollm2_layer0_15.safetensors")
    save_file(out, path, metadata={"transformers": transformers.__version__, "torch": torch.__version__, "text_chars": str(TEXT_CHARS)})
    print(path, {k: tuple(v.shape) for k, v in out.items()})


if __name__ == "__main__":
    main()
