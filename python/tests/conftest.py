"""A tiny initialized BERT (config.json and vocab.txt only) over the repository's own
fixtures/tiny-corpus.txt: what the sweep tests run on, no download and no ../shared needed."""

import json
import re
from pathlib import Path

import pytest

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "tiny-corpus.txt"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    words = set()
    for w in CORPUS.read_text().lower().split():
        words.update(p for p in re.findall(r"[a-z0-9]+|[^a-z0-9\s]", w))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(words)
    d = tmp_path_factory.mktemp("tiny-bert")
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (d / "config.json").write_text(json.dumps({
        "architectures": ["BertModel"], "model_type": "bert",
        "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 1,
        "intermediate_size": 64, "max_position_embeddings": 64, "vocab_size": len(vocab),
        "type_vocab_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
        "initializer_range": 0.02, "pad_token_id": 0,
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
    }))
    return d


@pytest.fixture
def tiny(tiny_model):
    """The input options of the tiny setup."""
    return dict(model="initialized", model_dir=tiny_model, corpus=CORPUS)
