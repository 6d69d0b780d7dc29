#!/usr/bin/env python3
"""Scores each calibration variant against the initialized anchors of both Figure 1s.

level: weighted median |ln(mean/anchor)| (Informer and V-Mean ×3, approximate anchors ×½) —
       the `approx-bench anchors` score.
shape: the same statistic after dividing every value by its panel's V-Mean (ours by our V-Mean,
       the anchors by the published V-Mean), so that only the curves' shapes relative to the
       flat baseline count; V-Mean itself is excluded.
Usage: python3 results/calibration/analyze.py results/calibration/*/  (reads summary.csv and the
anchor table printed by `approx-bench anchors`).
"""
import csv, math, subprocess, sys, os

BIN = os.environ.get("BIN", "./target/release/approx-bench")

def anchors(run):
    out = subprocess.run([BIN, "anchors", "--from", run, "--model", "initialized"], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        c = [x.strip() for x in line.strip("|").split("|")]
        if len(c) != 7 or c[0] in ("figure", "---"):
            continue
        n = int(c[1].split("n=")[1]); pub = float(c[4].lstrip("≈")); mean = float(c[5].split("±")[0])
        rows.append(dict(fig=c[0], n=n, method=c[2], d=int(c[3]), pub=pub, approx=c[4].startswith("≈"), mean=mean))
    return rows

def wmedian(pairs):
    pairs = sorted(pairs)
    tot = sum(w for _, w in pairs); acc = 0
    for v, w in pairs:
        acc += w
        if acc >= tot / 2:
            return v

def scores(run):
    rows = anchors(run)
    weight = lambda r: (3 if r["method"] in ("informer", "vmean") else 1) * (0.5 if r["approx"] else 1)
    level = wmedian([(abs(math.log(r["mean"] / r["pub"])), weight(r)) for r in rows])
    vm_ours = {int(r["n"]): float(r["mean"]) for r in csv.DictReader(open(os.path.join(run, "summary.csv")))
               if r["method"] == "vmean" and r["model"] == "initialized"}
    vm_pub = {r["n"]: r["pub"] for r in rows if r["method"] == "vmean" and r["d"] == 16}
    # n = 512, 2048 have no V-Mean anchor; METHODS.md §4.3: V-Mean ≈ Nyströmformer at d = 16.
    for r in rows:
        if r["method"] == "nystromformer" and r["d"] == 16:
            vm_pub.setdefault(r["n"], r["pub"])
    shape = wmedian([(abs(math.log((r["mean"] / vm_ours[r["n"]]) / (r["pub"] / vm_pub[r["n"]]))), weight(r))
                     for r in rows if r["method"] != "vmean" and r["n"] in vm_ours and r["n"] in vm_pub])
    per_n = {n: vm_ours[n] / vm_pub[n] for n in sorted(vm_ours) if n in vm_pub}
    return level, shape, per_n

print("| variant | level score (×) | shape score (×) | V-Mean ours/published per n |")
print("|---|---|---|---|")
for run in sys.argv[1:]:
    level, shape, per_n = scores(run)
    name = os.path.basename(run.rstrip("/"))
    print(f"| {name} | {level:.3f} (×{math.exp(level):.2f}) | {shape:.3f} (×{math.exp(shape):.2f}) | "
          + ", ".join(f"n={n}: {v:.2f}" for n, v in per_n.items()) + " |")
