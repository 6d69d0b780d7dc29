#!/usr/bin/env python3
"""METHODS.md §7.7.0's general attention target in float64 numpy (issue 45), and its check against
the family fixtures made by transformers (tests/reference/generate_family_fixtures.py).

For query head h, row i, with visible set V_i:
    s_ij = c·tanh(τ·q_i·k_j / c)   with a soft-cap c,   s_ij = τ·q_i·k_j   without;
    V_i  = {j ≤ i}, and with a window W also j > i − W   (W keys, the diagonal counted);
    O_i  = Σ_{j∈V_i} e^{s_ij − m_i} v_j / ( [e^{σ_h − m_i}] + Σ_{j∈V_i} e^{s_ij − m_i} ),
    m_i  = max([σ_h,] max_{j∈V_i} s_ij);
the sink (σ_h, gpt-oss) has a zero value vector; query head h reads K/V head ⌊h·H_kv/H⌋; p_v may
differ from p_qk (MLA). Written from the equations, sharing no code with transformers or the tool.

    python tests/reference/family_target.py --self-test
    python tests/reference/family_target.py --fixtures fixtures/families

``--self-test``: hand cases, each an identity the target must satisfy exactly or to rounding.
``--fixtures DIR``: for every stored layer of every fixture, family_target(q, k, v, spec) must
equal transformers' own eager output ``o`` within 1e-10 relative (max |Δ| / max |o|). That checks
the fixture and the spec together: that each family's attention is exactly §7.7.0 with the spec's
τ, c, W and σ. Each feature must also be active (else the fixture could not catch its omission):
leaving it out (or moving a window by one key either way) must change O by at least 1e-2 of its
max |O|, and the strength of each (fraction of
logits the cap moves by more than 1e-3, fraction of visible-set-excluded keys due to the window,
the sinks' mean share of the attention mass) is printed. For MLA the absorbed form (scores from
W_UKᵀ q_nope and the latent, O = W_UV Σ P c) must equal O too, and the latent's rope part must be
the k rope part. Exit 1 on any failure.
"""

import argparse
import json
import math
import os
import sys

import numpy as np

TOL_FIXTURE = 1e-10  # float64 vs float64 in another summation order: ~1e-15; 1e-10 leaves room, catches any τ/c/W/σ slip
TOL_IDENTITY = 1e-13
ACTIVE_MIN = 1e-2


def family_target(q, k, v, scale, softcap=None, window=None, sinks=None, return_probs=False):
    """q [H, n, p_qk], k [H_kv, n, p_qk], v [H_kv, n, p_v] → O [H, n, p_v], float64.

    With return_probs also the real-key probabilities [H, n, n] and the sink probability [H, n]."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    H, n, _ = q.shape
    H_kv = k.shape[0]
    if H % H_kv:
        raise ValueError(f"H = {H} is not a multiple of H_kv = {H_kv}")
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    kv_head = (np.arange(H) * H_kv) // H  # ⌊h·H_kv/H⌋
    s = scale * np.einsum("hid,hjd->hij", q, k[kv_head])
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    visible = j <= i
    if window is not None:
        visible &= j > i - window
    s = np.where(visible[None], s, -np.inf)
    m = s.max(axis=-1)
    if sinks is not None:
        sig = np.asarray(sinks, dtype=np.float64)[:, None]
        m = np.maximum(m, sig)
    e = np.exp(s - m[..., None])
    den = e.sum(axis=-1)
    if sinks is not None:
        e_sink = np.exp(sig - m)
        den = den + e_sink
    o = np.einsum("hij,hjd->hid", e, v[kv_head]) / den[..., None]
    if not return_probs:
        return o
    p_sink = e_sink / den if sinks is not None else np.zeros((H, n))
    return o, e / den[..., None], p_sink


def rel(a, b):
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-300))


# --------------------------------------------------------------------------------------------
def self_test():
    rng = np.random.default_rng(7)
    H, H_kv, n, p, pv = 4, 2, 23, 8, 5
    q = rng.standard_normal((H, n, p)) * 2
    k = rng.standard_normal((H_kv, n, p)) * 2
    v = rng.standard_normal((H_kv, n, pv))
    tau = 1 / math.sqrt(p)
    results = []

    # 1. τ = 1/√p, no cap/window/sink: plain causal softmax, written separately (per head, loops).
    plain = np.zeros((H, n, pv))
    for h in range(H):
        g = h // (H // H_kv)
        for i in range(n):
            x = np.array([q[h, i] @ k[g, j] / math.sqrt(p) for j in range(i + 1)])
            w = np.exp(x - x.max())
            plain[h, i] = (w / w.sum()) @ v[g, : i + 1]
    results.append(("plain causal softmax", rel(family_target(q, k, v, tau), plain), TOL_IDENTITY))
    # 2. W ≥ n is no window (W = n and W = n + 5).
    base = family_target(q, k, v, tau)
    results.append(("window W = n", rel(family_target(q, k, v, tau, window=n), base), 0.0))
    results.append(("window W = n + 5", rel(family_target(q, k, v, tau, window=n + 5), base), 0.0))
    # 3. A sink of −∞ is no sink.
    results.append(("sink −inf", rel(family_target(q, k, v, tau, sinks=np.full(H, -np.inf)), base), 0.0))
    # 4. A huge cap is no cap: c·tanh(x/c) = x − x³/(3c²) + …, |s| ≤ ~10 here, so c = 1e6 moves
    #    s by ≤ 1e-9·|s|/3 ≈ 3e-9 and O by as much relative.
    results.append(("cap c = 1e6", rel(family_target(q, k, v, tau, softcap=1e6), base), 1e-8))
    # 5. Window W = 1: each row reads only its own key (O_i = v_i of its K/V head).
    own = v[np.arange(H) // (H // H_kv)]
    results.append(("window W = 1 reads the diagonal", rel(family_target(q, k, v, tau, window=1), own), 0.0))
    # 6. Window W: row i equals the plain softmax over keys i−W+1..i, computed by slicing.
    W = 5
    sl = np.zeros((H, n, pv))
    for i in range(n):
        lo = max(0, i - W + 1)
        sl[:, i] = family_target(q[:, lo : i + 1], k[:, lo : i + 1], v[:, lo : i + 1], tau)[:, -1]
    results.append((f"window W = {W} by slicing", rel(family_target(q, k, v, tau, window=W), sl), TOL_IDENTITY))
    # 7. A sink is a key with a zero value: append one key per row whose logit is σ_h exactly.
    sig = rng.standard_normal(H) + 1.0
    o_sink = family_target(q, k, v, tau, sinks=sig)
    ref = np.zeros((H, n, pv))
    for h in range(H):
        g = h // (H // H_kv)
        for i in range(n):
            x = np.append(tau * (k[g, : i + 1] @ q[h, i]), sig[h])
            w = np.exp(x - x.max())
            ref[h, i] = (w[:-1] / w.sum()) @ v[g, : i + 1]
    results.append(("sink = zero-value key", rel(o_sink, ref), TOL_IDENTITY))
    # 8. The cap is tanh on the scaled logit: c = 2 against a hand loop.
    ref = np.zeros((H, n, pv))
    for h in range(H):
        g = h // (H // H_kv)
        for i in range(n):
            x = 2.0 * np.tanh(tau * (k[g, : i + 1] @ q[h, i]) / 2.0)
            w = np.exp(x - x.max())
            ref[h, i] = (w / w.sum()) @ v[g, : i + 1]
    results.append(("cap c = 2 by hand", rel(family_target(q, k, v, tau, softcap=2.0), ref), TOL_IDENTITY))
    # 9. Each case above must be able to fail: a wrong τ, a missing window or sink changes O.
    moved = [
        rel(family_target(q, k, v, 1.1 * tau), base),
        rel(family_target(q, k, v, tau, window=W), base),
        rel(o_sink, base),
        rel(family_target(q, k, v, tau, softcap=2.0), base),
    ]
    results.append(("each parameter moves O (min change, must be ≥ 1e-2)", -min(moved), -ACTIVE_MIN))
    failed = 0
    for name, dev, tol in results:
        ok = dev <= tol and math.isfinite(dev)
        failed += not ok
        shown = f"{-dev:.2e}" if tol < 0 else f"{dev:.2e}"
        print(f"  {name:<52} {shown} (tolerance {abs(tol):.0e}) {'ok' if ok else 'FAIL'}")
    print("family_target self-test: " + ("PASS" if not failed else f"{failed} FAILED"))
    return failed


# --------------------------------------------------------------------------------------------
def check_fixtures(root):
    from safetensors.numpy import load_file

    fams = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    if not fams:
        print(f"no fixtures under {root}")
        return 1
    failed = 0
    for fam in fams:
        spec = json.load(open(os.path.join(root, fam, "spec.json")))
        for ex in spec["expected"]:
            t = load_file(os.path.join(root, fam, ex["file"]))
            n = ex["n"]
            if t["ids"].shape != (n,):
                print(f"  {fam} {ex['file']}: ids has shape {t['ids'].shape}, spec says n = {n}  FAIL")
                failed += 1
            for L, ls in sorted(ex["layers"].items(), key=lambda kv: int(kv[0])):
                q, k, v, o = (t[f"layer{L}.{x}"] for x in "qkvo")
                sinks = t.get(f"layer{L}.sinks")
                if (sinks is not None) != ls["sinks"]:
                    print(f"  {fam} layer {L}: sinks tensor present = {sinks is not None}, spec = {ls['sinks']}  FAIL")
                    failed += 1
                shapes_ok = (
                    q.shape[1:] == (n, ls["head_dim"]) and k.shape[1:] == (n, ls["head_dim"])
                    and v.shape[1:] == (n, ls["head_dim_v"]) and o.shape == (q.shape[0], n, ls["head_dim_v"])
                )
                if not shapes_ok:
                    print(f"  {fam} layer {L}: shapes {q.shape} {k.shape} {v.shape} {o.shape} disagree with the spec  FAIL")
                    failed += 1
                    continue
                params = dict(scale=ls["scale"], softcap=ls["softcap"], window=ls["window"], sinks=sinks)
                got, P, p_sink = family_target(q, k, v, **params, return_probs=True)
                dev = rel(got, o)
                ok = dev <= TOL_FIXTURE
                lines = [f"O vs transformers {dev:.1e}"]
                # Each feature active: O must move by ≥ ACTIVE_MIN when it is left out.
                effects = {}
                p_qk = q.shape[-1]
                if abs(ls["scale"] - p_qk ** -0.5) > 1e-12 * ls["scale"]:
                    effects["τ→1/√p"] = rel(family_target(q, k, v, **{**params, "scale": p_qk ** -0.5}), o)
                if ls["softcap"] is not None:
                    c = ls["softcap"]
                    H_kv = k.shape[0]
                    raw = ls["scale"] * np.einsum("hid,hjd->hij", q, k[(np.arange(q.shape[0]) * H_kv) // q.shape[0]])
                    tri = np.tril(np.ones((n, n), bool))
                    moved = np.abs(c * np.tanh(raw / c) - raw)[:, tri]
                    lines.append(f"cap moves {np.mean(moved > 1e-3):.2f} of logits by > 1e-3, "
                                 f"{np.mean(np.abs(raw[:, tri]) > c / 2):.2f} beyond ±c/2")
                    effects["cap"] = rel(family_target(q, k, v, **{**params, "softcap": None}), o)
                if ls["window"] is not None:
                    i = np.arange(n)[:, None]
                    j = np.arange(n)[None, :]
                    causal = j <= i
                    outside = causal & (j <= i - ls["window"])
                    lines.append(f"window hides {outside.sum() / causal.sum():.2f} of causal keys")
                    effects["window"] = rel(family_target(q, k, v, **{**params, "window": None}), o)
                    # W counts the diagonal (W keys, j > i − W): W ± 1 must not match transformers.
                    effects["W±1"] = min(
                        rel(family_target(q, k, v, **{**params, "window": ls["window"] + d}), o) for d in (-1, 1)
                    )
                if sinks is not None:
                    share = p_sink.mean(axis=1)
                    lines.append("sink share " + "/".join(f"{x:.2f}" for x in share) + f" (mean {share.mean():.2f})")
                    effects["sinks"] = rel(family_target(q, k, v, **{**params, "sinks": None}), o)
                    # mass over real keys + sink mass = 1 on every row.
                    ok &= float(np.max(np.abs(P.sum(-1) + p_sink - 1))) <= 1e-12
                if "mla" in ls:
                    dev_abs, dev_pe = absorbed(t, L, ls, got, P)
                    lines.append(f"absorbed {dev_abs:.1e}, latent rope part {dev_pe:.1e}")
                    ok &= dev_abs <= TOL_FIXTURE and dev_pe == 0.0
                for name, e in effects.items():
                    ok &= e >= ACTIVE_MIN
                if effects:
                    lines.append("leaving out changes O by " + ", ".join(f"{a} {e:.2f}" for a, e in effects.items()))
                failed += not ok
                tag = f"{fam} {ex['file'].replace('.safetensors', '')} L{L} ({ls['layer_type']}, n {n})"
                print(f"  {tag:<52} {'ok' if ok else 'FAIL'}\n      " + "; ".join(lines))
    print("family_target on the fixtures: " + ("PASS" if not failed else f"{failed} FAILED"))
    return failed


def absorbed(t, L, ls, o_target, P):
    """MLA's absorbed view (§7.7.5): s = τ·[W_UKᵀ q_nope; q_pe]·[c; k_pe], O_h = W_UV,h Σ_j P_ij c_j."""
    m = ls["mla"]
    q, k = t[f"layer{L}.q"], t[f"layer{L}.k"]
    lat, w = t[f"layer{L}.kv_latent"], t[f"layer{L}.w_kv_b"]
    r, dn, dv = m["kv_lora_rank"], m["d_nope"], m["d_v"]
    c, k_pe = lat[:, :r], lat[:, r:]
    w_uk, w_uv = w[:, :dn, :], w[:, dn:, :]  # [H, d_nope, r], [H, d_v, r]
    q_abs = np.concatenate([np.einsum("hid,hdr->hir", q[..., :dn], w_uk), q[..., dn:]], axis=-1)
    key = np.concatenate([c, k_pe], axis=-1)[None]  # one shared K/V head
    H, n = q.shape[:2]
    s = ls["scale"] * np.einsum("hir,xjr->hij", q_abs, key)
    s = np.where(np.tril(np.ones((n, n), bool))[None], s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    Pa = e / e.sum(-1, keepdims=True)
    o = np.einsum("hdr,hir->hid", w_uv, np.einsum("hij,jr->hir", Pa, c))
    return rel(o, o_target), float(np.max(np.abs(k[:, :, dn:] - k_pe[None])))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--fixtures", help="fixtures/families")
    args = ap.parse_args()
    if not (args.self_test or args.fixtures):
        ap.error("give --self-test and/or --fixtures DIR")
    failed = 0
    if args.self_test:
        failed += self_test()
    if args.fixtures:
        failed += check_fixtures(args.fixtures)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
