# Sourced by scripts/demo.sh, scripts/test.sh and scripts/sim-table.sh: installs the Debian packages kvmm
# needs when any is missing (root on a fresh Debian machine; sudo otherwise).
kvmm_install_deps() {
  local pkgs=(cmake g++ make catch2 libfmt-dev libxxhash-dev libbenchmark-dev nlohmann-json3-dev
    libzmq3-dev cppzmq-dev python3-zmq python3-msgpack pybind11-dev python3-dev python3-numpy python3-pytest
    libhiredis-dev redis-server libsodium-dev "$@")
  local missing=()
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "kvmm: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# nvcc is optional: put the CUDA Toolkit on PATH when it is installed in the usual place.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
