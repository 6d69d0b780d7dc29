#!/usr/bin/env bash
# Packs into .gpu/ what scripts/gpu-check.sh needs on a GPU machine that has a driver and PyTorch's
# CUDA 13 libraries but no toolchain, no network and no ../shared (docs/gpu.md):
# - the CUDA binary and the unit and pipeline test binaries of `scripts/build-cuda.sh --tests`,
#   gzipped (about 50 MB in all);
# - bert-base-cased's config and tokenizer and Wikitext-2's test split from ../shared/data;
# - the initialized decoder of results/decoder (its Llama-3.2-1B-shaped config with SmolLM2's
#   tokenizer; the GGUF weights, 98 MB, do not fit a call);
# - SmolLM2-135M's config.json and tokenizer, for the end-to-end check on an initialized model of
#   its shape (its GGUF does not fit either);
# - this checkout's path, which the test binaries name.
# .gpu/ is git-ignored through .git/info/exclude, which this script extends; name .gpu in the call's
# carried paths, and run `bash scripts/gpu-check.sh` there.
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
scripts/build-cuda.sh --tests 2>&1 | tee "$log" >&2
exe() { sed -n "s|.*Executable $1 (\(.*\))|\1|p" "$log" | head -1; }
lib=$(exe "unittests src/lib.rs")
pipeline=$(exe "tests/pipeline.rs")
[ -n "$lib" ] && [ -n "$pipeline" ] || { echo "gpu-pack: no test binaries in the build's output" >&2; exit 1; }
target=${CARGO_TARGET_DIR:-target}
exclude="$(git rev-parse --git-path info/exclude)"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
rm -rf .gpu && mkdir -p .gpu/tests .gpu/data/bert-base-cased .gpu/data/wikitext-2 .gpu/data/llama-shape .gpu/data/smollm2-shape
gzip -9c "$target/release/approx-bench" > .gpu/approx-bench.gz
for t in "$lib" "$pipeline"; do gzip -9c "$t" > ".gpu/tests/$(basename "$t").gz"; done
data=../shared/data
cp "$data/bert-base-cased/"{config.json,tokenizer_config.json} .gpu/data/bert-base-cased/
gzip -9c "$data/bert-base-cased/tokenizer.json" > .gpu/data/bert-base-cased/tokenizer.json.gz
gzip -9c "$data/wikitext-2/wiki.test.raw" > .gpu/data/wikitext-2/wiki.test.raw.gz
cp results/decoder/llama-3.2-1b-shape.json .gpu/data/llama-shape/config.json
cp "$data/SmolLM2-135M-Instruct-Q4_1/tokenizer_config.json" .gpu/data/llama-shape/
gzip -9c "$data/SmolLM2-135M-Instruct-Q4_1/tokenizer.json" > .gpu/data/llama-shape/tokenizer.json.gz
smol=$data/SmolLM2-135M-Instruct-Q4_1
cp "$smol/"{config.json,tokenizer_config.json} .gpu/data/smollm2-shape/
gzip -9c "$smol/tokenizer.json" > .gpu/data/smollm2-shape/tokenizer.json.gz
pwd > .gpu/build-path
echo "gpu-pack: .gpu/ holds $(du -sh .gpu | cut -f1); the tracked files travel too (results/ is 157 MB: untrack it for the call, docs/gpu.md)" >&2
