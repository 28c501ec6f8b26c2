#!/usr/bin/env bash
# Builds kvmm and runs the demos: the mini engine (a hybrid model served on kvmm; its
# report: requests, tokens/s, prefix hit rate, preemptions, peak KV memory and waste per
# group, and the KV events it published as vLLM's stream for a KV-aware router), then the layout printout and allocation walk-through of examples/demo.cpp, then
# the Python engine on the bindings (examples/python/engine.py, checked against a recompute).
# Extra arguments go to the mini engine (--requests N --large-pages N --host-pages N).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
kvmm_install_deps

build=$(realpath -m "${KVMM_BUILD_ROOT:-build}")/demo
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVMM_BUILD_TESTS=OFF -DKVMM_BUILD_BENCH=OFF \
  -DKVMM_BUILD_EXAMPLES=ON -DKVMM_CUDA=OFF -DKVMM_PYTHON=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target mini_engine kvmm_demo kvmm_python >/dev/null
echo "== mini engine (examples/mini_engine)"
"$build/examples/mini_engine/mini_engine" --events "ipc://$build/kv-events" "$@"
echo
echo "== layouts and allocation walk-through (examples/demo.cpp)"
"$build/examples/kvmm_demo"
echo
echo "== Python engine on the bindings (examples/python/engine.py)"
/usr/bin/python3 examples/python/engine.py --build "$build" --check
