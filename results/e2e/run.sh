#!/usr/bin/env bash
# End to end (issue 43, METHODS.md §10): every §7 prefill method and every §9 decode method at the
# budgets FEATURES, every §8 method and the cache reads dkv_q4_0, dkivi2 (d = 0), each in every layer
# of SmolLM2-135M-Instruct (the Q4_1 GGUF of ../shared/data), on WINDOWS windows of N tokens of
# wiki.test.raw with a continuation of n_f = 256 scored positions. Writes e2e.csv, e2e_layers.csv,
# summary.csv (which operator metric predicts the KL), e2e.png and ids.txt into OUT.
#
# Resumable: rerunning completes what is missing, and a larger WINDOWS extends the run with the
# next windows (the ones already there must be its first).
#   committed: N=1024 WINDOWS=2 FEATURES=64,256 (results/e2e/smollm2-n1024; about 7 min a window on
#              the 2-core build machine before the exact run was shared by a window's points)
#   issue 43's target, in progress: N=2048 WINDOWS=16 FEATURES=64,256,1024 (results/e2e/smollm2-n2048;
#              about 6 s a point, 75 points and ~7.5 min a window on the same machine)
set -euo pipefail
BIN=${BIN:-./target/release/approx-bench}
N=${N:-1024}
WINDOWS=${WINDOWS:-2}
FEATURES=${FEATURES:-64,256}
OUT=${OUT:-results/e2e/smollm2-n$N}
$BIN e2e --model-dir ../shared/data/SmolLM2-135M-Instruct-Q4_1 \
  --corpus ../shared/data/wikitext-2/wiki.test.raw --lengths "$N" --windows "$WINDOWS" --n-f 256 \
  --methods all --features "$FEATURES" --out "$OUT" --quiet --summary
