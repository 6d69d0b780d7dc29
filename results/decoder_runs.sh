# Sourced by results/decoder/run.sh, results/quant/run.sh and results/decode/run.sh (BIN, WORK, OUT
# and SHARDS set by them): the decoder reproduction's models, lengths and windows (described in
# results/decoder/run.sh), and run_shards, which runs every (model, n) of the given shards with the
# given flags and merges each shard into OUT as soon as its runs finish.
DATA=../shared/data
SMOL=$DATA/SmolLM2-135M-Instruct-Q4_1
CORPUS=(--corpus $DATA/wikitext-2/wiki.test.raw)
# The initialized model's directory: results/decoder/llama-3.2-1b-shape.json and SmolLM2's tokenizer,
# linked (not copied).
LLAMA=$WORK/llama-3.2-1b-shape
mkdir -p "$LLAMA"
cp "$(dirname "${BASH_SOURCE[0]}")/decoder/llama-3.2-1b-shape.json" "$LLAMA/config.json"
ln -sf "$(cd "$SMOL" && pwd)/tokenizer.json" "$LLAMA/tokenizer.json"
ln -sf "$(cd "$SMOL" && pwd)/tokenizer_config.json" "$LLAMA/tokenizer_config.json"

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
RUNS=()
for m in "${MODELS[@]}"; do for n in "${LENGTHS[@]}"; do RUNS+=("$m-n$n"); done; done

# shellcheck source=results/merge_run.sh
source "$(dirname "${BASH_SOURCE[0]}")/merge_run.sh"

# run_shards FLAGS...: for each shard K of SHARDS, every run (model m, length n) not named in SKIP
# (and named in ONLY, if set) with FLAGS into WORK/m-nN/K, then `extra_run m n K` if the caller
# defines it; then every run of RUNS merged into OUT. With SHARDS empty, only the merges.
run_shards() {
  local s m n
  for s in $SHARDS; do
    for m in "${MODELS[@]}"; do
      for n in "${LENGTHS[@]}"; do
        case " ${SKIP:-} " in *" $m-n$n "*) continue ;; esac
        [ -z "${ONLY:-}" ] || case " $ONLY " in *" $m-n$n "*) ;; *) continue ;; esac
        # shellcheck disable=SC2046
        $BIN $(model_args "$m") "${CORPUS[@]}" --lengths "$n" --windows "$(windows_of "$n")" \
          "$@" --shard "$s/16" --out "$WORK/$m-n$n/$s"
        if declare -F extra_run > /dev/null; then extra_run "$m" "$n" "$s"; fi
      done
    done
    for run in "${RUNS[@]}"; do merge_run "$run"; done
  done
  [ -n "$SHARDS" ] || for run in "${RUNS[@]}"; do merge_run "$run"; done
}
