#!/usr/bin/env python3
# A gemma2-shaped random model for timing e2e decode points (BENCHMARKS.md, "The families' decode
# points"; not a fixture): Gemma 2 2B's widths
# scaled down (hidden 576, 9 heads / 3 KV heads of 64, 1536 MLP, 12 layers), window 256, vocab 4096.
# Writes config.json, model.safetensors (180 MB), tokenizer.json and corpus.txt into the directory
# given (default /tmp/g2big), from numpy's seeded PCG64. Run from the repository root.
import json, os, sys
import numpy as np
from safetensors.numpy import save_file
out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/g2big"
os.makedirs(out, exist_ok=True)
here = os.path.dirname(os.path.abspath(__file__))
fixture = os.path.join(here, "..", "fixtures", "families", "gemma2")
cfg = json.load(open(os.path.join(fixture, "config.json")))
cfg.update(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
           intermediate_size=1536, num_hidden_layers=12, sliding_window=256, vocab_size=4096,
           max_position_embeddings=8192, query_pre_attn_scalar=64,
           layer_types=["sliding_attention", "full_attention"] * 6)
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
rng = np.random.Generator(np.random.PCG64(7))
H, D, h, kv, I, V = 576, 64, 9, 3, 1536, 4096
t = {"model.embed_tokens.weight": rng.standard_normal((V, H)).astype(np.float32),
     "model.norm.weight": (rng.standard_normal(H) * 0.2).astype(np.float32)}
lin = lambda o, i: (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)
for l in range(12):
    p = f"model.layers.{l}."
    for n in ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"]:
        t[p + n + ".weight"] = (rng.standard_normal(H) * 0.2).astype(np.float32)
    t[p + "self_attn.q_proj.weight"] = lin(h * D, H)
    t[p + "self_attn.k_proj.weight"] = lin(kv * D, H)
    t[p + "self_attn.v_proj.weight"] = lin(kv * D, H)
    t[p + "self_attn.o_proj.weight"] = lin(H, h * D)
    t[p + "mlp.gate_proj.weight"] = lin(I, H)
    t[p + "mlp.up_proj.weight"] = lin(I, H)
    t[p + "mlp.down_proj.weight"] = lin(H, I)
save_file(t, os.path.join(out, "model.safetensors"))
tok = json.load(open(os.path.join(fixture, "tokenizer.json")))
tok["model"]["vocab"] = {f"t{i}": i for i in range(V)}
json.dump(tok, open(os.path.join(out, "tokenizer.json"), "w"))
ids = rng.integers(3, V, 2 * 2048)
open(os.path.join(out, "corpus.txt"), "w").write(" ".join(f"t{i}" for i in ids) + "\n")
