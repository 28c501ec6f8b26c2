#!/usr/bin/env bash
# Formats (or with --check, checks) every C++ and CUDA source of the tree with .clang-format.
# CI runs --check (scripts/test.sh). The tree-wide reformat is listed in .git-blame-ignore-revs.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.cpp' '*.hpp' '*.h' '*.cu' '*.cuh' 2>/dev/null || find . -name '*.cpp' -o -name '*.hpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh')
if [ "${1:-}" = "--check" ]; then
  # One clang-format run over all files: it prints each unformatted file's first difference.
  if ! out=$(echo "$files" | xargs clang-format --dry-run --Werror 2>&1); then
    echo "$out" | grep -oE '^[^:]+\.(cpp|hpp|h|cu|cuh)' | sort -u | sed 's/^/not formatted: /; s/$/ (scripts\/format.sh)/'
    exit 1
  fi
  exit 0
fi
echo "$files" | xargs clang-format -i
