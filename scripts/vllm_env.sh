#!/usr/bin/env bash
# Creates (or reuses) the virtual environment of kvmm's vLLM integration tests and installs
# kvmm into it as a vLLM user would (pip install ./python, a PEP 517 build through CMake).
# The environment lives outside the repository at a fixed path (KVMM_VLLM_VENV, default
# /opt/kvmm-venvs/vllm-<version>) so later runs reuse it: a fresh machine downloads about
# 3 GB (vLLM pins a CUDA build of torch with its nvidia-* wheels) and takes minutes; a
# machine that has it only rebuilds kvmm's module (ccache) and reinstalls the package.
# `scripts/vllm_env.sh --python` only prints the venv's python (scripts/test.sh runs the
# tests with it).
set -euo pipefail
cd "$(dirname "$0")/.."

# The pinned versions (vLLM pins torch itself). docs/vllm.md says what they cost.
VLLM_VERSION=0.33.0
TRANSFORMERS_VERSION=5.20.2
PYTEST_VERSION=9.2.0
VENV=${KVMM_VLLM_VENV:-/opt/kvmm-venvs/vllm-$VLLM_VERSION}
STAMP="$VENV/.kvmm-pins"
if [ "${1:-}" = "--python" ]; then
  echo "$VENV/bin/python"
  exit 0
fi
PINS="vllm==$VLLM_VERSION transformers==$TRANSFORMERS_VERSION pytest==$PYTEST_VERSION"
# Debian packages: kvmm's build dependencies and python3-venv.
source scripts/deps.sh
kvmm_install_deps python3-venv

if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$PINS" ]; then
  echo "== vLLM environment: creating $VENV ($PINS)"
  mkdir -p "$(dirname "$VENV")"
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV"
  start=$(date +%s)
  # shellcheck disable=SC2086
  "$VENV/bin/pip" install --progress-bar off -q $PINS
  echo "== vLLM environment: installed in $(($(date +%s) - start)) s, $(du -sh "$VENV" | cut -f1)"
  echo "$PINS" > "$STAMP"
fi

# kvmm itself, from this checkout, through its pyproject.toml (setuptools + CMake; pybind11
# from PyPI in the isolated build environment). The CMake build folder is kept between runs
# and compiled through ccache when it is installed.
if command -v ccache >/dev/null 2>&1; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache
fi
export KVMM_PIP_BUILD_DIR=${KVMM_PIP_BUILD_DIR:-$(realpath -m "${KVMM_BUILD_ROOT:-build}")/vllm-pip}
"$VENV/bin/pip" install --progress-bar off -q --force-reinstall --no-deps ./python
