#!/usr/bin/env bash
# The consumer checks of scripts/test.sh: kvmm used the ways an engine would use it.
#   tests/consumer/run.sh <kvmm release build dir, already built> <scratch dir>
# 1. find_package(kvmm) of a CPU-only static install (the release build's `kvmm` install
#    component; with nvcc that build also has kvmm::cuda, left out here), and asking
#    that install for COMPONENTS cuda fails with a clear message;
# 2. with kvmm::cuda built: a CPU consumer of the full install never looks for CUDA, and
#    a CUDA consumer links kvmm::cuda (find_package(kvmm COMPONENTS cuda));
# 3. pkg-config --cflags --libs kvmm against the static install;
# 4. add_subdirectory(kvmm) from a parent with no build type: the parent's build type, CUDA
#    state and flags unchanged, nothing of kvmm installed (tests/consumer/embed); with nvcc,
#    also a parent that has CUDA with its own architectures (configure only);
# 5. FetchContent from a source tarball (file path, no network) with BUILD_SHARED_LIBS=ON
#    and KVMM_INSTALL=ON: kvmm builds shared, the parent installs it, and that shared
#    install is consumed by find_package and by pkg-config.
# Reuses the release build (no CUDA rebuild); builds kvmm twice (static, shared).
set -euo pipefail
src=$(realpath "$(dirname "$0")/../..")
release=$(realpath "$1")
work=$(realpath -m "$2")
jobs=$(nproc)
source "$src/scripts/deps.sh"
kvmm_install_deps pkgconf
rm -rf "$work"
mkdir -p "$work"
started=$SECONDS
step() { echo "-- consumer [$((SECONDS - started)) s]: $*"; }

# consume NAME PREFIX [cmake args...]: configure, build and run tests/consumer.
consume() {
  local name=$1 prefix=$2
  shift 2
  cmake -S "$src/tests/consumer" -B "$work/$name" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release "$@" \
    >"$work/$name.log" || { cat "$work/$name.log"; return 1; }
  cmake --build "$work/$name" -j"$jobs" >>"$work/$name.log" || { cat "$work/$name.log"; return 1; }
  "$work/$name/kvmm_consumer"
}

# pkgconf_run NAME PREFIX: compile tests/consumer/main.cpp with pkg-config's flags, run it.
pkgconf_run() {
  local name=$1 prefix=$2 pcdir
  pcdir=$(dirname "$(find "$prefix" -name kvmm.pc)")
  local version cflags libs
  version=$(PKG_CONFIG_PATH="$pcdir" pkg-config --modversion kvmm)
  cflags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags kvmm)
  libs=$(PKG_CONFIG_PATH="$pcdir" pkg-config --libs kvmm)
  echo "pkg-config kvmm $version: $cflags $libs"
  # shellcheck disable=SC2086 # the flags are words
  g++ -std=c++20 -O1 -DKVMM_EXPECT_VERSION="\"$version\"" "$src/tests/consumer/main.cpp" $cflags $libs \
    -o "$work/$name"
  LD_LIBRARY_PATH="$(PKG_CONFIG_PATH="$pcdir" pkg-config --variable=libdir kvmm)" "$work/$name"
}

step "install the release build ($release)"
cmake --install "$release" --prefix "$work/install" >/dev/null
has_cuda=0
cpu="$work/install"  # the CPU-only install
if [ -n "$(find "$work/install" -name kvmmCudaTargets.cmake)" ]; then
  has_cuda=1
  cpu="$work/install-cpu"
  cmake --install "$release" --prefix "$cpu" --component kvmm >/dev/null
  [ -z "$(find "$cpu" -name 'kvmmCudaTargets.cmake' -o -name 'libkvmm_cuda*')" ]
fi

step "find_package(kvmm) of a CPU-only static install"
consume static "$cpu" -DKVMM_CONSUMER_LIBRARY_TYPE=STATIC_LIBRARY
step "find_package(kvmm COMPONENTS cuda) of a CPU-only install must fail, naming the component"
if cmake -S "$src/tests/consumer" -B "$work/no-cuda" -DCMAKE_PREFIX_PATH="$cpu" \
  -DKVMM_CONSUMER_CUDA=ON >"$work/no-cuda.log" 2>&1; then
  echo "configured, expected a failure"; exit 1
fi
grep -q "component cuda: this kvmm install has no kvmm::cuda" "$work/no-cuda.log" || { cat "$work/no-cuda.log"; exit 1; }

if [ $has_cuda = 1 ]; then
  step "find_package(kvmm) of a CUDA install by a CPU consumer: no CUDA lookup"
  consume cpu-of-cuda "$work/install" -DKVMM_CONSUMER_LIBRARY_TYPE=STATIC_LIBRARY
  step "find_package(kvmm COMPONENTS cuda): link kvmm::cuda"
  consume cuda "$work/install" -DKVMM_CONSUMER_CUDA=ON
  "$work/cuda/kvmm_consumer_cuda"
fi

step "pkg-config kvmm, static install"
pkgconf_run pkgconf-static "$cpu"

step "add_subdirectory(kvmm) from a parent project with no build type"
cmake -S "$src/tests/consumer/embed" -B "$work/embed-sub" -DKVMM_EMBED=subdirectory -DKVMM_SOURCE="$src" \
  >"$work/embed-sub.log" || { cat "$work/embed-sub.log"; exit 1; }
grep "kvmm_parent:" "$work/embed-sub.log" | cut -c1-160
cmake --build "$work/embed-sub" -j"$jobs" --target parent_app >>"$work/embed-sub.log" || { cat "$work/embed-sub.log"; exit 1; }
"$work/embed-sub/parent_app"
cmake --install "$work/embed-sub" --prefix "$work/embed-sub-install" >/dev/null
[ -x "$work/embed-sub-install/bin/parent_app" ]
# Paths below the prefix only: the prefix itself may lie in a folder named kvmm.
if [ -n "$(cd "$work/embed-sub-install" && find . -path '*kvmm*' -print -quit)" ]; then
  echo "an embedded kvmm installed files (KVMM_INSTALL should default OFF):"; find "$work/embed-sub-install"; exit 1
fi

if command -v nvcc >/dev/null 2>&1; then
  step "add_subdirectory(kvmm) from a parent with CUDA for sm_75 (configure only)"
  cmake -S "$src/tests/consumer/embed" -B "$work/embed-cuda" -DKVMM_EMBED=subdirectory -DKVMM_SOURCE="$src" \
    -DKVMM_PARENT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=75 >"$work/embed-cuda.log" || { cat "$work/embed-cuda.log"; exit 1; }
  grep "kvmm_parent:" "$work/embed-cuda.log" | cut -c1-160
fi

step "FetchContent(kvmm) from a source tarball, BUILD_SHARED_LIBS=ON, KVMM_INSTALL=ON"
tar -C "$src" -czf "$work/kvmm-src.tar.gz" --exclude=build --exclude='build-*' CMakeLists.txt LICENSE cmake include src kernels
cmake -S "$src/tests/consumer/embed" -B "$work/embed-fetch" -DKVMM_EMBED=fetchcontent \
  -DKVMM_SOURCE="$work/kvmm-src.tar.gz" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DKVMM_CUDA=OFF \
  -DKVMM_INSTALL=ON >"$work/embed-fetch.log" || { cat "$work/embed-fetch.log"; exit 1; }
grep "kvmm_parent:" "$work/embed-fetch.log" | cut -c1-160
cmake --build "$work/embed-fetch" -j"$jobs" >>"$work/embed-fetch.log" || { cat "$work/embed-fetch.log"; exit 1; }
"$work/embed-fetch/parent_app"
cmake --install "$work/embed-fetch" --prefix "$work/install-shared" >/dev/null
[ -n "$(find "$work/install-shared" -name 'libkvmm.so*' -print -quit)" ]

step "find_package(kvmm) of a CPU-only shared install"
consume shared "$work/install-shared" -DKVMM_CONSUMER_LIBRARY_TYPE=SHARED_LIBRARY
step "pkg-config kvmm, shared install"
pkgconf_run pkgconf-shared "$work/install-shared"
step "all consumer checks passed"
