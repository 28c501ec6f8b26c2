#!/usr/bin/env bash
# Formats (or with --check, checks) the C++ sources that follow .clang-format. The list
# grows as directories are brought under the format; CI runs --check (scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
paths=(src/manager include/kvmm/manager include/kvmm/detail
       include/kvmm/caching/request_hashes.hpp src/caching/request_hashes.cpp)
files=$(find "${paths[@]}" -name '*.cpp' -o -name '*.hpp' | sort)
if [ "${1:-}" = "--check" ]; then
  bad=0
  for f in $files; do
    if ! clang-format --dry-run --Werror "$f" 2>/dev/null; then echo "not formatted: $f (scripts/format.sh)"; bad=1; fi
  done
  exit $bad
fi
clang-format -i $files
