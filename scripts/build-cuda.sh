#!/usr/bin/env bash
# Builds target/release/approx-bench with --features cuda on a machine with no GPU, no driver and no CUDA
# toolkit (docs/gpu.md). NVIDIA's compiler wheels (nvcc, headers, the static CUDA runtime) are installed
# into a virtual environment outside the repository and reused on later runs.
#
# The binary links no CUDA library: candle's cudarc is switched from `dynamic-linking` to `dynamic-loading`
# (candle-core 0.11 hard-codes the former, and cudarc refuses both at once, so a copy of candle-core's
# registry source with that one word changed is patched in for this build only), and the CUDA runtime that
# candle-kernels' statically compiled kernels need is linked statically. At run time the binary dlopens
# libcuda.so.1 (the driver), libcublas.so.13, libcublasLt.so.13, libcurand.so.10 and libnvrtc.so.13 by
# their standard names, only when --device cuda is asked for; the same binary runs --device cpu anywhere.
#
# Usage: scripts/build-cuda.sh            build target/release/approx-bench (--features cuda)
#        scripts/build-cuda.sh --tests    the same, and the test binaries (cargo test --no-run; their paths
#                                         are printed as "Executable ..."), for APPROX_BENCH_TEST_DEVICE=cuda
#        scripts/build-cuda.sh --check    type-check the cuda feature as shipped in Cargo.toml
#                                         (cargo check --release --locked --features cuda --all-targets,
#                                         target dir target/cuda-check; used by .ci/run)
# Variables: CUDA_COMPUTE_CAP (default 90 = H100/H200; 80 = A100, 89 = L4/L40, ...),
#            APPROX_BENCH_CUDA_VERSION (default 13.0: the wheels' CUDA release; keep it at or below the
#              CUDA version of the GPU machine's driver, which must JIT candle's PTX: driver 580 = CUDA 13.0),
#            APPROX_BENCH_CUDA_VENV (default ~/.cache/approx-bench/cuda-<version>-venv),
#            CARGO_TARGET_DIR (as usual).
# Exit status: 0 done, 1 build or type error, 3 the CUDA wheels could not be installed (no network, no pip).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=build
tests=no
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  --tests) tests=yes ;;
  *) echo "usage: $0 [--check | --tests]" >&2; exit 2 ;;
esac

cuda_version=${APPROX_BENCH_CUDA_VERSION:-13.0}
major=${cuda_version%%.*}
minor=${cuda_version#*.}
minor=${minor%%.*}
venv=${APPROX_BENCH_CUDA_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/approx-bench/cuda-$cuda_version-venv}
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}

# Compiler (nvvm pinned too: it writes the PTX, whose version the driver must know), headers and the
# static runtime; cuBLAS, cuRAND and NVRTC are loaded at run time, not linked.
wheels=(nvidia-cuda-nvcc nvidia-nvvm nvidia-cuda-crt nvidia-cuda-runtime nvidia-cuda-cccl)
stamp="$venv/.approx-bench-wheels"
want="${wheels[*]} ==$cuda_version.*"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "build-cuda: installing NVIDIA's CUDA $cuda_version compiler wheels into $venv (about 350 MB)" >&2
  if ! { python3 -m venv "$venv" &&
         "$venv/bin/pip" install -q --disable-pip-version-check --retries 2 "${wheels[@]/%/==$cuda_version.*}"; } >&2; then
    echo "build-cuda: could not install the CUDA $cuda_version wheels into $venv (no network, pip or python3-venv?)" >&2
    exit 3
  fi
  echo "$want" > "$stamp"
fi
cuda_root=$("$venv/bin/python" -c "import nvidia, os; print(os.path.join(nvidia.__path__[0], 'cu$major'))")
if [ ! -x "$cuda_root/bin/nvcc" ]; then
  echo "build-cuda: no nvcc under $cuda_root" >&2
  exit 3
fi
export PATH="$cuda_root/bin:$PATH" CUDA_ROOT="$cuda_root" CUDA_PATH="$cuda_root" CUDA_HOME="$cuda_root"
# cudarc's bindings for this CUDA release (cudarc knows 11.4 ... 13.4; without it it parses `nvcc --version`).
export CUDARC_CUDA_VERSION="${major}0${minor}0"
echo "build-cuda: $(nvcc --version | tail -1), sm_$CUDA_COMPUTE_CAP, cudarc bindings $CUDARC_CUDA_VERSION" >&2

if [ "$mode" = check ]; then
  exec cargo check --release --locked --features cuda --all-targets --target-dir "${CARGO_TARGET_DIR:-target}/cuda-check"
fi

# candle-core's registry source, with its cudarc dependency switched to dynamic-loading.
target=${CARGO_TARGET_DIR:-target}
mkdir -p "$target"
work=$(cd "$target" && pwd)/cuda-build
candle_src=$(cargo metadata --locked --format-version 1 --features cuda |
  "$venv/bin/python" -c 'import json, sys
print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "candle-core"))')
candle_src=$(dirname "$candle_src")
patched="$work/$(basename "$candle_src")"
rm -rf "$patched"
mkdir -p "$work"
cp -R "$candle_src" "$patched"
sed -i 's/^    "dynamic-linking",$/    "dynamic-loading",/' "$patched/Cargo.toml"
if ! awk '/^\[dependencies.cudarc\]/ { s = 1; next } /^\[/ { s = 0 } s && /"dynamic-loading",/ { n++ } END { exit (n != 1) }' \
    "$patched/Cargo.toml" || grep -q '"dynamic-linking"' "$patched/Cargo.toml"; then
  echo "build-cuda: $candle_src/Cargo.toml no longer enables cudarc's dynamic-linking as expected; update this script" >&2
  exit 1
fi

# candle-kernels links -lcudart: make it the static runtime (it dlopens the driver itself).
mkdir -p "$work/link"
ln -sf "$cuda_root/lib/libcudart_static.a" "$work/link/libcudart.a"
export APPROX_BENCH_CUDA_LINK_DIR="$work/link" # read by build.rs under the cuda feature

# The [patch] rewrites candle-core's entry in Cargo.lock; put the committed lock file back afterwards
# (meanwhile, other cargo commands with --locked in this checkout fail).
cp -p Cargo.lock "$work/Cargo.lock.orig"
trap 'cp -p "$work/Cargo.lock.orig" Cargo.lock' EXIT
trap 'exit 130' INT TERM
patch=(--config "patch.crates-io.candle-core.path=\"$patched\"")
cargo build --release --features cuda --bin approx-bench "${patch[@]}"
if [ "$tests" = yes ]; then
  cargo test --release --features cuda --no-run "${patch[@]}"
fi

bin="$target/release/approx-bench"
if readelf -d "$bin" | grep -E 'NEEDED.*lib(cuda|cudart|cublas|curand|nvrtc)'; then
  echo "build-cuda: $bin still links a CUDA library" >&2
  exit 1
fi
echo "build-cuda: built $bin ($(du -h "$bin" | cut -f1)); it loads the CUDA libraries at run time" >&2
