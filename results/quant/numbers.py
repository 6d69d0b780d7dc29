#!/usr/bin/env python3
"""The quantized-attention reproduction's documented numbers, from the runs in results/quant (the §8
methods) and results/decoder (the sparse methods on the same windows and heads).

Prints the markdown table of docs/reproductions.md ("Quantized attention") and the README's sentences,
each number a mean over every trial of its point (error = ‖O − Ô‖₂; kv_read = the K/V bytes read
relative to dense f16 attention, METHODS.md §8.5; for a sparse method keys/((n + 1)/2)). With --write,
rewrites both in place between the markers <!-- quant-numbers --> and <!-- /quant-numbers --> of
README.md and docs/reproductions.md. Run from the repository root after a shard is merged (run.sh).
Standard library only.
"""
import collections
import csv
import json
import re
import sys

Q, D = "results/quant", "results/decoder"
RUNS = [("smollm2-l0", "SmolLM2 layer 0"), ("smollm2-l15", "SmolLM2 layer 15"),
        ("llama-1b-init", "initialized Llama-3.2-1B-shaped")]
LENGTHS = [2048, 8192]
QUANT = ["kv_f16", "kv_bf16", "kv_fp8", "kv_q8_0", "kv_q5_1", "kv_q5_0", "kv_q4_1", "kv_q4_0",
         "kivi4", "kivi2", "sage1", "sage2_8b", "sage2_4b"]
SPARSE = ["window", "streaming", "quest", "xattention"]  # efficient ones; topk is the oracle
EIGHT_BIT = ["kv_fp8", "kv_q8_0", "sage2_8b"]  # kv_read 0.50–0.53
FOUR_BIT = ["kv_q4_1", "kv_q4_0", "kivi4", "kivi2"]  # kv_read 0.21–0.34
ORACLE = "topk"


def points(path, keep, windows=None):
    """(method, d) → (mean error, mean kv_read or None, mean cos_sim or None, trials) over the run's
    trials of the methods in `keep` (and of `windows` only, if given); {} if the run is absent."""
    acc = collections.defaultdict(list)
    try:
        f = open(f"{path}/trials.csv")
    except FileNotFoundError:
        return {}
    with f:
        for r in csv.DictReader(f):
            if r["method"] not in keep or (windows is not None and int(r["window"]) not in windows):
                continue
            n = int(r["n"])
            read = float(r["kv_read"]) if r.get("kv_read") else (
                float(r["keys"]) / ((n + 1) / 2) if r.get("keys") else None)
            cos = float(r["cos_sim"]) if r.get("cos_sim") else None
            acc[(r["method"], int(r["d"]))].append((float(r["error"]), read, cos))
    mean = lambda xs: sum(xs) / len(xs) if xs and None not in xs else None
    return {k: (mean([e for e, _, _ in v]), mean([x for _, x, _ in v]), mean([c for _, _, c in v]), len(v))
            for k, v in acc.items()}


def windows_of(path):
    with open(f"{path}/trials.csv") as f:
        return {int(r["window"]) for r in csv.DictReader(f)}


def shards_of(path):
    try:
        m = json.load(open(f"{path}/manifest.json"))
    except FileNotFoundError:
        return []
    parts = m.get("merged_from") or [m]
    return sorted(p["shard"]["index"] for p in parts if p.get("shard"))


def facts():
    """Per (run, n) with data: the §8 points, the best 8-bit-class and 4-bit-class formats, and the
    best sparse points at no more traffic than the best 4-bit-class format."""
    out = []
    for run, label in RUNS:
        for n in LENGTHS:
            q = points(f"{Q}/{run}-n{n}", set(QUANT))
            if not q:
                continue
            # The sparse methods on the same windows as the §8 trials (results/decoder has all of them).
            s = points(f"{D}/{run}-n{n}", set(SPARSE + [ORACLE]), windows_of(f"{Q}/{run}-n{n}"))
            quant = {m: q[(m, 0)] for m in QUANT if (m, 0) in q}
            best = lambda ms: min((m for m in ms if m in quant), key=lambda m: quant[m][0])
            q8, q4 = best(EIGHT_BIT), best(FOUR_BIT)
            budget = quant[q4][1]
            # The best efficient sparse point and the oracle at no more traffic than that format.
            near = lambda keep: min(((e, m, d, x) for (m, d), (e, x, _, _) in s.items()
                                     if m in keep and x is not None and x <= budget), default=None)
            out.append(dict(run=run, label=label, n=n, quant=quant, q4=q4, q8=q8,
                            sparse=near(SPARSE), oracle=near([ORACLE]),
                            trials=quant[q4][3], shards=shards_of(f"{Q}/{run}-n{n}")))
    return out


def g(x):
    return f"{x:.3g}"


def table(fs):
    lines = ["| model, n | " + " | ".join(f"`{m}`" for m in QUANT) + " | best sparse at ≤ the 4-bit traffic | top-k oracle there |",
             "|---|" + "---|" * (len(QUANT) + 2)]
    for f in fs:
        cells = [f"{g(f['quant'][m][0])}" if m in f["quant"] else "–" for m in QUANT]
        sp = f["sparse"]
        sp_cell = f"`{sp[1]}` d = {sp[2]}: {g(sp[0])} ({sp[3]:.2f})" if sp else "–"
        o = f["oracle"]
        o_cell = f"d = {o[2]}: {g(o[0])} ({o[3]:.2f})" if o else "–"
        lines.append(f"| {f['label']}, {f['n']} | " + " | ".join(cells) + f" | {sp_cell} | {o_cell} |")
    reads = " · ".join(f"`{m}` {next(iter(fs))['quant'][m][1]:.2f}" for m in QUANT if m in fs[0]["quant"])
    return "\n".join(lines) + f"\n\nkv_read of each §8 method (n = {fs[0]['n']}): {reads}.\n"


def span(xs):
    xs = sorted(xs)
    return str(xs[0]) if len(xs) == 1 else f"{xs[0]}–{xs[-1]}" if xs == list(range(xs[0], xs[-1] + 1)) else ", ".join(map(str, xs))


def sentences(fs):
    N = len(fs)
    top8 = collections.Counter(f["q8"] for f in fs).most_common(1)[0][0]
    top4 = collections.Counter(f["q4"] for f in fs).most_common(1)[0][0]
    k8, k4 = sum(f["q8"] == top8 for f in fs), sum(f["q4"] == top4 for f in fs)
    where = lambda fl: "; ".join(
        f"{f['label']} at n = {f['n']}: `{f['sparse'][1]}` (d = {f['sparse'][2]}) {g(f['sparse'][0])} "
        f"against `{f['q4']}`'s {g(f['quant'][f['q4']][0])}" for f in fl)
    wins = [f for f in fs if f["sparse"] and f["sparse"][0] < f["quant"][f["q4"]][0]]
    loses = [f for f in fs if f["sparse"] and f not in wins]
    oracle_wins = [f for f in fs if f["oracle"] and f["oracle"][0] < f["quant"][f["q4"]][0]]
    s1 = (f"Of the caches and kernels that read half of dense f16 attention's K/V bytes (`kv_read` "
          f"0.50–0.53: `kv_fp8`, `kv_q8_0`, `sage2_8b`), `{top8}` loses least in {k8} of {N} runs; of "
          f"those that read a third or less (`kv_q4_1`, `kv_q4_0`, `kivi4`, `kivi2`), `{top4}` in {k4} of {N}.")
    if wins:
        s2 = (f" An efficient sparse method beats the best of those 4-bit formats at no more traffic only in "
              f"{where(wins)}")
    else:
        s2 = " No efficient sparse method beats the best 4-bit format at no more traffic"
    if oracle_wins:
        s2 += (f"; the top-k oracle does in {len(oracle_wins)} of {N} runs (e.g. "
               f"{oracle_wins[0]['label']} at n = {oracle_wins[0]['n']}: {g(oracle_wins[0]['oracle'][0])})")
    s2 += "."
    s3 = (f" Elsewhere the 4-bit cache wins ({where(loses[:2])}{'; …' if len(loses) > 2 else ''})."
          if loses else "")
    complete = all(len(f["shards"]) == 16 for f in fs)
    shards = sorted({i for f in fs for i in f["shards"]})
    state = ("all 16 shards" if complete else
             f"shard{'s' if len(shards) > 1 else ''} {span(shards)} of 16 so far, "
             f"{min(f['trials'] for f in fs)}–{max(f['trials'] for f in fs)} trials per point")
    return f"{s1}{s2}{s3} ({state}; [the numbers](docs/reproductions.md#quantized-attention).)"


def replace(path, text):
    src = open(path).read()
    pat = re.compile(r"(<!-- quant-numbers -->\n).*?(\n<!-- /quant-numbers -->)", re.S)
    if not pat.search(src):
        sys.exit(f"{path}: no <!-- quant-numbers --> block")
    open(path, "w").write(pat.sub(lambda m: m.group(1) + text + m.group(2), src))


def main():
    fs = facts()
    if not fs:
        sys.exit("no quantized run in results/quant yet")
    t, s = table(fs), sentences(fs)
    print(t)
    print(s)
    if "--write" in sys.argv:
        # The README holds a hand-written takeaway of a few sentences (issue 43); the numbers
        # live in docs/reproductions.md only.
        replace("docs/reproductions.md", t.rstrip("\n"))


if __name__ == "__main__":
    main()
