"""The Python face against closed forms and independent numpy computations."""

import numpy as np
import pytest

import approx_bench as ab


def softmax_attention(q, k, v):
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    s = q @ k.T / np.sqrt(q.shape[1])
    s -= s.max(axis=1, keepdims=True)
    e = np.exp(s)
    return (e / e.sum(axis=1, keepdims=True)) @ v


def head(n=256, p=32, seed=0, dtype=np.float32, scale=1.0):
    r = np.random.default_rng(seed)
    return tuple((scale * r.standard_normal((n, p))).astype(dtype) for _ in range(3))


@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-6), (np.float64, 1e-12)])
def test_exact_is_softmax_attention(dtype, tol):
    q, k, v = head(dtype=dtype, scale=2.0)
    o = ab.exact(q, k, v)
    assert o.dtype == dtype and o.shape == q.shape
    ref = softmax_attention(q, k, v)
    assert np.abs(o - ref).max() <= tol * np.abs(ref).max()


def test_spectral_error_is_the_largest_singular_value():
    r = np.random.default_rng(1)
    o = r.standard_normal((300, 40))
    o_hat = o + r.standard_normal((300, 40)) * 0.1
    s, rel, fro = ab.spectral_error(o, o_hat)
    e = o - o_hat
    assert s == pytest.approx(np.linalg.norm(e, 2), rel=1e-12)
    assert rel == pytest.approx(s / np.linalg.norm(o, 2), rel=1e-12)
    assert fro == pytest.approx(np.linalg.norm(e), rel=1e-12)


def test_vmean_is_the_mean_of_v_in_every_row():
    q, k, v = head()
    o_hat = ab.approximate("vmean", q, k, v, 16, 0)
    assert np.allclose(o_hat, np.broadcast_to(v.astype(np.float64).mean(0), v.shape), atol=1e-6)


def test_svd_optimal_at_full_rank_is_exact():
    q, k, v = head(n=64, p=16, dtype=np.float64)
    o_hat = ab.approximate("svd_optimal", q, k, v, 64, 0)
    assert np.abs(o_hat - softmax_attention(q, k, v)).max() < 1e-9


def test_the_seed_determines_a_randomized_method_and_nothing_else_does():
    q, k, v = head()
    a = ab.approximate("skeinformer", q, k, v, 32, 7)
    b = ab.approximate("skeinformer", q.copy(), k.copy(), v.copy(), 32, 7)
    c = ab.approximate("skeinformer", q, k, v, 32, 8)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_trial_seed_is_the_64_bit_derived_seed():
    s = ab.trial_seed(0, 1024, 3, 5, "skeinformer", 64)
    assert 0 <= s < 2**64
    assert s == ab.trial_seed(0, 1024, 3, 5, "skeinformer", 64)
    assert s != ab.trial_seed(0, 1024, 3, 5, "skeinformer", 32)


def test_inputs_are_converted_at_the_door_and_bad_ones_named():
    q, k, v = head(n=32, p=8)
    as_lists = ab.exact(q.tolist(), k.tolist(), v.tolist())  # float64 via numpy.asarray
    assert as_lists.dtype == np.float64
    with pytest.raises(ValueError, match="q: expected one head"):
        ab.exact(q[None], k, v)
    with pytest.raises(ValueError, match="one shape"):
        ab.exact(q, k[:16], v)
    with pytest.raises(ValueError, match="unknown method|not a method|no method"):
        ab.approximate("no_such_method", q, k, v, 8, 0)
    with pytest.raises(ValueError, match="budget"):
        ab.approximate("skeinformer", q, k, v, 0, 0)


def test_methods_lists_the_registry():
    ids = [m[0] for m in ab.methods()]
    for m in ["skyformer", "nystromformer", "performer", "informer", "skeinformer", "vmean", "linformer"]:
        assert m in ids


def causal_attention(q, k, v):
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    n = q.shape[0]
    s = q @ k.T / np.sqrt(q.shape[1])
    s[np.triu_indices(n, 1)] = -np.inf
    s -= s.max(axis=1, keepdims=True)
    e = np.exp(s)
    return (e / e.sum(axis=1, keepdims=True)) @ v


def test_the_causal_target_and_causal_forms_against_numpy():
    q, k, v = head(n=200, p=16, dtype=np.float64, scale=1.5)
    o = ab.exact(q, k, v, mask="causal")
    assert np.abs(o - causal_attention(q, k, v)).max() < 1e-12
    # The causal window of d keys and the prefix mean, from their definitions (docs/reference.md §7.4).
    d = 7
    w = ab.approximate("window", q, k, v, d, 0, mask="causal")
    want = np.stack([_window_row(q, k, v, i, d) for i in range(len(q))])
    assert np.abs(w - want).max() < 1e-12
    vm = ab.approximate("vmean", q, k, v, d, 0, mask="causal")
    assert np.abs(vm - np.cumsum(v, 0) / np.arange(1, len(v) + 1)[:, None]).max() < 1e-12
    with pytest.raises(ValueError, match="no causal form"):
        ab.approximate("nystromformer", q, k, v, 8, 0, mask="causal")


def _window_row(q, k, v, i, d):
    lo = max(0, i - d + 1)
    s = k[lo:i + 1] @ q[i] / np.sqrt(q.shape[1])
    e = np.exp(s - s.max())
    return (e / e.sum()) @ v[lo:i + 1]


def q8_0(x):
    """llama.cpp's Q8_0 round trip (quantize_row_q8_0_ref) in float32, blocks of 32 along rows."""
    b = np.asarray(x, dtype=np.float32).reshape(-1, 32)
    d = (np.abs(b).max(axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    y = (b * inv).astype(np.float32)
    q = np.sign(y) * np.floor(np.abs(y) + np.float32(0.5))  # roundf: half away from zero
    return (d.astype(np.float16).astype(np.float32) * q).astype(np.float32).reshape(np.shape(x))


@pytest.mark.parametrize("mask", ["none", "causal"])
def test_quantized_caches_against_numpy(mask):
    q, k, v = head(n=96, p=64, seed=3, dtype=np.float64)
    ref = lambda q_, k_, v_: ab.exact(q_, k_, v_, mask=mask)
    # kv_f16: numpy's float64 → float16 cast rounds once, as docs/reference.md §8.2 asks.
    f16 = lambda x: x.astype(np.float16).astype(np.float64)
    got = ab.approximate("kv_f16", q, k, v, 0, 0, mask=mask)
    assert np.abs(got - ref(f16(q), f16(k), f16(v))).max() < 1e-13
    # kv_q8_0: Q, K and V in Q8_0 (the cache write rounds to f32 first).
    q8 = lambda x: q8_0(x.astype(np.float32)).astype(np.float64)
    got = ab.approximate("kv_q8_0", q, k, v, 0, 0, mask=mask)
    assert np.abs(got - ref(q8(q), q8(k), q8(v))).max() < 1e-13
    # A budget method still refuses d = 0, naming it.
    with pytest.raises(ValueError, match="budget"):
        ab.approximate("window", q, k, v, 0, 0, mask=mask)


def test_agreement_is_the_literatures_three_measures():
    r = np.random.default_rng(4)
    o = r.standard_normal((50, 8))
    o_hat = o + 0.05 * r.standard_normal((50, 8))
    cos, l1, rmse = ab.agreement(o, o_hat)
    assert cos == pytest.approx((o * o_hat).sum() / np.linalg.norm(o) / np.linalg.norm(o_hat), rel=1e-13)
    assert l1 == pytest.approx(np.abs(o - o_hat).sum() / np.abs(o).sum(), rel=1e-13)
    assert rmse == pytest.approx(np.sqrt(((o - o_hat) ** 2).mean()), rel=1e-13)
