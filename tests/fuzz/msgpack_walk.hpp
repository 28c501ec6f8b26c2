// A strict msgpack structure walker for tests and fuzz targets: the byte length of the one
// msgpack value at the start of a buffer, or std::nullopt when it is truncated or uses the
// never-used type byte 0xc1. Iterative (a count of values still to read), so hostile
// nesting cannot exhaust the stack; O(bytes). kvmm has no event decoder of its own: this
// checks that the encoder wrote exactly one complete message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace kvmm::test {

inline std::optional<std::size_t> msgpack_value_size(std::span<const std::uint8_t> b) {
  std::size_t pos = 0;
  std::uint64_t pending = 1;  // values still to read
  auto be = [&](std::size_t at, int n) {
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v = v << 8 | b[at + static_cast<std::size_t>(i)];
    return v;
  };
  while (pending > 0) {
    if (pos >= b.size()) return std::nullopt;
    const std::uint8_t t = b[pos++];
    --pending;
    std::uint64_t skip = 0, children = 0;
    int len_bytes = 0;  // a big-endian length follows the type byte
    enum { kNone, kBytes, kExt, kArray, kMap } len_kind = kNone;
    if (t <= 0x7f || t >= 0xe0) {
      // positive / negative fixint
    } else if (t <= 0x8f) {
      children = 2u * (t & 0x0fu);
    } else if (t <= 0x9f) {
      children = t & 0x0fu;
    } else if (t <= 0xbf) {
      skip = t & 0x1fu;
    } else {
      switch (t) {
        case 0xc0:
        case 0xc2:
        case 0xc3:
          break;  // nil, false, true
        case 0xc1:
          return std::nullopt;  // never used
        case 0xc4:
        case 0xc5:
        case 0xc6:
          len_kind = kBytes;
          len_bytes = 1 << (t - 0xc4);
          break;  // bin
        case 0xc7:
        case 0xc8:
        case 0xc9:
          len_kind = kExt;
          len_bytes = 1 << (t - 0xc7);
          break;  // ext
        case 0xca:
          skip = 4;
          break;  // float32
        case 0xcb:
          skip = 8;
          break;  // float64
        case 0xcc:
        case 0xcd:
        case 0xce:
        case 0xcf:
          skip = 1u << (t - 0xcc);
          break;  // uint
        case 0xd0:
        case 0xd1:
        case 0xd2:
        case 0xd3:
          skip = 1u << (t - 0xd0);
          break;  // int
        case 0xd4:
        case 0xd5:
        case 0xd6:
        case 0xd7:
        case 0xd8:
          skip = 1 + (1u << (t - 0xd4));
          break;  // fixext
        case 0xd9:
        case 0xda:
        case 0xdb:
          len_kind = kBytes;
          len_bytes = 1 << (t - 0xd9);
          break;  // str
        case 0xdc:
        case 0xdd:
          len_kind = kArray;
          len_bytes = t == 0xdc ? 2 : 4;
          break;
        default:
          len_kind = kMap;
          len_bytes = t == 0xde ? 2 : 4;
          break;  // 0xde, 0xdf
      }
    }
    if (len_kind != kNone) {
      if (b.size() - pos < static_cast<std::size_t>(len_bytes)) return std::nullopt;
      const std::uint64_t n = be(pos, len_bytes);
      pos += static_cast<std::size_t>(len_bytes);
      if (len_kind == kBytes) skip = n;
      if (len_kind == kExt) skip = n + 1;  // the ext type byte, then the data
      if (len_kind == kArray) children = n;
      if (len_kind == kMap) children = 2 * n;
    }
    if (b.size() - pos < skip) return std::nullopt;
    pos += static_cast<std::size_t>(skip);
    pending += children;
  }
  return pos;
}

}  // namespace kvmm::test
