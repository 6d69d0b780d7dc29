#!/usr/bin/env python3
"""kvpress's presses beside the §9 methods (issue 58), from results/e2e: for each model, the mean KL
over the windows that both the press run (run-kvpress.sh) and the committed e2e run have, with the
same ids (checked line by line in ids.txt), at d = 64 and 256 (the presses also at 384, about what the per-query-head forms store at 256); and
the prompt keys a K/V head stores
(`kv_union` of the single-layer decode sweeps in results/e2e/kvpress-union-*, a mean over their
rows, two layers a model; d itself for one set per K/V head or per layer). Prints the markdown of docs/reproductions.md's
"kvpress's presses"; with --write, rewrites it between <!-- kvpress-table --> and <!-- /kvpress-table -->.
Run from the repository root."""

import csv
import glob
import os
import re
import sys
from collections import defaultdict

MODELS = {
    "SmolLM2-135M": ("results/e2e/smollm2-n2048", "results/e2e/kvpress-smollm2-n2048", "results/e2e/kvpress-union-smollm2-l*"),
    "Gemma 3 270M": ("results/e2e/gemma3-270m-n2048", "results/e2e/kvpress-gemma3-270m-n2048", "results/e2e/kvpress-union-gemma3-l*"),
}
# (kvpress form, the §9 method it is the per-query-head or per-layer form of); oracles last.
PAIRS = [
    ("snapkv_press", "snapkv"),
    ("pyramidkv_press", "pyramidkv"),
    ("adakv_press", "adakv"),
    ("observed_attention_press", "h2o_dec"),
    ("tova_press", "tova"),
    (None, "dec_streaming"),
    ("knorm_press", None),
    ("keydiff_press", None),
    ("cur_press", None),
    ("expected_attention_press", None),
    ("lagkv_press", None),
    (None, "topk_dec"),
    (None, "evict_oracle"),
]
PER_QUERY = {"snapkv", "snapkv_avg5", "pyramidkv", "adakv", "h2o_dec", "evict_oracle"}
DS = (64, 256)


def fmt(x):
    return "–" if x is None else (f"{x:.3g}" if abs(x) >= 1e-3 else f"{x:.2e}")


def kl_means(base, press):
    """{(method, d): mean kl over the shared windows}, and the number of those windows."""
    ids = lambda run: open(os.path.join(run, "ids.txt")).read().splitlines()
    a, b = ids(base), ids(press)
    shared = [w for w in range(min(len(a), len(b))) if a[w] == b[w]]
    if len(shared) < min(len(a), len(b)):
        sys.exit(f"{base} and {press}: windows {set(range(min(len(a), len(b)))) - set(shared)} have other ids")
    rows = [r for run in (base, press) for r in csv.DictReader(open(os.path.join(run, "e2e.csv")))]
    done = defaultdict(set)
    for r in rows:
        if r["mode"] == "decode":
            done[(r["method"], int(r["d"]))].add(int(r["window"]))
    windows = set(shared)
    for key, ws in done.items():
        if key[0].endswith("_press"):
            windows &= ws
    out = defaultdict(list)
    for r in rows:
        if r["mode"] == "decode" and int(r["window"]) in windows:
            out[(r["method"], int(r["d"]))].append(float(r["kl_mean"]))
    return {k: sum(v) / len(v) for k, v in out.items() if len(v) == len(windows)}, len(windows)


def unions(pattern):
    """{(method, d): mean kv_union over the rows of the sweeps matching `pattern` (one per layer)}."""
    acc = defaultdict(list)
    for run in sorted(glob.glob(pattern)):
        for r in csv.DictReader(open(os.path.join(run, "trials.csv"))):
            if r["kv_union"]:
                acc[(r["method"], int(r["d"]))].append(float(r["kv_union"]))
    return {k: sum(v) / len(v) for k, v in acc.items()}


def table():
    lines = []
    for model, (base, press, union_run) in MODELS.items():
        if not os.path.exists(os.path.join(press, "e2e.csv")):
            continue
        kl, nw = kl_means(base, press)
        un = unions(union_run)
        lines.append(f"**{model}** (mean KL over {nw} windows of n = 2048, n_f = 256; stored = prompt keys a K/V head holds)")
        lines.append("")
        lines.append("| kvpress form (stores d) | KL d=64 | KL d=256 | KL d=384 | §9 form (its rule) | stored d=64 | stored d=256 | KL d=64 | KL d=256 |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for p, ours in PAIRS:
            left = [f"`{p}`" if p else ""] + [fmt(kl.get((p, d))) if p else "" for d in (64, 256, 384)]
            if ours:
                rule = "per query head" if ours in PER_QUERY else ("per query" if ours == "topk_dec" else "per layer")
                stored = [fmt(un.get((ours, d))) if ours in PER_QUERY else str(d) for d in DS]
                if ours == "topk_dec":
                    stored = ["all", "all"]
                right = [f"`{ours}` ({rule})", *stored, fmt(kl.get((ours, 64))), fmt(kl.get((ours, 256)))]
            else:
                right = ["", "", "", "", ""]
            lines.append("| " + " | ".join(left + right) + " |")
        lines.append("")
    return "\n".join(lines)


def main():
    text = table()
    print(text)
    if "--write" in sys.argv:
        path = "docs/reproductions.md"
        doc = open(path).read()
        new, n = re.subn(r"<!-- kvpress-table -->.*<!-- /kvpress-table -->",
                         "<!-- kvpress-table -->\n" + text + "\n<!-- /kvpress-table -->", doc, flags=re.S)
        if n != 1:
            sys.exit(f"{path}: no <!-- kvpress-table --> block")
        open(path, "w").write(new)


if __name__ == "__main__":
    main()
