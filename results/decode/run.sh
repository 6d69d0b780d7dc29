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
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=../shared/data
SMOL=$DATA/SmolLM2-135M-Instruct-Q4_1
CORPUS=(--corpus $DATA/wikitext-2/wiki.test.raw)
LLAMA=$WORK/llama-3.2-1b-shape
mkdir -p "$LLAMA"
cp "$HERE/../decoder/llama-3.2-1b-shape.json" "$LLAMA/config.json"
ln -sf "$(cd "$SMOL" && pwd)/tokenizer.json" "$LLAMA/tokenizer.json"
ln -sf "$(cd "$SMOL" && pwd)/tokenizer_config.json" "$LLAMA/tokenizer_config.json"
DECODE=(--decode 256 --methods decode,kv_q8_0,kv_q4_0,kivi2 --quiet)

model_args() {
  case $1 in
    smollm2-l0) echo "--model pretrained --model-dir $SMOL --layer 0" ;;
    smollm2-l15) echo "--model pretrained --model-dir $SMOL --layer 15" ;;
    llama-1b-init) echo "--model initialized --model-dir $LLAMA --layer 0" ;;
  esac
}
windows_of() { case $1 in 2048) echo 64 ;; 8192) echo 36 ;; esac; }
MODELS=(smollm2-l0 smollm2-l15 llama-1b-init)
LENGTHS=(2048 8192)

# shellcheck source=results/merge_run.sh
source "$(dirname "$0")/../merge_run.sh"

RUNS=()
for m in "${MODELS[@]}"; do for n in "${LENGTHS[@]}"; do RUNS+=("$m-n$n"); done; done
SKIP=${SKIP:-}
ONLY=${ONLY:-}
for s in $SHARDS; do
  for m in "${MODELS[@]}"; do
    for n in "${LENGTHS[@]}"; do
      case " $SKIP " in *" $m-n$n "*) continue ;; esac
      [ -z "$ONLY" ] || case " $ONLY " in *" $m-n$n "*) ;; *) continue ;; esac
      # shellcheck disable=SC2046
      $BIN $(model_args "$m") "${CORPUS[@]}" --lengths "$n" --windows "$(windows_of "$n")" \
        "${DECODE[@]}" --shard "$s/16" --out "$WORK/$m-n$n/$s"
    done
  done
  for run in "${RUNS[@]}"; do merge_run "$run"; done
done
[ -n "$SHARDS" ] || for run in "${RUNS[@]}"; do merge_run "$run"; done

FROM=()
for run in "${RUNS[@]}"; do
  [ -d "$OUT/$run" ] && FROM+=(--from "$OUT/$run")
done
$BIN plot "${FROM[@]}" --out "$WORK/figures"
cp "$WORK/figures/decode.png" "$OUT/"
