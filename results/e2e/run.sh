#!/usr/bin/env bash
# End to end (issue 43, METHODS.md §10): every §7 prefill method and every §9 decode method at
# d = 64, 256 and 1024, every §8 method and the cache reads dkv_q4_0, dkivi2 (d = 0), each in every
# layer of SmolLM2-135M-Instruct (the Q4_1 GGUF of ../shared/data), on windows of n = 2048 tokens of
# wiki.test.raw with a continuation of n_f = 256 scored positions. Writes e2e.csv, e2e_layers.csv,
# summary.csv (which operator metric predicts the KL), e2e.png and ids.txt into OUT.
#
# Resumable: rerunning completes what is missing, and a larger WINDOWS extends the run with the
# next windows (the ones already there must be its first). The committed run is partial (see
# docs/reproductions.md); `WINDOWS=16 results/e2e/run.sh` completes it (about 20 min a window on
# the 2-core build machine).
set -euo pipefail
BIN=${BIN:-./target/release/approx-bench}
OUT=${OUT:-results/e2e/smollm2-n2048}
WINDOWS=${WINDOWS:-16}
$BIN e2e --model-dir ../shared/data/SmolLM2-135M-Instruct-Q4_1 \
  --corpus ../shared/data/wikitext-2/wiki.test.raw --lengths 2048 --windows "$WINDOWS" --n-f 256 \
  --methods all --features 64,256,1024 --out "$OUT" --quiet --summary
