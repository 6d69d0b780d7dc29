#!/usr/bin/env bash
# Decode-time KV-cache compression (issue 35, METHODS.md §9.3): every §9 method (`--methods decode`:
# dec_window, dec_streaming, snapkv, snapkv_avg5, pyramidkv, adakv, h2o_dec, tova, quest_dec and the
# oracles topk_dec, evict_oracle) with kv_q8_0, kv_q4_0 and kivi2 as points, under the continuation
# protocol with n_f = 256 (`--decode 256`), on the decoder reproduction's models, lengths and windows
# (results/decoder/run.sh: SmolLM2-135M-Instruct layers 0 and 15, the initialized Llama-3.2-1B-shaped
# model at layer 0; n = 2048 over 64 windows, n = 8192 over 36), d = 16..2048 (the causal default).
#
# As results/quant/run.sh: 16 shards (`--shard K/16`), SHARDS picks which to run (default all), each
# shard is merged into OUT (default results/decode) when its runs finish; `SHARDS= WORK=DIR` only
# merges; SKIP and ONLY name runs to leave out or to do alone. decode.png is drawn from the merged runs.
set -euo pipefail
BIN=${BIN:-./target/release/approx-bench}
SHARDS=${SHARDS-$(seq 1 16)}
OUT=${OUT:-results/decode}
WORK=${WORK:-$(mktemp -d)}
DECODE=(--decode 256 --methods decode,kv_q8_0,kv_q4_0,kivi2 --quiet)

# shellcheck source=results/decoder_runs.sh
source "$(dirname "$0")/../decoder_runs.sh"
run_shards "${DECODE[@]}"

FROM=()
for run in "${RUNS[@]}"; do
  [ -d "$OUT/$run" ] && FROM+=(--from "$OUT/$run")
done
$BIN plot "${FROM[@]}" --out "$WORK/figures"
cp "$WORK/figures/decode.png" "$OUT/"
