#!/usr/bin/env bash
# Calibration of the unstated pipeline choices against the initialized anchors of both Figure 1s
# (METHODS.md §4.4–4.5, issue: "Calibration"). Each variant: initialized bert-base-cased, n = 1024
# and 4096, 4 windows × 12 heads, the seven figure methods, d = 16..256. Run from the repository root.
set -euo pipefail
BIN=${BIN:-./target/release/approx-bench}
DATA=../shared/data
OUT=results/calibration
common=(--model initialized --model-dir $DATA/bert-base-cased --corpus $DATA/wikitext-2/wiki.test.raw
        --lengths 1024,4096 --windows 4 --methods figure --features 16,32,64,128,256 --quiet)
run() { # name, extra flags...
  local name=$1; shift
  $BIN "${common[@]}" "$@" --out "$OUT/$name"
  rm -f "$OUT/$name"/*.png "$OUT/$name/trials.csv"
  echo "$name: $($BIN anchors --from "$OUT/$name" | tail -1)"
}
# Every variant names its embedding policy: the tool's default changed to word-pos-first after
# (and because of) this study, and "recommended" means METHODS.md §1.4's word-pos.
run recommended --embedding word-pos
run pytorch-init --embedding word-pos --init pytorch
run dropout --embedding word-pos --embedding-dropout 0.1
run pytorch-init+dropout --embedding word-pos --init pytorch --embedding-dropout 0.1
run with-token-type --embedding word-pos-type
run no-positions --embedding word
run positions-first-512 --embedding word-pos-first
run positions-first-512+pytorch-init+dropout --embedding word-pos-first --init pytorch --embedding-dropout 0.1
# The Skyformer figure's other lengths (n = 512, 2048) for the leading candidates.
common=(--model initialized --model-dir $DATA/bert-base-cased --corpus $DATA/wikitext-2/wiki.test.raw
        --lengths 512,2048 --windows 4 --methods figure --features 16,32,64,128,256 --quiet)
run recommended-512-2048 --embedding word-pos
run positions-first-512-512-2048 --embedding word-pos-first
run positions-first-512+pytorch-init+dropout-512-2048 --embedding word-pos-first --init pytorch --embedding-dropout 0.1
