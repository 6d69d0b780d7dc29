"""sweep() with built-in ids and Python functions: the same files as the CLI, each trial
reproducible from its row, and user errors named."""

import csv
import subprocess
from pathlib import Path
import json

import numpy as np
import pytest

import approx_bench as ab


def masked_attention(q, k, v, drop):
    """Softmax attention over the keys (i, j) with drop(lag = i − j) false, dense, in float64."""
    n, p = q.shape
    s = q.astype(np.float64) @ k.T.astype(np.float64) / np.sqrt(p)
    i = np.arange(n)
    s[drop(i[:, None] - i[None, :])] = -np.inf
    s -= s.max(axis=1, keepdims=True)
    e = np.exp(s)
    return (e / e.sum(axis=1, keepdims=True)) @ v.astype(np.float64)


def window_attention(q, k, v, d, rng):
    """Sliding-window softmax attention over keys |i - j| <= d."""
    return masked_attention(q, k, v, lambda lag: np.abs(lag) > d)


SEEN = {}


def noisy_mean(q, k, v, d, rng):
    """Mean of V plus noise from the trial's generator (records its first draw)."""
    x = rng.standard_normal()
    SEEN[(q.shape[0], d, float(q[0, 0]))] = x
    return np.broadcast_to(v.mean(0) + 1e-3 * x, v.shape)


def rows(out):
    with open(out / "trials.csv") as f:
        return list(csv.DictReader(f))


def with_inputs(got, tiny):
    """Each row with its (n, window, head, d, seed) and its head's Q, K, V (one window loaded once)."""
    cache = {}
    for r in got:
        n, w, h, d, seed = (int(r[c]) for c in ("n", "window", "head", "d", "seed"))
        if (n, w) not in cache:
            cache[(n, w)] = ab.inputs(n, window=w, **tiny)
        yield r, (n, w, h, d, seed), tuple(x[h] for x in cache[(n, w)])


GRID = dict(lengths=[16, 32], windows=2, features=[4, 8], quiet=True)


def test_inputs_are_the_pipelines_q_k_v(tiny):
    q, k, v = ab.inputs(16, window=1, **tiny)
    assert q.shape == k.shape == v.shape == (4, 16, 8) and q.dtype == np.float32
    q2, _, _ = ab.inputs(16, window=1, **tiny)
    assert np.array_equal(q, q2)
    q0, _, _ = ab.inputs(16, window=0, **tiny)
    assert not np.array_equal(q, q0)
    q64, _, _ = ab.inputs(16, window=1, dtype="f64", **tiny)
    assert q64.dtype == np.float64
    with pytest.raises(ValueError, match="unknown option no_such"):
        ab.inputs(16, no_such=1, **tiny)
    with pytest.raises(ValueError, match="dtype"):
        ab.inputs(16, dtype="f16", **tiny)


def test_a_qkv_cache_directory_serves_the_second_sweep_with_the_same_rows(tiny, tmp_path):
    cache = tmp_path / "qkv-cache"
    first = ab.sweep(["vmean"], out=tmp_path / "a", qkv_cache=cache, **GRID, **tiny)
    second = ab.sweep(["vmean"], out=tmp_path / "b", qkv_cache=cache, **GRID, **tiny)
    used = [json.loads((Path(o) / "manifest.json").read_text())["qkv_cache"] for o in (first, second)]
    # 2 lengths × 2 windows: computed the first time, read back the second.
    assert (used[0]["misses"], used[0]["hits"]) == (4, 0)
    assert (used[1]["misses"], used[1]["hits"]) == (0, 4)
    assert len(list(cache.glob("*.safetensors"))) == 4
    strip = lambda rs: [{k: v for k, v in r.items() if k != "seconds"} for r in rs]
    assert strip(rows(Path(first))) == strip(rows(Path(second)))
    q, _, _ = ab.inputs(16, window=1, qkv_cache=cache, **tiny)
    q_off, _, _ = ab.inputs(16, window=1, qkv_cache="off", **tiny)
    assert np.array_equal(q, q_off)


def test_every_row_is_reproduced_from_the_inputs_and_its_seed(tiny, tmp_path):
    out = tmp_path / "run"
    ab.sweep(["skeinformer", "vmean", window_attention, noisy_mean], out=out, **tiny, **GRID)
    got = rows(out)
    assert len(got) == 2 * 2 * 4 * 4 * 2  # n × windows × heads × methods × d
    assert {r["method"] for r in got} == {"skeinformer", "vmean", "window_attention", "noisy_mean"}
    for r, (n, w, h, d, seed), (q, k, v) in with_inputs(got, tiny):
        assert seed == ab.trial_seed(0, n, w, h, r["method"], d)
        o = ab.exact(q, k, v)
        if r["method"] == "window_attention":
            o_hat = window_attention(q, k, v, d, None)
        elif r["method"] == "noisy_mean":
            x = np.random.default_rng(seed).standard_normal()
            assert SEEN[(n, d, float(q[0, 0]))] == x  # the generator was seeded with the row's seed
            o_hat = np.broadcast_to(v.mean(0) + 1e-3 * x, v.shape)
        else:
            o_hat = ab.approximate(r["method"], q, k, v, d, seed)
        err, rel, fro = ab.spectral_error(o, o_hat)
        assert float(r["error"]) == pytest.approx(err, rel=1e-12, abs=1e-15), r
        assert float(r["frob_error"]) == pytest.approx(fro, rel=1e-12, abs=1e-15), r
    # A window covering every key is exact attention.
    full = [r for r in got if r["method"] == "window_attention" and int(r["d"]) >= int(r["n"]) - 1]
    assert all(float(r["rel_error"]) < 1e-6 for r in full)


def test_the_manifest_records_the_function_and_resume_refuses_an_edited_one(tiny, tmp_path):
    out = tmp_path / "run"
    ab.sweep(["vmean", window_attention], out=out, **tiny, **GRID)
    m = json.loads((out / "manifest.json").read_text())
    um = m["config"]["user_methods"]["window_attention"]
    assert um["kind"] == "python function"
    assert um["origin"].endswith("test_sweep.window_attention")
    assert len(um["sha256"]) == 64
    assert m["status"] == "complete"
    n_rows = len(rows(out))
    ab.sweep(["vmean", window_attention], out=out, **tiny, **GRID)  # resumes: nothing new
    assert len(rows(out)) == n_rows

    def window_attention_v2(q, k, v, d, rng):
        return window_attention(q, k, v, d + 1, rng)

    with pytest.raises(ValueError, match="another configuration"):
        ab.sweep(["vmean", ("window_attention", window_attention_v2)], out=out, **tiny, **GRID)


def test_a_bad_user_method_is_named_with_its_trial(tiny, tmp_path):
    def wrong_shape(q, k, v, d, rng):
        return v[:, :2]

    with pytest.raises(RuntimeError, match=r"wrong_shape.*n = 16.*d = 4[\s\S]*expected \[n, p\] = \[16, 8\]"):
        ab.sweep([wrong_shape], out=tmp_path / "a", **tiny, **GRID)

    def nan_out(q, k, v, d, rng):
        o = np.array(v, dtype=np.float64)
        o[3, 1] = np.nan
        return o

    with pytest.raises(RuntimeError, match="non-finite value .* row 3, column 1"):
        ab.sweep([nan_out], out=tmp_path / "b", **tiny, **GRID)

    def raises(q, k, v, d, rng):
        raise ZeroDivisionError("boom")

    with pytest.raises(RuntimeError, match="ZeroDivisionError: boom"):
        ab.sweep([raises], out=tmp_path / "c", **tiny, **GRID)

    with pytest.raises(ValueError, match="taken by a built-in"):
        ab.sweep([("vmean", window_attention)], out=tmp_path / "d", **tiny, **GRID)
    with pytest.raises(ValueError, match="lambda"):
        ab.sweep([lambda q, k, v, d, rng: v], out=tmp_path / "e", **tiny, **GRID)


BIN = Path(__file__).resolve().parents[2] / "target" / "release" / "approx-bench"


@pytest.mark.skipif(not BIN.exists(), reason="needs the CLI: cargo build --release")
def test_a_user_run_is_plotted_and_checked_by_the_cli_like_any_run(tiny, tmp_path):
    mine = tmp_path / "mine"
    builtin = tmp_path / "builtin"
    ab.sweep(["vmean", window_attention], out=mine, **tiny, **GRID)
    ab.sweep(["skeinformer"], out=builtin, **tiny, **GRID)
    figs = tmp_path / "figs"
    r = subprocess.run([BIN, "plot", "--from", builtin, "--from", mine, "--out", figs],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert [p.name for p in figs.glob("all-methods-initialized*.png")], list(figs.iterdir())
    r = subprocess.run([BIN, "check", "--baseline", mine, "--current", mine,
                        "--report", tmp_path / "check.md"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "window_attention" in (tmp_path / "check.md").read_text()
    r = subprocess.run([BIN, "check", "--baseline", mine, "--rerun"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "cannot run the baseline's own methods (window_attention)" in r.stderr


def rff_like(q, k, v, d, rng):
    """Random Fourier features of the Gaussian kernel with iid frequencies (a user's variant)."""
    p = q.shape[1]
    w = rng.standard_normal((d // 2, p))
    qt, kt = (x.astype(np.float64) * p**-0.25 for x in (q, k))
    fq = np.hstack([np.cos(qt @ w.T), np.sin(qt @ w.T)])
    fk = np.hstack([np.cos(kt @ w.T), np.sin(kt @ w.T)])
    return fq @ (fk.T @ v.astype(np.float64)) / (d // 2)


def kernel_product(q, k, v):
    """C·V from the definition C_ij = exp(−‖q̃_i − k̃_j‖²/2), q̃ = q·p^-1/4, in float64."""
    p = q.shape[1]
    qt, kt = (x.astype(np.float64) * p**-0.25 for x in (q, k))
    d2 = ((qt[:, None, :] - kt[None, :, :]) ** 2).sum(-1)
    return np.exp(-d2 / 2) @ v.astype(np.float64)


def test_a_kernelized_sweep_scores_every_method_against_c_v(tiny, tmp_path):
    out = tmp_path / "kern"
    ab.sweep(["kernelized", rff_like], out=out, target="kernelized", **tiny, **GRID)
    got = rows(out)
    assert {r["target"] for r in got} == {"kernelized"}
    assert {r["method"] for r in got} == {
        "exact_kernelized", "zero", "skyformer_gauss", "skyformer_gauss_iter",
        "performer_gauss", "rff_gauss", "rff_like",
    }
    for r, (n, w, h, d, seed), (q, k, v) in with_inputs(got, tiny):
        o = ab.exact(q, k, v, target="kernelized")
        assert np.abs(o - kernel_product(q, k, v)).max() <= 1e-12 * np.abs(o).max()
        if r["method"] == "zero":
            assert float(r["rel_error"]) == 1.0
        if r["method"] == "rff_like":
            o_hat = rff_like(q, k, v, d, np.random.default_rng(seed))
        elif r["method"] in ("skyformer_gauss", "rff_gauss"):
            o_hat = ab.approximate(r["method"], q, k, v, d, seed)
        else:
            continue
        err, _, fro = ab.spectral_error(o, o_hat)
        assert float(r["error"]) == pytest.approx(err, rel=1e-12), r
        assert float(r["frob_error"]) == pytest.approx(fro, rel=1e-12), r
    # A softmax method with the kernelized target is refused, naming the methods that fit.
    with pytest.raises(ValueError, match="vmean does not approximate the kernelized target"):
        ab.sweep(["vmean"], out=tmp_path / "bad", target="kernelized", **tiny, **GRID)


def causal_window(q, k, v, d, rng, mask=None):
    """The d most recent keys j ≤ i (docs/reference.md §7.4), dense, in float64: told the mask."""
    assert mask == "causal"
    return masked_attention(q, k, v, lambda lag: (lag < 0) | (lag >= d))


def test_a_causal_sweep_tells_a_users_function_the_mask_and_scores_it_like_the_builtin(tiny, tmp_path):
    out = tmp_path / "causal"
    ab.sweep(["window", causal_window], out=out, mask="causal", **tiny, **GRID)
    got = rows(out)
    assert {r["mask"] for r in got} == {"causal"}
    builtin = {(r["n"], r["window"], r["head"], r["d"]): float(r["error"]) for r in got if r["method"] == "window"}
    mine = {(r["n"], r["window"], r["head"], r["d"]): float(r["error"]) for r in got if r["method"] == "causal_window"}
    assert builtin.keys() == mine.keys() and builtin
    for key, e in builtin.items():
        assert mine[key] == pytest.approx(e, rel=1e-4, abs=1e-7), key

    def unaware(q, k, v, d, rng):
        return v

    with pytest.raises(RuntimeError, match="mask=None"):
        ab.sweep([unaware], out=tmp_path / "u", mask="causal", **tiny, **GRID)


def test_quantized_methods_run_once_per_head_with_the_new_columns(tiny, tmp_path):
    # The tiny BERT has p = 8: the formats that take any p (f16, FP8, SageAttention) run, beside a
    # sparse method and a user's function.
    out = tmp_path / "quant"
    ab.sweep(["kv_f16", "kv_fp8", "sage2_8b", "window", window_attention], out=out, **tiny, **GRID)
    got = rows(out)
    quant = [r for r in got if r["method"] in ("kv_f16", "kv_fp8", "sage2_8b")]
    assert len(quant) == 3 * 2 * 2 * 4  # methods × n × windows × heads, d = 0 only
    assert {r["d"] for r in quant} == {"0"}
    for r, (n, w, h, d, seed), (q, k, v) in with_inputs(got, tiny):
        o = ab.exact(q, k, v)
        if r["method"] == "window_attention":
            o_hat = window_attention(q, k, v, d, None)
        else:
            o_hat = ab.approximate(r["method"], q, k, v, d, seed)
        cos, l1, rmse = ab.agreement(o, o_hat)
        assert float(r["cos_sim"]) == pytest.approx(cos, rel=1e-12), r
        assert float(r["rel_l1"]) == pytest.approx(l1, rel=1e-12, abs=1e-15), r
        assert float(r["rmse"]) == pytest.approx(rmse, rel=1e-12, abs=1e-15), r
        bits = {"kv_f16": "16.0", "kv_fp8": "8.0", "sage2_8b": "8.0", "window": "16.0"}.get(r["method"], "")
        assert r["kv_bits"] == bits, r
        if r["method"] in ("kv_f16", "kv_fp8", "sage2_8b"):
            assert float(r["kv_read"]) == float(bits) / 16 and r["mass"] == "1.0"
        elif r["method"] == "window":
            assert float(r["kv_read"]) == pytest.approx(float(r["keys"]) / n, rel=1e-15)
        else:
            assert r["kv_read"] == ""  # a user's function reads no declared cache


ROOT = Path(__file__).resolve().parents[2]


def tiny_llama(tmp_path):
    """fixtures/decoders' tiny llama (4 query heads on 2 K/V heads, 3 layers) with a BOS tokenizer,
    and a corpus of its tokens."""
    import shutil

    src = ROOT / "fixtures" / "decoders"
    d = tmp_path / "llama"
    d.mkdir()
    for p in (src / "llama").iterdir():
        if p.name != "expected.safetensors":
            shutil.copy(p, d / p.name)
    shutil.copy(src / "tokenizers" / "with_bos" / "tokenizer.json", d / "tokenizer.json")
    corpus = tmp_path / "abc.txt"
    row = " ".join(["a", "b", "c", "b"][i % 4] for i in range(30))
    corpus.write_text((row + "\n") * 20)
    return dict(model="pretrained", model_dir=d, corpus=corpus, layer=1)


def recent_prompt(q, k, v, d, rng, mask=None, n_f=None):
    """dec_window written densely in float64 (docs/reference.md §9.2): continuation query t reads the last d
    prompt keys and the continuation up to t; returns the n_f continuation rows."""
    assert mask == "causal" and n_f is not None
    n = q.shape[0]
    n_p = n - n_f
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    out = []
    for t in range(n_p, n):
        keys = [j for j in range(t + 1) if j >= n_p or j >= n_p - d]
        s = q[t] @ k[keys].T / np.sqrt(q.shape[1])
        w = np.exp(s - s.max())
        out.append(w @ v[keys] / w.sum())
    return np.array(out)


def test_a_decode_sweep_tells_a_users_function_n_f_and_scores_the_continuation(tmp_path):
    llama = tiny_llama(tmp_path)
    out = tmp_path / "decode"
    ab.sweep(["dec_window", recent_prompt], out=out, lengths=[64], windows=2, decode=16,
             features=[8, 16], **llama)
    got = rows(out)
    assert {r["n_f"] for r in got} == {"16"}
    builtin = {(r["window"], r["head"], r["d"]): float(r["error"]) for r in got if r["method"] == "dec_window"}
    mine = {(r["window"], r["head"], r["d"]): float(r["error"]) for r in got if r["method"] == "recent_prompt"}
    assert builtin.keys() == mine.keys() and len(builtin) == 2 * 4 * 2
    for key, e in builtin.items():
        assert mine[key] == pytest.approx(e, rel=1e-4, abs=1e-7), key
    manifest = json.loads((out / "manifest.json").read_text())
    assert {k: manifest["decode"][k] for k in ("n_f", "layer", "layers")} == {"n_f": 16, "layer": 1, "layers": 3}
    # Whose keys d counts (issue 58): a user's function is called per query head.
    assert manifest["decode"]["budget_rules"] == {"dec_window": "per_layer", "recent_prompt": "per_query_head"}
    # A prefill method is refused under the protocol.
    with pytest.raises(ValueError, match="not a method of the decode protocol"):
        ab.sweep(["window"], out=tmp_path / "bad", lengths=[64], windows=1, decode=16, **llama)


def last_prompt_keys(q, k, v, d, rng, mask=None, n_f=None):
    """dec_window as a key set: the tool computes the continuation's rows, keys, mass and kv_read."""
    n_p = q.shape[0] - n_f
    return np.arange(max(n_p - d, 0), n_p)


def last_prompt_keys_per_row(q, k, v, d, rng, mask=None, n_f=None):
    """The same set, given once per continuation row."""
    return [last_prompt_keys(q, k, v, d, rng, mask, n_f)] * n_f


def test_a_users_function_may_return_the_prompt_keys_the_continuation_reads(tmp_path):
    llama = tiny_llama(tmp_path)
    out = tmp_path / "sets"
    # In float64: the per-row sets run through the key-set softmax's per-row path, whose rounding
    # differs from the one-group path's (1e-8 relative in f32).
    ab.sweep(["dec_window", last_prompt_keys, last_prompt_keys_per_row], out=out, lengths=[64],
             windows=2, decode=16, features=[8, 16], dtype="f64", **llama)
    got = rows(out)
    cols = ("error", "frob_error", "mass", "keys", "kv_bits", "kv_read")
    by = {}
    for r in got:
        by.setdefault((r["window"], r["head"], r["d"]), {})[r["method"]] = r
    assert len(by) == 2 * 4 * 2
    for key, methods in by.items():
        want = methods["dec_window"]
        for m in ("last_prompt_keys", "last_prompt_keys_per_row"):
            for c in cols:
                assert float(methods[m][c]) == pytest.approx(float(want[c]), rel=1e-10), (key, m, c)

    def outside(q, k, v, d, rng, mask=None, n_f=None):
        return np.array([q.shape[0] - 1])  # a continuation key, not a prompt one

    with pytest.raises(RuntimeError, match="outside the prompt"):
        ab.sweep([outside], out=tmp_path / "bad", lengths=[64], windows=1, decode=16, features=[8], **llama)


def test_a_complex_result_is_refused_not_cast(tiny, tmp_path):
    # Issue 57: float64 casting would drop the imaginary part with only a warning.
    def complex_out(q, k, v, d, rng):
        return np.asarray(v, dtype=np.float64) + 1e-3j

    with pytest.raises(RuntimeError, match="complex"):
        ab.sweep([complex_out], out=tmp_path / "c", **tiny, **GRID)


def test_ctrl_c_stops_a_sweep_keeps_its_trials_and_the_same_call_completes_it(tiny, tmp_path):
    # Issue 57: SIGINT to the main thread while the sweep runs in Rust is seen between trials.
    import _thread
    import json

    calls = {"n": 0}

    def interrupting(q, k, v, d, rng):
        calls["n"] += 1
        if calls["n"] == 5:
            _thread.interrupt_main()
        return window_attention(q, k, v, d, rng)

    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        ab.sweep([interrupting], out=out, **tiny, **GRID)
    assert json.loads((out / "manifest.json").read_text())["status"] == "interrupted"
    kept = len(rows(out))
    ab.sweep([interrupting], out=out, **tiny, **GRID)
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"
    assert len(rows(out)) > kept
