"""Compares the trials of a device run with a reference run (the committed CPU run, or the CPU
step of scripts/gpu-check.sh), trial by trial: per method, the median and worst relative
difference of `error` and how many trials differ by more than 1e-4, and the worst relative
difference of the target's `exact_norm`. Trials are matched on (n, window, head, method, d); a
trial in one file only is counted, not compared.

usage: python3 scripts/gpu-compare.py DEVICE_TRIALS.csv[.gz] REFERENCE_TRIALS.csv[.gz]
"""
import csv
import gzip
import statistics
import sys


def rows(path):
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return {(r["n"], r["window"], r["head"], r["method"], r["d"]): r for r in csv.DictReader(f)}


def rel(a, b):
    a, b = float(a), float(b)
    return abs(a - b) / max(abs(b), 1e-300) if a != b else 0.0


dev, ref = rows(sys.argv[1]), rows(sys.argv[2])
common = sorted(set(dev) & set(ref))
print(f"{len(common)} trials in both; {len(set(dev) - set(ref))} only in {sys.argv[1]}, "
      f"{len(set(ref) - set(dev))} only in {sys.argv[2]}")
by_method = {}
norms = []
for key in common:
    by_method.setdefault(key[3], []).append((rel(dev[key]["error"], ref[key]["error"]), key))
    norms.append(rel(dev[key]["exact_norm"], ref[key]["exact_norm"]))
print(f"{'method':<20} {'trials':>7} {'median':>9} {'worst':>9} {'>1e-4':>6}  worst trial (n, window, head, d)")
for m, ds in sorted(by_method.items()):
    vals = [d for d, _ in ds]
    worst = max(ds)
    print(f"{m:<20} {len(ds):>7} {statistics.median(vals):>9.1e} {worst[0]:>9.1e} "
          f"{sum(v > 1e-4 for v in vals):>6}  {worst[1][0]}, {worst[1][1]}, {worst[1][2]}, {worst[1][4]}")
if norms:
    print(f"exact_norm: worst {max(norms):.1e} over {len(norms)} trials")
