#!/usr/bin/env python3
"""The end-to-end reproduction's numbers (issue 43): from results/e2e/<run>/e2e.csv and summary.csv, the
markdown tables of docs/reproductions.md ("End to end"): per (mode, method, d) the means over windows of
kv_read, kl_mean, top1, dnll and the layer-mean operator errors, then the correlation table. With --write,
rewrites them between <!-- e2e-numbers --> and <!-- /e2e-numbers --> of docs/reproductions.md. Run from the
repository root."""

import csv
import re
import sys
from collections import defaultdict

RUN = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else "results/e2e/smollm2-n2048"


def fmt(x):
    x = float(x)
    if x != x:
        return "–"
    if x == 0:
        return "0"
    return f"{x:.3g}" if abs(x) >= 1e-3 else f"{x:.2e}"


def points():
    rows = list(csv.DictReader(open(f"{RUN}/e2e.csv")))
    by = defaultdict(list)
    for r in rows:
        by[(r["mode"], r["method"], int(r["d"]))].append(r)
    windows = sorted({int(r["window"]) for r in rows})
    return by, windows, rows[0]["n"], rows[0]["n_f"]


def table():
    by, windows, n, n_f = points()
    cols = ["kv_read", "kl_mean", "top1", "dnll", "op_err_mean", "op_1mcos_mean", "one_layer_err_l0",
            f"one_layer_err_l15"]
    out = [f"SmolLM2-135M-Instruct (Q4_1 GGUF), n = {n}, n_f = {n_f}, windows {windows[0]}–{windows[-1]} of "
           f"wiki.test.raw, f32; means over the {len(windows)} windows:", "",
           "| mode | method | d | " + " | ".join(f"`{c}`" for c in cols) + " |",
           "|---|---|---|" + "---|" * len(cols)]
    order = {"prefill": 0, "decode": 1}
    for (mode, method, d), rs in sorted(by.items(), key=lambda kv: (order[kv[0][0]], kv[0][2] == 0, kv[0][1], kv[0][2])):
        vals = [sum(float(r[c]) for r in rs) / len(rs) for c in cols]
        out.append(f"| {mode} | `{method}` | {d} | " + " | ".join(fmt(v) for v in vals) + " |")
    out += ["", "Spearman ρ between `kl_mean` and each operator metric over the (mode, method, d) points "
            "(summary.csv; 95 % bootstrap interval over windows):", "",
            "| subset | predictor | points | ρ | interval |", "|---|---|---|---|---|"]
    for r in csv.DictReader(open(f"{RUN}/summary.csv")):
        out.append(f"| {r['subset']} | `{r['predictor']}` | {r['points']} | {fmt(r['spearman'])} | "
                   f"{fmt(r['ci_low'])} – {fmt(r['ci_high'])} |")
    return "\n".join(out)


def main():
    t = table()
    print(t)
    if "--write" in sys.argv:
        path = "docs/reproductions.md"
        src = open(path).read()
        pat = re.compile(r"(<!-- e2e-numbers -->\n)(?:.*?\n)?(<!-- /e2e-numbers -->)", re.S)
        if not pat.search(src):
            sys.exit(f"{path}: no <!-- e2e-numbers --> block")
        open(path, "w").write(pat.sub(lambda m: m.group(1) + t + "\n" + m.group(2), src, count=1))


if __name__ == "__main__":
    main()
