#!/usr/bin/env python3
"""Generate Hugging Face reference Q/K/V projections for all-MiniLM-L6-v2.

Produces ``fixtures/hf_minilm_qkv.json`` (relative to the repository root),
the reference data for the Rust test that checks our own embedding + per-head
Q/K/V computation against the real ``transformers`` BERT implementation.

What it computes
----------------
* Tokenizes the fixed ``TEXT`` below with ``BertTokenizerFast`` using
  ``add_special_tokens=False, truncation=False, padding=False`` (no [CLS]/[SEP]).
* Runs ``BertModel`` (eval mode, float32, eager attention) with
  ``output_hidden_states=True``, ``token_type_ids = 0`` and the default
  position ids ``0..n-1``. For layer L in {0, 1} the layer input is
  ``hidden_states[L]`` and Q/K/V are obtained by applying that layer's
  ``attention.self.{query,key,value}`` Linear modules (x @ W^T + b), reshaped
  to ``[heads=12, n, head_dim=32]``. Embedding variant ``"word_pos_type"``.
* A second embedding variant ``"word_pos"`` (no token-type embedding):
  ``X = LayerNorm(word_embeddings(ids) + position_embeddings(0..n-1))`` using the
  model's own ``embeddings.LayerNorm``; only its layer-0 Q/K/V are recorded.
* Only heads ``HEADS = [0, 5, 11]`` are stored (all tokens, all 32 dims), as
  nested lists ``[3][n][32]``.

Floats are written as the shortest decimal string that round-trips to the
exact float32 value (numpy's ``str(np.float32(x))``), i.e. full float32
precision: parsing a value as f32 recovers the bit-exact tensor element. This
keeps the fixture under ~200 KB. The sha256 of the ``model.safetensors`` (and
``tokenizer.json``) that was read is recorded, so a fixture/model mismatch is
detectable.

How to rerun
------------
From the repository root, with a Python virtualenv *outside* the repo::

    python3 -m venv /work/venv-ref
    /work/venv-ref/bin/pip install torch==2.15.0        # CPU use is fine; default wheel pulls CUDA libs
    /work/venv-ref/bin/pip install transformers==5.23.0 safetensors==0.8.0 numpy==2.4.6
    /work/venv-ref/bin/python tests/reference/generate_minilm_qkv.py \
        [MODEL_DIR (default ../shared/data/all-MiniLM-L6-v2)] [--out fixtures/hf_minilm_qkv.json]

Relative paths are resolved against the repository root, not the cwd.

Pinned versions used to produce the committed fixture (Python 3.11.7):
    torch==2.15.0 transformers==5.23.0 tokenizers==0.23.3
    safetensors==0.8.0 numpy==2.4.6
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import BertModel, BertTokenizerFast

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL_DIR = "../shared/data/all-MiniLM-L6-v2"
DEFAULT_OUT = "fixtures/hf_minilm_qkv.json"

TEXT = (
    "The quick brown fox jumps over the lazy dog , said Robert Boulter "
    "@-@ an English actor ."
)
HEADS = [0, 5, 11]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def f32_list(t: torch.Tensor):
    """Nested lists of Python floats whose repr is the shortest f32 round-trip string."""
    a = t.detach().cpu().numpy().astype(np.float32)
    flat = [float(str(x)) for x in a.reshape(-1)]
    # Sanity: every value round-trips bit-exactly to the float32 we computed.
    assert np.array_equal(np.asarray(flat, dtype=np.float32), a.reshape(-1))
    return np.asarray(flat, dtype=object).reshape(a.shape).tolist()


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[n, hidden] -> [heads, n, head_dim]."""
    n, hidden = x.shape
    return x.view(n, num_heads, hidden // num_heads).permute(1, 0, 2).contiguous()


def qkv(layer, hidden: torch.Tensor, num_heads: int):
    attn = layer.attention.self
    out = {}
    for name, lin in (("q", attn.query), ("k", attn.key), ("v", attn.value)):
        y = lin(hidden)  # hidden @ W^T + b
        # Cross-check the Linear module against an explicit matmul.
        manual = hidden @ lin.weight.T + lin.bias
        assert torch.allclose(y, manual, atol=1e-5, rtol=1e-5), name
        out[name] = split_heads(y, num_heads)[HEADS]
    return out


def resolve(p: str) -> Path:
    path = Path(p)
    return path if path.is_absolute() else (REPO_ROOT / path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", nargs="?", default=DEFAULT_MODEL_DIR)
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()

    model_dir = resolve(args.model_dir)
    out_path = resolve(args.out)

    torch.manual_seed(0)
    tok = BertTokenizerFast.from_pretrained(str(model_dir))
    model = BertModel.from_pretrained(
        str(model_dir), dtype=torch.float32, attn_implementation="eager"
    )
    model = model.float().eval()
    cfg = model.config
    num_heads = cfg.num_attention_heads
    head_dim = cfg.hidden_size // num_heads

    enc = tok(TEXT, add_special_tokens=False, truncation=False, padding=False)
    token_ids = list(enc["input_ids"])
    n = len(token_ids)

    ids = torch.tensor([token_ids], dtype=torch.long)
    type_ids = torch.zeros_like(ids)
    pos_ids = torch.arange(n, dtype=torch.long).unsqueeze(0)

    cases = []
    with torch.no_grad():
        outputs = model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            token_type_ids=type_ids,
            output_hidden_states=True,
        )
        hs = outputs.hidden_states

        emb = model.embeddings
        word = emb.word_embeddings(ids)
        pos = emb.position_embeddings(pos_ids)
        typ = emb.token_type_embeddings(type_ids)

        # Sanity: HF's hidden_states[0] == LayerNorm(word + pos + type[0]).
        x_wpt = emb.LayerNorm(word + pos + typ)
        assert torch.allclose(hs[0], x_wpt, atol=1e-5), "embedding mismatch"

        for layer_idx in (0, 1):
            h = hs[layer_idx][0]
            r = qkv(model.encoder.layer[layer_idx], h, num_heads)
            cases.append(
                {
                    "embedding": "word_pos_type",
                    "layer": layer_idx,
                    "q": f32_list(r["q"]),
                    "k": f32_list(r["k"]),
                    "v": f32_list(r["v"]),
                }
            )

        x_wp = emb.LayerNorm(word + pos)[0]
        r = qkv(model.encoder.layer[0], x_wp, num_heads)
        cases.append(
            {
                "embedding": "word_pos",
                "layer": 0,
                "q": f32_list(r["q"]),
                "k": f32_list(r["k"]),
                "v": f32_list(r["v"]),
            }
        )

    result = {
        "model_dir_name": model_dir.name,
        "model_safetensors_sha256": sha256_file(model_dir / "model.safetensors"),
        "tokenizer_json_sha256": sha256_file(model_dir / "tokenizer.json"),
        "text": TEXT,
        "token_ids": token_ids,
        "n": n,
        "num_heads": num_heads,
        "head_dim": head_dim,
        "heads": HEADS,
        "cases": cases,
        "generator": {
            "script": "tests/reference/generate_minilm_qkv.py",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "numpy": np.__version__,
        },
    }

    out_path.parent.mkdir(parents=True, exist_ok=True)
    with out_path.open("w") as f:
        json.dump(result, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out_path} ({out_path.stat().st_size} bytes), n={n}")


if __name__ == "__main__":
    main()
