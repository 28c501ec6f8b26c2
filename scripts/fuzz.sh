#!/usr/bin/env bash
# CI stage (scripts/test.sh): builds the libFuzzer targets of tests/fuzz with clang,
# AddressSanitizer and UndefinedBehaviorSanitizer (only the kvmm sources they reach), and
# fuzzes each for KVMM_FUZZ_SECONDS (default 60) from its seed corpus: read_hf_config from
# the real configs in tests/data, the KV event validator and encoder from tests/distributed/golden
# and tests/fuzz/regressions. A finding fails the stage and leaves its input under
# <build>/fuzz/findings/<target>/: fix it and add the input to tests/fuzz/regressions/<target>/,
# which every ordinary build replays under ctest. Cost: ~1 min build + 1 min per target.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
kvmm_install_deps clang libclang-rt-14-dev

seconds=${KVMM_FUZZ_SECONDS:-60}
build=$(realpath -m "${KVMM_BUILD_ROOT:-build}")/fuzz
cmake -S . -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" \
  -DKVMM_WERROR=ON -DKVMM_CUDA=OFF -DKVMM_SANITIZE=address,undefined -DKVMM_FUZZ=ON -DKVMM_BUILD_TESTS=ON \
  -DKVMM_BUILD_BENCH=OFF -DKVMM_BUILD_EXAMPLES=OFF -DKVMM_PYTHON=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target kvmm_fuzz_hf_config kvmm_fuzz_kv_events

run() {
  local target=$1 max_len=$2
  shift 2
  local corpus="$build/corpus/$target" findings="$build/findings/$target"
  mkdir -p "$corpus" "$findings"
  echo "== fuzz $target for ${seconds}s (seeds: $*)"
  # New inputs go to the first corpus directory (in the build tree); the seeds are read only.
  if ! ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$build/tests/kvmm_fuzz_$target" "$corpus" "$@" -max_total_time="$seconds" -max_len="$max_len" \
    -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$findings/" -print_final_stats=1 >"$build/$target.log" 2>&1; then
    tail -n 60 "$build/$target.log"
    echo "fuzz $target: a finding, its input in $findings (log: $build/$target.log)" >&2
    exit 1
  fi
  grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::(number_of_executed_units|peak_rss_mb)' "$build/$target.log" || true
}
run hf_config 16384 tests/data tests/fuzz/regressions/hf_config
run kv_events 1024 tests/distributed/golden tests/fuzz/regressions/kv_events
echo "== fuzz: no findings"
