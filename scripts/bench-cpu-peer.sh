#!/usr/bin/env bash
# Issue 33, side by side with PyTorch in one run (BENCHMARKS.md "Exact attention and the decoder
# forward against PyTorch"): exact causal attention per head (the fused kernel, the two-pass kernel
# it replaced, PyTorch's SDPA), and SmolLM2's Q/K/V of layer 15 (`dump-qkv`, against transformers'
# SDPA forward through the layers before it, loading excluded), then the Q/K/V cache's read.
# Needs ../shared/data and a Python with torch, transformers, gguf and accelerate (PY).
set -euo pipefail
BIN=${BIN:-./target/release/approx-bench}
PY=${PY:-python3}
THREADS=${THREADS:-2}
SMOL=(--model pretrained --model-dir ../shared/data/SmolLM2-135M-Instruct-Q4_1 --corpus ../shared/data/wikitext-2/wiki.test.raw)
export RAYON_NUM_THREADS=$THREADS
for n in ${LENGTHS:-4096 8192 32768}; do
  echo "== n = $n: exact causal attention per head (layer 0's Q/K/V), fused and two-pass"
  $BIN bench "${SMOL[@]}" --layer 0 --lengths "$n" --methods window --features 64 --repeats 3 --qkv-cache off \
    | grep -E "matmul peak|exact attention per head|two-pass kernel"
done
# The machine is shared and noisy: the kernel and SDPA alternated, ROUNDS times at n = 8192.
echo "== paired: the fused kernel (bench, layer 0's Q/K/V) and SDPA alternated, n = 8192"
for r in $(seq "${ROUNDS:-5}"); do
  $BIN bench "${SMOL[@]}" --layer 0 --lengths 8192 --methods window --features 64 --repeats 3 --qkv-cache off \
    | grep -oE "exact attention per head [0-9.]+ ms" | sed "s/^/round $r: /"
  $PY scripts/peer-forward.py --n 8192 --threads "$THREADS" --sdpa-only 2>/dev/null | sed "s/^/round $r: /"
done
for n in ${FORWARD_LENGTHS:-4096 8192}; do
  echo "== n = $n: Q/K/V of layer 15 (dump-qkv, whole process) and the PyTorch peer"
  /usr/bin/time -f "approx-bench dump-qkv: %e s wall, %U s user" \
    $BIN dump-qkv "${SMOL[@]}" --layer 15 --length "$n" --qkv-cache off --out "$(mktemp -d)/qkv.safetensors"
  $PY scripts/peer-forward.py --n "$n" --layer 15 --threads "$THREADS" 2>/dev/null | tail -1
  $BIN bench "${SMOL[@]}" --layer 15 --lengths "$n" --methods window --features 64 --repeats 1 \
    | grep -E "Q/K/V of one window|read back"
done
echo "== a decoder sweep twice into a fresh Q/K/V cache: the second run skips the forward"
CACHE=$(mktemp -d)
SWEEP=("${SMOL[@]}" --layer 15 --lengths 2048 --windows 2 --methods window,streaming --features 64,256 --quiet --qkv-cache "$CACHE" --force)
/usr/bin/time -f "first sweep: %e s wall" $BIN "${SWEEP[@]}" --out "$CACHE/run1"
/usr/bin/time -f "second sweep: %e s wall" $BIN "${SWEEP[@]}" --out "$CACHE/run2"
rm -rf "$CACHE"
