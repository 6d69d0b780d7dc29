"""A §7.7 family's layer through the Python face (docs/reference.md §7.7): ``exact`` and
``approximate`` under a scale, soft-cap, window and sink against numpy in float64, and a user's
function told the layer's spec in a sweep of fixtures/families' gpt-oss."""

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest

import approx_bench as ab

ROOT = Path(__file__).resolve().parents[2]


def family_attention(q, k, v, scale, softcap=None, window=None, sink=None):
    """§7.7.0 in float64: s = c·tanh(τ q·k / c), keys i − W < j ≤ i, the sink a zero-valued key."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    s = scale * q @ k.T
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    n = len(q)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    seen = j <= i
    if window is not None:
        seen &= j > i - window
    s = np.where(seen, s, -np.inf)
    m = s.max(axis=1, keepdims=True)
    if sink is not None:
        m = np.maximum(m, sink)
    e = np.exp(s - m)
    z = e.sum(axis=1, keepdims=True) + (np.exp(sink - m) if sink is not None else 0.0)
    return e @ v / z


def head(n=64, p=16, pv=16, seed=0):
    r = np.random.default_rng(seed)
    return r.standard_normal((n, p)), r.standard_normal((n, p)), r.standard_normal((n, pv))


LAYER = dict(scale=0.2, softcap=3.0, window=12, sink=0.7)


def test_exact_under_a_layers_spec_is_the_family_target():
    q, k, v = head()
    o = ab.exact(q, k, v, mask="causal", **LAYER)
    assert np.abs(o - family_attention(q, k, v, **LAYER)).max() < 1e-12
    # MLA's heads: V with its own head size, τ alone.
    q, k, v = head(pv=8)
    o = ab.exact(q, k, v, mask="causal", scale=0.3)
    assert o.shape == (64, 8)
    assert np.abs(o - family_attention(q, k, v, 0.3)).max() < 1e-12


def test_approximate_under_a_layers_spec_runs_its_rules_or_refuses_by_name():
    q, k, v = head()
    want = family_attention(q, k, v, **LAYER)
    # §7.7.6: window and topk keep the window's keys, the sink in every denominator: exact at d = W.
    for method in ("window", "topk"):
        o = ab.approximate(method, q, k, v, LAYER["window"], 0, mask="causal", **LAYER)
        assert np.abs(o - want).max() < 1e-12, method
    small = ab.approximate("window", q, k, v, 4, 0, mask="causal", **LAYER)
    assert np.abs(small - want).max() > 1e-3
    with pytest.raises(ValueError, match="performer_favor does not yet implement a logit soft-cap"):
        ab.approximate("performer_favor", q, k, v, 8, 0, mask="causal", **LAYER)
    # A method reading the scale through Q and K (svd_optimal at full rank is exact).
    o = ab.approximate("svd_optimal", q, k, v, 64, 0, mask="causal", scale=0.2)
    assert np.abs(o - family_attention(q, k, v, 0.2)).max() < 1e-9


def test_a_spec_no_attention_has_is_a_value_error_naming_it():
    q, k, v = head()
    for kw, needle in [
        (dict(window=4), "a sliding window needs the causal mask"),
        (dict(mask="causal", window=0), "a sliding window of 0"),
        (dict(mask="causal", softcap=-1.0), "soft-cap is -1"),
        (dict(mask="causal", scale=0.0), "scale is 0"),
    ]:
        with pytest.raises(ValueError, match=needle):
            ab.exact(q, k, v, **kw)
    with pytest.raises(ValueError, match="kernelized target has no form"):
        ab.exact(q, k, v, target="kernelized", scale=0.3)


def gpt_oss(tmp_path):
    src = ROOT / "fixtures" / "families" / "gpt_oss"
    d = tmp_path / "gpt_oss"
    d.mkdir()
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        shutil.copy(src / f, d / f)
    return dict(model="pretrained", model_dir=d, corpus=src / "corpus.txt")


def spec_attention(q, k, v, d, rng, mask=None, spec=None):
    """The layer's exact attention from the spec the sweep passes."""
    assert mask == "causal" and spec["causal"]
    return family_attention(q, k, v, spec["scale"], spec["softcap"], spec["window"], spec["sink"])


def plain_causal(q, k, v, d, rng, mask=None):
    return family_attention(q, k, v, 1 / np.sqrt(q.shape[1]))


@pytest.mark.parametrize("layer", [0, 1])
def test_a_users_function_told_the_spec_reproduces_a_sink_layer(tmp_path, layer):
    out = ab.sweep([("mine", spec_attention), "window"], out=tmp_path / "run", lengths=[32],
                   windows=1, features=[8, 16], layer=layer, quiet=True, **gpt_oss(tmp_path))
    rows = list(csv.DictReader(open(Path(out) / "trials.csv")))
    mine = [r for r in rows if r["method"] == "mine"]
    assert mine and all(float(r["rel_error"]) < 1e-5 for r in mine), mine
    assert all(r["sinks"] == "true" for r in rows)


def test_a_function_without_spec_is_refused_on_a_sink_layer_naming_the_feature(tmp_path):
    with pytest.raises(ValueError, match="attention sinks.*plain_causal"):
        ab.sweep([("plain_causal", plain_causal)], out=tmp_path / "run", lengths=[32], windows=1,
                 features=[8], layer=1, quiet=True, **gpt_oss(tmp_path))


def gpt_oss_ids(tmp_path):
    """The fixture's 40 expected ids (its corpus.txt tokenizes to them), as an ids file."""
    words = (ROOT / "fixtures" / "families" / "gpt_oss" / "corpus.txt").read_text().split()
    f = tmp_path / "ids.txt"
    f.write_text(" ".join(w[1:] for w in words) + "\n")
    return f


def test_e2e_a_users_function_told_the_spec_is_the_exact_model_in_every_layer(tmp_path):
    # gpt-oss: sinks in every layer, a window of 16 on layers 0 and 2 (n = 40).
    fixture = gpt_oss(tmp_path)
    rows = ab.e2e(fixture.pop("model_dir"), [("mine", spec_attention)], out=tmp_path / "run",
                  methods=["window"], features=[8], lengths=[40], windows=1, n_f=8,
                  ids=gpt_oss_ids(tmp_path), dtype="f64", **fixture)
    by = {r["method"]: r for r in rows}
    assert by["mine"]["kl_max"] < 1e-13 and by["mine"]["op_err_mean"] < 1e-12
    assert by["window"]["op_err_mean"] > 1e-3


def test_e2e_a_function_without_spec_is_refused_on_the_families_layers(tmp_path):
    fixture = gpt_oss(tmp_path)
    with pytest.raises(ValueError, match="plain_causal: layer 0 has a sliding window"):
        ab.e2e(fixture.pop("model_dir"), [("plain_causal", plain_causal)], out=tmp_path / "run",
               features=[8], lengths=[40], windows=1, n_f=8, ids=gpt_oss_ids(tmp_path), **fixture)
