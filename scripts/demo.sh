#!/usr/bin/env bash
# Builds kvmm and runs the demo: preset layouts, their page sizes, and an allocation
# walk-through.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
kvmm_install_deps

build=$(realpath -m "${KVMM_BUILD_ROOT:-build}")/demo
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVMM_BUILD_TESTS=OFF -DKVMM_BUILD_BENCH=OFF \
  -DKVMM_BUILD_EXAMPLES=ON -DKVMM_CUDA=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target kvmm_demo >/dev/null
"$build/examples/kvmm_demo" "$@"
