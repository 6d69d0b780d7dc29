#!/usr/bin/env bash
# Issue 46: the Fig. 1 side-by-side workload (BENCHMARKS.md, the commands at its top) against the
# PyTorch peer (benches/pytorch_sweep.py), alternated ROUNDS times, each process timed whole on
# THREADS threads; prints each round's times and ratio. Needs ../shared/data and a Python with
# torch (PY).
set -euo pipefail
BIN=${BIN:-./target/release/approx-bench}
PY=${PY:-python3}
THREADS=${THREADS:-2}
export RAYON_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS
OUT=$(mktemp -d)
for r in $(seq "${ROUNDS:-5}"); do
  s=$(date +%s.%N)
  $BIN --model initialized --model-dir ../shared/data/bert-base-cased \
    --corpus ../shared/data/wikitext-2/wiki.test.raw --lengths 1024 --windows 2 \
    --methods skyformer,nystromformer,performer,informer,skeinformer,vmean,linformer \
    --out "$OUT/w" --quiet --force
  m=$(date +%s.%N)
  $PY benches/pytorch_sweep.py --threads "$THREADS" --out "$OUT/torch.csv" > /dev/null 2>&1
  e=$(date +%s.%N)
  awk -v r="$r" -v a="$(echo "$m - $s" | bc)" -v b="$(echo "$e - $m" | bc)" \
    'BEGIN { printf "round %d: approx-bench %.2f s, pytorch %.2f s, ratio %.2f\n", r, a, b, b / a }'
done
rm -rf "$OUT"
