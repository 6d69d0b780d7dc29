#!/usr/bin/env bash
# The field on one axis (issue 13): every softmax-target method (`--methods field`) at
# n = 1024 and 4096 on initialized bert-base-cased and pretrained all-MiniLM-L6-v2 (the stand-in
# for bert-base-cased's weights, which cannot be fetched here), and the kernelized target's six
# methods on both, 768 trials per point (64 windows × 12 heads).
#
# Run from the repository root with ../shared/data beside it. The grid is cut into 16 shards
# (`--shard K/16`: 4 of the 64 windows at each n); SHARDS picks which to run (default all). Each
# shard is merged into OUT (default results/field) as soon as its four runs finish, so an
# interrupted script keeps every finished shard and a reproduction can grow shard by shard:
# `SHARDS="2 3" results/field/run.sh` adds two. `SHARDS= WORK=DIR results/field/run.sh` runs
# nothing and merges the shard directories already in DIR (DIR/initialized/K, …, as this script
# lays them out). Each merged manifest lists its shards with the build that ran them (`merged_from`).
#
# The committed results/field is complete. To reproduce it, write a fresh copy elsewhere and
# compare: `OUT=/tmp/field results/field/run.sh`, then
# `approx-bench check --baseline results/field/initialized --current /tmp/field/initialized`
# (and the other three runs). Trials are seeded, but f32 products round differently on other CPUs,
# so a rerun elsewhere agrees statistically (what `check` tests), not bit for bit, and cannot be
# merged into the committed directories: the script refuses to add shards to a complete OUT.
set -euo pipefail
BIN=${BIN:-./target/release/approx-bench}
SHARDS=${SHARDS-$(seq 1 16)}
OUT=${OUT:-results/field}
WORK=${WORK:-$(mktemp -d)}
DATA=../shared/data
CORPUS=(--corpus $DATA/wikitext-2/wiki.test.raw)
INIT=(--model initialized --model-dir $DATA/bert-base-cased "${CORPUS[@]}")
PRE=(--model pretrained --model-dir $DATA/all-MiniLM-L6-v2 "${CORPUS[@]}")
GRID=(--lengths 1024,4096 --windows 64 --quiet)
RUNS=(initialized pretrained-minilm kernelized-initialized kernelized-pretrained-minilm)

if [ -n "$SHARDS" ]; then
  for run in "${RUNS[@]}"; do
    if grep -q '"status": "complete"' "$OUT/$run/manifest.json" 2>/dev/null; then
      echo "$OUT/$run already holds the complete run (768 trials per point); to reproduce it, set OUT to a new directory (OUT=/tmp/field $0) and compare with approx-bench check --baseline $OUT/$run --current /tmp/field/$run" >&2
      exit 2
    fi
  done
fi

# shellcheck source=results/merge_run.sh
source "$(dirname "$0")/../merge_run.sh"

for s in $SHARDS; do
  $BIN --methods field "${INIT[@]}" "${GRID[@]}" --shard "$s/16" --out "$WORK/initialized/$s"
  $BIN --methods field "${PRE[@]}" "${GRID[@]}" --shard "$s/16" --out "$WORK/pretrained-minilm/$s"
  $BIN --target kernelized "${INIT[@]}" "${GRID[@]}" --shard "$s/16" --out "$WORK/kernelized-initialized/$s"
  $BIN --target kernelized "${PRE[@]}" "${GRID[@]}" --shard "$s/16" --out "$WORK/kernelized-pretrained-minilm/$s"
  for run in "${RUNS[@]}"; do merge_run "$run"; done
done
# SHARDS= : merge what WORK already holds.
[ -n "$SHARDS" ] || for run in "${RUNS[@]}"; do merge_run "$run"; done

$BIN plot --from "$OUT/initialized" --from "$OUT/pretrained-minilm" \
  --from "$OUT/kernelized-initialized" --from "$OUT/kernelized-pretrained-minilm" --out "$WORK/figures"
cp "$WORK/figures/field.png" "$WORK/figures/kernelized.png" "$OUT/"
