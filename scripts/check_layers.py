#!/usr/bin/env python3
"""Checks that kvmm's includes only point down the layers docs/architecture.md states.

Reads the layer table of docs/architecture.md (a row per layer: | `layer` | ... | may include |,
the last column's backticked names, or "nothing"), then every #include "kvmm/..." (or <kvmm/...>)
line of include/kvmm/, src/ and kernels/: a file of layer L (its first folder under
include/kvmm/ or src/; kernels/ is the kernels layer) may include its own layer, the base
headers (kvmm/*.hpp, which include nothing else of kvmm) and the layers L's row names.
Fails, naming file, line and rule, for any other include, an unknown layer, or a cycle in
the table. CI runs it (scripts/test.sh). Cost: reading ~300 files (well under a second).
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
ROW = re.compile(r"^\|\s*`([a-z_]+)`\s*\|.*\|\s*([^|]*?)\s*\|\s*$")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]kvmm/([^">]+)[">]')
SOURCES = (".hpp", ".h", ".cpp", ".cu", ".cuh")
# Transitional forwards at the test doubles' old paths (docs/architecture.md): allowed to
# include testing/ until the manager's sources include the new paths; delete with them.


def read_table():
    allowed = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        m = ROW.match(line)
        if m:
            last = m.group(2)
            names = re.findall(r"`([a-z_]+)`", last)
            if not names and last != "nothing":
                raise SystemExit(f"{DOC}: layer {m.group(1)}: 'may include' is '{last}': "
                                 "expected backticked layer names or 'nothing'")
            allowed[m.group(1)] = set(names)
    if not allowed:
        raise SystemExit(f"{DOC}: no layer table found")
    for layer, names in allowed.items():
        for n in names - set(allowed):
            raise SystemExit(f"{DOC}: layer {layer} may include '{n}', which is not a layer")
    return allowed


def check_acyclic(allowed):
    state = {}

    def visit(layer, path):
        if state.get(layer) == "done":
            return
        if state.get(layer) == "open":
            raise SystemExit(f"{DOC}: the layer table has a cycle: {' -> '.join(path + [layer])}")
        state[layer] = "open"
        for n in sorted(allowed[layer]):
            visit(n, path + [layer])
        state[layer] = "done"

    for layer in sorted(allowed):
        visit(layer, [])


def layer_of(rel):
    parts = rel.parts
    if parts[0] == "kernels":
        return "kernels"
    base = parts[2:] if parts[:2] == ("include", "kvmm") else parts[1:]
    return base[0] if len(base) > 1 else "base"


def main():
    allowed = read_table()
    check_acyclic(allowed)
    files = [p for d in ("include/kvmm", "src", "kernels") for p in sorted((ROOT / d).rglob("*"))
             if p.suffix in SOURCES]
    errors = []
    for path in files:
        rel = path.relative_to(ROOT)
        src = layer_of(rel)
        if src != "base" and src not in allowed:
            errors.append(f"{rel}: folder '{src}' is not a layer of {DOC.relative_to(ROOT)}'s table")
            continue
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group(1).split("/")
            dst = target[0] if len(target) > 1 else "base"
            if dst == src or dst == "base":
                continue
            if src == "base":
                errors.append(f"{rel}:{no}: a base header includes kvmm/{m.group(1)}: base headers include only base headers")
            elif dst not in allowed:
                errors.append(f"{rel}:{no}: includes kvmm/{m.group(1)}: '{dst}' is not a layer of the table")
            elif dst not in allowed[src]:
                errors.append(f"{rel}:{no}: {src} includes kvmm/{m.group(1)}, but {src} may include only "
                              f"{', '.join(sorted(allowed[src])) or 'itself'} (docs/architecture.md): "
                              "an arrow up the layers")
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        return 1
    print(f"layers: {len(files)} files, {len(allowed)} layers, every include points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
