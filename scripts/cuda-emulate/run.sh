#!/usr/bin/env bash
# Emulates the project's CUDA kernels (src/numerics/cuda/*.cu, concatenated as NVRTC compiles them)
# on the host and checks them against float64 (emulate.cpp says how). Needs g++ with C++20; no GPU,
# no CUDA toolkit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The one line that differs on the host: the block's dynamic shared memory.
src="$here/../../src/numerics/cuda"
cat "$src/common.cuh" "$src/attention.cu" "$src/sampled_logits.cu" |
  sed 's|extern __shared__ __align__(16) unsigned char smem_raw\[\];|unsigned char* smem_raw = shared_block;|' \
  > "$work/attention_host.inc"
grep -q 'smem_raw = shared_block' "$work/attention_host.inc" || { echo "emulate: shared-memory line not found" >&2; exit 1; }
g++ -std=c++20 -O2 -pthread -I"$work" "$here/emulate.cpp" -o "$work/emulate"
"$work/emulate"
