#!/usr/bin/env bash
# Issue 21's GPU checks in one call, on the machine with the GPU, from the checkout's root with the
# .gpu/ of scripts/gpu-pack.sh beside it: the unit and pipeline tests on cuda, the Skyformer preset
# on cuda (batched, profiled), the same on 8 windows batched, head by head and on the machine's CPU
# cores, `bench`, the Skeinformer preset, and the decoder path (issue 23: one shard of the
# initialized Llama-shaped model at n = 8192 on cuda and on the CPU cores), and the decode protocol
# (issue 35) on cuda and the CPU cores. Each step has a timeout; OUT (default /tmp/out) receives
# log.txt, tests.txt, bench.txt and five archives of trials (at most 8 files come back from a
# device call). Compare the presets' trials with the committed CPU runs afterwards.
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
  timeout "$limit" "$@" > /tmp/step.txt 2>&1
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
gunzip -kf $D/wikitext-2/wiki.test.raw.gz $D/bert-base-cased/tokenizer.json.gz $D/llama-shape/tokenizer.json.gz
# The test binaries name the build checkout's absolute path: link it to this checkout.
BUILD_PATH=$(cat .gpu/build-path)
[ "$BUILD_PATH" = "$ROOT" ] || { mkdir -p "$(dirname "$BUILD_PATH")" && ln -sfn "$ROOT" "$BUILD_PATH"; }
BIN=$ROOT/target/release/approx-bench
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv >> "$LOG" 2>&1
echo "cpus $(nproc)" >> "$LOG"
C=(--model initialized --model-dir $D/bert-base-cased --corpus $D/wikitext-2/wiki.test.raw --quiet)

export RUST_BACKTRACE=0 RUST_LIB_BACKTRACE=0
log "1 unit tests and pipeline tests on cuda"
cd "$BUILD_PATH"
for t in "${TESTS[@]}"; do
  APPROX_BENCH_TEST_DEVICE=cuda timeout 100 "$t" --test-threads 8 > /tmp/t.txt 2>&1; echo "exit $?" >> /tmp/t.txt
  grep -E "test result|^exit" /tmp/t.txt >> "$LOG"
  sed -n '/^failures:/,/^test result/p' /tmp/t.txt | head -120 >> "$OUT/tests.txt"
done
for t in "${TESTS[@]}"; do
  case $t in */approx_bench-*) ;; *) continue ;; esac
  APPROX_BENCH_TEST_DEVICE=cuda timeout 30 "$t" every_batched_method --nocapture >> "$OUT/tests.txt" 2>&1
  APPROX_BENCH_TEST_DEVICE=cuda timeout 30 "$t" batched_heads_with_shared_kv --nocapture >> "$OUT/tests.txt" 2>&1
done
cd "$ROOT"

log "2 Skyformer preset, cuda, 64 windows, batched, profiled"
APPROX_BENCH_PROFILE=1 step preset-cuda-64 90 $BIN --figure skyformer "${C[@]}" --windows 64 --device cuda --out /tmp/sky-cuda
gzip -c /tmp/sky-cuda/trials.csv > "$OUT/sky-cuda-trials.csv.gz"

log "3 the same on 8 windows: batched, head by head (before), the 16 CPU cores"
APPROX_BENCH_PROFILE=1 step preset-cuda-8 30 $BIN --figure skyformer "${C[@]}" --windows 8 --device cuda --out /tmp/sky8-cuda
APPROX_BENCH_PROFILE=1 APPROX_BENCH_HEAD_BATCH=0 step preset-cuda-8-per-head 40 $BIN --figure skyformer "${C[@]}" --windows 8 --device cuda --out /tmp/sky8-perhead
step preset-cpu16-8 30 $BIN --figure skyformer "${C[@]}" --windows 8 --device cpu --out /tmp/sky8-cpu
tar czf "$OUT/sky8.tgz" -C /tmp sky8-cuda/trials.csv sky8-perhead/trials.csv sky8-cpu/trials.csv

log "4 bench, cuda"
timeout 30 $BIN bench "${C[@]}" --lengths 4096,16384 --methods skyformer,nystromformer,performer,informer \
  --features 64 --device cuda > "$OUT/bench.txt" 2>&1
echo "-- bench: exit $?" >> "$LOG"

log "5 Skeinformer preset, cuda, 64 windows, profiled"
APPROX_BENCH_PROFILE=1 step skein-cuda-64 70 $BIN --figure skeinformer "${C[@]}" --windows 64 --device cuda --out /tmp/skein-cuda
gzip -c /tmp/skein-cuda/trials.csv > "$OUT/skein-cuda-trials.csv.gz"

log "6 decoder: results/decoder's initialized model at n = 8192, shard 1 of 16 (3 windows x 32 heads), cuda and CPU"
# Its main methods as results/decoder/run.sh runs them; the CPU step may be cut by its timeout (its
# rows so far give a rate). The committed CPU run's shard 1 is the reference for the rows.
DEC=(--model initialized --model-dir $D/llama-shape --layer 0 --corpus $D/wikitext-2/wiki.test.raw
     --lengths 8192 --windows 36 --shard 1/16 --quiet
     --methods vmean,performer_favor,window,topk,streaming,h2o,quest,moba,block_sparse,xattention,vertical_slash
     --features 16,32,64,128,256,512,1024,2048)
APPROX_BENCH_PROFILE=1 step decoder-cuda 150 $BIN "${DEC[@]}" --device cuda --out /tmp/dec-cuda
step decoder-cpu16 90 $BIN "${DEC[@]}" --device cpu --out /tmp/dec-cpu
tar czf "$OUT/decoder.tgz" -C /tmp dec-cuda/trials.csv dec-cpu/trials.csv

log "7 decode protocol (issue 35): the same model at n = 2048, --decode 256, 2 windows, cuda and CPU"
# Heads one after another on the device's host thread; the rows should equal the CPU's within f32
# rounding, except where a near-tie in a score flips a kept key (compare sets via keys and mass).
DCD=(--model initialized --model-dir $D/llama-shape --layer 0 --corpus $D/wikitext-2/wiki.test.raw
     --lengths 2048 --windows 2 --decode 256 --quiet --methods decode,kv_q8_0,kv_q4_0,kivi2)
APPROX_BENCH_PROFILE=1 step decode-cuda 90 $BIN "${DCD[@]}" --device cuda --out /tmp/dcd-cuda
step decode-cpu16 90 $BIN "${DCD[@]}" --device cpu --out /tmp/dcd-cpu
tar czf "$OUT/decode.tgz" -C /tmp dcd-cuda/trials.csv dcd-cpu/trials.csv
log done
