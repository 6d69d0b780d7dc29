# Sourced by results/field/run.sh and results/decoder_runs.sh (BIN, WORK and OUT set by them).
# merge_run RUN merges every shard directory in WORK/RUN with OUT/RUN, beside it, and swaps only on
# success; the merged shard directories are set aside so that the next merge does not read them
# again.
merge_run() {
  local run=$1 shards previous=()
  shards=("$WORK/$run"/[0-9]*)
  [ -e "${shards[0]}" ] || return 0
  if [ -d "$OUT/$run" ]; then previous=("$OUT/$run"); fi
  rm -rf "$WORK/$run.merged"
  $BIN merge "${previous[@]}" "${shards[@]}" --out "$WORK/$run.merged"
  rm -f "$WORK/$run.merged"/*.png
  mkdir -p "$OUT"
  rm -rf "$OUT/$run" && mv "$WORK/$run.merged" "$OUT/$run"
  mkdir -p "$WORK/merged/$run"
  mv "${shards[@]}" "$WORK/merged/$run/"
}
