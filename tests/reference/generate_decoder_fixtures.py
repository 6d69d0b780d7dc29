#!/usr/bin/env python3
"""Generate the tiny decoder fixtures of METHODS.md §7.1 "Check" under fixtures/decoders/.

Each tiny random model is built by transformers itself (fixed torch seed), saved with
``save_pretrained`` and run in float32 with eager attention. The reference Q/K/V of layer 1 are
taken from transformers' own modules: a forward pre-hook on ``model.layers[1].self_attn`` captures
its input (the post-``input_layernorm`` hidden states) and its ``position_embeddings`` (cos, sin
from the model's rotary module, i.e. transformers' inv_freq code incl. llama3 scaling); Q/K/V are
then ``q_proj``/``k_proj``/``v_proj`` of that input (+ qwen3's ``q_norm``/``k_norm``), passed
through the modeling file's own ``apply_rotary_pos_emb``. The exact causal attention output per
query head uses the modeling file's ``repeat_kv`` and a plain causal mask (METHODS.md §7.2), in
float32 as ``eager_attention_forward`` computes it. Nothing here shares code with the Rust side.

Models (hidden 64, 4 query heads, 2 K/V heads, vocab 128, ids: 40 tokens):
* ``llama``: GQA, ``llama3`` rope scaling (θ = 5e5, N₀ = 32, so all three frequency regimes occur
  at p = 16), 3 layers, untied; config.json rewritten to the transformers-4 spelling
  (``rope_theta`` + ``rope_scaling`` with the legacy ``type`` key). Saved only **sharded**, over 4
  files: embeddings / layer 0 / layer 1 / layer 2 + final norm + lm_head, with
  ``model.safetensors.index.json``; so layer 1 needs the first three shards only.
* ``llama_gguf``: the same llama as a GGUF file written with the ``gguf`` package in llama.cpp's
  layout: F32 tensors, ``attn_q``/``attn_k`` rows permuted by llama.cpp's ``LlamaModel.permute``,
  the llama3 scaling as ``rope_freqs.weight`` divisors (as its converter writes them).
* ``mistral``: sliding_window 16 (< 40 tokens, so layer 0's attention is windowed), 2 layers.
* ``qwen2``: q/k/v biases, tied embeddings, weights stored as **bfloat16** (the reference model
  runs on the bf16-rounded values in float32), 2 layers.
* ``qwen3``: q_norm/k_norm, explicit head_dim 32 ≠ 64/4, tied, transformers-5 ``rope_parameters``,
  2 layers.

Parameters are redrawn at a larger scale than ``_init_weights`` (Linear N(0, 1/in), embeddings
N(0, 1), norms 1 + N(0, 0.2²), biases N(0, 0.3²)) so that attention is far from uniform and a wrong
RoPE, head mapping or norm shows.

Also two tiny tokenizers (WordLevel) under fixtures/decoders/tokenizers/: ``with_bos`` (a
TemplateProcessing post-processor "<s> $A") and ``without_bos`` (none).

Run:  python tests/reference/generate_decoder_fixtures.py   (torch, transformers, safetensors,
gguf, numpy, tokenizers). Versions used are recorded in fixtures/decoders/VERSIONS.
"""

import json
import math
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
OUT = os.path.join(ROOT, "fixtures", "decoders")
N_TOKENS = 40
LAYER = 1

COMMON = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=96,
    vocab_size=128,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
)


def configs():
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    return {
        "llama": LlamaConfig(
            **COMMON,
            num_hidden_layers=3,
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
        "mistral": MistralConfig(
            **COMMON,
            num_hidden_layers=2,
            sliding_window=16,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
        "qwen2": Qwen2Config(
            **COMMON,
            num_hidden_layers=2,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        ),
        "qwen3": Qwen3Config(
            **COMMON,
            num_hidden_layers=2,
            head_dim=32,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        ),
    }


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))


def reference(model, ids):
    """Post-RoPE Q, K, V of layer LAYER ([H|H_kv, n, p]) and the exact causal output [H, n, p]."""
    modeling = sys.modules[type(model.model).__module__]
    attn = model.model.layers[LAYER].self_attn
    seen = {}

    def hook(_module, args, kwargs):
        seen["h"] = kwargs.get("hidden_states", args[0] if args else None)
        seen["pe"] = kwargs["position_embeddings"]

    handle = attn.register_forward_pre_hook(hook, with_kwargs=True)
    with torch.no_grad():
        model(torch.tensor([ids]), use_cache=False)
    handle.remove()
    h = seen["h"]
    cos, sin = seen["pe"]
    p = attn.head_dim
    with torch.no_grad():
        shape = (*h.shape[:-1], -1, p)
        q = attn.q_proj(h).view(shape)
        k = attn.k_proj(h).view(shape)
        v = attn.v_proj(h).view(shape).transpose(1, 2)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = modeling.apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        groups = q.shape[1] // k.shape[1]
        kr, vr = modeling.repeat_kv(k, groups), modeling.repeat_kv(v, groups)
        n = q.shape[2]
        mask = torch.full((n, n), float("-inf")).triu(1)
        w = torch.matmul(q, kr.transpose(2, 3)) * attn.scaling + mask
        w = torch.nn.functional.softmax(w, dim=-1, dtype=torch.float32)
        out = torch.matmul(w, vr)
    return {
        "q": q[0].contiguous(),
        "k": k[0].contiguous(),
        "v": v[0].contiguous(),
        "causal_output": out[0].contiguous(),
        "ids": torch.tensor(ids, dtype=torch.int64),
    }


def rewrite_legacy_rope(path):
    """transformers-4 spelling: rope_theta + rope_scaling{"type": ...}, no head_dim."""
    with open(path) as f:
        c = json.load(f)
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp.pop("rope_theta")
    rp["type"] = rp.pop("rope_type")
    c["rope_scaling"] = rp
    c.pop("head_dim", None)
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)


def shard_llama(model, d):
    """4 shards: embeddings / layer 0 / layer 1 / layer 2 + norm + lm_head, and the index."""
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    groups = [
        lambda k: k.startswith("model.embed_tokens."),
        lambda k: k.startswith("model.layers.0."),
        lambda k: k.startswith("model.layers.1."),
        lambda k: True,
    ]
    weight_map, placed = {}, set()
    for i, take in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-00004.safetensors"
        part = {k: v for k, v in sd.items() if k not in placed and take(k)}
        placed |= set(part)
        save_file(part, os.path.join(d, fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in part})
    total = sum(v.numel() * v.element_size() for v in sd.values())
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)


def llama_cpp_permute(w, n_head):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute (the K call passes n_head_kv)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, cfg, path):
    import gguf

    rp = cfg.rope_parameters
    p = cfg.head_dim
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(rp["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_key_length(p)
    w.add_value_length(p)
    w.add_rope_dimension_count(p)
    # llama.cpp's converter: llama3 scaling → per-frequency divisors in rope_freqs.weight. (Its
    # converter reads N₀ from the config's top level, default 8192; N₀ from rope_scaling is used
    # here so the file describes this model.)
    base = rp["rope_theta"]
    freqs = 1.0 / (base ** (torch.arange(0, p, 2, dtype=torch.float32) / p))
    f, lo, hi, n0 = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"], rp["original_max_position_embeddings"]
    factors = []
    for fr in freqs.tolist():
        wl = 2 * math.pi / fr
        if wl < n0 / hi:
            factors.append(1.0)
        elif wl > n0 / lo:
            factors.append(f)
        else:
            s = (n0 / wl - lo) / (hi - lo)
            factors.append(1 / ((1 - s) / f + s))
    w.add_tensor("rope_freqs.weight", np.array(factors, dtype=np.float32))
    names = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for k, t in model.state_dict().items():
        a = t.float().numpy()
        if k == "model.embed_tokens.weight":
            g = "token_embd.weight"
        elif k == "model.norm.weight":
            g = "output_norm.weight"
        elif k == "lm_head.weight":
            g = "output.weight"
        else:
            _, _, l, rest = k.split(".", 3)
            stem, suffix = rest.rsplit(".", 1)
            g = f"blk.{l}.{names[stem]}.{suffix}"
            if stem == "self_attn.q_proj":
                a = llama_cpp_permute(a, cfg.num_attention_heads)
            elif stem == "self_attn.k_proj":
                a = llama_cpp_permute(a, cfg.num_key_value_heads)
        w.add_tensor(g, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tokenizers_fixture():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3, "b": 4, "c": 5}
    for name, bos in [("with_bos", True), ("without_bos", False)]:
        tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        if bos:
            tok.post_processor = processors.TemplateProcessing(
                single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
            )
        d = os.path.join(OUT, "tokenizers", name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        assert tok.encode("a b").ids == ([1, 3, 4] if bos else [3, 4])


def main():
    from transformers import AutoConfig, AutoModelForCausalLM

    transformers.logging.set_verbosity_error()

    torch.manual_seed(0)
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    ids = torch.randint(0, COMMON["vocab_size"], (N_TOKENS,), generator=torch.Generator().manual_seed(7)).tolist()
    for i, (name, cfg) in enumerate(configs().items()):
        cfg._attn_implementation = "eager"
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
        randomize(model, 100 + i)
        if name == "qwen2":
            with torch.no_grad():
                for prm in model.parameters():
                    prm.copy_(prm.to(torch.bfloat16).float())
        d = os.path.join(OUT, name)
        os.makedirs(d)
        ref = reference(model, ids)
        if name == "llama":
            model.config.save_pretrained(d)
            shard_llama(model, d)
            rewrite_legacy_rope(os.path.join(d, "config.json"))
            again = {k: v for k, v in AutoConfig.from_pretrained(d).rope_parameters.items() if k != "type"}
            assert again == cfg.rope_parameters, (again, cfg.rope_parameters)
            write_gguf(model, cfg, os.path.join(OUT, "llama_gguf.gguf"))
        elif name == "qwen2":
            model.config.save_pretrained(d)
            sd = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
            save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        else:
            model.save_pretrained(d, safe_serialization=True)
        for extra in ["generation_config.json"]:
            if os.path.exists(os.path.join(d, extra)):
                os.remove(os.path.join(d, extra))
        # What was saved is the model the reference ran: transformers reloads it to the same Q/K/V.
        reloaded = AutoModelForCausalLM.from_pretrained(d, attn_implementation="eager", dtype=torch.float32).eval()
        for key, val in reference(reloaded, ids).items():
            assert torch.equal(val, ref[key]), (name, key)
        save_file(ref, os.path.join(d, "expected.safetensors"))
        # The reference must see a non-uniform attention, or it tests little.
        print(name, {k: tuple(v.shape) for k, v in ref.items()})
    tokenizers_fixture()
    import gguf

    with open(os.path.join(OUT, "VERSIONS"), "w") as f:
        f.write(
            f"torch {torch.__version__}\ntransformers {transformers.__version__}\n"
            f"gguf {getattr(gguf, '__version__', 'unknown')}\nnumpy {np.__version__}\n"
        )


if __name__ == "__main__":
    main()
