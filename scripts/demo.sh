#!/usr/bin/env bash
# Builds kvmm and runs the demos: the mini engine (a hybrid model served on kvmm; its
# report: requests, tokens/s, prefix hit rate, preemptions, peak KV memory and waste per
# group, and the KV events it published as vLLM's stream for a KV-aware router), then the layout printout (with the 2026 lineup: a Qwen3-Next-like hybrid and a DeepSeek-like MLA + DSA indexer) and allocation walk-through of examples/demo.cpp, then
# the Python engine on the bindings (examples/python/engine.py, checked against a recompute).
# With redis-server installed (scripts/deps.sh installs it), the mini engine also runs twice
# against one server (a unix socket in a temporary directory): engine A stores its KV pages,
# a fresh engine B on prompts sharing A's system prompts loads them (its tier hits).
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
if command -v redis-server >/dev/null &&
  ! "$build/examples/mini_engine/mini_engine" --tier redis:none --requests 1 2>&1 | grep -q "no kvmm::redis"; then
  echo
  echo "== two mini engines sharing KV pages through a redis-server (--tier)"
  tier_dir=$(mktemp -d)
  redis-server --port 0 --unixsocket "$tier_dir/redis.sock" --unixsocketperm 700 --save "" --appendonly no \
    --dir "$tier_dir" --daemonize yes --pidfile "$tier_dir/redis.pid" --logfile "$tier_dir/redis.log"
  trap 'kill "$(cat "$tier_dir/redis.pid" 2>/dev/null)" 2>/dev/null; rm -rf "$tier_dir"' EXIT
  for _ in $(seq 50); do [ -S "$tier_dir/redis.sock" ] && break; sleep 0.1; done
  echo "-- engine A (system prompts of seed 7, its own questions)"
  "$build/examples/mini_engine/mini_engine" --tier "redis:unix:$tier_dir/redis.sock" --suffix-seed 7 | grep -E "^(prefix hit|tier)"
  echo "-- engine B, fresh (the same system prompts, other questions)"
  "$build/examples/mini_engine/mini_engine" --tier "redis:unix:$tier_dir/redis.sock" --suffix-seed 8 | grep -E "^(prefix hit|tier|vAttention)"
fi
echo
echo "== layouts (the presets; a Qwen3-Next-like hybrid and a DeepSeek-like MLA + indexer, bf16 and fp8) and allocation walk-through (examples/demo.cpp)"
"$build/examples/kvmm_demo"
echo
echo "== Python engine on the bindings (examples/python/engine.py)"
/usr/bin/python3 examples/python/engine.py --build "$build" --check
