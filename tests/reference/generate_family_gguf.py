#!/usr/bin/env python3
"""GGUF files of family fixtures (issue 45, docs/reference.md §7.7), written with gguf-py as llama.cpp's
converter (`convert_hf_to_gguf.py`) lays each family out, so that the tool's GGUF route of a §7.7 family can
be checked against its safetensors route on the same weights (tensors in F32: the two routes must agree to
the bit in f32):

* ``fixtures/families/phi3/model.gguf`` (``Phi3MiniModel``): the phi3 fixture (MHA, fused qkv and gate_up, a
  sliding window on every layer);
* ``fixtures/families/phi3-longrope/model.gguf``: the longrope fixture (GQA, partial rotary 0.75, tied
  embeddings), with llama.cpp's global ``rope_factors_long.weight`` / ``rope_factors_short.weight`` and
  ``phi3.rope.scaling.attn_factor``;
* ``fixtures/families/gemma2/model.gguf`` (``Gemma2Model``) and ``gemma3/model.gguf`` (``Gemma3Model``);
* ``fixtures/families/gpt_oss/model.gguf`` (``GptOssModel``, experts unquantized; see ``write_gpt_oss``);
* ``fixtures/gpt_oss-mxfp4/``: gpt-oss as the hub ships it, experts in MXFP4, as a checkpoint (``config.json``,
  ``model.safetensors``; ``write_gpt_oss_mxfp4_checkpoint``) and as its GGUF (ggml type 39, the converter's
  ``repack_mxfp4``). It lies outside ``fixtures/families/``, whose every directory the fixture scripts read as
  a transformers fixture with float64 references (this one has none);
* ``fixtures/families/deepseek_v2/model.gguf`` and ``deepseek_v3/model.gguf`` (``DeepseekV2Model``, arch
  ``deepseek2``). Not deepseek_v3-noqlora: its mscale (1.0) differs from its mscale_all_dim (0.8), and GGUF
  carries only the latter (``rope.scaling.yarn_log_multiplier``); llama.cpp runs such a file as if they were
  equal.

Phi-3, by name (llama.cpp's tensor map for ``MODEL_ARCH.PHI3``): ``token_embd``, ``output_norm``,
``output`` (absent when tied), and per layer ``blk.N.attn_norm`` (input_layernorm), ``attn_qkv`` (qkv_proj,
rows [q; k; v]), ``attn_output``, ``ffn_norm`` (post_attention_layernorm), ``ffn_up`` (the fused
gate_up_proj, gate rows first), ``ffn_down``. Metadata: context length,
``rope.scaling.original_context_length``, embedding and feed-forward lengths, block count, head counts, the
RMS epsilon, ``rope.dimension_count`` (⌊f_r·hidden⌋/H), ``rope.freq_base`` and ``attention.sliding_window``
(0 when the config has none: llama.cpp's mark of Phi-4). No q/k row permutation (NEOX RoPE).

Gemma (``MODEL_ARCH.GEMMA2`` / ``GEMMA3``): ``token_embd``, ``output_norm``, no ``output`` (tied; a
``lm_head`` is skipped), per layer ``attn_norm``, ``attn_{q,k,v,output}``, gemma3's ``attn_q_norm`` /
``attn_k_norm``, ``post_attention_norm``, ``ffn_norm`` (pre_feedforward_layernorm), ``post_ffw_norm``,
``ffn_{gate,up,down}``; **every norm stored as 1 + w**. Metadata: sizes, ``attention.key_length`` /
``value_length`` (head_dim), gemma2's ``attn_logit_softcapping``, ``final_logit_softcapping`` and
``attention.sliding_window``; gemma3's ``rope.freq_base`` (the global θ), ``attention.sliding_window``,
``rope.scaling.type`` / ``factor`` (linear, global layers only). Plus ``{arch}.attention.scale``, which the
converter does not write (see ``write_gemma``).

gpt-oss (``MODEL_ARCH.GPT_OSS``): ``token_embd``, ``output_norm``, ``output``, per layer ``attn_norm``,
``post_attention_norm``, ``attn_{q,k,v,output}`` with biases, ``attn_sinks``, ``ffn_gate_inp`` (the router,
with bias), ``ffn_{gate,up,down}_exps`` with biases (gate and up split from the interleaved gate_up).
Metadata: sizes, expert counts, ``rope.scaling.*`` (yarn: factor, N₀, β), ``rope.freq_base``,
``attention.sliding_window``, ``expert_feed_forward_length``.

DeepSeek (``MODEL_ARCH.DEEPSEEK2``): ``token_embd``, ``output_norm``, ``output``, per layer ``attn_norm``,
``attn_q`` or ``attn_q_a`` / ``attn_q_a_norm`` / ``attn_q_b``, ``attn_kv_a_mqa``, ``attn_kv_a_norm``,
``attn_k_b`` / ``attn_v_b`` (kv_b split per head), ``attn_output``, ``ffn_norm``; dense blocks ``ffn_{gate,up,
down}``, MoE blocks ``ffn_gate_inp``, ``exp_probs_b`` (V3), ``ffn_{gate,up,down}_exps`` and ``_shexp``.

Usage (from the repository root):
    python tests/reference/generate_family_gguf.py            # (re)write the files
    python tests/reference/generate_family_gguf.py --check    # CI: regenerate into a temp dir, compare bytes
"""

import filecmp
import json
import math
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
FIXTURES = os.path.join(ROOT, "fixtures", "families")
MXFP4_DIR = os.path.join(ROOT, "fixtures", "gpt_oss-mxfp4")

LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.qkv_proj": "attn_qkv",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf):
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf.split(".", 3)
    stem, suffix = rest.rsplit(".", 1)
    return f"blk.{layer}.{LAYER_NAMES[stem]}.{suffix}"


def write_phi3(fixture_dir, out_path):
    import gguf
    from safetensors.numpy import load_file

    cfg = json.load(open(os.path.join(fixture_dir, "config.json")))
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    rot = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    rope_dims = int(rot * hidden) // heads
    n0 = rope.get("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
    w = gguf.GGUFWriter(out_path, "phi3")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_rope_scaling_orig_ctx_len(n0)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_head_count(heads)
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(rope_dims)
    w.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_sliding_window(cfg.get("sliding_window") or 0)
    long_f, short_f = rope.get("long_factor"), rope.get("short_factor")
    if long_f:
        # The converter's attention factor for longrope: √(1 + ln s / ln N₀), s = max positions / N₀.
        scale = cfg["max_position_embeddings"] / n0
        attn = math.sqrt(1 + math.log(scale) / math.log(n0)) if scale > 1.0 else 1.0
        w.add_rope_scaling_attn_factors(attn)
        assert len(long_f) == len(short_f) == rope_dims // 2
        w.add_tensor("rope_factors_long.weight", np.array(long_f, dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(short_f, dtype=np.float32))
    tensors = load_file(os.path.join(fixture_dir, "model.safetensors"))
    for name in sorted(tensors):
        # A tied checkpoint has no lm_head; transformers writes none either.
        w.add_tensor(gguf_name(name), np.ascontiguousarray(tensors[name].astype(np.float32)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


GEMMA_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gemma_name(hf):
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    _, _, layer, rest = hf.split(".", 3)
    stem, suffix = rest.rsplit(".", 1)
    return f"blk.{layer}.{GEMMA_NAMES[stem]}.{suffix}"


def write_gemma(fixture_dir, out_path):
    """``Gemma2Model`` / ``Gemma3Model`` of the converter: every ``*norm.weight`` stored as 1 + w (in the
    tensor's own dtype, f32 here), no ``output`` (tied; a ``lm_head`` is skipped), no q/k permutation."""
    import gguf
    from safetensors.numpy import load_file

    cfg = json.load(open(os.path.join(fixture_dir, "config.json")))
    arch = {"gemma2": "gemma2", "gemma3_text": "gemma3"}[cfg["model_type"]]
    w = gguf.GGUFWriter(out_path, arch)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    if arch == "gemma2":
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        w.add_sliding_window(cfg["sliding_window"])
    else:
        rope = cfg["rope_parameters"]
        w.add_rope_freq_base(rope["full_attention"]["rope_theta"])  # the global layers' θ
        if cfg.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        w.add_sliding_window(cfg["sliding_window"])
        full = rope["full_attention"]
        if full.get("rope_type") == "linear":  # applied to global layers only
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(full["factor"])
    # Not the converter's: GGUF has no query_pre_attn_scalar and llama.cpp derives τ from the model's
    # size (1/√head_dim, or 1/√(hidden/H) for 27B), which a 4- or 6-layer fixture is none of; its τ goes in
    # gguf-py's `{arch}.attention.scale`, which the tool reads before the size rule.
    w.add_attention_scale(cfg["query_pre_attn_scalar"] ** -0.5)
    tensors = load_file(os.path.join(fixture_dir, "model.safetensors"))
    for name in sorted(tensors):
        if name == "lm_head.weight":
            continue
        t = tensors[name].astype(np.float32)
        if name.endswith("norm.weight"):
            t = t + np.float32(1)
        w.add_tensor(gemma_name(name), np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


GPT_OSS_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.router": "ffn_gate_inp",
}


def gpt_oss_tensors(name, t):
    """The converter's tensors for one checkpoint tensor (``GptOssModel.modify_tensors``, unquantized experts:
    gate_up [E, hidden, 2I] transposed to [E, 2I, hidden] and split into its even (gate) and odd (up) rows,
    the bias likewise along its last axis; down [E, I, hidden] transposed; the sinks as ``attn_sinks.weight``)."""
    if name == "model.embed_tokens.weight":
        return [("token_embd.weight", t)]
    if name == "model.norm.weight":
        return [("output_norm.weight", t)]
    if name == "lm_head.weight":
        return [("output.weight", t)]
    _, _, layer, rest = name.split(".", 3)
    blk = f"blk.{layer}"
    if rest == "self_attn.sinks":
        return [(f"{blk}.attn_sinks.weight", t)]
    if rest == "mlp.experts.gate_up_proj":
        t = t.swapaxes(-1, -2)
        return [(f"{blk}.ffn_gate_exps.weight", t[:, ::2, :]), (f"{blk}.ffn_up_exps.weight", t[:, 1::2, :])]
    if rest == "mlp.experts.gate_up_proj_bias":
        return [(f"{blk}.ffn_gate_exps.bias", t[..., ::2]), (f"{blk}.ffn_up_exps.bias", t[..., 1::2])]
    if rest == "mlp.experts.down_proj":
        return [(f"{blk}.ffn_down_exps.weight", t.swapaxes(-1, -2))]
    if rest == "mlp.experts.down_proj_bias":
        return [(f"{blk}.ffn_down_exps.bias", t)]
    stem, suffix = rest.rsplit(".", 1)
    return [(f"{blk}.{GPT_OSS_NAMES[stem]}.{suffix}", t)]


def ggml_mxfp4(blocks, scales):
    """The converter's ``repack_mxfp4``: a checkpoint's MXFP4 ``blocks`` [..., groups, 16] (value 2k in the low
    nibble of byte k, 2k+1 in the high one) and ``scales`` [..., groups] as ggml's ``block_mxfp4`` rows
    [..., groups·17]: the scale byte, then 16 bytes whose byte j holds value j (low) and value j + 16 (high)."""
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(blocks.shape[:-1] + (32,))
    packed = codes[..., :16] | (codes[..., 16:] << 4)
    rows = np.concatenate([scales[..., None], packed], axis=-1).astype(np.uint8)
    return np.ascontiguousarray(rows.reshape(rows.shape[:-2] + (-1,)))


def mxfp4_values(blocks, scales):
    """A checkpoint's MXFP4 values in float64 (OCP: E2M1 codes times 2^(scale − 127)), [..., groups·32]."""
    e2m1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(blocks.shape[:-1] + (32,))
    v = e2m1[codes] * np.ldexp(1.0, scales.astype(np.int64) - 127)[..., None]
    return v.reshape(v.shape[:-2] + (-1,))


def gpt_oss_mxfp4_tensors(name, blocks, scales):
    """The converter's MXFP4 experts (``GptOssModel.generate_extra_tensors``): gate_up's rows split even (gate)
    and odd (up), down as stored; each repacked by ``ggml_mxfp4``. gguf-py's own MXFP4 dequantizer must read
    back the checkpoint's values (checked here, so the fixture is right by llama.cpp's reading)."""
    import gguf

    _, _, layer, rest = name.split(".", 3)
    blk = f"blk.{layer}"
    if rest == "mlp.experts.down_proj_blocks":
        parts = [(f"{blk}.ffn_down_exps.weight", blocks, scales)]
    else:
        assert rest == "mlp.experts.gate_up_proj_blocks", name
        parts = [
            (f"{blk}.ffn_gate_exps.weight", blocks[:, ::2], scales[:, ::2]),
            (f"{blk}.ffn_up_exps.weight", blocks[:, 1::2], scales[:, 1::2]),
        ]
    out = []
    for g, b, sc in parts:
        raw = ggml_mxfp4(b, sc)
        back = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.MXFP4)
        assert np.array_equal(back, mxfp4_values(b, sc)), g
        out.append((g, raw))
    return out


def write_gpt_oss_mxfp4_checkpoint(out_dir):
    """gpt-oss with its experts in MXFP4, as the hub's checkpoints hold them: ``{x}_blocks`` [E, rows, cols/32,
    16] uint8 and ``{x}_scales`` [E, rows, cols/32] E8M0, rows the output features (gate_up's interleaved gate
    and up), and ``quantization_config`` ``mxfp4``. The gpt_oss fixture's other tensors, with intermediate_size
    32 (MXFP4 blocks down_proj's 32 inputs); codes uniform and scales 2^−6..2^−3, biases N(0, 0.3²), from
    numpy's seeded PCG64. No transformers reference: the tool's GGUF route is checked against this checkpoint
    (bit for bit), and the checkpoint's decoder against transformers' layout (``quantized_weights`` tests)."""
    from safetensors.numpy import load_file, save_file

    src = os.path.join(FIXTURES, "gpt_oss")
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["intermediate_size"] = 32
    cfg["quantization_config"] = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    for name in ["tokenizer.json", "corpus.txt"]:
        with open(os.path.join(src, name), "rb") as a, open(os.path.join(out_dir, name), "wb") as b:
            b.write(a.read())
    rng = np.random.Generator(np.random.PCG64(20261207))
    e, hidden, inter = cfg["num_local_experts"], cfg["hidden_size"], cfg["intermediate_size"]
    tensors = {}
    for name, t in sorted(load_file(os.path.join(src, "model.safetensors")).items()):
        if ".mlp.experts." not in name:
            tensors[name] = t
            continue
        if not name.endswith("gate_up_proj"):
            continue
        x = name.rsplit(".", 1)[0]
        for proj, rows, cols in [("gate_up_proj", 2 * inter, hidden), ("down_proj", hidden, inter)]:
            tensors[f"{x}.{proj}_blocks"] = rng.integers(0, 256, (e, rows, cols // 32, 16), dtype=np.uint8)
            tensors[f"{x}.{proj}_scales"] = rng.integers(121, 125, (e, rows, cols // 32), dtype=np.uint8)
            tensors[f"{x}.{proj}_bias"] = (rng.standard_normal((e, rows)) * 0.3).astype(np.float32)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"))


def write_gpt_oss(fixture_dir, out_path):
    """``GptOssModel`` of the converter: experts not in MXFP4 take its "not in MXFP4" path, MXFP4 experts are
    repacked as ggml MXFP4 (``gpt_oss_mxfp4_tensors``); the base
    ``TextModel`` metadata (sizes, head counts, key/value length, expert counts, yarn rope), then
    ``attention.sliding_window`` and ``expert_feed_forward_length``."""
    import gguf
    from safetensors.numpy import load_file

    cfg = json.load(open(os.path.join(fixture_dir, "config.json")))
    rope = cfg["rope_parameters"]
    w = gguf.GGUFWriter(out_path, "gpt-oss")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
    w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(cfg["num_local_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_sliding_window(cfg["sliding_window"])
    w.add_expert_feed_forward_length(cfg["intermediate_size"])
    tensors = load_file(os.path.join(fixture_dir, "model.safetensors"))
    for name in sorted(tensors):
        if name.endswith("_scales"):
            continue
        if name.endswith("_blocks"):
            scales = tensors[name.removesuffix("_blocks") + "_scales"]
            for g, raw in gpt_oss_mxfp4_tensors(name, tensors[name], scales):
                w.add_tensor(g, raw, raw_dtype=gguf.GGMLQuantizationType.MXFP4)
            continue
        for g, t in gpt_oss_tensors(name, tensors[name].astype(np.float32)):
            w.add_tensor(g, np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


DEEPSEEK_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.q_a_proj": "attn_q_a",
    "self_attn.q_a_layernorm": "attn_q_a_norm",
    "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
    "self_attn.kv_a_layernorm": "attn_kv_a_norm",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
    "mlp.shared_experts.up_proj": "ffn_up_shexp",
    "mlp.shared_experts.down_proj": "ffn_down_shexp",
}


def deepseek_tensors(cfg, tensors):
    """The converter's tensors (``DeepseekV2Model.modify_tensors``): each layer's routed experts stacked into
    ``ffn_{gate,up,down}_exps`` [E, out, in]; ``kv_b_proj`` [H·(d_nope + d_v), r] split per head into
    ``attn_k_b`` (its k rows, transposed: [H, r, d_nope]) and ``attn_v_b`` [H, d_v, r]; V3's
    ``e_score_correction_bias`` as ``exp_probs_b.bias``."""
    heads, d_nope, d_v = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    out = []
    for name in sorted(tensors):
        t = tensors[name]
        if name == "model.embed_tokens.weight":
            out.append(("token_embd.weight", t))
            continue
        if name == "model.norm.weight":
            out.append(("output_norm.weight", t))
            continue
        if name == "lm_head.weight":
            out.append(("output.weight", t))
            continue
        _, _, layer, rest = name.split(".", 3)
        blk = f"blk.{layer}"
        if rest.startswith("mlp.experts."):
            _, _, e, w, _ = rest.split(".")
            if e != "0":
                continue
            stacked = np.stack([tensors[f"model.layers.{layer}.mlp.experts.{x}.{w}.weight"]
                                for x in range(cfg["n_routed_experts"])])
            out.append((f"{blk}.ffn_{w.removesuffix('_proj')}_exps.weight", stacked))
            continue
        if rest == "self_attn.kv_b_proj.weight":
            kv_b = t.reshape(heads, d_nope + d_v, t.shape[-1])
            out.append((f"{blk}.attn_k_b.weight", kv_b[:, :d_nope, :].swapaxes(1, 2)))
            out.append((f"{blk}.attn_v_b.weight", kv_b[:, d_nope:, :]))
            continue
        if rest == "mlp.gate.e_score_correction_bias":
            out.append((f"{blk}.exp_probs_b.bias", t))
            continue
        stem, suffix = rest.rsplit(".", 1)
        out.append((f"{blk}.{DEEPSEEK_NAMES[stem]}.{suffix}", t))
    return out


def write_deepseek(fixture_dir, out_path):
    """``DeepseekV2Model`` of the converter (DeepSeek V2 and V3 alike, ``deepseek2``): the base metadata with
    ``head_count_kv`` 1 (MLA as MQA) and the yarn rope, then the leading dense blocks, the ranks,
    ``key_length``/``value_length`` (the latent r + d_R and r) and their ``_mla`` forms (d_nope + d_R, d_v),
    the experts, ``rope.dimension_count`` d_R and ``rope.scaling.yarn_log_multiplier`` 0.1·mscale_all_dim. The
    V3 fixture's sigmoid router is ``expert_gating_func`` 2 (what the hub config's ``scoring_func`` sigmoid
    gives), and ``expert_group_count``/``expert_group_used_count`` carry n_group/topk_group."""
    import gguf
    from safetensors.numpy import load_file

    cfg = json.load(open(os.path.join(fixture_dir, "config.json")))
    rope = cfg["rope_parameters"]
    v3 = cfg["model_type"] == "deepseek_v3"
    r = cfg["kv_lora_rank"]
    w = gguf.GGUFWriter(out_path, "deepseek2")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(1)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
    w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_group_count(cfg["n_group"])
    w.add_expert_group_used_count(cfg["topk_group"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_vocab_size(cfg["vocab_size"])
    if cfg.get("q_lora_rank") is not None:
        w.add_q_lora_rank(cfg["q_lora_rank"])
    w.add_kv_lora_rank(r)
    w.add_key_length(r + cfg["qk_rope_head_dim"])
    w.add_value_length(r)
    w.add_key_length_mla(cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"])
    w.add_value_length_mla(cfg["v_head_dim"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_count(cfg["n_routed_experts"])
    w.add_expert_shared_count(cfg["n_shared_experts"])
    w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    if cfg.get("norm_topk_prob"):
        w.add_expert_weights_norm(True)
    if v3:
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_rope_dimension_count(cfg["qk_rope_head_dim"])
    w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
    tensors = {k: v.astype(np.float32) for k, v in load_file(os.path.join(fixture_dir, "model.safetensors")).items()}
    for g, t in deepseek_tensors(cfg, tensors):
        w.add_tensor(g, np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


WRITERS = {
    "phi3": write_phi3,
    "phi3-longrope": write_phi3,
    "gemma2": write_gemma,
    "gemma3": write_gemma,
    "gpt_oss": write_gpt_oss,
    "deepseek_v2": write_deepseek,
    "deepseek_v3": write_deepseek,
}


def main():
    check = "--check" in sys.argv
    with tempfile.TemporaryDirectory() as tmp:
        bad = []
        out_dir = os.path.join(tmp, "gpt_oss-mxfp4") if check else MXFP4_DIR
        write_gpt_oss_mxfp4_checkpoint(out_dir)
        for f in sorted(os.listdir(out_dir)):
            if check and not filecmp.cmp(os.path.join(out_dir, f), os.path.join(MXFP4_DIR, f), shallow=False):
                bad.append(f"gpt_oss-mxfp4/{f}")
        print(f"gpt_oss-mxfp4: {'checked' if check else 'wrote'} the checkpoint in {os.path.relpath(MXFP4_DIR, ROOT)}")
        ggufs = [(name, os.path.join(FIXTURES, name), write) for name, write in WRITERS.items()]
        for name, fixture_dir, write in ggufs + [("gpt_oss-mxfp4", MXFP4_DIR, write_gpt_oss)]:
            target = os.path.join(fixture_dir, "model.gguf")
            out = os.path.join(tmp, f"{name}.gguf") if check else target
            write(fixture_dir, out)
            if check and not filecmp.cmp(out, target, shallow=False):
                bad.append(name)
            print(f"{name}: {'checked' if check else 'wrote'} {os.path.relpath(target, ROOT)}")
        if bad:
            sys.exit(f"GGUF fixtures differ from a regeneration: {', '.join(bad)}")


if __name__ == "__main__":
    main()
