#!/usr/bin/env bash
# The GPU checks of issues 21 and 34 in one call (about 9 minutes), on the machine with the GPU,
# from the checkout's root with the .gpu/ of scripts/gpu-pack.sh beside it, most important first:
#  1. the unit tests of the exact targets, the fused kernel and the batched methods on cuda;
#  2. `bench`: exact attention at n = 4096, 16384, 65536, both masks, with the project's CUDA
#     kernels and without them (APPROX_BENCH_CUDA_KERNELS=0: candle's blocked path), against the
#     card's f32 matmul peak; PyTorch's SDPA in f32 on the same card beside it;
#  3. the Skyformer preset (64 windows) on cuda, profiled;
#  4. the decoder check (issue 23/34): six heads of one window of results/decoder's initialized
#     model at n = 8192 on cuda and on the CPU cores;
#  5. the Skyformer preset on 8 windows: cuda, cuda without the kernels, the 16 CPU cores;
#  6. the Skeinformer preset (64 windows) on cuda, profiled;
#  7. the PyTorch peer on cuda (benches/pytorch_sweep.py --device cuda) beside the same binary on
#     the same lengths and windows;
#  8. end to end (issue 47): SmolLM2-135M's shape, initialized, one window at n = 1024 with a
#     method in every layer, on cuda and on the 16 CPU cores, compared by scripts/gpu-compare-e2e.py;
#  9. every unit test and the pipeline tests on cuda.
# Each step has a timeout; OUT (default /tmp/out) receives log.txt, tests.txt, bench.txt and
# archives of trials (at most 8 files come back from a device call). Compare the trials with the
# committed CPU runs afterwards (scripts/gpu-compare.py).
set -u
ROOT=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LOG=$OUT/log.txt
log() { echo "== $(date +%T) $*" | tee -a "$LOG"; }
# step NAME SECONDS CMD...: runs CMD with a timeout, its output appended to the log, and its wall time.
step() {
  local name=$1 limit=$2; shift 2
  local s=$(date +%s%N)
  # -k: a sweep stops gracefully on SIGTERM after its current window (which kept a decoder step
  # running 218 s past its limit on an H200); SIGKILL 10 s later bounds it.
  timeout -k 10 "$limit" "$@" > /tmp/step.txt 2>&1
  local rc=$? e=$(( ($(date +%s%N) - s) / 1000000 ))
  tail -14 /tmp/step.txt >> "$LOG"
  echo "-- $name: exit $rc, wall $e ms" | tee -a "$LOG"
}
export LD_LIBRARY_PATH="$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))'):${LD_LIBRARY_PATH:-}"
mkdir -p target/release/deps
gunzip -c .gpu/approx-bench.gz > target/release/approx-bench && chmod +x target/release/approx-bench
# The carried test binaries (and only those: a build directory may hold others).
TESTS=()
for t in .gpu/tests/*.gz; do
  b=target/release/deps/$(basename "$t" .gz); gunzip -c "$t" > "$b"; chmod +x "$b"; TESTS+=("$b")
done
D=$ROOT/.gpu/data
gunzip -kf $D/wikitext-2/wiki.test.raw.gz $D/bert-base-cased/tokenizer.json.gz $D/llama-shape/tokenizer.json.gz \
  $D/smollm2-shape/tokenizer.json.gz
# The test binaries name the build checkout's absolute path: link it to this checkout.
BUILD_PATH=$(cat .gpu/build-path)
[ "$BUILD_PATH" = "$ROOT" ] || { mkdir -p "$(dirname "$BUILD_PATH")" && ln -sfn "$ROOT" "$BUILD_PATH"; }
BIN=$ROOT/target/release/approx-bench
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv >> "$LOG" 2>&1
echo "cpus $(nproc)" >> "$LOG"
C=(--model initialized --model-dir $D/bert-base-cased --corpus $D/wikitext-2/wiki.test.raw --quiet)

export RUST_BACKTRACE=0 RUST_LIB_BACKTRACE=0
lib_tests() { for t in "${TESTS[@]}"; do case $t in */approx_bench-*) echo "$t" ;; esac; done; }
LIB=$(lib_tests)

log "1 unit tests of the targets, the kernels and the batched methods on cuda"
cd "$BUILD_PATH"
APPROX_BENCH_TEST_DEVICE=cuda timeout 90 "$LIB" --test-threads 4 exact flash informer batched every_batched_method \
  > /tmp/t1.txt 2>&1; echo "exit $?" >> /tmp/t1.txt
grep -E "test result|^exit|panicked|FAILED" /tmp/t1.txt | head -20 >> "$LOG"
sed -n '/^failures:/,/^test result/p' /tmp/t1.txt | head -80 >> "$OUT/tests.txt"
cd "$ROOT"

log "2 bench: exact attention with and without the project's kernels; SDPA beside it"
B=(bench "${C[@]}" --methods vmean --features 8)
for mask in none causal; do
  timeout -k 10 60 $BIN "${B[@]}" --mask $mask --lengths 4096,16384,65536 --device cuda >> "$OUT/bench.txt" 2>&1
  echo "-- bench $mask fused: exit $?" | tee -a "$LOG" >> "$OUT/bench.txt"
  APPROX_BENCH_CUDA_KERNELS=0 timeout -k 10 60 $BIN "${B[@]}" --mask $mask --lengths 4096,16384 --device cuda >> "$OUT/bench.txt" 2>&1
  echo "-- bench $mask candle (kernels off): exit $?" | tee -a "$LOG" >> "$OUT/bench.txt"
done
grep -E "peak|exact attention|^-- bench|^n =|n=" "$OUT/bench.txt" | head -60 >> "$LOG"
PYTHONUNBUFFERED=1 timeout 60 python3 scripts/sdpa-cuda.py >> "$LOG" 2>&1

log "3 Skyformer preset, cuda, 64 windows, profiled"
APPROX_BENCH_PROFILE=1 step preset-cuda-64 90 $BIN --figure skyformer "${C[@]}" --windows 64 --device cuda --out /tmp/sky-cuda
gzip -c /tmp/sky-cuda/trials.csv > "$OUT/sky-cuda-trials.csv.gz"

log "4 decoder: results/decoder's initialized model at n = 8192, one window, heads 0-5, cuda and CPU"
# One window, six heads (528 trials): on an H200 the decoder methods ran head by head at 8.5
# trials/s on cuda against 51/s on the 16 CPU cores (2026-11-27), so three windows of 32 heads did
# not fit the step.
DEC=(--model initialized --model-dir $D/llama-shape --layer 0 --corpus $D/wikitext-2/wiki.test.raw
     --lengths 8192 --windows 1 --heads 0,1,2,3,4,5 --quiet
     --methods vmean,performer_favor,window,topk,streaming,h2o,quest,moba,block_sparse,xattention,vertical_slash
     --features 16,32,64,128,256,512,1024,2048)
APPROX_BENCH_PROFILE=1 step decoder-cuda 120 $BIN "${DEC[@]}" --device cuda --out /tmp/dec-cuda
step decoder-cpu16 60 $BIN "${DEC[@]}" --device cpu --out /tmp/dec-cpu
tar czf "$OUT/decoder.tgz" -C /tmp dec-cuda/trials.csv dec-cpu/trials.csv

log "5 Skyformer preset, 8 windows: cuda, cuda without the project's kernels, the 16 CPU cores"
APPROX_BENCH_PROFILE=1 step preset-cuda-8 30 $BIN --figure skyformer "${C[@]}" --windows 8 --device cuda --out /tmp/sky8-cuda
APPROX_BENCH_PROFILE=1 APPROX_BENCH_CUDA_KERNELS=0 step preset-cuda-8-candle 30 $BIN --figure skyformer "${C[@]}" --windows 8 --device cuda --out /tmp/sky8-candle
step preset-cpu16-8 30 $BIN --figure skyformer "${C[@]}" --windows 8 --device cpu --out /tmp/sky8-cpu
tar czf "$OUT/sky8.tgz" -C /tmp sky8-cuda/trials.csv sky8-candle/trials.csv sky8-cpu/trials.csv

log "6 Skeinformer preset, cuda, 64 windows, profiled"
APPROX_BENCH_PROFILE=1 step skein-cuda-64 70 $BIN --figure skeinformer "${C[@]}" --windows 64 --device cuda --out /tmp/skein-cuda
gzip -c /tmp/skein-cuda/trials.csv > "$OUT/skein-cuda-trials.csv.gz"

log "7 the PyTorch peer on cuda: the preset's four methods at n = 4096, 8 windows (needs transformers there)"
PYTHONUNBUFFERED=1 timeout -k 10 90 python3 benches/pytorch_sweep.py --device cuda --n 4096 --windows 8 \
  --model-dir $D/bert-base-cased --corpus $D/wikitext-2/wiki.test.raw --embedding word-pos-first \
  --methods skyformer,nystromformer,performer,informer --features 8,16,32,64,128,256 --out /tmp/peer.csv \
  > /tmp/peer.txt 2>&1; echo "-- peer: exit $?" >> /tmp/peer.txt
head -40 /tmp/peer.txt >> "$LOG"
APPROX_BENCH_PROFILE=1 step preset-n4096-cuda-8 40 $BIN --figure skyformer "${C[@]}" --lengths 4096 --windows 8 --device cuda --out /tmp/sky4096

log "8 end to end: SmolLM2-135M's shape initialized (its GGUF does not fit a call), n = 1024, cuda and the CPU cores"
E2E=(e2e --model initialized --model-dir $D/smollm2-shape --corpus $D/wikitext-2/wiki.test.raw --lengths 1024
     --windows 1 --n-f 256 --methods window,topk,streaming,snapkv,dec_window,kv_q4_0,dkv_q4_0 --features 64,256
     --positions --quiet)
step e2e-cuda 60 $BIN "${E2E[@]}" --device cuda --out /tmp/e2e-cuda
step e2e-cpu16 45 $BIN "${E2E[@]}" --device cpu --out /tmp/e2e-cpu
python3 scripts/gpu-compare-e2e.py /tmp/e2e-cpu /tmp/e2e-cuda >> "$LOG" 2>&1; echo "-- e2e compare: exit $?" >> "$LOG"
tar czf "$OUT/e2e.tgz" -C /tmp e2e-cuda/e2e.csv e2e-cuda/e2e_positions.csv e2e-cuda/ids.txt \
  e2e-cpu/e2e.csv e2e-cpu/e2e_positions.csv

log "9 every unit test and the pipeline tests on cuda"
cd "$BUILD_PATH"
for t in "${TESTS[@]}"; do
  APPROX_BENCH_TEST_DEVICE=cuda timeout 80 "$t" --test-threads 8 > /tmp/t.txt 2>&1; echo "exit $?" >> /tmp/t.txt
  grep -E "test result|^exit" /tmp/t.txt >> "$LOG"
  sed -n '/^failures:/,/^test result/p' /tmp/t.txt | head -120 >> "$OUT/tests.txt"
done
cd "$ROOT"
log done
