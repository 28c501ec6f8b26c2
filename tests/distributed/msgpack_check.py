#!/usr/bin/python3
# Decodes msgpack files with python3-msgpack (an implementation independent of kvmm's) and
# prints each as one canonical line: repr() of the decoded object, bytes as b'..'.
# Usage: msgpack_check.py FILE...   Exit 0 when every file is exactly one msgpack value.
import sys

import msgpack


def main() -> int:
    for path in sys.argv[1:]:
        with open(path, "rb") as f:
            data = f.read()
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        unpacker.feed(data)
        values = list(unpacker)
        if len(values) != 1:
            print(f"{path}: {len(values)} values, expected 1", file=sys.stderr)
            return 1
        print(repr(values[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
