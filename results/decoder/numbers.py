#!/usr/bin/env python3
"""The decoder reproduction's documented numbers, from the merged runs in results/decoder.

Prints the markdown table of docs/reproductions.md ("Decoder attention") and the numbers the README
quotes, each a mean over every trial of its point (error = ‖O − Ô‖₂, mass = the attention mass the
visited keys carry). Checks the qualitative claims of the prose around them (which method is lowest, which
lies below V-Mean) and says which no longer hold. With --write, rewrites them in place in README.md and docs/reproductions.md:
the paragraph from "Committed so far:" to the table, the table, and the quoted numbers of the
README's three sentences. Run from the repository root after a shard is merged (run.sh).
Standard library only.
"""
import collections
import csv
import json
import re
import sys

R = "results/decoder"
SHARDS = 16
WINDOWS = {2048: 64, 8192: 36}  # run.sh's --windows (the corpus holds 36 windows of 8192)


def load(run):
    """(method, d) → [(error, mass or None)] over the run's trials."""
    acc = collections.defaultdict(list)
    with open(f"{R}/{run}/trials.csv") as f:
        for r in csv.DictReader(f):
            acc[(r["method"], int(r["d"]))].append(
                (float(r["error"]), float(r["mass"]) if r["mass"] else None)
            )
    return acc


def shards_of(run):
    """The shard indices merged into a run (sorted), [] if it has not run."""
    try:
        m = json.load(open(f"{R}/{run}/manifest.json"))
    except FileNotFoundError:
        return []
    parts = m.get("merged_from") or [m]
    return sorted(p["shard"]["index"] for p in parts if p.get("shard"))


def span(shards):
    """[1, 2, 3] → "1–3", [1] → "1", [1, 3] → "1, 3"."""
    if shards == list(range(shards[0], shards[-1] + 1)):
        return str(shards[0]) if len(shards) == 1 else f"{shards[0]}–{shards[-1]}"
    return ", ".join(map(str, shards))


def err(a, m, d):
    v = a[(m, d)]
    return sum(x for x, _ in v) / len(v)


def mass(a, m, d):
    v = [y for _, y in a[(m, d)]]
    return sum(v) / len(v)


def per_point(a):
    return len(a[("vmean", 16)])


def f1(x):
    return f"{x:.1f}"


def f2(x):
    return f"{x:.2f}" if x < 2 else f"{x:.1f}"


def cell(a, m, d, fe=f1):
    return f"{fe(err(a, m, d))} ({mass(a, m, d):.2f})"


def pair(a, m1, m2, d, fe=f1):
    e1, e2 = fe(err(a, m1, d)), fe(err(a, m2, d))
    x, y = f"{mass(a, m1, d):.2f}", f"{mass(a, m2, d):.2f}"
    e = e1 if e1 == e2 else f"{e1} / {e2}"
    return f"{e} ({x})" if x == y else f"{e} ({x} / {y})"


def table(l15, l0):
    ds = (16, 64, 256)
    rows = [f"| layer 15: `vmean` | " + " | ".join(f1(err(l15, "vmean", d)) for d in ds) + " |"]
    for m, label in [("window", "`window`"), ("streaming", "`streaming`"), ("h2o", "`h2o` (oracle)")]:
        rows.append(f"| {label} | " + " | ".join(cell(l15, m, d) for d in ds) + " |")
    rows.append("| `quest` / `moba` | " + " | ".join(pair(l15, "quest", "moba", d) for d in ds) + " |")
    rows.append(
        "| `block_sparse` / `xattention` | "
        + " | ".join(pair(l15, "block_sparse", "xattention", d) for d in ds)
        + " |"
    )
    for m, label in [("vertical_slash", "`vertical_slash`"), ("topk", "`topk` (oracle)")]:
        rows.append(f"| {label} | " + " | ".join(cell(l15, m, d) for d in ds) + " |")
    for m, label in [("window", "layer 0: `window`"), ("topk", "`topk` (oracle)"), ("moba", "`moba`")]:
        rows.append(f"| {label} | " + " | ".join(cell(l0, m, d, f2) for d in ds) + " |")
    return "\n".join(rows)


def committed(runs):
    """The paragraph above the table: what was run, what is committed so far, the caption."""
    smol = shards_of("smollm2-l15-n8192")
    init8 = shards_of("llama-1b-init-n8192")
    w2048 = per_point(runs["smollm2-l15-n2048"]) // 9
    w8192 = per_point(runs["smollm2-l15-n8192"]) // 9
    text = (
        "`results/decoder/` (`results/decoder/run.sh`, METHODS.md §7.6): every method with a causal "
        "form on SmolLM2-135M (the Q4_1 GGUF; layers 0 and 15) and on initialized Llama-3.2-1B-shaped "
        "weights (`results/decoder/llama-3.2-1b-shape.json`; layer 0), n = 2048 and 8192, d = 16..2048 "
        "keys per query (the SVD floor at d ≤ 256, on the pretrained heads). "
        + (
            f"Committed so far: shards {span(smol)} of {SHARDS} ({w2048} of {WINDOWS[2048]} windows at "
            f"n = 2048, {w8192} of the corpus's {WINDOWS[8192]} at n = 8192: "
            if len(smol) < SHARDS
            else f"Committed: all {SHARDS} shards ({w2048} windows at n = 2048, all {w8192} the corpus "
            f"holds at n = 8192: "
        )
        + f"{per_point(runs['smollm2-l15-n2048'])} and {per_point(runs['smollm2-l15-n8192'])} trials "
        f"per point for SmolLM2, {per_point(runs['llama-1b-init-n2048'])} for the 32-head "
        f"initialized model at n = 2048"
    )
    missing = [k for k in range(1, SHARDS + 1) if k not in smol]
    init_missing = [k for k in range(1, SHARDS + 1) if k not in init8]
    if init8:
        text += f", and {per_point(runs['llama-1b-init-n8192'])} at n = 8192" + (
            f" from shard{'s' if len(init8) > 1 else ''} {span(init8)}" if init_missing else ""
        )
    if not missing and not init_missing:
        return text + "). Mean ‖O − Ô‖₂ (mass captured) at n = 8192:"
    left = []
    if missing:
        left.append(f"the other {len(missing)} shards")
    if init_missing:
        left.append(
            f"{len(init_missing)} of the initialized model's at n = 8192" if init8 else
            "the initialized model at n = 8192"
        )
    if missing:
        nxt = " ".join(map(str, missing[:2]))
        how = (
            f"`SHARDS=\"{nxt}\" SKIP=llama-1b-init-n8192 results/decoder/run.sh` adds shards, 16 minutes "
            f"for shard 10 alone on 2 cores; the initialized model at n = 8192 takes "
            f"`SHARDS=K ONLY=llama-1b-init-n8192`, 8 minutes for shards 6 and 7 alone"
        )
    else:
        how = (
            f"`SHARDS={init_missing[0]} ONLY=llama-1b-init-n8192 results/decoder/run.sh` adds one, "
            f"8 minutes for shards 6 and 7 (2 windows each) with nothing beside them on 2 cores"
        )
    return text + f"); {' and '.join(left)} remain ({how}). Mean ‖O − Ô‖₂ (mass captured) at n = 8192:"


def readme_scope(l15, l8=None):
    """What the README says is merged: (the figure's caption, at its line break; the results list's
    few words)."""
    smol = shards_of("smollm2-l15-n8192")
    init8 = shards_of("llama-1b-init-n8192")
    if len(smol) < SHARDS:
        s = span(smol)
        return f"shards {s} of 16 so far:\n{per_point(l15)} trials per point at n = 8192", f"shards {s} of 16"
    if len(init8) < SHARDS:
        return (
            f"every shard but the\ninitialized model's at n = 8192, {len(init8)} of 16 so far",
            "every shard but the initialized model's at n = 8192",
        )
    return (
        f"all 16 shards: {per_point(l15)} trials\nper point at n = 8192 for SmolLM2, {per_point(l8)} for the "
        "initialized model",
        "all 16 shards",
    )


def wrap(text, width=100):
    """Greedy line wrap (the docs' prose is wrapped near 100 columns), never inside "n = 8192" or
    a `code span` (the docs test reads code spans line by line)."""
    glued, code = [], False
    for c in text.replace(" = ", "\u00a0=\u00a0"):
        code ^= c == "`"
        glued.append("\u00a0" if c == " " and code else c)
    lines, line = [], ""
    for word in "".join(glued).split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "\n".join(lines + [line]).replace("\u00a0", " ")


SPARSE = ["window", "streaming", "quest", "moba", "block_sparse", "xattention", "vertical_slash"]


def claims(l15, l0, ll):
    """The qualitative claims of the prose around the numbers; the ones that no longer hold."""
    failed = []

    def check(ok, what):
        if not ok:
            failed.append(what)

    check(mass(l15, "streaming", 16) > mass(l15, "window", 16) + 0.3, "layer 15: a sink (streaming ≫ window in mass at 16 keys)")
    best = sorted((err(l15, m, 256), m) for m in SPARSE)[:2]
    check({m for _, m in best} == {"xattention", "block_sparse"}, f"layer 15: xattention and block_sparse lowest at 256 keys (got {best})")
    check(all(err(l15, "quest", d) < err(l15, "moba", d) for d in (64, 256)), "layer 15: quest below moba at 64 and 256 keys")
    check(all(mass(l0, "topk", 256) > mass(l0, m, 256) for m in SPARSE), "layer 0: topk captures the most mass at 256 keys")
    check(err(l0, "topk", 256) > err(l0, "window", 256), "layer 0: topk's error above the window's at 256 keys")
    v = err(ll, "vmean", 16)
    check(all(err(ll, m, d) > v for m in SPARSE for d in (16, 32, 64)), "initialized: V-Mean below every sparse method up to 64 keys")
    well_below = {m for m in SPARSE if err(ll, m, 256) < 0.9 * v}
    check(well_below == {"xattention", "quest", "moba", "block_sparse"}, f"initialized: the sparse methods 10 % or more below V-Mean at 256 keys (got {sorted(well_below)})")
    check(all(0.9 <= err(ll, m, 256) / v < 1 for m in ("window", "streaming")), "initialized: window and streaming less than 10 % below V-Mean at 256 keys")
    check(err(ll, "vertical_slash", 256) > v, "initialized: vertical_slash above V-Mean at 256 keys")
    return failed


def init_8192_claims(l8):
    """The initialized model at n = 8192: V-Mean below every sparse method up to 256 keys; at 512
    keys `xattention` well below it and `quest` a few per cent below it; the others but `vertical_slash` below
    it at 1024."""
    v = err(l8, "vmean", 16)
    failed = []
    if not all(err(l8, m, d) > v for m in SPARSE for d in (16, 32, 64, 128, 256)):
        failed.append("initialized n = 8192: V-Mean below every sparse method up to 256 keys")
    if {m for m in SPARSE if err(l8, m, 512) < 0.9 * v} != {"xattention"}:
        failed.append("initialized n = 8192: only xattention 10 % or more below V-Mean at 512 keys")
    # quest sits a few per cent below V-Mean here and moved across 5 % as shards came in: the
    # sentence quotes the gap, and the claim is only that it is below by less than 10 %.
    if not 0 < 1 - err(l8, "quest", 512) / v < 0.1:
        failed.append("initialized n = 8192: quest below V-Mean by less than 10 % at 512 keys")
    if any(err(l8, m, 512) < v for m in ("window", "streaming", "moba", "block_sparse", "vertical_slash")):
        failed.append("initialized n = 8192: the other sparse methods above V-Mean at 512 keys")
    if {m for m in SPARSE if err(l8, m, 1024) < v} != set(SPARSE) - {"vertical_slash"}:
        failed.append("initialized n = 8192: every sparse method but vertical_slash below V-Mean at 1024 keys")
    return failed


def init_8192_sentence(l8):
    return (
        f"On initialized weights at n = 8192 ({per_point(l8)} trials per point{' so far' if shards_of('llama-1b-init-n8192') != list(range(1, SHARDS + 1)) else ''}) V-Mean ({err(l8, 'vmean', 16):.1f}) stays below every "
        f"sparse method up to 256 keys; at 512 keys `xattention` is well below it ({err(l8, 'xattention', 512):.1f}) and "
        f"`quest` {100 * (1 - err(l8, 'quest', 512) / err(l8, 'vmean', 16)):.0f} % below it ({err(l8, 'quest', 512):.1f}); the others but `vertical_slash` pass it at 1024."
    )


def main():
    names = ["smollm2-l15-n8192", "smollm2-l0-n8192", "smollm2-l15-n2048", "llama-1b-init-n2048"]
    if shards_of("llama-1b-init-n8192"):
        names.append("llama-1b-init-n8192")
    runs = {n: load(n) for n in names}
    l15, l0, ll = runs["smollm2-l15-n8192"], runs["smollm2-l0-n8192"], runs["llama-1b-init-n2048"]
    tab = table(l15, l0)
    para = committed(runs)
    ratio = err(l0, "topk", 256) / err(l0, "window", 256)
    lo, hi = sorted([err(l15, "xattention", 256), err(l15, "block_sparse", 256)])
    three = ["quest", "moba", "block_sparse"]
    print(para, tab, sep="\n\n")
    print(
        f"\nREADME: streaming {mass(l15, 'streaming', 16):.2f}, window {mass(l15, 'window', 16):.2f} at 16 keys; "
        f"xattention/block_sparse {lo:.0f}–{hi:.0f} vs topk {err(l15, 'topk', 256):.1f} at 256; "
        f"layer 0 topk/window {ratio:.1f}×"
    )
    failed = claims(l15, l0, ll)
    l8 = runs.get("llama-1b-init-n8192")
    if l8:
        failed += init_8192_claims(l8)
        print(init_8192_sentence(l8))
    for f in failed:
        print(f"claim no longer holds: {f}")
    if "--write" not in sys.argv[1:]:
        return
    if failed:
        sys.exit("numbers.py: the prose around the numbers needs rewording first (above)")

    doc = open("docs/reproductions.md").read()
    doc, k1 = re.subn(
        r"`results/decoder/` \(`results/decoder/run.sh`, METHODS.md §7.6\):.*?Mean\s+‖O\s+−\s+Ô‖₂\s+\(mass\s+captured\)\s+at\s+n = 8192:",
        lambda _: wrap(para),
        doc,
        flags=re.S,
    )
    doc, k2 = re.subn(
        r"(\| \| d = 16 \| 64 \| 256 \|\n\|---\|---\|---\|---\|\n)(?:\|.*\|\n)+",
        lambda m: m.group(1) + tab + "\n",
        doc,
    )
    doc, k3 = re.subn(r"has \d\.\d× the window's spectral error", f"has {ratio:.1f}× the window's spectral error", doc)
    ws = [err(ll, m, 256) for m in ("window", "streaming")]
    doc, k4 = re.subn(
        r"V-Mean\n\(\d+\.\d at n = 2048\) beats every sparse method up to 64 keys; at 256 keys `xattention` \(\d+\.\d\), `quest`,\n`moba` and `block_sparse` \(\d+\.\d–\d+\.\d\) are (?:well )?below it(?:, the window and\n`streaming` \(\d+\.\d–\d+\.\d\) (?:about level with|slightly below) it)?\.",
        f"V-Mean\n({err(ll, 'vmean', 16):.1f} at n = 2048) beats every sparse method up to 64 keys; at 256 keys "
        f"`xattention` ({err(ll, 'xattention', 256):.1f}), `quest`,\n`moba` and `block_sparse` "
        f"({min(err(ll, m, 256) for m in three):.1f}–{max(err(ll, m, 256) for m in three):.1f}) are well below it, "
        f"the window and\n`streaming` ({min(ws):.1f}–{max(ws):.1f}) slightly below it.",
        doc,
    )
    if l8:
        doc, k = re.subn(
            r"(slightly below it\.)(\n\nOn initialized weights at n = 8192 .*?at 1024\.)?",
            lambda m: m.group(1) + "\n\n" + wrap(init_8192_sentence(l8)),
            doc,
            flags=re.S,
        )
        k4 = k4 if k == 1 else 0
    rd = open("README.md").read()
    long_scope, short_scope = readme_scope(l15, runs.get("llama-1b-init-n8192"))
    rd, k5 = re.subn(
        r"\(`results/decoder/`, .*?; `results/decoder/run\.sh`\):",
        lambda _: f"(`results/decoder/`, {long_scope}; `results/decoder/run.sh`):",
        rd,
        flags=re.S,
    )
    rd, k6 = re.subn(
        r"\(error \d+–\d+\) come closest to the top-k oracle \(\d+\.\d\)",
        f"(error {lo:.0f}–{hi:.0f}) come closest to the top-k oracle ({err(l15, 'topk', 256):.1f})",
        rd,
    )
    rd, k7 = re.subn(
        r"at 256 keys \(0\.\d\d against the window's 0\.\d\d\) yet\nits error is \d\.\d× the window's \(\d\.\d against \d\.\d\)",
        f"at 256 keys ({mass(l0, 'topk', 256):.2f} against the window's {mass(l0, 'window', 256):.2f}) yet\n"
        f"its error is {ratio:.1f}× the window's ({err(l0, 'topk', 256):.1f} against {err(l0, 'window', 256):.1f})",
        rd,
    )
    rd, k8 = re.subn(
        r"at 16 keys `streaming` captures 0\.\d\d of the\nattention mass where the sliding window captures 0\.\d\d",
        f"at 16 keys `streaming` captures {mass(l15, 'streaming', 16):.2f} of the\n"
        f"attention mass where the sliding window captures {mass(l15, 'window', 16):.2f}",
        rd,
    )
    rd, k9 = re.subn(
        r"decoder attention \((?:shards? [0-9–, ]+ of 16|every shard but [^)]*|all 16 shards)\)",
        lambda _: f"decoder attention ({short_scope})",
        rd,
    )
    missing = [i + 1 for i, k in enumerate([k1, k2, k3, k4, k5, k6, k7, k8, k9]) if k != 1]
    if missing:
        sys.exit(f"numbers.py: the text of replacement(s) {missing} was not found once; edit the docs by hand")
    open("docs/reproductions.md", "w").write(doc)
    open("README.md", "w").write(rd)


if __name__ == "__main__":
    main()
