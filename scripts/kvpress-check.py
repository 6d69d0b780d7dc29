#!/usr/bin/env python3
"""`approx-bench e2e`'s decode protocol against NVIDIA kvpress itself, press by press (issue 58).

kvpress compresses the prompt's cache while the prompt is prefilled, in every layer; the tokens after
it then read the compressed cache. This script does exactly that with kvpress's own presses on
transformers' Llama loaded from the same GGUF the tool reads (its GGUF loader dequantizes it), on
the ids of an `e2e` run (its ids.txt), and compares the teacher-forced KL against the exact model
with the `e2e` run's rows:

- the prompt is the first n_p = n − n_f tokens. `with press(model): model(prompt)` fills and
  compresses the cache; the continuation tokens n_p … n − 2 are then fed in one call with their
  uncompressed positions (`position_ids` = n_p …; kvpress's pipeline passes them so, and without
  them the KL doubles), and the press does not fire again (kvpress compresses at prefill only);
- the scored rows are `e2e`'s: row n_p − 1 (the prefill's last, exact) and rows n_p … n − 2;
  KL(P_exact ‖ P_press) per row in float64, its mean over the n_f rows;
- the budget: kvpress keeps int(n_p·(1 − compression_ratio)) keys, so the ratio is
  (n_p − d − ½)/n_p, which keeps exactly d (1 − d/n_p keeps d − 1 through float rounding);
  PyramidKVPress rounds its own budget and takes 1 − d/n_p.

The run's dtype decides the model's: an `e2e --dtype f64` run is compared with transformers' model
made float64 end to end (tests/reference/e2e_transformers_f64.py's RMSNorm and RoPE, sdpa in
float64, an eager float64 attention for ObservedAttentionPress). That is the deciding check: every
twin must agree in kl_mean to --tol relative (1e-5) with identical top-1 and exactly d keys kept
(measured: 1e-14). An f32 run is compared with the float32 model and reported only: a near-tie that
rounding flips moves a point by up to 3e-3 there, in either tool.

Not twins, reported and never failed: `tova` (TOVAPress keeps the last token, `tova` does not
protect it) and the windowed presses at d < 64 (kvpress keeps d of the window's 64 equal scores,
torch.topk's unspecified choice). KnormPress and CURPress tie by construction on repeated tokens:
they are compared with their scores tilted toward the lower position, as the tool orders them
(TIE_TILT), and the spread to the opposite tilt is reported as their tie noise.
    python scripts/kvpress-check.py --gguf ../shared/data/SmolLM2-135M-Instruct-Q4_1/SmolLM2-135M-Instruct.Q4_1.gguf \
        --run OUT            # an e2e run's directory (ids.txt, e2e.csv)

Needs kvpress 0.5.5 (PyPI) and a transformers it accepts (< 5.3): `pip install kvpress==0.5.5`.
Exit 1 if a twin disagrees, 2 on bad input.
"""

import argparse
import csv
import json
import os
import sys

# transformers' GGUF loader and weight loading print progress bars: the comparison is the output.
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch


def presses():
    """Our method id → (a kvpress press at compression ratio r, whether a twin by construction, note)."""
    import kvpress as kp

    return {
        # Our §9 methods that are kvpress's presses by definition.
        "dec_streaming": (lambda r: kp.StreamingLLMPress(compression_ratio=r, n_sink=4), True, "StreamingLLMPress"),
        "tova": (lambda r: kp.TOVAPress(compression_ratio=r), False,
                 "TOVAPress; ours does not force the last token (tova_press does)"),
        # The presses, each kvpress's class with its defaults.
        "snapkv_press": (lambda r: kp.SnapKVPress(compression_ratio=r), True, "SnapKVPress"),
        # PyramidKVPress rounds n_p·(1 − ratio) itself (half to even): it takes 1 − d/n_p (see RATIO).
        "pyramidkv_press": (lambda r: kp.PyramidKVPress(compression_ratio=r), True, "PyramidKVPress"),
        "adakv_press": (lambda r: kp.AdaKVPress(kp.SnapKVPress(compression_ratio=r)), True, "AdaKVPress(SnapKVPress)"),
        "observed_attention_press": (lambda r: kp.ObservedAttentionPress(compression_ratio=r), True, "ObservedAttentionPress"),
        "tova_press": (lambda r: kp.TOVAPress(compression_ratio=r), True, "TOVAPress"),
        "knorm_press": (lambda r: kp.KnormPress(compression_ratio=r), True, "KnormPress"),
        "keydiff_press": (lambda r: kp.KeyDiffPress(compression_ratio=r), True, "KeyDiffPress"),
        "cur_press": (lambda r: kp.CURPress(compression_ratio=r), True, "CURPress"),
        "expected_attention_press": (lambda r: kp.ExpectedAttentionPress(compression_ratio=r), True,
                                     "ExpectedAttentionPress"),
        # A twin only where no tie sits on the budget's edge (lagkv_untied).
        "lagkv_press": (lambda r: kp.LagKVPress(compression_ratio=r), True, "LagKVPress"),
    }


def lagkv_untied(n_p, d, sinks=4, lag=128):
    """Whether LagKVPress's top d is free of ties at its edge: its scores are 1 on the sinks and the
    last partition with the remainder, then the ranks r/128 of each earlier partition, each rank
    once per partition; d must take whole rank levels (or, on a short prompt, at least the sinks)."""
    if n_p < sinks + 2 * lag:
        return d >= sinks
    end = sinks + (n_p - sinks) // lag * lag
    ones = sinks + lag + n_p - end
    parts = (end - sinks) // lag - 1
    return d >= ones and (d - ones) % parts == 0


# Presses whose scores tie by construction: a key's norm is RoPE's invariant and a layer-0 key or
# value depends on its token only, so every repeat of a token scores the same (to rounding) under
# KnormPress and CURPress. kvpress's choice among them is torch.topk's order, ours the lower
# position's (docs/reference.md §9.4). In f64 the check runs these presses with their scores tilted
# by 1e-10 relative toward the lower position (TIE_TILT), as the tool orders them, without touching
# any real gap, and reports the spread to the opposite tilt: the press's tie noise.
TIED = {"knorm_press", "cur_press"}
TIE_TILT = 1e-10  # src/attention/decode/press.rs' TIE_TILT


def tilted(press, toward_lower):
    """`press` with its scores s_t tilted by ∓TIE_TILT·|s_t|·t/n: ties to the lower (or higher) t."""
    base = type(press)
    sign = 1.0 if toward_lower else -1.0

    class Tilted(base):
        def score(self, *args, **kwargs):
            s = super().score(*args, **kwargs)
            t = torch.arange(s.shape[-1], dtype=s.dtype) / s.shape[-1]
            return s - sign * TIE_TILT * s.abs() * t

    Tilted.__name__ = base.__name__
    out = Tilted.__new__(Tilted)
    out.__dict__.update(press.__dict__)
    return out


# The presses that round n_p·(1 − ratio) instead of truncating it: they take 1 − d/n_p.
ROUNDING = {"pyramidkv_press"}
# The presses that force a window of 64 (score max + 1): at d < 64 kvpress keeps d of 64 equal
# scores, torch.topk's unspecified choice; ours keeps the most recent d (docs/reference.md §9.4).
WINDOWED = {"snapkv_press": 64, "pyramidkv_press": 64, "adakv_press": 64}


def read_ids(path):
    with open(path) as f:
        return [[int(t) for t in line.split()] for line in f if line.strip()]


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def log_softmax64(logits):
    return torch.log_softmax(logits.to(torch.float64), dim=-1)


def kl_rows(exact_lp, method_lp):
    """KL(P_exact ‖ P_method) per row, float64."""
    return (exact_lp.exp() * (exact_lp - method_lp)).sum(-1)


def set_attention(model, name):
    model.config._attn_implementation = name
    for m in model.modules():
        if hasattr(m, "config") and m.config is not model.config and hasattr(m.config, "_attn_implementation"):
            m.config._attn_implementation = name


def press_logp(model, ids, n_f, press, prefill_attention):
    """Log-probabilities of the scored rows with `press` compressing the prompt's cache: the prompt
    with `prefill_attention` (what the press reads), the continuation with sdpa."""
    from transformers import DynamicCache

    n = len(ids)
    n_p = n - n_f
    x = torch.tensor([ids])
    layers = model.model.layers
    for layer in layers:
        # A masking press (Ada-KV) leaves its mask on the modules after the run.
        layer.self_attn.masked_key_indices = None
    cache = DynamicCache()
    with torch.no_grad():
        set_attention(model, prefill_attention)
        with press(model):
            out = model(x[:, :n_p], past_key_values=cache)
        set_attention(model, "sdpa")
        first = out.logits[0, -1:]
        lengths = {cache.layers[l].keys.shape[-2] for l in range(len(layers))}
        if len(lengths) == 1:
            pos = torch.arange(n_p, n - 1)[None]
            rest = model(x[:, n_p : n - 1], past_key_values=cache, position_ids=pos).logits[0]
        else:
            # Layers of different cache lengths (PyramidKV above d = 1280): the causal mask is sized
            # from layer 0, so with n_f > 1 a shorter layer would see later tokens. One token per call.
            rest = torch.cat([
                model(x[:, t : t + 1], past_key_values=cache, position_ids=torch.tensor([[t]])).logits[0]
                for t in range(n_p, n - 1)
            ], 0)
    # The prompt keys each K/V head keeps, mean over the layer-0 heads: a masking press keeps
    # the whole cache and lists the masked (batch, head, position) triples.
    k0 = cache.layers[0].keys
    kv_heads = k0.shape[1]
    masked = getattr(layers[0].self_attn, "masked_key_indices", None)
    stored = k0.shape[-2] - (n_f - 1)
    kept = stored - (len(masked[0]) / kv_heads if masked is not None else 0)
    return log_softmax64(torch.cat([first, rest], 0)), kept


def float64_model(gguf):
    """transformers' Llama from the GGUF made float64 end to end: tests/reference/e2e_transformers_f64.py's
    RMSNorm and RoPE replacements (a `.double()` model still computes both in float32), sdpa in
    float64, and for the presses that read attention weights an eager float64 attention that returns
    them (transformers' eager softmax is float32)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
    from e2e_transformers_f64 import load, make_float64
    from transformers import AttentionInterface

    def eager64(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        b, h, n, p = query.shape
        group = h // key.shape[1]
        key = key.repeat_interleave(group, dim=1)
        value = value.repeat_interleave(group, dim=1)
        scores = torch.matmul(query, key.transpose(-1, -2)) * (scaling or p ** -0.5)
        # A prefill from an empty cache: query i sees keys j ≤ i.
        assert key.shape[2] == n, "eager64 serves the prefill only"
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights

    AttentionInterface.register("eager64", eager64)
    model = load(os.path.abspath(gguf))
    make_float64(model)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True, help="the GGUF the e2e run read")
    ap.add_argument("--run", required=True, help="the e2e run's directory (ids.txt, e2e.csv)")
    ap.add_argument("--tol", type=float, default=1e-5, help="relative tolerance on kl_mean")
    ap.add_argument("--methods", default=None, help="only these of our ids (comma-separated)")
    args = ap.parse_args()
    for p in (args.gguf, os.path.join(args.run, "ids.txt"), os.path.join(args.run, "e2e.csv")):
        if not os.path.exists(p):
            print(f"kvpress-check: {p} does not exist (run `approx-bench e2e ... --out RUN` first)", file=sys.stderr)
            sys.exit(2)

    import kvpress
    from importlib.metadata import version
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with open(os.path.join(args.run, "manifest.json")) as f:
        dtype = json.load(f)["dtype"]
    if dtype == "f64":
        model, eager = float64_model(args.gguf), "eager64"
    else:
        model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(os.path.abspath(args.gguf)), gguf_file=os.path.basename(args.gguf), dtype=torch.float32
        ).eval()
        eager = "eager"
    set_attention(model, "sdpa")
    windows = read_ids(os.path.join(args.run, "ids.txt"))
    rows = [r for r in read_rows(os.path.join(args.run, "e2e.csv")) if r["mode"] == "decode"]
    table = presses()
    wanted = set(args.methods.split(",")) if args.methods else None
    print(f"kvpress {version('kvpress')}, transformers {version('transformers')}, torch {torch.__version__}; "
          f"{dtype}; {len(windows)} windows, {len(rows)} decode rows of the e2e run")

    failures, compared = 0, 0
    for w, ids in enumerate(windows):
        w_rows = [r for r in rows if int(r["window"]) == w]
        if not w_rows:
            continue
        n_f = int(w_rows[0]["n_f"])
        n_p = len(ids) - n_f
        set_attention(model, "sdpa")
        with torch.no_grad():
            full = model(torch.tensor([ids])).logits[0, n_p - 1 : len(ids) - 1]
        exact = log_softmax64(full)
        exact_top = exact.argmax(-1)
        for r in sorted(w_rows, key=lambda r: (r["method"], int(r["d"]))):
            m, d = r["method"], int(r["d"])
            if m not in table or (wanted and m not in wanted) or d >= n_p:
                continue
            make, twin, note = table[m]
            if d < WINDOWED.get(m, 0):
                twin, note = False, f"{note}: d < {WINDOWED[m]} keeps d of the window's equal scores"
            if m == "lagkv_press" and not lagkv_untied(n_p, d):
                twin, note = False, f"{note}: d splits a level of ranks that tie across partitions"
            ratio = 1 - d / n_p if m in ROUNDING else (n_p - d - 0.5) / n_p
            press = make(ratio)
            # ObservedAttention reads eager attention weights; a masking press (Ada-KV) works
            # through kvpress's patch of every attention function but eager.
            attn = eager if isinstance(press, kvpress.ObservedAttentionPress) else "sdpa"
            lp, kept = press_logp(model, ids, n_f, press, attn)
            kl_mean = kl_rows(exact, lp).mean().item()
            top1 = (lp.argmax(-1) == exact_top).double().mean().item()
            tie_note = ""
            if m in TIED and dtype == "f64":
                # The twin check is the tilt toward the lower position; as kvpress ships, the
                # difference is within the spread of the two tilts (the tie noise).
                spread = []
                for lower in (True, False):
                    lpt, _ = press_logp(model, ids, n_f, tilted(make(ratio), lower), attn)
                    spread.append(kl_rows(exact, lpt).mean().item())
                    if lower:
                        as_shipped, kl_mean = kl_mean, spread[0]
                        top1 = (lpt.argmax(-1) == exact_top).double().mean().item()
                noise = abs(spread[0] - spread[1]) / max(abs(spread[0]), 1e-300)
                shipped = abs(as_shipped - float(r["kl_mean"])) / max(abs(float(r["kl_mean"])), 1e-300)
                tie_note = f" [ties to the lower position; as shipped rel {shipped:.1e}, tie noise {noise:.1e}]"
            ours, ours_top = float(r["kl_mean"]), float(r["top1"])
            rel = abs(kl_mean - ours) / max(abs(ours), 1e-300)
            dtop = abs(top1 - ours_top)
            compared += 1
            if rel <= args.tol and dtop < 1e-12 and abs(kept - d) < 1e-9:
                verdict = "ok"
            elif not twin:
                verdict = f"DIFFERS (not a twin: {note})"
            elif dtype != "f64" and rel < 1e-2:
                verdict = "DIFFERS in f32 (as much as a near-tie that rounding flips; the f64 run decides)"
            elif dtype != "f64":
                verdict = "DIFFERS in f32, beyond what a rounding flip moves (see docs/reproductions.md)"
            else:
                verdict = "FAIL"
                failures += 1
            print(f"w{w} {m:<24} d={d:<5} kept {kept:<7g} kl_mean ours {ours:.9g} kvpress {kl_mean:.9g} "
                  f"rel {rel:.2e} top1 {ours_top:.6f}/{top1:.6f} {verdict}{tie_note}", flush=True)
    if compared == 0:
        print("kvpress-check: no row of the run has a kvpress counterpart (run e2e with --methods kvpress)", file=sys.stderr)
        sys.exit(2)
    print(f"kvpress-check ({dtype}): {compared} points, {failures} twins disagree")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
