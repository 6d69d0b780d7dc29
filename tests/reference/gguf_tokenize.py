#!/usr/bin/env python3
"""llama.cpp's token ids for a GGUF's own tokenizer (issue 55), written as a fixture that the Rust
tests compare with src/inputs/gguf_tokenizer.rs token for token.

The corpus stream is built as src/inputs/corpus.rs builds it: every non-blank line of the text file,
with its "\\n", cut at 16 KiB before a space, tokenized on its own without special tokens (llama.cpp:
llama_tokenize with add_special = false, parse_special = true), the ids concatenated. Window w of
length n is then [BOS] + stream[w(n-1):(w+1)(n-1)] when llama.cpp adds a BOS for the vocabulary,
else stream[wn:(w+1)n] (docs/reference.md §7.1). The fixture keeps the sha256 of every window's ids
(little-endian u32), the stream's length and first ids, and the ids of hand-made edge cases in full.

llama.cpp runs through tests/reference/llamacpp_tokenize.cpp, built against a llama.cpp checkout
(--llama-cpp DIR with build/bin/libllama.so; the PyPI sdist of llama-cpp-python vendors one).
--transformers also tokenizes with transformers' GGUF conversion and reports where it differs.

    gguf_tokenize.py --gguf M.gguf --corpus wiki.test.raw --llama-cpp DIR --out fixtures/tokenizers/x.json
    gguf_tokenize.py --gguf M.gguf --corpus wiki.test.raw --llama-cpp DIR --check fixtures/tokenizers/x.json
"""

import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile

MAX_ROW_BYTES = 16 * 1024

EDGE_CASES = [
    "Hello world",
    " leading space",
    "   three leading spaces and  two  inside",
    "trailing spaces   ",
    "digits 0 12 345 6789 1234567890 3.14159 -2e10",
    "newlines\n\nand\n\n\nmore\n",
    "tabs\tand\r\ncarriage returns",
    "don't it's we'll they've I'm you'd HE'S",
    "naïve café résumé Zürich",
    "日本語のテキスト 中文 한국어",
    "emoji 🤖🚀 and symbols ∑∫√ ≤ ≥",
    "rare bytes \x01\x02 \u2028 \ufeff",
    "math: x^2 + y_1 = {a, b}; [c] (d) <e> |f| ~g`",
    " = = Robert Boulter = = \n",
    "@-@ 1 @,@ 000 @.@ 5",
    "",
    " ",
    "\n",
]


def text_rows(path):
    """src/inputs/corpus.rs text_rows for a text file."""
    text = open(path, "rb").read().decode("utf-8")
    rows = []
    for line in text.split("\n"):
        if line.endswith("\r"):
            line = line[:-1]
        if not line.strip():
            continue
        pieces = split_long_row(line)
        for i, p in enumerate(pieces):
            rows.append(p + "\n" if i == len(pieces) - 1 else p)
    return rows


def split_long_row(line):
    data = line.encode("utf-8")
    pieces = []
    while len(data) > MAX_ROW_BYTES:
        head = data[: MAX_ROW_BYTES + 1]
        cut = head.rfind(b" ")
        if cut <= 0:
            cut = MAX_ROW_BYTES
        while cut > 0 and (data[cut] & 0xC0) == 0x80:
            cut -= 1
        pieces.append(data[:cut].decode("utf-8"))
        data = data[cut:]
    pieces.append(data.decode("utf-8"))
    return pieces


def build_driver(llama_cpp, workdir):
    exe = os.path.join(workdir, "llamacpp_tokenize")
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llamacpp_tokenize.cpp")
    lib = os.path.join(llama_cpp, "build", "bin")
    subprocess.run(
        ["g++", "-O2", "-std=c++17", src, "-I", os.path.join(llama_cpp, "include"),
         "-I", os.path.join(llama_cpp, "ggml", "include"), "-L", lib, "-lllama",
         f"-Wl,-rpath,{lib}", "-o", exe],
        check=True,
    )
    return exe


def llamacpp_ids(exe, gguf, texts):
    """(add_bos, bos, [ids per text]) from llama.cpp."""
    if any("\0" in t for t in texts):
        raise SystemExit("a text holds a NUL byte, which the driver uses as a separator")
    data = "\0".join(texts).encode("utf-8")
    out = subprocess.run([exe, gguf], input=data, stdout=subprocess.PIPE, check=True).stdout
    lines = out.decode().split("\n")
    head = lines[0].split()
    add_bos, bos = head[1] == "1", int(head[3])
    ids = [[int(x) for x in line.split()] for line in lines[1 : 1 + len(texts)]]
    # An empty text gives an empty line, which the join cannot tell from "no texts": pad.
    while len(ids) < len(texts):
        ids.append([])
    return add_bos, bos, ids


def windows(stream, n, bos):
    per = n - 1 if bos is not None else n
    out = []
    for w in range(len(stream) // per):
        ids = ([bos] if bos is not None else []) + stream[w * per : (w + 1) * per]
        out.append(hashlib.sha256(struct.pack(f"<{len(ids)}I", *ids)).hexdigest())
    return out


def transformers_rows(gguf, rows):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(gguf)), gguf_file=os.path.basename(gguf))
    return [tok.encode(r, add_special_tokens=False) for r in rows]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--llama-cpp", required=True, help="a llama.cpp checkout with build/bin/libllama.so")
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--out")
    ap.add_argument("--check")
    ap.add_argument("--transformers", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        exe = build_driver(a.llama_cpp, work)
        rows = text_rows(a.corpus)
        add_bos, bos_id, row_ids = llamacpp_ids(exe, a.gguf, rows)
        _, _, edge_ids = llamacpp_ids(exe, a.gguf, EDGE_CASES)
    stream = [i for r in row_ids for i in r]
    bos = bos_id if add_bos else None
    fixture = {
        "gguf": os.path.basename(a.gguf),
        "corpus": os.path.basename(a.corpus),
        "generator": "tests/reference/gguf_tokenize.py (llama.cpp llama_tokenize, add_special=false, parse_special=true)",
        "n": a.n,
        "bos": bos,
        "stream_tokens": len(stream),
        "stream_head": stream[:64],
        "window_sha256": windows(stream, a.n, bos),
        "edge_cases": [{"text": t, "ids": ids} for t, ids in zip(EDGE_CASES, edge_ids)],
    }
    if a.transformers:
        hf = transformers_rows(a.gguf, rows)
        diff_rows = sum(1 for x, y in zip(hf, row_ids) if x != y)
        hf_stream = [i for r in hf for i in r]
        hf_windows = windows(hf_stream, a.n, bos)
        same = sum(1 for x, y in zip(hf_windows, fixture["window_sha256"]) if x == y)
        print(f"transformers' GGUF conversion: {diff_rows} of {len(rows)} rows differ from llama.cpp; "
              f"{same} of {len(fixture['window_sha256'])} windows identical")
    print(f"{fixture['gguf']}: {len(stream)} tokens, {len(fixture['window_sha256'])} windows of n = {a.n}, BOS {bos}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(fixture, f, indent=1, ensure_ascii=False)
            f.write("\n")
    if a.check:
        old = json.load(open(a.check))
        if old != fixture:
            bad = [k for k in fixture if old.get(k) != fixture[k]]
            sys.exit(f"{a.check}: llama.cpp's ids differ from the fixture in {bad}")
        print(f"{a.check}: llama.cpp's ids are the fixture's")


if __name__ == "__main__":
    main()
