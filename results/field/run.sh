#!/usr/bin/env bash
# The field on one axis (issue 13): every softmax-target method (`--methods field`) at
# n = 1024 and 4096 on initialized bert-base-cased and pretrained all-MiniLM-L6-v2 (the stand-in
# for bert-base-cased's weights, which cannot be fetched here), and the kernelized target's six
# methods on both, 768 trials per point when complete (64 windows × 12 heads).
#
# Run from the repository root with ../shared/data beside it. The grid is cut into 16 shards
# (`--shard K/16`: 4 of the 64 windows at each n); SHARDS picks which to run (default all), and
# every run directory already under results/field is merged with the new shards, so the
# reproduction grows shard by shard: `SHARDS="2 3" results/field/run.sh` adds two.
# `SHARDS= WORK=DIR results/field/run.sh` runs nothing and merges the shard directories already
# in DIR (DIR/initialized/K, …, as this script lays them out). Each merged manifest lists its
# shards with the build that ran them (`merged_from`).
set -euo pipefail
BIN=${BIN:-./target/release/approx-bench}
SHARDS=${SHARDS-$(seq 1 16)}
DATA=../shared/data
CORPUS=(--corpus $DATA/wikitext-2/wiki.test.raw)
INIT=(--model initialized --model-dir $DATA/bert-base-cased "${CORPUS[@]}")
PRE=(--model pretrained --model-dir $DATA/all-MiniLM-L6-v2 "${CORPUS[@]}")
GRID=(--lengths 1024,4096 --windows 64 --quiet)
OUT=results/field
WORK=${WORK:-$(mktemp -d)}
for s in $SHARDS; do
  $BIN --methods field "${INIT[@]}" "${GRID[@]}" --shard "$s/16" --out "$WORK/initialized/$s"
  $BIN --methods field "${PRE[@]}" "${GRID[@]}" --shard "$s/16" --out "$WORK/pretrained-minilm/$s"
  $BIN --target kernelized "${INIT[@]}" "${GRID[@]}" --shard "$s/16" --out "$WORK/kernelized-initialized/$s"
  $BIN --target kernelized "${PRE[@]}" "${GRID[@]}" --shard "$s/16" --out "$WORK/kernelized-pretrained-minilm/$s"
done
for run in initialized pretrained-minilm kernelized-initialized kernelized-pretrained-minilm; do
  shards=("$WORK/$run"/[0-9]*)
  [ -e "${shards[0]}" ] || continue
  previous=()
  if [ -d "$OUT/$run" ]; then previous=("$OUT/$run"); fi
  # Merge beside the committed directory and swap only when the merge succeeded.
  rm -rf "$WORK/$run.merged"
  $BIN merge "${previous[@]}" "${shards[@]}" --out "$WORK/$run.merged"
  rm -f "$WORK/$run.merged"/*.png
  rm -rf "$OUT/$run" && mv "$WORK/$run.merged" "$OUT/$run"
done
$BIN plot --from $OUT/initialized --from $OUT/pretrained-minilm \
  --from $OUT/kernelized-initialized --from $OUT/kernelized-pretrained-minilm --out "$WORK/figures"
cp "$WORK/figures/field.png" "$WORK/figures/kernelized.png" $OUT/
