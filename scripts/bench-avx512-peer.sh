#!/usr/bin/env bash
# Issue 46 on one machine, every round paired (BENCHMARKS.md "AVX-512 dispatch"): the Fig. 1 workload
# against the PyTorch peer (scripts/bench-fig1-peer.sh), the fused kernel at n = 8192 on the AVX-512 and
# AVX2 paths against SDPA, and SmolLM2's layer-15 Q/K/V (dump-qkv, whole process) against transformers'
# forward. Needs ../shared/data and a Python with torch, transformers and accelerate (PY).
set -euo pipefail
BIN=${BIN:-./target/release/approx-bench}
export PY=${PY:-python3} BIN THREADS=${THREADS:-2}
export RAYON_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS
SMOL=(--model pretrained --model-dir ../shared/data/SmolLM2-135M-Instruct-Q4_1 --corpus ../shared/data/wikitext-2/wiki.test.raw)
date -u; uptime
echo "== Fig. 1 workload vs PyTorch peer"
ROUNDS=${ROUNDS:-5} scripts/bench-fig1-peer.sh
echo "== kernel (AVX-512, AVX2) vs SDPA, n = 8192, alternated"
for r in $(seq "${ROUNDS:-5}"); do
  for p in avx512 avx2; do
    AB_SIMD=$p $BIN bench "${SMOL[@]}" --layer 0 --lengths 8192 --methods window --features 64 --repeats 3 --qkv-cache off \
      | grep -oE "matmul peak[^;]*|kernel path [a-z0-9]+|exact attention per head [0-9.]+ ms" | tr '\n' ' ' | sed "s/^/round $r $p: /"
    echo
  done
  $PY scripts/peer-forward.py --n 8192 --threads "$THREADS" --sdpa-only 2>/dev/null | sed "s/^/round $r: /"
done
echo "== dump-qkv layer 15, n = 8192, vs transformers' forward"
OUT=$(mktemp -d)
for r in $(seq "${FORWARD_ROUNDS:-3}"); do
  /usr/bin/time -f "round $r approx-bench dump-qkv: %e s wall" \
    $BIN dump-qkv "${SMOL[@]}" --layer 15 --length 8192 --qkv-cache off --out "$OUT/qkv.safetensors" > /dev/null
  $PY scripts/peer-forward.py --n 8192 --layer 15 --threads "$THREADS" 2>/dev/null | tail -1 | sed "s/^/round $r: /"
done
rm -rf "$OUT"
date -u; uptime
