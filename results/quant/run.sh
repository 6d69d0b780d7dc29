#!/usr/bin/env bash
# Quantized attention beside sparse attention on one axis of K/V bytes read (issue 31, METHODS.md
# §8.5): every §8 method (`--methods quant`: the KV caches kv_f16 … kv_q4_0, KIVI, SageAttention) on
# the decoder reproduction's models, lengths and windows (results/decoder/run.sh: SmolLM2-135M-Instruct
# layers 0 and 15, the initialized Llama-3.2-1B-shaped model at layer 0; n = 2048 over 64 windows,
# n = 8192 over 36). The §8 methods have no budget: one trial per (window, head), d = 0.
#
# The sparse methods of the figure (window, streaming, quest, xattention and the topk oracle) are
# results/decoder's rows for the same windows and heads (deterministic, from the same Q/K/V); quant.png
# is drawn from both directories. Their kv_read (keys/((n+1)/2) read from an f16 cache) is computed from
# the summary's keys_mean where a run predates the column.
#
# As results/decoder/run.sh: 16 shards (`--shard K/16`), SHARDS picks which to run (default all), each
# shard is merged into OUT (default results/quant) when its runs finish; `SHARDS= WORK=DIR` only merges;
# SKIP and ONLY name runs to leave out or to do alone.
set -euo pipefail
BIN=${BIN:-./target/release/approx-bench}
SHARDS=${SHARDS-$(seq 1 16)}
OUT=${OUT:-results/quant}
DECODER=${DECODER:-results/decoder}
WORK=${WORK:-$(mktemp -d)}
QUANT=(--methods quant --quiet)

# shellcheck source=results/decoder_runs.sh
source "$(dirname "$0")/../decoder_runs.sh"
run_shards "${QUANT[@]}"

# The figure: the §8 runs beside the decoder runs' sparse methods (the others have no kv_read and are
# not drawn).
FROM=()
for run in "${RUNS[@]}"; do
  [ -d "$OUT/$run" ] && FROM+=(--from "$OUT/$run")
  [ -d "$DECODER/$run" ] && FROM+=(--from "$DECODER/$run")
done
$BIN plot "${FROM[@]}" --out "$WORK/figures"
cp "$WORK/figures/quant.png" "$OUT/"
