#!/usr/bin/env bash
# Installs the CUDA binary tools that the kernel static checks use (tests/kernels/static:
# cuobjdump -res-usage / -sass, which needs nvdisasm) from PyPI, pinned, into a venv at a
# fixed path outside the repository. Idempotent: seconds when already installed.
#   scripts/kernel_tools.sh            # installs into /opt/kvmm-venvs/cuobjdump
#   KVMM_CUDA_TOOLS_VENV=DIR scripts/kernel_tools.sh
# 13.2.51 is the oldest release on PyPI; it reads the cubins of the CUDA 13.0 nvcc used here.
set -euo pipefail
venv=${KVMM_CUDA_TOOLS_VENV:-/opt/kvmm-venvs/cuobjdump}
pins=(nvidia-cuda-cuobjdump==13.2.51 nvidia-cuda-nvdisasm==13.2.51)
installed=$("$venv/bin/python" -m pip freeze 2>/dev/null || true)
ok=1
for p in "${pins[@]}"; do grep -qix "$p" <<<"$installed" || ok=0; done
if ((ok)); then
  echo "kernel tools: ${pins[*]} in $venv"
  exit 0
fi
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  source "$(dirname "$0")/deps.sh"
  kvmm_install_deps python3-venv
fi
mkdir -p "$(dirname "$venv")"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${pins[@]}"
echo "kernel tools: installed ${pins[*]} in $venv"
