#!/usr/bin/env bash
# The decoder figure (issues 22–23, METHODS.md §7.6): every method with a causal form on one axis
# of keys per query, on real pretrained decoder attention and on initialized weights.
#
# Models: SmolLM2-135M-Instruct (the Q4_1 GGUF in ../shared/data; 9 query heads over 3 K/V heads,
# p = 64) at layers 0 and 15, and `--model initialized` with a Llama-3.2-1B-shaped config
# (llama-3.2-1b-shape.json beside this script: H = 32, H_kv = 8, p = 64, θ = 500000, llama3 RoPE
# scaling; the public config's numbers) at layer 0. The initialized model reads SmolLM2's tokenizer
# (Llama 3's is not available offline; with initialized weights the token ids matter little, and
# they all lie below its vocabulary of 128256). Lengths 2048 (64 of the corpus's 147 windows) and
# 8192 (all 36 windows the corpus holds); d = 16..2048 keys per query for every causal method but
# the SVD floor, which runs at d = 16..256 on the pretrained heads (its exact SVD at d ≥ n/4 would
# take minutes per head).
#
# Run from the repository root with ../shared/data beside it. As results/field/run.sh: the grid is
# cut into 16 shards (`--shard K/16`), SHARDS picks which to run (default all), each shard is merged
# into OUT (default results/decoder) as soon as its runs finish, `SHARDS= WORK=DIR` only merges.
# SKIP names runs to leave out of these shards (e.g. SKIP=llama-1b-init-n8192: 32 heads at n = 8192
# take about as long as the rest of a shard on 2 cores); ONLY, if set, names the only runs to do.
set -euo pipefail
BIN=${BIN:-./target/release/approx-bench}
SHARDS=${SHARDS-$(seq 1 16)}
OUT=${OUT:-results/decoder}
WORK=${WORK:-$(mktemp -d)}
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=../shared/data
SMOL=$DATA/SmolLM2-135M-Instruct-Q4_1
CORPUS=(--corpus $DATA/wikitext-2/wiki.test.raw)
# The initialized model's directory: the config above and SmolLM2's tokenizer, linked (not copied).
LLAMA=$WORK/llama-3.2-1b-shape
mkdir -p "$LLAMA"
cp "$HERE/llama-3.2-1b-shape.json" "$LLAMA/config.json"
ln -sf "$(cd "$SMOL" && pwd)/tokenizer.json" "$LLAMA/tokenizer.json"
ln -sf "$(cd "$SMOL" && pwd)/tokenizer_config.json" "$LLAMA/tokenizer_config.json"
MAIN=(--methods vmean,performer_favor,window,topk,streaming,h2o,quest,moba,block_sparse,xattention,vertical_slash
      --features 16,32,64,128,256,512,1024,2048 --quiet)
FLOOR=(--methods svd_optimal --features 16,32,64,128,256 --quiet)

# run name → model flags, and length → windows.
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
for m in "${MODELS[@]}"; do for n in "${LENGTHS[@]}"; do
  RUNS+=("$m-n$n")
  [ "$m" = llama-1b-init ] || RUNS+=("$m-n$n-floor")
done; done
SKIP=${SKIP:-}
ONLY=${ONLY:-}
for s in $SHARDS; do
  for m in "${MODELS[@]}"; do
    for n in "${LENGTHS[@]}"; do
      case " $SKIP " in *" $m-n$n "*) continue ;; esac
      [ -z "$ONLY" ] || case " $ONLY " in *" $m-n$n "*) ;; *) continue ;; esac
      # shellcheck disable=SC2046
      $BIN $(model_args "$m") "${CORPUS[@]}" --lengths "$n" --windows "$(windows_of "$n")" \
        "${MAIN[@]}" --shard "$s/16" --out "$WORK/$m-n$n/$s"
      # The SVD floor on the pretrained heads only (on initialized weights it is seconds per head
      # at n = 8192 for 32 heads, and the near-uniform attention's floor says little).
      [ "$m" = llama-1b-init ] && continue
      # shellcheck disable=SC2046
      $BIN $(model_args "$m") "${CORPUS[@]}" --lengths "$n" --windows "$(windows_of "$n")" \
        "${FLOOR[@]}" --shard "$s/16" --out "$WORK/$m-n$n-floor/$s"
    done
  done
  for run in "${RUNS[@]}"; do merge_run "$run"; done
done
[ -n "$SHARDS" ] || for run in "${RUNS[@]}"; do merge_run "$run"; done

FROM=()
for run in "${RUNS[@]}"; do [ -d "$OUT/$run" ] && FROM+=(--from "$OUT/$run"); done
$BIN plot "${FROM[@]}" --out "$WORK/figures"
cp "$WORK/figures/decoder.png" "$OUT/"
