#!/usr/bin/env bash
# Checks the format and that includes point down the layers (docs/architecture.md); builds
# kvmm with warnings as errors and runs every test; the manager, caching and paging tests at
# debug tier 2; then everything again under AddressSanitizer + UndefinedBehaviorSanitizer;
# fuzzes the config reader and the KV event encoder (scripts/fuzz.sh, clang + libFuzzer);
# the memory tests under ThreadSanitizer; then uses kvmm as engines would: installed
# (find_package, pkg-config) and embedded (add_subdirectory, FetchContent), checking the
# embedding manners (tests/consumer/run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
kvmm_install_deps clang-format

echo "== format check (.clang-format over every C++/CUDA file, scripts/format.sh)"
scripts/format.sh --check

echo "== layers: every include points down the table of docs/architecture.md (scripts/check_layers.py)"
/usr/bin/python3 scripts/check_layers.py

jobs=$(nproc)
build=$(realpath -m "${KVMM_BUILD_ROOT:-build}")
# Compiles through ccache where the machine has it (CMake takes these at a build folder's
# first configure): a machine that built kvmm before, in any checkout, recompiles only what
# changed (paths are hashed relative to the checkout).
if command -v ccache >/dev/null 2>&1; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache CCACHE_BASEDIR=$PWD
fi

echo "== CUDA binary tools for the kernel static checks (cuobjdump/nvdisasm, pinned, /opt/kvmm-venvs/cuobjdump)"
scripts/kernel_tools.sh
echo "== cuDNN frontend headers for the cuDNN paged-SDPA prefill (pinned nvidia-cudnn-frontend, /opt/kvmm-venvs/cudnn-frontend-1.32.0)"
scripts/cudnn_frontend.sh

echo "== release build (-Werror) and tests"
cmake -S . -B "$build/release" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVMM_WERROR=ON \
  -DKVMM_BUILD_TESTS=ON -DKVMM_BUILD_BENCH=ON -DKVMM_BUILD_EXAMPLES=ON -DKVMM_PYTHON=ON \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON
cmake --build "$build/release" -j"$jobs"
ctest --test-dir "$build/release" --output-on-failure -j"$jobs"
echo "== lint: clang-tidy over src/ with .clang-tidy (scripts/lint.sh)"
kvmm_install_deps clang-tidy
scripts/lint.sh "$build/release"
echo "== the GPU script without a GPU: syntax, its parsers on the committed H100 output, the model on this build's census"
if command -v nvcc >/dev/null 2>&1; then
  KVMM_CENSUS_JSON="$build/release/kernels_census.json" bash scripts/gpu_kernels.sh --dry-run
else
  bash scripts/gpu_kernels.sh --dry-run
fi
echo "== Python package: pytest against the release build tree (tests/python)"
KVMM_BUILD="$build/release" /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python

echo "== vLLM: vLLM's own scheduler on kvmm (pinned vLLM in a venv outside the repo, kvmm pip-installed; tests/vllm)"
KVMM_BUILD_ROOT="$build" scripts/vllm_env.sh
"$(scripts/vllm_env.sh --python)" -m pytest -q -p no:cacheprovider tests/vllm

echo "== debug tier 2 (KVMM_DEBUG_CHECKS=2: every fast path checked against its generic path): manager, caching, paging tests"
# Only the three test binaries and the library, -O1 without -g: the tier's own checks are
# what this stage adds (tier 3, the full recount, runs in the sanitizer stage below).
cmake -S . -B "$build/debug2" -DCMAKE_BUILD_TYPE=Debug -DKVMM_WERROR=ON -DKVMM_CUDA=OFF -DKVMM_DEBUG_CHECKS=2 \
  -DKVMM_BUILD_TESTS=ON -DKVMM_BUILD_BENCH=OFF -DKVMM_BUILD_EXAMPLES=OFF -DKVMM_PYTHON=OFF \
  -DCMAKE_CXX_FLAGS_DEBUG="-O1"
cmake --build "$build/debug2" -j"$jobs" --target kvmm_test_manager kvmm_test_caching kvmm_test_paging
ctest --test-dir "$build/debug2" --output-on-failure -j"$jobs" -L '^(manager|caching|paging)$'

echo "== AddressSanitizer + UndefinedBehaviorSanitizer build and tests (debug tier 3; the plain path: no prefetch)"
cmake -S . -B "$build/asan" -DCMAKE_BUILD_TYPE=Debug -DKVMM_WERROR=ON -DKVMM_CUDA=OFF \
  -DKVMM_SANITIZE=address,undefined -DKVMM_DEBUG_CHECKS=3 -DKVMM_PREFETCH=OFF \
  -DKVMM_BUILD_TESTS=ON -DKVMM_BUILD_BENCH=OFF -DKVMM_BUILD_EXAMPLES=ON \
  -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g"
cmake --build "$build/asan" -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir "$build/asan" --output-on-failure -j"$jobs"
# The Python differential scripts replayed by the sanitized C++ driver (the module itself
# stays the release one: a sanitized extension cannot load into python3).
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  KVMM_BUILD="$build/release" KVMM_PY_DRIVER="$build/asan/python/kvmm_py_driver" \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python/test_differential.py

echo "== fuzz: libFuzzer + ASan + UBSan on read_hf_config and the KV event encoder, ${KVMM_FUZZ_SECONDS:-60}s each (scripts/fuzz.sh)"
scripts/fuzz.sh

echo "== ThreadSanitizer: memory tests (the background mapper thread), dist tests (publisher thread, Redis tier I/O threads)"
cmake -S . -B "$build/tsan" -DCMAKE_BUILD_TYPE=Debug -DKVMM_WERROR=ON -DKVMM_CUDA=OFF -DKVMM_SANITIZE=thread \
  -DKVMM_BUILD_TESTS=ON -DKVMM_BUILD_BENCH=OFF -DKVMM_BUILD_EXAMPLES=OFF -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g"
cmake --build "$build/tsan" -j"$jobs" --target kvmm_test_memory kvmm_test_distributed kvmm_test_distributed_events kvmm_test_distributed_redis
TSAN_OPTIONS=halt_on_error=1 "$build/tsan/tests/kvmm_test_memory"
TSAN_OPTIONS=halt_on_error=1 "$build/tsan/tests/kvmm_test_distributed"
# libzmq's own threads are invisible to TSan (tsan.supp); the [python] cases fork a
# consumer, which TSan does not support in a threaded process: they run in the stages above.
TSAN_OPTIONS="halt_on_error=1 suppressions=$PWD/tests/distributed/tsan.supp" "$build/tsan/tests/kvmm_test_distributed_events" "~[python]"
# The Redis tier against a real redis-server (spawned with posix_spawn, no fork).
TSAN_OPTIONS=halt_on_error=1 "$build/tsan/tests/kvmm_test_distributed_redis"

echo "== consumer: find_package (static, shared, kvmm::cuda), pkg-config, add_subdirectory, FetchContent"
tests/consumer/run.sh "$build/release" "$build/consumer"

echo "== all kvmm tests passed"
