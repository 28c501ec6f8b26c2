#!/usr/bin/env bash
# Installs the cuDNN frontend (NVIDIA's header-only C++ API over cuDNN 9's backend) that
# kvmm_cudnn compiles against (cmake/cudnn.cmake: the cuDNN paged-SDPA prefill, its GPU test
# and bench rows): PyPI nvidia-cudnn-frontend, pinned, into a venv at a fixed path outside
# the repository; only its include/ (3.2 MB, 90 headers) is used, so its Python
# dependencies are not installed (--no-deps). Idempotent: seconds when already installed;
# a first install took 26 s here (2026-11-28), the venv is 119 MB.
#   scripts/cudnn_frontend.sh                     # /opt/kvmm-venvs/cudnn-frontend-1.32.0
#   scripts/cudnn_frontend.sh --kit DIR           # also copies the headers to DIR/include and
#                                                 # the toolkit's cudnn*.h to DIR/cudnn-include
#                                                 # (the GPU machine's kit: .device-kit/cudnn-frontend)
#   KVMM_CUDNN_FRONTEND_VENV=DIR scripts/cudnn_frontend.sh
set -euo pipefail
pin=nvidia-cudnn-frontend==1.32.0
venv=${KVMM_CUDNN_FRONTEND_VENV:-/opt/kvmm-venvs/cudnn-frontend-1.32.0}
headers() { compgen -G "$venv/lib/python3*/site-packages/include/cudnn_frontend.h" | head -1 | xargs -r dirname; }
if grep -qix "$pin" <<<"$("$venv/bin/python" -m pip freeze 2>/dev/null || true)" && [[ -n $(headers) ]]; then
  echo "cudnn frontend: $pin in $venv"
else
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    source "$(dirname "$0")/deps.sh"
    kvmm_install_deps python3-venv
  fi
  mkdir -p "$(dirname "$venv")"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$pin"
  echo "cudnn frontend: installed $pin in $venv"
fi
if [[ ${1:-} == --kit ]]; then
  kit=${2:?--kit DIR}
  rm -rf "$kit/include"
  mkdir -p "$kit"
  cp -r "$(headers)" "$kit/include"
  # cuDNN's own headers from this toolkit, for a machine whose cuDNN came without them.
  rm -rf "$kit/cudnn-include"
  mkdir -p "$kit/cudnn-include"
  cp /usr/local/cuda/include/cudnn*.h "$kit/cudnn-include/"
  echo "cudnn frontend: headers copied to $kit/include ($(du -sh "$kit/include" | cut -f1))"
fi
