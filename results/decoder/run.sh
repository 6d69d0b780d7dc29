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
MAIN=(--methods vmean,performer_favor,window,topk,streaming,h2o,quest,moba,block_sparse,xattention,vertical_slash
      --features 16,32,64,128,256,512,1024,2048 --quiet)
FLOOR=(--methods svd_optimal --features 16,32,64,128,256 --quiet)

# shellcheck source=results/decoder_runs.sh
source "$(dirname "$0")/../decoder_runs.sh"

RUNS=()
for m in "${MODELS[@]}"; do for n in "${LENGTHS[@]}"; do
  RUNS+=("$m-n$n")
  [ "$m" = llama-1b-init ] || RUNS+=("$m-n$n-floor")
done; done
# The SVD floor on the pretrained heads only (on initialized weights it is seconds per head at
# n = 8192 for 32 heads, and the near-uniform attention's floor says little).
extra_run() {
  [ "$1" = llama-1b-init ] && return 0
  # shellcheck disable=SC2046
  $BIN $(model_args "$1") "${CORPUS[@]}" --lengths "$2" --windows "$(windows_of "$2")" \
    "${FLOOR[@]}" --shard "$3/16" --out "$WORK/$1-n$2-floor/$3"
}
run_shards "${MAIN[@]}"

FROM=()
for run in "${RUNS[@]}"; do [ -d "$OUT/$run" ] && FROM+=(--from "$OUT/$run"); done
$BIN plot "${FROM[@]}" --out "$WORK/figures"
cp "$WORK/figures/decoder.png" "$OUT/"
