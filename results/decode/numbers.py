#!/usr/bin/env python3
"""The decode-time KV-cache compression reproduction's documented numbers, from the runs in
results/decode (METHODS.md §9: the continuation protocol, n_f = 256).

Prints the markdown tables of docs/reproductions.md ("Decode-time KV-cache compression") and the README's
sentences, each number a mean over every trial of its point (error = ‖O_F − Ô_F‖₂ over the continuation
rows; kv_read = the continuation's K/V bytes read relative to dense f16, METHODS.md §9.1). Points with
d ≥ n_p = n − n_f are exact and left out; the SnapKV-scored methods at d ≤ 32 are dec_window's fallback
(METHODS.md §9.2) and are left out of every "best method" comparison. With --write, rewrites both in
place between the markers <!-- decode-numbers --> and <!-- /decode-numbers --> of README.md and
docs/reproductions.md (inserting the blocks after the quantized-attention ones the first time). Works on
whatever runs and shards are merged so far, and on none. Run from the repository root after a shard is
merged (run.sh), or name the root with --root DIR. Standard library only.
"""
import argparse
import collections
import csv
import json
import os
import re
import sys

DIR = "results/decode"
RUNS = [("smollm2-l15", "SmolLM2 layer 15"), ("smollm2-l0", "SmolLM2 layer 0"),
        ("llama-1b-init", "initialized Llama-3.2-1B-shaped")]
# What each run's heads are, for the README (METHODS.md §9.3).
SETTING = {"smollm2-l15": "sink heads (SmolLM2 layer 15)", "smollm2-l0": "local heads (SmolLM2 layer 0)",
           "llama-1b-init": "the initialized Llama-3.2-1B-shaped model"}
SHORT = {"smollm2-l15": "sink heads", "smollm2-l0": "local heads", "llama-1b-init": "the initialized model"}
LENGTHS = [2048, 8192]
SHARDS = 16
EFFICIENT = ["dec_window", "dec_streaming", "snapkv", "snapkv_avg5", "pyramidkv", "adakv", "h2o_dec",
             "tova", "quest_dec"]
ORACLES = ["topk_dec", "evict_oracle"]
CACHES = ["kv_q4_0", "kivi2", "kv_q8_0"]
SNAP = {"snapkv", "snapkv_avg5", "pyramidkv", "adakv"}  # at d ≤ SNAP_W: dec_window's fallback
SNAP_W = 32
BUDGETS = [64, 256, 1024]
N_F = 256
FIGURE = "results/decode/decode.png"
IMAGE = "![Decode-time KV-cache compression]({})"
INTRO = ("Decode-time KV-cache compression on the same axis (`--decode 256`: the prompt's cache compressed "
         "once by\nSnapKV, PyramidKV, Ada-KV, H2O, TOVA or StreamingLLM, or read by Quest's pages, against "
         "the eviction and\ntop-k oracles and the `kv_q8_0`, `kv_q4_0`, `kivi2` caches; `results/decode/`, "
         "METHODS.md §9):")
DOCS_INTRO = (
    "`results/decode/` (`results/decode/run.sh`, issue 35, METHODS.md §9): the §9 methods under the\n"
    "continuation protocol (n_f = 256: the error of the 256 rows after the prompt, each reading the\n"
    "compressed prompt cache) on the decoder reproduction's models, lengths and windows. Mean\n"
    "‖O_F − Ô_F‖₂ per method at d = 64, 256 and 1024 prompt keys kept per query head (in bold the\n"
    "efficient method with the least error; `pyramidkv` and `adakv` redistribute the budget, so their\n"
    "`kv_read` differs), then the `kv_q4_0`, `kivi2` and `kv_q8_0` caches against the best efficient\n"
    "method at no more `kv_read` and the least `kv_read` at which one matches the cache, from\n"
    "`python3 results/decode/numbers.py`:")


def points(path):
    """(method, d) → (mean error, mean kv_read, trials) over the run's non-exact trials, and the
    run's n; ({}, None) if the run is absent."""
    acc = collections.defaultdict(list)
    n = None
    try:
        f = open(f"{path}/trials.csv")
    except FileNotFoundError:
        return {}, None
    with f:
        for r in csv.DictReader(f):
            m, d, n = r["method"], int(r["d"]), int(r["n"])
            if m not in EFFICIENT + ORACLES + CACHES:
                continue
            n_p = n - (int(r["n_f"]) if r.get("n_f") else N_F)
            if d >= n_p:  # keeps every prompt key: exact
                continue
            acc[(m, d)].append((float(r["error"]), float(r["kv_read"])))
    mean = lambda xs: sum(xs) / len(xs)
    return {k: (mean([e for e, _ in v]), mean([x for _, x in v]), len(v)) for k, v in acc.items()}, n


def shards_of(path):
    """The shard indices merged into the run; None for an unsharded run."""
    try:
        m = json.load(open(f"{path}/manifest.json"))
    except FileNotFoundError:
        return []
    parts = m.get("merged_from") or [m]
    if not any(p.get("shard") for p in parts):
        return None
    return sorted(p["shard"]["index"] for p in parts if p.get("shard"))


def fallback(m, d):
    return m in SNAP and d <= SNAP_W


def facts(root):
    """Per run with data: its points, the best efficient method at each budget with its ratios to
    the oracles, and per cache the best efficient point at no more traffic and the least traffic at
    which an efficient point matches it."""
    out = []
    for run, label in RUNS:
        for n in LENGTHS:
            path = f"{root}/{DIR}/{run}-n{n}"
            pts, n_run = points(path)
            if not pts:
                continue
            eff = [(e, m, d, x) for (m, d), (e, x, _) in pts.items()
                   if m in EFFICIENT and d > 0 and not fallback(m, d)]
            best = {}
            for d in BUDGETS:
                here = [(e, m) for e, m, dd, _ in eff if dd == d]
                if not here:
                    continue
                e, m = min(here)
                ratio = lambda o: e / pts[(o, d)][0] if (o, d) in pts and pts[(o, d)][0] > 0 else None
                best[d] = dict(method=m, error=e, evict=ratio("evict_oracle"), topk=ratio("topk_dec"))
            caches = {}
            for c in CACHES:
                if (c, 0) not in pts:
                    continue
                ce, cx, _ = pts[(c, 0)]
                under = min(((e, m, d, x) for e, m, d, x in eff if x <= cx), default=None)
                match = min(((x, m, d, e) for e, m, d, x in eff if e <= ce), default=None)
                caches[c] = dict(error=ce, read=cx, under=under, match=match,
                                 top_d=max((d for _, _, d, _ in eff), default=None))
            counts = [t for _, _, t in pts.values()]
            out.append(dict(run=run, label=label, n=n_run or n, pts=pts, best=best, caches=caches,
                            trials=(min(counts), max(counts)), shards=shards_of(path)))
    return out


def g(x):
    return f"{x:.3g}"


def two(x):
    return f"{x:.2g}"


def rng(xs, fmt=two):
    lo, hi = fmt(min(xs)), fmt(max(xs))
    return lo if lo == hi else f"{lo}–{hi}"


def per_point(f):
    lo, hi = f["trials"]
    return str(lo) if lo == hi else f"{lo}–{hi}"


def header():
    cols = EFFICIENT + ORACLES
    return ["| model, n | d | " + " | ".join(f"`{m}`" for m in cols) + " | `kv_read` of `dec_window` | trials per point |",
            "|---|---|" + "---|" * (len(cols) + 2)]


def table(fs):
    cols = EFFICIENT + ORACLES
    lines = header()
    for f in fs:
        for d in BUDGETS:
            if d not in f["best"]:
                continue
            cells = []
            for m in cols:
                p = f["pts"].get((m, d))
                cell = g(p[0]) if p else "–"
                cells.append(f"**{cell}**" if m == f["best"][d]["method"] else cell)
            w = f["pts"].get(("dec_window", d))
            read = f"{w[1]:.2f}" if w else "–"
            lines.append(f"| {f['label']}, {f['n']} | {d} | " + " | ".join(cells) + f" | {read} | {per_point(f)} |")
    lines += ["", "| model, n | cache | `kv_read` | error | best efficient at ≤ its `kv_read` | "
              "least `kv_read` matching it | shards |", "|---|---|---|---|---|---|---|"]
    for f in fs:
        for c in CACHES:
            if c not in f["caches"]:
                continue
            k = f["caches"][c]
            u, m = k["under"], k["match"]
            u_cell = f"`{u[1]}` d = {u[2]}: {g(u[0])} ({u[3]:.2f})" if u else "–"
            m_cell = (f"{m[0]:.2f} (`{m[1]}` d = {m[2]}: {g(m[3])})" if m
                      else f"none up to d = {k['top_d']}")
            lines.append(f"| {f['label']}, {f['n']} | `{c}` | {k['read']:.2f} | {g(k['error'])} | "
                         f"{u_cell} | {m_cell} | {shard_cell(f)} |")
    return "\n".join(lines) + "\n"


def empty_table():
    return "\n".join(header()) + "\n\nNo run is merged yet: `results/decode/run.sh` is computing them, shard by shard.\n"


def span(xs):
    xs = sorted(xs)
    return str(xs[0]) if len(xs) == 1 else f"{xs[0]}–{xs[-1]}" if xs == list(range(xs[0], xs[-1] + 1)) else ", ".join(map(str, xs))


def shard_cell(f):
    s = f["shards"]
    return ("unsharded" if s is None else f"all {SHARDS}" if len(s) == SHARDS else
            f"{span(s)} of {SHARDS}" if s else "–")


def backing(fs):
    """What backs a statement about the runs fs: their shards and trials per point."""
    lo, hi = min(f["trials"][0] for f in fs), max(f["trials"][1] for f in fs)
    trials = f"{lo} trial{'s' if hi > 1 else ''} per point" if lo == hi else f"{lo}–{hi} trials per point"
    sets = [f["shards"] for f in fs]
    if all(s is None for s in sets):
        return f"{'one unsharded run' if len(fs) == 1 else f'{len(fs)} unsharded runs'}, {trials}"
    sets = [s or [] for s in sets]
    if all(len(s) == SHARDS for s in sets):
        state = f"all {SHARDS} shards"
    elif all(s == sets[0] for s in sets):
        state = f"shard{'s' if len(sets[0]) > 1 else ''} {span(sets[0])} of {SHARDS} so far"
    else:
        state = f"between {min(map(len, sets))} and {max(map(len, sets))} of {SHARDS} shards so far"
    return f"{state}, {trials}"


def listing(xs):
    xs = list(map(str, xs))
    return xs[0] if len(xs) == 1 else f"{', '.join(xs[:-1])} and {xs[-1]}"


def ds(xs):
    return f"d = {listing(sorted(xs))}"


def ns(xs):
    return f"n = {listing(sorted(xs))}"


def where(pairs):
    """(n, d) pairs as "d = 64 and 256 at n = 2048, d = 1024 at n = 8192" (n's with the same d's merged)."""
    by_n = collections.defaultdict(set)
    for n, d in pairs:
        by_n[n].add(d)
    groups = collections.defaultdict(list)
    for n in sorted(by_n):
        groups[tuple(sorted(by_n[n]))].append(n)
    return ", ".join(f"{ds(d)} ({ns(n)})" for d, n in groups.items())


def runs_phrase(fl, every):
    """Runs as "sink heads at n = 2048 and 8192, local heads at n = 2048"; "every run" if fl is every."""
    if len(fl) == len(every) and len(every) > 1:
        return "every run"
    by = collections.defaultdict(list)
    for f in fl:
        by[f["run"]].append(f["n"])
    groups = collections.defaultdict(list)
    for run, n in by.items():
        groups[tuple(sorted(n))].append(SHORT[run])
    return ", ".join(f"{listing(names)} at {ns(n)}" for n, names in groups.items())


def sentences(fs):
    settings = [(run, [f for f in fs if f["run"] == run and f["best"]]) for run, _ in RUNS]
    settings = [(run, sub) for run, sub in settings if sub]
    used = [f for _, sub in settings for f in sub]
    out = []
    if settings:
        # (1) Which compression loses least, per setting.
        parts = []
        for run, sub in settings:
            wins = collections.defaultdict(list)
            for f in sub:
                for d, b in f["best"].items():
                    wins[b["method"]].append((f["n"], d))
            order = sorted(wins, key=lambda m: (-len(wins[m]), EFFICIENT.index(m)))
            parts.append(f"on {SETTING[run]} `{order[0]}` loses least at {where(wins[order[0]])}" +
                         "".join(f", `{m}` at {where(wins[m])}" for m in order[1:]))
        out.append(f"Of the efficient §9 methods, {'; '.join(parts)} ({backing(used)}).")
        # (2) How far the best one is from the oracles at the same d.
        parts = []
        for run, sub in settings:
            bs = [b for f in sub for b in f["best"].values()]
            ev = [b["evict"] for b in bs if b["evict"] is not None]
            tk = [b["topk"] for b in bs if b["topk"] is not None]
            if not ev or not tk:
                continue
            below = ("below both oracles" if max(ev) < 1 and max(tk) < 1 else
                     "below `evict_oracle`" if max(ev) < 1 else "")
            if not parts:
                q = f"{rng(ev)}× `evict_oracle`'s error and {rng(tk)}× `topk_dec`'s on {SHORT[run]}"
            else:
                q = f"{rng(ev)}× and {rng(tk)}× on {SHORT[run]}"
            parts.append(q + (f", {below}" if below else ""))
        if parts:
            out.append(f"Against the oracles at the same d ({', '.join(map(str, sorted({d for f in used for d in f['best']})))}), "
                       f"the best of them has {'; '.join(parts)} ({backing(used)}).")
    # (3) Where a quantized cache beats eviction at equal traffic.
    with_caches = [f for f in fs if f["caches"]]
    if with_caches:
        parts = []
        for c in CACHES:
            fl = [f for f in with_caches if c in f["caches"]]
            if not fl:
                continue
            k = lambda f: f["caches"][c]
            reads = rng([k(f)["read"] for f in fl], lambda x: f"{x:.2f}")
            won = [f for f in fl if not k(f)["under"] or k(f)["under"][0] > k(f)["error"]]
            lost = [f for f in fl if f not in won]
            p = f"`{c}` (`kv_read` {reads})"
            if won:
                p += f" beats every efficient method on {runs_phrase(won, fl)}"
                found = [f for f in won if k(f)["match"]]
                none = [f for f in won if not k(f)["match"]]
                how = []
                if found:
                    x = min(found, key=lambda f: k(f)["match"])
                    m = k(x)["match"]
                    how.append(f"eviction first matching it at `kv_read` {rng([k(f)['match'][0] for f in found], lambda v: f'{v:.2f}')}"
                               + (f" on {runs_phrase(found, won)}" if none else "")
                               + f" (`{m[1]}` d = {m[2]}" + (f", {SHORT[x['run']]} at n = {x['n']})" if len(found) > 1 else ")"))
                if none:
                    how.append(f"unmatched up to d = {'/'.join(map(str, sorted({k(f)['top_d'] for f in none})))}"
                               + (f" on {runs_phrase(none, won)}" if found else ""))
                p += ", " + " and ".join(how)
            if lost:
                x = max(lost, key=lambda f: k(f)["error"] / k(f)["under"][0])
                u = k(x)["under"]
                eg = f"`{u[1]}` d = {u[2]}: {g(u[0])} at `kv_read` {u[3]:.2f} against {g(k(x)['error'])}"
                if len(lost) > 1:
                    eg = f"on {SHORT[x['run']]} at n = {x['n']}, {eg}"
                p += (f", and loses on {runs_phrase(lost, fl)} ({eg})" if won else
                      f" loses to eviction on {runs_phrase(lost, fl)} ({eg})")
            parts.append(p)
        out.append(f"At no more K/V traffic than the cache's, {'; '.join(parts)} ({backing(with_caches)}; "
                   f"[the numbers](docs/reproductions.md#decode-time-kv-cache-compression)).")
    return " ".join(out)


NO_RUN = ("The decode-time KV-cache compression reproduction (`results/decode/run.sh`, METHODS.md §9) is "
          f"being computed: none of its {SHARDS} shards is merged yet, and its numbers appear here as they are.")


def block(src, text, image, image_first):
    """src with its decode block (and the figure line beside it) rewritten to text, the figure line
    kept only if `image` is given; without a block: (None, the block to insert)."""
    pat = re.compile(r"(?:!\[Decode-time KV-cache compression\]\([^)]*\)\n\n)?"
                     r"<!-- decode-numbers -->\n.*?\n<!-- /decode-numbers -->"
                     r"(?:\n\n!\[Decode-time KV-cache compression\]\([^)]*\))?", re.S)
    body = f"<!-- decode-numbers -->\n{text}\n<!-- /decode-numbers -->"
    if image:
        body = f"{image}\n\n{body}" if image_first else f"{body}\n\n{image}"
    if pat.search(src):
        return pat.sub(lambda _: body, src, count=1), None
    return None, body


def insert(path, src, at, text, before=False):
    """src with text inserted after the first line `at` (before it, if `before`)."""
    found = re.search(rf"^{re.escape(at)}$", src, re.M)
    if not found:
        sys.exit(f"{path}: neither a <!-- decode-numbers --> block nor a line {at!r} to put one beside")
    i = found.start() if before else found.end()
    return src[:i] + text + src[i:]


def write_docs(root, text, figure):
    path = f"{root}/docs/reproductions.md"
    src = open(path).read()
    image = IMAGE.format("../" + FIGURE) if figure else None
    new, body = block(src, text, image, False)
    if new is None:
        new = insert(path, src, "## More", f"## Decode-time KV-cache compression\n\n{DOCS_INTRO}\n\n{body}\n\n", True)
    open(path, "w").write(new)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."),
                    help="the repository root (default: this script's)")
    ap.add_argument("--write", action="store_true",
                    help="rewrite the block of docs/reproductions.md under the root")
    a = ap.parse_args()
    root = os.path.normpath(a.root)
    fs = facts(root)
    figure = os.path.exists(f"{root}/{FIGURE}")
    if fs:
        t, s = table(fs), sentences(fs)
    else:
        print(f"no decode run in {root}/{DIR} yet (results/decode/run.sh merges them shard by shard)")
        t, s = empty_table(), NO_RUN
    print(t)
    print(s)
    if a.write:
        # The README holds a hand-written takeaway of a few sentences (issue 43); the numbers
        # live in docs/reproductions.md only.
        write_docs(root, t.rstrip("\n"), figure and bool(fs))


if __name__ == "__main__":
    main()
