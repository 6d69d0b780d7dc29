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
ORACLE = "topk"


def points(path, keep):
    """(method, d) → (mean error, mean kv_read or None, mean cos_sim or None, trials) over the run's
    trials of the methods in `keep`; {} if the run is absent."""
    acc = collections.defaultdict(list)
    try:
        f = open(f"{path}/trials.csv")
    except FileNotFoundError:
        return {}
    with f:
        for r in csv.DictReader(f):
            if r["method"] not in keep:
                continue
            n = int(r["n"])
            read = float(r["kv_read"]) if r.get("kv_read") else (
                float(r["keys"]) / ((n + 1) / 2) if r.get("keys") else None)
            cos = float(r["cos_sim"]) if r.get("cos_sim") else None
            acc[(r["method"], int(r["d"]))].append((float(r["error"]), read, cos))
    mean = lambda xs: sum(xs) / len(xs) if xs and None not in xs else None
    return {k: (mean([e for e, _, _ in v]), mean([x for _, x, _ in v]), mean([c for _, _, c in v]), len(v))
            for k, v in acc.items()}


def shards_of(path):
    try:
        m = json.load(open(f"{path}/manifest.json"))
    except FileNotFoundError:
        return []
    parts = m.get("merged_from") or [m]
    return sorted(p["shard"]["index"] for p in parts if p.get("shard"))


def facts():
    """Per (run, n) with data: the §8 points, the sparse points, the best of each class."""
    out = []
    for run, label in RUNS:
        for n in LENGTHS:
            q = points(f"{Q}/{run}-n{n}", set(QUANT))
            if not q:
                continue
            s = points(f"{D}/{run}-n{n}", set(SPARSE + [ORACLE]))
            quant = {m: q[(m, 0)] for m in QUANT if (m, 0) in q}
            q4 = min((m for m in quant if quant[m][1] <= 0.3), key=lambda m: quant[m][0])
            q8 = min((m for m in quant if quant[m][1] <= 0.55 and quant[m][1] > 0.3),
                     key=lambda m: quant[m][0])
            budget = quant[q4][1]
            # The best efficient sparse point at no more traffic than the best 4-bit format.
            cands = [(e, m, d, x) for (m, d), (e, x, _, _) in s.items()
                     if m in SPARSE and x is not None and x <= budget]
            best_sparse = min(cands) if cands else None
            oracle = [(e, d, x) for (m, d), (e, x, _, _) in s.items()
                      if m == ORACLE and x is not None and x <= budget]
            out.append(dict(run=run, label=label, n=n, quant=quant, q4=q4, q8=q8,
                            sparse=best_sparse, oracle=min(oracle) if oracle else None,
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
        o_cell = f"d = {o[1]}: {g(o[0])} ({o[2]:.2f})" if o else "–"
        lines.append(f"| {f['label']}, {f['n']} | " + " | ".join(cells) + f" | {sp_cell} | {o_cell} |")
    reads = " · ".join(f"`{m}` {next(iter(fs))['quant'][m][1]:.2f}" for m in QUANT if m in fs[0]["quant"])
    return "\n".join(lines) + f"\n\nkv_read of each §8 method (n = {fs[0]['n']}): {reads}.\n"


def sentences(fs):
    q4s = collections.Counter(f["q4"] for f in fs)
    q8s = collections.Counter(f["q8"] for f in fs)
    top4, top8 = q4s.most_common(1)[0][0], q8s.most_common(1)[0][0]
    wins = [f for f in fs if f["sparse"] and f["sparse"][0] < f["quant"][f["q4"]][0]]
    loses = [f for f in fs if f not in wins]
    where = lambda fl: ", ".join(f"{f['label']} at n = {f['n']}" for f in fl) or "none of the runs"
    s1 = (f"At about half of dense f16 attention's K/V traffic, `{top8}` loses least "
          f"({sum(1 for f in fs if f['q8'] == top8)} of {len(fs)} runs); at a quarter to a third "
          f"(`kv_read` ≤ 0.3), `{top4}` ({sum(1 for f in fs if f['q4'] == top4)} of {len(fs)}).")
    if wins:
        w = wins[0]
        s2 = (f"A sparse method beats the best 4-bit format at no more traffic on {where(wins)} "
              f"(e.g. `{w['sparse'][1]}` at d = {w['sparse'][2]}: {g(w['sparse'][0])} against "
              f"`{w['q4']}`'s {g(w['quant'][w['q4']][0])}),")
    else:
        s2 = "No efficient sparse method beats the best 4-bit format at equal traffic in any run,"
    if loses:
        l = loses[0]
        ratio = (l["sparse"][0] / l["quant"][l["q4"]][0]) if l["sparse"] else float("nan")
        s3 = (f" and the 4-bit format wins on {where(loses)} (e.g. `{l['q4']}` {g(l['quant'][l['q4']][0])} "
              f"against the best sparse method's {g(l['sparse'][0]) if l['sparse'] else '–'}, {ratio:.1f}×).")
    else:
        s3 = " everywhere."
    shards = sorted({tuple(f["shards"]) for f in fs})
    state = ("all 16 shards" if all(len(f["shards"]) == 16 for f in fs)
             else f"shards {', '.join('–'.join(map(str, (s[0], s[-1]))) if len(s) > 1 else str(s[0]) for s in shards)} of 16 so far, "
                  f"{min(f['trials'] for f in fs)}–{max(f['trials'] for f in fs)} trials per point")
    return f"{s1} {s2}{s3} ({state}; [the numbers](docs/reproductions.md#quantized-attention).)"


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
        replace("README.md", s)
        replace("docs/reproductions.md", t.rstrip("\n"))


if __name__ == "__main__":
    main()
