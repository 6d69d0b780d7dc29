#!/usr/bin/env python3
"""Tiny random fixtures for the decoder families of METHODS.md §7.7 (issue 45), made by transformers.

For each fixture a tiny model is built by transformers' own modeling class from a small config,
its weights redrawn from a seeded numpy generator (platform-independent, unlike torch's vectorised
CPU sampler), saved with ``save_pretrained`` in float32 (``config.json`` + ``model.safetensors``,
read back like a real checkpoint), then **re-loaded by transformers in true float64** and run on a
fixed token window. At each stored layer L the tensors that the module hands to its attention
function are captured (the modeling file's ``eager_attention_forward`` is wrapped, so the output O
is transformers' own eager attention):

  expected.safetensors (float64 unless said)
    ids                 [n] int64          the token window
    logits              [n, vocab]          the model's final logits (after gemma2's final cap)
    layer{L}.q          [H, n, p_qk]        post-RoPE (and post q/k-norm), NOT multiplied by τ
    layer{L}.k          [H_kv, n, p_qk]
    layer{L}.v          [H_kv, n, p_v]
    layer{L}.o          [H, n, p_v]         the eager attention function's output (before o_proj)
    layer{L}.sinks      [H]                 gpt-oss only: the learned sink logits σ_h
    layer{L}.kv_latent  [n, r + d_R]        MLA only: c after kv_a_layernorm, then the post-RoPE k_pe
                                            (in the same rope layout as k's rope part)
    layer{L}.w_kv_b     [H, d_nope + d_v, r] MLA only: kv_b_proj.weight per head (from the checkpoint)

  spec.json: per expected file and stored layer the §7.7.0 parameters, derived from config.json by
  the formulas of §7.7.1–7.7.5 (not read back from the module) and asserted equal to what the
  module passed to its attention function: scale τ, softcap c or null, window W or null,
  layer_type, head_dim_v, sinks; phi3 longrope's rope_factors (short|long); MLA's ``mla`` object.

phi3-longrope has two expected files: ``expected.safetensors`` at n above its switch N₀ (long
factors) and ``expected_short.safetensors`` at n ≤ N₀ (short factors).

**True float64.** ``.double()`` alone leaves transformers computing in float32 wherever its code
casts explicitly: RMSNorm (``hidden_states.to(torch.float32)``, gemma's ``x.float()``), the RoPE
(``position_ids.float()``, ``inv_freq.to(dtype=torch.float)``, inv_freq built from
``arange(...).float()``, longrope's ``torch.tensor(factors, dtype=torch.float32)``, yarn's ramp in
``arange(dtype=torch.float32)``), the eager softmax (``softmax(dtype=torch.float32)``), the
DeepSeek routers (``.type(torch.float32)``) and DeepSeek-V2's complex RoPE (``xq.float()`` →
complex64). e2e_transformers_f64.py replaces RMSNorm and the rotary forward by float64 copies; here
there are six families with linear/yarn/longrope/partial/complex RoPE, so instead of rewriting them
the casts themselves are redirected: while the model is built and run, the ``torch`` seen by the
modeling files and by modeling_rope_utils is a proxy whose ``float32``/``float`` are float64 (and
``complex64`` complex128), and ``Tensor.float`` returns float64. Every line of transformers' math
runs unchanged, in float64. A TorchDispatchMode then checks that **no** op of the forward produced
a float32/16 or complex64 tensor (exit 1 otherwise), so a cast this redirection misses cannot pass
silently.

Run (torch 2.15, transformers 5.24, safetensors, numpy; about 10 s on 2 CPU threads):
    python tests/reference/generate_family_fixtures.py --out fixtures/families
    python tests/reference/generate_family_fixtures.py --check fixtures/families
``--check`` regenerates into a temporary directory and compares: config.json, spec.json,
model.safetensors and ``ids`` byte for byte; every float64 tensor within 1e-12 relative to its own
max |·| (float64 through a few layers in another BLAS summation order differs by ~1e-15; the sink
logits are rounded to 1/64 before storing so that the weights themselves are bit-stable).
Exit 1 on any difference.
"""

import argparse
import filecmp
import json
import math
import os
import sys
import tempfile

import numpy as np
import torch

CHECK_REL = 1e-12
VOCAB = 128
COMMON_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)


# --------------------------------------------------------------------------------------------
# The fixtures. Each: transformers config class + causal-LM class, config kwargs, the layers to
# store, the window lengths, the seed, and the gain of q/k projections (to make a cap bite).
# --------------------------------------------------------------------------------------------
def fixtures():
    import transformers as tf

    yarn_ds = lambda mscale, mscale_all_dim: {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": mscale, "mscale_all_dim": mscale_all_dim,
    }
    mla = dict(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        kv_lora_rank=56, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, intermediate_size=32,
        moe_intermediate_size=8, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=1,
        topk_group=1, first_k_dense_replace=1, vocab_size=VOCAB, max_position_embeddings=163840,
        tie_word_embeddings=False, **COMMON_IDS,
    )
    return {
        # §7.7.7: 4 layers (0 and 2 sliding), τ = 24^(−1/2) ≠ 1/√p (p = 16), c = 8, final cap 6,
        # W = 16 < n = 40; q/k gain 3 so that |τ·q·k| > c/2 for a large share of the logits.
        "gemma2": dict(
            cfg=tf.Gemma2Config, model=tf.Gemma2ForCausalLM, seed=4501, layers=[2, 3], ns=[40], qk_gain=3.0,
            kw=dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    intermediate_size=32, vocab_size=VOCAB, sliding_window=16, query_pre_attn_scalar=24,
                    attn_logit_softcapping=8.0, final_logit_softcapping=6.0, max_position_embeddings=512,
                    **COMMON_IDS),
        ),
        # 6 layers so that the default 5 local : 1 global pattern gives layer 5 global; MQA; q/k
        # norms; local θ 1e4, global θ 1e6 with linear ×8; τ = 40^(−1/2) (p = 16).
        "gemma3": dict(
            cfg=tf.Gemma3TextConfig, model=tf.Gemma3ForCausalLM, seed=4502, layers=[4, 5], ns=[40], qk_gain=1.0,
            kw=dict(hidden_size=64, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                    intermediate_size=32, vocab_size=VOCAB, sliding_window=16, query_pre_attn_scalar=40,
                    max_position_embeddings=512,
                    rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                    **COMMON_IDS),
        ),
        # MHA, fused qkv/gate_up, W = 16 on every layer.
        "phi3": dict(
            cfg=tf.Phi3Config, model=tf.Phi3ForCausalLM, seed=4503, layers=[2], ns=[40], qk_gain=1.5,
            kw=dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                    intermediate_size=32, vocab_size=VOCAB, sliding_window=16, max_position_embeddings=512,
                    tie_word_embeddings=False, **COMMON_IDS),
        ),
        # longrope N₀ = 32, max 128 (f = 4, a = √(1 + ln 4/ln 32)), partial rotary 0.75 (12 of 16
        # dims), GQA, tied, no window; n = 40 > N₀ reads the long factors, n = 24 the short.
        "phi3-longrope": dict(
            cfg=tf.Phi3Config, model=tf.Phi3ForCausalLM, seed=4504, layers=[2], ns=[40, 24], qk_gain=1.5,
            kw=dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                    intermediate_size=32, vocab_size=VOCAB, sliding_window=None, max_position_embeddings=128,
                    original_max_position_embeddings=32, tie_word_embeddings=True,
                    rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                                     "original_max_position_embeddings": 32,
                                     "short_factor": [1.0, 1.05, 1.2, 1.5, 2.0, 3.0],
                                     "long_factor": [1.0, 1.5, 3.0, 6.0, 12.0, 24.0]},
                    **COMMON_IDS),
        ),
        # 4 layers (0, 2 sliding, W = 16), q/k/v/o biases, sinks calibrated to each head's mean
        # log-sum-exp, yarn ×32 (truncate false, the config default), 4 experts, top-2.
        "gpt_oss": dict(
            cfg=tf.GptOssConfig, model=tf.GptOssForCausalLM, seed=4505, layers=[2, 3], ns=[40], qk_gain=1.5,
            kw=dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    intermediate_size=16, vocab_size=VOCAB, sliding_window=16, num_local_experts=4,
                    num_experts_per_tok=2, max_position_embeddings=131072, tie_word_embeddings=False,
                    **COMMON_IDS),
        ),
        # MLA, r = 56, d_R = 8 (latent 64), d_nope 16, d_v 16 (p_qk 24 ≠ p_v 16), 4 heads.
        "deepseek_v2": dict(
            cfg=tf.DeepseekV2Config, model=tf.DeepseekV2ForCausalLM, seed=4506, layers=[2], ns=[40], qk_gain=1.5,
            kw=dict(q_lora_rank=None, rope_parameters=yarn_ds(0.707, 0.707), **mla),
        ),
        "deepseek_v3": dict(
            cfg=tf.DeepseekV3Config, model=tf.DeepseekV3ForCausalLM, seed=4507, layers=[2], ns=[40], qk_gain=1.5,
            kw=dict(q_lora_rank=48, rope_parameters=yarn_ds(1.0, 1.0), **mla),
        ),
        # mscale ≠ mscale_all_dim: the yarn attention factor on cos/sin is m(40,1)/m(40,0.8) ≠ 1.
        "deepseek_v3-noqlora": dict(
            cfg=tf.DeepseekV3Config, model=tf.DeepseekV3ForCausalLM, seed=4508, layers=[2], ns=[40], qk_gain=1.5,
            kw=dict(q_lora_rank=None, rope_parameters=yarn_ds(1.0, 0.8), **mla),
        ),
    }


# --------------------------------------------------------------------------------------------
# Weights: a seeded numpy generator (PCG64 + ziggurat normals are the same on every platform).
# --------------------------------------------------------------------------------------------
def redraw(model, seed, family, qk_gain):
    rng = np.random.default_rng(seed)
    gemma = family.startswith("gemma")
    sd = model.state_dict()
    params = dict(model.named_parameters())
    # e_score_correction_bias (DeepSeek-V3's router selection bias) is a persistent buffer.
    targets = {k: v for k, v in sd.items() if k in params or k.endswith("e_score_correction_bias")}
    with torch.no_grad():
        for name in sorted(targets):
            t = targets[name]
            shape = tuple(t.shape)
            z = rng.standard_normal(shape)
            if name.endswith("sinks"):
                x = np.zeros(shape)  # calibrated below
            elif "norm" in name:
                # gemma's RMSNorm multiplies by (1 + w): w ~ N(0, 0.2²); the others by w ~ 1 + N(0, 0.2²).
                x = 0.2 * z + (0.0 if gemma else 1.0)
            elif name.endswith("e_score_correction_bias") or name.endswith("bias") or t.dim() == 1:
                x = 0.3 * z
            elif "embed_tokens" in name:
                x = z
            else:
                # Linear [out, in] (and 3-D expert stacks): N(0, 1/fan_in), fan_in the larger of the
                # last two dims for the 3-D stacks, whose layout differs between families.
                fan_in = shape[-1] if t.dim() == 2 else max(shape[-1], shape[-2])
                gain = qk_gain if any(s in name for s in ("q_proj", "k_proj", "qkv_proj", "q_b_proj", "kv_b_proj")) else 1.0
                x = gain * z / math.sqrt(fan_in)
            t.copy_(torch.from_numpy(x.astype(np.float32)))


def window_ids(seed, n):
    return np.random.default_rng(seed + 1000 + n).integers(3, VOCAB, size=n).astype(np.int64)


# --------------------------------------------------------------------------------------------
# True float64: redirect transformers' float32 casts (see the module docstring).
# --------------------------------------------------------------------------------------------
class _Float64Torch:
    """`torch` as the modeling files see it: float32/float are float64, complex64 is complex128."""

    float32 = torch.float64
    float = torch.float64
    complex64 = torch.complex128
    cfloat = torch.complex128

    def __getattr__(self, name):
        return getattr(torch, name)


class float64_everywhere:
    def __init__(self, modules):
        self.modules = modules

    def __enter__(self):
        self.saved = [(m, m.torch) for m in self.modules]
        for m in self.modules:
            m.torch = _Float64Torch()
        self.tensor_float = torch.Tensor.float
        torch.Tensor.float = lambda t, *a, **k: t.to(torch.float64)
        return self

    def __exit__(self, *exc):
        for m, t in self.saved:
            m.torch = t
        torch.Tensor.float = self.tensor_float


def no_low_precision():
    """A dispatch mode that records every op producing a float32/16, bfloat16 or complex64 tensor."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    low = {torch.float32, torch.float16, torch.bfloat16, torch.complex64}

    class Mode(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.offenders = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.dtype in low:
                    self.offenders.append(f"{func} -> {t.dtype}")
            return out

    return Mode()


def modeling_module(model):
    return sys.modules[type(model).__module__]


# --------------------------------------------------------------------------------------------
# §7.7.0 parameters from the config (the formulas of §7.7.1–7.7.5, independent of the module).
# --------------------------------------------------------------------------------------------
def layer_spec(family, cfg, layer, n):
    lt = list(getattr(cfg, "layer_types", None) or [])
    spec = {"softcap": None, "window": None, "sinks": False}
    if family.startswith("deepseek"):
        p_qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        rp = cfg.rope_parameters
        m = lambda f, mu: 1.0 if f <= 1 else 0.1 * mu * math.log(f) + 1.0
        tau = p_qk ** -0.5
        if rp.get("rope_type") == "yarn" and rp.get("mscale_all_dim"):
            tau = tau * m(rp["factor"], rp["mscale_all_dim"]) ** 2
        spec.update(scale=tau, layer_type="full_attention", head_dim=p_qk, head_dim_v=cfg.v_head_dim)
        spec["mla"] = {
            "kv_lora_rank": cfg.kv_lora_rank, "q_lora_rank": cfg.q_lora_rank, "d_nope": cfg.qk_nope_head_dim,
            "d_rope": cfg.qk_rope_head_dim, "d_v": cfg.v_head_dim,
            # V2 keeps rotated pairs in place (complex RoPE); V3 with rope_interleave writes them
            # de-interleaved, [rotated evens; rotated odds] (§7.7.5).
            "rope_layout": "deinterleaved" if getattr(cfg, "rope_interleave", False) else "pairs",
            "rope_attention_factor": m(rp["factor"], rp["mscale"]) / m(rp["factor"], rp["mscale_all_dim"]),
            "latent_values_per_token": cfg.kv_lora_rank + cfg.qk_rope_head_dim,
            "materialised_values_per_token": cfg.num_attention_heads * (p_qk + cfg.v_head_dim),
        }
        return spec
    p = cfg.head_dim if getattr(cfg, "head_dim", None) else cfg.hidden_size // cfg.num_attention_heads
    spec.update(head_dim=p, head_dim_v=p)
    if family in ("gemma2", "gemma3"):
        spec["scale"] = cfg.query_pre_attn_scalar ** -0.5
        spec["softcap"] = cfg.attn_logit_softcapping if family == "gemma2" else None
        spec["layer_type"] = lt[layer]
        spec["window"] = cfg.sliding_window if lt[layer] == "sliding_attention" else None
    elif family.startswith("phi3"):
        # §7.7.3: a set sliding_window applies to every layer.
        spec["scale"] = p ** -0.5
        spec["window"] = cfg.sliding_window
        spec["layer_type"] = "sliding_attention" if cfg.sliding_window else "full_attention"
        rp = cfg.rope_parameters
        if rp.get("rope_type") == "longrope":
            spec["rope_factors"] = "long" if n > rp["original_max_position_embeddings"] else "short"
    elif family == "gpt_oss":
        spec["scale"] = p ** -0.5
        spec["layer_type"] = lt[layer]
        spec["window"] = cfg.sliding_window if lt[layer] == "sliding_attention" else None
        spec["sinks"] = True
    return spec


# --------------------------------------------------------------------------------------------
# Capture: wrap the modeling file's eager_attention_forward.
# --------------------------------------------------------------------------------------------
def capture_run(model, ids, layers, mla_hooks=False):
    mod = modeling_module(model)
    eager = mod.eager_attention_forward
    got = {}

    def wrapped(module, query, key, value, attention_mask, **kwargs):
        out, w = eager(module, query, key, value, attention_mask, **kwargs)
        if module.layer_idx in layers:
            got[module.layer_idx] = dict(
                q=query[0].detach().clone(), k=key[0].detach().clone(), v=value[0].detach().clone(),
                o=out[0].transpose(0, 1).detach().clone(), kwargs=dict(kwargs),
                sinks=getattr(module, "sinks", None),
            )
        return out, w

    hooks = []
    latents = {}
    if mla_hooks:
        for L in layers:
            norm = model.model.layers[L].self_attn.kv_a_layernorm
            hooks.append(norm.register_forward_hook(lambda m, i, o, L=L: latents.__setitem__(L, o[0].detach().clone())))
    mod.eager_attention_forward = wrapped
    try:
        with torch.no_grad():
            logits = model(torch.tensor(ids[None, :]), use_cache=False).logits[0].detach().clone()
    finally:
        mod.eager_attention_forward = eager
        for h in hooks:
            h.remove()
    return logits, got, latents


def calibrate_sinks(model, ids):
    """gpt-oss: σ_h = (mean over rows of head h's log-sum-exp of its real logits) + an offset, so the
    sink takes a visible share; layer by layer, since each layer's sinks change the later inputs.
    Rounded to 1/64 so that an ulp-level difference of the calibration forward between machines
    cannot change the stored float32 weights."""
    offsets = np.array([-1.0, -0.25, 0.5, 1.25])
    n = len(ids)
    i = torch.arange(n)
    for L, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        _, got, _ = capture_run(model, ids, {L})
        g = got[L]
        q, k = g["q"].double(), g["k"].double()
        k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)
        s = torch.matmul(q, k.transpose(1, 2)) * g["kwargs"]["scaling"]
        hidden = i[None, :] > i[:, None]
        if attn.sliding_window:
            hidden = hidden | (i[None, :] <= i[:, None] - attn.sliding_window)
        lse = torch.logsumexp(s.masked_fill(hidden, float("-inf")), dim=-1).mean(dim=-1).numpy()
        sig = np.round((lse + offsets[: len(lse)]) * 64) / 64
        with torch.no_grad():
            attn.sinks.copy_(torch.from_numpy(sig.astype(np.float32)))


# --------------------------------------------------------------------------------------------
def build(family, fx, out_dir):
    import transformers
    from safetensors.torch import save_file

    fam_dir = os.path.join(out_dir, family)
    os.makedirs(fam_dir, exist_ok=True)
    cfg = fx["cfg"](**fx["kw"])
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    torch.manual_seed(0)  # _init_weights' draws are all overwritten; fixed anyway
    model = fx["model"](cfg).eval()
    redraw(model, fx["seed"], family, fx["qk_gain"])
    if family == "gpt_oss":
        calibrate_sinks(model, window_ids(fx["seed"], fx["ns"][0]))
    model.save_pretrained(fam_dir)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(fam_dir, extra)):
            os.remove(os.path.join(fam_dir, extra))

    # Re-load what was saved, in true float64 (the f32 weights widen exactly).
    from transformers import modeling_rope_utils

    probe = fx["model"]
    mod = sys.modules[probe.__module__]
    with float64_everywhere([mod, modeling_rope_utils]):
        # The MoE experts run the modeling file's own loop ("eager"): the default grouped_mm kernel
        # takes float32/16 only.
        ref = probe.from_pretrained(
            fam_dir, dtype=torch.float64, attn_implementation="eager", experts_implementation="eager"
        ).eval()
        for name, buf in ref.named_buffers():
            if buf.is_floating_point() and buf.dtype != torch.float64:
                sys.exit(f"{family}: buffer {name} is {buf.dtype} in the float64 model")
        spec = {"family": family, "model_type": cfg.model_type, "expected": []}
        for n in fx["ns"]:
            ids = window_ids(fx["seed"], n)
            mode = no_low_precision()
            with mode:
                logits, got, latents = capture_run(ref, ids, set(fx["layers"]), family.startswith("deepseek"))
            if mode.offenders:
                sys.exit(f"{family}: the float64 forward still computes in low precision: {sorted(set(mode.offenders))[:8]}")
            fname = "expected.safetensors" if n == fx["ns"][0] else "expected_short.safetensors"
            if n == fx["ns"][0]:
                write_tokenizer_and_corpus(fam_dir, ids)
            tensors = {"ids": torch.from_numpy(ids), "logits": logits.contiguous()}
            layers = {}
            for L in fx["layers"]:
                g = got[L]
                ls = layer_spec(family, ref.config, L, n)
                check_against_module(family, L, ls, g, ref.config)
                for key in ("q", "k", "v", "o"):
                    tensors[f"layer{L}.{key}"] = g[key].contiguous()
                if ls["sinks"]:
                    tensors[f"layer{L}.sinks"] = g["sinks"].detach().clone().contiguous()
                if "mla" in ls:
                    d_nope = ls["mla"]["d_nope"]
                    k_pe = g["k"][0, :, d_nope:]
                    # k_pe is one key shared by all heads: every head's rope part must be the same.
                    assert torch.equal(g["k"][:, :, d_nope:], k_pe.expand_as(g["k"][:, :, d_nope:]))
                    tensors[f"layer{L}.kv_latent"] = torch.cat([latents[L], k_pe], dim=-1).contiguous()
                    w = ref.model.layers[L].self_attn.kv_b_proj.weight.detach()
                    H = ref.config.num_attention_heads
                    tensors[f"layer{L}.w_kv_b"] = w.reshape(H, d_nope + ls["mla"]["d_v"], -1).clone().contiguous()
                layers[str(L)] = ls
            rope_checks(family, ref, n)
            save_file(tensors, os.path.join(fam_dir, fname), metadata={"format": "pt"})
            spec["expected"].append({"file": fname, "n": n, "layers": layers})
            REPORT.append((family, n, got, logits))
    with open(os.path.join(fam_dir, "spec.json"), "w") as f:
        json.dump(spec, f, indent=1, sort_keys=True)
        f.write("\n")
    floors(family, fam_dir, fx)


def write_tokenizer_and_corpus(fam_dir, ids):
    """tokenizer.json (word-level: the word t{i} is token i, no BOS) and corpus.txt (the words of the
    expected window), so that the tool's CLI reads the fixture as a model directory and its window 0
    of n tokens is the reference's ids (`approx-bench dump-qkv --model-dir fixtures/families/<name>
    --corpus fixtures/families/<name>/corpus.txt --length n`)."""
    vocab = {f"t{i}": i for i in range(128)}
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
           "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
           "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}}
    with open(os.path.join(fam_dir, "tokenizer.json"), "w") as f:
        json.dump(tok, f, indent=1)
        f.write("\n")
    with open(os.path.join(fam_dir, "corpus.txt"), "w") as f:
        f.write(" ".join(f"t{i}" for i in ids) + "\n")


def floors(family, fam_dir, fx):
    """Printed only (not stored, so --check does not depend on them):
    - the negative control of the dispatch guard: transformers' model cast with dtype=float64 but
      its float32 casts left in must trip it (else the guard proves nothing), and how far that
      forward is from the true float64 one;
    - the float32 floor of §7.7.7: transformers in float32 against the true float64 reference."""
    probe = fx["model"]
    mine = [r for r in REPORT if r[0] == family]
    for dtype, label in ((torch.float64, "float64, casts left in"), (torch.float32, "float32 floor")):
        m = probe.from_pretrained(fam_dir, dtype=dtype, attn_implementation="eager", experts_implementation="eager").eval()
        for _, n, ref_got, ref_logits in mine:
            mode = no_low_precision()
            with mode:
                logits, got, _ = capture_run(m, window_ids(fx["seed"], n), set(fx["layers"]))
            if dtype == torch.float64 and not mode.offenders:
                sys.exit(f"{family}: the dispatch guard saw no float32 op in transformers' un-redirected float64 forward")
            dev = lambda a, b: float((a.double() - b).abs().max() / b.abs().max())
            cols = [
                f"L{L} " + " ".join(f"{x} {dev(got[L][x], ref_got[L][x]):.1e}" for x in "qkvo") for L in sorted(got)
            ]
            print(f"  {family:<20} n {n:>3} {label:<24} " + " | ".join(cols) + f" | logits {dev(logits, ref_logits):.1e}")


def rope_checks(family, ref, n):
    """The RoPE variants the fixture is meant to exercise, recomputed from the config (§7.7.2-3)."""
    rot = ref.model.rotary_emb
    cfg = ref.config
    arange = lambda d: torch.arange(0, d, 2, dtype=torch.float64) / d

    def same(name, got, want):
        dev = float((got - want).abs().max() / want.abs().max())
        if not dev <= 1e-15:
            sys.exit(f"{family} n = {n}: {name} differs from §7.7 by {dev:.1e}")

    if family == "gemma3":
        p = cfg.head_dim
        same("local inv_freq (θ 1e4)", rot.sliding_attention_inv_freq, 1.0 / 1e4 ** arange(p))
        same("global inv_freq (θ 1e6, linear ×8)", rot.full_attention_inv_freq, 1.0 / (8.0 * 1e6 ** arange(p)))
    if family == "phi3-longrope":
        rp = cfg.rope_parameters
        d = int(cfg.hidden_size // cfg.num_attention_heads * rp["partial_rotary_factor"])
        n0 = rp["original_max_position_embeddings"]
        e = torch.tensor(rp["long_factor"] if n > n0 else rp["short_factor"], dtype=torch.float64)
        same(f"longrope inv_freq ({'long' if n > n0 else 'short'} factors)", rot.inv_freq, 1.0 / (e * 1e4 ** arange(d)))
        a = math.sqrt(1 + math.log(cfg.max_position_embeddings / n0) / math.log(n0))
        if abs(rot.attention_scaling - a) > 1e-15:
            sys.exit(f"{family}: longrope attention factor {rot.attention_scaling} != {a}")


REPORT = []


def check_against_module(family, L, ls, g, cfg):
    """The config-derived spec must be what the module passed to its attention function."""
    kw = g["kwargs"]
    scaling = kw.get("scaling")
    if abs(scaling - ls["scale"]) > 1e-15 * ls["scale"]:
        sys.exit(f"{family} layer {L}: module scaling {scaling!r} != spec scale {ls['scale']!r}")
    if "softcap" in kw and kw["softcap"] != ls["softcap"]:
        sys.exit(f"{family} layer {L}: module softcap {kw['softcap']} != spec {ls['softcap']}")
    if "sliding_window" in kw and kw["sliding_window"] != ls["window"]:
        sys.exit(f"{family} layer {L}: module sliding_window {kw['sliding_window']} != spec {ls['window']}")
    if ls["sinks"] != (g["sinks"] is not None):
        sys.exit(f"{family} layer {L}: sinks presence differs from the spec")
    if g["v"].shape[-1] != ls["head_dim_v"] or g["q"].shape[-1] != ls["head_dim"]:
        sys.exit(f"{family} layer {L}: head dims {tuple(g['q'].shape)}/{tuple(g['v'].shape)} != spec")


def generate(out_dir, only=None):
    torch.set_num_threads(int(os.environ.get("RAYON_NUM_THREADS", "2")))
    os.makedirs(out_dir, exist_ok=True)
    for family, fx in fixtures().items():
        if only and family not in only:
            continue
        build(family, fx, out_dir)


def compare(new_dir, old_dir):
    from safetensors.numpy import load_file

    bad = []
    fams = sorted(os.listdir(new_dir))
    if sorted(d for d in os.listdir(old_dir) if os.path.isdir(os.path.join(old_dir, d))) != fams:
        bad.append(f"family directories differ: {fams}")
    for fam in fams:
        nd, od = os.path.join(new_dir, fam), os.path.join(old_dir, fam)
        # model.gguf is generate_family_gguf.py's (checked by its own --check).
        names = sorted(os.listdir(nd))
        if not os.path.isdir(od) or sorted(f for f in os.listdir(od) if f != "model.gguf") != names:
            bad.append(f"{fam}: files differ")
            continue
        for name in names:
            if not name.startswith("expected"):
                if not filecmp.cmp(os.path.join(nd, name), os.path.join(od, name), shallow=False):
                    bad.append(f"{fam}/{name}: bytes differ")
                continue
            a, b = load_file(os.path.join(nd, name)), load_file(os.path.join(od, name))
            if sorted(a) != sorted(b):
                bad.append(f"{fam}/{name}: tensor names differ")
                continue
            worst = 0.0
            for t in sorted(a):
                if a[t].dtype != b[t].dtype or a[t].shape != b[t].shape:
                    bad.append(f"{fam}/{name}:{t}: dtype/shape differ")
                elif a[t].dtype != np.float64:
                    if not np.array_equal(a[t], b[t]):
                        bad.append(f"{fam}/{name}:{t}: differs")
                else:
                    dev = float(np.max(np.abs(a[t] - b[t])) / max(np.max(np.abs(b[t])), 1e-300))
                    worst = max(worst, dev)
                    if not dev <= CHECK_REL:
                        bad.append(f"{fam}/{name}:{t}: max relative deviation {dev:.2e} > {CHECK_REL:.0e}")
            print(f"  {fam}/{name}: max relative deviation {worst:.2e}")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--out", help="write the fixtures here (e.g. fixtures/families)")
    g.add_argument("--check", help="regenerate into a temporary directory and compare with this one")
    ap.add_argument("--only", nargs="*", help="only these fixtures (with --out)")
    args = ap.parse_args()
    if args.out:
        generate(args.out, args.only)
        print(f"wrote {args.out}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(tmp)
        bad = compare(tmp, args.check)
    for b in bad:
        print("DIFF " + b)
    print("family fixtures: " + ("match" if not bad else f"{len(bad)} DIFFERENCES"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
