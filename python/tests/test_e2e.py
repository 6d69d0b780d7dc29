"""e2e(): a user's attention in every layer of a decoder, scored at the output beside the built-in
methods (docs/reference.md §10), on the repository's tiny llama (no ../shared needed)."""

import numpy as np
import pytest

import approx_bench as ab
from test_sweep import recent_prompt, tiny_llama


def causal_window(q, k, v, d, rng, mask=None):
    """The built-in `window` written densely in float64: query i reads keys i − d < j ≤ i."""
    assert mask == "causal"
    n, p = q.shape
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    s = q @ k.T / np.sqrt(p)
    lag = np.arange(n)[:, None] - np.arange(n)[None, :]
    s[(lag < 0) | (lag >= d)] = -np.inf
    w = np.exp(s - s.max(axis=1, keepdims=True))
    return (w / w.sum(axis=1, keepdims=True)) @ v


def exact_attention(q, k, v, d, rng, mask=None):
    return causal_window(q, k, v, q.shape[0], rng, mask)


def options(tmp_path):
    llama = tiny_llama(tmp_path)
    llama.pop("layer")
    return dict(lengths=[64], windows=2, n_f=16, features=[8, 16], dtype="f64", **llama)


def test_exact_attention_as_a_callable_gives_kl_zero_and_window_gives_the_builtins_numbers(tmp_path):
    o = options(tmp_path)
    rows = ab.e2e(o.pop("model_dir"), [("exact", exact_attention), ("mywindow", causal_window)],
                  out=tmp_path / "run", methods=["window"], **o)
    by = {(r["method"], r["d"], r["window"]): r for r in rows}
    assert len(rows) == 3 * 2 * 2
    for w in (0, 1):
        for d in (8, 16):
            ex = by[("exact", d, w)]
            assert ex["kl_max"] < 1e-13 and abs(ex["dnll"]) < 1e-12 and ex["top1"] == 1.0
            assert ex["op_err_mean"] < 1e-12
            mine, builtin = by[("mywindow", d, w)], by[("window", d, w)]
            assert builtin["kl_mean"] > 1e-6  # the window does change the output
            for col in ("kl_mean", "kl_max", "nll_method", "op_err_mean", "op_1mcos_mean",
                        "one_layer_err_l0", "one_layer_err_l1"):
                assert mine[col] == pytest.approx(builtin[col], rel=1e-9, abs=1e-15), col
            assert mine["top1"] == builtin["top1"]


def test_a_decode_callable_matches_the_builtin_dec_window(tmp_path):
    o = options(tmp_path)
    rows = ab.e2e(o.pop("model_dir"), ("mine", recent_prompt, "decode"), out=tmp_path / "run",
                  methods=["dec_window"], **o)
    by = {(r["method"], r["d"], r["window"]): r for r in rows}
    for (m, d, w), r in by.items():
        if m == "mine":
            assert r["mode"] == "decode"
            assert r["kl_mean"] == pytest.approx(by[("dec_window", d, w)]["kl_mean"], rel=1e-9)


def test_a_callable_returning_a_wrong_shape_or_nan_is_a_value_error_naming_the_layer(tmp_path):
    o = options(tmp_path)
    model = o.pop("model_dir")
    out = tmp_path / "run"
    ab.e2e(model, [], out=out, methods=["window"], **o)
    before = (out / "e2e.csv").read_bytes()

    def short(q, k, v, d, rng, mask=None):
        return np.zeros((q.shape[0] - 1, q.shape[1]))

    def nan(q, k, v, d, rng, mask=None):
        return np.full(q.shape, np.nan)

    for f, want in ((short, "shape"), (nan, "non-finite")):
        with pytest.raises(ValueError, match=rf"layer 0, head 0: .*{want}"):
            ab.e2e(model, (f.__name__, f), out=out, methods=["window"], **o)
        # What was written before stays.
        assert (out / "e2e.csv").read_bytes().startswith(before)


def test_ctrl_c_stops_a_run_keeps_its_rows_and_the_same_call_completes_it(tmp_path):
    # Ctrl-C (issue 57): SIGINT to the main thread while the run is in Rust is seen at the next
    # poll, between layers; the run stops, its finished rows kept and its manifest `interrupted`,
    # and KeyboardInterrupt reaches the caller. The same call then completes it.
    import _thread
    import json

    o = options(tmp_path)
    model = o.pop("model_dir")
    calls = {"n": 0, "after": 0}

    def interrupting(q, k, v, d, rng, mask=None):
        calls["n"] += 1
        if calls["n"] == 40:
            _thread.interrupt_main()
        elif calls["n"] > 40:
            calls["after"] += 1
        return causal_window(q, k, v, d, rng, mask)

    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        ab.e2e(model, ("mine", interrupting), out=out, methods=["window"], **o)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    # Within a layer's calls (two layers of four query heads each), not the rest of the run.
    assert calls["after"] <= 8, calls
    kept = (out / "e2e.csv").read_text().splitlines()[1:]
    # The same function (it interrupts only at its 40th call) resumes the run.
    rows = ab.e2e(model, ("mine", interrupting), out=out, methods=["window"], **o)
    assert len(rows) == 2 * 2 * 2
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"
    done = (out / "e2e.csv").read_text().splitlines()[1:]
    assert all(r in done for r in kept)


def test_a_resume_with_another_function_under_the_same_name_is_refused(tmp_path):
    # Issue 57: the rows of two functions must not end up under one name.
    o = options(tmp_path)
    model = o.pop("model_dir")
    out = tmp_path / "run"
    o["windows"] = 1
    ab.e2e(model, ("mine", causal_window), out=out, **o)
    o["windows"] = 2
    with pytest.raises(ValueError, match="from another function"):
        ab.e2e(model, ("mine", exact_attention), out=out, **o)
    rows = ab.e2e(model, ("mine", causal_window), out=out, **o)  # the same function resumes
    assert len(rows) == 2 * 2
